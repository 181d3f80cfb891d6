//! Quantization through the binary: `moshi-rs quantize` reproduces the MLX release files of
//! tiny-a tensor for tensor, `file --quantize q8` on the bf16 weights gives the tokens of the
//! packed q8 file, and contradictory or impossible requests fail clearly without output.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;

use moshi_loader::SafetensorsFile;
use moshi_test_support::{path_str, run_binary, tiny_a, tiny_a_dir};

fn moshi(args: &[&str]) -> Output {
    run_binary(env!("CARGO_BIN_EXE_moshi-rs"), args)
}

/// Every tensor of `path`: name -> (dtype, shape, raw little-endian bytes).
fn tensors(path: &Path) -> BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let f = SafetensorsFile::open(path).unwrap();
    f.tensors()
        .iter()
        .map(|(name, info)| {
            (
                name.clone(),
                (
                    info.dtype.to_string(),
                    info.shape.clone(),
                    f.bytes(name).unwrap().to_vec(),
                ),
            )
        })
        .collect()
}

fn check_quantize_command_reproduces(reference: &str, bits: &str, extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.safetensors");
    let input = tiny_a("model.safetensors");
    let mut args = vec!["quantize", path_str(&input), path_str(&out), "--bits", bits];
    args.extend_from_slice(extra);
    let o = moshi(&args);
    assert!(
        o.status.success(),
        "moshi-rs quantize failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let (got, want) = (tensors(&out), tensors(&tiny_a(reference)));
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "tensor names vs {reference}"
    );
    for (name, (dtype, shape, bytes)) in &want {
        let g = &got[name];
        assert_eq!(
            (&g.0, &g.1),
            (dtype, shape),
            "{name}: dtype/shape vs {reference}"
        );
        assert!(g.2 == *bytes, "{name}: bytes differ from {reference}");
    }
}

#[test]
fn quantize_command_reproduces_mlx_q4_file() {
    check_quantize_command_reproduces("model.q4.safetensors", "4", &[]);
}

#[test]
fn quantize_command_reproduces_mlx_q8_file() {
    let config = tiny_a("config.json");
    check_quantize_command_reproduces(
        "model.q8.safetensors",
        "8",
        &["--group-size", "64", "--config", path_str(&config)],
    );
}

#[test]
fn quantize_command_refuses_bad_requests_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.safetensors");
    let input = tiny_a("model.safetensors");
    let o = moshi(&["quantize", path_str(&input), path_str(&out), "--bits", "6"]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("expected 4 or 8"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // An unsupported group size is refused as the flag, before the model is read (even a
    // missing input is not reached).
    let o = moshi(&[
        "quantize",
        path_str(&dir.path().join("absent.safetensors")),
        path_str(&out),
        "--bits",
        "4",
        "--group-size",
        "48",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--group-size 48") && err.contains("expected one of [32, 64, 128]"),
        "{err}"
    );
    assert!(!err.contains("absent.safetensors"), "{err}");
    // A checkpoint that does not fit the config (the built-in 7B one: no config.json beside it).
    let copied = dir.path().join("model.safetensors");
    std::fs::copy(&input, &copied).unwrap();
    let o = moshi(&["quantize", path_str(&copied), path_str(&out), "--bits", "4"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("moshiko 7B") && err.contains("expects"),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("model.safetensors")],
        "nothing half-written"
    );
}

/// `moshi-rs file ... --greedy --tokens-out` on tiny-a with `extra` flags; the token lines.
fn file_tokens(extra: &[&str]) -> Vec<String> {
    file_tokens_of(&tiny_a_dir(), extra)
}

/// The same on the model folder `model` (its `input.wav`).
fn file_tokens_of(model: &Path, extra: &[&str]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let (out, tokens) = (dir.path().join("out.wav"), dir.path().join("t.jsonl"));
    let input = model.join("input.wav");
    let mut args = vec![
        "file",
        path_str(&input),
        path_str(&out),
        "--model",
        path_str(model),
        "--greedy",
        "--tokens-out",
        path_str(&tokens),
    ];
    args.extend_from_slice(extra);
    let o = moshi(&args);
    assert!(
        o.status.success(),
        "moshi-rs file {extra:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::read_to_string(&tokens)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn file_with_quantize_q8_matches_the_packed_q8_file() {
    let bf16 = tiny_a("model.safetensors");
    let q8 = tiny_a("model.q8.safetensors");
    let quantized = file_tokens(&["--weights", path_str(&bf16), "--quantize", "q8"]);
    let packed = file_tokens(&["--weights", path_str(&q8)]);
    assert!(!packed.is_empty());
    assert_eq!(quantized, packed);
    // And the dequantized q8 file is the same model computed in f32: same tokens on tiny-a.
    let dequantized = file_tokens(&["--weights", path_str(&q8), "--dequantize"]);
    assert_eq!(dequantized, packed);
}

#[test]
fn file_with_quantize_q4g64_matches_the_quantize_command_output() {
    let dir = tempfile::tempdir().unwrap();
    let bf16 = tiny_a("model.safetensors");
    let packed_path = dir.path().join("model.q4g64.safetensors");
    let o = moshi(&[
        "quantize",
        path_str(&bf16),
        path_str(&packed_path),
        "--bits",
        "4",
        "--group-size",
        "64",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The file really holds 64-wide groups: half the scales of the group-32 release file.
    let scales = |path: &Path| {
        tensors(path)
            .into_iter()
            .filter(|(name, _)| name.ends_with(".scales"))
            .map(|(_, (_, shape, _))| shape.iter().product::<usize>())
            .sum::<usize>()
    };
    assert_eq!(
        2 * scales(&packed_path),
        scales(&tiny_a("model.q4.safetensors"))
    );
    let quantized_on_load = file_tokens(&["--weights", path_str(&bf16), "--quantize", "q4g64"]);
    let packed = file_tokens(&["--weights", path_str(&packed_path)]);
    assert!(!packed.is_empty());
    assert_eq!(quantized_on_load, packed);
    // `--quantize q4g64` names exactly the packed file's format (a packed checkpoint runs only
    // under its own), and not the group-32 one `--quantize q4` asks for.
    let same_format = file_tokens(&["--weights", path_str(&packed_path), "--quantize", "q4g64"]);
    assert_eq!(same_format, packed);
    let out = dir.path().join("out.wav");
    let o = moshi(&[
        "file",
        path_str(&tiny_a("input.wav")),
        path_str(&out),
        "--model",
        path_str(&tiny_a_dir()),
        "--weights",
        path_str(&packed_path),
        "--quantize",
        "q4",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("stored as 4-bit, group size 64")
            && err.contains("requested 4-bit, group size 32"),
        "{err}"
    );
}

/// Hibiki 2B's low-rank embeddings are narrower than a group (8 values in the tiny fixture):
/// they stay dense through `--quantize` and `moshi-rs quantize` alike, and the written file runs
/// exactly as the checkpoint quantized on load.
#[test]
fn hibiki_2b_quantize_command_matches_quantize_on_load() {
    let fixture = moshi_test_support::fixture_dir("tiny-hibiki2b");
    for (bits, quantize) in [("4", "q4"), ("8", "q8")] {
        let dir = tempfile::tempdir().unwrap();
        let packed = dir.path().join("model.safetensors");
        let o = moshi(&[
            "quantize",
            path_str(&fixture.join("model.safetensors")),
            path_str(&packed),
            "--bits",
            bits,
            "--config",
            path_str(&fixture.join("config.json")),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let dense: Vec<String> = tensors(&packed)
            .into_iter()
            .filter(|(name, (dtype, _, _))| {
                name.contains("emb")
                    && dtype != "U32"
                    && !name.ends_with(".scales")
                    && !name.ends_with(".biases")
            })
            .map(|(name, _)| name)
            .collect();
        assert!(
            dense.iter().any(|n| n.contains("depformer")),
            "low-rank tables kept dense: {dense:?}"
        );
        let on_load = file_tokens_of(&fixture, &["--quantize", quantize]);
        let from_file = file_tokens_of(&fixture, &["--weights", path_str(&packed)]);
        assert!(!from_file.is_empty());
        assert_eq!(on_load, from_file, "{quantize}");
    }
}

/// Hibiki-Zero's depformer LayerNorms travel through `moshi-rs quantize` (kept f32-exact as
/// norms, beside their sub-step's tensors) and the grouped-query projections are packed like any
/// matrix: `moshi-rs file` on the written file gives the tokens of quantizing on load.
#[test]
fn hibiki_zero_quantize_command_matches_quantize_on_load() {
    let fixture = moshi_test_support::fixture_dir("tiny-hibiki-zero");
    for (bits, quantize) in [("4", "q4"), ("8", "q8")] {
        let dir = tempfile::tempdir().unwrap();
        let packed = dir.path().join("model.safetensors");
        let o = moshi(&[
            "quantize",
            path_str(&fixture.join("model.safetensors")),
            path_str(&packed),
            "--bits",
            bits,
            "--config",
            path_str(&fixture.join("config.json")),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let written = tensors(&packed);
        for k in 0..8 {
            for part in ["weight", "bias"] {
                let name = format!("depformer.slices.{k}.out_norm.{part}");
                assert!(written.contains_key(&name), "{name} missing");
            }
        }
        // The fixture's generation window (Hibiki-Zero's `file` generates for a fixed length).
        let tail = ["--gen-duration-s", "5.12"];
        let on_load = file_tokens_of(&fixture, &[&["--quantize", quantize][..], &tail].concat());
        let from_file = file_tokens_of(
            &fixture,
            &[&["--weights", path_str(&packed)][..], &tail].concat(),
        );
        assert!(!from_file.is_empty());
        assert_eq!(on_load, from_file, "{quantize}");
    }
}

#[test]
fn contradictory_weight_flags_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.wav");
    let input = tiny_a("input.wav");
    let model = tiny_a_dir();
    let base = [
        "file",
        path_str(&input),
        path_str(&out),
        "--model",
        path_str(&model),
        "--greedy",
    ];
    let o = moshi(&[&base[..], &["--quantize", "q4", "--dequantize"]].concat());
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--dequantize") && err.contains("--quantize"),
        "{err}"
    );
    // A packed q8 file cannot be run as q4.
    let q8 = tiny_a("model.q8.safetensors");
    let o = moshi(&[&base[..], &["--weights", path_str(&q8), "--quantize", "q4"]].concat());
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("stored as 8-bit, group size 64")
            && err.contains("requested 4-bit, group size 32"),
        "{err}"
    );
    assert!(!out.exists(), "no output on error");
}
