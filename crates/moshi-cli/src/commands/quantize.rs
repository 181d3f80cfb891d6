//! `moshi-rs quantize`: a dense LM checkpoint (PyTorch, candle or dense MLX layout) -> an MLX
//! release-layout q4/q8 file, quantized exactly as MLX's `nn.quantize`, written atomically.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use moshi_kernels::SUPPORTED_GROUP_SIZES;
use moshi_loader::mlx_export::write_mlx_quantized;
use moshi_loader::{load_lm_weights, LmConfig, WeightMode};

use super::outputs::check_outputs;
use super::signals::{remove_partials_on, Signals};

#[derive(clap::Args, Debug)]
pub struct QuantizeArgs {
    /// Dense LM checkpoint (.safetensors: PyTorch, candle or dense MLX layout; bf16/f16/f32).
    pub input: PathBuf,
    /// Output file (MLX layout, like kyutai/moshiko-mlx-q4's model.q4.safetensors).
    pub output: PathBuf,
    /// Bits per weight: 4 or 8.
    #[arg(long, value_parser = clap::value_parser!(u32).range(4..=8))]
    pub bits: u32,
    /// Values per scale/bias group: 32, 64 or 128 (default: 32 for 4 bits, 64 for 8 bits, as in the Kyutai releases).
    #[arg(long, value_name = "N")]
    pub group_size: Option<usize>,
    /// LM config (Kyutai config.json). Default: config.json next to the input, else moshiko 7B.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// The LM config (`--config`, else config.json next to the input, else the built-in 7B), where
/// it came from, and the file read (if any).
fn config_for(args: &QuantizeArgs) -> anyhow::Result<(LmConfig, String, Option<PathBuf>)> {
    let sibling = args
        .input
        .parent()
        .unwrap_or(Path::new("."))
        .join("config.json");
    let path = match &args.config {
        Some(p) => p.clone(),
        None if sibling.is_file() => sibling,
        None => return Ok((LmConfig::moshiko_7b(), "built-in moshiko 7B".into(), None)),
    };
    let cfg = LmConfig::from_file(&path)
        .with_context(|| format!("reading the LM config {}", path.display()))?;
    let origin = path.display().to_string();
    Ok((cfg, origin, Some(path)))
}

pub fn run(args: QuantizeArgs) -> anyhow::Result<()> {
    remove_partials_on(Signals::All)?;
    if args.bits != 4 && args.bits != 8 {
        bail!(
            "--bits {}: expected 4 or 8 (the MLX formats of the Kyutai releases)",
            args.bits
        );
    }
    let group_size = args
        .group_size
        .unwrap_or_else(|| WeightMode::default_group_size(args.bits));
    // Before anything is read: a group size no MLX file uses is a bad flag, not a bad tensor.
    if !SUPPORTED_GROUP_SIZES.contains(&group_size) {
        bail!(
            "--group-size {group_size}: expected one of {SUPPORTED_GROUP_SIZES:?} (the MLX group sizes)"
        );
    }
    let (cfg, config_origin, config_path) = config_for(&args)?;
    // The config read, whether named by --config or picked up next to the input.
    let mut inputs = vec![args.input.as_path()];
    inputs.extend(config_path.as_deref());
    check_outputs(&[("output", &args.output)], &inputs)?;
    let started = Instant::now();
    eprintln!(
        "quantizing {} to {}-bit, group size {group_size} (config: {config_origin}) ...",
        args.input.display(),
        args.bits
    );
    let weights = load_lm_weights(
        &args.input,
        &cfg,
        WeightMode::Quantize {
            bits: args.bits,
            group_size,
        },
    )
    .with_context(|| format!("quantizing {}", args.input.display()))?;
    write_mlx_quantized(&weights, &cfg, &args.output)
        .with_context(|| format!("writing {}", args.output.display()))?;
    eprintln!(
        "wrote {} in {:.1} s",
        args.output.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
