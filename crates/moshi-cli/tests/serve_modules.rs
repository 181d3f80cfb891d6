//! One `moshi-rs serve` process hosting two models, as moshi-server's modules: speech to text
//! (assets/tiny-stt) at `/api/asr-streaming` and Moshi (assets/tiny-a) at `/api/chat`, each with
//! its own batched engine. A transcription stream and a real-pace conversation run at the same
//! time, and each gets exactly what it gets from a server of its own (the STT messages of the
//! same samples offline; greedy chat tokens equal to `moshi-rs file`'s on what the server
//! heard); `/api/modules_info`, `/api/capacity`, `/api/ready?module=` and `/metrics` report per
//! module. Paths given with `PATH=MODEL`, and the refusals of bad module lists, are checked too.

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::asr::{
    asr_url, connect, dsm_stream, expected_messages, tiny_stt, transcribe_stream, without_buffered,
    FRAME, KEY,
};
use common::chat::{converse, file_tokens, wait_for_file};
use common::serve::{read_wav, tiny_model, Server};
use common::{assert_fails, moshi};
use moshi_server::asr_protocol::AsrServerMessage;
use moshi_server::client::Received;
use moshi_server::metrics::{of_module, sample};
use moshi_test_support::path_str;

/// `GET path` on the server at `addr`: (status, body).
fn get(addr: &str, path: &str) -> (u16, String) {
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    write!(
        tcp,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    tcp.read_to_string(&mut text).unwrap();
    let status = text[9..12].parse().unwrap();
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_string())
}

fn metric(text: &str, name: &str, module: &str) -> f64 {
    let name = of_module(name, module);
    sample(text, &name).unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

#[test]
fn speech_to_text_and_moshi_served_at_once_each_as_alone() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(&keys, format!("{KEY}\n")).unwrap();
    let record = dir.path().join("rec");
    std::fs::create_dir(&record).unwrap();
    let server = Server::start(&[
        "--module",
        path_str(&tiny_stt()),
        "--module",
        path_str(&tiny_model()),
        "--greedy",
        "--kv-cache",
        "f32",
        "--api-key-file",
        path_str(&keys),
        "--static",
        "none",
        "--record",
        path_str(&record),
    ]);
    // The start-up lines reach stderr after the URL reaches stdout: wait for them.
    for needle in ["/api/asr-streaming (speech to text", "/api/chat (Kyutai"] {
        server.wait_for_log(needle, Duration::from_secs(30));
    }

    let (status, info) = get(&server.addr, "/api/modules_info");
    assert_eq!(status, 200, "{info}");
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    let listed: Vec<(&str, &str)> = info
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["type"].as_str().unwrap(), m["path"].as_str().unwrap()))
        .collect();
    assert_eq!(
        listed,
        [("batched_asr", "/api/asr-streaming"), ("chat", "/api/chat")]
    );
    assert!(
        info[0]["lm"].as_str().unwrap().contains("tiny-stt"),
        "{info}"
    );
    assert!(info[1]["lm"].as_str().unwrap().contains("tiny-a"), "{info}");

    // Both clients at once.
    let stt_input = read_wav(&tiny_stt().join("input.wav"));
    let (before, after) = dsm_stream(&stt_input);
    let samples_before: usize = before.iter().map(Vec::len).sum();
    let marker_steps = samples_before / FRAME + 7;
    let mut stt_all: Vec<f32> = before.concat();
    stt_all.extend(after.concat());
    let chat_input = read_wav(&tiny_model().join("input.wav"));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (stt, chat, capacity_during) = runtime.block_on(async {
        let socket = connect(&asr_url(&server, ""), Some(KEY)).await.unwrap();
        let stt = tokio::spawn(transcribe_stream(socket, before, 42, after));
        let chat_url = server.ws_url(&format!("?auth_id={KEY}"));
        let chat = tokio::spawn(async move {
            converse(&chat_url, &chat_input, Duration::from_millis(600)).await
        });
        // While both run: each module's slot is in use.
        let mut capacity = serde_json::Value::Null;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let addr = server.addr.clone();
            let (_, body) = tokio::task::spawn_blocking(move || get(&addr, "/api/capacity"))
                .await
                .unwrap();
            capacity = serde_json::from_str(&body).unwrap();
            if capacity["used"] == 2 {
                break;
            }
        }
        (stt.await.unwrap(), chat.await.unwrap(), capacity)
    });
    assert_eq!(capacity_during["used"], 2, "{capacity_during}");
    assert_eq!(capacity_during["total"], 2, "{capacity_during}");
    assert_eq!(capacity_during["ready"], false, "{capacity_during}");
    for m in capacity_during["modules"].as_array().unwrap() {
        assert_eq!(
            (m["used"].as_u64(), m["total"].as_u64()),
            (Some(1), Some(1)),
            "{m}"
        );
    }

    // Speech to text: the messages of the same samples offline.
    let expected = expected_messages(dir.path(), &stt_all, marker_steps, Some(42));
    assert_eq!(stt[0], AsrServerMessage::Ready, "Ready comes first");
    assert_eq!(without_buffered(&stt[1..]), expected);

    // Moshi: handshake, metadata, audio; greedy tokens of `file` on what the server heard.
    assert_eq!(chat.messages[0], Received::Handshake);
    let Received::Metadata(meta) = &chat.messages[1] else {
        panic!("second message: {:?}", chat.messages[1]);
    };
    assert!(
        meta["lm_model_file"].as_str().unwrap().contains("tiny-a"),
        "{meta}"
    );
    assert!(!chat.audio.is_empty());
    let heard = wait_for_file(&record, "-in.wav");
    let server_tokens = std::fs::read_to_string(wait_for_file(&record, "-tokens.jsonl")).unwrap();
    assert!(server_tokens.lines().count() > 10, "{server_tokens}");
    let (file, _) = file_tokens(&heard, &tiny_model(), "f32");
    assert_eq!(server_tokens, file, "server tokens != file tokens");

    // Per module: readiness, and metrics that add up to what each client did.
    for path in ["/api/asr-streaming", "/api/chat"] {
        let (status, body) = get(&server.addr, &format!("/api/ready?module={path}"));
        assert_eq!(status, 200, "{path}: {body}");
    }
    let (status, body) = get(&server.addr, "/api/ready?module=/api/tts");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("/api/asr-streaming, /api/chat"), "{body}");
    let (_, text) = get(&server.addr, "/metrics");
    for path in ["/api/asr-streaming", "/api/chat"] {
        assert_eq!(metric(&text, "moshi_rs_sessions_started_total", path), 1.0);
        assert_eq!(metric(&text, "moshi_rs_sessions_max", path), 1.0);
    }
    let chat_frames = server_tokens.lines().count() as f64;
    assert_eq!(
        metric(&text, "moshi_rs_frames_processed_total", "/api/chat"),
        chat_frames
    );
    assert!(
        metric(
            &text,
            "moshi_rs_frames_processed_total",
            "/api/asr-streaming"
        ) >= marker_steps as f64
    );
    assert_eq!(
        text.matches("# TYPE moshi_rs_sessions_started_total ")
            .count(),
        1
    );
    assert!(server.stop(), "the server did not stop cleanly");
}

#[test]
fn a_module_serves_at_the_path_given_and_bad_module_lists_are_refused() {
    let server = Server::start(&[
        "--module",
        &format!("/api/stt-fr={}", path_str(&tiny_stt())),
    ]);
    let (_, info) = get(&server.addr, "/api/modules_info");
    assert!(info.contains(r#""path":"/api/stt-fr""#), "{info}");
    let (_, index) = get(&server.addr, "/");
    assert!(index.contains("/api/stt-fr: speech to text"), "{index}");
    // The default path is not served: the module is at its own.
    assert_eq!(get(&server.addr, "/api/asr-streaming").0, 404);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let socket = connect(&format!("ws://{}/api/stt-fr", server.addr), None).await;
        let (_, mut rx) = futures_util::StreamExt::split(socket.unwrap());
        let first = futures_util::StreamExt::next(&mut rx)
            .await
            .unwrap()
            .unwrap();
        let bytes = first.into_data();
        assert_eq!(
            AsrServerMessage::from_bytes(&bytes).unwrap(),
            AsrServerMessage::Ready
        );
    });
    assert!(server.stop());

    let tiny_dir = tiny_model();
    let tiny = path_str(&tiny_dir);
    let o = moshi(&["serve", "--port", "0", "--module", tiny, "--module", tiny]);
    assert_fails(&o, &["module /api/chat", "two modules at this path"]);
    let o = moshi(&["serve", "--module", &format!("/api/ready={tiny}")]);
    assert_fails(&o, &["--module", "/api/ready", "the server's own path"]);
    let o = moshi(&["serve", "--module", &format!("/etc={tiny}")]);
    assert_fails(&o, &["--module", "path /etc", "under /api/"]);
    let o = moshi(&["serve", "--module", "/api/x="]);
    assert_fails(&o, &["--module", "expected [PATH=]MODEL"]);
    let o = moshi(&["serve", "--module", tiny, "--model", tiny]);
    assert_fails(&o, &["--module", "--model"]);
    let stt_dir = tiny_stt();
    let stt = path_str(&stt_dir);
    let o = moshi(&[
        "serve", "--module", stt, "--static", "none", "--temp", "0.5",
    ]);
    assert_fails(&o, &["--temp", "speech-to-text model is served greedy"]);
}
