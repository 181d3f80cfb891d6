//! The streaming generator (the official `LMGen` state machine): one frame of user codes in per
//! step, the 1 + n_q model inputs built with the config's delays and initial tokens, text and
//! Moshi's audio sampled, and (once the delays are filled) one frame returned per step:
//! `[text, audio_0 .. audio_{dep_q-1}]` with `stream k` taken from step `s - max_delay + delay_k`.
//!
//! A model without a depformer (`dep_q` 0, Kyutai's speech-to-text) samples only the text: the
//! step has no depformer pass and its frames no audio; the extra heads, where the model has
//! them, are read from the temporal output of every step ([`StepDetails::extra_heads`]).
//!
//! With classifier-free guidance (`LMGen(cfg_coef, condition_tensors)`, Hibiki) a second,
//! negatively conditioned row runs the temporal transformer and the depformer on the same tokens;
//! the text logits and each codebook's logits are mixed as `null + (cond - null) * cfg_coef`,
//! and the one sampled token is fed to both rows.
//!
//! The [`Generator`] is immutable and shared (`Arc` of the weights); each conversation is an
//! [`LmSession`] its caller owns. [`Generator::step`] steps any number of sessions together: one
//! temporal step and, per depformer sub-step, one pass for all their rows (a session with
//! guidance brings two), every linear layer one product over all rows, so the weights are read
//! once per frame whoever shares it. Each session keeps its own caches, position, delays, token
//! history, sampling settings and RNG; its tokens and logits have the bits it gets alone. One
//! session is a batch of one.

pub mod sampling;
mod session;

use std::sync::Arc;
use std::time::Instant;

use moshi_loader::{LmConfig, WeightMap};

use crate::kind::ModelKind;
use crate::lm::embedding::ZERO_TOKEN;
use crate::lm::{LmRowState, LmScratch, LmWeights, RandomWeightKind};
use crate::rng::Rng;
use crate::tts::TtsStream;
use crate::{ModelError, Result};
use sampling::sample_token;
pub use sampling::SamplingConfig;
use session::Guidance;
pub use session::{Conditioning, LmSession, LmSessionSettings};

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

/// What one session's step gave. `model_input`, the logits and `transformer_out` are kept only
/// for a session made with [`LmSessionSettings::record_details`] (else empty).
#[derive(Clone, Debug, PartialEq)]
pub struct StepDetails {
    /// Step index (0-based).
    pub step: usize,
    /// The 1 + n_q tokens embedded by the temporal transformer.
    pub model_input: Vec<u32>,
    /// Text token of this step's frame: the one sampled, or for a text-to-speech model the one
    /// its state machine feeds (muxed with the second stream).
    pub text_token: u32,
    /// Text token sampled at this step (before a TTS state machine's decision).
    pub text_sampled: u32,
    /// Audio tokens sampled at this step (`dep_q`).
    pub audio_tokens: Vec<u32>,
    /// `[text_card]`.
    pub text_logits: Vec<f32>,
    /// `[dep_q][card]`.
    pub audio_logits: Vec<Vec<f32>>,
    /// `[dim]`, after out_norm.
    pub transformer_out: Vec<f32>,
    /// The extra heads' softmax outputs of this step, `[head][extra_heads_dim]` (empty for a
    /// model without extra heads), as `LMGen.step_with_extra_heads` returns them.
    pub extra_heads: Vec<Vec<f32>>,
    /// The frame this step returns (None while the delays fill).
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

/// The generator of one model: immutable, shared by every session (a clone shares the weights).
#[derive(Clone, Debug)]
pub struct Generator {
    weights: Arc<LmWeights>,
}

impl Generator {
    pub fn new(weights: Arc<LmWeights>) -> Self {
        Self { weights }
    }

    /// Builds the model from canonically named weights ([`LmWeights::load`]).
    pub fn load(cfg: &LmConfig, weights: WeightMap) -> Result<Self> {
        Ok(Self::new(Arc::new(LmWeights::load(cfg, weights)?)))
    }

    /// A model of `cfg`'s shapes with deterministic random weights (benchmarks and tests).
    pub fn random(cfg: &LmConfig, seed: u64, kind: RandomWeightKind) -> Result<Self> {
        Ok(Self::new(Arc::new(LmWeights::random(cfg, seed, kind)?)))
    }

    pub fn weights(&self) -> &Arc<LmWeights> {
        &self.weights
    }

    pub fn config(&self) -> &LmConfig {
        self.weights.config()
    }

    /// The model type and its conventions.
    pub fn kind(&self) -> ModelKind {
        self.weights.kind()
    }

    /// Whether a text token is shown to the user: not PAD, not EPAD, not the initial token.
    pub fn text_is_printable(&self, id: u32) -> bool {
        let cfg = self.config();
        id != cfg.existing_text_padding_id
            && id != cfg.existing_text_end_padding_id
            && (id as usize) < cfg.text_card
    }

    /// A new conversation at step 0. Errors on settings the model cannot take: a temperature
    /// that is not a finite number >= 0, a condition the model does not know, guidance for a
    /// model without conditioners (both rows would be the same), or a guidance coefficient that
    /// is not a positive number.
    pub fn new_session(&self, settings: LmSessionSettings) -> Result<LmSession> {
        settings.sampling.validate()?;
        let cond = &settings.conditioning;
        let cfg_coef = cond.cfg_coef;
        if !(cfg_coef.is_finite() && cfg_coef > 0.0) {
            return Err(ModelError::BadGuidance {
                cfg_coef,
                reason: "expected a positive number (1 = no guidance)",
            });
        }
        let precision = settings.kv_precision;
        let guidance = if cond.is_guided() {
            if self.weights.conditions().is_empty() {
                return Err(ModelError::BadGuidance {
                    cfg_coef,
                    reason: "guidance needs a conditioned model (Hibiki); this one has no \
                             conditioners (use a coefficient of 1)",
                });
            }
            if !cond.tensors.is_empty() {
                return Err(ModelError::BadGuidance {
                    cfg_coef,
                    reason: "guidance of a model conditioned on tensors (a TTS voice) is not \
                             implemented: Kyutai's TTS takes its guidance strength as the `cfg` \
                             condition (use a coefficient of 1)",
                });
            }
            let negative = Conditioning::borrowed(&cond.negative);
            Some(Guidance {
                null_row: self.weights.new_row(&negative, precision)?,
                text_logits: vec![0.0; self.config().text_card],
                audio_logits: vec![0.0; self.config().card],
            })
        } else {
            None
        };
        let tensors: Vec<(&str, &Arc<crate::lm::conditioner::TensorCondition>)> =
            cond.tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let row = self.weights.new_row_with_tensors(
            &Conditioning::borrowed(&cond.values),
            &tensors,
            precision,
        )?;
        let cfg = self.config();
        let tts = (self.kind() == ModelKind::TextToSpeech)
            .then(|| TtsStream::new(cfg, settings.tts))
            .transpose()?;
        let ring = cfg.max_delay() + 1;
        Ok(LmSession {
            weights_id: self.weights.id(),
            rng: Rng::new(settings.sampling.seed),
            settings,
            row,
            guidance,
            tts,
            step: 0,
            sampled: vec![vec![0; cfg.dep_q + 1]; ring],
            user: vec![vec![0; cfg.user_codebooks()]; ring],
            input: vec![0; cfg.n_q + 1],
            sampler: Default::default(),
            scratch: LmScratch::default(),
            last_timings: StepTimings::default(),
        })
    }

    /// One step of `sessions` together, session `i` fed `inputs[i]`: the result of each is what
    /// it gets stepping alone, bit for bit, and the frame the official `LMGen.step` returns
    /// (None while the delays fill, i.e. for the first `max_delay` steps). A session's error (a
    /// bad input, non-finite logits, a session of other weights) is its own and leaves the
    /// others stepping.
    ///
    /// # Panics
    /// If `inputs` and `sessions` differ in length (caller bug).
    pub fn step(
        &self,
        sessions: &mut [&mut LmSession],
        inputs: &[StepInput<'_>],
    ) -> Vec<Result<StepDetails>> {
        assert_eq!(sessions.len(), inputs.len(), "one input per session");
        let Some(first) = sessions.first_mut() else {
            return Vec::new();
        };
        let mut scratch = std::mem::take(&mut first.scratch);
        let mut steps: Vec<SessionStep> = sessions
            .iter_mut()
            .zip(inputs)
            .map(|(s, &input)| {
                let prepared = self.prepare(s, input);
                SessionStep::new(prepared, self.config().dep_q, s)
            })
            .collect();
        let temporal_s = self.temporal_pass(sessions, &steps, &mut scratch);
        sample_each(sessions, &mut steps, Stream::Text);
        apply_text_hooks(sessions, &mut steps);
        let mut depformer_s = 0.0;
        for (s, _) in sessions
            .iter_mut()
            .zip(&steps)
            .filter(|(_, st)| st.in_depformer())
        {
            s.rows_mut().for_each(LmRowState::depformer_reset);
        }
        for k in 0..self.config().dep_q {
            if !steps.iter().any(|st| st.makes_codebook(k)) {
                continue;
            }
            depformer_s += self.depformer_pass(k, sessions, &steps, &mut scratch);
            sample_each(sessions, &mut steps, Stream::Audio(k));
        }
        apply_audio_hooks(sessions, &mut steps);
        sessions[0].scratch = scratch;
        sessions
            .iter_mut()
            .zip(steps)
            .map(|(s, st)| self.finish(s, st, temporal_s, depformer_s))
            .collect()
    }

    /// Checks `input` and the session, stores the user frame and builds this step's `1 + n_q`
    /// model inputs (stream i with delay d takes its initial token while s <= d; generated
    /// streams then read the token sampled at s - 1, user streams the frame fed at s - d).
    fn prepare(&self, session: &mut LmSession, input: StepInput<'_>) -> Result<()> {
        if session.weights_id != self.weights.id() {
            return Err(ModelError::BatchWeightsDiffer);
        }
        let cfg = self.config();
        let (dep_q, card, s) = (cfg.dep_q, cfg.card, session.step);
        let ring = session.sampled.len();
        match input {
            StepInput::UserCodes(codes) => {
                check_user_codes(cfg, codes)?;
                session.user[s % ring].copy_from_slice(codes);
            }
            StepInput::EndOfInput => session.user[s % ring].fill(card as u32),
        }
        for (i, inp) in session.input.iter_mut().enumerate() {
            let d = cfg.delays[i];
            *inp = if s <= d {
                if i == 0 {
                    cfg.text_card as u32
                } else {
                    card as u32
                }
            } else if i <= dep_q {
                session.sampled[(s - 1) % ring][i]
            } else {
                session.user[(s - d) % ring][i - dep_q - 1]
            };
        }
        self.weights.check_step_tokens(&session.input)
    }

    /// The temporal transformer on every row of the sessions still stepping; its seconds.
    fn temporal_pass(
        &self,
        sessions: &mut [&mut LmSession],
        steps: &[SessionStep],
        scratch: &mut LmScratch,
    ) -> f64 {
        let t0 = Instant::now();
        let mut tokens = Vec::with_capacity(2 * sessions.len() * (self.config().n_q + 1));
        let mut rows = stepping_rows(
            sessions,
            steps,
            &SessionStep::is_ok,
            &mut tokens,
            |s, _, t| t.extend_from_slice(&s.input),
        );
        let _span = tracing::trace_span!("lm_temporal", rows = rows.len()).entered();
        self.weights.step_temporal_rows(&mut rows, &tokens, scratch);
        t0.elapsed().as_secs_f64()
    }

    /// Depformer sub-step `k` of every row of the sessions still stepping; its seconds.
    fn depformer_pass(
        &self,
        k: usize,
        sessions: &mut [&mut LmSession],
        steps: &[SessionStep],
        scratch: &mut LmScratch,
    ) -> f64 {
        let t0 = Instant::now();
        let mut prev = Vec::with_capacity(2 * sessions.len());
        let mut rows = stepping_rows(
            sessions,
            steps,
            &|st: &SessionStep| st.makes_codebook(k),
            &mut prev,
            |_, st, t| t.push(st.frame[k]),
        );
        let _span = tracing::trace_span!("lm_depformer", k, rows = rows.len()).entered();
        self.weights
            .step_depformer_rows(k, &mut rows, &prev, scratch);
        t0.elapsed().as_secs_f64()
    }

    /// Stores the sampled frame, advances the session and returns what its step gave.
    fn finish(
        &self,
        session: &mut LmSession,
        st: SessionStep,
        temporal_s: f64,
        depformer_s: f64,
    ) -> Result<StepDetails> {
        if let Some(e) = st.error {
            return Err(e);
        }
        let cfg = self.config();
        let (s, ring, max_delay) = (session.step, session.sampled.len(), cfg.max_delay());
        session.sampled[s % ring].copy_from_slice(&st.frame);
        let frame = (s + 1 > max_delay).then(|| {
            let at = |k: usize| session.sampled[(s + cfg.delays[k] - max_delay) % ring][k];
            GeneratedFrame {
                text: at(0),
                audio: (1..=cfg.dep_q).map(at).collect(),
            }
        });
        session.step += 1;
        session.last_timings = StepTimings {
            temporal_ms: temporal_s * 1e3,
            depformer_ms: depformer_s * 1e3,
            sampling_ms: st.sampling_s * 1e3,
        };
        let record = session.settings.record_details;
        Ok(StepDetails {
            step: s,
            model_input: if record {
                session.input.clone()
            } else {
                Vec::new()
            },
            text_token: st.frame[0],
            text_sampled: st.text_sampled,
            audio_tokens: st.frame[1..].to_vec(),
            text_logits: st.text_logits,
            audio_logits: st.audio_logits,
            transformer_out: if record {
                session.row.transformer_out().to_vec()
            } else {
                Vec::new()
            },
            extra_heads: self.weights.extra_heads_of(&session.row),
            frame,
            timings: session.last_timings,
        })
    }
}

/// What one session of a batched step has sampled so far.
struct SessionStep {
    /// `[text, audio_0 .. audio_{dep_q-1}]`.
    frame: Vec<u32>,
    /// The text token sampled (before a TTS machine's decision).
    text_sampled: u32,
    /// Whether the depformer runs for this session (a TTS session not before its audio starts).
    runs_depformer: bool,
    /// Audio codebooks the depformer makes for this session (all `dep_q`, or a TTS's `n_q`).
    codebooks: usize,
    text_logits: Vec<f32>,
    audio_logits: Vec<Vec<f32>>,
    sampling_s: f64,
    error: Option<ModelError>,
}

impl SessionStep {
    fn new(prepared: Result<()>, dep_q: usize, session: &LmSession) -> Self {
        let runs_depformer = session
            .tts
            .as_ref()
            .is_none_or(|t| t.runs_depformer(session.step));
        let codebooks = session.tts.as_ref().map_or(dep_q, TtsStream::codebooks);
        // Audio the depformer does not make is zero (`depformer_replace_tokens`; a TTS's
        // codebooks past its `n_q`).
        let mut frame = vec![ZERO_TOKEN; dep_q + 1];
        if runs_depformer {
            frame[..=codebooks].fill(0);
        }
        Self {
            frame,
            text_sampled: 0,
            runs_depformer,
            codebooks,
            text_logits: Vec::new(),
            audio_logits: Vec::new(),
            sampling_s: 0.0,
            error: prepared.err(),
        }
    }

    /// Whether the session is still stepping (no error so far).
    fn is_ok(&self) -> bool {
        self.error.is_none()
    }

    /// Whether the session is still stepping and runs the depformer.
    fn in_depformer(&self) -> bool {
        self.is_ok() && self.runs_depformer
    }

    /// Whether the depformer makes audio codebook `k` for the session at this step.
    fn makes_codebook(&self, k: usize) -> bool {
        self.in_depformer() && k < self.codebooks
    }
}

/// The TTS sessions' text: the sampled token kept, the frame's text replaced by what the state
/// machine feeds (before the depformer, which reads it, as `LMGen`'s `on_text_hook`).
fn apply_text_hooks(sessions: &mut [&mut LmSession], steps: &mut [SessionStep]) {
    for (s, st) in sessions.iter_mut().zip(steps.iter_mut()) {
        st.text_sampled = st.frame[0];
        let step = s.step;
        if let (Some(tts), true) = (s.tts.as_mut(), st.is_ok()) {
            st.frame[0] = tts.text_hook(step, st.frame[0]);
        }
    }
}

/// The TTS sessions' audio: tokens still inside their delay zeroed (`on_audio_hook`).
fn apply_audio_hooks(sessions: &mut [&mut LmSession], steps: &mut [SessionStep]) {
    for (s, st) in sessions.iter_mut().zip(steps.iter_mut()) {
        if let (Some(tts), true) = (s.tts.as_ref(), st.is_ok()) {
            tts.audio_hook(s.step, &mut st.frame[1..]);
        }
    }
}

/// The rows of the sessions still stepping (a session with guidance brings two), and for each
/// row the tokens `tokens_of` appends for its session.
fn stepping_rows<'a>(
    sessions: &'a mut [&mut LmSession],
    steps: &'a [SessionStep],
    takes_part: &dyn Fn(&SessionStep) -> bool,
    tokens: &mut Vec<u32>,
    tokens_of: impl Fn(&LmSession, &SessionStep, &mut Vec<u32>),
) -> Vec<&'a mut LmRowState> {
    let mut rows = Vec::with_capacity(2 * sessions.len());
    for (s, st) in sessions
        .iter_mut()
        .zip(steps)
        .filter(|(_, st)| takes_part(st))
    {
        for _ in 0..s.rows_per_step() {
            tokens_of(s, st, tokens);
        }
        rows.extend(s.rows_mut());
    }
    rows
}

/// Which stream a sampling pass samples.
#[derive(Clone, Copy)]
enum Stream {
    Text,
    /// Audio codebook `k` (after depformer sub-step `k`).
    Audio(usize),
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Text => "text",
            Stream::Audio(_) => "audio",
        }
    }

    /// Where the sampled token goes in the frame `[text, audio..]`.
    fn frame_index(self) -> usize {
        match self {
            Stream::Text => 0,
            Stream::Audio(k) => k + 1,
        }
    }

    /// A row's own logits of this stream.
    fn logits_of(self, row: &LmRowState) -> &[f32] {
        match self {
            Stream::Text => row.text_logits(),
            Stream::Audio(_) => row.depformer_logits(),
        }
    }
}

/// Samples `stream` for every session still stepping (audio: that runs the depformer); a
/// session whose logits are not finite fails alone.
fn sample_each(sessions: &mut [&mut LmSession], steps: &mut [SessionStep], stream: Stream) {
    for (s, st) in sessions.iter_mut().zip(steps.iter_mut()) {
        let takes_part = match stream {
            Stream::Text => st.is_ok(),
            Stream::Audio(k) => st.makes_codebook(k),
        };
        if !takes_part {
            continue;
        }
        let t0 = Instant::now();
        match sample_one(s, st, stream) {
            Ok(token) => st.frame[stream.frame_index()] = token,
            Err(e) => st.error = Some(e),
        }
        st.sampling_s += t0.elapsed().as_secs_f64();
    }
}

/// One session's token of `stream`: its logits (mixed with guidance as `LMGen` mixes them,
/// `null + (cond - null) * cfg_coef` elementwise in f32), checked, recorded if asked, sampled
/// with its settings and RNG.
fn sample_one(session: &mut LmSession, st: &mut SessionStep, stream: Stream) -> Result<u32> {
    let LmSession {
        settings,
        row,
        guidance,
        rng,
        sampler,
        step,
        tts,
        ..
    } = session;
    let mut logits: &[f32] = match guidance {
        Some(g) => {
            let mixed = match stream {
                Stream::Text => &mut g.text_logits,
                Stream::Audio(_) => &mut g.audio_logits,
            };
            let null = stream.logits_of(&g.null_row);
            let cfg_coef = settings.conditioning.cfg_coef;
            for ((m, &c), &n) in mixed.iter_mut().zip(stream.logits_of(row)).zip(null) {
                *m = n + (c - n) * cfg_coef;
            }
            mixed
        }
        None => stream.logits_of(row),
    };
    let with_bonus;
    if let (Stream::Text, Some(tts)) = (stream, tts.as_ref()) {
        if tts.settings().padding_bonus != 0.0 {
            let mut l = logits.to_vec();
            tts.text_logits_hook(&mut l);
            with_bonus = l;
            logits = &with_bonus;
        }
    }
    check_finite(logits, *step, stream.name())?;
    if settings.record_details {
        match stream {
            Stream::Text => st.text_logits = logits.to_vec(),
            Stream::Audio(_) => st.audio_logits.push(logits.to_vec()),
        }
    }
    let sc = &settings.sampling;
    let (temp, top_k) = match stream {
        Stream::Text => (sc.temp_text, sc.top_k_text),
        Stream::Audio(_) => (sc.temp_audio, sc.top_k_audio),
    };
    Ok(sample_token(logits, sc.greedy, temp, top_k, rng, sampler))
}

fn check_user_codes(cfg: &LmConfig, user_codes: &[u32]) -> Result<()> {
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
        .find(|(_, &c)| c as usize >= cfg.card)
    {
        return Err(ModelError::TokenOutOfRange {
            what: "user code",
            value: c,
            at: format!(" of codebook {i}"),
            max: cfg.card - 1,
            note: ": card - 1",
        });
    }
    Ok(())
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
