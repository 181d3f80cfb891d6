//! One pre-norm transformer layer of the Moshi LM (temporal and depformer alike):
//! `x += attn(rms_norm1(x)); x += gating(rms_norm2(x))`, RMSNorm in f32 with gain `alpha`,
//! SiLU-gated FFN `linear_out(silu(gate) * value)` where `linear_in(x) = [gate | value]`. A
//! temporal layer of Kyutai's TTS also cross-attends between the two:
//! `x += cross_attn(layer_norm_cross(x), source)`.

use moshi_kernels::dense::silu_mul_slice;
use moshi_loader::NormKind;

use crate::nn::norm::{layer_norm, rms_norm};
use crate::nn::{
    Attention, AttentionScratch, CrossAttention, CrossAttentionScratch, CrossKeysValues, KvCache,
    Linear, RopeRotation,
};

/// Epsilon of the cross-attention's LayerNorm (`nn.LayerNorm(d_model, eps=1e-5)`).
const CROSS_NORM_EPS: f32 = 1e-5;

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

/// The cross-attention block of a layer: a LayerNorm with bias (eps 1e-5, as Kyutai's
/// `norm_cross`, "always a layer norm") and the attention.
#[derive(Clone, Debug)]
pub struct CrossBlock {
    norm_weight: Vec<f32>,
    norm_bias: Vec<f32>,
    attention: CrossAttention,
}

impl CrossBlock {
    pub fn new(norm_weight: Vec<f32>, norm_bias: Vec<f32>, attention: CrossAttention) -> Self {
        Self {
            norm_weight,
            norm_bias,
            attention,
        }
    }

    pub fn attention(&self) -> &CrossAttention {
        &self.attention
    }

    pub fn weight_bytes(&self) -> usize {
        self.attention.weight_bytes() + (self.norm_weight.len() + self.norm_bias.len()) * 4
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

    /// `out = linear_out(silu(gate) * value)` with `[gate | value] = linear_in(x)`, for `m` rows.
    pub fn forward(&self, x: &[f32], m: usize, scratch: &mut LayerScratch, out: &mut [f32]) {
        let hidden = self.hidden_dim();
        scratch.ff_in.resize(m * 2 * hidden, 0.0);
        scratch.gated.resize(m * hidden, 0.0);
        self.linear_in.forward(x, m, &mut scratch.ff_in);
        gate_rows(&scratch.ff_in, hidden, &mut scratch.gated);
        self.linear_out.forward(&scratch.gated, m, out);
    }
}

/// Values below which [`gate_rows`] stays on the calling thread (waking the team costs about what
/// this many `silu`s take).
const GATE_MIN_VALUES_PER_THREAD: usize = 4096;

/// `gated[r, j] = silu(gate[r, j]) · value[r, j]` for every row `r` of `ff_in` (`[gate | value]`,
/// `2 · hidden` each), split between the team's threads: elementwise, so the bits do not depend
/// on the split.
fn gate_rows(ff_in: &[f32], hidden: usize, gated: &mut [f32]) {
    let threads = moshi_kernels::team::threads();
    let per_part = gated
        .len()
        .div_ceil(threads)
        .max(GATE_MIN_VALUES_PER_THREAD);
    moshi_kernels::team::run_chunks_mut(gated, per_part, &|first, part| {
        let (mut part, mut at) = (part, first);
        while !part.is_empty() {
            // The rest of row `at / hidden` within this part.
            let (row, col) = (at / hidden, at % hidden);
            let (out, rest) = part.split_at_mut((hidden - col).min(part.len()));
            let gate = &ff_in[row * 2 * hidden + col..][..out.len()];
            let value = &ff_in[row * 2 * hidden + hidden + col..][..out.len()];
            silu_mul_slice(out, gate, value);
            at += out.len();
            part = rest;
        }
    });
}

/// Buffers reused by every layer of one stack.
#[derive(Clone, Debug, Default)]
pub struct LayerScratch {
    normed: Vec<f32>,
    branch: Vec<f32>,
    ff_in: Vec<f32>,
    gated: Vec<f32>,
    attention: AttentionScratch,
    cross: CrossAttentionScratch,
}

/// One transformer layer.
#[derive(Clone, Debug)]
pub struct TransformerLayer {
    norm1: RmsNorm,
    attention: Attention,
    norm2: RmsNorm,
    gating: Gating,
    cross: Option<CrossBlock>,
}

impl TransformerLayer {
    pub fn new(norm1: RmsNorm, attention: Attention, norm2: RmsNorm, gating: Gating) -> Self {
        Self {
            norm1,
            attention,
            norm2,
            gating,
            cross: None,
        }
    }

    /// The layer with a cross-attention block between self-attention and the feed-forward.
    pub fn with_cross(mut self, cross: CrossBlock) -> Self {
        self.cross = Some(cross);
        self
    }

    pub fn cross(&self) -> Option<&CrossBlock> {
        self.cross.as_ref()
    }

    pub fn attention(&self) -> &Attention {
        &self.attention
    }

    /// Bytes of weights read per step (norms included).
    pub fn weight_bytes(&self) -> usize {
        self.attention.weight_bytes()
            + self.gating.weight_bytes()
            + (self.norm1.dim() + self.norm2.dim()) * 4
            + self.cross.as_ref().map_or(0, CrossBlock::weight_bytes)
    }

    /// Updates the residual streams `xs` (`[m, dim]`), row `i` one new position of its own
    /// stream (rotation `rotations[i]`, cache `caches[i]`). Row `i`'s result does not depend on
    /// the other rows.
    pub fn step_rows(
        &self,
        xs: &mut [f32],
        m: usize,
        rotations: Option<&[RopeRotation]>,
        caches: &mut [&mut KvCache],
        scratch: &mut LayerScratch,
    ) {
        self.step_rows_cross(xs, m, rotations, caches, &[], scratch);
    }

    /// [`TransformerLayer::step_rows`] of a layer with cross-attention, row `i` attending over
    /// `cross_sources[i]` (this layer's keys and values of its source; empty for a layer
    /// without cross-attention).
    ///
    /// # Panics
    /// If the layer has cross-attention and `cross_sources` is not one per row (caller bug).
    pub fn step_rows_cross(
        &self,
        xs: &mut [f32],
        m: usize,
        rotations: Option<&[RopeRotation]>,
        caches: &mut [&mut KvCache],
        cross_sources: &[&CrossKeysValues],
        scratch: &mut LayerScratch,
    ) {
        let dim = self.attention.dim();
        let xs = &mut xs[..m * dim];
        scratch.normed.resize(m * dim, 0.0);
        scratch.branch.resize(m * dim, 0.0);
        self.norm1.forward(xs, &mut scratch.normed);
        self.attention.step_rows(
            &scratch.normed,
            m,
            rotations,
            caches,
            &mut scratch.attention,
            &mut scratch.branch,
        );
        for (a, b) in xs.iter_mut().zip(&scratch.branch) {
            *a += b;
        }
        if let Some(cross) = &self.cross {
            layer_norm(
                xs,
                &cross.norm_weight,
                &cross.norm_bias,
                CROSS_NORM_EPS,
                &mut scratch.normed,
            );
            cross.attention.step_rows(
                &scratch.normed,
                m,
                cross_sources,
                &mut scratch.cross,
                &mut scratch.branch,
            );
            for (a, b) in xs.iter_mut().zip(&scratch.branch) {
                *a += b;
            }
        }
        self.norm2.forward(xs, &mut scratch.normed);
        let normed = std::mem::take(&mut scratch.normed);
        let mut branch = std::mem::take(&mut scratch.branch);
        self.gating.forward(&normed, m, scratch, &mut branch);
        for (a, b) in xs.iter_mut().zip(&branch) {
            *a += b;
        }
        scratch.normed = normed;
        scratch.branch = branch;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moshi_kernels::dense::silu;

    /// Split between threads or not, every gated value is `silu(gate) · value` of its own row.
    #[test]
    fn gated_rows_are_each_rows_own_elementwise_product_at_any_split() {
        for (m, hidden) in [(1, 40), (3, 5000), (8, 2816)] {
            let ff_in: Vec<f32> = (0..m * 2 * hidden)
                .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) * 3e-3)
                .collect();
            let want: Vec<f32> = ff_in
                .chunks_exact(2 * hidden)
                .flat_map(|row| {
                    let (gate, value) = row.split_at(hidden);
                    gate.iter()
                        .zip(value)
                        .map(|(g, v)| silu(*g) * v)
                        .collect::<Vec<_>>()
                })
                .collect();
            for threads in [1, 2, 3] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let mut gated = vec![f32::NAN; m * hidden];
                pool.install(|| gate_rows(&ff_in, hidden, &mut gated));
                assert_eq!(gated, want, "{m} x {hidden}, {threads} threads");
            }
        }
    }
}
