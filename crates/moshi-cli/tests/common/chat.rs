//! Helpers of the `/api/chat` server tests: a real-pace client session, the recordings it
//! leaves, and the tokens `moshi-rs file` gives on what the server heard.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use moshi_server::client::{self, Received};
use moshi_server::ogg_opus::OpusPacketing;

use super::serve::files_ending;

/// What a client got from one session, in order.
pub struct Conversation {
    pub messages: Vec<Received>,
    pub audio: Vec<f32>,
    pub text: String,
}

/// Streams `pcm` at real pace in 40 ms messages, waits `tail` for the last answers, closes.
pub async fn converse(url: &str, pcm: &[f32], tail: Duration) -> Conversation {
    let (mut tx, mut rx) = client::connect(url, OpusPacketing::WEB_CLIENT)
        .await
        .expect("connect");
    let receiver = tokio::spawn(async move {
        let mut messages = Vec::new();
        loop {
            let m = tokio::time::timeout(Duration::from_secs(30), rx.recv())
                .await
                .expect("the server went silent")
                .expect("receive");
            let closed = matches!(m, Received::Closed(_));
            messages.push(m);
            if closed {
                return messages;
            }
        }
    });
    let start = tokio::time::Instant::now();
    for (i, chunk) in pcm.chunks(960).enumerate() {
        tokio::time::sleep_until(start + Duration::from_millis(40 * i as u64)).await;
        tx.send_pcm(chunk).await.expect("send audio");
    }
    tokio::time::sleep(tail).await;
    tx.close().await.expect("close");
    let messages = receiver.await.unwrap();
    let mut audio = Vec::new();
    let mut text = String::new();
    for m in &messages {
        match m {
            Received::Audio(pcm) => audio.extend_from_slice(pcm),
            Received::Text(t) => text.push_str(t),
            _ => {}
        }
    }
    Conversation {
        messages,
        audio,
        text,
    }
}

pub fn wait_for_file(dir: &Path, suffix: &str) -> PathBuf {
    let t0 = Instant::now();
    loop {
        if let Some(p) = files_ending(dir, suffix).pop() {
            return p;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no *{suffix} in {}",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `moshi-rs file --greedy` of `heard` (a session's `-in.wav`) on `model` with `--kv-cache
/// kv_cache`: its `--tokens-out` text and its printed words.
pub fn file_tokens(heard: &Path, model: &Path, kv_cache: &str) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("t.jsonl");
    let o = Command::new(env!("CARGO_BIN_EXE_moshi-rs"))
        .args(["file", heard.to_str().unwrap()])
        .arg(dir.path().join("out.wav"))
        .args(["--model", model.to_str().unwrap(), "--greedy"])
        .args(["--kv-cache", kv_cache])
        .arg("--tokens-out")
        .arg(&tokens)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout).trim_end().to_string();
    (std::fs::read_to_string(&tokens).unwrap(), text)
}
