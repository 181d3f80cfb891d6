//! Soak: `moshi-rs serve --max-sessions 4` with the tiny model through 100 sessions one after
//! another and 10 rounds of 4 at once; afterwards its resident memory is back to the baseline
//! (within 10 %) and it holds no more file descriptors than before.

mod common;

use std::time::Duration;

use common::serve::{tiny_model, Server};
use moshi_server::client::{self, Received};
use moshi_server::ogg_opus::OpusPacketing;

/// Resident memory of a process, in kB.
fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// (RSS kB, open fds) once the sessions just closed are gone: a client sees the close frame a
/// moment before the server drops its socket, so the fds are read until they stop falling
/// below `fds_baseline` or 2 s pass (a leaked descriptor never goes).
fn settled(pid: u32, fds_baseline: usize) -> (u64, usize) {
    let t0 = std::time::Instant::now();
    while open_fds(pid) > fds_baseline && t0.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    (rss_kb(pid), open_fds(pid))
}

/// One short conversation: 3 frames of audio sent at once (no more than the server keeps
/// waiting whatever the model's pace, so none is dropped), the answers read until at least
/// `min_frames` frames have come back, then a clean close.
async fn session(url: String, min_frames: usize) {
    let (mut tx, mut rx) = client::connect(&url, OpusPacketing::WEB_CLIENT)
        .await
        .expect("connect");
    let tone: Vec<f32> = (0..3 * 1920)
        .map(|n| 0.1 * (n as f32 * 0.05).sin())
        .collect();
    for chunk in tone.chunks(960) {
        tx.send_pcm(chunk).await.unwrap();
    }
    let mut samples = 0;
    while samples < min_frames * 1920 {
        match tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .expect("no answer within 20 s")
            .unwrap()
        {
            Received::Audio(pcm) => samples += pcm.len(),
            Received::Error(e) => panic!("server error: {e}"),
            Received::Closed(c) => panic!("closed early: {c:?}"),
            _ => {}
        }
    }
    tx.close().await.unwrap();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
            Ok(Ok(Received::Closed(_))) | Ok(Err(_)) => break,
            Ok(Ok(_)) => {}
            Err(_) => panic!("the server did not close within 10 s"),
        }
    }
}

async fn round(url: &str, at_once: usize) {
    let tasks: Vec<_> = (0..at_once)
        // The client's decoder drops the Opus pre-skip: 3 frames sent, a little less than 3 back.
        .map(|_| tokio::spawn(session(url.to_string(), 2)))
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

#[test]
fn sessions_leave_no_memory_or_descriptors_behind() {
    let server = Server::start(&[
        "--model",
        tiny_model().to_str().unwrap(),
        "--static",
        "none",
        "--max-sessions",
        "4",
    ]);
    let url = server.ws_url("");
    let pid = server.pid();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // Warm-up: every slot and thread has run once (allocator arenas, caches).
    runtime.block_on(round(&url, 4));
    runtime.block_on(round(&url, 1));
    std::thread::sleep(Duration::from_millis(500));
    let (rss0, fds0) = settled(pid, 0);

    for _ in 0..100 {
        runtime.block_on(round(&url, 1));
    }
    let (rss1, fds1) = settled(pid, fds0);
    for _ in 0..10 {
        runtime.block_on(round(&url, 4));
    }
    let (rss2, fds2) = settled(pid, fds0);
    eprintln!(
        "serve soak: RSS {rss0} kB at the start, {rss1} kB after 100 sessions one after another, \
         {rss2} kB after 10 rounds of 4 at once; open fds {fds0} -> {fds1} -> {fds2}"
    );
    let log = server.log();
    let ended = log.matches("session ended").count();
    assert_eq!(ended, 5 + 100 + 40, "every session ended and was logged");
    assert_eq!(
        log.matches("session ended: the client closed the connection")
            .count(),
        ended,
        "every session ended cleanly:\n{log}"
    );
    for (rss, what) in [(rss1, "100 sequential"), (rss2, "40 concurrent")] {
        assert!(
            rss as f64 <= rss0 as f64 * 1.10,
            "RSS {rss} kB after {what} sessions, baseline {rss0} kB (more than 10 % above)"
        );
    }
    assert!(
        fds1 <= fds0 && fds2 <= fds0,
        "fds {fds0} -> {fds1} -> {fds2}"
    );
    assert!(server.stop(), "the server did not stop cleanly");
}
