//! `moshi-rs serve` end to end with the tiny model: a Rust client streams
//! `assets/tiny-a/input.wav` as Ogg/Opus at real pace (20 ms packets, two per page, as Kyutai's
//! web UI sends them) and gets the handshake, the metadata, audio and text. Greedy, the tokens
//! the server produced equal `moshi-rs file`'s on the PCM the server decoded (its `--record`),
//! that PCM is the WAV that was sent, and the audio the client decoded is exactly the audio the
//! server sent.

mod common;

use std::time::Duration;

use common::chat::{converse, file_tokens, wait_for_file};
use common::serve::{align, read_wav, tiny_model, Server};
use moshi_server::client::Received;
use moshi_server::ogg_opus::{OggOpusWriter, OpusPacketing};

#[test]
fn a_real_pace_client_gets_the_tokens_of_file_mode() {
    let record = tempfile::tempdir().unwrap();
    let server = Server::start(&[
        "--model",
        tiny_model().to_str().unwrap(),
        "--greedy",
        "--static",
        "none",
        "--record",
        record.path().to_str().unwrap(),
    ]);
    let input = read_wav(&tiny_model().join("input.wav"));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let got = runtime.block_on(converse(
        &server.ws_url(""),
        &input,
        Duration::from_millis(600),
    ));

    // The protocol: handshake first, then the metadata, then audio and text; closed at the end.
    assert_eq!(
        got.messages[0],
        Received::Handshake,
        "{:?}",
        &got.messages[..2]
    );
    let Received::Metadata(meta) = &got.messages[1] else {
        panic!("second message: {:?}", got.messages[1]);
    };
    assert_eq!(meta["greedy"], true, "{meta}");
    assert_eq!(meta["instance_name"], "moshi-rs");
    assert!(meta["lm_model_file"].as_str().unwrap().contains("tiny-a"));
    assert!(matches!(got.messages.last(), Some(Received::Closed(_))));
    for m in &got.messages {
        assert!(
            !matches!(m, Received::Error(_) | Received::Other { .. }),
            "unexpected message {m:?}"
        );
    }

    // The server's record: what the model processed, what it sent, its tokens.
    let heard = read_wav(&wait_for_file(record.path(), "-in.wav"));
    let sent = read_wav(&wait_for_file(record.path(), "-out.wav"));
    let tokens_path = wait_for_file(record.path(), "-tokens.jsonl");
    let server_tokens = std::fs::read_to_string(&tokens_path).unwrap();
    let frames = heard.len() / 1920;
    assert!(
        frames * 1920 >= input.len() * 9 / 10 - 1920,
        "the server processed {frames} frames of {} samples sent",
        input.len()
    );
    assert_eq!(server_tokens.lines().count(), frames);

    // The server heard the WAV: Opus-decoded, later by exactly the encoder's delay (the server
    // keeps the pre-skip so that frames end on the client's packet boundaries).
    let pre_skip = OggOpusWriter::new(0, OpusPacketing::WEB_CLIENT)
        .unwrap()
        .pre_skip_samples();
    let (lag, similarity) = align(&input, &heard, 480);
    // Give or take Opus' own filter delay (a few samples).
    assert!(
        lag.abs_diff(pre_skip) <= 3,
        "decoded input is {lag} samples late, the pre-skip is {pre_skip}"
    );
    assert!(
        similarity > 0.9,
        "decoded input vs the WAV: ncc {similarity:.3}"
    );

    // The client decoded exactly the audio the server sent.
    assert!(!got.audio.is_empty());
    assert_eq!(got.audio.len(), sent.len());
    assert!(got.audio.iter().zip(&sent).all(|(a, b)| a == b));
    // One 1920-sample frame out per frame in (minus the encoder's pre-skip).
    assert!(sent.len() <= frames * 1920 && sent.len() + 1920 > frames * 1920);

    // Greedy: `moshi-rs file` on what the server heard gives the same tokens and text (with the
    // server's default bf16 KV caches; file's default is f32).
    let heard_path = wait_for_file(record.path(), "-in.wav");
    let (expected, file_text) = file_tokens(&heard_path, &tiny_model(), "bf16");
    assert_eq!(server_tokens, expected, "server tokens != file tokens");
    // `file` prints the words with their control characters escaped (a terminal gets no raw
    // escape sequence); the server sends them as they are.
    let sent_text = moshi_loader::escape::escape_controls_in_lines(got.text.trim_end());
    assert!(
        file_text.starts_with(sent_text.as_ref()),
        "text sent {:?} vs file's {file_text:?}",
        got.text
    );

    let log = server.log();
    assert!(
        log.contains("session ended: the client closed the connection"),
        "{log}"
    );
    assert!(server.stop(), "the server did not stop cleanly on Ctrl-C");
}
