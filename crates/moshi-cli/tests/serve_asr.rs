//! `moshi-rs serve` with a speech-to-text model (assets/tiny-stt) speaks moshi-server's
//! `/api/asr-streaming`: a Rust client streams audio the way Kyutai's
//! `stt_from_file_rust_server.py` does (1 s of silence, the file, 5 s of silence, a marker, more
//! silence) as fast as the server takes it, and gets `Ready`, then per frame the `Step`, `Word`
//! and `EndWord` messages that the same samples give offline (`moshi-rs transcribe
//! --tokens-out` of a WAV holding them, through moshi-server's word rules), and its marker after
//! exactly the frames it covers plus the model's delay. Keys, a full server and bad clients are
//! checked too; a bad client ends only its own stream.

mod common;

use std::time::Duration;

use common::asr::{
    asr_url, audio, connect, dsm_stream, expected_messages, start_server, tiny_stt,
    transcribe_stream, without_buffered, FRAME, KEY, SECOND,
};
use common::serve::read_wav;
use futures_util::{SinkExt, StreamExt};
use moshi_server::asr_protocol::AsrServerMessage;
use moshi_test_support::{path_str, run_binary};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

#[test]
fn a_stream_gets_the_words_of_the_same_audio_offline() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &[]);
    let input = read_wav(&tiny_stt().join("input.wav"));
    let (before, after) = dsm_stream(&input);
    let samples_before: usize = before.iter().map(Vec::len).sum();
    // The marker covers the whole frames received before it, plus ceil(0.5 x 12.5) = 7.
    let marker_steps = samples_before / FRAME + 7;
    let mut all: Vec<f32> = before.concat();
    all.extend(after.concat());
    let expected = expected_messages(dir.path(), &all, marker_steps, Some(42));

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let got = runtime.block_on(async {
        let socket = connect(&asr_url(&server, ""), Some(KEY)).await.unwrap();
        transcribe_stream(socket, before, 42, after).await
    });
    assert_eq!(got[0], AsrServerMessage::Ready, "Ready comes first");
    // Back-pressure: 41 s of audio sent at once never waits in the server beyond the 8 frames
    // that stop its reading, one 1 s message and a partial frame.
    let most_buffered = got
        .iter()
        .filter_map(|m| match m {
            AsrServerMessage::Step { buffered_pcm, .. } => Some(*buffered_pcm),
            _ => None,
        })
        .max()
        .unwrap();
    assert!(
        most_buffered as usize <= 8 * FRAME + SECOND + FRAME,
        "{most_buffered} samples buffered"
    );
    let got = without_buffered(&got[1..]);
    let words = |m: &[AsrServerMessage]| {
        m.iter()
            .filter(|m| matches!(m, AsrServerMessage::Word { .. }))
            .count()
    };
    assert!(
        words(&expected) >= 3,
        "the fixture's speech gives words: {expected:?}"
    );
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(g, e, "message {i}");
    }
    assert_eq!(got.len(), expected.len(), "messages: {got:?}");
    // The server took the audio faster than real time (41 s of stream within the test's time)
    // and logged the stream's end once the client went.
    drop(runtime);
    server.wait_for_log("asr stream ended", Duration::from_secs(20));
}

#[test]
fn keys_are_checked_before_the_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &["--max-sessions", "2"]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let url = asr_url(&server, "");
        assert_eq!(connect(&url, None).await.err().as_deref(), Some("HTTP 401"));
        assert_eq!(
            connect(&url, Some("public_toke")).await.err().as_deref(),
            Some("HTTP 401")
        );
        let wrong_query = asr_url(&server, "?auth_id=nope");
        assert_eq!(
            connect(&wrong_query, None).await.err().as_deref(),
            Some("HTTP 401")
        );
        for (url, key) in [
            (url.clone(), Some(KEY)),
            (asr_url(&server, "?auth_id=public_token"), None),
        ] {
            let mut socket = connect(&url, key).await.expect("a key lets the client in");
            let m = socket.next().await.unwrap().unwrap();
            assert_eq!(
                AsrServerMessage::from_bytes(&m.into_data()).unwrap(),
                AsrServerMessage::Ready
            );
        }
    });
    // /api/chat is not served by a speech-to-text server; `/` says what is.
    let index = std::process::Command::new("curl")
        .args(["-s", &format!("http://{}/", server.addr)])
        .output();
    if let Ok(o) = index {
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(text.contains("/api/asr-streaming"), "{text}");
    }
}

#[test]
fn a_full_server_says_no_free_channels_and_a_bad_client_ends_only_its_stream() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &["--max-sessions", "2"]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let url = asr_url(&server, "");
        let mut good = connect(&url, Some(KEY)).await.unwrap();
        let mut bad = connect(&url, Some(KEY)).await.unwrap();
        for s in [&mut good, &mut bad] {
            let m = s.next().await.unwrap().unwrap();
            assert_eq!(
                AsrServerMessage::from_bytes(&m.into_data()).unwrap(),
                AsrServerMessage::Ready
            );
        }
        // A third stream: moshi-server's answer, then the close.
        let mut third = connect(&url, Some(KEY)).await.unwrap();
        let m = third.next().await.unwrap().unwrap();
        match AsrServerMessage::from_bytes(&m.into_data()).unwrap() {
            AsrServerMessage::Error { message } => {
                assert!(message.starts_with("no free channels"), "{message}")
            }
            other => panic!("expected an error, got {other:?}"),
        }
        // A message that is not the protocol ends the bad stream with an error naming it ...
        bad.send(Message::Binary(b"\x81\xa4type\xa5Hello".to_vec().into()))
            .await
            .unwrap();
        let mut error = None;
        while let Some(Ok(m)) = bad.next().await {
            if let Message::Binary(b) = m {
                if let Ok(AsrServerMessage::Error { message }) = AsrServerMessage::from_bytes(&b) {
                    error = Some(message);
                }
            }
        }
        let error = error.expect("an Error message before the close");
        assert!(error.contains("expected a MessagePack map"), "{error}");
        // ... NaN audio likewise, on a new stream (the slot was freed) ...
        let mut nan = connect(&url, Some(KEY)).await.unwrap();
        nan.send(audio(&[0.0, f32::NAN])).await.unwrap();
        let mut error = None;
        while let Some(Ok(m)) = nan.next().await {
            if let Message::Binary(b) = m {
                if let Ok(AsrServerMessage::Error { message }) = AsrServerMessage::from_bytes(&b) {
                    error = Some(message);
                }
            }
        }
        assert!(error.unwrap().contains("sample 1 is NaN"));
        // ... while the good stream goes on: a frame of audio gives its Step.
        good.send(audio(&vec![0.0; FRAME])).await.unwrap();
        loop {
            let m = tokio::time::timeout(Duration::from_secs(30), good.next())
                .await
                .expect("the good stream still answers")
                .unwrap()
                .unwrap();
            if let Message::Binary(b) = m {
                if let AsrServerMessage::Step { step_idx, .. } =
                    AsrServerMessage::from_bytes(&b).unwrap()
                {
                    assert_eq!(step_idx, 1);
                    break;
                }
            }
        }
    });
}

#[test]
fn serve_refuses_what_a_speech_to_text_server_does_not_do() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("empty-keys");
    std::fs::write(&keys, "# no key\n").unwrap();
    let cases: [(&[&str], &[&str]); 3] = [
        (
            &["--record", path_str(dir.path())],
            &["--record", "speech-to-text"],
        ),
        (&["--temp-text", "0.7"], &["--temp-text", "greedy"]),
        (
            &["--api-key-file", path_str(&keys)],
            &["--api-key-file", "no key"],
        ),
    ];
    let model = tiny_stt();
    for (flags, needles) in cases {
        let mut args = vec!["serve", "--model", path_str(&model), "--port", "0"];
        args.extend_from_slice(flags);
        let out = run_binary(env!("CARGO_BIN_EXE_moshi-rs"), &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} accepted");
        assert!(needles.iter().all(|n| err.contains(n)), "{flags:?}: {err}");
    }
}

/// `/api/chat` checks the same keys; Kyutai's web UI sends its key as `worker_auth_id`.
#[test]
fn chat_checks_the_keys_too() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(&keys, format!("{KEY}\n")).unwrap();
    let model = moshi_test_support::tiny_a_dir();
    let server = common::serve::Server::start(&[
        "--model",
        path_str(&model),
        "--static",
        "none",
        "--api-key-file",
        path_str(&keys),
    ]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let chat = |query: &str| format!("ws://{}/api/chat{query}", server.addr);
        assert_eq!(
            connect(&chat(""), None).await.err().as_deref(),
            Some("HTTP 401")
        );
        assert_eq!(
            connect(&chat("?worker_auth_id=nope"), None)
                .await
                .err()
                .as_deref(),
            Some("HTTP 401")
        );
        let mut socket = connect(&chat("?worker_auth_id=public_token"), None)
            .await
            .expect("the web UI's key lets it in");
        let first = socket.next().await.unwrap().unwrap().into_data();
        assert_eq!(first[0], 0, "the handshake");
    });
}

/// `--allowed-origin`: a browser page from another origin gets 403 before the upgrade; the
/// listed origin and programs (no `Origin`) are let in; a malformed origin is refused at start.
#[test]
fn allowed_origins_are_checked_before_the_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(
        dir.path(),
        &[
            "--max-sessions",
            "3",
            "--allowed-origin",
            "https://captions.example",
        ],
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let url = asr_url(&server, "");
        let with_origin = |origin: &'static str| {
            let mut r = url.as_str().into_client_request().unwrap();
            r.headers_mut()
                .insert("kyutai-api-key", KEY.parse().unwrap());
            r.headers_mut().insert("origin", origin.parse().unwrap());
            r
        };
        match tokio_tungstenite::connect_async(with_origin("https://evil.example")).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
                assert_eq!(r.status().as_u16(), 403)
            }
            other => panic!("expected 403, got {:?}", other.map(|_| ())),
        }
        for request in [with_origin("https://CAPTIONS.example"), {
            let mut r = url.as_str().into_client_request().unwrap();
            r.headers_mut()
                .insert("kyutai-api-key", KEY.parse().unwrap());
            r
        }] {
            let (mut socket, _) = tokio_tungstenite::connect_async(request).await.unwrap();
            let m = socket.next().await.unwrap().unwrap();
            assert_eq!(
                AsrServerMessage::from_bytes(&m.into_data()).unwrap(),
                AsrServerMessage::Ready
            );
        }
    });
    let out = run_binary(
        env!("CARGO_BIN_EXE_moshi-rs"),
        &[
            "serve",
            "--model",
            path_str(&tiny_stt()),
            "--allowed-origin",
            "https://x.example/",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--allowed-origin"),
        "{err}"
    );
}
