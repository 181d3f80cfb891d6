//! Issue #41 defect 21: `serve`'s resident memory rose after bursts of clients (18 -> 64 MB on
//! tiny-hibiki, 4 rounds of 40) and stayed. This soak tells a plateau (the allocator keeping
//! freed pages for reuse) from a leak (growth every round): rounds of concurrent sessions on the
//! tiny model, resident memory read after each; after the first rounds it must stop growing.
//! Its own test binary, so no other test's allocations count. Loopback only; bounded: 6 rounds
//! of 12 sessions of 1 s (`SOAK_RSS_ROUNDS=N`: more).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use moshi_loader::{ModelSource, SourceOverrides, WeightMode};
use moshi_model::generator::SamplingConfig;
use moshi_runtime::engine::DropPolicy;
use moshi_runtime::pipeline::{MoshiModel, SessionSettings};
use moshi_server::batch_engine::BatchEngine;
use moshi_server::client::{self, Received};
use moshi_server::ogg_opus::OpusPacketing;
use moshi_server::{Endpoint, Limits, Module, ServerConfig, WebUi};
use moshi_test_support::tiny_a_dir;

/// Rounds by default; `SOAK_RSS_ROUNDS=N` runs more by hand.
const ROUNDS: usize = 6;
const CLIENTS: usize = 12;
const FRAMES: usize = 12;

/// Resident memory of this process, KiB (Linux).
fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// One client: a second of a tone at real pace, then a normal close.
async fn session(addr: SocketAddr) {
    let url = format!("ws://{addr}/api/chat");
    let (mut tx, mut rx) = client::connect(&url, OpusPacketing::WEB_CLIENT)
        .await
        .unwrap();
    let reader = tokio::spawn(async move {
        loop {
            match rx.recv().await {
                Ok(Received::Closed(_)) | Err(_) => return,
                Ok(Received::Error(e)) => panic!("{e}"),
                Ok(_) => {}
            }
        }
    });
    let start = tokio::time::Instant::now();
    for i in 0..FRAMES {
        tokio::time::sleep_until(start + Duration::from_millis(80 * i as u64)).await;
        let pcm: Vec<f32> = (0..1920)
            .map(|n| 0.1 * ((i * 1920 + n) as f32 * 0.05).sin())
            .collect();
        tx.send_pcm(&pcm).await.unwrap();
    }
    tx.close().await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), reader)
        .await
        .expect("no close within 20 s")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resident_memory_plateaus_over_rounds_of_sessions() {
    if rss_kib().is_none() {
        eprintln!("SKIPPED: no /proc/self/status");
        return;
    }
    let model =
        ModelSource::resolve(tiny_a_dir().to_str().unwrap(), &SourceOverrides::default()).unwrap();
    let model = MoshiModel::load(&model, WeightMode::Native, Default::default()).unwrap();
    let settings = SessionSettings::with_sampling(SamplingConfig::greedy());
    let pool = BatchEngine::new(
        Arc::new(model),
        settings,
        CLIENTS,
        DropPolicy::RealTime {
            max_backlog_frames: 2,
        },
        8,
    )
    .unwrap();
    let mut config = ServerConfig::new("127.0.0.1:0".parse().unwrap());
    config.web_ui = WebUi::None;
    config.limits = Limits::default();
    let mut module = Module::new(Endpoint::Chat, Arc::new(pool));
    module.default_sampling = SamplingConfig::greedy();
    let server = moshi_server::start(config, vec![module]).await.unwrap();
    let addr = server.local_addr();
    let mut rss = vec![rss_kib().unwrap()];
    let rounds = std::env::var("SOAK_RSS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ROUNDS)
        .max(3);
    for _ in 0..rounds {
        let clients: Vec<_> = (0..CLIENTS).map(|_| tokio::spawn(session(addr))).collect();
        for c in clients {
            c.await.unwrap();
        }
        // Every session's state freed before measuring.
        let t0 = tokio::time::Instant::now();
        while server.running_sessions() > 0 && t0.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        rss.push(rss_kib().unwrap());
    }
    eprintln!("resident memory, KiB: start then after each round: {rss:?}");
    // A leak grows every round by about what a round allocates; a plateau stops after the first
    // rounds (the allocator reuses what it kept). Compare the last rounds with round 2.
    let settled = rss[2];
    let last = *rss.last().unwrap();
    assert!(
        last <= settled + settled / 10 + 2048,
        "resident memory kept growing after round 2: {rss:?} KiB"
    );
    assert!(server.shutdown(Duration::from_secs(3)).await);
}
