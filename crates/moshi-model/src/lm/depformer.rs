//! The depformer (depth transformer): per frame, `dep_q` sequential sub-steps, one token
//! position each, over a cache that is fresh every frame. Sub-step k has its own input
//! projection, token embedding, layer weights and output head; norms are shared in the
//! checkpoint (copied per sub-step by the loader).

use super::embedding::Embedding;
use super::transformer::{LayerScratch, TransformerLayer};
use crate::nn::{KvCache, Linear, Rope, RopeRotation};

/// Weights of one depformer sub-step.
#[derive(Clone, Debug)]
pub struct DepformerSlice {
    pub linear_in: Linear,
    /// k = 0: text embedding (`text_card + 1` rows); k >= 1: embedding of audio codebook k - 1.
    pub emb: Embedding,
    pub layers: Vec<TransformerLayer>,
    pub linear_out: Linear,
}

impl DepformerSlice {
    /// Bytes of weights read by one sub-step (the embedding table excluded: one row is read).
    pub fn weight_bytes_read(&self) -> usize {
        self.linear_in.weight_bytes()
            + self
                .layers
                .iter()
                .map(TransformerLayer::weight_bytes)
                .sum::<usize>()
            + self.linear_out.weight_bytes()
    }
}

/// Per-frame state of the depformer for one batch row (caches, buffers, last logits).
#[derive(Clone, Debug)]
pub struct DepformerState {
    caches: Vec<KvCache>,
    rotation: RopeRotation,
    scratch: LayerScratch,
    x: Vec<f32>,
    row: Vec<f32>,
    logits: Vec<f32>,
    /// Sub-steps run since the last reset.
    substeps_done: usize,
}

/// Weights and per-frame state of the depformer.
#[derive(Clone, Debug)]
pub struct Depformer {
    slices: Vec<DepformerSlice>,
    rope: Option<Rope>,
    state: DepformerState,
}

impl Depformer {
    pub fn new(slices: Vec<DepformerSlice>, rope: Option<Rope>) -> Self {
        let steps = slices.len();
        let (num_layers, dim, width, card) = slices
            .first()
            .map(|s| {
                (
                    s.layers.len(),
                    s.linear_in.out_dim(),
                    s.layers.first().map_or(0, |l| l.attention().dim()),
                    s.linear_out.out_dim(),
                )
            })
            .unwrap_or((0, 0, 0, 0));
        Self {
            slices,
            rope,
            state: DepformerState {
                caches: (0..num_layers)
                    .map(|_| KvCache::new(steps.max(1), width))
                    .collect(),
                rotation: RopeRotation::default(),
                scratch: LayerScratch::default(),
                x: vec![0.0; dim],
                row: vec![0.0; dim],
                logits: vec![0.0; card],
                substeps_done: 0,
            },
        }
    }

    /// A fresh state for another row over the same weights (empty caches).
    pub fn new_state(&self) -> DepformerState {
        let mut state = self.state.clone();
        for c in &mut state.caches {
            c.reset();
        }
        state.substeps_done = 0;
        state
    }

    /// Exchanges the current row's state with `other` (buffers are moved, not copied).
    pub fn swap_state(&mut self, other: &mut DepformerState) {
        std::mem::swap(&mut self.state, other);
    }

    pub fn num_steps(&self) -> usize {
        self.slices.len()
    }

    pub fn slices(&self) -> &[DepformerSlice] {
        &self.slices
    }

    /// Bytes of weights read by one full pass (all sub-steps).
    pub fn weight_bytes_read_per_pass(&self) -> usize {
        self.slices
            .iter()
            .map(DepformerSlice::weight_bytes_read)
            .sum()
    }

    /// Bytes of the per-sub-step embedding tables.
    pub fn embedding_bytes(&self) -> usize {
        self.slices.iter().map(|s| s.emb.weight_bytes()).sum()
    }

    /// Starts a new frame (empties the cache).
    pub fn reset(&mut self) {
        for c in &mut self.state.caches {
            c.reset();
        }
        self.state.substeps_done = 0;
    }

    /// Sub-step `k` of the current frame: input `linear_in[k](transformer_out) + emb[k](prev_token)`,
    /// returns the logits over the audio codes of codebook k. Sub-steps must be run in order
    /// 0, 1, .. after [`Depformer::reset`]; `prev_token` is range-checked by the caller.
    pub fn step(&mut self, k: usize, prev_token: u32, transformer_out: &[f32]) -> &[f32] {
        let slice = &self.slices[k];
        let st = &mut self.state;
        slice.linear_in.forward(transformer_out, 1, &mut st.x);
        slice
            .emb
            .add_into(prev_token as usize, &mut st.x, &mut st.row);
        let rotation = match &self.rope {
            Some(rope) => {
                rope.rotation_into(k, &mut st.rotation);
                Some(&st.rotation)
            }
            None => None,
        };
        for (layer, cache) in slice.layers.iter().zip(st.caches.iter_mut()) {
            layer.step_rows(
                &mut st.x,
                1,
                rotation.map(std::slice::from_ref),
                &mut [cache],
                &mut st.scratch,
            );
        }
        slice.linear_out.forward(&st.x, 1, &mut st.logits);
        st.substeps_done += 1;
        &st.logits
    }

    /// Logits of the last sub-step (`[card]`).
    pub fn logits(&self) -> &[f32] {
        &self.state.logits
    }

    /// Sub-steps run in this frame (since the last reset).
    pub fn substeps_done(&self) -> usize {
        self.state.substeps_done
    }
}
