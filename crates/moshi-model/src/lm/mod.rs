//! The Moshi language model: temporal transformer + depformer, built from canonically named
//! weights (see `moshi_loader::lm_weights`), stepped one frame at a time.
//!
//! Weights apart from state: [`LmWeights`] is the immutable model, shared (`Arc`) by every
//! session; [`LmRowState`] is one row's streaming state (temporal KV caches and position, the
//! depformer's frame, the row's condition). [`LmWeights::forward_text_rows`] and
//! [`LmWeights::depformer_step_rows`] step any number of rows together, every linear layer one
//! product over all of them (the weights read once per step, not once per row), each row
//! attending over its own caches at its own position, with the bits it gets alone. Sessions
//! (sampling, token history, guidance) live in [`crate::generator`].

pub mod conditioner;
pub mod demux;
pub mod depformer;
pub mod embedding;
pub mod random;
pub mod temporal;
pub mod transformer;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use moshi_loader::lm_names::{DEMUX_MAIN, DEMUX_SECOND, NORM_CROSS, NORM_DEPFORMER_OUT};
use moshi_loader::{LmConfig, PositionalEmbedding, WeightMap};

use crate::kind::ModelKind;
use crate::nn::norm::LayerNorm;
use crate::nn::{Attention, CrossAttention, CrossKeysValues, KvPrecision, Linear, Rope};
use crate::{ModelError, Result};
use conditioner::ConditionProvider;
use conditioner::TensorCondition;
use demux::Demux;
use depformer::{Depformer, DepformerScratch, DepformerSlice, DepformerState};
use embedding::{Embedding, ZERO_TOKEN};
pub use random::RandomWeightKind;
use temporal::{TemporalScratch, TemporalState, TemporalTransformer};
use transformer::{CrossBlock, Gating, RmsNorm, TransformerLayer};

/// Bytes of weights by part (for memory and bandwidth estimates). Everything but
/// `embedding_tables` is read in full once per step; of the tables only one row each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LmWeightBytes {
    /// All temporal transformer layers (norms included).
    pub temporal_layers: usize,
    pub temporal_num_layers: usize,
    /// out_norm, the text head and the extra heads.
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
    /// Tells sessions made over these weights from others ([`LmWeights::id`]).
    id: u64,
    cfg: LmConfig,
    temporal: TemporalTransformer,
    depformer: Depformer,
    conditions: ConditionProvider,
    /// Extra heads (Kyutai's STT voice activity): linear maps of the temporal output after
    /// `out_norm`, each read through a softmax ([`LmWeights::extra_heads_of`]).
    extra_heads: Vec<Linear>,
    /// The cross-attention keys and values of the tensor conditions rows were made with (a
    /// TTS voice), kept while a row holds them: rows of the same condition share them.
    cross_cache: Arc<Mutex<Vec<CrossCacheEntry>>>,
    /// The cross-attention source computed last and its keys and values (kept): a new source
    /// computes only its rows that differ. In Kyutai's TTS the empty speaker slots (learnt
    /// padding plus position, 500 of 625 positions with one voice) are the same for every
    /// voice, so a new voice costs its own rows only.
    last_cross: Arc<Mutex<Option<LastCross>>>,
}

/// A cross-attention source and its keys and values (every layer's).
type LastCross = (Vec<f32>, Arc<Vec<CrossKeysValues>>);

/// Cross-attention keys and values, and the conditions they were computed from.
#[derive(Debug)]
struct CrossCacheEntry {
    conditions: Vec<Weak<TensorCondition>>,
    keys_values: Weak<Vec<CrossKeysValues>>,
}

impl CrossCacheEntry {
    /// Whether the entry is of exactly `tensors` (the same conditions, by identity).
    fn is_of(&self, tensors: &[(&str, &Arc<TensorCondition>)]) -> bool {
        self.conditions.len() == tensors.len()
            && self
                .conditions
                .iter()
                .zip(tensors)
                .all(|(w, (_, t))| std::ptr::eq(w.as_ptr(), Arc::as_ptr(t)))
    }
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

/// The rotary embedding of a transformer with `pos` (none unless rotary).
fn rope_of(pos: PositionalEmbedding, head_dim: usize, max_period: f64) -> Option<Rope> {
    match pos {
        PositionalEmbedding::Rope => Some(Rope::new(head_dim, max_period)),
        PositionalEmbedding::RopeConcat => Some(Rope::halves(head_dim, max_period)),
        PositionalEmbedding::None | PositionalEmbedding::Sin => None,
    }
}

/// The id of the next weights loaded.
static NEXT_WEIGHTS_ID: AtomicU64 = AtomicU64::new(1);

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
    /// A LayerNorm's gain `{name}` and bias `{name}.bias` (`nn.LayerNorm`, eps 1e-5).
    fn layer_norm(&mut self, name: &str, dim: usize) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: self.map.take_f32(name, &[dim])?,
            bias: self.map.take_f32(&format!("{name}.bias"), &[dim])?,
            eps: 1e-5,
        })
    }
    /// A transformer layer of width `dim`, `heads` query heads and keys/values `kv_dim` wide.
    #[allow(clippy::too_many_arguments)]
    fn layer(
        &mut self,
        prefix: &str,
        dim: usize,
        kv_dim: usize,
        hidden: usize,
        heads: usize,
        eps: f32,
    ) -> Result<TransformerLayer> {
        let norm1 = self.norm(&format!("{prefix}.norm1"), dim, eps)?;
        let norm2 = self.norm(&format!("{prefix}.norm2"), dim, eps)?;
        let in_proj = self.linear(
            &format!("{prefix}.self_attn.in_proj"),
            dim + 2 * kv_dim,
            dim,
        )?;
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
    /// A temporal layer's cross-attention block (Kyutai's TTS).
    fn cross_block(&mut self, prefix: &str, dim: usize, heads: usize) -> Result<CrossBlock> {
        let norm = format!("{prefix}.{NORM_CROSS}");
        Ok(CrossBlock::new(
            self.map.take_f32(&norm, &[dim])?,
            self.map.take_f32(&format!("{norm}.bias"), &[dim])?,
            CrossAttention::new(
                self.linear(&format!("{prefix}.cross_attention.in_proj"), 3 * dim, dim)?,
                self.linear(&format!("{prefix}.cross_attention.out_proj"), dim, dim)?,
                heads,
            ),
        ))
    }
    /// The projections of the demuxed embedding `table` (`[width, table width]` each).
    fn demux(
        &mut self,
        table: &str,
        width: usize,
        table_width: usize,
        card: usize,
    ) -> Result<Demux> {
        Ok(Demux::new(
            self.linear(&format!("{table}.{DEMUX_MAIN}"), width, table_width)?,
            self.linear(&format!("{table}.{DEMUX_SECOND}"), width, table_width)?,
            card,
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
        let text_demux = match cfg.demux_second_stream {
            true => Some(t.demux("text_emb", dim, dim, cfg.mux_card())?),
            false => None,
        };
        let layers = (0..cfg.num_layers)
            .map(|l| {
                let p = format!("transformer.layers.{l}");
                let layer = t.layer(&p, dim, cfg.kv_dim(), hidden, cfg.num_heads, eps)?;
                Ok(match cfg.cross_attention {
                    true => layer.with_cross(t.cross_block(&p, dim, cfg.num_heads)?),
                    false => layer,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let rope = rope_of(
            cfg.positional_embedding,
            dim / cfg.num_heads,
            cfg.max_period,
        );
        let mut temporal = TemporalTransformer::new(
            text_emb,
            audio_embs,
            layers,
            out_norm,
            text_linear,
            rope,
            cfg.context,
        );
        temporal.set_text_demux(text_demux);

        let mut slices = Vec::with_capacity(cfg.dep_q);
        for k in 0..cfg.dep_q {
            let p = format!("depformer.{k}");
            let emb_rows = if k == 0 {
                cfg.text_card + 1
            } else {
                cfg.card + 1
            };
            let width = cfg.depformer_emb_width();
            let mut emb_low_rank = match cfg.depformer_low_rank_embeddings {
                Some(r) => Some(t.linear(&format!("{p}.emb.low_rank"), ddim, r)?),
                None => None,
            };
            let emb_demux = match k == 0 && cfg.demux_second_stream {
                true => {
                    // Kyutai's demuxed embedding does not read its low-rank projection.
                    emb_low_rank = None;
                    Some(t.demux(&format!("{p}.emb"), ddim, width, cfg.mux_card())?)
                }
                false => None,
            };
            slices.push(DepformerSlice {
                linear_in: t.linear(&format!("{p}.linear_in"), ddim, dim)?,
                emb: t.embedding(&format!("{p}.emb"), emb_rows, width)?,
                emb_low_rank,
                emb_demux,
                layers: (0..cfg.depformer_num_layers)
                    .map(|l| {
                        t.layer(
                            &format!("{p}.layers.{l}"),
                            ddim,
                            cfg.depformer_kv_dim(),
                            dhidden,
                            cfg.depformer_num_heads,
                            eps,
                        )
                    })
                    .collect::<Result<Vec<_>>>()?,
                out_norm: match cfg.depformer_norm {
                    Some(_) => Some(t.layer_norm(&format!("{p}.{NORM_DEPFORMER_OUT}"), ddim)?),
                    None => None,
                },
                linear_out: t.linear(&format!("{p}.linear_out"), cfg.card, ddim)?,
            });
        }
        // A model without a depformer (speech to text) may leave its keys at 0.
        let drope = match cfg.dep_q {
            0 => None,
            _ => rope_of(
                cfg.depformer_pos_emb,
                ddim / cfg.depformer_num_heads,
                cfg.depformer_max_period,
            ),
        };
        let depformer = Depformer::new(slices, drope);
        let conditions = ConditionProvider::load(cfg, &mut weights)?;
        let mut t = Take { map: &mut weights };
        let extra_heads = (0..cfg.extra_heads_num_heads)
            .map(|i| t.linear(&format!("extra_heads.{i}"), cfg.extra_heads_dim, dim))
            .collect::<Result<Vec<_>>>()?;

        let left = weights.remaining();
        if !left.is_empty() {
            let shown: Vec<&str> = left.iter().take(5).map(String::as_str).collect();
            return Err(ModelError::UnusedTensors {
                path: weights.source().to_path_buf(),
                count: left.len(),
                config: format!(
                    "num_layers {}, depformer_num_layers {}, n_q {}, dep_q {}, extra_heads_num_heads {}",
                    cfg.num_layers,
                    cfg.depformer_num_layers,
                    cfg.n_q,
                    cfg.dep_q,
                    cfg.extra_heads_num_heads
                ),
                shown: format!(
                    "{}{}",
                    shown.join(", "),
                    if left.len() > 5 { ", ..." } else { "" }
                ),
            });
        }
        let mut weights = Self {
            id: NEXT_WEIGHTS_ID.fetch_add(1, Ordering::Relaxed),
            cfg: cfg.clone(),
            temporal,
            depformer,
            conditions,
            extra_heads,
            cross_cache: Default::default(),
            last_cross: Default::default(),
        };
        let alias = ModelKind::of(cfg).conventions().text_input_alias;
        weights.temporal.set_text_alias(alias);
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

    /// An id of these weights, different for every load (a session remembers the id of the
    /// weights it was made for, so that a batch refuses a session of another model).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The model type and its conventions.
    pub fn kind(&self) -> ModelKind {
        ModelKind::of(&self.cfg)
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

    /// Number of extra heads (0 but for Kyutai's STT models).
    pub fn num_extra_heads(&self) -> usize {
        self.extra_heads.len()
    }

    /// The extra heads on a row's last temporal output (after `out_norm`), each a softmax over
    /// its `extra_heads_dim` values, as `LMGen.step_with_extra_heads`: `[head][value]`. Each
    /// row alone: the heads are a few rows of weights, so batching them saves nothing.
    pub fn extra_heads_of(&self, row: &LmRowState) -> Vec<Vec<f32>> {
        self.extra_heads
            .iter()
            .map(|head| {
                let mut p = head.forward_vec(row.transformer_out(), 1);
                softmax_in_place(&mut p);
                p
            })
            .collect()
    }

    /// A fresh row: empty caches of `precision`, position 0, conditioned on `values`
    /// (`(conditioner, value)` pairs, e.g. `[("description", "very_good")]`; conditioners not
    /// named take their learnt padding; a model without conditioners accepts only `&[]`).
    pub fn new_row(&self, values: &[(&str, &str)], precision: KvPrecision) -> Result<LmRowState> {
        self.new_row_with_tensors(values, &[], precision)
    }

    /// [`LmWeights::new_row`] with tensor conditions (`(conditioner, tensor)`: the TTS's
    /// `speaker_wavs`), whose keys and values for every layer's cross-attention are computed
    /// here, once for every row made with the same conditions (the same `Arc`s) while one holds
    /// them.
    pub fn new_row_with_tensors(
        &self,
        values: &[(&str, &str)],
        tensors: &[(&str, &Arc<TensorCondition>)],
        precision: KvPrecision,
    ) -> Result<LmRowState> {
        let mut temporal = self.temporal.new_state(precision);
        temporal.set_condition(self.conditions.fused(values)?);
        temporal.set_cross(self.cross_keys_values(tensors)?);
        Ok(LmRowState {
            temporal,
            depformer: self.depformer.new_state(),
        })
    }

    /// The cross-attention keys and values of `tensors`: shared with the rows holding them,
    /// else computed (None for a model without cross-attention).
    fn cross_keys_values(
        &self,
        tensors: &[(&str, &Arc<TensorCondition>)],
    ) -> Result<Option<Arc<Vec<CrossKeysValues>>>> {
        let mut cache = self.cross_cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.retain(|e| e.keys_values.strong_count() > 0);
        if let Some(kv) = cache
            .iter()
            .find(|e| e.is_of(tensors))
            .and_then(|e| e.keys_values.upgrade())
        {
            return Ok(Some(kv));
        }
        let plain: Vec<(&str, &TensorCondition)> =
            tensors.iter().map(|(n, t)| (*n, t.as_ref())).collect();
        let Some(source) = self.conditions.cross_source(&plain)? else {
            return Ok(None);
        };
        let mut last = self.last_cross.lock().unwrap_or_else(|p| p.into_inner());
        let computed = match last.as_ref() {
            Some((previous, kv)) => self
                .temporal
                .cross_keys_values_reusing(&source, (previous, kv)),
            None => self.temporal.cross_keys_values(&source),
        };
        let Some(kv) = computed else {
            return Ok(None);
        };
        let kv = Arc::new(kv);
        *last = Some((source, kv.clone()));
        cache.push(CrossCacheEntry {
            conditions: tensors.iter().map(|(_, t)| Arc::downgrade(t)).collect(),
            keys_values: Arc::downgrade(&kv),
        });
        Ok(Some(kv))
    }

    /// Checks one step's `1 + n_q` input tokens (`[text, audio_0 .. audio_{n_q-1}]`, initial
    /// tokens `text_card` / `card` allowed, [`ZERO_TOKEN`] anywhere, muxed text tokens up to
    /// [`LmConfig::max_text_input`]).
    pub fn check_step_tokens(&self, tokens: &[u32]) -> Result<()> {
        let cfg = &self.cfg;
        if tokens.len() != cfg.n_q + 1 {
            return Err(ModelError::WrongLength {
                what: "LM step: tokens per step (1 + n_q)",
                expected: cfg.n_q + 1,
                got: tokens.len(),
            });
        }
        if tokens[0] as usize > cfg.max_text_input() && tokens[0] != ZERO_TOKEN {
            return Err(ModelError::TokenOutOfRange {
                what: "text token",
                value: tokens[0],
                at: String::new(),
                max: cfg.max_text_input(),
                note: ": text_card, the initial token (or the largest muxed token)",
            });
        }
        if let Some((i, &t)) = tokens[1..]
            .iter()
            .enumerate()
            .find(|(_, &t)| t as usize > cfg.card && t != ZERO_TOKEN)
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
        let limit = if k == 0 {
            cfg.max_text_input()
        } else {
            cfg.card
        };
        for (row, &prev) in rows.iter().zip(prev_tokens) {
            let done = row.depformer.substeps_done();
            if k >= cfg.dep_q || done != k {
                return Err(ModelError::DepformerOrder {
                    requested: k,
                    done,
                    dep_q: cfg.dep_q,
                });
            }
            if prev as usize > limit && prev != ZERO_TOKEN {
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
            text_head: self.temporal.text_head_bytes()
                + self
                    .extra_heads
                    .iter()
                    .map(Linear::weight_bytes)
                    .sum::<usize>(),
            depformer: self.depformer.weight_bytes_read_per_pass(),
            embedding_tables: self.temporal.embedding_bytes() + self.depformer.embedding_bytes(),
        }
    }
}

/// Softmax over `x` in f32: the largest value subtracted before `exp`, as torch's.
fn softmax_in_place(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}
