//! Mimi's streaming transformer (25 Hz): pre-norm LayerNorm layers with interleaved RoPE,
//! causal multi-head attention over a ring KV cache of `context` steps (`nn::Attention`), exact-GELU
//! MLP and LayerScale on both residual branches. Streaming follows PyTorch's `RingKVCache`: a
//! chunk's keys are written first, then a query at position p sees the keys still in the ring with
//! `p - context < p' <= p`. The non-streaming forward sees every key with `p - context < p' <= p`.

use moshi_kernels::dense::gelu_slice;
use moshi_loader::config::MimiTransformerConfig;

use super::weights::WeightSource;
use super::MimiWeights;
use crate::nn::linear::count_bytes;
use crate::nn::norm::layer_norm;
use crate::nn::{Attention, AttentionScratch, KvCache, KvPrecision, Linear, Rope, RopeRotation};
use crate::Result;

#[derive(Clone, Debug)]
struct Layer {
    attention: Attention,
    norm1_w: Vec<f32>,
    norm1_b: Vec<f32>,
    norm2_w: Vec<f32>,
    norm2_b: Vec<f32>,
    linear1: Linear,
    linear2: Linear,
    scale1: Vec<f32>,
    scale2: Vec<f32>,
}

/// Weights and shape of one Mimi transformer.
#[derive(Clone, Debug)]
pub struct MimiTransformer {
    layers: Vec<Layer>,
    dim: usize,
    num_heads: usize,
    ff_dim: usize,
    context: usize,
    rope: Rope,
    /// Element type of the streaming KV rings (bf16 with a reduced weight mode).
    kv_precision: KvPrecision,
}

/// How keys are kept between calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionMode {
    /// Ring KV cache of `context` steps (PyTorch streaming).
    Streaming,
    /// The whole chunk is the sequence (PyTorch non-streaming call); the state is not used for keys.
    Batch,
}

/// Streaming state of a [`MimiTransformer`]: position and KV rings, plus scratch buffers.
#[derive(Clone, Debug, Default)]
pub struct TransformerState {
    offset: usize,
    caches: Vec<KvCache>,
    rotations: Vec<RopeRotation>,
    attention: AttentionScratch,
    norm: Vec<f32>,
    proj: Vec<f32>,
    hidden: Vec<f32>,
}

impl TransformerState {
    pub fn reset(&mut self) {
        self.offset = 0;
        self.caches.iter_mut().for_each(KvCache::reset);
    }

    /// Steps consumed since the last reset.
    pub fn offset(&self) -> usize {
        self.offset
    }
}

impl MimiTransformer {
    pub(crate) fn load(
        src: &mut dyn WeightSource,
        prefix: &str,
        cfg: &MimiTransformerConfig,
    ) -> Result<Self> {
        let (d, f) = (cfg.d_model, cfg.dim_feedforward);
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for l in 0..cfg.num_layers {
            let p = format!("{prefix}.transformer.layers.{l}");
            let mut t = |name: &str, shape: &[usize]| src.tensor(&format!("{p}.{name}"), shape);
            let in_proj = Linear::f32(t("self_attn.in_proj_weight", &[3 * d, d])?, 3 * d, d);
            let out_proj = Linear::f32(t("self_attn.out_proj.weight", &[d, d])?, d, d);
            let layer = Layer {
                attention: Attention::new(in_proj, out_proj, cfg.num_heads),
                norm1_w: t("norm1.weight", &[d])?,
                norm1_b: t("norm1.bias", &[d])?,
                norm2_w: t("norm2.weight", &[d])?,
                norm2_b: t("norm2.bias", &[d])?,
                linear1: Linear::f32(t("linear1.weight", &[f, d])?, f, d),
                linear2: Linear::f32(t("linear2.weight", &[d, f])?, d, f),
                scale1: if cfg.layer_scale.is_some() {
                    t("layer_scale_1.scale", &[d])?
                } else {
                    vec![1.0; d]
                },
                scale2: if cfg.layer_scale.is_some() {
                    t("layer_scale_2.scale", &[d])?
                } else {
                    vec![1.0; d]
                },
            };
            layers.push(layer);
        }
        Ok(Self {
            layers,
            dim: d,
            num_heads: cfg.num_heads,
            ff_dim: f,
            context: cfg.context,
            rope: Rope::new(d / cfg.num_heads, cfg.max_period),
            kv_precision: KvPrecision::F32,
        })
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn num_heads(&self) -> usize {
        self.num_heads
    }

    /// Weight precision of the projections' few-row products; the reduced modes also keep the
    /// streaming KV rings in bf16 (a state made in another mode is converted on its next call,
    /// keeping its history).
    pub fn set_weights(&mut self, mode: MimiWeights) {
        self.kv_precision = if mode == MimiWeights::F32 {
            KvPrecision::F32
        } else {
            KvPrecision::Bf16
        };
        for l in &mut self.layers {
            let [in_proj, out_proj] = l.attention.projections_mut();
            for w in [in_proj, out_proj, &mut l.linear1, &mut l.linear2] {
                w.set_reduced_precision(mode);
            }
        }
    }

    pub fn context(&self) -> usize {
        self.context
    }

    pub fn new_state(&self) -> TransformerState {
        TransformerState {
            caches: (0..self.layers.len())
                .map(|_| {
                    let head_dim = self.dim / self.num_heads;
                    KvCache::with_precision(self.context, self.dim, head_dim, self.kv_precision)
                })
                .collect(),
            ..Default::default()
        }
    }

    /// Runs `x` (`[t][dim]`) through all layers in place. In streaming mode `t` must not exceed
    /// the context (Mimi feeds 2 steps per frame).
    pub fn forward(&self, st: &mut TransformerState, x: &mut [f32], mode: AttentionMode) {
        let d = self.dim;
        assert_eq!(
            x.len() % d,
            0,
            "transformer input is not a whole number of rows"
        );
        let t = x.len() / d;
        if t == 0 {
            return;
        }
        if mode == AttentionMode::Streaming {
            self.forward_streams(&mut [st], x, t);
            return;
        }
        let TransformerState {
            rotations,
            attention,
            norm,
            proj,
            hidden,
            ..
        } = st;
        rotations.resize_with(t, RopeRotation::default);
        for (i, rot) in rotations.iter_mut().enumerate() {
            self.rope.rotation_into(i, rot);
        }
        let (context, rotations) = (self.context, &rotations[..]);
        self.run_layers(x, [norm, proj, hidden], |_, attn, norm, proj| {
            attn.forward_sequence(norm, t, Some(rotations), context, attention, proj)
        });
    }

    /// Streaming steps of several streams (sessions) at once: `x` holds `t` rows of each state's
    /// stream in turn (`[states.len() * t][dim]`), each stream over its own KV rings and
    /// position. The products take the rows of as many streams at once as give each row its own
    /// bits ([`Linear::same_bits_rows`]: with f32 weights 32 streams of 2 steps), so every stream
    /// gets what [`MimiTransformer::forward`] gives it alone, bit for bit, while the weights are
    /// read once per group of streams instead of once per stream.
    ///
    /// # Panics
    /// If `x` does not hold `t` rows per state or `t` exceeds the context (caller bug).
    pub fn forward_streams(&self, states: &mut [&mut TransformerState], x: &mut [f32], t: usize) {
        let d = self.dim;
        assert_eq!(
            x.len(),
            states.len() * t * d,
            "transformer: {t} rows per stream"
        );
        assert!(
            t <= self.context,
            "streaming chunk of {t} steps exceeds the context {}",
            self.context
        );
        if t == 0 || states.is_empty() {
            return;
        }
        let per_group = (self.same_bits_rows() / t).max(1);
        for (group, x) in states
            .chunks_mut(per_group)
            .zip(x.chunks_mut(per_group * t * d))
        {
            let streams = group.len();
            // The first stream's buffers serve the group.
            let (first, rest) = group.split_first_mut().expect("a group holds a stream");
            let TransformerState {
                offset,
                caches,
                rotations,
                attention,
                norm,
                proj,
                hidden,
            } = &mut **first;
            rotations.resize_with(streams * t, RopeRotation::default);
            let offsets = std::iter::once(*offset).chain(rest.iter().map(|s| s.offset));
            for (rots, start) in rotations.chunks_exact_mut(t).zip(offsets) {
                for (i, rot) in rots.iter_mut().enumerate() {
                    self.rope.rotation_into(start + i, rot);
                }
            }
            let rotations = &rotations[..];
            self.run_layers(x, [norm, proj, hidden], |layer, attn, norm, proj| {
                let first = &mut caches[layer];
                first.convert(self.kv_precision);
                for s in rest.iter_mut() {
                    s.caches[layer].convert(self.kv_precision);
                }
                let mut run = |layer_caches: &mut [&mut KvCache]| {
                    attn.forward_streams(
                        norm,
                        streams,
                        t,
                        Some(rotations),
                        layer_caches,
                        attention,
                        proj,
                    )
                };
                if rest.is_empty() {
                    // One stream (Mimi alone): no list of caches to build each layer and frame.
                    run(&mut [first]);
                } else {
                    let mut layer_caches: Vec<&mut KvCache> = std::iter::once(first)
                        .chain(rest.iter_mut().map(|s| &mut s.caches[layer]))
                        .collect();
                    run(&mut layer_caches);
                }
            });
            *offset += t;
            for s in rest.iter_mut() {
                s.offset += t;
            }
        }
    }

    /// The most rows every product of a layer takes with each row's own bits.
    fn same_bits_rows(&self) -> usize {
        self.layers
            .iter()
            .flat_map(|l| {
                [
                    l.attention.in_proj(),
                    l.attention.out_proj(),
                    &l.linear1,
                    &l.linear2,
                ]
            })
            .map(Linear::same_bits_rows)
            .min()
            .unwrap_or(usize::MAX)
    }

    /// Every layer over the rows of `x` (in place), with `attend(layer, attention, normed rows,
    /// out)` for the attention; `buffers` are the norm, projection and hidden scratch.
    fn run_layers(
        &self,
        x: &mut [f32],
        buffers: [&mut Vec<f32>; 3],
        mut attend: impl FnMut(usize, &Attention, &[f32], &mut [f32]),
    ) {
        let d = self.dim;
        let rows = x.len() / d;
        let [norm, proj, hidden] = buffers;
        norm.resize(rows * d, 0.0);
        proj.resize(rows * d, 0.0);
        hidden.resize(rows * self.ff_dim, 0.0);
        for (index, layer) in self.layers.iter().enumerate() {
            layer_norm(x, &layer.norm1_w, &layer.norm1_b, 1e-5, norm);
            let attn = &layer.attention;
            attend(index, attn, norm, proj);
            count_bytes(attn.in_proj().forward_bytes(rows) + attn.out_proj().forward_bytes(rows));
            for (row, prow) in x.chunks_exact_mut(d).zip(proj.chunks_exact(d)) {
                for ((v, p), s) in row.iter_mut().zip(prow).zip(&layer.scale1) {
                    *v += s * p;
                }
            }
            layer_norm(x, &layer.norm2_w, &layer.norm2_b, 1e-5, norm);
            layer.linear1.forward(norm, rows, hidden);
            gelu_slice(hidden);
            layer.linear2.forward(hidden, rows, proj);
            count_bytes(layer.linear1.forward_bytes(rows) + layer.linear2.forward_bytes(rows));
            for (row, prow) in x.chunks_exact_mut(d).zip(proj.chunks_exact(d)) {
                for ((v, p), s) in row.iter_mut().zip(prow).zip(&layer.scale2) {
                    *v += s * p;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mimi::weights::RandomWeights;
    use crate::mimi::MimiWeights;
    use moshi_loader::{Gating, NormKind, PositionalEmbedding};

    fn config(context: usize, num_layers: usize) -> MimiTransformerConfig {
        MimiTransformerConfig {
            d_model: 16,
            num_heads: 2,
            num_layers,
            causal: true,
            layer_scale: Some(0.01),
            context,
            conv_layout: true,
            max_period: 10000.0,
            gating: Gating::None,
            norm: NormKind::LayerNorm,
            positional_embedding: PositionalEmbedding::Rope,
            dim_feedforward: 32,
            input_dimension: 16,
            output_dimensions: vec![16],
        }
    }

    fn input(t: usize, d: usize) -> Vec<f32> {
        (0..t * d).map(|i| ((i as f32) * 0.37).sin()).collect()
    }

    #[test]
    fn streaming_equals_batch_before_the_window_fills() {
        let tr = MimiTransformer::load(&mut RandomWeights::new(5), "t", &config(12, 2)).unwrap();
        let x = input(12, 16);
        let mut batch = x.clone();
        tr.forward(&mut tr.new_state(), &mut batch, AttentionMode::Batch);
        assert!(
            batch.iter().zip(&x).any(|(a, b)| (a - b).abs() > 1e-4),
            "transformer must change its input"
        );
        for chunk in [1, 2, 3, 4] {
            let mut st = tr.new_state();
            let mut streamed = x.clone();
            for part in streamed.chunks_mut(chunk * 16) {
                tr.forward(&mut st, part, AttentionMode::Streaming);
            }
            let diff = streamed
                .iter()
                .zip(&batch)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(diff < 1e-5, "chunk {chunk}: stream vs batch {diff}");
            assert_eq!(st.offset(), 12);
            st.reset();
            let mut again = x.clone();
            for part in again.chunks_mut(chunk * 16) {
                tr.forward(&mut st, part, AttentionMode::Streaming);
            }
            assert_eq!(again, streamed, "reset repeats the stream");
        }
    }

    #[test]
    fn bf16_kv_ring_stays_close_and_a_mode_switch_keeps_the_history() {
        let tr = MimiTransformer::load(&mut RandomWeights::new(7), "t", &config(8, 2)).unwrap();
        let x = input(20, 16);
        let run = |tr: &MimiTransformer, st: &mut TransformerState, xs: &mut [f32]| {
            for part in xs.chunks_mut(2 * 16) {
                tr.forward(st, part, AttentionMode::Streaming);
            }
        };
        let mut exact = x.clone();
        run(&tr, &mut tr.new_state(), &mut exact);
        let mut reduced = tr.clone();
        reduced.set_weights(MimiWeights::Bf16);
        let diff_from = |ys: &[f32], from_row: usize| {
            ys[from_row * 16..]
                .iter()
                .zip(&exact[from_row * 16..])
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max)
        };
        // Exact for 10 steps, then bf16 (the f32 ring is converted), then exact again.
        let mut st = tr.new_state();
        let mut mixed = x.clone();
        let (head, rest) = mixed.split_at_mut(10 * 16);
        let (middle, tail) = rest.split_at_mut(6 * 16);
        run(&tr, &mut st, head);
        run(&reduced, &mut st, middle);
        run(&tr, &mut st, tail);
        assert_eq!(mixed[..10 * 16], exact[..10 * 16]);
        let switched = diff_from(&mixed, 10);
        // The same stream with the history lost at the switch (fresh ring, same positions).
        let mut lost = x.clone();
        let mut st_lost = tr.new_state();
        run(&tr, &mut st_lost, &mut lost[..10 * 16]);
        st_lost.caches = tr.new_state().caches;
        run(&reduced, &mut st_lost, &mut lost[10 * 16..16 * 16]);
        run(&tr, &mut st_lost, &mut lost[16 * 16..]);
        let lost_diff = diff_from(&lost, 10);
        assert!(
            switched > 0.0 && switched * 20.0 < lost_diff,
            "switch diff {switched}, lost-history diff {lost_diff}"
        );
    }

    #[test]
    fn ring_window_drops_the_oldest_key_for_the_first_step_of_a_chunk() {
        // context 4, chunks of 2: step 4 (first of the third chunk) sees keys 2..=4 only (3 keys),
        // the batch forward sees 1..=4. So the streams agree up to step 3 and differ at step 4
        // (one layer, so that step 5 does not see step 4's changed values).
        let tr = MimiTransformer::load(&mut RandomWeights::new(6), "t", &config(4, 1)).unwrap();
        let x = input(6, 16);
        let mut batch = x.clone();
        tr.forward(&mut tr.new_state(), &mut batch, AttentionMode::Batch);
        let mut st = tr.new_state();
        let mut streamed = x.clone();
        for part in streamed.chunks_mut(2 * 16) {
            tr.forward(&mut st, part, AttentionMode::Streaming);
        }
        let row_diff = |r: usize| {
            (0..16)
                .map(|c| (streamed[r * 16 + c] - batch[r * 16 + c]).abs())
                .fold(0.0, f32::max)
        };
        for r in 0..4 {
            assert!(row_diff(r) < 1e-5, "step {r} should match");
        }
        assert!(
            row_diff(4) > 1e-6,
            "step 4 should see one key fewer in streaming"
        );
        assert!(row_diff(5) < 1e-5, "step 5 sees a full window again");
    }
}
