//! `moshi-rs serve` with a text-to-speech model (assets/tiny-tts) at moshi-server's
//! `/api/tts_streaming`:
//! - Kyutai's `tts_rust_server.py` (../shared/clients/dsm), unmodified, on loopback: the WAV it
//!   writes is the official PyTorch run's audio (`ref/output.wav`, within 1 LSB) followed by the
//!   two frames moshi-server flushes after it (greedy, exact KV caches);
//! - a Rust client of the protocol: `Ready` first, one `Audio` of 1920 samples per frame, each
//!   word's `Text` with moshi-server's times (from the step after its consumption to the step
//!   after the next's, the last one to the end), then a normal close;
//! - bad input: a missing key (401), an unknown format (400), an unknown voice (`Error`), a
//!   full server ("no free channels"), a client that never finishes its text (`Error` after the
//!   idle timeout).
//!
//! The Python client test says SKIPPED (and why) when what it needs is missing, and fails
//! instead under `CI` (`bash scripts/setup.sh --serve-e2e` makes target/stt-clients/venv).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::asr::{connect, Socket};
use common::serve::{root, Server};
use futures_util::{SinkExt, StreamExt};
use moshi_server::tts_protocol::{TtsClientMessage, TtsServerMessage};
use moshi_test_support::path_str;
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

const KEY: &str = "public_token";
const VOICE: &str = "expresso/ex03-ex01_happy_001_channel1_334s.wav";
const FRAME: usize = 1920;
/// moshi-server runs `max_delay` (2) steps past the end to flush the last frames.
const FLUSHED_FRAMES: usize = 2;

fn tiny_tts() -> PathBuf {
    root().join("assets/tiny-tts")
}

fn reference() -> Value {
    let text = std::fs::read_to_string(tiny_tts().join("ref/tts_greedy.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The server on tiny-tts, greedy with exact KV caches (as `speak --greedy`), one key.
fn start_server(dir: &Path, extra: &[&str]) -> Server {
    let model = tiny_tts();
    let mut models = vec!["--model", path_str(&model)];
    models.extend_from_slice(extra);
    start_with(dir, &models)
}

/// [`start_server`] with the model flags `models` (and any other flags).
fn start_with(dir: &Path, models: &[&str]) -> Server {
    let keys = dir.join("keys");
    std::fs::write(&keys, format!("{KEY}\n")).unwrap();
    let mut args = vec![
        "--greedy",
        "--kv-cache",
        "f32",
        "--api-key-file",
        path_str(&keys),
    ];
    args.extend_from_slice(models);
    Server::start(&args)
}

fn url(server: &Server, query: &str) -> String {
    format!("ws://{}/api/tts_streaming{query}", server.addr)
}

/// Sends `words` one per message, then `Eos` (unless `eos` is false), and reads every message
/// until the server closes; returns them and the close code.
async fn speak(socket: Socket, words: &[&str], eos: bool) -> (Vec<TtsServerMessage>, Option<u16>) {
    speak_after(socket, &[], words, eos).await
}

/// [`speak`], sending `first` before the words.
async fn speak_after(
    socket: Socket,
    first: &[TtsClientMessage],
    words: &[&str],
    eos: bool,
) -> (Vec<TtsServerMessage>, Option<u16>) {
    let (mut tx, mut rx) = socket.split();
    for m in first {
        let _ = tx.send(Message::Binary(m.to_bytes().into())).await;
    }
    for w in words {
        let m = TtsClientMessage::Text {
            text: w.to_string(),
        };
        // A server that refused the stream may have closed already: read what it said.
        let _ = tx.send(Message::Binary(m.to_bytes().into())).await;
    }
    if eos {
        let m = TtsClientMessage::Eos.to_bytes();
        let _ = tx.send(Message::Binary(m.into())).await;
    }
    let mut messages = Vec::new();
    let mut code = None;
    while let Some(m) = tokio::time::timeout(Duration::from_secs(60), rx.next())
        .await
        .expect("the server answers within 60 s")
    {
        match m {
            Ok(Message::Binary(b)) => messages.push(TtsServerMessage::from_bytes(&b).unwrap()),
            Ok(Message::Close(frame)) => {
                code = frame.map(|f| u16::from(f.code));
                break;
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    (messages, code)
}

fn script_words(reference: &Value) -> Vec<String> {
    reference["script"]
        .as_str()
        .unwrap()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gets_ready_the_audio_and_the_words_with_their_times() {
    let reference = reference();
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &[]);
    let socket = connect(
        &url(&server, &format!("?voice={VOICE}&format=PcmMessagePack")),
        Some(KEY),
    )
    .await
    .unwrap();
    let words = script_words(&reference);
    let refs: Vec<&str> = words.iter().map(String::as_str).collect();
    let (messages, code) = speak(socket, &refs, true).await;
    assert_eq!(messages.first(), Some(&TtsServerMessage::Ready));
    assert_eq!(code, Some(1000), "a normal close once everything is said");
    let audio: Vec<&Vec<f32>> = messages
        .iter()
        .filter_map(|m| match m {
            TtsServerMessage::Audio { pcm } => Some(pcm),
            _ => None,
        })
        .collect();
    let decoded = reference["decoded"]["frames_decoded"].as_u64().unwrap() as usize;
    assert_eq!(audio.len(), decoded + FLUSHED_FRAMES);
    assert!(audio.iter().all(|p| p.len() == FRAME));
    // moshi-server's times: a word from the step after its consumption to the step after the
    // next one's; the last to the stream's last step (end + delay + final padding + 2).
    let times: Vec<u64> = reference["consumption_times"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() + 1)
        .collect();
    let end_steps = reference["end_step"].as_u64().unwrap() + 16 + 4 + 2;
    let texts: Vec<(String, f64, f64)> = messages
        .iter()
        .filter_map(|m| match m {
            TtsServerMessage::Text {
                text,
                start_s,
                stop_s,
            } => Some((text.clone(), *start_s, *stop_s)),
            _ => None,
        })
        .collect();
    assert_eq!(texts.len(), words.len());
    for (i, (text, start_s, stop_s)) in texts.iter().enumerate() {
        assert_eq!(text, &words[i]);
        assert_eq!(*start_s, times[i] as f64 / 12.5, "{text}");
        let stop = times.get(i + 1).copied().unwrap_or(end_steps);
        assert_eq!(*stop_s, stop as f64 / 12.5, "{text}");
    }
    server.stop();
}

/// The audio and words of the fixture's script from a server at `addr` (greedy, exact caches).
async fn fixture_stream(server: &Server) -> Vec<TtsServerMessage> {
    fixture_stream_after(server, &[]).await
}

/// [`fixture_stream`], sending `first` before the words.
async fn fixture_stream_after(
    server: &Server,
    first: &[TtsClientMessage],
) -> Vec<TtsServerMessage> {
    let reference = reference();
    let socket = connect(
        &url(server, &format!("?voice={VOICE}&format=PcmMessagePack")),
        Some(KEY),
    )
    .await
    .unwrap();
    let words = script_words(&reference);
    let refs: Vec<&str> = words.iter().map(String::as_str).collect();
    speak_after(socket, first, &refs, true).await.0
}

/// The fixture's voice as a `Voice` message carries it (channels first), its values times
/// `gain`.
fn voice_message(gain: f32) -> TtsClientMessage {
    let file = tiny_tts().join(format!("voices/{VOICE}.f00d4040@12.safetensors"));
    let dim = moshi_loader::SafetensorsFile::open(&file)
        .unwrap()
        .info("speaker_wavs")
        .unwrap()
        .shape[1];
    let voice = moshi_loader::voice::load_voice(&file, dim).unwrap();
    let mut embeddings = vec![0f32; voice.values.len()];
    for (t, row) in voice.values.chunks_exact(dim).enumerate() {
        for (c, v) in row.iter().enumerate() {
            embeddings[c * voice.frames + t] = v * gain;
        }
    }
    TtsClientMessage::Voice {
        embeddings,
        shape: vec![1, dim, voice.frames],
    }
}

/// moshi-server's `Voice` message (unmute's custom voices): the stream speaks with the voice
/// sent, exactly as with the same voice named in the query; another voice changes the audio;
/// a voice of the wrong shape, or after text, is an `Error`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voice_sent_by_the_client_is_the_stream_voice() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &[]);
    let by_name = fixture_stream(&server).await;
    assert!(by_name.len() > 10, "{by_name:?}");
    assert_eq!(
        fixture_stream_after(&server, &[voice_message(1.0)]).await,
        by_name
    );
    let other = fixture_stream_after(&server, &[voice_message(0.5)]).await;
    let audio = |m: &[TtsServerMessage]| -> Vec<f32> {
        m.iter()
            .flat_map(|m| match m {
                TtsServerMessage::Audio { pcm } => pcm.clone(),
                _ => Vec::new(),
            })
            .collect()
    };
    assert!(!audio(&other).is_empty() && audio(&other) != audio(&by_name));

    let query = format!("?voice={VOICE}&format=PcmMessagePack");
    let TtsClientMessage::Voice { embeddings, shape } = voice_message(1.0) else {
        unreachable!()
    };
    let wrong = TtsClientMessage::Voice {
        embeddings: embeddings[1..].to_vec(),
        shape: shape.clone(),
    };
    let socket = connect(&url(&server, &query), Some(KEY)).await.unwrap();
    let (messages, _) = speak_after(socket, &[wrong], &["Hello"], true).await;
    assert!(
        matches!(messages.last(), Some(TtsServerMessage::Error { message }) if message.contains("values for shape")),
        "{messages:?}"
    );
    let socket = connect(&url(&server, &query), Some(KEY)).await.unwrap();
    let late = [
        TtsClientMessage::Text {
            text: "Hello".into(),
        },
        voice_message(1.0),
    ];
    let (messages, _) = speak_after(socket, &late, &[], true).await;
    assert!(
        matches!(messages.last(), Some(TtsServerMessage::Error { message }) if message.contains("before the stream's first Text")),
        "{messages:?}"
    );
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beside_speech_to_text_in_one_process_a_stream_gets_what_it_gets_alone() {
    let dir = tempfile::tempdir().unwrap();
    let alone = start_server(dir.path(), &[]);
    let want = fixture_stream(&alone).await;
    alone.stop();
    let stt = root().join("assets/tiny-stt");
    let tts = tiny_tts();
    let both = start_with(
        dir.path(),
        &["--module", path_str(&tts), "--module", path_str(&stt)],
    );
    // The start-up lines reach stderr after the URL reaches stdout: wait for them.
    for needle in ["/api/tts_streaming (text to speech", "/api/asr-streaming"] {
        both.wait_for_log(needle, Duration::from_secs(30));
    }
    assert_eq!(fixture_stream(&both).await, want);
    let info = http_get(&both.addr, "/api/modules_info");
    assert!(
        info.contains("\"tts_py\"") && info.contains("\"batched_asr\""),
        "{info}"
    );
    both.stop();
}

/// `--tts-n-q 24` (moshi-server's deployment): the stream's audio is the official
/// `TTSModel(n_q=24)` run's (ref/output_nq24.wav, within 1 LSB), then the flushed frames.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fewer_codebooks_give_the_official_audio_with_them() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &["--tts-n-q", "24"]);
    let pcm: Vec<f32> = fixture_stream(&server)
        .await
        .into_iter()
        .flat_map(|m| match m {
            TtsServerMessage::Audio { pcm } => pcm,
            _ => Vec::new(),
        })
        .collect();
    server.stop();
    let want = common::read_i16(&tiny_tts().join("ref/output_nq24.wav"));
    assert_eq!(pcm.len(), want.len() + FLUSHED_FRAMES * FRAME);
    for (i, (&got, &w)) in pcm.iter().zip(&want).enumerate() {
        let got = (got * 32768.0).round().clamp(-32768.0, 32767.0) as i32;
        assert!((got - i32::from(w)).abs() <= 1, "sample {i}: {got} vs {w}");
    }
}

/// `GET path` on `addr`: the body.
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    write!(
        tcp,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    tcp.read_to_string(&mut text).unwrap();
    text.split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_with_reasons() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &["--idle-timeout-s", "3"]);
    let query = format!("?voice={VOICE}&format=PcmMessagePack");
    assert_eq!(
        connect(&url(&server, &query), None).await.err().as_deref(),
        Some("HTTP 401")
    );
    assert_eq!(
        connect(&url(&server, "?format=Wav"), Some(KEY))
            .await
            .err()
            .as_deref(),
        Some("HTTP 400")
    );
    // An unknown voice, one outside the folder.
    for voice in ["nobody.wav", "../../etc/passwd"] {
        let socket = connect(
            &url(&server, &format!("?voice={voice}&format=PcmMessagePack")),
            Some(KEY),
        )
        .await
        .unwrap();
        let (messages, _) = speak(socket, &[], false).await;
        assert!(
            matches!(&messages[..], [TtsServerMessage::Error { message }] if message.contains("unknown voice")),
            "{voice}: {messages:?}"
        );
    }
    // One slot: a second stream while the first waits for its text gets "no free channels";
    // the first, never finishing its text, ends after the idle timeout with an error.
    let first = connect(&url(&server, &query), Some(KEY)).await.unwrap();
    let held = tokio::spawn(speak(first, &["Hello"], false));
    // The slot is taken once the first stream is open (however loaded the machine).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !http_get(&server.addr, "/api/modules_info").contains("\"used_slots\":\"1\"") {
        assert!(
            std::time::Instant::now() < deadline,
            "the first stream never opened"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = connect(&url(&server, &query), Some(KEY)).await.unwrap();
    let (messages, _) = speak(second, &["Hi"], true).await;
    assert!(
        matches!(&messages[..], [TtsServerMessage::Error { message }] if message.contains("no free channels")),
        "{messages:?}"
    );
    let (messages, _) = held.await.unwrap();
    assert!(
        matches!(messages.last(), Some(TtsServerMessage::Error { message }) if message.contains("no text and no Eos")),
        "{messages:?}"
    );
    server.stop();
}

fn venv_python() -> PathBuf {
    root().join("target/stt-clients/venv/bin/python")
}

#[test]
fn kyutai_tts_client_writes_the_official_audio() {
    let script = root().join("../shared/clients/dsm/tts_rust_server.py");
    let missing: Vec<&str> = [
        ("target/stt-clients/venv", venv_python().exists()),
        ("../shared/clients/dsm", script.exists()),
    ]
    .iter()
    .filter(|(_, ok)| !ok)
    .map(|(n, _)| *n)
    .collect();
    if !missing.is_empty() {
        let why = format!(
            "SKIPPED kyutai_tts_client_writes_the_official_audio: missing {missing:?} (run `bash scripts/setup.sh --serve-e2e`; Kyutai's scripts are in ../shared)"
        );
        assert!(std::env::var_os("CI").is_none(), "{why}");
        eprintln!("{why}");
        return;
    }
    let reference = reference();
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &[]);
    // Two lines: the client sends each word of each line as it reads them.
    let text = dir.path().join("in.txt");
    let script_text = reference["script"]
        .as_str()
        .unwrap()
        .replacen(", ", ",\n", 1);
    std::fs::write(&text, script_text).unwrap();
    let out = dir.path().join("out.wav");
    let output = Command::new(venv_python())
        .arg(&script)
        .arg(&text)
        .arg(&out)
        .args(["--url", &format!("ws://{}", server.addr), "--api-key", KEY])
        .args(["--voice", VOICE])
        .stdin(Stdio::null())
        .output()
        .expect("run the client");
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let ours = common::read_i16(&out);
    let theirs = common::read_i16(&tiny_tts().join("ref/output.wav"));
    assert_eq!(ours.len(), theirs.len() + FLUSHED_FRAMES * FRAME);
    let worst = ours
        .iter()
        .zip(&theirs)
        .map(|(a, b)| (*a as i32 - *b as i32).abs())
        .max()
        .unwrap();
    assert!(worst <= 1, "the client's audio differs by {worst} LSB");
    server.stop();
}
