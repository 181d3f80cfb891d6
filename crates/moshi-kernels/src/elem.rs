//! The weight element types of the dense kernels (f32, bf16 as its `u16` bits, and `i8` codes
//! whose scale the caller applies, each widened exactly), the accumulator width and the one lane
//! reduction every dense kernel uses.

/// Accumulator lanes of the dense kernels: one AVX-512 register, two AVX2 ones. The fixed-order
/// matrix-vector kernels keep `2 * LANES` accumulators (see [`crate::dense`]).
pub const LANES: usize = 16;

/// Converts bf16 bits to f32 (exact).
#[inline(always)]
pub fn bf16_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// f32 -> bf16 bits, round to nearest even (NaN kept quiet), as PyTorch's `.to(torch.bfloat16)`.
#[inline]
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let rounding = 0x7FFF + ((b >> 16) & 1);
    ((b.wrapping_add(rounding)) >> 16) as u16
}

/// Sums `N` accumulator lanes (`N` a power of two) by halving: `v[i] += v[i + N/2]` for
/// `i < N/2`, then the same on the first half, down to one value. The order every dense kernel
/// reduces in; the SIMD reductions reproduce it exactly.
#[inline(always)]
pub fn reduce_lanes<const N: usize>(acc: &[f32; N]) -> f32 {
    let mut v = *acc;
    let mut width = N / 2;
    while width > 0 {
        for l in 0..width {
            v[l] += v[l + width];
        }
        width /= 2;
    }
    v[0]
}

/// A weight (or cached key/value) element the dense kernels read: `f32`, bf16 bits (`u16`) or an
/// 8-bit code (`i8`, its scale applied by the caller), widened exactly to f32. Sealed: the SIMD
/// loads are this crate's business.
pub trait WeightElem: Copy + Send + Sync + sealed::Sealed + 'static {
    /// The value as f32 (exact).
    fn to_f32(self) -> f32;

    /// The first [`LANES`] elements of `chunk` as f32.
    #[inline(always)]
    fn lanes(chunk: &[Self]) -> [f32; LANES] {
        let c: &[Self; LANES] = chunk[..LANES].try_into().expect("lane chunk");
        c.map(Self::to_f32)
    }

    /// 8 elements at `p`, widened (AVX2).
    ///
    /// # Safety
    /// The CPU must support AVX2; 8 elements must be readable at `p`.
    #[cfg(target_arch = "x86_64")]
    #[doc(hidden)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;

    /// 16 elements at `p`, widened (AVX-512).
    ///
    /// # Safety
    /// The CPU must support AVX-512F and AVX2; 16 elements must be readable at `p`.
    #[cfg(target_arch = "x86_64")]
    #[doc(hidden)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;

    /// 4 elements at `p`, widened (NEON).
    ///
    /// # Safety
    /// 4 elements must be readable at `p` (NEON is part of every aarch64 CPU).
    #[cfg(target_arch = "aarch64")]
    #[doc(hidden)]
    unsafe fn load4(p: *const Self) -> std::arch::aarch64::float32x4_t;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for u16 {}
    impl Sealed for i8 {}
}

impl WeightElem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }

    #[inline(always)]
    fn lanes(chunk: &[Self]) -> [f32; LANES] {
        chunk[..LANES].try_into().expect("lane chunk")
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller guarantees 8 readable f32 at `p`.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f,avx2")]
    unsafe fn load16(p: *const f32) -> std::arch::x86_64::__m512 {
        // SAFETY: the caller guarantees 16 readable f32 at `p`.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p) }
    }

    #[cfg(target_arch = "aarch64")]
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn load4(p: *const f32) -> std::arch::aarch64::float32x4_t {
        // SAFETY: the caller guarantees 4 readable f32 at `p`.
        unsafe { std::arch::aarch64::vld1q_f32(p) }
    }
}

impl WeightElem for u16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16_bits_to_f32(self)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load8(p: *const u16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller guarantees 8 readable u16 at `p`.
        let h = unsafe { _mm_loadu_si128(p as *const __m128i) };
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f,avx2")]
    unsafe fn load16(p: *const u16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller guarantees 16 readable u16 at `p`.
        let h = unsafe { _mm256_loadu_si256(p as *const __m256i) };
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
    }

    #[cfg(target_arch = "aarch64")]
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn load4(p: *const u16) -> std::arch::aarch64::float32x4_t {
        use std::arch::aarch64::*;
        // SAFETY: the caller guarantees 4 readable u16 at `p`.
        let h = unsafe { vld1_u16(p) };
        vreinterpretq_f32_u32(vshll_n_u16::<16>(h))
    }
}

impl WeightElem for i8 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from(self)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load8(p: *const i8) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller guarantees 8 readable i8 at `p`.
        let b = unsafe { _mm_loadl_epi64(p as *const __m128i) };
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b))
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f,avx2")]
    unsafe fn load16(p: *const i8) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller guarantees 16 readable i8 at `p`.
        let b = unsafe { _mm_loadu_si128(p as *const __m128i) };
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b))
    }

    #[cfg(target_arch = "aarch64")]
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn load4(p: *const i8) -> std::arch::aarch64::float32x4_t {
        use std::arch::aarch64::*;
        // SAFETY: the caller guarantees 4 readable i8 at `p`.
        let word = unsafe { (p as *const i32).read_unaligned() };
        let bytes = vreinterpret_s8_s32(vdup_n_s32(word));
        vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(bytes))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halving_reduction_matches_the_written_out_orders() {
        let l: [f32; 32] = std::array::from_fn(|i| ((i * 7919 % 97) as f32 * 0.37).sin() * 1e3);
        // 32 lanes: the fixed order of the matrix-vector kernels, written out.
        let t: [f32; 8] = std::array::from_fn(|i| (l[i] + l[16 + i]) + (l[8 + i] + l[24 + i]));
        let u = [t[0] + t[4], t[1] + t[5], t[2] + t[6], t[3] + t[7]];
        let v = [u[0] + u[2], u[1] + u[3]];
        assert_eq!(reduce_lanes(&l).to_bits(), (v[0] + v[1]).to_bits());
        let l16: [f32; 16] = std::array::from_fn(|i| l[i]);
        let w: [f32; 8] = std::array::from_fn(|i| l16[i] + l16[i + 8]);
        let x = [w[0] + w[4], w[1] + w[5], w[2] + w[6], w[3] + w[7]];
        let y = [x[0] + x[2], x[1] + x[3]];
        assert_eq!(reduce_lanes(&l16).to_bits(), (y[0] + y[1]).to_bits());
    }

    #[test]
    fn bf16_rounding_is_to_nearest_even() {
        assert_eq!(f32_to_bf16_bits(1.0), 0x3F80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3F80_8000)), 0x3F80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3F81_8000)), 0x3F82);
        assert!(bf16_bits_to_f32(f32_to_bf16_bits(f32::NAN)).is_nan());
        for x in [0.1f32, -3.7, 1e-30, 6.5e4] {
            assert_eq!(f32_to_bf16_bits(x), half::bf16::from_f32(x).to_bits());
        }
    }
}
