//! `moshi-rs serve` with a speech-to-text model (assets/tiny-stt) speaks moshi-server's
//! `/api/asr-streaming`: a Rust client streams audio the way Kyutai's
//! `stt_from_file_rust_server.py` does (1 s of silence, the file, 5 s of silence, a marker, more
//! silence) as fast as the server takes it, and gets `Ready`, then per frame the `Step`, `Word`
//! and `EndWord` messages that the same samples give offline (`moshi-rs transcribe
//! --tokens-out` of a WAV holding them, through moshi-server's word rules), and its marker after
//! exactly the frames it covers plus the model's delay. Keys, a full server and bad clients are
//! checked too; a bad client ends only its own stream.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::serve::{read_wav, root, Server};
use futures_util::{SinkExt, StreamExt};
use moshi_loader::tokenizer::TextTokenizer;
use moshi_loader::LmConfig;
use moshi_model::word_events::{WordEvent, WordEvents};
use moshi_server::asr_protocol::{AsrClientMessage, AsrServerMessage};
use moshi_test_support::{path_str, read_json_lines, run_binary};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const FRAME: usize = 1920;
const SECOND: usize = 24_000;
const KEY: &str = "public_token";

fn tiny_stt() -> PathBuf {
    root().join("assets/tiny-stt")
}

/// The server on tiny-stt with exact KV caches (as `transcribe`), one key.
fn start_server(dir: &Path, extra: &[&str]) -> Server {
    let keys = dir.join("keys");
    std::fs::write(&keys, format!("# test\n{KEY}\n")).unwrap();
    let model = tiny_stt();
    let mut args = vec![
        "--model",
        path_str(&model),
        "--kv-cache",
        "f32",
        "--api-key-file",
        path_str(&keys),
    ];
    args.extend_from_slice(extra);
    Server::start(&args)
}

fn asr_url(server: &Server, query: &str) -> String {
    format!("ws://{}/api/asr-streaming{query}", server.addr)
}

/// What Kyutai's file script sends: 1 s of silence, the file in frames, 5 s of silence (the
/// marker goes after these), and 35 s of silence after the marker.
fn dsm_stream(audio: &[f32]) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let mut before = vec![vec![0.0; SECOND]];
    before.extend(audio.chunks(FRAME).map(<[f32]>::to_vec));
    before.extend((0..5).map(|_| vec![0.0; SECOND]));
    let after = (0..35).map(|_| vec![0.0; SECOND]).collect();
    (before, after)
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(url: &str, key: Option<&str>) -> Result<Socket, String> {
    let mut request = url.into_client_request().unwrap();
    if let Some(k) = key {
        request
            .headers_mut()
            .insert("kyutai-api-key", k.parse().unwrap());
    }
    match tokio_tungstenite::connect_async(request).await {
        Ok((socket, _)) => Ok(socket),
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            Err(format!("HTTP {}", r.status().as_u16()))
        }
        Err(e) => Err(e.to_string()),
    }
}

fn audio(pcm: &[f32]) -> Message {
    Message::Binary(
        AsrClientMessage::Audio { pcm: pcm.to_vec() }
            .to_bytes()
            .into(),
    )
}

/// Sends `before`, a marker, then `after` as fast as the server takes them, and returns every
/// message received up to the marker's echo.
async fn transcribe_stream(
    socket: Socket,
    before: Vec<Vec<f32>>,
    marker: i64,
    after: Vec<Vec<f32>>,
) -> Vec<AsrServerMessage> {
    let (mut tx, mut rx) = socket.split();
    let sender = tokio::spawn(async move {
        for chunk in &before {
            tx.send(audio(chunk)).await?;
        }
        let m = AsrClientMessage::Marker { id: marker }.to_bytes();
        tx.send(Message::Binary(m.into())).await?;
        for chunk in &after {
            tx.send(audio(chunk)).await?;
        }
        Ok::<_, tokio_tungstenite::tungstenite::Error>(tx)
    });
    let mut got = Vec::new();
    loop {
        let m = tokio::time::timeout(Duration::from_secs(60), rx.next())
            .await
            .expect("the server went silent")
            .expect("the connection closed before the marker")
            .expect("receive");
        let Message::Binary(bytes) = m else { continue };
        let message = AsrServerMessage::from_bytes(&bytes).expect("a protocol message");
        let done = message == AsrServerMessage::Marker { id: marker };
        got.push(message);
        if done {
            break;
        }
    }
    sender.abort();
    got
}

/// What the server must send for `samples` (the whole stream) up to a marker due after `steps`
/// frames: each frame's `Step` (buffered_pcm left out), then its word events, then the marker.
fn expected_messages(dir: &Path, samples: &[f32], steps: usize, marker: i64) -> Vec<AsrServerMessage> {
    let wav = dir.join("stream.wav");
    write_wav(&wav, samples);
    let tokens_out = dir.join("steps.jsonl");
    let out = run_binary(
        env!("CARGO_BIN_EXE_moshi-rs"),
        &[
            "transcribe",
            path_str(&wav),
            "--model",
            path_str(&tiny_stt()),
            "--kv-cache",
            "f32",
            "--tokens-out",
            path_str(&tokens_out),
        ],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines = read_json_lines(&tokens_out);
    assert!(lines.len() >= steps, "{} steps offline, {steps} needed", lines.len());
    let config = std::fs::read_to_string(tiny_stt().join("config.json")).unwrap();
    let cfg = LmConfig::from_json_str(&config, Path::new("config.json")).unwrap();
    let tokenizer = TextTokenizer::from_file(tiny_stt().join("tokenizer.model")).unwrap();
    let mut words = WordEvents::new(&cfg, 12.5);
    let mut expected = Vec::new();
    for (i, line) in lines[..steps].iter().enumerate() {
        let prs = line["extra_heads"]
            .as_array()
            .unwrap()
            .iter()
            .map(|head| head[0].as_f64().unwrap() as f32)
            .collect();
        expected.push(AsrServerMessage::Step {
            step_idx: i as u64 + 1,
            prs,
            buffered_pcm: 0,
        });
        let token = line["text"].as_u64().unwrap() as u32;
        for event in words.push(token, &tokenizer).unwrap() {
            expected.push(match event {
                WordEvent::Word { text, start_s } => AsrServerMessage::Word {
                    text,
                    start_time: start_s,
                },
                WordEvent::EndWord { stop_s } => AsrServerMessage::EndWord { stop_time: stop_s },
            });
        }
    }
    expected.push(AsrServerMessage::Marker { id: marker });
    expected
}

fn write_wav(path: &Path, samples: &[f32]) {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 24_000,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    for &x in samples {
        w.write_sample(x).unwrap();
    }
    w.finalize().unwrap();
}

/// `Step`'s `buffered_pcm` depends on how fast the client sends: left out of comparisons.
fn without_buffered(messages: &[AsrServerMessage]) -> Vec<AsrServerMessage> {
    messages
        .iter()
        .map(|m| match m {
            AsrServerMessage::Step { step_idx, prs, .. } => AsrServerMessage::Step {
                step_idx: *step_idx,
                prs: prs.clone(),
                buffered_pcm: 0,
            },
            other => other.clone(),
        })
        .collect()
}

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
    let expected = expected_messages(dir.path(), &all, marker_steps, 42);

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let got = runtime.block_on(async {
        let socket = connect(&asr_url(&server, ""), Some(KEY)).await.unwrap();
        transcribe_stream(socket, before, 42, after).await
    });
    assert_eq!(got[0], AsrServerMessage::Ready, "Ready comes first");
    let got = without_buffered(&got[1..]);
    let words = |m: &[AsrServerMessage]| {
        m.iter()
            .filter(|m| matches!(m, AsrServerMessage::Word { .. }))
            .count()
    };
    assert!(words(&expected) >= 3, "the fixture's speech gives words: {expected:?}");
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
        assert_eq!(connect(&wrong_query, None).await.err().as_deref(), Some("HTTP 401"));
        for (url, key) in [(url.clone(), Some(KEY)), (asr_url(&server, "?auth_id=public_token"), None)] {
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
            assert_eq!(AsrServerMessage::from_bytes(&m.into_data()).unwrap(), AsrServerMessage::Ready);
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
                if let AsrServerMessage::Step { step_idx, .. } = AsrServerMessage::from_bytes(&b).unwrap() {
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
    for (flag, value) in [("--record", path_str(dir.path()))] {
        let out = run_binary(
            env!("CARGO_BIN_EXE_moshi-rs"),
            &["serve", "--model", path_str(&tiny_stt()), "--port", "0", flag, value],
        );
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(flag) && err.contains("speech-to-text"), "{err}");
    }
    let keys = dir.path().join("empty-keys");
    std::fs::write(&keys, "# no key\n").unwrap();
    let out = run_binary(
        env!("CARGO_BIN_EXE_moshi-rs"),
        &["serve", "--model", path_str(&tiny_stt()), "--api-key-file", path_str(&keys)],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--api-key-file") && err.contains("no key"), "{err}");
}
