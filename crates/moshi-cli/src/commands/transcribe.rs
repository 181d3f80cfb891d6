//! `moshi-rs transcribe in.wav`: a recording transcribed by a speech-to-text model (Kyutai's
//! STT: `model_type` "stt"), fed as `delayed-streams-modeling`'s `stt_from_file_pytorch.py`
//! feeds it ([`moshi_runtime::transcribe`]): greedy, as Kyutai's scripts and `moshi-server`
//! run these models. Prints the text as it is recognised and, where the model has its voice
//! activity heads, marks the end of a turn as the script's `--vad` does (head 2's first value
//! above 0.5); writes the words with their start and end (`--out`, TSV, JSON, SRT or WebVTT by
//! extension), every step's token and extra heads (`--tokens-out`) and timings (`--profile`).
//!
//! The recording is read one frame at a time and every output is written as the words complete,
//! each through `moshi_loader::output_file` (complete or absent, inputs never overwritten): memory
//! stays flat however long the recording.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use moshi_loader::output_file::{commit_all, names_stdout, FinishedOutput, OutputFile};
use moshi_model::kind::ModelKind;
use moshi_model::stt::TimedWord;
use moshi_runtime::metrics::ProfileWriter;
use moshi_runtime::transcribe::{feeding_of, transcribe_frames, TranscribedStep};
use moshi_runtime::wav_frames::{PartialFrame, WavFrames};
use moshi_runtime::{FRAME_SAMPLES, SAMPLE_RATE_HZ};

use super::model_args::{ModelArgs, SamplingArgs, FILE_KV_CACHE};
use super::outputs::check_outputs;
use super::stdout::Words;
use super::transcript::{escape_controls, tsv_line};

/// The model without `--model`: Kyutai's English and French model (0.5 s delay, voice activity
/// heads), its PyTorch release.
pub const DEFAULT_STT_REPO: &str = "kyutai/stt-1b-en_fr";

/// The extra head whose first value is the end-of-turn probability, and the threshold above
/// which a turn has ended (`stt_from_file_pytorch.py --vad`: `vad_heads[2][0, 0, 0] > 0.5`).
const END_OF_TURN_HEAD: usize = 2;
const END_OF_TURN_THRESHOLD: f32 = 0.5;

#[derive(clap::Args, Debug)]
pub struct TranscribeArgs {
    /// Input WAV (8 kHz or more, any channels, 8/16/24/32-bit integer or 32/64-bit float).
    pub input: PathBuf,
    // `--model` defaults to DEFAULT_STT_REPO here; `assets/tiny-stt` is the bundled
    // random-weight speech-to-text model for testing offline.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Write the words with their start and end in the input, in seconds; the format follows the
    /// extension: `.tsv` (start_s, end_s, word), `.json` (an array of {"text", "start_s",
    /// "end_s"}), `.srt` or `.vtt` (one cue per word). May be given several times.
    #[arg(long, value_name = "FILE")]
    pub out: Vec<PathBuf>,
    /// Write one JSON object per step: {"frame", "fed", "text", "extra_heads"}.
    #[arg(long, value_name = "FILE")]
    pub tokens_out: Option<PathBuf>,
    /// Write per-step timings as JSON Lines.
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
}

/// A format of `--out`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WordsFormat {
    Tsv,
    Json,
    Srt,
    Vtt,
}

impl WordsFormat {
    fn of(path: &Path) -> anyhow::Result<Self> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        Ok(match ext.as_deref() {
            Some("tsv") => Self::Tsv,
            Some("json") => Self::Json,
            Some("srt") => Self::Srt,
            Some("vtt") => Self::Vtt,
            _ => anyhow::bail!(
                "--out {}: the extension names the format: .tsv, .json, .srt or .vtt",
                path.display()
            ),
        })
    }
}

/// One `--out` file, written word by word.
struct WordsFile {
    format: WordsFormat,
    file: OutputFile,
    written: usize,
}

impl WordsFile {
    fn create(path: &Path) -> anyhow::Result<Self> {
        let format = WordsFormat::of(path)?;
        let mut file = OutputFile::create(path)?;
        let header: &[u8] = match format {
            WordsFormat::Json => b"[",
            WordsFormat::Vtt => b"WEBVTT\n\n",
            WordsFormat::Tsv | WordsFormat::Srt => b"",
        };
        file.write_bytes(header)?;
        Ok(Self {
            format,
            file,
            written: 0,
        })
    }

    fn word(&mut self, w: &TimedWord) -> anyhow::Result<()> {
        let cue = |sep: char| {
            format!(
                "{} --> {}\n{}\n\n",
                clock(w.start_s, sep),
                clock(w.end_s, sep),
                escape_controls(&w.text)
            )
        };
        let text = match self.format {
            WordsFormat::Tsv => tsv_line(w.start_s, w.end_s, &w.text),
            // Keys in the documented order; times as the shortest decimal that reads back
            // as the same f64.
            WordsFormat::Json => format!(
                "{}\n  {{\"text\": {}, \"start_s\": {}, \"end_s\": {}}}",
                if self.written == 0 { "" } else { "," },
                serde_json::Value::from(w.text.as_str()),
                serde_json::Value::from(w.start_s),
                serde_json::Value::from(w.end_s)
            ),
            WordsFormat::Srt => format!("{}\n{}", self.written + 1, cue(',')),
            WordsFormat::Vtt => cue('.'),
        };
        self.file.write_bytes(text.as_bytes())?;
        self.written += 1;
        Ok(())
    }

    /// The file complete, to be put in place with the run's other outputs.
    fn finish(mut self) -> anyhow::Result<FinishedOutput> {
        if self.format == WordsFormat::Json {
            let end: &[u8] = if self.written == 0 { b"]\n" } else { b"\n]\n" };
            self.file.write_bytes(end)?;
        }
        Ok(self.file.finish()?)
    }
}

/// `HH:MM:SS,mmm` (SRT, `sep` ',') or `HH:MM:SS.mmm` (WebVTT, '.'), to the nearest millisecond.
fn clock(seconds: f64, sep: char) -> String {
    let ms = (seconds.max(0.0) * 1e3).round() as u64;
    let (h, m, s, ms) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    format!("{h:02}:{m:02}:{s:02}{sep}{ms:03}")
}

/// Greedy sampling: Kyutai's STT scripts run `LMGen(temp=0, temp_text=0)`, moshi-server
/// `temperature = 0`.
fn greedy() -> SamplingArgs {
    SamplingArgs {
        temp: None,
        temp_text: None,
        top_k: None,
        top_k_text: None,
        seed: 0,
        greedy: true,
        cfg_coef: None,
    }
}

pub fn run(args: TranscribeArgs) -> anyhow::Result<()> {
    let input: &Path = &args.input;
    let mut outputs: Vec<(&str, &Path)> = args.out.iter().map(|p| ("--out", p.as_path())).collect();
    for p in &args.out {
        WordsFormat::of(p)?;
    }
    for (what, p) in [
        ("--tokens-out", &args.tokens_out),
        ("--profile", &args.profile),
    ] {
        if let Some(p) = p {
            outputs.push((what, p));
        }
    }
    let mut frames = WavFrames::open(input, SAMPLE_RATE_HZ, FRAME_SAMPLES, PartialFrame::Pad)?;
    let model = args.model.resolve_or(DEFAULT_STT_REPO, "assets/tiny-stt")?;
    // No output may overwrite a file the command reads: the WAV or any file of the model.
    let mut inputs = vec![input];
    inputs.extend(model.input_paths());
    check_outputs(&outputs, &inputs)?;
    // Words are not printed into an output.
    let mut printed = if outputs.iter().any(|(_, p)| names_stdout(p)) {
        Words::quiet()
    } else {
        Words::default()
    };

    let load_started = Instant::now();
    let (model, mut pipeline) = args
        .model
        .load_resolved_model(model, &greedy(), FILE_KV_CACHE, 1)?
        .into_pipeline()?;
    let kind = pipeline.model().kind();
    anyhow::ensure!(
        kind == ModelKind::SpeechToText,
        "transcribe needs a speech-to-text model (`model_type` \"stt\"); {} is {}: use `moshi-rs file`",
        model.lm_weights_path.display(),
        kind.conventions().name
    );
    let feeding = feeding_of(&pipeline);
    let heads = pipeline.model().generator().weights().num_extra_heads();
    eprintln!(
        "model: {} ({:?}), mimi {}, tokenizer {}; loaded in {:.2} s",
        model.lm_weights_path.display(),
        model.layout,
        model.mimi_weights_path.display(),
        model.tokenizer_path.display(),
        load_started.elapsed().as_secs_f64()
    );
    eprintln!(
        "input: {} ({} frames, {:.2} s at 24 kHz); {} silence frames before, {} after (text delay {:.2} s); {heads} extra heads",
        input.display(),
        frames.total_frames(),
        (frames.total_frames() * FRAME_SAMPLES as u64) as f64 / SAMPLE_RATE_HZ as f64,
        feeding.prefix_frames,
        feeding.suffix_frames,
        pipeline.model().lm_config().stt().delay_s(),
    );

    let mut words_files = args
        .out
        .iter()
        .map(|p| WordsFile::create(p).with_context(|| format!("--out {}", p.display())))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut tokens = args
        .tokens_out
        .as_deref()
        .map(OutputFile::create)
        .transpose()
        .context("--tokens-out")?;
    let mut profile = args
        .profile
        .as_deref()
        .map(ProfileWriter::create)
        .transpose()
        .context("--profile")?;
    let steps = feeding.prefix_frames as u64 + frames.total_frames() + feeding.suffix_frames as u64;
    let bar = indicatif::ProgressBar::new(steps).with_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} steps {msg}")
            .expect("static template"),
    );
    let started = Instant::now();
    let mut words_out = 0usize;
    let mut after_turn_end = false;
    let mut write_words = |files: &mut Vec<WordsFile>, words: &[TimedWord]| -> anyhow::Result<()> {
        for w in words {
            for f in files.iter_mut() {
                f.word(w).context("--out")?;
            }
        }
        words_out += words.len();
        Ok(())
    };

    let on_step = |s: &TranscribedStep<'_>| -> anyhow::Result<()> {
        let t = s.output.tokens.as_ref();
        if let (Some(out), Some(t)) = (tokens.as_mut(), t) {
            let mut line = serde_json::json!({
                "frame": s.step,
                "fed": s.fed.label(),
                "text": t.text,
                "extra_heads": t.extra_heads,
            })
            .to_string();
            line.push('\n');
            out.write_bytes(line.as_bytes()).context("--tokens-out")?;
        }
        if let Some(p) = profile.as_mut() {
            p.write(s.record).context("--profile")?;
        }
        if let Some(text) = &s.output.text {
            printed.print(text);
            after_turn_end = false;
        }
        let end_of_turn = t
            .and_then(|t| t.extra_heads.get(END_OF_TURN_HEAD))
            .and_then(|h| h.first().copied());
        if let Some(p) = end_of_turn {
            if p > END_OF_TURN_THRESHOLD && !after_turn_end {
                printed.print(" [end of turn]");
                after_turn_end = true;
            }
            bar.set_message(format!("end of turn {p:.2}"));
        }
        write_words(&mut words_files, s.words)?;
        bar.inc(1);
        Ok(())
    };
    let result: anyhow::Result<_> = transcribe_frames(&mut pipeline, &mut frames, on_step);
    let (last, metrics) = result?;
    write_words(&mut words_files, &last)?;
    printed.print("\n");
    bar.finish_and_clear();
    // Every output complete first, then all put in place together: a failed one replaces none.
    let mut finished = Vec::new();
    for f in words_files {
        finished.push(f.finish().context("--out")?);
    }
    if let Some(out) = tokens {
        finished.push(out.finish().context("--tokens-out")?);
    }
    if let Some(p) = profile {
        finished.push(p.complete(&metrics.summary()).context("--profile")?);
    }
    commit_all(finished)?;
    eprintln!(
        "{words_out} words in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    eprint!("{}", metrics.summary().to_table());
    printed.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subtitle_clocks_round_to_the_millisecond() {
        assert_eq!(clock(0.45999999999999996, ','), "00:00:00,460");
        assert_eq!(clock(3723.0015, '.'), "01:02:03.002");
    }

    #[test]
    fn the_extension_names_the_format() {
        assert_eq!(
            WordsFormat::of(Path::new("a.JSON")).unwrap(),
            WordsFormat::Json
        );
        let e = WordsFormat::of(Path::new("words.txt"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--out words.txt") && e.contains(".vtt"), "{e}");
    }
}
