//! Mimi's streaming transformer (25 Hz): pre-norm LayerNorm layers with interleaved RoPE,
//! causal multi-head attention over a ring KV cache of `context` steps, exact-GELU MLP and
//! LayerScale on both residual branches. Streaming follows PyTorch's `RingKVCache`: a chunk's
//! keys are written first, then a query at position p sees the keys still in the ring with
//! `p - context < p' <= p`. The non-streaming forward sees every key with `p - context < p' <= p`.

use moshi_kernels::dense::{accumulate_rows, dot_rows, gelu_slice};
use moshi_kernels::{f32_to_bf16_bits, Kernel, WeightElem};
use moshi_loader::config::MimiTransformerConfig;

use super::matrix::{MimiWeights, WeightMatrix};
use super::weights::WeightSource;
use crate::ops::layer_norm;
use crate::Result;

#[derive(Clone, Debug)]
struct Layer {
    in_proj: WeightMatrix,
    out_proj: WeightMatrix,
    norm1_w: Vec<f32>,
    norm1_b: Vec<f32>,
    norm2_w: Vec<f32>,
    norm2_b: Vec<f32>,
    linear1: WeightMatrix,
    linear2: WeightMatrix,
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
    /// RoPE inverse frequencies per pair, as PyTorch computes them in f32.
    inv_freq: Vec<f32>,
    /// Keep the streaming KV ring in bf16 (set with a reduced weight mode).
    kv_bf16: bool,
}

/// How keys are kept between calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionMode {
    /// Ring KV cache of `context` steps (PyTorch streaming).
    Streaming,
    /// The whole chunk is the sequence (PyTorch non-streaming call); the state is not used for keys.
    Batch,
}

#[derive(Clone, Debug, Default)]
struct LayerCache {
    /// `[context][dim]`, slot = position % context (exact mode).
    keys: Vec<f32>,
    values: Vec<f32>,
    /// The same ring as bf16 bits (reduced weight modes: half the bytes read per query).
    keys_bf16: Vec<u16>,
    values_bf16: Vec<u16>,
}

/// An element of the KV ring: f32, or bf16 bits.
trait KvElem: WeightElem {
    fn from_f32(x: f32) -> Self;
}

impl KvElem for f32 {
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl KvElem for u16 {
    fn from_f32(x: f32) -> Self {
        f32_to_bf16_bits(x)
    }
}

/// Makes `ring` a `len`-element ring, converting `other` (the ring in the other element type, if
/// it holds one: the weight mode changed mid-stream) and then dropping it, so that only one
/// up-to-date ring exists.
fn take_ring<A: KvElem, B: KvElem>(ring: &mut Vec<A>, other: &mut Vec<B>, len: usize) {
    if ring.len() != len {
        *ring = if other.len() == len {
            other.iter().map(|v| A::from_f32(v.to_f32())).collect()
        } else {
            vec![A::from_f32(0.0); len]
        };
    }
    if !other.is_empty() {
        *other = Vec::new();
    }
}

/// Writes rows `0..t` of the chunk's keys and values (columns `d..2d` and `2d..3d` of each qkv
/// row) into their ring slots.
fn write_ring<K: KvElem>(
    keys: &mut [K],
    values: &mut [K],
    qkv: &[f32],
    t: usize,
    d: usize,
    offset: usize,
    context: usize,
) {
    for i in 0..t {
        let slot = (offset + i) % context;
        let row = &qkv[i * 3 * d..(i + 1) * 3 * d];
        for (k, v) in keys[slot * d..(slot + 1) * d]
            .iter_mut()
            .zip(&row[d..2 * d])
        {
            *k = K::from_f32(*v);
        }
        for (k, v) in values[slot * d..(slot + 1) * d]
            .iter_mut()
            .zip(&row[2 * d..])
        {
            *k = K::from_f32(*v);
        }
    }
}

/// Streaming state of a [`MimiTransformer`]: position and KV rings, plus scratch buffers.
#[derive(Clone, Debug, Default)]
pub struct TransformerState {
    offset: usize,
    caches: Vec<LayerCache>,
    norm: Vec<f32>,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    hidden: Vec<f32>,
}

impl TransformerState {
    pub fn reset(&mut self) {
        self.offset = 0;
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
            let layer = Layer {
                in_proj: WeightMatrix::new(t("self_attn.in_proj_weight", &[3 * d, d])?, 3 * d, d),
                out_proj: WeightMatrix::new(t("self_attn.out_proj.weight", &[d, d])?, d, d),
                norm1_w: t("norm1.weight", &[d])?,
                norm1_b: t("norm1.bias", &[d])?,
                norm2_w: t("norm2.weight", &[d])?,
                norm2_b: t("norm2.bias", &[d])?,
                linear1: WeightMatrix::new(t("linear1.weight", &[f, d])?, f, d),
                linear2: WeightMatrix::new(t("linear2.weight", &[d, f])?, d, f),
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
        let head_dim = d / cfg.num_heads;
        let step = (-(cfg.max_period.ln()) * 2.0 / head_dim as f64) as f32;
        let inv_freq = (0..head_dim / 2).map(|i| (i as f32 * step).exp()).collect();
        Ok(Self {
            layers,
            dim: d,
            num_heads: cfg.num_heads,
            ff_dim: f,
            context: cfg.context,
            inv_freq,
            kv_bf16: false,
        })
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Weight precision of the projections' few-row products; the reduced modes also keep the
    /// streaming KV ring in bf16 (a state made in another mode is converted on its next call).
    pub fn set_weights(&mut self, mode: MimiWeights) {
        self.kv_bf16 = mode != MimiWeights::F32;
        for l in &mut self.layers {
            for w in [
                &mut l.in_proj,
                &mut l.out_proj,
                &mut l.linear1,
                &mut l.linear2,
            ] {
                w.set_weights(mode);
            }
        }
    }

    pub fn context(&self) -> usize {
        self.context
    }

    pub fn new_state(&self) -> TransformerState {
        TransformerState {
            caches: vec![LayerCache::default(); self.layers.len()],
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
        let offset = match mode {
            AttentionMode::Streaming => {
                assert!(
                    t <= self.context,
                    "streaming chunk of {t} steps exceeds the context {}",
                    self.context
                );
                st.offset
            }
            AttentionMode::Batch => 0,
        };
        let TransformerState {
            caches,
            norm,
            qkv,
            attn,
            proj,
            hidden,
            ..
        } = st;
        norm.resize(t * d, 0.0);
        qkv.resize(t * 3 * d, 0.0);
        attn.resize(t * d, 0.0);
        proj.resize(t * d, 0.0);
        hidden.resize(t * self.ff_dim, 0.0);
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            layer_norm(x, &layer.norm1_w, &layer.norm1_b, 1e-5, norm);
            layer
                .in_proj
                .gemm(t, d, 3 * d, norm, d, 0, d, qkv, 3 * d, false);
            self.rope(qkv, t, offset);
            match mode {
                AttentionMode::Streaming => {
                    let (context, len) = (self.context, self.context * d);
                    let oldest = (offset + t).saturating_sub(context);
                    let row_of = |p: usize| (p % context) * d;
                    if self.kv_bf16 {
                        take_ring(&mut cache.keys_bf16, &mut cache.keys, len);
                        take_ring(&mut cache.values_bf16, &mut cache.values, len);
                        write_ring(
                            &mut cache.keys_bf16,
                            &mut cache.values_bf16,
                            qkv,
                            t,
                            d,
                            offset,
                            context,
                        );
                        self.attend(
                            qkv,
                            t,
                            offset,
                            oldest,
                            row_of,
                            &cache.keys_bf16,
                            &cache.values_bf16,
                            attn,
                        );
                    } else {
                        take_ring(&mut cache.keys, &mut cache.keys_bf16, len);
                        take_ring(&mut cache.values, &mut cache.values_bf16, len);
                        write_ring(
                            &mut cache.keys,
                            &mut cache.values,
                            qkv,
                            t,
                            d,
                            offset,
                            context,
                        );
                        self.attend(
                            qkv,
                            t,
                            offset,
                            oldest,
                            row_of,
                            &cache.keys,
                            &cache.values,
                            attn,
                        );
                    }
                }
                AttentionMode::Batch => {
                    // Keys and values read in place from the qkv rows.
                    let (keys, values) = (&qkv[d..], &qkv[2 * d..]);
                    self.attend(qkv, t, 0, 0, |p| p * 3 * d, keys, values, attn);
                }
            }
            layer.out_proj.gemm(t, d, d, attn, d, 0, d, proj, d, false);
            for (row, prow) in x.chunks_exact_mut(d).zip(proj.chunks_exact(d)) {
                for ((v, p), s) in row.iter_mut().zip(prow).zip(&layer.scale1) {
                    *v += s * p;
                }
            }
            layer_norm(x, &layer.norm2_w, &layer.norm2_b, 1e-5, norm);
            layer
                .linear1
                .gemm(t, d, self.ff_dim, norm, d, 0, d, hidden, self.ff_dim, false);
            gelu_slice(hidden);
            layer.linear2.gemm(
                t,
                self.ff_dim,
                d,
                hidden,
                self.ff_dim,
                0,
                self.ff_dim,
                proj,
                d,
                false,
            );
            for (row, prow) in x.chunks_exact_mut(d).zip(proj.chunks_exact(d)) {
                for ((v, p), s) in row.iter_mut().zip(prow).zip(&layer.scale2) {
                    *v += s * p;
                }
            }
        }
        if mode == AttentionMode::Streaming {
            st.offset += t;
        }
    }

    /// Interleaved rotary embedding of q and k (first two thirds of each qkv row) at positions
    /// `offset..offset + t`, in f32 like PyTorch.
    fn rope(&self, qkv: &mut [f32], t: usize, offset: usize) {
        let d = self.dim;
        let hd = d / self.num_heads;
        for i in 0..t {
            let pos = (offset + i) as f32;
            let row = &mut qkv[i * 3 * d..i * 3 * d + 2 * d];
            for (pair, &f) in self.inv_freq.iter().enumerate() {
                let angle = f * pos;
                let (c, s) = (angle.cos(), angle.sin());
                for head in 0..2 * self.num_heads {
                    let base = head * hd + 2 * pair;
                    let (r, im) = (row[base], row[base + 1]);
                    row[base] = r * c - im * s;
                    row[base + 1] = r * s + im * c;
                }
            }
        }
    }

    /// Softmax attention of the `t` queries (positions `q0..q0 + t`) over keys at positions
    /// `max(oldest, p - context + 1) ..= p`; `row_of(p')` gives the key's offset in `keys`/`values`.
    /// Heads are independent parts on the [`crate::team`] (the window's keys and values are the
    /// memory traffic here); each head's arithmetic is the same whoever runs it.
    #[allow(clippy::too_many_arguments)]
    fn attend<K: WeightElem>(
        &self,
        qkv: &[f32],
        t: usize,
        q0: usize,
        oldest: usize,
        row_of: impl Fn(usize) -> usize + Sync,
        keys: &[K],
        values: &[K],
        out: &mut [f32],
    ) {
        let d = self.dim;
        assert!(
            qkv.len() >= t * 3 * d && out.len() >= t * d,
            "attention buffers"
        );
        let out_ptr = OutPtr(out.as_mut_ptr());
        let head = |h: usize| {
            let op = out_ptr;
            // SAFETY: head h writes only columns h * hd..(h + 1) * hd of the t output rows (inside
            // `out`, asserted above), which no other head touches.
            unsafe { self.attend_head(h, qkv, t, q0, oldest, &row_of, keys, values, op.0) };
        };
        if self.num_heads > 1 && t * self.context.min(q0 + t) * d >= ATTENTION_PARALLEL_MIN {
            crate::team::run(self.num_heads, &head);
        } else {
            (0..self.num_heads).for_each(head);
        }
    }

    /// # Safety
    /// `out` points at `t` rows of `dim` values; columns of head `h` are not accessed concurrently.
    #[allow(clippy::too_many_arguments)]
    unsafe fn attend_head<K: WeightElem>(
        &self,
        h: usize,
        qkv: &[f32],
        t: usize,
        q0: usize,
        oldest: usize,
        row_of: &dyn Fn(usize) -> usize,
        keys: &[K],
        values: &[K],
        out: *mut f32,
    ) {
        SCORES.with(|cell| {
            let scores = &mut *cell.borrow_mut();
            // SAFETY: caller contract forwarded.
            unsafe {
                attend_head_body(
                    self, h, qkv, t, q0, oldest, row_of, keys, values, out, scores,
                )
            };
        });
    }
}

/// Work (`queries · keys · dim`) from which attention heads are split over the team.
const ATTENTION_PARALLEL_MIN: usize = 1 << 16;

#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: hands disjoint column blocks of one output to the parts of one team region.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

thread_local! {
    /// Per-thread attention scores (no allocation per head in steady state).
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One head of [`MimiTransformer::attend`] for all `t` queries: scores in the fixed order of
/// `moshi_kernels::dense`, values accumulated position by position.
///
/// # Safety
/// As [`MimiTransformer::attend_head`].
#[allow(clippy::too_many_arguments)]
unsafe fn attend_head_body<K: WeightElem>(
    tr: &MimiTransformer,
    h: usize,
    qkv: &[f32],
    t: usize,
    q0: usize,
    oldest: usize,
    row_of: &dyn Fn(usize) -> usize,
    keys: &[K],
    values: &[K],
    out: *mut f32,
    scores: &mut Vec<f32>,
) {
    let d = tr.dim;
    let hd = d / tr.num_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let kernel = Kernel::detect();
    for i in 0..t {
        let p = q0 + i;
        let first = oldest.max((p + 1).saturating_sub(tr.context));
        let q = &qkv[i * 3 * d + h * hd..i * 3 * d + (h + 1) * hd];
        scores.clear();
        let mut max = f32::NEG_INFINITY;
        for kp in first..=p {
            let k = &keys[row_of(kp) + h * hd..row_of(kp) + (h + 1) * hd];
            let s = dot_rows(kernel, [k], q)[0] * scale;
            max = max.max(s);
            scores.push(s);
        }
        let mut sum = 0f32;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        // SAFETY: this head's columns of row i (caller contract).
        let o = unsafe { std::slice::from_raw_parts_mut(out.add(i * d + h * hd), hd) };
        o.fill(0.0);
        for (j, kp) in (first..=p).enumerate() {
            let w = scores[j] / sum;
            let v = &values[row_of(kp) + h * hd..row_of(kp) + (h + 1) * hd];
            accumulate_rows(kernel, o, [w], [v]);
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
        st_lost.caches = vec![LayerCache::default(); 2];
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
