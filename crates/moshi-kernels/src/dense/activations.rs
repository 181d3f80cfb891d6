//! Activation functions: SiLU, exact (erf) GELU and ELU per value, and the vectorized slice
//! forms run over whole buffers (Mimi's GELU through a rational erf and ELU through a branch-free
//! expm1, the LM's gated SiLU through a branch-free exp), compiled for the instruction set
//! [`Kernel::detect`] picks. Element-wise: every instruction set gives the same bits.

use crate::elem::LANES;
#[cfg(target_arch = "x86_64")]
use crate::InstructionSet;
use crate::Kernel;

/// SiLU: `x · sigmoid(x)`, as `x / (1 + e)` for `x >= 0` and `x · e / (1 + e)` below, with
/// `e = exp(-|x|)` (`exp_nonpositive`): branch-free, so that slices vectorize
/// ([`silu_mul_slice`]) with the same bits as this scalar form; within 4 ulp of
/// `x / (1 + exp(-x))`, and 0 below -87.3, where `exp(-|x|)` leaves f32's normal range and the
/// exact value is under 1e-36 (`silu_matches_the_exact_form`).
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    let e = exp_nonpositive(-x.abs());
    let numerator = if x >= 0.0 { x } else { x * e };
    numerator / (1.0 + e)
}

/// `out[i] = silu(gate[i]) · value[i]` (the LM's gated feed-forward), vectorized for the
/// instruction set [`Kernel::detect`] picks: the same bits as the scalar [`silu`].
pub fn silu_mul_slice(out: &mut [f32], gate: &[f32], value: &[f32]) {
    assert!(
        gate.len() == out.len() && value.len() == out.len(),
        "silu_mul_slice lengths"
    );
    match Kernel::detect().instruction_set() {
        // SAFETY (both arms): the detected kernel runs on this CPU.
        #[cfg(target_arch = "x86_64")]
        InstructionSet::Avx512 => unsafe { silu_mul_slice_avx512(out, gate, value) },
        #[cfg(target_arch = "x86_64")]
        InstructionSet::Avx2 => unsafe { silu_mul_slice_avx2(out, gate, value) },
        _ => silu_mul_slice_body(out, gate, value),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn silu_mul_slice_avx512(out: &mut [f32], gate: &[f32], value: &[f32]) {
    silu_mul_slice_body(out, gate, value)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_mul_slice_avx2(out: &mut [f32], gate: &[f32], value: &[f32]) {
    silu_mul_slice_body(out, gate, value)
}

#[inline(always)]
fn silu_mul_slice_body(out: &mut [f32], gate: &[f32], value: &[f32]) {
    for ((o, &g), &v) in out.iter_mut().zip(gate).zip(value) {
        *o = silu(g) * v;
    }
}

/// Exact (erf) GELU.
#[inline]
pub fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// `erf(x)` in f32 as a rational function (odd degree-13 numerator over even degree-8 denominator
/// in x, the minimax form XLA and Eigen use; inputs clamped to ±4 where erf is ±1 in f32).
/// Branch-free so that slices vectorize; within 4.2e-7 absolute (3.6 ulp near ±1) of the exact
/// erf, see `gelu_slice_matches_libm`.
#[inline(always)]
pub fn erf_rational(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = -2.726_142_3e-10_f32;
    p = p * x2 + 2.770_681_4e-8;
    p = p * x2 - 2.101_024e-6;
    p = p * x2 - 5.692_506_4e-5;
    p = p * x2 - 7.349_906_3e-4;
    p = p * x2 - 2.954_600_2e-3;
    p = p * x2 - 1.609_603_3e-2;
    let mut q = -1.456_607_2e-5_f32;
    q = q * x2 - 2.133_740_6e-4;
    q = q * x2 - 1.682_827e-3;
    q = q * x2 - 7.373_329e-3;
    q = q * x2 - 1.426_473_9e-2;
    x * p / q
}

/// Exact-form (erf) GELU over a slice in place, vectorized with [`erf_rational`].
pub fn gelu_slice(xs: &mut [f32]) {
    match Kernel::detect().instruction_set() {
        // SAFETY (both arms): the detected kernel runs on this CPU.
        #[cfg(target_arch = "x86_64")]
        InstructionSet::Avx512 => unsafe { gelu_slice_avx512(xs) },
        #[cfg(target_arch = "x86_64")]
        InstructionSet::Avx2 => unsafe { gelu_slice_avx2(xs) },
        _ => gelu_slice_body(xs),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn gelu_slice_avx512(xs: &mut [f32]) {
    gelu_slice_body(xs)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu_slice_avx2(xs: &mut [f32]) {
    gelu_slice_body(xs)
}

#[inline(always)]
fn gelu_slice_body(xs: &mut [f32]) {
    for v in xs.iter_mut() {
        *v = 0.5 * *v * (1.0 + erf_rational(*v * std::f32::consts::FRAC_1_SQRT_2));
    }
}

/// ELU with alpha 1.
#[inline]
pub fn elu(x: f32) -> f32 {
    if x > 0.0 {
        x
    } else {
        x.exp_m1()
    }
}

/// Elements from which [`elu_slice_par`] splits the work over the team.
const ELU_PARALLEL_MIN: usize = 1 << 14;

/// [`elu_slice`] split over the [`crate::team`] for large slices (element-wise: same result).
pub fn elu_slice_par(dst: &mut [f32], src: &[f32]) {
    assert_eq!(dst.len(), src.len(), "elu_slice lengths");
    let len = dst.len();
    let threads = crate::team::threads();
    if len < ELU_PARALLEL_MIN || threads < 2 {
        elu_slice(dst, src);
        return;
    }
    let chunk = len.div_ceil(LANES).div_ceil(threads) * LANES;
    crate::team::run_chunks_mut(dst, chunk, &|a, d| elu_slice(d, &src[a..a + d.len()]));
}

/// `dst[i] = elu(src[i])` (alpha 1) over a slice, vectorized: `expm1` by range reduction
/// (`x = k ln2 + r`, degree-8 polynomial for `expm1(r)`), within 2 ulp of `f32::exp_m1`.
pub fn elu_slice(dst: &mut [f32], src: &[f32]) {
    assert_eq!(dst.len(), src.len(), "elu_slice lengths");
    match Kernel::detect().instruction_set() {
        // SAFETY (both arms): the detected kernel runs on this CPU.
        #[cfg(target_arch = "x86_64")]
        InstructionSet::Avx512 => unsafe { elu_slice_avx512(dst, src) },
        #[cfg(target_arch = "x86_64")]
        InstructionSet::Avx2 => unsafe { elu_slice_avx2(dst, src) },
        _ => elu_slice_body(dst, src),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn elu_slice_avx512(dst: &mut [f32], src: &[f32]) {
    elu_slice_body(dst, src)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn elu_slice_avx2(dst: &mut [f32], src: &[f32]) {
    elu_slice_body(dst, src)
}

#[inline(always)]
fn elu_slice_body(dst: &mut [f32], src: &[f32]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = if x > 0.0 { x } else { expm1_nonpositive(x) };
    }
}

/// `expm1(x)` for `x <= 0`, branch-free so that it vectorizes.
#[inline(always)]
fn expm1_nonpositive(x: f32) -> f32 {
    let (two_k, em1_r) = exp_reduced(x);
    // 2^k (expm1(r) + 1) - 1 = 2^k expm1(r) + (2^k - 1)
    two_k * em1_r + (two_k - 1.0)
}

/// `exp(x)` for `x <= 0` (0 below -88), branch-free so that it vectorizes.
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    let (two_k, em1_r) = exp_reduced(x);
    two_k * em1_r + two_k
}

/// `(2^k, expm1(r))` with `x = k ln2 + r` and `|r| <= ln2 / 2`, for `x <= 0` clamped at -88 (where
/// `2^k` is 0): the range reduction [`expm1_nonpositive`] and [`exp_nonpositive`] finish.
#[inline(always)]
fn exp_reduced(x: f32) -> (f32, f32) {
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let x = x.max(-88.0);
    // k = round(x / ln2) with the 1.5 * 2^23 trick (|x / ln2| < 2^22).
    let kf = (x * std::f32::consts::LOG2_E + 12_582_912.0) - 12_582_912.0;
    let r = (x - kf * LN2_HI) - kf * LN2_LO;
    // expm1(r), |r| <= ln2 / 2: r + r²/2! + ... + r⁸/8!
    let p = 1.0 / 40320.0;
    let p = p * r + 1.0 / 5040.0;
    let p = p * r + 1.0 / 720.0;
    let p = p * r + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let em1_r = r + r * r * p;
    // 2^k from the bits of k + 127 + 1.5 * 2^23 (integer k + 127 in 0..=127 in the low mantissa
    // bits; shifted into the exponent field). Same value as `(k as i32 + 127) << 23`, but it
    // vectorizes (a saturating float -> int cast does not).
    let two_k = f32::from_bits((kf + (127.0 + 12_582_912.0)).to_bits() << 23);
    (two_k, em1_r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elu_slice_matches_libm() {
        let xs: Vec<f32> = (0..200_000)
            .map(|i| -30.0 + i as f32 * 0.00016)
            .chain([0.0, -0.0, -1e-8, -1e-30, -87.9, -200.0, 5.0])
            .collect();
        let mut out = vec![0f32; xs.len()];
        elu_slice(&mut out, &xs);
        for (&x, &y) in xs.iter().zip(&out) {
            let r = elu(x);
            let ulp = (r.abs() * f32::EPSILON).max(f32::MIN_POSITIVE);
            assert!((y - r).abs() <= 2.0 * ulp, "elu({x}) = {y}, libm {r}");
        }
        let mut par = vec![0f32; xs.len()];
        elu_slice_par(&mut par, &xs);
        assert_eq!(par, out, "split over the team == serial");
    }

    /// Where `exp(-|x|)` leaves f32's normal range (x below about -87.3) [`silu`] gives 0 for
    /// values of at most this magnitude.
    const UNDERFLOW_BOUND: f64 = 1e-36;

    #[test]
    fn silu_matches_the_exact_form() {
        let xs: Vec<f32> = (0..2_000_000)
            .map(|i| -100.0 + i as f32 * 1e-4)
            .chain([
                0.0, -0.0, 1e-30, -1e-30, 1e-45, 87.9, -87.9, 88.5, -88.5, 1e30, -1e30,
            ])
            .chain([f32::MAX, f32::MIN, f32::INFINITY])
            .collect();
        for &x in &xs {
            let exact = x as f64 / (1.0 + (-(x as f64)).exp());
            if exact.is_infinite() {
                assert_eq!(silu(x) as f64, exact, "silu({x})");
                continue;
            }
            let ulp = ((exact as f32).abs() * f32::EPSILON) as f64;
            let bound = (4.0 * ulp).max(UNDERFLOW_BOUND);
            let err = (silu(x) as f64 - exact).abs();
            assert!(err <= bound, "silu({x}) = {}, exact {exact:e}", silu(x));
        }
        assert!(silu(f32::NAN).is_nan());
        let values: Vec<f32> = xs.iter().map(|x| (x * 0.37).sin()).collect();
        let mut out = vec![f32::NAN; xs.len()];
        silu_mul_slice(&mut out, &xs, &values);
        for ((&x, &v), &y) in xs.iter().zip(&values).zip(&out) {
            assert_eq!(y.to_bits(), (silu(x) * v).to_bits(), "silu({x}) * {v}");
        }
    }

    #[test]
    fn gelu_slice_matches_libm() {
        let xs: Vec<f32> = (0..1_200_000)
            .map(|i| -6.0 + i as f32 * 1e-5)
            .chain([0.0, -0.0, 1e-30, -1e-30, 10.0, -10.0, 1e6, -1e6])
            .collect();
        let (mut max_abs, mut max_ulp) = (0f64, 0f64);
        for &x in &xs {
            let exact = libm::erf(x as f64);
            let err = (erf_rational(x) as f64 - exact).abs();
            max_abs = max_abs.max(err);
            max_ulp = max_ulp
                .max(err / ((exact as f32).abs() * f32::EPSILON).max(f32::MIN_POSITIVE) as f64);
        }
        assert!(
            max_abs <= 5e-7 && max_ulp <= 4.0,
            "erf: max abs error {max_abs:e}, {max_ulp:.2} ulp"
        );
        let mut gelu = xs.clone();
        gelu_slice(&mut gelu);
        for (&x, &g) in xs.iter().zip(&gelu) {
            let r = gelu_erf(x);
            // 0.5 |x| · (erf error + libm erff's own ~1 ulp) + rounding of the product.
            let bound = 0.5 * x.abs() * 6e-7 + 2.0 * r.abs() * f32::EPSILON + f32::MIN_POSITIVE;
            assert!((g - r).abs() <= bound, "gelu({x}) = {g}, libm {r}");
        }
    }
}
