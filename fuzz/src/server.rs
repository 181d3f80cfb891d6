//! What the server's fuzz targets do with their input: what a websocket client can send to
//! `moshi-rs serve` (binary messages, the Ogg/Opus stream inside them, the query string of
//! `/api/chat`). Each returns normally for any input: an `Err` is the right answer to bad input
//! (the server then ends that session with a kind-5 message); a panic, an abort, a hang or an
//! allocation out of proportion to the input is a bug. Included by the server fuzz targets and
//! by moshi-server's `fuzz_regressions` test, which replays the seeds and kept crashes.

use moshi_model::generator::SamplingConfig;
use moshi_server::app::Limits;
use moshi_server::asr_protocol::AsrClientMessage;
use moshi_server::ogg_opus::{OggOpusReader, OggOpusWriter, OpusPacketing, PreSkip};
use moshi_server::protocol::{parse_client_message, ClientMessage};
use moshi_server::query::SessionRequest;

/// Decoded samples a session keeps before handing whole frames on (it never holds more than
/// one message's worth plus a frame).
fn consume_frames(pcm: &mut Vec<f32>) {
    let whole = pcm.len() / moshi_runtime::FRAME_SAMPLES * moshi_runtime::FRAME_SAMPLES;
    pcm.drain(..whole);
}

/// Feeds `stream` to a fresh reader in messages of `chunk_bytes` (the last one shorter), as the
/// server does with a session's audio, with the server's per-message cap on decoded audio.
fn read_stream(stream: &[u8], chunk_bytes: usize) {
    let cap = Limits::default().max_audio_per_message_samples;
    for pre_skip in [PreSkip::Keep, PreSkip::Discard] {
        let mut reader = OggOpusReader::new(pre_skip);
        let mut pcm = Vec::new();
        for chunk in stream.chunks(chunk_bytes.max(1)) {
            let before = pcm.len();
            if reader.push(chunk, &mut pcm, cap).is_err() {
                break;
            }
            assert!(
                pcm.len() - before <= cap,
                "one message decoded beyond the cap"
            );
            consume_frames(&mut pcm);
        }
    }
}

/// An Ogg/Opus stream as a client would send it: whole, then cut into small uneven messages
/// (pages split across messages), the chunk size taken from the input's length.
pub fn ogg_opus(data: &[u8]) {
    read_stream(data, data.len());
    read_stream(data, 1 + data.len() % 97);
}

/// The messages of a fuzz input: (u16 little-endian length, message) records, the last one cut
/// short by the input's end.
fn records(mut rest: &[u8]) -> impl Iterator<Item = &[u8]> {
    std::iter::from_fn(move || {
        if rest.len() < 2 {
            return None;
        }
        let len = u16::from_le_bytes([rest[0], rest[1]]) as usize;
        let end = (2 + len).min(rest.len());
        let message = &rest[2..end];
        rest = &rest[end..];
        Some(message)
    })
}

/// A session's binary messages: the input is a sequence of (u16 little-endian length, message)
/// records; each message is parsed as the server does (kind byte, payload) and audio payloads
/// go through one session's Ogg/Opus reader. The first error ends the session.
pub fn client_messages(data: &[u8]) {
    let cap = Limits::default().max_audio_per_message_samples;
    let mut reader = OggOpusReader::new(PreSkip::Keep);
    let mut pcm = Vec::new();
    for message in records(data) {
        match parse_client_message(message) {
            Ok(ClientMessage::Audio(ogg)) => {
                if reader.push(ogg, &mut pcm, cap).is_err() {
                    return;
                }
                consume_frames(&mut pcm);
            }
            Ok(ClientMessage::Unused(_) | ClientMessage::UnknownKind(_)) => {}
            Err(_) => return,
        }
    }
}

/// The query string of `/api/chat` (`key=value&...`, as the web UI sends its settings), applied
/// over sampling defaults and over a greedy server's.
pub fn query(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let params: Vec<(String, String)> = text
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (pair.to_string(), String::new()),
        })
        .collect();
    for defaults in [SamplingConfig::default(), SamplingConfig::greedy()] {
        if let Ok(request) = SessionRequest::from_query(&params, &defaults) {
            let _ = request.settings_json();
        }
    }
}

/// Markers a stream keeps waiting at most (the server's bound; more end the stream).
const MAX_PENDING_MARKERS: usize = 1024;

/// A speech-to-text stream's messages (`/api/asr-streaming`, MessagePack): the input is a
/// sequence of (u16 little-endian length, message) records, each read as the server reads it;
/// `Audio` samples and `OggOpus` pages (through the stream's reader, with the server's cap) are
/// cut into frames, markers counted up to the server's bound. The first error ends the stream.
pub fn asr_messages(data: &[u8]) {
    let cap = Limits::default().max_audio_per_message_samples;
    let mut reader = OggOpusReader::new(PreSkip::Discard);
    let (mut pcm, mut markers) = (Vec::new(), 0usize);
    for message in records(data) {
        match AsrClientMessage::from_bytes(message) {
            Ok(AsrClientMessage::Audio { pcm: samples }) => {
                assert!(
                    samples.iter().all(|x| x.is_finite()),
                    "a non-finite sample got through"
                );
                pcm.extend_from_slice(&samples);
            }
            Ok(AsrClientMessage::OggOpus { data }) => {
                if reader.push(&data.0, &mut pcm, cap).is_err() {
                    return;
                }
            }
            Ok(AsrClientMessage::Marker { .. }) => {
                markers += 1;
                if markers > MAX_PENDING_MARKERS {
                    return;
                }
            }
            Ok(AsrClientMessage::Init) => {}
            Err(_) => return,
        }
        consume_frames(&mut pcm);
    }
}

/// `--tls-cert` and `--tls-key` as the server reads them: the input is two (u16 little-endian
/// length, bytes) records, the certificate chain's PEM and the key's PEM. Any answer but a
/// configuration is an error naming its flag.
pub fn tls_pem(data: &[u8]) {
    let mut files = records(data);
    let cert = files.next().unwrap_or_default();
    let key = files.next().unwrap_or_default();
    let tls = moshi_server::tls::TlsFiles {
        cert: "cert.pem".into(),
        key: "key.pem".into(),
    };
    if let Err(e) = tls.server_config(cert, key) {
        let message = e.to_string();
        assert!(
            message.contains("--tls-"),
            "an error naming no flag: {message}"
        );
    }
}

/// The pages of a valid half-second web-client stream (OpusHead, OpusTags, audio), made once.
fn stream_pages() -> &'static [Vec<u8>] {
    static PAGES: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();
    PAGES.get_or_init(|| {
        let mut writer = OggOpusWriter::new(7, OpusPacketing::WEB_CLIENT).unwrap();
        let pcm: Vec<f32> = (0..12_000).map(|i| 0.3 * (i as f32 * 0.05).sin()).collect();
        let mut bytes = Vec::new();
        for chunk in pcm.chunks(960) {
            bytes.extend(writer.push(chunk).unwrap());
        }
        split_pages(&bytes)
    })
}

/// Ogg pages of a well-formed stream: 27-byte header, segment table, body.
fn split_pages(mut bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut pages = Vec::new();
    while bytes.len() >= 27 {
        let segments = bytes[26] as usize;
        let body: usize = bytes[27..27 + segments].iter().map(|&b| b as usize).sum();
        let (page, rest) = bytes.split_at(27 + segments + body);
        pages.push(page.to_vec());
        bytes = rest;
    }
    pages
}

/// The Ogg page sequence (RFC 3533): each input byte picks a page of a valid stream (page
/// `byte % pages`, its sequence number its index), sent one per message; pages repeated,
/// missing or out of order. The reader accepts the pages exactly as long as they run 0, 1, 2,
/// ... and refuses the first that breaks the run.
pub fn ogg_sequence(data: &[u8]) {
    let pages = stream_pages();
    let cap = Limits::default().max_audio_per_message_samples;
    let mut reader = OggOpusReader::new(PreSkip::Keep);
    let mut pcm = Vec::new();
    for (i, &pick) in data.iter().enumerate() {
        let index = pick as usize % pages.len();
        let result = reader.push(&pages[index], &mut pcm, cap);
        consume_frames(&mut pcm);
        let in_order = index == i;
        assert_eq!(
            result.is_ok(),
            in_order,
            "page {index} sent {i}th: {result:?}"
        );
        if !in_order {
            return;
        }
    }
}
