//! Dense building blocks shared by Mimi and the LM: the linear layer over dense or packed
//! weights, norms and softmax. All activations are f32; the products run in `moshi-kernels`.

use moshi_kernels::dense::{matmul_t, matvec};
use moshi_kernels::QuantizedMatrix;
use moshi_loader::{Weight, WeightData};

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
                    matvec(
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
    /// fixed-order matrix-vector kernels of `moshi_kernels::dense`; packed weights through `forward_into`.
    pub fn matvec_into(&self, x: &[f32], out: &mut [f32]) {
        let (n, k) = (self.out_dim(), self.in_dim());
        match self {
            Linear::F32 { weight, .. } => matvec(weight, n, k, x, out),
            Linear::BF16 { weight, .. } => matvec(weight, n, k, x, out),
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
