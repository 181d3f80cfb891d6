//! The candle release layout and the dense MLX layout, written from the PyTorch fixtures (tiny-a,
//! and tiny-hibiki with its conditioner) with the official `safetensors` crate, load to values
//! equal to the PyTorch ones.

mod common;

use std::path::{Path, PathBuf};

use common::{
    asset, copy_all, hibiki_asset, hibiki_config, tiny_config, write_safetensors, RawTensor,
};
use moshi_loader::inspect::{inspect_checkpoint, ConfigRef};
use moshi_loader::layout::detect_kind;
use moshi_loader::mlx_export::write_mlx_quantized;
use moshi_loader::{
    load_lm_weights, CheckpointKind, LmConfig, LmLayout, SafetensorsFile, WeightData, WeightMode,
};

/// Re-lays the PyTorch depformer per slice, as Kyutai's `import_rust.py` does (conditioner
/// tensors keep their names).
fn candle_tensors(pt: &SafetensorsFile, cfg: &LmConfig) -> Vec<RawTensor> {
    let ddim = cfg.depformer_dim;
    let mut out = copy_all(pt, |n| {
        let dep = n.starts_with("depformer") || n.starts_with("linears.");
        (!dep).then(|| n.to_string())
    });
    for k in 0..cfg.dep_q {
        out.push(RawTensor::copy(
            pt,
            &format!("depformer_in.{k}.weight"),
            &format!("depformer.{k}.linear_in.weight"),
        ));
        out.push(RawTensor::copy(
            pt,
            &format!("linears.{k}.weight"),
            &format!("depformer.{k}.linear_out.weight"),
        ));
        let emb = if k == 0 {
            "depformer_text_emb.weight".to_string()
        } else {
            format!("depformer_emb.{}.weight", k - 1)
        };
        out.push(RawTensor::copy(
            pt,
            &emb,
            &format!("depformer.{k}.emb.weight"),
        ));
        for l in 0..cfg.depformer_num_layers {
            let (src, dst) = (
                format!("depformer.layers.{l}"),
                format!("depformer.{k}.transformer.layers.{l}"),
            );
            for norm in ["norm1", "norm2"] {
                out.push(RawTensor::copy(
                    pt,
                    &format!("{src}.{norm}.alpha"),
                    &format!("{dst}.{norm}.alpha"),
                ));
            }
            let name = format!("{src}.self_attn.in_proj_weight");
            out.push(RawTensor::rows(
                pt,
                &name,
                &format!("{dst}.self_attn.in_proj_weight"),
                k * 3 * ddim,
                3 * ddim,
            ));
            let name = format!("{src}.self_attn.out_proj.weight");
            out.push(RawTensor::rows(
                pt,
                &name,
                &format!("{dst}.self_attn.out_proj.weight"),
                k * ddim,
                ddim,
            ));
            for lin in ["linear_in", "linear_out"] {
                out.push(RawTensor::copy(
                    pt,
                    &format!("{src}.gating.{k}.{lin}.weight"),
                    &format!("{dst}.gating.{lin}.weight"),
                ));
            }
        }
    }
    out
}

/// Renames candle tensors into the MLX scheme (dense bf16, like `kyutai/moshiko-mlx-bf16`).
fn mlx_dense_tensors(candle: Vec<RawTensor>) -> Vec<RawTensor> {
    candle
        .into_iter()
        .map(|mut t| {
            let mut n = t.name.replace("in_proj_weight", "in_proj.weight");
            if let Some(r) = n.strip_prefix("emb.") {
                n = format!("audio_embs.{r}");
            }
            if let Some(r) = n.strip_prefix("depformer.") {
                n = format!("depformer.slices.{r}");
            }
            if let Some(base) = n.strip_suffix(".alpha") {
                n = format!("{base}.weight");
                t.shape = vec![t.shape[2]];
            }
            t.name = n;
            t
        })
        .collect()
}

/// Writes the PyTorch checkpoint `pt_path` re-laid as the candle release and as the dense MLX
/// release into `dir`; returns their paths.
fn write_relaid(pt_path: &Path, cfg: &LmConfig, dir: &Path) -> (PathBuf, PathBuf) {
    let pt = SafetensorsFile::open(pt_path).unwrap();
    let candle_path = dir.join("candle.safetensors");
    let mlx_path = dir.join("mlx-bf16.safetensors");
    let candle = candle_tensors(&pt, cfg);
    write_safetensors(&candle_path, &candle);
    write_safetensors(&mlx_path, &mlx_dense_tensors(candle));
    (candle_path, mlx_path)
}

#[test]
fn candle_and_dense_mlx_layouts_load_to_the_pytorch_values() {
    let cfg = tiny_config();
    let pt_path = asset("model.safetensors");
    let dir = tempfile::tempdir().unwrap();
    let (candle_path, mlx_path) = write_relaid(&pt_path, &cfg, dir.path());

    assert_eq!(
        detect_kind(&SafetensorsFile::open(&pt_path).unwrap()).unwrap(),
        CheckpointKind::Lm(LmLayout::PyTorch)
    );
    assert_eq!(
        detect_kind(&SafetensorsFile::open(&candle_path).unwrap()).unwrap(),
        CheckpointKind::Lm(LmLayout::Candle)
    );
    assert_eq!(
        detect_kind(&SafetensorsFile::open(&mlx_path).unwrap()).unwrap(),
        CheckpointKind::Lm(LmLayout::Mlx)
    );

    for (path, format) in [(&candle_path, "candle"), (&mlx_path, "mlx")] {
        let report = inspect_checkpoint(path, Some(ConfigRef::Lm(&cfg))).unwrap();
        assert_eq!(report.format, format);
        assert!(report.quantization.is_empty());
        let check = report.config_check.unwrap();
        assert!(check.is_clean(), "{format}: {check:?}");
    }

    for mode in [
        WeightMode::Native,
        WeightMode::DequantizeF32,
        WeightMode::DequantizeBf16,
    ] {
        let want = load_lm_weights(&pt_path, &cfg, mode).unwrap();
        for path in [&candle_path, &mlx_path] {
            let got = load_lm_weights(path, &cfg, mode).unwrap();
            assert_eq!(
                got.names().collect::<Vec<_>>(),
                want.names().collect::<Vec<_>>()
            );
            for name in want.names() {
                let (a, b) = (want.get(name).unwrap(), got.get(name).unwrap());
                assert_eq!(a.shape, b.shape, "{name}");
                assert_eq!(
                    std::mem::discriminant(&a.data),
                    std::mem::discriminant(&b.data),
                    "{name}"
                );
                assert_eq!(a.to_f32(), b.to_f32(), "{} {name}", path.display());
            }
        }
    }
}

/// Every tensor of `path`: name -> (dtype, shape, raw bytes).
fn all_tensors(path: &std::path::Path) -> Vec<(String, String, Vec<usize>, Vec<u8>)> {
    let f = SafetensorsFile::open(path).unwrap();
    let mut v: Vec<_> = f
        .tensors()
        .iter()
        .map(|(n, i)| {
            (
                n.clone(),
                i.dtype.to_string(),
                i.shape.clone(),
                f.bytes(n).unwrap().to_vec(),
            )
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[test]
fn every_dense_layout_quantizes_and_exports_to_the_mlx_release_file() {
    let cfg = tiny_config();
    let pt_path = asset("model.safetensors");
    let dir = tempfile::tempdir().unwrap();
    let (candle_path, mlx_path) = write_relaid(&pt_path, &cfg, dir.path());
    for (release, bits, group_size) in [
        ("model.q4.safetensors", 4, 32),
        ("model.q8.safetensors", 8, 64),
    ] {
        let want = all_tensors(&asset(release));
        for input in [&pt_path, &candle_path, &mlx_path] {
            let weights =
                load_lm_weights(input, &cfg, WeightMode::Quantize { bits, group_size }).unwrap();
            let out = dir.path().join(format!("out.q{bits}.safetensors"));
            write_mlx_quantized(&weights, &cfg, &out).unwrap();
            let got = all_tensors(&out);
            assert_eq!(
                got.len(),
                want.len(),
                "{} -> {release}: tensor count",
                input.display()
            );
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(
                    (&g.0, &g.1, &g.2),
                    (&w.0, &w.1, &w.2),
                    "{} -> {release}",
                    input.display()
                );
                assert!(
                    g.3 == w.3,
                    "{} -> {release}: bytes of {} differ",
                    input.display(),
                    w.0
                );
            }
        }
    }
}

#[test]
fn exporting_unquantized_weights_is_refused_and_writes_nothing() {
    let cfg = tiny_config();
    let weights = load_lm_weights(&asset("model.safetensors"), &cfg, WeightMode::Native).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.safetensors");
    let err = write_mlx_quantized(&weights, &cfg, &out)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("text_emb") && err.contains("not quantized"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing half-written"
    );
}

#[test]
fn hibiki_conditioner_loads_from_every_layout_and_stays_f32_when_quantized() {
    let cfg = hibiki_config();
    let pt_path = hibiki_asset("model.safetensors");
    let dir = tempfile::tempdir().unwrap();
    let (candle_path, mlx_path) = write_relaid(&pt_path, &cfg, dir.path());
    let conditioner = [
        "condition_provider.conditioners.description.embed",
        "condition_provider.conditioners.description.output_proj",
        "condition_provider.conditioners.description.learnt_padding",
    ];
    let want = load_lm_weights(&pt_path, &cfg, WeightMode::Native).unwrap();
    for (name, shape) in conditioner
        .iter()
        .zip([vec![32, 16], vec![256, 16], vec![256]])
    {
        let w = want.get(name).unwrap();
        assert_eq!(w.shape, shape, "{name}");
        assert!(matches!(w.data, WeightData::F32(_)), "{name} is f32");
    }
    for (path, format) in [
        (&pt_path, "pytorch"),
        (&candle_path, "candle"),
        (&mlx_path, "mlx"),
    ] {
        let report = inspect_checkpoint(path, Some(ConfigRef::Lm(&cfg))).unwrap();
        assert_eq!(report.format, format);
        let check = report.config_check.unwrap();
        assert!(check.is_clean(), "{format}: {check:?}");
        let got = load_lm_weights(path, &cfg, WeightMode::Native).unwrap();
        assert_eq!(
            got.names().collect::<Vec<_>>(),
            want.names().collect::<Vec<_>>()
        );
        for name in want.names() {
            assert_eq!(
                want.get(name).unwrap().to_f32(),
                got.get(name).unwrap().to_f32(),
                "{format} {name}"
            );
        }
    }

    // Quantized at load: every matrix but the conditioner's; exported and read back as packed.
    for (bits, group_size) in [(4, 32), (8, 64)] {
        let mode = WeightMode::Quantize { bits, group_size };
        let q = load_lm_weights(&mlx_path, &cfg, mode).unwrap();
        for name in conditioner {
            assert_eq!(
                q.get(name).unwrap().to_f32(),
                want.get(name).unwrap().to_f32(),
                "{name}"
            );
            assert!(
                matches!(q.get(name).unwrap().data, WeightData::F32(_)),
                "{name}"
            );
        }
        assert!(matches!(
            q.get("text_emb").unwrap().data,
            WeightData::Quantized(_)
        ));
        let out = dir.path().join(format!("model.q{bits}.safetensors"));
        write_mlx_quantized(&q, &cfg, &out).unwrap();
        let file = SafetensorsFile::open(&out).unwrap();
        let padding = file
            .info("condition_provider.conditioners.description.learnt_padding")
            .unwrap();
        assert_eq!(padding.shape, vec![1, 1, 256]);
        let report = inspect_checkpoint(&out, Some(ConfigRef::Lm(&cfg))).unwrap();
        assert!(report.config_check.unwrap().is_clean());
        let back = load_lm_weights(&out, &cfg, WeightMode::Native).unwrap();
        for name in q.names() {
            assert_eq!(
                back.get(name).unwrap().to_f32(),
                q.get(name).unwrap().to_f32(),
                "{name}"
            );
        }
    }
}

#[test]
fn a_conditioner_missing_from_the_checkpoint_or_the_config_is_an_error_naming_it() {
    let hibiki = hibiki_config();
    // The Moshi config has no conditioner: the checkpoint's conditioner tensors are unexpected.
    let mut moshi_like = hibiki.clone();
    moshi_like.conditioners.clear();
    moshi_like.fuser = None;
    let err = load_lm_weights(
        &hibiki_asset("model.safetensors"),
        &moshi_like,
        WeightMode::Native,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("condition_provider"), "{err}");
    // A conditioned config on a checkpoint without the tensors names the missing one.
    let mut conditioned = tiny_config();
    conditioned.conditioners = hibiki.conditioners.clone();
    conditioned.fuser = hibiki.fuser.clone();
    let err = load_lm_weights(
        &asset("model.safetensors"),
        &conditioned,
        WeightMode::Native,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("condition_provider.conditioners.description."),
        "{err}"
    );
}
