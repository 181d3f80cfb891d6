//! Regression tests of issue #18's bad-input sweep, through the built binary: out-of-range sizes
//! in configs and flags are refused before anything is allocated, non-finite or negative
//! numbers are refused, and messages name the file, key or flag and say what is wrong (once).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use moshi_test_support::{path_str, run_binary, stderr_text, tiny_a, tiny_a_dir};
use serde_json::Value;

fn moshi(args: &[&str]) -> Output {
    run_binary(env!("CARGO_BIN_EXE_moshi-rs"), args)
}

/// Runs `args`, expects a failure within `limit` whose stderr holds every one of `parts`.
fn fails_quickly_with(args: &[&str], parts: &[&str], limit: Duration) -> String {
    let started = Instant::now();
    let o = moshi(args);
    let took = started.elapsed();
    let err = stderr_text(&o);
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
    for entry in std::fs::read_dir(tiny_a_dir()).unwrap() {
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
static INPUT: LazyLock<PathBuf> = LazyLock::new(|| tiny_a("input.wav"));

/// `moshi-rs file` on tiny-a's input with the model in `dir`.
fn file_cmd_args<'a>(dir: &'a Path, out: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "file",
        path_str(&INPUT),
        path_str(out),
        "--model",
        path_str(dir),
    ];
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
        want.push(path_str(&cfg_path));
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
            path_str(&cfg),
            "--kv-prefill",
            "100000000",
        ],
        &["`context` is 1000000000000", "expected 1 to 65536"],
    );
    let tiny_cfg = tiny_a("config.json");
    fails_with(
        &[
            "bench",
            "--random-weights",
            "--config",
            path_str(&tiny_cfg),
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
            &file_cmd_args(&tiny_a_dir(), &out, &[flag, value]),
            &[flag, value, "finite number >= 0"],
        );
        assert!(!out.exists());
    }
    for value in ["NaN", "-1", "0", "inf"] {
        fails_quickly_with(
            &[
                "chat",
                "--model",
                path_str(&tiny_a_dir()),
                "--duration-s",
                value,
            ],
            &["--duration-s", value, "seconds above 0"],
            Duration::from_secs(30),
        );
    }
    fails_with(
        &[
            "chat",
            "--model",
            path_str(&tiny_a_dir()),
            "--jitter-ms",
            "NaN",
        ],
        &["--jitter-ms", "NaN", "milliseconds from 0"],
    );
    // The sweep's find (issue #41): a negative value of a flag without allow_negative_numbers
    // was "unexpected argument '-3'", with a tip (`-- -3`) that does not work for a flag.
    for (flag, value, says) in [
        ("--cfg-coef", "-3", "--cfg-coef"),
        ("--max-tail-s", "-1", "--max-tail-s"),
        ("--top-k", "-5", "--top-k"),
    ] {
        let err = fails_with(
            &file_cmd_args(&tiny_a_dir(), &out, &[flag, value]),
            &[says, value],
        );
        assert!(
            !err.contains("unexpected argument"),
            "{flag} {value}: {err}"
        );
    }
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
        assert!(err.contains(path_str(&dir.path().join(file))), "{err}");
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
        &file_cmd_args(&tiny_a_dir(), &out, &["--weights", path_str(&a)]),
        &["--weights", path_str(&a), "ymbolic links"],
    );
    assert!(!err.contains("no such file"), "{err}");

    let err = fails_with(
        &file_cmd_args(&tiny_a_dir(), &out, &["--config", "/dev/zero"]),
        &["/dev/zero", "too large for a JSON config"],
    );
    assert!(!err.contains("no such file"), "{err}");

    fails_with(
        &file_cmd_args(&tiny_a_dir(), &out, &["--weights", "/dev/zero"]),
        &[
            "--weights",
            "/dev/zero",
            "a character device, expected a regular file",
        ],
    );
    let missing = dir.path().join("missing.safetensors");
    fails_with(
        &file_cmd_args(&tiny_a_dir(), &out, &["--weights", path_str(&missing)]),
        &["--weights", path_str(&missing), "no such file"],
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
        &[
            "file",
            path_str(&not_wav),
            path_str(&out),
            "--model",
            path_str(&tiny_a_dir()),
        ],
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
        &[
            "--log",
            "moshi_model=loud",
            "inspect",
            path_str(&tiny_a_dir()),
        ],
        &["--log", "moshi_model=loud", "not a log filter"],
    );
}

/// Runs `moshi-rs ARGS` through bash with `prelude` first (e.g. `ulimit -f 1`), SIGXFSZ
/// ignored so that a write over the file-size limit fails with EFBIG as on a full disk.
fn moshi_limited(prelude: &str, args: &[&str]) -> Output {
    Command::new("bash")
        .arg("-c")
        .arg(format!("trap '' XFSZ; {prelude}; exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_moshi-rs"))
        .args(args)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap()
}

/// Names in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// tiny-a's input copied into `dir` as `in.wav`.
fn input_copy(dir: &Path) -> PathBuf {
    let p = dir.join("in.wav");
    std::fs::copy(&*INPUT, &p).unwrap();
    p
}

/// Codes of tiny-a's input (`codec encode`) in `dir/codes.npy`.
fn codes_of_input(dir: &Path) -> PathBuf {
    let codes = dir.join("codes.npy");
    let o = moshi(&[
        "codec",
        "encode",
        path_str(&INPUT),
        path_str(&codes),
        "--model",
        path_str(&tiny_a_dir()),
    ]);
    assert!(o.status.success(), "{}", stderr_text(&o));
    codes
}

/// Issue #18 item 2: a trace written to a full device is an error (no panic, no "written").
#[test]
fn trace_to_a_full_device_is_an_error() {
    let cfg = tiny_a_dir().join("config.json");
    let err = fails_with(
        &[
            "bench",
            "--random-weights",
            "--config",
            path_str(&cfg),
            "--frames",
            "2",
            "--warmup",
            "0",
            "--threads",
            "1",
            "--bandwidth-buffer-mib",
            "8",
            "--trace",
            "/dev/full",
        ],
        &["--trace", "/dev/full", "No space left on device"],
    );
    assert!(!err.contains("trace written"), "{err}");
}

/// Issue #18 item 4: an output that is one of the inputs is refused, the input untouched.
#[test]
fn an_input_is_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let input = input_copy(dir.path());
    let before = std::fs::read(&input).unwrap();
    let same_spelled_differently = dir.path().join(".").join("in.wav");
    let hard_link = dir.path().join("link.wav");
    std::fs::hard_link(&input, &hard_link).unwrap();
    for out in [&input, &same_spelled_differently, &hard_link] {
        fails_with(
            &[
                "file",
                path_str(&input),
                path_str(out),
                "--model",
                path_str(&tiny_a_dir()),
            ],
            &["same file as the input"],
        );
        fails_with(
            &[
                "codec",
                "encode",
                path_str(&input),
                path_str(out),
                "--model",
                path_str(&tiny_a_dir()),
            ],
            &["same file as the input"],
        );
    }
    let answer = dir.path().join("o.wav");
    fails_with(
        &[
            "file",
            path_str(&input),
            path_str(&answer),
            "--model",
            path_str(&tiny_a_dir()),
            "--transcript",
            path_str(&input),
        ],
        &["--transcript", "same file as the input"],
    );
    assert!(!answer.exists());
    assert_eq!(std::fs::read(&input).unwrap(), before);

    let codes = codes_of_input(dir.path());
    let codes_before = std::fs::read(&codes).unwrap();
    fails_with(
        &[
            "codec",
            "decode",
            path_str(&codes),
            path_str(&codes),
            "--model",
            path_str(&tiny_a_dir()),
        ],
        &["same file as the input"],
    );
    assert_eq!(std::fs::read(&codes).unwrap(), codes_before);

    let weights = dir.path().join("model.safetensors");
    std::fs::copy(tiny_a_dir().join("model.safetensors"), &weights).unwrap();
    let weights_before = std::fs::read(&weights).unwrap();
    fails_with(
        &[
            "quantize",
            path_str(&weights),
            path_str(&weights),
            "--bits",
            "8",
        ],
        &["same file as the input"],
    );
    assert_eq!(std::fs::read(&weights).unwrap(), weights_before);
}

/// No output overwrites a file of the model a command reads (weights, tokenizer, configs), also
/// when the command found that file itself (config.json next to the input, the model folder's
/// files); the file stays untouched.
#[test]
fn model_files_are_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    moshi_test_support::copy_tiny_a_files(
        &model,
        &[
            "config.json",
            "model.safetensors",
            "mimi.safetensors",
            "mimi_config.json",
            "tokenizer.model",
        ],
    );
    let input = input_copy(dir.path());
    let snapshot = |name: &str| std::fs::read(model.join(name)).unwrap();
    for name in [
        "config.json",
        "model.safetensors",
        "mimi.safetensors",
        "mimi_config.json",
        "tokenizer.model",
    ] {
        let before = snapshot(name);
        let target = model.join(name);
        for flag in [None, Some("--transcript"), Some("--tokens-out")] {
            let answer = dir.path().join("o.wav");
            let mut args = vec!["file", path_str(&input)];
            match flag {
                None => args.push(path_str(&target)),
                Some(f) => args.extend([path_str(&answer), f, path_str(&target)]),
            }
            args.extend(["--model", path_str(&model)]);
            fails_with(&args, &["same file as the input", name]);
            assert!(!answer.exists());
        }
        assert_eq!(snapshot(name), before, "{name} was changed");
    }
    for name in ["mimi.safetensors", "mimi_config.json"] {
        let before = snapshot(name);
        fails_with(
            &[
                "codec",
                "encode",
                path_str(&input),
                path_str(&model.join(name)),
                "--model",
                path_str(&model),
            ],
            &["same file as the input", name],
        );
        assert_eq!(snapshot(name), before, "{name} was changed");
    }
    let before = snapshot("config.json");
    fails_with(
        &[
            "quantize",
            path_str(&model.join("model.safetensors")),
            path_str(&model.join("config.json")),
            "--bits",
            "8",
        ],
        &["same file as the input", "config.json"],
    );
    assert_eq!(snapshot("config.json"), before);
}

/// The output, --transcript, --tokens-out and --profile must be different files: naming one
/// file twice is refused before any work, and nothing is written.
#[test]
fn file_outputs_must_be_distinct() {
    let dir = tempfile::tempdir().unwrap();
    let answer = dir.path().join("o.wav");
    let same_answer = dir.path().join(".").join("o.wav");
    let tokens = dir.path().join("t.jsonl");
    let model = tiny_a_dir();
    for extra in [
        vec!["--transcript", path_str(&same_answer)],
        vec![
            "--tokens-out",
            path_str(&tokens),
            "--profile",
            path_str(&tokens),
        ],
    ] {
        let mut args = vec![
            "file",
            path_str(&INPUT),
            path_str(&answer),
            "--model",
            path_str(&model),
        ];
        args.extend(extra);
        fails_with(
            &args,
            &["are the same file", "each output needs its own file"],
        );
        assert!(!answer.exists() && !tokens.exists());
    }
}

/// A private character device with the numbers of `/dev/null` (1, 3) or `/dev/full` (1, 7) in
/// `dir`, or `None` (with a message) where this process may not make or open one.
fn device_node(dir: &Path, name: &str, minor: u32) -> Option<PathBuf> {
    let path = dir.join(name);
    let made = Command::new("mknod")
        .arg(&path)
        .args(["c", "1", &minor.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    if !made || std::fs::OpenOptions::new().write(true).open(&path).is_err() {
        eprintln!(
            "skipped: cannot make or open a device node in {} (not root, or no mknod)",
            dir.display()
        );
        return None;
    }
    Some(path)
}

fn assert_still_device(path: &Path, minor: u32) {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let m = std::fs::symlink_metadata(path).unwrap();
    assert!(
        m.file_type().is_char_device(),
        "{} was replaced",
        path.display()
    );
    assert_eq!(m.rdev(), (1 << 8) | minor as u64, "{}", path.display());
}

/// Issue #18 item 5: a device given as the output is written in place (never replaced by a
/// regular file), and its write errors are reported.
#[test]
fn devices_as_outputs_stay_devices_and_report_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (Some(null), Some(full)) = (
        device_node(dir.path(), "null.wav", 3),
        device_node(dir.path(), "full.wav", 7),
    ) else {
        return;
    };
    let codes = codes_of_input(dir.path());
    let ok = |args: &[&str]| {
        let o = moshi(args);
        assert!(o.status.success(), "{args:?}: {}", stderr_text(&o));
    };
    ok(&file_cmd_args(&tiny_a_dir(), &null, &[]));
    ok(&[
        "codec",
        "encode",
        path_str(&INPUT),
        path_str(&null),
        "--model",
        path_str(&tiny_a_dir()),
    ]);
    ok(&[
        "codec",
        "decode",
        path_str(&codes),
        path_str(&null),
        "--model",
        path_str(&tiny_a_dir()),
    ]);
    let weights = tiny_a_dir().join("model.safetensors");
    ok(&[
        "quantize",
        path_str(&weights),
        path_str(&null),
        "--bits",
        "8",
    ]);
    assert_still_device(&null, 3);

    let no_space = "No space left on device";
    fails_with(
        &file_cmd_args(&tiny_a_dir(), &full, &[]),
        &[path_str(&full), no_space],
    );
    fails_with(
        &[
            "codec",
            "encode",
            path_str(&INPUT),
            path_str(&full),
            "--model",
            path_str(&tiny_a_dir()),
        ],
        &[path_str(&full), no_space],
    );
    fails_with(
        &[
            "codec",
            "decode",
            path_str(&codes),
            path_str(&full),
            "--model",
            path_str(&tiny_a_dir()),
        ],
        &[path_str(&full), no_space],
    );
    fails_with(
        &[
            "quantize",
            path_str(&weights),
            path_str(&full),
            "--bits",
            "8",
        ],
        &[path_str(&full), no_space],
    );
    assert_still_device(&full, 7);
}

/// Issue #18 item 6: when the disk fills (simulated with a file-size limit: writes past it
/// fail with EFBIG as they would with ENOSPC), every output is either complete or absent: no
/// partial or temporary file is left.
#[test]
fn a_full_disk_leaves_no_partial_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let codes = codes_of_input(dir.path());
    let out = tempfile::tempdir().unwrap();
    let o = |name: &str| out.path().join(name);
    let cases: Vec<(&str, Vec<String>)> = vec![
        (
            "ulimit -f 64",
            vec![
                "file".into(),
                path_str(&INPUT).into(),
                path_str(&o("answer.wav")).into(),
                "--model".into(),
                path_str(&tiny_a_dir()).into(),
                "--tokens-out".into(),
                path_str(&o("tokens.jsonl")).into(),
                "--transcript".into(),
                path_str(&o("words.tsv")).into(),
                "--profile".into(),
                path_str(&o("profile.jsonl")).into(),
            ],
        ),
        (
            "ulimit -f 1",
            vec![
                "codec".into(),
                "encode".into(),
                path_str(&INPUT).into(),
                path_str(&o("codes.npy")).into(),
                "--model".into(),
                path_str(&tiny_a_dir()).into(),
            ],
        ),
        (
            "ulimit -f 64",
            vec![
                "codec".into(),
                "decode".into(),
                path_str(&codes).into(),
                path_str(&o("decoded.wav")).into(),
                "--model".into(),
                path_str(&tiny_a_dir()).into(),
            ],
        ),
        (
            "ulimit -f 1",
            vec![
                "bench".into(),
                "--random-weights".into(),
                "--config".into(),
                path_str(&tiny_a_dir().join("config.json")).into(),
                "--frames".into(),
                "2".into(),
                "--warmup".into(),
                "0".into(),
                "--threads".into(),
                "1".into(),
                "--bandwidth-buffer-mib".into(),
                "8".into(),
                "--json".into(),
                path_str(&o("report.json")).into(),
            ],
        ),
    ];
    for (limit, args) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = moshi_limited(limit, &args);
        let err = stderr_text(&run);
        assert!(
            !run.status.success(),
            "{args:?} succeeded over `{limit}`: {err}"
        );
        assert!(err.contains("File too large"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(
            names_in(out.path()),
            Vec::<String>::new(),
            "{args:?}: {err}"
        );
    }
}

/// Peak resident memory (`VmHWM`) of a child process, polled until it exits, in bytes.
fn peak_rss_of(mut cmd: Command) -> (std::process::ExitStatus, u64, String) {
    let mut child = cmd
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let status_path = format!("/proc/{}/status", child.id());
    let mut peak = 0u64;
    let status = loop {
        if let Ok(text) = std::fs::read_to_string(&status_path) {
            if let Some(kb) = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
            {
                peak = peak.max(kb * 1024);
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut err = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status, peak, err)
}

/// A 24 kHz mono 16-bit WAV of `seconds` of speech-like noise.
fn long_wav(path: &Path, seconds: usize) {
    let mut x = 0x1234_5678u32;
    common::write_wav_24k(
        path,
        (0..seconds * 24_000).map(|i| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let envelope = ((i as f32 / 24_000.0) * 1.7).sin().abs();
            ((x as i32 >> 20) as f32 * envelope) as i16
        }),
    );
}

/// Issue #18 item 7: memory does not grow with the input's length: `file` and `codec encode`
/// of a 6-minute input peak within 5 % (+ 2 MiB of allocator slack) of a 1-minute one.
/// Issue #41 item 5: for a translation model too (tiny-hibiki kept the input and the
/// translation in memory: 35 MB for 1 minute, 106 MB for 6), its transcript included.
#[test]
fn memory_is_flat_in_the_input_length() {
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short.wav");
    let long = dir.path().join("long.wav");
    long_wav(&short, 60);
    long_wav(&long, 360);
    let peak = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_moshi-rs"));
        cmd.args(args).env("HF_HUB_OFFLINE", "1");
        let (status, peak, err) = peak_rss_of(cmd);
        assert!(status.success(), "{args:?}: {err}");
        peak
    };
    let out = dir.path().join("out.wav");
    let codes = dir.path().join("codes.npy");
    let transcript = dir.path().join("words.tsv");
    let hibiki = moshi_test_support::fixture_dir("tiny-hibiki");
    for (what, short_args, long_args) in [
        (
            "file",
            vec![
                "file",
                path_str(&short),
                path_str(&out),
                "--model",
                path_str(&tiny_a_dir()),
            ],
            vec![
                "file",
                path_str(&long),
                path_str(&out),
                "--model",
                path_str(&tiny_a_dir()),
            ],
        ),
        (
            "file (translation, tiny-hibiki)",
            vec![
                "file",
                path_str(&short),
                path_str(&out),
                "--model",
                path_str(&hibiki),
                "--max-tail-s",
                "1",
                "--transcript",
                path_str(&transcript),
            ],
            vec![
                "file",
                path_str(&long),
                path_str(&out),
                "--model",
                path_str(&hibiki),
                "--max-tail-s",
                "1",
                "--transcript",
                path_str(&transcript),
            ],
        ),
        (
            "codec encode",
            vec![
                "codec",
                "encode",
                path_str(&short),
                path_str(&codes),
                "--model",
                path_str(&tiny_a_dir()),
            ],
            vec![
                "codec",
                "encode",
                path_str(&long),
                path_str(&codes),
                "--model",
                path_str(&tiny_a_dir()),
            ],
        ),
    ] {
        let (p_short, p_long) = (peak(&short_args), peak(&long_args));
        eprintln!(
            "{what}: peak resident memory {:.1} MiB for 1 minute, {:.1} MiB for 6 minutes",
            p_short as f64 / (1 << 20) as f64,
            p_long as f64 / (1 << 20) as f64
        );
        assert!(
            p_long as f64 <= p_short as f64 * 1.05 + (2 << 20) as f64,
            "{what}: {p_long} bytes for 6 minutes vs {p_short} for 1 minute"
        );
    }
}

/// Issue #18 item 8: a code file's header is checked before its data is read: a device or a
/// header claiming more than the file holds fails at once.
#[test]
fn code_file_headers_are_capped() {
    let dir = tempfile::tempdir().unwrap();
    let decoded = dir.path().join("decoded.wav");
    fails_quickly_with(
        &[
            "codec",
            "decode",
            "/dev/zero",
            path_str(&decoded),
            "--model",
            path_str(&tiny_a_dir()),
        ],
        &["/dev/zero", "magic"],
        Duration::from_secs(10),
    );
    let out = dir.path().join("out.wav");
    for (frames, message) in [
        (10_000_000u64, "need 640000000 bytes, have 64".to_string()),
        (
            100_000_000,
            "more than the 4 GiB this reader accepts".to_string(),
        ),
    ] {
        let liar = dir.path().join("liar.npy");
        let header =
            format!("{{'descr': '<i8', 'fortran_order': False, 'shape': (8, {frames}), }}");
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(&[0u8; 64]);
        std::fs::write(&liar, &bytes).unwrap();
        fails_quickly_with(
            &[
                "codec",
                "decode",
                path_str(&liar),
                path_str(&out),
                "--model",
                path_str(&tiny_a_dir()),
            ],
            &["liar.npy", &message],
            Duration::from_secs(10),
        );
        assert!(!out.exists());
    }
}

/// Issue #18 item 9: low-rate WAVs are refused with the supported range (they used to become
/// over a thousand seconds of output). At the lowest rate accepted, a 100-sample (12.5 ms) file
/// gives one 80 ms frame: the resampler's zero-padded last chunk adds at most 1024 input
/// samples (128 ms at 8 kHz), never minutes.
#[test]
fn low_rate_wavs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, rate: u32, samples: usize| {
        let path = dir.path().join(name);
        let spec = hound::WavSpec {
            channels: 1,
            sample_rate: rate,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        };
        let mut w = hound::WavWriter::create(&path, spec).unwrap();
        for i in 0..samples {
            w.write_sample((i as i16).wrapping_mul(97)).unwrap();
        }
        w.finalize().unwrap();
        path
    };
    let out = dir.path().join("out.wav");
    for samples in [100, 10] {
        let one_hz = write("one_hz.wav", 1, samples);
        fails_with(
            &[
                "file",
                path_str(&one_hz),
                path_str(&out),
                "--model",
                path_str(&tiny_a_dir()),
            ],
            &["one_hz.wav", "sample rate 1 Hz", "8000 to 384000 Hz"],
        );
        fails_with(
            &[
                "codec",
                "encode",
                path_str(&one_hz),
                path_str(&out),
                "--model",
                path_str(&tiny_a_dir()),
            ],
            &["one_hz.wav", "sample rate 1 Hz"],
        );
    }
    assert!(!out.exists());
    let short = write("short.wav", 8_000, 100);
    let o = moshi(&[
        "file",
        path_str(&short),
        path_str(&out),
        "--model",
        path_str(&tiny_a_dir()),
    ]);
    assert!(o.status.success(), "{}", stderr_text(&o));
    assert_eq!(hound::WavReader::open(&out).unwrap().duration(), 1920);
}

/// Issue #18 item 11: outputs get the mode `File::create` gives under the umask (quantize used
/// to write 0600 whatever the umask).
#[test]
fn outputs_follow_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let weights = tiny_a_dir().join("model.safetensors");
    for (umask, mode) in [("022", 0o644), ("027", 0o640), ("002", 0o664)] {
        let out = dir.path().join(format!("q8-{umask}.safetensors"));
        let run = moshi_limited(
            &format!("umask {umask}"),
            &[
                "quantize",
                path_str(&weights),
                path_str(&out),
                "--bits",
                "8",
            ],
        );
        assert!(run.status.success(), "{}", stderr_text(&run));
        let got = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
        assert_eq!(got, mode, "umask {umask}: mode {got:o}");
    }
}
