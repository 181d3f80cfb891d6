//! The server against bad and hostile clients (tiny model, in process, short limits): an
//! oversized message, malformed Ogg, malformed Opus, unknown kinds, text frames, a silent client,
//! a client that never reads, an abrupt disconnect, one session too many (HTTP 503 before the
//! upgrade). Each ends only its
//! own session, with a kind-5 sentence while the socket is open, while a well-behaved session
//! talks throughout and ends normally. Also: frames beyond real time dropped and reported, TLS,
//! and Ctrl-C (shutdown) closing sessions with a message.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use moshi_loader::{ModelSource, SourceOverrides, WeightMode};
use moshi_model::generator::SamplingConfig;
use moshi_runtime::engine::DropPolicy;
use moshi_runtime::pipeline::{MoshiModel, SessionSettings};
use moshi_server::batch_engine::BatchEngine;
use moshi_server::client::{self, ChatReceiver, Received};
use moshi_server::ogg_opus::{OggOpusWriter, OpusPacketing};
use moshi_server::{Endpoint, Limits, Module, RunningServer, ServerConfig, WebUi};
use moshi_test_support::tiny_a_dir;
use tokio::io::{AsyncRead, AsyncWrite};

/// An engine over the tiny model, greedy.
fn pool(max_sessions: usize, policy: DropPolicy, queue_frames: usize) -> BatchEngine {
    let model =
        ModelSource::resolve(tiny_a_dir().to_str().unwrap(), &SourceOverrides::default()).unwrap();
    let model = MoshiModel::load(&model, WeightMode::Native, Default::default()).unwrap();
    let settings = SessionSettings::with_sampling(SamplingConfig::greedy());
    BatchEngine::new(
        Arc::new(model),
        settings,
        max_sessions,
        policy,
        queue_frames,
    )
    .unwrap()
}

fn limits() -> Limits {
    Limits {
        idle_timeout: Duration::from_secs(2),
        not_reading_timeout: Duration::from_secs(2),
        ..Limits::default()
    }
}

async fn start(max_sessions: usize, limits: Limits) -> RunningServer {
    let mut config = ServerConfig::new("127.0.0.1:0".parse().unwrap());
    config.web_ui = WebUi::None;
    config.limits = limits;
    let pool = pool(
        max_sessions,
        DropPolicy::RealTime {
            max_backlog_frames: 2,
        },
        8,
    );
    let mut module = Module::new(Endpoint::Chat, Arc::new(pool));
    module.default_sampling = SamplingConfig::greedy();
    moshi_server::start(config, vec![module]).await.unwrap()
}

fn url(addr: SocketAddr) -> String {
    format!("ws://{addr}/api/chat")
}

/// 80 ms of a quiet tone.
fn frame_pcm(i: usize) -> Vec<f32> {
    (0..1920)
        .map(|n| 0.1 * ((i * 1920 + n) as f32 * 0.05).sin())
        .collect()
}

/// Waits for the first message that is not audio, text or metadata (an error or the close).
async fn next_ending<S: AsyncRead + AsyncWrite + Unpin>(rx: &mut ChatReceiver<S>) -> Vec<Received> {
    let mut seen = Vec::new();
    loop {
        let m = tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .expect("no end within 20 s")
            .unwrap_or(Received::Closed(None));
        let done = matches!(m, Received::Closed(_));
        if !matches!(
            m,
            Received::Audio(_) | Received::Text(_) | Received::Metadata(_)
        ) {
            seen.push(m);
        }
        if done {
            return seen;
        }
    }
}

fn error_of(seen: &[Received]) -> String {
    seen.iter()
        .find_map(|m| match m {
            Received::Error(e) => Some(e.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no kind-5 message: {seen:?}"))
}

fn close_code(seen: &[Received]) -> Option<u16> {
    seen.iter().find_map(|m| match m {
        Received::Closed(Some((code, _))) => Some(*code),
        _ => None,
    })
}

/// A well-behaved client talking at real pace for `seconds`; returns the audio frames it got.
async fn good_session(addr: SocketAddr, seconds: f64) -> usize {
    let (mut tx, mut rx) = client::connect(&url(addr), OpusPacketing::WEB_CLIENT)
        .await
        .unwrap();
    let receiver = tokio::spawn(async move {
        let mut samples = 0usize;
        loop {
            match rx.recv().await.unwrap() {
                Received::Audio(pcm) => samples += pcm.len(),
                Received::Closed(code) => return (samples, code),
                Received::Error(e) => panic!("the good session got an error: {e}"),
                _ => {}
            }
        }
    });
    let frames = (seconds / 0.08) as usize;
    let start = tokio::time::Instant::now();
    for i in 0..frames {
        tokio::time::sleep_until(start + Duration::from_millis(80 * i as u64)).await;
        tx.send_pcm(&frame_pcm(i)).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    tx.close().await.unwrap();
    let (samples, code) = receiver.await.unwrap();
    assert_eq!(
        code.map(|c| c.0),
        Some(1000),
        "the good session ends normally"
    );
    samples / 1920
}

/// Sends `bytes` as one message on a fresh session and returns what ended it.
async fn send_and_end(addr: SocketAddr, bytes: Vec<u8>) -> Vec<Received> {
    let (mut tx, mut rx) = client::connect(&url(addr), OpusPacketing::WEB_CLIENT)
        .await
        .unwrap();
    assert_eq!(rx.recv().await.unwrap(), Received::Handshake);
    tx.send_raw(bytes).await.unwrap();
    next_ending(&mut rx).await
}

/// Valid Ogg/Opus headers (pages 0 and 1) and one valid audio page.
fn valid_stream_start() -> Vec<u8> {
    let mut w = OggOpusWriter::new(1, OpusPacketing::SERVER).unwrap();
    w.push(&frame_pcm(0)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_end_only_their_own_session() {
    let server = start(2, limits()).await;
    let addr = server.local_addr();
    let good = tokio::spawn(good_session(addr, 14.0));
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Oversized message (the limit is 256 KiB).
    let seen = send_and_end(addr, vec![1u8; 300 * 1024]).await;
    let e = error_of(&seen);
    assert!(e.contains("at most 262144"), "{e}");
    assert_eq!(close_code(&seen), Some(1009));

    // Not Ogg.
    let seen = send_and_end(addr, b"\x01RIFF\x00\x00\x00\x00WAVEfmt ".to_vec()).await;
    assert!(error_of(&seen).contains("capture pattern"), "{seen:?}");
    assert_eq!(close_code(&seen), Some(1008));

    // Ogg pages whose packets are not Opus.
    let mut bytes = vec![1u8];
    let start_pages = valid_stream_start();
    bytes.extend_from_slice(&start_pages);
    let mut garbage_page = ogg::writing::PacketWriter::new(Vec::new());
    // Same serial as the writer's, the next sequence number.
    garbage_page
        .write_packet(
            vec![0xffu8; 60],
            1,
            ogg::writing::PacketWriteEndInfo::EndPage,
            0,
        )
        .unwrap();
    let mut g = garbage_page.into_inner();
    g[5] = 0; // not a first page
    g[18..22].copy_from_slice(&4u32.to_le_bytes()); // after OpusHead, OpusTags, 2 audio pages
    g[22..26].copy_from_slice(&[0; 4]);
    let crc = ogg_crc(&g);
    g[22..26].copy_from_slice(&crc.to_le_bytes());
    bytes.extend_from_slice(&g);
    let seen = send_and_end(addr, bytes).await;
    assert!(error_of(&seen).contains("cannot be decoded"), "{seen:?}");

    // An empty message, a text frame.
    let seen = send_and_end(addr, Vec::new()).await;
    assert!(error_of(&seen).contains("empty message"), "{seen:?}");
    {
        let (mut tx, mut rx) = client::connect(&url(addr), OpusPacketing::WEB_CLIENT)
            .await
            .unwrap();
        tx.send_text("hello").await.unwrap();
        let seen = next_ending(&mut rx).await;
        assert!(
            error_of(&seen).contains("text websocket messages"),
            "{seen:?}"
        );
    }

    // Kinds the protocol defines but a session does not use, and kinds it does not define
    // (protocol.md: unknown types are discarded), are discarded and counted, not fatal.
    {
        let (mut tx, mut rx) = client::connect(
            &format!("{}?stats_s=0.5", url(addr)),
            OpusPacketing::WEB_CLIENT,
        )
        .await
        .unwrap();
        tx.send_raw(vec![3, 0]).await.unwrap(); // control: start
        tx.send_raw(vec![6]).await.unwrap(); // ping
        tx.send_raw(b"\x09hello".to_vec()).await.unwrap(); // unknown kinds
        tx.send_raw(vec![255]).await.unwrap();
        for i in 0..5 {
            tx.send_pcm(&frame_pcm(i)).await.unwrap();
        }
        let mut audio = 0;
        let mut discarded = 0;
        let mut i = 5;
        let start = tokio::time::Instant::now();
        while audio < 2 || discarded < 4 {
            match tokio::time::timeout(Duration::from_millis(80), rx.recv()).await {
                Ok(m) => match m.unwrap() {
                    Received::Audio(p) if !p.is_empty() => audio += 1,
                    Received::Metadata(m) if m.get("moshi_rs_stats").is_some() => {
                        discarded = m["moshi_rs_stats"]["messages_discarded"].as_u64().unwrap();
                    }
                    Received::Error(e) => panic!("{e}"),
                    Received::Closed(c) => panic!("closed: {c:?}"),
                    _ => {}
                },
                // Keep talking at real pace while waiting for the statistics.
                Err(_) => {
                    tx.send_pcm(&frame_pcm(i)).await.unwrap();
                    i += 1;
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "audio {audio}, discarded {discarded}"
            );
        }
        assert_eq!(discarded, 4);
        tx.close().await.unwrap();
        // The server frees the model slot before it answers the close: wait for the answer, or
        // the next connection may find both slots taken.
        let seen = next_ending(&mut rx).await;
        assert_eq!(close_code(&seen), Some(1000), "{seen:?}");
    }

    // A silent client: closed after the idle timeout (2 s here).
    {
        let (_tx, mut rx) = client::connect(&url(addr), OpusPacketing::WEB_CLIENT)
            .await
            .unwrap();
        let t0 = tokio::time::Instant::now();
        let seen = next_ending(&mut rx).await;
        assert!(
            error_of(&seen).contains("no audio from the client for 2 s"),
            "{seen:?}"
        );
        assert!(t0.elapsed() >= Duration::from_millis(1900));
    }

    // An abrupt disconnect mid-stream.
    {
        let (mut tx, rx) = client::connect(&url(addr), OpusPacketing::WEB_CLIENT)
            .await
            .unwrap();
        for i in 0..5 {
            tx.send_pcm(&frame_pcm(i)).await.unwrap();
        }
        drop(tx);
        drop(rx);
        // Its session ends and releases its slot: only the good session (while it lasts) runs.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let expected = if good.is_finished() { 0 } else { 1 };
            let running = server.running_sessions();
            if running <= expected {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{running} sessions still running 5 s after an abrupt disconnect"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    let frames = good.await.unwrap();
    assert!(
        frames >= 150,
        "the good session got {frames} frames in 14 s"
    );
    assert!(
        server.shutdown(Duration::from_secs(3)).await,
        "every session closed at shutdown"
    );
}

/// A client that closes while answers are still on their way gets the close handshake's reply
/// every time: messages queued for it are refused once its close is read, and the reply the
/// websocket owes is still written (before, the refused send ended the writer without it, so
/// the client saw the connection drop without a close frame now and then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_mid_stream_always_gets_the_close_reply() {
    let server = start(1, limits()).await;
    let addr = server.local_addr();
    for round in 0..20 {
        let (mut tx, mut rx) = client::connect(&url(addr), OpusPacketing::WEB_CLIENT)
            .await
            .unwrap();
        // A burst: the server has answers queued when the close arrives.
        for i in 0..12 {
            tx.send_pcm(&frame_pcm(i)).await.unwrap();
        }
        loop {
            match rx.recv().await.unwrap() {
                Received::Audio(p) if !p.is_empty() => break,
                Received::Error(e) => panic!("round {round}: {e}"),
                Received::Closed(c) => panic!("round {round}: closed early: {c:?}"),
                _ => {}
            }
        }
        tx.close().await.unwrap();
        let seen = next_ending(&mut rx).await;
        assert_eq!(close_code(&seen), Some(1000), "round {round}: {seen:?}");
    }
    assert!(
        server.shutdown(Duration::from_secs(3)).await,
        "every session closed at shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_dropped_without_unbounded_buffering() {
    let server = start(2, limits()).await;
    let addr = server.local_addr();
    let good = tokio::spawn(good_session(addr, 8.0));

    // A socket with a tiny receive window, and nobody reading it.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(2048).unwrap();
    let tcp = socket.connect(addr).await.unwrap();
    let (ws, _) = tokio_tungstenite::client_async(url(addr), tcp)
        .await
        .unwrap();
    let (mut tx, rx) = client::split(ws, OpusPacketing::WEB_CLIENT).unwrap();
    let start = tokio::time::Instant::now();
    let mut ended = false;
    for i in 0..400 {
        // Talks at twice the real pace: the server answers every frame and nobody reads them.
        tokio::time::sleep_until(start + Duration::from_millis(40 * i as u64)).await;
        if tx.send_pcm(&frame_pcm(i)).await.is_err() {
            ended = true;
            break;
        }
    }
    drop(rx);
    assert!(ended, "the server never closed a client that does not read");
    // An unanswered ping (sent within 1 s) for 2 s ends the session; the client's next writes fail.
    eprintln!(
        "the non-reading client was dropped after {:?}",
        start.elapsed()
    );
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "took {:?}",
        start.elapsed()
    );
    let frames = good.await.unwrap();
    assert!(frames >= 80, "the good session got {frames} frames in 8 s");
    assert!(
        server.shutdown(Duration::from_secs(3)).await,
        "every session closed at shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_beyond_real_time_are_dropped_counted_and_reported_to_the_client() {
    let server = start(1, limits()).await;
    let (mut tx, mut rx) = client::connect(&url(server.local_addr()), OpusPacketing::WEB_CLIENT)
        .await
        .unwrap();
    // 4 s of audio at once: far more than the model takes while it works on one frame.
    for i in 0..50 {
        tx.send_pcm(&frame_pcm(i)).await.unwrap();
    }
    let dropped = loop {
        match tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("no statistics within 10 s")
            .unwrap()
        {
            Received::Metadata(m) if m.get("moshi_rs_stats").is_some() => {
                break m["moshi_rs_stats"]["input_frames_dropped"]
                    .as_u64()
                    .unwrap();
            }
            Received::Error(e) => panic!("{e}"),
            Received::Closed(c) => panic!("closed: {c:?}"),
            _ => {}
        }
    };
    assert!(dropped > 0, "frames were dropped and the client was told");
    tx.close().await.unwrap();
    assert!(
        server.shutdown(Duration::from_secs(3)).await,
        "every session closed at shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_session_too_many_gets_busy_and_shutdown_says_goodbye() {
    let server = start(1, limits()).await;
    let addr = server.local_addr();
    let (mut tx, mut rx) = client::connect(&url(addr), OpusPacketing::WEB_CLIENT)
        .await
        .unwrap();
    assert_eq!(rx.recv().await.unwrap(), Received::Handshake);
    tx.send_pcm(&frame_pcm(0)).await.unwrap();

    // A full server answers the upgrade with 503 and Retry-After (a load balancer tries
    // another replica); the body says why.
    let refused = client::connect(&url(addr), OpusPacketing::WEB_CLIENT).await;
    let Err(client::ClientError::Websocket(tokio_tungstenite::tungstenite::Error::Http(response))) =
        refused
    else {
        panic!("expected HTTP 503, got {:?}", refused.map(|_| ()));
    };
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "2");
    let body = String::from_utf8_lossy(response.body().as_deref().unwrap_or_default()).to_string();
    assert!(body.contains("busy"), "{body}");

    // Bad query parameters: refused with the parameter named.
    let (_tx3, mut rx3) = client::connect(
        &format!("{}?text_temperature=hot", url(addr)),
        OpusPacketing::WEB_CLIENT,
    )
    .await
    .unwrap();
    let seen = next_ending(&mut rx3).await;
    assert!(error_of(&seen).contains("text_temperature"), "{seen:?}");

    let closing = tokio::spawn(async move { next_ending(&mut rx).await });
    assert!(
        server.shutdown(Duration::from_secs(3)).await,
        "every session closed at shutdown"
    );
    let seen = closing.await.unwrap();
    assert!(error_of(&seen).contains("shutting down"), "{seen:?}");
    assert_eq!(close_code(&seen), Some(1001));
}

/// Sends a frame every `every_ms` from a fresh session until the server ends it; returns
/// what ended it and when.
async fn send_at_pace(addr: SocketAddr, every_ms: u64, frames: usize) -> (Vec<Received>, Duration) {
    let (mut tx, mut rx) = client::connect(&url(addr), OpusPacketing::WEB_CLIENT)
        .await
        .unwrap();
    let start = tokio::time::Instant::now();
    let ending = tokio::spawn(async move {
        let seen = next_ending(&mut rx).await;
        (seen, start.elapsed())
    });
    for i in 0..frames {
        tokio::time::sleep_until(start + Duration::from_millis(every_ms * i as u64)).await;
        if ending.is_finished() || tx.send_pcm(&frame_pcm(i)).await.is_err() {
            break;
        }
    }
    ending.await.unwrap()
}

/// A client trickling audio (80 ms every 500 ms: 0.16x real time) no longer holds a session
/// slot: below 0.5x over the window (2 s here) it gets a kind-5 and is closed, while a client at
/// real pace talks on. Before, any audio reset the idle timer and the session lived forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trickling_audio_is_closed() {
    let server = start(
        2,
        Limits {
            idle_timeout: Duration::from_secs(10),
            min_audio_window: Duration::from_secs(2),
            ..limits()
        },
    )
    .await;
    let addr = server.local_addr();
    let good = tokio::spawn(good_session(addr, 6.0));
    let (seen, took) = send_at_pace(addr, 500, 40).await;
    let e = error_of(&seen);
    assert!(
        e.contains("in the last 2 s") && e.contains("at least 0.5x"),
        "{e}"
    );
    assert_eq!(close_code(&seen), Some(1008));
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(6),
        "{took:?}"
    );
    let frames = good.await.unwrap();
    assert!(frames >= 50, "the good session got {frames} frames in 6 s");
    assert!(
        server.shutdown(Duration::from_secs(3)).await,
        "every session closed at shutdown"
    );
}

/// Audio beyond the sustained pace (1.25x) plus the burst (1 s here) ends the session: a
/// client at 2x real time is closed after about 1.3 s. Before, the check allowed 4x real time
/// (plus 10 s ahead) forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audio_faster_than_the_sustained_pace_is_closed() {
    let server = start(
        2,
        Limits {
            max_audio_burst: Duration::from_secs(1),
            ..limits()
        },
    )
    .await;
    let addr = server.local_addr();
    let good = tokio::spawn(good_session(addr, 5.0));
    let (seen, took) = send_at_pace(addr, 40, 150).await;
    let e = error_of(&seen);
    assert!(
        e.contains("faster than real time") && e.contains("1.25x"),
        "{e}"
    );
    assert_eq!(close_code(&seen), Some(1008));
    assert!(took < Duration::from_secs(4), "{took:?}");
    let frames = good.await.unwrap();
    assert!(frames >= 40, "the good session got {frames} frames in 5 s");
    assert!(
        server.shutdown(Duration::from_secs(3)).await,
        "every session closed at shutdown"
    );
}

/// `shutdown` says whether every session closed within the grace: not when a client that
/// reads nothing holds its session's goodbye (which waits up to 2 s to leave) past a 300 ms
/// grace; yes when no session runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_reports_whether_every_session_closed() {
    let server = start(
        1,
        Limits {
            not_reading_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(60),
            socket_send_buffer_bytes: 0,
            ..limits()
        },
    )
    .await;
    let addr = server.local_addr();
    // A socket with a tiny receive window, and nobody reading it.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(2048).unwrap();
    let tcp = socket.connect(addr).await.unwrap();
    let (ws, _) = tokio_tungstenite::client_async(format!("{}?stats_s=0.5", url(addr)), tcp)
        .await
        .unwrap();
    let (mut tx, _rx) = client::split(ws, OpusPacketing::WEB_CLIENT).unwrap();
    // 3 s at real pace: the answers and statistics fill both small buffers.
    let t0 = tokio::time::Instant::now();
    for i in 0..38 {
        tokio::time::sleep_until(t0 + Duration::from_millis(80 * i as u64)).await;
        tx.send_pcm(&frame_pcm(i)).await.unwrap();
    }
    assert_eq!(server.running_sessions(), 1);
    assert!(
        !server.shutdown(Duration::from_millis(300)).await,
        "a session still closing was reported closed"
    );
    let idle = start(1, limits()).await;
    assert!(
        idle.shutdown(Duration::ZERO).await,
        "no session: all closed"
    );
}

/// Reads from `tcp` until the server closes it; returns how long that took (None: still open
/// after `within`).
async fn closed_within(tcp: &mut tokio::net::TcpStream, within: Duration) -> Option<Duration> {
    use tokio::io::AsyncReadExt;
    let t0 = tokio::time::Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout_at(t0 + within, tcp.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(t0.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

/// A connection that starts a request and never finishes its headers (slowloris) is closed
/// after `header_read_timeout`; so is one that says nothing. Before, hyper had no timer and held
/// both forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_request_headers_are_closed_after_the_header_timeout() {
    use tokio::io::AsyncWriteExt;
    let server = start(
        1,
        Limits {
            header_read_timeout: Duration::from_secs(1),
            ..limits()
        },
    )
    .await;
    let mut slow = tokio::net::TcpStream::connect(server.local_addr())
        .await
        .unwrap();
    slow.write_all(b"GET /api/chat HTTP/1.1\r\nHost: x\r\nX-Slow: a")
        .await
        .unwrap();
    let mut silent = tokio::net::TcpStream::connect(server.local_addr())
        .await
        .unwrap();
    let took = closed_within(&mut slow, Duration::from_secs(5)).await;
    assert!(
        took.is_some(),
        "a connection with unfinished headers was still open after 5 s"
    );
    assert!(took.unwrap() >= Duration::from_millis(900), "{took:?}");
    let took = closed_within(&mut silent, Duration::from_secs(5)).await;
    assert!(
        took.is_some(),
        "a connection that says nothing was still open after 5 s"
    );
    assert_eq!(server.running_sessions(), 0);
    assert!(
        server.shutdown(Duration::from_secs(3)).await,
        "every session closed at shutdown"
    );
}

/// With `max_pending_connections` connections holding unfinished requests, one more is closed
/// at once, and a websocket session that started before keeps talking; once they are gone, new
/// connections are served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_are_closed_without_harming_a_session() {
    use tokio::io::AsyncWriteExt;
    let server = start(
        1,
        Limits {
            max_pending_connections: 4,
            header_read_timeout: Duration::from_secs(3),
            ..limits()
        },
    )
    .await;
    let addr = server.local_addr();
    let (mut tx, mut rx) = client::connect(&url(addr), OpusPacketing::WEB_CLIENT)
        .await
        .unwrap();
    assert_eq!(rx.recv().await.unwrap(), Received::Handshake);
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        held.push(tcp);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for _ in 0..3 {
        let mut extra = tokio::net::TcpStream::connect(addr).await.unwrap();
        let took = closed_within(&mut extra, Duration::from_secs(2)).await;
        assert!(
            took.is_some(),
            "a connection beyond the cap was not closed at once"
        );
    }
    // The session keeps working: audio in, audio out.
    let start = tokio::time::Instant::now();
    let mut audio = 0;
    let mut i = 0;
    while audio < 10 {
        tokio::time::sleep_until(start + Duration::from_millis(80 * i as u64)).await;
        tx.send_pcm(&frame_pcm(i)).await.unwrap();
        i += 1;
        while let Ok(m) = tokio::time::timeout(Duration::from_millis(1), rx.recv()).await {
            match m.unwrap() {
                Received::Audio(p) if !p.is_empty() => audio += 1,
                Received::Error(e) => panic!("{e}"),
                Received::Closed(c) => panic!("closed: {c:?}"),
                _ => {}
            }
        }
        assert!(i < 200, "the session got {audio} audio messages in 16 s");
    }
    tx.close().await.unwrap();
    let seen = next_ending(&mut rx).await;
    assert_eq!(close_code(&seen), Some(1000), "{seen:?}");
    // The held connections are released (header timeout); new ones are served again.
    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (_tx, mut rx) = client::connect(&url(addr), OpusPacketing::WEB_CLIENT)
        .await
        .unwrap();
    assert_eq!(rx.recv().await.unwrap(), Received::Handshake);
    assert!(
        server.shutdown(Duration::from_secs(3)).await,
        "every session closed at shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_wss() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let o = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output();
    match o {
        Ok(o) if o.status.success() => {}
        _ => {
            eprintln!("SKIPPED tls_serves_wss: openssl cannot make a test certificate");
            return;
        }
    }
    let files = moshi_server::tls::TlsFiles {
        cert: cert.clone(),
        key: key.clone(),
    };
    // Bad files are named in the error.
    let wrong = moshi_server::tls::TlsFiles {
        cert: key.clone(),
        key: cert.clone(),
    };
    let e = wrong.acceptor().err().unwrap().to_string();
    assert!(e.contains("--tls-cert") && e.contains("key.pem"), "{e}");

    let mut config = ServerConfig::new("127.0.0.1:0".parse().unwrap());
    config.web_ui = WebUi::None;
    config.tls = Some(files);
    let pool = pool(1, DropPolicy::Lossless, 8);
    let module = Module::new(Endpoint::Chat, Arc::new(pool));
    let server = moshi_server::start(config, vec![module]).await.unwrap();
    assert!(server.url().starts_with("https://127.0.0.1:"));

    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from_pem_file(&cert).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(server.local_addr())
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(name, tcp)
        .await
        .unwrap();
    let wss = format!("wss://localhost:{}/api/chat", server.local_addr().port());
    let (ws, _) = tokio_tungstenite::client_async(wss, stream).await.unwrap();
    let (mut tx, mut rx) = client::split(ws, OpusPacketing::WEB_CLIENT).unwrap();
    assert_eq!(rx.recv().await.unwrap(), Received::Handshake);
    assert!(matches!(rx.recv().await.unwrap(), Received::Metadata(_)));
    for i in 0..4 {
        tx.send_pcm(&frame_pcm(i)).await.unwrap();
    }
    loop {
        match rx.recv().await.unwrap() {
            Received::Audio(p) if !p.is_empty() => break,
            Received::Error(e) => panic!("{e}"),
            _ => {}
        }
    }
    tx.close().await.unwrap();
    assert!(
        server.shutdown(Duration::from_secs(3)).await,
        "every session closed at shutdown"
    );
}

/// Ogg's CRC-32 (polynomial 0x04c11db7, no reflection), for hand-made pages.
fn ogg_crc(bytes: &[u8]) -> u32 {
    let mut crc = 0u32;
    for &b in bytes {
        crc ^= (b as u32) << 24;
        for _ in 0..8 {
            crc = if crc & 0x8000_0000 != 0 {
                (crc << 1) ^ 0x04c1_1db7
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// A TCP connection to `addr` from the loopback address `from` (Linux answers every 127/8
/// address), so one test can play several clients.
async fn connect_from(from: &str, addr: SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    socket.connect(addr).await.unwrap()
}

/// Issue #41 defect 7: connections that send nothing, as many as `max_pending_connections`,
/// used to lock every new client out until they timed out (and reconnecting kept it so). Now,
/// once the cap is reached, a new client takes the place of an idle connection: first one of an
/// address holding more than `max_pending_per_address` (whatever its age: reconnecting fast
/// does not help), else the one idle longest; an address over its share gets no new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_cannot_lock_new_clients_out() {
    let server = start(
        1,
        Limits {
            max_pending_connections: 4,
            max_pending_per_address: 2,
            pending_eviction_grace: Duration::from_millis(300),
            header_read_timeout: Duration::from_secs(30),
            ..limits()
        },
    )
    .await;
    let addr = server.local_addr();
    // One address fills the cap (below it, its share does not apply) ...
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(connect_from("127.0.0.2", addr).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ... gets no more (at the cap, over its share) ...
    let mut fifth = connect_from("127.0.0.2", addr).await;
    assert!(
        closed_within(&mut fifth, Duration::from_secs(2))
            .await
            .is_some(),
        "a connection from an address over its share was not closed at once"
    );
    // ... and a client from another address is served at once (within the grace: the
    // connections it replaces are fresh), in the place of that address's oldest.
    let (mut tx, mut rx) = client::connect(&url(addr), OpusPacketing::WEB_CLIENT)
        .await
        .unwrap();
    assert_eq!(rx.recv().await.unwrap(), Received::Handshake);
    assert!(
        closed_within(&mut idle[0], Duration::from_secs(2))
            .await
            .is_some(),
        "the oldest connection of the address over its share was not evicted"
    );
    tx.close().await.unwrap();
    let seen = next_ending(&mut rx).await;
    assert_eq!(close_code(&seen), Some(1000), "{seen:?}");
    drop(idle);

    // Four addresses, one idle connection each (none over its share): past the grace, a new
    // client takes the place of the one idle longest; the others stay open.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut idle = Vec::new();
    for from in ["127.0.0.5", "127.0.0.6", "127.0.0.7", "127.0.0.8"] {
        idle.push(connect_from(from, addr).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (mut tx, mut rx) = client::connect(&url(addr), OpusPacketing::WEB_CLIENT)
        .await
        .unwrap();
    assert_eq!(rx.recv().await.unwrap(), Received::Handshake);
    assert!(
        closed_within(&mut idle[0], Duration::from_secs(2))
            .await
            .is_some(),
        "the connection idle longest was not evicted"
    );
    for tcp in &mut idle[1..] {
        assert!(closed_within(tcp, Duration::from_millis(200))
            .await
            .is_none());
    }
    tx.close().await.unwrap();
    let seen = next_ending(&mut rx).await;
    assert_eq!(close_code(&seen), Some(1000), "{seen:?}");
    assert!(
        server.shutdown(Duration::from_secs(3)).await,
        "every session closed at shutdown"
    );
}

/// Sends `request` on a new connection and returns the status code of the answer (None: closed
/// without one).
async fn status_of(addr: SocketAddr, request: &[u8]) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = tcp.write_all(request).await;
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !answer.windows(2).any(|w| w == b"\r\n") {
        match tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => answer.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    answer.split(' ').nth(1).and_then(|code| code.parse().ok())
}

/// A request whose head is exactly `bytes` long (one padding header).
fn request_with_head(bytes: usize) -> Vec<u8> {
    let start = "GET / HTTP/1.1\r\nHost: x\r\nX-Pad: ";
    let end = "\r\n\r\n";
    let pad = bytes - start.len() - end.len();
    format!("{start}{}{end}", "a".repeat(pad)).into_bytes()
}

/// Issue #41 defect 15: the request head limit, documented as 32 KiB, let a 40,000-byte head
/// through (hyper's buffer grows past `max_buf_size`). Exactly the limit is served; one byte
/// more gets 431.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_one_byte_over_the_limit_gets_431() {
    let server = start(1, limits()).await;
    let addr = server.local_addr();
    let max = Limits::default().max_request_head_bytes;
    assert_eq!(max, 32 * 1024);
    let at = status_of(addr, &request_with_head(max)).await;
    assert!(matches!(at, Some(c) if c != 431), "{at:?}");
    assert_eq!(
        status_of(addr, &request_with_head(max + 1)).await,
        Some(431)
    );
    assert_eq!(status_of(addr, &request_with_head(40_000)).await, Some(431));
    assert!(server.shutdown(Duration::from_secs(3)).await);
}

/// A server with the web UI folder `dir` (tiny model, one session).
async fn start_with_static(dir: &std::path::Path) -> RunningServer {
    let mut config = ServerConfig::new("127.0.0.1:0".parse().unwrap());
    config.web_ui = WebUi::dir(dir).unwrap();
    config.limits = limits();
    let pool = pool(1, DropPolicy::Lossless, 8);
    let module = Module::new(Endpoint::Chat, Arc::new(pool));
    moshi_server::start(config, vec![module]).await.unwrap()
}

fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").into_bytes()
}

/// Issue #41 defect 14: with `--static`, a path component of 256 characters gave HTTP 500 (the
/// file system's "name too long"); it is a file that is not there: 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_a_path_component_too_long_for_a_file_system_is_404() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("index.html"), "<html></html>").unwrap();
    let server = start_with_static(dir.path()).await;
    let addr = server.local_addr();
    assert_eq!(status_of(addr, &get("/")).await, Some(200));
    for long in [256, 1000] {
        let path = format!("/{}", "a".repeat(long));
        assert_eq!(status_of(addr, &get(&path)).await, Some(404), "{long}");
        let path = format!("/{}/index.html", "a".repeat(long));
        assert_eq!(status_of(addr, &get(&path)).await, Some(404), "{long}");
    }
    assert!(server.shutdown(Duration::from_secs(3)).await);
}

/// Issue #41 defect 22: a symlink inside `--static` pointing outside it was served. Only what
/// resolves inside the static folder is served (links within it still work).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_a_symlink_pointing_outside_the_folder_is_not_served() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "secret").unwrap();
    std::fs::write(outside.path().join("index.html"), "secret").unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("index.html"), "<html></html>").unwrap();
    std::fs::write(dir.path().join("inside.txt"), "ok").unwrap();
    let link = |target: &std::path::Path, name: &str| {
        std::os::unix::fs::symlink(target, dir.path().join(name)).unwrap()
    };
    link(&outside.path().join("secret.txt"), "leak.txt");
    link(outside.path(), "leakdir");
    link(&dir.path().join("inside.txt"), "alias.txt");
    let server = start_with_static(dir.path()).await;
    let addr = server.local_addr();
    assert_eq!(status_of(addr, &get("/alias.txt")).await, Some(200));
    assert_eq!(status_of(addr, &get("/leak.txt")).await, Some(404));
    assert_eq!(
        status_of(addr, &get("/leakdir/secret.txt")).await,
        Some(404)
    );
    assert_eq!(status_of(addr, &get("/leakdir/")).await, Some(404));
    assert_eq!(status_of(addr, &get("/%6ceak.txt")).await, Some(404));
    assert!(server.shutdown(Duration::from_secs(3)).await);
}

/// Issue #41 defect 17: a text or close frame that is not UTF-8 ended the session as "the
/// connection was lost" with close code 1000 and no kind-5. Now the client is told why, and the
/// close code is 1007 (invalid frame payload data, RFC 6455).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_or_close_frame_that_is_not_utf8_gets_kind5_and_1007() {
    use tungstenite::protocol::frame::coding::{Control, Data, OpCode};
    use tungstenite::protocol::frame::Frame;
    let server = start(1, limits()).await;
    let addr = server.local_addr();
    let mut close_payload = 1000u16.to_be_bytes().to_vec();
    close_payload.extend_from_slice(&[0xff, 0xfe]);
    // A close frame with any payload (Frame::close takes a reason that is UTF-8 already).
    let mut close = Frame::pong(close_payload);
    close.header_mut().opcode = OpCode::Control(Control::Close);
    for (what, frame) in [
        (
            "text",
            Frame::message(vec![b'a', 0xff, 0xfe], OpCode::Data(Data::Text), true),
        ),
        ("close", close),
    ] {
        let (mut tx, mut rx) = client::connect(&url(addr), OpusPacketing::WEB_CLIENT)
            .await
            .unwrap();
        assert_eq!(rx.recv().await.unwrap(), Received::Handshake);
        tx.send_frame(frame).await.unwrap();
        let seen = next_ending(&mut rx).await;
        let e = error_of(&seen);
        assert!(e.contains("not valid UTF-8"), "{what}: {e}");
        assert_eq!(close_code(&seen), Some(1007), "{what}: {seen:?}");
        // The slot is free again.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(server.shutdown(Duration::from_secs(3)).await);
}
