//! The temporal (Helium) transformer: embeds the 1 + n_q tokens of a step, runs the layers over
//! a sliding window of `context` positions, applies `out_norm` and the text head.

use super::embedding::Embedding;
use super::kv_cache::{KvCache, KvPrecision};
use super::rope::{Rope, RopeRotation};
use super::transformer::{LayerScratch, RmsNorm, TransformerLayer};
use crate::ops::Linear;

/// Weights and streaming state of the temporal transformer.
#[derive(Clone, Debug)]
pub struct TemporalTransformer {
    text_emb: Embedding,
    audio_embs: Vec<Embedding>,
    layers: Vec<TransformerLayer>,
    out_norm: RmsNorm,
    text_linear: Linear,
    rope: Option<Rope>,
    caches: Vec<KvCache>,
    rotation: RopeRotation,
    scratch: LayerScratch,
    residual: Vec<f32>,
    row: Vec<f32>,
    transformer_out: Vec<f32>,
    text_logits: Vec<f32>,
    position: usize,
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
            caches,
            rotation: RopeRotation::default(),
            scratch: LayerScratch::default(),
            residual: vec![0.0; dim],
            row: vec![0.0; dim],
            transformer_out: vec![0.0; dim],
            text_logits: vec![0.0; text_card],
            position: 0,
        }
    }

    pub fn dim(&self) -> usize {
        self.residual.len()
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    pub fn layers(&self) -> &[TransformerLayer] {
        &self.layers
    }

    /// Positions processed since the last reset.
    pub fn position(&self) -> usize {
        self.position
    }

    pub fn caches(&self) -> &[KvCache] {
        &self.caches
    }

    pub fn transformer_out(&self) -> &[f32] {
        &self.transformer_out
    }

    pub fn text_logits(&self) -> &[f32] {
        &self.text_logits
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
        // Sum order of the reference: audio embeddings first, then the text embedding.
        let x = &mut self.residual;
        x.fill(0.0);
        for (emb, &t) in self.audio_embs.iter().zip(&tokens[1..]) {
            emb.add_into(t as usize, x, &mut self.row);
        }
        self.text_emb.add_into(tokens[0] as usize, x, &mut self.row);

        let rotation = match &self.rope {
            Some(rope) => {
                rope.rotation_into(self.position, &mut self.rotation);
                Some(&self.rotation)
            }
            None => None,
        };
        for (i, (layer, cache)) in self.layers.iter().zip(self.caches.iter_mut()).enumerate() {
            // `moshi-rs bench` times this span to extrapolate `--layers N` runs to full depth.
            let _span = tracing::trace_span!("lm_temporal_layer", layer = i).entered();
            layer.step(x, rotation, cache, &mut self.scratch);
        }
        let _span = tracing::trace_span!("lm_text_head").entered();
        self.out_norm.forward(x, &mut self.transformer_out);
        self.text_linear
            .matvec_into(&self.transformer_out, &mut self.text_logits);
        self.position += 1;
    }

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

    /// Stores keys and values as `precision` from now on. Changing it empties the caches and
    /// restarts the positions (a new conversation); setting the current one changes nothing.
    pub fn set_kv_precision(&mut self, precision: KvPrecision) {
        if precision == self.kv_precision() {
            return;
        }
        for c in &mut self.caches {
            *c = KvCache::with_precision(c.capacity(), c.width(), precision);
        }
        self.position = 0;
    }

    /// Pushes `positions` random keys and values (uniform in [-0.5, 0.5), from `seed`) into every
    /// layer's cache and advances the position as if that many steps had run. For benchmarks:
    /// attention over a filled window without computing the steps that would fill it. The caches
    /// keep at most `context` positions, as always. No input leads to this state.
    pub fn fill_caches_with_noise(&mut self, positions: usize, seed: u64) {
        for (i, cache) in self.caches.iter_mut().enumerate() {
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
        self.position += positions;
    }
}
