//! The temporal (Helium) transformer: embeds the 1 + n_q tokens of a step, runs the layers over
//! a sliding window of `context` positions, applies `out_norm` and the text head.
//!
//! The weights ([`TemporalTransformer`]) are apart from the streaming state of a row
//! ([`TemporalState`]: KV caches, position, condition, last outputs): one step runs `m` rows
//! together ([`TemporalTransformer::step_rows`]), every linear layer one `m`-row product (the
//! weights read once), each row attending over its own caches at its own position. A row's
//! results have the bits it gets alone.

use std::sync::Arc;

use super::demux::{Demux, DemuxScratch};
use super::embedding::Embedding;
use super::transformer::{LayerScratch, RmsNorm, TransformerLayer};
use crate::nn::{CrossKeysValues, KvCache, KvPrecision, Linear, Rope, RopeRotation};

/// Streaming state of the temporal transformer for one row (a session, or a guidance row): KV
/// caches, position, the row's condition and the outputs of its last step.
#[derive(Clone, Debug)]
pub struct TemporalState {
    caches: Vec<KvCache>,
    position: usize,
    /// Added to the input embedding at every step (the fused conditioners' sum, `[dim]`).
    condition: Option<Vec<f32>>,
    /// The cross-attention source's keys and values, one per layer (the TTS's voice).
    cross: Option<Arc<Vec<CrossKeysValues>>>,
    transformer_out: Vec<f32>,
    text_logits: Vec<f32>,
}

impl TemporalState {
    /// The fused condition added to this row's input at every step (`[dim]`), if any.
    pub fn condition(&self) -> Option<&[f32]> {
        self.condition.as_deref()
    }

    /// Sets the condition added to this row's input at every step (`[dim]`), or none.
    pub fn set_condition(&mut self, condition: Option<Vec<f32>>) {
        debug_assert!(condition
            .as_ref()
            .is_none_or(|c| c.len() == self.transformer_out.len()));
        self.condition = condition;
    }

    /// Sets the keys and values (one per layer) this row's cross-attention reads.
    pub fn set_cross(&mut self, cross: Option<Arc<Vec<CrossKeysValues>>>) {
        self.cross = cross;
    }

    /// The cross-attention's keys and values, one per layer (shared by the rows of one
    /// condition).
    pub fn cross(&self) -> Option<&Arc<Vec<CrossKeysValues>>> {
        self.cross.as_ref()
    }

    /// Bytes held by the cross-attention's keys and values (shared ones counted in full).
    pub fn cross_bytes(&self) -> usize {
        self.cross
            .as_ref()
            .map_or(0, |c| c.iter().map(CrossKeysValues::bytes).sum())
    }

    /// Positions processed since the last reset.
    pub fn position(&self) -> usize {
        self.position
    }

    pub fn caches(&self) -> &[KvCache] {
        &self.caches
    }

    /// Output of the last step after `out_norm` (`[dim]`).
    pub fn transformer_out(&self) -> &[f32] {
        &self.transformer_out
    }

    /// Text logits of the last step (`[text_card]`).
    pub fn text_logits(&self) -> &[f32] {
        &self.text_logits
    }

    /// Forgets every position (keeps the condition and the caches' allocations).
    pub fn reset(&mut self) {
        for c in &mut self.caches {
            c.reset();
        }
        self.position = 0;
    }

    /// Element type of the KV caches (f32 unless set).
    pub fn kv_precision(&self) -> KvPrecision {
        self.caches
            .first()
            .map_or(KvPrecision::F32, KvCache::precision)
    }

    /// Pushes `positions` random keys and values (uniform in [-0.5, 0.5), from `seed`) into every
    /// layer's cache and advances the position as if that many steps had run. For benchmarks:
    /// attention over a filled window without computing the steps that would fill it. The caches
    /// keep at most `context` positions, as always. No input leads to this state.
    pub fn fill_caches_with_noise(&mut self, positions: usize, seed: u64) {
        for (i, cache) in self.caches.iter_mut().enumerate() {
            let mut rng =
                crate::rng::Rng::new(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let width = cache.width();
            let (mut key, mut value) = (vec![0f32; width], vec![0f32; width]);
            for _ in 0..positions.min(cache.capacity()) {
                key.iter_mut().for_each(|v| *v = rng.next_f32() - 0.5);
                value.iter_mut().for_each(|v| *v = rng.next_f32() - 0.5);
                cache.push(&key, &value);
            }
        }
        self.position += positions;
    }
}

/// Buffers of a step over `m` rows, reused across steps (one per caller that steps rows).
#[derive(Clone, Debug, Default)]
pub struct TemporalScratch {
    /// `[m, dim]` residual streams.
    residual: Vec<f32>,
    /// One embedding row.
    row: Vec<f32>,
    rotations: Vec<RopeRotation>,
    layer: LayerScratch,
    /// `[m, dim]` after `out_norm`.
    normed: Vec<f32>,
    /// `[m, text_card]`.
    logits: Vec<f32>,
    /// `[m, dim]`: the rows' demuxed text embeddings.
    text_rows: Vec<f32>,
    text_tokens: Vec<u32>,
    demux: DemuxScratch,
}

/// The weights of the temporal transformer.
#[derive(Clone, Debug)]
pub struct TemporalTransformer {
    text_emb: Embedding,
    audio_embs: Vec<Embedding>,
    layers: Vec<TransformerLayer>,
    out_norm: RmsNorm,
    text_linear: Linear,
    rope: Option<Rope>,
    /// Attention window in positions, current one included.
    context: usize,
    /// Text input token read with another token's embedding row (Hibiki: EOS reads as PAD).
    text_alias: Option<(u32, u32)>,
    /// The text input's two muxed streams (the TTS), read through these projections.
    text_demux: Option<Demux>,
}

impl TemporalTransformer {
    /// `context` is the attention window in positions, current one included.
    pub fn new(
        text_emb: Embedding,
        audio_embs: Vec<Embedding>,
        layers: Vec<TransformerLayer>,
        out_norm: RmsNorm,
        text_linear: Linear,
        rope: Option<Rope>,
        context: usize,
    ) -> Self {
        Self {
            text_emb,
            audio_embs,
            layers,
            out_norm,
            text_linear,
            rope,
            context: context.max(1),
            text_alias: None,
            text_demux: None,
        }
    }

    /// Reads the text input as two muxed streams through `demux` (Kyutai's TTS).
    pub fn set_text_demux(&mut self, demux: Option<Demux>) {
        self.text_demux = demux;
    }

    /// The keys and values of a cross-attention `source` (`[positions, dim]`) for every layer,
    /// computed once per session; `None` for a model without cross-attention.
    pub fn cross_keys_values(&self, source: &[f32]) -> Option<Vec<CrossKeysValues>> {
        self.layers
            .iter()
            .map(|l| Some(l.cross()?.attention().source_keys_values(source)))
            .collect()
    }

    /// [`TemporalTransformer::cross_keys_values`] of `source`, taking the rows equal (bit for
    /// bit, at the same position) to rows of `previous` (a source and its keys and values) from
    /// it and computing the others.
    pub fn cross_keys_values_reusing(
        &self,
        source: &[f32],
        previous: (&[f32], &[CrossKeysValues]),
    ) -> Option<Vec<CrossKeysValues>> {
        let (previous_source, previous_kv) = previous;
        let dim = self.dim();
        let same = |j: usize| {
            let row = j * dim..(j + 1) * dim;
            match (previous_source.get(row.clone()), source.get(row)) {
                (Some(a), Some(b)) => a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                _ => false,
            }
        };
        let fresh: Vec<usize> = (0..source.len() / dim).filter(|&j| !same(j)).collect();
        self.layers
            .iter()
            .zip(previous_kv)
            .map(|(l, kv)| {
                Some(
                    l.cross()?
                        .attention()
                        .source_keys_values_reusing(source, &fresh, kv),
                )
            })
            .collect()
    }

    /// A fresh row: empty caches of `precision`, position 0, no condition.
    pub fn new_state(&self, precision: KvPrecision) -> TemporalState {
        TemporalState {
            caches: self
                .layers
                .iter()
                .map(|l| {
                    let attention = l.attention();
                    let (width, head_dim) = (attention.kv_dim(), attention.head_dim());
                    KvCache::with_precision(self.context, width, head_dim, precision)
                })
                .collect(),
            position: 0,
            condition: None,
            cross: None,
            transformer_out: vec![0.0; self.dim()],
            text_logits: vec![0.0; self.text_linear.out_dim()],
        }
    }

    /// Reads text input token `from` with the embedding row of `to` (Kyutai's loader does this
    /// for Hibiki: an EOS sampled before the end of the input is read back as PAD).
    pub fn set_text_alias(&mut self, alias: Option<(u32, u32)>) {
        self.text_alias = alias;
    }

    pub fn dim(&self) -> usize {
        self.text_emb.dim()
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    pub fn layers(&self) -> &[TransformerLayer] {
        &self.layers
    }

    /// Bytes of the embedding tables.
    pub fn embedding_bytes(&self) -> usize {
        self.text_emb.weight_bytes()
            + self.text_demux.as_ref().map_or(0, Demux::weight_bytes)
            + self
                .audio_embs
                .iter()
                .map(Embedding::weight_bytes)
                .sum::<usize>()
    }

    /// Bytes of out_norm and the text head.
    pub fn text_head_bytes(&self) -> usize {
        self.text_linear.weight_bytes() + self.out_norm.dim() * 4
    }

    /// One step of `rows.len()` rows: row `i` takes the tokens `tokens[i * (1 + n_q)..]`
    /// (`[text, audio_0 .. audio_{n_q-1}]`, already range-checked), at its own position, over
    /// its own caches; its outputs land in its state.
    ///
    /// # Panics
    /// If `tokens` does not hold `1 + n_q` tokens per row (caller bug).
    pub fn step_rows(
        &self,
        rows: &mut [&mut TemporalState],
        tokens: &[u32],
        scratch: &mut TemporalScratch,
    ) {
        let m = rows.len();
        let (dim, per_row) = (self.dim(), 1 + self.audio_embs.len());
        assert_eq!(tokens.len(), m * per_row, "temporal step: tokens per row");
        if m == 0 {
            return;
        }
        let st = scratch;
        st.residual.resize(m * dim, 0.0);
        st.row.resize(dim, 0.0);
        if let Some(demux) = &self.text_demux {
            st.text_tokens.clear();
            st.text_tokens
                .extend(tokens.chunks_exact(per_row).map(|t| t[0]));
            st.text_rows.resize(m * dim, 0.0);
            demux.embed_rows(
                &self.text_emb,
                &st.text_tokens,
                &mut st.demux,
                &mut st.text_rows,
            );
        }
        for (i, ((x, row_tokens), row)) in st
            .residual
            .chunks_exact_mut(dim)
            .zip(tokens.chunks_exact(per_row))
            .zip(rows.iter())
            .enumerate()
        {
            // Sum order of the reference: audio embeddings first, then the text embedding, then
            // the condition (`LMModel.forward_text`).
            x.fill(0.0);
            for (emb, &t) in self.audio_embs.iter().zip(&row_tokens[1..]) {
                emb.add_into(t as usize, x, &mut st.row);
            }
            if self.text_demux.is_some() {
                let text = &st.text_rows[i * dim..(i + 1) * dim];
                x.iter_mut().zip(text).for_each(|(a, b)| *a += b);
            } else {
                let text = match self.text_alias {
                    Some((from, to)) if row_tokens[0] == from => to,
                    _ => row_tokens[0],
                };
                self.text_emb.add_into(text as usize, x, &mut st.row);
            }
            if let Some(c) = &row.condition {
                for (a, v) in x.iter_mut().zip(c) {
                    *a += v;
                }
            }
        }
        let rotations = match &self.rope {
            Some(rope) => {
                st.rotations.resize_with(m, RopeRotation::default);
                for (rot, row) in st.rotations.iter_mut().zip(rows.iter()) {
                    rope.rotation_into(row.position, rot);
                }
                Some(&st.rotations[..m])
            }
            None => None,
        };
        // The rows' cross-attention sources (shared, so held apart from the rows' caches).
        let sources: Vec<Arc<Vec<CrossKeysValues>>> =
            if self.layers.iter().any(|l| l.cross().is_some()) {
                rows.iter()
                    .map(|r| r.cross.clone().expect("a cross-attention row has a source"))
                    .collect()
            } else {
                Vec::new()
            };
        for (i, layer) in self.layers.iter().enumerate() {
            // `moshi-rs bench` times this span to extrapolate `--layers N` runs to full depth.
            let _span = tracing::trace_span!("lm_temporal_layer", layer = i).entered();
            let cross: Vec<&CrossKeysValues> = match layer.cross() {
                Some(_) => sources.iter().map(|s| &s[i]).collect(),
                None => Vec::new(),
            };
            let mut caches: Vec<&mut KvCache> = rows.iter_mut().map(|r| &mut r.caches[i]).collect();
            layer.step_rows_cross(
                &mut st.residual,
                m,
                rotations,
                &mut caches,
                &cross,
                &mut st.layer,
            );
        }
        let _span = tracing::trace_span!("lm_text_head").entered();
        let card = self.text_linear.out_dim();
        st.normed.resize(m * dim, 0.0);
        st.logits.resize(m * card, 0.0);
        self.out_norm.forward(&st.residual, &mut st.normed);
        self.text_linear.forward(&st.normed, m, &mut st.logits);
        for ((row, out), logits) in rows
            .iter_mut()
            .zip(st.normed.chunks_exact(dim))
            .zip(st.logits.chunks_exact(card))
        {
            row.transformer_out.copy_from_slice(out);
            row.text_logits.copy_from_slice(logits);
            row.position += 1;
        }
    }
}
