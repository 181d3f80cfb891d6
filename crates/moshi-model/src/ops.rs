//! Dense math kernels shared by Mimi and the LM: matrix products against row-major weights,
//! norms and activations. All activations are f32.

use moshi_loader::{Weight, WeightData};
use moshi_quant::QuantizedMatrix;

/// `out[m, n] = x[m, k] · w[n, k]ᵀ` (+ `out` if `accumulate`), with `w` row-major `[n, k]`
/// as stored in PyTorch checkpoints.
pub fn matmul_t(x: &[f32], m: usize, k: usize, w: &[f32], n: usize, out: &mut [f32], accumulate: bool) {
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
    F32 { weight: Vec<f32>, out_dim: usize, in_dim: usize },
    BF16 { weight: Vec<u16>, out_dim: usize, in_dim: usize },
    Quantized(QuantizedMatrix),
}

impl Linear {
    /// Builds a layer from a loader weight of logical shape `[out_dim, in_dim]`.
    pub fn from_weight(w: Weight) -> Self {
        let (out_dim, in_dim) = (w.shape[0], w.shape[1..].iter().product());
        match w.data {
            WeightData::F32(weight) => Linear::F32 { weight, out_dim, in_dim },
            WeightData::BF16(weight) => Linear::BF16 { weight, out_dim, in_dim },
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
                    matvec_bf16(weight, n, k, &x[r * k..(r + 1) * k], &mut out[r * n..(r + 1) * n]);
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

/// Work (multiply-adds) under which a product stays on the calling thread.
const PARALLEL_MIN_MACS: usize = 1 << 18;

/// A row-strided f32 product against row-major weights, the kernel behind Mimi's convolutions:
/// `out[i * rs_out + j] (+)= Σ_p a[i * rs_a + p] · w[j * rs_w + p * cs_w]` for `i < m`, `j < n`, `p < k`.
/// Rows of `a` may overlap (`rs_a < k`): a causal convolution over a channels-last buffer reads its
/// windows in place this way, without an im2col copy. Splits the work over the rayon pool when large.
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
    assert!(w.len() > (n - 1) * rs_w + (k - 1) * cs_w, "weight slice too short");
    let macs = m * n * k;
    let threads = rayon::current_num_threads();
    if macs < PARALLEL_MIN_MACS || threads < 2 {
        // SAFETY: bounds asserted above; `out` is a unique borrow so it cannot alias `a`/`w`.
        unsafe { gemm_raw(m, k, n, a.as_ptr(), rs_a, w.as_ptr(), rs_w, cs_w, out.as_mut_ptr(), rs_out, accumulate) };
        return;
    }
    let parts = threads.min(if m >= n { m.div_ceil(16) } else { n.div_ceil(16) }).max(1);
    let (ap, wp, op) = (SendPtr(a.as_ptr() as *mut f32), SendPtr(w.as_ptr() as *mut f32), SendPtr(out.as_mut_ptr()));
    let split_rows = m >= n;
    let total = if split_rows { m } else { n };
    let chunk = total.div_ceil(parts);
    rayon::scope(|s| {
        for p in 0..parts {
            let lo = p * chunk;
            let hi = ((p + 1) * chunk).min(total);
            if lo >= hi {
                continue;
            }
            let (ap, wp, op) = (ap, wp, op);
            s.spawn(move |_| {
                let (ap, wp, op) = (ap, wp, op);
                // SAFETY: each task writes a disjoint block of rows (or columns) of `out`,
                // all inside the ranges asserted above.
                unsafe {
                    if split_rows {
                        gemm_raw(hi - lo, k, n, ap.0.add(lo * rs_a), rs_a, wp.0, rs_w, cs_w, op.0.add(lo * rs_out), rs_out, accumulate);
                    } else {
                        gemm_raw(m, k, hi - lo, ap.0, rs_a, wp.0.add(lo * rs_w), rs_w, cs_w, op.0.add(lo), rs_out, accumulate);
                    }
                }
            });
        }
    });
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
    let beta = if accumulate { 1.0 } else { 0.0 };
    // SAFETY: forwarded caller contract. B = wᵀ is [k, n] with strides (cs_w, rs_w).
    unsafe {
        matrixmultiply::sgemm(m, k, n, 1.0, a, rs_a as isize, 1, w, cs_w as isize, rs_w as isize, beta, out, rs_out as isize, 1);
    }
}

/// Rows of the left operand up to which the weight-streaming kernel beats a packed sgemm.
const SMALL_M: usize = 4;

/// `out = a · wᵀ` for at most [`SMALL_M`] rows: streams each weight row once, no packing (the
/// transformer and quantizer projections at 1-2 tokens per frame are memory-bound matrix-vector work).
///
/// # Safety
/// Same contract as [`gemm_raw`], with `m <= SMALL_M` and contiguous weight rows.
#[allow(clippy::too_many_arguments)]
unsafe fn small_m_nt(m: usize, k: usize, n: usize, a: *const f32, rs_a: usize, w: *const f32, rs_w: usize, out: *mut f32, rs_out: usize, accumulate: bool) {
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
    unsafe { small_m_nt_body::<false>(m, k, n, a, rs_a, w, rs_w, out, rs_out, accumulate) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn small_m_nt_avx512(m: usize, k: usize, n: usize, a: *const f32, rs_a: usize, w: *const f32, rs_w: usize, out: *mut f32, rs_out: usize, accumulate: bool) {
    // SAFETY: caller contract forwarded.
    unsafe { small_m_nt_body::<true>(m, k, n, a, rs_a, w, rs_w, out, rs_out, accumulate) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn small_m_nt_avx2(m: usize, k: usize, n: usize, a: *const f32, rs_a: usize, w: *const f32, rs_w: usize, out: *mut f32, rs_out: usize, accumulate: bool) {
    // SAFETY: caller contract forwarded.
    unsafe { small_m_nt_body::<true>(m, k, n, a, rs_a, w, rs_w, out, rs_out, accumulate) }
}

/// Lane count of the accumulators (one AVX-512 register, two AVX2 ones).
const LANES: usize = 16;

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn small_m_nt_body<const FMA: bool>(
    m: usize,
    k: usize,
    n: usize,
    a: *const f32,
    rs_a: usize,
    w: *const f32,
    rs_w: usize,
    out: *mut f32,
    rs_out: usize,
    accumulate: bool,
) {
    let mut rows: [&[f32]; SMALL_M] = [&[]; SMALL_M];
    for (i, r) in rows.iter_mut().enumerate().take(m) {
        // SAFETY: row i of `a` holds k values (caller contract).
        *r = unsafe { std::slice::from_raw_parts(a.add(i * rs_a), k) };
    }
    let full = k - k % LANES;
    for j in 0..n {
        // SAFETY: weight row j holds k values (caller contract).
        let wr = unsafe { std::slice::from_raw_parts(w.add(j * rs_w), k) };
        let mut acc = [[0f32; LANES]; SMALL_M];
        let mut p = 0;
        while p < full {
            let wc: &[f32; LANES] = wr[p..p + LANES].try_into().expect("lane chunk");
            for i in 0..m {
                let xc: &[f32; LANES] = rows[i][p..p + LANES].try_into().expect("lane chunk");
                for l in 0..LANES {
                    acc[i][l] = if FMA { xc[l].mul_add(wc[l], acc[i][l]) } else { acc[i][l] + xc[l] * wc[l] };
                }
            }
            p += LANES;
        }
        for i in 0..m {
            let mut s = 0f32;
            for q in full..k {
                s += rows[i][q] * wr[q];
            }
            // pairwise lane reduction
            let mut width = LANES / 2;
            while width > 0 {
                for l in 0..width {
                    acc[i][l] += acc[i][l + width];
                }
                width /= 2;
            }
            s += acc[i][0];
            // SAFETY: element (i, j) of `out` is in bounds (caller contract).
            unsafe {
                let o = out.add(i * rs_out + j);
                *o = if accumulate { *o + s } else { s };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let w16: Vec<u16> = (0..n * k).map(|i| half::bf16::from_f32((i as f32 * 0.3).sin()).to_bits()).collect();
        let w32: Vec<f32> = w16.iter().map(|&b| f32::from_bits((b as u32) << 16)).collect();
        let x: Vec<f32> = (0..2 * k).map(|i| (i as f32 * 0.7).cos()).collect();
        let a = Linear::BF16 { weight: w16, out_dim: n, in_dim: k }.forward(&x, 2);
        let b = Linear::F32 { weight: w32, out_dim: n, in_dim: k }.forward(&x, 2);
        for (p, q) in a.iter().zip(&b) {
            assert!((p - q).abs() < 1e-5, "{p} vs {q}");
        }
    }
}
