//! Bad input gets a clear error naming the file, the tensor, and the expected and actual values:
//! truncated or corrupt safetensors, missing or mis-shaped tensors, impossible packed shapes,
//! mistyped configs, configs that disagree with the checkpoint, and non-SentencePiece tokenizers.

mod common;

use std::path::Path;

use common::{asset, copy_all, tiny_config, write_safetensors, RawTensor};
use moshi_loader::tokenizer::TextTokenizer;
use moshi_loader::{
    load_lm_weights, DType, LmConfig, LoaderError, MimiConfig, SafetensorsFile, WeightMode,
};

fn load_err(path: &Path, cfg: &LmConfig) -> String {
    let err = load_lm_weights(path, cfg, WeightMode::Native).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(&path.display().to_string()),
        "error does not name the file: {msg}"
    );
    msg
}

fn assert_has(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "`{p}` not in: {msg}");
    }
}

#[test]
fn truncated_safetensors() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(asset("model.safetensors")).unwrap();
    let path = dir.path().join("model.safetensors");
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let data_len = bytes.len() - 8 - header_len;
    let msg = load_err(&path, &tiny_config());
    assert_has(
        &msg,
        &[
            "truncated",
            &format!("{data_len} bytes"),
            &format!("holds {}", bytes.len() / 2 - 8 - header_len),
        ],
    );
    // Cut inside the header itself: the header's length is what the file cannot hold (not
    // tensor data).
    std::fs::write(&path, &bytes[..100]).unwrap();
    let msg = load_err(&path, &tiny_config());
    assert_has(
        &msg,
        &[
            "truncated",
            &format!("announces a {header_len}-byte JSON header"),
            "holds only 92 bytes after it",
        ],
    );
    assert!(!msg.contains("tensor data"), "{msg}");
    std::fs::write(&path, &bytes[..5]).unwrap();
    assert_has(
        &load_err(&path, &tiny_config()),
        &["5 bytes", "8-byte header"],
    );
}

#[test]
fn corrupt_header() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(asset("model.safetensors")).unwrap();
    let path = dir.path().join("model.safetensors");
    bytes[8] = b'#';
    std::fs::write(&path, &bytes).unwrap();
    assert_has(
        &load_err(&path, &tiny_config()),
        &["not a safetensors file", "not valid JSON"],
    );

    // A header whose offsets disagree with the shape of a tensor.
    let header = r#"{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}}"#;
    let mut raw = (header.len() as u64).to_le_bytes().to_vec();
    raw.extend_from_slice(header.as_bytes());
    raw.extend_from_slice(&[0u8; 24]);
    std::fs::write(&path, &raw).unwrap();
    let msg = SafetensorsFile::open(&path).err().unwrap().to_string();
    assert_has(
        &msg,
        &[
            &path.display().to_string(),
            "`w`",
            "[2, 3]",
            "needs 24 bytes",
            "give 20",
        ],
    );

    let header = r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}"#;
    let mut raw = (header.len() as u64).to_le_bytes().to_vec();
    raw.extend_from_slice(header.as_bytes());
    raw.extend_from_slice(&[0u8; 4]);
    std::fs::write(&path, &raw).unwrap();
    assert_has(
        &SafetensorsFile::open(&path).err().unwrap().to_string(),
        &["`w`", "[4294967296, 4294967296]", "too large"],
    );

    let header = r#"{"w":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}}"#;
    let mut raw = (header.len() as u64).to_le_bytes().to_vec();
    raw.extend_from_slice(header.as_bytes());
    raw.push(0);
    std::fs::write(&path, &raw).unwrap();
    assert_has(
        &SafetensorsFile::open(&path).err().unwrap().to_string(),
        &["`w`", "unsupported dtype Q7"],
    );
}

#[test]
fn missing_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let pt = SafetensorsFile::open(asset("model.safetensors")).unwrap();
    let path = dir.path().join("model.safetensors");
    write_safetensors(
        &path,
        &copy_all(&pt, |n| {
            (n != "transformer.layers.1.norm2.alpha").then(|| n.to_string())
        }),
    );
    let msg = load_err(&path, &tiny_config());
    assert_has(&msg, &["`transformer.layers.1.norm2.alpha`", "missing"]);
}

#[test]
fn wrong_shape() {
    let dir = tempfile::tempdir().unwrap();
    let pt = SafetensorsFile::open(asset("model.safetensors")).unwrap();
    let path = dir.path().join("model.safetensors");
    let mut tensors = copy_all(&pt, |n| (n != "text_linear.weight").then(|| n.to_string()));
    tensors.push(RawTensor::rows(
        &pt,
        "text_linear.weight",
        "text_linear.weight",
        0,
        383,
    ));
    write_safetensors(&path, &tensors);
    let msg = load_err(&path, &tiny_config());
    assert_has(
        &msg,
        &[
            "`text_linear.weight`",
            "shape [383, 256]",
            "expects [384, 256]",
        ],
    );
}

#[test]
fn wrong_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let pt = SafetensorsFile::open(asset("model.safetensors")).unwrap();
    let path = dir.path().join("model.safetensors");
    let mut tensors = copy_all(&pt, |n| (n != "out_norm.alpha").then(|| n.to_string()));
    tensors.push(RawTensor {
        name: "out_norm.alpha".into(),
        dtype: DType::I32,
        shape: vec![1, 1, 256],
        bytes: vec![0; 1024],
    });
    write_safetensors(&path, &tensors);
    assert_has(
        &load_err(&path, &tiny_config()),
        &["`out_norm.alpha`", "dtype I32", "expected F32, BF16 or F16"],
    );
}

/// The q4 file with `text_linear`'s packed words or scales cut or padded to `packed_cols` / `scale_cols` columns.
fn q4_with_text_linear(dir: &Path, packed_cols: usize, scale_cols: usize) -> std::path::PathBuf {
    let q4 = SafetensorsFile::open(asset("model.q4.safetensors")).unwrap();
    let mut tensors = copy_all(&q4, |n| {
        (!n.starts_with("text_linear.")).then(|| n.to_string())
    });
    for (part, cols) in [
        ("weight", packed_cols),
        ("scales", scale_cols),
        ("biases", scale_cols),
    ] {
        let name = format!("text_linear.{part}");
        let info = q4.info(&name).unwrap().clone();
        let esize = info.dtype.size_bytes();
        let bytes = q4.bytes(&name).unwrap();
        let row_bytes = info.shape[1] * esize;
        // Cut each row, or pad it with zeros.
        let cut: Vec<u8> = bytes
            .chunks(row_bytes)
            .flat_map(|row| {
                (0..cols * esize)
                    .map(|i| row.get(i).copied().unwrap_or(0))
                    .collect::<Vec<u8>>()
            })
            .collect();
        tensors.push(RawTensor {
            name,
            dtype: info.dtype,
            shape: vec![info.shape[0], cols],
            bytes: cut,
        });
    }
    let path = dir.join("model.q4.safetensors");
    write_safetensors(&path, &tensors);
    path
}

#[test]
fn quantized_shapes_without_valid_bits_or_group() {
    let dir = tempfile::tempdir().unwrap();
    // 30 words for 256 inputs = 3.75 bits.
    let path = q4_with_text_linear(dir.path(), 30, 8);
    assert_has(
        &load_err(&path, &tiny_config()),
        &[
            "quantized tensor `text_linear`",
            "30 packed",
            "input width of 256",
            "3.750 bits",
        ],
    );
    // 28 words = 3.5 bits.
    let path = q4_with_text_linear(dir.path(), 28, 8);
    assert_has(
        &load_err(&path, &tiny_config()),
        &["`text_linear`", "3.500 bits"],
    );
    // 5 scale columns do not divide 256.
    let path = q4_with_text_linear(dir.path(), 32, 5);
    assert_has(
        &load_err(&path, &tiny_config()),
        &["`text_linear`", "5 scale columns", "256"],
    );
    // 16 scale columns give a group size of 16, which MLX does not produce.
    let path = q4_with_text_linear(dir.path(), 32, 16);
    assert_has(
        &load_err(&path, &tiny_config()),
        &[
            "`text_linear`",
            "group size of 16",
            "expected one of [32, 64, 128]",
        ],
    );
}

#[test]
fn config_with_a_wrong_type() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(asset("config.json")).unwrap()).unwrap();
    cfg["dim"] = "256".into();
    let path = dir.path().join("config.json");
    std::fs::write(&path, cfg.to_string()).unwrap();
    let err = LmConfig::from_file(&path).unwrap_err();
    assert!(
        matches!(&err, LoaderError::ConfigValue { key, .. } if key == "dim"),
        "{err:?}"
    );
    assert_has(
        &err.to_string(),
        &[
            &path.display().to_string(),
            "invalid type: string \"256\"",
            "expected usize",
        ],
    );

    let mut mimi: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(asset("mimi_config.json")).unwrap()).unwrap();
    mimi["seanet"]["ratios"] = serde_json::json!([8, "six", 5, 4]);
    let path = dir.path().join("mimi_config.json");
    std::fs::write(&path, mimi.to_string()).unwrap();
    assert_has(
        &MimiConfig::from_file(&path).unwrap_err().to_string(),
        &[&path.display().to_string(), "invalid type: string \"six\""],
    );

    cfg["dim"] = 256.into();
    cfg["delays"] = serde_json::json!([0, 1]);
    let path = dir.path().join("config.json");
    std::fs::write(&path, cfg.to_string()).unwrap();
    assert_has(
        &LmConfig::from_file(&path).unwrap_err().to_string(),
        &["`delays` has 2 entries", "expected n_q + 1 = 17"],
    );
}

#[test]
fn checkpoint_whose_dims_disagree_with_the_config() {
    let mut cfg = tiny_config();
    cfg.dim = 512;
    cfg.num_heads = 8;
    for file in ["model.safetensors", "model.q8.safetensors"] {
        let msg = load_err(&asset(file), &cfg);
        assert!(msg.contains("512") && msg.contains("256"), "{file}: {msg}");
    }
    assert_has(
        &load_err(&asset("model.safetensors"), &cfg),
        &[
            "`text_emb.weight`",
            "shape [385, 256]",
            "expects [385, 512]",
        ],
    );
    assert_has(
        &load_err(&asset("model.q8.safetensors"), &cfg),
        &[
            "packed tensor `text_emb`",
            "holds [385, 256] (8-bit, group size 64)",
            "expects [385, 512]",
        ],
    );

    let mut cfg = tiny_config();
    cfg.num_layers = 1;
    assert_has(
        &load_err(&asset("model.safetensors"), &cfg),
        &[
            "not used by the config",
            "transformer.layers.1.",
            "num_layers 1",
        ],
    );
    let mut cfg = tiny_config();
    cfg.n_q = 17;
    cfg.delays.push(1);
    assert_has(
        &load_err(&asset("model.q4.safetensors"), &cfg),
        &["`audio_embs.16.weight`", "missing"],
    );
}

#[test]
fn unsupported_release_formats_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.q8.gguf");
    std::fs::write(&path, b"GGUF\x03\x00\x00\x00rest-of-a-gguf-file").unwrap();
    assert_has(
        &load_err(&path, &tiny_config()),
        &["not a GGUF file moshi-rs reads", "tensors", "100000"],
    );

    let pt = SafetensorsFile::open(asset("model.safetensors")).unwrap();
    let mut tensors = copy_all(&pt, |n| Some(n.to_string()));
    let scb = "transformer.layers.0.self_attn.in_proj_weight_scb";
    tensors.push(RawTensor {
        name: scb.into(),
        dtype: DType::F32,
        shape: vec![768],
        bytes: vec![0; 768 * 4],
    });
    let path = dir.path().join("model.q8.safetensors");
    write_safetensors(&path, &tensors);
    assert_has(
        &load_err(&path, &tiny_config()),
        &[scb, "bitsandbytes int8"],
    );
}

#[test]
fn mimi_checkpoint_given_as_the_lm() {
    assert_has(
        &load_err(&asset("mimi.safetensors"), &tiny_config()),
        &["Mimi codec checkpoint", "expected a Moshi LM"],
    );
    let err = moshi_loader::load_mimi_weights(&asset("model.safetensors"), 8)
        .unwrap_err()
        .to_string();
    assert_has(
        &err,
        &[
            "model.safetensors",
            "Moshi LM checkpoint",
            "expected a Mimi codec",
        ],
    );
}

#[test]
fn tokenizer_file_that_is_not_sentencepiece() {
    let dir = tempfile::tempdir().unwrap();
    let random: Vec<u8> = (0u32..4096)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "model.safetensors",
            std::fs::read(asset("model.safetensors")).unwrap(),
        ),
        ("config.json", std::fs::read(asset("config.json")).unwrap()),
        ("empty.model", Vec::new()),
        ("random.model", random),
        (
            "truncated.model",
            std::fs::read(asset("tokenizer.model")).unwrap()[..1000].to_vec(),
        ),
    ];
    for (name, bytes) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, &bytes).unwrap();
        let err = TextTokenizer::from_file(&path).unwrap_err();
        assert!(
            matches!(err, LoaderError::BadTokenizer { .. }),
            "{name}: {err}"
        );
        assert_has(
            &err.to_string(),
            &[&path.display().to_string(), "not a SentencePiece model"],
        );
    }
}

/// Issue #18 item 10: a packed tensor without its `.scales` (or `.biases`) is reported as the
/// missing tensor, not as a shape mismatch of its codes.
#[test]
fn packed_tensor_missing_its_scales_names_the_missing_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let q4 = SafetensorsFile::open(asset("model.q4.safetensors")).unwrap();
    for missing in ["text_linear.scales", "text_linear.biases"] {
        let tensors = copy_all(&q4, |n| (n != missing).then(|| n.to_string()));
        let path = dir.path().join("model.q4.safetensors");
        write_safetensors(&path, &tensors);
        let msg = load_err(&path, &tiny_config());
        assert_has(&msg, &[&format!("`{missing}`"), "missing"]);
        assert!(!msg.contains("shape"), "{msg}");
    }
}

/// Issue #18 items 1 and 10: a config's sizes are range-checked at load, before anything is
/// allocated; the error names the file, the key, the value and the accepted range.
#[test]
fn config_values_out_of_range_name_key_value_and_limit() {
    let dir = tempfile::tempdir().unwrap();
    let base: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(asset("config.json")).unwrap()).unwrap();
    let cases: Vec<(&str, serde_json::Value, &[&str])> = vec![
        (
            "delays",
            serde_json::json!([
                0,
                1_000_000_000u64,
                1,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                1,
                1,
                1,
                1,
                1,
                1,
                1
            ]),
            &["`delays[1]` is 1000000000", "expected 0 to 4096"],
        ),
        ("dim", 0.into(), &["`dim` is 0", "expected 1 to 16384"]),
        (
            "num_layers",
            100_000.into(),
            &["`num_layers` is 100000", "expected 1 to 256"],
        ),
        (
            "max_period",
            0.into(),
            &["`max_period` is 0", "finite number from 1"],
        ),
        ("hidden_scale", (-1.0).into(), &["`hidden_scale` is -1"]),
        (
            "existing_text_padding_id",
            384.into(),
            &["`existing_text_padding_id` is 384", "expected 0 to 383"],
        ),
        (
            "layer_scale",
            0.01.into(),
            &["`layer_scale` is 0.01", "does not support"],
        ),
        (
            "norm",
            "layer_norm".into(),
            &["`norm` is layer_norm", "rms_norm"],
        ),
        (
            "positional_embedding",
            "sin".into(),
            &[
                "config key `positional_embedding` is sin",
                "does not support",
            ],
        ),
        (
            "num_heads",
            3.into(),
            &["dim 256 is not divisible by num_heads 3"],
        ),
    ];
    for (key, value, parts) in cases {
        let mut cfg = base.clone();
        cfg[key] = value;
        let path = dir.path().join("config.json");
        std::fs::write(&path, cfg.to_string()).unwrap();
        let msg = LmConfig::from_file(&path).unwrap_err().to_string();
        assert_has(&msg, &[&path.display().to_string()]);
        assert_has(&msg, parts);
    }
    // The parameter count and the KV caches at a full window are bounded too.
    let mut cfg = base.clone();
    cfg["dim"] = 16384.into();
    cfg["num_layers"] = 256.into();
    cfg["num_heads"] = 128.into();
    let path = dir.path().join("config.json");
    std::fs::write(&path, cfg.to_string()).unwrap();
    assert_has(
        &LmConfig::from_file(&path).unwrap_err().to_string(),
        &["parameters, above this engine's limit"],
    );
    // The 7B is well inside every limit; its parameter count is the known one.
    assert_eq!(LmConfig::moshiko_7b().parameter_count(), 7_687_729_152);
}

/// Issue #18 items 1 and 10 for Mimi's config.
#[test]
fn mimi_config_values_out_of_range_name_key_value_and_limit() {
    let dir = tempfile::tempdir().unwrap();
    let base: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(asset("mimi_config.json")).unwrap()).unwrap();
    type Edit = fn(&mut serde_json::Value);
    let cases: Vec<(Edit, &[&str])> = vec![
        (
            |c| c["transformer"]["context"] = 1_000_000_000_000u64.into(),
            &[
                "`transformer.context` is 1000000000000",
                "expected 1 to 65536",
            ],
        ),
        (|c| c["frame_rate"] = 0.into(), &["`frame_rate` is 0"]),
        (|c| c["channels"] = 2.into(), &["`channels` is 2", "mono"]),
        (
            |c| c["seanet"]["ratios"][0] = 0.into(),
            &["`seanet.ratios[0]` is 0", "expected 1 to 64"],
        ),
        (
            |c| c["seanet"]["ratios"][0] = 7.into(),
            &["not a whole number of SEANet hops"],
        ),
        (
            |c| c["seanet"]["activation"] = "GELU".into(),
            &[
                "config key `seanet.activation`",
                "unknown variant `GELU`",
                "`ELU`",
            ],
        ),
        (
            |c| c["seanet"]["compress"] = 0.into(),
            &["`seanet.compress` is 0"],
        ),
        (
            |c| c["quantizer"]["bins"] = 0.into(),
            &["`quantizer.bins` is 0"],
        ),
        (
            |c| c["transformer"]["num_heads"] = 3.into(),
            &["not a multiple of 2 x transformer.num_heads 3"],
        ),
        (
            |c| c["transformer"]["gating"] = "silu".into(),
            &["`transformer.gating` is silu", "none"],
        ),
    ];
    for (edit, parts) in cases {
        let mut cfg = base.clone();
        edit(&mut cfg);
        let path = dir.path().join("mimi_config.json");
        std::fs::write(&path, cfg.to_string()).unwrap();
        let msg = MimiConfig::from_file(&path).unwrap_err().to_string();
        assert_has(&msg, &[&path.display().to_string()]);
        assert_has(&msg, parts);
    }
}

/// Issue #18 item 11: tensors whose data ranges overlap are refused, naming both.
#[test]
fn overlapping_tensor_data_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("overlap.safetensors");
    let header = r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}"#;
    let mut raw = (header.len() as u64).to_le_bytes().to_vec();
    raw.extend_from_slice(header.as_bytes());
    raw.extend_from_slice(&[0u8; 16]);
    std::fs::write(&path, &raw).unwrap();
    assert_has(
        &SafetensorsFile::open(&path).err().unwrap().to_string(),
        &[
            &path.display().to_string(),
            "`b`",
            "[8, 16) overlap those of `a` [0, 16)",
        ],
    );
    // Adjacent ranges (and empty tensors) are fine.
    let header = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},"e":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}}"#;
    let mut raw = (header.len() as u64).to_le_bytes().to_vec();
    raw.extend_from_slice(header.as_bytes());
    raw.extend_from_slice(&[0u8; 16]);
    assert_eq!(
        SafetensorsFile::validate_bytes(&raw, Path::new("mem")).unwrap(),
        3
    );
    // A device is not a checkpoint.
    assert_has(
        &SafetensorsFile::open("/dev/zero")
            .err()
            .unwrap()
            .to_string(),
        &["/dev/zero", "a character device, expected a regular file"],
    );
}

/// The q4 file with tensor `name` replaced by a U32 tensor of `shape` (zeros).
fn q4_with_u32(dir: &Path, name: &str, shape: &[usize]) -> std::path::PathBuf {
    let q4 = SafetensorsFile::open(asset("model.q4.safetensors")).unwrap();
    let mut tensors = copy_all(&q4, |n| (n != name).then(|| n.to_string()));
    tensors.push(RawTensor {
        name: name.into(),
        dtype: DType::U32,
        shape: shape.to_vec(),
        bytes: vec![0; 4 * shape.iter().product::<usize>()],
    });
    let path = dir.join("model.q4.safetensors");
    write_safetensors(&path, &tensors);
    path
}

/// Packed (U32) tensors of the wrong rank are refused with an error naming the tensor, the
/// expected and the stored shape, by loading and by inspecting (they used to panic indexing
/// the missing dimensions).
#[test]
fn packed_tensors_of_the_wrong_rank_are_errors_not_panics() {
    use moshi_loader::inspect::{inspect_checkpoint, ConfigRef};
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_config();

    // A packed matrix stored as a scalar.
    let path = q4_with_u32(dir.path(), "audio_embs.0.weight", &[]);
    assert_has(
        &load_err(&path, &cfg),
        &[
            "quantized tensor `audio_embs.0`",
            "shape []",
            "expected [65, packed columns]",
        ],
    );
    let report = inspect_checkpoint(&path, Some(ConfigRef::Lm(&cfg))).unwrap();
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.contains("audio_embs.0") && n.contains("shape []")),
        "{:?}",
        report.notes
    );

    // A norm (a vector) stored packed.
    let path = q4_with_u32(dir.path(), "transformer.layers.0.norm1.weight", &[256]);
    assert_has(
        &load_err(&path, &cfg),
        &[
            "`transformer.layers.0.norm1.weight` is stored packed (U32 [256])",
            "expected an unpacked",
            "[256]",
        ],
    );
    let report = inspect_checkpoint(&path, Some(ConfigRef::Lm(&cfg))).unwrap();
    assert!(!report.config_check.unwrap().is_clean());

    // The FFN input matrix, whose rows give the width of the packed `linear_out`, as a scalar.
    let path = q4_with_u32(
        dir.path(),
        "transformer.layers.0.gating.linear_in.weight",
        &[],
    );
    assert_has(
        &load_err(&path, &cfg),
        &["`transformer.layers.0.gating.linear_in`", "shape []"],
    );
    let report = inspect_checkpoint(&path, Some(ConfigRef::Lm(&cfg))).unwrap();
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.contains("gating.linear_in") && n.contains("shape []")),
        "{:?}",
        report.notes
    );
}

/// A safetensors file with `entries` (JSON text of each header entry, in order) and no data.
fn raw_header_file(path: &Path, entries: impl Iterator<Item = String>) {
    let mut json = String::from("{");
    for (i, e) in entries.enumerate() {
        if i > 0 {
            json.push(',');
        }
        json += &e;
    }
    json.push('}');
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(json.as_bytes());
    std::fs::write(path, bytes).unwrap();
}

/// Issue #41 item 9: a header within the 100 MB limit listing a million empty tensors took
/// 2.4 GB and 11 s (each entry read into a `serde_json::Value`). The tensors past the cap are
/// counted, not kept, and the file is refused naming the count and the cap; a shape of more
/// dimensions than any tensor has is refused likewise.
#[test]
fn a_header_listing_too_many_tensors_is_refused_naming_the_count_and_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("many.safetensors");
    let listed = 150_000;
    raw_header_file(
        &path,
        (0..listed)
            .map(|i| format!(r#""t{i}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}"#)),
    );
    let started = std::time::Instant::now();
    let msg = SafetensorsFile::open(&path).err().unwrap().to_string();
    assert_has(
        &msg,
        &[
            "many.safetensors",
            &format!("lists {listed} tensors"),
            "more than the 100000",
        ],
    );
    assert!(started.elapsed().as_secs() < 10, "{:?}", started.elapsed());

    raw_header_file(
        &path,
        std::iter::once(
            r#""deep":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}"#
                .to_string(),
        ),
    );
    let msg = SafetensorsFile::open(&path).err().unwrap().to_string();
    assert_has(&msg, &["`deep`", "10 dimensions", "more than the 8"]);

    let meta = (0..20_000)
        .map(|i| format!(r#""k{i}":"v""#))
        .collect::<Vec<_>>()
        .join(",");
    raw_header_file(
        &path,
        std::iter::once(format!(r#""__metadata__":{{{meta}}}"#)),
    );
    let msg = SafetensorsFile::open(&path).err().unwrap().to_string();
    assert_has(
        &msg,
        &["__metadata__ lists 20000 entries", "more than the 10000"],
    );
}
