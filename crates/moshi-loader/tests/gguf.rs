//! GGUF checkpoints: the q8_0 fixture written by candle's own quantizer and GGUF writer
//! (`assets/tiny-a-gguf`, from `scripts/gguf-candle`) reads to candle's own dequantized values
//! and to the tiny-a weights within q8_0's rounding, under the canonical names; hostile headers
//! are refused with errors naming the file and the field, never a panic or a huge allocation.

mod common;

use std::path::{Path, PathBuf};

use common::{asset, tiny_config};
use moshi_kernels::{QuantizedMatrix, ScaleFormat};
use moshi_loader::gguf_file::{GgmlType, GgufFile};
use moshi_loader::inspect::{inspect_checkpoint, ConfigRef};
use moshi_loader::layout::{detect_file_kind, detect_gguf_kind};
use moshi_loader::{
    load_lm_weights, CheckpointKind, LmLayout, SafetensorsFile, WeightData, WeightMode,
};

fn gguf_asset(name: &str) -> PathBuf {
    moshi_test_support::fixture("tiny-a-gguf", name)
}

#[test]
fn the_candle_fixture_reads_as_a_candle_lm_of_q8_0_matrices_and_f32_norms() {
    let file = GgufFile::open(gguf_asset("model.q8.gguf")).unwrap();
    assert_eq!(file.version(), 2);
    assert_eq!(
        detect_gguf_kind(&file).unwrap(),
        CheckpointKind::Lm(LmLayout::Candle)
    );
    assert_eq!(
        detect_file_kind(&gguf_asset("model.q8.gguf")).unwrap(),
        CheckpointKind::Lm(LmLayout::Candle)
    );
    for (name, t) in file.tensors() {
        let want = if t.shape.len() == 2 {
            GgmlType::Q8_0
        } else {
            GgmlType::F32
        };
        assert_eq!(t.ggml_type, want, "{name} {:?}", t.shape);
    }
    let in_proj = &file.tensors()["transformer.layers.0.self_attn.in_proj_weight"];
    assert_eq!(
        in_proj.shape,
        [768, 256],
        "row-major: the file's dimensions reversed"
    );
    let report = inspect_checkpoint(
        &gguf_asset("model.q8.gguf"),
        Some(ConfigRef::Lm(&tiny_config())),
    )
    .unwrap();
    assert_eq!(report.format, "candle (GGUF v2)");
    assert_eq!(report.dtypes["Q8_0"], 114);
    assert_eq!(report.quantization[0].group_size, 32);
    assert!(report.config_check.unwrap().is_clean());
}

/// The packed matrices unpack to candle's own `QTensor::dequantize` values (written beside the
/// GGUF by the generator), value for value.
#[test]
fn q8_0_unpacks_to_candles_dequantized_values() {
    let file = GgufFile::open(gguf_asset("model.q8.gguf")).unwrap();
    let reference = SafetensorsFile::open(gguf_asset("dequant.safetensors")).unwrap();
    assert_eq!(reference.tensors().len(), 3);
    for (name, info) in reference.tensors() {
        let want = reference.read_f32(name, &info.shape).unwrap();
        let t = &file.tensors()[name.as_str()];
        let (rows, cols) = (t.shape[0], t.shape[1]);
        let q = QuantizedMatrix::from_q8_0(rows, cols, file.bytes(name).unwrap()).unwrap();
        assert_eq!(q.scale_format(), ScaleFormat::F16);
        // Equal values (a zero code gives +0 where candle's `d · 0` may give -0).
        assert_eq!(q.dequantize_f32(), want, "{name}");
    }
}

/// Every canonical tensor of the GGUF is the tiny-a weight of the same name (PyTorch layout,
/// bf16) to within q8_0's rounding, norms exactly: the candle names map to the right tensors,
/// depformer slices included. A block's step is `d = max |w| / 127`, stored as f16 (relative
/// rounding at most 2^-11), so `|w - f16(d) · q| ≤ d / 2 + 127 · d · 2^-11`.
#[test]
fn the_gguf_holds_the_tiny_a_weights_under_the_canonical_names() {
    let cfg = tiny_config();
    let dense =
        load_lm_weights(&asset("model.safetensors"), &cfg, WeightMode::DequantizeF32).unwrap();
    let packed = load_lm_weights(&gguf_asset("model.q8.gguf"), &cfg, WeightMode::Native).unwrap();
    assert_eq!(dense.len(), packed.len());
    let mut quantized = 0;
    for name in dense.names() {
        let (want, got) = (dense.get(name).unwrap(), packed.get(name).unwrap());
        assert_eq!(want.shape, got.shape, "{name}");
        let (want, got_f32) = (want.to_f32(), got.to_f32());
        match &got.data {
            WeightData::Quantized(q) => {
                quantized += 1;
                assert_eq!(q.scale_format(), ScaleFormat::F16, "{name}");
                for (w, g) in want.chunks(32).zip(got_f32.chunks(32)) {
                    let step = w.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                    let bound = step * (0.5 + 127.0 / 2048.0) * (1.0 + 1e-4);
                    for (a, b) in w.iter().zip(g) {
                        assert!((a - b).abs() <= bound, "{name}: {a} vs {b} (step {step})");
                    }
                }
            }
            WeightData::F32(_) => assert_eq!(want, got_f32, "{name}"),
            WeightData::BF16(_) => panic!("{name}: a GGUF holds no bf16 here"),
        }
    }
    assert!(quantized > 50, "{quantized} packed matrices");
}

#[test]
fn weight_modes_dequantize_or_refuse_to_requantize() {
    let cfg = tiny_config();
    let path = gguf_asset("model.q8.gguf");
    let native = load_lm_weights(&path, &cfg, WeightMode::Native).unwrap();
    let f32s = load_lm_weights(&path, &cfg, WeightMode::DequantizeF32).unwrap();
    let name = "transformer.layers.1.gating.linear_out";
    let w = native.get(name).unwrap();
    assert!(matches!(w.data, WeightData::Quantized(_)));
    assert_eq!(f32s.get(name).unwrap().to_f32(), w.to_f32());
    let same = WeightMode::Quantize {
        bits: 8,
        group_size: 32,
    };
    assert!(matches!(
        load_lm_weights(&path, &cfg, same)
            .unwrap()
            .get(name)
            .unwrap()
            .data,
        WeightData::Quantized(_)
    ));
    let err = load_lm_weights(
        &path,
        &cfg,
        WeightMode::Quantize {
            bits: 4,
            group_size: 32,
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("requantizing") && err.contains("model.q8.gguf"),
        "{err}"
    );
}

/// A GGUF header built field by field (version 3 unless changed).
struct Header {
    bytes: Vec<u8>,
}

impl Header {
    fn new(version: u32, tensors: u64, metadata: u64) -> Self {
        let mut bytes = b"GGUF".to_vec();
        bytes.extend(version.to_le_bytes());
        bytes.extend(tensors.to_le_bytes());
        bytes.extend(metadata.to_le_bytes());
        Header { bytes }
    }
    fn string(mut self, s: &str) -> Self {
        self.bytes.extend((s.len() as u64).to_le_bytes());
        self.bytes.extend(s.as_bytes());
        self
    }
    fn u32(mut self, v: u32) -> Self {
        self.bytes.extend(v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.bytes.extend(v.to_le_bytes());
        self
    }
    /// A tensor info: name, row-major shape (written innermost first), ggml type, offset.
    fn tensor(self, name: &str, shape: &[u64], ty: u32, offset: u64) -> Self {
        let mut h = self.string(name).u32(shape.len() as u32);
        for &d in shape.iter().rev() {
            h = h.u64(d);
        }
        h.u32(ty).u64(offset)
    }
    /// Pads to 32 bytes and appends `data_bytes` zero bytes of data.
    fn data(mut self, data_bytes: usize) -> Vec<u8> {
        self.bytes
            .resize(self.bytes.len().div_ceil(32) * 32 + data_bytes, 0);
        self.bytes
    }
}

fn refused(bytes: &[u8], needles: &[&str]) {
    let origin = Path::new("hostile.gguf");
    let err = GgufFile::validate_bytes(bytes, origin)
        .unwrap_err()
        .to_string();
    assert!(err.contains("hostile.gguf"), "{err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` not in: {err}");
    }
}

#[test]
fn a_well_formed_header_reads_and_every_prefix_of_it_is_refused() {
    let good = Header::new(3, 2, 1)
        .string("general.alignment")
        .u32(4)
        .u32(32)
        .tensor("a.weight", &[2, 64], 8, 0)
        .tensor("a.alpha", &[1, 1, 4], 0, 160)
        .data(160 + 16);
    assert_eq!(
        GgufFile::validate_bytes(&good, Path::new("good.gguf")).unwrap(),
        2
    );
    for len in 0..good.len() - 1 {
        let err = GgufFile::validate_bytes(&good[..len], Path::new("cut.gguf"));
        assert!(err.is_err(), "a {len}-byte prefix was accepted");
    }
}

#[test]
fn hostile_headers_are_refused_naming_the_field() {
    refused(b"GGUX", &["does not start with `GGUF`"]);
    refused(
        &Header::new(1, 0, 0).data(0),
        &["version 1, expected 2 or 3"],
    );
    refused(
        &Header::new(3, u64::MAX, 0).data(0),
        &["18446744073709551615 tensors", "100000"],
    );
    refused(&Header::new(3, 0, 1 << 40).data(0), &["metadata pairs"]);
    // A key whose length runs past the file.
    refused(
        &Header::new(3, 0, 1).u64(1 << 62).data(0),
        &["more than the 65536"],
    );
    refused(
        &Header::new(3, 0, 1).u64(100).data(0),
        &["truncated", "a metadata key"],
    );
    // An array announcing more elements than bytes left, and arrays nested too deep.
    let array = Header::new(3, 0, 1).string("k").u32(9).u32(0).u64(u64::MAX);
    refused(&array.data(0), &["`k`", "array elements"]);
    let mut nested = Header::new(3, 0, 1).string("k").u32(9);
    for _ in 0..6 {
        nested = nested.u32(9).u64(1);
    }
    refused(&nested.data(0), &["nests arrays"]);
    refused(
        &Header::new(3, 0, 1).string("k").u32(13).data(0),
        &["value type 13"],
    );
    refused(
        &Header::new(3, 0, 1)
            .string("k")
            .u32(7)
            .bytes
            .iter()
            .copied()
            .chain([2])
            .collect::<Vec<_>>(),
        &["bool of byte 2"],
    );
    let zero_alignment = Header::new(3, 0, 1)
        .string("general.alignment")
        .u32(4)
        .u32(0);
    refused(&zero_alignment.data(0), &["general.alignment is 0"]);
    // Tensor infos.
    let one = |shape: &[u64], ty: u32, offset: u64, data: usize| {
        Header::new(3, 1, 0)
            .tensor("t", shape, ty, offset)
            .data(data)
    };
    refused(
        &one(&[2, 64], 12, 0, 0),
        &["`t`", "ggml type 12 (Q4_K)", "Q8_0"],
    );
    refused(
        &one(&[2, 48], 8, 0, 1000),
        &["`t`", "rows of 48 values", "32-value block"],
    );
    refused(&one(&[2, 64], 8, 0, 100), &["`t`", "needs 136 bytes"]);
    refused(
        &one(&[2, 64], 8, u64::MAX, 1000),
        &["`t`", "needs 136 bytes"],
    );
    refused(
        &one(&[u64::MAX, u64::MAX], 0, 0, 0),
        &["`t`", "too large to address"],
    );
    let deep = Header::new(3, 1, 0).string("t").u32(1000).data(0);
    refused(&deep, &["`t`", "1000 dimensions"]);
    let overlap = Header::new(3, 2, 0)
        .tensor("a", &[64], 0, 0)
        .tensor("b", &[64], 0, 128)
        .data(512);
    refused(&overlap, &["`b`", "overlap", "`a`"]);
    let twice = Header::new(3, 2, 0)
        .tensor("a", &[8], 0, 0)
        .tensor("a", &[8], 0, 32)
        .data(64);
    refused(&twice, &["`a` is listed twice"]);
}
