//! `moshi-rs bench`: per-stage latency of the streaming pipeline against the 80 ms frame budget,
//! on random weights of the real shapes or on a checkpoint, next to the memory-bandwidth bound.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use moshi_bench::format::WeightFormat;
use moshi_bench::frames::TEMPORAL_LAYER_SPAN;
use moshi_bench::run::{input_paths, run_bench, BenchOptions, Stage, WeightSource};
use moshi_bench::span_timer::SpanTimerLayer;
use moshi_kernels::ActivationPrecision;
use moshi_loader::output_file::{commit_all, names_stdout, FinishedOutput, OutputFile};
use moshi_model::mimi::MimiWeights;
use moshi_model::nn::KvPrecision;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer;

use super::outputs::{check_outputs, given};
use super::signals::{remove_partials_on, Signals};

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
    /// `chat --echo-cancel`'s canceller only (24 <-> 48 kHz resampling and WebRTC AEC3 on a
    /// frame with its echo).
    EchoCancel,
}

impl From<StageArg> for Stage {
    fn from(s: StageArg) -> Self {
        match s {
            StageArg::All => Stage::All,
            StageArg::Mimi => Stage::Mimi,
            StageArg::Lm => Stage::Lm,
            StageArg::Depformer => Stage::Depformer,
            StageArg::EchoCancel => Stage::EchoCancel,
        }
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
    /// Element type of the temporal KV caches: f32 (exact, default), bf16 (half the bytes) or
    /// i8 (8-bit codes and a scale per head: about a quarter).
    #[arg(long, value_name = "f32|bf16|i8", default_value_t = KvPrecision::F32)]
    kv_cache: KvPrecision,
    /// How the q4/q8 products hold their activations: exact (default), i16 (rounded per
    /// quantization group to 16 bits: two byte dot products per code vector) or i8 (8 bits: one).
    #[arg(long, value_name = "exact|i16|i8", default_value_t = ActivationPrecision::Exact)]
    activations: ActivationPrecision,
    /// Conversations stepped together over one set of weights, as `serve` runs them: every
    /// frame is one batched step of all of them (stages all and lm). The report gives the
    /// frame time of the whole step and the conversation frames per second.
    #[arg(long, value_name = "N", default_value_t = 1)]
    sessions: usize,
    /// Compute threads, at most the logical CPUs (default: the performance cores of a big/little
    /// CPU, else all of them).
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
    /// bf16 or q8 (MLX 8-bit affine, group 64), their activations f32. With q8, convolutions of
    /// many rows round their weights and activations to bf16 on CPUs with AVX512-BF16, and the
    /// transformers' activations take the quantized products' precision on AVX-512 VNNI.
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
    /// Probe the read bandwidth (two passes over at most 256 MiB, untimed) before every N timed
    /// frames and set each frame's LM step against that probe's bound: the report's "beside the
    /// frames" line. 0: only the probes before and after the run.
    #[arg(
        long,
        default_value_t = 10,
        value_name = "N",
        value_parser = super::flag_values::probe_every
    )]
    probe_every: usize,
    /// Classifier-free guidance of a conditioned config (Hibiki, e.g. `--config
    /// configs/hibiki-m.json`): two LM rows per step, logits mixed with this coefficient. 1 = no
    /// guidance. Default: the config's `lm_gen_config.cfg_coef`, else 1. Stages all and lm.
    #[arg(long, value_name = "COEF", value_parser = super::flag_values::cfg_coef)]
    cfg_coef: Option<f32>,
    /// Audio codebooks a text-to-speech config generates (moshi-server deploys 24 of the
    /// release's 32). Default: all of them.
    #[arg(long, value_name = "N")]
    tts_n_q: Option<usize>,
}

/// Runs the benchmark; `log_filter` is the `--log` filter for messages on stderr.
pub fn run(args: BenchArgs, log_filter: &str) -> Result<()> {
    remove_partials_on(Signals::All)?;
    let threads = match args.threads {
        Some(0) => bail!("--threads must be at least 1"),
        Some(n) => n,
        None => moshi_kernels::cores::default_compute_threads(),
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .context("cannot set up the compute thread pool")?;

    let options = BenchOptions {
        weights: match (args.random_weights, &args.model) {
            (true, _) => WeightSource::Random,
            (false, Some(spec)) => WeightSource::Checkpoint(spec.clone()),
            (false, None) => bail!("--model or --random-weights is required"),
        },
        config: args.config.clone(),
        layers: args.layers,
        quant: args.quant.map(WeightFormat::from),
        group_size: args.group_size,
        frames: args.frames,
        warmup: args.warmup,
        kv_prefill: args.kv_prefill,
        kv_cache: args.kv_cache,
        activations: args.activations,
        threads,
        stage: args.stage.into(),
        seed: args.seed,
        mimi_weights: args.mimi_weights,
        bandwidth_buffer_mib: args.bandwidth_buffer_mib,
        probe_every: args.probe_every,
        cfg_coef: args.cfg_coef,
        sessions: args.sessions,
        tts_n_q: args.tts_n_q,
        // The report's `frames` (kept on disk during the run) only when it is written.
        keep_frames: args.json.is_some(),
    };
    // Neither report may replace a file the run reads (the checkpoint, a config) or the other.
    let inputs = input_paths(&options)?;
    check_outputs(
        &given(&[
            ("--json", args.json.as_deref()),
            ("--trace", args.trace.as_deref()),
        ]),
        &inputs.iter().map(PathBuf::as_path).collect::<Vec<_>>(),
    )?;
    // Our own subscriber for this command: the per-layer span timer, the optional Chrome trace,
    // and the usual stderr log filtered by --log.
    let (timer, totals) = SpanTimerLayer::new(&[TEMPORAL_LAYER_SPAN]);
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
    let result = tracing::subscriber::with_default(subscriber, || {
        run_bench(&options, Some(&totals), &mut |line| eprintln!("{line}"))
    });
    // Dropping the guard flushes the trace and ends tracing-chrome's writer thread.
    drop(flush_guard);
    let report = result?;
    // Both reports complete before either is put in place: a run that fails on one (a full
    // disk) replaces neither.
    let mut finished = Vec::new();
    if let Some(path) = &args.json {
        // Streamed (the file is buffered): `frames` is read back from disk record by record,
        // never whole in memory.
        let mut out = OutputFile::create(path).context("--json")?;
        serde_json::to_writer_pretty(&mut out, &report)
            .map_err(std::io::Error::from)
            .and_then(|()| std::io::Write::write_all(&mut out, b"\n"))
            .context("--json")?;
        finished.push(out.finish().context("--json")?);
    }
    if let Some(sink) = trace {
        finished.push(sink.finish().context("--trace")?);
    }
    commit_all(finished)?;
    // After the files: a closed stdout (`| head`) loses none of them. Not when stdout is one of
    // them (`--json /dev/stdout`): it gets that file's bytes only.
    let stdout_taken = [&args.json, &args.trace]
        .into_iter()
        .flatten()
        .any(|p| names_stdout(p));
    if !stdout_taken {
        super::stdout::print(&report.to_text())?;
    }
    if let Some(path) = &args.json {
        eprintln!("report written to {}", path.display());
    }
    if let Some(path) = &args.trace {
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

    /// The trace, complete (not yet in place), or the first write error.
    fn finish(self) -> Result<FinishedOutput> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let out = state.out.take().context("the trace was already finished")?;
        if let Some(e) = state.error.take() {
            return Err(moshi_loader::LoaderError::Write {
                path: out.path().to_path_buf(),
                cause: e,
            }
            .into());
        }
        Ok(out.finish()?)
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
