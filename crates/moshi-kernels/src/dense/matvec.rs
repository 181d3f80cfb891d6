//! Matrix-vector kernels for one-token-at-a-time inference: `y = W · x` with `W` row-major
//! `[n, k]` in bf16 (widened exactly) or f32, f32 accumulation, split over output rows on the
//! thread team for large matrices.
//!
//! Every kernel accumulates in one fixed order, so the SIMD and the portable paths give
//! bit-identical results: element `j` of each `2 * LANES`-wide block goes to lane `j % 32`; the
//! lanes are reduced by [`reduce_lanes`] (halving), then the `k % 32` trailing elements are added
//! one by one. Products and sums are separate roundings (no fused multiply-add), as in the scalar
//! reference.

use crate::elem::{reduce_lanes, WeightElem, LANES};
use crate::{InstructionSet, Kernel};

/// Below this many weight elements a product runs on the calling thread.
const PARALLEL_MIN_ELEMENTS: usize = 1 << 17;
/// Lanes of the fixed accumulation order.
const BLOCK: usize = 2 * LANES;

/// Portable reference: one row dotted with `x` in the fixed order.
#[inline(always)]
fn dot_scalar<T: WeightElem>(row: &[T], x: &[f32]) -> f32 {
    let k = row.len().min(x.len());
    let blocks = k / BLOCK;
    let mut l = [0f32; BLOCK];
    for b in 0..blocks {
        let (wr, xr) = (
            &row[b * BLOCK..(b + 1) * BLOCK],
            &x[b * BLOCK..(b + 1) * BLOCK],
        );
        for j in 0..BLOCK {
            l[j] += wr[j].to_f32() * xr[j];
        }
    }
    let mut s = reduce_lanes(&l);
    for j in blocks * BLOCK..k {
        s += row[j].to_f32() * x[j];
    }
    s
}

/// Portable reference: one bf16 row dotted with `x` in the fixed order.
pub fn dot_bf16_scalar(row: &[u16], x: &[f32]) -> f32 {
    dot_scalar(row, x)
}

/// Portable reference: one f32 row dotted with `x` in the fixed order.
pub fn dot_f32_scalar(row: &[f32], x: &[f32]) -> f32 {
    dot_scalar(row, x)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::BLOCK;
    use crate::elem::WeightElem;

    /// Sums the four accumulators in the fixed order.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn reduce(a0: __m256, a1: __m256, a2: __m256, a3: __m256) -> f32 {
        let t = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
        let u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
        let v = _mm_add_ps(u, _mm_movehl_ps(u, u));
        let s = _mm_add_ss(v, _mm_shuffle_ps(v, v, 0b01));
        _mm_cvtss_f32(s)
    }

    /// `R` rows at once, interleaving their weight streams; each row keeps the fixed
    /// accumulation order (lanes `8q..8q + 8` of each block in `acc[r][q]`).
    ///
    /// # Safety
    /// The CPU must support AVX2; every row must have `x.len()` elements.
    #[target_feature(enable = "avx2")]
    #[allow(clippy::needless_range_loop)]
    pub(super) unsafe fn dotn<const R: usize, E: WeightElem>(
        rows: [&[E]; R],
        x: &[f32],
    ) -> [f32; R] {
        let k = x.len();
        let blocks = k / BLOCK;
        let xp = x.as_ptr();
        let wp = rows.map(|r| r.as_ptr());
        let mut acc = [[_mm256_setzero_ps(); 4]; R];
        for b in 0..blocks {
            let o = b * BLOCK;
            // SAFETY: o + 32 <= k for every block; every row and x hold k elements.
            unsafe {
                for q in 0..4 {
                    let xq = _mm256_loadu_ps(xp.add(o + 8 * q));
                    for r in 0..R {
                        acc[r][q] = _mm256_add_ps(
                            acc[r][q],
                            _mm256_mul_ps(E::load8(wp[r].add(o + 8 * q)), xq),
                        );
                    }
                }
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            let mut s = reduce(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
            for j in blocks * BLOCK..k {
                s += rows[r][j].to_f32() * x[j];
            }
            out[r] = s;
        }
        out
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::BLOCK;
    use crate::elem::WeightElem;

    /// Folds lanes 0..16 (+) 16..32 held as `lo`/`hi` into the fixed order, then reduces.
    #[inline]
    #[target_feature(enable = "avx512f,avx2")]
    fn reduce(lo: __m512, hi: __m512) -> f32 {
        // s[i] = l[i] + l[16+i]; t[i] = s[i] + s[8+i] = (l[i] + l[16+i]) + (l[8+i] + l[24+i]).
        let s = _mm512_add_ps(lo, hi);
        let s_lo = _mm512_castps512_ps256(s);
        let s_hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1));
        let t = _mm256_add_ps(s_lo, s_hi);
        let u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
        let v = _mm_add_ps(u, _mm_movehl_ps(u, u));
        _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 0b01)))
    }

    /// `R` rows at once, interleaving their weight streams; each row keeps the fixed
    /// accumulation order (lanes 0..16 of each block in `lo`, 16..32 in `hi`).
    ///
    /// # Safety
    /// The CPU must support AVX-512F; every row must have `x.len()` elements.
    #[target_feature(enable = "avx512f,avx2")]
    #[allow(clippy::needless_range_loop)]
    pub(super) unsafe fn dotn<const R: usize, E: WeightElem>(
        rows: [&[E]; R],
        x: &[f32],
    ) -> [f32; R] {
        let k = x.len();
        let blocks = k / BLOCK;
        let xp = x.as_ptr();
        let wp = rows.map(|r| r.as_ptr());
        let mut lo = [_mm512_setzero_ps(); R];
        let mut hi = [_mm512_setzero_ps(); R];
        for b in 0..blocks {
            let o = b * BLOCK;
            // SAFETY: o + 32 <= k for every block; every row and x hold k elements.
            unsafe {
                let (x0, x1) = (_mm512_loadu_ps(xp.add(o)), _mm512_loadu_ps(xp.add(o + 16)));
                for r in 0..R {
                    lo[r] = _mm512_add_ps(lo[r], _mm512_mul_ps(E::load16(wp[r].add(o)), x0));
                    hi[r] = _mm512_add_ps(hi[r], _mm512_mul_ps(E::load16(wp[r].add(o + 16)), x1));
                }
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            let mut s = reduce(lo[r], hi[r]);
            for j in blocks * BLOCK..k {
                s += rows[r][j].to_f32() * x[j];
            }
            out[r] = s;
        }
        out
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::*;

    use super::BLOCK;
    use crate::elem::WeightElem;

    /// Reduces the 32 lanes (`acc[q]` holding lanes `4q..4q + 4`) in the fixed halving order of
    /// `reduce_lanes`: lanes `i + 16`, then `i + 8`, `i + 4`, `i + 2`, `i + 1` onto lane `i`.
    #[inline]
    #[target_feature(enable = "neon")]
    fn reduce(acc: [float32x4_t; 8]) -> f32 {
        let a = [
            vaddq_f32(acc[0], acc[4]),
            vaddq_f32(acc[1], acc[5]),
            vaddq_f32(acc[2], acc[6]),
            vaddq_f32(acc[3], acc[7]),
        ];
        let b = [vaddq_f32(a[0], a[2]), vaddq_f32(a[1], a[3])];
        let c = vaddq_f32(b[0], b[1]);
        vpadds_f32(vadd_f32(vget_low_f32(c), vget_high_f32(c)))
    }

    /// `R` rows at once, interleaving their weight streams; each row keeps the fixed
    /// accumulation order (lanes `4q..4q + 4` of each block in `acc[r][q]`).
    ///
    /// # Safety
    /// Every row must have `x.len()` elements (NEON is part of every aarch64 CPU).
    #[target_feature(enable = "neon")]
    #[allow(clippy::needless_range_loop)]
    pub(super) unsafe fn dotn<const R: usize, E: WeightElem>(
        rows: [&[E]; R],
        x: &[f32],
    ) -> [f32; R] {
        let k = x.len();
        let blocks = k / BLOCK;
        let xp = x.as_ptr();
        let wp = rows.map(|r| r.as_ptr());
        let mut acc = [[vdupq_n_f32(0.0); 8]; R];
        for b in 0..blocks {
            let o = b * BLOCK;
            // SAFETY: o + 32 <= k for every block; every row and x hold k elements.
            unsafe {
                for q in 0..8 {
                    let xq = vld1q_f32(xp.add(o + 4 * q));
                    for r in 0..R {
                        acc[r][q] =
                            vaddq_f32(acc[r][q], vmulq_f32(E::load4(wp[r].add(o + 4 * q)), xq));
                    }
                }
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            let mut s = reduce(acc[r]);
            for j in blocks * BLOCK..k {
                s += rows[r][j].to_f32() * x[j];
            }
            out[r] = s;
        }
        out
    }
}

/// `R` rows (f32, or bf16 bits) · x at once, each in the fixed order (the bits of the scalar dot
/// product per row, whatever the kernel). The SIMD kernels interleave the rows' weight streams.
/// A kernel this CPU lacks is replaced by [`Kernel::detect`]'s choice.
///
/// # Panics
/// If a row's length differs from `x`'s (caller bug).
#[inline]
pub fn dot_rows<const R: usize, E: WeightElem>(
    kernel: Kernel,
    rows: [&[E]; R],
    x: &[f32],
) -> [f32; R] {
    assert!(
        rows.iter().all(|r| r.len() == x.len()),
        "dot_rows: row and x lengths differ"
    );
    match kernel.or_detected().instruction_set() {
        // SAFETY (all arms): the kernel is available (checked); equal lengths (asserted).
        #[cfg(target_arch = "x86_64")]
        InstructionSet::Avx512 => unsafe { avx512::dotn(rows, x) },
        #[cfg(target_arch = "x86_64")]
        InstructionSet::Avx2 => unsafe { avx2::dotn(rows, x) },
        #[cfg(target_arch = "aarch64")]
        InstructionSet::Neon => unsafe { neon::dotn(rows, x) },
        _ => rows.map(|r| dot_scalar(r, x)),
    }
}

/// Rows per pass of the SIMD kernels in a matrix-vector product: several bf16 weight rows per
/// pass (4 with AVX2, 8 with AVX-512) share each activation load, and measured faster than one
/// row at a time on a 22528 x 4096 matrix
/// (docs/performance.md#rows-per-pass-and-prefetch-distances-qmv-weights-streamed-from-dram).
/// NEON: 2 (16 of its 32 registers hold the two rows' accumulators; not measured on an aarch64
/// machine).
fn rows_per_pass(kernel: Kernel) -> usize {
    match kernel.instruction_set() {
        InstructionSet::Avx512 => 8,
        InstructionSet::Avx2 => 4,
        InstructionSet::Neon => 2,
        InstructionSet::Portable => 1,
    }
}

/// Output rows of `w` (`out_t.len() / m` rows of `k`) against `m` activation rows `xs`:
/// `out_t[r * m + i] = w[r] · xs[i]`, several weight rows per pass where the kernel does so, each
/// pass applied to every activation row while its weight rows are in cache.
fn rows_of<E: WeightElem>(
    w: &[E],
    k: usize,
    xs: &[f32],
    m: usize,
    out_t: &mut [f32],
    kernel: Kernel,
) {
    match rows_per_pass(kernel) {
        8 => rows_interleaved::<8, E>(w, k, xs, m, out_t, kernel),
        4 => rows_interleaved::<4, E>(w, k, xs, m, out_t, kernel),
        2 => rows_interleaved::<2, E>(w, k, xs, m, out_t, kernel),
        _ => rows_interleaved::<1, E>(w, k, xs, m, out_t, kernel),
    }
}

/// `R` weight rows per pass, the remaining rows one by one.
#[inline(always)]
fn rows_interleaved<const R: usize, E: WeightElem>(
    w: &[E],
    k: usize,
    xs: &[f32],
    m: usize,
    out_t: &mut [f32],
    kernel: Kernel,
) {
    let n = out_t.len() / m;
    let groups = n / R;
    for (wg, og) in w.chunks_exact(R * k).zip(out_t.chunks_exact_mut(R * m)) {
        let rows: [&[E]; R] = std::array::from_fn(|r| &wg[r * k..(r + 1) * k]);
        for (i, x) in xs.chunks_exact(k).enumerate() {
            for (r, d) in dot_rows(kernel, rows, x).into_iter().enumerate() {
                og[r * m + i] = d;
            }
        }
    }
    for (row, o) in w[groups * R * k..]
        .chunks_exact(k)
        .zip(out_t[groups * R * m..].chunks_exact_mut(m))
    {
        for (v, x) in o.iter_mut().zip(xs.chunks_exact(k)) {
            *v = dot_rows(kernel, [row], x)[0];
        }
    }
}

/// `ys[m, n] = xs[m, k] · W[n, k]ᵀ` with an explicit choice of kernel (replaced by
/// [`Kernel::detect`]'s if this CPU lacks it) and threading (for tests and benchmarks; [`matmul`]
/// picks both). Every output is the fixed-order dot product of its weight row and activation row,
/// so row `i` of `ys` has the bits of [`matvec_with`] on row `i` of `xs`, whatever `m`, the kernel
/// or the split: the weights are read once for all `m` rows. With `parallel`, large matrices are
/// split evenly over the threads of [`crate::team`] (one part per thread, at least 8 weight rows
/// each; the team's helpers spin between calls, so a call costs no futex wake-up).
///
/// # Panics
/// If `w`, `xs` or `ys` is shorter than `n * k`, `m * k`, `m * n` (caller bug).
#[allow(clippy::too_many_arguments)]
pub fn matmul_with<E: WeightElem>(
    w: &[E],
    n: usize,
    k: usize,
    xs: &[f32],
    m: usize,
    ys: &mut [f32],
    kernel: Kernel,
    parallel: bool,
) {
    assert!(
        w.len() >= n * k && xs.len() >= m * k && ys.len() >= m * n,
        "matmul: bad lengths"
    );
    let kernel = kernel.or_detected();
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        ys[..m * n].fill(0.0);
        return;
    }
    let (w, xs) = (&w[..n * k], &xs[..m * k]);
    let mut transposed = Vec::new();
    let out_t = if m == 1 {
        &mut ys[..n]
    } else {
        transposed.resize(n * m, 0f32);
        &mut transposed[..]
    };
    if parallel && n * k >= PARALLEL_MIN_ELEMENTS && n > 1 {
        let parts = crate::team::threads().min(n.div_ceil(8)).max(1);
        crate::team::run_chunks_mut(out_t, n.div_ceil(parts) * m, &|lo, oc| {
            let (r0, r1) = (lo / m, (lo + oc.len()) / m);
            rows_of(&w[r0 * k..r1 * k], k, xs, m, oc, kernel)
        });
    } else {
        rows_of(w, k, xs, m, out_t, kernel);
    }
    if m > 1 {
        for (r, vals) in transposed.chunks_exact(m).enumerate() {
            for (i, v) in vals.iter().enumerate() {
                ys[i * n + r] = *v;
            }
        }
    }
}

/// `y[n] = W[n, k] · x[k]`: [`matmul_with`] with one activation row.
#[allow(clippy::too_many_arguments)]
pub fn matvec_with<E: WeightElem>(
    w: &[E],
    n: usize,
    k: usize,
    x: &[f32],
    y: &mut [f32],
    kernel: Kernel,
    parallel: bool,
) {
    assert!(x.len() >= k && y.len() >= n, "matvec: bad lengths");
    matmul_with(w, n, k, &x[..k], 1, &mut y[..n], kernel, parallel)
}

/// `ys[m, n] = xs[m, k] · W[n, k]ᵀ` (f32 or bf16 weights): [`Kernel::detect`]'s kernel, threads
/// for large matrices; row `i` has the bits of [`matvec`] on row `i` of `xs`.
pub fn matmul<E: WeightElem>(w: &[E], n: usize, k: usize, xs: &[f32], m: usize, ys: &mut [f32]) {
    matmul_with(w, n, k, xs, m, ys, Kernel::detect(), true)
}

/// `y[n] = W[n, k] · x[k]` (f32 or bf16 weights): [`Kernel::detect`]'s kernel, threads for large
/// matrices.
pub fn matvec<E: WeightElem>(w: &[E], n: usize, k: usize, x: &[f32], y: &mut [f32]) {
    matvec_with(w, n, k, x, y, Kernel::detect(), true)
}

/// `a · b` in the fixed accumulation order ([`Kernel::detect`]'s kernel; bit-identical to
/// [`dot_f32_scalar`]).
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let k = a.len().min(b.len());
    dot_rows(Kernel::detect(), [&a[..k]], &b[..k])[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, k: usize) -> (Vec<u16>, Vec<f32>, Vec<f32>) {
        let w16: Vec<u16> = (0..n * k)
            .map(|i| half::bf16::from_f32(((i * 7919 % 1000) as f32 * 0.013).sin()).to_bits())
            .collect();
        let w32: Vec<f32> = w16.iter().map(|&b| b.to_f32()).collect();
        let x: Vec<f32> = (0..k).map(|i| (i as f32 * 0.71).cos()).collect();
        (w16, w32, x)
    }

    /// Several f32, bf16 or 8-bit rows at once give each row's single-row bits, on every kernel
    /// this CPU has.
    #[test]
    fn f32_rows_at_once_equal_the_scalar_dot_bit_for_bit() {
        for k in [0, 1, 31, 32, 33, 128, 130] {
            let (w16, w, x) = data(4, k);
            let rows: [&[f32]; 4] = std::array::from_fn(|r| &w[r * k..(r + 1) * k]);
            let expected = rows.map(|r| dot_f32_scalar(r, &x).to_bits());
            let rows16: [&[u16]; 4] = std::array::from_fn(|r| &w16[r * k..(r + 1) * k]);
            let expected16 = rows16.map(|r| dot_bf16_scalar(r, &x).to_bits());
            let w8: Vec<i8> = w.iter().map(|&v| (v * 127.0).round() as i8).collect();
            let rows8: [&[i8]; 4] = std::array::from_fn(|r| &w8[r * k..(r + 1) * k]);
            let expected8 = rows8.map(|r| dot_scalar(r, &x).to_bits());
            for kernel in Kernel::available() {
                let got = dot_rows(kernel, rows, &x).map(f32::to_bits);
                assert_eq!(got, expected, "{kernel:?} k {k}");
                let got16 = dot_rows(kernel, rows16, &x).map(f32::to_bits);
                assert_eq!(got16, expected16, "{kernel:?} k {k} bf16");
                let got8 = dot_rows(kernel, rows8, &x).map(f32::to_bits);
                assert_eq!(got8, expected8, "{kernel:?} k {k} i8");
            }
        }
    }

    #[test]
    fn simd_threaded_and_scalar_paths_are_bit_identical() {
        // k covers: below one block, exact blocks, blocks + tail; n large enough to go parallel.
        for &(n, k) in &[(3usize, 5usize), (17, 32), (9, 77), (1500, 96), (640, 1003)] {
            let (w16, w32, x) = data(n, k);
            let mut reference = vec![0f32; n];
            for r in 0..n {
                reference[r] = dot_bf16_scalar(&w16[r * k..(r + 1) * k], &x);
            }
            let runs = Kernel::available()
                .into_iter()
                .flat_map(|kr| [(kr, false), (kr, true)]);
            for (kernel, par) in runs {
                let mut y = vec![f32::NAN; n];
                matvec_with(&w16, n, k, &x, &mut y, kernel, par);
                assert!(
                    y.iter()
                        .zip(&reference)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "bf16 n={n} k={k} {kernel:?} par={par}"
                );
                let d = dot_f32(&w32[..k], &x);
                assert_eq!(d.to_bits(), reference[0].to_bits(), "dot_f32 k={k}");
                let mut y32 = vec![f32::NAN; n];
                matvec_with(&w32, n, k, &x, &mut y32, kernel, par);
                assert!(
                    y32.iter()
                        .zip(&reference)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "f32 n={n} k={k} {kernel:?} par={par}"
                );
            }
        }
    }

    /// Each row of a many-row product has the bits of the one-row product of that row, for f32
    /// and bf16 weights, every kernel, threaded or not, at sizes with and without leftover rows.
    #[test]
    fn every_row_of_a_matmul_equals_its_matvec_bit_for_bit() {
        for &(n, k, m) in &[
            (7usize, 40usize, 3usize),
            (1500, 96, 5),
            (641, 130, 2),
            (9, 1, 4),
        ] {
            let (w16, w32, _) = data(n, k);
            let xs: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
            for kernel in Kernel::available() {
                for par in [false, true] {
                    let mut ys = vec![f32::NAN; m * n];
                    matmul_with(&w16, n, k, &xs, m, &mut ys, kernel, par);
                    let mut ys32 = vec![f32::NAN; m * n];
                    matmul_with(&w32, n, k, &xs, m, &mut ys32, kernel, par);
                    for i in 0..m {
                        let x = &xs[i * k..(i + 1) * k];
                        let mut y = vec![0f32; n];
                        matvec_with(&w16, n, k, x, &mut y, Kernel::Portable, false);
                        let bits = |v: &[f32]| v.iter().map(|a| a.to_bits()).collect::<Vec<_>>();
                        let what = format!("n {n} k {k} m {m} row {i} {kernel:?} par {par}");
                        assert_eq!(bits(&ys[i * n..(i + 1) * n]), bits(&y), "bf16 {what}");
                        matvec_with(&w32, n, k, x, &mut y, Kernel::Portable, false);
                        assert_eq!(bits(&ys32[i * n..(i + 1) * n]), bits(&y), "f32 {what}");
                    }
                }
            }
        }
    }

    #[test]
    fn matches_f64_dot_product() {
        let (n, k) = (33, 4096);
        let (w16, w32, x) = data(n, k);
        let mut y = vec![0f32; n];
        matvec(&w16, n, k, &x, &mut y);
        for r in 0..n {
            let exact: f64 = (0..k).map(|j| w32[r * k + j] as f64 * x[j] as f64).sum();
            assert!(
                (y[r] as f64 - exact).abs() < 1e-3,
                "row {r}: {} vs {exact}",
                y[r]
            );
        }
    }
}
