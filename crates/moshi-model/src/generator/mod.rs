//! The streaming generator (the official `LMGen` state machine): one frame of user codes in per
//! step, the 1 + n_q model inputs built with the config's delays and initial tokens, text and
//! Moshi's audio sampled, and (once the delays are filled) one frame returned per step:
//! `[text, audio_0 .. audio_{dep_q-1}]` with `stream k` taken from step `s - max_delay + delay_k`.
//!
//! With classifier-free guidance (`LMGen(cfg_coef, condition_tensors)`, Hibiki) a second,
//! negatively conditioned row runs the temporal transformer and the depformer on the same tokens;
//! the text logits and each codebook's logits are mixed as `null + (cond - null) * cfg_coef`,
//! and the one sampled token is fed to both rows.
//!
//! Several sessions over the same weights step together ([`Generator::step_batch`]): one
//! temporal step and, per depformer sub-step, one pass for all their rows (a session with
//! guidance brings two), every linear layer one product over all rows, so the weights are read
//! once per frame whoever shares it. Each session keeps its own caches, position, delays, token
//! history, sampling settings and RNG; its tokens and logits have the bits it gets alone.
//! [`Generator::step`] is the batch of one.

pub mod sampling;

use std::sync::Arc;
use std::time::Instant;

use crate::lm::{LmModel, LmRowState, LmScratch, LmWeights};
use crate::rng::Rng;
use crate::{ModelError, Result};
pub use sampling::SamplingConfig;
use sampling::{sample_token, SamplerScratch};

/// One output frame: Moshi's text token and its `dep_q` audio codes, delays undone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeneratedFrame {
    pub text: u32,
    pub audio: Vec<u32>,
}

/// Wall-clock time of the stages of one step, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepTimings {
    /// Embeddings + temporal transformer + out_norm + text head.
    pub temporal_ms: f64,
    /// All depformer sub-steps (without sampling).
    pub depformer_ms: f64,
    /// Text and audio sampling.
    pub sampling_ms: f64,
}

impl StepTimings {
    pub fn total_ms(&self) -> f64 {
        self.temporal_ms + self.depformer_ms + self.sampling_ms
    }
}

/// Everything about one step (for tests, debugging and profiling).
#[derive(Clone, Debug, PartialEq)]
pub struct StepDetails {
    /// Step index (0-based).
    pub step: usize,
    /// The 1 + n_q tokens embedded by the temporal transformer.
    pub model_input: Vec<u32>,
    /// Text token sampled at this step.
    pub text_token: u32,
    /// Audio tokens sampled at this step (`dep_q`).
    pub audio_tokens: Vec<u32>,
    /// `[text_card]`.
    pub text_logits: Vec<f32>,
    /// `[dep_q][card]`.
    pub audio_logits: Vec<Vec<f32>>,
    /// `[dim]`, after out_norm.
    pub transformer_out: Vec<f32>,
    /// What [`Generator::step`] returns for this step.
    pub frame: Option<GeneratedFrame>,
    pub timings: StepTimings,
}

/// What a session feeds one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepInput<'a> {
    /// One frame of user codes (`n_q - dep_q` codes, each `< card`).
    UserCodes(&'a [u32]),
    /// The end-of-stream frame of a translation model: every user code equal to `card`
    /// (`moshi/run_inference.py` after the last input frame).
    EndOfInput,
}

/// The negative row of classifier-free guidance and the buffers of the mixed logits.
#[derive(Clone, Debug)]
struct Guidance {
    cfg_coef: f32,
    null_row: LmRowState,
    text_logits: Vec<f32>,
    audio_logits: Vec<f32>,
}

impl Guidance {
    /// `mixed = null + (mixed - null) * cfg_coef`, elementwise in f32 (`mixed` holds the
    /// conditioned logits on entry), as `LMGen` mixes them.
    fn mix(cfg_coef: f32, mixed: &mut [f32], null: &[f32]) {
        for (m, &n) in mixed.iter_mut().zip(null) {
            *m = n + (*m - n) * cfg_coef;
        }
    }
}

/// Streaming generation state around an [`LmModel`].
#[derive(Clone, Debug)]
pub struct Generator {
    model: LmModel,
    guidance: Option<Guidance>,
    sampling: SamplingConfig,
    rng: Rng,
    step: usize,
    /// Ring of the last `max_delay + 1` sampled frames `[text, audio..]`, slot `step % len`.
    sampled: Vec<Vec<u32>>,
    /// Ring of the last `max_delay + 1` user frames, slot `step % len`.
    user: Vec<Vec<u32>>,
    input: Vec<u32>,
    scratch: SamplerScratch,
    last_timings: StepTimings,
}

impl Generator {
    pub fn new(model: LmModel, sampling: SamplingConfig) -> Generator {
        let cfg = model.config();
        let ring = cfg.max_delay() + 1;
        let sampled = vec![vec![0; cfg.dep_q + 1]; ring];
        let user = vec![vec![0; cfg.user_codebooks()]; ring];
        let input = vec![0; cfg.n_q + 1];
        let rng = Rng::new(sampling.seed);
        Generator {
            model,
            guidance: None,
            sampling,
            rng,
            step: 0,
            sampled,
            user,
            input,
            scratch: SamplerScratch::default(),
            last_timings: StepTimings::default(),
        }
    }

    pub fn model(&self) -> &LmModel {
        &self.model
    }

    pub fn into_model(self) -> LmModel {
        self.model
    }

    /// The temporal KV caches' element type (of both rows with guidance); changing it restarts
    /// the conversation.
    pub fn set_kv_precision(&mut self, precision: crate::nn::KvPrecision) {
        if precision != self.model.kv_precision() {
            self.model.set_kv_precision(precision);
            if let Some(g) = &mut self.guidance {
                g.null_row.set_kv_precision(precision);
            }
            self.reset();
        }
    }

    /// Conditions generation on `values` (`(conditioner, value)` pairs; Hibiki:
    /// `[("description", "very_good")]`), the negative row of guidance on `negative`
    /// (`[("description", "very_bad")]`), with guidance coefficient `cfg_coef` (1 = no guidance:
    /// one row, `negative` unused). Conditioners not named take their learnt padding. Restarts
    /// the conversation. Errors on a value the model does not know, on guidance for a model
    /// without conditioners (both rows would be the same), or on a coefficient that is not a
    /// positive number.
    pub fn set_conditions(
        &mut self,
        values: &[(&str, &str)],
        cfg_coef: f32,
        negative: &[(&str, &str)],
    ) -> Result<()> {
        if !(cfg_coef.is_finite() && cfg_coef > 0.0) {
            return Err(ModelError::BadGuidance {
                cfg_coef,
                reason: "expected a positive number (1 = no guidance)",
            });
        }
        let guidance = if cfg_coef == 1.0 {
            None
        } else {
            if self.model.conditions().is_empty() {
                return Err(ModelError::BadGuidance {
                    cfg_coef,
                    reason:
                        "guidance needs a conditioned model (Hibiki); this one has no conditioners \
                             (use a coefficient of 1)",
                });
            }
            let cfg = self.model.config();
            Some(Guidance {
                cfg_coef,
                null_row: self.model.new_row(negative)?,
                text_logits: vec![0.0; cfg.text_card],
                audio_logits: vec![0.0; cfg.card],
            })
        };
        self.model.set_conditions(values)?;
        self.guidance = guidance;
        self.reset();
        Ok(())
    }

    /// The guidance coefficient (1 without guidance).
    pub fn cfg_coef(&self) -> f32 {
        self.guidance.as_ref().map_or(1.0, |g| g.cfg_coef)
    }

    /// Activation rows of each product of a step: 2 with guidance (the conditioned and the
    /// unconditioned pass), else 1.
    pub fn rows_per_step(&self) -> usize {
        if self.guidance.is_some() {
            2
        } else {
            1
        }
    }

    pub fn sampling(&self) -> &SamplingConfig {
        &self.sampling
    }

    /// New sampling settings (temperatures, top-k, seed, greedy); restarts the conversation so
    /// the RNG starts from the new seed.
    pub fn set_sampling(&mut self, sampling: SamplingConfig) {
        self.sampling = sampling;
        self.reset();
    }

    /// Steps run since the start / last reset.
    pub fn step_index(&self) -> usize {
        self.step
    }

    /// Stage timings of the last step.
    pub fn last_timings(&self) -> StepTimings {
        self.last_timings
    }

    /// Whether a text token is shown to the user: not PAD, not EPAD, not the initial token.
    pub fn text_is_printable(&self, id: u32) -> bool {
        let cfg = self.model.config();
        id != cfg.existing_text_padding_id
            && id != cfg.existing_text_end_padding_id
            && (id as usize) < cfg.text_card
    }

    /// [`crate::lm::LmModel::fill_temporal_caches_with_noise`] for every row (both with
    /// guidance): for benchmarks of long conversations.
    pub fn fill_temporal_caches_with_noise(&mut self, positions: usize, seed: u64) {
        self.model.fill_temporal_caches_with_noise(positions, seed);
        if let Some(g) = &mut self.guidance {
            g.null_row
                .fill_temporal_caches_with_noise(positions, seed ^ 0x5EED);
        }
    }

    /// Back to step 0 (model caches emptied, RNG re-seeded).
    pub fn reset(&mut self) {
        self.model.reset();
        if let Some(g) = &mut self.guidance {
            g.null_row.reset();
        }
        self.rng = Rng::new(self.sampling.seed);
        self.step = 0;
    }

    /// Feeds one frame of user codes (`n_q - dep_q` codes, each `< card`); returns the frame
    /// the official `LMGen.step` returns (None while the delays fill, i.e. for the first
    /// `max_delay` steps).
    pub fn step(&mut self, user_codes: &[u32]) -> Result<Option<GeneratedFrame>> {
        Ok(self
            .step_alone(StepInput::UserCodes(user_codes), false)?
            .frame)
    }

    /// [`Generator::step`] with the model inputs, sampled tokens, logits and timings.
    pub fn step_detailed(&mut self, user_codes: &[u32]) -> Result<StepDetails> {
        self.step_alone(StepInput::UserCodes(user_codes), true)
    }

    /// Feeds the end-of-stream frame of a translation model (Hibiki): every user code equal to
    /// `card` (`moshi/run_inference.py` after the last input frame). Then feed silence.
    pub fn step_end_of_input(&mut self) -> Result<Option<GeneratedFrame>> {
        Ok(self.step_alone(StepInput::EndOfInput, false)?.frame)
    }

    /// [`Generator::step_end_of_input`] with details.
    pub fn step_end_of_input_detailed(&mut self) -> Result<StepDetails> {
        self.step_alone(StepInput::EndOfInput, true)
    }

    /// One step of `gens` together, session `i` fed `inputs[i]`: the result of each is what
    /// [`Generator::step`] (or [`Generator::step_end_of_input`]) returns for it alone, bit for
    /// bit; a session's error (a bad input, non-finite logits, weights other than the first
    /// session's) is its own and leaves the others stepping. Every session must run over the same
    /// [`LmWeights`] (`Arc`); `scratch` holds the buffers of the batch.
    ///
    /// # Panics
    /// If `inputs` and `gens` differ in length (caller bug).
    pub fn step_batch(
        gens: &mut [&mut Generator],
        inputs: &[StepInput<'_>],
        scratch: &mut LmScratch,
    ) -> Vec<Result<Option<GeneratedFrame>>> {
        run_steps(gens, inputs, false, scratch)
            .into_iter()
            .map(|r| r.map(|d| d.frame))
            .collect()
    }

    /// [`Generator::step_batch`] with each session's details.
    ///
    /// # Panics
    /// If `inputs` and `gens` differ in length (caller bug).
    pub fn step_batch_detailed(
        gens: &mut [&mut Generator],
        inputs: &[StepInput<'_>],
        scratch: &mut LmScratch,
    ) -> Vec<Result<StepDetails>> {
        run_steps(gens, inputs, true, scratch)
    }

    /// A batch of one over this session's own scratch buffers.
    fn step_alone(&mut self, input: StepInput<'_>, record: bool) -> Result<StepDetails> {
        let mut scratch = std::mem::take(&mut self.model.scratch);
        let result = run_steps(&mut [&mut *self], &[input], record, &mut scratch).pop();
        self.model.scratch = scratch;
        result.expect("one session in, one result out")
    }

    fn check_user_codes(&self, user_codes: &[u32]) -> Result<()> {
        let cfg = self.model.config();
        let card = cfg.card;
        if user_codes.len() != cfg.user_codebooks() {
            return Err(ModelError::WrongLength {
                what: "generator step: user audio codes per frame (n_q - dep_q)",
                expected: cfg.user_codebooks(),
                got: user_codes.len(),
            });
        }
        if let Some((i, &c)) = user_codes
            .iter()
            .enumerate()
            .find(|(_, &c)| c as usize >= card)
        {
            return Err(ModelError::TokenOutOfRange {
                what: "user code",
                value: c,
                at: format!(" of codebook {i}"),
                max: card - 1,
                note: ": card - 1",
            });
        }
        Ok(())
    }

    /// Checks `input` and the settings, stores the user frame and builds this step's `1 + n_q`
    /// model inputs (stream i with delay d takes its initial token while s <= d; generated
    /// streams then read the token sampled at s - 1, user streams the frame fed at s - d).
    fn prepare_step(&mut self, weights: &Arc<LmWeights>, input: StepInput<'_>) -> Result<()> {
        if !Arc::ptr_eq(self.model.weights(), weights) {
            return Err(ModelError::BatchWeightsDiffer);
        }
        if let StepInput::UserCodes(codes) = input {
            self.check_user_codes(codes)?;
        }
        // Public fields: checked where they are used (two comparisons per step).
        self.sampling.validate()?;
        let cfg = self.model.config();
        let (dep_q, card, s) = (cfg.dep_q, cfg.card, self.step);
        let ring = self.sampled.len();
        match input {
            StepInput::UserCodes(codes) => self.user[s % ring].copy_from_slice(codes),
            StepInput::EndOfInput => self.user[s % ring].fill(card as u32),
        }
        let delays = &cfg.delays;
        for (i, inp) in self.input.iter_mut().enumerate() {
            let d = delays[i];
            *inp = if s <= d {
                if i == 0 {
                    cfg.text_card as u32
                } else {
                    card as u32
                }
            } else if i <= dep_q {
                self.sampled[(s - 1) % ring][i]
            } else {
                self.user[(s - d) % ring][i - dep_q - 1]
            };
        }
        weights.check_step_tokens(&self.input)
    }

    /// The logits to sample after the temporal step (mixed with guidance) into the guidance
    /// buffer, or this row's own.
    fn text_logits(&mut self) -> &[f32] {
        match &mut self.guidance {
            Some(g) => {
                g.text_logits
                    .copy_from_slice(self.model.row().text_logits());
                Guidance::mix(g.cfg_coef, &mut g.text_logits, g.null_row.text_logits());
                &g.text_logits
            }
            None => self.model.row().text_logits(),
        }
    }

    /// The logits to sample after a depformer sub-step (mixed with guidance).
    fn audio_logits(&mut self) -> &[f32] {
        match &mut self.guidance {
            Some(g) => {
                g.audio_logits
                    .copy_from_slice(self.model.row().depformer_logits());
                Guidance::mix(
                    g.cfg_coef,
                    &mut g.audio_logits,
                    g.null_row.depformer_logits(),
                );
                &g.audio_logits
            }
            None => self.model.row().depformer_logits(),
        }
    }

    /// This session's rows (its own, and the negative one with guidance).
    fn rows_mut(&mut self) -> impl Iterator<Item = &mut LmRowState> {
        std::iter::once(self.model.row_mut()).chain(self.guidance.as_mut().map(|g| &mut g.null_row))
    }
}

/// What one session of a batched step has sampled so far.
struct SessionStep {
    /// `[text, audio_0 .. audio_{dep_q-1}]`.
    frame: Vec<u32>,
    text_logits: Vec<f32>,
    audio_logits: Vec<Vec<f32>>,
    sampling_s: f64,
    error: Option<ModelError>,
}

/// One step of `gens` (see [`Generator::step_batch`]).
fn run_steps(
    gens: &mut [&mut Generator],
    inputs: &[StepInput<'_>],
    record: bool,
    scratch: &mut LmScratch,
) -> Vec<Result<StepDetails>> {
    assert_eq!(gens.len(), inputs.len(), "one input per session");
    let Some(weights) = gens.first().map(|g| g.model.weights().clone()) else {
        return Vec::new();
    };
    let dep_q = weights.config().dep_q;
    let mut steps: Vec<SessionStep> = gens
        .iter_mut()
        .zip(inputs)
        .map(|(g, &input)| SessionStep {
            frame: vec![0; dep_q + 1],
            text_logits: Vec::new(),
            audio_logits: Vec::new(),
            sampling_s: 0.0,
            error: g.prepare_step(&weights, input).err(),
        })
        .collect();

    // The temporal step of every row (inputs checked above).
    let t0 = Instant::now();
    {
        let mut rows = Vec::with_capacity(2 * gens.len());
        let mut tokens = Vec::with_capacity(2 * gens.len() * (weights.config().n_q + 1));
        for (g, st) in gens.iter_mut().zip(&steps) {
            if st.error.is_none() {
                for _ in 0..1 + usize::from(g.guidance.is_some()) {
                    tokens.extend_from_slice(&g.input);
                }
                rows.extend(g.rows_mut());
            }
        }
        let _span = tracing::trace_span!("lm_temporal", rows = rows.len()).entered();
        weights.step_temporal_rows(&mut rows, &tokens, scratch);
    }
    let temporal_s = t0.elapsed().as_secs_f64();
    for (g, st) in gens.iter_mut().zip(steps.iter_mut()) {
        if st.error.is_some() {
            continue;
        }
        let ts = Instant::now();
        let s = g.step;
        let logits = g.text_logits();
        if let Err(e) = check_finite(logits, s, "text") {
            st.error = Some(e);
            continue;
        }
        if record {
            st.text_logits = logits.to_vec();
        }
        let sc = &g.sampling;
        let (greedy, temp, top_k) = (sc.greedy, sc.temp_text, sc.top_k_text);
        // The logits live in `g`: sample from a copy-free borrow of the right buffer.
        let text = sample_from(g, greedy, temp, top_k, Logits::Text);
        st.frame[0] = text;
        st.sampling_s += ts.elapsed().as_secs_f64();
    }

    // The depformer, one pass of every row per sub-step.
    let mut depformer_s = 0.0;
    for (g, st) in gens.iter_mut().zip(&steps) {
        if st.error.is_none() {
            g.rows_mut().for_each(LmRowState::depformer_reset);
        }
    }
    for k in 0..dep_q {
        let ta = Instant::now();
        {
            let mut rows = Vec::with_capacity(2 * gens.len());
            let mut prev = Vec::with_capacity(2 * gens.len());
            for (g, st) in gens.iter_mut().zip(&steps) {
                if st.error.is_none() {
                    for row in g.rows_mut() {
                        rows.push(row);
                        prev.push(st.frame[k]);
                    }
                }
            }
            let _span = tracing::trace_span!("lm_depformer", k, rows = rows.len()).entered();
            weights.step_depformer_rows(k, &mut rows, &prev, scratch);
        }
        depformer_s += ta.elapsed().as_secs_f64();
        for (g, st) in gens.iter_mut().zip(steps.iter_mut()) {
            if st.error.is_some() {
                continue;
            }
            let tb = Instant::now();
            let s = g.step;
            let logits = g.audio_logits();
            if let Err(e) = check_finite(logits, s, "audio") {
                st.error = Some(e);
                continue;
            }
            if record {
                st.audio_logits.push(logits.to_vec());
            }
            let sc = &g.sampling;
            let (greedy, temp, top_k) = (sc.greedy, sc.temp_audio, sc.top_k_audio);
            st.frame[k + 1] = sample_from(g, greedy, temp, top_k, Logits::Audio);
            st.sampling_s += tb.elapsed().as_secs_f64();
        }
    }

    gens.iter_mut()
        .zip(steps)
        .map(|(g, st)| match st.error {
            Some(e) => Err(e),
            None => Ok(g.finish_step(st, temporal_s, depformer_s, record)),
        })
        .collect()
}

/// Which logits [`sample_from`] samples.
enum Logits {
    Text,
    Audio,
}

/// Samples one token from `g`'s (already mixed) text or audio logits with `g`'s RNG.
fn sample_from(
    g: &mut Generator,
    greedy: bool,
    temperature: f32,
    top_k: usize,
    which: Logits,
) -> u32 {
    let logits = match (&g.guidance, which) {
        (Some(gd), Logits::Text) => &gd.text_logits,
        (Some(gd), Logits::Audio) => &gd.audio_logits,
        (None, Logits::Text) => g.model.row().text_logits(),
        (None, Logits::Audio) => g.model.row().depformer_logits(),
    };
    sample_token(
        logits,
        greedy,
        temperature,
        top_k,
        &mut g.rng,
        &mut g.scratch,
    )
}

impl Generator {
    /// Stores the sampled frame, advances the step and returns what the step returns.
    fn finish_step(
        &mut self,
        st: SessionStep,
        temporal_s: f64,
        depformer_s: f64,
        record: bool,
    ) -> StepDetails {
        let cfg = self.model.config();
        let (s, ring, max_delay) = (self.step, self.sampled.len(), cfg.max_delay());
        self.sampled[s % ring].copy_from_slice(&st.frame);
        let out = (s + 1 > max_delay).then(|| {
            let at = |k: usize| self.sampled[(s + cfg.delays[k] - max_delay) % ring][k];
            GeneratedFrame {
                text: at(0),
                audio: (1..=cfg.dep_q).map(at).collect(),
            }
        });
        self.step += 1;
        self.last_timings = StepTimings {
            temporal_ms: temporal_s * 1e3,
            depformer_ms: depformer_s * 1e3,
            sampling_ms: st.sampling_s * 1e3,
        };
        StepDetails {
            step: s,
            model_input: if record {
                self.input.clone()
            } else {
                Vec::new()
            },
            text_token: st.frame[0],
            audio_tokens: st.frame[1..].to_vec(),
            text_logits: st.text_logits,
            audio_logits: st.audio_logits,
            transformer_out: if record {
                self.model.transformer_out().to_vec()
            } else {
                Vec::new()
            },
            frame: out,
            timings: self.last_timings,
        }
    }
}

fn check_finite(logits: &[f32], step: usize, what: &'static str) -> Result<()> {
    if let Some(index) = logits.iter().position(|v| !v.is_finite()) {
        return Err(ModelError::NonFiniteLogits {
            what,
            step,
            index,
            value: logits[index],
        });
    }
    Ok(())
}
