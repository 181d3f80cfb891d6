//! `moshi-rs transcribe` end to end through the built binary on the speech-to-text fixtures
//! (tiny-stt as kyutai/stt-1b-en_fr; tiny-stt-2b6 as kyutai/stt-2.6b-en: a 1 s silence prefix,
//! a 2.5 s delay, no extra heads): every greedy text token and extra head of the official
//! PyTorch run (`ref/stt_greedy.json`), the DSM script's words with their start and end in
//! every `--out` format, with the bf16 weights as stored and expanded to f32; q8 / q4 through
//! the packed kernels (an MLX file written by `moshi-rs quantize` and `--quantize` at load)
//! against the same weights dequantized; and clear failures on bad input.
//!
//! Extra heads: within 2e-6 of the reference, as `moshi-model --test stt_reference` (the
//! reference is rounded to 7 decimals; the rest is f32 summation order).

mod common;

use std::path::{Path, PathBuf};

use common::{assert_fails, jsonl, moshi, s};
use serde_json::Value;

const HEAD_TOL: f64 = 2e-6;

/// A speech-to-text fixture under `assets/` and what its reference's words look like.
struct Fixture {
    name: &'static str,
    /// Words of the official run.
    words: usize,
    /// The first word's cue as `.srt` writes it.
    first_srt_cue: &'static str,
    /// One word's cue as `.vtt` writes it.
    a_vtt_cue: &'static str,
}

/// As kyutai/stt-1b-en_fr: 4 extra heads, delay 0.5 s, no silence prefix.
const TINY_STT: Fixture = Fixture {
    name: "tiny-stt",
    words: 6,
    first_srt_cue: "1\n00:00:00,300 --> 00:00:00,460\n",
    a_vtt_cue: "00:00:02.460 --> 00:00:02.620\ncoent\n",
};

/// As kyutai/stt-2.6b-en: no extra heads, delay 2.5 s, 1 s of silence before the audio. Its
/// first words come before the offset (clamped at 0); one word starts with a tab (escaped).
const TINY_STT_2B6: Fixture = Fixture {
    name: "tiny-stt-2b6",
    words: 13,
    first_srt_cue: "1\n00:00:00,000 --> 00:00:00,000\ncall\n",
    a_vtt_cue: "00:00:02.020 --> 00:00:02.340\n\\tunun\n",
};

/// tiny-stt's folder: the model of the quantization and bad-input tests.
fn assets() -> PathBuf {
    common::asset_dir(TINY_STT.name)
}

fn reference_text(fx: &Fixture) -> String {
    std::fs::read_to_string(common::asset_dir(fx.name).join("ref/stt_greedy.json")).unwrap()
}

fn reference(fx: &Fixture) -> Value {
    serde_json::from_str(&reference_text(fx)).unwrap()
}

/// `(text, start_s, end_s)` of the words in a JSON text (`--out words.json` or the reference's
/// `words`). The times are read with Rust's correctly rounded parser (serde_json's default one
/// may be 1 ulp off), so that they compare exactly.
fn words_in(json: &str) -> Vec<(String, f64, f64)> {
    let v: Value = serde_json::from_str(json).unwrap();
    let words = v.get("words").unwrap_or(&v).as_array().unwrap().clone();
    let section = match json.find("\"steps\"") {
        Some(end) => &json[..end],
        None => json,
    };
    let times = |key: &str| -> Vec<f64> {
        section
            .match_indices(&format!("\"{key}\": "))
            .map(|(i, m)| {
                let rest = &section[i + m.len()..];
                let end = rest.find([',', '}', '\n']).unwrap();
                rest[..end].trim().parse::<f64>().unwrap()
            })
            .collect()
    };
    let (starts, ends) = (times("start_s"), times("end_s"));
    assert_eq!((starts.len(), ends.len()), (words.len(), words.len()));
    words
        .iter()
        .zip(starts.into_iter().zip(ends))
        .map(|(w, (a, b))| (w["text"].as_str().unwrap().to_string(), a, b))
        .collect()
}

/// Runs `transcribe` on the input of `fx` with `extra` flags, writing `--tokens-out` into
/// `dir`; returns the steps written.
fn transcribe(fx: &Fixture, dir: &Path, extra: &[&str]) -> Vec<Value> {
    let tokens = dir.join("steps.jsonl");
    let model = common::asset_dir(fx.name);
    let input = model.join("input.wav");
    let mut args = vec![
        "transcribe",
        s(&input),
        "--model",
        s(&model),
        "--tokens-out",
        s(&tokens),
    ];
    args.extend_from_slice(extra);
    let o = moshi(&args);
    assert!(
        o.status.success(),
        "moshi-rs transcribe {extra:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    jsonl(&tokens)
}

/// `moshi-rs transcribe WAV --model assets/tiny-stt EXTRA...`.
fn transcribe_tiny(wav: &Path, extra: &[&str]) -> std::process::Output {
    let model = assets();
    let mut args = vec!["transcribe", s(wav), "--model", s(&model)];
    args.extend_from_slice(extra);
    moshi(&args)
}

fn heads(step: &Value) -> Vec<Vec<f64>> {
    step["extra_heads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            h.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

/// Largest difference between the extra heads of two runs (or a run and the reference).
fn heads_diff(a: &Value, b: &Value) -> f64 {
    let (a, b) = (heads(a), heads(b));
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(&b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len());
            x.iter().zip(y).map(|(p, q)| (p - q).abs())
        })
        .fold(0.0, f64::max)
}

/// Every step's fed chunk and text token equal the reference's, every extra head within
/// [`HEAD_TOL`].
fn assert_matches_reference(fx: &Fixture, steps: &[Value], what: &str) {
    let reference = reference(fx);
    let want = reference["steps"].as_array().unwrap();
    assert_eq!(steps.len(), want.len(), "{what}: steps");
    for (i, (got, want)) in steps.iter().zip(want).enumerate() {
        assert_eq!(got["frame"], i, "{what}: step index");
        assert_eq!(got["fed"], want["fed"], "{what}: fed chunk of step {i}");
        assert_eq!(
            got["text"], want["text_token"],
            "{what}: text token of step {i}"
        );
        let d = heads_diff(got, want);
        assert!(
            d <= HEAD_TOL,
            "{what}: extra heads of step {i} differ by {d}"
        );
    }
}

/// `transcribe` with every output on `fx`: the steps and the words as the official run's.
fn check_transcribe(fx: &Fixture) {
    let dir = tempfile::tempdir().unwrap();
    let out = |name: &str| dir.path().join(name);
    let (json, tsv, srt, vtt, profile) = (
        out("words.json"),
        out("words.tsv"),
        out("words.srt"),
        out("words.vtt"),
        out("profile.jsonl"),
    );
    let steps = transcribe(
        fx,
        dir.path(),
        &[
            "--out",
            s(&json),
            "--out",
            s(&tsv),
            "--out",
            s(&srt),
            "--out",
            s(&vtt),
            "--profile",
            s(&profile),
        ],
    );
    assert_matches_reference(fx, &steps, "bf16 weights");

    let want = words_in(&reference_text(fx));
    assert_eq!(want.len(), fx.words);
    let got = words_in(&std::fs::read_to_string(&json).unwrap());
    assert_eq!(got, want, "--out words.json");
    // Control characters are written escaped (`\u{12}`: moshi_loader::escape::escape_controls).
    let escaped = |w: &str| -> String {
        w.chars()
            .map(|c| match c.is_control() {
                true => c.escape_default().to_string(),
                false => c.to_string(),
            })
            .collect()
    };
    let tsv_want: String = want
        .iter()
        .map(|(w, a, b)| format!("{a:.2}\t{b:.2}\t{}\n", escaped(w)))
        .collect();
    assert_eq!(std::fs::read_to_string(&tsv).unwrap(), tsv_want);
    let srt_text = std::fs::read_to_string(&srt).unwrap();
    assert!(srt_text.starts_with(fx.first_srt_cue), "{srt_text}");
    assert_eq!(srt_text.matches(" --> ").count(), want.len());
    let vtt_text = std::fs::read_to_string(&vtt).unwrap();
    assert!(vtt_text.starts_with("WEBVTT\n\n"), "{vtt_text}");
    assert!(vtt_text.contains(fx.a_vtt_cue), "{vtt_text}");
    assert_eq!(vtt_text.matches(" --> ").count(), want.len());
    let prof = jsonl(&profile);
    assert_eq!(prof.len(), steps.len() + 1);
    assert_eq!(prof[steps.len()]["event"], "summary");
}

#[test]
fn transcribe_reproduces_official_tokens_extra_heads_and_words() {
    check_transcribe(&TINY_STT);
}

#[test]
fn transcribe_with_a_silence_prefix_long_delay_and_no_extra_heads_reproduces_the_official_run() {
    check_transcribe(&TINY_STT_2B6);
}

#[test]
fn f32_weights_reproduce_the_reference_too() {
    for fx in [&TINY_STT, &TINY_STT_2B6] {
        let dir = tempfile::tempdir().unwrap();
        // --dequantize hands the bf16 weights over as f32.
        let steps = transcribe(fx, dir.path(), &["--dequantize"]);
        assert_matches_reference(fx, &steps, &format!("{}: f32 weights", fx.name));
    }
}

/// The q8 / q4 model through the packed kernels gives the tokens of the same quantized weights
/// expanded to f32, and extra heads within f32 rounding of them. (Its tokens may differ from the
/// f32 reference: quantization changes the model.)
fn check_quantized(bits: &str, group: &str, at_load: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(format!("model.q{bits}.safetensors"));
    let config = assets().join("config.json");
    let o = moshi(&[
        "quantize",
        s(&assets().join("model.safetensors")),
        s(&file),
        "--bits",
        bits,
        "--group-size",
        group,
        "--config",
        s(&config),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let packed = transcribe(&TINY_STT, dir.path(), &["--weights", s(&file)]);
    let dense = transcribe(
        &TINY_STT,
        dir.path(),
        &["--weights", s(&file), "--dequantize"],
    );
    let at_load = transcribe(&TINY_STT, dir.path(), &["--quantize", at_load]);
    assert_eq!(packed.len(), 60);
    for (i, ((p, d), l)) in packed.iter().zip(&dense).zip(&at_load).enumerate() {
        assert_eq!(
            p["text"], d["text"],
            "q{bits}: packed vs dequantized, step {i}"
        );
        let diff = heads_diff(p, d);
        assert!(
            diff <= 1e-5,
            "q{bits}: extra heads of step {i} differ by {diff}"
        );
        // `--quantize` at load quantizes as `moshi-rs quantize` writes: the same run.
        assert_eq!(p, l, "q{bits}: MLX file vs --quantize at load, step {i}");
    }
}

#[test]
fn q8_packed_kernels_agree_with_the_dequantized_model() {
    check_quantized("8", "64", "q8");
}

#[test]
fn q4_packed_kernels_agree_with_the_dequantized_model() {
    check_quantized("4", "32", "q4");
}

#[test]
fn bad_input_fails_clearly_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let input = assets().join("input.wav");
    let json = dir.path().join("w.json");
    // An unknown --out format, before anything runs.
    let txt = dir.path().join("w.txt");
    let o = transcribe_tiny(&input, &["--out", s(&txt)]);
    assert_fails(&o, &["--out", "w.txt", ".tsv"]);
    assert!(!txt.exists());
    // A missing input names the file.
    let missing = dir.path().join("missing.wav");
    let o = transcribe_tiny(&missing, &["--out", s(&json)]);
    assert_fails(&o, &["missing.wav"]);
    // An output that is the input or a file of the model, or two outputs on one path: the
    // inputs stay as they were.
    let wav = dir.path().join("in.wav");
    std::fs::copy(&input, &wav).unwrap();
    let before = std::fs::read(&wav).unwrap();
    let tsv = dir.path().join("in.tsv");
    std::fs::write(&tsv, b"not an output\n").unwrap();
    // (the input under a name with an output's extension: a hard link)
    let link = dir.path().join("link.json");
    std::fs::hard_link(&wav, &link).unwrap();
    let o = transcribe_tiny(&wav, &["--out", s(&link)]);
    assert_fails(&o, &["--out", "same file as the input"]);
    assert_eq!(std::fs::read(&wav).unwrap(), before);
    let config = assets().join("config.json");
    let o = transcribe_tiny(&wav, &["--tokens-out", s(&config)]);
    assert_fails(&o, &["--tokens-out", "same file as the input"]);
    // Not a WAV, and an output in a folder that does not exist.
    let o = transcribe_tiny(&tsv, &[]);
    assert_fails(&o, &["in.tsv", "not a readable WAV"]);
    let nowhere = dir.path().join("no-such-dir").join("w.json");
    let o = transcribe_tiny(&wav, &["--out", s(&nowhere)]);
    assert_fails(&o, &["--out", "no-such-dir"]);
    let o = transcribe_tiny(&input, &["--out", s(&json), "--tokens-out", s(&json)]);
    assert_fails(&o, &["--out", "--tokens-out"]);
    assert!(!json.exists());
    // No --model, offline: the default STT repo is named, and the bundled test model.
    let o = moshi(&["transcribe", s(&input), "--out", s(&json)]);
    assert_fails(&o, &["kyutai/stt-1b-en_fr", "assets/tiny-stt"]);
    // A model that is not speech to text (Moshi): refused, pointing at `file`.
    let o = moshi(&[
        "transcribe",
        s(&input),
        "--model",
        s(&common::asset_dir("tiny-a")),
        "--out",
        s(&json),
    ]);
    assert_fails(&o, &["speech-to-text", "moshi-rs file"]);
    assert!(!json.exists());
    // (`serve` serves one at /api/asr-streaming: `--test serve_asr`.) `file` refuses a
    // speech-to-text model, pointing at `transcribe`.
    let wav = dir.path().join("out.wav");
    let o = moshi(&["file", s(&input), s(&wav), "--model", s(&assets())]);
    assert_fails(&o, &["speech-to-text", "transcribe"]);
    assert!(!wav.exists());
}

/// `--mic` refusals that need no device: a file and --mic, neither, the microphone's flags
/// without --mic, a model that is not speech to text, a bad buffer, an input device that does
/// not exist; nothing is written.
#[test]
fn mic_mode_is_refused_clearly_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let input = assets().join("input.wav");
    let (json, rec) = (dir.path().join("w.json"), dir.path().join("rec.wav"));
    let model = assets();
    let outputs = ["--out", s(&json), "--record-input", s(&rec)];
    let mic = |extra: &[&str]| {
        let mut args = vec!["transcribe", "--mic", "--model", s(&model)];
        args.extend_from_slice(extra);
        moshi(&args)
    };
    let o = transcribe_tiny(&input, &["--mic", "--out", s(&json)]);
    assert_fails(&o, &["--mic", "input.wav", "one or the other"]);
    let o = moshi(&["transcribe", "--model", s(&model), "--out", s(&json)]);
    assert_fails(&o, &["input WAV", "--mic"]);
    for flags in [
        &["--duration-s", "3"][..],
        &["--input-device", "mic"],
        &["--buffer-ms", "20"],
        &["--max-backlog-frames", "5"],
        &["--record-input", s(&rec)],
    ] {
        let o = transcribe_tiny(&input, &[flags, &["--out", s(&json)]].concat());
        assert_fails(&o, &[flags[0], "is for --mic"]);
    }
    let o = moshi(&[
        "transcribe",
        "--mic",
        "--model",
        s(&common::asset_dir("tiny-a")),
        "--out",
        s(&json),
    ]);
    assert_fails(&o, &["speech-to-text", "moshi-rs chat"]);
    let o = mic(&[&["--buffer-ms", "0"][..], &outputs].concat());
    assert_fails(&o, &["--buffer-ms 0", "1..=1000"]);
    let o = mic(&["--out", s(&json), "--record-input", s(&json)]);
    assert_fails(&o, &["--record-input", "--out", "same file"]);
    // No such input device: named, before anything is written.
    let o = mic(&[&["--input-device", "no-such-device-xyz"][..], &outputs].concat());
    assert_fails(&o, &["input device", "no-such-device-xyz"]);
    assert!(moshi_test_support::names_in(dir.path()).is_empty());
}

#[test]
fn inspect_reads_the_bundled_stt_configs_and_the_fixture() {
    let root = moshi_test_support::repo_root();
    for (config, needle) in [
        ("configs/stt-1b-en_fr.json", "4 extra heads x 6"),
        (
            "configs/stt-2.6b-en.json",
            "text delay 2.5 s, silence prefix 1 s",
        ),
    ] {
        let path = root.join(config);
        let o = moshi(&["inspect", s(&path)]);
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(
            stdout.contains("dep_q 0, no depformer") && stdout.contains(needle),
            "{stdout}"
        );
    }
    // The fixtures: tiny-stt with its 4 extra heads, tiny-stt-2b6 without.
    for (fx, tensors) in [(&TINY_STT, 51), (&TINY_STT_2B6, 47)] {
        let o = moshi(&["inspect", s(&common::asset_dir(fx.name))]);
        let stdout = String::from_utf8_lossy(&o.stdout);
        let want = format!("matches (names and shapes of all {tensors} LM tensors)");
        assert!(o.status.success() && stdout.contains(&want), "{stdout}");
    }
}
