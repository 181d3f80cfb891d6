//! Norms over rows of f32 activations: RMSNorm (the LM) and LayerNorm (Mimi).

/// RMSNorm in f32: `x * alpha / sqrt(mean(x²) + eps)`, per row of width `alpha.len()`. The sum of
/// squares runs in the dense kernels' fixed lane order (the same bits on every instruction set):
/// one running sum would be a chain of `d` dependent additions, microseconds a row on the LM's
/// serial path.
pub fn rms_norm(x: &[f32], alpha: &[f32], eps: f32, out: &mut [f32]) {
    let d = alpha.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let ms = moshi_kernels::dense::dot_f32(xr, xr) / d as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for ((o, v), a) in or.iter_mut().zip(xr).zip(alpha) {
            *o = v * inv * a;
        }
    }
}

/// A LayerNorm's weights: gain, bias and epsilon.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
    pub eps: f32,
}

impl LayerNorm {
    /// [`layer_norm`] of every row of `x` into `out`.
    pub fn forward(&self, x: &[f32], out: &mut [f32]) {
        layer_norm(x, &self.weight, &self.bias, self.eps, out);
    }

    pub fn weight_bytes(&self) -> usize {
        (self.weight.len() + self.bias.len()) * 4
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
