//! The Moshi language model: temporal transformer + depformer, built from canonically named
//! weights (see `moshi_loader::lm_weights`), stepped one frame at a time.
//!
//! Weights apart from state: [`LmWeights`] is the immutable model, shared (`Arc`) by every
//! session; [`LmRowState`] is one row's streaming state (temporal KV caches and position, the
//! depformer's frame, the row's condition). [`LmWeights::forward_text_rows`] and
//! [`LmWeights::depformer_step_rows`] step any number of rows together, every linear layer one
//! product over all of them (the weights read once per step, not once per row), each row
//! attending over its own caches at its own position, with the bits it gets alone.
//! [`LmModel`] is one row over shared weights, the single-session API.

pub mod conditioner;
pub mod depformer;
pub mod embedding;
pub mod random;
pub mod temporal;
pub mod transformer;

use std::path::Path;
use std::sync::Arc;

use moshi_loader::{LmConfig, PositionalEmbedding, WeightMap};

use crate::nn::{Attention, KvPrecision, Linear, Rope};
use crate::{ModelError, Result};
use conditioner::ConditionProvider;
use depformer::{Depformer, DepformerScratch, DepformerSlice, DepformerState};
use embedding::Embedding;
pub use random::RandomWeightKind;
use temporal::{TemporalScratch, TemporalState, TemporalTransformer};
use transformer::{Gating, RmsNorm, TransformerLayer};

/// Bytes of weights by part (for memory and bandwidth estimates). Everything but
/// `embedding_tables` is read in full once per step; of the tables only one row each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LmWeightBytes {
    /// All temporal transformer layers (norms included).
    pub temporal_layers: usize,
    pub temporal_num_layers: usize,
    /// out_norm and the text head.
    pub text_head: usize,
    /// All depformer sub-steps: input projections, layers, output heads (no embedding tables).
    pub depformer: usize,
    /// Every embedding table (temporal and depformer).
    pub embedding_tables: usize,
}

impl LmWeightBytes {
    /// Bytes read by one full step (temporal step + depformer pass).
    pub fn read_per_step(&self) -> usize {
        self.temporal_layers + self.text_head + self.depformer
    }
}

/// The LM's weights (temporal transformer, depformer, conditioners) and config: immutable once
/// built, shared by every row that steps over them.
#[derive(Clone, Debug)]
pub struct LmWeights {
    cfg: LmConfig,
    temporal: TemporalTransformer,
    depformer: Depformer,
    conditions: ConditionProvider,
}

/// The streaming state of one row (a session, or the negative row of a session's guidance):
/// temporal caches and position, the depformer's frame, the row's condition and the outputs of
/// its last step.
#[derive(Clone, Debug)]
pub struct LmRowState {
    temporal: TemporalState,
    depformer: DepformerState,
}

impl LmRowState {
    /// The fused condition this row adds to its input, if any.
    pub fn condition(&self) -> Option<&[f32]> {
        self.temporal.condition()
    }

    /// The temporal transformer's state (caches, position, last outputs).
    pub fn temporal(&self) -> &TemporalState {
        &self.temporal
    }

    /// Output of the temporal transformer after `out_norm` for the last step (`[dim]`).
    pub fn transformer_out(&self) -> &[f32] {
        self.temporal.transformer_out()
    }

    /// Text logits of the last step (`[text_card]`).
    pub fn text_logits(&self) -> &[f32] {
        self.temporal.text_logits()
    }

    /// Logits of the last depformer sub-step (`[card]`).
    pub fn depformer_logits(&self) -> &[f32] {
        self.depformer.logits()
    }

    /// Temporal steps run since the last reset.
    pub fn position(&self) -> usize {
        self.temporal.position()
    }

    /// Element type of the temporal KV caches.
    pub fn kv_precision(&self) -> KvPrecision {
        self.temporal.kv_precision()
    }

    /// [`TemporalState::set_kv_precision`] (the depformer's 8-position caches stay f32).
    pub fn set_kv_precision(&mut self, precision: KvPrecision) {
        self.temporal.set_kv_precision(precision);
    }

    /// Starts the depformer pass of the current step.
    pub fn depformer_reset(&mut self) {
        self.depformer.reset();
    }

    /// Forgets the whole conversation (position 0, empty caches; the condition stays).
    pub fn reset(&mut self) {
        self.temporal.reset();
        self.depformer.reset();
    }

    /// [`TemporalState::fill_caches_with_noise`]: for benchmarks of long conversations.
    pub fn fill_temporal_caches_with_noise(&mut self, positions: usize, seed: u64) {
        self.temporal.fill_caches_with_noise(positions, seed);
    }

    /// Bytes currently allocated by the temporal KV caches.
    pub fn kv_cache_bytes(&self) -> usize {
        self.temporal
            .caches()
            .iter()
            .map(|c| c.allocated_bytes())
            .sum()
    }
}

/// Buffers of a step over several rows, reused across steps: one per caller that steps rows
/// (a session, a batch scheduler).
#[derive(Clone, Debug, Default)]
pub struct LmScratch {
    temporal: TemporalScratch,
    depformer: DepformerScratch,
    /// `[m, dim]`: the rows' temporal outputs, the depformer's input.
    transformer_outs: Vec<f32>,
}

/// One row over shared [`LmWeights`]: the single-session API (a clone is another session over
/// the same weights).
#[derive(Clone, Debug)]
pub struct LmModel {
    weights: Arc<LmWeights>,
    row: LmRowState,
    /// Buffers of this row's steps (a generator lends them to its batch of one).
    pub(crate) scratch: LmScratch,
}

/// Kyutai's loader reads a Hibiki model's EOS text input (2) with PAD's embedding row (3): an
/// EOS sampled before the end of the input then acts as a pause (`loaders.get_moshi`).
const HIBIKI_EOS_READS_AS_PAD: (u32, u32) = (2, 3);

/// Checks the config (a no-op for one read by `LmConfig::from_file`, which validated it; a config
/// built or changed in code is checked here, before anything is allocated from it).
fn check_supported(cfg: &LmConfig) -> Result<()> {
    cfg.validate(Path::new("<LM config>"))?;
    Ok(())
}

struct Take<'a> {
    map: &'a mut WeightMap,
}

impl Take<'_> {
    fn linear(&mut self, name: &str, rows: usize, cols: usize) -> Result<Linear> {
        Ok(Linear::from_weight(self.map.take(name, &[rows, cols])?))
    }
    fn embedding(&mut self, name: &str, rows: usize, cols: usize) -> Result<Embedding> {
        Ok(Embedding::from_weight(self.map.take(name, &[rows, cols])?))
    }
    fn norm(&mut self, name: &str, dim: usize, eps: f32) -> Result<RmsNorm> {
        Ok(RmsNorm::new(self.map.take_f32(name, &[dim])?, eps))
    }
    #[allow(clippy::too_many_arguments)]
    fn layer(
        &mut self,
        prefix: &str,
        dim: usize,
        hidden: usize,
        heads: usize,
        eps: f32,
    ) -> Result<TransformerLayer> {
        let norm1 = self.norm(&format!("{prefix}.norm1"), dim, eps)?;
        let norm2 = self.norm(&format!("{prefix}.norm2"), dim, eps)?;
        let in_proj = self.linear(&format!("{prefix}.self_attn.in_proj"), 3 * dim, dim)?;
        let out_proj = self.linear(&format!("{prefix}.self_attn.out_proj"), dim, dim)?;
        let linear_in = self.linear(&format!("{prefix}.gating.linear_in"), 2 * hidden, dim)?;
        let linear_out = self.linear(&format!("{prefix}.gating.linear_out"), dim, hidden)?;
        Ok(TransformerLayer::new(
            norm1,
            Attention::new(in_proj, out_proj, heads),
            norm2,
            Gating::new(linear_in, linear_out),
        ))
    }
}

impl LmWeights {
    /// Builds the model from canonically named weights (every name consumed, every shape
    /// checked against `cfg`; a checkpoint made for another config is an error naming the tensor).
    pub fn load(cfg: &LmConfig, mut weights: WeightMap) -> Result<Self> {
        check_supported(cfg)?;
        let eps = RmsNorm::eps_for(cfg.norm);
        let (dim, ddim) = (cfg.dim, cfg.depformer_dim);
        let (hidden, dhidden) = (cfg.hidden_dim(), cfg.depformer_hidden_dim());
        let mut t = Take { map: &mut weights };

        let text_emb = t.embedding("text_emb", cfg.text_card + 1, dim)?;
        let audio_embs = (0..cfg.n_q)
            .map(|i| t.embedding(&format!("emb.{i}"), cfg.card + 1, dim))
            .collect::<Result<Vec<_>>>()?;
        let text_linear = t.linear("text_linear", cfg.text_card, dim)?;
        let out_norm = t.norm("out_norm", dim, eps)?;
        let layers = (0..cfg.num_layers)
            .map(|l| {
                t.layer(
                    &format!("transformer.layers.{l}"),
                    dim,
                    hidden,
                    cfg.num_heads,
                    eps,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let rope = (cfg.positional_embedding == PositionalEmbedding::Rope)
            .then(|| Rope::new(dim / cfg.num_heads, cfg.max_period));
        let temporal = TemporalTransformer::new(
            text_emb,
            audio_embs,
            layers,
            out_norm,
            text_linear,
            rope,
            cfg.context,
        );

        let mut slices = Vec::with_capacity(cfg.dep_q);
        for k in 0..cfg.dep_q {
            let p = format!("depformer.{k}");
            let emb_rows = if k == 0 {
                cfg.text_card + 1
            } else {
                cfg.card + 1
            };
            slices.push(DepformerSlice {
                linear_in: t.linear(&format!("{p}.linear_in"), ddim, dim)?,
                emb: t.embedding(&format!("{p}.emb"), emb_rows, ddim)?,
                layers: (0..cfg.depformer_num_layers)
                    .map(|l| {
                        t.layer(
                            &format!("{p}.layers.{l}"),
                            ddim,
                            dhidden,
                            cfg.depformer_num_heads,
                            eps,
                        )
                    })
                    .collect::<Result<Vec<_>>>()?,
                linear_out: t.linear(&format!("{p}.linear_out"), cfg.card, ddim)?,
            });
        }
        let drope = (cfg.depformer_pos_emb == PositionalEmbedding::Rope)
            .then(|| Rope::new(ddim / cfg.depformer_num_heads, cfg.depformer_max_period));
        let depformer = Depformer::new(slices, drope);
        let conditions = ConditionProvider::load(cfg, &mut weights)?;

        let left = weights.remaining();
        if !left.is_empty() {
            let shown: Vec<&str> = left.iter().take(5).map(String::as_str).collect();
            return Err(ModelError::UnusedTensors {
                path: weights.source().to_path_buf(),
                count: left.len(),
                config: format!(
                    "num_layers {}, depformer_num_layers {}, n_q {}, dep_q {}",
                    cfg.num_layers, cfg.depformer_num_layers, cfg.n_q, cfg.dep_q
                ),
                shown: format!(
                    "{}{}",
                    shown.join(", "),
                    if left.len() > 5 { ", ..." } else { "" }
                ),
            });
        }
        let mut weights = Self {
            cfg: cfg.clone(),
            temporal,
            depformer,
            conditions,
        };
        if cfg.model_type.as_deref() == Some("hibiki") {
            weights
                .temporal
                .set_text_alias(Some(HIBIKI_EOS_READS_AS_PAD));
        }
        Ok(weights)
    }

    /// Weights of `cfg`'s shapes, deterministic and random (for benchmarks and tests).
    pub fn random(cfg: &LmConfig, seed: u64, kind: RandomWeightKind) -> Result<Self> {
        check_supported(cfg)?;
        Self::load(cfg, random::random_lm_weights(cfg, seed, kind)?)
    }

    pub fn config(&self) -> &LmConfig {
        &self.cfg
    }

    /// The temporal transformer's weights, e.g. to time one layer.
    pub fn temporal(&self) -> &TemporalTransformer {
        &self.temporal
    }

    /// The depformer's weights.
    pub fn depformer(&self) -> &Depformer {
        &self.depformer
    }

    /// The model's conditioners (empty for Moshi).
    pub fn conditions(&self) -> &ConditionProvider {
        &self.conditions
    }

    /// A fresh row: empty caches of `precision`, position 0, conditioned on `values`
    /// (`(conditioner, value)` pairs, e.g. `[("description", "very_good")]`; conditioners not
    /// named take their learnt padding; a model without conditioners accepts only `&[]`).
    pub fn new_row(&self, values: &[(&str, &str)], precision: KvPrecision) -> Result<LmRowState> {
        let mut temporal = self.temporal.new_state(precision);
        temporal.set_condition(self.conditions.fused(values)?);
        Ok(LmRowState {
            temporal,
            depformer: self.depformer.new_state(),
        })
    }

    /// Checks one step's `1 + n_q` input tokens (`[text, audio_0 .. audio_{n_q-1}]`, initial
    /// tokens `text_card` / `card` allowed).
    pub fn check_step_tokens(&self, tokens: &[u32]) -> Result<()> {
        let cfg = &self.cfg;
        if tokens.len() != cfg.n_q + 1 {
            return Err(ModelError::WrongLength {
                what: "LM step: tokens per step (1 + n_q)",
                expected: cfg.n_q + 1,
                got: tokens.len(),
            });
        }
        if tokens[0] as usize > cfg.text_card {
            return Err(ModelError::TokenOutOfRange {
                what: "text token",
                value: tokens[0],
                at: String::new(),
                max: cfg.text_card,
                note: ": text_card, the initial token",
            });
        }
        if let Some((i, &t)) = tokens[1..]
            .iter()
            .enumerate()
            .find(|(_, &t)| t as usize > cfg.card)
        {
            return Err(ModelError::TokenOutOfRange {
                what: "audio token",
                value: t,
                at: format!(" of stream {i}"),
                max: cfg.card,
                note: ": card, the initial token",
            });
        }
        Ok(())
    }

    /// The temporal transformer on `rows.len()` rows, row `i` on its step's `1 + n_q` tokens
    /// `tokens[i * (1 + n_q)..]` (each checked as [`LmWeights::check_step_tokens`]), at its own
    /// position over its own caches: one product per linear layer for all rows. Results in each
    /// row: [`LmRowState::transformer_out`], [`LmRowState::text_logits`]. Nothing runs if a row's
    /// tokens are wrong.
    pub fn forward_text_rows(
        &self,
        rows: &mut [&mut LmRowState],
        tokens: &[u32],
        scratch: &mut LmScratch,
    ) -> Result<()> {
        let per_row = self.cfg.n_q + 1;
        if tokens.len() != rows.len() * per_row {
            return Err(ModelError::WrongLength {
                what: "LM step: tokens of all rows (rows x (1 + n_q))",
                expected: rows.len() * per_row,
                got: tokens.len(),
            });
        }
        for row_tokens in tokens.chunks_exact(per_row) {
            self.check_step_tokens(row_tokens)?;
        }
        self.step_temporal_rows(rows, tokens, scratch);
        Ok(())
    }

    /// [`LmWeights::forward_text_rows`] on tokens the caller has checked.
    pub(crate) fn step_temporal_rows(
        &self,
        rows: &mut [&mut LmRowState],
        tokens: &[u32],
        scratch: &mut LmScratch,
    ) {
        let mut temporal: Vec<&mut TemporalState> =
            rows.iter_mut().map(|r| &mut r.temporal).collect();
        self.temporal
            .step_rows(&mut temporal, tokens, &mut scratch.temporal);
    }

    /// Depformer sub-step `k` (in order 0..dep_q after [`LmRowState::depformer_reset`]) of
    /// `rows.len()` rows on their last `transformer_out`: `prev_tokens[i]` is row `i`'s text token
    /// of this step for k = 0, else its audio token of codebook k - 1. Each row's logits of
    /// codebook k land in [`LmRowState::depformer_logits`]. Nothing runs if a row is out of order
    /// or a token out of range.
    pub fn depformer_step_rows(
        &self,
        k: usize,
        rows: &mut [&mut LmRowState],
        prev_tokens: &[u32],
        scratch: &mut LmScratch,
    ) -> Result<()> {
        let cfg = &self.cfg;
        if prev_tokens.len() != rows.len() {
            return Err(ModelError::WrongLength {
                what: "depformer step: previous tokens (one per row)",
                expected: rows.len(),
                got: prev_tokens.len(),
            });
        }
        let limit = if k == 0 { cfg.text_card } else { cfg.card };
        for (row, &prev) in rows.iter().zip(prev_tokens) {
            let done = row.depformer.substeps_done();
            if k >= cfg.dep_q || done != k {
                return Err(ModelError::DepformerOrder {
                    requested: k,
                    done,
                    dep_q: cfg.dep_q,
                });
            }
            if prev as usize > limit {
                return Err(ModelError::TokenOutOfRange {
                    what: "previous token",
                    value: prev,
                    at: format!(" of depformer sub-step {k}"),
                    max: limit,
                    note: "",
                });
            }
        }
        self.step_depformer_rows(k, rows, prev_tokens, scratch);
        Ok(())
    }

    /// [`LmWeights::depformer_step_rows`] with the order and tokens checked by the caller.
    pub(crate) fn step_depformer_rows(
        &self,
        k: usize,
        rows: &mut [&mut LmRowState],
        prev_tokens: &[u32],
        scratch: &mut LmScratch,
    ) {
        let dim = self.temporal.dim();
        scratch.transformer_outs.resize(rows.len() * dim, 0.0);
        for (out, row) in scratch
            .transformer_outs
            .chunks_exact_mut(dim)
            .zip(rows.iter())
        {
            out.copy_from_slice(row.transformer_out());
        }
        let mut depformer: Vec<&mut DepformerState> =
            rows.iter_mut().map(|r| &mut r.depformer).collect();
        self.depformer.step_rows(
            k,
            &mut depformer,
            prev_tokens,
            &scratch.transformer_outs,
            &mut scratch.depformer,
        );
    }

    /// Bytes of weights read per step, by part.
    pub fn weight_bytes(&self) -> LmWeightBytes {
        LmWeightBytes {
            temporal_layers: self
                .temporal
                .layers()
                .iter()
                .map(TransformerLayer::weight_bytes)
                .sum(),
            temporal_num_layers: self.temporal.num_layers(),
            text_head: self.temporal.text_head_bytes(),
            depformer: self.depformer.weight_bytes_read_per_pass(),
            embedding_tables: self.temporal.embedding_bytes() + self.depformer.embedding_bytes(),
        }
    }
}

impl LmModel {
    /// Builds the model from canonically named weights (see [`LmWeights::load`]): one row, f32
    /// KV caches, conditioned on every conditioner's learnt padding.
    pub fn load(cfg: &LmConfig, weights: WeightMap) -> Result<Self> {
        Self::with_weights(Arc::new(LmWeights::load(cfg, weights)?))
    }

    /// A model of `cfg`'s shapes with deterministic random weights (for benchmarks and tests).
    pub fn random(cfg: &LmConfig, seed: u64, kind: RandomWeightKind) -> Result<Self> {
        Self::with_weights(Arc::new(LmWeights::random(cfg, seed, kind)?))
    }

    /// A fresh row over shared weights: f32 KV caches, position 0, and until told otherwise
    /// every conditioner's learnt padding (the official value of an absent attribute).
    pub fn with_weights(weights: Arc<LmWeights>) -> Result<Self> {
        let row = weights.new_row(&[], KvPrecision::F32)?;
        Ok(Self {
            weights,
            row,
            scratch: LmScratch::default(),
        })
    }

    /// The shared weights.
    pub fn weights(&self) -> &Arc<LmWeights> {
        &self.weights
    }

    /// This row's state.
    pub fn row(&self) -> &LmRowState {
        &self.row
    }

    pub(crate) fn row_mut(&mut self) -> &mut LmRowState {
        &mut self.row
    }

    pub fn config(&self) -> &LmConfig {
        &self.weights.cfg
    }

    /// The temporal transformer's weights, e.g. to time one layer.
    pub fn temporal(&self) -> &TemporalTransformer {
        &self.weights.temporal
    }

    /// The depformer's weights.
    pub fn depformer(&self) -> &Depformer {
        &self.weights.depformer
    }

    /// The model's conditioners (empty for Moshi).
    pub fn conditions(&self) -> &ConditionProvider {
        &self.weights.conditions
    }

    /// Conditions this row on `values` (`(conditioner, value)` pairs, e.g.
    /// `[("description", "very_good")]`); conditioners not named take their learnt padding.
    /// A model without conditioners accepts only `&[]`.
    pub fn set_conditions(&mut self, values: &[(&str, &str)]) -> Result<()> {
        let fused = self.weights.conditions.fused(values)?;
        self.row.temporal.set_condition(fused);
        Ok(())
    }

    /// A fresh row over the same weights with this row's KV precision, conditioned on `values`.
    pub fn new_row(&self, values: &[(&str, &str)]) -> Result<LmRowState> {
        self.weights.new_row(values, self.kv_precision())
    }

    /// Exchanges this row's state with `row`: the following calls run on `row`'s caches and
    /// outputs, over the same weights (cheap: buffers are moved, not copied).
    pub fn swap_row(&mut self, row: &mut LmRowState) {
        std::mem::swap(&mut self.row, row);
    }

    /// Runs the temporal transformer on one step's `1 + n_q` input tokens
    /// (`[text, audio_0 .. audio_{n_q-1}]`, initial tokens `text_card` / `card` allowed).
    /// Results: [`LmModel::transformer_out`], [`LmModel::text_logits`].
    pub fn forward_text(&mut self, tokens: &[u32]) -> Result<()> {
        self.weights.check_step_tokens(tokens)?;
        self.weights
            .forward_text_rows(&mut [&mut self.row], tokens, &mut self.scratch)
    }

    /// Output of the temporal transformer after `out_norm` for the last step (`[dim]`).
    pub fn transformer_out(&self) -> &[f32] {
        self.row.transformer_out()
    }

    /// Text logits of the last step (`[text_card]`).
    pub fn text_logits(&self) -> &[f32] {
        self.row.text_logits()
    }

    /// Starts the depformer pass of the current step.
    pub fn depformer_reset(&mut self) {
        self.row.depformer_reset();
    }

    /// Depformer sub-step `k` (in order 0..dep_q after [`LmModel::depformer_reset`]) on the
    /// last `transformer_out`; `prev_token` is the text token of this step for k = 0, else the
    /// audio token of codebook k - 1. Returns the logits of codebook k (`[card]`).
    pub fn depformer_step(&mut self, k: usize, prev_token: u32) -> Result<&[f32]> {
        self.weights.depformer_step_rows(
            k,
            &mut [&mut self.row],
            &[prev_token],
            &mut self.scratch,
        )?;
        Ok(self.row.depformer_logits())
    }

    /// Logits of the last depformer sub-step (`[card]`).
    pub fn depformer_logits(&self) -> &[f32] {
        self.row.depformer_logits()
    }

    /// Forgets the whole session (position 0, empty caches).
    pub fn reset(&mut self) {
        self.row.reset();
    }

    /// Element type of the temporal KV caches.
    pub fn kv_precision(&self) -> KvPrecision {
        self.row.kv_precision()
    }

    /// [`TemporalState::set_kv_precision`]: the temporal KV caches' element type (the
    /// depformer's 8-position caches stay f32).
    pub fn set_kv_precision(&mut self, precision: KvPrecision) {
        self.row.set_kv_precision(precision);
    }

    /// [`TemporalState::fill_caches_with_noise`]: for benchmarks of long conversations.
    pub fn fill_temporal_caches_with_noise(&mut self, positions: usize, seed: u64) {
        self.row.fill_temporal_caches_with_noise(positions, seed);
    }

    /// Temporal steps run since the last reset.
    pub fn position(&self) -> usize {
        self.row.position()
    }

    /// Positions held by each temporal layer's KV cache (≤ `context`).
    pub fn temporal_cache_lens(&self) -> Vec<usize> {
        self.row.temporal.caches().iter().map(|c| c.len()).collect()
    }

    /// Bytes currently allocated by the temporal KV caches.
    pub fn kv_cache_bytes(&self) -> usize {
        self.row.kv_cache_bytes()
    }

    /// Bytes of weights read per step, by part.
    pub fn weight_bytes(&self) -> LmWeightBytes {
        self.weights.weight_bytes()
    }
}
