//! `moshi-rs codec`: Mimi encode (WAV of any rate/channels -> mono 24 kHz -> codes .npy, int64
//! `[codebooks, frames]`) and decode (codes .npy -> 24 kHz int16 WAV, or float32 PCM .npy), both
//! through the streaming codec frame by frame, exactly as the live pipeline runs it. Audio is
//! read and written a frame at a time (memory flat whatever the length); outputs are complete
//! or absent, devices and pipes are written in place, an input is never overwritten.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use moshi_loader::npy::{self, NpyWriter};
use moshi_loader::{load_mimi_weights, MimiConfig};
use moshi_model::mimi::{Mimi, MimiWeights};
use moshi_runtime::wav::WavWriter;
use moshi_runtime::wav_frames::{PartialFrame, WavFrames};

use super::outputs::check_outputs;
use super::signals::{remove_partials_on, Signals};

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
    /// bf16 or q8 (MLX 8-bit affine, group 64), their activations f32. With q8, convolutions of
    /// many rows round their weights and activations to bf16 on CPUs with AVX512-BF16, and the
    /// transformers' activations take the quantized products' precision on AVX-512 VNNI.
    #[arg(long, value_name = "f32|bf16|q8", default_value_t = MimiWeights::F32)]
    pub mimi_weights: MimiWeights,
}

#[derive(clap::Args, Debug)]
pub struct EncodeArgs {
    /// Input WAV (8/16/24/32-bit integer or 32/64-bit float, any channel count (averaged to mono),
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
    remove_partials_on(Signals::All)?;
    match cmd {
        CodecCommand::Encode(args) => encode(args),
        CodecCommand::Decode(args) => decode(args),
    }
}

/// Resolves (weights, config, the config file read if any) from the options.
fn resolve(source: &MimiSource) -> Result<(PathBuf, MimiConfig, Option<PathBuf>)> {
    let weights = match (&source.mimi, &source.model) {
        (Some(file), _) => file.clone(),
        (None, Some(dir)) => find_mimi_in(dir)?,
        (None, None) => bail!("no Mimi weights: pass --mimi FILE or --model DIR"),
    };
    let config_path = match (&source.mimi_config, &source.model) {
        (Some(file), _) => Some(file.clone()),
        (None, Some(dir)) if dir.join("mimi_config.json").is_file() => {
            Some(dir.join("mimi_config.json"))
        }
        _ => None,
    };
    let config = match &config_path {
        Some(file) => MimiConfig::from_file(file)?,
        None => MimiConfig::v0_1(),
    };
    Ok((weights, config, config_path))
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
    let output = [("output", args.output.as_path())];
    check_outputs(&output, &[&args.input])?;
    let (weights, cfg, config_path) = resolve(&args.source)?;
    let mut inputs = vec![args.input.as_path(), weights.as_path()];
    inputs.extend(config_path.as_deref());
    check_outputs(&output, &inputs)?;
    let mut mimi = load_mimi(&cfg, &weights, args.codebooks)?;
    mimi.set_weights(args.source.mimi_weights);
    let frame = mimi.frame_size_samples();
    let partial = if args.pad_last_frame {
        PartialFrame::Pad
    } else {
        PartialFrame::Drop
    };
    let rate = mimi.sample_rate() as u32;
    let mut frames_in = WavFrames::open(&args.input, rate, frame, partial)?;
    if frames_in.source_rate_hz() != rate {
        tracing::info!(
            "resampling {} from {} Hz to {rate} Hz",
            args.input.display(),
            frames_in.source_rate_hz()
        );
    }
    let frames = frames_in.total_frames() as usize;
    if frames == 0 {
        bail!(
            "{}: shorter than one {frame}-sample frame at {rate} Hz; nothing to encode",
            args.input.display()
        );
    }
    let k = mimi.num_codebooks();
    let start = std::time::Instant::now();
    // Codes are small (8 codebooks x 12.5 frames/s x 4 bytes: 1.4 MB per hour of audio); the
    // audio itself is streamed.
    let mut frame_major = Vec::with_capacity(frames * k);
    let mut codes = vec![0u32; k];
    while let Some(pcm) = frames_in.next_frame()? {
        mimi.encode_frame_into(pcm, &mut codes)?;
        frame_major.extend_from_slice(&codes);
    }
    tracing::info!(
        "encoded {frames} frames in {:.1} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
    let mut writer = NpyWriter::create_i64(&args.output, &[k, frames])?;
    let mut row = Vec::with_capacity(frames);
    for q in 0..k {
        row.clear();
        row.extend(frame_major.iter().skip(q).step_by(k).map(|&c| c as i64));
        writer.write_i64(&row)?;
    }
    writer.finish()?;
    eprintln!("{}: {k} codebooks x {frames} frames", args.output.display());
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
    let output = [("output", args.output.as_path())];
    check_outputs(&output, &[&args.input])?;
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
    // Frame-major codes, checked: every one a u32 (the codebook range is Mimi's check).
    let mut frame_major = vec![0u32; k * frames];
    for q in 0..k {
        for t in 0..frames {
            let c = arr.data[q * frames + t];
            frame_major[t * k + q] = u32::try_from(c).map_err(|_| {
                anyhow::anyhow!(
                    "{}: code {c} at codebook {q}, frame {t} is negative or too large",
                    args.input.display()
                )
            })?;
        }
    }
    drop(arr);
    let (weights, cfg, config_path) = resolve(&args.source)?;
    let mut inputs = vec![args.input.as_path(), weights.as_path()];
    inputs.extend(config_path.as_deref());
    check_outputs(&output, &inputs)?;
    if k > cfg.quantizer.n_q {
        bail!(
            "{}: holds {k} codebooks (rows), the Mimi quantizer has 1..={} (n_q)",
            args.input.display(),
            cfg.quantizer.n_q
        );
    }
    let mut mimi = load_mimi(&cfg, &weights, k)?;
    mimi.set_weights(args.source.mimi_weights);
    mimi.check_codes(&frame_major)
        .with_context(|| format!("decoding {}", args.input.display()))?;
    let frame = mimi.frame_size_samples();
    let samples = frames as u64 * frame as u64;
    let rate = mimi.sample_rate() as u32;
    let mut pcm = vec![0f32; frame];
    let decoding = || format!("decoding {}", args.input.display());
    if as_npy {
        let mut out = NpyWriter::create_f32(&args.output, &[samples as usize])?;
        for codes in frame_major.chunks_exact(k) {
            mimi.decode_frame_into(codes, &mut pcm)
                .with_context(decoding)?;
            out.write_f32(&pcm)?;
        }
        out.finish()?;
    } else {
        let mut out = WavWriter::create(&args.output, 1, rate, samples)?;
        for codes in frame_major.chunks_exact(k) {
            mimi.decode_frame_into(codes, &mut pcm)
                .with_context(decoding)?;
            out.write_mono(&pcm)?;
        }
        out.finish()?;
    }
    eprintln!(
        "{}: {samples} samples ({frames} frames)",
        args.output.display()
    );
    Ok(())
}
