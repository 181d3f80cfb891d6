//! The Moshi family as one model and many sessions: [`MoshiModel`] is immutable (the LM, Mimi's
//! weights, the tokenizer, the model type's conventions) and shared by `Arc`; each conversation
//! is a [`MoshiSession`] its caller owns (the LM session with its guidance row, sampling and
//! RNG, Mimi's encoder and decoder states, the text decoder). [`MoshiModel::step`] runs one
//! frame of any number of sessions: Mimi encode -> one batched LM step -> Mimi decode, the
//! weights read once for all of them, each session's output the bits it gets alone. `file`,
//! `chat`, `serve` and `bench` all drive that call; [`MoshiPipeline`] is a model and one session
//! as the engine's [`FrameProcessor`] (a batch of one).
//!
//! Conventions come from the model type ([`moshi_model::kind`]): the first user frame is fed to
//! the LM twice (`run_inference.py`: T frames in give T frames out, output frame i answering
//! input frames 0..=i); a translation model (Hibiki) is conditioned on `very_good`, guided
//! against `very_bad`, and its input ends with one end-of-stream frame
//! ([`FrameInput::EndOfInput`]), then silence until its text returns EOS. With a config whose
//! max delay is above 1, the first outputs are silence until the generator returns frames. A
//! model that generates no audio (speech to text, `dep_q` 0) has no Mimi decode: its output
//! frames are silence, its text and extra heads are in [`FrameTokens`]; how a recording is fed
//! to it is [`crate::transcribe`].

use std::sync::Arc;
use std::time::Instant;

use moshi_loader::tokenizer::{IncrementalDecoder, TextTokenizer};
use moshi_loader::{load_lm_weights, load_mimi_weights, LmConfig, ResolvedModel, WeightMode};
use moshi_model::generator::{
    GeneratedFrame, Generator, LmSession, LmSessionSettings, SamplingConfig, StepInput,
};
use moshi_model::kind::{Conventions, EndOfInput, ModelKind};
use moshi_model::mimi::{Mimi, MimiWeights};
use moshi_model::nn::KvPrecision;

use crate::engine::{FrameOutput, FrameProcessor, FrameTokens};
use crate::metrics::StageTimings;
use crate::{Result, RuntimeError, FRAME_SAMPLES};

/// What a session is made with.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionSettings {
    pub sampling: SamplingConfig,
    /// The LM's temporal KV caches in f32 (exact) or bf16 (half the memory and the bytes read
    /// per frame late in a conversation).
    pub kv_precision: KvPrecision,
    /// Classifier-free guidance coefficient of a conditioned model; `None`: the config's
    /// `lm_gen_config.cfg_coef`, else 1 (no guidance). Other than 1 on a model without
    /// conditioners is an error.
    pub cfg_coef: Option<f32>,
}

impl SessionSettings {
    /// `sampling`, f32 KV caches, the config's guidance.
    pub fn with_sampling(sampling: SamplingConfig) -> Self {
        Self {
            sampling,
            kv_precision: KvPrecision::F32,
            cfg_coef: None,
        }
    }
}

/// What a session feeds one step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FrameInput<'a> {
    /// One frame of the user's audio (24 kHz mono, [`FRAME_SAMPLES`] samples).
    Pcm(&'a [f32]),
    /// One frame's user codes, already encoded (Hibiki-Zero's `file`: its whole input encoded
    /// in one Mimi call, as Kyutai's `generate` encodes it); Mimi's encoder is not used. At least
    /// the model's user codebooks; the first of them are fed.
    Codes(&'a [u32]),
    /// The end of a translated stream (Hibiki): one LM step on user codes all equal to `card`,
    /// no audio consumed. Feed silence after it until the text returns
    /// [`MoshiModel::eos_text_id`].
    EndOfInput,
}

/// One model of the Moshi family, immutable once built; share it by `Arc`.
pub struct MoshiModel {
    lm: Generator,
    /// A fresh Mimi stream: each session's is a clone (its own states over the shared weights).
    mimi: Mimi,
    tokenizer: TextTokenizer,
    user_codebooks: usize,
}

/// One conversation over a [`MoshiModel`], owned by its caller.
#[derive(Clone)]
pub struct MoshiSession {
    settings: SessionSettings,
    lm: LmSession,
    mimi: Mimi,
    text: IncrementalDecoder,
    frames_in: u64,
}

/// What the LM step of one frame returned: the generated frame and the step's extra heads.
#[derive(Clone, Debug)]
struct LmFrame {
    frame: GeneratedFrame,
    extra_heads: Vec<Vec<f32>>,
}

/// Milliseconds since `t0`.
fn ms_since(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1e3
}

impl MoshiModel {
    /// Loads Mimi, the LM and the tokenizer of a resolved model; Mimi's products in `mimi`'s
    /// precision.
    pub fn load(model: &ResolvedModel, mode: WeightMode, mimi: MimiWeights) -> Result<Self> {
        let cfg = &model.lm_config;
        let weights = load_lm_weights(&model.lm_weights_path, cfg, mode)?;
        let lm = Generator::load(cfg, weights)?;
        let num_codebooks = cfg.dep_q.max(cfg.user_codebooks());
        let mimi_weights = load_mimi_weights(&model.mimi_weights_path, num_codebooks)?;
        let mut mimi_stream = Mimi::load(&model.mimi_config, mimi_weights, num_codebooks)?;
        mimi_stream.set_weights(mimi);
        let tokenizer = TextTokenizer::from_file(&model.tokenizer_path)?;
        Self::from_parts(mimi_stream, lm, tokenizer)
    }

    /// Builds the model from loaded parts (`mimi` a fresh stream, its weight precision set).
    pub fn from_parts(mimi: Mimi, lm: Generator, tokenizer: TextTokenizer) -> Result<Self> {
        let cfg = lm.config();
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
        Ok(Self {
            lm,
            mimi,
            tokenizer,
            user_codebooks,
        })
    }

    /// A fresh Mimi stream over the model's weights (each stream owns its states).
    pub fn mimi_stream(&self) -> Mimi {
        self.mimi.clone()
    }

    /// The LM's generator (weights, config).
    pub fn generator(&self) -> &Generator {
        &self.lm
    }

    pub fn lm_config(&self) -> &LmConfig {
        self.lm.config()
    }

    /// The model type.
    pub fn kind(&self) -> ModelKind {
        self.lm.kind()
    }

    /// The model type's conventions.
    pub fn conventions(&self) -> &'static Conventions {
        self.kind().conventions()
    }

    /// Whether the model translates (Hibiki: its input ends with [`FrameInput::EndOfInput`],
    /// its output with EOS).
    pub fn is_translation(&self) -> bool {
        matches!(
            self.kind(),
            ModelKind::Translation | ModelKind::TranslationZero
        )
    }

    /// The text id that ends a translation (the tokenizer's EOS), if the tokenizer has one.
    pub fn eos_text_id(&self) -> Option<u32> {
        self.tokenizer.eos_id()
    }

    /// The text tokenizer.
    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }

    /// Weight precision of Mimi's per-frame products.
    pub fn mimi_weights(&self) -> MimiWeights {
        self.mimi.weights()
    }

    /// The guidance coefficient `settings` give on this model.
    pub fn cfg_coef(&self, settings: &SessionSettings) -> f32 {
        settings
            .cfg_coef
            .unwrap_or_else(|| self.lm_config().default_cfg_coef())
    }

    /// Activation rows one session with `settings` adds to each LM product (2 with guidance).
    pub fn rows_per_session(&self, settings: &SessionSettings) -> usize {
        1 + usize::from(self.cfg_coef(settings) != 1.0)
    }

    /// A new conversation at its start. Errors on settings the model cannot take (a bad
    /// temperature, guidance on a model without conditioners).
    pub fn new_session(&self, settings: &SessionSettings) -> Result<MoshiSession> {
        if self.kind() == ModelKind::TextToSpeech {
            return Err(RuntimeError::TextToSpeechModel);
        }
        let conv = self.conventions();
        let lm = self.lm.new_session(LmSessionSettings {
            sampling: settings.sampling.clone(),
            kv_precision: settings.kv_precision,
            conditioning: conv.conditioning(self.lm_config(), self.cfg_coef(settings)),
            record_details: false,
            tts: Default::default(),
        })?;
        let mut mimi = self.mimi.clone();
        mimi.reset();
        Ok(MoshiSession {
            settings: settings.clone(),
            lm,
            mimi,
            text: self.tokenizer.incremental_decoder(),
            frames_in: 0,
        })
    }

    /// One frame of each of `sessions` together, session `i` fed `inputs[i]`: Mimi encodes the
    /// audio frames together (each session's convolutions alone, the encoder transformer's
    /// weights read once for all), one batched LM step for all (sessions at their first frame
    /// step [`Conventions::first_frame_lm_steps`] times: first those alone, then everyone), Mimi
    /// decodes together. Session `i` gets what it gets alone, bit for bit; its error (a wrong
    /// frame size, a session of another model) is its own. The LM stage timings of every output
    /// are the batch's; each Mimi stage time is the batch's divided evenly among its sessions.
    ///
    /// # Panics
    /// If `inputs` and `sessions` differ in length (caller bug).
    pub fn step(
        &self,
        sessions: &mut [&mut MoshiSession],
        inputs: &[FrameInput<'_>],
    ) -> Vec<Result<FrameOutput>> {
        assert_eq!(sessions.len(), inputs.len(), "one input per session");
        let mut timings = vec![StageTimings::default(); sessions.len()];
        let mut codes = encode_frames(
            sessions,
            inputs,
            self.user_codebooks,
            self.conventions(),
            &mut timings,
        );
        let generated = self.lm_passes(sessions, inputs, &mut codes, &mut timings);
        for (s, c) in sessions.iter_mut().zip(&codes) {
            if c.is_ok() {
                s.frames_in += 1;
            }
        }
        let generated = codes
            .into_iter()
            .zip(generated)
            .map(|(c, g)| c.map(|_| g))
            .collect();
        outputs_of(sessions, generated, timings)
    }

    /// The LM steps of one frame: sessions at their first audio frame take the extra steps of
    /// [`Conventions::first_frame_lm_steps`] alone, then every session takes one. A failed
    /// step turns the session's codes into its error.
    fn lm_passes(
        &self,
        sessions: &mut [&mut MoshiSession],
        inputs: &[FrameInput<'_>],
        codes: &mut [Result<Vec<u32>>],
        timings: &mut [StageTimings],
    ) -> Vec<Option<LmFrame>> {
        let first: Vec<bool> = sessions
            .iter()
            .zip(inputs)
            .map(|(s, i)| {
                s.frames_in == 0 && matches!(i, FrameInput::Pcm(_) | FrameInput::Codes(_))
            })
            .collect();
        let passes = self.conventions().first_frame_lm_steps.max(1);
        let mut generated: Vec<Option<LmFrame>> = vec![None; sessions.len()];
        for pass in 0..passes {
            let last = pass + 1 == passes;
            let stepping: Vec<bool> = first.iter().map(|&f| f || last).collect();
            let results = self.lm_step(sessions, codes, &stepping, timings);
            for ((c, g), r) in codes.iter_mut().zip(&mut generated).zip(results) {
                match r {
                    Some(Ok(frame)) => *g = frame,
                    Some(Err(e)) => *c = Err(e.into()),
                    None => {}
                }
            }
        }
        generated
    }

    /// One batched generator step of the sessions marked in `stepping` whose input is ready,
    /// on their user codes (an empty code list stands for the end of input); adds the step's
    /// timings to theirs. `None` for a session that did not step.
    fn lm_step(
        &self,
        sessions: &mut [&mut MoshiSession],
        codes: &[Result<Vec<u32>>],
        stepping: &[bool],
        timings: &mut [StageTimings],
    ) -> Vec<Option<moshi_model::Result<Option<LmFrame>>>> {
        let mut out: Vec<Option<_>> = (0..sessions.len()).map(|_| None).collect();
        let mut lms = Vec::new();
        let mut inputs = Vec::new();
        let mut index = Vec::new();
        for (i, ((s, c), &go)) in sessions.iter_mut().zip(codes).zip(stepping).enumerate() {
            if let (true, Ok(c)) = (go, c) {
                lms.push(&mut s.lm);
                inputs.push(if c.is_empty() {
                    StepInput::EndOfInput
                } else {
                    StepInput::UserCodes(c)
                });
                index.push(i);
            }
        }
        if lms.is_empty() {
            return out;
        }
        let results = self.lm.step(&mut lms, &inputs);
        for (i, r) in index.into_iter().zip(results) {
            add_lm_timings(&mut timings[i], &sessions[i].lm);
            out[i] = Some(r.map(|d| {
                d.frame.map(|frame| LmFrame {
                    frame,
                    extra_heads: d.extra_heads,
                })
            }));
        }
        out
    }
}

impl MoshiSession {
    pub fn settings(&self) -> &SessionSettings {
        &self.settings
    }

    /// The LM session (step index, guidance, KV caches).
    pub fn lm(&self) -> &LmSession {
        &self.lm
    }

    /// The LM session, e.g. to fill its caches for a benchmark of a long conversation.
    pub fn lm_mut(&mut self) -> &mut LmSession {
        &mut self.lm
    }

    /// The guidance coefficient in use (1 without guidance).
    pub fn cfg_coef(&self) -> f32 {
        self.lm.cfg_coef()
    }

    /// Bytes held by the LM's temporal KV caches (bounded by the attention window).
    pub fn kv_cache_bytes(&self) -> usize {
        self.lm.kv_cache_bytes()
    }

    /// Back to the start of a conversation: behaves exactly as a new session.
    pub fn reset(&mut self) {
        self.mimi.reset();
        self.lm.reset();
        self.text.reset();
        self.frames_in = 0;
    }

    /// Text still held back by the incremental decoder (call at the end of a stream).
    pub fn finish_text(&mut self) -> String {
        self.text.finish()
    }
}

/// A model and one session: the engine's [`FrameProcessor`] (`file`, `chat`), a batch of one.
#[derive(Clone)]
pub struct MoshiPipeline {
    model: Arc<MoshiModel>,
    session: MoshiSession,
}

impl MoshiPipeline {
    /// A new session of `model` with `settings`.
    pub fn new(model: Arc<MoshiModel>, settings: &SessionSettings) -> Result<Self> {
        let session = model.new_session(settings)?;
        Ok(Self { model, session })
    }

    /// The pipeline an engine ran, handed back by
    /// [`EngineHandle::join_with_processor`](crate::engine::EngineHandle::join_with_processor);
    /// `None` if that processor was not a pipeline.
    pub fn from_processor(processor: Box<dyn FrameProcessor>) -> Option<Self> {
        let any: Box<dyn std::any::Any> = processor;
        any.downcast::<Self>().ok().map(|p| *p)
    }

    pub fn model(&self) -> &Arc<MoshiModel> {
        &self.model
    }

    pub fn session(&self) -> &MoshiSession {
        &self.session
    }

    pub fn session_mut(&mut self) -> &mut MoshiSession {
        &mut self.session
    }

    /// One step of this session alone.
    pub fn process(&mut self, input: FrameInput<'_>) -> Result<FrameOutput> {
        self.model
            .step(&mut [&mut self.session], &[input])
            .pop()
            .expect("one session in, one output out")
    }

    /// [`FrameInput::EndOfInput`] for this session.
    pub fn process_end_of_input(&mut self) -> Result<FrameOutput> {
        self.process(FrameInput::EndOfInput)
    }

    /// Runs one frame of silence, then goes back to the start of the conversation: the
    /// weights' pages are read and the caches and scratch buffers allocated before a live
    /// session's first frame, which would otherwise pay for them inside its 80 ms (for a 7B
    /// file not yet in the page cache, seconds: an underrun at the start of every `chat`).
    pub fn warm_up(&mut self) -> Result<()> {
        self.process(FrameInput::Pcm(&[0.0; FRAME_SAMPLES]))?;
        self.session.reset();
        Ok(())
    }

    /// Back to the start of the conversation.
    pub fn reset(&mut self) {
        self.session.reset();
    }

    /// Text still held back by the incremental decoder (call at the end of a stream).
    pub fn finish_text(&mut self) -> String {
        self.session.finish_text()
    }
}

impl FrameProcessor for MoshiPipeline {
    fn process_frame(&mut self, pcm_in: &[f32]) -> Result<FrameOutput> {
        self.process(FrameInput::Pcm(pcm_in))
    }
}

/// One frame of silence: what Mimi's encoder consumes in place of the end-of-input frame when
/// that frame takes a frame's place ([`EndOfInput::AllUserCodesCardInPlaceOfAFrame`]).
static SILENCE: [f32; FRAME_SAMPLES] = [0.0; FRAME_SAMPLES];

/// Each session's audio frame through Mimi's encoder, together ([`Mimi::encode_frames`]) ->
/// the user codes the LM takes (empty for the end of input), or the session's error. Where
/// the end of input takes a frame's place ([`EndOfInput::AllUserCodesCardInPlaceOfAFrame`]) it
/// encodes a frame of silence (its codes dropped); [`Conventions::reset_encoder_after_first_frame`]
/// is applied here.
fn encode_frames(
    sessions: &mut [&mut MoshiSession],
    inputs: &[FrameInput<'_>],
    user_codebooks: usize,
    conventions: &Conventions,
    timings: &mut [StageTimings],
) -> Vec<Result<Vec<u32>>> {
    let end_consumes_a_frame =
        conventions.end_of_input == EndOfInput::AllUserCodesCardInPlaceOfAFrame;
    let ends: Vec<bool> = inputs
        .iter()
        .map(|i| end_consumes_a_frame && matches!(i, FrameInput::EndOfInput))
        .collect();
    let inputs: Vec<FrameInput<'_>> = inputs
        .iter()
        .zip(&ends)
        .map(|(&input, &end)| {
            if end {
                FrameInput::Pcm(&SILENCE)
            } else {
                input
            }
        })
        .collect();
    let mut results: Vec<Result<Vec<u32>>> = inputs
        .iter()
        .zip(sessions.iter())
        .map(|(input, s)| match input {
            FrameInput::Pcm(pcm) if pcm.len() == FRAME_SAMPLES => {
                Ok(vec![0; s.mimi.num_codebooks()])
            }
            FrameInput::Pcm(pcm) => Err(RuntimeError::FrameSize {
                expected: FRAME_SAMPLES,
                got: pcm.len(),
            }),
            FrameInput::Codes(codes) if codes.len() >= user_codebooks => {
                Ok(codes[..user_codebooks].to_vec())
            }
            FrameInput::Codes(codes) => Err(RuntimeError::CodesPerFrame {
                expected: user_codebooks,
                got: codes.len(),
            }),
            FrameInput::EndOfInput => Ok(Vec::new()),
        })
        .collect();
    let encoding: Vec<usize> = (0..inputs.len())
        .filter(|&i| matches!(inputs[i], FrameInput::Pcm(_)) && results[i].is_ok())
        .collect();
    if encoding.is_empty() {
        return results;
    }
    let t0 = Instant::now();
    let encoded = {
        let mut mimis = mimis_of(sessions, &encoding);
        let pcms: Vec<&[f32]> = encoding
            .iter()
            .map(|&i| match inputs[i] {
                FrameInput::Pcm(pcm) => pcm,
                FrameInput::Codes(_) | FrameInput::EndOfInput => {
                    unreachable!("only audio frames are encoded")
                }
            })
            .collect();
        let mut buffers: Vec<&mut [u32]> = results
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| encoding.contains(i))
            .filter_map(|(_, r)| r.as_mut().ok().map(|c| &mut c[..]))
            .collect();
        Mimi::encode_frames(&mut mimis, &pcms, &mut buffers)
    };
    let each_ms = ms_since(t0) / encoding.len() as f64;
    for (&i, r) in encoding.iter().zip(encoded) {
        timings[i].mimi_encode_ms = each_ms;
        match r {
            Ok(()) => {
                if let Ok(c) = &mut results[i] {
                    c.truncate(if ends[i] { 0 } else { user_codebooks });
                }
                if conventions.reset_encoder_after_first_frame && sessions[i].frames_in == 0 {
                    sessions[i].mimi.reset_encoder();
                }
            }
            Err(e) => results[i] = Err(e.into()),
        }
    }
    results
}

/// The Mimi streams of the sessions `which` (in order).
fn mimis_of<'a>(sessions: &'a mut [&mut MoshiSession], which: &[usize]) -> Vec<&'a mut Mimi> {
    sessions
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| which.contains(i))
        .map(|(_, p)| &mut p.mimi)
        .collect()
}

/// Each session's output: its generated frame decoded by Mimi, together with the others'
/// ([`Mimi::decode_frames`]; silence while the delays fill, and for a model that generates no
/// audio), and its text; or its error.
fn outputs_of(
    sessions: &mut [&mut MoshiSession],
    generated: Vec<Result<Option<LmFrame>>>,
    mut timings: Vec<StageTimings>,
) -> Vec<Result<FrameOutput>> {
    let decoding: Vec<usize> = (0..generated.len())
        .filter(|&i| matches!(&generated[i], Ok(Some(f)) if !f.frame.audio.is_empty()))
        .collect();
    let mut pcms: Vec<Vec<f32>> = vec![vec![0.0; FRAME_SAMPLES]; generated.len()];
    let mut decoded: Vec<Option<moshi_model::Result<()>>> =
        (0..generated.len()).map(|_| None).collect();
    if !decoding.is_empty() {
        let t0 = Instant::now();
        let results = {
            let mut mimis = mimis_of(sessions, &decoding);
            let codes: Vec<&[u32]> = generated
                .iter()
                .filter_map(|g| match g {
                    Ok(Some(f)) if !f.frame.audio.is_empty() => Some(&f.frame.audio[..]),
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
    sessions
        .iter_mut()
        .zip(generated)
        .zip(pcms)
        .zip(timings)
        .zip(decoded)
        .map(|((((s, g), pcm), timings), decoded)| {
            let Some(LmFrame { frame, extra_heads }) = g? else {
                return Ok(FrameOutput {
                    pcm,
                    timings,
                    ..Default::default()
                });
            };
            // A frame with audio was decoded; one without (speech to text) stays silence.
            decoded.unwrap_or(Ok(()))?;
            let piece = s.text.push(frame.text);
            Ok(FrameOutput {
                pcm,
                text: (!piece.is_empty()).then_some(piece),
                tokens: Some(FrameTokens {
                    text: frame.text,
                    audio: frame.audio,
                    extra_heads,
                }),
                timings,
            })
        })
        .collect()
}

/// Adds the LM session's last step timings to `timings`.
fn add_lm_timings(timings: &mut StageTimings, lm: &LmSession) {
    let t = lm.last_timings();
    timings.lm_temporal_ms += t.temporal_ms;
    timings.lm_depformer_ms += t.depformer_ms;
    timings.sampling_ms += t.sampling_ms;
}
