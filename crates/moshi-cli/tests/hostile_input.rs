//! Regression tests of issue #18's bad-input sweep, through the built binary: out-of-range sizes
//! in configs and flags are refused before anything is allocated, non-finite or negative
//! numbers are refused, and messages name the file, key or flag and say what is wrong (once).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use serde_json::Value;

fn assets() -> PathBuf {
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

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `args`, expects a failure within `limit` whose stderr holds every one of `parts`.
fn fails_quickly_with(args: &[&str], parts: &[&str], limit: Duration) -> String {
    let started = Instant::now();
    let o = moshi(args);
    let took = started.elapsed();
    let err = stderr(&o);
    assert!(!o.status.success(), "{args:?} succeeded: {err}");
    assert!(
        !err.contains("panicked"),
        "{args:?} panicked instead of an error: {err}"
    );
    for p in parts {
        assert!(err.contains(p), "{args:?}: `{p}` not in: {err}");
    }
    assert!(
        took < limit,
        "{args:?} took {took:?} to fail (allocating before validating?)"
    );
    err
}

fn fails_with(args: &[&str], parts: &[&str]) -> String {
    fails_quickly_with(args, parts, Duration::from_secs(60))
}

/// A change to a JSON config.
type ConfigEdit = Box<dyn FnOnce(&mut Value)>;

/// A copy of tiny-a in a temp folder with `edit` applied to `file` (a JSON config).
fn model_with(file: &str, edit: impl FnOnce(&mut Value)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(assets()).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
    }
    let path = dir.path().join(file);
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(&path, cfg.to_string()).unwrap();
    dir
}

/// tiny-a's input WAV.
static INPUT: LazyLock<PathBuf> = LazyLock::new(|| assets().join("input.wav"));

/// `moshi-rs file` on tiny-a's input with the model in `dir`.
fn file_cmd_args<'a>(dir: &'a Path, out: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["file", s(&INPUT), s(out), "--model", s(dir)];
    args.extend_from_slice(extra);
    args
}

/// Issue #18 item 1: sizes from a config are range-checked before anything is allocated; the
/// error names the file, the key, the value and the limit.
#[test]
fn oversized_config_values_are_refused_before_allocating() {
    let cases: Vec<(&str, ConfigEdit, Vec<&str>)> = vec![
        (
            "config.json",
            Box::new(|c| c["delays"][1] = 1_000_000_000u64.into()),
            vec!["`delays[1]` is 1000000000", "expected 0 to 4096"],
        ),
        (
            "config.json",
            Box::new(|c| c["dim"] = 1_000_000_000_000u64.into()),
            vec!["`dim` is 1000000000000", "expected 1 to 16384"],
        ),
        (
            "config.json",
            Box::new(|c| c["context"] = 1_000_000_000_000u64.into()),
            vec!["`context` is 1000000000000", "expected 1 to 65536"],
        ),
        (
            "mimi_config.json",
            Box::new(|c| c["transformer"]["context"] = 1_000_000_000_000u64.into()),
            vec![
                "`transformer.context` is 1000000000000",
                "expected 1 to 65536",
            ],
        ),
    ];
    for (file, edit, parts) in cases {
        let dir = model_with(file, edit);
        let out = dir.path().join("out.wav");
        let mut want = parts.clone();
        let cfg_path = dir.path().join(file);
        want.push(s(&cfg_path));
        fails_quickly_with(
            &file_cmd_args(dir.path(), &out, &[]),
            &want,
            Duration::from_secs(30),
        );
        assert!(!out.exists(), "{file}: an output was written");
    }
}

/// Issue #18 item 1: flags that size an allocation or a thread count are range-checked.
#[test]
fn oversized_bench_flags_are_refused() {
    let dir = model_with("config.json", |c| {
        c["context"] = 1_000_000_000_000u64.into()
    });
    let cfg = dir.path().join("config.json");
    fails_with(
        &[
            "bench",
            "--random-weights",
            "--config",
            s(&cfg),
            "--kv-prefill",
            "100000000",
        ],
        &["`context` is 1000000000000", "expected 1 to 65536"],
    );
    let tiny_cfg = assets().join("config.json");
    fails_with(
        &[
            "bench",
            "--random-weights",
            "--config",
            s(&tiny_cfg),
            "--kv-prefill",
            "100000000",
        ],
        &["--kv-prefill 100000000", "context of 16"],
    );
    fails_with(
        &[
            "bench",
            "--random-weights",
            "--bandwidth-buffer-mib",
            "100000000",
        ],
        &["--bandwidth-buffer-mib", "100000000", "expected 1 to 65536"],
    );
    fails_with(
        &["bench", "--random-weights", "--threads", "10000"],
        &["--threads", "10000", "logical CPUs"],
    );
    fails_with(
        &["bench", "--random-weights", "--frames", "0"],
        &["--frames", "expected 1 to"],
    );
}

/// Issue #18 item 3: non-finite or negative durations and temperatures are refused.
#[test]
fn non_finite_and_negative_numbers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.wav");
    for (flag, value) in [
        ("--temp", "-1"),
        ("--temp", "NaN"),
        ("--temp-text", "nan"),
        ("--temp-text", "inf"),
    ] {
        fails_with(
            &file_cmd_args(&assets(), &out, &[flag, value]),
            &[flag, value, "finite number >= 0"],
        );
        assert!(!out.exists());
    }
    for value in ["NaN", "-1", "0", "inf"] {
        fails_quickly_with(
            &["chat", "--model", s(&assets()), "--duration-s", value],
            &["--duration-s", value, "seconds above 0"],
            Duration::from_secs(30),
        );
    }
    fails_with(
        &["chat", "--model", s(&assets()), "--jitter-ms", "NaN"],
        &["--jitter-ms", "NaN", "milliseconds from 0"],
    );
}

/// Issue #18 item 10: zeros that used to surface as confusing errors far from their cause are
/// refused at load, naming the key.
#[test]
fn degenerate_config_values_name_their_key() {
    let cases: Vec<(&str, ConfigEdit, Vec<&str>)> = vec![
        (
            "config.json",
            Box::new(|c| c["max_period"] = 0.into()),
            vec!["`max_period` is 0", "a finite number from 1"],
        ),
        (
            "config.json",
            Box::new(|c| c["dim"] = 0.into()),
            vec!["`dim` is 0", "expected 1 to 16384"],
        ),
        (
            "mimi_config.json",
            Box::new(|c| c["frame_rate"] = 0.into()),
            vec!["`frame_rate` is 0", "a finite number from 0.01"],
        ),
        (
            "config.json",
            Box::new(|c| c["gating"] = "gelu".into()),
            vec!["config key `gating`", "unknown variant `gelu`", "`silu`"],
        ),
        (
            "mimi_config.json",
            Box::new(|c| c["seanet"]["ratios"][2] = "five".into()),
            vec!["config key `seanet.ratios[2]`", "invalid type"],
        ),
    ];
    for (file, edit, parts) in cases {
        let dir = model_with(file, edit);
        let out = dir.path().join("out.wav");
        let err = fails_with(&file_cmd_args(dir.path(), &out, &[]), &parts);
        assert!(err.contains(s(&dir.path().join(file))), "{err}");
    }
}

/// Issue #18 item 10: a path that cannot be read says why (not "no such file" for everything).
#[test]
fn unreadable_model_paths_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.wav");
    let a = dir.path().join("loop-a");
    let b = dir.path().join("loop-b");
    std::os::unix::fs::symlink(&b, &a).unwrap();
    std::os::unix::fs::symlink(&a, &b).unwrap();
    let err = fails_with(
        &file_cmd_args(&assets(), &out, &["--weights", s(&a)]),
        &["--weights", s(&a), "ymbolic links"],
    );
    assert!(!err.contains("no such file"), "{err}");

    let err = fails_with(
        &file_cmd_args(&assets(), &out, &["--config", "/dev/zero"]),
        &["/dev/zero", "too large for a JSON config"],
    );
    assert!(!err.contains("no such file"), "{err}");

    fails_with(
        &file_cmd_args(&assets(), &out, &["--weights", "/dev/zero"]),
        &[
            "--weights",
            "/dev/zero",
            "a character device, expected a regular file",
        ],
    );
    let missing = dir.path().join("missing.safetensors");
    fails_with(
        &file_cmd_args(&assets(), &out, &["--weights", s(&missing)]),
        &["--weights", s(&missing), "no such file"],
    );
}

/// Issue #18 item 10: an I/O error's cause is printed once, not repeated by the error chain.
#[test]
fn causes_are_not_repeated() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.wav");
    let not_wav = dir.path().join("in.wav");
    std::fs::write(&not_wav, b"RIFF but not really a wave file at all").unwrap();
    let err = fails_with(
        &["file", s(&not_wav), s(&out), "--model", s(&assets())],
        &["in.wav", "not a readable WAV"],
    );
    let line = err.lines().find(|l| l.starts_with("error:")).unwrap();
    let cause = line.rsplit(": ").next().unwrap();
    assert_eq!(line.matches(cause).count(), 1, "cause repeated: {line}");
}

/// Issue #18 item 11: an unparsable `--log` filter is an error, not silently ignored.
#[test]
fn unparsable_log_filter_is_an_error() {
    fails_with(
        &["--log", "moshi_model=loud", "inspect", s(&assets())],
        &["--log", "moshi_model=loud", "not a log filter"],
    );
}
