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
//!
//! `--mic` (live captions from the microphone) is [`super::transcribe_mic`]; the outputs and
//! the model's loading are shared from here.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use moshi_loader::output_file::{commit_all, names_stdout, FinishedOutput, OutputFile};
use moshi_loader::ResolvedModel;
use moshi_model::kind::ModelKind;
use moshi_model::stt::TimedWord;
use moshi_runtime::engine::FrameTokens;
use moshi_runtime::metrics::{ProfileWriter, RunSummary};
use moshi_runtime::pipeline::MoshiPipeline;
use moshi_runtime::transcribe::{feeding_of, transcribe_frames, TranscribedStep};
use moshi_runtime::wav_frames::{PartialFrame, WavFrames};
use moshi_runtime::{FRAME_SAMPLES, SAMPLE_RATE_HZ};

use super::live::LiveInputArgs;
use super::model_args::{ModelArgs, SamplingArgs, FILE_DEFAULTS};
use super::outputs::check_outputs;
use super::signals::{remove_partials_on, Signals};
use super::stdout::Words;
use super::transcript::{escape_controls, tsv_line};

/// The model without `--model`: Kyutai's English and French model (0.5 s delay, voice activity
/// heads), its PyTorch release.
pub const DEFAULT_STT_REPO: &str = "kyutai/stt-1b-en_fr";

/// The extra head whose first value is the end-of-turn probability, and the threshold above
/// which a turn has ended (`stt_from_file_pytorch.py --vad`: `vad_heads[2][0, 0, 0] > 0.5`).
const END_OF_TURN_HEAD: usize = 2;
pub(super) const END_OF_TURN_THRESHOLD: f32 = 0.5;

#[derive(clap::Args, Debug)]
pub struct TranscribeArgs {
    /// Input WAV (8 kHz or more, any channels, 8/16/24/32-bit integer or 32/64-bit float); or
    /// --mic.
    pub input: Option<PathBuf>,
    /// Live captions from the microphone (the default input device, or --input-device), through
    /// `chat`'s real-time runtime: words printed as they are recognised, with their times since
    /// listening started, until Ctrl-C, SIGTERM or --duration-s; then the words still in the
    /// model's delay are flushed and the outputs written.
    #[arg(long)]
    pub mic: bool,
    // `--model` defaults to DEFAULT_STT_REPO here; `assets/tiny-stt` is the bundled
    // random-weight speech-to-text model for testing offline.
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub live: LiveInputArgs,
    /// With --mic: write the 24 kHz frames fed to the model (the device's channels mixed and
    /// its rate converted; frames dropped because the model fell behind left out) as a mono
    /// 32-bit float WAV; `moshi-rs transcribe` on it gives the same steps and words.
    #[arg(long, value_name = "FILE")]
    pub record_input: Option<PathBuf>,
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

/// The end-of-turn probability of a step: the first value of extra head 2, when the model has
/// its voice activity heads.
pub(super) fn end_of_turn(tokens: Option<&FrameTokens>) -> Option<f32> {
    tokens
        .and_then(|t| t.extra_heads.get(END_OF_TURN_HEAD))
        .and_then(|h| h.first().copied())
}

/// The outputs of a run (flag, path), `--record-input` included; `--out`'s extensions checked.
pub(super) fn outputs_of(args: &TranscribeArgs) -> anyhow::Result<Vec<(&'static str, &Path)>> {
    let mut outputs: Vec<(&str, &Path)> = args.out.iter().map(|p| ("--out", p.as_path())).collect();
    for p in &args.out {
        WordsFormat::of(p)?;
    }
    for (what, p) in [
        ("--tokens-out", &args.tokens_out),
        ("--profile", &args.profile),
        ("--record-input", &args.record_input),
    ] {
        if let Some(p) = p {
            outputs.push((what, p));
        }
    }
    Ok(outputs)
}

/// Loads the resolved model greedy, with exact (f32) KV caches, as one pipeline; refuses a
/// model that is not speech to text (`instead`: the command that runs it).
pub(super) fn load_stt_pipeline(
    args: &ModelArgs,
    model: ResolvedModel,
    instead: &str,
) -> anyhow::Result<(ResolvedModel, MoshiPipeline)> {
    let (model, pipeline) = args
        .load_resolved_model(model, &greedy(), FILE_DEFAULTS, 1)?
        .into_pipeline()?;
    let kind = pipeline.model().kind();
    anyhow::ensure!(
        kind == ModelKind::SpeechToText,
        "transcribe needs a speech-to-text model (`model_type` \"stt\"); {} is {}: use `moshi-rs {instead}`",
        model.lm_weights_path.display(),
        kind.conventions().name
    );
    Ok((model, pipeline))
}

/// `--out`, `--tokens-out` and `--profile`, written step by step as the words complete, and
/// put in place together at the end (a failed one replaces none).
pub(super) struct StepOutputs {
    words_files: Vec<WordsFile>,
    tokens: Option<OutputFile>,
    profile: Option<ProfileWriter>,
    /// Words written so far.
    pub words_out: usize,
}

impl StepOutputs {
    pub fn create(args: &TranscribeArgs) -> anyhow::Result<Self> {
        let words_files = args
            .out
            .iter()
            .map(|p| WordsFile::create(p).with_context(|| format!("--out {}", p.display())))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let tokens = args
            .tokens_out
            .as_deref()
            .map(OutputFile::create)
            .transpose()
            .context("--tokens-out")?;
        let profile = args
            .profile
            .as_deref()
            .map(ProfileWriter::create)
            .transpose()
            .context("--profile")?;
        Ok(Self {
            words_files,
            tokens,
            profile,
            words_out: 0,
        })
    }

    /// One step: its `--tokens-out` line, its `--profile` record and the words it completed.
    pub fn step(&mut self, s: &TranscribedStep<'_>) -> anyhow::Result<()> {
        if let (Some(out), Some(t)) = (self.tokens.as_mut(), s.tokens) {
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
        if let Some(p) = self.profile.as_mut() {
            p.write(s.record).context("--profile")?;
        }
        self.words(s.words)
    }

    /// Words to every `--out` file.
    pub fn words(&mut self, words: &[TimedWord]) -> anyhow::Result<()> {
        for w in words {
            for f in self.words_files.iter_mut() {
                f.word(w).context("--out")?;
            }
        }
        self.words_out += words.len();
        Ok(())
    }

    /// Completes every output (the profile with `summary`), then puts them all in place.
    pub fn commit(self, summary: &RunSummary) -> anyhow::Result<()> {
        let mut finished = Vec::new();
        for f in self.words_files {
            finished.push(f.finish().context("--out")?);
        }
        if let Some(out) = self.tokens {
            finished.push(out.finish().context("--tokens-out")?);
        }
        if let Some(p) = self.profile {
            finished.push(p.complete(summary).context("--profile")?);
        }
        Ok(commit_all(finished)?)
    }
}

pub fn run(args: TranscribeArgs) -> anyhow::Result<()> {
    check_mode(&args)?;
    match args.input.clone() {
        Some(input) => run_file(&input, &args),
        None => super::transcribe_mic::run(&args),
    }
}

/// An input file or `--mic`, not both, not neither; the microphone's flags with `--mic` only.
fn check_mode(args: &TranscribeArgs) -> anyhow::Result<()> {
    match (&args.input, args.mic) {
        (Some(input), true) => anyhow::bail!(
            "--mic transcribes the microphone, and {} is an input file: give one or the other",
            input.display()
        ),
        (None, false) => anyhow::bail!(
            "transcribe needs an input WAV (`moshi-rs transcribe in.wav`) or --mic (live captions from the microphone)"
        ),
        (Some(_), false) => {
            let mut given = args.live.given();
            if args.record_input.is_some() {
                given.push("--record-input");
            }
            if let Some(flag) = given.first() {
                anyhow::bail!(
                    "{flag} is for --mic (live captions from the microphone); a file is transcribed whole"
                );
            }
            Ok(())
        }
        (None, true) => Ok(()),
    }
}

fn run_file(input: &Path, args: &TranscribeArgs) -> anyhow::Result<()> {
    remove_partials_on(Signals::All)?;
    let outputs = outputs_of(args)?;
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
    let (model, mut pipeline) = load_stt_pipeline(&args.model, model, "file")?;
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

    let mut outputs = StepOutputs::create(args)?;
    let steps = feeding.prefix_frames as u64 + frames.total_frames() + feeding.suffix_frames as u64;
    let bar = indicatif::ProgressBar::new(steps).with_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} steps {msg}")
            .expect("static template"),
    );
    let started = Instant::now();
    let mut after_turn_end = false;
    let on_step = |s: &TranscribedStep<'_>| -> anyhow::Result<()> {
        outputs.step(s)?;
        if let Some(text) = s.text {
            printed.print(text);
            after_turn_end = false;
        }
        if let Some(p) = end_of_turn(s.tokens) {
            if p > END_OF_TURN_THRESHOLD && !after_turn_end {
                printed.print(" [end of turn]");
                after_turn_end = true;
            }
            bar.set_message(format!("end of turn {p:.2}"));
        }
        bar.inc(1);
        Ok(())
    };
    let result: anyhow::Result<_> = transcribe_frames(&mut pipeline, &mut frames, on_step);
    let (last, metrics) = result?;
    outputs.words(&last)?;
    printed.print("\n");
    bar.finish_and_clear();
    let words_out = outputs.words_out;
    outputs.commit(&metrics.summary())?;
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
