//! A recording transcribed by a speech-to-text model, fed as Kyutai's
//! `delayed-streams-modeling` `stt_from_file_pytorch.py` feeds it (the model type's
//! [`Conventions`](moshi_model::kind::Conventions)): `stt_config`'s silence prefix, the audio
//! zero-padded to whole frames (open the file with [`PartialFrame::Pad`](crate::wav_frames::PartialFrame)),
//! then silence for the text's delay; one LM step per frame. The words and their times come from
//! [`WordTimer`] as the text's word boundaries arrive. The audio is read one frame at a time and
//! the words are handed over as they complete, so memory stays flat however long the recording.
//!
//! [`SttStream`] is that feeding and word timing step by step, wherever the steps run: here for
//! a file ([`transcribe_frames`]), and for live captions the silence prefix here, the
//! microphone's frames on the real-time engine's thread (their outputs handed over as the
//! engine reports them) and the flushing suffix here again, on the pipeline the engine hands
//! back. Fed the same frames, both give the same steps and words.

use moshi_model::kind::{EndOfInput, LeadingSilence};
use moshi_model::stt::{SttFeeding, TimedWord, WordTimer};

use crate::engine::{FrameTokens, OfflineRunner};
use crate::metrics::{FrameRecord, Metrics};
use crate::pipeline::{MoshiModel, MoshiPipeline};
use crate::wav_frames::WavFrames;
use crate::{RuntimeError, FRAME_SAMPLES, SAMPLE_RATE_HZ};

/// What one step was fed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fed {
    /// Silence before the audio.
    PrefixSilence,
    /// Frame `i` of the audio (the last one zero-padded).
    Audio(u64),
    /// Silence after the audio, flushing the text's delay.
    SuffixSilence,
}

impl Fed {
    /// As the fixture's reference names it: `prefix silence`, `frame i`, `suffix silence`.
    pub fn label(self) -> String {
        match self {
            Fed::PrefixSilence => "prefix silence".into(),
            Fed::Audio(i) => format!("frame {i}"),
            Fed::SuffixSilence => "suffix silence".into(),
        }
    }
}

/// One step of a transcription, as the callback sees it.
pub struct TranscribedStep<'a> {
    /// LM step index (0-based, prefix silence included).
    pub step: u64,
    pub fed: Fed,
    /// The text this step's token added, if any.
    pub text: Option<&'a str>,
    /// The step's tokens: the text token and the extra heads.
    pub tokens: Option<&'a FrameTokens>,
    /// The words this step's token completed.
    pub words: &'a [TimedWord],
    /// The step's timing record (`--profile`); its `frame` is `step`.
    pub record: &'a FrameRecord,
}

/// The feeding of the pipeline's model (the LM's `stt_config`, Mimi's frame rate).
pub fn feeding_of(pipeline: &MoshiPipeline) -> SttFeeding {
    feeding_of_model(pipeline.model())
}

fn feeding_of_model(model: &MoshiModel) -> SttFeeding {
    SttFeeding::of(
        model.lm_config(),
        SAMPLE_RATE_HZ as f64 / FRAME_SAMPLES as f64,
    )
}

/// A speech-to-text stream fed with its model type's conventions, one step at a time, in order:
/// [`Self::feed_prefix`] first, then every audio frame ([`Self::feed_audio`] here, or
/// [`Self::audio_step`] for a frame the engine ran), then [`Self::feed_suffix_and_finish`].
/// Each step goes to the caller's `on_step` with the words it completed; an error from
/// `on_step` ends the stream as itself (its type is the caller's, e.g. `anyhow::Error`).
pub struct SttStream {
    feeding: SttFeeding,
    prefix_frames: usize,
    timer: WordTimer,
    steps: u64,
    audio_frames: u64,
    silence: Vec<f32>,
}

impl SttStream {
    /// The stream of a speech-to-text model; another type of model is an error.
    pub fn new(model: &MoshiModel) -> Result<Self, RuntimeError> {
        let conventions = model.conventions();
        if conventions.end_of_input != EndOfInput::SilenceForTextDelay {
            return Err(RuntimeError::NotSpeechToText {
                kind: conventions.name,
            });
        }
        let feeding = feeding_of_model(model);
        let prefix_frames = match conventions.leading_silence {
            LeadingSilence::SttSilencePrefix => feeding.prefix_frames,
            // The pipeline feeds Hibiki-Zero's warm-up itself (and it is refused above).
            LeadingSilence::None | LeadingSilence::MaxDelaySilenceOwnEncoder => 0,
        };
        Ok(Self {
            feeding,
            prefix_frames,
            timer: WordTimer::new(model.lm_config(), feeding),
            steps: 0,
            audio_frames: 0,
            silence: vec![0.0; FRAME_SAMPLES],
        })
    }

    /// The feeding (its suffix, the times' offset); [`Self::prefix_frames`] is what is fed before.
    pub fn feeding(&self) -> SttFeeding {
        self.feeding
    }

    /// Silence frames fed before the audio.
    pub fn prefix_frames(&self) -> usize {
        self.prefix_frames
    }

    /// Audio frames fed so far.
    pub fn audio_frames(&self) -> u64 {
        self.audio_frames
    }

    /// The silence before the audio, through `pipeline` here.
    pub fn feed_prefix<E: From<RuntimeError>>(
        &mut self,
        pipeline: &mut MoshiPipeline,
        runner: &mut OfflineRunner,
        mut on_step: impl FnMut(&TranscribedStep<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        for _ in 0..self.prefix_frames {
            self.feed_silence(pipeline, runner, Fed::PrefixSilence, &mut on_step)?;
        }
        Ok(())
    }

    /// One audio frame, through `pipeline` here.
    pub fn feed_audio<E: From<RuntimeError>>(
        &mut self,
        pipeline: &mut MoshiPipeline,
        runner: &mut OfflineRunner,
        frame: &[f32],
        on_step: impl FnMut(&TranscribedStep<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let (record, output) = runner.process(pipeline, frame)?;
        self.audio_step(
            pipeline.model(),
            output.text.as_deref(),
            output.tokens.as_ref(),
            record,
            on_step,
        )
    }

    /// One audio frame that ran elsewhere (the engine's thread, on this stream's pipeline):
    /// its text, tokens and record as reported.
    pub fn audio_step<E: From<RuntimeError>>(
        &mut self,
        model: &MoshiModel,
        text: Option<&str>,
        tokens: Option<&FrameTokens>,
        record: FrameRecord,
        on_step: impl FnMut(&TranscribedStep<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let fed = Fed::Audio(self.audio_frames);
        self.audio_frames += 1;
        self.step(model, fed, text, tokens, record, on_step)
    }

    /// The silence after the audio, which flushes the words still in the text's delay, through
    /// `pipeline` here; returns the words of the last segment, known only at the end.
    pub fn feed_suffix_and_finish<E: From<RuntimeError>>(
        mut self,
        pipeline: &mut MoshiPipeline,
        runner: &mut OfflineRunner,
        mut on_step: impl FnMut(&TranscribedStep<'_>) -> Result<(), E>,
    ) -> Result<Vec<TimedWord>, E> {
        for _ in 0..self.feeding.suffix_frames {
            self.feed_silence(pipeline, runner, Fed::SuffixSilence, &mut on_step)?;
        }
        Ok(self
            .timer
            .finish(pipeline.model().tokenizer())
            .map_err(RuntimeError::from)?)
    }

    fn feed_silence<E: From<RuntimeError>>(
        &mut self,
        pipeline: &mut MoshiPipeline,
        runner: &mut OfflineRunner,
        fed: Fed,
        on_step: impl FnMut(&TranscribedStep<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let (record, output) = runner.process(pipeline, &self.silence)?;
        self.step(
            pipeline.model(),
            fed,
            output.text.as_deref(),
            output.tokens.as_ref(),
            record,
            on_step,
        )
    }

    /// Times the step's text token into words and hands the step to `on_step`.
    fn step<E: From<RuntimeError>>(
        &mut self,
        model: &MoshiModel,
        fed: Fed,
        text: Option<&str>,
        tokens: Option<&FrameTokens>,
        mut record: FrameRecord,
        mut on_step: impl FnMut(&TranscribedStep<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let words = match tokens {
            Some(t) => self
                .timer
                .push(t.text, model.tokenizer())
                .map_err(RuntimeError::from)?,
            None => Vec::new(),
        };
        record.frame = self.steps;
        self.steps += 1;
        on_step(&TranscribedStep {
            step: record.frame,
            fed,
            text,
            tokens,
            words: &words,
            record: &record,
        })
    }
}

/// Transcribes `audio` (24 kHz frames, the last zero-padded) with a speech-to-text model:
/// `on_step` sees every step as it is produced (an error from it ends the run). Returns the
/// words of the last segment, known only at the end of the stream, and the run's metrics. A
/// model of another type is an error. The callback's error type is the run's (e.g.
/// `anyhow::Error`), so that what it meets (a full disk) ends the run as itself.
pub fn transcribe_frames<E: From<RuntimeError>>(
    pipeline: &mut MoshiPipeline,
    audio: &mut WavFrames,
    mut on_step: impl FnMut(&TranscribedStep<'_>) -> Result<(), E>,
) -> Result<(Vec<TimedWord>, Metrics), E> {
    let mut stream = SttStream::new(pipeline.model())?;
    let mut runner = OfflineRunner::new();
    stream.feed_prefix(pipeline, &mut runner, &mut on_step)?;
    while let Some(frame) = audio.next_frame().map_err(E::from)? {
        stream.feed_audio(pipeline, &mut runner, frame, &mut on_step)?;
    }
    let last = stream.feed_suffix_and_finish(pipeline, &mut runner, &mut on_step)?;
    Ok((last, runner.into_metrics()))
}
