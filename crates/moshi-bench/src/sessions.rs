//! `moshi-rs bench --sessions N`: N conversations over one set of weights, each frame one batched
//! step for all of them (as `serve` runs them). A frame's record is the whole batched step: every
//! session's Mimi encode and decode (summed), the LM step they share, sampling.

use std::sync::Arc;

use moshi_model::generator::{Generator, LmSession, StepInput};
use moshi_runtime::engine::{FrameOutput, FrameProcessor};
use moshi_runtime::metrics::StageTimings;
use moshi_runtime::pipeline::{FrameInput, MoshiModel, MoshiSession};
use moshi_runtime::Result;

use crate::stages::lm_only_output;

/// N sessions of the whole pipeline (Mimi encode -> LM -> Mimi decode) over one model, all fed
/// the frame and stepped together: one [`MoshiModel::step`] per frame.
pub struct SessionsPipeline {
    model: Arc<MoshiModel>,
    sessions: Vec<MoshiSession>,
}

impl SessionsPipeline {
    /// Sessions of `model` (each made by [`MoshiModel::new_session`]).
    pub fn new(model: Arc<MoshiModel>, sessions: Vec<MoshiSession>) -> Self {
        Self { model, sessions }
    }
}

impl FrameProcessor for SessionsPipeline {
    fn process_frame(&mut self, pcm_in: &[f32]) -> Result<FrameOutput> {
        let mut batch: Vec<&mut MoshiSession> = self.sessions.iter_mut().collect();
        let inputs = vec![FrameInput::Pcm(pcm_in); batch.len()];
        let outputs = self.model.step(&mut batch, &inputs);
        let mut first = None;
        let mut timings = StageTimings::default();
        for out in outputs {
            let out = out?;
            let t = &out.timings;
            timings.mimi_encode_ms += t.mimi_encode_ms;
            timings.mimi_decode_ms += t.mimi_decode_ms;
            // The LM step is the batch's: the same in every output.
            timings.lm_temporal_ms = t.lm_temporal_ms;
            timings.lm_depformer_ms = t.lm_depformer_ms;
            timings.sampling_ms += t.sampling_ms;
            first.get_or_insert(out);
        }
        let mut out = first.unwrap_or_default();
        out.timings = timings;
        Ok(out)
    }
}

/// A small xorshift generator for synthetic user codes.
#[derive(Clone, Debug)]
struct CodeRng(u64);

impl CodeRng {
    fn next_below(&mut self, n: usize) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 33) % n as u64) as u32
    }
}

/// The LM step alone for N sessions: each session fed its own pseudo-random user codes (the
/// input audio is not encoded), all stepped together by one [`Generator::step`]; times temporal
/// transformer, depformer and sampling.
pub struct LmStage {
    generator: Generator,
    sessions: Vec<LmSession>,
    rngs: Vec<CodeRng>,
    user_codes: Vec<Vec<u32>>,
}

impl LmStage {
    /// Sessions of `generator`; session `i`'s codes come from `seed + i`.
    pub fn new(generator: Generator, sessions: Vec<LmSession>, seed: u64) -> Self {
        let n = generator.config().user_codebooks();
        Self {
            rngs: (0..sessions.len() as u64)
                .map(|i| CodeRng(seed.wrapping_add(i) | 1))
                .collect(),
            user_codes: vec![vec![0; n]; sessions.len()],
            generator,
            sessions,
        }
    }
}

impl FrameProcessor for LmStage {
    fn process_frame(&mut self, _pcm_in: &[f32]) -> Result<FrameOutput> {
        let card = self.generator.config().card;
        for (codes, rng) in self.user_codes.iter_mut().zip(&mut self.rngs) {
            codes.iter_mut().for_each(|c| *c = rng.next_below(card));
        }
        let inputs: Vec<StepInput> = self
            .user_codes
            .iter()
            .map(|c| StepInput::UserCodes(c))
            .collect();
        let mut batch: Vec<&mut LmSession> = self.sessions.iter_mut().collect();
        for r in self.generator.step(&mut batch, &inputs) {
            r?;
        }
        // Temporal and depformer times are the batch's (the same in every session); sampling is
        // each session's own.
        let t = self.sessions[0].last_timings();
        let sampling_ms = self
            .sessions
            .iter()
            .map(|s| s.last_timings().sampling_ms)
            .sum();
        Ok(lm_only_output(StageTimings {
            lm_temporal_ms: t.temporal_ms,
            lm_depformer_ms: t.depformer_ms,
            sampling_ms,
            ..Default::default()
        }))
    }
}
