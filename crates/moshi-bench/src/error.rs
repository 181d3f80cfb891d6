//! Why a benchmark could not run: each variant names the flag, file or frame at fault.

use std::path::PathBuf;

use moshi_loader::LoaderError;
use moshi_model::ModelError;
use moshi_runtime::RuntimeError;

use crate::format::WeightFormat;

/// How to get a quantized file when only dense weights exist (bench measures stored formats).
fn quantize_hint(format: &WeightFormat) -> String {
    match format {
        WeightFormat::Bf16 => String::new(),
        f => format!(
            " (bench measures the format as stored; write a {0} file from the bf16 one with \
             `moshi-rs quantize model.safetensors model.{0}.safetensors --bits {1}`)",
            f.name(),
            if *f == WeightFormat::Q4 { 4 } else { 8 }
        ),
    }
}

/// `bytes` as GiB with two decimals.
fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Why a benchmark could not run. Loader errors inside other variants are boxed (they are large
/// and rare).
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Loader(#[from] LoaderError),
    #[error("benchmark frame {frame}: {source}")]
    Frame { frame: usize, source: RuntimeError },
    #[error("cannot keep the frame records for --json in a temporary file (TMPDIR): {0}")]
    FrameLog(std::io::Error),
    #[error("{flag} must be at least 1")]
    ZeroCount { flag: &'static str },
    #[error(
        "--layers {layers} is above the {config_layers} temporal layers of the config ({config})"
    )]
    LayersAboveConfig {
        layers: usize,
        config_layers: usize,
        config: String,
    },
    #[error("--kv-prefill fills the temporal transformer's KV caches: it needs --stage all or lm, not {stage}")]
    KvPrefillWithoutLm { stage: &'static str },
    #[error(
        "--kv-prefill {positions} is above the config's context of {context} positions ({config})"
    )]
    KvPrefillAboveContext {
        positions: usize,
        context: usize,
        config: String,
    },
    #[error("--group-size {group_size}: {} weights have no groups (use --quant q4 or q8)", .format.name())]
    GroupSizeWithoutGroups {
        group_size: usize,
        format: WeightFormat,
    },
    #[error("--group-size {group_size}: supported group sizes are {supported:?}")]
    UnsupportedGroupSize {
        group_size: usize,
        supported: &'static [usize],
    },
    #[error(
        "--group-size {group_size} applies to --random-weights only: a checkpoint's group size is \
         read from its tensors (`moshi-rs quantize --group-size` writes one with another)"
    )]
    GroupSizeOfCheckpoint { group_size: usize },
    #[error("checkpoint `{spec}`: {source}")]
    Checkpoint {
        spec: String,
        source: Box<LoaderError>,
    },
    #[error("checkpoint `{spec}` cannot provide --quant {}: {source}{}", .format.name(), quantize_hint(.format))]
    FormatFileMissing {
        spec: String,
        format: WeightFormat,
        source: Box<LoaderError>,
    },
    #[error("checkpoint cannot provide --quant {}: {} holds {stored} weights{}", .format.name(), .path.display(), quantize_hint(.format))]
    FormatMismatch {
        format: WeightFormat,
        path: PathBuf,
        stored: String,
    },
    #[error("{} holds {stored} weights; bench measures bf16, q8 or q4 (pick one with --quant)", .path.display())]
    UnmeasuredFormat { path: PathBuf, stored: String },
    #[error("{}: no temporal layer 0 attention weights to benchmark", .path.display())]
    NoTemporalLayer { path: PathBuf },
    #[error("cannot read {}: {source}", .path.display())]
    MimiConfig {
        path: PathBuf,
        source: Box<LoaderError>,
    },
    #[error("the LM config's `card` is {lm_card} but Mimi's codebooks ({mimi_config}) have {mimi_bins} entries: Mimi's codes would be out of the LM's range; pair the LM config with its own Mimi config (its `mimi_config_name` beside it)")]
    MimiCardMismatch {
        lm_card: usize,
        mimi_bins: usize,
        /// Which Mimi config was used, and why.
        mimi_config: String,
    },
    #[error("cannot build the stand-in tokenizer: {source}")]
    StandInTokenizer { source: Box<LoaderError> },
    #[error("{what} needs about {} of memory, the machine has {} available", gib(*.needed_bytes), gib(*.available_bytes))]
    NotEnoughMemory {
        what: String,
        needed_bytes: u64,
        available_bytes: u64,
    },
    #[error("--cfg-coef {coef}: expected a positive number (1 = no guidance)")]
    CfgCoefNotPositive { coef: f32 },
    #[error(
        "--cfg-coef {coef}: guidance needs a conditioned config (Hibiki: --config \
         configs/hibiki-m.json); {config} has no conditioners"
    )]
    GuidanceWithoutConditioners { coef: f32, config: String },
    #[error("--cfg-coef {coef} applies to --stage all or lm (the generator runs the two rows), not {stage}")]
    GuidanceStage { coef: f32, stage: &'static str },
    #[error("--sessions {sessions}: expected 1..={max}")]
    SessionsOutOfRange { sessions: usize, max: usize },
    #[error("--sessions {sessions} steps several conversations through the generator: it needs --stage all or lm, not {stage}")]
    SessionsStage {
        sessions: usize,
        stage: &'static str,
    },
    #[error("a text-to-speech model ({config}) runs with --stage all (its streams' LM steps and Mimi decodes) or mimi, not {stage}")]
    TextToSpeechStage { stage: &'static str, config: String },
    #[error("--kv-prefill {positions}: a text-to-speech stream's caches fill as it speaks; use --warmup N to run N steps first ({config})")]
    TextToSpeechKvPrefill { positions: usize, config: String },
    #[error("a text-to-speech stream returned no audio in its first {steps} steps: its audio delay should have passed")]
    NoFirstAudio { steps: usize },
    #[error("internal: --stage {stage} was set up without the {part} it runs")]
    StageWithoutPart {
        stage: &'static str,
        part: &'static str,
    },
}
