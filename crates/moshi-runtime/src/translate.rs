//! A recorded speech translated by a Hibiki model, as Kyutai's `moshi/run_inference.py` does for
//! model_type "hibiki": the input's whole frames, then one end-of-stream frame (user codes all
//! equal to `card`), then silence through the same streaming Mimi encoder until the model ends
//! its text with EOS, at most `max_tail_frames` silence frames. The output is every frame the
//! model returns (none while its delays fill), up to and including the EOS frame.

use crate::engine::{FrameOutput, FrameProcessor, OfflineRunner};
use crate::metrics::{FrameRecord, Metrics};
use crate::pipeline::MoshiPipeline;
use crate::{Result, FRAME_SAMPLES};

/// How a translation run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TranslationEnd {
    /// The model returned EOS after this many silence frames.
    Eos { tail_frames: usize },
    /// `max_tail_frames` silence frames were fed and the model had not returned EOS.
    TailCapReached { tail_frames: usize },
}

/// The translated audio and what it took.
#[derive(Debug)]
pub struct Translation {
    /// 24 kHz mono, [`FRAME_SAMPLES`] per returned frame.
    pub pcm: Vec<f32>,
    /// One record per model call: input frames, the end-of-stream step, silence frames.
    pub metrics: Metrics,
    /// Frames returned by the model (= `pcm.len() / FRAME_SAMPLES`).
    pub frames_out: u64,
    pub end: TranslationEnd,
}

/// Translates a whole 24 kHz mono signal (whole frames only). The translation ends when the
/// model returns `end_text_id` after the end of the input (normally
/// [`crate::pipeline::MoshiModel::eos_text_id`]; `None`: after `max_tail_frames`). `on_frame(i, output)` sees
/// each returned frame as it is produced, `i` counting returned frames; `on_record` the timing
/// record of every model call (`--profile`).
pub fn translate_offline(
    pipeline: &mut MoshiPipeline,
    pcm: &[f32],
    end_text_id: Option<u32>,
    max_tail_frames: usize,
    mut on_frame: impl FnMut(u64, &FrameOutput),
    mut on_record: impl FnMut(&FrameRecord),
) -> Result<Translation> {
    let eos = end_text_id;
    let mut out = Vec::with_capacity(pcm.len() + max_tail_frames * FRAME_SAMPLES);
    let mut runner = OfflineRunner::new();
    let mut frames_out = 0u64;
    // Keeps a returned frame; true when it is EOS (only after the end of the input counts).
    let mut keep = |o: FrameOutput, after_input: bool| {
        let Some(tokens) = &o.tokens else {
            return false;
        };
        out.extend_from_slice(&o.pcm);
        on_frame(frames_out, &o);
        frames_out += 1;
        after_input && Some(tokens.text) == eos
    };
    for frame in pcm.chunks_exact(FRAME_SAMPLES) {
        let (record, o) = runner.run(|| pipeline.process_frame(frame))?;
        on_record(&record);
        keep(o, false);
    }
    let (record, o) = runner.run(|| pipeline.process_end_of_input())?;
    on_record(&record);
    let mut ended = keep(o, true);
    let silence = vec![0f32; FRAME_SAMPLES];
    let mut tail_frames = 0;
    while !ended && tail_frames < max_tail_frames {
        let (record, o) = runner.run(|| pipeline.process_frame(&silence))?;
        on_record(&record);
        tail_frames += 1;
        ended = keep(o, true);
    }
    let end = if ended {
        TranslationEnd::Eos { tail_frames }
    } else {
        TranslationEnd::TailCapReached { tail_frames }
    };
    Ok(Translation {
        pcm: out,
        metrics: runner.into_metrics(),
        frames_out,
        end,
    })
}
