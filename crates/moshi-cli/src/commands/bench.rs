//! `moshi-rs bench`: per-stage latency of the streaming pipeline against the 80 ms frame budget,
//! on random weights of the real shapes or on a checkpoint, next to the memory-bandwidth bound.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use moshi_kernels::SUPPORTED_GROUP_SIZES;
use moshi_loader::tokenizer::TextTokenizer;
use moshi_loader::{load_mimi_weights, LmConfig, MimiConfig, WeightMap};
use moshi_model::generator::{Generator, SamplingConfig};
use moshi_model::lm::kv_cache::KvPrecision;
use moshi_model::lm::random::{random_lm_weights, RandomWeightKind};
use moshi_model::lm::LmModel;
use moshi_model::mimi::{Mimi, MimiWeights};
use moshi_runtime::bench::checkpoint::{load_checkpoint_lm, resolve_model};
use moshi_runtime::bench::extrapolate::extrapolate_to_full_depth;
use moshi_runtime::bench::format::WeightFormat;
use moshi_runtime::bench::kv_traffic::kv_read_per_layer_bytes;
use moshi_runtime::bench::memory::{peak_resident_bytes, reset_peak_resident};
use moshi_runtime::bench::report::{
    real_time_factor, BandwidthBound, BenchReport, MachineInfo, RunInfo, StageStats, WeightBytes,
    BENCH_SCHEMA_VERSION,
};
use moshi_runtime::bench::runner::{run_frames, TEMPORAL_LAYER_SPAN};
use moshi_runtime::bench::span_timer::{SpanTimerLayer, SpanTotals};
use moshi_runtime::bench::stages::{DepformerStage, LmStage, MimiStage};
use moshi_runtime::bench::synthetic_tokenizer::synthetic_tokenizer;
use moshi_runtime::engine::FrameProcessor;
use moshi_runtime::pipeline::{
    MoshiPipeline, FIRST_FRAME_LM_STEPS, TRANSLATION_CONDITIONS, TRANSLATION_NEGATIVE_CONDITIONS,
};
use moshi_runtime::FRAME_MS;
use std::sync::{Arc, Mutex};

use moshi_loader::output_file::{check_output_path, write_output, OutputFile};

use super::memory_budget::ensure_fits;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer;

/// `--quant`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantArg {
    Bf16,
    Q8,
    Q4,
}

impl From<QuantArg> for WeightFormat {
    fn from(q: QuantArg) -> Self {
        match q {
            QuantArg::Bf16 => WeightFormat::Bf16,
            QuantArg::Q8 => WeightFormat::Q8,
            QuantArg::Q4 => WeightFormat::Q4,
        }
    }
}

/// `--stage`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StageArg {
    /// Mimi encode -> LM step -> Mimi decode, as in `file` and `chat`.
    All,
    /// Mimi encode + decode only.
    Mimi,
    /// The LM step only (temporal transformer, depformer, sampling), random user codes.
    Lm,
    /// The depformer only (its 8 sub-steps per frame).
    Depformer,
}

impl StageArg {
    fn name(self) -> &'static str {
        match self {
            StageArg::All => "all",
            StageArg::Mimi => "mimi",
            StageArg::Lm => "lm",
            StageArg::Depformer => "depformer",
        }
    }
    fn needs_mimi(self) -> bool {
        matches!(self, StageArg::All | StageArg::Mimi)
    }
    fn needs_lm(self) -> bool {
        !matches!(self, StageArg::Mimi)
    }
}

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Checkpoint: a folder laid out like a Kyutai repo, a checkpoint file, or a Hugging Face repo
    /// id (`kyutai/moshiko-mlx-q4`); `--quant` picks model.safetensors / model.q8.safetensors /
    /// model.q4.safetensors.
    #[arg(
        long,
        value_name = "DIR|REPO",
        conflicts_with = "random_weights",
        required_unless_present = "random_weights"
    )]
    model: Option<String>,
    /// Random weights of the config's shapes instead of a checkpoint (no download needed).
    #[arg(long)]
    random_weights: bool,
    /// LM config (default: DIR/config.json for --model, configs/moshiko-7b.json built in for
    /// --random-weights).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Run only the first N temporal layers; figures for the full depth are then extrapolated
    /// from the measured per-layer time (and labelled so).
    #[arg(long, value_name = "N")]
    layers: Option<usize>,
    /// Weight format: bf16, q8 (MLX 8-bit, group 64) or q4 (MLX 4-bit, group 32). Default: q4
    /// for random weights, the config's `moshi_name` file (bf16) for a checkpoint.
    #[arg(long, value_enum)]
    quant: Option<QuantArg>,
    /// Values per scale/bias group of random q4/q8 weights (32, 64 or 128; default: 32 for q4, 64
    /// for q8, as in the Kyutai releases). MLX's own default, 64, gives q4 4.5 bits per weight
    /// instead of 5. Only with --random-weights: a checkpoint's group size is read from its tensors.
    #[arg(long, value_name = "N")]
    group_size: Option<usize>,
    /// Timed frames (80 ms each).
    #[arg(long, default_value_t = 50, value_parser = super::flag_values::bench_frames)]
    frames: usize,
    /// Untimed frames run first.
    #[arg(long, default_value_t = 3, value_parser = super::flag_values::warmup_frames)]
    warmup: usize,
    /// Put N positions of random keys and values into every temporal KV cache before the warm-up
    /// (at most the config's context: 3000 for moshiko, 4 minutes): attention over a long
    /// conversation in seconds, without running it (`--warmup N` computes those steps instead).
    #[arg(long, value_name = "N", default_value_t = 0)]
    kv_prefill: usize,
    /// Element type of the temporal KV caches: f32 (exact, default) or bf16 (half the bytes).
    #[arg(long, value_name = "f32|bf16", default_value_t = KvPrecision::F32)]
    kv_cache: KvPrecision,
    /// Compute threads, at most the logical CPUs (default: all of them).
    #[arg(long, value_parser = super::flag_values::threads)]
    threads: Option<usize>,
    /// What to run.
    #[arg(long, value_enum, default_value_t = StageArg::All)]
    stage: StageArg,
    /// Write the report as JSON (schema: docs/performance.md, "moshi-rs bench --json").
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write a Chrome trace (chrome://tracing, Perfetto) of the timed frames' spans.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Seed of the random weights, the input signal and sampling.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Mimi weight precision of the per-frame (memory-bound) products: f32 (exact, default),
    /// bf16 or q8 (MLX 8-bit affine, group 64). Activations stay f32.
    #[arg(long, value_name = "f32|bf16|q8", default_value_t = MimiWeights::F32)]
    mimi_weights: MimiWeights,
    /// Buffer of the memory read-bandwidth probe, MiB (keep it well above the last-level cache).
    #[arg(
        long,
        default_value_t = 1024,
        value_name = "MIB",
        value_parser = super::flag_values::bandwidth_buffer_mib
    )]
    bandwidth_buffer_mib: usize,
    /// Classifier-free guidance of a conditioned config (Hibiki, e.g. `--config
    /// configs/hibiki-m.json`): two LM rows per step, logits mixed with this coefficient. 1 = no
    /// guidance. Default: the config's `lm_gen_config.cfg_coef`, else 1. Stages all and lm.
    #[arg(long, value_name = "COEF")]
    cfg_coef: Option<f32>,
}

/// The models a run needs, their config and where they came from.
struct Loaded {
    lm: Option<LmModel>,
    mimi: Option<Mimi>,
    tokenizer: Option<TextTokenizer>,
    cfg: LmConfig,
    layers_config: usize,
    config_origin: String,
    /// Weight format for the reports: `bf16`, `q8`, `q4`, or with a group size other than the
    /// release one, e.g. `q4g64`.
    quant: String,
    weights: WeightBytes,
}

/// Runs the benchmark; `log_filter` is the `--log` filter for messages on stderr.
pub fn run(args: BenchArgs, log_filter: &str) -> Result<()> {
    if args.frames == 0 {
        bail!("--frames must be at least 1");
    }
    let threads = match args.threads {
        Some(0) => bail!("--threads must be at least 1"),
        Some(n) => n,
        None => std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .context("cannot set up the compute thread pool")?;

    // Our own subscriber for this command: the per-layer span timer, the optional Chrome trace,
    // and the usual stderr log filtered by --log.
    let (timer, totals) = SpanTimerLayer::new(&[TEMPORAL_LAYER_SPAN]);
    if let Some(path) = &args.json {
        check_output_path(path).context("--json")?;
    }
    let trace = match &args.trace {
        Some(path) => Some(TraceSink::create(path).context("--trace")?),
        None => None,
    };
    let (chrome, flush_guard) = match &trace {
        Some(sink) => {
            let (layer, guard) = tracing_chrome::ChromeLayerBuilder::new()
                .writer(sink.clone())
                .include_args(true)
                .build();
            (Some(layer), Some(guard))
        }
        None => (None, None),
    };
    let stderr_log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(
            tracing_subscriber::EnvFilter::try_new(log_filter)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        );
    let subscriber = tracing_subscriber::registry()
        .with(timer)
        .with(chrome)
        .with(stderr_log);
    let result = tracing::subscriber::with_default(subscriber, || bench(&args, threads, &totals));
    // Dropping the guard flushes the trace and ends tracing-chrome's writer thread.
    drop(flush_guard);
    result?;
    if let (Some(sink), Some(path)) = (trace, &args.trace) {
        sink.finish().context("--trace")?;
        eprintln!(
            "Chrome trace written to {} (open in chrome://tracing or ui.perfetto.dev)",
            path.display()
        );
    }
    Ok(())
}

/// The `--trace` file as tracing-chrome's writer. tracing-chrome writes from its own thread and
/// panics on a write error, so none reaches it: the first error is kept, later writes are
/// dropped, and [`TraceSink::finish`] reports it (the trace is then not committed: no partial
/// file is left).
#[derive(Clone)]
struct TraceSink {
    state: Arc<Mutex<TraceState>>,
}

struct TraceState {
    out: Option<OutputFile>,
    error: Option<std::io::Error>,
}

impl TraceSink {
    fn create(path: &Path) -> Result<Self> {
        Ok(Self {
            state: Arc::new(Mutex::new(TraceState {
                out: Some(OutputFile::create(path)?),
                error: None,
            })),
        })
    }

    fn finish(self) -> Result<()> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let out = state.out.take().context("the trace was already finished")?;
        if let Some(e) = state.error.take() {
            return Err(moshi_loader::LoaderError::Write {
                path: out.path().to_path_buf(),
                cause: e,
            }
            .into());
        }
        Ok(out.commit()?)
    }
}

impl std::io::Write for TraceSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.error.is_none() {
            if let Some(out) = state.out.as_mut() {
                if let Err(e) = out.write_all(buf) {
                    state.error = Some(e);
                }
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.error.is_none() {
            if let Some(Err(e)) = state.out.as_mut().map(|o| o.flush()) {
                state.error = Some(e);
            }
        }
        Ok(())
    }
}

/// One memory read-bandwidth probe of `buffer_mib` MiB with `threads` threads, GB/s.
fn probe_bandwidth(threads: usize, buffer_mib: usize) -> f64 {
    moshi_kernels::bandwidth::measure_read_bandwidth_gbps_with(
        threads,
        buffer_mib.max(1) << 20,
        moshi_kernels::bandwidth::DEFAULT_PASSES,
    )
}

fn bench(args: &BenchArgs, threads: usize, totals: &SpanTotals) -> Result<()> {
    // Bandwidth is probed before the model is loaded and again after the timed frames; the best
    // probe is kept (a busy machine only ever makes a probe slower).
    ensure_fits(
        &format!("--bandwidth-buffer-mib {}", args.bandwidth_buffer_mib),
        (args.bandwidth_buffer_mib as u64) << 20,
    )?;
    eprintln!("measuring memory read bandwidth with {threads} threads ...");
    let mut probes = vec![probe_bandwidth(threads, args.bandwidth_buffer_mib)];
    // The probe's buffer is freed; do not let it count as the model's peak memory.
    if !reset_peak_resident() {
        tracing::debug!(
            "cannot reset the peak resident set; peak memory includes the bandwidth probe"
        );
    }
    let loaded = load(args)?;
    let layers_run = loaded.cfg.num_layers;
    let cfg_coef = args
        .cfg_coef
        .unwrap_or_else(|| loaded.cfg.default_cfg_coef());
    if !(cfg_coef.is_finite() && cfg_coef > 0.0) {
        bail!("--cfg-coef {cfg_coef}: expected a positive number (1 = no guidance)");
    }
    if cfg_coef != 1.0 {
        if !loaded.cfg.is_conditioned() {
            bail!(
                "--cfg-coef {cfg_coef}: guidance needs a conditioned config (Hibiki: --config \
                 configs/hibiki-m.json); {} has no conditioners",
                loaded.config_origin
            );
        }
        if !matches!(args.stage, StageArg::All | StageArg::Lm) {
            bail!(
                "--cfg-coef {cfg_coef} applies to --stage all or lm (the generator runs the two rows), not {}",
                args.stage.name()
            );
        }
    }
    // Guidance runs a second row over the same weights, one after the other: the weights are
    // read twice per frame and each row has its own KV caches.
    let lm_rows: u64 = if cfg_coef != 1.0 { 2 } else { 1 };
    // The temporal KV caches grow by one position per LM step (warm-up included) up to the
    // context; the pipeline's first frame steps twice (the first step only fills the delays).
    let first_frame_steps = match args.stage {
        StageArg::All => FIRST_FRAME_LM_STEPS,
        StageArg::Lm => 1,
        StageArg::Mimi | StageArg::Depformer => 0,
    };
    if args.kv_prefill > 0 {
        if first_frame_steps == 0 {
            bail!(
                "--kv-prefill fills the temporal transformer's KV caches: it needs --stage all or lm, not {}",
                args.stage.name()
            );
        }
        if args.kv_prefill > loaded.cfg.context {
            bail!(
                "--kv-prefill {} is above the config's context of {} positions ({})",
                args.kv_prefill,
                loaded.cfg.context,
                loaded.config_origin
            );
        }
        let cfg = &loaded.cfg;
        ensure_fits(
            &format!(
                "--kv-prefill {} ({} layers of dim {}, {} KV cache)",
                args.kv_prefill, cfg.num_layers, cfg.dim, args.kv_cache
            ),
            [
                args.kv_prefill,
                cfg.dim,
                2,
                args.kv_cache.bytes(),
                cfg.num_layers,
            ]
            .iter()
            .map(|&x| x as u64)
            .product(),
        )?;
    }
    let kv_layer_bytes = if first_frame_steps > 0 {
        let cfg = &loaded.cfg;
        // The prefilled positions count as LM steps taken before the first frame's.
        let steps_by_first_frame = args.kv_prefill + first_frame_steps;
        kv_read_per_layer_bytes(
            args.kv_cache.bytes(),
            cfg.dim,
            cfg.context,
            steps_by_first_frame,
            args.warmup,
            args.frames,
        )
    } else {
        0
    };
    let Loaded {
        mut lm,
        mut mimi,
        tokenizer,
        layers_config,
        config_origin,
        quant,
        mut weights,
        ..
    } = loaded;
    if let Some(lm) = lm.as_mut() {
        lm.set_kv_precision(args.kv_cache);
    }
    if let Some(lm) = lm.as_mut().filter(|_| args.kv_prefill > 0) {
        eprintln!(
            "filling the temporal KV caches with {} random positions ...",
            args.kv_prefill
        );
        lm.fill_temporal_caches_with_noise(args.kv_prefill, args.seed);
    }
    weights.kv_cache_layer_read_bytes = kv_layer_bytes * lm_rows;
    weights.kv_cache_read_per_frame_bytes = kv_layer_bytes * lm_rows * layers_run as u64;
    weights.weight_passes_per_frame = lm_rows;
    weights.read_per_frame_bytes *= lm_rows;
    if let Some(m) = mimi.as_mut() {
        m.set_weights(args.mimi_weights);
        eprintln!("Mimi weights: {}", args.mimi_weights);
    }
    let kernel = moshi_kernels::Kernel::detect();
    let eight_bit = if kernel == moshi_kernels::Kernel::Avx512Vnni {
        "; 8-bit products on the f32 avx512 kernel"
    } else {
        ""
    };
    eprintln!(
        "quantized kernel: {}{eight_bit} (set {} to pick another)",
        kernel.name(),
        moshi_kernels::KERNEL_ENV
    );
    let mut processor: Box<dyn FrameProcessor> = match args.stage {
        StageArg::All => {
            let lm = lm.context("internal: the LM was not built")?;
            let mimi = mimi.context("internal: Mimi was not built")?;
            let generator = Generator::new(
                lm,
                SamplingConfig {
                    seed: args.seed,
                    ..SamplingConfig::default()
                },
            );
            let tokenizer = tokenizer.context("internal: the text tokenizer was not built")?;
            let mut pipeline = MoshiPipeline::from_parts(mimi, generator, &tokenizer)?;
            pipeline.set_cfg_coef(cfg_coef)?;
            Box::new(pipeline)
        }
        StageArg::Mimi => Box::new(MimiStage::new(
            mimi.context("internal: Mimi was not built")?,
        )),
        StageArg::Lm => {
            let lm = lm.context("internal: the LM was not built")?;
            let conditioned = lm.config().is_conditioned();
            let mut generator = Generator::new(
                lm,
                SamplingConfig {
                    seed: args.seed,
                    ..SamplingConfig::default()
                },
            );
            if conditioned {
                generator.set_conditions(
                    TRANSLATION_CONDITIONS,
                    cfg_coef,
                    TRANSLATION_NEGATIVE_CONDITIONS,
                )?;
            }
            Box::new(LmStage::new(generator, args.seed))
        }
        StageArg::Depformer => Box::new(DepformerStage::new(
            lm.context("internal: the LM was not built")?,
        )?),
    };

    eprintln!(
        "running {} warm-up + {} timed frames ({}, stage {}) ...",
        args.warmup,
        args.frames,
        quant,
        args.stage.name()
    );
    let run = run_frames(
        processor.as_mut(),
        args.warmup,
        args.frames,
        args.seed,
        Some(totals),
    )?;
    drop(processor);
    // Read the peak before the bandwidth probe allocates its own buffer.
    let peak_memory_bytes = peak_resident_bytes();
    eprintln!("measuring memory read bandwidth again ...");
    probes.push(probe_bandwidth(threads, args.bandwidth_buffer_mib));
    let read_bandwidth_gbps = probes.iter().copied().fold(0.0, f64::max);

    let stats = StageStats::of(&run.records);
    let bound = BandwidthBound::new(
        weights.lm_read_per_frame_bytes(),
        read_bandwidth_gbps,
        stats.lm_step_ms.p50,
    );
    let extrapolated = if matches!(args.stage, StageArg::All | StageArg::Lm) {
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
    let report = BenchReport {
        schema_version: BENCH_SCHEMA_VERSION,
        tool: "moshi-rs bench".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        run: RunInfo {
            weights: if args.random_weights {
                "random"
            } else {
                "checkpoint"
            }
            .into(),
            model: args.model.clone(),
            config: config_origin,
            quant,
            mimi_weights: args.mimi_weights.to_string(),
            quant_kernel: kernel.name().into(),
            stage: args.stage.name().into(),
            layers_run,
            layers_config,
            frames: args.frames,
            warmup_frames: args.warmup,
            kv_prefill_positions: args.kv_prefill,
            kv_cache: args.kv_cache.name().into(),
            threads,
            seed: args.seed,
            cfg_coef: cfg_coef as f64,
            lm_rows: lm_rows as usize,
        },
        machine: MachineInfo {
            os: std::env::consts::OS.into(),
            arch: std::env::consts::ARCH.into(),
            logical_cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            read_bandwidth_gbps,
            read_bandwidth_probes_gbps: probes,
            peak_memory_bytes,
        },
        frame_budget_ms: FRAME_MS,
        real_time_factor: real_time_factor(&stats),
        stages: stats,
        weights,
        bound,
        extrapolated,
        frames: run.records,
    };
    print!("{}", report.to_text());
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).context("cannot serialise the report")?;
        write_output(path, (text + "\n").as_bytes()).context("--json")?;
        eprintln!("report written to {}", path.display());
    }
    Ok(())
}

/// Applies `--layers` to a config: `N` must be between 1 and the config's `num_layers`.
fn with_layers(cfg: &LmConfig, layers: Option<usize>, origin: &str) -> Result<LmConfig> {
    let mut out = cfg.clone();
    match layers {
        None => {}
        Some(0) => bail!("--layers must be at least 1"),
        Some(n) if n > cfg.num_layers => {
            bail!(
                "--layers {n} is above the {} temporal layers of the config ({origin})",
                cfg.num_layers
            )
        }
        Some(n) => out.num_layers = n,
    }
    Ok(out)
}

/// Weight byte counts of a built LM.
fn weight_bytes_of(lm: &LmModel, stage: StageArg) -> WeightBytes {
    let b = lm.weight_bytes();
    let per_layer = b
        .temporal_layers
        .checked_div(b.temporal_num_layers)
        .unwrap_or(0);
    let read = match stage {
        StageArg::All | StageArg::Lm => b.read_per_step(),
        StageArg::Depformer => b.depformer,
        StageArg::Mimi => 0,
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
    }
}

/// The Mimi config to pair with an LM config file: its `mimi_config_name` next to it, else the
/// real Mimi's.
fn mimi_config_near(config_path: Option<&Path>, cfg: &LmConfig) -> Result<MimiConfig> {
    if let (Some(path), Some(name)) = (config_path, cfg.mimi_config_name.as_deref()) {
        let candidate = path.parent().unwrap_or(Path::new(".")).join(name);
        if candidate.is_file() {
            return MimiConfig::from_file(&candidate)
                .with_context(|| format!("cannot read {}", candidate.display()));
        }
    }
    Ok(MimiConfig::v0_1())
}

fn load(args: &BenchArgs) -> Result<Loaded> {
    if args.random_weights {
        load_random(args)
    } else {
        load_checkpoint(args)
    }
}

/// Number of Mimi codebooks the LM of `cfg` needs.
fn mimi_codebooks(cfg: &LmConfig) -> usize {
    cfg.dep_q.max(cfg.user_codebooks())
}

/// Builds the LM from `weights` and counts its weight bytes.
fn build_lm(
    cfg: &LmConfig,
    weights: Option<WeightMap>,
    stage: StageArg,
) -> Result<(Option<LmModel>, WeightBytes)> {
    let Some(w) = weights else {
        return Ok((None, WeightBytes::default()));
    };
    let lm = LmModel::load(cfg, w)?;
    let bytes = weight_bytes_of(&lm, stage);
    Ok((Some(lm), bytes))
}

fn load_random(args: &BenchArgs) -> Result<Loaded> {
    let started = Instant::now();
    let (full, config_origin) = match &args.config {
        Some(p) => (LmConfig::from_file(p)?, p.display().to_string()),
        None => (
            LmConfig::moshiko_7b(),
            "<built-in moshiko-7b (configs/moshiko-7b.json)>".to_string(),
        ),
    };
    let cfg = with_layers(&full, args.layers, &config_origin)?;
    let format = args
        .quant
        .map(WeightFormat::from)
        .unwrap_or(WeightFormat::Q4);
    let (kind, quant) = random_kind_of(format, args.group_size)?;
    let weights = if args.stage.needs_lm() {
        let bits = random_bits_per_weight(kind);
        ensure_fits(
            &format!(
                "--random-weights ({quant}: {} parameters of {config_origin} at {bits} bits each)",
                cfg.parameter_count()
            ),
            (cfg.parameter_count() as f64 * bits / 8.0) as u64,
        )?;
        eprintln!(
            "generating random {quant} weights: {} of {} temporal layers (dim {}) + depformer ...",
            cfg.num_layers, full.num_layers, cfg.dim
        );
        Some(random_lm_weights(&cfg, args.seed, kind)?)
    } else {
        None
    };
    let (lm, weight_bytes) = build_lm(&cfg, weights, args.stage)?;
    let (mimi, tokenizer) = if args.stage.needs_mimi() {
        let mimi_cfg = mimi_config_near(args.config.as_deref(), &cfg)?;
        let mimi = Mimi::random(&mimi_cfg, mimi_codebooks(&cfg), args.seed)?;
        (Some(mimi), Some(synthetic_tokenizer(cfg.text_card)?))
    } else {
        (None, None)
    };
    eprintln!("models ready in {:.1} s", started.elapsed().as_secs_f64());
    Ok(Loaded {
        lm,
        mimi,
        tokenizer,
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
) -> Result<(RandomWeightKind, String)> {
    let kind = format.random_kind();
    let Some(wanted) = group_size else {
        return Ok((kind, format.name().to_string()));
    };
    let RandomWeightKind::Quantized { bits, group_size } = kind else {
        bail!(
            "--group-size {wanted}: {} weights have no groups (use --quant q4 or q8)",
            format.name()
        );
    };
    if !SUPPORTED_GROUP_SIZES.contains(&wanted) {
        bail!("--group-size {wanted}: supported group sizes are {SUPPORTED_GROUP_SIZES:?}");
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

fn load_checkpoint(args: &BenchArgs) -> Result<Loaded> {
    let started = Instant::now();
    let spec = args
        .model
        .as_deref()
        .context("--model or --random-weights is required")?;
    if let Some(g) = args.group_size {
        bail!(
            "--group-size {g} applies to --random-weights only: a checkpoint's group size is read \
             from its tensors (`moshi-rs quantize --group-size` writes one with another)"
        );
    }
    let requested = args.quant.map(WeightFormat::from);
    let model = resolve_model(spec, args.config.as_deref(), requested)?;
    let full = model.lm_config.clone();
    let checked = with_layers(&full, args.layers, &model.lm_config_source)?;
    eprintln!("loading {} ...", model.lm_weights_path.display());
    // The weights are read even for `--stage mimi`: that is how the format is checked.
    let (weights, cfg, format) = load_checkpoint_lm(&model, requested, checked.num_layers)?;
    let (lm, weight_bytes) = build_lm(&cfg, args.stage.needs_lm().then_some(weights), args.stage)?;
    let (mimi, tokenizer) = if args.stage.needs_mimi() {
        let codebooks = mimi_codebooks(&cfg);
        let mimi_weights = load_mimi_weights(&model.mimi_weights_path, codebooks)?;
        let mimi = Mimi::load(&model.mimi_config, mimi_weights, codebooks)?;
        (
            Some(mimi),
            Some(TextTokenizer::from_file(&model.tokenizer_path)?),
        )
    } else {
        (None, None)
    };
    eprintln!("models ready in {:.1} s", started.elapsed().as_secs_f64());
    Ok(Loaded {
        lm,
        mimi,
        tokenizer,
        layers_config: full.num_layers,
        cfg,
        config_origin: model.lm_config_source.clone(),
        quant: format.name().into(),
        weights: weight_bytes,
    })
}
