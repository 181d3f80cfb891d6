//! AVX2 + FMA instruction set for the lane kernel (`quant::lanes`): 8 `u32` code lanes (32 code
//! bytes) per step. AVX2 converts signed integers only, so the top code of each lane (whose
//! `q · 2^(BITS·k)` can reach 2^31) is shifted down to `q` instead, and its activations are left
//! unscaled ([`TOP_UNSCALED`]).

use std::arch::x86_64::*;

use crate::quant::F16_TO_F32;
use crate::ScaleFormat;

/// Two weight rows per matrix-matrix tile of the lane kernel (`quant::passes`) from 2 activation
/// rows on, each activation vector loaded once for both. With 4 activation rows the two rows'
/// partial sums and accumulators outgrow the 16 registers and the accumulators live on the stack
/// (one load and one store per block and pair), still cheaper than loading every activation
/// vector once per weight row: the temporal layer ran faster than with one weight row per tile,
/// q4 at 2, 4 and 8 sessions, q8 at 4 (`moshi-rs bench --sessions N`). Two weight rows against 2
/// activation rows at a time (no spill, codes decoded twice) gained less, and tiles of 4 or 8
/// weight rows taken two at a time per block (each block of the activation rows then read from
/// L1 by all but the first pair) were slower than one row per tile. Figures: docs/performance.md.
pub(crate) const PAIRED_FROM_M: usize = 2;

/// f32 lanes per vector (and `u32` code words per block).
pub(crate) const LANES: usize = 8;

/// The top code of a lane is shifted down to `q`, so its activations are not pre-scaled.
pub(crate) const TOP_UNSCALED: bool = true;

type F = __m256;
type I = __m256i;

fn available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn fzero() -> F {
    _mm256_setzero_ps()
}

#[target_feature(enable = "avx2,fma")]
#[inline]
fn izero() -> I {
    _mm256_setzero_si256()
}

/// # Safety
/// `p` must point to 8 readable floats.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) unsafe fn fload(p: *const f32) -> F {
    // SAFETY: forwarded contract.
    unsafe { _mm256_loadu_ps(p) }
}

/// # Safety
/// `p` must point to 8 writable floats.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) unsafe fn fstore(p: *mut f32, v: F) {
    // SAFETY: forwarded contract.
    unsafe { _mm256_storeu_ps(p, v) }
}

#[target_feature(enable = "avx2,fma")]
#[inline]
fn fset1(v: f32) -> F {
    _mm256_set1_ps(v)
}

#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn fmul(a: F, b: F) -> F {
    _mm256_mul_ps(a, b)
}

#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn ffma(a: F, b: F, c: F) -> F {
    _mm256_fmadd_ps(a, b, c)
}

/// Horizontal sum of 8 lanes (also the AVX2 integer kernel's).
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn fsum(v: F) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
    _mm_cvtss_f32(s)
}

/// [`fsum`] of each vector.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn fsums<const N: usize>(v: [F; N]) -> [f32; N] {
    // The closure inherits this function's features.
    crate::quant::sums_one_by_one(v, |v| fsum(v))
}

/// Lane `i` of the result is lane `idx[i]` of `v`.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn fpermute(idx: I, v: F) -> F {
    _mm256_permutevar8x32_ps(v, idx)
}

/// # Safety
/// `p` must point to 8 readable `i32`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn iload(p: *const i32) -> I {
    // SAFETY: forwarded contract.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// The first `n < 8` lanes from `p`, zeros in the others (which are not read).
///
/// # Safety
/// `p` must point to `n` readable `i32`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn iload_lanes(p: *const i32, n: usize) -> I {
    let mask = _mm256_cmpgt_epi32(
        _mm256_set1_epi32(n as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    );
    // SAFETY: masked-off lanes are not accessed.
    unsafe { _mm256_maskload_epi32(p, mask) }
}

/// 8 bf16 values as f32 (exact: the bits shifted into the high half).
///
/// # Safety
/// `p` must point to 8 readable `u16`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn widen_bf16(p: *const u16) -> F {
    // SAFETY: forwarded contract (16 bytes).
    let h = unsafe { _mm_loadu_si128(p as *const __m128i) };
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
}

/// 8 finite f16 values as f32 (exact): the magnitude bits moved into f32's places read as
/// `v · 2^-112` (subnormal halves as subnormal floats), so one multiply by `2^112` restores
/// them; then the sign. AVX2 alone has no f16 conversion (that is F16C).
///
/// # Safety
/// `p` must point to 8 readable `u16`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn widen_f16(p: *const u16) -> F {
    // SAFETY: forwarded contract (16 bytes).
    let h = _mm256_cvtepu16_epi32(unsafe { _mm_loadu_si128(p as *const __m128i) });
    let magnitude = _mm256_slli_epi32::<13>(_mm256_and_si256(h, _mm256_set1_epi32(0x7fff)));
    let sign = _mm256_slli_epi32::<16>(_mm256_and_si256(h, _mm256_set1_epi32(0x8000)));
    let unsigned = _mm256_mul_ps(_mm256_castsi256_ps(magnitude), _mm256_set1_ps(F16_TO_F32));
    _mm256_or_ps(unsigned, _mm256_castsi256_ps(sign))
}

/// 8 scales or biases of `format` from `p` as f32 (exact).
///
/// # Safety
/// `p` must point to 8 readable `u16`.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) unsafe fn widen_scales(format: ScaleFormat, p: *const u16) -> F {
    // SAFETY: forwarded contract.
    unsafe {
        match format {
            ScaleFormat::Bf16 => widen_bf16(p),
            ScaleFormat::F16 => widen_f16(p),
        }
    }
}

/// Code `k` of every lane as `q · 2^(BITS·k)`, or as `q` for the top code (exact: below 2^31, so
/// the signed convert applies).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn decode<const BITS: usize>(d: I, k: usize) -> F {
    if k == 32 / BITS - 1 {
        let top = if BITS == 4 {
            _mm256_srli_epi32::<28>(d)
        } else {
            _mm256_srli_epi32::<24>(d)
        };
        _mm256_cvtepi32_ps(top)
    } else {
        let mask = _mm256_set1_epi32((((1u32 << BITS) - 1) << (BITS * k)) as i32);
        _mm256_cvtepi32_ps(_mm256_and_si256(d, mask))
    }
}

lane_kernel!("avx2,fma");
