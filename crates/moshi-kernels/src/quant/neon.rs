//! aarch64 NEON instruction set for the lane kernel (`quant::lanes`): 4 `u32` code lanes (16 code
//! bytes) per step; `ucvtf` converts every code, the top one included, in place (as AVX-512's
//! unsigned convert does). NEON is part of every aarch64 CPU.

use std::arch::aarch64::*;

use crate::quant::F16_TO_F32;
use crate::ScaleFormat;

/// Two weight rows per matrix-matrix tile of the lane kernel (`quant::passes`): never (two not measured on an aarch64 machine).
pub(crate) const PAIRED_FROM_M: usize = usize::MAX;

/// f32 lanes per vector (and `u32` code words per block).
pub(crate) const LANES: usize = 4;

/// The top code of a lane is converted in place (`q · 2^(BITS·(32/BITS - 1))`), like the others.
pub(crate) const TOP_UNSCALED: bool = false;

type F = float32x4_t;
type I = uint32x4_t;

fn available() -> bool {
    std::arch::is_aarch64_feature_detected!("neon")
}

#[target_feature(enable = "neon")]
#[inline]
pub(crate) fn fzero() -> F {
    vdupq_n_f32(0.0)
}

#[target_feature(enable = "neon")]
#[inline]
fn izero() -> I {
    vdupq_n_u32(0)
}

/// # Safety
/// `p` must point to 4 readable floats.
#[target_feature(enable = "neon")]
#[inline]
pub(crate) unsafe fn fload(p: *const f32) -> F {
    // SAFETY: forwarded contract.
    unsafe { vld1q_f32(p) }
}

/// # Safety
/// `p` must point to 4 writable floats.
#[target_feature(enable = "neon")]
#[inline]
pub(crate) unsafe fn fstore(p: *mut f32, v: F) {
    // SAFETY: forwarded contract.
    unsafe { vst1q_f32(p, v) }
}

#[target_feature(enable = "neon")]
#[inline]
fn fset1(v: f32) -> F {
    vdupq_n_f32(v)
}

#[target_feature(enable = "neon")]
#[inline]
pub(crate) fn fmul(a: F, b: F) -> F {
    vmulq_f32(a, b)
}

/// `a · b + c`, one rounding.
#[target_feature(enable = "neon")]
#[inline]
pub(crate) fn ffma(a: F, b: F, c: F) -> F {
    vfmaq_f32(c, a, b)
}

/// Horizontal sum of 4 lanes (pairwise: `(v0 + v1) + (v2 + v3)`).
#[target_feature(enable = "neon")]
#[inline]
pub(crate) fn fsum(v: F) -> f32 {
    vaddvq_f32(v)
}

/// [`fsum`] of each vector.
#[target_feature(enable = "neon")]
#[inline]
pub(crate) fn fsums<const N: usize>(v: [F; N]) -> [f32; N] {
    // The closure inherits this function's features.
    crate::quant::sums_one_by_one(v, |v| fsum(v))
}

/// Lane `i` of the result is lane `idx[i]` of `v` (`idx[i] < 4`): a byte table lookup with each
/// lane index turned into its four byte indices.
#[target_feature(enable = "neon")]
#[inline]
fn fpermute(idx: I, v: F) -> F {
    let bytes = vmlaq_u32(vdupq_n_u32(0x0302_0100), idx, vdupq_n_u32(0x0404_0404));
    vreinterpretq_f32_u8(vqtbl1q_u8(
        vreinterpretq_u8_f32(v),
        vreinterpretq_u8_u32(bytes),
    ))
}

/// # Safety
/// `p` must point to 4 readable `i32`.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn iload(p: *const i32) -> I {
    // SAFETY: forwarded contract.
    unsafe { vld1q_u32(p as *const u32) }
}

/// The first `n < 4` lanes from `p`, zeros in the others (which are not read).
///
/// # Safety
/// `p` must point to `n` readable `i32`.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn iload_lanes(p: *const i32, n: usize) -> I {
    let mut lanes = [0u32; LANES];
    // SAFETY: `n` readable `i32` from `p`, into the first `n < 4` of `lanes`.
    unsafe { std::ptr::copy_nonoverlapping(p as *const u32, lanes.as_mut_ptr(), n) };
    // SAFETY: 4 `u32`.
    unsafe { vld1q_u32(lanes.as_ptr()) }
}

/// 4 bf16 values as f32 (exact: the bits shifted into the high half).
///
/// # Safety
/// `p` must point to 4 readable `u16`.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn widen_bf16(p: *const u16) -> F {
    // SAFETY: forwarded contract (8 bytes).
    let h = unsafe { vld1_u16(p) };
    vreinterpretq_f32_u32(vshll_n_u16::<16>(h))
}

/// 4 finite f16 values as f32 (exact), with the bit arithmetic of the AVX2 module's
/// `widen_f16` (stable Rust has no NEON f16 conversion): magnitude bits in f32's places, times
/// `2^112`, then the sign.
///
/// # Safety
/// `p` must point to 4 readable `u16`.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn widen_f16(p: *const u16) -> F {
    // SAFETY: forwarded contract (8 bytes).
    let h = vmovl_u16(unsafe { vld1_u16(p) });
    let magnitude = vshlq_n_u32::<13>(vandq_u32(h, vdupq_n_u32(0x7fff)));
    let sign = vshlq_n_u32::<16>(vandq_u32(h, vdupq_n_u32(0x8000)));
    let unsigned = vmulq_f32(vreinterpretq_f32_u32(magnitude), vdupq_n_f32(F16_TO_F32));
    vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(unsigned), sign))
}

/// 4 scales or biases of `format` from `p` as f32 (exact).
///
/// # Safety
/// `p` must point to 4 readable `u16`.
#[target_feature(enable = "neon")]
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

/// Code `k` of every lane as `q · 2^(BITS·k)` (exact: at most 8 significant bits).
#[target_feature(enable = "neon")]
#[inline]
fn decode<const BITS: usize>(d: I, k: usize) -> F {
    let mask = vdupq_n_u32(((1u32 << BITS) - 1) << (BITS * k));
    vcvtq_f32_u32(vandq_u32(d, mask))
}

lane_kernel!("neon");
