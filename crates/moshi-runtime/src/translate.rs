//! A recorded speech translated by a Hibiki model, as Kyutai's `moshi/run_inference.py` does for
//! model_type "hibiki": the input's whole frames, then one end-of-stream frame (user codes all
//! equal to `card`), then silence through the same streaming Mimi encoder until the model ends
//! its text with EOS, at most `max_tail_frames` silence frames. The output is every frame the
//! model returns (none while its delays fill), up to and including the EOS frame.

use crate::engine::{FrameOutput, FrameProcessor, OfflineRunner};
use crate::metrics::{FrameRecord, Metrics};
use crate::pipeline::MoshiPipeline;
use crate::wav_frames::WavFrames;
use crate::{Result, RuntimeError, FRAME_SAMPLES};

/// How a translation run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TranslationEnd {
    /// The model returned EOS after this many silence frames.
    Eos { tail_frames: usize },
    /// `max_tail_frames` silence frames were fed and the model had not returned EOS.
    TailCapReached { tail_frames: usize },
}

/// What a translation took. The translated audio went to `on_frame` as it was made: nothing
/// of it is kept, so memory does not grow with the input.
#[derive(Debug)]
pub struct Translation {
    /// One record per model call: input frames, the end-of-stream step, silence frames.
    pub metrics: Metrics,
    /// Frames returned by the model ([`FRAME_SAMPLES`] samples each).
    pub frames_out: u64,
    pub end: TranslationEnd,
}

/// 24 kHz mono input frames of [`FRAME_SAMPLES`] samples, handed out one at a time.
pub trait FrameSource {
    /// The next frame, `None` after the last.
    fn next_frame(&mut self) -> Result<Option<&[f32]>>;
}

impl FrameSource for WavFrames {
    fn next_frame(&mut self) -> Result<Option<&[f32]>> {
        WavFrames::next_frame(self)
    }
}

/// The whole frames of a signal in memory.
pub struct SliceFrames<'a>(std::slice::ChunksExact<'a, f32>);

impl<'a> SliceFrames<'a> {
    pub fn new(pcm: &'a [f32]) -> Self {
        Self(pcm.chunks_exact(FRAME_SAMPLES))
    }
}

impl FrameSource for SliceFrames<'_> {
    fn next_frame(&mut self) -> Result<Option<&[f32]>> {
        Ok(self.0.next())
    }
}

/// Translates 24 kHz mono frames read one at a time from `input`. The translation ends when
/// the model returns `end_text_id` after the end of the input (normally
/// [`crate::pipeline::MoshiModel::eos_text_id`]; `None`: after `max_tail_frames`).
/// `on_frame(i, output)` takes each returned frame as it is produced (`i` counts returned
/// frames; its audio is `output.pcm`); an error it returns ends the run. `on_record` sees the
/// timing record of every model call (`--profile`).
pub fn translate_offline<E: From<RuntimeError>>(
    pipeline: &mut MoshiPipeline,
    input: &mut dyn FrameSource,
    end_text_id: Option<u32>,
    max_tail_frames: usize,
    mut on_frame: impl FnMut(u64, &FrameOutput) -> std::result::Result<(), E>,
    mut on_record: impl FnMut(&FrameRecord),
) -> std::result::Result<Translation, E> {
    let eos = end_text_id;
    let mut runner = OfflineRunner::new();
    let mut frames_out = 0u64;
    // Hands a returned frame on; true when it is EOS (only after the end of the input counts).
    let mut keep = |o: FrameOutput, after_input: bool| -> std::result::Result<bool, E> {
        let Some(tokens) = &o.tokens else {
            return Ok(false);
        };
        on_frame(frames_out, &o)?;
        frames_out += 1;
        Ok(after_input && Some(tokens.text) == eos)
    };
    while let Some(frame) = input.next_frame()? {
        let (record, o) = runner.run(|| pipeline.process_frame(frame))?;
        on_record(&record);
        keep(o, false)?;
    }
    let (record, o) = runner.run(|| pipeline.process_end_of_input())?;
    on_record(&record);
    let mut ended = keep(o, true)?;
    let silence = vec![0f32; FRAME_SAMPLES];
    let mut tail_frames = 0;
    while !ended && tail_frames < max_tail_frames {
        let (record, o) = runner.run(|| pipeline.process_frame(&silence))?;
        on_record(&record);
        tail_frames += 1;
        ended = keep(o, true)?;
    }
    let end = if ended {
        TranslationEnd::Eos { tail_frames }
    } else {
        TranslationEnd::TailCapReached { tail_frames }
    };
    Ok(Translation {
        metrics: runner.into_metrics(),
        frames_out,
        end,
    })
}
