//! Scalar reference quantized matrix product: dequantize each weight row exactly
//! (`q * scale + bias` in f32, as `QuantizedMatrix::dequantize_row_f32`) and accumulate the
//! dot products sequentially in f32. Slow and obviously correct: the kernels are tested against it.

use crate::QuantizedMatrix;

/// `y[m, rows] = x[m, cols] · dequant(W)ᵀ` with sequential f32 accumulation.
///
/// # Panics
/// If `x.len() != m * cols` or `y.len() != m * rows` (caller bug, not user input).
pub fn qmm_reference(w: &QuantizedMatrix, x: &[f32], m: usize, y: &mut [f32]) {
    let (rows, cols) = (w.rows(), w.cols());
    assert_eq!(
        x.len(),
        m * cols,
        "qmm_reference: x must hold m * cols = {m} * {cols} values"
    );
    assert_eq!(
        y.len(),
        m * rows,
        "qmm_reference: y must hold m * rows = {m} * {rows} values"
    );
    let mut row_values = vec![0f32; cols];
    for r in 0..rows {
        w.dequantize_row_f32(r, &mut row_values);
        for i in 0..m {
            y[i * rows + r] = dot_in_order(&row_values, &x[i * cols..(i + 1) * cols]);
        }
    }
}

/// `Σ_j w_j · x_j` accumulated in f32 in order of `j`: the reference's arithmetic for one output.
pub(crate) fn dot_in_order(w: &[f32], x: &[f32]) -> f32 {
    let mut acc = 0f32;
    for (a, b) in w.iter().zip(x) {
        acc += a * b;
    }
    acc
}
