//! A recorded speech translated by a Hibiki model, as Kyutai's `moshi/run_inference.py` does for
//! model_type "hibiki": the input's whole frames, then one end-of-stream frame (user codes all
//! equal to `card`), then silence through the same streaming Mimi encoder until the model ends
//! its text with EOS, at most `max_tail_frames` silence frames. The output is every frame the
//! model returns (none while its delays fill), up to and including the EOS frame.
//!
//! Hibiki-Zero (Kyutai's `hibiki_zero.run.generate`) instead generates for a fixed length
//! ([`GenerationWindow`]): the input zero-padded to it, the frame at `ceil(duration x 12.5)`
//! replaced by the end-of-input frame, and its output cut at the first EOS
//! ([`translate_window`]).

use crate::engine::{FrameOutput, FrameProcessor, OfflineRunner};
use crate::metrics::{FrameRecord, Metrics};
use crate::pipeline::{FrameInput, MoshiPipeline};
use crate::wav_frames::WavFrames;
use crate::{Result, RuntimeError, FRAME_SAMPLES};
use moshi_model::mimi::Mimi;

/// How a translation run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TranslationEnd {
    /// The model returned EOS after this many silence frames.
    Eos { tail_frames: usize },
    /// `max_tail_frames` silence frames were fed and the model had not returned EOS.
    TailCapReached { tail_frames: usize },
    /// Hibiki-Zero: the generation window's last frame was fed, `tail_frames` of them after
    /// the end-of-input frame, and the model had not returned EOS.
    WindowEnd { tail_frames: usize },
}

/// Hibiki-Zero's generation length (`hibiki_zero.run.generate`'s `gen_duration`): the input
/// is zero-padded to `total_frames` and the frame `end_of_input_frame` replaced by the
/// end-of-input frame (`add_input_eos`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GenerationWindow {
    /// Frames fed after the warm-up: the padded input's.
    pub total_frames: usize,
    /// `min(ceil(duration x 12.5), total_frames - 1)`.
    pub end_of_input_frame: usize,
}

impl GenerationWindow {
    /// The window of `input_samples` at 24 kHz generating for `gen_duration_s` seconds, as
    /// `generate` computes it (`int(gen_duration x 24000)` samples, whole frames by Mimi's
    /// padding, the end-of-input frame from the duration in floating point); `None` where the
    /// input is longer than the window or either is empty (`generate` refuses those).
    pub fn new(input_samples: u64, gen_duration_s: f64) -> Option<Self> {
        let sample_rate = crate::SAMPLE_RATE_HZ as f64;
        let gen_samples = (gen_duration_s * sample_rate) as u64;
        let duration_s = input_samples as f64 / sample_rate;
        if input_samples == 0 || duration_s > gen_duration_s || gen_samples == 0 {
            return None;
        }
        let total_frames = gen_samples.div_ceil(FRAME_SAMPLES as u64) as usize;
        let frame_rate_hz = 1e3 / crate::FRAME_MS;
        let end = (duration_s * frame_rate_hz).ceil() as usize;
        Some(Self {
            total_frames,
            end_of_input_frame: end.min(total_frames - 1),
        })
    }
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

/// What Hibiki-Zero's `generate` feeds, frame-major user codes (`encode_inputs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowCodes {
    /// `max_delay` frames of silence encoded in one call by an encoder of their own.
    pub warm_up: Vec<Vec<u32>>,
    /// The input zero-padded to the window, encoded in one call.
    pub frames: Vec<Vec<u32>>,
}

/// Encodes `pcm` (whole frames) in one Mimi call -> frame-major codes.
fn encode_in_one_call(mimi: &Mimi, pcm: &[f32]) -> Result<Vec<Vec<u32>>> {
    let by_codebook = mimi.encode_batch(pcm)?;
    let frames = pcm.len() / FRAME_SAMPLES;
    Ok((0..frames)
        .map(|f| by_codebook.iter().map(|c| c[f]).collect())
        .collect())
}

/// Hibiki-Zero's user codes for `window` (`hibiki_zero.inference.encode_inputs`): the frames of
/// `input` zero-padded to `window.total_frames` and encoded by `mimi` in one call (not frame by
/// frame: once the codec's attention window is full its batch and streaming encoders may pick
/// different codes on near ties, and `generate` encodes in one call), after `max_delay` warm-up
/// frames. Holds the window's audio and its activations while it encodes (memory grows with
/// the window).
pub fn encode_window(
    mimi: &Mimi,
    max_delay: usize,
    input: &mut dyn FrameSource,
    window: GenerationWindow,
) -> Result<WindowCodes> {
    let samples = window.total_frames * FRAME_SAMPLES;
    let mut pcm = Vec::with_capacity(samples);
    while pcm.len() < samples {
        let Some(frame) = input.next_frame()? else {
            break;
        };
        pcm.extend_from_slice(frame);
    }
    pcm.resize(samples, 0.0);
    let warm_up = if max_delay == 0 {
        Vec::new()
    } else {
        encode_in_one_call(mimi, &vec![0.0; max_delay * FRAME_SAMPLES])?
    };
    Ok(WindowCodes {
        warm_up,
        frames: encode_in_one_call(mimi, &pcm)?,
    })
}

/// Translates the window's `codes` (from [`encode_window`]) as Hibiki-Zero's `generate` does:
/// the warm-up frames, then each frame of the window once, the frame at
/// `window.end_of_input_frame` replaced by the end-of-input frame (`add_input_eos`). `generate`
/// keeps the output up to the first EOS anywhere (`decode_outputs`), so the run stops once the
/// model returns `end_text_id`. `on_frame` and `on_record` as in [`translate_offline`].
pub fn translate_window<E: From<RuntimeError>>(
    pipeline: &mut MoshiPipeline,
    codes: &WindowCodes,
    window: GenerationWindow,
    end_text_id: Option<u32>,
    mut on_frame: impl FnMut(u64, &FrameOutput) -> std::result::Result<(), E>,
    mut on_record: impl FnMut(&FrameRecord),
) -> std::result::Result<Translation, E> {
    let mut runner = OfflineRunner::new();
    let mut frames_out = 0u64;
    let mut ended = false;
    let inputs = codes.warm_up.iter().map(|c| FrameInput::Codes(c)).chain(
        codes.frames.iter().enumerate().map(|(i, c)| {
            if i == window.end_of_input_frame {
                FrameInput::EndOfInput
            } else {
                FrameInput::Codes(c)
            }
        }),
    );
    for input in inputs {
        let (record, o) = runner.run(|| pipeline.process(input))?;
        on_record(&record);
        if let Some(tokens) = &o.tokens {
            on_frame(frames_out, &o)?;
            frames_out += 1;
            ended = Some(tokens.text) == end_text_id;
        }
        if ended {
            break;
        }
    }
    let fed = runner.frames() as usize - codes.warm_up.len();
    let tail_frames = fed.saturating_sub(window.end_of_input_frame + 1);
    let end = if ended {
        TranslationEnd::Eos { tail_frames }
    } else {
        TranslationEnd::WindowEnd { tail_frames }
    };
    Ok(Translation {
        metrics: runner.into_metrics(),
        frames_out,
        end,
    })
}

/// Where Hibiki-Zero's `decode_outputs` cuts a translation: before the first frame whose text
/// is EOS, else (no EOS) before the last frame whose text is not PAD (the tokenizer's
/// `pad_id`; none: every frame but the last), nothing if every text is PAD. Push each returned
/// frame's text token in order, then read [`OutputCut::kept_frames`].
#[derive(Clone, Copy, Debug, Default)]
pub struct OutputCut {
    eos: Option<u32>,
    pad: Option<u32>,
    frames: usize,
    first_eos: Option<usize>,
    last_not_pad: Option<usize>,
}

impl OutputCut {
    pub fn new(eos: Option<u32>, pad: Option<u32>) -> Self {
        Self {
            eos,
            pad,
            ..Self::default()
        }
    }

    /// The next returned frame's text token.
    pub fn push(&mut self, text: u32) {
        if self.first_eos.is_none() && Some(text) == self.eos {
            self.first_eos = Some(self.frames);
        }
        if Some(text) != self.pad {
            self.last_not_pad = Some(self.frames);
        }
        self.frames += 1;
    }

    /// How many of the frames pushed so far the output keeps.
    pub fn kept_frames(&self) -> usize {
        self.first_eos.or(self.last_not_pad).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many frames with `texts` `OutputCut` keeps (EOS 2, PAD 3).
    fn kept(texts: &[u32]) -> usize {
        let mut cut = OutputCut::new(Some(2), Some(3));
        texts.iter().for_each(|&t| cut.push(t));
        cut.kept_frames()
    }

    #[test]
    fn the_cut_follows_decode_outputs() {
        // The first EOS: every frame before it, PAD or not, and nothing from it on.
        assert_eq!(kept(&[7, 3, 3, 2, 9, 2]), 3);
        // No EOS: before the last non-PAD frame.
        assert_eq!(kept(&[7, 3, 8, 3, 3]), 2);
        assert_eq!(kept(&[7, 8, 9]), 2);
        // Nothing but PAD, or one word then PAD: nothing (eos_idx 0).
        assert_eq!(kept(&[3, 3, 3]), 0);
        assert_eq!(kept(&[5, 3, 3]), 0);
    }

    #[test]
    fn the_window_is_generates_own() {
        // 4.563875 s in 5.12 s: 64 frames, the end of input at ceil(57.05) = 58.
        let w = GenerationWindow::new(109_533, 5.12).unwrap();
        assert_eq!((w.total_frames, w.end_of_input_frame), (64, 58));
        // An input filling the window: its last frame is replaced.
        let w = GenerationWindow::new(1920 * 10, 0.8).unwrap();
        assert_eq!((w.total_frames, w.end_of_input_frame), (10, 9));
        // 120 s by default: 1500 frames; longer inputs refused.
        assert_eq!(
            GenerationWindow::new(24_000, 120.0).unwrap().total_frames,
            1500
        );
        assert!(GenerationWindow::new(24_001, 1.0).is_none());
        assert!(GenerationWindow::new(0, 1.0).is_none());
    }
}
