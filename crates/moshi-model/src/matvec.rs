//! Matrix-vector kernels for one-token-at-a-time inference: `y = W · x` with `W` row-major
//! `[n, k]` in bf16 (upcast exactly) or f32, f32 accumulation, AVX-512 or AVX2 when the CPU has
//! them, split over output rows on the thread team for large matrices.
//!
//! Every kernel accumulates in one fixed order, so the SIMD and the portable paths give
//! bit-identical results: element `j` of each 32-wide block goes to lane `j % 32`; the lanes
//! are reduced as `t[i] = (l[i] + l[16+i]) + (l[8+i] + l[24+i])` (i < 8), then
//! `u[i] = t[i] + t[4+i]` (i < 4), `v[i] = u[i] + u[2+i]` (i < 2), `s = v[0] + v[1]`; the
//! `k % 32` trailing elements are then added one by one. Products and sums are separate
//! roundings (no fused multiply-add), as in the scalar reference.

/// Below this many weight elements a product runs on the calling thread.
const PARALLEL_MIN_ELEMENTS: usize = 1 << 17;
/// Lanes of the fixed accumulation order.
const LANES: usize = 32;

#[inline(always)]
fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// A weight element type of the kernels (`u16` = bf16 bits, or `f32`), widened exactly to f32.
pub(crate) trait WeightElem: Copy {
    fn to_f32(self) -> f32;
}

/// A row element every kernel of this CPU architecture can load: f32, or bf16 bits (`u16`).
#[cfg(target_arch = "x86_64")]
pub(crate) trait RowElem: WeightElem + avx2::Load8 + avx512::Load16 {}
#[cfg(target_arch = "x86_64")]
impl<T: WeightElem + avx2::Load8 + avx512::Load16> RowElem for T {}

/// A row element every kernel of this CPU architecture can load: f32, or bf16 bits (`u16`).
#[cfg(not(target_arch = "x86_64"))]
pub(crate) trait RowElem: WeightElem {}
#[cfg(not(target_arch = "x86_64"))]
impl<T: WeightElem> RowElem for T {}

impl WeightElem for u16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16_to_f32(self)
    }
}

impl WeightElem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

#[inline(always)]
fn reduce_lanes(l: &[f32; LANES]) -> f32 {
    let mut t = [0f32; 8];
    for i in 0..8 {
        t[i] = (l[i] + l[16 + i]) + (l[8 + i] + l[24 + i]);
    }
    let u = [t[0] + t[4], t[1] + t[5], t[2] + t[6], t[3] + t[7]];
    let v = [u[0] + u[2], u[1] + u[3]];
    v[0] + v[1]
}

/// Portable reference: one row dotted with `x` in the fixed order.
#[inline(always)]
fn dot_scalar<T: WeightElem>(row: &[T], x: &[f32]) -> f32 {
    let k = row.len().min(x.len());
    let blocks = k / LANES;
    let mut l = [0f32; LANES];
    for b in 0..blocks {
        let (wr, xr) = (
            &row[b * LANES..(b + 1) * LANES],
            &x[b * LANES..(b + 1) * LANES],
        );
        for j in 0..LANES {
            l[j] += wr[j].to_f32() * xr[j];
        }
    }
    let mut s = reduce_lanes(&l);
    for j in blocks * LANES..k {
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
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    use super::LANES;

    /// Sums the four accumulators in the fixed order.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn reduce(a0: __m256, a1: __m256, a2: __m256, a3: __m256) -> f32 {
        let t = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
        let u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
        let v = _mm_add_ps(u, _mm_movehl_ps(u, u));
        let s = _mm_add_ss(v, _mm_shuffle_ps(v, v, 0b01));
        _mm_cvtss_f32(s)
    }

    /// A weight element type the AVX2 kernels load 8 of at once, widened to f32.
    pub(crate) trait Load8: super::WeightElem {
        /// # Safety
        /// The CPU must support AVX2; 8 elements must be readable at `p`.
        unsafe fn load8(p: *const Self) -> __m256;
    }

    impl Load8 for u16 {
        #[inline]
        #[target_feature(enable = "avx2")]
        unsafe fn load8(p: *const u16) -> __m256 {
            // SAFETY: the caller guarantees 8 readable u16 at `p`.
            let h = unsafe { _mm_loadu_si128(p as *const __m128i) };
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
        }
    }

    impl Load8 for f32 {
        #[inline]
        #[target_feature(enable = "avx2")]
        unsafe fn load8(p: *const f32) -> __m256 {
            // SAFETY: the caller guarantees 8 readable f32 at `p`.
            unsafe { _mm256_loadu_ps(p) }
        }
    }

    /// One row: [`dotn`] with `R = 1` (the same accumulation order).
    ///
    /// # Safety
    /// The CPU must support AVX2; `row` and `x` must have the same length.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dot<E: Load8>(row: &[E], x: &[f32]) -> f32 {
        // SAFETY: caller contract forwarded.
        unsafe { dotn::<1, E>([row], x)[0] }
    }

    /// `R` rows at once, interleaving their weight streams; each row keeps the fixed
    /// accumulation order (lanes `8q..8q + 8` of each block in `acc[r][q]`).
    ///
    /// # Safety
    /// The CPU must support AVX2; every row must have `x.len()` elements.
    #[target_feature(enable = "avx2")]
    #[allow(clippy::needless_range_loop)]
    pub(super) unsafe fn dotn<const R: usize, E: Load8>(rows: [&[E]; R], x: &[f32]) -> [f32; R] {
        let k = x.len();
        let blocks = k / LANES;
        let xp = x.as_ptr();
        let wp = rows.map(|r| r.as_ptr());
        let mut acc = [[_mm256_setzero_ps(); 4]; R];
        for b in 0..blocks {
            let o = b * LANES;
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
            let mut s = unsafe { reduce(acc[r][0], acc[r][1], acc[r][2], acc[r][3]) };
            for j in blocks * LANES..k {
                s += rows[r][j].to_f32() * x[j];
            }
            out[r] = s;
        }
        out
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use std::arch::x86_64::*;

    use super::LANES;

    /// Folds lanes 0..16 (+) 16..32 held as `lo`/`hi` into the fixed order, then reduces.
    #[inline]
    #[target_feature(enable = "avx512f,avx2")]
    unsafe fn reduce(lo: __m512, hi: __m512) -> f32 {
        // s[i] = l[i] + l[16+i]; t[i] = s[i] + s[8+i] = (l[i] + l[16+i]) + (l[8+i] + l[24+i]).
        let s = _mm512_add_ps(lo, hi);
        let s_lo = _mm512_castps512_ps256(s);
        let s_hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1));
        let t = _mm256_add_ps(s_lo, s_hi);
        let u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
        let v = _mm_add_ps(u, _mm_movehl_ps(u, u));
        _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 0b01)))
    }

    /// A weight element type the AVX-512 kernels load 16 of at once, widened to f32.
    pub(crate) trait Load16: super::WeightElem {
        /// # Safety
        /// The CPU must support AVX-512F; 16 elements must be readable at `p`.
        unsafe fn load16(p: *const Self) -> __m512;
    }

    impl Load16 for u16 {
        #[inline]
        #[target_feature(enable = "avx512f,avx2")]
        unsafe fn load16(p: *const u16) -> __m512 {
            // SAFETY: the caller guarantees 16 readable u16 at `p`.
            let h = unsafe { _mm256_loadu_si256(p as *const __m256i) };
            _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
        }
    }

    impl Load16 for f32 {
        #[inline]
        #[target_feature(enable = "avx512f,avx2")]
        unsafe fn load16(p: *const f32) -> __m512 {
            // SAFETY: the caller guarantees 16 readable f32 at `p`.
            unsafe { _mm512_loadu_ps(p) }
        }
    }

    /// One row: [`dotn`] with `R = 1` (the same accumulation order).
    ///
    /// # Safety
    /// The CPU must support AVX-512F; `row` and `x` must have the same length.
    #[inline]
    #[target_feature(enable = "avx512f,avx2")]
    pub(super) unsafe fn dot<E: Load16>(row: &[E], x: &[f32]) -> f32 {
        // SAFETY: caller contract forwarded.
        unsafe { dotn::<1, E>([row], x)[0] }
    }

    /// `R` rows at once, interleaving their weight streams; each row keeps the fixed
    /// accumulation order (lanes 0..16 of each block in `lo`, 16..32 in `hi`).
    ///
    /// # Safety
    /// The CPU must support AVX-512F; every row must have `x.len()` elements.
    #[target_feature(enable = "avx512f,avx2")]
    #[allow(clippy::needless_range_loop)]
    pub(super) unsafe fn dotn<const R: usize, E: Load16>(rows: [&[E]; R], x: &[f32]) -> [f32; R] {
        let k = x.len();
        let blocks = k / LANES;
        let xp = x.as_ptr();
        let wp = rows.map(|r| r.as_ptr());
        let mut lo = [_mm512_setzero_ps(); R];
        let mut hi = [_mm512_setzero_ps(); R];
        for b in 0..blocks {
            let o = b * LANES;
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
            let mut s = unsafe { reduce(lo[r], hi[r]) };
            for j in blocks * LANES..k {
                s += rows[r][j].to_f32() * x[j];
            }
            out[r] = s;
        }
        out
    }
}

/// Which implementation of the fixed-order dot product runs (all give identical bits). The SIMD
/// kernels stream several bf16 weight rows per pass (4 with AVX2, 8 with AVX-512), which measured
/// 1.3-1.6x faster than one row at a time on a 22528 x 4096 matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    Scalar,
    Avx2,
    Avx512,
}

impl Kernel {
    /// The fastest kernel this CPU supports.
    pub fn best() -> Kernel {
        if Kernel::Avx512.is_available() {
            Kernel::Avx512
        } else if Kernel::Avx2.is_available() {
            Kernel::Avx2
        } else {
            Kernel::Scalar
        }
    }

    /// Whether this CPU can run the kernel.
    #[inline]
    pub fn is_available(self) -> bool {
        match self {
            Kernel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => std::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => {
                std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx2")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// This kernel if available, else the best available one.
    fn or_best(self) -> Kernel {
        if self.is_available() {
            self
        } else {
            Kernel::best()
        }
    }

    /// One bf16 row · x (`row.len() == x.len()`); the kernel must be available.
    #[inline]
    fn dot_bf16(self, row: &[u16], x: &[f32]) -> f32 {
        match self {
            // SAFETY: callers only pass kernels checked with `is_available`; equal lengths.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => unsafe { avx512::dot(row, x) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { avx2::dot(row, x) },
            _ => dot_bf16_scalar(row, x),
        }
    }

    /// `R` rows (f32, or bf16 bits) · x at once, each in the fixed order (the bits of the scalar
    /// dot product per row); the kernel must be available.
    ///
    /// # Panics
    /// If a row's length differs from `x`'s (caller bug).
    #[inline]
    pub(crate) fn dot_rows<const R: usize, E: RowElem>(
        self,
        rows: [&[E]; R],
        x: &[f32],
    ) -> [f32; R] {
        assert!(
            rows.iter().all(|r| r.len() == x.len()),
            "dot_rows: row and x lengths differ"
        );
        match self {
            // SAFETY: callers only pass kernels checked with `is_available`; equal lengths.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => unsafe { avx512::dotn(rows, x) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { avx2::dotn(rows, x) },
            _ => rows.map(|r| dot_scalar(r, x)),
        }
    }

    /// One f32 row · x (`row.len() == x.len()`); the kernel must be available.
    #[inline]
    fn dot_f32(self, row: &[f32], x: &[f32]) -> f32 {
        match self {
            // SAFETY: callers only pass kernels checked with `is_available`; equal lengths.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => unsafe { avx512::dot(row, x) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { avx2::dot(row, x) },
            _ => dot_f32_scalar(row, x),
        }
    }
}

static BEST_KERNEL: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();

/// [`Kernel::best`], detected once.
#[inline]
pub fn best_kernel() -> Kernel {
    *BEST_KERNEL.get_or_init(Kernel::best)
}

fn rows_bf16(w: &[u16], k: usize, x: &[f32], y: &mut [f32], kernel: Kernel) {
    let x = &x[..k];
    #[cfg(target_arch = "x86_64")]
    match kernel {
        // SAFETY (both arms): only reached for kernels checked available; rows hold k elements.
        Kernel::Avx512 => {
            return rows_bf16_interleaved::<8>(w, k, x, y, kernel, |rows, x| unsafe {
                avx512::dotn(rows, x)
            })
        }
        Kernel::Avx2 => {
            return rows_bf16_interleaved::<4>(w, k, x, y, kernel, |rows, x| unsafe {
                avx2::dotn(rows, x)
            })
        }
        Kernel::Scalar => {}
    }
    for (row, yv) in w.chunks_exact(k).zip(y.iter_mut()) {
        *yv = kernel.dot_bf16(row, x);
    }
}

/// `R` rows per pass with `dotn` (the kernel's `dotn`), the remaining rows one by one with
/// `kernel`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn rows_bf16_interleaved<const R: usize>(
    w: &[u16],
    k: usize,
    x: &[f32],
    y: &mut [f32],
    kernel: Kernel,
    dotn: impl Fn([&[u16]; R], &[f32]) -> [f32; R],
) {
    let groups = y.len() / R;
    for (wg, yg) in w.chunks_exact(R * k).zip(y.chunks_exact_mut(R)) {
        let rows: [&[u16]; R] = std::array::from_fn(|r| &wg[r * k..(r + 1) * k]);
        yg.copy_from_slice(&dotn(rows, x));
    }
    for (row, yv) in w[groups * R * k..]
        .chunks_exact(k)
        .zip(y[groups * R..].iter_mut())
    {
        *yv = kernel.dot_bf16(row, x);
    }
}

fn rows_f32(w: &[f32], k: usize, x: &[f32], y: &mut [f32], kernel: Kernel) {
    let x = &x[..k];
    for (row, yv) in w.chunks_exact(k).zip(y.iter_mut()) {
        *yv = kernel.dot_f32(row, x);
    }
}

/// Checks lengths, then runs `rows` (one block of rows on one thread) over all of `W`, split
/// evenly over the threads of [`crate::team`] when `parallel` and the matrix is large (one part
/// per thread, at least 8 rows each; the team's helpers spin between calls, so a call costs no
/// futex wake-up). Each row's dot product does not depend on the split.
#[allow(clippy::too_many_arguments)]
fn matvec_with<T: Sync>(
    name: &str,
    w: &[T],
    n: usize,
    k: usize,
    x: &[f32],
    y: &mut [f32],
    kernel: Kernel,
    parallel: bool,
    rows: impl Fn(&[T], usize, &[f32], &mut [f32], Kernel) + Sync,
) {
    assert!(
        w.len() >= n * k && x.len() >= k && y.len() >= n,
        "{name}: bad lengths"
    );
    let kernel = kernel.or_best();
    if k == 0 {
        y[..n].fill(0.0);
        return;
    }
    let (w, y) = (&w[..n * k], &mut y[..n]);
    if parallel && n * k >= PARALLEL_MIN_ELEMENTS && n > 1 {
        let parts = crate::team::threads().min(n.div_ceil(8)).max(1);
        crate::team::run_chunks_mut(y, n.div_ceil(parts), &|lo, yc| {
            rows(&w[lo * k..(lo + yc.len()) * k], k, x, yc, kernel)
        });
    } else {
        rows(w, k, x, y, kernel);
    }
}

/// `y[n] = W[n, k] · x[k]`, bf16 weights, with an explicit choice of kernel (replaced by the
/// best one if this CPU lacks it) and threading (for tests and benchmarks; [`matvec_bf16_auto`]
/// picks both).
pub fn matvec_bf16_with(
    w: &[u16],
    n: usize,
    k: usize,
    x: &[f32],
    y: &mut [f32],
    kernel: Kernel,
    parallel: bool,
) {
    matvec_with("matvec_bf16", w, n, k, x, y, kernel, parallel, rows_bf16)
}

/// `y[n] = W[n, k] · x[k]`, f32 weights, explicit kernel / threading choice.
pub fn matvec_f32_with(
    w: &[f32],
    n: usize,
    k: usize,
    x: &[f32],
    y: &mut [f32],
    kernel: Kernel,
    parallel: bool,
) {
    matvec_with("matvec_f32", w, n, k, x, y, kernel, parallel, rows_f32)
}

/// `a · b` in the fixed accumulation order (best kernel of this CPU; bit-identical to
/// [`dot_f32_scalar`]).
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let k = a.len().min(b.len());
    best_kernel().dot_f32(&a[..k], &b[..k])
}

/// `y[n] = W[n, k] · x[k]` with bf16 weights: best SIMD kernel, threads for large matrices.
pub fn matvec_bf16_auto(w: &[u16], n: usize, k: usize, x: &[f32], y: &mut [f32]) {
    matvec_bf16_with(w, n, k, x, y, best_kernel(), true)
}

/// `y[n] = W[n, k] · x[k]` with f32 weights: best SIMD kernel, threads for large matrices.
pub fn matvec_f32_auto(w: &[f32], n: usize, k: usize, x: &[f32], y: &mut [f32]) {
    matvec_f32_with(w, n, k, x, y, best_kernel(), true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Several f32 or bf16 rows at once give each row's single-row bits, on every kernel this CPU
    /// has.
    #[test]
    fn f32_rows_at_once_equal_the_scalar_dot_bit_for_bit() {
        for k in [0, 1, 31, 32, 33, 128, 130] {
            let (_, w, x) = data(4, k);
            let rows: [&[f32]; 4] = std::array::from_fn(|r| &w[r * k..(r + 1) * k]);
            let expected = rows.map(|r| dot_f32_scalar(r, &x).to_bits());
            let (w16, _, _) = data(4, k);
            let rows16: [&[u16]; 4] = std::array::from_fn(|r| &w16[r * k..(r + 1) * k]);
            let expected16 = rows16.map(|r| dot_bf16_scalar(r, &x).to_bits());
            for kernel in [Kernel::Scalar, Kernel::Avx2, Kernel::Avx512] {
                if kernel.is_available() {
                    let got = kernel.dot_rows(rows, &x).map(f32::to_bits);
                    assert_eq!(got, expected, "{kernel:?} k {k}");
                    let got16 = kernel.dot_rows(rows16, &x).map(f32::to_bits);
                    assert_eq!(got16, expected16, "{kernel:?} k {k} bf16");
                }
            }
        }
    }

    fn data(n: usize, k: usize) -> (Vec<u16>, Vec<f32>, Vec<f32>) {
        let w16: Vec<u16> = (0..n * k)
            .map(|i| half::bf16::from_f32(((i * 7919 % 1000) as f32 * 0.013).sin()).to_bits())
            .collect();
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
            let kernels = [Kernel::Scalar, Kernel::Avx2, Kernel::Avx512];
            for (kernel, par) in kernels.iter().flat_map(|&kr| [(kr, false), (kr, true)]) {
                if !kernel.is_available() {
                    eprintln!("{kernel:?} is not available on this CPU: not tested");
                    continue;
                }
                let mut y = vec![f32::NAN; n];
                matvec_bf16_with(&w16, n, k, &x, &mut y, kernel, par);
                assert!(
                    y.iter()
                        .zip(&reference)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "bf16 n={n} k={k} {kernel:?} par={par}"
                );
                let d = dot_f32(&w32[..k], &x);
                assert_eq!(d.to_bits(), reference[0].to_bits(), "dot_f32 k={k}");
                let mut y32 = vec![f32::NAN; n];
                matvec_f32_with(&w32, n, k, &x, &mut y32, kernel, par);
                assert!(
                    y32.iter()
                        .zip(&reference)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "f32 n={n} k={k} {kernel:?} par={par}"
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
            assert!(
                (y[r] as f64 - exact).abs() < 1e-3,
                "row {r}: {} vs {exact}",
                y[r]
            );
        }
    }
}
