//! Issue #41, the class "untrusted text reaches a terminal": what files, configs and tokenizers
//! hold (tensor names, dtypes, tokenizer pieces) is printed with its control characters escaped
//! (`moshi_loader::escape`), on stdout and stderr alike, so that a checkpoint or a tokenizer
//! cannot send escape sequences to the terminal of whoever inspects or runs it. Each test fails
//! without the escaping (the bytes arrived raw).

use std::path::Path;
use std::process::Command;

use moshi_test_support::{path_str, tiny_a, tiny_a_dir};
use serde_json::Value;

/// Bytes a terminal would act on: ESC, BEL, CR, the 8-bit CSI (U+009B as UTF-8) and the
/// right-to-left override (U+202E).
fn assert_no_raw_controls(what: &str, bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    for (raw, name) in [
        ("\u{1b}", "ESC"),
        ("\u{7}", "BEL"),
        ("\r", "CR"),
        ("\u{9b}", "CSI"),
        ("\u{202e}", "RLO"),
    ] {
        assert!(!text.contains(raw), "{what} carries a raw {name}: {text:?}");
    }
}

/// A copy of `src` (a safetensors file) with one more 4-byte F32 tensor named `name`.
fn with_extra_tensor(src: &Path, dst: &Path, name: &str, dtype: &str) {
    let bytes = std::fs::read(src).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    header.insert(
        name.to_string(),
        serde_json::json!({"dtype": dtype, "shape": [1], "data_offsets": [data.len(), data.len() + 4]}),
    );
    let header = serde_json::to_vec(&header).unwrap();
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&header);
    out.extend_from_slice(data);
    out.extend_from_slice(&[0; 4]);
    std::fs::write(dst, out).unwrap();
}

fn moshi_rs(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_moshi-rs"))
        .args(args)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap()
}

/// `inspect` lists a tensor whose name carries ESC, CSI and RLO: escaped in the text report,
/// and in the JSON report as JSON escapes (the name reads back exactly).
#[test]
fn inspect_escapes_tensor_names_in_text_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("extra.safetensors");
    let name = "evil\u{1b}[2J\u{9b}\u{202e}";
    with_extra_tensor(&tiny_a("model.safetensors"), &file, name, "F32");
    let config = tiny_a("config.json");
    let text = moshi_rs(&["inspect", path_str(&file), "--config", path_str(&config)]);
    assert!(text.status.success(), "{text:?}");
    assert_no_raw_controls("inspect's report", &text.stdout);
    let report = String::from_utf8(text.stdout).unwrap();
    assert!(report.contains(r"evil\u{1b}[2J\u{9b}\u{202e}"), "{report}");

    let json = moshi_rs(&[
        "inspect",
        path_str(&file),
        "--config",
        path_str(&config),
        "--json",
    ]);
    assert!(json.status.success(), "{json:?}");
    assert_no_raw_controls("inspect --json", &json.stdout);
    let value: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(value.to_string().contains(r#""evil\u001b[2J"#), "{value}");
    let unexpected = &value["checkpoints"][0]["config_check"]["unexpected"];
    assert!(
        unexpected
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().starts_with(name)),
        "{unexpected}"
    );
}

/// An error quoting what a file holds (a tensor's name, raw in the loader's message) is printed
/// escaped.
#[test]
fn errors_quoting_a_file_are_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.safetensors");
    with_extra_tensor(
        &tiny_a("model.safetensors"),
        &file,
        "\u{1b}]0;owned\u{7}\r",
        "Q7",
    );
    let out = moshi_rs(&["inspect", path_str(&file)]);
    assert!(!out.status.success());
    assert_no_raw_controls("the error", &out.stderr);
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains(r"tensor `\u{1b}]0;owned\u{7}\r`") && err.contains("unsupported dtype Q7"),
        "{err}"
    );
}

/// `file` prints the model's words: a tokenizer whose pieces carry ESC (here every `▁`, three
/// bytes, replaced by `ESC [ 2`) has them shown escaped.
#[test]
fn file_prints_tokenizer_pieces_escaped() {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(tiny_a_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    let tokenizer = dir.path().join("tokenizer.model");
    let bytes = std::fs::read(&tokenizer).unwrap();
    let space = "\u{2581}".as_bytes();
    let mut patched = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(space) {
            patched.extend_from_slice(b"\x1b[2");
            i += space.len();
        } else {
            patched.push(bytes[i]);
            i += 1;
        }
    }
    assert_ne!(patched, bytes, "the tokenizer has no `\u{2581}` piece");
    std::fs::write(&tokenizer, patched).unwrap();
    let out_wav = dir.path().join("out.wav");
    let out = moshi_rs(&[
        "file",
        path_str(&tiny_a("input.wav")),
        path_str(&out_wav),
        "--model",
        path_str(dir.path()),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_no_raw_controls("file's words", &out.stdout);
    assert_no_raw_controls("file's messages", &out.stderr);
    let words = String::from_utf8(out.stdout).unwrap();
    assert!(words.contains(r"\u{1b}[2"), "{words}");
}

/// The sweep's find (issue #41): log lines written to a file or a pipe (a log collector, `serve
/// 2>serve.log`) carried the subscriber's colour escapes; they are for a terminal only.
#[test]
fn logs_to_a_file_or_pipe_carry_no_colour_escapes() {
    let dir = tempfile::tempdir().unwrap();
    let codes = dir.path().join("codes.npy");
    let o = moshi_rs(&[
        "--log",
        "debug",
        "codec",
        "encode",
        "--model",
        path_str(&tiny_a_dir()),
        path_str(&tiny_a("input.wav")),
        path_str(&codes),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(log.contains("INFO"), "no log line to check: {log}");
    assert_no_raw_controls("the log on a pipe", &o.stderr);
}
