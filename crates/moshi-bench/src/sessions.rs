//! `moshi-rs bench --sessions N`: N conversations over one set of weights, each frame one batched
//! step for all of them (as `serve` runs them). A frame's record is the whole batched step: every
//! session's Mimi encode and decode (summed), the LM step they share, sampling.

use moshi_model::generator::{Generator, StepInput};
use moshi_model::lm::LmScratch;
use moshi_runtime::engine::{FrameOutput, FrameProcessor};
use moshi_runtime::metrics::StageTimings;
use moshi_runtime::pipeline::MoshiPipeline;
use moshi_runtime::Result;

use crate::stages::lm_only_output;

/// N whole pipelines (Mimi encode -> LM -> Mimi decode) stepped together, all fed the frame.
pub struct SessionsPipeline {
    sessions: Vec<MoshiPipeline>,
    scratch: LmScratch,
}

impl SessionsPipeline {
    /// The sessions (clones of one pipeline share its weights).
    pub fn new(sessions: Vec<MoshiPipeline>) -> Self {
        Self {
            sessions,
            scratch: LmScratch::default(),
        }
    }
}

impl FrameProcessor for SessionsPipeline {
    fn process_frame(&mut self, pcm_in: &[f32]) -> Result<FrameOutput> {
        let mut batch: Vec<&mut MoshiPipeline> = self.sessions.iter_mut().collect();
        let frames = vec![pcm_in; batch.len()];
        let outputs = MoshiPipeline::process_frames(&mut batch, &frames, &mut self.scratch);
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

/// The LM step alone for N sessions: each generator fed its own pseudo-random user codes (the
/// input audio is not encoded), all stepped together; times temporal transformer, depformer and
/// sampling.
pub struct LmStage {
    generators: Vec<Generator>,
    rngs: Vec<CodeRng>,
    user_codes: Vec<Vec<u32>>,
    scratch: LmScratch,
}

impl LmStage {
    /// Sessions over one set of weights; session `i`'s codes come from `seed + i`.
    pub fn new(generators: Vec<Generator>, seed: u64) -> Self {
        let n = generators
            .first()
            .map_or(0, |g| g.model().config().user_codebooks());
        Self {
            rngs: (0..generators.len() as u64)
                .map(|i| CodeRng(seed.wrapping_add(i) | 1))
                .collect(),
            user_codes: vec![vec![0; n]; generators.len()],
            generators,
            scratch: LmScratch::default(),
        }
    }
}

impl FrameProcessor for LmStage {
    fn process_frame(&mut self, _pcm_in: &[f32]) -> Result<FrameOutput> {
        for (g, (codes, rng)) in self
            .generators
            .iter()
            .zip(self.user_codes.iter_mut().zip(&mut self.rngs))
        {
            let card = g.model().config().card;
            codes.iter_mut().for_each(|c| *c = rng.next_below(card));
        }
        let inputs: Vec<StepInput> = self
            .user_codes
            .iter()
            .map(|c| StepInput::UserCodes(c))
            .collect();
        let mut batch: Vec<&mut Generator> = self.generators.iter_mut().collect();
        for r in Generator::step_batch(&mut batch, &inputs, &mut self.scratch) {
            r?;
        }
        let t = self.generators[0].last_timings();
        let sampling_ms = self
            .generators
            .iter()
            .map(|g| g.last_timings().sampling_ms)
            .sum();
        Ok(lm_only_output(StageTimings {
            lm_temporal_ms: t.temporal_ms,
            lm_depformer_ms: t.depformer_ms,
            sampling_ms,
            ..Default::default()
        }))
    }
}
