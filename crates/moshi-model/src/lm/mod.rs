//! The Moshi language model: temporal transformer + depformer, built from canonically named
//! weights (see `moshi_loader::lm_weights`), stepped one frame at a time.

pub mod conditioner;
pub mod depformer;
pub mod embedding;
pub mod random;
pub mod temporal;
pub mod transformer;

use std::path::Path;

use moshi_loader::{LmConfig, PositionalEmbedding, WeightMap};

use crate::nn::{Attention, KvPrecision, Linear, Rope};
use crate::{ModelError, Result};
use conditioner::ConditionProvider;
use depformer::{Depformer, DepformerSlice, DepformerState};
use embedding::Embedding;
pub use random::RandomWeightKind;
use temporal::{TemporalState, TemporalTransformer};
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

/// The LM with its streaming state (temporal KV caches, current position) for one batch row;
/// more rows over the same weights are swapped in with [`LmModel::swap_row`].
#[derive(Clone, Debug)]
pub struct LmModel {
    cfg: LmConfig,
    temporal: TemporalTransformer,
    depformer: Depformer,
    conditions: ConditionProvider,
}

/// The streaming state of one batch row (temporal caches and position, the depformer's frame,
/// the row's condition): classifier-free guidance steps a second row over the same weights.
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

impl LmModel {
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
        let mut model = Self {
            cfg: cfg.clone(),
            temporal,
            depformer,
            conditions,
        };
        if cfg.model_type.as_deref() == Some("hibiki") {
            model.temporal.set_text_alias(Some(HIBIKI_EOS_READS_AS_PAD));
        }
        // Until told otherwise a conditioned model sees every conditioner's learnt padding (the
        // official value of an absent attribute).
        model.set_conditions(&[])?;
        Ok(model)
    }

    /// A model of `cfg`'s shapes with deterministic random weights (for benchmarks and tests).
    pub fn random(cfg: &LmConfig, seed: u64, kind: RandomWeightKind) -> Result<Self> {
        check_supported(cfg)?;
        Self::load(cfg, random::random_lm_weights(cfg, seed, kind)?)
    }

    pub fn config(&self) -> &LmConfig {
        &self.cfg
    }

    /// The temporal transformer (weights and state), e.g. to time one layer.
    pub fn temporal(&self) -> &TemporalTransformer {
        &self.temporal
    }

    /// The depformer (weights and per-frame state).
    pub fn depformer(&self) -> &Depformer {
        &self.depformer
    }

    /// The model's conditioners (empty for Moshi).
    pub fn conditions(&self) -> &ConditionProvider {
        &self.conditions
    }

    /// Conditions the current row on `values` (`(conditioner, value)` pairs, e.g.
    /// `[("description", "very_good")]`); conditioners not named take their learnt padding.
    /// A model without conditioners accepts only `&[]`.
    pub fn set_conditions(&mut self, values: &[(&str, &str)]) -> Result<()> {
        let fused = self.conditions.fused(values)?;
        self.temporal.set_condition(fused);
        Ok(())
    }

    /// A fresh row over the same weights: empty caches, position 0, conditioned on `values`.
    pub fn new_row(&self, values: &[(&str, &str)]) -> Result<LmRowState> {
        let mut temporal = self.temporal.new_state();
        temporal.set_condition(self.conditions.fused(values)?);
        Ok(LmRowState {
            temporal,
            depformer: self.depformer.new_state(),
        })
    }

    /// Exchanges the current row's state with `row`: the following calls run on `row`'s caches
    /// and outputs, over the same weights (cheap: buffers are moved, not copied).
    pub fn swap_row(&mut self, row: &mut LmRowState) {
        self.temporal.swap_state(&mut row.temporal);
        self.depformer.swap_state(&mut row.depformer);
    }

    /// Runs the temporal transformer on one step's `1 + n_q` input tokens
    /// (`[text, audio_0 .. audio_{n_q-1}]`, initial tokens `text_card` / `card` allowed).
    /// Results: [`LmModel::transformer_out`], [`LmModel::text_logits`].
    pub fn forward_text(&mut self, tokens: &[u32]) -> Result<()> {
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
        self.temporal.step(tokens);
        Ok(())
    }

    /// Output of the temporal transformer after `out_norm` for the last step (`[dim]`).
    pub fn transformer_out(&self) -> &[f32] {
        self.temporal.transformer_out()
    }

    /// Text logits of the last step (`[text_card]`).
    pub fn text_logits(&self) -> &[f32] {
        self.temporal.text_logits()
    }

    /// Starts the depformer pass of the current step.
    pub fn depformer_reset(&mut self) {
        self.depformer.reset();
    }

    /// Depformer sub-step `k` (in order 0..dep_q after [`LmModel::depformer_reset`]) on the
    /// last `transformer_out`; `prev_token` is the text token of this step for k = 0, else the
    /// audio token of codebook k - 1. Returns the logits of codebook k (`[card]`).
    pub fn depformer_step(&mut self, k: usize, prev_token: u32) -> Result<&[f32]> {
        let cfg = &self.cfg;
        if k >= cfg.dep_q || self.depformer.substeps_done() != k {
            return Err(ModelError::DepformerOrder {
                requested: k,
                done: self.depformer.substeps_done(),
                dep_q: cfg.dep_q,
            });
        }
        let limit = if k == 0 { cfg.text_card } else { cfg.card };
        if prev_token as usize > limit {
            return Err(ModelError::TokenOutOfRange {
                what: "previous token",
                value: prev_token,
                at: format!(" of depformer sub-step {k}"),
                max: limit,
                note: "",
            });
        }
        Ok(self
            .depformer
            .step(k, prev_token, self.temporal.transformer_out()))
    }

    /// Logits of the last depformer sub-step (`[card]`).
    pub fn depformer_logits(&self) -> &[f32] {
        self.depformer.logits()
    }

    /// Forgets the whole session (position 0, empty caches).
    pub fn reset(&mut self) {
        self.temporal.reset();
        self.depformer.reset();
    }

    /// [`TemporalTransformer::set_kv_precision`]: the temporal KV caches' element type (the
    /// depformer's 8-position caches stay f32).
    pub fn set_kv_precision(&mut self, precision: KvPrecision) {
        self.temporal.set_kv_precision(precision);
    }

    /// [`TemporalTransformer::fill_caches_with_noise`]: for benchmarks of long conversations.
    pub fn fill_temporal_caches_with_noise(&mut self, positions: usize, seed: u64) {
        self.temporal.fill_caches_with_noise(positions, seed);
    }

    /// Temporal steps run since the last reset.
    pub fn position(&self) -> usize {
        self.temporal.position()
    }

    /// Positions held by each temporal layer's KV cache (≤ `context`).
    pub fn temporal_cache_lens(&self) -> Vec<usize> {
        self.temporal.caches().iter().map(|c| c.len()).collect()
    }

    /// Bytes currently allocated by the temporal KV caches.
    pub fn kv_cache_bytes(&self) -> usize {
        self.temporal
            .caches()
            .iter()
            .map(|c| c.allocated_bytes())
            .sum()
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
