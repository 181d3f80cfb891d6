//! One pre-norm transformer layer of the Moshi LM (temporal and depformer alike):
//! `x += attn(rms_norm1(x)); x += gating(rms_norm2(x))`, RMSNorm in f32 with gain `alpha`,
//! SiLU-gated FFN `linear_out(silu(gate) * value)` where `linear_in(x) = [gate | value]`.

use super::attention::{Attention, AttentionScratch};
use super::kv_cache::KvCache;
use super::rope::RopeRotation;
use moshi_kernels::dense::silu;
use moshi_loader::NormKind;

use crate::ops::{rms_norm, Linear};

/// RMSNorm with a learnt gain (`alpha`, `[dim]`).
#[derive(Clone, Debug)]
pub struct RmsNorm {
    alpha: Vec<f32>,
    eps: f32,
}

impl RmsNorm {
    pub fn new(alpha: Vec<f32>, eps: f32) -> Self {
        Self { alpha, eps }
    }

    /// Epsilon of a config `norm`: `rms_norm_f32` 1e-8, `rms_norm` 1e-5 (as in the
    /// official `create_norm_fn`).
    pub fn eps_for(norm: NormKind) -> f32 {
        if norm == NormKind::RmsNormF32 {
            1e-8
        } else {
            1e-5
        }
    }

    pub fn forward(&self, x: &[f32], out: &mut [f32]) {
        rms_norm(x, &self.alpha, self.eps, out);
    }

    pub fn dim(&self) -> usize {
        self.alpha.len()
    }
}

/// SiLU-gated feed-forward block.
#[derive(Clone, Debug)]
pub struct Gating {
    linear_in: Linear,
    linear_out: Linear,
}

impl Gating {
    pub fn new(linear_in: Linear, linear_out: Linear) -> Self {
        Self {
            linear_in,
            linear_out,
        }
    }

    pub fn hidden_dim(&self) -> usize {
        self.linear_out.in_dim()
    }

    pub fn weight_bytes(&self) -> usize {
        self.linear_in.weight_bytes() + self.linear_out.weight_bytes()
    }

    /// `out = linear_out(silu(gate) * value)` with `[gate | value] = linear_in(x)`.
    pub fn forward(&self, x: &[f32], scratch: &mut LayerScratch, out: &mut [f32]) {
        let hidden = self.hidden_dim();
        scratch.ff_in.resize(2 * hidden, 0.0);
        self.linear_in.matvec_into(x, &mut scratch.ff_in);
        let (gate, value) = scratch.ff_in.split_at_mut(hidden);
        for (g, v) in gate.iter_mut().zip(value.iter()) {
            *g = silu(*g) * v;
        }
        self.linear_out.matvec_into(gate, out);
    }
}

/// Buffers reused by every layer of one stack.
#[derive(Clone, Debug, Default)]
pub struct LayerScratch {
    normed: Vec<f32>,
    branch: Vec<f32>,
    ff_in: Vec<f32>,
    attention: AttentionScratch,
}

/// One transformer layer.
#[derive(Clone, Debug)]
pub struct TransformerLayer {
    norm1: RmsNorm,
    attention: Attention,
    norm2: RmsNorm,
    gating: Gating,
}

impl TransformerLayer {
    pub fn new(norm1: RmsNorm, attention: Attention, norm2: RmsNorm, gating: Gating) -> Self {
        Self {
            norm1,
            attention,
            norm2,
            gating,
        }
    }

    pub fn attention(&self) -> &Attention {
        &self.attention
    }

    /// Bytes of weights read per step (norms included).
    pub fn weight_bytes(&self) -> usize {
        self.attention.weight_bytes()
            + self.gating.weight_bytes()
            + (self.norm1.dim() + self.norm2.dim()) * 4
    }

    /// Updates the residual stream `x` (`[dim]`) for one new position.
    pub fn step(
        &self,
        x: &mut [f32],
        rotation: Option<&RopeRotation>,
        cache: &mut KvCache,
        scratch: &mut LayerScratch,
    ) {
        let dim = x.len();
        scratch.normed.resize(dim, 0.0);
        scratch.branch.resize(dim, 0.0);
        self.norm1.forward(x, &mut scratch.normed);
        self.attention.step(
            &scratch.normed,
            rotation,
            cache,
            &mut scratch.attention,
            &mut scratch.branch,
        );
        for (a, b) in x.iter_mut().zip(&scratch.branch) {
            *a += b;
        }
        self.norm2.forward(x, &mut scratch.normed);
        let normed = std::mem::take(&mut scratch.normed);
        let mut branch = std::mem::take(&mut scratch.branch);
        self.gating.forward(&normed, scratch, &mut branch);
        for (a, b) in x.iter_mut().zip(&branch) {
            *a += b;
        }
        scratch.normed = normed;
        scratch.branch = branch;
    }
}
