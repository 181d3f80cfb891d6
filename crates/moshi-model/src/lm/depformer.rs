//! The depformer (depth transformer): per frame, `dep_q` sequential sub-steps, one token
//! position each, over a cache that is fresh every frame. Sub-step k has its own input
//! projection, token embedding, layer weights and output head; norms are shared in the
//! checkpoint (copied per sub-step by the loader).
//!
//! The weights ([`Depformer`]) are apart from the per-frame state of a row ([`DepformerState`]);
//! a sub-step runs `m` rows together ([`Depformer::step_rows`]), each row the bits it gets alone.

use super::demux::{Demux, DemuxScratch};
use super::embedding::Embedding;
use super::transformer::{LayerScratch, TransformerLayer};
use crate::nn::norm::LayerNorm;
use crate::nn::{KvCache, Linear, Rope, RopeRotation};

/// Weights of one depformer sub-step.
#[derive(Clone, Debug)]
pub struct DepformerSlice {
    pub linear_in: Linear,
    /// k = 0: text embedding (`text_card + 1` rows); k >= 1: embedding of audio codebook k - 1.
    /// Its width is the low rank when `emb_low_rank` is set.
    pub emb: Embedding,
    /// A low-rank embedding's projection to the depformer's width (`[depformer dim, rank]`,
    /// Kyutai's `ScaledEmbedding(low_rank=..)`).
    pub emb_low_rank: Option<Linear>,
    /// k = 0 of a model whose text carries two muxed streams (the TTS): the table read through
    /// these projections instead (its low-rank projection unused, as Kyutai's demuxed
    /// `ScaledEmbedding`).
    pub emb_demux: Option<Demux>,
    pub layers: Vec<TransformerLayer>,
    /// The norm on the output before `linear_out` (`depformer_norm`, Hibiki-Zero's LayerNorm).
    pub out_norm: Option<LayerNorm>,
    pub linear_out: Linear,
}

impl DepformerSlice {
    /// Bytes of weights read by one sub-step (the embedding table excluded: one row is read).
    pub fn weight_bytes_read(&self) -> usize {
        self.linear_in.weight_bytes()
            + self.emb_low_rank.as_ref().map_or(0, Linear::weight_bytes)
            + self.emb_demux.as_ref().map_or(0, Demux::weight_bytes)
            + self
                .layers
                .iter()
                .map(TransformerLayer::weight_bytes)
                .sum::<usize>()
            + self.out_norm.as_ref().map_or(0, LayerNorm::weight_bytes)
            + self.linear_out.weight_bytes()
    }
}

/// Per-frame state of the depformer for one row (caches, last logits).
#[derive(Clone, Debug)]
pub struct DepformerState {
    caches: Vec<KvCache>,
    logits: Vec<f32>,
    /// Sub-steps run since the last reset.
    substeps_done: usize,
}

impl DepformerState {
    /// Starts a new frame (empties the caches).
    pub fn reset(&mut self) {
        for c in &mut self.caches {
            c.reset();
        }
        self.substeps_done = 0;
    }

    /// Logits of the last sub-step (`[card]`).
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// Sub-steps run in this frame (since the last reset).
    pub fn substeps_done(&self) -> usize {
        self.substeps_done
    }
}

/// Buffers of a sub-step over `m` rows, reused across calls.
#[derive(Clone, Debug, Default)]
pub struct DepformerScratch {
    /// `[m, depformer dim]`.
    x: Vec<f32>,
    row: Vec<f32>,
    /// A low-rank embedding's rows `[m, rank]` and their projection `[m, depformer dim]`.
    low_rank_rows: Vec<f32>,
    low_rank_out: Vec<f32>,
    demux: DemuxScratch,
    rotations: Vec<RopeRotation>,
    layer: LayerScratch,
    /// `[m, depformer dim]`: the output after `out_norm`.
    normed: Vec<f32>,
    /// `[m, card]`.
    logits: Vec<f32>,
}

/// The weights of the depformer.
#[derive(Clone, Debug)]
pub struct Depformer {
    slices: Vec<DepformerSlice>,
    rope: Option<Rope>,
}

impl Depformer {
    pub fn new(slices: Vec<DepformerSlice>, rope: Option<Rope>) -> Self {
        Self { slices, rope }
    }

    /// A fresh per-frame state for a row.
    pub fn new_state(&self) -> DepformerState {
        let (num_layers, width, card) = self
            .slices
            .first()
            .map(|s| {
                (
                    s.layers.len(),
                    s.layers.first().map_or(0, |l| l.attention().kv_dim()),
                    s.linear_out.out_dim(),
                )
            })
            .unwrap_or((0, 0, 0));
        DepformerState {
            caches: (0..num_layers)
                .map(|_| KvCache::new(self.slices.len().max(1), width))
                .collect(),
            logits: vec![0.0; card],
            substeps_done: 0,
        }
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

    /// Sub-step `k` of the current frame for `rows.len()` rows: row `i`'s input is
    /// `linear_in[k](transformer_outs[i]) + emb[k](prev_tokens[i])`, its logits over the codes of
    /// codebook k land in its state. Sub-steps must be run in order 0, 1, .. after
    /// [`DepformerState::reset`]; tokens are range-checked by the caller.
    ///
    /// # Panics
    /// If the slices disagree on the number of rows (caller bug).
    pub fn step_rows(
        &self,
        k: usize,
        rows: &mut [&mut DepformerState],
        prev_tokens: &[u32],
        transformer_outs: &[f32],
        scratch: &mut DepformerScratch,
    ) {
        let m = rows.len();
        assert_eq!(prev_tokens.len(), m, "depformer step: one token per row");
        if m == 0 {
            return;
        }
        let slice = &self.slices[k];
        let st = scratch;
        let dim = slice.linear_in.out_dim();
        st.x.resize(m * dim, 0.0);
        st.row.resize(dim, 0.0);
        slice.linear_in.forward(transformer_outs, m, &mut st.x);
        match (&slice.emb_low_rank, &slice.emb_demux) {
            (_, Some(demux)) => {
                st.low_rank_out.resize(m * dim, 0.0);
                demux.embed_rows(&slice.emb, prev_tokens, &mut st.demux, &mut st.low_rank_out);
                for (x, e) in st.x.iter_mut().zip(&st.low_rank_out) {
                    *x += e;
                }
            }
            (None, None) => {
                for (x, &t) in st.x.chunks_exact_mut(dim).zip(prev_tokens) {
                    slice.emb.add_into(t as usize, x, &mut st.row);
                }
            }
            (Some(projection), None) => {
                let rank = slice.emb.dim();
                st.low_rank_rows.resize(m * rank, 0.0);
                for (row, &t) in st.low_rank_rows.chunks_exact_mut(rank).zip(prev_tokens) {
                    slice.emb.lookup_into(t as usize, row);
                }
                st.low_rank_out.resize(m * dim, 0.0);
                projection.forward(&st.low_rank_rows, m, &mut st.low_rank_out);
                for (x, e) in st.x.iter_mut().zip(&st.low_rank_out) {
                    *x += e;
                }
            }
        }
        let rotations = match &self.rope {
            Some(rope) => {
                st.rotations.resize_with(m, RopeRotation::default);
                for rot in st.rotations.iter_mut() {
                    rope.rotation_into(k, rot);
                }
                Some(&st.rotations[..m])
            }
            None => None,
        };
        for (i, layer) in slice.layers.iter().enumerate() {
            let mut caches: Vec<&mut KvCache> = rows.iter_mut().map(|r| &mut r.caches[i]).collect();
            layer.step_rows(&mut st.x, m, rotations, &mut caches, &mut st.layer);
        }
        let out = match &slice.out_norm {
            Some(norm) => {
                st.normed.resize(m * dim, 0.0);
                norm.forward(&st.x, &mut st.normed);
                &st.normed
            }
            None => &st.x,
        };
        let card = slice.linear_out.out_dim();
        st.logits.resize(m * card, 0.0);
        slice.linear_out.forward(out, m, &mut st.logits);
        for (row, logits) in rows.iter_mut().zip(st.logits.chunks_exact(card)) {
            row.logits.copy_from_slice(logits);
            row.substeps_done += 1;
        }
    }
}
