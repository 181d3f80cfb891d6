//! `moshi-rs file in.wav out.wav`: Moshi answers a recorded conversation, frame by frame through
//! the same streaming pipeline as live chat (Mimi encode -> LM step -> Mimi decode). Prints the
//! words as they are generated, writes the answer (24 kHz mono int16), optionally a transcript
//! with word times, the tokens as JSON Lines and a per-frame profile; ends with the time per
//! frame split by stage and the real-time factor.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use moshi_runtime::engine::{run_offline, FrameOutput};
use moshi_runtime::{resample, wav, RuntimeError, FRAME_SAMPLES, SAMPLE_RATE_HZ};

use super::model_args::{ModelArgs, SamplingArgs};
use super::transcript::Transcript;

#[derive(clap::Args, Debug)]
pub struct FileArgs {
    /// Input WAV (any rate, channels, 8/16/24/32-bit integer or 32-bit float).
    pub input: PathBuf,
    /// Output WAV (24 kHz mono int16), as many samples as the input's whole 80 ms frames.
    pub output: PathBuf,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Write Moshi's words with their time in the output (TSV: start_s, end_s, word).
    #[arg(long, value_name = "FILE")]
    pub transcript: Option<PathBuf>,
    /// Write the tokens, one JSON object per output frame: {"frame", "text", "audio"}.
    #[arg(long, value_name = "FILE")]
    pub tokens_out: Option<PathBuf>,
    /// Write per-frame timings as JSON Lines.
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
}

/// Fails early (before any compute) when `path` cannot be written: missing folder, a directory.
pub fn check_writable(path: &Path, what: &str) -> anyhow::Result<()> {
    anyhow::ensure!(!path.is_dir(), "{what} {}: is a directory", path.display());
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    anyhow::ensure!(
        parent.is_dir(),
        "{what} {}: folder {} does not exist",
        path.display(),
        parent.display()
    );
    let probe = parent.join(format!(".moshi-rs-write-probe-{}", std::process::id()));
    std::fs::File::create(&probe).with_context(|| {
        format!(
            "{what} {}: folder {} is not writable",
            path.display(),
            parent.display()
        )
    })?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Reads a WAV and brings it to 24 kHz mono with at least one whole frame.
pub fn read_input_24k(path: &Path) -> anyhow::Result<Vec<f32>> {
    let audio = wav::read_mono(path)?;
    let pcm = resample::resample_to(&audio.samples, audio.sample_rate_hz, SAMPLE_RATE_HZ)?;
    if pcm.len() < FRAME_SAMPLES {
        return Err(RuntimeError::TooShort {
            path: path.to_path_buf(),
            got_samples: pcm.len(),
            need_samples: FRAME_SAMPLES,
        }
        .into());
    }
    Ok(pcm)
}

pub fn run(args: FileArgs) -> anyhow::Result<()> {
    let pcm = read_input_24k(&args.input)?;
    check_writable(&args.output, "output")?;
    for (what, p) in [
        ("--transcript", &args.transcript),
        ("--tokens-out", &args.tokens_out),
        ("--profile", &args.profile),
    ] {
        if let Some(p) = p {
            check_writable(p, what)?;
        }
    }
    let frames = pcm.len() / FRAME_SAMPLES;

    let load_started = Instant::now();
    let spinner = indicatif::ProgressBar::new_spinner().with_message("loading the model");
    spinner.enable_steady_tick(std::time::Duration::from_millis(120));
    let loaded = args.model.load_pipeline(args.sampling.config());
    spinner.finish_and_clear();
    let (model, mut pipeline) = loaded?;
    eprintln!(
        "model: {} ({:?}), mimi {}, tokenizer {}; loaded in {:.2} s",
        model.lm_weights_path.display(),
        model.layout,
        model.mimi_weights_path.display(),
        model.tokenizer_path.display(),
        load_started.elapsed().as_secs_f64()
    );
    eprintln!(
        "input: {} ({} frames, {:.2} s at 24 kHz)",
        args.input.display(),
        frames,
        pcm.len() as f64 / SAMPLE_RATE_HZ as f64
    );

    let bar = indicatif::ProgressBar::new(frames as u64).with_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} frames {msg}")
            .expect("static template"),
    );
    let mut tokens_jsonl = String::new();
    let mut transcript = Transcript::default();
    let started = Instant::now();
    let mut stdout = std::io::stdout();
    let (out_pcm, metrics) = run_offline(&mut pipeline, &pcm, |i, o: &FrameOutput| {
        if let Some(t) = &o.tokens {
            tokens_jsonl +=
                &serde_json::json!({ "frame": i, "text": t.text, "audio": t.audio }).to_string();
            tokens_jsonl.push('\n');
        }
        if let Some(text) = &o.text {
            transcript.push(i, text);
            let _ = write!(stdout, "{text}");
            let _ = stdout.flush();
        }
        let audio_s = (i + 1) as f64 * FRAME_SAMPLES as f64 / SAMPLE_RATE_HZ as f64;
        bar.set_message(format!(
            "real-time factor {:.2}",
            started.elapsed().as_secs_f64() / audio_s
        ));
        bar.inc(1);
    })?;
    let tail = pipeline.finish_text();
    if !tail.is_empty() {
        transcript.push(frames as u64 - 1, &tail);
        print!("{tail}");
    }
    println!();
    bar.finish_and_clear();

    wav::write_mono_i16(&args.output, &out_pcm, SAMPLE_RATE_HZ)?;
    eprintln!(
        "wrote {} ({} samples)",
        args.output.display(),
        out_pcm.len()
    );
    if let Some(p) = &args.tokens_out {
        std::fs::write(p, &tokens_jsonl).with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &args.transcript {
        std::fs::write(p, transcript.to_tsv())
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &args.profile {
        metrics.write_jsonl(p)?;
    }
    eprint!("{}", metrics.summary().to_table());
    Ok(())
}
