//! `moshi-rs codec`: Mimi encode (WAV of any rate/channels -> mono 24 kHz -> codes .npy, int64
//! `[codebooks, frames]`) and decode (codes .npy -> 24 kHz int16 WAV, or float32 PCM .npy), both
//! through the streaming codec frame by frame, exactly as the live pipeline runs it.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use moshi_loader::{load_mimi_weights, npy, MimiConfig};
use moshi_model::mimi::{Mimi, MimiWeights};

use moshi_runtime::{resample::resample_to, wav};

#[derive(clap::Subcommand, Debug)]
pub enum CodecCommand {
    /// Encode a 24 kHz WAV file into Mimi codes (.npy, int64 [codebooks, frames]).
    Encode(EncodeArgs),
    /// Decode Mimi codes (.npy, [codebooks, frames]) into a 24 kHz WAV (int16) or a float32 .npy.
    Decode(DecodeArgs),
}

/// Where the Mimi weights and config come from.
#[derive(clap::Args, Debug)]
pub struct MimiSource {
    /// Mimi weights (safetensors, PyTorch names, e.g. tokenizer-e351c8d8-checkpoint125.safetensors).
    #[arg(long)]
    pub mimi: Option<PathBuf>,
    /// Mimi config (mimi_config.json); default: the one in --model DIR, else the v0.1 release config.
    #[arg(long)]
    pub mimi_config: Option<PathBuf>,
    /// Model folder holding mimi.safetensors or tokenizer-*.safetensors (and optionally mimi_config.json).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Mimi weight precision of the per-frame (memory-bound) products: f32 (exact, default),
    /// bf16 or q8 (MLX 8-bit affine, group 64). Activations stay f32.
    #[arg(long, value_name = "f32|bf16|q8", default_value_t = MimiWeights::F32)]
    pub mimi_weights: MimiWeights,
}

#[derive(clap::Args, Debug)]
pub struct EncodeArgs {
    /// Input WAV (8/16/24/32-bit integer or 32-bit float, any channel count (averaged to mono),
    /// any sample rate (resampled to 24 kHz)).
    pub input: PathBuf,
    /// Output codes (.npy, int64 [codebooks, frames]).
    pub output: PathBuf,
    #[command(flatten)]
    pub source: MimiSource,
    /// Codebooks per frame (Moshi uses 8).
    #[arg(long, default_value_t = 8)]
    pub codebooks: usize,
    /// Zero-pad a trailing partial frame instead of dropping it.
    #[arg(long)]
    pub pad_last_frame: bool,
}

#[derive(clap::Args, Debug)]
pub struct DecodeArgs {
    /// Input codes (.npy, integer [codebooks, frames]).
    pub input: PathBuf,
    /// Output: .wav (24 kHz mono int16) or .npy (float32 PCM).
    pub output: PathBuf,
    #[command(flatten)]
    pub source: MimiSource,
    /// Codebooks expected in the input (default: as many as the file holds).
    #[arg(long)]
    pub codebooks: Option<usize>,
}

pub fn run(cmd: CodecCommand) -> Result<()> {
    match cmd {
        CodecCommand::Encode(args) => encode(args),
        CodecCommand::Decode(args) => decode(args),
    }
}

/// Resolves (weights, config) from the options.
fn resolve(source: &MimiSource) -> Result<(PathBuf, MimiConfig)> {
    let weights = match (&source.mimi, &source.model) {
        (Some(file), _) => file.clone(),
        (None, Some(dir)) => find_mimi_in(dir)?,
        (None, None) => bail!("no Mimi weights: pass --mimi FILE or --model DIR"),
    };
    let config = match (&source.mimi_config, &source.model) {
        (Some(file), _) => MimiConfig::from_file(file)?,
        (None, Some(dir)) if dir.join("mimi_config.json").is_file() => {
            MimiConfig::from_file(dir.join("mimi_config.json"))?
        }
        _ => MimiConfig::v0_1(),
    };
    Ok((weights, config))
}

/// Reads the Mimi checkpoint at `weights` and builds Mimi with `codebooks` codebooks.
fn load_mimi(cfg: &MimiConfig, weights: &Path, codebooks: usize) -> Result<Mimi> {
    let map = load_mimi_weights(weights, codebooks)?;
    Ok(Mimi::load(cfg, map, codebooks)?)
}

fn find_mimi_in(dir: &Path) -> Result<PathBuf> {
    if !dir.is_dir() {
        bail!("--model {}: not a directory", dir.display());
    }
    let direct = dir.join("mimi.safetensors");
    if direct.is_file() {
        return Ok(direct);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("--model {}: cannot list the folder", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("tokenizer-") && n.ends_with(".safetensors"))
        })
        .collect();
    found.sort();
    match found.len() {
        0 => bail!(
            "--model {}: no mimi.safetensors or tokenizer-*.safetensors in the folder",
            dir.display()
        ),
        1 => Ok(found.remove(0)),
        _ => bail!(
            "--model {}: several Mimi checkpoints ({found:?}); pick one with --mimi",
            dir.display()
        ),
    }
}

fn encode(args: EncodeArgs) -> Result<()> {
    let (weights, cfg) = resolve(&args.source)?;
    let mut mimi = load_mimi(&cfg, &weights, args.codebooks)?;
    mimi.set_weights(args.source.mimi_weights);
    let frame = mimi.frame_size_samples();
    let audio = wav::read_mono(&args.input)?;
    let rate = mimi.sample_rate() as u32;
    let mut pcm = if audio.sample_rate_hz == rate {
        audio.samples
    } else {
        tracing::info!(
            "resampling {} from {} Hz to {rate} Hz",
            args.input.display(),
            audio.sample_rate_hz
        );
        resample_to(&audio.samples, audio.sample_rate_hz, rate)?
    };
    let partial = pcm.len() % frame;
    if partial != 0 {
        if args.pad_last_frame {
            pcm.resize(pcm.len() + frame - partial, 0.0);
        } else {
            tracing::info!("dropping the trailing {partial} samples (a partial frame; --pad-last-frame keeps them)");
            pcm.truncate(pcm.len() - partial);
        }
    }
    if pcm.is_empty() {
        bail!(
            "{}: shorter than one {frame}-sample frame ({partial} samples); nothing to encode",
            args.input.display()
        );
    }
    let start = std::time::Instant::now();
    let codes = mimi.encode_step(&pcm)?;
    let frames = codes[0].len();
    tracing::info!(
        "encoded {frames} frames in {:.1} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
    let flat: Vec<i64> = codes
        .iter()
        .flat_map(|row| row.iter().map(|&c| c as i64))
        .collect();
    npy::write_i64(&args.output, &[codes.len(), frames], &flat)?;
    eprintln!(
        "{}: {} codebooks x {frames} frames",
        args.output.display(),
        codes.len()
    );
    Ok(())
}

fn decode(args: DecodeArgs) -> Result<()> {
    let as_npy = match args
        .output
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("npy") => true,
        Some("wav") => false,
        _ => bail!("{}: output must end in .wav or .npy", args.output.display()),
    };
    let arr = npy::read_i64(&args.input)?;
    if arr.shape.len() != 2 {
        bail!(
            "{}: codes must be a 2-D array [codebooks, frames], got shape {:?}",
            args.input.display(),
            arr.shape
        );
    }
    let (k, frames) = (arr.shape[0], arr.shape[1]);
    if k == 0 || frames == 0 {
        bail!("{}: no codes (shape {:?})", args.input.display(), arr.shape);
    }
    if let Some(expected) = args.codebooks {
        if expected != k {
            bail!(
                "{}: holds {k} codebooks, --codebooks says {expected}",
                args.input.display()
            );
        }
    }
    let mut codes = Vec::with_capacity(k);
    for q in 0..k {
        let row = &arr.data[q * frames..(q + 1) * frames];
        let mut out = Vec::with_capacity(frames);
        for (t, &c) in row.iter().enumerate() {
            let c = u32::try_from(c).map_err(|_| {
                anyhow::anyhow!(
                    "{}: code {c} at codebook {q}, frame {t} is negative or too large",
                    args.input.display()
                )
            })?;
            out.push(c);
        }
        codes.push(out);
    }
    let (weights, cfg) = resolve(&args.source)?;
    let mut mimi = load_mimi(&cfg, &weights, k)?;
    mimi.set_weights(args.source.mimi_weights);
    let pcm = mimi
        .decode_step(&codes)
        .with_context(|| format!("decoding {}", args.input.display()))?;
    if as_npy {
        npy::write_f32(&args.output, &[pcm.len()], &pcm)?;
    } else {
        wav::write_mono_i16(&args.output, &pcm, mimi.sample_rate() as u32)?;
    }
    eprintln!(
        "{}: {} samples ({frames} frames)",
        args.output.display(),
        pcm.len()
    );
    Ok(())
}
