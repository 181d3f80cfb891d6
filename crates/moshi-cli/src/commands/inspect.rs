//! `moshi-rs inspect <file-or-folder> [--json]`: what a checkpoint, tokenizer, config file or
//! model folder holds, and whether it matches the config that applies to it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use moshi_loader::inspect::{inspect_checkpoint, CheckpointReport, ConfigRef};
use moshi_loader::layout::detect_file_kind;
use moshi_loader::tokenizer::TextTokenizer;
use moshi_loader::{
    read_config_text, CheckpointKind, LmConfig, MimiConfig, ModelSource, SourceOverrides,
};
use serde::Serialize;

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// A checkpoint (.safetensors), tokenizer (.model), config (.json) or a model folder.
    pub path: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// LM config to check LM checkpoints against (default: config.json next to the file, else the built-in 7B).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Mimi config to check Mimi checkpoints against (default: mimi_config.json next to the file, else the built-in one).
    #[arg(long)]
    pub mimi_config: Option<PathBuf>,
}

/// One checkpoint with the config it was checked against.
#[derive(Serialize)]
struct CheckpointEntry {
    #[serde(flatten)]
    report: CheckpointReport,
    config: String,
}

#[derive(Serialize)]
struct TokenizerEntry {
    path: PathBuf,
    vocab_size: usize,
    model_type: String,
    byte_fallback: bool,
    normalizer: String,
}

#[derive(Serialize)]
struct ConfigEntry {
    path: PathBuf,
    kind: &'static str,
    summary: String,
    unknown_keys: Vec<String>,
}

#[derive(Serialize)]
struct ResolvedEntry {
    /// The model type its config gives (`moshi (conversation)`, `hibiki (speech
    /// translation)`, ...).
    model: String,
    /// The commands that run it.
    runs: String,
    lm_weights: PathBuf,
    layout: String,
    lm_config: String,
    mimi_weights: PathBuf,
    mimi_config: String,
    tokenizer: PathBuf,
}

#[derive(Serialize, Default)]
struct InspectOutput {
    checkpoints: Vec<CheckpointEntry>,
    tokenizers: Vec<TokenizerEntry>,
    configs: Vec<ConfigEntry>,
    /// For folders: the files `moshi-rs` would run with.
    resolved: Option<ResolvedEntry>,
}

pub fn run(args: InspectArgs) -> anyhow::Result<()> {
    let mut out = InspectOutput::default();
    let path = &args.path;
    if path.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .with_context(|| format!("reading folder {}", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        entries.sort();
        for file in &entries {
            match file.extension().and_then(|e| e.to_str()) {
                Some("safetensors") => out.checkpoints.push(inspect_file(file, &args)?),
                Some("model") => out.tokenizers.push(inspect_tokenizer(file)?),
                _ => {}
            }
        }
        let overrides = SourceOverrides {
            lm_config: args.config.clone(),
            mimi_config: args.mimi_config.clone(),
            ..Default::default()
        };
        match ModelSource::resolve(&path.to_string_lossy(), &overrides) {
            Ok(r) => {
                let kind = moshi_model::kind::ModelKind::of(&r.lm_config);
                out.resolved = Some(ResolvedEntry {
                    model: kind.conventions().name.into(),
                    runs: commands_for(kind).into(),
                    lm_weights: r.lm_weights_path,
                    layout: r.layout.as_str().into(),
                    lm_config: r.lm_config_source,
                    mimi_weights: r.mimi_weights_path,
                    mimi_config: r.mimi_config_source,
                    tokenizer: r.tokenizer_path,
                })
            }
            Err(e) => tracing::warn!("{}: not a complete model folder: {e}", path.display()),
        }
        if out.checkpoints.is_empty() && out.tokenizers.is_empty() {
            bail!(
                "{}: no .safetensors checkpoint and no .model tokenizer in this folder",
                path.display()
            );
        }
    } else {
        match path.extension().and_then(|e| e.to_str()) {
            Some("model") => out.tokenizers.push(inspect_tokenizer(path)?),
            Some("json") => out.configs.push(inspect_config(path)?),
            _ => out.checkpoints.push(inspect_file(path, &args)?),
        }
    }
    if args.json {
        super::stdout::print_json(&out)
    } else {
        super::stdout::print(&text(&out))
    }
}

/// The config that applies to a checkpoint: explicit, else next to the file, else built in.
fn inspect_file(path: &Path, args: &InspectArgs) -> anyhow::Result<CheckpointEntry> {
    let kind = detect_file_kind(path)?;
    let folder = path.parent().unwrap_or(Path::new("."));
    let report;
    let config;
    match kind {
        CheckpointKind::Mimi => {
            let cfg_path = args
                .mimi_config
                .clone()
                .or_else(|| Some(folder.join("mimi_config.json")).filter(|p| p.is_file()));
            let (cfg, source) = match cfg_path {
                Some(p) => (MimiConfig::from_file(&p)?, p.display().to_string()),
                None => (MimiConfig::v0_1(), "built-in mimi-v0_1".to_string()),
            };
            report = inspect_checkpoint(path, Some(ConfigRef::Mimi(&cfg)))?;
            config = source;
        }
        CheckpointKind::Lm(_) => {
            let cfg_path = args
                .config
                .clone()
                .or_else(|| Some(folder.join("config.json")).filter(|p| p.is_file()));
            let (cfg, source) = match cfg_path {
                Some(p) => (LmConfig::from_file(&p)?, p.display().to_string()),
                None => (LmConfig::moshiko_7b(), "built-in moshiko-7b".to_string()),
            };
            report = inspect_checkpoint(path, Some(ConfigRef::Lm(&cfg)))?;
            config = source;
        }
    }
    Ok(CheckpointEntry { report, config })
}

fn inspect_tokenizer(path: &Path) -> anyhow::Result<TokenizerEntry> {
    let tok = TextTokenizer::from_file(path)?;
    let m = tok.model();
    Ok(TokenizerEntry {
        path: path.to_path_buf(),
        vocab_size: tok.vocab_size(),
        model_type: format!("{:?}", m.trainer.model_type).to_lowercase(),
        byte_fallback: m.trainer.byte_fallback,
        normalizer: m.normalizer.name.clone(),
    })
}

fn inspect_config(path: &Path) -> anyhow::Result<ConfigEntry> {
    // Capped: a device or a huge file given as a config is refused, not read to the end.
    let text = read_config_text(path)?;
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    // A Mimi config has a `seanet` section; anything else is read as an LM config.
    if value.get("seanet").is_some() {
        let c = MimiConfig::from_json_str(&text, path)?;
        let summary = format!(
            "Mimi: {} Hz, {} codebooks x {} bins, transformer d_model {} x {} layers, frame {} samples",
            c.sample_rate,
            c.quantizer.n_q,
            c.quantizer.bins,
            c.transformer.d_model,
            c.transformer.num_layers,
            c.frame_size_samples()
        );
        Ok(ConfigEntry {
            path: path.into(),
            kind: "mimi",
            summary,
            unknown_keys: c.unknown.keys().cloned().collect(),
        })
    } else {
        let c = LmConfig::from_json_str(&text, path)?;
        // A speech-to-text model has no depformer: its extra heads and feeding instead.
        let tail = if c.dep_q == 0 {
            let stt = c.stt();
            format!(
                "no depformer, {} extra heads x {}, speech to text: text delay {} s, silence prefix {} s",
                c.extra_heads_num_heads,
                c.extra_heads_dim,
                stt.delay_s(),
                stt.silence_prefix_s()
            )
        } else {
            format!(
                "depformer {} x {} layers",
                c.depformer_dim, c.depformer_num_layers
            )
        };
        let summary = format!(
            "LM: dim {} x {} layers ({} heads), text_card {}, card {}, n_q {}, dep_q {}, {tail}, context {}",
            c.dim, c.num_layers, c.num_heads, c.text_card, c.card, c.n_q, c.dep_q, c.context
        );
        Ok(ConfigEntry {
            path: path.into(),
            kind: "lm",
            summary,
            unknown_keys: c.unknown.keys().cloned().collect(),
        })
    }
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The text report (what `inspect` prints without `--json`).
fn text(out: &InspectOutput) -> String {
    let mut s = String::new();
    // Writing to a String cannot fail.
    macro_rules! out_line {
        ($($arg:tt)*) => {{
            let _ = writeln!(s, $($arg)*);
        }};
    }
    for e in &out.checkpoints {
        let r = &e.report;
        out_line!("{}", r.path.display());
        out_line!("  format      {}", r.format);
        let dtypes: Vec<String> = r.dtypes.iter().map(|(d, n)| format!("{d} x {n}")).collect();
        out_line!("  tensors     {} ({})", r.tensor_count, dtypes.join(", "));
        for q in &r.quantization {
            out_line!(
                "  quantized   {}-bit, group size {} ({} matrices)",
                q.bits,
                q.group_size,
                q.matrices
            );
        }
        out_line!("  parameters  {}", thousands(r.parameter_count));
        out_line!("  size        {:.2} MB", r.file_size_bytes as f64 / 1e6);
        for n in &r.notes {
            out_line!("  note        {n}");
        }
        match &r.config_check {
            Some(c) if c.is_clean() => {
                out_line!("  config      {}: matches ({})", e.config, c.scope)
            }
            Some(c) => {
                out_line!("  config      {}: DOES NOT MATCH ({})", e.config, c.scope);
                for (label, list) in [
                    ("missing", &c.missing),
                    ("unexpected", &c.unexpected),
                    ("mismatched", &c.mismatched),
                ] {
                    if !list.is_empty() {
                        out_line!(
                            "  {label:<11} {} (first: {})",
                            list.len(),
                            list.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
                        );
                    }
                }
            }
            None => out_line!("  config      {}", e.config),
        }
    }
    for t in &out.tokenizers {
        out_line!("{}", t.path.display());
        out_line!(
            "  format      sentencepiece {} ({} pieces, byte_fallback {}, normalizer {})",
            t.model_type,
            t.vocab_size,
            t.byte_fallback,
            t.normalizer
        );
    }
    for c in &out.configs {
        out_line!("{}", c.path.display());
        out_line!("  config      {}", c.summary);
        if !c.unknown_keys.is_empty() {
            out_line!("  unknown     {:?} (kept, ignored)", c.unknown_keys);
        }
    }
    if let Some(r) = &out.resolved {
        out_line!("model folder resolves to");
        out_line!("  model       {}: {}", r.model, r.runs);
        out_line!(
            "  lm          {} ({}), config {}",
            r.lm_weights.display(),
            r.layout,
            r.lm_config
        );
        out_line!(
            "  mimi        {}, config {}",
            r.mimi_weights.display(),
            r.mimi_config
        );
        out_line!("  tokenizer   {}", r.tokenizer.display());
    }
    s
}

/// The commands that run a model of `kind`.
fn commands_for(kind: moshi_model::kind::ModelKind) -> &'static str {
    use moshi_model::kind::ModelKind;
    match kind {
        ModelKind::Conversation => "runs with file, chat and serve (/api/chat)",
        ModelKind::Translation => "runs with file, chat and serve (/api/chat), translating",
        ModelKind::TranslationZero => {
            "runs with file, chat and serve (/api/chat), translating (hibiki-zero's feeding)"
        }
        ModelKind::SpeechToText => {
            "runs with transcribe (files, --mic) and serve (/api/asr-streaming)"
        }
        ModelKind::TextToSpeech => "runs with speak and serve (/api/tts_streaming)",
    }
}
