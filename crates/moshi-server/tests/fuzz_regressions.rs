//! Replays the server fuzz targets' seeds and every kept regression input (crashes
//! `scripts/fuzz.sh` found, fixed since) through the targets' own code (`fuzz/src/server.rs`):
//! each must return, an error being a fine answer to bad input, never panic. The seeds are a real
//! client's Ogg/Opus stream, its messages and the web UI's query string; `write_seeds` (ignored)
//! makes them again.

use moshi_server::asr_protocol::serde_bytes_compat::Bytes;
use moshi_server::asr_protocol::AsrClientMessage;
use moshi_server::ogg_opus::{OggOpusWriter, OpusPacketing};
use moshi_server::protocol::MessageKind;

#[path = "../../../fuzz/src/server.rs"]
mod server;

use moshi_test_support::replay_fuzz_inputs as replay;

#[test]
fn ogg_opus_inputs() {
    replay("ogg_opus", server::ogg_opus);
}

#[test]
fn client_messages_inputs() {
    replay("client_messages", server::client_messages);
}

#[test]
fn query_inputs() {
    replay("query", server::query);
}

#[test]
fn asr_messages_inputs() {
    replay("asr_messages", server::asr_messages);
}

#[test]
fn tls_pem_inputs() {
    replay("tls_pem", server::tls_pem);
}

#[test]
fn ogg_sequence_inputs() {
    replay("ogg_sequence", server::ogg_sequence);
}

/// Half a second of a speech-band tone as the web client sends it: Ogg pages, one message per
/// page.
fn client_pages() -> Vec<Vec<u8>> {
    let pcm: Vec<f32> = (0..12_000)
        .map(|i| {
            let t = i as f32 / 24_000.0;
            0.4 * (2.0 * std::f32::consts::PI * (300.0 + 400.0 * t) * t).sin()
        })
        .collect();
    let mut writer = OggOpusWriter::new(1, OpusPacketing::WEB_CLIENT).unwrap();
    pcm.chunks(1920)
        .map(|chunk| writer.push(chunk).unwrap())
        .filter(|pages| !pages.is_empty())
        .collect()
}

#[test]
#[ignore = "writes fuzz/seeds/{ogg_opus,client_messages,query,asr_messages}: run by hand"]
fn write_seeds() {
    let root = moshi_test_support::repo_root().join("fuzz/seeds");
    let pages = client_pages();
    std::fs::write(root.join("ogg_opus/web_client_0.5s.ogg"), pages.concat()).unwrap();
    let mut messages = Vec::new();
    for (i, page) in pages.iter().enumerate() {
        let mut message = vec![MessageKind::Audio as u8];
        message.extend_from_slice(page);
        if i == 1 {
            // A kind the session discards, between audio messages.
            messages.extend_from_slice(&1u16.to_le_bytes());
            messages.push(MessageKind::Control as u8);
        }
        messages.extend_from_slice(&(message.len() as u16).to_le_bytes());
        messages.extend_from_slice(&message);
    }
    std::fs::write(root.join("client_messages/web_client_session"), messages).unwrap();
    // A speech-to-text stream as Kyutai's scripts and the LiveKit plugin send it: audio frames,
    // a marker, Ogg/Opus pages, an Init.
    let asr = [
        AsrClientMessage::Audio {
            pcm: vec![0.0; 1920],
        },
        AsrClientMessage::Audio {
            pcm: vec![0.25; 960],
        },
        AsrClientMessage::Marker { id: 7 },
        AsrClientMessage::OggOpus {
            data: Bytes(pages.concat()),
        },
        AsrClientMessage::Init,
    ];
    let mut stream = Vec::new();
    for m in &asr {
        let bytes = m.to_bytes();
        stream.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
        stream.extend_from_slice(&bytes);
    }
    std::fs::create_dir_all(root.join("asr_messages")).unwrap();
    std::fs::write(root.join("asr_messages/dsm_session"), stream).unwrap();
    std::fs::write(
        root.join("query/web_ui_settings"),
        "text_temperature=0.7&text_topk=25&audio_temperature=0.8&audio_topk=250&pad_mult=0&repetition_penalty_context=64&repetition_penalty=1&text_seed=123&audio_seed=456&stats_s=1",
    )
    .unwrap();
}
