//! The real Moshi frame processor: Mimi encode -> LM generator step -> Mimi decode, plus the
//! incremental text decoder, as one [`FrameProcessor`] used by both `moshi-rs file` and
//! `moshi-rs chat`.
//!
//! Convention (moshi/run_inference.py, MANIFEST.md "LM (LMGen, ...)"): the first user frame is
//! fed to the generator twice, so that T frames in give T frames out and output frame i answers
//! input frames 0..=i. Chat uses the same processor, so a live session reproduces file mode
//! exactly for the same input and seed. With a config whose max delay is above 1, the first
//! outputs are silence until the generator returns frames.
//!
//! A translation model (Hibiki) is conditioned as `run_inference.py` conditions it
//! (`description` = `very_good`, guidance against `very_bad`); its end of input is one frame of
//! user codes all equal to `card` ([`MoshiPipeline::process_end_of_input`]), then silence until
//! it ends its text with EOS.
//!
//! Sessions share weights: a clone is a new session over the same `Arc`'d LM and Mimi weights,
//! and [`MoshiPipeline::process_frames`] runs one frame of several sessions with one batched LM
//! step (the weights read once for all of them), each session's output the same as alone.

use std::time::Instant;

use moshi_loader::tokenizer::{IncrementalDecoder, TextTokenizer};
use moshi_loader::{load_lm_weights, load_mimi_weights, ResolvedModel, WeightMode};
use moshi_model::generator::{GeneratedFrame, Generator, SamplingConfig, StepInput};
use moshi_model::lm::{LmModel, LmScratch};
use moshi_model::mimi::{Mimi, MimiWeights};
use moshi_model::nn::KvPrecision;

use crate::engine::{FrameOutput, FrameProcessor, FrameTokens};
use crate::metrics::StageTimings;
use crate::{Result, RuntimeError, FRAME_SAMPLES};

/// LM steps the first frame takes, as Kyutai's `run_inference.py` does: the first one only fills
/// the acoustic delays. Every later frame takes one.
pub const FIRST_FRAME_LM_STEPS: usize = 2;

/// What a translation model (Hibiki) is conditioned on (`run_inference.py`, model_type "hibiki").
pub const TRANSLATION_CONDITIONS: &[(&str, &str)] = &[("description", "very_good")];
/// The negative row of guidance for a translation model.
pub const TRANSLATION_NEGATIVE_CONDITIONS: &[(&str, &str)] = &[("description", "very_bad")];

/// Moshi as a frame processor. A clone is another session over the same weights (its own
/// streaming state, the LM and Mimi weights shared).
#[derive(Clone)]
pub struct MoshiPipeline {
    mimi: Mimi,
    generator: Generator,
    text: IncrementalDecoder,
    user_codebooks: usize,
    frames_in: u64,
    /// The tokenizer's end-of-sequence id (a translation model ends its text with it).
    eos_text_id: Option<u32>,
    /// Buffers of this session's LM steps when it steps alone.
    lm_scratch: LmScratch,
}

/// Milliseconds since `t0`.
fn ms_since(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1e3
}

impl MoshiPipeline {
    /// Loads Mimi, the LM and the tokenizer of a resolved model.
    pub fn load(model: &ResolvedModel, sampling: SamplingConfig, mode: WeightMode) -> Result<Self> {
        sampling.validate()?;
        let cfg = &model.lm_config;
        let weights = load_lm_weights(&model.lm_weights_path, cfg, mode)?;
        let lm = LmModel::load(cfg, weights)?;
        let num_codebooks = cfg.dep_q.max(cfg.user_codebooks());
        let mimi_weights = load_mimi_weights(&model.mimi_weights_path, num_codebooks)?;
        let mimi = Mimi::load(&model.mimi_config, mimi_weights, num_codebooks)?;
        let tokenizer = TextTokenizer::from_file(&model.tokenizer_path)?;
        Self::from_parts(mimi, Generator::new(lm, sampling), &tokenizer)
    }

    /// Builds the pipeline from loaded parts.
    pub fn from_parts(mimi: Mimi, generator: Generator, tokenizer: &TextTokenizer) -> Result<Self> {
        let cfg = generator.model().config();
        let user_codebooks = cfg.user_codebooks();
        if mimi.num_codebooks() < user_codebooks || mimi.num_codebooks() < cfg.dep_q {
            return Err(RuntimeError::CodebooksMismatch {
                mimi: mimi.num_codebooks(),
                user: user_codebooks,
                generated: cfg.dep_q,
            });
        }
        if mimi.frame_size_samples() != FRAME_SAMPLES {
            return Err(RuntimeError::FrameSize {
                expected: FRAME_SAMPLES,
                got: mimi.frame_size_samples(),
            });
        }
        let mut pipeline = Self {
            mimi,
            generator,
            text: tokenizer.incremental_decoder(),
            user_codebooks,
            frames_in: 0,
            eos_text_id: tokenizer.eos_id(),
            lm_scratch: LmScratch::default(),
        };
        let cfg_coef = pipeline.generator.model().config().default_cfg_coef();
        pipeline.set_cfg_coef(cfg_coef)?;
        Ok(pipeline)
    }

    /// Classifier-free guidance coefficient of a conditioned model (1 = none, the default unless
    /// the config's `lm_gen_config.cfg_coef` says otherwise; Kyutai suggests 3 for Hibiki).
    /// Conditions a translation model as `run_inference.py` does. Restarts the conversation.
    /// Errors for a coefficient other than 1 on a model without conditioners.
    pub fn set_cfg_coef(&mut self, cfg_coef: f32) -> Result<()> {
        let conditioned = self.generator.model().config().is_conditioned();
        let (values, negative) = if conditioned {
            (TRANSLATION_CONDITIONS, TRANSLATION_NEGATIVE_CONDITIONS)
        } else {
            (&[][..], &[][..])
        };
        self.generator.set_conditions(values, cfg_coef, negative)?;
        self.reset();
        Ok(())
    }

    /// The guidance coefficient in use (1 without guidance).
    pub fn cfg_coef(&self) -> f32 {
        self.generator.cfg_coef()
    }

    /// Activation rows of each product of one session's step (2 with guidance, else 1).
    pub fn rows_per_session(&self) -> usize {
        self.generator.rows_per_step()
    }

    /// Whether the model translates (Hibiki: its input ends with an end-of-stream frame, its
    /// output with EOS); see [`moshi_loader::LmConfig::is_translation`].
    pub fn is_translation(&self) -> bool {
        self.generator.model().config().is_translation()
    }

    /// The text id that ends a translation (the tokenizer's EOS), if the tokenizer has one.
    pub fn eos_text_id(&self) -> Option<u32> {
        self.eos_text_id
    }

    /// The generator (model, sampling, step index).
    pub fn generator(&self) -> &Generator {
        &self.generator
    }

    /// Weight precision of Mimi's per-frame products (see [`Mimi::set_weights`]).
    pub fn set_mimi_weights(&mut self, mode: MimiWeights) {
        self.mimi.set_weights(mode);
    }

    /// The LM's temporal KV caches in f32 (exact, default) or bf16 (half the memory and the
    /// bytes read per frame late in a conversation). Changing it restarts the conversation.
    pub fn set_kv_precision(&mut self, precision: KvPrecision) {
        if precision != self.generator.model().kv_precision() {
            self.generator.set_kv_precision(precision);
            self.reset();
        }
    }

    /// [`Generator::fill_temporal_caches_with_noise`]: a long conversation's KV caches without
    /// running it, for benchmarks (no input leads to this state).
    pub fn fill_temporal_caches_with_noise(&mut self, positions: usize, seed: u64) {
        self.generator
            .fill_temporal_caches_with_noise(positions, seed);
    }

    /// New sampling settings for the next conversation (restarts the conversation).
    pub fn set_sampling(&mut self, sampling: SamplingConfig) {
        self.generator.set_sampling(sampling);
        self.reset();
    }

    /// The sampling settings in force.
    pub fn sampling(&self) -> &SamplingConfig {
        self.generator.sampling()
    }

    /// Back to the start of a conversation: behaves exactly as a freshly loaded pipeline.
    pub fn reset(&mut self) {
        self.mimi.reset();
        self.generator.reset();
        self.text.reset();
        self.frames_in = 0;
    }

    /// Runs one frame of silence, then goes back to the start of a conversation ([`Self::reset`]):
    /// the weights' pages are read and the caches and scratch buffers allocated before a live
    /// session's first frame, which would otherwise pay for them inside its 80 ms (for a 7B file
    /// not yet in the page cache, seconds: an underrun at the start of every `chat`).
    pub fn warm_up(&mut self) -> Result<()> {
        self.process_frame(&[0.0; FRAME_SAMPLES])?;
        self.reset();
        Ok(())
    }

    /// Bytes held by the LM's temporal KV caches (bounded by the attention window).
    pub fn kv_cache_bytes(&self) -> usize {
        self.generator.model().kv_cache_bytes()
    }

    /// Text still held back by the incremental decoder (call at the end of a stream).
    pub fn finish_text(&mut self) -> String {
        self.text.finish()
    }
}

impl FrameProcessor for MoshiPipeline {
    fn process_frame(&mut self, pcm_in: &[f32]) -> Result<FrameOutput> {
        let mut scratch = std::mem::take(&mut self.lm_scratch);
        let out = Self::process_frames(&mut [&mut *self], &[pcm_in], &mut scratch).pop();
        self.lm_scratch = scratch;
        out.expect("one session in, one output out")
    }
}

impl MoshiPipeline {
    /// One input frame (1920 samples at 24 kHz) for each of `pipelines` together: Mimi encodes
    /// them together (each session's convolutions alone, the encoder transformer's weights read
    /// once for all), one batched LM step for all of them (sessions at their first frame step
    /// twice, as [`FIRST_FRAME_LM_STEPS`] says: first those alone, then everyone), Mimi decodes
    /// them together. Session `i` gets what [`FrameProcessor::process_frame`] gives it alone, bit
    /// for bit; its error (a wrong frame size, weights it does not share) is its own. The LM stage
    /// timings of every output are the batch's; each Mimi stage time is the batch's divided
    /// evenly among the sessions in it. `scratch` holds the LM's buffers.
    ///
    /// # Panics
    /// If `frames` and `pipelines` differ in length (caller bug).
    pub fn process_frames(
        pipelines: &mut [&mut MoshiPipeline],
        frames: &[&[f32]],
        scratch: &mut LmScratch,
    ) -> Vec<Result<FrameOutput>> {
        assert_eq!(pipelines.len(), frames.len(), "one frame per session");
        let mut timings = vec![StageTimings::default(); pipelines.len()];
        let mut codes = encode_frames(pipelines, frames, &mut timings);
        // First frame twice (run_inference.py): step 0 only fills the delays. Sessions at
        // their first frame take that step alone, then every session takes one.
        let first: Vec<bool> = pipelines.iter().map(|p| p.frames_in == 0).collect();
        let mut generated: Vec<Option<GeneratedFrame>> = vec![None; pipelines.len()];
        for pass in 0..FIRST_FRAME_LM_STEPS {
            let last = pass + 1 == FIRST_FRAME_LM_STEPS;
            let stepping: Vec<bool> = first.iter().map(|&f| f || last).collect();
            let results = lm_step(pipelines, &codes, &stepping, &mut timings, scratch);
            for ((c, g), r) in codes.iter_mut().zip(&mut generated).zip(results) {
                match r {
                    Some(Ok(frame)) => *g = frame,
                    Some(Err(e)) => *c = Err(e.into()),
                    None => {}
                }
            }
        }
        for (p, c) in pipelines.iter_mut().zip(&codes) {
            if c.is_ok() {
                p.frames_in += 1;
            }
        }
        let generated = codes
            .into_iter()
            .zip(generated)
            .map(|(c, g)| c.map(|_| g))
            .collect();
        outputs_of(pipelines, generated, timings)
    }
}

/// Each session's frame through Mimi's encoder, together ([`Mimi::encode_frames`]) -> the user
/// codes the LM takes, or the session's error.
fn encode_frames(
    pipelines: &mut [&mut MoshiPipeline],
    frames: &[&[f32]],
    timings: &mut [StageTimings],
) -> Vec<Result<Vec<u32>>> {
    let mut results: Vec<Result<Vec<u32>>> = frames
        .iter()
        .zip(pipelines.iter())
        .map(|(pcm, p)| {
            if pcm.len() == FRAME_SAMPLES {
                Ok(vec![0; p.mimi.num_codebooks()])
            } else {
                Err(RuntimeError::FrameSize {
                    expected: FRAME_SAMPLES,
                    got: pcm.len(),
                })
            }
        })
        .collect();
    let sessions: Vec<usize> = (0..frames.len()).filter(|&i| results[i].is_ok()).collect();
    if sessions.is_empty() {
        return results;
    }
    let t0 = Instant::now();
    let encoded = {
        let mut mimis = mimis_of(pipelines, &sessions);
        let pcms: Vec<&[f32]> = sessions.iter().map(|&i| frames[i]).collect();
        let mut buffers: Vec<&mut [u32]> = results
            .iter_mut()
            .filter_map(|r| r.as_mut().ok().map(|c| &mut c[..]))
            .collect();
        Mimi::encode_frames(&mut mimis, &pcms, &mut buffers)
    };
    let each_ms = ms_since(t0) / sessions.len() as f64;
    for (&i, r) in sessions.iter().zip(encoded) {
        timings[i].mimi_encode_ms = each_ms;
        match r {
            Ok(()) => {
                if let Ok(c) = &mut results[i] {
                    c.truncate(pipelines[i].user_codebooks);
                }
            }
            Err(e) => results[i] = Err(e.into()),
        }
    }
    results
}

/// The Mimi streams of the sessions `sessions` (in order).
fn mimis_of<'a>(pipelines: &'a mut [&mut MoshiPipeline], sessions: &[usize]) -> Vec<&'a mut Mimi> {
    pipelines
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| sessions.contains(i))
        .map(|(_, p)| &mut p.mimi)
        .collect()
}

/// Each session's output: its generated frame decoded by Mimi, together with the others'
/// ([`Mimi::decode_frames`]; silence while the delays fill), and its text; or its error.
fn outputs_of(
    pipelines: &mut [&mut MoshiPipeline],
    generated: Vec<Result<Option<GeneratedFrame>>>,
    mut timings: Vec<StageTimings>,
) -> Vec<Result<FrameOutput>> {
    let decoding: Vec<usize> = (0..generated.len())
        .filter(|&i| matches!(generated[i], Ok(Some(_))))
        .collect();
    let mut pcms: Vec<Vec<f32>> = vec![vec![0.0; FRAME_SAMPLES]; generated.len()];
    let mut decoded: Vec<Option<moshi_model::Result<()>>> =
        (0..generated.len()).map(|_| None).collect();
    if !decoding.is_empty() {
        let t0 = Instant::now();
        let results = {
            let mut mimis = mimis_of(pipelines, &decoding);
            let codes: Vec<&[u32]> = generated
                .iter()
                .filter_map(|g| match g {
                    Ok(Some(frame)) => Some(&frame.audio[..]),
                    _ => None,
                })
                .collect();
            let mut outs: Vec<&mut [f32]> = pcms
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| decoding.contains(i))
                .map(|(_, p)| &mut p[..])
                .collect();
            Mimi::decode_frames(&mut mimis, &codes, &mut outs)
        };
        let each_ms = ms_since(t0) / decoding.len() as f64;
        for (&i, r) in decoding.iter().zip(results) {
            timings[i].mimi_decode_ms = each_ms;
            decoded[i] = Some(r);
        }
    }
    pipelines
        .iter_mut()
        .zip(generated)
        .zip(pcms)
        .zip(timings)
        .zip(decoded)
        .map(|((((p, g), pcm), timings), decoded)| {
            let Some(frame) = g? else {
                return Ok(FrameOutput {
                    pcm,
                    timings,
                    ..Default::default()
                });
            };
            decoded.expect("a generated frame is decoded")?;
            let piece = p.text.push(frame.text);
            Ok(FrameOutput {
                pcm,
                text: (!piece.is_empty()).then_some(piece),
                tokens: Some(FrameTokens {
                    text: frame.text,
                    audio: frame.audio,
                }),
                timings,
            })
        })
        .collect()
}

/// One batched generator step of the sessions marked in `stepping` whose frame was encoded, on
/// their user codes; adds the step's timings to theirs. `None` for a session that did not step.
fn lm_step(
    pipelines: &mut [&mut MoshiPipeline],
    codes: &[Result<Vec<u32>>],
    stepping: &[bool],
    timings: &mut [StageTimings],
    scratch: &mut LmScratch,
) -> Vec<Option<moshi_model::Result<Option<GeneratedFrame>>>> {
    let mut out: Vec<Option<_>> = (0..pipelines.len()).map(|_| None).collect();
    let mut gens = Vec::new();
    let mut inputs = Vec::new();
    let mut index = Vec::new();
    for (i, ((p, c), &s)) in pipelines.iter_mut().zip(codes).zip(stepping).enumerate() {
        if let (true, Ok(c)) = (s, c) {
            gens.push(&mut p.generator);
            inputs.push(StepInput::UserCodes(c));
            index.push(i);
        }
    }
    if gens.is_empty() {
        return out;
    }
    let results = Generator::step_batch(&mut gens, &inputs, scratch);
    for (i, r) in index.into_iter().zip(results) {
        add_lm_timings(&mut timings[i], &pipelines[i].generator);
        out[i] = Some(r);
    }
    out
}

impl MoshiPipeline {
    /// The end of a translated stream (`run_inference.py`, model_type "hibiki"): one LM step on
    /// user codes all equal to `card`, no audio consumed. Feed silence frames after it through
    /// [`FrameProcessor::process_frame`] until the returned text is [`MoshiPipeline::eos_text_id`].
    pub fn process_end_of_input(&mut self) -> Result<FrameOutput> {
        let mut timings = StageTimings::default();
        let generated = self.generator.step_end_of_input()?;
        add_lm_timings(&mut timings, &self.generator);
        self.frames_in += 1;
        outputs_of(&mut [self], vec![Ok(generated)], vec![timings])
            .pop()
            .expect("one session in, one output out")
    }
}

/// Adds the generator's last step timings to `timings`.
fn add_lm_timings(timings: &mut StageTimings, generator: &Generator) {
    let t = generator.last_timings();
    timings.lm_temporal_ms += t.temporal_ms;
    timings.lm_depformer_ms += t.depformer_ms;
    timings.sampling_ms += t.sampling_ms;
}
