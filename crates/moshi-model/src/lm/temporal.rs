//! The temporal (Helium) transformer: embeds the 1 + n_q tokens of a step, runs the layers over
//! a sliding window of `context` positions, applies `out_norm` and the text head.

use super::embedding::Embedding;
use super::transformer::{LayerScratch, RmsNorm, TransformerLayer};
use crate::nn::{KvCache, KvPrecision, Linear, Rope, RopeRotation};

/// Streaming state of the temporal transformer for one batch row: KV caches, position, buffers,
/// the outputs of the last step and the row's condition (classifier-free guidance runs two rows
/// over the same weights; see [`TemporalTransformer::swap_state`]).
#[derive(Clone, Debug)]
pub struct TemporalState {
    caches: Vec<KvCache>,
    rotation: RopeRotation,
    scratch: LayerScratch,
    residual: Vec<f32>,
    row: Vec<f32>,
    transformer_out: Vec<f32>,
    text_logits: Vec<f32>,
    position: usize,
    /// Added to the input embedding at every step (the fused conditioners' sum, `[dim]`).
    condition: Option<Vec<f32>>,
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
            .is_none_or(|c| c.len() == self.residual.len()));
        self.condition = condition;
    }
}

/// Weights and streaming state of the temporal transformer.
#[derive(Clone, Debug)]
pub struct TemporalTransformer {
    text_emb: Embedding,
    audio_embs: Vec<Embedding>,
    layers: Vec<TransformerLayer>,
    out_norm: RmsNorm,
    text_linear: Linear,
    rope: Option<Rope>,
    /// Text input token read with another token's embedding row (Hibiki: EOS reads as PAD).
    text_alias: Option<(u32, u32)>,
    state: TemporalState,
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
        let dim = text_emb.dim();
        let caches = layers
            .iter()
            .map(|l| KvCache::new(context.max(1), l.attention().dim()))
            .collect();
        let text_card = text_linear.out_dim();
        Self {
            text_emb,
            audio_embs,
            layers,
            out_norm,
            text_linear,
            rope,
            text_alias: None,
            state: TemporalState {
                caches,
                rotation: RopeRotation::default(),
                scratch: LayerScratch::default(),
                residual: vec![0.0; dim],
                row: vec![0.0; dim],
                transformer_out: vec![0.0; dim],
                text_logits: vec![0.0; text_card],
                position: 0,
                condition: None,
            },
        }
    }

    /// A fresh state for another row over the same weights: empty caches of the same window and
    /// precision, position 0, no condition.
    pub fn new_state(&self) -> TemporalState {
        let mut state = self.state.clone();
        for c in &mut state.caches {
            *c = KvCache::with_precision(c.capacity(), c.width(), c.precision());
        }
        state.position = 0;
        state.condition = None;
        state
    }

    /// Exchanges the current row's state with `other` (cheap: buffers are moved, not copied).
    pub fn swap_state(&mut self, other: &mut TemporalState) {
        std::mem::swap(&mut self.state, other);
    }

    /// Sets the condition added to the input embedding at every step (`[dim]`), or none.
    pub fn set_condition(&mut self, condition: Option<Vec<f32>>) {
        self.state.set_condition(condition);
    }

    /// The current row's condition.
    pub fn condition(&self) -> Option<&[f32]> {
        self.state.condition()
    }

    /// Reads text input token `from` with the embedding row of `to` (Kyutai's loader does this
    /// for Hibiki: an EOS sampled before the end of the input is read back as PAD).
    pub fn set_text_alias(&mut self, alias: Option<(u32, u32)>) {
        self.text_alias = alias;
    }

    pub fn dim(&self) -> usize {
        self.state.residual.len()
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    pub fn layers(&self) -> &[TransformerLayer] {
        &self.layers
    }

    /// Positions processed since the last reset.
    pub fn position(&self) -> usize {
        self.state.position
    }

    pub fn caches(&self) -> &[KvCache] {
        &self.state.caches
    }

    pub fn transformer_out(&self) -> &[f32] {
        &self.state.transformer_out
    }

    pub fn text_logits(&self) -> &[f32] {
        &self.state.text_logits
    }

    /// Bytes of the embedding tables.
    pub fn embedding_bytes(&self) -> usize {
        self.text_emb.weight_bytes()
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

    /// One step: `tokens` = `[text, audio_0 .. audio_{n_q-1}]`, already range-checked.
    pub fn step(&mut self, tokens: &[u32]) {
        let st = &mut self.state;
        // Sum order of the reference: audio embeddings first, then the text embedding, then the
        // condition (`LMModel.forward_text`).
        let x = &mut st.residual;
        x.fill(0.0);
        for (emb, &t) in self.audio_embs.iter().zip(&tokens[1..]) {
            emb.add_into(t as usize, x, &mut st.row);
        }
        let text = match self.text_alias {
            Some((from, to)) if tokens[0] == from => to,
            _ => tokens[0],
        };
        self.text_emb.add_into(text as usize, x, &mut st.row);
        if let Some(c) = &st.condition {
            for (a, v) in x.iter_mut().zip(c) {
                *a += v;
            }
        }

        let rotation = match &self.rope {
            Some(rope) => {
                rope.rotation_into(st.position, &mut st.rotation);
                Some(&st.rotation)
            }
            None => None,
        };
        for (i, (layer, cache)) in self.layers.iter().zip(st.caches.iter_mut()).enumerate() {
            // `moshi-rs bench` times this span to extrapolate `--layers N` runs to full depth.
            let _span = tracing::trace_span!("lm_temporal_layer", layer = i).entered();
            layer.step_rows(
                x,
                1,
                rotation.map(std::slice::from_ref),
                &mut [cache],
                &mut st.scratch,
            );
        }
        let _span = tracing::trace_span!("lm_text_head").entered();
        self.out_norm.forward(x, &mut st.transformer_out);
        self.text_linear
            .forward(&st.transformer_out, 1, &mut st.text_logits);
        st.position += 1;
    }

    pub fn reset(&mut self) {
        for c in &mut self.state.caches {
            c.reset();
        }
        self.state.position = 0;
    }

    /// Element type of the KV caches (f32 unless set).
    pub fn kv_precision(&self) -> KvPrecision {
        self.state
            .caches
            .first()
            .map_or(KvPrecision::F32, KvCache::precision)
    }

    /// Stores keys and values as `precision` from now on. Changing it empties the caches and
    /// restarts the positions (a new conversation); setting the current one changes nothing.
    pub fn set_kv_precision(&mut self, precision: KvPrecision) {
        if precision == self.kv_precision() {
            return;
        }
        for c in &mut self.state.caches {
            *c = KvCache::with_precision(c.capacity(), c.width(), precision);
        }
        self.state.position = 0;
    }

    /// Pushes `positions` random keys and values (uniform in [-0.5, 0.5), from `seed`) into every
    /// layer's cache and advances the position as if that many steps had run. For benchmarks:
    /// attention over a filled window without computing the steps that would fill it. The caches
    /// keep at most `context` positions, as always. No input leads to this state.
    pub fn fill_caches_with_noise(&mut self, positions: usize, seed: u64) {
        for (i, cache) in self.state.caches.iter_mut().enumerate() {
            let mut rng =
                crate::rng::Rng::new(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let width = self.layers[i].attention().dim();
            let (mut key, mut value) = (vec![0f32; width], vec![0f32; width]);
            for _ in 0..positions.min(cache.capacity()) {
                key.iter_mut().for_each(|v| *v = rng.next_f32() - 0.5);
                value.iter_mut().for_each(|v| *v = rng.next_f32() - 0.5);
                cache.push(&key, &value);
            }
        }
        self.state.position += positions;
    }
}
