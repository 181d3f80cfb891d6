//! Issue #41, the class "outputs", through the built binary: every output of every command is
//! checked against every input of the run and every other output; a run that fails or is
//! interrupted changes no output and leaves nothing behind; stdout may be closed, full or a pipe.

mod common;

use std::path::Path;
use std::process::Output;

use moshi_test_support::{
    copy_tiny_a_files, path_str, run_binary, stderr_text, tiny_a, tiny_a_dir,
};

fn moshi(args: &[&str]) -> Output {
    run_binary(env!("CARGO_BIN_EXE_moshi-rs"), args)
}

/// Runs `args`, expects a clean failure (no panic) whose stderr holds every one of `parts`.
fn fails_with(args: &[&str], parts: &[&str]) -> String {
    let o = moshi(args);
    let err = stderr_text(&o);
    assert!(!o.status.success(), "{args:?} succeeded: {err}");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    for p in parts {
        assert!(err.contains(p), "{args:?}: `{p}` not in: {err}");
    }
    err
}

/// A copy of tiny-a's model files in a temp folder (outputs may then be aimed at them).
fn model_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_tiny_a_files(
        dir.path(),
        &[
            "config.json",
            "mimi_config.json",
            "model.safetensors",
            "model.q8.safetensors",
            "model.q4.safetensors",
            "mimi.safetensors",
            "tokenizer.model",
        ],
    );
    dir
}

/// Every file in `dir` with its content.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let bytes = if e.file_type().unwrap().is_file() {
                std::fs::read(e.path()).unwrap()
            } else {
                Vec::new()
            };
            (name, bytes)
        })
        .collect();
    v.sort();
    v
}

/// Issue #41 item 1: `bench --json`/`--trace` never replace a file the run reads (the
/// checkpoint, its configs, `--config`) and never name the same file twice; `chat`'s outputs
/// likewise (checked before any audio device is opened).
#[test]
fn bench_and_chat_outputs_never_replace_an_input_or_each_other() {
    let model = model_copy();
    let m = model.path();
    let dir_s = path_str(m);
    let before = snapshot(m);
    let file = |name: &str| m.join(name).to_string_lossy().into_owned();
    let bench = |extra: &[&str], parts: &[&str]| {
        let mut args = vec!["bench", "--frames", "2", "--warmup", "0"];
        args.extend_from_slice(extra);
        fails_with(&args, parts);
    };
    for name in [
        "model.safetensors",
        "config.json",
        "mimi_config.json",
        "mimi.safetensors",
        "tokenizer.model",
    ] {
        let out = file(name);
        bench(
            &["--model", dir_s, "--json", &out],
            &["--json", "same file as the input", name],
        );
        bench(
            &["--model", dir_s, "--trace", &out],
            &["--trace", "same file as the input", name],
        );
    }
    // The format picked by --quant is read; so is an explicit --config.
    bench(
        &[
            "--model",
            dir_s,
            "--quant",
            "q8",
            "--json",
            &file("model.q8.safetensors"),
        ],
        &["same file as the input", "model.q8.safetensors"],
    );
    let config = file("config.json");
    bench(
        &["--model", dir_s, "--config", &config, "--trace", &config],
        &["--trace", "same file as the input"],
    );
    bench(
        &["--random-weights", "--config", &config, "--json", &config],
        &["--json", "same file as the input"],
    );
    bench(
        &[
            "--random-weights",
            "--config",
            &config,
            "--json",
            &file("mimi_config.json"),
        ],
        &["--json", "same file as the input", "mimi_config.json"],
    );
    let out = tempfile::tempdir().unwrap();
    let report = out.path().join("r.json");
    let report_s = path_str(&report);
    bench(
        &["--random-weights", "--json", report_s, "--trace", report_s],
        &["--trace", "--json", "same file"],
    );
    assert!(!report.exists());

    // chat: before the model loads for two flags on one file, after resolving it for the model's.
    let chat = |extra: &[&str], parts: &[&str]| {
        let mut args = vec!["chat", "--model", dir_s, "--duration-s", "0.1"];
        args.extend_from_slice(extra);
        fails_with(&args, parts);
    };
    chat(
        &["--record", &file("model.safetensors")],
        &["--record", "same file as the input"],
    );
    chat(
        &["--stats-json", &config],
        &["--stats-json", "same file as the input"],
    );
    chat(
        &["--record", report_s, "--profile", report_s],
        &["--profile", "--record", "same file"],
    );
    chat(
        &["--record-raw-mic", &file("model.safetensors")],
        &["--record-raw-mic", "same file as the input"],
    );
    chat(
        &["--record", report_s, "--record-raw-mic", report_s],
        &["--record-raw-mic", "--record", "same file"],
    );
    assert!(!report.exists());
    assert_eq!(snapshot(m), before, "an input of the run was changed");
}

/// Copies `from` into `to`, folders included.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// The sweep's find (issue #41): `speak` checked its outputs against the LM weights and the
/// text only, so `--words` or `--tokens-out` replaced the model's config, Mimi, tokenizer or the
/// voice file (exit 0), and the output WAV the voice.
#[test]
fn speak_outputs_never_replace_a_file_of_the_model_or_the_voice() {
    let model = tempfile::tempdir().unwrap();
    let m = model.path();
    copy_tree(&tiny_a_dir().parent().unwrap().join("tiny-tts"), m);
    let voice = "voices/expresso/ex03-ex01_happy_001_channel1_334s.wav.f00d4040@12.safetensors";
    let text = m.join("text.txt");
    std::fs::write(&text, "Hello there.\n").unwrap();
    let before = |name: &str| std::fs::read(m.join(name)).unwrap();
    let inputs = [
        "config.json",
        "mimi_config.json",
        "mimi.safetensors",
        "tokenizer.model",
        "model.safetensors",
        voice,
        "text.txt",
    ];
    let kept: Vec<Vec<u8>> = inputs.iter().map(|n| before(n)).collect();
    let out = tempfile::tempdir().unwrap();
    let wav = out.path().join("out.wav");
    for name in inputs {
        let target = m.join(name);
        for flag in ["output WAV", "--tokens-out", "--words"] {
            let mut args = vec![
                "speak",
                "--model",
                path_str(m),
                "--voice",
                "expresso/ex03-ex01_happy_001_channel1_334s.wav",
                "--greedy",
                "--text-file",
                path_str(&text),
            ];
            if flag == "output WAV" {
                args.push(path_str(&target));
            } else {
                args.extend([path_str(&wav), flag, path_str(&target)]);
            }
            fails_with(&args, &[flag, "same file as the input"]);
        }
    }
    for (name, bytes) in inputs.iter().zip(&kept) {
        assert_eq!(&before(name), bytes, "{name} was changed");
    }
    assert!(!wav.exists(), "a refused run wrote its WAV");
}

/// The names in `dir`, sorted (hidden temporary files included).
fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// `moshi-rs file` on tiny-a's input into `out`, with `extra` flags.
fn file_run(out: &Path, extra: &[&str]) -> Output {
    let input = tiny_a("input.wav");
    let model = tiny_a_dir();
    let mut args = vec![
        "file",
        path_str(&input),
        path_str(out),
        "--model",
        path_str(&model),
    ];
    args.extend_from_slice(extra);
    moshi(&args)
}

/// Issue #41 item 10: a run that fails on one output (here a full device) replaces none of the
/// others: the old answer and the old transcript stay together, and nothing else is left.
#[test]
fn a_failed_run_replaces_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let answer = dir.path().join("k.wav");
    let transcript = dir.path().join("t.tsv");
    std::fs::write(&answer, b"old answer").unwrap();
    std::fs::write(&transcript, b"old transcript").unwrap();
    let before = snapshot(dir.path());
    for extra in [
        vec!["--transcript", "/dev/full"],
        vec![
            "--transcript",
            path_str(&transcript),
            "--tokens-out",
            "/dev/full",
        ],
        vec![
            "--transcript",
            path_str(&transcript),
            "--profile",
            "/dev/full",
        ],
    ] {
        let o = file_run(&answer, &extra);
        let err = stderr_text(&o);
        assert!(!o.status.success(), "{extra:?} succeeded: {err}");
        assert!(
            err.contains("/dev/full") && err.contains("No space left"),
            "{extra:?}: {err}"
        );
        assert_eq!(snapshot(dir.path()), before, "{extra:?} changed an output");
    }
    // The same run with every output writable replaces both.
    let o = file_run(&answer, &["--transcript", path_str(&transcript)]);
    assert!(o.status.success(), "{}", stderr_text(&o));
    assert_ne!(std::fs::read(&answer).unwrap(), b"old answer");
    assert_ne!(std::fs::read(&transcript).unwrap(), b"old transcript");
    assert_eq!(names_in(dir.path()), ["k.wav", "t.tsv"]);
}

/// A 24 kHz mono WAV of `seconds` of a quiet tone.
#[cfg(unix)]
fn tone_wav(path: &Path, seconds: u32) {
    common::write_wav_24k(
        path,
        (0..seconds as usize * 24_000)
            .map(|i| ((i as f64 * 440.0 * std::f64::consts::TAU / 24_000.0).sin() * 3000.0) as i16),
    );
}

/// A `.npy` of int64 zeros, shape `[1, frames]` (Mimi codes, all valid).
#[cfg(unix)]
fn zero_codes(path: &Path, frames: usize) {
    let mut header =
        format!("{{'descr': '<i8', 'fortran_order': False, 'shape': (1, {frames}), }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.resize(bytes.len() + frames * 8, 0);
    std::fs::write(path, bytes).unwrap();
}

/// Issue #41 item 2: SIGINT, SIGTERM or SIGHUP in the middle of `file`, `codec decode`,
/// `transcribe` or `speak` leaves
/// the old outputs as they were and no hidden temporary file; the process ends as killed by the
/// signal.
#[cfg(unix)]
#[test]
fn a_signal_leaves_no_partial_file() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    let work = tempfile::tempdir().unwrap();
    let long = work.path().join("long.wav");
    tone_wav(&long, 600);
    let codes = work.path().join("codes.npy");
    zero_codes(&codes, 40_000);
    let model = tiny_a_dir();
    let stt = model.parent().unwrap().join("tiny-stt");
    let tts = model.parent().unwrap().join("tiny-tts");
    let text = work.path().join("text.txt");
    std::fs::write(&text, "One two three four five six seven. ".repeat(400)).unwrap();
    for (name, number) in [("INT", 2), ("TERM", 15), ("HUP", 1)] {
        let out = tempfile::tempdir().unwrap();
        let answer = out.path().join("out.wav");
        let tokens = out.path().join("t.jsonl");
        std::fs::write(&answer, b"old answer").unwrap();
        std::fs::write(&tokens, b"old tokens").unwrap();
        let words = out.path().join("w.tsv");
        std::fs::write(&words, b"old words").unwrap();
        let before = snapshot(out.path());
        let runs: [(Vec<&str>, usize); 4] = [
            (
                vec![
                    "file",
                    path_str(&long),
                    path_str(&answer),
                    "--model",
                    path_str(&model),
                    "--tokens-out",
                    path_str(&tokens),
                ],
                2,
            ),
            (
                vec![
                    "codec",
                    "decode",
                    path_str(&codes),
                    path_str(&answer),
                    "--model",
                    path_str(&model),
                ],
                1,
            ),
            // The sweep's find: transcribe and speak left their temporary files.
            (
                vec![
                    "transcribe",
                    path_str(&long),
                    "--model",
                    path_str(&stt),
                    "--out",
                    path_str(&words),
                    "--tokens-out",
                    path_str(&tokens),
                ],
                2,
            ),
            (
                vec![
                    "speak",
                    "--model",
                    path_str(&tts),
                    "--voice",
                    "expresso/ex03-ex01_happy_001_channel1_334s.wav",
                    "--text-file",
                    path_str(&text),
                    path_str(&answer),
                    "--words",
                    path_str(&words),
                    "--tokens-out",
                    path_str(&tokens),
                ],
                3,
            ),
        ];
        for (args, temporaries) in runs {
            let mut child = Command::new(env!("CARGO_BIN_EXE_moshi-rs"))
                .args(&args)
                .env("HF_HUB_OFFLINE", "1")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            // Signalled once its temporary outputs exist, while it writes them.
            let started = Instant::now();
            while names_in(out.path()).len() < before.len() + temporaries {
                assert!(
                    child.try_wait().unwrap().is_none(),
                    "{args:?} ended before it was signalled"
                );
                assert!(
                    started.elapsed() < Duration::from_secs(120),
                    "{args:?}: no output"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            let killed = Command::new("kill")
                .args(["-s", name, &child.id().to_string()])
                .status()
                .unwrap();
            assert!(killed.success());
            let status = child.wait().unwrap();
            assert_eq!(
                status.signal(),
                Some(number),
                "{args:?} SIG{name}: {status:?}"
            );
            assert_eq!(
                snapshot(out.path()),
                before,
                "{args:?} SIG{name} left: {:?}",
                names_in(out.path())
            );
        }
    }
}

/// Issue #41 item 12: outputs whose names take the 255 bytes a folder entry allows are written
/// (the temporary name beside them is short, whatever theirs).
#[test]
fn outputs_with_names_of_255_bytes_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let named = |stem: char, ext: &str| {
        dir.path()
            .join(format!("{}{ext}", stem.to_string().repeat(255 - ext.len())))
    };
    let answer = named('a', ".wav");
    let transcript = named('t', ".tsv");
    let tokens = named('k', ".jsonl");
    let o = file_run(
        &answer,
        &[
            "--transcript",
            path_str(&transcript),
            "--tokens-out",
            path_str(&tokens),
        ],
    );
    assert!(o.status.success(), "{}", stderr_text(&o));
    let codes = named('c', ".npy");
    let o = moshi(&[
        "codec",
        "encode",
        path_str(&tiny_a("input.wav")),
        path_str(&codes),
        "--model",
        path_str(&tiny_a_dir()),
    ]);
    assert!(o.status.success(), "{}", stderr_text(&o));
    let mut names = names_in(dir.path());
    names
        .iter_mut()
        .for_each(|n| *n = n[..1].to_string() + &n.len().to_string());
    assert_eq!(names, ["a255", "c255", "k255", "t255"]);
}

/// How a test hands stdout to the binary.
enum Stdout {
    /// A pipe whose reader is gone before anything is written (`| head -c0`).
    Closed,
    /// `/dev/full` (writes fail with ENOSPC).
    Full,
}

/// Runs `args` with stdout `how`; returns (status code, stderr).
fn with_stdout(args: &[&str], how: Stdout) -> (Option<i32>, String) {
    use std::process::{Command, Stdio};
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_moshi-rs"));
    cmd.args(args)
        .env("HF_HUB_OFFLINE", "1")
        .stderr(Stdio::piped());
    let child = match how {
        Stdout::Closed => {
            let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
            drop(child.stdout.take()); // the reader leaves at once
            child
        }
        Stdout::Full => {
            let full = std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap();
            cmd.stdout(Stdio::from(full)).spawn().unwrap()
        }
    };
    let o = child.wait_with_output().unwrap();
    let err = stderr_text(&o);
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    (o.status.code(), err)
}

/// Issue #41 item 3: a closed stdout ends a command quietly (status 0, nothing on stderr but
/// what the command says anyway), a full one is a clean error naming stdout; `file` completes
/// its outputs either way; `--help` into a full stdout is an error, not a silent success.
#[test]
fn a_closed_or_full_stdout_is_no_panic() {
    let model = tiny_a_dir();
    let a = path_str(&model);
    for args in [
        vec!["inspect", a],
        vec!["inspect", a, "--json"],
        vec!["--help"],
    ] {
        let (code, err) = with_stdout(&args, Stdout::Closed);
        assert_eq!(code, Some(0), "{args:?}: {err}");
        assert!(!err.contains("error"), "{args:?}: {err}");
        let (code, err) = with_stdout(&args, Stdout::Full);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(
            err.contains("stdout") && err.contains("No space left"),
            "{args:?}: {err}"
        );
    }
    // devices: no audio device here is an error of its own; never a panic.
    for how in [Stdout::Closed, Stdout::Full] {
        let (code, err) = with_stdout(&["devices"], how);
        assert_ne!(code, Some(101), "{err}");
    }
    let dir = tempfile::tempdir().unwrap();
    let answer = dir.path().join("k.wav");
    let transcript = dir.path().join("t.tsv");
    let input = tiny_a("input.wav");
    let args = [
        "file",
        path_str(&input),
        path_str(&answer),
        "--model",
        a,
        "--transcript",
        path_str(&transcript),
    ];
    let (code, err) = with_stdout(&args, Stdout::Closed);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(names_in(dir.path()), ["k.wav", "t.tsv"]);
    std::fs::remove_file(&answer).unwrap();
    std::fs::remove_file(&transcript).unwrap();
    let (code, err) = with_stdout(&args, Stdout::Full);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("stdout") && err.contains("No space left"),
        "{err}"
    );
    // The words could not be printed; the files are still complete.
    assert_eq!(names_in(dir.path()), ["k.wav", "t.tsv"]);
}

/// Issue #41 item 4: `/dev/stdout` and `/proc/self/fd/1` as an output stream to stdout, a pipe
/// or a regular file the shell opened, instead of a rename onto it; stdout then carries that
/// output's bytes only (`file`'s words are left out).
#[cfg(target_os = "linux")]
#[test]
fn dev_stdout_is_streamed_to_a_pipe_or_a_file() {
    use std::process::{Command, Stdio};
    let input = tiny_a("input.wav");
    let model = tiny_a_dir();
    let dir = tempfile::tempdir().unwrap();
    // What each command writes to a file, to compare with what it streams.
    let answer = dir.path().join("answer.wav");
    let o = file_run(&answer, &[]);
    assert!(o.status.success(), "{}", stderr_text(&o));
    let codes = dir.path().join("codes.npy");
    let encode = |out: &str| -> Vec<String> {
        [
            "codec",
            "encode",
            path_str(&input),
            out,
            "--model",
            path_str(&model),
        ]
        .map(String::from)
        .to_vec()
    };
    let o = moshi(
        &encode(path_str(&codes))
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert!(o.status.success(), "{}", stderr_text(&o));
    for out in ["/dev/stdout", "/proc/self/fd/1"] {
        let runs = [
            (
                ["file", path_str(&input), out, "--model", path_str(&model)]
                    .map(String::from)
                    .to_vec(),
                std::fs::read(&answer).unwrap(),
            ),
            (encode(out), std::fs::read(&codes).unwrap()),
        ];
        for (args, expected) in runs {
            // A pipe.
            let o = Command::new(env!("CARGO_BIN_EXE_moshi-rs"))
                .args(&args)
                .env("HF_HUB_OFFLINE", "1")
                .stdout(Stdio::piped())
                .output()
                .unwrap();
            assert!(o.status.success(), "{args:?}: {}", stderr_text(&o));
            assert!(
                o.stdout == expected,
                "{args:?}: not the same bytes as the file"
            );
            // A regular file opened by the "shell" for appending, with something before: written
            // after it, the file kept (not replaced by a rename).
            let file = dir.path().join("shell.out");
            std::fs::write(&file, b"before").unwrap();
            let opened = std::fs::OpenOptions::new()
                .append(true)
                .open(&file)
                .unwrap();
            let o = Command::new(env!("CARGO_BIN_EXE_moshi-rs"))
                .args(&args)
                .env("HF_HUB_OFFLINE", "1")
                .stdout(Stdio::from(opened))
                .output()
                .unwrap();
            assert!(o.status.success(), "{args:?}: {}", stderr_text(&o));
            let bytes = std::fs::read(&file).unwrap();
            assert!(
                bytes[..6] == *b"before" && bytes[6..] == expected,
                "{args:?}: the file holds {} bytes",
                bytes.len()
            );
        }
    }
}

/// Issue #41 item 18: `serve --record FILE` says the flag takes a folder (not "no such folder").
#[test]
fn serve_record_names_a_folder() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("talk.wav");
    std::fs::write(&file, b"keep").unwrap();
    let model = tiny_a_dir();
    fails_with(
        &[
            "serve",
            "--model",
            path_str(&model),
            "--record",
            path_str(&file),
        ],
        &["--record", "talk.wav", "is a file, not a folder"],
    );
    fails_with(
        &[
            "serve",
            "--model",
            path_str(&model),
            "--record",
            path_str(&dir.path().join("missing")),
        ],
        &["--record", "no such folder"],
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"keep");
}

/// The class's other stream: a full or closed stderr loses the messages, never the run
/// (`eprintln!` would panic, exit 101, the outputs never committed).
#[test]
fn a_full_or_closed_stderr_loses_only_the_messages() {
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let answer = dir.path().join("k.wav");
    let input = tiny_a("input.wav");
    let model = tiny_a_dir();
    for full in [true, false] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_moshi-rs"));
        cmd.args([
            "file",
            path_str(&input),
            path_str(&answer),
            "--model",
            path_str(&model),
        ])
        .env("HF_HUB_OFFLINE", "1")
        .stdout(Stdio::null());
        let status = if full {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap();
            cmd.stderr(Stdio::from(f)).status().unwrap()
        } else {
            let mut child = cmd.stderr(Stdio::piped()).spawn().unwrap();
            drop(child.stderr.take());
            child.wait().unwrap()
        };
        assert_eq!(status.code(), Some(0), "stderr full: {full}");
        assert_eq!(names_in(dir.path()), ["k.wav"]);
        std::fs::remove_file(&answer).unwrap();
    }
}

/// Two outputs on one pipe (`/dev/stdout` and `/proc/self/fd/1`) would be interleaved in it:
/// refused as one file named twice; `/dev/null` may still take several.
#[cfg(target_os = "linux")]
#[test]
fn one_pipe_is_not_two_outputs() {
    use std::process::{Command, Stdio};
    let input = tiny_a("input.wav");
    let model = tiny_a_dir();
    let args = [
        "file",
        path_str(&input),
        "/dev/stdout",
        "--model",
        path_str(&model),
        "--tokens-out",
        "/proc/self/fd/1",
    ];
    let o = Command::new(env!("CARGO_BIN_EXE_moshi-rs"))
        .args(args)
        .env("HF_HUB_OFFLINE", "1")
        .stdout(Stdio::piped())
        .output()
        .unwrap();
    let err = stderr_text(&o);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("--tokens-out") && err.contains("same file"),
        "{err}"
    );
    assert!(o.stdout.is_empty());
    let dir = tempfile::tempdir().unwrap();
    let o = file_run(
        &dir.path().join("k.wav"),
        &["--tokens-out", "/dev/null", "--profile", "/dev/null"],
    );
    assert!(o.status.success(), "{}", stderr_text(&o));
}

/// An output named with a trailing `/` is refused before any work (it once ran the whole input,
/// then hung: the failed final rename dropped the other outputs under the registry's lock).
#[test]
fn an_output_ending_in_a_slash_is_refused_up_front() {
    let dir = tempfile::tempdir().unwrap();
    let out = format!("{}/new/", path_str(dir.path()));
    let input = tiny_a("input.wav");
    let model = tiny_a_dir();
    fails_with(
        &["file", path_str(&input), &out, "--model", path_str(&model)],
        &["output", "ends in `/`"],
    );
    assert!(names_in(dir.path()).is_empty());
}
