//! The server for operators (tiny model, in process): `/metrics` counts what clients did,
//! `/api/health`, `/api/ready` and `/api/capacity` follow the sessions, a full server answers
//! 503 before the upgrade, a drain (`POST /api/drain`) refuses new sessions while the live one
//! goes on, `--max-session-s` ends a session with a message, and the drain endpoint refuses
//! who may not drain.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use moshi_loader::{ModelSource, SourceOverrides, WeightMode};
use moshi_model::generator::SamplingConfig;
use moshi_runtime::engine::DropPolicy;
use moshi_runtime::pipeline::{MoshiModel, SessionSettings};
use moshi_server::api_keys::ApiKeys;
use moshi_server::batch_engine::BatchEngine;
use moshi_server::client::{self, Received};
use moshi_server::metrics::{of_module, sample};
use moshi_server::ogg_opus::OpusPacketing;
use moshi_server::{Endpoint, Limits, Module, RunningServer, ServerConfig, WebUi};
use moshi_test_support::tiny_a_dir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn start(max_sessions: usize, limits: Limits, keys: Option<ApiKeys>) -> RunningServer {
    let model =
        ModelSource::resolve(tiny_a_dir().to_str().unwrap(), &SourceOverrides::default()).unwrap();
    let model = MoshiModel::load(&model, WeightMode::Native, Default::default()).unwrap();
    let settings = SessionSettings::with_sampling(SamplingConfig::greedy());
    let policy = DropPolicy::RealTime {
        max_backlog_frames: 2,
    };
    let engine = BatchEngine::new(Arc::new(model), settings, max_sessions, policy, 8).unwrap();
    let mut config = ServerConfig::new("127.0.0.1:0".parse().unwrap());
    config.web_ui = WebUi::None;
    config.limits = limits;
    config.api_keys = keys;
    let mut module = Module::new(Endpoint::Chat, Arc::new(engine));
    module.default_sampling = SamplingConfig::greedy();
    module.lm_model_file = "tiny-a/model.safetensors".into();
    moshi_server::start(config, vec![module]).await.unwrap()
}

/// One HTTP/1.1 request; (status, headers and body as text).
async fn http(addr: SocketAddr, method: &str, path: &str, headers: &str) -> (u16, String) {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let connection = if headers.contains("Connection:") {
        ""
    } else {
        "Connection: close\r\n"
    };
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{connection}Content-Length: 0\r\n{headers}\r\n"
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_string(&mut response))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    (status, response)
}

async fn metrics(addr: SocketAddr) -> String {
    let (status, text) = http(addr, "GET", "/metrics", "").await;
    assert_eq!(status, 200, "{text}");
    text
}

/// The `/api/chat` module's sample `name` (a server-wide one when `name` starts with `!`).
fn value(text: &str, name: &str) -> f64 {
    let name = match name.strip_prefix('!') {
        Some(server_wide) => server_wide.to_string(),
        None => of_module(name, "/api/chat"),
    };
    let name = name.as_str();
    sample(text, name).unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

fn frame_pcm(i: usize) -> Vec<f32> {
    (0..1920)
        .map(|n| 0.1 * ((i * 1920 + n) as f32 * 0.05).sin())
        .collect()
}

/// A session that sends `frames` frames at real pace and then closes; returns the samples of
/// audio it got and the kind-5 errors.
async fn talk(addr: SocketAddr, frames: usize) -> (usize, Vec<String>) {
    let url = format!("ws://{addr}/api/chat");
    let (mut tx, mut rx) = client::connect(&url, OpusPacketing::WEB_CLIENT)
        .await
        .unwrap();
    let receiver = tokio::spawn(async move {
        let (mut samples, mut errors) = (0, Vec::new());
        loop {
            match rx.recv().await {
                Ok(Received::Audio(pcm)) => samples += pcm.len(),
                Ok(Received::Error(e)) => errors.push(e),
                Ok(Received::Closed(_)) | Err(_) => return (samples, errors),
                Ok(_) => {}
            }
        }
    });
    let start = tokio::time::Instant::now();
    for i in 0..frames {
        tokio::time::sleep_until(start + Duration::from_millis(80 * i as u64)).await;
        if tx.send_pcm(&frame_pcm(i)).await.is_err() {
            break;
        }
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    let _ = tx.close().await;
    receiver.await.unwrap()
}

/// The JSON body of `GET /api/capacity`.
async fn capacity(addr: SocketAddr) -> serde_json::Value {
    let (status, text) = http(addr, "GET", "/api/capacity", "").await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("content-type: application/json"), "{text}");
    serde_json::from_str(text.split_once("\r\n\r\n").unwrap().1).unwrap()
}

/// Polls until `/api/capacity` shows `used` sessions.
async fn wait_used(addr: SocketAddr, used: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = capacity(addr).await;
        if text["used"] == used {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_probes_and_capacity_follow_the_sessions() {
    let server = start(1, Limits::default(), None).await;
    let addr = server.local_addr();
    assert_eq!(http(addr, "GET", "/api/health", "").await.0, 200);
    let (status, text) = http(addr, "GET", "/api/ready", "").await;
    assert_eq!(status, 200, "{text}");
    let c = capacity(addr).await;
    assert_eq!(
        (c["used"].as_u64(), c["total"].as_u64(), c["free"].as_u64()),
        (Some(0), Some(1), Some(1)),
        "{c}"
    );
    assert_eq!(c["ready"], true, "{c}");
    let (_, text) = http(addr, "GET", "/api/modules_info", "").await;
    assert!(text.contains(r#""total_slots":"1""#), "{text}");
    assert!(text.contains(r#""used_slots":"0""#), "{text}");

    let text = metrics(addr).await;
    assert!(
        text.contains("content-type: text/plain; version=0.0.4"),
        "{text}"
    );
    assert!(text.contains(r#"moshi_rs_info{version=""#), "{text}");
    assert!(
        text.contains(r#"module="/api/chat",type="chat",model="tiny-a/model.safetensors"} 1"#),
        "{text}"
    );
    assert_eq!(value(&text, "moshi_rs_sessions_started_total"), 0.0);

    let live = tokio::spawn(talk(addr, 25));
    wait_used(addr, 1).await;
    // Full: not ready, and a new session is refused before the upgrade.
    let (status, text) = http(addr, "GET", "/api/ready", "").await;
    assert_eq!(status, 503, "{text}");
    assert!(text.to_lowercase().contains("retry-after: 2"), "{text}");
    let (status, text) = http(
        addr,
        "GET",
        "/api/chat",
        "Upgrade: websocket\r\nConnection: Upgrade, close\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
    )
    .await;
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("busy"), "{text}");

    let (samples, errors) = live.await.unwrap();
    assert!(errors.is_empty(), "{errors:?}");
    wait_used(addr, 0).await;
    assert_eq!(http(addr, "GET", "/api/ready", "").await.0, 200);

    let text = metrics(addr).await;
    assert_eq!(value(&text, "moshi_rs_sessions_started_total"), 1.0);
    assert_eq!(value(&text, "moshi_rs_sessions_active"), 0.0);
    assert_eq!(
        value(
            &text,
            r#"moshi_rs_sessions_ended_total{reason="client_closed"}"#
        ),
        1.0
    );
    assert_eq!(
        value(&text, r#"moshi_rs_sessions_refused_total{reason="busy"}"#),
        1.0
    );
    // Every frame the client heard was processed (and counted) by the server.
    let processed = value(&text, "moshi_rs_frames_processed_total");
    let heard_frames = (samples / 1920) as f64;
    assert!(
        processed >= heard_frames && processed <= 25.0 && heard_frames >= 15.0,
        "processed {processed}, heard {heard_frames}"
    );
    assert_eq!(
        value(&text, "moshi_rs_frame_latency_seconds_count"),
        processed
    );
    assert_eq!(value(&text, "moshi_rs_batch_size_sum"), processed);
    assert!(value(&text, "moshi_rs_step_duration_seconds_count") >= processed);
    assert!(value(&text, "moshi_rs_step_duration_seconds_sum") > 0.0);
    // Published by the compute thread once it has seen the session end.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while value(&metrics(addr).await, "moshi_rs_kv_cache_bytes") != 0.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "KV-cache bytes without a session"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(server.shutdown(Duration::from_secs(3)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_refuses_new_sessions_and_lets_the_live_one_finish() {
    let server = start(2, Limits::default(), None).await;
    let addr = server.local_addr();
    let live = tokio::spawn(talk(addr, 30));
    wait_used(addr, 1).await;
    // The compute thread publishes the gauge after the session's first step.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while value(&metrics(addr).await, "moshi_rs_kv_cache_bytes") == 0.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no KV-cache bytes while a session runs"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // From this machine, without keys: allowed.
    let (status, text) = http(addr, "POST", "/api/drain", "").await;
    assert_eq!(status, 202, "{text}");
    tokio::time::timeout(Duration::from_secs(5), server.drain_started())
        .await
        .expect("the drain is seen");
    let (status, text) = http(addr, "GET", "/api/ready", "").await;
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("draining"), "{text}");
    let c = capacity(addr).await;
    assert_eq!(
        (c["draining"].as_bool(), c["ready"].as_bool()),
        (Some(true), Some(false)),
        "{c}"
    );
    let refused =
        client::connect(&format!("ws://{addr}/api/chat"), OpusPacketing::WEB_CLIENT).await;
    assert!(refused.is_err(), "a draining server takes no new session");

    // The live session is not cut: it ends when its client closes.
    assert!(!server.sessions_ended(Duration::from_millis(300)).await);
    let (samples, errors) = live.await.unwrap();
    assert!(errors.is_empty(), "{errors:?}");
    assert!(samples >= 20 * 1920, "{samples} samples");
    assert!(server.sessions_ended(Duration::from_secs(5)).await);
    let text = metrics(addr).await;
    assert_eq!(value(&text, "!moshi_rs_draining"), 1.0);
    assert_eq!(
        value(
            &text,
            r#"moshi_rs_sessions_refused_total{reason="draining"}"#
        ),
        1.0
    );
    assert!(server.shutdown(Duration::from_secs(3)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_needs_a_key_when_keys_are_set_and_a_session_has_a_longest() {
    let keys = ApiKeys::from_keys(["k1"], "test").unwrap();
    let limits = Limits {
        max_session: Some(Duration::from_secs(1)),
        ..Limits::default()
    };
    let server = start(1, limits, Some(keys)).await;
    let addr = server.local_addr();
    assert_eq!(http(addr, "POST", "/api/drain", "").await.0, 403);
    assert_eq!(
        http(addr, "POST", "/api/drain", "kyutai-api-key: nope\r\n")
            .await
            .0,
        403
    );
    // The probes need no key.
    assert_eq!(http(addr, "GET", "/api/ready", "").await.0, 200);
    assert_eq!(http(addr, "GET", "/metrics", "").await.0, 200);

    // --max-session-s: the session is ended with a sentence after 1 s.
    let url = format!("ws://{addr}/api/chat?auth_id=k1");
    let (mut tx, mut rx) = client::connect(&url, OpusPacketing::WEB_CLIENT)
        .await
        .unwrap();
    let t0 = tokio::time::Instant::now();
    let sender = tokio::spawn(async move {
        for i in 0..40 {
            tokio::time::sleep(Duration::from_millis(80)).await;
            if tx.send_pcm(&frame_pcm(i)).await.is_err() {
                return;
            }
        }
    });
    let mut error = None;
    loop {
        match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
            Ok(Ok(Received::Error(e))) => error = Some(e),
            Ok(Ok(Received::Closed(_)) | Err(_)) | Err(_) => break,
            Ok(Ok(_)) => {}
        }
    }
    let took = t0.elapsed();
    sender.abort();
    let error = error.expect("a kind-5 sentence");
    assert!(error.contains("longest"), "{error}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "{took:?}"
    );
    let text = metrics(addr).await;
    assert_eq!(
        value(
            &text,
            r#"moshi_rs_sessions_ended_total{reason="max_duration"}"#
        ),
        1.0
    );

    assert_eq!(http(addr, "POST", "/api/drain?auth_id=k1", "").await.0, 202);
    assert_eq!(http(addr, "GET", "/api/ready", "").await.0, 503);
    assert!(server.shutdown(Duration::from_secs(3)).await);
}
