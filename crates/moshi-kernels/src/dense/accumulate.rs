//! `y += c_0 · r_0 + c_1 · r_1 + …` over a few rows at once, in row order: the value pass of
//! attention (`out_h += p_j · v_j` over the cached positions `j`). Every element is updated as
//! `y = y + c_r · r[d]` for `r = 0, 1, …`, one product and one sum each (no fused multiply-add),
//! so the SIMD kernels give the bits of the plain loop, whatever the number of rows per call.
//! Several rows per call load and store `y` once for all of them. Rows are f32 or bf16 bits
//! (widened exactly).

use crate::elem::WeightElem;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use crate::InstructionSet;
use crate::Kernel;

/// `y[d] = (…((y[d] + coefs[0] · rows[0][d]) + coefs[1] · rows[1][d]) …)` for every `d`, with
/// `kernel` ([`Kernel::detect`]'s choice if this CPU lacks it).
///
/// # Panics
/// If a row is shorter than `y` (caller bug).
#[inline]
pub fn accumulate_rows<const R: usize, E: WeightElem>(
    kernel: Kernel,
    y: &mut [f32],
    coefs: [f32; R],
    rows: [&[E]; R],
) {
    assert!(
        rows.iter().all(|r| r.len() >= y.len()),
        "accumulate_rows: a row is shorter than the output"
    );
    match kernel.or_detected().instruction_set() {
        // SAFETY (all arms): the kernel is available (checked); rows hold y.len() values.
        #[cfg(target_arch = "x86_64")]
        InstructionSet::Avx512 => unsafe { avx512::accumulate(y, coefs, rows) },
        #[cfg(target_arch = "x86_64")]
        InstructionSet::Avx2 => unsafe { avx2::accumulate(y, coefs, rows) },
        #[cfg(target_arch = "aarch64")]
        InstructionSet::Neon => unsafe { neon::accumulate(y, coefs, rows) },
        _ => accumulate_scalar(y, 0, coefs, rows),
    }
}

/// The plain loop from element `from` on.
#[inline(always)]
fn accumulate_scalar<const R: usize, E: WeightElem>(
    y: &mut [f32],
    from: usize,
    coefs: [f32; R],
    rows: [&[E]; R],
) {
    for (d, v) in y.iter_mut().enumerate().skip(from) {
        let mut acc = *v;
        for r in 0..R {
            acc += coefs[r] * rows[r][d].to_f32();
        }
        *v = acc;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use crate::elem::WeightElem;

    /// 16 elements per step, the rest with the plain loop.
    ///
    /// # Safety
    /// The CPU must support AVX-512F and AVX2 (the row loaders use both); every row holds at
    /// least `y.len()` values.
    #[target_feature(enable = "avx512f,avx2")]
    #[allow(clippy::needless_range_loop)] // plain index loops keep the vectors in registers
    pub(super) unsafe fn accumulate<const R: usize, E: WeightElem>(
        y: &mut [f32],
        coefs: [f32; R],
        rows: [&[E]; R],
    ) {
        let mut c = [_mm512_setzero_ps(); R];
        for r in 0..R {
            c[r] = _mm512_set1_ps(coefs[r]);
        }
        let n = y.len();
        let mut d = 0;
        while d + 16 <= n {
            // SAFETY: elements d..d + 16 lie inside y and every row (caller's contract).
            unsafe {
                let mut acc = _mm512_loadu_ps(y.as_ptr().add(d));
                for r in 0..R {
                    let v = E::load16(rows[r].as_ptr().add(d));
                    acc = _mm512_add_ps(acc, _mm512_mul_ps(c[r], v));
                }
                _mm512_storeu_ps(y.as_mut_ptr().add(d), acc);
            }
            d += 16;
        }
        super::accumulate_scalar(y, d, coefs, rows);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use crate::elem::WeightElem;

    /// 8 elements per step, the rest with the plain loop.
    ///
    /// # Safety
    /// The CPU must support AVX2; every row holds at least `y.len()` values.
    #[target_feature(enable = "avx2")]
    #[allow(clippy::needless_range_loop)] // plain index loops keep the vectors in registers
    pub(super) unsafe fn accumulate<const R: usize, E: WeightElem>(
        y: &mut [f32],
        coefs: [f32; R],
        rows: [&[E]; R],
    ) {
        let mut c = [_mm256_setzero_ps(); R];
        for r in 0..R {
            c[r] = _mm256_set1_ps(coefs[r]);
        }
        let n = y.len();
        let mut d = 0;
        while d + 8 <= n {
            // SAFETY: elements d..d + 8 lie inside y and every row (caller's contract).
            unsafe {
                let mut acc = _mm256_loadu_ps(y.as_ptr().add(d));
                for r in 0..R {
                    let v = E::load8(rows[r].as_ptr().add(d));
                    acc = _mm256_add_ps(acc, _mm256_mul_ps(c[r], v));
                }
                _mm256_storeu_ps(y.as_mut_ptr().add(d), acc);
            }
            d += 8;
        }
        super::accumulate_scalar(y, d, coefs, rows);
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::*;

    use crate::elem::WeightElem;

    /// 4 elements per step, the rest with the plain loop.
    ///
    /// # Safety
    /// Every row holds at least `y.len()` values (NEON is part of every aarch64 CPU).
    #[target_feature(enable = "neon")]
    #[allow(clippy::needless_range_loop)] // plain index loops keep the vectors in registers
    pub(super) unsafe fn accumulate<const R: usize, E: WeightElem>(
        y: &mut [f32],
        coefs: [f32; R],
        rows: [&[E]; R],
    ) {
        let mut c = [vdupq_n_f32(0.0); R];
        for r in 0..R {
            c[r] = vdupq_n_f32(coefs[r]);
        }
        let n = y.len();
        let mut d = 0;
        while d + 4 <= n {
            // SAFETY: elements d..d + 4 lie inside y and every row (caller's contract).
            unsafe {
                let mut acc = vld1q_f32(y.as_ptr().add(d));
                for r in 0..R {
                    let v = E::load4(rows[r].as_ptr().add(d));
                    acc = vaddq_f32(acc, vmulq_f32(c[r], v));
                }
                vst1q_f32(y.as_mut_ptr().add(d), acc);
            }
            d += 4;
        }
        super::accumulate_scalar(y, d, coefs, rows);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elem::f32_to_bf16_bits;

    /// A small deterministic generator (xorshift) of values in [-1.5, 1.5).
    fn random(len: usize, state: &mut u64) -> Vec<f32> {
        (0..len)
            .map(|_| {
                *state ^= *state << 13;
                *state ^= *state >> 7;
                *state ^= *state << 17;
                ((*state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0
            })
            .collect()
    }

    /// Every kernel this CPU has gives the plain loop's bits, at lengths around the vector
    /// widths and for 1 to 4 rows per call; 4 rows at once equal 4 calls of one row.
    #[test]
    fn kernels_equal_the_plain_loop_bit_for_bit() {
        let mut rng = 11u64;
        for len in [0, 1, 7, 8, 9, 15, 16, 17, 33, 128, 130] {
            let rows: Vec<Vec<f32>> = (0..4).map(|_| random(len + 3, &mut rng)).collect();
            let coefs = [0.3f32, -1.7, 2.9e-3, 0.61];
            let start = random(len, &mut rng);
            let mut expected = start.clone();
            for (c, row) in coefs.iter().zip(&rows) {
                for (v, x) in expected.iter_mut().zip(row) {
                    *v += c * x;
                }
            }
            for kernel in Kernel::available() {
                let mut four = start.clone();
                let refs: [&[f32]; 4] = std::array::from_fn(|r| &rows[r][..]);
                accumulate_rows(kernel, &mut four, coefs, refs);
                let mut one_by_one = start.clone();
                for (c, row) in coefs.iter().zip(&rows) {
                    accumulate_rows(kernel, &mut one_by_one, [*c], [&row[..]]);
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&four), bits(&expected), "{kernel:?} len {len}, 4 rows");
                assert_eq!(
                    bits(&one_by_one),
                    bits(&expected),
                    "{kernel:?} len {len}, 1 row"
                );
            }
        }
    }

    /// bf16 and 8-bit rows: the kernels give the plain loop's bits over the exactly widened
    /// values.
    #[test]
    fn narrow_rows_equal_the_plain_loop_bit_for_bit() {
        narrow_rows_equal_the_plain_loop(12, f32_to_bf16_bits);
        narrow_rows_equal_the_plain_loop(13, |v| (v * 84.0).round() as i8);
    }

    fn narrow_rows_equal_the_plain_loop<E: WeightElem + std::fmt::Debug>(
        seed: u64,
        narrow: fn(f32) -> E,
    ) {
        let mut rng = seed;
        for len in [0, 5, 8, 16, 23, 128] {
            let rows: Vec<Vec<E>> = (0..4)
                .map(|_| random(len, &mut rng).into_iter().map(narrow).collect())
                .collect();
            let coefs = [1.5f32, -0.25, 3.3e-2, 0.9];
            let start = random(len, &mut rng);
            let mut expected = start.clone();
            for (c, row) in coefs.iter().zip(&rows) {
                for (v, &x) in expected.iter_mut().zip(row) {
                    *v += c * x.to_f32();
                }
            }
            for kernel in Kernel::available() {
                let mut got = start.clone();
                let refs: [&[E]; 4] = std::array::from_fn(|r| &rows[r][..]);
                accumulate_rows(kernel, &mut got, coefs, refs);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&expected), "{kernel:?} len {len}");
            }
        }
    }
    #[test]
    #[should_panic(expected = "shorter than the output")]
    fn a_short_row_is_refused() {
        let mut y = vec![0f32; 8];
        accumulate_rows(Kernel::Portable, &mut y, [1.0], [&[1.0f32; 4][..]]);
    }
}
