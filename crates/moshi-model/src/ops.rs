//! Dense math kernels shared by Mimi and the LM: matrix products against row-major weights,
//! norms and activations. All activations are f32.

use moshi_kernels::QuantizedMatrix;
use moshi_loader::{Weight, WeightData};

/// `out[m, n] = x[m, k] · w[n, k]ᵀ` (+ `out` if `accumulate`), with `w` row-major `[n, k]`
/// as stored in PyTorch checkpoints.
pub fn matmul_t(
    x: &[f32],
    m: usize,
    k: usize,
    w: &[f32],
    n: usize,
    out: &mut [f32],
    accumulate: bool,
) {
    debug_assert!(x.len() >= m * k && w.len() >= n * k && out.len() >= m * n);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            out[..m * n].fill(0.0);
        }
        return;
    }
    let beta = if accumulate { 1.0 } else { 0.0 };
    // SAFETY: the slices cover the strided ranges checked above; `out` does not alias `x`/`w`.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            x.as_ptr(),
            k as isize,
            1,
            w.as_ptr(),
            1,
            k as isize,
            beta,
            out.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// A linear layer without bias: dense f32, bf16 (upcast exactly at use) or MLX-packed.
#[derive(Clone, Debug)]
pub enum Linear {
    F32 {
        weight: Vec<f32>,
        out_dim: usize,
        in_dim: usize,
    },
    BF16 {
        weight: Vec<u16>,
        out_dim: usize,
        in_dim: usize,
    },
    Quantized(QuantizedMatrix),
}

impl Linear {
    /// Builds a layer from a loader weight of logical shape `[out_dim, in_dim]`.
    pub fn from_weight(w: Weight) -> Self {
        let (out_dim, in_dim) = (w.shape[0], w.shape[1..].iter().product());
        match w.data {
            WeightData::F32(weight) => Linear::F32 {
                weight,
                out_dim,
                in_dim,
            },
            WeightData::BF16(weight) => Linear::BF16 {
                weight,
                out_dim,
                in_dim,
            },
            WeightData::Quantized(q) => Linear::Quantized(q),
        }
    }

    pub fn out_dim(&self) -> usize {
        match self {
            Linear::F32 { out_dim, .. } | Linear::BF16 { out_dim, .. } => *out_dim,
            Linear::Quantized(q) => q.rows(),
        }
    }

    pub fn in_dim(&self) -> usize {
        match self {
            Linear::F32 { in_dim, .. } | Linear::BF16 { in_dim, .. } => *in_dim,
            Linear::Quantized(q) => q.cols(),
        }
    }

    /// Bytes of weights read by one forward pass.
    pub fn weight_bytes(&self) -> usize {
        match self {
            Linear::F32 { weight, .. } => weight.len() * 4,
            Linear::BF16 { weight, .. } => weight.len() * 2,
            Linear::Quantized(q) => q.weight_bytes(),
        }
    }

    /// `out[m, out_dim] = x[m, in_dim] · Wᵀ`.
    pub fn forward_into(&self, x: &[f32], m: usize, out: &mut [f32]) {
        let (n, k) = (self.out_dim(), self.in_dim());
        match self {
            Linear::F32 { weight, .. } => matmul_t(x, m, k, weight, n, out, false),
            Linear::BF16 { weight, .. } => {
                for r in 0..m {
                    matvec_bf16(
                        weight,
                        n,
                        k,
                        &x[r * k..(r + 1) * k],
                        &mut out[r * n..(r + 1) * n],
                    );
                }
            }
            Linear::Quantized(q) => {
                if m == 1 {
                    q.matvec(&x[..k], &mut out[..n]);
                } else {
                    q.matmul(&x[..m * k], m, &mut out[..m * n]);
                }
            }
        }
    }

    /// One vector: `out[out_dim] = W · x[in_dim]`. Dense weights go through the threaded
    /// matrix-vector kernels of [`crate::matvec`]; packed weights through `forward_into`.
    pub fn matvec_into(&self, x: &[f32], out: &mut [f32]) {
        let (n, k) = (self.out_dim(), self.in_dim());
        match self {
            Linear::F32 { weight, .. } => crate::matvec::matvec_f32_auto(weight, n, k, x, out),
            Linear::BF16 { weight, .. } => crate::matvec::matvec_bf16_auto(weight, n, k, x, out),
            Linear::Quantized(_) => self.forward_into(x, 1, out),
        }
    }

    /// Allocating variant of [`Linear::forward_into`].
    pub fn forward(&self, x: &[f32], m: usize) -> Vec<f32> {
        let mut out = vec![0f32; m * self.out_dim()];
        self.forward_into(x, m, &mut out);
        out
    }
}

/// `y[n] = W[n, k] · x[k]` with bf16 weights upcast exactly to f32, f32 accumulation (AVX2 when
/// available, rows split over threads for large matrices; see [`crate::matvec`]).
pub fn matvec_bf16(w: &[u16], n: usize, k: usize, x: &[f32], y: &mut [f32]) {
    crate::matvec::matvec_bf16_auto(w, n, k, x, y);
}

/// RMSNorm in f32: `x * alpha / sqrt(mean(x²) + eps)`, per row of width `alpha.len()`.
pub fn rms_norm(x: &[f32], alpha: &[f32], eps: f32, out: &mut [f32]) {
    let d = alpha.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let ms = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for ((o, v), a) in or.iter_mut().zip(xr).zip(alpha) {
            *o = v * inv * a;
        }
    }
}

/// LayerNorm with affine weight and bias, per row of width `weight.len()`.
pub fn layer_norm(x: &[f32], weight: &[f32], bias: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let mean = xr.iter().sum::<f32>() / d as f32;
        let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for (((o, v), w), b) in or.iter_mut().zip(xr).zip(weight).zip(bias) {
            *o = (v - mean) * inv * w + b;
        }
    }
}

/// SiLU: `x * sigmoid(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
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
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: feature checked at run time.
            unsafe { gelu_slice_avx512(xs) };
            return;
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: feature checked at run time.
            unsafe { gelu_slice_avx2(xs) };
            return;
        }
    }
    gelu_slice_body(xs);
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

/// In-place softmax over one row.
pub fn softmax_in_place(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
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
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: feature checked at run time.
            unsafe { elu_slice_avx512(dst, src) };
            return;
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: feature checked at run time.
            unsafe { elu_slice_avx2(dst, src) };
            return;
        }
    }
    elu_slice_body(dst, src);
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
    // 2^k (expm1(r) + 1) - 1 = 2^k expm1(r) + (2^k - 1)
    two_k * em1_r + (two_k - 1.0)
}

/// Dot product with 8 independent accumulators (vectorizes; order differs from a serial sum).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_elem(a, b)
}

/// [`dot`] against f32 or bf16 values of `b` (upcast per element), in the same operation order,
/// so f32 values give bit-identical results.
#[inline(always)]
pub fn dot_elem<K: WeightElem>(a: &[f32], b: &[K]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l].to_f32();
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        s += x * y.to_f32();
    }
    s
}

/// Work (multiply-adds) under which a product stays on the calling thread.
pub(crate) const PARALLEL_MIN_MACS: usize = 1 << 18;

/// A row-strided f32 product against row-major weights, the kernel behind Mimi's convolutions:
/// `out[i * rs_out + j] (+)= Σ_p a[i * rs_a + p] · w[j * rs_w + p * cs_w]` for `i < m`, `j < n`, `p < k`.
/// Rows of `a` may overlap (`rs_a < k`): a causal convolution over a channels-last buffer reads its
/// windows in place this way, without an im2col copy. Splits the work over the [`crate::team`] when large.
///
/// Panics if a slice is too short for the strides (an internal invariant, never user input).
#[allow(clippy::too_many_arguments)]
pub fn gemm_nt_strided(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    rs_a: usize,
    w: &[f32],
    rs_w: usize,
    cs_w: usize,
    out: &mut [f32],
    rs_out: usize,
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(rs_out >= n, "output rows overlap: rs_out {rs_out} < n {n}");
    assert!(out.len() >= (m - 1) * rs_out + n, "output slice too short");
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                out[i * rs_out..i * rs_out + n].fill(0.0);
            }
        }
        return;
    }
    assert!(a.len() >= (m - 1) * rs_a + k, "lhs slice too short");
    assert!(
        w.len() > (n - 1) * rs_w + (k - 1) * cs_w,
        "weight slice too short"
    );
    let macs = m * n * k;
    let threads = crate::team::threads();
    if macs < PARALLEL_MIN_MACS || threads < 2 {
        // SAFETY: bounds asserted above; `out` is a unique borrow so it cannot alias `a`/`w`.
        unsafe {
            gemm_raw(
                m,
                k,
                n,
                a.as_ptr(),
                rs_a,
                w.as_ptr(),
                rs_w,
                cs_w,
                out.as_mut_ptr(),
                rs_out,
                accumulate,
            )
        };
        return;
    }
    let parts = threads
        .min(if m >= n {
            m.div_ceil(16)
        } else {
            n.div_ceil(16)
        })
        .max(1);
    let (ap, wp, op) = (
        SendPtr(a.as_ptr() as *mut f32),
        SendPtr(w.as_ptr() as *mut f32),
        SendPtr(out.as_mut_ptr()),
    );
    let split_rows = m >= n;
    let total = if split_rows { m } else { n };
    par_ranges(0, total, parts, &|lo, hi| {
        let (ap, wp, op) = (ap, wp, op);
        // SAFETY: each range writes a disjoint block of rows (or columns) of `out`, all inside
        // the ranges asserted above.
        unsafe {
            if split_rows {
                gemm_raw(
                    hi - lo,
                    k,
                    n,
                    ap.0.add(lo * rs_a),
                    rs_a,
                    wp.0,
                    rs_w,
                    cs_w,
                    op.0.add(lo * rs_out),
                    rs_out,
                    accumulate,
                );
            } else {
                gemm_raw(
                    m,
                    k,
                    hi - lo,
                    ap.0,
                    rs_a,
                    wp.0.add(lo * rs_w),
                    rs_w,
                    cs_w,
                    op.0.add(lo),
                    rs_out,
                    accumulate,
                );
            }
        }
    });
}

/// Runs `f` over `parts` near-equal sub-ranges of `lo..hi` on the persistent [`crate::team`]
/// (no thread wake-up and sleep per product).
pub(crate) fn par_ranges(lo: usize, hi: usize, parts: usize, f: &(dyn Fn(usize, usize) + Sync)) {
    crate::team::run_ranges(lo, hi, parts, f);
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: used only to hand disjoint output blocks and shared read-only inputs to scoped tasks.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

/// # Safety
/// The strided ranges must be in bounds and `out` must not alias `a` or `w`.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_raw(
    m: usize,
    k: usize,
    n: usize,
    a: *const f32,
    rs_a: usize,
    w: *const f32,
    rs_w: usize,
    cs_w: usize,
    out: *mut f32,
    rs_out: usize,
    accumulate: bool,
) {
    if m <= SMALL_M && cs_w == 1 {
        // SAFETY: forwarded caller contract.
        unsafe { small_m_nt(m, k, n, a, rs_a, w, rs_w, out, rs_out, accumulate) };
        return;
    }
    if n == 1 && cs_w == 1 && rs_out == 1 {
        // One output column (e.g. a convolution to mono PCM): a matrix-vector product with the
        // left rows as the streamed matrix, instead of packing all of `a` for a 1-column sgemm.
        // SAFETY: forwarded caller contract; out[j] for j < m is out[j * rs_out] with rs_out 1.
        unsafe { small_m_nt(1, k, m, w, k, a, rs_a, out, 1, accumulate) };
        return;
    }
    let beta = if accumulate { 1.0 } else { 0.0 };
    // SAFETY: forwarded caller contract. B = wᵀ is [k, n] with strides (cs_w, rs_w).
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a,
            rs_a as isize,
            1,
            w,
            cs_w as isize,
            rs_w as isize,
            beta,
            out,
            rs_out as isize,
            1,
        );
    }
}

/// A weight element the streaming kernel can read: f32, or bf16 bits (`u16`, upcast exactly).
pub trait WeightElem: Copy + Send + Sync {
    fn to_f32(self) -> f32;
    fn lanes(chunk: &[Self]) -> [f32; LANES];
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
}

impl WeightElem for u16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self as u32) << 16)
    }
    #[inline(always)]
    fn lanes(chunk: &[Self]) -> [f32; LANES] {
        let c: &[u16; LANES] = chunk[..LANES].try_into().expect("lane chunk");
        let mut out = [0f32; LANES];
        for l in 0..LANES {
            out[l] = f32::from_bits((c[l] as u32) << 16);
        }
        out
    }
}

/// f32 -> bf16 bits, round to nearest even (NaN kept quiet).
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let rounding = 0x7FFF + ((b >> 16) & 1);
    ((b.wrapping_add(rounding)) >> 16) as u16
}

/// Like [`gemm_nt_strided`] with contiguous weight rows stored as bf16 bits, for at most
/// [`SMALL_M`] left rows (the memory-bound per-frame case: half the weight bytes of f32).
#[allow(clippy::too_many_arguments)]
pub fn gemm_nt_bf16(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    rs_a: usize,
    w: &[u16],
    rs_w: usize,
    out: &mut [f32],
    rs_out: usize,
    accumulate: bool,
) {
    assert!(
        m <= SMALL_M,
        "gemm_nt_bf16 takes at most {SMALL_M} rows, got {m}"
    );
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        rs_out >= n && out.len() >= (m - 1) * rs_out + n,
        "output slice too short"
    );
    assert!(
        k > 0 && a.len() >= (m - 1) * rs_a + k,
        "lhs slice too short"
    );
    assert!(w.len() >= (n - 1) * rs_w + k, "weight slice too short");
    let threads = crate::team::threads();
    if m * n * k < PARALLEL_MIN_MACS || threads < 2 {
        // SAFETY: bounds asserted above.
        unsafe {
            small_m_nt(
                m,
                k,
                n,
                a.as_ptr(),
                rs_a,
                w.as_ptr(),
                rs_w,
                out.as_mut_ptr(),
                rs_out,
                accumulate,
            )
        };
        return;
    }
    let parts = threads.min(n.div_ceil(16));
    let (ap, wp, op) = (
        SendPtr(a.as_ptr() as *mut f32),
        SendPtrU16(w.as_ptr() as *mut u16),
        SendPtr(out.as_mut_ptr()),
    );
    par_ranges(0, n, parts, &|lo, hi| {
        let (ap, wp, op) = (ap, wp, op);
        // SAFETY: disjoint output columns per range, all in the asserted ranges.
        unsafe {
            small_m_nt(
                m,
                k,
                hi - lo,
                ap.0,
                rs_a,
                wp.0.add(lo * rs_w),
                rs_w,
                op.0.add(lo),
                rs_out,
                accumulate,
            )
        };
    });
}

#[derive(Clone, Copy)]
struct SendPtrU16(*mut u16);
// SAFETY: shared read-only weights handed to scoped tasks.
unsafe impl Send for SendPtrU16 {}
unsafe impl Sync for SendPtrU16 {}

/// Rows of the left operand up to which the weight-streaming kernel beats a packed sgemm.
const SMALL_M: usize = 4;

/// `out = a · wᵀ` for at most [`SMALL_M`] rows: streams each weight row once, no packing (the
/// transformer and quantizer projections at 1-2 tokens per frame are memory-bound matrix-vector work).
///
/// # Safety
/// Same contract as [`gemm_raw`], with `m <= SMALL_M` and contiguous weight rows.
#[allow(clippy::too_many_arguments)]
unsafe fn small_m_nt<W: WeightElem>(
    m: usize,
    k: usize,
    n: usize,
    a: *const f32,
    rs_a: usize,
    w: *const W,
    rs_w: usize,
    out: *mut f32,
    rs_out: usize,
    accumulate: bool,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: feature checked at run time; caller contract forwarded.
            unsafe { small_m_nt_avx512(m, k, n, a, rs_a, w, rs_w, out, rs_out, accumulate) };
            return;
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: as above.
            unsafe { small_m_nt_avx2(m, k, n, a, rs_a, w, rs_w, out, rs_out, accumulate) };
            return;
        }
    }
    // SAFETY: caller contract forwarded.
    unsafe { small_m_nt_body::<W, false>(m, k, n, a, rs_a, w, rs_w, out, rs_out, accumulate) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn small_m_nt_avx512<W: WeightElem>(
    m: usize,
    k: usize,
    n: usize,
    a: *const f32,
    rs_a: usize,
    w: *const W,
    rs_w: usize,
    out: *mut f32,
    rs_out: usize,
    accumulate: bool,
) {
    // SAFETY: caller contract forwarded.
    unsafe { small_m_nt_body::<W, true>(m, k, n, a, rs_a, w, rs_w, out, rs_out, accumulate) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn small_m_nt_avx2<W: WeightElem>(
    m: usize,
    k: usize,
    n: usize,
    a: *const f32,
    rs_a: usize,
    w: *const W,
    rs_w: usize,
    out: *mut f32,
    rs_out: usize,
    accumulate: bool,
) {
    // SAFETY: caller contract forwarded.
    unsafe { small_m_nt_body::<W, true>(m, k, n, a, rs_a, w, rs_w, out, rs_out, accumulate) }
}

/// Lane count of the accumulators (one AVX-512 register, two AVX2 ones).
pub const LANES: usize = 16;

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn small_m_nt_body<W: WeightElem, const FMA: bool>(
    m: usize,
    k: usize,
    n: usize,
    a: *const f32,
    rs_a: usize,
    w: *const W,
    rs_w: usize,
    out: *mut f32,
    rs_out: usize,
    accumulate: bool,
) {
    // SAFETY (all arms): caller contract forwarded.
    unsafe {
        match m {
            1 => small_m_fixed::<W, 1, FMA>(k, n, a, rs_a, w, rs_w, out, rs_out, accumulate),
            2 => small_m_fixed::<W, 2, FMA>(k, n, a, rs_a, w, rs_w, out, rs_out, accumulate),
            3 => small_m_fixed::<W, 3, FMA>(k, n, a, rs_a, w, rs_w, out, rs_out, accumulate),
            _ => small_m_fixed::<W, 4, FMA>(k, n, a, rs_a, w, rs_w, out, rs_out, accumulate),
        }
    }
}

/// Weight rows processed together (independent memory streams and accumulator chains).
const NR: usize = 4;

#[inline(always)]
pub(crate) fn fma_lanes<const FMA: bool>(
    acc: &mut [f32; LANES],
    x: &[f32; LANES],
    w: &[f32; LANES],
) {
    for l in 0..LANES {
        acc[l] = if FMA {
            x[l].mul_add(w[l], acc[l])
        } else {
            acc[l] + x[l] * w[l]
        };
    }
}

#[inline(always)]
pub(crate) fn reduce_lanes(acc: &[f32; LANES]) -> f32 {
    let mut v = *acc;
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            v[l] += v[l + width];
        }
        width /= 2;
    }
    v[0]
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn small_m_fixed<W: WeightElem, const M: usize, const FMA: bool>(
    k: usize,
    n: usize,
    a: *const f32,
    rs_a: usize,
    w: *const W,
    rs_w: usize,
    out: *mut f32,
    rs_out: usize,
    accumulate: bool,
) {
    let mut rows: [&[f32]; M] = [&[]; M];
    for (i, r) in rows.iter_mut().enumerate() {
        // SAFETY: row i of `a` holds k values (caller contract).
        *r = unsafe { std::slice::from_raw_parts(a.add(i * rs_a), k) };
    }
    let full = k - k % LANES;
    let store = |i: usize, j: usize, s: f32| {
        // SAFETY: element (i, j) of `out` is in bounds (caller contract).
        unsafe {
            let o = out.add(i * rs_out + j);
            *o = if accumulate { *o + s } else { s };
        }
    };
    let mut j = 0;
    while j + NR <= n {
        let mut wr: [&[W]; NR] = [&[]; NR];
        for (r, wrow) in wr.iter_mut().enumerate() {
            // SAFETY: weight row j + r holds k values (caller contract).
            *wrow = unsafe { std::slice::from_raw_parts(w.add((j + r) * rs_w), k) };
        }
        let mut acc = [[[0f32; LANES]; NR]; M];
        let mut p = 0;
        while p < full {
            let mut xc: [&[f32; LANES]; M] = [&[0f32; LANES]; M];
            for i in 0..M {
                xc[i] = rows[i][p..p + LANES].try_into().expect("lane chunk");
            }
            for r in 0..NR {
                let wc = W::lanes(&wr[r][p..p + LANES]);
                for i in 0..M {
                    fma_lanes::<FMA>(&mut acc[i][r], xc[i], &wc);
                }
            }
            p += LANES;
        }
        for i in 0..M {
            for r in 0..NR {
                let mut s = reduce_lanes(&acc[i][r]);
                for q in full..k {
                    s += rows[i][q] * wr[r][q].to_f32();
                }
                store(i, j + r, s);
            }
        }
        j += NR;
    }
    while j < n {
        // SAFETY: weight row j holds k values (caller contract).
        let wrow = unsafe { std::slice::from_raw_parts(w.add(j * rs_w), k) };
        let mut acc = [[0f32; LANES]; M];
        let mut p = 0;
        while p < full {
            let wc = W::lanes(&wrow[p..p + LANES]);
            for i in 0..M {
                let xc: &[f32; LANES] = rows[i][p..p + LANES].try_into().expect("lane chunk");
                fma_lanes::<FMA>(&mut acc[i], xc, &wc);
            }
            p += LANES;
        }
        for i in 0..M {
            let mut s = reduce_lanes(&acc[i]);
            for q in full..k {
                s += rows[i][q] * wrow[q].to_f32();
            }
            store(i, j, s);
        }
        j += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::too_many_arguments)]
    fn naive_strided(
        m: usize,
        k: usize,
        n: usize,
        a: &[f32],
        rs_a: usize,
        w: &[f32],
        rs_w: usize,
        cs_w: usize,
    ) -> Vec<f32> {
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k)
                    .map(|p| a[i * rs_a + p] as f64 * w[j * rs_w + p * cs_w] as f64)
                    .sum::<f64>() as f32;
            }
        }
        out
    }

    #[test]
    fn gemm_nt_strided_matches_scalar_reference() {
        // small-m kernel, packed sgemm, overlapping lhs rows, strided weights, parallel split
        for &(m, k, n, rs_a, cs_w) in &[
            (300, 448, 1, 64, 1),
            (2000, 448, 1, 64, 1),
            (1, 37, 5, 37, 1),
            (2, 64, 33, 64, 1),
            (4, 100, 7, 50, 1),
            (9, 24, 12, 6, 1),
            (3, 8, 5, 8, 3),
            (200, 96, 64, 48, 1),
            (2, 512, 1536, 512, 1),
            (3, 40, 9, 40, 1),
            (1, 300, 2051, 300, 1),
        ] {
            let a: Vec<f32> = (0..(m - 1) * rs_a + k)
                .map(|i| (i as f32 * 0.13).sin())
                .collect();
            let rs_w = if cs_w == 1 { k } else { 1 };
            let wlen = (n - 1) * rs_w + (k - 1) * cs_w + 1;
            let w: Vec<f32> = (0..wlen).map(|i| (i as f32 * 0.071).cos()).collect();
            let reference = naive_strided(m, k, n, &a, rs_a, &w, rs_w, cs_w);
            let mut out = vec![1f32; m * n];
            gemm_nt_strided(m, k, n, &a, rs_a, &w, rs_w, cs_w, &mut out, n, false);
            let tol = 1e-4 * (k as f32).sqrt();
            for (x, y) in out.iter().zip(&reference) {
                assert!((x - y).abs() < tol, "m{m} k{k} n{n}: {x} vs {y}");
            }
            gemm_nt_strided(m, k, n, &a, rs_a, &w, rs_w, cs_w, &mut out, n, true);
            for (x, y) in out.iter().zip(&reference) {
                assert!((x - 2.0 * y).abs() < 2.0 * tol, "accumulate m{m} k{k} n{n}");
            }
        }
    }

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

    #[test]
    fn gemm_bf16_matches_f32_on_rounded_weights() {
        for &(m, k, n) in &[(1, 37, 5), (2, 512, 1536), (4, 64, 9), (3, 100, 33)] {
            let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.13).sin()).collect();
            let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.071).cos()).collect();
            let w16: Vec<u16> = w.iter().map(|&x| f32_to_bf16_bits(x)).collect();
            let rounded: Vec<f32> = w16.iter().map(|&b| b.to_f32()).collect();
            for (x, r) in w.iter().zip(&rounded) {
                assert!((x - r).abs() <= x.abs() / 256.0);
            }
            let reference = naive_strided(m, k, n, &a, k, &rounded, k, 1);
            let mut out = vec![0f32; m * n];
            gemm_nt_bf16(m, k, n, &a, k, &w16, k, &mut out, n, false);
            let tol = 1e-4 * (k as f32).sqrt();
            for (x, y) in out.iter().zip(&reference) {
                assert!((x - y).abs() < tol, "m{m} k{k} n{n}: {x} vs {y}");
            }
        }
        assert_eq!(f32_to_bf16_bits(1.0), 0x3F80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3F80_8000)), 0x3F80); // tie -> even
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3F81_8000)), 0x3F82);
    }

    #[test]
    fn matmul_t_matches_naive() {
        let (m, k, n) = (3, 5, 4);
        let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut out = vec![0f32; m * n];
        matmul_t(&x, m, k, &w, n, &mut out, false);
        for i in 0..m {
            for j in 0..n {
                let r: f32 = (0..k).map(|t| x[i * k + t] * w[j * k + t]).sum();
                assert!((out[i * n + j] - r).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn bf16_linear_equals_f32_linear_on_upcast_weights() {
        let (n, k) = (7, 19);
        let w16: Vec<u16> = (0..n * k)
            .map(|i| half::bf16::from_f32((i as f32 * 0.3).sin()).to_bits())
            .collect();
        let w32: Vec<f32> = w16
            .iter()
            .map(|&b| f32::from_bits((b as u32) << 16))
            .collect();
        let x: Vec<f32> = (0..2 * k).map(|i| (i as f32 * 0.7).cos()).collect();
        let a = Linear::BF16 {
            weight: w16,
            out_dim: n,
            in_dim: k,
        }
        .forward(&x, 2);
        let b = Linear::F32 {
            weight: w32,
            out_dim: n,
            in_dim: k,
        }
        .forward(&x, 2);
        for (p, q) in a.iter().zip(&b) {
            assert!((p - q).abs() < 1e-5, "{p} vs {q}");
        }
    }
}
