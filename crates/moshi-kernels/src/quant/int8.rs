//! The 8-bit activation mode of the quantized products ([`crate::ActivationPrecision::Int8`]):
//! each activation row is scaled by its power of two (`quant::scale`), and each quantization
//! group `g` rounded to signed 8-bit integers `n` with the unit `u_g = max_g / 127` (its largest
//! scaled magnitude over 127), as ggml's and candle's `q8` activations are per block. The integer
//! kernels then take one byte dot product per code vector instead of the exact fixed point's
//! three (`quant::fixed_point`); the f32 kernels take the rounded values `n · u_g · 2^e`, so every
//! kernel computes the same product of the dequantized weights with the same rounded activations.

use crate::quant::scale::{pow2, RowScale, MIN_UNIT_EXP};

/// Largest `|n|` of an activation rounded to 8 bits (symmetric: `-128` is never used, as in
/// ggml's and candle's `q8` activations).
pub(crate) const I8_MAX: f32 = 127.0;

/// Round to nearest, ties to even, of `|v| < 2^22`: adding and removing `1.5 · 2^23` leaves the
/// rounded integer (one f32 addition rounds it), without `f32::round_ties_even`, which is a
/// library call on x86-64 without SSE4.1.
fn round_small(v: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0;
    (v + SHIFT) - SHIFT
}

/// The unit `u_g` of a group in the 8-bit activation mode and its inverse, given the group's
/// largest magnitude after the row scaling (`< 2`): `u_g = max / 127`, and each value becomes
/// `n = round_ties_even(x · 2^-e · (127 / max))`, `|n| ≤ 127`, one signed 8-bit digit per value
/// per group, as ggml's and candle's `q8` activations (their blocks are our quantization groups).
/// A group whose largest value lies more than `2^MIN_UNIT_EXP` below the row's largest magnitude
/// is held as zeros (unit 0).
pub(crate) fn i8_group_unit(scaled_group_max: f32) -> (f32, f32) {
    if scaled_group_max < pow2(MIN_UNIT_EXP) {
        (0.0, 0.0)
    } else {
        (scaled_group_max / I8_MAX, I8_MAX / scaled_group_max)
    }
}

/// The exponent `e` of the row scale `2^e` in the 8-bit activation mode (0 for a row of zeros),
/// or `None` where the row cannot be held (as [`RowScale::of_row`]).
pub(crate) fn i8_row_exp(row: &[f32]) -> Option<i32> {
    let has_nan = row.iter().any(|v| v.is_nan());
    let max_abs = row.iter().fold(0f32, |m, v| m.max(v.abs()));
    Some(match RowScale::of_row(max_abs, has_nan)? {
        RowScale::Zero => 0,
        RowScale::Exponent(e) => e,
    })
}

/// One row in the 8-bit activation mode, of row scale `2^row_exp`: calls `group(g, u_g, n)` for
/// each group, with its unit `u_g` (relative to the row scale) and its values' `n`. The one
/// implementation of the rule: the integer kernels' arrangement ([`arrange_row_i8`]) and the
/// rounded activations of the f32 kernels ([`round_row_i8`]) both go through it.
pub(crate) fn i8_groups(
    row: &[f32],
    group_size: usize,
    row_exp: i32,
    mut group: impl FnMut(usize, f32, &[i8]),
) {
    let row_scale = pow2(-row_exp);
    let mut n = vec![0i8; group_size];
    for (g, values) in row.chunks_exact(group_size).enumerate() {
        let group_max = values.iter().fold(0f32, |m, v| m.max(v.abs()));
        let (unit, inverse) = i8_group_unit(group_max * row_scale);
        for (n, &v) in n.iter_mut().zip(values) {
            *n = round_small(v * row_scale * inverse) as i8;
        }
        group(g, unit, &n);
    }
}

/// `row` rounded to 8 bits per group as the integer kernels hold it (`n · u_g · 2^e`), into
/// `out`; false (and `out` untouched) where the row cannot be held.
pub(crate) fn round_row_i8(row: &[f32], group_size: usize, out: &mut [f32]) -> bool {
    let Some(row_exp) = i8_row_exp(row) else {
        return false;
    };
    let unscale = pow2(row_exp);
    i8_groups(row, group_size, row_exp, |g, unit, n| {
        for (out, &n) in out[g * group_size..(g + 1) * group_size].iter_mut().zip(n) {
            *out = n as f32 * unit * unscale;
        }
    });
    true
}

/// `m` rows of `cols` activations rounded to 8 bits per group of `group_size` (see the module
/// docs): the values the 8-bit activation mode multiplies. A row that cannot be held (a NaN, an
/// infinity, only subnormal magnitudes) is copied unchanged: its products run on the exact values,
/// as the integer kernels leave such rows to their f32 sibling.
///
/// # Panics
/// If `x.len() != m * cols` or `group_size` does not divide `cols` (caller bug).
pub fn round_activations_i8(x: &[f32], m: usize, cols: usize, group_size: usize) -> Vec<f32> {
    assert!(x.len() == m * cols && group_size > 0 && cols.is_multiple_of(group_size));
    let mut out = x.to_vec();
    for (row, out) in x
        .chunks_exact(cols.max(1))
        .zip(out.chunks_exact_mut(cols.max(1)))
    {
        round_row_i8(row, group_size, out);
    }
    out
}
