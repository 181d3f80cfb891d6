//! AVX-512F instruction set for the lane kernel (`quant::lanes`): 16 `u32` code lanes (64 code
//! bytes) per step; `vcvtudq2ps` converts every code, the top one included, in place.

use std::arch::x86_64::*;

use crate::ScaleFormat;

/// Two weight rows per matrix-matrix tile of the lane kernel (`quant::passes`): from 3 activation
/// rows on, each activation vector loaded once for both (the 7B's q8 LM step in `bench
/// --sessions N` ran faster than with one weight row at 4 and 8 sessions; no gain at 2, where q8
/// is still bound by the code stream:
/// docs/performance.md#rows-per-pass-and-prefetch-distances-qmv-weights-streamed-from-dram).
pub(crate) const PAIRED_FROM_M: usize = 3;

/// f32 lanes per vector (and `u32` code words per block).
pub(crate) const LANES: usize = 16;

/// The top code of a lane is converted in place (`q · 2^(BITS·(32/BITS - 1))`), like the others.
pub(crate) const TOP_UNSCALED: bool = false;

type F = __m512;
type I = __m512i;

fn available() -> bool {
    is_x86_feature_detected!("avx512f")
}

#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn fzero() -> F {
    _mm512_setzero_ps()
}

#[target_feature(enable = "avx512f")]
#[inline]
fn izero() -> I {
    _mm512_setzero_si512()
}

/// # Safety
/// `p` must point to 16 readable floats.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn fload(p: *const f32) -> F {
    // SAFETY: forwarded contract.
    unsafe { _mm512_loadu_ps(p) }
}

/// # Safety
/// `p` must point to 16 writable floats.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn fstore(p: *mut f32, v: F) {
    // SAFETY: forwarded contract.
    unsafe { _mm512_storeu_ps(p, v) }
}

#[target_feature(enable = "avx512f")]
#[inline]
fn fset1(v: f32) -> F {
    _mm512_set1_ps(v)
}

#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn fmul(a: F, b: F) -> F {
    _mm512_mul_ps(a, b)
}

#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn ffma(a: F, b: F, c: F) -> F {
    _mm512_fmadd_ps(a, b, c)
}

#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn fsum(v: F) -> f32 {
    _mm512_reduce_add_ps(v)
}

/// [`fsum`] of each vector, bit for bit (the same halving order: lanes `k` and `k + 8`, then
/// `k + 4`, `k + 2`, `k + 1`), four vectors at a time folded into one: a tile's sums at the end
/// of a short row, where one reduction per vector cost as much as a seventh of the products.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn fsums<const N: usize>(v: [F; N]) -> [f32; N] {
    let mut out = [0f32; N];
    let mut k = 0;
    while k + 4 <= N {
        let four = fsums4(v[k], v[k + 1], v[k + 2], v[k + 3]);
        out[k..k + 4].copy_from_slice(&four);
        k += 4;
    }
    while k < N {
        out[k] = fsum(v[k]);
        k += 1;
    }
    out
}

/// The sums of the lanes of `a`, `b`, `c` and `d`, in [`fsum`]'s order.
#[target_feature(enable = "avx512f")]
#[inline]
fn fsums4(a: F, b: F, c: F, d: F) -> [f32; 4] {
    // Each 256-bit half of `ab` is one vector's lanes k + (k + 8), k < 8.
    let halves = |x: F, y: F| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y),
        )
    };
    let (ab, cd) = (halves(a, b), halves(c, d));
    // Each 128-bit lane: one vector's k + (k + 4), k < 4.
    let quarters = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b10_00_10_00>(ab, cd),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(ab, cd),
    );
    let pairs = _mm512_add_ps(quarters, _mm512_permute_ps::<0b01_00_11_10>(quarters));
    let total = _mm512_add_ps(pairs, _mm512_permute_ps::<0b10_11_00_01>(pairs));
    let mut lanes = [0f32; 16];
    // SAFETY: 16 floats.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), total) };
    [lanes[0], lanes[4], lanes[8], lanes[12]]
}

/// Lane `i` of the result is lane `idx[i]` of `v`.
#[target_feature(enable = "avx512f")]
#[inline]
fn fpermute(idx: I, v: F) -> F {
    _mm512_permutexvar_ps(idx, v)
}

/// # Safety
/// `p` must point to 16 readable `i32`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn iload(p: *const i32) -> I {
    // SAFETY: forwarded contract.
    unsafe { _mm512_loadu_si512(p as *const _) }
}

/// The first `n < 16` lanes from `p`, zeros in the others (which are not read).
///
/// # Safety
/// `p` must point to `n` readable `i32`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn iload_lanes(p: *const i32, n: usize) -> I {
    // SAFETY: masked-off lanes are not accessed.
    unsafe { _mm512_maskz_loadu_epi32(((1u32 << n) - 1) as __mmask16, p) }
}

/// 16 bf16 values as f32 (exact: the bits shifted into the high half).
///
/// # Safety
/// `p` must point to 16 readable `u16`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn widen_bf16(p: *const u16) -> F {
    // SAFETY: forwarded contract (32 bytes).
    let h = unsafe { _mm256_loadu_si256(p as *const __m256i) };
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
}

/// 16 finite f16 values as f32 (exact: the hardware conversion).
///
/// # Safety
/// `p` must point to 16 readable `u16`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn widen_f16(p: *const u16) -> F {
    // SAFETY: forwarded contract (32 bytes).
    let h = unsafe { _mm256_loadu_si256(p as *const __m256i) };
    _mm512_cvtph_ps(h)
}

/// 16 scales or biases of `format` from `p` as f32 (exact).
///
/// # Safety
/// `p` must point to 16 readable `u16`.
#[target_feature(enable = "avx512f")]
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

/// Code `k` of every lane as `q · 2^(BITS·k)` (exact).
#[target_feature(enable = "avx512f")]
#[inline]
fn decode<const BITS: usize>(d: I, k: usize) -> F {
    let mask = _mm512_set1_epi32((((1u32 << BITS) - 1) << (BITS * k)) as i32);
    _mm512_cvtepu32_ps(_mm512_and_si512(d, mask))
}

lane_kernel!("avx512f");

#[cfg(test)]
mod tests {
    use moshi_test_support::XorShift64;

    use super::*;

    /// `fsums` folds four vectors at a time: each sum must be `fsum`'s bit for bit (a tile of one
    /// activation row and a tile of several give a row the same bits), here on lanes of mixed
    /// signs and magnitudes, where another order of the additions would round differently.
    #[test]
    fn batched_sums_equal_each_vectors_sum_bit_for_bit() {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        let mut rng = XorShift64::new(0x5eed);
        for _ in 0..200 {
            let lanes: Vec<f32> = (0..9 * 16)
                .map(|_| {
                    (rng.uniform_f32() - 0.5) * 2f32.powi((rng.uniform_f32() * 40.0) as i32 - 20)
                })
                .collect();
            // SAFETY (all): the CPU has AVX-512F (checked above); 16 floats per vector.
            let v: [F; 9] =
                std::array::from_fn(|k| unsafe { _mm512_loadu_ps(lanes[16 * k..].as_ptr()) });
            let each: Vec<u32> = v.iter().map(|&v| unsafe { fsum(v) }.to_bits()).collect();
            let nine = unsafe { fsums(v) }.map(f32::to_bits);
            let four = unsafe { fsums([v[0], v[1], v[2], v[3]]) }.map(f32::to_bits);
            let two = unsafe { fsums([v[4], v[5]]) }.map(f32::to_bits);
            assert_eq!(nine.to_vec(), each);
            assert_eq!(four.to_vec(), each[..4]);
            assert_eq!(two.to_vec(), each[4..6]);
        }
    }
}
