//! Helpers of the speech-to-text server tests: the tiny-stt server with a key, the stream Kyutai's
//! file script sends, and what the server must answer for given samples (computed offline by
//! `moshi-rs transcribe --tokens-out` and moshi-server's word rules).

use std::path::{Path, PathBuf};

use moshi_loader::tokenizer::TextTokenizer;
use moshi_loader::LmConfig;
use moshi_model::word_events::{WordEvent, WordEvents};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use moshi_server::asr_protocol::{AsrClientMessage, AsrServerMessage};
use moshi_test_support::{path_str, read_json_lines, run_binary};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use super::serve::{root, Server};

pub const FRAME: usize = 1920;
pub const SECOND: usize = 24_000;
pub const KEY: &str = "public_token";

pub fn tiny_stt() -> PathBuf {
    root().join("assets/tiny-stt")
}

/// The server on tiny-stt with exact KV caches (as `transcribe`), one key.
pub fn start_server(dir: &Path, extra: &[&str]) -> Server {
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

pub fn asr_url(server: &Server, query: &str) -> String {
    format!("ws://{}/api/asr-streaming{query}", server.addr)
}

/// What Kyutai's file script sends: 1 s of silence, the file in frames, 5 s of silence (the
/// marker goes after these), and 35 s of silence after the marker.
pub fn dsm_stream(audio: &[f32]) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let mut before = vec![vec![0.0; SECOND]];
    before.extend(audio.chunks(FRAME).map(<[f32]>::to_vec));
    before.extend((0..5).map(|_| vec![0.0; SECOND]));
    let after = (0..35).map(|_| vec![0.0; SECOND]).collect();
    (before, after)
}

/// What the server must send for `samples` (the whole stream) over its first `steps` frames:
/// each frame's `Step` (buffered_pcm left out), then its word events; then `marker`, if due then.
pub fn expected_messages(
    dir: &Path,
    samples: &[f32],
    steps: usize,
    marker: Option<i64>,
) -> Vec<AsrServerMessage> {
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
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = read_json_lines(&tokens_out);
    assert!(
        lines.len() >= steps,
        "{} steps offline, {steps} needed",
        lines.len()
    );
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
    expected.extend(marker.map(|id| AsrServerMessage::Marker { id }));
    expected
}

pub fn write_wav(path: &Path, samples: &[f32]) {
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

/// The words of a message list as Kyutai's file script pairs them: each `Word` with its start,
/// its end the `EndWord` that follows it (else its start).
pub fn timed_words(messages: &[AsrServerMessage]) -> Vec<(String, f64, f64)> {
    let mut words: Vec<(String, f64, f64)> = Vec::new();
    for m in messages {
        match m {
            AsrServerMessage::Word { text, start_time } => {
                words.push((text.clone(), *start_time, *start_time))
            }
            AsrServerMessage::EndWord { stop_time } => {
                if let Some(last) = words.last_mut() {
                    last.2 = *stop_time;
                }
            }
            _ => {}
        }
    }
    words
}

pub type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub async fn connect(url: &str, key: Option<&str>) -> Result<Socket, String> {
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

pub fn audio(pcm: &[f32]) -> Message {
    Message::Binary(
        AsrClientMessage::Audio { pcm: pcm.to_vec() }
            .to_bytes()
            .into(),
    )
}

/// Sends `before`, a marker, then `after` as fast as the server takes them, and returns every
/// message received up to the marker's echo.
pub async fn transcribe_stream(
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

/// `Step`'s `buffered_pcm` depends on how fast the client sends: left out of comparisons.
pub fn without_buffered(messages: &[AsrServerMessage]) -> Vec<AsrServerMessage> {
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
