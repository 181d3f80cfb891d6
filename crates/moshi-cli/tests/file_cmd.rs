//! `moshi-rs file` end to end through the built binary: greedy tokens and output audio against
//! the official references (ref/lm_greedy.json, ref/output.wav), transcript/profile files, and
//! clear failures (exit code != 0, nothing half-written) on bad input.

mod common;

use std::path::{Path, PathBuf};

use common::{
    assert_fails, assert_tokens_match_reference, assert_wav_within_lsb, jsonl, moshi, read_i16, s,
};
use serde_json::Value;

fn assets() -> PathBuf {
    common::asset_dir("tiny-a")
}

#[test]
fn greedy_file_mode_reproduces_official_tokens_and_audio() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.wav");
    let tokens = dir.path().join("t.jsonl");
    let transcript = dir.path().join("words.tsv");
    let profile = dir.path().join("profile.jsonl");
    let input = assets().join("input.wav");
    let o = moshi(&[
        "file",
        s(&input),
        s(&out),
        "--model",
        s(&assets()),
        "--greedy",
        "--tokens-out",
        s(&tokens),
        "--transcript",
        s(&transcript),
        "--profile",
        s(&profile),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "moshi-rs file failed: {stderr}");

    let reference: Value = serde_json::from_str(
        &std::fs::read_to_string(assets().join("ref/lm_greedy.json")).unwrap(),
    )
    .unwrap();
    assert_tokens_match_reference(&jsonl(&tokens), &reference);
    assert_wav_within_lsb(&out, &assets().join("ref/output.wav"), 2);

    // Printed words = the official decoding of the returned text tokens (pieces, '▁' -> ' ').
    let stdout = String::from_utf8(o.stdout).unwrap();
    assert!(!stdout.trim().is_empty(), "no words printed");
    let tsv = std::fs::read_to_string(&transcript).unwrap();
    for line in tsv.lines() {
        let cols: Vec<&str> = line.split('\t').collect();
        assert_eq!(cols.len(), 3, "transcript line {line:?}");
        let (a, b): (f64, f64) = (cols[0].parse().unwrap(), cols[1].parse().unwrap());
        assert!(a < b && b <= 43.0 * 0.08 + 1e-9, "{line:?}");
    }
    assert!(stderr.contains("real-time factor"), "{stderr}");
    assert!(
        stderr.contains("mimi_encode")
            && stderr.contains("lm_depformer")
            && stderr.contains("mimi_decode"),
        "{stderr}"
    );
    let prof = jsonl(&profile);
    assert_eq!(prof.len(), 44);
    assert_eq!(prof[43]["event"], "summary");
}

#[test]
fn sixteen_khz_input_is_resampled_and_processed() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.wav");
    let o = moshi(&[
        "file",
        s(&assets().join("input_16k.wav")),
        s(&out),
        "--model",
        s(&assets()),
        "--seed",
        "7",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // 84480 samples at 24 kHz after resampling -> 44 whole frames.
    assert_eq!(read_i16(&out).len(), 44 * 1920);
}

#[test]
fn bf16_and_i8_kv_caches_run_the_whole_file_and_a_bad_precision_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.wav");
    let (input, model) = (assets().join("input.wav"), assets());
    let base = ["file", s(&input), s(&out), "--model", s(&model), "--greedy"];
    for precision in ["bf16", "i8"] {
        let o = moshi(&[&base[..], &["--kv-cache", precision]].concat());
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        // input.wav: 43 whole frames of 1920 samples.
        assert_eq!(read_i16(&out).len(), 43 * 1920, "--kv-cache {precision}");
        std::fs::remove_file(&out).unwrap();
    }
    let o = moshi(&[&base[..], &["--kv-cache", "f16"]].concat());
    assert_fails(&o, &["--kv-cache", "f16", "expected f32, bf16 or i8"]);
    assert!(!out.exists());
}

/// A folder laid out like Kyutai's `moshiko-candle-q8` repo (its LM only as `model.q8.gguf`, the
/// candle q8_0 fixture), with tiny-a's config, Mimi and tokenizer: `--model DIR` resolves it,
/// and `file` runs the packed q8_0 weights to the tokens and audio of the same weights
/// dequantized to f32 (`--dequantize`).
#[test]
fn candle_q8_0_gguf_folder_runs_packed_as_its_dequantized_weights() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("moshiko-candle-q8");
    std::fs::create_dir(&model).unwrap();
    for name in [
        "config.json",
        "mimi.safetensors",
        "mimi_config.json",
        "tokenizer.model",
    ] {
        std::fs::copy(assets().join(name), model.join(name)).unwrap();
    }
    let gguf = common::asset_dir("tiny-a-gguf").join("model.q8.gguf");
    std::fs::copy(&gguf, model.join("model.q8.gguf")).unwrap();
    let input = assets().join("input.wav");
    let run = |name: &str, extra: &[&str]| {
        let (out, tokens) = (
            dir.path().join(format!("{name}.wav")),
            dir.path().join(format!("{name}.jsonl")),
        );
        let args = [
            &[
                "file",
                s(&input),
                s(&out),
                "--model",
                s(&model),
                "--greedy",
                "--tokens-out",
                s(&tokens),
            ][..],
            extra,
        ]
        .concat();
        let o = moshi(&args);
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(
            o.status.success(),
            "moshi-rs file ({name}) failed: {stderr}"
        );
        (read_i16(&out), jsonl(&tokens), stderr)
    };
    let (packed_audio, packed_tokens, stderr) = run("packed", &[]);
    assert!(stderr.contains("model.q8.gguf"), "{stderr}");
    let (dense_audio, dense_tokens, _) = run("dense", &["--dequantize"]);
    assert_eq!(packed_tokens.len(), 43);
    assert_eq!(packed_tokens, dense_tokens);
    assert_eq!(packed_audio, dense_audio);
}

fn dir_entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn bad_input_gives_clear_errors_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let model = assets();
    let out = dir.path().join("out.wav");

    // Missing input.
    let missing = dir.path().join("missing.wav");
    assert_fails(
        &moshi(&["file", s(&missing), s(&out), "--model", s(&model)]),
        &["missing.wav", "does not exist"],
    );

    // Not a WAV.
    let junk = dir.path().join("junk.wav");
    std::fs::write(&junk, b"definitely not audio").unwrap();
    assert_fails(
        &moshi(&["file", s(&junk), s(&out), "--model", s(&model)]),
        &["junk.wav", "not a readable WAV"],
    );

    // Shorter than one frame (1000 samples at 24 kHz).
    let short = dir.path().join("short.wav");
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 24_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(&short, spec).unwrap();
    for i in 0..1000 {
        w.write_sample((i % 100) as i16).unwrap();
    }
    w.finalize().unwrap();
    assert_fails(
        &moshi(&["file", s(&short), s(&out), "--model", s(&model)]),
        &["short.wav", "too short", "1920"],
    );

    // Output folder that does not exist.
    let unwritable = dir.path().join("no/such/folder/out.wav");
    assert_fails(
        &moshi(&[
            "file",
            s(&model.join("input.wav")),
            s(&unwritable),
            "--model",
            s(&model),
        ]),
        &["does not exist"],
    );
    // Output is a directory.
    assert_fails(
        &moshi(&[
            "file",
            s(&model.join("input.wav")),
            s(dir.path()),
            "--model",
            s(&model),
        ]),
        &["is a directory"],
    );

    // Model folder missing a file (no tokenizer).
    let partial = dir.path().join("partial-model");
    std::fs::create_dir(&partial).unwrap();
    for f in [
        "config.json",
        "model.safetensors",
        "mimi.safetensors",
        "mimi_config.json",
    ] {
        std::fs::copy(model.join(f), partial.join(f)).unwrap();
    }
    assert_fails(
        &moshi(&[
            "file",
            s(&model.join("input.wav")),
            s(&out),
            "--model",
            s(&partial),
        ]),
        &["partial-model", "tokenizer"],
    );

    // No output, no temp file was left anywhere.
    assert_eq!(
        dir_entries(dir.path()),
        vec!["junk.wav", "partial-model", "short.wav"]
    );
}
