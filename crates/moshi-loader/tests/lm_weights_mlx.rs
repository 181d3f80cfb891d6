//! Loads the tiny-a MLX q4/q8 release checkpoints: canonical names, bits/group derived from
//! shapes, and dequantization bit-exact against `mx.dequantize` (ref/dequant.safetensors).

mod common;

use common::{asset, tiny_config};
use moshi_loader::lm_names::canonical_lm_tensors;
use moshi_loader::{
    load_lm_weights, SafetensorsFile, TensorData, WeightData, WeightMap, WeightMode,
};

fn load(file: &str, mode: WeightMode) -> WeightMap {
    load_lm_weights(&asset(file), &tiny_config(), mode).unwrap()
}

#[test]
fn mlx_q4_and_q8_load_to_the_pytorch_name_set_with_the_same_shapes() {
    let cfg = tiny_config();
    let pytorch = load("model.safetensors", WeightMode::Native);
    for (file, bits, group) in [
        ("model.q4.safetensors", 4, 32),
        ("model.q8.safetensors", 8, 64),
    ] {
        let mlx = load(file, WeightMode::Native);
        assert_eq!(
            mlx.names().collect::<Vec<_>>(),
            pytorch.names().collect::<Vec<_>>(),
            "{file}"
        );
        for t in canonical_lm_tensors(&cfg) {
            let w = mlx.get(&t.name).unwrap();
            assert_eq!(w.shape, t.shape, "{file} {}", t.name);
            match &w.data {
                WeightData::Quantized(q) => {
                    assert_eq!(
                        (q.bits(), q.group_size()),
                        (bits, group),
                        "{file} {}",
                        t.name
                    );
                    assert_eq!(
                        (q.rows(), q.cols()),
                        (t.shape[0], t.shape[1]),
                        "{file} {}",
                        t.name
                    );
                }
                WeightData::F32(v) => {
                    assert_eq!(
                        t.shape.len(),
                        1,
                        "{file} {}: only norms are dense in a packed MLX file",
                        t.name
                    );
                    assert_eq!(v.len(), t.shape[0]);
                }
                WeightData::BF16(_) => panic!("{file} {}: unexpected bf16", t.name),
            }
        }
    }
}

#[test]
fn mlx_quantized_weights_approximate_the_pytorch_weights() {
    // Same random model, quantized: q8 must sit much closer to the bf16 weights than q4.
    let pytorch = load("model.safetensors", WeightMode::DequantizeF32);
    let max_err = |file: &str| {
        let mlx = load(file, WeightMode::DequantizeF32);
        let mut worst = 0f32;
        for name in pytorch.names() {
            let (a, b) = (
                pytorch.get(name).unwrap().to_f32(),
                mlx.get(name).unwrap().to_f32(),
            );
            let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
            let err = a
                .iter()
                .zip(&b)
                .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            worst = worst.max(err / scale);
        }
        worst
    };
    let (q4, q8) = (
        max_err("model.q4.safetensors"),
        max_err("model.q8.safetensors"),
    );
    assert!(q8 < 0.02, "q8 relative error {q8}");
    assert!(q4 < 0.2, "q4 relative error {q4}");
    assert!(q8 < q4 / 4.0, "q8 {q8} vs q4 {q4}");
}

#[test]
fn mlx_dequantization_is_bit_exact_against_mlx() {
    let reference = SafetensorsFile::open(asset("ref/dequant.safetensors")).unwrap();
    let entries = [
        ("depformer.slices.1.emb", "depformer.1.emb"),
        ("depformer.slices.0.linear_out", "depformer.0.linear_out"),
        (
            "depformer.slices.0.transformer.layers.0.gating.linear_out",
            "depformer.0.layers.0.gating.linear_out",
        ),
    ];
    for q in ["q4", "q8"] {
        let native = load(&format!("model.{q}.safetensors"), WeightMode::Native);
        let dequantized = load(&format!("model.{q}.safetensors"), WeightMode::DequantizeF32);
        let as_bf16 = load(
            &format!("model.{q}.safetensors"),
            WeightMode::DequantizeBf16,
        );
        for (mlx_name, canonical) in entries {
            let want_f32 = reference
                .read(&format!("{q}.{mlx_name}.dequant_f32"))
                .unwrap();
            let want_bf16 = reference
                .read(&format!("{q}.{mlx_name}.dequant_bf16"))
                .unwrap();
            let WeightData::Quantized(m) = &native.get(canonical).unwrap().data else {
                panic!("{canonical} not packed")
            };
            let got_f32 = dequantized.get(canonical).unwrap().to_f32();
            let (TensorData::F32(want_f32_v), TensorData::BF16(want_bf16_v)) =
                (&want_f32.data, &want_bf16.data)
            else {
                panic!("reference dtypes")
            };
            assert_eq!(want_f32.shape, vec![m.rows(), m.cols()]);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got_f32), bits(want_f32_v), "{q} {mlx_name} f32");
            assert_eq!(
                bits(&m.dequantize_f32()),
                bits(want_f32_v),
                "{q} {mlx_name} f32 (packed)"
            );
            assert_eq!(&m.dequantize_bf16(), want_bf16_v, "{q} {mlx_name} bf16");
            let WeightData::BF16(got_bf16) = &as_bf16.get(canonical).unwrap().data else {
                panic!("{canonical} not bf16")
            };
            assert_eq!(
                got_bf16, want_bf16_v,
                "{q} {mlx_name} bf16 (DequantizeBf16 mode)"
            );
        }
    }
}
