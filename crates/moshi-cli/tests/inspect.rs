//! Runs the built `moshi-rs inspect` on every file of assets/tiny-a and on the folder.

use std::path::Path;

use moshi_test_support::{path_str, read_json, run_binary, tiny_a, tiny_a_dir};
use serde_json::Value;

fn inspect(args: &[&str]) -> (bool, String, String) {
    let out = run_binary(
        env!("CARGO_BIN_EXE_moshi-rs"),
        &[&["inspect"][..], args].concat(),
    );
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn inspect_json(path: &Path, extra: &[&str]) -> Value {
    let mut args = vec![path_str(path), "--json"];
    args.extend_from_slice(extra);
    let (ok, stdout, stderr) = inspect(&args);
    assert!(ok, "inspect {} failed: {stderr}", path.display());
    serde_json::from_str(&stdout).unwrap()
}

fn the_checkpoint(v: &Value) -> &Value {
    let list = v["checkpoints"].as_array().unwrap();
    assert_eq!(list.len(), 1);
    &list[0]
}

fn assert_config_clean(c: &Value) {
    let check = &c["config_check"];
    for k in ["missing", "unexpected", "mismatched"] {
        assert_eq!(check[k].as_array().unwrap().len(), 0, "{k}: {check}");
    }
}

#[test]
fn every_tiny_a_file_is_described() {
    let mut seen = 0;
    for entry in std::fs::read_dir(tiny_a_dir()).unwrap() {
        let path = entry.unwrap().path();
        if !path.is_file() {
            continue;
        }
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        match name.as_str() {
            "model.safetensors" => {
                let c = inspect_json(&path, &[]);
                let c = the_checkpoint(&c);
                assert_eq!(c["format"], "pytorch");
                assert_eq!(c["dtypes"]["BF16"], 95);
                assert!(c["quantization"].as_array().unwrap().is_empty());
                assert_eq!(c["parameter_count"], 2_943_232);
                assert!(c["config"].as_str().unwrap().ends_with("config.json"));
                assert_config_clean(c);
            }
            "model.q4.safetensors" | "model.q8.safetensors" => {
                let (bits, group) = if name.contains("q4") {
                    (4, 32)
                } else {
                    (8, 64)
                };
                let c = inspect_json(&path, &[]);
                let c = the_checkpoint(&c);
                assert_eq!(c["format"], "mlx");
                let q = c["quantization"].as_array().unwrap();
                assert_eq!(q.len(), 1, "{q:?}");
                assert_eq!(
                    (
                        q[0]["bits"].as_u64().unwrap(),
                        q[0]["group_size"].as_u64().unwrap()
                    ),
                    (bits, group)
                );
                assert_eq!(q[0]["matrices"], 114);
                // Same model as the PyTorch file plus the depformer norms MLX stores per slice.
                assert_eq!(c["parameter_count"], 2_943_232 + 7 * 2 * 2 * 64);
                assert_config_clean(c);
            }
            "mimi.safetensors" => {
                let c = inspect_json(&path, &[]);
                let c = the_checkpoint(&c);
                assert_eq!(c["format"], "mimi");
                assert_eq!(c["dtypes"]["F32"], 138);
                assert!(c["config"].as_str().unwrap().ends_with("mimi_config.json"));
                assert_config_clean(c);
            }
            "tokenizer.model" => {
                let v = inspect_json(&path, &[]);
                let t = &v["tokenizers"][0];
                assert_eq!(
                    (t["vocab_size"].as_u64(), t["byte_fallback"].as_bool()),
                    (Some(384), Some(true))
                );
                assert_eq!(t["model_type"], "unigram");
            }
            "config.json" | "mimi_config.json" => {
                let v = inspect_json(&path, &[]);
                let kind = if name == "config.json" { "lm" } else { "mimi" };
                assert_eq!(v["configs"][0]["kind"], kind);
            }
            _ => {
                // WAVs and the manifest are not model files: a clear error, not a panic.
                let (ok, _, stderr) = inspect(&[path_str(&path)]);
                assert!(!ok, "{name} should be rejected");
                assert!(
                    stderr.contains(&name) && stderr.contains("not a safetensors file"),
                    "{name}: {stderr}"
                );
                assert!(!stderr.contains("panicked"), "{stderr}");
            }
        }
        seen += 1;
    }
    assert!(seen >= 10, "only {seen} files in assets/tiny-a");
}

#[test]
fn the_folder_is_described_and_resolved() {
    let v = inspect_json(&tiny_a_dir(), &[]);
    let formats: Vec<&str> = v["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["format"].as_str().unwrap())
        .collect();
    assert_eq!(formats, ["mimi", "mlx", "mlx", "pytorch"]);
    assert_eq!(v["tokenizers"].as_array().unwrap().len(), 1);
    let r = &v["resolved"];
    assert!(r["lm_weights"]
        .as_str()
        .unwrap()
        .ends_with("model.safetensors"));
    assert_eq!(r["layout"], "pytorch");
    assert!(r["mimi_weights"]
        .as_str()
        .unwrap()
        .ends_with("mimi.safetensors"));
    assert!(r["tokenizer"]
        .as_str()
        .unwrap()
        .ends_with("tokenizer.model"));

    let (ok, text, _) = inspect(&[path_str(&tiny_a_dir())]);
    assert!(ok);
    assert!(
        text.contains("4-bit, group size 32")
            && text.contains("8-bit, group size 64")
            && text.contains("format      pytorch"),
        "{text}"
    );
}

/// For a folder, the model type its config gives and the commands that run it.
#[test]
fn the_folder_says_what_model_it_is_and_what_runs_it() {
    for (fixture, model, runs) in [
        (
            "tiny-a",
            "moshi (conversation)",
            "file, chat and serve (/api/chat)",
        ),
        ("tiny-hibiki", "hibiki (speech translation)", "translating"),
        (
            "tiny-hibiki-zero",
            "hibiki-zero (speech translation)",
            "translating (hibiki-zero's feeding)",
        ),
        ("tiny-stt", "stt (speech to text)", "transcribe"),
        (
            "tiny-tts",
            "tts (text to speech)",
            "speak and serve (/api/tts_streaming)",
        ),
    ] {
        let dir = moshi_test_support::repo_root().join("assets").join(fixture);
        let v = inspect_json(&dir, &[]);
        assert_eq!(v["resolved"]["model"], model, "{fixture}");
        assert!(
            v["resolved"]["runs"].as_str().unwrap().contains(runs),
            "{fixture}: {v}"
        );
        let (ok, text, _) = inspect(&[path_str(&dir)]);
        assert!(
            ok && text.contains(&format!("  model       {model}: runs with")),
            "{text}"
        );
    }
}

#[test]
fn a_config_that_does_not_fit_is_reported_and_bits_still_come_from_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        tiny_a("model.q4.safetensors"),
        dir.path().join("model.q4.safetensors"),
    )
    .unwrap();
    // No config.json next to it: the built-in 7B config applies, and does not fit a tiny model.
    let v = inspect_json(&dir.path().join("model.q4.safetensors"), &[]);
    let c = the_checkpoint(&v);
    assert_eq!(c["config"], "built-in moshiko-7b");
    assert_eq!(c["quantization"][0]["bits"], 4);
    assert_eq!(c["quantization"][0]["group_size"], 32);
    let check = &c["config_check"];
    assert!(!check["missing"].as_array().unwrap().is_empty(), "{check}");
    assert!(
        !check["mismatched"].as_array().unwrap().is_empty(),
        "{check}"
    );

    // A config with an extra layer: that layer's tensors are missing.
    let mut cfg = read_json(&tiny_a("config.json"));
    cfg["num_layers"] = 3.into();
    let cfg_path = dir.path().join("three-layers.json");
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let v = inspect_json(
        &tiny_a("model.safetensors"),
        &["--config", path_str(&cfg_path)],
    );
    let missing = the_checkpoint(&v)["config_check"]["missing"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(missing.len(), 6, "{missing:?}");
    assert!(missing
        .iter()
        .all(|m| m.as_str().unwrap().starts_with("transformer.layers.2.")));
}

/// A config that is a device (here a link named `.json` to /dev/zero) is refused at the size
/// cap, naming the file, instead of read until memory runs out.
#[cfg(unix)]
#[test]
fn an_endless_config_is_refused_at_the_size_cap() {
    let dir = tempfile::tempdir().unwrap();
    let zero = dir.path().join("zero.json");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let started = std::time::Instant::now();
    let (ok, _, err) = inspect(&[path_str(&zero)]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("zero.json") && err.contains("too large for a JSON config"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
}

/// candle's q8_0 GGUF (`assets/tiny-a-gguf`): its layout, ggml types, the q8_0 format and a
/// clean check against the tiny-a config; against the built-in 7B config, the mismatches.
#[test]
fn the_candle_q8_0_gguf_is_described() {
    let gguf = moshi_test_support::fixture("tiny-a-gguf", "model.q8.gguf");
    let v = inspect_json(&gguf, &["--config", path_str(&tiny_a("config.json"))]);
    let c = the_checkpoint(&v);
    assert_eq!(c["format"], "candle (GGUF v2)");
    assert_eq!(
        (c["dtypes"]["Q8_0"].as_u64(), c["dtypes"]["F32"].as_u64()),
        (Some(114), Some(37))
    );
    let q = &c["quantization"][0];
    assert_eq!(
        (q["bits"].as_u64(), q["group_size"].as_u64()),
        (Some(8), Some(32))
    );
    assert_config_clean(c);
    let v = inspect_json(&gguf, &[]);
    let c = the_checkpoint(&v);
    assert_eq!(c["config"], "built-in moshiko-7b");
    assert!(
        !c["config_check"]["mismatched"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{c}"
    );
}
