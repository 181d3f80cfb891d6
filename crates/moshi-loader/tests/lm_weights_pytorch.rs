//! Loads the tiny-a PyTorch release checkpoint and checks the canonical mapping tensor by tensor.

mod common;

use common::{asset, tiny_config};
use moshi_loader::lm_names::canonical_lm_tensors;
use moshi_loader::{load_lm_weights, SafetensorsFile, WeightData, WeightMode};

fn bf16_rows(file: &SafetensorsFile, name: &str, row_start: usize, rows: usize) -> Vec<f32> {
    let t = file.read(name).unwrap();
    let row_elems: usize = t.shape[1..].iter().product();
    t.to_f32().unwrap()[row_start * row_elems..(row_start + rows) * row_elems].to_vec()
}

#[test]
fn pytorch_release_loads_every_canonical_tensor_with_its_shape() {
    let cfg = tiny_config();
    let map = load_lm_weights(&asset("model.safetensors"), &cfg, WeightMode::Native).unwrap();
    let expected = canonical_lm_tensors(&cfg);
    assert_eq!(map.len(), expected.len());
    for t in &expected {
        let w = map
            .get(&t.name)
            .unwrap_or_else(|| panic!("missing {}", t.name));
        assert_eq!(w.shape, t.shape, "{}", t.name);
        let is_norm =
            t.name.ends_with("norm") || t.name.ends_with("norm1") || t.name.ends_with("norm2");
        match (&w.data, is_norm) {
            (WeightData::F32(v), true) => assert_eq!(v.len(), t.shape.iter().product::<usize>()),
            (WeightData::BF16(v), false) => assert_eq!(v.len(), t.shape.iter().product::<usize>()),
            (other, _) => panic!(
                "{}: unexpected storage {:?}",
                t.name,
                std::mem::discriminant(other)
            ),
        }
    }
}

#[test]
fn pytorch_stacked_depformer_tensors_are_cut_per_step() {
    let cfg = tiny_config();
    let file = SafetensorsFile::open(asset("model.safetensors")).unwrap();
    let map =
        load_lm_weights(&asset("model.safetensors"), &cfg, WeightMode::DequantizeF32).unwrap();
    let ddim = cfg.depformer_dim;
    for k in [0, 3, 7] {
        for l in 0..cfg.depformer_num_layers {
            let p = format!("depformer.layers.{l}");
            let q = format!("depformer.{k}.layers.{l}");
            let in_proj = map.get(&format!("{q}.self_attn.in_proj")).unwrap().to_f32();
            assert_eq!(
                in_proj,
                bf16_rows(
                    &file,
                    &format!("{p}.self_attn.in_proj_weight"),
                    k * 3 * ddim,
                    3 * ddim
                )
            );
            let out_proj = map
                .get(&format!("{q}.self_attn.out_proj"))
                .unwrap()
                .to_f32();
            assert_eq!(
                out_proj,
                bf16_rows(
                    &file,
                    &format!("{p}.self_attn.out_proj.weight"),
                    k * ddim,
                    ddim
                )
            );
            let gate = map.get(&format!("{q}.gating.linear_out")).unwrap().to_f32();
            assert_eq!(
                gate,
                file.read(&format!("{p}.gating.{k}.linear_out.weight"))
                    .unwrap()
                    .to_f32()
                    .unwrap()
            );
            // Shared norms are copied into every step.
            let norm = map.get(&format!("{q}.norm2")).unwrap().to_f32();
            assert_eq!(
                norm,
                file.read(&format!("{p}.norm2.alpha"))
                    .unwrap()
                    .to_f32()
                    .unwrap()
            );
        }
        let emb = map.get(&format!("depformer.{k}.emb")).unwrap().to_f32();
        let stored = if k == 0 {
            "depformer_text_emb.weight".to_string()
        } else {
            format!("depformer_emb.{}.weight", k - 1)
        };
        assert_eq!(emb, file.read(&stored).unwrap().to_f32().unwrap());
        let head = map
            .get(&format!("depformer.{k}.linear_out"))
            .unwrap()
            .to_f32();
        assert_eq!(
            head,
            file.read(&format!("linears.{k}.weight"))
                .unwrap()
                .to_f32()
                .unwrap()
        );
    }
    // Different steps really get different rows.
    let a = map
        .get("depformer.0.layers.0.self_attn.in_proj")
        .unwrap()
        .to_f32();
    let b = map
        .get("depformer.1.layers.0.self_attn.in_proj")
        .unwrap()
        .to_f32();
    assert_ne!(a, b);
}

#[test]
fn native_and_dequantized_modes_agree_exactly() {
    let cfg = tiny_config();
    let native = load_lm_weights(&asset("model.safetensors"), &cfg, WeightMode::Native).unwrap();
    let f32s =
        load_lm_weights(&asset("model.safetensors"), &cfg, WeightMode::DequantizeF32).unwrap();
    for name in native.names() {
        let w = f32s.get(name).unwrap();
        assert!(matches!(w.data, WeightData::F32(_)), "{name}");
        assert_eq!(native.get(name).unwrap().to_f32(), w.to_f32(), "{name}");
    }
}
