//! One `moshi-rs bench` run: builds the models a stage needs (random weights of a config's shapes,
//! or a checkpoint as stored), runs warm-up and timed frames through them, probes the memory read
//! bandwidth before and after, and assembles the [`BenchReport`] (measured figures, the bandwidth
//! bound and, for a `--layers N` run, the extrapolation to the config's depth).
//!
//! The caller sets up the compute pool (`threads` workers), the tracing subscriber (with the
//! [`SpanTimerLayer`](crate::span_timer::SpanTimerLayer) whose totals it passes in) and prints.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use moshi_kernels::{
    ActivationPrecision, Kernel, QuantAlgorithm, Workload, KERNEL_ENV, SUPPORTED_GROUP_SIZES,
};
use moshi_loader::tokenizer::TextTokenizer;
use moshi_loader::{load_mimi_weights, LmConfig, MimiConfig, WeightMap};
use moshi_model::generator::{Generator, LmSessionSettings, SamplingConfig};
use moshi_model::kind::ModelKind;
use moshi_model::lm::random::{random_lm_weights, RandomWeightKind};
use moshi_model::lm::LmWeights;
use moshi_model::mimi::{Mimi, MimiWeights};
use moshi_model::nn::KvPrecision;
use moshi_runtime::engine::FrameProcessor;
use moshi_runtime::pipeline::{MoshiModel, SessionSettings};
use moshi_runtime::FRAME_MS;

use crate::bandwidth::{measure_read_bandwidth_gbps_with, DEFAULT_PASSES};
use crate::checkpoint::{load_checkpoint_lm, resolve_model};
use crate::extrapolate::extrapolate_to_full_depth;
use crate::format::WeightFormat;
use crate::frame_probe::FrameProbe;
use crate::frames::{run_frames, FrameLog};
use crate::kv_traffic::kv_read_per_layer_bytes;
use crate::memory::{ensure_fits, peak_resident_bytes, reset_peak_resident};
use crate::report::{
    aggregate_frames_per_s, real_time_factor, BandwidthBound, BenchReport, MachineInfo, RunInfo,
    TtsFigures, WeightBytes, BENCH_SCHEMA_VERSION,
};
use crate::sessions::{LmStage, SessionsPipeline};
use crate::span_timer::SpanTotals;
use crate::stages::{DepformerStage, EchoCancelStage, MimiStage};
use crate::synthetic_tokenizer::synthetic_tokenizer;
use crate::tts::{TtsStage, TtsStart, TtsStreamSettings};
use crate::BenchError;

/// What a run times (`--stage`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Mimi encode -> LM step -> Mimi decode, as in `file` and `chat`.
    All,
    /// Mimi encode + decode only.
    Mimi,
    /// The LM step only (temporal transformer, depformer, sampling), random user codes.
    Lm,
    /// The depformer only (its sub-steps per frame).
    Depformer,
    /// `chat`'s echo canceller only (resampling and AEC3 on a frame with its echo).
    EchoCancel,
}

impl Stage {
    /// `all`, `mimi`, `lm` or `depformer` (command line and reports).
    pub fn name(self) -> &'static str {
        match self {
            Stage::All => "all",
            Stage::Mimi => "mimi",
            Stage::Lm => "lm",
            Stage::Depformer => "depformer",
            Stage::EchoCancel => "echo-cancel",
        }
    }

    fn needs_mimi(self) -> bool {
        matches!(self, Stage::All | Stage::Mimi)
    }

    fn needs_lm(self) -> bool {
        !matches!(self, Stage::Mimi | Stage::EchoCancel)
    }

    /// LM steps the first frame takes: the temporal KV caches grow by one position per step
    /// (warm-up included) up to the context; the pipeline's first frame steps as the model
    /// type's conventions say (twice).
    fn first_frame_lm_steps(self, cfg: &LmConfig) -> usize {
        match self {
            Stage::All => ModelKind::of(cfg).conventions().first_frame_lm_steps,
            Stage::Lm => 1,
            Stage::Mimi | Stage::Depformer | Stage::EchoCancel => 0,
        }
    }
}

/// Where the weights come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WeightSource {
    /// Random weights of the config's shapes (`--random-weights`).
    Random,
    /// A checkpoint folder, file or Hub repo id (`--model`).
    Checkpoint(String),
}

/// Everything a run is told (the `moshi-rs bench` options).
#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub weights: WeightSource,
    /// LM config file (default: the checkpoint's, or moshiko 7B for random weights).
    pub config: Option<PathBuf>,
    /// Run only the first N temporal layers (the rest is extrapolated).
    pub layers: Option<usize>,
    /// Weight format (default: q4 for random weights, the config's file for a checkpoint).
    pub quant: Option<WeightFormat>,
    /// Group size of random q4/q8 weights (default: the release's).
    pub group_size: Option<usize>,
    /// Timed frames.
    pub frames: usize,
    /// Untimed frames run first.
    pub warmup: usize,
    /// Random positions put into every temporal KV cache before the warm-up.
    pub kv_prefill: usize,
    pub kv_cache: KvPrecision,
    /// How the quantized products hold their activations (exact, or rounded to 16 or 8 bits per
    /// group).
    pub activations: ActivationPrecision,
    /// Workers of the compute pool the caller set up; the bandwidth probe uses as many.
    pub threads: usize,
    pub stage: Stage,
    /// Seed of the random weights, the input signal and sampling.
    pub seed: u64,
    pub mimi_weights: MimiWeights,
    /// Buffer of the memory read-bandwidth probe, MiB.
    pub bandwidth_buffer_mib: usize,
    /// A read-bandwidth probe (two passes) before every this many timed frames, each frame's LM
    /// step set against it (`--probe-every`); 0: none.
    pub probe_every: usize,
    /// Classifier-free guidance coefficient of a conditioned config (Hibiki); `None`: the
    /// config's default, else 1 (no guidance).
    pub cfg_coef: Option<f32>,
    /// Conversations stepped together over one set of weights (`--sessions`, stages all and lm).
    pub sessions: usize,
    /// Audio codebooks a text-to-speech model generates (`--tts-n-q`); `None`: all.
    pub tts_n_q: Option<usize>,
    /// Keep every timed frame's record for the report's `frames` (`--json`): in a temporary
    /// file, not in memory. Without it `frames` is empty.
    pub keep_frames: bool,
}

/// Most sessions `--sessions` accepts (as `serve --max-sessions`).
pub const MAX_SESSIONS: usize = 64;

/// The models a run needs, their config and where they came from.
struct Loaded {
    lm: Option<Generator>,
    /// Mimi and the text tokenizer (stages that run Mimi).
    codec: Option<(Mimi, TextTokenizer)>,
    cfg: LmConfig,
    layers_config: usize,
    config_origin: String,
    /// Weight format for the reports: `bf16`, `q8`, `q4`, or with a group size other than the
    /// release one, e.g. `q4g64`.
    quant: String,
    weights: WeightBytes,
}

/// One memory read-bandwidth probe of `buffer_mib` MiB with `threads` threads, GB/s.
fn probe_bandwidth(threads: usize, buffer_mib: usize) -> f64 {
    measure_read_bandwidth_gbps_with(threads, buffer_mib.max(1) << 20, DEFAULT_PASSES)
}

/// Runs the benchmark `options` describe. `spans` are the totals of the span timer installed by
/// the caller (for the per-layer time of `--layers` runs); `progress` receives a line at each
/// step (loading, warm-up, probes).
pub fn run_bench(
    options: &BenchOptions,
    spans: Option<&SpanTotals>,
    progress: &mut dyn FnMut(&str),
) -> Result<BenchReport, BenchError> {
    if options.frames == 0 {
        return Err(BenchError::ZeroCount { flag: "--frames" });
    }
    let threads = options.threads;
    // Bandwidth is probed before the model is loaded and again after the timed frames; the best
    // probe is kept (a busy machine only ever makes a probe slower).
    ensure_fits(
        || format!("--bandwidth-buffer-mib {}", options.bandwidth_buffer_mib),
        (options.bandwidth_buffer_mib as u64) << 20,
    )?;
    progress(&format!(
        "measuring memory read bandwidth with {threads} threads ..."
    ));
    let mut probes = vec![probe_bandwidth(threads, options.bandwidth_buffer_mib)];
    let reads_lm = matches!(options.stage, Stage::All | Stage::Lm | Stage::Depformer);
    let probe_buffer = (options.probe_every > 0 && reads_lm)
        .then(|| FrameProbe::buffer(threads, options.bandwidth_buffer_mib << 20))
        .flatten();
    let probe_buffer_bytes = probe_buffer.as_ref().map_or(0, |b| b.bytes() as u64);
    // The probe's buffer is freed; do not let it count as the model's peak memory.
    if !reset_peak_resident() {
        tracing::debug!(
            "cannot reset the peak resident set; peak memory includes the bandwidth probe"
        );
    }
    check_sessions(options)?;
    let sessions = options.sessions as u64;
    let loaded = load(options, progress)?;
    let layers_run = loaded.cfg.num_layers;
    let tts = loaded.cfg.is_text_to_speech();
    let cfg_coef = match (options.cfg_coef, tts) {
        (Some(coef), _) => coef,
        (None, true) => DEFAULT_TTS_CFG_COEF,
        (None, false) => loaded.cfg.default_cfg_coef(),
    };
    // A TTS model's guidance is a condition of its one row (CFG distillation), checked against
    // its `cfg` values when the streams are made.
    let lm_rows: u64 = if tts {
        check_tts(options, &loaded)?;
        1
    } else {
        check_guidance(cfg_coef, &loaded, options.stage)?;
        // Guidance runs a second row per session over the same weights, in the same batched
        // step (the weights are read once per frame); each row has its own KV caches.
        if cfg_coef != 1.0 {
            2
        } else {
            1
        }
    };
    // The kernels' default follows the rows of each product, as `serve --max-sessions N` declares
    // them (a later run in the same process keeps the first run's kernel, as products did).
    let kernel = Kernel::init(Workload::of_rows(lm_rows as usize * options.sessions))
        .unwrap_or_else(|e| {
            tracing::debug!("{e}");
            e.chosen
        });
    // Process-wide, as the live commands set it; every product of this run reads it.
    moshi_kernels::set_activation_precision(options.activations);
    let mut first_frame_steps = options.stage.first_frame_lm_steps(&loaded.cfg);
    if options.kv_prefill > 0 {
        if first_frame_steps == 0 {
            return Err(BenchError::KvPrefillWithoutLm {
                stage: options.stage.name(),
            });
        }
        if options.kv_prefill > loaded.cfg.context {
            return Err(BenchError::KvPrefillAboveContext {
                positions: options.kv_prefill,
                context: loaded.cfg.context,
                config: loaded.config_origin,
            });
        }
        let cfg = &loaded.cfg;
        ensure_fits(
            || {
                format!(
                    "--kv-prefill {} ({} layers of dim {}, {} KV cache, {} LM rows)",
                    options.kv_prefill,
                    cfg.num_layers,
                    cfg.dim,
                    options.kv_cache,
                    lm_rows * sessions
                )
            },
            [
                lm_rows as usize * options.sessions,
                options.kv_prefill,
                2,
                options
                    .kv_cache
                    .bytes_per_position(cfg.dim, cfg.dim / cfg.num_heads),
                cfg.num_layers,
            ]
            .iter()
            .map(|&x| x as u64)
            .product(),
        )?;
    }
    let Loaded {
        lm,
        mut codec,
        cfg,
        layers_config,
        config_origin,
        quant,
        mut weights,
    } = loaded;
    weights.weight_passes_per_frame = 1;
    if let Some((mimi, _)) = codec.as_mut() {
        mimi.set_weights(options.mimi_weights);
        progress(&format!("Mimi weights: {}", options.mimi_weights));
    }
    // AVX-512 VNNI reads 4-bit and 8-bit codes (in panels); the other integer-digit kernels take
    // 4-bit codes only, and their 8-bit products run the f32 sibling.
    let eight_bit = match kernel.algorithm() {
        QuantAlgorithm::IntegerDigits if kernel != Kernel::Avx512Vnni => {
            format!(
                "; 8-bit products on the f32 {} kernel",
                kernel.f32_sibling()
            )
        }
        QuantAlgorithm::IntegerDigits | QuantAlgorithm::F32 => String::new(),
    };
    progress(&format!(
        "kernels: {kernel}{eight_bit} (set {KERNEL_ENV} to pick another); activations: {}",
        options.activations
    ));
    if options.kv_prefill > 0 {
        progress(&format!(
            "filling the temporal KV caches with {} random positions ...",
            options.kv_prefill
        ));
    }
    let (mut processor, tts_start): (Box<dyn FrameProcessor>, _) =
        if tts && options.stage == Stage::All {
            progress(&format!(
                "starting {} text-to-speech stream(s) until their first audio, twice ...",
                options.sessions
            ));
            let mut stage = tts_stage(options, cfg_coef, lm, codec)?;
            let start = stage.start_measured()?;
            // The timed frames continue the streams: their caches hold the first-audio steps.
            first_frame_steps = start.warm.steps + 1;
            weights.cross_kv_read_per_frame_bytes = stage.cross_kv_bytes();
            if let Some(n) = options.tts_n_q {
                weights.make_codebooks(n, cfg.dep_q);
            }
            (Box::new(stage), Some(start))
        } else {
            (stage_processor(options, cfg_coef, lm, codec)?, None)
        };
    let kv_layer_bytes = if first_frame_steps > 0 {
        // The prefilled positions count as LM steps taken before the first frame's.
        let steps_by_first_frame = options.kv_prefill + first_frame_steps;
        let kv_width = cfg.dim / cfg.kv_repeat;
        let position_bytes = options
            .kv_cache
            .bytes_per_position(kv_width, cfg.dim / cfg.num_heads);
        kv_read_per_layer_bytes(
            position_bytes,
            cfg.context,
            steps_by_first_frame,
            options.warmup,
            options.frames,
        )
    } else {
        0
    };
    let kv_rows = lm_rows * sessions;
    weights.kv_cache_layer_read_bytes = kv_layer_bytes * kv_rows;
    weights.kv_cache_read_per_frame_bytes = kv_layer_bytes * kv_rows * layers_run as u64;

    progress(&format!(
        "running {} warm-up + {} timed frames ({}, stage {}) ...",
        options.warmup,
        options.frames,
        quant,
        options.stage.name()
    ));
    let log = options
        .keep_frames
        .then(FrameLog::create)
        .transpose()
        .map_err(BenchError::FrameLog)?;
    let mut probe = probe_buffer.and_then(|buffer| {
        FrameProbe::new(
            buffer,
            options.probe_every,
            weights.lm_read_per_frame_bytes(),
        )
    });
    let run = run_frames(
        processor.as_mut(),
        options.warmup,
        options.frames,
        options.seed,
        spans,
        log,
        probe.as_mut(),
    )?;
    drop(processor);
    // Read the peak before the bandwidth probe allocates its own buffer; the buffer of the probes
    // beside the frames was resident since the peak's reset, so it comes off exactly.
    let peak_memory_bytes = peak_resident_bytes().map(|p| p.saturating_sub(probe_buffer_bytes));
    progress("measuring memory read bandwidth again ...");
    probes.push(probe_bandwidth(threads, options.bandwidth_buffer_mib));
    let read_bandwidth_gbps = probes.iter().copied().fold(0.0, f64::max);

    let stats = run.stages.stats();
    let bound = BandwidthBound {
        beside_frames: probe.map(|p| p.figures()),
        ..BandwidthBound::new(
            weights.lm_read_per_frame_bytes(),
            read_bandwidth_gbps,
            stats.lm_step_ms.p50,
        )
    };
    let extrapolated = if matches!(options.stage, Stage::All | Stage::Lm) {
        extrapolate_to_full_depth(
            &stats,
            &run.layer_ms,
            &weights,
            layers_run,
            layers_config,
            read_bandwidth_gbps,
        )
    } else {
        None
    };
    let (weight_source, model) = match &options.weights {
        WeightSource::Random => ("random", None),
        WeightSource::Checkpoint(spec) => ("checkpoint", Some(spec.clone())),
    };
    let tts = tts_start.map(|start| {
        tts_figures(
            start,
            &cfg,
            &weights,
            cfg_coef,
            options.sessions,
            read_bandwidth_gbps,
        )
    });
    Ok(BenchReport {
        schema_version: BENCH_SCHEMA_VERSION,
        tool: "moshi-rs bench".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        run: RunInfo {
            weights: weight_source.into(),
            model,
            config: config_origin,
            quant,
            mimi_weights: options.mimi_weights.to_string(),
            quant_kernel: kernel.name().into(),
            activations: options.activations.name().into(),
            stage: options.stage.name().into(),
            layers_run,
            layers_config,
            frames: options.frames,
            warmup_frames: options.warmup,
            kv_prefill_positions: options.kv_prefill,
            kv_cache: options.kv_cache.name().into(),
            threads,
            seed: options.seed,
            cfg_coef: cfg_coef as f64,
            lm_rows: lm_rows as usize,
            sessions: options.sessions,
        },
        machine: MachineInfo {
            os: std::env::consts::OS.into(),
            arch: std::env::consts::ARCH.into(),
            logical_cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            read_bandwidth_gbps,
            read_bandwidth_probes_gbps: probes,
            transparent_huge_pages: moshi_kernels::huge_pages::transparent_huge_pages_setting(),
            peak_memory_bytes,
        },
        frame_budget_ms: FRAME_MS,
        real_time_factor: real_time_factor(&stats),
        aggregate_frames_per_s: aggregate_frames_per_s(&stats, options.sessions),
        stages: stats,
        weights,
        bound,
        extrapolated,
        tts,
        frames: run.log,
    })
}

/// The speak command's default guidance strength of a CFG-distilled TTS model.
pub const DEFAULT_TTS_CFG_COEF: f32 = 2.0;

/// Checks the options a text-to-speech config takes: its streams run through the whole
/// pipeline (LM and Mimi decode), and their caches fill as they speak.
fn check_tts(options: &BenchOptions, loaded: &Loaded) -> Result<(), BenchError> {
    if !matches!(options.stage, Stage::All | Stage::Mimi) {
        return Err(BenchError::TextToSpeechStage {
            stage: options.stage.name(),
            config: loaded.config_origin.clone(),
        });
    }
    if options.kv_prefill > 0 {
        return Err(BenchError::TextToSpeechKvPrefill {
            positions: options.kv_prefill,
            config: loaded.config_origin.clone(),
        });
    }
    Ok(())
}

/// The TTS stage of `options.sessions` streams over the model built from `lm` and `codec`.
fn tts_stage(
    options: &BenchOptions,
    cfg_coef: f32,
    lm: Option<Generator>,
    codec: Option<(Mimi, TextTokenizer)>,
) -> Result<TtsStage, BenchError> {
    let missing = |part| BenchError::StageWithoutPart {
        stage: options.stage.name(),
        part,
    };
    let lm = lm.ok_or_else(|| missing("LM"))?;
    let (mimi, tokenizer) = codec.ok_or_else(|| missing("Mimi"))?;
    let model = Arc::new(MoshiModel::from_parts(mimi, lm, tokenizer)?);
    Ok(TtsStage::new(
        model,
        options.sessions,
        TtsStreamSettings {
            session: SessionSettings {
                sampling: SamplingConfig::default(),
                kv_precision: options.kv_cache,
                cfg_coef: None,
            },
            cfg_coef,
            seed: options.seed,
            n_q: options.tts_n_q,
        },
    ))
}

/// The report's TTS figures from what the streams' start measured.
fn tts_figures(
    start: TtsStart,
    cfg: &LmConfig,
    weights: &WeightBytes,
    cfg_coef: f32,
    streams: usize,
    read_bandwidth_gbps: f64,
) -> TtsFigures {
    let cross = start.cross_kv.unwrap_or_default();
    let (cross_kv_ms, cross_kv_gflop) = (cross.first_ms, cross.first_gflop);
    let f = &start.warm;
    // Every first-audio step reads the temporal weights and the voices' keys and values; the
    // steps past the audio's delay the depformer's too.
    let temporal_bytes = weights.temporal_layer_bytes * cfg.num_layers as u64
        + weights.text_head_bytes
        + weights.cross_kv_read_per_frame_bytes;
    let bytes =
        f.steps as u64 * temporal_bytes + f.depformer_steps as u64 * weights.depformer_bytes;
    TtsFigures {
        streams,
        cfg_coef: cfg_coef as f64,
        codebooks: start.codebooks,
        source_positions: start.source_positions,
        setup_per_stream_ms: f.setup_ms / streams.max(1) as f64,
        cross_kv_ms,
        cross_kv_gflop,
        cross_kv_next_voice_ms: cross.next_ms,
        cross_kv_next_voice_gflop: cross.next_gflop,
        cross_kv_gflops: if cross_kv_ms > 0.0 {
            cross_kv_gflop / cross_kv_ms * 1e3
        } else {
            0.0
        },
        first_audio_steps_bound_ms: BandwidthBound::new(bytes, read_bandwidth_gbps, 0.0)
            .lm_bound_ms,
        first_audio_cold: start.cold,
        first_audio: start.warm,
    }
}

/// Checks `--cfg-coef` against the config and the stage: guidance needs a conditioned config and
/// a stage that runs the generator.
fn check_guidance(cfg_coef: f32, loaded: &Loaded, stage: Stage) -> Result<(), BenchError> {
    if !(cfg_coef.is_finite() && cfg_coef > 0.0) {
        return Err(BenchError::CfgCoefNotPositive { coef: cfg_coef });
    }
    if cfg_coef != 1.0 {
        if !loaded.cfg.is_conditioned() {
            return Err(BenchError::GuidanceWithoutConditioners {
                coef: cfg_coef,
                config: loaded.config_origin.clone(),
            });
        }
        if !matches!(stage, Stage::All | Stage::Lm) {
            return Err(BenchError::GuidanceStage {
                coef: cfg_coef,
                stage: stage.name(),
            });
        }
    }
    Ok(())
}

/// Checks `--sessions` against its range and the stage: several sessions need a stage that runs
/// the generator.
fn check_sessions(options: &BenchOptions) -> Result<(), BenchError> {
    if !(1..=MAX_SESSIONS).contains(&options.sessions) {
        return Err(BenchError::SessionsOutOfRange {
            sessions: options.sessions,
            max: MAX_SESSIONS,
        });
    }
    if options.sessions > 1 && !matches!(options.stage, Stage::All | Stage::Lm) {
        return Err(BenchError::SessionsStage {
            sessions: options.sessions,
            stage: options.stage.name(),
        });
    }
    Ok(())
}

/// The frame processor of `options.stage`, from the models loaded for it (`cfg_coef`: the
/// guidance of a conditioned config): `options.sessions` sessions over the one set of weights,
/// with the KV precision and the prefilled positions asked for (every row of every session).
fn stage_processor(
    options: &BenchOptions,
    cfg_coef: f32,
    lm: Option<Generator>,
    codec: Option<(Mimi, TextTokenizer)>,
) -> Result<Box<dyn FrameProcessor>, BenchError> {
    let stage = options.stage;
    let missing = |part| BenchError::StageWithoutPart {
        stage: stage.name(),
        part,
    };
    let sampling = |i: usize| SamplingConfig {
        seed: options.seed.wrapping_add(i as u64),
        ..SamplingConfig::default()
    };
    // Session i's caches get their own noise.
    let noise_seed = |i: usize| options.seed.wrapping_add(i as u64);
    Ok(match stage {
        Stage::All => {
            let lm = lm.ok_or_else(|| missing("LM"))?;
            let (mimi, tokenizer) = codec.ok_or_else(|| missing("Mimi"))?;
            let model = Arc::new(MoshiModel::from_parts(mimi, lm, tokenizer)?);
            let sessions = (0..options.sessions)
                .map(|i| {
                    let mut s = model.new_session(&SessionSettings {
                        sampling: sampling(i),
                        kv_precision: options.kv_cache,
                        cfg_coef: Some(cfg_coef),
                    })?;
                    if options.kv_prefill > 0 {
                        s.lm_mut()
                            .fill_temporal_caches_with_noise(options.kv_prefill, noise_seed(i));
                    }
                    Ok(s)
                })
                .collect::<Result<Vec<_>, BenchError>>()?;
            Box::new(SessionsPipeline::new(model, sessions))
        }
        Stage::Mimi => Box::new(MimiStage::new(codec.ok_or_else(|| missing("Mimi"))?.0)),
        Stage::Lm => {
            let generator = lm.ok_or_else(|| missing("LM"))?;
            // Conditioned and guided as the pipeline's sessions are (the model type's
            // conventions).
            let conv = generator.kind().conventions();
            let sessions = (0..options.sessions)
                .map(|i| {
                    let mut s = generator.new_session(LmSessionSettings {
                        sampling: sampling(i),
                        kv_precision: options.kv_cache,
                        conditioning: conv.conditioning(generator.config(), cfg_coef),
                        record_details: false,
                        tts: Default::default(),
                    })?;
                    if options.kv_prefill > 0 {
                        s.fill_temporal_caches_with_noise(options.kv_prefill, noise_seed(i));
                    }
                    Ok(s)
                })
                .collect::<Result<Vec<_>, BenchError>>()?;
            Box::new(LmStage::new(generator, sessions, options.seed))
        }
        Stage::Depformer => Box::new(DepformerStage::new(
            lm.ok_or_else(|| missing("LM"))?.weights().clone(),
        )?),
        Stage::EchoCancel => Box::new(EchoCancelStage::new()?),
    })
}

/// Applies `--layers` to a config: `N` must be between 1 and the config's `num_layers`.
fn with_layers(
    cfg: &LmConfig,
    layers: Option<usize>,
    origin: &str,
) -> Result<LmConfig, BenchError> {
    let mut out = cfg.clone();
    match layers {
        None => {}
        Some(0) => return Err(BenchError::ZeroCount { flag: "--layers" }),
        Some(n) if n > cfg.num_layers => {
            return Err(BenchError::LayersAboveConfig {
                layers: n,
                config_layers: cfg.num_layers,
                config: origin.to_string(),
            })
        }
        Some(n) => out.num_layers = n,
    }
    Ok(out)
}

/// Weight byte counts of a built LM.
fn weight_bytes_of(lm: &LmWeights, stage: Stage) -> WeightBytes {
    let b = lm.weight_bytes();
    let per_layer = b
        .temporal_layers
        .checked_div(b.temporal_num_layers)
        .unwrap_or(0);
    let read = match stage {
        Stage::All | Stage::Lm => b.read_per_step(),
        Stage::Depformer => b.depformer,
        Stage::Mimi | Stage::EchoCancel => 0,
    };
    WeightBytes {
        resident_bytes: (b.temporal_layers + b.text_head + b.depformer + b.embedding_tables) as u64,
        read_per_frame_bytes: read as u64,
        // Set by the caller, which knows whether guidance runs a second row.
        weight_passes_per_frame: 1,
        temporal_layer_bytes: per_layer as u64,
        text_head_bytes: b.text_head as u64,
        depformer_bytes: b.depformer as u64,
        // Set by the caller, which knows the frames to run.
        kv_cache_layer_read_bytes: 0,
        kv_cache_read_per_frame_bytes: 0,
        // Set by the caller, which makes the cross-attention sources (a TTS stream's voice).
        cross_kv_read_per_frame_bytes: 0,
    }
}

/// Every file a run of `options` reads (the checkpoint's files, the LM config and the Mimi config
/// beside it): what its outputs (`--json`, `--trace`) must not overwrite. Resolves the model as
/// the run will; an unreadable config is left for the run to report.
pub fn input_paths(options: &BenchOptions) -> Result<Vec<PathBuf>, BenchError> {
    let mut paths: Vec<PathBuf> = options.config.iter().cloned().collect();
    match &options.weights {
        WeightSource::Checkpoint(spec) => {
            let model = resolve_model(spec, options.config.as_deref(), options.quant)?;
            paths.extend(model.input_paths().into_iter().map(Path::to_path_buf));
        }
        WeightSource::Random => {
            if let Some(config) = &options.config {
                if let Ok(cfg) = LmConfig::from_file(config) {
                    if let Some(name) = cfg.mimi_config_name.as_deref() {
                        paths.push(config.parent().unwrap_or(Path::new(".")).join(name));
                    }
                }
            }
        }
    }
    Ok(paths)
}

/// The Mimi config to pair with an LM config file: its `mimi_config_name` next to it, else the
/// real Mimi's; with where it came from (for messages).
fn mimi_config_near(
    config_path: Option<&Path>,
    cfg: &LmConfig,
) -> Result<(MimiConfig, String), BenchError> {
    let mut origin =
        "the built-in Mimi v0.1 config: the LM config names no `mimi_config_name`".to_string();
    let mut mimi = MimiConfig::v0_1();
    if let (Some(path), Some(name)) = (config_path, cfg.mimi_config_name.as_deref()) {
        let candidate = path.parent().unwrap_or(Path::new(".")).join(name);
        if candidate.is_file() {
            mimi = MimiConfig::from_file(&candidate).map_err(|source| BenchError::MimiConfig {
                path: candidate.clone(),
                source: Box::new(source),
            })?;
            origin = candidate.display().to_string();
        } else {
            origin = format!(
                "the built-in Mimi v0.1 config: {} is not there",
                candidate.display()
            );
        }
    }
    Ok((mimi, origin))
}

fn load(options: &BenchOptions, progress: &mut dyn FnMut(&str)) -> Result<Loaded, BenchError> {
    let started = Instant::now();
    let loaded = match &options.weights {
        WeightSource::Random => load_random(options, progress),
        WeightSource::Checkpoint(spec) => load_checkpoint(options, spec, progress),
    }?;
    progress(&format!(
        "models ready in {:.1} s",
        started.elapsed().as_secs_f64()
    ));
    Ok(loaded)
}

/// Number of Mimi codebooks the LM of `cfg` needs.
fn mimi_codebooks(cfg: &LmConfig) -> usize {
    cfg.dep_q.max(cfg.user_codebooks())
}

/// Builds the LM from `weights` and counts its weight bytes.
fn build_lm(
    cfg: &LmConfig,
    weights: Option<WeightMap>,
    stage: Stage,
) -> Result<(Option<Generator>, WeightBytes), BenchError> {
    let Some(w) = weights else {
        return Ok((None, WeightBytes::default()));
    };
    let lm = Generator::load(cfg, w)?;
    let bytes = weight_bytes_of(lm.weights(), stage);
    Ok((Some(lm), bytes))
}

fn load_random(
    options: &BenchOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<Loaded, BenchError> {
    let (full, config_origin) = match &options.config {
        Some(p) => (LmConfig::from_file(p)?, p.display().to_string()),
        None => (
            LmConfig::moshiko_7b(),
            "<built-in moshiko-7b (configs/moshiko-7b.json)>".to_string(),
        ),
    };
    let cfg = with_layers(&full, options.layers, &config_origin)?;
    let format = options.quant.unwrap_or(WeightFormat::Q4);
    let (kind, quant) = random_kind_of(format, options.group_size)?;
    let weights = if options.stage.needs_lm() {
        let bits = random_bits_per_weight(kind);
        ensure_fits(
            || {
                format!(
                    "--random-weights ({quant}: {} parameters of {config_origin} at {bits} bits each)",
                    cfg.parameter_count()
                )
            },
            (cfg.parameter_count() as f64 * bits / 8.0) as u64,
        )?;
        progress(&format!(
            "generating random {quant} weights: {} of {} temporal layers (dim {}) + depformer ...",
            cfg.num_layers, full.num_layers, cfg.dim
        ));
        Some(random_lm_weights(&cfg, options.seed, kind)?)
    } else {
        None
    };
    let (lm, weight_bytes) = build_lm(&cfg, weights, options.stage)?;
    let codec = if options.stage.needs_mimi() {
        let (mimi_cfg, origin) = mimi_config_near(options.config.as_deref(), &cfg)?;
        // Mimi's codes feed the LM: a code the LM cannot embed would fail every frame.
        if lm.is_some() && mimi_cfg.quantizer.bins > cfg.card {
            return Err(BenchError::MimiCardMismatch {
                lm_card: cfg.card,
                mimi_bins: mimi_cfg.quantizer.bins,
                mimi_config: origin,
            });
        }
        let mimi = Mimi::random(&mimi_cfg, mimi_codebooks(&cfg), options.seed)?;
        Some((mimi, synthetic_tokenizer(cfg.text_card)?))
    } else {
        None
    };
    Ok(Loaded {
        lm,
        codec,
        layers_config: full.num_layers,
        cfg,
        config_origin,
        quant,
        weights: weight_bytes,
    })
}

/// Bits per weight of random weights of `kind` (MLX packing: a 16-bit scale and bias per group).
fn random_bits_per_weight(kind: RandomWeightKind) -> f64 {
    match kind {
        RandomWeightKind::Quantized { bits, group_size } => bits as f64 + 32.0 / group_size as f64,
        RandomWeightKind::BF16 => 16.0,
        RandomWeightKind::F32 => 32.0,
    }
}

/// The random weights' packing for `--quant` and `--group-size`, and its report label.
fn random_kind_of(
    format: WeightFormat,
    group_size: Option<usize>,
) -> Result<(RandomWeightKind, String), BenchError> {
    let kind = format.random_kind();
    let Some(wanted) = group_size else {
        return Ok((kind, format.name().to_string()));
    };
    let RandomWeightKind::Quantized { bits, group_size } = kind else {
        return Err(BenchError::GroupSizeWithoutGroups {
            group_size: wanted,
            format,
        });
    };
    if !SUPPORTED_GROUP_SIZES.contains(&wanted) {
        return Err(BenchError::UnsupportedGroupSize {
            group_size: wanted,
            supported: &SUPPORTED_GROUP_SIZES,
        });
    }
    let label = if wanted == group_size {
        format.name().to_string()
    } else {
        format!("{}g{wanted}", format.name())
    };
    Ok((
        RandomWeightKind::Quantized {
            bits,
            group_size: wanted,
        },
        label,
    ))
}

fn load_checkpoint(
    options: &BenchOptions,
    spec: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<Loaded, BenchError> {
    if let Some(group_size) = options.group_size {
        return Err(BenchError::GroupSizeOfCheckpoint { group_size });
    }
    let requested = options.quant;
    let model = resolve_model(spec, options.config.as_deref(), requested)?;
    let full = model.lm_config.clone();
    let checked = with_layers(&full, options.layers, &model.lm_config_source)?;
    progress(&format!("loading {} ...", model.lm_weights_path.display()));
    // The weights are read even for `--stage mimi`: that is how the format is checked.
    let (weights, cfg, format) = load_checkpoint_lm(&model, requested, checked.num_layers)?;
    let (lm, weight_bytes) = build_lm(
        &cfg,
        options.stage.needs_lm().then_some(weights),
        options.stage,
    )?;
    let codec = if options.stage.needs_mimi() {
        let codebooks = mimi_codebooks(&cfg);
        let mimi_weights = load_mimi_weights(&model.mimi_weights_path, codebooks)?;
        let mimi = Mimi::load(&model.mimi_config, mimi_weights, codebooks)?;
        Some((mimi, TextTokenizer::from_file(&model.tokenizer_path)?))
    } else {
        None
    };
    Ok(Loaded {
        lm,
        codec,
        layers_config: full.num_layers,
        cfg,
        config_origin: model.lm_config_source.clone(),
        quant: format.name().into(),
        weights: weight_bytes,
    })
}
