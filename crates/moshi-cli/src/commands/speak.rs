//! `moshi-rs speak "text" out.wav --voice V`: text to speech with Kyutai's TTS models
//! (`model_type` "tts"), driven as `delayed-streams-modeling`'s `tts_pytorch.py` drives
//! `TTSModel` (its defaults: `padding_between` 1, temperature 0.6, cfg 2.0 as a condition of the
//! distilled model) through [`moshi_runtime::speak`]. The text comes from the command line,
//! `--text-file`, or standard input (`-`), read line by line as it arrives (each line's words
//! queued as soon as it is read, so speech starts before the text is complete). The audio is
//! written as it is generated, and played on the speaker with `--play`; `--tokens-out` writes
//! every returned frame, `--words` each word with the time it starts. Voices are named in a
//! folder or a Hub repo laid out as `kyutai/tts-voices`.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use anyhow::Context;
use moshi_loader::output_file::{commit_all, FinishedOutput, OutputFile};
use moshi_loader::voice::{load_voice, Voice, VoiceSource, DEFAULT_VOICE_REPO};
use moshi_model::tts::machine::Entry;
use moshi_model::tts::script::{ScriptOptions, ScriptReader, WordEncoder};
use moshi_model::tts::{TtsSettings, SPEAKER_CONDITIONER};
use moshi_model::ModelError;
use moshi_runtime::backend::cpal::{CpalBackend, CpalOptions, DEFAULT_BUFFER_MS};
use moshi_runtime::pipeline::{MoshiModel, SessionSettings};
use moshi_runtime::player::{PlaybackSummary, Player};
use moshi_runtime::speak::{SpokenFrame, TtsSpeaker};
use moshi_runtime::wav::WavWriter;
use moshi_runtime::SAMPLE_RATE_HZ;

use super::model_args::{ModelArgs, FILE_DEFAULTS};
use super::outputs::check_outputs;
use super::signals::{remove_partials_on, Signals};
use super::transcript::tsv_line;

/// The model without `--model`: Kyutai's English and French TTS.
pub const DEFAULT_TTS_REPO: &str = "kyutai/tts-1.6b-en_fr";
/// Kyutai's TTS temperature (text and audio: `TTSModel(temp=0.6)`, `tts_pytorch.py`).
pub const TTS_TEMPERATURE: f32 = 0.6;
/// Kyutai's guidance strength for its distilled TTS (`tts_pytorch.py --cfg-coef 2.0`).
pub const TTS_CFG_COEF: f32 = 2.0;
/// Frames per second of the text stream.
const FRAME_RATE_HZ: f64 = 12.5;
/// The longest text read, in bytes (a book's chapter; the stream stays bounded by the text).
const MAX_TEXT_BYTES: u64 = 1 << 20;

#[derive(clap::Args, Debug)]
pub struct SpeakArgs {
    /// `TEXT OUT.wav`, or `OUT.wav` with --text-file: the text to say (`-` reads standard input
    /// line by line as it arrives) and the output WAV (24 kHz mono 16-bit, written as the audio
    /// is generated). With --play, OUT.wav may be left out.
    #[arg(num_args = 0..=2, value_name = "TEXT OUT.wav")]
    pub positional: Vec<String>,
    /// Play the speech on the speaker as it is generated.
    #[arg(long)]
    pub play: bool,
    /// With --play: the output device (a substring of its name; `moshi-rs devices` lists them).
    /// Default: the system's default output.
    #[arg(long, value_name = "NAME", requires = "play")]
    pub output_device: Option<String>,
    /// With --play: audio queued before playback starts, so that a machine a little slower than
    /// real time at first does not stutter (silence inserted later is counted and reported).
    #[arg(long, default_value_t = 320.0, value_name = "MS", requires = "play",
          value_parser = super::flag_values::jitter_ms)]
    pub prefill_ms: f64,
    /// Read the text from this file.
    #[arg(long, value_name = "FILE")]
    pub text_file: Option<PathBuf>,
    // `--model` defaults to DEFAULT_TTS_REPO; `assets/tiny-tts` is the bundled random-weight TTS.
    #[command(flatten)]
    pub model: ModelArgs,
    /// The voice: a name as Kyutai's clients give it (`expresso/ex03-ex01_happy_001_channel1_334s.wav`,
    /// looked up in --voices with the model's `.<sig>@<epoch>.safetensors` suffix), or a
    /// `.safetensors` voice file.
    #[arg(long, value_name = "NAME|FILE")]
    pub voice: Option<String>,
    /// Where voices are named: a folder laid out as kyutai/tts-voices, or such a Hugging Face
    /// repo (voices downloaded as named). Default: `voices/` in the model folder, else
    /// kyutai/tts-voices.
    #[arg(long, value_name = "DIR|REPO")]
    pub voices: Option<String>,
    /// Guidance strength, a condition of the distilled model (one of its `cfg` values: 1.0 to
    /// 4.0 by 0.5 for Kyutai's release).
    #[arg(long, default_value_t = TTS_CFG_COEF, value_parser = super::flag_values::cfg_coef)]
    pub cfg_coef: f32,
    /// Sampling temperature of text and audio (Kyutai's TTS default 0.6; 0 picks the most
    /// probable token).
    #[arg(long, default_value_t = TTS_TEMPERATURE, value_parser = super::flag_values::temperature)]
    pub temp: f32,
    /// Random seed.
    #[arg(long, default_value_t = 4242)]
    pub seed: u64,
    /// Argmax everywhere (deterministic).
    #[arg(long)]
    pub greedy: bool,
    /// Padding forced between words (Kyutai's scripts: 1; higher articulates more slowly).
    #[arg(long, default_value_t = 1, value_parser = super::flag_values::padding_between_frames)]
    pub padding_between: usize,
    /// Audio codebooks to generate (Kyutai's `TTSModel(n_q)`; fewer is faster and coarser:
    /// moshi-server deploys 24 of the release's 32). Default: all of them.
    #[arg(long, value_name = "N")]
    pub n_q: Option<usize>,
    /// Added to the padding logit (positive: slower speech).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub padding_bonus: f32,
    /// Write one JSON object per returned frame: {"frame", "text", "audio"} (`audio` null before
    /// the audio starts).
    #[arg(long, value_name = "FILE")]
    pub tokens_out: Option<PathBuf>,
    /// Write each word with its times as TSV (`start_s`, `end_s`, `word`): it starts at the step
    /// it was consumed at / 12.5, as Kyutai's TTS gives it, and ends where the next one starts.
    #[arg(long, value_name = "FILE")]
    pub words: Option<PathBuf>,
}

impl SpeakArgs {
    /// The text argument (None with --text-file) and the output path (None: --play only).
    fn text_and_out(&self) -> anyhow::Result<(Option<&str>, Option<PathBuf>)> {
        let usage = "expected `speak TEXT OUT.wav` (TEXT `-` reads standard input), \
                     `speak --text-file FILE OUT.wav`, or either with --play and no OUT.wav";
        match (&self.positional[..], &self.text_file, self.play) {
            ([text, out], None, _) => Ok((Some(text.as_str()), Some(PathBuf::from(out)))),
            ([text], None, true) => Ok((Some(text.as_str()), None)),
            ([out], Some(_), _) => Ok((None, Some(PathBuf::from(out)))),
            ([], Some(_), true) => Ok((None, None)),
            ([_, _], Some(f), _) => anyhow::bail!(
                "--text-file {} and a text argument: give one (`speak --text-file FILE OUT.wav` or `speak TEXT OUT.wav`)",
                f.display()
            ),
            _ => anyhow::bail!("{usage}"),
        }
    }
}

pub fn run(args: SpeakArgs) -> anyhow::Result<()> {
    remove_partials_on(Signals::All)?;
    let (_, out_path) = args.text_and_out()?;
    anyhow::ensure!(
        args.padding_bonus.is_finite(),
        "--padding-bonus {}: expected a finite number",
        args.padding_bonus
    );
    let resolved = args.model.resolve_or(DEFAULT_TTS_REPO, "assets/tiny-tts")?;
    anyhow::ensure!(
        resolved.lm_config.is_text_to_speech(),
        "speak needs a text-to-speech model (`model_type` \"tts\"); {} is {}",
        resolved.lm_weights_path.display(),
        moshi_model::kind::ModelKind::of(&resolved.lm_config)
            .conventions()
            .name
    );
    let mut outputs: Vec<(&str, &Path)> = out_path
        .as_deref()
        .map(|p| ("output WAV", p))
        .into_iter()
        .collect();
    for (flag, p) in [("--tokens-out", &args.tokens_out), ("--words", &args.words)] {
        if let Some(p) = p {
            outputs.push((flag, p.as_path()));
        }
    }
    // No output may overwrite a file the command reads: any file of the model, the voice or
    // the text.
    let voice_file = voice_file(&args, &resolved.lm_config, resolved.folder())?;
    let mut inputs = resolved.input_paths();
    inputs.extend(voice_file.as_deref());
    inputs.extend(args.text_file.as_deref());
    check_outputs(&outputs, &inputs)?;
    let model = MoshiModel::load(
        &resolved,
        args.model.weight_mode()?,
        args.model.mimi_weights,
    )
    .with_context(|| {
        format!(
            "loading the model from {}",
            resolved.lm_weights_path.display()
        )
    })?;
    super::declare_workload(1);
    let voices = match model
        .generator()
        .weights()
        .conditions()
        .cross_conditioners()
    {
        [] => Vec::new(),
        [c, ..] => vec![load_speaker_voice(&args, voice_file.as_deref(), c.dim())?],
    };
    let settings = SessionSettings {
        sampling: sampling(&args),
        kv_precision: args.model.kv_cache_or(FILE_DEFAULTS),
        cfg_coef: None,
    };
    let tts = TtsSettings {
        padding_bonus: args.padding_bonus,
        n_q: args.n_q,
        ..TtsSettings::default()
    };
    let speakers = TtsSpeaker::speakers(&model, &voices)?;
    let mut speaker = TtsSpeaker::new(&model, &settings, tts, speakers, args.cfg_coef)
        .with_context(|| format!("--cfg-coef {} / --voice / --n-q", args.cfg_coef))?;
    let mut out = Outputs::create(&args, out_path.as_deref())?;
    speak(&args, &model, &mut speaker, &mut out)?;
    let words: Vec<(String, usize)> = speaker
        .lm()
        .tts()
        .map(|t| {
            t.machine()
                .transcript()
                .iter()
                .map(|w| (w.text.clone(), w.step))
                .collect()
        })
        .unwrap_or_default();
    out.finish(&words)
}

/// `--temp` for text and audio (Kyutai's `TTSModel(temp)` sets both), `LMGen`'s default top-k.
fn sampling(args: &SpeakArgs) -> moshi_model::generator::SamplingConfig {
    moshi_model::generator::SamplingConfig {
        temp_text: args.temp,
        temp_audio: args.temp,
        seed: args.seed,
        greedy: args.greedy || args.temp == 0.0,
        ..Default::default()
    }
}

/// Where voices are named: `--voices` (a folder or a Hub repo id), else the model folder's
/// `voices/`, else Kyutai's voices repo (as `tts_pytorch.py` looks them up).
pub fn voice_source(
    voices: Option<&str>,
    model_folder: Option<&Path>,
) -> anyhow::Result<VoiceSource> {
    let hub = moshi_loader::hub::HubSettings::from_env;
    if let Some(spec) = voices {
        return VoiceSource::parse(spec, hub).with_context(|| format!("--voices {spec}"));
    }
    match model_folder
        .map(|m| m.join("voices"))
        .filter(|f| f.is_dir())
    {
        Some(folder) => Ok(VoiceSource::Folder(folder)),
        None => Ok(VoiceSource::parse(DEFAULT_VOICE_REPO, hub)?),
    }
}

/// The file of `--voice`: a `.safetensors` file given as a path, else a name in the voices
/// ([`voice_source`]; from a Hub repo, downloaded); None without `--voice`.
fn voice_file(
    args: &SpeakArgs,
    cfg: &moshi_loader::LmConfig,
    model_folder: Option<&Path>,
) -> anyhow::Result<Option<PathBuf>> {
    let Some(name) = &args.voice else {
        return Ok(None);
    };
    let direct = Path::new(name);
    if name.ends_with(".safetensors") && direct.is_file() {
        return Ok(Some(direct.to_path_buf()));
    }
    let source = voice_source(args.voices.as_deref(), model_folder)?;
    let suffix = cfg.voice_suffix();
    let path = source
        .locate(name, &suffix)
        .with_context(|| format!("--voice {name:?}"))?;
    Ok(Some(path))
}

/// The voice the model speaks in, from [`voice_file`]'s file: `--voice` is needed.
fn load_speaker_voice(
    args: &SpeakArgs,
    voice_file: Option<&Path>,
    dim: usize,
) -> anyhow::Result<Voice> {
    let (Some(name), Some(path)) = (&args.voice, voice_file) else {
        anyhow::bail!(
            "--voice is needed: the model speaks in a given voice (its `{SPEAKER_CONDITIONER}` \
             conditioner), e.g. `--voice expresso/ex03-ex01_happy_001_channel1_334s.wav` with \
             --voices a kyutai/tts-voices folder"
        );
    };
    load_voice(path, dim).with_context(|| format!("--voice {name}"))
}

/// Feeds the text and steps until the stream is done, writing each frame.
fn speak(
    args: &SpeakArgs,
    model: &MoshiModel,
    speaker: &mut TtsSpeaker,
    out: &mut Outputs,
) -> anyhow::Result<()> {
    let tokenizer = model.tokenizer();
    let encode = |w: &str| {
        tokenizer.encode(w).map_err(|e| ModelError::BadScript {
            reason: format!("tokenizing {w:?}: {e}"),
        })
    };
    let encode: &WordEncoder = &encode;
    let options = ScriptOptions {
        multi_speaker: !model
            .generator()
            .weights()
            .conditions()
            .cross_conditioners()
            .is_empty(),
        padding_between: args.padding_between,
        moshi_server: false,
    };
    let mut reader = ScriptReader::new(encode, options);
    let mut lines = text_lines(args)?;
    let mut first = true;
    loop {
        while !speaker.is_ready() {
            match lines.next() {
                Some(line) => {
                    let entries: Vec<Entry> = reader.turn_part(0, &line?, first)?;
                    first &= entries.is_empty();
                    speaker.push(entries);
                }
                None => {
                    anyhow::ensure!(
                        !first,
                        "the text has no word to say (it is empty or only spaces)"
                    );
                    speaker.finish_text();
                }
            }
        }
        if speaker.is_finished() {
            return Ok(());
        }
        if let Some(frame) = speaker.step(model)? {
            out.frame(&frame)?;
        }
    }
}

/// The text's lines: the argument's, the file's, or standard input's as they arrive.
fn text_lines(
    args: &SpeakArgs,
) -> anyhow::Result<Box<dyn Iterator<Item = anyhow::Result<String>>>> {
    let limited = |r: Box<dyn std::io::Read>,
                   what: String|
     -> Box<dyn Iterator<Item = anyhow::Result<String>>> {
        let reader = std::io::BufReader::new(std::io::Read::take(r, MAX_TEXT_BYTES + 1));
        let mut total = 0u64;
        Box::new(reader.lines().map(move |l| {
            let l = l.with_context(|| format!("reading {what} (UTF-8 text expected)"))?;
            total += l.len() as u64 + 1;
            anyhow::ensure!(
                total <= MAX_TEXT_BYTES,
                "{what}: more than {MAX_TEXT_BYTES} bytes of text"
            );
            Ok(l)
        }))
    };
    match (args.text_and_out()?.0, &args.text_file) {
        (Some("-"), _) => Ok(limited(Box::new(std::io::stdin()), "standard input".into())),
        (Some(t), _) => {
            anyhow::ensure!(
                t.len() as u64 <= MAX_TEXT_BYTES,
                "the text is {} bytes, at most {MAX_TEXT_BYTES}",
                t.len()
            );
            Ok(Box::new(std::iter::once(Ok(t.to_string()))))
        }
        (None, Some(f)) => {
            moshi_loader::input_file::check_input_file(
                f,
                moshi_loader::input_file::InputKind::Readable,
            )
            .context("--text-file")?;
            let file =
                std::fs::File::open(f).with_context(|| format!("--text-file {}", f.display()))?;
            Ok(limited(
                Box::new(file),
                format!("--text-file {}", f.display()),
            ))
        }
        (None, None) => anyhow::bail!("give the text, `-` for standard input, or --text-file"),
    }
}

/// The audio (the WAV and/or the speaker), `--tokens-out` and `--words`; the files put in
/// place together at the end.
struct Outputs {
    wav: Option<WavWriter>,
    player: Option<Player>,
    tokens: Option<OutputFile>,
    words: Option<OutputFile>,
}

impl Outputs {
    fn create(args: &SpeakArgs, out: Option<&Path>) -> anyhow::Result<Self> {
        let create = |p: &Option<PathBuf>, flag: &str| {
            p.as_deref()
                .map(OutputFile::create)
                .transpose()
                .with_context(|| flag.to_string())
        };
        Ok(Self {
            wav: out
                .map(|o| WavWriter::create_open_ended(o, 1, SAMPLE_RATE_HZ))
                .transpose()?,
            player: args.play.then(|| open_player(args)).transpose()?,
            tokens: create(&args.tokens_out, "--tokens-out")?,
            words: create(&args.words, "--words")?,
        })
    }

    fn frame(&mut self, frame: &SpokenFrame) -> anyhow::Result<()> {
        if let Some(pcm) = &frame.pcm {
            if let Some(wav) = &mut self.wav {
                wav.write_mono(pcm)?;
            }
            if let Some(player) = &mut self.player {
                player.play(pcm).context("--play")?;
            }
        }
        if let Some(t) = &mut self.tokens {
            let line = serde_json::json!({
                "frame": frame.index,
                "text": frame.text,
                "audio": frame.audio,
            });
            t.write_bytes(format!("{line}\n").as_bytes())?;
        }
        Ok(())
    }

    fn finish(mut self, words: &[(String, usize)]) -> anyhow::Result<()> {
        if let Some(player) = self.player.take() {
            report_playback(&player.finish().context("--play")?);
        }
        let mut done: Vec<FinishedOutput> = Vec::new();
        if let Some(wav) = self.wav.take() {
            done.push(wav.complete()?);
        }
        if let Some(mut w) = self.words.take() {
            for (i, (word, step)) in words.iter().enumerate() {
                let start_s = *step as f64 / FRAME_RATE_HZ;
                let end_s = words
                    .get(i + 1)
                    .map_or(start_s, |(_, next)| *next as f64 / FRAME_RATE_HZ);
                w.write_bytes(tsv_line(start_s, end_s, word).as_bytes())?;
            }
            done.push(w.finish()?);
        }
        if let Some(t) = self.tokens.take() {
            done.push(t.finish()?);
        }
        Ok(commit_all(done)?)
    }
}

/// The output device of --play, started.
fn open_player(args: &SpeakArgs) -> anyhow::Result<Player> {
    let options = CpalOptions {
        input_device: None,
        output_device: args.output_device.clone(),
        buffer_ms: DEFAULT_BUFFER_MS,
        playback: true,
        capture: false,
    };
    let backend = CpalBackend::open(&options).context("--play: opening the output device")?;
    let player = Player::start(Box::new(backend), args.prefill_ms)
        .context("--play: starting the output device")?;
    eprintln!("audio: {}", player.describe());
    Ok(player)
}

/// What --play played, and the silence a slow machine inserted (never hidden).
fn report_playback(summary: &PlaybackSummary) {
    if summary.underrun_events > 0 {
        eprintln!(
            "played {:.2} s; the speaker ran dry {} times ({:.2} s of silence inserted): this \
             machine generates slower than real time (a larger --prefill-ms queues more first)",
            summary.played_s, summary.underrun_events, summary.underrun_s
        );
    } else {
        eprintln!("played {:.2} s without a gap", summary.played_s);
    }
}
