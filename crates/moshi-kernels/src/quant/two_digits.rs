//! The 16-bit activation mode of the quantized products ([`crate::ActivationPrecision::Int16`])
//! for the kernels that take f32 activations: each value rounded to the integer kernels' fixed
//! point of two digits (`quant::fixed_point`), so every kernel computes the same product of the
//! dequantized weights with the same rounded activations.

use crate::quant::scale::{group_unit_exp, pow2, RowScale};

/// Signed 8-bit digits per activation of the 16-bit fixed point.
pub(crate) const TWO_DIGITS: usize = 2;

/// `m` rows of `cols` activations rounded to the 16-bit fixed point per group of `group_size`
/// (the values `n · u_g · 2^e` the integer kernels hold at two digits): what the f32 kernels
/// multiply at [`crate::ActivationPrecision::Int16`]. A row that cannot be held is copied
/// unchanged: its products run on the exact values, as the integer kernels leave such rows to
/// their f32 sibling.
///
/// # Panics
/// If `x.len() != m * cols` or `group_size` does not divide `cols` (caller bug).
pub fn round_activations_two_digits(
    x: &[f32],
    m: usize,
    cols: usize,
    group_size: usize,
) -> Vec<f32> {
    assert!(x.len() == m * cols && group_size > 0 && cols.is_multiple_of(group_size));
    let mut out = x.to_vec();
    for row in out.chunks_exact_mut(cols.max(1)) {
        let max_abs = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        let has_nan = row.iter().any(|v| v.is_nan());
        let Some(RowScale::Exponent(row_exp)) = RowScale::of_row(max_abs, has_nan) else {
            continue;
        };
        for group in row.chunks_exact_mut(group_size) {
            let group_max = group.iter().fold(0f32, |m, v| m.max(v.abs()));
            let unit_exp = group_unit_exp(group_max * pow2(-row_exp), TWO_DIGITS);
            for v in group.iter_mut() {
                let n = (*v * pow2(-row_exp) * pow2(-unit_exp)).round_ties_even();
                // n · 2^unit_exp is exact (|n| < 2^15, the unit normal); the row scale may
                // round it into the subnormals, as the kernels' f32 result would.
                *v = n * pow2(unit_exp) * pow2(row_exp);
            }
        }
    }
    out
}
