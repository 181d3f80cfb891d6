//! `moshi-rs file` with a Hibiki model (assets/tiny-hibiki) through the built binary: the
//! official greedy tokens with guidance 3 (ref/hibiki_greedy.json: 51 returned frames) and
//! audio (ref/output.wav) on the issue's command line, the tail cap, and clear errors for
//! guidance or tail options a model cannot take; and Hibiki-Zero (assets/tiny-hibiki-zero) fed
//! as Kyutai's `hibiki-zero generate` feeds it: its official tokens and output WAV.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{
    assert_fails, assert_tokens_match_reference, assert_wav_within_lsb, jsonl, moshi, read_i16, s,
};
use serde_json::Value;

fn hibiki() -> PathBuf {
    common::asset_dir("tiny-hibiki")
}

/// `moshi-rs file` on the fixture's input with guidance 3, greedy, plus `extra`.
fn translate(out: &Path, extra: &[&str]) -> Output {
    let (input, model) = (hibiki().join("input.wav"), hibiki());
    let base = [
        "file",
        s(&input),
        s(out),
        "--model",
        s(&model),
        "--greedy",
        "--cfg-coef",
        "3",
    ];
    moshi(&[&base[..], extra].concat())
}

#[test]
fn issue_command_reproduces_the_official_guided_translation() {
    let dir = tempfile::tempdir().unwrap();
    let (out, tokens, profile) = (
        dir.path().join("out.wav"),
        dir.path().join("t.jsonl"),
        dir.path().join("p.jsonl"),
    );
    let o = translate(
        &out,
        &[
            "--max-tail-s",
            "0.5",
            "--tokens-out",
            s(&tokens),
            "--profile",
            s(&profile),
        ],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "moshi-rs file failed: {stderr}");
    let reference: Value = serde_json::from_str(
        &std::fs::read_to_string(hibiki().join("ref/hibiki_greedy.json")).unwrap(),
    )
    .unwrap();
    assert_tokens_match_reference(&jsonl(&tokens), &reference);
    let max_lsb = assert_wav_within_lsb(&out, &hibiki().join("ref/output.wav"), 2);
    eprintln!("out.wav: max {max_lsb} LSB from ref/output.wav");
    // Random weights never end their text: the cap (0.5 s: 6 frames, the silence Kyutai's
    // hibiki-rs appends, as in the reference) ends the run, and the user is told the translation
    // may be cut short.
    assert!(stderr.contains("guidance coefficient 3"), "{stderr}");
    assert!(
        stderr.contains("no EOS") && stderr.contains("--max-tail-s"),
        "{stderr}"
    );
    // One profile record per model call: 45 input frames, the end of stream, 6 silence frames.
    let prof = jsonl(&profile);
    assert_eq!(prof.len(), 45 + 1 + 6 + 1);
    assert_eq!(prof.last().unwrap()["event"], "summary");
}

#[test]
fn tail_flag_caps_the_silence_after_the_input() {
    let dir = tempfile::tempdir().unwrap();
    let (out, tokens) = (dir.path().join("out.wav"), dir.path().join("t.jsonl"));
    let o = translate(&out, &["--max-tail-s", "0.16", "--tokens-out", s(&tokens)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(jsonl(&tokens).len(), 44 + 1 + 2);
    assert_eq!(read_i16(&out).len(), 47 * 1920);
}

#[test]
fn default_tail_cap_leaves_a_lagging_translation_30_seconds_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let (out, tokens) = (dir.path().join("out.wav"), dir.path().join("t.jsonl"));
    let o = translate(&out, &["--tokens-out", s(&tokens)]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    // Random weights never return EOS: 44 returned input frames, the end of stream, 375 silence
    // frames (30 s), then the warning.
    assert_eq!(jsonl(&tokens).len(), 44 + 1 + 375);
    assert_eq!(read_i16(&out).len(), 420 * 1920);
    assert!(
        stderr.contains("375 silence frames (30.00 s, --max-tail-s)"),
        "{stderr}"
    );
}

#[test]
fn guidance_and_tail_options_are_refused_where_they_cannot_apply() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.wav");
    let tiny_a = common::asset_dir("tiny-a");
    let input = tiny_a.join("input.wav");
    let moshi_file = |extra: &[&str]| {
        let base = [
            "file",
            s(&input),
            s(&out),
            "--model",
            s(&tiny_a),
            "--greedy",
        ];
        moshi(&[&base[..], extra].concat())
    };
    assert_fails(
        &moshi_file(&["--cfg-coef", "3"]),
        &["--cfg-coef 3", "no conditioners"],
    );
    assert_fails(
        &moshi_file(&["--max-tail-s", "2"]),
        &["--max-tail-s", "translation models"],
    );
    let (hibiki_input, hibiki_model) = (hibiki().join("input.wav"), hibiki());
    for bad in ["--cfg-coef=0", "--cfg-coef=-2", "--cfg-coef=nan"] {
        let args = [
            "file",
            s(&hibiki_input),
            s(&out),
            "--model",
            s(&hibiki_model),
            bad,
        ];
        assert_fails(&moshi(&args), &["--cfg-coef", "positive"]);
    }
    assert_fails(&translate(&out, &["--max-tail-s=-1"]), &["--max-tail-s"]);
    assert!(!out.exists(), "an output was written");
}

fn hibiki_zero() -> PathBuf {
    common::asset_dir("tiny-hibiki-zero")
}

/// `moshi-rs file` on tiny-hibiki-zero's input, greedy, plus `extra`.
fn translate_zero(out: &Path, extra: &[&str]) -> Output {
    let (input, model) = (hibiki_zero().join("input.wav"), hibiki_zero());
    let base = ["file", s(&input), s(out), "--model", s(&model), "--greedy"];
    moshi(&[&base[..], extra].concat())
}

/// The fixture's run: 64 frames (`gen_duration` 5.12 s), 2 warm-up frames, the end of input at
/// frame 58; every returned frame's tokens, and `generate`'s output WAV (decode_outputs: no EOS,
/// so cut before the last frame: 63 frames) within 1 LSB.
#[test]
fn hibiki_zero_reproduces_the_official_generate() {
    let dir = tempfile::tempdir().unwrap();
    let (out, tokens, profile) = (
        dir.path().join("out.wav"),
        dir.path().join("t.jsonl"),
        dir.path().join("p.jsonl"),
    );
    let o = translate_zero(
        &out,
        &[
            "--gen-duration-s",
            "5.12",
            "--tokens-out",
            s(&tokens),
            "--profile",
            s(&profile),
        ],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "moshi-rs file failed: {stderr}");
    let reference: Value = serde_json::from_str(
        &std::fs::read_to_string(hibiki_zero().join("ref/hibiki_zero_greedy.json")).unwrap(),
    )
    .unwrap();
    assert_tokens_match_reference(&jsonl(&tokens), &reference);
    assert_eq!(reference["output_wav_frames"], 63);
    let max_lsb = assert_wav_within_lsb(&out, &hibiki_zero().join("ref/output.wav"), 1);
    eprintln!("out.wav: max {max_lsb} LSB from ref/output.wav");
    assert!(
        stderr.contains("64 frames (5.12 s, --gen-duration-s), end of input at frame 58"),
        "{stderr}"
    );
    assert!(stderr.contains("no EOS"), "{stderr}");
    // One record per model call (2 warm-up frames, 64 frames), then the summary.
    assert_eq!(jsonl(&profile).len(), 2 + 64 + 1);
}

/// Without `--gen-duration-s` the window is the input plus 30 s (4.64 s, its last frame zero-padded, + 30 s: 433 frames): its
/// first 64 returned frames are the fixture's 5.12 s run's, each frame depending only on the
/// frames before it.
#[test]
fn hibiki_zero_default_window_is_the_input_plus_30_s_and_keeps_the_official_frames() {
    let dir = tempfile::tempdir().unwrap();
    let (out, tokens) = (dir.path().join("out.wav"), dir.path().join("t.jsonl"));
    let o = translate_zero(&out, &["--tokens-out", s(&tokens)]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "moshi-rs file failed: {stderr}");
    assert!(
        stderr.contains("433 frames (34.64 s, --gen-duration-s), end of input at frame 58"),
        "{stderr}"
    );
    let reference: Value = serde_json::from_str(
        &std::fs::read_to_string(hibiki_zero().join("ref/hibiki_zero_greedy.json")).unwrap(),
    )
    .unwrap();
    let lines = jsonl(&tokens);
    assert!(lines.len() >= 64, "{} frames returned", lines.len());
    assert_tokens_match_reference(&lines[..64], &reference);
}

#[test]
fn hibiki_zero_options_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.wav");
    // The input (4.56 s) is longer than the window.
    assert_fails(
        &translate_zero(&out, &["--gen-duration-s", "4"]),
        &["input.wav", "longer than --gen-duration-s 4"],
    );
    for bad in [
        "--gen-duration-s=0",
        "--gen-duration-s=nan",
        "--gen-duration-s=121",
    ] {
        assert_fails(&translate_zero(&out, &[bad]), &["--gen-duration-s"]);
    }
    assert_fails(
        &translate_zero(&out, &["--max-tail-s", "1"]),
        &["--max-tail-s", "Hibiki-Zero", "--gen-duration-s"],
    );
    assert_fails(
        &translate(&out, &["--gen-duration-s", "10"]),
        &[
            "--gen-duration-s",
            "Hibiki-Zero only",
            "hibiki (speech translation)",
        ],
    );
    assert!(!out.exists(), "an output was written");
}
