//! MLX affine quantization (`mx.quantize`), bit for bit, and MLX's native bf16 dequantization.
//!
//! Per group of `group_size` consecutive values of a row (all arithmetic in f32, as MLX's CPU
//! kernel does on bf16 input upcast to f32):
//! * `w_min`, `w_max` of the group; `n_bins = 2^bits - 1`;
//! * `scale = max((w_max - w_min) / n_bins, 1e-7)`, negated unless `|w_min| > |w_max|`;
//! * `edge` = `w_min` if `|w_min| > |w_max|` else `w_max`; `q0 = rint(edge / scale)`;
//! * if `q0 != 0`: `scale = edge / q0`, `bias = edge`; otherwise `bias = 0` (scale kept);
//! * `q = clamp(rint((w - bias) / scale), 0, n_bins)`, with the *f32* scale and bias;
//! * the stored scale and bias are the f32 values rounded to bf16 (round to nearest even).
//!
//! Choosing the larger-magnitude end as the bias makes that end exactly representable
//! (it is `q = 0` after the bf16 rounding of the bias), which is MLX's edge handling.

use half::bf16;

use crate::matrix::check_layout;
use crate::{QuantError, QuantizedMatrix};

/// MLX's lower bound on the magnitude of a scale.
const SCALE_EPS: f32 = 1e-7;

/// Quantizes a row-major `[rows, cols]` f32 matrix exactly like MLX's `mx.quantize`.
pub fn quantize_mlx(
    weights: &[f32],
    rows: usize,
    cols: usize,
    bits: u32,
    group_size: usize,
) -> Result<QuantizedMatrix, QuantError> {
    check_layout(cols, bits, group_size)?;
    if weights.len() != rows * cols {
        return Err(QuantError::LengthMismatch {
            what: "weights",
            expected: rows * cols,
            got: weights.len(),
        });
    }
    if let Some(index) = weights.iter().position(|v| !v.is_finite()) {
        return Err(QuantError::NonFinite {
            index,
            value: weights[index],
        });
    }
    let n_bins = ((1u32 << bits) - 1) as f32;
    let groups = rows * cols / group_size;
    let mut scales = Vec::with_capacity(groups);
    let mut biases = Vec::with_capacity(groups);
    let mut codes = vec![0u32; rows * cols * bits as usize / 32];
    let mut bit_pos = 0usize;
    for group in weights.chunks_exact(group_size) {
        // Same comparisons as std::max / std::min in MLX (keeps the first of equal values).
        let (mut w_min, mut w_max) = (f32::INFINITY, f32::NEG_INFINITY);
        for &v in group {
            if w_max < v {
                w_max = v;
            }
            if v < w_min {
                w_min = v;
            }
        }
        let min_is_edge = w_min.abs() > w_max.abs();
        let mut scale = ((w_max - w_min) / n_bins).max(SCALE_EPS);
        if !min_is_edge {
            scale = -scale;
        }
        let edge = if min_is_edge { w_min } else { w_max };
        let q0 = (edge / scale).round_ties_even();
        let mut bias = 0f32;
        if q0 != 0.0 {
            scale = edge / q0;
            bias = edge;
        }
        for &v in group {
            let q = ((v - bias) / scale).round_ties_even().clamp(0.0, n_bins) as u64;
            let (word, shift) = (bit_pos / 32, bit_pos % 32);
            let placed = q << shift;
            codes[word] |= placed as u32;
            if shift + bits as usize > 32 {
                codes[word + 1] |= (placed >> 32) as u32;
            }
            bit_pos += bits as usize;
        }
        scales.push(bf16::from_f32(scale).to_bits());
        biases.push(bf16::from_f32(bias).to_bits());
    }
    QuantizedMatrix::new(rows, cols, bits, group_size, codes, scales, biases)
}

/// MLX's native dequantization with bf16 scales: `bf16(bf16(q * scale) + bias)`, row-major bf16 bits.
pub fn dequantize_bf16(w: &QuantizedMatrix) -> Vec<u16> {
    let (rows, cols, group_size) = (w.rows(), w.cols(), w.group_size());
    let groups_per_row = cols / group_size;
    let mut out = Vec::with_capacity(rows * cols);
    for row in 0..rows {
        for col in 0..cols {
            let g = row * groups_per_row + col / group_size;
            let scale = w.scale_format().to_f32(w.scales()[g]);
            let bias = w.scale_format().to_f32(w.biases()[g]);
            let scaled = bf16::from_f32(w.code(row, col) as f32 * scale).to_f32();
            out.push(bf16::from_f32(scaled + bias).to_bits());
        }
    }
    out
}
