//! Cross-checks of `moshi_kernels` against the MLX fixtures of `assets/tiny-a`:
//! * quantizing the bf16 PyTorch weights of `model.safetensors` (as gen_mlx.py does: load,
//!   bf16, `nn.quantize`) reproduces every packed tensor of `model.q4/q8.safetensors` bit for bit;
//! * dequantization equals `ref/dequant.safetensors` (`dequant_f32` and MLX's native `dequant_bf16`);
//! * every kernel reproduces the `quantized_matmul` pairs `{q4,q8}.qmm.x` -> `.y_f32`.

use moshi_kernels::{Kernel, QuantizedMatrix};
use moshi_loader::{SafetensorsFile, TensorData};
use moshi_test_support::tiny_a;

/// tiny-a dimensions (MANIFEST.md): temporal layers, depformer layers, steps, codebooks.
const LAYERS: usize = 2;
const DEP_LAYERS: usize = 2;
const DEP_Q: usize = 8;
const N_Q: usize = 16;
const DEP_DIM: usize = 64;

/// An MLX packed tensor and where its unpacked values come from in the PyTorch checkpoint:
/// (MLX prefix, PyTorch name, first row, row count or 0 for all rows).
fn name_table() -> Vec<(String, String, usize, usize)> {
    let mut t = vec![
        ("text_emb".into(), "text_emb.weight".into(), 0, 0),
        ("text_linear".into(), "text_linear.weight".into(), 0, 0),
    ];
    for i in 0..N_Q {
        t.push((format!("audio_embs.{i}"), format!("emb.{i}.weight"), 0, 0));
    }
    for l in 0..LAYERS {
        let (m, p) = (
            format!("transformer.layers.{l}"),
            format!("transformer.layers.{l}"),
        );
        t.push((
            format!("{m}.self_attn.in_proj"),
            format!("{p}.self_attn.in_proj_weight"),
            0,
            0,
        ));
        t.push((
            format!("{m}.self_attn.out_proj"),
            format!("{p}.self_attn.out_proj.weight"),
            0,
            0,
        ));
        t.push((
            format!("{m}.gating.linear_in"),
            format!("{p}.gating.linear_in.weight"),
            0,
            0,
        ));
        t.push((
            format!("{m}.gating.linear_out"),
            format!("{p}.gating.linear_out.weight"),
            0,
            0,
        ));
    }
    for k in 0..DEP_Q {
        let s = format!("depformer.slices.{k}");
        let emb = if k == 0 {
            "depformer_text_emb.weight".to_string()
        } else {
            format!("depformer_emb.{}.weight", k - 1)
        };
        t.push((format!("{s}.emb"), emb, 0, 0));
        t.push((
            format!("{s}.linear_in"),
            format!("depformer_in.{k}.weight"),
            0,
            0,
        ));
        t.push((
            format!("{s}.linear_out"),
            format!("linears.{k}.weight"),
            0,
            0,
        ));
        for l in 0..DEP_LAYERS {
            let (m, p) = (
                format!("{s}.transformer.layers.{l}"),
                format!("depformer.layers.{l}"),
            );
            t.push((
                format!("{m}.self_attn.in_proj"),
                format!("{p}.self_attn.in_proj_weight"),
                k * 3 * DEP_DIM,
                3 * DEP_DIM,
            ));
            t.push((
                format!("{m}.self_attn.out_proj"),
                format!("{p}.self_attn.out_proj.weight"),
                k * DEP_DIM,
                DEP_DIM,
            ));
            t.push((
                format!("{m}.gating.linear_in"),
                format!("{p}.gating.{k}.linear_in.weight"),
                0,
                0,
            ));
            t.push((
                format!("{m}.gating.linear_out"),
                format!("{p}.gating.{k}.linear_out.weight"),
                0,
                0,
            ));
        }
    }
    t
}

fn u32s(f: &SafetensorsFile, name: &str) -> Vec<u32> {
    match f.read(name).unwrap().data {
        TensorData::U32(v) => v,
        other => panic!("{name}: expected U32, got {other:?}"),
    }
}

fn bf16s(f: &SafetensorsFile, name: &str) -> Vec<u16> {
    match f.read(name).unwrap().data {
        TensorData::BF16(v) => v,
        other => panic!("{name}: expected BF16, got {other:?}"),
    }
}

/// Loads the packed matrix `prefix` from an MLX file.
fn load_packed(f: &SafetensorsFile, prefix: &str, bits: u32, group_size: usize) -> QuantizedMatrix {
    let shape = f.info(&format!("{prefix}.weight")).unwrap().shape.clone();
    let (rows, cols) = (shape[0], shape[1] * 32 / bits as usize);
    let codes = u32s(f, &format!("{prefix}.weight"));
    let scales = bf16s(f, &format!("{prefix}.scales"));
    let biases = bf16s(f, &format!("{prefix}.biases"));
    QuantizedMatrix::new(rows, cols, bits, group_size, codes, scales, biases).unwrap()
}

fn check_quantize_reproduces(file: &str, bits: u32, group_size: usize) {
    let torch = SafetensorsFile::open(tiny_a("model.safetensors")).unwrap();
    let mlx = SafetensorsFile::open(tiny_a(file)).unwrap();
    let table = name_table();
    let packed_in_file = mlx
        .tensors()
        .keys()
        .filter(|k| k.ends_with(".scales"))
        .count();
    assert_eq!(
        table.len(),
        packed_in_file,
        "{file}: the name table must cover every packed tensor"
    );
    for (prefix, torch_name, first_row, row_count) in table {
        let expected = load_packed(&mlx, &prefix, bits, group_size);
        let t = torch.read(&torch_name).unwrap();
        let cols = t.shape[1];
        let all = t.to_f32().unwrap();
        let rows = if row_count == 0 {
            t.shape[0]
        } else {
            row_count
        };
        let values = &all[first_row * cols..(first_row + rows) * cols];
        let got = QuantizedMatrix::quantize(values, rows, cols, bits, group_size).unwrap();
        assert_eq!(
            (got.rows(), got.cols()),
            (expected.rows(), expected.cols()),
            "{file}: {prefix} shape"
        );
        assert!(
            got.scales() == expected.scales(),
            "{file}: {prefix}.scales differ from MLX"
        );
        assert!(
            got.biases() == expected.biases(),
            "{file}: {prefix}.biases differ from MLX"
        );
        let bad = got
            .codes()
            .iter()
            .zip(expected.codes())
            .filter(|(a, b)| a != b)
            .count();
        assert_eq!(
            bad,
            0,
            "{file}: {prefix}.weight: {bad} of {} code words differ from MLX",
            got.codes().len()
        );
    }
}

#[test]
fn quantize_reproduces_mlx_q4_file() {
    check_quantize_reproduces("model.q4.safetensors", 4, 32);
}

#[test]
fn quantize_reproduces_mlx_q8_file() {
    check_quantize_reproduces("model.q8.safetensors", 8, 64);
}

const QMM_WEIGHT: &str = "depformer.slices.0.transformer.layers.0.gating.linear_out";

#[test]
fn dequantization_matches_mlx_dequantize() {
    let refs = SafetensorsFile::open(tiny_a("ref/dequant.safetensors")).unwrap();
    for (q, bits, group_size) in [("q4", 4, 32), ("q8", 8, 64)] {
        let mlx = SafetensorsFile::open(tiny_a(&format!("model.{q}.safetensors"))).unwrap();
        for name in [
            "depformer.slices.1.emb",
            "depformer.slices.0.linear_out",
            QMM_WEIGHT,
        ] {
            let w = load_packed(&mlx, name, bits, group_size);
            let shape = [w.rows(), w.cols()];
            let want_f32 = refs
                .read_f32(&format!("{q}.{name}.dequant_f32"), &shape)
                .unwrap();
            let got_f32 = w.dequantize_f32();
            let f32_equal = got_f32
                .iter()
                .zip(&want_f32)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(f32_equal, "{q}.{name}: dequantize_f32 is not bit-exact");
            let want_bf16 = bf16s(&refs, &format!("{q}.{name}.dequant_bf16"));
            assert!(
                w.dequantize_bf16() == want_bf16,
                "{q}.{name}: dequantize_bf16 is not bit-exact"
            );
        }
    }
}

#[test]
fn kernels_match_mlx_quantized_matmul_f32() {
    let refs = SafetensorsFile::open(tiny_a("ref/dequant.safetensors")).unwrap();
    for (q, bits, group_size) in [("q4", 4, 32), ("q8", 8, 64)] {
        let mlx = SafetensorsFile::open(tiny_a(&format!("model.{q}.safetensors"))).unwrap();
        let w = load_packed(&mlx, QMM_WEIGHT, bits, group_size);
        let m = 2;
        let x = refs
            .read_f32(&format!("{q}.qmm.x"), &[m, w.cols()])
            .unwrap();
        let want = refs
            .read_f32(&format!("{q}.qmm.y_f32"), &[m, w.rows()])
            .unwrap();
        // MLX's own f32 result is within 5e-7 of a float64 product (MANIFEST); outputs are O(1).
        let tol = 2e-6;
        let mut got = vec![0f32; m * w.rows()];
        w.matmul_reference(&x, m, &mut got);
        let err = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(err < tol, "{q}: reference qmm differs from MLX by {err}");
        for kernel in Kernel::available() {
            w.matmul_with_kernel(kernel, &x, m, &mut got).unwrap();
            let err = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                err < tol,
                "{q}: {} kernel differs from MLX quantized_matmul by {err}",
                kernel.name()
            );
        }
        let mut row = vec![0f32; w.rows()];
        w.matvec(&x[..w.cols()], &mut row);
        let err = row
            .iter()
            .zip(&want[..w.rows()])
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(err < tol, "{q}: matvec differs from MLX by {err}");
    }
}
