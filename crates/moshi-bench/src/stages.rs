//! Frame processors that run one stage of the pipeline alone (`moshi-rs bench --stage`): Mimi
//! (encode + decode), the depformer alone (the LM step alone is `sessions::LmStage`) and
//! `chat`'s echo canceller.
//! Each fills the [`StageTimings`] of the parts it runs; the others stay 0.

use std::sync::Arc;
use std::time::Instant;

use moshi_model::generator::sampling::argmax;
use moshi_model::lm::{LmRowState, LmScratch, LmWeights};
use moshi_model::mimi::Mimi;
use moshi_model::nn::KvPrecision;

use moshi_runtime::echo_cancel::{EchoCancelConfig, EchoCanceller};
use moshi_runtime::engine::{FrameOutput, FrameProcessor};
use moshi_runtime::metrics::StageTimings;
use moshi_runtime::{Result, FRAME_SAMPLES};

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Mimi alone: encode the input frame, decode the codes just produced.
pub struct MimiStage {
    mimi: Mimi,
}

impl MimiStage {
    pub fn new(mimi: Mimi) -> Self {
        Self { mimi }
    }
}

impl FrameProcessor for MimiStage {
    fn process_frame(&mut self, pcm_in: &[f32]) -> Result<FrameOutput> {
        let t0 = Instant::now();
        let codes = self.mimi.encode_frame(pcm_in)?;
        let mimi_encode_ms = ms_since(t0);
        let t1 = Instant::now();
        let pcm = self.mimi.decode_frame(&codes)?;
        let timings = StageTimings {
            mimi_encode_ms,
            mimi_decode_ms: ms_since(t1),
            ..Default::default()
        };
        Ok(FrameOutput {
            pcm,
            timings,
            ..Default::default()
        })
    }
}

/// `chat`'s echo canceller alone: each input frame is played (the reference), and the
/// microphone frame is the previous frame's echo at -6 dB over the input at -20 dB (double talk
/// throughout, the costliest case), aligned as the engine aligns it.
pub struct EchoCancelStage {
    canceller: EchoCanceller,
    previous: Vec<f32>,
}

impl EchoCancelStage {
    pub fn new() -> Result<Self> {
        Ok(Self {
            canceller: EchoCanceller::new(EchoCancelConfig::default())?,
            previous: vec![0.0; FRAME_SAMPLES],
        })
    }
}

impl FrameProcessor for EchoCancelStage {
    fn process_frame(&mut self, pcm_in: &[f32]) -> Result<FrameOutput> {
        let mut mic: Vec<f32> = self
            .previous
            .iter()
            .zip(pcm_in)
            .map(|(echo, near)| 0.5 * echo + 0.1 * near)
            .collect();
        self.canceller.played(pcm_in);
        // The frame played last is one frame ahead of the microphone.
        self.canceller.process(&mut mic, FRAME_SAMPLES as f64)?;
        self.previous.copy_from_slice(pcm_in);
        Ok(FrameOutput {
            pcm: mic,
            ..Default::default()
        })
    }
}

/// The depformer alone: one temporal step is run at construction, then every frame runs the
/// `dep_q` depformer sub-steps on its output, each fed the argmax of the previous one (one row,
/// through the weights' row API).
pub struct DepformerStage {
    weights: Arc<LmWeights>,
    row: LmRowState,
    scratch: LmScratch,
}

impl DepformerStage {
    /// Runs the first temporal step (initial tokens) of a fresh row (f32 KV caches, every
    /// conditioner's learnt padding) so the depformer has an input.
    pub fn new(weights: Arc<LmWeights>) -> moshi_model::Result<Self> {
        let cfg = weights.config();
        let mut tokens = vec![cfg.card as u32; cfg.n_q + 1];
        tokens[0] = cfg.text_card as u32;
        let mut row = weights.new_row(&[], KvPrecision::F32)?;
        let mut scratch = LmScratch::default();
        weights.forward_text_rows(&mut [&mut row], &tokens, &mut scratch)?;
        Ok(Self {
            weights,
            row,
            scratch,
        })
    }
}

impl FrameProcessor for DepformerStage {
    fn process_frame(&mut self, _pcm_in: &[f32]) -> Result<FrameOutput> {
        let dep_q = self.weights.config().dep_q;
        let mut prev = argmax(self.row.text_logits());
        let (mut depformer_ms, mut sampling_ms) = (0.0, 0.0);
        self.row.depformer_reset();
        for k in 0..dep_q {
            let t0 = Instant::now();
            tracing::trace_span!("lm_depformer", k).in_scope(|| {
                self.weights.depformer_step_rows(
                    k,
                    &mut [&mut self.row],
                    &[prev],
                    &mut self.scratch,
                )
            })?;
            depformer_ms += ms_since(t0);
            let t1 = Instant::now();
            prev = argmax(self.row.depformer_logits());
            sampling_ms += ms_since(t1);
        }
        Ok(lm_only_output(StageTimings {
            lm_depformer_ms: depformer_ms,
            sampling_ms,
            ..Default::default()
        }))
    }
}

/// The output of a stage that runs LM parts only: a silent frame and `timings`.
pub(crate) fn lm_only_output(timings: StageTimings) -> FrameOutput {
    FrameOutput {
        pcm: vec![0.0; FRAME_SAMPLES],
        timings,
        ..Default::default()
    }
}
