//! How the quantized products hold their activations ([`ActivationPrecision`]): exact (the
//! default), or rounded per quantization group to two signed 8-bit digits or to one, the
//! accuracy contract of issue #40.
//! A process-wide setting, like the kernel: the binary sets it once at start
//! ([`set_activation_precision`]), before its first product, and every product reads it when it
//! starts ([`activation_precision`]); [`crate::QuantizedMatrix::matmul_with`] takes it explicitly.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU8, Ordering};

/// How a quantized product holds its activation rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ActivationPrecision {
    /// As given: f32 in the f32 kernels, the 24-bit fixed point (within one f32 rounding of each
    /// group's largest value) in the integer kernels. The default.
    #[default]
    Exact,
    /// Rounded per quantization group to the 16-bit fixed point of two signed 8-bit digits (the
    /// exact fixed point's rule with 8 bits fewer: within `2^-15` of each group's largest value),
    /// two byte dot products per code vector in the integer kernels instead of three (see
    /// `quant::fixed_point`).
    Int16,
    /// Rounded per quantization group to signed 8-bit integers with an f32 unit (the group's
    /// largest magnitude over 127, as ggml's and candle's `q8` activations), one byte dot product
    /// per code vector in the integer kernels (see `quant::int8`).
    Int8,
}

impl ActivationPrecision {
    /// Every precision, the default first.
    pub const ALL: [ActivationPrecision; 3] = [
        ActivationPrecision::Exact,
        ActivationPrecision::Int16,
        ActivationPrecision::Int8,
    ];

    /// The flag value: `"exact"`, `"i16"` or `"i8"`.
    pub fn name(self) -> &'static str {
        match self {
            ActivationPrecision::Exact => "exact",
            ActivationPrecision::Int16 => "i16",
            ActivationPrecision::Int8 => "i8",
        }
    }
}

impl fmt::Display for ActivationPrecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ActivationPrecision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ActivationPrecision::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown activation precision {s:?}, expected exact, i16 or i8"))
    }
}

/// The precision every product reads when it starts: its index in [`ActivationPrecision::ALL`].
static PRECISION: AtomicU8 = AtomicU8::new(0);

/// Sets the activation precision of every later quantized product of this process.
pub fn set_activation_precision(precision: ActivationPrecision) {
    let code = ActivationPrecision::ALL
        .iter()
        .position(|p| *p == precision)
        .unwrap_or(0);
    PRECISION.store(code as u8, Ordering::Relaxed);
}

/// The activation precision of this process's quantized products ([`ActivationPrecision::Exact`]
/// unless [`set_activation_precision`] said otherwise).
pub fn activation_precision() -> ActivationPrecision {
    ActivationPrecision::ALL
        .get(PRECISION.load(Ordering::Relaxed) as usize)
        .copied()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_say_what_is_expected() {
        for p in ActivationPrecision::ALL {
            assert_eq!(p.name().parse::<ActivationPrecision>(), Ok(p));
            assert_eq!(p.to_string(), p.name());
        }
        let err = "int8".parse::<ActivationPrecision>().unwrap_err();
        assert!(
            err.contains("int8") && err.contains("exact, i16 or i8"),
            "{err}"
        );
        assert_eq!(ActivationPrecision::default(), ActivationPrecision::Exact);
    }
}
