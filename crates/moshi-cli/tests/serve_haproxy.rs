//! Three `moshi-rs serve` replicas (`--max-sessions 1` each) behind HAProxy, Debian's package,
//! run with docs/examples/haproxy.cfg as documented (`balance leastconn`, health checks on
//! `/api/ready`, retries on 503), all on loopback, with the project's Rust client:
//! - three clients get three different replicas, a fourth gets HTTP 503 from the balancer, and
//!   the replicas' `/metrics` add up to what the clients did;
//! - SIGTERM to one replica: its live session goes on to its end, a new session goes to
//!   another replica, and the drained replica exits when its session ends;
//! - `kill -9` of one replica: only its own session ends; another replica's client hears no gap.
//!
//! SKIPPED without haproxy (`bash scripts/setup.sh --serve-e2e` installs it); fails where `CI`
//! is set.

mod common;

use std::io::{Read, Write};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::balancer::{haproxy_present, Balancer};
use common::serve::{tiny_model, Server};
use moshi_server::client::{self, ClientError, Received};
use moshi_server::metrics::{of_module, sample};
use moshi_server::ogg_opus::OpusPacketing;

/// `GET path` on `addr`: (status, body).
fn get(addr: &str, path: &str) -> (u16, String) {
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        tcp,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    tcp.read_to_string(&mut text).unwrap();
    let status = text.split(' ').nth(1).unwrap().parse().unwrap();
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

fn used(r: &Server) -> usize {
    let (_, body) = get(&r.addr, "/api/capacity");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["used"].as_u64().unwrap() as usize
}

/// The replica's `/api/chat` module's sample `name`.
fn metric(r: &Server, name: &str) -> f64 {
    let (_, text) = get(&r.addr, "/metrics");
    let name = of_module(name, "/api/chat");
    sample(&text, &name).unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

/// Waits until the replicas' sessions are `want` (in order), or panics after 10 s.
fn wait_used(replicas: &[&Server], want: &[usize]) {
    let t0 = Instant::now();
    loop {
        let got: Vec<usize> = replicas.iter().map(|r| used(r)).collect();
        if got == want {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "sessions per replica: {got:?}, expected {want:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What a client saw.
#[derive(Debug, Default)]
struct Heard {
    samples: usize,
    frames_sent: usize,
    errors: Vec<String>,
    /// Longest time between two audio messages with samples, after the first.
    longest_gap: Duration,
    /// The connection ended without a close from the server (a replica killed).
    lost: bool,
}

/// A client talking at real pace through the balancer until `stop` is set or `max_frames`
/// are sent, then closing.
struct Talker {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Heard>,
}

impl Talker {
    fn start(rt: &tokio::runtime::Runtime, url: String, max_frames: usize) -> Talker {
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = stop.clone();
        let task = rt.spawn(async move {
            let (mut tx, mut rx) = client::connect(&url, OpusPacketing::WEB_CLIENT)
                .await
                .expect("connect through the balancer");
            let heard = Arc::new(Mutex::new(Heard::default()));
            let heard_rx = heard.clone();
            let receiver = tokio::spawn(async move {
                let mut last_audio: Option<Instant> = None;
                loop {
                    let m = tokio::time::timeout(Duration::from_secs(20), rx.recv()).await;
                    let mut h = heard_rx.lock().unwrap();
                    match m {
                        Ok(Ok(Received::Audio(pcm))) if !pcm.is_empty() => {
                            h.samples += pcm.len();
                            let now = Instant::now();
                            if let Some(t) = last_audio {
                                h.longest_gap = h.longest_gap.max(now - t);
                            }
                            last_audio = Some(now);
                        }
                        Ok(Ok(Received::Error(e))) => h.errors.push(e),
                        Ok(Ok(Received::Closed(Some(_)))) => return,
                        Ok(Ok(Received::Closed(None)) | Err(_)) | Err(_) => {
                            h.lost = true;
                            return;
                        }
                        Ok(Ok(_)) => {}
                    }
                }
            });
            let start = tokio::time::Instant::now();
            let mut sent = 0;
            while sent < max_frames && !stop_flag.load(Ordering::Relaxed) {
                tokio::time::sleep_until(start + Duration::from_millis(80 * sent as u64)).await;
                let pcm: Vec<f32> = (0..1920)
                    .map(|n| 0.1 * ((sent * 1920 + n) as f32 * 0.05).sin())
                    .collect();
                if tx.send_pcm(&pcm).await.is_err() {
                    break;
                }
                sent += 1;
            }
            tokio::time::sleep(Duration::from_millis(400)).await;
            let _ = tx.close().await;
            let _ = tokio::time::timeout(Duration::from_secs(10), receiver).await;
            let mut h = std::mem::take(&mut *heard.lock().unwrap());
            h.frames_sent = sent;
            h
        });
        Talker { stop, task }
    }

    fn finish(self, rt: &tokio::runtime::Runtime) -> Heard {
        self.stop.store(true, Ordering::Relaxed);
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(30), self.task)
                .await
                .expect("the client ended")
                .unwrap()
        })
    }
}

/// Starts a talker and waits until one more replica holds a session; returns it and the index
/// of its replica.
fn talk_on_a_free_replica(
    rt: &tokio::runtime::Runtime,
    lb: &Balancer,
    replicas: &[&Server],
    max_frames: usize,
) -> (Talker, usize) {
    let before: Vec<usize> = replicas.iter().map(|r| used(r)).collect();
    let talker = Talker::start(rt, lb.url(), max_frames);
    let t0 = Instant::now();
    loop {
        let now: Vec<usize> = replicas.iter().map(|r| used(r)).collect();
        if let Some(i) = (0..replicas.len()).find(|&i| now[i] > before[i]) {
            return (talker, i);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no replica took the session: {before:?} -> {now:?}"
        );
        std::thread::sleep(Duration::from_millis(30));
    }
}

/// A healthy session: no error, and it heard (nearly) everything it said.
fn assert_complete(h: &Heard, who: &str) {
    assert!(h.errors.is_empty(), "{who}: {:?}", h.errors);
    assert!(!h.lost, "{who}: the connection was lost");
    assert!(
        h.samples >= (h.frames_sent.saturating_sub(6)) * 1920 && h.frames_sent >= 10,
        "{who}: sent {} frames, heard {} samples",
        h.frames_sent,
        h.samples
    );
}

/// `text` without its ANSI colour sequences (`ESC [ ... m`).
fn without_colours(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn start_replicas() -> Vec<Server> {
    let handles: Vec<_> = (0..3)
        .map(|_| {
            std::thread::spawn(|| {
                Server::start(&[
                    "--model",
                    tiny_model().to_str().unwrap(),
                    "--static",
                    "none",
                    "--max-sessions",
                    "1",
                    "--trust-forwarded",
                    "--drain-timeout-s",
                    "20",
                ])
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn three_replicas_behind_haproxy_share_refuse_drain_and_survive_a_kill() {
    if !haproxy_present("serve_haproxy") {
        return;
    }
    let mut replicas = start_replicas();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let all: Vec<&Server> = replicas.iter().collect();
    let lb = Balancer::start(&all.iter().map(|r| r.addr.as_str()).collect::<Vec<_>>());
    // The first health checks.
    std::thread::sleep(Duration::from_millis(1200));

    // Three clients, three replicas; a fourth is refused by the balancer.
    let mut first = Vec::new();
    for _ in 0..3 {
        first.push(talk_on_a_free_replica(&rt, &lb, &all, 50));
    }
    let mut placed: Vec<usize> = first.iter().map(|(_, i)| *i).collect();
    placed.sort();
    assert_eq!(placed, vec![0, 1, 2], "one session per replica");
    let refused = rt.block_on(client::connect(&lb.url(), OpusPacketing::WEB_CLIENT));
    match refused {
        Err(ClientError::Websocket(tokio_tungstenite::tungstenite::Error::Http(r))) => {
            assert_eq!(r.status(), 503, "{r:?}")
        }
        other => panic!(
            "a fourth client: expected HTTP 503, got {:?}",
            other.map(|_| ())
        ),
    }
    let heard: Vec<Heard> = first
        .into_iter()
        .map(|(t, _)| t.task)
        .map(|task| rt.block_on(task).unwrap())
        .collect();
    for (i, h) in heard.iter().enumerate() {
        assert_complete(h, &format!("client {i}"));
    }
    wait_used(&all, &[0, 0, 0]);
    // The replicas' metrics add up to what the clients did.
    let sum = |name: &str| all.iter().map(|r| metric(r, name)).sum::<f64>();
    for r in &all {
        assert_eq!(metric(r, "moshi_rs_sessions_started_total"), 1.0);
    }
    assert_eq!(
        sum(r#"moshi_rs_sessions_ended_total{reason="client_closed"}"#),
        3.0
    );
    let processed = sum("moshi_rs_frames_processed_total");
    let heard_frames: usize = heard.iter().map(|h| h.samples / 1920).sum();
    let sent_frames: usize = heard.iter().map(|h| h.frames_sent).sum();
    assert!(
        processed >= heard_frames as f64 && processed <= sent_frames as f64,
        "processed {processed}, heard {heard_frames}, sent {sent_frames}"
    );
    // Every replica logged its client at the address HAProxy reported (no port: forwarded).
    for r in &all {
        let log = without_colours(&r.log());
        assert!(log.contains("peer=127.0.0.1 "), "{log}");
    }

    // Drain: sessions on every replica; one ends; SIGTERM to another.
    std::thread::sleep(Duration::from_millis(1200));
    let (d0, a) = talk_on_a_free_replica(&rt, &lb, &all, 10_000);
    let (d1, b) = talk_on_a_free_replica(&rt, &lb, &all, 10_000);
    let (d2, c) = talk_on_a_free_replica(&rt, &lb, &all, 10_000);
    std::thread::sleep(Duration::from_millis(1500));
    let h1 = d1.finish(&rt);
    assert_complete(&h1, "the session ended to free a replica");
    let mut want = [1, 1, 1];
    want[b] = 0;
    wait_used(&all, &want);
    std::thread::sleep(Duration::from_millis(1200));
    all[a].signal("TERM");
    all[a].wait_for_log("draining", Duration::from_secs(5));
    assert_eq!(get(&all[a].addr, "/api/ready").0, 503);
    std::thread::sleep(Duration::from_millis(800));
    let (e0, landed) = talk_on_a_free_replica(&rt, &lb, &all, 10_000);
    assert_eq!(landed, b, "the new session went to the free replica");
    assert_eq!(metric(all[a], "moshi_rs_sessions_started_total"), 2.0);
    std::thread::sleep(Duration::from_millis(1000));
    let h0 = d0.finish(&rt);
    assert_complete(&h0, "the drained replica's session");
    drop(all);
    let status = replicas[a]
        .wait_exit(Duration::from_secs(10))
        .expect("the drained replica exits once its session ended");
    assert!(status.success(), "{status:?}\n{}", replicas[a].log());
    assert!(replicas[a].log().contains("drained: every session ended"));

    // kill -9 of one replica: its session ends; the other one's audio goes on without a gap.
    std::thread::sleep(Duration::from_millis(1000));
    replicas[c].signal("KILL");
    std::thread::sleep(Duration::from_millis(1500));
    let h2 = d2.finish(&rt);
    assert!(
        h2.lost,
        "the killed replica's client lost its connection: {h2:?}"
    );
    let he = e0.finish(&rt);
    assert_complete(&he, "the surviving replica's session");
    assert!(
        he.longest_gap < Duration::from_millis(500),
        "a gap of {:?} in the surviving session's audio",
        he.longest_gap
    );
    assert_eq!(metric(&replicas[b], "moshi_rs_sessions_started_total"), 3.0);
    let survivor = replicas.swap_remove(b);
    let log = survivor.log();
    assert!(survivor.stop(), "{log}");
}
