//! Text to speech over a loaded TTS model ([`MoshiModel`] of `model_type` "tts"): one stream's
//! LM session (its voice, its state machine) and Mimi decoder. Text is pushed as entries (all at
//! once, or as it arrives), each [`TtsSpeaker::step`] runs one LM step when the text it may need
//! is there, and returns the frame and, once the audio has started (`delay_steps` frames in, as
//! `tts_pytorch.py` decodes `frames[delay_steps:]`), its 1920 samples decoded by Mimi.

use moshi_loader::voice::Voice;
use moshi_model::generator::{LmSession, LmSessionSettings, StepDetails, StepInput};
use moshi_model::lm::embedding::ZERO_TOKEN;
use moshi_model::mimi::Mimi;
use moshi_model::tts::machine::Entry;
use moshi_model::tts::{session_conditioning, speaker_condition, TtsSettings, TtsStream};

use crate::pipeline::{MoshiModel, SessionSettings};
use crate::Result;

/// One returned frame of a TTS stream.
#[derive(Clone, Debug, PartialEq)]
pub struct SpokenFrame {
    /// Index of the frame (the LM's returned frames, from 0).
    pub index: usize,
    /// The text token of the frame (muxed with the look-ahead stream).
    pub text: u32,
    /// The audio codes, `None` before the audio starts (the LM returns zero tokens there).
    pub audio: Option<Vec<u32>>,
    /// The frame's samples (24 kHz), clipped to [-1, 1]; with the audio.
    pub pcm: Option<Vec<f32>>,
}

/// One text-to-speech stream.
pub struct TtsSpeaker {
    lm: LmSession,
    mimi: Mimi,
    frames_out: usize,
}

impl TtsSpeaker {
    /// A stream of `model` (a TTS model) speaking with `voices` (the speaker slots, in order),
    /// guidance strength `cfg_coef` (the `cfg` condition of a distilled model).
    pub fn new(
        model: &MoshiModel,
        settings: &SessionSettings,
        tts: TtsSettings,
        voices: &[Voice],
        cfg_coef: f32,
    ) -> Result<Self> {
        let cfg = model.lm_config();
        let max_speakers = cfg.tts_config.as_ref().map_or(1, |t| t.max_speakers());
        let speakers = match model
            .generator()
            .weights()
            .conditions()
            .cross_conditioners()
        {
            [] => None,
            _ => Some(speaker_condition(voices, max_speakers)?),
        };
        let lm = model.generator().new_session(LmSessionSettings {
            sampling: settings.sampling.clone(),
            kv_precision: settings.kv_precision,
            conditioning: session_conditioning(cfg, cfg_coef, speakers)?,
            record_details: false,
            tts,
        })?;
        if lm.tts().is_none() {
            return Err(moshi_model::ModelError::BadScript {
                reason: format!(
                    "the model is {}, not a text-to-speech model (`model_type` \"tts\")",
                    model.conventions().name
                ),
            }
            .into());
        }
        let mut mimi = model.mimi_stream();
        mimi.reset();
        Ok(Self {
            lm,
            mimi,
            frames_out: 0,
        })
    }

    fn tts(&self) -> &TtsStream {
        self.lm.tts().expect("checked when made")
    }

    /// Queues words (and pauses) to say.
    pub fn push(&mut self, entries: impl IntoIterator<Item = Entry>) {
        let machine = self.lm.tts_mut().expect("checked when made").machine_mut();
        for e in entries {
            machine.push(e);
        }
    }

    /// No more text will come: the stream ends after the last word.
    pub fn finish_text(&mut self) {
        self.lm
            .tts_mut()
            .expect("checked when made")
            .machine_mut()
            .finish_text();
    }

    /// Whether a step may run (the text it may need is there, or the text is complete).
    pub fn is_ready(&self) -> bool {
        self.tts().is_ready()
    }

    /// Whether everything is generated.
    pub fn is_finished(&self) -> bool {
        self.tts().is_finished(self.lm.step_index())
    }

    /// The LM session (its state machine: words consumed and their steps).
    pub fn lm(&self) -> &LmSession {
        &self.lm
    }

    /// One step: the frame it returns (None while the LM's delays fill), decoded once the
    /// audio has started.
    pub fn step(&mut self, model: &MoshiModel) -> Result<Option<SpokenFrame>> {
        Self::step_together(model, &mut [self])
            .pop()
            .expect("one stream, one result")
    }

    /// One step of several streams of `model` together (one LM pass for all: the weights read
    /// once), each getting what it gets alone; a stream's error is its own.
    pub fn step_together(
        model: &MoshiModel,
        speakers: &mut [&mut TtsSpeaker],
    ) -> Vec<Result<Option<SpokenFrame>>> {
        let inputs = vec![StepInput::UserCodes(&[]); speakers.len()];
        let mut sessions: Vec<&mut LmSession> = speakers.iter_mut().map(|s| &mut s.lm).collect();
        let results = model.generator().step(&mut sessions, &inputs);
        speakers
            .iter_mut()
            .zip(results)
            .map(|(s, r)| s.finish_step(r?))
            .collect()
    }

    /// The frame of a step's details, decoded by this stream's Mimi once the audio has started.
    fn finish_step(&mut self, details: StepDetails) -> Result<Option<SpokenFrame>> {
        let Some(frame) = details.frame else {
            return Ok(None);
        };
        let index = self.frames_out;
        self.frames_out += 1;
        let audio = (!frame.audio.contains(&ZERO_TOKEN)).then_some(frame.audio);
        let pcm = match &audio {
            Some(codes) => {
                let mut pcm = self.mimi.decode_frame(codes)?;
                pcm.iter_mut().for_each(|x| *x = x.clamp(-1.0, 1.0));
                Some(pcm)
            }
            None => None,
        };
        Ok(Some(SpokenFrame {
            index,
            text: frame.text,
            audio,
            pcm,
        }))
    }
}
