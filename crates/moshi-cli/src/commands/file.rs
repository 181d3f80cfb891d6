//! `moshi-rs file in.wav out.wav`: Moshi answers a recorded conversation, frame by frame through
//! the same streaming pipeline as live chat (Mimi encode -> LM step -> Mimi decode). Prints the
//! words as they are generated, writes the answer (24 kHz mono int16), optionally a transcript
//! with word times, the tokens as JSON Lines and a per-frame profile; ends with the time per
//! frame split by stage and the real-time factor. With a translation model (Hibiki) the input is
//! followed by its end-of-stream frame and silence until the model ends its text
//! ([`moshi_runtime::translate`]); the output is the translation.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use moshi_runtime::engine::{run_offline, FrameOutput};
use moshi_runtime::translate::{translate_offline, TranslationEnd};
use moshi_runtime::{resample, wav, RuntimeError, FRAME_SAMPLES, SAMPLE_RATE_HZ};

use super::model_args::{ModelArgs, SamplingArgs};
use super::transcript::Transcript;

#[derive(clap::Args, Debug)]
pub struct FileArgs {
    /// Input WAV (any rate, channels, 8/16/24/32-bit integer or 32-bit float).
    pub input: PathBuf,
    /// Output WAV (24 kHz mono int16): as many samples as the input's whole 80 ms frames (Moshi),
    /// or every frame the model returns until it ends its text (translation models).
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
    /// Translation models (Hibiki) only: after the input's end-of-stream frame, silence is fed
    /// until the model ends its text (EOS), for at most this many seconds (whole 80 ms frames).
    /// Default 0.5 (6 frames, the silence Kyutai's hibiki-rs appends); a real model may need
    /// several seconds to finish its last sentence.
    #[arg(long, value_name = "SECONDS")]
    pub max_tail_s: Option<f64>,
}

/// Default of `--max-tail-s`.
pub const DEFAULT_MAX_TAIL_S: f64 = 0.5;

/// Whole 80 ms frames in `seconds` (`--max-tail-s`), refusing what is not a finite number >= 0
/// or more than an hour.
pub fn tail_frames(seconds: f64) -> anyhow::Result<usize> {
    anyhow::ensure!(
        seconds.is_finite() && (0.0..=3600.0).contains(&seconds),
        "--max-tail-s {seconds}: expected seconds between 0 and 3600"
    );
    Ok((seconds * 1e3 / moshi_runtime::FRAME_MS + 1e-9).floor() as usize)
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
    let max_tail_frames = tail_frames(args.max_tail_s.unwrap_or(DEFAULT_MAX_TAIL_S))?;
    let frames = pcm.len() / FRAME_SAMPLES;

    let load_started = Instant::now();
    let spinner = indicatif::ProgressBar::new_spinner().with_message("loading the model");
    spinner.enable_steady_tick(std::time::Duration::from_millis(120));
    let loaded = args.model.load_pipeline(&args.sampling);
    spinner.finish_and_clear();
    let (model, mut pipeline) = loaded?;
    let translation = pipeline.is_translation();
    anyhow::ensure!(
        translation || args.max_tail_s.is_none(),
        "--max-tail-s applies to translation models (Hibiki) only; {} is a Moshi model",
        model.lm_weights_path.display()
    );
    eprintln!(
        "model: {} ({:?}), mimi {}, tokenizer {}; loaded in {:.2} s",
        model.lm_weights_path.display(),
        model.layout,
        model.mimi_weights_path.display(),
        model.tokenizer_path.display(),
        load_started.elapsed().as_secs_f64()
    );
    if translation {
        eprintln!(
            "translation model: guidance coefficient {}, end of text: {}",
            pipeline.cfg_coef(),
            match pipeline.eos_text_id() {
                Some(id) => format!("EOS (id {id}) or {max_tail_frames} silence frames"),
                None => format!("the tokenizer has no EOS: {max_tail_frames} silence frames"),
            }
        );
    }
    eprintln!(
        "input: {} ({} frames, {:.2} s at 24 kHz)",
        args.input.display(),
        frames,
        pcm.len() as f64 / SAMPLE_RATE_HZ as f64
    );

    // A translation returns up to the input's frames plus the silence after it.
    let bar_len = frames + if translation { max_tail_frames } else { 0 };
    let bar = indicatif::ProgressBar::new(bar_len as u64).with_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} frames {msg}")
            .expect("static template"),
    );
    let mut tokens_jsonl = String::new();
    let mut transcript = Transcript::default();
    let started = Instant::now();
    let mut stdout = std::io::stdout();
    let mut frames_done = 0u64;
    let on_frame = |i: u64, o: &FrameOutput| {
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
        frames_done += 1;
        let audio_s = frames_done as f64 * FRAME_SAMPLES as f64 / SAMPLE_RATE_HZ as f64;
        bar.set_message(format!(
            "real-time factor {:.2}",
            started.elapsed().as_secs_f64() / audio_s
        ));
        bar.inc(1);
    };
    let eos = pipeline.eos_text_id();
    let (out_pcm, metrics, end) = if translation {
        let t = translate_offline(&mut pipeline, &pcm, eos, max_tail_frames, on_frame)?;
        (t.pcm, t.metrics, Some(t.end))
    } else {
        let (pcm, metrics) = run_offline(&mut pipeline, &pcm, on_frame)?;
        (pcm, metrics, None)
    };
    let frames_out = (out_pcm.len() / FRAME_SAMPLES) as u64;
    let tail = pipeline.finish_text();
    if !tail.is_empty() {
        transcript.push(frames_out.saturating_sub(1), &tail);
        print!("{tail}");
    }
    println!();
    bar.finish_and_clear();
    match end {
        Some(TranslationEnd::Eos { tail_frames }) => eprintln!(
            "the model ended its text after {tail_frames} silence frames ({frames_out} frames out)"
        ),
        Some(TranslationEnd::TailCapReached { tail_frames }) => eprintln!(
            "warning: the model had not ended its text (no EOS) after {tail_frames} silence frames \
             ({:.2} s, --max-tail-s); the translation may be cut short: raise --max-tail-s (e.g. 10)",
            tail_frames as f64 * moshi_runtime::FRAME_MS / 1e3
        ),
        None => {}
    }

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
