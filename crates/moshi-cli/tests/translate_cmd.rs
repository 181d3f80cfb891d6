//! `moshi-rs file` with a Hibiki model (assets/tiny-hibiki) through the built binary: the
//! official greedy tokens with guidance 3 (ref/hibiki_greedy.json: 51 returned frames) and
//! audio (ref/output.wav) on the issue's command line, the tail cap, and clear errors for
//! guidance or tail options a model cannot take.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn hibiki() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../assets/tiny-hibiki")
}

fn tiny_a() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../assets/tiny-a")
}

fn moshi(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moshi-rs"))
        .args(args)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn read_i16(path: &Path) -> Vec<i16> {
    let mut r = hound::WavReader::open(path).unwrap();
    assert_eq!(r.spec().sample_rate, 24_000);
    assert_eq!(r.spec().channels, 1);
    r.samples::<i16>().map(|x| x.unwrap()).collect()
}

fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn issue_command_reproduces_the_official_guided_translation() {
    let dir = tempfile::tempdir().unwrap();
    let (out, tokens, profile) = (
        dir.path().join("out.wav"),
        dir.path().join("t.jsonl"),
        dir.path().join("p.jsonl"),
    );
    let o = moshi(&[
        "file",
        s(&hibiki().join("input.wav")),
        s(&out),
        "--model",
        s(&hibiki()),
        "--greedy",
        "--cfg-coef",
        "3",
        "--tokens-out",
        s(&tokens),
        "--profile",
        s(&profile),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "moshi-rs file failed: {stderr}");
    let reference: Value = serde_json::from_str(
        &std::fs::read_to_string(hibiki().join("ref/hibiki_greedy.json")).unwrap(),
    )
    .unwrap();
    let want_text = reference["out_text_tokens"].as_array().unwrap();
    let want_audio = reference["out_audio_tokens"].as_array().unwrap();
    let lines = jsonl(&tokens);
    assert_eq!(lines.len(), 51, "returned frames");
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["frame"], i);
        assert_eq!(line["text"], want_text[i], "text token of frame {i}");
        assert_eq!(line["audio"], want_audio[i], "audio tokens of frame {i}");
    }
    let ours = read_i16(&out);
    let theirs = read_i16(&hibiki().join("ref/output.wav"));
    assert_eq!(ours.len(), theirs.len());
    let max_lsb = ours
        .iter()
        .zip(&theirs)
        .map(|(a, b)| (*a as i32 - *b as i32).abs())
        .max()
        .unwrap();
    assert!(
        max_lsb <= 2,
        "out.wav differs from the reference by {max_lsb} LSB"
    );
    eprintln!("out.wav: max {max_lsb} LSB from ref/output.wav");
    // Random weights never end their text: the default cap (0.5 s: 6 frames) ends the run, and
    // the user is told the translation may be cut short.
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
    let o = moshi(&[
        "file",
        s(&hibiki().join("input.wav")),
        s(&out),
        "--model",
        s(&hibiki()),
        "--greedy",
        "--cfg-coef",
        "3",
        "--max-tail-s",
        "0.16",
        "--tokens-out",
        s(&tokens),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(jsonl(&tokens).len(), 44 + 1 + 2);
    assert_eq!(read_i16(&out).len(), 47 * 1920);
}

#[test]
fn guidance_and_tail_options_are_refused_where_they_cannot_apply() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.wav");
    let input = tiny_a().join("input.wav");
    let run = |model: &Path, extra: &[&str]| {
        let mut args = vec!["file", s(&input), s(&out), "--model", s(model), "--greedy"];
        args.extend_from_slice(extra);
        let o = moshi(&args);
        assert!(!o.status.success(), "{extra:?} was accepted");
        assert!(!out.exists(), "{extra:?}: output written");
        String::from_utf8_lossy(&o.stderr).to_string()
    };
    let e = run(&tiny_a(), &["--cfg-coef", "3"]);
    assert!(
        e.contains("--cfg-coef 3") && e.contains("no conditioners"),
        "{e}"
    );
    let e = run(&tiny_a(), &["--max-tail-s", "2"]);
    assert!(
        e.contains("--max-tail-s") && e.contains("translation models"),
        "{e}"
    );
    for bad in ["--cfg-coef=0", "--cfg-coef=-2", "--cfg-coef=nan"] {
        let e = run(&hibiki(), &[bad]);
        assert!(
            e.contains("--cfg-coef") && e.contains("positive"),
            "{bad}: {e}"
        );
    }
    let e = run(&hibiki(), &["--max-tail-s=-1"]);
    assert!(e.contains("--max-tail-s"), "{e}");
}
