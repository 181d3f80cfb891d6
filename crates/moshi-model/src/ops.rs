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
                for r in 0..m {
                    quantized_matvec_reference(q, &x[r * k..(r + 1) * k], &mut out[r * n..(r + 1) * n]);
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

/// Scalar fallback for a packed matrix-vector product (dequantize a row, dot in f32).
pub fn quantized_matvec_reference(q: &QuantizedMatrix, x: &[f32], y: &mut [f32]) {
    let mut row = vec![0f32; q.cols()];
    for (r, yv) in y.iter_mut().enumerate().take(q.rows()) {
        q.dequantize_row_f32(r, &mut row);
        *yv = row.iter().zip(x).map(|(a, b)| a * b).sum();
    }
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
