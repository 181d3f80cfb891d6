//! `WeightMode::Quantize`: quantizing the dense tiny-a checkpoint at load time gives exactly the
//! packed matrices of the MLX release files (codes, scales, biases), norms stay f32, and packed
//! files asked for other parameters are refused with the stored and requested values.

mod common;

use common::{asset, tiny_config};
use moshi_loader::lm_names::{canonical_lm_tensors, TensorRole};
use moshi_loader::{load_lm_weights, WeightData, WeightMode};

fn check_quantize_on_load_equals_packed_file(file: &str, bits: u32, group_size: usize) {
    let cfg = tiny_config();
    let mode = WeightMode::Quantize { bits, group_size };
    let quantized = load_lm_weights(&asset("model.safetensors"), &cfg, mode).unwrap();
    let packed = load_lm_weights(&asset(file), &cfg, WeightMode::Native).unwrap();
    let tensors = canonical_lm_tensors(&cfg);
    assert_eq!(quantized.len(), tensors.len());
    for t in tensors {
        let (got, want) = (
            quantized.get(&t.name).unwrap(),
            packed.get(&t.name).unwrap(),
        );
        assert_eq!(got.shape, want.shape, "{file} {}", t.name);
        match (&got.data, &want.data, t.role) {
            (
                WeightData::Quantized(g),
                WeightData::Quantized(w),
                TensorRole::Linear | TensorRole::Embedding,
            ) => {
                assert_eq!((g.bits(), g.group_size()), (bits, group_size), "{}", t.name);
                assert_eq!(
                    (g.rows(), g.cols()),
                    (w.rows(), w.cols()),
                    "{file} {}",
                    t.name
                );
                assert!(
                    g.codes() == w.codes(),
                    "{file} {}: codes differ from MLX",
                    t.name
                );
                assert!(
                    g.scales() == w.scales(),
                    "{file} {}: scales differ from MLX",
                    t.name
                );
                assert!(
                    g.biases() == w.biases(),
                    "{file} {}: biases differ from MLX",
                    t.name
                );
            }
            (WeightData::F32(g), WeightData::F32(w), TensorRole::Norm) => {
                assert!(
                    g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{file} {}",
                    t.name
                );
            }
            (g, w, role) => {
                panic!(
                    "{file} {} ({role:?}): quantize-on-load gave {}, the packed file {}",
                    t.name,
                    kind(g),
                    kind(w)
                )
            }
        }
    }
}

fn kind(d: &WeightData) -> &'static str {
    match d {
        WeightData::F32(_) => "F32",
        WeightData::BF16(_) => "BF16",
        WeightData::Quantized(_) => "Quantized",
    }
}

#[test]
fn quantize_q4_on_load_equals_mlx_q4_file() {
    check_quantize_on_load_equals_packed_file("model.q4.safetensors", 4, 32);
}

#[test]
fn quantize_q8_on_load_equals_mlx_q8_file() {
    check_quantize_on_load_equals_packed_file("model.q8.safetensors", 8, 64);
}

#[test]
fn packed_file_with_the_requested_parameters_loads_natively() {
    let cfg = tiny_config();
    let a = load_lm_weights(
        &asset("model.q8.safetensors"),
        &cfg,
        WeightMode::Quantize {
            bits: 8,
            group_size: 64,
        },
    )
    .unwrap();
    let b = load_lm_weights(&asset("model.q8.safetensors"), &cfg, WeightMode::Native).unwrap();
    for t in canonical_lm_tensors(&cfg) {
        match (&a.get(&t.name).unwrap().data, &b.get(&t.name).unwrap().data) {
            (WeightData::Quantized(x), WeightData::Quantized(y)) => {
                assert!(x.codes() == y.codes(), "{}", t.name)
            }
            (WeightData::F32(x), WeightData::F32(y)) => assert_eq!(x, y, "{}", t.name),
            _ => panic!("{}: different kinds", t.name),
        }
    }
}

#[test]
fn packed_file_with_other_parameters_is_refused_naming_both() {
    let cfg = tiny_config();
    let err = load_lm_weights(
        &asset("model.q8.safetensors"),
        &cfg,
        WeightMode::Quantize {
            bits: 4,
            group_size: 32,
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("model.q8.safetensors"), "{err}");
    assert!(err.contains("stored as 8-bit, group size 64"), "{err}");
    assert!(err.contains("requested 4-bit, group size 32"), "{err}");
}

#[test]
fn unsupported_quantization_parameters_are_refused() {
    let cfg = tiny_config();
    let err = load_lm_weights(
        &asset("model.safetensors"),
        &cfg,
        WeightMode::Quantize {
            bits: 4,
            group_size: 48,
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("model.safetensors") && err.contains("group size 48"),
        "{err}"
    );
}

#[test]
fn default_group_sizes_follow_the_mlx_releases() {
    assert_eq!(WeightMode::default_group_size(4), 32);
    assert_eq!(WeightMode::default_group_size(8), 64);
}
