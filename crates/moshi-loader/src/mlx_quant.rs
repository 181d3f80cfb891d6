//! MLX-affine packed tensors in a checkpoint: bits and group size derived from the shapes of
//! `.weight` (U32), `.scales` and `.biases`, cross-checked, then built into a `QuantizedMatrix`.

use std::path::Path;

use moshi_kernels::{QuantizedMatrix, SUPPORTED_BITS, SUPPORTED_GROUP_SIZES};

use crate::{DType, LoaderError, Result, SafetensorsFile, TensorData};

/// Bit width and group size of one packed matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QuantParams {
    pub bits: u32,
    pub group_size: usize,
}

/// True when `{prefix}.weight` is a packed MLX matrix: U32 codes (a weight is never stored as
/// U32 otherwise), or a `.scales` sibling. Its `.scales` and `.biases` may still be missing:
/// [`derive_quant_params`] then names the missing tensor.
pub fn is_packed(file: &SafetensorsFile, prefix: &str) -> bool {
    file.tensors()
        .get(&format!("{prefix}.weight"))
        .is_some_and(|i| i.dtype == DType::U32)
        || (file.contains(&format!("{prefix}.weight"))
            && file.contains(&format!("{prefix}.scales")))
}

/// Derives bits (`32 * packed_cols / in_dim`) and group size (`in_dim / scale_cols`) of the packed
/// matrix `{prefix}` holding `rows` x `in_dim` values, checking every shape and dtype.
pub fn derive_quant_params(
    file: &SafetensorsFile,
    prefix: &str,
    rows: usize,
    in_dim: usize,
) -> Result<QuantParams> {
    let path = file.path();
    let bad = |reason: String| LoaderError::BadQuantized {
        path: path.to_path_buf(),
        name: prefix.to_string(),
        reason,
    };
    let codes = file.info(&format!("{prefix}.weight"))?;
    let scales = file.info(&format!("{prefix}.scales"))?;
    let biases = file.info(&format!("{prefix}.biases"))?;
    if codes.dtype != DType::U32 {
        return Err(bad(format!(
            "`.weight` has dtype {}, expected U32",
            codes.dtype
        )));
    }
    for (what, info) in [("scales", scales), ("biases", biases)] {
        if info.dtype != DType::BF16 {
            return Err(bad(format!(
                "`.{what}` has dtype {}, expected BF16",
                info.dtype
            )));
        }
    }
    if codes.shape.len() != 2 || codes.shape[0] != rows {
        return Err(bad(format!(
            "`.weight` has shape {:?}, expected [{rows}, packed columns]",
            codes.shape
        )));
    }
    if scales.shape.len() != 2 || scales.shape[0] != rows {
        return Err(bad(format!(
            "`.scales` has shape {:?}, expected [{rows}, groups]",
            scales.shape
        )));
    }
    if biases.shape != scales.shape {
        return Err(bad(format!(
            "`.biases` has shape {:?}, expected the shape of `.scales` {:?}",
            biases.shape, scales.shape
        )));
    }
    quant_params_from_shapes(codes.shape[1], scales.shape[1], in_dim).map_err(bad)
}

/// The pure shape arithmetic of [`derive_quant_params`]; the error text names expected and got.
pub fn quant_params_from_shapes(
    packed_cols: usize,
    scale_cols: usize,
    in_dim: usize,
) -> std::result::Result<QuantParams, String> {
    let supported_bits = || {
        SUPPORTED_BITS
            .iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if in_dim == 0 || !(32 * packed_cols).is_multiple_of(in_dim) {
        return Err(format!(
            "{packed_cols} packed u32 columns for an input width of {in_dim} give 32*{packed_cols}/{in_dim} = {:.3} bits, \
             expected a whole number of bits in {{{}}}",
            32.0 * packed_cols as f64 / in_dim.max(1) as f64,
            supported_bits()
        ));
    }
    let bits = (32 * packed_cols / in_dim) as u32;
    if !SUPPORTED_BITS.contains(&bits) {
        return Err(format!(
            "{packed_cols} packed u32 columns for an input width of {in_dim} give {bits} bits, expected one of {{{}}}",
            supported_bits()
        ));
    }
    if scale_cols == 0 || !in_dim.is_multiple_of(scale_cols) {
        return Err(format!(
            "{scale_cols} scale columns do not divide the input width {in_dim}: expected in_dim / group_size with a group \
             size in {SUPPORTED_GROUP_SIZES:?}"
        ));
    }
    let group_size = in_dim / scale_cols;
    if !SUPPORTED_GROUP_SIZES.contains(&group_size) {
        return Err(format!(
            "input width {in_dim} / {scale_cols} scale columns gives a group size of {group_size}, expected one of \
             {SUPPORTED_GROUP_SIZES:?}"
        ));
    }
    // Cross-check: the derived pair must reproduce both stored widths exactly.
    if in_dim * bits as usize != 32 * packed_cols || in_dim / group_size != scale_cols {
        return Err(format!("bits {bits} / group size {group_size} do not reproduce {packed_cols} packed and {scale_cols} scale columns"));
    }
    Ok(QuantParams { bits, group_size })
}

fn words(file: &SafetensorsFile, name: &str) -> Result<Vec<u32>> {
    match file.read(name)?.data {
        TensorData::U32(v) => Ok(v),
        _ => unreachable_dtype(file.path(), name, "U32"),
    }
}

fn halves(file: &SafetensorsFile, name: &str) -> Result<Vec<u16>> {
    match file.read(name)?.data {
        TensorData::BF16(v) => Ok(v),
        _ => unreachable_dtype(file.path(), name, "BF16"),
    }
}

fn unreachable_dtype<T>(path: &Path, name: &str, expected: &str) -> Result<T> {
    Err(LoaderError::DTypeMismatch {
        path: path.to_path_buf(),
        name: name.to_string(),
        expected: expected.into(),
        got: "another dtype".into(),
    })
}

/// Reads the packed matrix `{prefix}` (`rows` x `in_dim` logical values).
pub fn read_quantized(
    file: &SafetensorsFile,
    prefix: &str,
    rows: usize,
    in_dim: usize,
) -> Result<QuantizedMatrix> {
    let p = derive_quant_params(file, prefix, rows, in_dim)?;
    let codes = words(file, &format!("{prefix}.weight"))?;
    let scales = halves(file, &format!("{prefix}.scales"))?;
    let biases = halves(file, &format!("{prefix}.biases"))?;
    QuantizedMatrix::new(rows, in_dim, p.bits, p.group_size, codes, scales, biases).map_err(|e| {
        LoaderError::BadQuantized {
            path: file.path().to_path_buf(),
            name: prefix.to_string(),
            reason: e.to_string(),
        }
    })
}

/// The rows of matrix `name`; `None` when it is missing or not 2-D (the caller then reports
/// the width as unknown, or the shape check names the tensor).
fn rows_of(file: &SafetensorsFile, name: &str) -> Option<usize> {
    file.tensors()
        .get(name)
        .filter(|i| i.shape.len() == 2)
        .map(|i| i.shape[0])
}

fn width_of_norm(file: &SafetensorsFile, name: &str) -> Option<usize> {
    file.tensors()
        .get(name)
        .and_then(|i| i.shape.last().copied())
}

/// The unpacked input width of MLX matrix `prefix`, from unquantized tensors of the same file:
/// the model width from `out_norm`, the depformer width from a depformer norm, and the FFN width
/// from the rows of the matching `linear_in` (which holds 2 * hidden rows).
pub fn infer_in_dim(file: &SafetensorsFile, prefix: &str) -> Option<usize> {
    if let Some(base) = prefix.strip_suffix("gating.linear_out") {
        return rows_of(file, &format!("{base}gating.linear_in.weight")).map(|r| r / 2);
    }
    let dim = width_of_norm(file, "out_norm.weight")?;
    match prefix.strip_prefix("depformer.slices.") {
        Some(rest) => {
            let k = rest.split('.').next()?;
            if rest == format!("{k}.linear_in") {
                Some(dim)
            } else {
                width_of_norm(
                    file,
                    &format!("depformer.slices.{k}.transformer.layers.0.norm1.weight"),
                )
            }
        }
        None => Some(dim),
    }
}

/// The unpacked `[rows, in_dim]` and bits/group of packed matrix `prefix` as the file itself
/// implies them (in_dim from [`infer_in_dim`]); `None` if the shapes give no valid pair.
pub fn file_logical_shape(
    file: &SafetensorsFile,
    prefix: &str,
) -> Option<(Vec<usize>, QuantParams)> {
    let in_dim = infer_in_dim(file, prefix)?;
    let rows = rows_of(file, &format!("{prefix}.weight"))?;
    derive_quant_params(file, prefix, rows, in_dim)
        .ok()
        .map(|p| (vec![rows, in_dim], p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_give_bits_and_group() {
        assert_eq!(
            quant_params_from_shapes(32, 8, 256),
            Ok(QuantParams {
                bits: 4,
                group_size: 32
            })
        );
        assert_eq!(
            quant_params_from_shapes(64, 4, 256),
            Ok(QuantParams {
                bits: 8,
                group_size: 64
            })
        );
        assert_eq!(
            quant_params_from_shapes(176, 11, 704),
            Ok(QuantParams {
                bits: 8,
                group_size: 64
            })
        );
        // moshiko-mlx-q4 / -q8 (7B): text_emb [32001, 512] + scales [32001, 128]; FFN out width 11264.
        assert_eq!(
            quant_params_from_shapes(512, 128, 4096),
            Ok(QuantParams {
                bits: 4,
                group_size: 32
            })
        );
        assert_eq!(
            quant_params_from_shapes(1408, 352, 11264),
            Ok(QuantParams {
                bits: 4,
                group_size: 32
            })
        );
        assert_eq!(
            quant_params_from_shapes(2816, 176, 11264),
            Ok(QuantParams {
                bits: 8,
                group_size: 64
            })
        );
    }

    #[test]
    fn impossible_shapes_are_rejected_with_numbers() {
        let e = quant_params_from_shapes(30, 8, 256).unwrap_err();
        assert!(
            e.contains("30 packed") && e.contains("256") && e.contains("3.750"),
            "{e}"
        );
        let e = quant_params_from_shapes(56, 8, 256).unwrap_err();
        assert!(e.contains("7 bits"), "{e}");
        let e = quant_params_from_shapes(32, 5, 256).unwrap_err();
        assert!(e.contains("5 scale columns"), "{e}");
        let e = quant_params_from_shapes(32, 16, 256).unwrap_err();
        assert!(e.contains("group size of 16"), "{e}");
    }
}
