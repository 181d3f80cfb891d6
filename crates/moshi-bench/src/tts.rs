//! `moshi-rs bench` on a text-to-speech model (Kyutai's TTS, `model_type` "tts"): N streams of
//! [`TtsSpeaker`] over one model, each with its own random voice (slot 0 of the `speaker_wavs`
//! condition, as one `--voice` gives) and an endless synthetic script pushed word by word as the
//! stream asks for text (as `speak` reads lines). Every frame is one
//! [`TtsSpeaker::step_together`] of all streams (one LM pass, each stream's Mimi decode).
//!
//! Before the frames, [`TtsStage::start_streams`] measures the time to first audio: the streams'
//! setup (each voice's cross-attention keys and values for every layer, the LM state, the Mimi
//! decoder) and the LM steps until every stream has returned a frame with PCM.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use moshi_loader::voice::Voice;
use moshi_loader::LmConfig;
use moshi_model::lm::LmWeights;
use moshi_model::rng::Rng;
use moshi_model::tts::machine::Entry;
use moshi_model::tts::script::{ScriptOptions, ScriptReader, WordEncoder};
use moshi_model::tts::{speaker_condition, TtsSettings, SPEAKER_CONDITIONER};
use moshi_runtime::engine::{FrameOutput, FrameProcessor};
use moshi_runtime::metrics::StageTimings;
use moshi_runtime::pipeline::{MoshiModel, SessionSettings};
use moshi_runtime::speak::TtsSpeaker;
use moshi_runtime::{Result, FRAME_SAMPLES};
use serde::Serialize;

use crate::BenchError;

/// Frames of a random voice: Kyutai's voices are 10 s of Mimi latents (`kyutai/tts-voices`).
pub const VOICE_FRAMES: usize = 125;

/// Most tokens a synthetic word has (each has 1 to this many).
const MAX_WORD_TOKENS: usize = 3;

/// Padding forced between words (`speak --padding-between`'s default, Kyutai's scripts').
const PADDING_BETWEEN: usize = 1;

/// A random voice of the model's `speaker_wavs` width, standard deviation 1.
pub fn random_voice(dim: usize, seed: u64) -> Voice {
    let mut rng = Rng::new(seed ^ 0x7015_CE00);
    let a = 3f32.sqrt();
    Voice {
        path: PathBuf::from(format!("<random voice, seed {seed}>")),
        values: (0..VOICE_FRAMES * dim)
            .map(|_| (rng.next_f32() * 2.0 - 1.0) * a)
            .collect(),
        frames: VOICE_FRAMES,
        dim,
    }
}

/// The tokens of synthetic word `w{i}`: 1 to [`MAX_WORD_TOKENS`] tokens above the special ones
/// (WORD, the speakers, PAD), fixed by `i` and the seed.
fn word_tokens(word: &str, text_card: usize, seed: u64) -> moshi_model::Result<Vec<u32>> {
    let i: u64 = word
        .strip_prefix('w')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| moshi_model::ModelError::BadScript {
            reason: format!("synthetic word {word:?} is not w<number>"),
        })?;
    let mut rng = Rng::new(seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let first = 4u32;
    let span = text_card.saturating_sub(first as usize).max(1) as u64;
    let n = 1 + rng.next_u64() as usize % MAX_WORD_TOKENS;
    Ok((0..n)
        .map(|_| first + (rng.next_u64() % span) as u32)
        .collect())
}

/// One stream's endless synthetic script: words `w0`, `w1`, .. turned into entries by the
/// script reader `speak` uses (speaker token on the first word, padding between words).
struct SyntheticScript {
    next_word: u64,
    text_card: usize,
    seed: u64,
    options: ScriptOptions,
    started: bool,
}

impl SyntheticScript {
    fn new(cfg: &LmConfig, multi_speaker: bool, seed: u64) -> Self {
        Self {
            next_word: 0,
            text_card: cfg.text_card,
            seed,
            options: ScriptOptions {
                multi_speaker,
                padding_between: PADDING_BETWEEN,
                moshi_server: false,
            },
            started: false,
        }
    }

    /// The entries of the next word.
    fn next_entries(&mut self) -> moshi_model::Result<Vec<Entry>> {
        let (text_card, seed) = (self.text_card, self.seed);
        let encode = |w: &str| word_tokens(w, text_card, seed);
        let encode: &WordEncoder = &encode;
        let mut reader = ScriptReader::new(encode, self.options);
        let word = format!("w{}", self.next_word);
        self.next_word += 1;
        let starts_turn = !self.started;
        self.started = true;
        reader.turn_part(0, &word, starts_turn)
    }

    /// Pushes words until `speaker` may step (the text it may need is there).
    fn feed(&mut self, speaker: &mut TtsSpeaker) -> moshi_model::Result<()> {
        while !speaker.is_ready() {
            speaker.push(self.next_entries()?);
        }
        Ok(())
    }
}

/// What every stream of a run is made with.
#[derive(Clone, Debug)]
pub struct TtsStreamSettings {
    pub session: SessionSettings,
    /// The guidance strength, the `cfg` condition of a CFG-distilled model.
    pub cfg_coef: f32,
    /// Stream `i`'s voice, script and sampling seed derive from `seed + i`.
    pub seed: u64,
    /// Audio codebooks generated ([`TtsSettings::n_q`]); `None`: all.
    pub n_q: Option<usize>,
}

/// The time to first audio of a set of streams started together.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FirstAudio {
    /// Making every stream, one after the other (each voice's cross-attention keys and values
    /// for every layer, its LM state, its Mimi decoder), ms.
    pub setup_ms: f64,
    /// LM steps until every stream had returned a frame with PCM.
    pub steps: usize,
    /// How many of those ran the depformer (none before the audio's delay).
    pub depformer_steps: usize,
    /// Those steps (LM pass, sampling, the machine, Mimi decode), ms.
    pub steps_ms: f64,
    /// Of which the temporal transformer (+ text head), ms.
    pub temporal_ms: f64,
    /// Of which the depformer, ms.
    pub depformer_ms: f64,
    /// `setup_ms + steps_ms`: compute from the streams' creation to their first PCM.
    pub total_ms: f64,
}

/// What [`TtsStage::start_measured`] measured.
#[derive(Clone, Debug)]
pub struct TtsStart {
    pub cold: FirstAudio,
    pub warm: FirstAudio,
    /// One voice's cross-attention keys and values alone, the first and the next.
    pub cross_kv: Option<CrossKvTimes>,
    /// Cross-attention source positions per stream (speaker slots x voice frames).
    pub source_positions: usize,
    /// Audio codebooks each stream generates.
    pub codebooks: usize,
}

/// N TTS streams stepped together, one frame per [`FrameProcessor::process_frame`].
pub struct TtsStage {
    model: Arc<MoshiModel>,
    settings: TtsStreamSettings,
    count: usize,
    streams: Vec<(TtsSpeaker, SyntheticScript)>,
}

impl TtsStage {
    /// A stage of `count` streams of `model` (a TTS model); the streams are made by
    /// [`TtsStage::start_streams`].
    pub fn new(model: Arc<MoshiModel>, count: usize, settings: TtsStreamSettings) -> Self {
        Self {
            model,
            settings,
            count,
            streams: Vec::new(),
        }
    }

    fn new_stream(&self, i: usize) -> Result<(TtsSpeaker, SyntheticScript)> {
        let weights = self.model.generator().weights();
        let cross = weights.conditions().cross_conditioners();
        let seed = self.settings.seed.wrapping_add(i as u64);
        let voices: Vec<Voice> = cross
            .first()
            .map(|c| random_voice(c.dim(), seed))
            .into_iter()
            .collect();
        let mut session = self.settings.session.clone();
        session.sampling.seed = seed;
        // A new voice for every stream: its keys and values are computed at its start (streams
        // of one known voice share them).
        let speakers = TtsSpeaker::speakers(&self.model, &voices)?;
        let speaker = TtsSpeaker::new(
            &self.model,
            &session,
            TtsSettings {
                n_q: self.settings.n_q,
                ..TtsSettings::default()
            },
            speakers,
            self.settings.cfg_coef,
        )?;
        let script = SyntheticScript::new(self.model.lm_config(), !cross.is_empty(), seed);
        Ok((speaker, script))
    }

    /// Replaces the streams by fresh ones and steps them until each has returned a frame with
    /// PCM: the time to first audio. The streams then go on (the frames that follow are the
    /// steady state).
    pub fn start_streams(&mut self) -> std::result::Result<FirstAudio, BenchError> {
        self.streams.clear();
        let started = Instant::now();
        for i in 0..self.count {
            let stream = self.new_stream(i)?;
            self.streams.push(stream);
        }
        let setup_ms = ms_since(started);
        let mut first = FirstAudio {
            setup_ms,
            ..Default::default()
        };
        let mut heard = vec![false; self.count];
        // A stream whose audio never starts is a bug; bound the wait by the model's delays.
        let limit = first_audio_step_limit(self.model.lm_config());
        while heard.contains(&false) {
            if first.steps == limit {
                return Err(BenchError::NoFirstAudio { steps: limit });
            }
            let t0 = Instant::now();
            let pcm = self.step_all()?;
            first.steps_ms += ms_since(t0);
            first.steps += 1;
            let lm = self.streams[0].0.lm();
            let t = lm.last_timings();
            first.temporal_ms += t.temporal_ms;
            first.depformer_ms += t.depformer_ms;
            let step = lm.step_index() - 1;
            if lm.tts().is_some_and(|tts| tts.runs_depformer(step)) {
                first.depformer_steps += 1;
            }
            heard.iter_mut().zip(pcm).for_each(|(h, p)| *h |= p);
        }
        first.total_ms = first.setup_ms + first.steps_ms;
        Ok(first)
    }

    /// Starts the streams twice: the first streams after the model was built (cold), then,
    /// after timing one voice's cross-attention keys and values alone, fresh streams on the
    /// warm model, which go on into the timed frames.
    pub fn start_measured(&mut self) -> std::result::Result<TtsStart, BenchError> {
        let cold = self.start_streams()?;
        let cross_kv =
            time_cross_keys_values(self.model.generator().weights(), self.settings.seed)?;
        let warm = self.start_streams()?;
        let cfg = self.model.lm_config();
        let voiced = !self
            .model
            .generator()
            .weights()
            .conditions()
            .cross_conditioners()
            .is_empty();
        let max_speakers = cfg.tts_config.as_ref().map_or(1, |t| t.max_speakers());
        Ok(TtsStart {
            cold,
            warm,
            cross_kv,
            codebooks: self.settings.n_q.unwrap_or(cfg.dep_q),
            source_positions: if voiced {
                max_speakers * VOICE_FRAMES
            } else {
                0
            },
        })
    }

    /// Bytes of the cross-attention keys and values every stream's steps read (all layers).
    pub fn cross_kv_bytes(&self) -> u64 {
        self.streams
            .iter()
            .map(|(speaker, _)| speaker.lm().row().temporal().cross_bytes() as u64)
            .sum()
    }

    /// One step of every stream (text fed as each asks for it); whether each returned PCM.
    fn step_all(&mut self) -> Result<Vec<bool>> {
        for (speaker, script) in &mut self.streams {
            script.feed(speaker)?;
        }
        let mut speakers: Vec<&mut TtsSpeaker> =
            self.streams.iter_mut().map(|s| &mut s.0).collect();
        TtsSpeaker::step_together(&self.model, &mut speakers)
            .into_iter()
            .map(|r| Ok(r?.is_some_and(|f| f.pcm.is_some())))
            .collect()
    }
}

/// Steps after which a stream must have returned audio: the audio delay, the codebooks' delays
/// and a margin.
fn first_audio_step_limit(cfg: &LmConfig) -> usize {
    let delay = cfg.tts_config.as_ref().map_or(0, |t| t.delay_steps());
    delay + cfg.delays.iter().copied().max().unwrap_or(0) + 8
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

impl FrameProcessor for TtsStage {
    fn process_frame(&mut self, _pcm_in: &[f32]) -> Result<FrameOutput> {
        for (speaker, script) in &mut self.streams {
            script.feed(speaker)?;
        }
        let t0 = Instant::now();
        let mut speakers: Vec<&mut TtsSpeaker> =
            self.streams.iter_mut().map(|s| &mut s.0).collect();
        let frames = TtsSpeaker::step_together(&self.model, &mut speakers);
        let step_ms = ms_since(t0);
        let mut pcm = None;
        for f in frames {
            if let Some(p) = f?.and_then(|f| f.pcm) {
                pcm.get_or_insert(p);
            }
        }
        // Temporal and depformer times are the batch's; sampling is each stream's own; the
        // rest of the step is the streams' Mimi decodes (and the state machines).
        let t = self.streams[0].0.lm().last_timings();
        let sampling_ms: f64 = self
            .streams
            .iter()
            .map(|s| s.0.lm().last_timings().sampling_ms)
            .sum();
        let lm_ms = t.temporal_ms + t.depformer_ms + sampling_ms;
        Ok(FrameOutput {
            pcm: pcm.unwrap_or_else(|| vec![0.0; FRAME_SAMPLES]),
            timings: StageTimings {
                lm_temporal_ms: t.temporal_ms,
                lm_depformer_ms: t.depformer_ms,
                sampling_ms,
                mimi_decode_ms: (step_ms - lm_ms).max(0.0),
                ..Default::default()
            },
            ..Default::default()
        })
    }
}

/// The cross-attention keys and values of a voice, timed alone: the first voice (every source
/// position computed) and the next one (only its own positions: the empty speaker slots' are
/// taken from the first's).
#[derive(Clone, Copy, Debug, Default)]
pub struct CrossKvTimes {
    pub first_ms: f64,
    pub first_gflop: f64,
    pub next_ms: f64,
    pub next_gflop: f64,
}

/// [`CrossKvTimes`] of two random voices for every temporal layer of `weights`; `None` for a
/// model without cross-attention.
pub fn time_cross_keys_values(
    weights: &LmWeights,
    seed: u64,
) -> std::result::Result<Option<CrossKvTimes>, BenchError> {
    let cfg = weights.config();
    let Some(conditioner) = weights.conditions().cross_conditioners().first() else {
        return Ok(None);
    };
    let max_speakers = cfg.tts_config.as_ref().map_or(1, |t| t.max_speakers());
    let source_of = |seed: u64| -> std::result::Result<Option<Vec<f32>>, BenchError> {
        let condition = speaker_condition(&[random_voice(conditioner.dim(), seed)], max_speakers)?;
        Ok(weights
            .conditions()
            .cross_source(&[(SPEAKER_CONDITIONER, &condition)])?)
    };
    let (Some(first), Some(next)) = (source_of(seed)?, source_of(seed ^ 1)?) else {
        return Ok(None);
    };
    let temporal = weights.temporal();
    let t0 = Instant::now();
    let kv = temporal.cross_keys_values(&first);
    let first_ms = ms_since(t0);
    let Some(kv) = kv else {
        return Ok(None);
    };
    let t0 = Instant::now();
    let _ = temporal.cross_keys_values_reusing(&next, (&first, &kv));
    let next_ms = ms_since(t0);
    // Keys and values: a [2 dim, dim] product per source position and layer.
    let per_position = 2.0 * (2 * cfg.dim * cfg.dim) as f64 * kv.len() as f64 / 1e9;
    let dim = cfg.dim;
    let own = (0..next.len() / dim)
        .filter(|&j| first[j * dim..(j + 1) * dim] != next[j * dim..(j + 1) * dim])
        .count();
    Ok(Some(CrossKvTimes {
        first_ms,
        first_gflop: per_position * (first.len() / dim) as f64,
        next_ms,
        next_gflop: per_position * own as f64,
    }))
}
