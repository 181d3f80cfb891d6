//! The streaming generator (the official `LMGen` state machine): one frame of user codes in per
//! step, the 1 + n_q model inputs built with the config's delays and initial tokens, text and
//! Moshi's audio sampled, and (once the delays are filled) one frame returned per step:
//! `[text, audio_0 .. audio_{dep_q-1}]` with `stream k` taken from step `s - max_delay + delay_k`.
//!
//! With classifier-free guidance (`LMGen(cfg_coef, condition_tensors)`, Hibiki) a second,
//! negatively conditioned row runs the temporal transformer and the depformer on the same tokens;
//! the text logits and each codebook's logits are mixed as `null + (cond - null) * cfg_coef`,
//! and the one sampled token is fed to both rows.

pub mod sampling;

use std::time::Instant;

use crate::lm::{LmModel, LmRowState};
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
        if precision != self.model.temporal().kv_precision() {
            self.model.set_kv_precision(precision);
            if let Some(g) = &mut self.guidance {
                self.model.swap_row(&mut g.null_row);
                self.model.set_kv_precision(precision);
                self.model.swap_row(&mut g.null_row);
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

    /// Back to step 0 (model caches emptied, RNG re-seeded).
    pub fn reset(&mut self) {
        self.model.reset();
        if let Some(g) = &mut self.guidance {
            self.model.swap_row(&mut g.null_row);
            self.model.reset();
            self.model.swap_row(&mut g.null_row);
        }
        self.rng = Rng::new(self.sampling.seed);
        self.step = 0;
    }

    /// Feeds one frame of user codes (`n_q - dep_q` codes, each `< card`); returns the frame
    /// the official `LMGen.step` returns (None while the delays fill, i.e. for the first
    /// `max_delay` steps).
    pub fn step(&mut self, user_codes: &[u32]) -> Result<Option<GeneratedFrame>> {
        self.check_user_codes(user_codes)?;
        Ok(self.run_step(user_codes, false)?.frame)
    }

    /// [`Generator::step`] with the model inputs, sampled tokens, logits and timings.
    pub fn step_detailed(&mut self, user_codes: &[u32]) -> Result<StepDetails> {
        self.check_user_codes(user_codes)?;
        self.run_step(user_codes, true)
    }

    /// Feeds the end-of-stream frame of a translation model (Hibiki): every user code equal to
    /// `card` (`moshi/run_inference.py` after the last input frame). Then feed silence.
    pub fn step_end_of_input(&mut self) -> Result<Option<GeneratedFrame>> {
        Ok(self.step_end_of_input_detailed()?.frame)
    }

    /// [`Generator::step_end_of_input`] with details.
    pub fn step_end_of_input_detailed(&mut self) -> Result<StepDetails> {
        let cfg = self.model.config();
        let codes = vec![cfg.card as u32; cfg.user_codebooks()];
        self.run_step(&codes, true)
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

    /// The temporal step of both rows (with guidance): leaves the text logits to sample in
    /// the guidance buffer, else in the model.
    fn temporal_step(&mut self) -> Result<()> {
        let s = self.step;
        tracing::trace_span!("lm_temporal", step = s)
            .in_scope(|| self.model.forward_text(&self.input))?;
        if let Some(g) = &mut self.guidance {
            g.text_logits.copy_from_slice(self.model.text_logits());
            self.model.swap_row(&mut g.null_row);
            let null = tracing::trace_span!("lm_temporal_null", step = s)
                .in_scope(|| self.model.forward_text(&self.input));
            Guidance::mix(g.cfg_coef, &mut g.text_logits, self.model.text_logits());
            self.model.swap_row(&mut g.null_row);
            null?;
        }
        Ok(())
    }

    /// Depformer sub-step `k` of both rows (with guidance): leaves the logits to sample in the
    /// guidance buffer, else in the model.
    fn depformer_substep(&mut self, k: usize, prev: u32) -> Result<()> {
        let cond = tracing::trace_span!("lm_depformer", k)
            .in_scope(|| self.model.depformer_step(k, prev))?;
        let Some(g) = &mut self.guidance else {
            return Ok(());
        };
        g.audio_logits.copy_from_slice(cond);
        self.model.swap_row(&mut g.null_row);
        let null = tracing::trace_span!("lm_depformer_null", k)
            .in_scope(|| self.model.depformer_step(k, prev))
            .map(|null| Guidance::mix(g.cfg_coef, &mut g.audio_logits, null));
        self.model.swap_row(&mut g.null_row);
        null
    }

    fn depformer_reset(&mut self) {
        self.model.depformer_reset();
        if let Some(g) = &mut self.guidance {
            self.model.swap_row(&mut g.null_row);
            self.model.depformer_reset();
            self.model.swap_row(&mut g.null_row);
        }
    }

    /// One step on `user_codes` (already checked; `card` allowed for the end of the input).
    fn run_step(&mut self, user_codes: &[u32], record: bool) -> Result<StepDetails> {
        // Public fields: checked where they are used (two comparisons per step).
        self.sampling.validate()?;
        let cfg = self.model.config();
        let (dep_q, card, s) = (cfg.dep_q, cfg.card, self.step);
        let ring = self.sampled.len();
        self.user[s % ring].copy_from_slice(user_codes);

        // Inputs: stream i with delay d takes its initial token while s <= d; generated streams
        // then read the token sampled at s - 1, user streams the frame fed at s - d.
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

        let t0 = Instant::now();
        self.temporal_step()?;
        let t1 = Instant::now();
        let text_logits = match &self.guidance {
            Some(g) => &g.text_logits,
            None => self.model.text_logits(),
        };
        check_finite(text_logits, s, "text")?;
        let recorded_text_logits = if record {
            text_logits.to_vec()
        } else {
            Vec::new()
        };
        let sc = &self.sampling;
        let text = sample_token(
            text_logits,
            sc.greedy,
            sc.temp_text,
            sc.top_k_text,
            &mut self.rng,
            &mut self.scratch,
        );
        let mut sampling_s = t1.elapsed().as_secs_f64();
        let mut depformer_s = 0.0;
        let mut audio_logits = Vec::new();
        let mut frame = vec![0u32; dep_q + 1];
        frame[0] = text;
        self.depformer_reset();
        let mut prev = text;
        for k in 0..dep_q {
            let ta = Instant::now();
            self.depformer_substep(k, prev)?;
            let tb = Instant::now();
            depformer_s += (tb - ta).as_secs_f64();
            let logits = match &self.guidance {
                Some(g) => &g.audio_logits,
                None => self.model.depformer_logits(),
            };
            check_finite(logits, s, "audio")?;
            if record {
                audio_logits.push(logits.to_vec());
            }
            let sc = &self.sampling;
            prev = sample_token(
                logits,
                sc.greedy,
                sc.temp_audio,
                sc.top_k_audio,
                &mut self.rng,
                &mut self.scratch,
            );
            frame[k + 1] = prev;
            sampling_s += tb.elapsed().as_secs_f64();
        }
        self.sampled[s % ring].copy_from_slice(&frame);

        let cfg = self.model.config();
        let max_delay = cfg.max_delay();
        let out = (s + 1 > max_delay).then(|| {
            let at = |k: usize| self.sampled[(s + cfg.delays[k] - max_delay) % ring][k];
            GeneratedFrame {
                text: at(0),
                audio: (1..=dep_q).map(at).collect(),
            }
        });
        self.step += 1;
        self.last_timings = StepTimings {
            temporal_ms: (t1 - t0).as_secs_f64() * 1e3,
            depformer_ms: depformer_s * 1e3,
            sampling_ms: sampling_s * 1e3,
        };
        Ok(StepDetails {
            step: s,
            model_input: if record {
                self.input.clone()
            } else {
                Vec::new()
            },
            text_token: text,
            audio_tokens: frame[1..].to_vec(),
            text_logits: recorded_text_logits,
            audio_logits,
            transformer_out: if record {
                self.model.transformer_out().to_vec()
            } else {
                Vec::new()
            },
            frame: out,
            timings: self.last_timings,
        })
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
