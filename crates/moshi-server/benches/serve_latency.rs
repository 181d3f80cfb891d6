//! Latency through `moshi-rs serve` on loopback (tiny model): a client talks at real pace in
//! 20 ms Opus packets (as Kyutai's web UI does) and times, for every frame k, from sending the
//! packet that completes input frame k to receiving output frame k, minus the model's compute
//! for that frame (measured on the server's compute thread). Mouth-to-ear beyond the 80 ms frame
//! and the compute is that, plus the two Opus encoder delays (pre-skips, in and out), plus
//! whatever jitter buffer the client keeps (not the server's: reported apart).
//!
//! `cargo bench -p moshi-server --bench serve_latency [-- --seconds 20 --json out.json]`

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use moshi_loader::{ModelSource, SourceOverrides, WeightMode};
use moshi_model::generator::SamplingConfig;
use moshi_runtime::engine::DropPolicy;
use moshi_runtime::metrics::Percentiles;
use moshi_runtime::pipeline::{self, MoshiModel};
use moshi_runtime::SAMPLE_RATE_HZ;
use moshi_server::batch_engine::BatchEngine;
use moshi_server::client::{self, Received};
use moshi_server::ogg_opus::{OggOpusWriter, OpusPacketing};
use moshi_server::session_engine::{
    EngineSession, OpenError, SessionEngine, SessionEvent, SessionSettings,
};
use moshi_server::{Endpoint, Module, ServerConfig, WebUi};

/// The engine, with the compute time of every frame noted as it passes to the session.
struct Timed {
    pool: BatchEngine,
    compute_ms: Arc<Mutex<Vec<f64>>>,
}

impl SessionEngine for Timed {
    fn open(&self, settings: SessionSettings) -> Result<EngineSession, OpenError> {
        let inner = self.pool.open(settings)?;
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let mut events = inner.events;
        let compute = self.compute_ms.clone();
        tokio::spawn(async move {
            while let Some(e) = events.recv().await {
                if let SessionEvent::Frame(f) = &e {
                    compute.lock().unwrap().push(f.compute_ms);
                }
                if tx.send(e).await.is_err() {
                    break;
                }
            }
        });
        Ok(EngineSession {
            input: inner.input,
            events: rx,
        })
    }

    fn max_sessions(&self) -> usize {
        self.pool.max_sessions()
    }

    fn active_sessions(&self) -> usize {
        self.pool.active_sessions()
    }
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let seconds: f64 = arg("--seconds").map_or(20.0, |s| s.parse().expect("--seconds"));
    let tiny = moshi_test_support::tiny_a_dir();
    let model = ModelSource::resolve(tiny.to_str().unwrap(), &SourceOverrides::default()).unwrap();
    let model = MoshiModel::load(&model, WeightMode::Native, Default::default()).unwrap();
    let compute_ms = Arc::new(Mutex::new(Vec::new()));
    let engine = Timed {
        pool: BatchEngine::new(
            Arc::new(model),
            pipeline::SessionSettings::with_sampling(SamplingConfig::greedy()),
            1,
            DropPolicy::RealTime {
                max_backlog_frames: 2,
            },
            8,
        )
        .unwrap(),
        compute_ms: compute_ms.clone(),
    };
    let speech = moshi_runtime::wav::read_mono(&tiny.join("input.wav"))
        .unwrap()
        .samples;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (sent_at, received_at) = runtime.block_on(async {
        let mut config = ServerConfig::new("127.0.0.1:0".parse().unwrap());
        config.web_ui = WebUi::None;
        let mut module = Module::new(Endpoint::Chat, Arc::new(engine));
        module.default_sampling = SamplingConfig::greedy();
        let server = moshi_server::start(config, vec![module]).await.unwrap();
        let url = format!("ws://{}/api/chat", server.local_addr());
        let (mut tx, mut rx) = client::connect(&url, OpusPacketing::WEB_CLIENT)
            .await
            .unwrap();
        let receiver = tokio::spawn(async move {
            // Arrival time of each whole output frame (1920 decoded samples).
            let mut arrivals = Vec::new();
            let mut samples = 0usize;
            loop {
                match rx.recv().await.unwrap() {
                    Received::Audio(pcm) if !pcm.is_empty() => {
                        let now = Instant::now();
                        samples += pcm.len();
                        // With the client's pre-skip discarded, message k completes output
                        // samples up to 1920 (k + 1) - pre-skip: frame k has started.
                        while arrivals.len() < samples.div_ceil(1920) {
                            arrivals.push(now);
                        }
                    }
                    Received::Closed(_) => return arrivals,
                    _ => {}
                }
            }
        });
        // 20 ms packets at real pace; a frame is complete when its 4th packet is sent.
        let packet = 480;
        let total_packets = (seconds * SAMPLE_RATE_HZ as f64) as usize / packet;
        let mut sent_at = Vec::new();
        let start = tokio::time::Instant::now();
        for p in 0..total_packets {
            tokio::time::sleep_until(start + Duration::from_millis(20 * p as u64)).await;
            let from = (p * packet) % (speech.len() - packet);
            tx.send_pcm(&speech[from..from + packet]).await.unwrap();
            if p % 4 == 3 {
                sent_at.push(Instant::now());
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        tx.close().await.unwrap();
        let arrivals = receiver.await.unwrap();
        server.shutdown(Duration::from_secs(2)).await;
        (sent_at, arrivals)
    });

    let compute = compute_ms.lock().unwrap().clone();
    if compute.len() < sent_at.len() {
        println!(
            "warning: the server processed {} of {} frames (dropped for real time: is the machine busy?); frames after a drop are misaligned",
            compute.len(),
            sent_at.len()
        );
    }
    let frames = sent_at.len().min(received_at.len()).min(compute.len());
    // The first second warms up (first touch of caches, connection start).
    let skip = 12.min(frames);
    let transport: Vec<f64> = (skip..frames)
        .map(|k| received_at[k].duration_since(sent_at[k]).as_secs_f64() * 1e3 - compute[k])
        .collect();
    let pre_skip_ms = |packeting| {
        OggOpusWriter::new(0, packeting).unwrap().pre_skip_samples() as f64 * 1e3
            / SAMPLE_RATE_HZ as f64
    };
    let codec_ms = pre_skip_ms(OpusPacketing::WEB_CLIENT) + pre_skip_ms(OpusPacketing::SERVER);
    let t = Percentiles::of(&transport);
    let c = Percentiles::of(&compute[skip..frames]);
    println!(
        "serve latency, tiny model, loopback, {} frames ({} s at real pace, 20 ms packets in, 40 ms out):",
        frames - skip,
        seconds
    );
    println!(
        "  transport (sent the packet completing input frame k -> received output frame k, minus compute): p50 {:.1} ms, p95 {:.1} ms, max {:.1} ms",
        t.p50, t.p95, t.max
    );
    println!("  Opus encoder delays (pre-skip in + out): {codec_ms:.1} ms");
    println!(
        "  added mouth-to-ear beyond the 80 ms frame and the compute: p50 {:.1} ms, p95 {:.1} ms (+ the client's jitter buffer)",
        t.p50 + codec_ms,
        t.p95 + codec_ms
    );
    println!(
        "  compute per frame: p50 {:.1} ms, p95 {:.1} ms",
        c.p50, c.p95
    );
    if let Some(path) = arg("--json") {
        let json = serde_json::json!({
            "frames": frames - skip,
            "transport_ms": t,
            "codec_ms": codec_ms,
            "added_ms_p50": t.p50 + codec_ms,
            "added_ms_p95": t.p95 + codec_ms,
            "compute_ms": c,
        });
        std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    }
}
