//! `moshi-rs file in.wav out.wav`: Moshi answers a recorded conversation, frame by frame through
//! the same streaming pipeline as live chat (Mimi encode -> LM step -> Mimi decode). Prints the
//! words as they are generated, writes the answer (24 kHz mono int16), optionally a transcript
//! with word times, the tokens as JSON Lines and a per-frame profile; ends with the time per
//! frame split by stage and the real-time factor. With a translation model (Hibiki) the input is
//! followed by its end-of-stream frame and silence until the model ends its text
//! ([`moshi_runtime::translate`]); the output is the translation. Hibiki-Zero (a Hibiki config
//! without conditioners) is fed as Kyutai's `hibiki-zero generate` feeds it: a fixed generation
//! length (`--gen-duration-s`), the end-of-input frame in place of the frame after the input,
//! the output cut at the first EOS as its `decode_outputs` cuts it.
//!
//! The input is read, resampled, answered (or translated) and written one frame at a time, and
//! the transcript a word at a time: memory stays flat however long the input, for every model
//! type but Hibiki-Zero, whose window is encoded and decoded in one Mimi call each (as Kyutai's
//! `generate`), so its memory grows with `--gen-duration-s`. Every output goes through
//! `moshi_loader::output_file`: complete or absent, devices and pipes written in place, an
//! input never overwritten.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use moshi_loader::output_file::{commit_all, names_stdout, FinishedOutput, OutputFile};
use moshi_model::kind::{ModelKind, PartialLastFrame};
use moshi_runtime::engine::{FrameOutput, OfflineRunner};
use moshi_runtime::metrics::{Metrics, ProfileWriter};
use moshi_runtime::pipeline::MoshiPipeline;
use moshi_runtime::translate::{
    encode_window, translate_offline, translate_window, GenerationWindow, OutputCut, TranslationEnd,
};
use moshi_runtime::wav::WavWriter;
use moshi_runtime::wav_frames::{PartialFrame, WavFrames};
use moshi_runtime::{RuntimeError, FRAME_SAMPLES, SAMPLE_RATE_HZ};

use super::model_args::{ModelArgs, SamplingArgs, FILE_DEFAULTS};
use super::outputs::{check_outputs, given};
use super::signals::{remove_partials_on, Signals};
use super::stdout::Words;
use super::transcript::Transcript;

#[derive(clap::Args, Debug)]
pub struct FileArgs {
    /// Input WAV (8 kHz or more, any channels, 8/16/24/32-bit integer or 32/64-bit float).
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
    /// Default 30 (375 frames): Kyutai's `run_inference.py` feeds silence until EOS without a
    /// cap, and a translation lags the speech by a few seconds; the cap only ends a run whose
    /// model never returns EOS.
    #[arg(long, value_name = "SECONDS")]
    pub max_tail_s: Option<f64>,
    /// Hibiki-Zero only: how long it generates, the input included (`hibiki-zero generate
    /// --gen-duration`): the input is padded with silence to this length, and the output is
    /// cut at the model's first EOS (else before its last word). At most 120 (Kyutai's default:
    /// the whole window is encoded in one Mimi call, whose memory grows with it); default the
    /// input plus 30 s, at most 120 (each frame's codes depend only on the frames before it, so
    /// a shorter window gives Kyutai's 120 s run's frames up to its end). A longer input is
    /// refused.
    #[arg(long, value_name = "SECONDS")]
    pub gen_duration_s: Option<f64>,
}

/// Largest `--gen-duration-s`: `hibiki_zero.run.generate`'s default `gen_duration`. The window
/// is encoded in one Mimi call, whose peak memory grows with it (docs/hibiki.md).
pub const MAX_GEN_DURATION_S: f64 = 120.0;

/// What `--gen-duration-s` defaults to beyond the input's length.
pub const DEFAULT_GEN_TAIL_S: f64 = 30.0;

/// Default of `--max-tail-s`.
pub const DEFAULT_MAX_TAIL_S: f64 = 30.0;

/// Whole 80 ms frames in `seconds` (`--max-tail-s`), refusing what is not a finite number >= 0
/// or more than an hour.
pub fn tail_frames(seconds: f64) -> anyhow::Result<usize> {
    anyhow::ensure!(
        seconds.is_finite() && (0.0..=3600.0).contains(&seconds),
        "--max-tail-s {seconds}: expected seconds between 0 and 3600"
    );
    Ok((seconds * 1e3 / moshi_runtime::FRAME_MS + 1e-9).floor() as usize)
}

/// Opens a WAV as 24 kHz frames (at least one whole frame).
pub fn open_input_frames(path: &Path) -> anyhow::Result<WavFrames> {
    let frames = WavFrames::open(path, SAMPLE_RATE_HZ, FRAME_SAMPLES, PartialFrame::Drop)?;
    if frames.total_frames() == 0 {
        return Err(RuntimeError::TooShort {
            path: path.to_path_buf(),
            got_samples: moshi_runtime::resample::resampled_len(
                frames.source_samples() as usize,
                frames.source_rate_hz(),
                SAMPLE_RATE_HZ,
            ),
            need_samples: FRAME_SAMPLES,
        }
        .into());
    }
    Ok(frames)
}

pub fn run(args: FileArgs) -> anyhow::Result<()> {
    remove_partials_on(Signals::All)?;
    let input: &Path = &args.input;
    let outputs_given = given(&[
        ("output", Some(&args.output)),
        ("--transcript", args.transcript.as_deref()),
        ("--tokens-out", args.tokens_out.as_deref()),
        ("--profile", args.profile.as_deref()),
    ]);
    let mut frames_in = open_input_frames(input)?;
    let model = args.model.resolve()?;
    // No output may overwrite a file the command reads: the WAV or any file of the model.
    let mut inputs = vec![input];
    inputs.extend(model.input_paths());
    check_outputs(&outputs_given, &inputs)?;
    let max_tail_frames = tail_frames(args.max_tail_s.unwrap_or(DEFAULT_MAX_TAIL_S))?;
    let window = generation_window(&args, &model.lm_config, &mut frames_in)?;
    let frames = frames_in.total_frames();

    let load_started = Instant::now();
    let spinner = indicatif::ProgressBar::new_spinner().with_message("loading the model");
    spinner.enable_steady_tick(std::time::Duration::from_millis(120));
    let loaded = args
        .model
        .load_resolved_model(model, &args.sampling, FILE_DEFAULTS, 1)
        .and_then(|loaded| loaded.into_pipeline());
    spinner.finish_and_clear();
    let (model, mut pipeline) = loaded?;
    anyhow::ensure!(
        pipeline.model().conventions().generates_audio,
        "{} is a speech-to-text model: it generates no audio; use `moshi-rs transcribe`",
        model.lm_weights_path.display()
    );
    let translation = pipeline.model().is_translation() && window.is_none();
    anyhow::ensure!(
        translation || window.is_some() || args.max_tail_s.is_none(),
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
    if let Some(w) = window {
        eprintln!(
            "hibiki-zero: {} frames ({:.2} s, --gen-duration-s), end of input at frame {}, \
             the output cut at the first EOS",
            w.total_frames,
            w.total_frames as f64 * moshi_runtime::FRAME_MS / 1e3,
            w.end_of_input_frame
        );
    }
    if translation {
        eprintln!(
            "translation model: guidance coefficient {}, end of text: {}",
            pipeline.session().cfg_coef(),
            match pipeline.model().eos_text_id() {
                Some(id) => format!("EOS (id {id}) or {max_tail_frames} silence frames"),
                None => format!("the tokenizer has no EOS: {max_tail_frames} silence frames"),
            }
        );
    }
    eprintln!(
        "input: {} ({} frames, {:.2} s at 24 kHz)",
        input.display(),
        frames,
        (frames * FRAME_SAMPLES as u64) as f64 / SAMPLE_RATE_HZ as f64
    );

    let mut outputs = Outputs {
        tokens: args
            .tokens_out
            .as_deref()
            .map(OutputFile::create)
            .transpose()?,
        profile: args
            .profile
            .as_deref()
            .map(ProfileWriter::create)
            .transpose()?,
        transcript: args
            .transcript
            .as_deref()
            .map(|p| OutputFile::create(p).map(|out| (Transcript::default(), out)))
            .transpose()
            .context("--transcript")?,
        // An output on stdout (`/dev/stdout`) must get its bytes only: the words are then in
        // --transcript alone.
        words: if outputs_given.iter().any(|(_, p)| names_stdout(p)) {
            Words::quiet()
        } else {
            Words::default()
        },
        // A translation returns up to the input's frames plus the silence after it.
        bar: indicatif::ProgressBar::new(match window {
            Some(w) => w.total_frames as u64,
            None if translation => frames + max_tail_frames as u64,
            None => frames,
        })
        .with_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} frames {msg}")
                .expect("static template"),
        ),
        started: Instant::now(),
        frames_out: 0,
        error: None,
    };
    let (audio, frames_out, metrics) = if let Some(window) = window {
        translate_zero(
            &mut pipeline,
            &mut frames_in,
            &args.output,
            window,
            &mut outputs,
        )?
    } else if translation {
        translate(
            &mut pipeline,
            &mut frames_in,
            &args.output,
            max_tail_frames,
            &mut outputs,
        )?
    } else {
        answer(
            &mut pipeline,
            &mut frames_in,
            &args.output,
            frames,
            &mut outputs,
        )?
    };
    let tail = pipeline.finish_text();
    if !tail.is_empty() {
        if let Some((words, _)) = outputs.transcript.as_mut() {
            words.push(frames_out.saturating_sub(1), &tail);
        }
        outputs.words.print(&tail);
    }
    outputs.words.print("\n");
    outputs.bar.finish_and_clear();
    // Every output is completed first, then all are put in place together: a run that fails
    // on one of them (a full disk) replaces none.
    let mut finished = vec![audio];
    if let Some(out) = outputs.tokens {
        finished.push(out.finish().context("--tokens-out")?);
    }
    if let Some((words, mut out)) = outputs.transcript {
        out.write_bytes(words.to_tsv().as_bytes())
            .context("--transcript")?;
        finished.push(out.finish().context("--transcript")?);
    }
    if let Some(p) = outputs.profile {
        finished.push(p.complete(&metrics.summary()).context("--profile")?);
    }
    commit_all(finished)?;
    eprintln!(
        "wrote {} ({} samples)",
        args.output.display(),
        frames_out * FRAME_SAMPLES as u64
    );
    eprint!("{}", metrics.summary().to_table());
    outputs.words.finish()
}

/// What `file` writes besides the audio, fed one output frame at a time.
struct Outputs {
    tokens: Option<OutputFile>,
    profile: Option<ProfileWriter>,
    /// `--transcript`: the words not yet complete, and the file the complete ones are in.
    transcript: Option<(Transcript, OutputFile)>,
    /// The words on stdout, as they come.
    words: Words,
    bar: indicatif::ProgressBar,
    started: Instant,
    /// Output frames seen.
    frames_out: u64,
    /// The first write error (the translation's callback cannot return one).
    error: Option<anyhow::Error>,
}

impl Outputs {
    /// Records output frame `i` (tokens, words, progress).
    fn frame(&mut self, i: u64, o: &FrameOutput) {
        if let (Some(out), Some(t), None) = (self.tokens.as_mut(), &o.tokens, &self.error) {
            let mut line =
                serde_json::json!({ "frame": i, "text": t.text, "audio": t.audio }).to_string();
            line.push('\n');
            if let Err(e) = out.write_bytes(line.as_bytes()) {
                self.error = Some(anyhow::Error::new(e).context("--tokens-out"));
            }
        }
        if let Some(text) = &o.text {
            if let (Some((words, out)), None) = (self.transcript.as_mut(), &self.error) {
                words.push(i, text);
                if let Err(e) = out.write_bytes(words.take_complete_tsv().as_bytes()) {
                    self.error = Some(anyhow::Error::new(e).context("--transcript"));
                }
            }
            self.words.print(text);
        }
        self.frames_out += 1;
        let audio_s = self.frames_out as f64 * FRAME_SAMPLES as f64 / SAMPLE_RATE_HZ as f64;
        self.bar.set_message(format!(
            "real-time factor {:.2}",
            self.started.elapsed().as_secs_f64() / audio_s
        ));
        self.bar.inc(1);
    }

    /// Appends a model call's timing record to `--profile`.
    fn record(&mut self, record: &moshi_runtime::metrics::FrameRecord) -> anyhow::Result<()> {
        if let Some(p) = self.profile.as_mut() {
            p.write(record).context("--profile")?;
        }
        Ok(())
    }

    /// The first error a frame met, if any.
    fn check(&mut self) -> anyhow::Result<()> {
        self.error.take().map_or(Ok(()), Err)
    }
}

/// Moshi answers the input frame by frame, each answer frame written as it comes (`frames` in,
/// `frames` out). Returns the answer (complete, not yet in place), the frames written and the
/// run's metrics.
fn answer(
    pipeline: &mut MoshiPipeline,
    frames_in: &mut WavFrames,
    output: &Path,
    frames: u64,
    outputs: &mut Outputs,
) -> anyhow::Result<(FinishedOutput, u64, Metrics)> {
    let mut wav_out = WavWriter::create(output, 1, SAMPLE_RATE_HZ, frames * FRAME_SAMPLES as u64)?;
    let mut runner = OfflineRunner::new();
    while let Some(frame) = frames_in.next_frame()? {
        let i = runner.frames();
        let (record, o) = runner.process(pipeline, frame)?;
        wav_out.write_mono(&o.pcm)?;
        outputs.record(&record)?;
        outputs.frame(i, &o);
        outputs.check()?;
    }
    let audio = wav_out.complete()?;
    Ok((audio, frames, runner.into_metrics()))
}

/// Hibiki-Zero's generation window for `file`'s input (reopened zero-padded to whole frames, as
/// its conventions pad it), `None` for other models; refuses `--gen-duration-s` for other
/// models, `--max-tail-s` for Hibiki-Zero and an input longer than the window.
fn generation_window(
    args: &FileArgs,
    cfg: &moshi_loader::LmConfig,
    frames_in: &mut WavFrames,
) -> anyhow::Result<Option<GenerationWindow>> {
    let kind = ModelKind::of(cfg);
    if kind != ModelKind::TranslationZero {
        anyhow::ensure!(
            args.gen_duration_s.is_none(),
            "--gen-duration-s applies to Hibiki-Zero only (a Hibiki config without conditioners); \
             this model is {}",
            kind.conventions().name
        );
        return Ok(None);
    }
    anyhow::ensure!(
        args.max_tail_s.is_none(),
        "--max-tail-s applies to Hibiki-M and Hibiki 2B; Hibiki-Zero generates for a fixed \
         length: use --gen-duration-s"
    );
    if let Some(gen_s) = args.gen_duration_s {
        anyhow::ensure!(
            gen_s.is_finite() && gen_s > 0.0 && gen_s <= MAX_GEN_DURATION_S,
            "--gen-duration-s {gen_s}: expected seconds above 0, at most {MAX_GEN_DURATION_S} \
             (Kyutai's length; the window is encoded in one Mimi call, whose memory grows with \
             it)"
        );
    }
    if kind.conventions().partial_last_frame == PartialLastFrame::ZeroPad {
        *frames_in = WavFrames::open(
            &args.input,
            SAMPLE_RATE_HZ,
            FRAME_SAMPLES,
            PartialFrame::Pad,
        )?;
    }
    let samples = moshi_runtime::resample::resampled_len(
        frames_in.source_samples() as usize,
        frames_in.source_rate_hz(),
        SAMPLE_RATE_HZ,
    ) as u64;
    let input_s = samples as f64 / SAMPLE_RATE_HZ as f64;
    let gen_s = args
        .gen_duration_s
        .unwrap_or((input_s + DEFAULT_GEN_TAIL_S).min(MAX_GEN_DURATION_S));
    let window = GenerationWindow::new(samples, gen_s).with_context(|| {
        format!(
            "{}: {:.2} s is longer than --gen-duration-s {gen_s} (Hibiki-Zero generates for a \
             fixed length, the input included, at most {MAX_GEN_DURATION_S} s): raise \
             --gen-duration-s, or split the input",
            args.input.display(),
            samples as f64 / SAMPLE_RATE_HZ as f64
        )
    })?;
    Ok(Some(window))
}

/// Hibiki-Zero translates the input in its generation window, encoded and decoded as its
/// `generate` does: the whole window encoded in one Mimi call, the returned frames' codes
/// decoded in one call once the output is cut ([`OutputCut`]; Mimi's batch and streaming
/// paths differ once the codec's attention window is full, and `generate` takes the batch
/// ones). Returns the translation (complete, not yet in place), the frames written and the
/// run's metrics.
fn translate_zero(
    pipeline: &mut MoshiPipeline,
    frames_in: &mut WavFrames,
    output: &Path,
    window: GenerationWindow,
    outputs: &mut Outputs,
) -> anyhow::Result<(FinishedOutput, u64, Metrics)> {
    let tokenizer = pipeline.model().tokenizer();
    let eos = tokenizer.eos_id();
    let mut cut = OutputCut::new(eos, tokenizer.pad_id());
    let mimi = pipeline.model().mimi_stream();
    let encode_started = Instant::now();
    let max_delay = pipeline.model().lm_config().max_delay();
    let codes = encode_window(&mimi, max_delay, frames_in, window)?;
    let encode_s = encode_started.elapsed().as_secs_f64();
    let mut returned: Vec<Vec<u32>> = Vec::with_capacity(window.total_frames);
    let mut profile = ProfileRecords::take(outputs);
    let t = translate_window(
        pipeline,
        &codes,
        window,
        eos,
        |i, o| -> anyhow::Result<()> {
            if let Some(tokens) = &o.tokens {
                cut.push(tokens.text);
                returned.push(tokens.audio.clone());
            }
            outputs.frame(i, o);
            outputs.check()
        },
        |record| profile.write(record),
    )?;
    profile.give_back(outputs)?;
    match t.end {
        TranslationEnd::Eos { .. } => eprintln!(
            "\nthe model ended its text (EOS) at returned frame {}",
            t.frames_out - 1
        ),
        _ => eprintln!(
            "\nwarning: the model had not ended its text (no EOS) in {} frames (--gen-duration-s): \
             the output ends before its last word, as hibiki-zero's own; raise --gen-duration-s",
            window.total_frames
        ),
    }
    let kept = cut.kept_frames();
    let decode_started = Instant::now();
    let pcm = if kept == 0 {
        Vec::new()
    } else {
        let by_codebook: Vec<Vec<u32>> = (0..returned[0].len())
            .map(|k| returned[..kept].iter().map(|f| f[k]).collect())
            .collect();
        mimi.decode_batch(&by_codebook)?
    };
    eprintln!(
        "Mimi in one call: encoded {} frames in {encode_s:.2} s, decoded {kept} in {:.2} s",
        window.total_frames,
        decode_started.elapsed().as_secs_f64()
    );
    let mut wav_out = WavWriter::create(output, 1, SAMPLE_RATE_HZ, pcm.len() as u64)?;
    wav_out.write_mono(&pcm)?;
    Ok((wav_out.complete()?, kept as u64, t.metrics))
}

/// The `--profile` records of a run that hands the model's records to a callback while the
/// frame callback holds `outputs`: written as they come, the first write error kept for the end.
struct ProfileRecords {
    writer: Option<ProfileWriter>,
    error: Option<moshi_runtime::RuntimeError>,
}

impl ProfileRecords {
    /// The profile writer of `outputs`, if any, until [`ProfileRecords::give_back`].
    fn take(outputs: &mut Outputs) -> Self {
        ProfileRecords {
            writer: outputs.profile.take(),
            error: None,
        }
    }

    /// Writes `record`, unless an earlier write failed.
    fn write(&mut self, record: &moshi_runtime::metrics::FrameRecord) {
        if let (Some(w), None) = (self.writer.as_mut(), &self.error) {
            self.error = w.write(record).err();
        }
    }

    /// Returns the writer to `outputs`; the first write error, if any.
    fn give_back(self, outputs: &mut Outputs) -> anyhow::Result<()> {
        outputs.profile = self.writer;
        match self.error {
            Some(e) => Err(anyhow::Error::new(e).context("--profile")),
            None => Ok(()),
        }
    }
}

/// A translation model translates the input frame by frame, each returned frame written as it
/// comes: the translation's length is known only when the model ends its text, so the output
/// is open-ended (a regular file gets its exact length in the header when completed, a pipe
/// the largest a WAV holds). Returns the translation (complete, not yet in place), the frames
/// written and the run's metrics.
fn translate(
    pipeline: &mut MoshiPipeline,
    frames_in: &mut WavFrames,
    output: &Path,
    max_tail_frames: usize,
    outputs: &mut Outputs,
) -> anyhow::Result<(FinishedOutput, u64, Metrics)> {
    let eos = pipeline.model().eos_text_id();
    let mut wav_out = WavWriter::create_open_ended(output, 1, SAMPLE_RATE_HZ)?;
    let mut profile = ProfileRecords::take(outputs);
    let t = translate_offline(
        pipeline,
        frames_in,
        eos,
        max_tail_frames,
        |i, o| -> anyhow::Result<()> {
            wav_out.write_mono(&o.pcm)?;
            outputs.frame(i, o);
            outputs.check()
        },
        |record| profile.write(record),
    )?;
    profile.give_back(outputs)?;
    match t.end {
        TranslationEnd::Eos { tail_frames } => eprintln!(
            "\nthe model ended its text after {tail_frames} silence frames ({} frames out)",
            t.frames_out
        ),
        TranslationEnd::TailCapReached { tail_frames } | TranslationEnd::WindowEnd { tail_frames } => eprintln!(
            "\nwarning: the model had not ended its text (no EOS) after {tail_frames} silence frames \
             ({:.2} s, --max-tail-s); the translation may be cut short: raise --max-tail-s (e.g. 60)",
            tail_frames as f64 * moshi_runtime::FRAME_MS / 1e3
        ),
    }
    Ok((wav_out.complete()?, t.frames_out, t.metrics))
}
