//! Matrix-vector kernels for one-token-at-a-time inference: `y = W · x` with `W` row-major
//! `[n, k]` in bf16 (upcast exactly) or f32, f32 accumulation, AVX2 when the CPU has it,
//! split over output rows with rayon for large matrices.
//!
//! Every kernel accumulates in one fixed order, so the SIMD and the portable paths give
//! bit-identical results: element `j` of each 32-wide block goes to lane `j % 32`; the lanes
//! are reduced as `t[i] = (l[i] + l[8+i]) + (l[16+i] + l[24+i])` (i < 8), then
//! `u[i] = t[i] + t[4+i]` (i < 4), `v[i] = u[i] + u[2+i]` (i < 2), `s = v[0] + v[1]`; the
//! `k % 32` trailing elements are then added one by one. Products and sums are separate
//! roundings (no fused multiply-add), as in the scalar reference.

use rayon::prelude::*;

/// Below this many weight elements a product runs on the calling thread.
const PARALLEL_MIN_ELEMENTS: usize = 1 << 17;
/// Lanes of the fixed accumulation order.
const LANES: usize = 32;

#[inline(always)]
fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

#[inline(always)]
fn reduce_lanes(l: &[f32; LANES]) -> f32 {
    let mut t = [0f32; 8];
    for i in 0..8 {
        t[i] = (l[i] + l[8 + i]) + (l[16 + i] + l[24 + i]);
    }
    let u = [t[0] + t[4], t[1] + t[5], t[2] + t[6], t[3] + t[7]];
    let v = [u[0] + u[2], u[1] + u[3]];
    v[0] + v[1]
}

/// Portable reference: one bf16 row dotted with `x` in the fixed order.
pub fn dot_bf16_scalar(row: &[u16], x: &[f32]) -> f32 {
    let k = row.len().min(x.len());
    let blocks = k / LANES;
    let mut l = [0f32; LANES];
    for b in 0..blocks {
        let (wr, xr) = (&row[b * LANES..(b + 1) * LANES], &x[b * LANES..(b + 1) * LANES]);
        for j in 0..LANES {
            l[j] += bf16_to_f32(wr[j]) * xr[j];
        }
    }
    let mut s = reduce_lanes(&l);
    for j in blocks * LANES..k {
        s += bf16_to_f32(row[j]) * x[j];
    }
    s
}

/// Portable reference: one f32 row dotted with `x` in the fixed order.
pub fn dot_f32_scalar(row: &[f32], x: &[f32]) -> f32 {
    let k = row.len().min(x.len());
    let blocks = k / LANES;
    let mut l = [0f32; LANES];
    for b in 0..blocks {
        let (wr, xr) = (&row[b * LANES..(b + 1) * LANES], &x[b * LANES..(b + 1) * LANES]);
        for j in 0..LANES {
            l[j] += wr[j] * xr[j];
        }
    }
    let mut s = reduce_lanes(&l);
    for j in blocks * LANES..k {
        s += row[j] * x[j];
    }
    s
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::LANES;

    /// Sums the four accumulators in the fixed order.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn reduce(a0: __m256, a1: __m256, a2: __m256, a3: __m256) -> f32 {
        let t = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
        let u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
        let v = _mm_add_ps(u, _mm_movehl_ps(u, u));
        let s = _mm_add_ss(v, _mm_shuffle_ps(v, v, 0b01));
        _mm_cvtss_f32(s)
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load_bf16(p: *const u16) -> __m256 {
        // SAFETY: the caller guarantees 8 readable u16 at `p`.
        let h = unsafe { _mm_loadu_si128(p as *const __m128i) };
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
    }

    /// # Safety
    /// The CPU must support AVX2; `row` and `x` must have the same length.
    #[target_feature(enable = "avx2")]
    pub unsafe fn dot_bf16(row: &[u16], x: &[f32]) -> f32 {
        let k = row.len();
        let blocks = k / LANES;
        let (wp, xp) = (row.as_ptr(), x.as_ptr());
        let (mut a0, mut a1, mut a2, mut a3) =
            (_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps());
        for b in 0..blocks {
            let o = b * LANES;
            // SAFETY: o + 32 <= k for every block; both slices hold k elements.
            unsafe {
                a0 = _mm256_add_ps(a0, _mm256_mul_ps(load_bf16(wp.add(o)), _mm256_loadu_ps(xp.add(o))));
                a1 = _mm256_add_ps(a1, _mm256_mul_ps(load_bf16(wp.add(o + 8)), _mm256_loadu_ps(xp.add(o + 8))));
                a2 = _mm256_add_ps(a2, _mm256_mul_ps(load_bf16(wp.add(o + 16)), _mm256_loadu_ps(xp.add(o + 16))));
                a3 = _mm256_add_ps(a3, _mm256_mul_ps(load_bf16(wp.add(o + 24)), _mm256_loadu_ps(xp.add(o + 24))));
            }
        }
        let mut s = unsafe { reduce(a0, a1, a2, a3) };
        for j in blocks * LANES..k {
            s += super::bf16_to_f32(row[j]) * x[j];
        }
        s
    }

    /// # Safety
    /// The CPU must support AVX2; `row` and `x` must have the same length.
    #[target_feature(enable = "avx2")]
    pub unsafe fn dot_f32(row: &[f32], x: &[f32]) -> f32 {
        let k = row.len();
        let blocks = k / LANES;
        let (wp, xp) = (row.as_ptr(), x.as_ptr());
        let (mut a0, mut a1, mut a2, mut a3) =
            (_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps());
        for b in 0..blocks {
            let o = b * LANES;
            // SAFETY: o + 32 <= k for every block; both slices hold k elements.
            unsafe {
                a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_loadu_ps(wp.add(o)), _mm256_loadu_ps(xp.add(o))));
                a1 = _mm256_add_ps(a1, _mm256_mul_ps(_mm256_loadu_ps(wp.add(o + 8)), _mm256_loadu_ps(xp.add(o + 8))));
                a2 = _mm256_add_ps(a2, _mm256_mul_ps(_mm256_loadu_ps(wp.add(o + 16)), _mm256_loadu_ps(xp.add(o + 16))));
                a3 = _mm256_add_ps(a3, _mm256_mul_ps(_mm256_loadu_ps(wp.add(o + 24)), _mm256_loadu_ps(xp.add(o + 24))));
            }
        }
        let mut s = unsafe { reduce(a0, a1, a2, a3) };
        for j in blocks * LANES..k {
            s += row[j] * x[j];
        }
        s
    }
}

/// Whether the AVX2 kernels are used on this CPU.
#[inline]
pub fn simd_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn rows_bf16(w: &[u16], k: usize, x: &[f32], y: &mut [f32], simd: bool) {
    for (row, yv) in w.chunks_exact(k).zip(y.iter_mut()) {
        #[cfg(target_arch = "x86_64")]
        if simd {
            // SAFETY: `simd` is only true when AVX2 was detected; row and x hold k elements.
            *yv = unsafe { avx2::dot_bf16(row, &x[..k]) };
            continue;
        }
        let _ = simd;
        *yv = dot_bf16_scalar(row, x);
    }
}

fn rows_f32(w: &[f32], k: usize, x: &[f32], y: &mut [f32], simd: bool) {
    for (row, yv) in w.chunks_exact(k).zip(y.iter_mut()) {
        #[cfg(target_arch = "x86_64")]
        if simd {
            // SAFETY: `simd` is only true when AVX2 was detected; row and x hold k elements.
            *yv = unsafe { avx2::dot_f32(row, &x[..k]) };
            continue;
        }
        let _ = simd;
        *yv = dot_f32_scalar(row, x);
    }
}

/// Rows per rayon task: a few tasks per thread, never tiny.
fn rows_per_task(n: usize) -> usize {
    let tasks = rayon::current_num_threads().max(1) * 4;
    n.div_ceil(tasks).max(8)
}

/// `y[n] = W[n, k] · x[k]`, bf16 weights, with an explicit choice of SIMD and threading (for tests
/// and benchmarks; [`matvec_bf16_auto`] picks both).
pub fn matvec_bf16_with(w: &[u16], n: usize, k: usize, x: &[f32], y: &mut [f32], simd: bool, parallel: bool) {
    assert!(w.len() >= n * k && x.len() >= k && y.len() >= n, "matvec_bf16: bad lengths");
    let simd = simd && simd_available();
    if k == 0 {
        y[..n].fill(0.0);
        return;
    }
    let (w, y) = (&w[..n * k], &mut y[..n]);
    if parallel && n * k >= PARALLEL_MIN_ELEMENTS && n > 1 {
        let rows = rows_per_task(n);
        w.par_chunks(rows * k)
            .zip(y.par_chunks_mut(rows))
            .for_each(|(wc, yc)| rows_bf16(wc, k, x, yc, simd));
    } else {
        rows_bf16(w, k, x, y, simd);
    }
}

/// `y[n] = W[n, k] · x[k]`, f32 weights, explicit SIMD / threading choice.
pub fn matvec_f32_with(w: &[f32], n: usize, k: usize, x: &[f32], y: &mut [f32], simd: bool, parallel: bool) {
    assert!(w.len() >= n * k && x.len() >= k && y.len() >= n, "matvec_f32: bad lengths");
    let simd = simd && simd_available();
    if k == 0 {
        y[..n].fill(0.0);
        return;
    }
    let (w, y) = (&w[..n * k], &mut y[..n]);
    if parallel && n * k >= PARALLEL_MIN_ELEMENTS && n > 1 {
        let rows = rows_per_task(n);
        w.par_chunks(rows * k)
            .zip(y.par_chunks_mut(rows))
            .for_each(|(wc, yc)| rows_f32(wc, k, x, yc, simd));
    } else {
        rows_f32(w, k, x, y, simd);
    }
}

/// `a · b` in the fixed accumulation order (AVX2 if available; bit-identical to
/// [`dot_f32_scalar`]).
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let k = a.len().min(b.len());
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        // SAFETY: AVX2 was detected; both slices hold k elements.
        return unsafe { avx2::dot_f32(&a[..k], &b[..k]) };
    }
    dot_f32_scalar(&a[..k], &b[..k])
}

/// `y[n] = W[n, k] · x[k]` with bf16 weights: AVX2 if available, threads for large matrices.
pub fn matvec_bf16_auto(w: &[u16], n: usize, k: usize, x: &[f32], y: &mut [f32]) {
    matvec_bf16_with(w, n, k, x, y, true, true)
}

/// `y[n] = W[n, k] · x[k]` with f32 weights: AVX2 if available, threads for large matrices.
pub fn matvec_f32_auto(w: &[f32], n: usize, k: usize, x: &[f32], y: &mut [f32]) {
    matvec_f32_with(w, n, k, x, y, true, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, k: usize) -> (Vec<u16>, Vec<f32>, Vec<f32>) {
        let w16: Vec<u16> =
            (0..n * k).map(|i| half::bf16::from_f32(((i * 7919 % 1000) as f32 * 0.013).sin()).to_bits()).collect();
        let w32: Vec<f32> = w16.iter().map(|&b| bf16_to_f32(b)).collect();
        let x: Vec<f32> = (0..k).map(|i| (i as f32 * 0.71).cos()).collect();
        (w16, w32, x)
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
            for &(simd, par) in &[(false, false), (true, false), (false, true), (true, true)] {
                let mut y = vec![f32::NAN; n];
                matvec_bf16_with(&w16, n, k, &x, &mut y, simd, par);
                assert!(
                    y.iter().zip(&reference).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "bf16 n={n} k={k} simd={simd} par={par}"
                );
                let d = dot_f32(&w32[..k], &x);
                assert_eq!(d.to_bits(), reference[0].to_bits(), "dot_f32 k={k}");
                let mut y32 = vec![f32::NAN; n];
                matvec_f32_with(&w32, n, k, &x, &mut y32, simd, par);
                assert!(
                    y32.iter().zip(&reference).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "f32 n={n} k={k} simd={simd} par={par}"
                );
            }
        }
    }

    #[test]
    fn matches_f64_dot_product() {
        let (n, k) = (33, 4096);
        let (w16, w32, x) = data(n, k);
        let mut y = vec![0f32; n];
        matvec_bf16_auto(&w16, n, k, &x, &mut y);
        for r in 0..n {
            let exact: f64 = (0..k).map(|j| w32[r * k + j] as f64 * x[j] as f64).sum();
            assert!((y[r] as f64 - exact).abs() < 1e-3, "row {r}: {} vs {exact}", y[r]);
        }
    }
}
