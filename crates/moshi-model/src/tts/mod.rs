//! Kyutai's text-to-speech (`moshi/models/tts.py` `TTSModel.generate`, moshi-server's TTS
//! service): the text is an input the [`machine::TtsMachine`] feeds word by word as the model
//! asks for words; the audio runs `delay_steps` behind it. A TTS session's [`TtsStream`] is
//! what the generator consults at each step: the fed text for the sampled one, whether the
//! depformer runs (not before `delay_steps`: the audio is all zero there), which audio tokens
//! are zeroed (those still inside their delay), and when the stream is done.

pub mod machine;
pub mod script;

use std::sync::Arc;

use moshi_loader::voice::Voice;
use moshi_loader::LmConfig;

use crate::generator::Conditioning;
use crate::kind::ModelKind;
use crate::lm::conditioner::TensorCondition;
use crate::lm::embedding::ZERO_TOKEN;
use crate::{ModelError, Result};
use machine::{MachineParams, TtsMachine};

/// The tensor conditioner of the speaker embeddings.
pub const SPEAKER_CONDITIONER: &str = "speaker_wavs";
/// The LUT conditioner of a CFG-distilled model's guidance strength.
pub const CFG_CONDITIONER: &str = "cfg";

/// The `speaker_wavs` condition of `voices` (Kyutai's `make_condition_attributes`): `max_speakers`
/// slots of the first voice's length, voice `i` in slot `i`, the others empty (their positions
/// take the learnt padding).
pub fn speaker_condition(voices: &[Voice], max_speakers: usize) -> Result<TensorCondition> {
    let first = voices.first().ok_or_else(|| ModelError::BadScript {
        reason: "a voice is needed (the model is conditioned on a speaker)".into(),
    })?;
    if voices.len() > max_speakers {
        return Err(ModelError::BadScript {
            reason: format!(
                "{} voices given, the model takes at most {max_speakers}",
                voices.len()
            ),
        });
    }
    let (frames, dim) = (first.frames, first.dim);
    if let Some(v) = voices.iter().find(|v| (v.frames, v.dim) != (frames, dim)) {
        return Err(ModelError::BadScript {
            reason: format!(
                "voice {} has {} frames of {}, the first {} of {}: voices must have one shape",
                v.path.display(),
                v.frames,
                v.dim,
                frames,
                dim
            ),
        });
    }
    let mut values = vec![0f32; max_speakers * frames * dim];
    let mut mask = vec![false; max_speakers * frames];
    for (i, v) in voices.iter().enumerate() {
        values[i * frames * dim..(i + 1) * frames * dim].copy_from_slice(&v.values);
        mask[i * frames..(i + 1) * frames].fill(true);
    }
    Ok(TensorCondition { values, mask, dim })
}

/// What a session of the TTS model `cfg` is conditioned on: its conventions' conditions, the
/// guidance strength `cfg_coef` as the `cfg` condition (a CFG-distilled model, Kyutai's release:
/// one of the values it was trained with, shown as `"{:.1}"`), and the speakers (sessions given
/// the same `Arc` share its cross-attention keys and values).
pub fn session_conditioning(
    cfg: &LmConfig,
    cfg_coef: f32,
    speakers: Option<Arc<TensorCondition>>,
) -> Result<Conditioning> {
    let conventions = ModelKind::TextToSpeech.conventions();
    let mut conditioning = Conditioning::new(conventions.conditions, &[], 1.0);
    if let Some(lut) = cfg.conditioners.get(CFG_CONDITIONER).and_then(|c| c.lut()) {
        let values = lut.possible_values.clone().unwrap_or_default();
        let value = values
            .iter()
            .find(|v| v.parse::<f32>().is_ok_and(|x| x == cfg_coef))
            .ok_or(ModelError::BadGuidance {
                cfg_coef,
                reason: "this TTS model was trained with CFG distillation: the coefficient \
                         must be one of its `cfg` condition's values",
            })?;
        conditioning
            .values
            .push((CFG_CONDITIONER.to_string(), value.clone()));
    } else if cfg_coef != 1.0 {
        return Err(ModelError::BadGuidance {
            cfg_coef,
            reason: "guidance of a TTS model without a `cfg` condition is not implemented (use 1)",
        });
    }
    if let Some(s) = speakers {
        conditioning
            .tensors
            .push((SPEAKER_CONDITIONER.to_string(), s));
    }
    Ok(conditioning)
}

/// A TTS session's settings (Kyutai's `TTSModel` / moshi-server defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TtsSettings {
    /// Longest run of PAD the model may choose before a WORD is forced.
    pub max_padding: usize,
    /// PAD forced before the first word.
    pub initial_padding: usize,
    /// Steps generated after the text's end has entered the audio.
    pub final_padding: usize,
    /// Added to the PAD logit before sampling (positive: slower speech).
    pub padding_bonus: f32,
    /// Audio codebooks generated (Kyutai's `TTSModel(n_q)`; moshi-server deploys 24 of the
    /// release's 32): the others are fed Kyutai's zero token and the audio is decoded from
    /// these. `None`: every codebook (`dep_q`).
    pub n_q: Option<usize>,
}

impl Default for TtsSettings {
    fn default() -> Self {
        Self {
            max_padding: 8,
            initial_padding: 2,
            final_padding: 4,
            padding_bonus: 0.0,
            n_q: None,
        }
    }
}

/// One TTS session's text state and the hooks the generator applies at each step.
#[derive(Clone, Debug)]
pub struct TtsStream {
    machine: TtsMachine,
    settings: TtsSettings,
    delay_steps: usize,
    /// The model's delays of the audio codebooks (`delays[1..]`).
    audio_delays: Vec<usize>,
    pad: u32,
    /// Audio codebooks generated ([`TtsSettings::n_q`], checked).
    codebooks: usize,
}

impl TtsStream {
    /// A stream for a TTS model of `cfg` (checked by `LmConfig::validate`: `tts_config`);
    /// an error for an `n_q` the model cannot generate.
    pub fn new(cfg: &LmConfig, settings: TtsSettings) -> Result<Self> {
        let tts = cfg.tts_config.clone().unwrap_or_default();
        let pad = cfg.existing_text_padding_id;
        let codebooks = settings.n_q.unwrap_or(cfg.dep_q);
        if !(1..=cfg.dep_q).contains(&codebooks) {
            return Err(ModelError::BadScript {
                reason: format!(
                    "n_q {codebooks}: the model generates 1 to {} audio codebooks",
                    cfg.dep_q
                ),
            });
        }
        Ok(Self {
            machine: TtsMachine::new(MachineParams {
                mux_card: cfg.mux_card() as u32,
                pad,
                second_stream_ahead: tts.second_stream_ahead,
                max_padding: settings.max_padding,
                initial_padding: settings.initial_padding,
            }),
            settings,
            delay_steps: tts.delay_steps(),
            audio_delays: cfg.delays[1..].to_vec(),
            pad,
            codebooks,
        })
    }

    /// Audio codebooks generated and decoded ([`TtsSettings::n_q`]).
    pub fn codebooks(&self) -> usize {
        self.codebooks
    }

    pub fn machine(&self) -> &TtsMachine {
        &self.machine
    }

    pub fn machine_mut(&mut self) -> &mut TtsMachine {
        &mut self.machine
    }

    pub fn settings(&self) -> &TtsSettings {
        &self.settings
    }

    /// Steps the audio runs behind the text.
    pub fn delay_steps(&self) -> usize {
        self.delay_steps
    }

    /// The text fed for the token sampled at `step` (the machine's decision).
    pub fn text_hook(&mut self, step: usize, sampled: u32) -> u32 {
        self.machine.process(step, sampled).0
    }

    /// Whether the depformer runs at `step`: not while the audio is all zero.
    pub fn runs_depformer(&self, step: usize) -> bool {
        step >= self.delay_steps
    }

    /// Zeroes the audio tokens of `step` still inside their delay (codebook q while `step <
    /// delay_steps + delays[q + 1]`).
    pub fn audio_hook(&self, step: usize, audio: &mut [u32]) {
        for (a, &d) in audio.iter_mut().zip(&self.audio_delays) {
            if step < self.delay_steps + d {
                *a = ZERO_TOKEN;
            }
        }
    }

    /// Adds the padding bonus to the PAD logit.
    pub fn text_logits_hook(&self, logits: &mut [f32]) {
        if let Some(l) = logits.get_mut(self.pad as usize) {
            *l += self.settings.padding_bonus;
        }
    }

    /// Whether the stream has generated everything at `step` (the text is complete, its end
    /// reached, and `delay_steps + final_padding` steps run since).
    pub fn is_finished(&self, step: usize) -> bool {
        self.machine.is_text_complete()
            && self
                .machine
                .end_step()
                .is_some_and(|end| step >= end + self.delay_steps + self.settings.final_padding)
    }

    /// Whether a step may run now (the text it may need has arrived, or is complete).
    pub fn is_ready(&self) -> bool {
        self.machine.is_ready()
    }
}
