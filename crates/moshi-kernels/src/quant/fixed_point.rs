//! The 24-bit fixed point in which the integer kernels (x86-64 VNNI, aarch64 dot product) hold
//! activations, one rule for both: a row is scaled by the power of two `2^-e` that brings its
//! largest magnitude into [1, 2); each quantization group `g` gets a unit `u_g`, the power of two
//! 22 binades below its largest scaled magnitude (one binade higher when that largest value would
//! round past [`DIGITS_MAX`]), never below `2^MIN_UNIT_EXP`; every value becomes the integer
//! `n = round_ties_even(x · 2^-e / u_g)`, `|n| ≤ DIGITS_MAX`, held as three signed base-256
//! digits. So each activation is held to within half a unit: at most `2^-23` of its group's
//! largest magnitude, the size of one f32 rounding of that value. Rows holding a NaN, an infinity
//! or only subnormal magnitudes cannot be held (the kernels then use their f32 sibling).
//!
//! Each kernel arranges the digits in its own vector layout; this module is the rule itself,
//! in scalar form, which the kernels' arrangement tests check their layouts against, and what
//! the two kernels share around their vector code: the arranged row's layout ([`RowLayout`],
//! [`arrange_rows`]) and their tiles' state ([`DigitTiles`], over each kernel's [`DigitTile`]).

use std::marker::PhantomData;

use crate::quant::passes::{Tiles, MATMUL_ROWS};
use crate::quant::CodePrefetch;
use crate::QuantizedMatrix;

/// Signed 8-bit digits per activation.
pub(crate) const DIGITS: usize = 3;

/// Largest `|n|` three signed 8-bit digits hold: `127 · (2^16 + 2^8 + 1)`.
pub(crate) const DIGITS_MAX: f32 = 8_355_711.0;

/// Smallest group unit, as a power of two relative to the row's largest magnitude: groups whose
/// largest value lies more than 2^-78 below the row's are held to within 2^-101 of it.
pub(crate) const MIN_UNIT_EXP: i32 = -100;

/// `2^e` as f32, for `-149 ≤ e ≤ 127` (subnormal below -126).
pub(crate) fn pow2(e: i32) -> f32 {
    debug_assert!((-149..=127).contains(&e));
    if e >= -126 {
        f32::from_bits(((e + 127) as u32) << 23)
    } else {
        f32::from_bits(1 << (e + 149))
    }
}

/// The binade of a positive normal `v`: `v ∈ [2^e, 2^(e+1))`.
pub(crate) fn binade(v: f32) -> i32 {
    ((v.to_bits() >> 23) & 0xff) as i32 - 127
}

/// How a row of activations is scaled before its groups are cut into digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowScale {
    /// Every value is zero: every digit is zero, and the row's scale is 1.
    Zero,
    /// The row is multiplied by `2^-e` (its largest magnitude lies in `[2^e, 2^(e+1))`).
    Exponent(i32),
}

impl RowScale {
    /// The scale of a row whose largest magnitude is `max_abs`, or `None` if the row cannot be
    /// held (`has_nan`, an infinite or a subnormal largest magnitude).
    pub(crate) fn of_row(max_abs: f32, has_nan: bool) -> Option<RowScale> {
        if has_nan || max_abs == f32::INFINITY {
            None
        } else if max_abs == 0.0 {
            Some(RowScale::Zero)
        } else if max_abs < f32::MIN_POSITIVE {
            None
        } else {
            Some(RowScale::Exponent(binade(max_abs)))
        }
    }
}

/// Whether the fixed point can hold `row` (finite values whose largest magnitude is zero or
/// normal): the test the kernels' arrangements make, for callers that decide before arranging.
pub(crate) fn holds_row(row: &[f32]) -> bool {
    let has_nan = row.iter().any(|v| v.is_nan());
    let max_abs = row.iter().fold(0f32, |m, v| m.max(v.abs()));
    RowScale::of_row(max_abs, has_nan).is_some()
}

/// The exponent of a group's unit, given the group's largest magnitude after the row scaling
/// (`< 2`).
pub(crate) fn group_unit_exp(scaled_group_max: f32) -> i32 {
    let mut unit_exp = if scaled_group_max >= pow2(MIN_UNIT_EXP + 22) {
        binade(scaled_group_max) - 22
    } else {
        MIN_UNIT_EXP
    };
    if (scaled_group_max * pow2(-unit_exp)).round_ties_even() > DIGITS_MAX {
        unit_exp += 1;
    }
    unit_exp
}

/// Where the parts of one arranged activation row of an integer kernel lie, in f32 slots: the
/// digit blocks (bytes, `DIGITS` per column, in the kernel's own order within a block), then each
/// group's unit, each group's f32 sum (both zero-padded to whole vectors), then the row's scale
/// `2^e` (one vector, first lane used).
#[derive(Clone, Copy)]
pub(crate) struct RowLayout {
    pub(crate) digits_len: usize,
    pub(crate) units_offset: usize,
    pub(crate) sums_offset: usize,
    pub(crate) unscale_offset: usize,
    pub(crate) stride: usize,
}

impl RowLayout {
    /// The layout of a row of `cols` activations in groups of `group_size`, for a kernel whose
    /// blocks cover `block_cols` columns (the last one zero-padded) and whose vectors hold `lanes`
    /// f32.
    pub(crate) fn new(cols: usize, group_size: usize, block_cols: usize, lanes: usize) -> Self {
        let digits_len = cols.div_ceil(block_cols) * block_cols * DIGITS / 4;
        let groups_padded = (cols / group_size).next_multiple_of(lanes);
        let units_offset = digits_len;
        let sums_offset = units_offset + groups_padded;
        let unscale_offset = sums_offset + groups_padded;
        RowLayout {
            digits_len,
            units_offset,
            sums_offset,
            unscale_offset,
            stride: unscale_offset + lanes,
        }
    }
}

/// `m` rows of `cols` activations arranged by `arrange_row` (a row and its zeroed `layout.stride`
/// floats; false if the fixed point cannot hold the row), or `None` if a row could not be.
pub(crate) fn arrange_rows(
    x: &[f32],
    m: usize,
    cols: usize,
    layout: RowLayout,
    mut arrange_row: impl FnMut(&[f32], &mut [f32]) -> bool,
) -> Option<Vec<f32>> {
    let mut out = vec![0f32; m * layout.stride];
    for (row, dst) in x
        .chunks_exact(cols)
        .zip(out.chunks_exact_mut(layout.stride))
    {
        if !arrange_row(row, dst) {
            return None;
        }
    }
    Some(out)
}

/// One integer kernel's tile (`vnni`, `dotprod`): dot products of weight rows `r0 + k · row_step`
/// (`k < NR`) with the `MR` arranged activation rows at `xs`, `U` code blocks a step, using
/// `windows` for the factors of each (weight row, activation row) pair.
pub(crate) trait DigitTile {
    /// f32 lanes per vector: each factor window is the row's groups padded to whole vectors, plus
    /// one vector.
    const LANES: usize;

    /// [`crate::quant::passes::Tiles::PAIRED_FROM_M`] for this kernel.
    const PAIRED_FROM_M: usize;

    /// # Safety
    /// The CPU must have the kernel's features; rows `r0 + k · row_step` must exist in `w`; `xs`
    /// must point to `MR` arranged rows of `layout`; `windows` must hold `NR · MR` windows.
    unsafe fn tile<const GROUP: usize, const NR: usize, const MR: usize, const U: usize>(
        w: &QuantizedMatrix,
        r0: usize,
        xs: *const f32,
        layout: RowLayout,
        windows: &mut [f32],
        row_step: usize,
        prefetch: CodePrefetch,
    ) -> [[f32; MR]; NR];
}

/// An integer kernel's tiles for one product (see `quant::passes`), `MATVEC` weight rows per
/// matrix-vector pass.
pub(crate) struct DigitTiles<'a, K, const GROUP: usize, const MATVEC: usize> {
    w: &'a QuantizedMatrix,
    /// The arranged activation rows.
    xs: &'a [f32],
    layout: RowLayout,
    /// The factor windows of the largest tile.
    windows: Vec<f32>,
    prefetch: CodePrefetch,
    kernel: PhantomData<K>,
}

impl<'a, K: DigitTile, const GROUP: usize, const MATVEC: usize> DigitTiles<'a, K, GROUP, MATVEC> {
    /// The tiles of `w` against the rows of `xs`, arranged by `layout`.
    ///
    /// # Safety
    /// The CPU must have the kernel's features (every tile runs them).
    pub(crate) unsafe fn new(w: &'a QuantizedMatrix, xs: &'a [f32], layout: RowLayout) -> Self {
        let window = (w.cols() / GROUP).next_multiple_of(K::LANES) + K::LANES;
        DigitTiles {
            w,
            xs,
            layout,
            windows: vec![0f32; MATVEC.max(2 * MATMUL_ROWS) * window],
            prefetch: CodePrefetch::for_cpu(),
            kernel: PhantomData,
        }
    }
}

impl<K: DigitTile, const GROUP: usize, const MATVEC: usize> Tiles
    for DigitTiles<'_, K, GROUP, MATVEC>
{
    const MATVEC_ROWS: usize = MATVEC;
    const PAIRED_FROM_M: usize = K::PAIRED_FROM_M;

    unsafe fn tile<const NR: usize, const MR: usize, const U: usize>(
        &mut self,
        r0: usize,
        row_step: usize,
        first: usize,
    ) -> [[f32; MR]; NR] {
        let layout = self.layout;
        // SAFETY: the CPU has the features (`new`'s contract); forwarded contract (activation row
        // `first` exists; the windows are sized for the largest tile).
        unsafe {
            let x = self.xs.as_ptr().add(first * layout.stride);
            K::tile::<GROUP, NR, MR, U>(
                self.w,
                r0,
                x,
                layout,
                &mut self.windows,
                row_step,
                self.prefetch,
            )
        }
    }
}

/// The integer `n` that holds `v` in a row of exponent `row_exp` and a group of unit
/// `2^unit_exp`: two exact scalings by powers of two (the first may round a value far below the
/// row's largest into the subnormals, where it rounds to 0 all the same), then one rounding to
/// nearest even, as the vector arrangements do it.
#[cfg(test)]
pub(crate) fn fixed(v: f32, row_exp: i32, unit_exp: i32) -> i32 {
    (v * pow2(-row_exp) * pow2(-unit_exp)).round_ties_even() as i32
}

/// The balanced base-256 digits of `n` (`|n| ≤ DIGITS_MAX`), most significant first:
/// `n = d0 · 2^16 + d1 · 2^8 + d2`.
#[cfg(test)]
pub(crate) fn digits(n: i32) -> [i8; DIGITS] {
    let low = n as i8;
    let n1 = (n - low as i32) >> 8;
    let mid = n1 as i8;
    let top = ((n1 - mid as i32) >> 8) as i8;
    [top, mid, low]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_rebuild_every_held_integer() {
        let max = DIGITS_MAX as i32;
        for n in (-max..=max)
            .step_by(997)
            .chain([-max, -1, 0, 1, 127, 128, -128, -129, max])
        {
            let [a, b, c] = digits(n);
            assert_eq!(a as i32 * 65536 + b as i32 * 256 + c as i32, n, "{n}");
        }
    }

    #[test]
    fn values_are_held_within_half_a_unit_of_at_most_2_pow_minus_23_of_the_group_max() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut uniform = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for _ in 0..200 {
            // Magnitudes spread over 2^±40 within a row, so groups differ widely.
            let row: Vec<f32> = (0..256)
                .map(|_| ((uniform() - 0.5) * 2f64.powf(80.0 * uniform() - 40.0)) as f32)
                .collect();
            let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
            let Some(RowScale::Exponent(e)) = RowScale::of_row(max, false) else {
                panic!("row of normal values refused")
            };
            for group in row.chunks_exact(32) {
                let group_max = group.iter().fold(0f32, |m, v| m.max(v.abs()));
                let unit_exp = group_unit_exp(group_max * pow2(-e));
                let unit = 2f64.powi(unit_exp + e);
                assert!(unit < 2.0 * group_max as f64 / DIGITS_MAX as f64 || unit_exp == -100);
                for &v in group {
                    let n = fixed(v, e, unit_exp);
                    assert!(n.unsigned_abs() <= DIGITS_MAX as u32);
                    assert!((n as f64 * unit - v as f64).abs() <= unit / 2.0, "{v}");
                }
            }
        }
    }

    #[test]
    fn rows_it_cannot_hold_are_refused_and_zero_rows_accepted() {
        assert_eq!(RowScale::of_row(1.5, true), None);
        assert_eq!(RowScale::of_row(f32::INFINITY, false), None);
        assert_eq!(RowScale::of_row(1e-40, false), None);
        assert_eq!(RowScale::of_row(0.0, false), Some(RowScale::Zero));
        assert_eq!(RowScale::of_row(3.0, false), Some(RowScale::Exponent(1)));
        assert!(holds_row(&[0.0, -2.5, 1e-30]) && holds_row(&[0.0; 4]));
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            assert!(!holds_row(&[1.0, bad]), "{bad}");
        }
        assert!(!holds_row(&[1e-40, -1e-39]));
        // Small integers are held exactly: 100 in a group whose largest is 100.
        let e = binade(100.0);
        let unit_exp = group_unit_exp(100.0 * pow2(-e));
        assert_eq!(
            fixed(100.0, e, unit_exp) as f64 * 2f64.powi(unit_exp + e),
            100.0
        );
    }
}
