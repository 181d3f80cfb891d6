//! The row scale every activation rounding of the quantized products starts from (the integer
//! kernels' fixed point, `quant::fixed_point`, and the 8-bit activations, `quant::int8`): a row
//! is scaled by the power of two that brings its largest magnitude into [1, 2), and rows holding
//! a NaN, an infinity or only subnormal magnitudes are not held; and the fixed point's group unit
//! for a number of digits, which the f32 kernels' 16-bit rounding shares (`quant::two_digits`).

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

/// Largest `|n|` that `digits` balanced signed 8-bit digits hold: `127 · (1 + 2^8 + 2^16 ...)`
/// (8 355 711 for three, 32 639 for two).
pub(crate) const fn digits_max(digits: usize) -> f32 {
    let mut max = 0u32;
    let mut d = 0;
    while d < digits {
        max = max * 256 + 127;
        d += 1;
    }
    max as f32
}

/// The exponent of a group's unit in the fixed point of `digits` digits, given the group's
/// largest magnitude after the row scaling (`< 2`). Always inlined: in the kernels' arrangements
/// the rounding then compiles to their instruction set's, not to a call of `rintf`.
#[inline(always)]
pub(crate) fn group_unit_exp(scaled_group_max: f32, digits: usize) -> i32 {
    let binades_below = 8 * digits as i32 - 2;
    let mut unit_exp = if scaled_group_max >= pow2(MIN_UNIT_EXP + binades_below) {
        binade(scaled_group_max) - binades_below
    } else {
        MIN_UNIT_EXP
    };
    if (scaled_group_max * pow2(-unit_exp)).round_ties_even() > digits_max(digits) {
        unit_exp += 1;
    }
    unit_exp
}
