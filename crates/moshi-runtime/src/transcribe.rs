//! A recording transcribed by a speech-to-text model, fed as Kyutai's
//! `delayed-streams-modeling` `stt_from_file_pytorch.py` feeds it (the model type's
//! [`Conventions`](moshi_model::kind::Conventions)): `stt_config`'s silence prefix, the audio
//! zero-padded to whole frames (open the file with [`PartialFrame::Pad`](crate::wav_frames::PartialFrame)),
//! then silence for the text's delay; one LM step per frame. The words and their times come from
//! [`WordTimer`] as the text's word boundaries arrive. The audio is read one frame at a time and
//! the words are handed over as they complete, so memory stays flat however long the recording.

use moshi_model::kind::{EndOfInput, LeadingSilence};
use moshi_model::stt::{SttFeeding, TimedWord, WordTimer};

use crate::engine::{FrameOutput, OfflineRunner};
use crate::metrics::{FrameRecord, Metrics};
use crate::pipeline::MoshiPipeline;
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
    /// The pipeline's output: text piece, tokens (text token, extra heads), timings.
    pub output: &'a FrameOutput,
    /// The words this step's token completed.
    pub words: &'a [TimedWord],
    /// The step's timing record (`--profile`).
    pub record: &'a FrameRecord,
}

/// The feeding of the pipeline's model (the LM's `stt_config`, Mimi's frame rate).
pub fn feeding_of(pipeline: &MoshiPipeline) -> SttFeeding {
    SttFeeding::of(
        pipeline.model().lm_config(),
        SAMPLE_RATE_HZ as f64 / FRAME_SAMPLES as f64,
    )
}

/// Transcribes `audio` (24 kHz frames, the last zero-padded) with a speech-to-text model:
/// `on_step` sees every step as it is produced (an error from it ends the run). Returns the
/// words of the last segment, known only at the end of the stream, and the run's metrics. A
/// model of another type is an error. The callback's error type is the run's (e.g.
/// `anyhow::Error`), so that what it meets (a full disk) ends the run as itself.
pub fn transcribe_frames<E: From<RuntimeError>>(
    pipeline: &mut MoshiPipeline,
    audio: &mut WavFrames,
    mut on_step: impl FnMut(&TranscribedStep<'_>) -> std::result::Result<(), E>,
) -> std::result::Result<(Vec<TimedWord>, Metrics), E> {
    let conventions = pipeline.model().conventions();
    if conventions.end_of_input != EndOfInput::SilenceForTextDelay {
        return Err(RuntimeError::NotSpeechToText {
            kind: conventions.name,
        }
        .into());
    }
    let feeding = feeding_of(pipeline);
    let prefix = match conventions.leading_silence {
        LeadingSilence::SttSilencePrefix => feeding.prefix_frames,
        LeadingSilence::None => 0,
    };
    let mut timer = WordTimer::new(pipeline.model().lm_config(), feeding);
    let mut runner = OfflineRunner::new();
    let silence = vec![0f32; FRAME_SAMPLES];
    let mut step =
        |pipeline: &mut MoshiPipeline, frame: &[f32], fed: Fed| -> std::result::Result<(), E> {
            let (record, output) = runner.process(pipeline, frame)?;
            let words = match &output.tokens {
                Some(t) => timer
                    .push(t.text, pipeline.model().tokenizer())
                    .map_err(RuntimeError::from)?,
                None => Vec::new(),
            };
            on_step(&TranscribedStep {
                step: record.frame,
                fed,
                output: &output,
                words: &words,
                record: &record,
            })
        };
    for _ in 0..prefix {
        step(pipeline, &silence, Fed::PrefixSilence)?;
    }
    let mut i = 0;
    while let Some(frame) = audio.next_frame().map_err(E::from)? {
        step(pipeline, frame, Fed::Audio(i))?;
        i += 1;
    }
    for _ in 0..feeding.suffix_frames {
        step(pipeline, &silence, Fed::SuffixSilence)?;
    }
    let last = timer
        .finish(pipeline.model().tokenizer())
        .map_err(RuntimeError::from)?;
    Ok((last, runner.into_metrics()))
}
