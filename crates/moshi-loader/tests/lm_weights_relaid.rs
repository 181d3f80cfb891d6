//! The candle release layout and the dense MLX layout, written from the PyTorch fixture with the
//! official `safetensors` crate, load to values equal to the PyTorch ones.

mod common;

use common::{asset, copy_all, tiny_config, write_safetensors, RawTensor};
use moshi_loader::inspect::{inspect_checkpoint, ConfigRef};
use moshi_loader::layout::detect_kind;
use moshi_loader::mlx_export::write_mlx_quantized;
use moshi_loader::{load_lm_weights, CheckpointKind, LmLayout, SafetensorsFile, WeightMode};

/// Re-lays the PyTorch depformer per slice, as Kyutai's `import_rust.py` does.
fn candle_tensors(pt: &SafetensorsFile) -> Vec<RawTensor> {
    let cfg = tiny_config();
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

#[test]
fn candle_and_dense_mlx_layouts_load_to_the_pytorch_values() {
    let cfg = tiny_config();
    let pt_path = asset("model.safetensors");
    let pt = SafetensorsFile::open(&pt_path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let candle_path = dir.path().join("candle.safetensors");
    let mlx_path = dir.path().join("mlx-bf16.safetensors");
    let candle = candle_tensors(&pt);
    write_safetensors(&candle_path, &candle);
    write_safetensors(&mlx_path, &mlx_dense_tensors(candle));

    assert_eq!(
        detect_kind(&pt).unwrap(),
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
    let pt = SafetensorsFile::open(&pt_path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let candle_path = dir.path().join("candle.safetensors");
    let mlx_path = dir.path().join("mlx-bf16.safetensors");
    let candle = candle_tensors(&pt);
    write_safetensors(&candle_path, &candle);
    write_safetensors(&mlx_path, &mlx_dense_tensors(candle));
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
