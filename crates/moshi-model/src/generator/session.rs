//! One session's generation state, owned by the caller: its LM rows (the negatively conditioned
//! row of guidance included), its settings, RNG and token history. Settings are fixed when the
//! session is made ([`crate::generator::Generator::new_session`]); other settings are another
//! session.

use std::sync::Arc;

use crate::lm::conditioner::TensorCondition;
use crate::lm::{LmRowState, LmScratch};
use crate::nn::KvPrecision;
use crate::rng::Rng;
use crate::tts::{TtsSettings, TtsStream};

use super::sampling::{SamplerScratch, SamplingConfig};
use super::StepTimings;

/// What a session is conditioned on, and its classifier-free guidance.
#[derive(Clone, Debug, PartialEq)]
pub struct Conditioning {
    /// `(conditioner, value)` pairs (Hibiki: `[("description", "very_good")]`); conditioners not
    /// named take their learnt padding. Empty for a model without conditioners.
    pub values: Vec<(String, String)>,
    /// The negative row of guidance (Hibiki: `[("description", "very_bad")]`); unused without
    /// guidance.
    pub negative: Vec<(String, String)>,
    /// Guidance coefficient: logits mixed as `null + (cond - null) * cfg_coef`; 1 = no guidance
    /// (one row).
    pub cfg_coef: f32,
    /// Tensor conditions (the TTS's voice: `("speaker_wavs", ..)`), the cross-attention source.
    pub tensors: Vec<(String, Arc<TensorCondition>)>,
}

impl Conditioning {
    /// No conditions, no guidance (Moshi).
    pub fn none() -> Self {
        Self {
            values: Vec::new(),
            negative: Vec::new(),
            cfg_coef: 1.0,
            tensors: Vec::new(),
        }
    }

    /// Conditioned on `values`, guided against `negative` with `cfg_coef`.
    pub fn new(values: &[(&str, &str)], negative: &[(&str, &str)], cfg_coef: f32) -> Self {
        let own = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|&(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        };
        Self {
            values: own(values),
            negative: own(negative),
            cfg_coef,
            tensors: Vec::new(),
        }
    }

    /// Whether a second, negatively conditioned row runs.
    pub fn is_guided(&self) -> bool {
        self.cfg_coef != 1.0
    }

    pub(crate) fn borrowed(pairs: &[(String, String)]) -> Vec<(&str, &str)> {
        pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }
}

impl Default for Conditioning {
    fn default() -> Self {
        Self::none()
    }
}

/// The settings a session is made with.
#[derive(Clone, Debug, PartialEq)]
pub struct LmSessionSettings {
    pub sampling: SamplingConfig,
    /// Element type of the temporal KV caches (of both rows with guidance).
    pub kv_precision: KvPrecision,
    pub conditioning: Conditioning,
    /// Keep each step's model input, logits and temporal output in its
    /// [`super::StepDetails`] (tests, debugging); off, those fields are empty.
    pub record_details: bool,
    /// The TTS state machine's settings (used by a text-to-speech model only).
    pub tts: TtsSettings,
}

impl Default for LmSessionSettings {
    fn default() -> Self {
        Self {
            sampling: SamplingConfig::default(),
            kv_precision: KvPrecision::F32,
            conditioning: Conditioning::none(),
            record_details: false,
            tts: TtsSettings::default(),
        }
    }
}

impl LmSessionSettings {
    /// Default settings with `sampling`.
    pub fn with_sampling(sampling: SamplingConfig) -> Self {
        Self {
            sampling,
            ..Self::default()
        }
    }
}

/// The negative row of classifier-free guidance and the buffers of the mixed logits.
#[derive(Clone, Debug)]
pub(super) struct Guidance {
    pub(super) null_row: LmRowState,
    pub(super) text_logits: Vec<f32>,
    pub(super) audio_logits: Vec<f32>,
}

/// One conversation's generation state (see the module doc). Made by
/// [`crate::generator::Generator::new_session`], stepped by
/// [`crate::generator::Generator::step`].
#[derive(Clone, Debug)]
pub struct LmSession {
    /// [`crate::lm::LmWeights::id`] of the weights this session was made for.
    pub(super) weights_id: u64,
    pub(super) settings: LmSessionSettings,
    pub(super) row: LmRowState,
    pub(super) guidance: Option<Guidance>,
    /// The text state of a text-to-speech session.
    pub(super) tts: Option<TtsStream>,
    pub(super) rng: Rng,
    pub(super) step: usize,
    /// Ring of the last `max_delay + 1` sampled frames `[text, audio..]`, slot `step % len`.
    pub(super) sampled: Vec<Vec<u32>>,
    /// Ring of the last `max_delay + 1` user frames, slot `step % len`.
    pub(super) user: Vec<Vec<u32>>,
    /// This step's `1 + n_q` model inputs.
    pub(super) input: Vec<u32>,
    pub(super) sampler: SamplerScratch,
    /// Buffers of a batched step, lent by the batch's first session.
    pub(super) scratch: LmScratch,
    pub(super) last_timings: StepTimings,
}

impl LmSession {
    pub fn settings(&self) -> &LmSessionSettings {
        &self.settings
    }

    pub fn sampling(&self) -> &SamplingConfig {
        &self.settings.sampling
    }

    /// The guidance coefficient (1 without guidance).
    pub fn cfg_coef(&self) -> f32 {
        self.settings.conditioning.cfg_coef
    }

    /// Activation rows this session adds to each product of a step: 2 with guidance (the
    /// conditioned and the unconditioned pass), else 1.
    pub fn rows_per_step(&self) -> usize {
        1 + usize::from(self.guidance.is_some())
    }

    /// The text state of a text-to-speech session (None for other models).
    pub fn tts(&self) -> Option<&TtsStream> {
        self.tts.as_ref()
    }

    /// The text state of a text-to-speech session, to push text into.
    pub fn tts_mut(&mut self) -> Option<&mut TtsStream> {
        self.tts.as_mut()
    }

    /// Steps run since the start / last reset.
    pub fn step_index(&self) -> usize {
        self.step
    }

    /// Stage timings of the last step (the batch's: shared by every session in it).
    pub fn last_timings(&self) -> StepTimings {
        self.last_timings
    }

    /// The conditioned row's state (caches, position, last outputs).
    pub fn row(&self) -> &LmRowState {
        &self.row
    }

    /// Element type of the temporal KV caches.
    pub fn kv_precision(&self) -> KvPrecision {
        self.settings.kv_precision
    }

    /// Bytes held by the temporal KV caches of every row.
    pub fn kv_cache_bytes(&self) -> usize {
        self.rows().map(LmRowState::kv_cache_bytes).sum()
    }

    /// Back to step 0: caches emptied, RNG re-seeded, settings kept.
    pub fn reset(&mut self) {
        self.rows_mut().for_each(LmRowState::reset);
        self.rng = Rng::new(self.settings.sampling.seed);
        self.step = 0;
        if let Some(tts) = &mut self.tts {
            tts.machine_mut().reset();
        }
    }

    /// Fills every row's temporal caches with `positions` of noise
    /// ([`LmRowState::fill_temporal_caches_with_noise`]): a long conversation's attention cost
    /// without running it, for benchmarks (no input leads to this state).
    pub fn fill_temporal_caches_with_noise(&mut self, positions: usize, seed: u64) {
        for (i, row) in self.rows_mut().enumerate() {
            row.fill_temporal_caches_with_noise(positions, seed ^ (0x5EED * i as u64));
        }
    }

    /// This session's rows: its own, and the negative one with guidance.
    pub(super) fn rows(&self) -> impl Iterator<Item = &LmRowState> {
        std::iter::once(&self.row).chain(self.guidance.as_ref().map(|g| &g.null_row))
    }

    pub(super) fn rows_mut(&mut self) -> impl Iterator<Item = &mut LmRowState> {
        std::iter::once(&mut self.row).chain(self.guidance.as_mut().map(|g| &mut g.null_row))
    }
}
