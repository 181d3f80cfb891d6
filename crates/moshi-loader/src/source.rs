//! Finds the files of a model: a local folder laid out like a Kyutai repo, explicit file paths,
//! or a Hugging Face Hub repo id (standard HF cache, `HF_TOKEN`, `HF_HUB_OFFLINE`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::hub::{HubRepo, HubSettings};
use crate::layout::{detect_file_kind, detect_kind, CheckpointKind, LmLayout};
use crate::{LmConfig, LoaderError, MimiConfig, Result, SafetensorsFile};

/// Which LM file to take when a folder or repo holds several.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LmVariant {
    /// `model.safetensors` (PyTorch/candle/MLX bf16).
    Bf16,
    /// `model.q8.safetensors` (MLX 8-bit), else `model.q8.gguf` (candle q8_0).
    Q8,
    /// `model.q4.safetensors` (MLX 4-bit).
    Q4,
}

impl LmVariant {
    pub fn file_name(self) -> &'static str {
        match self {
            LmVariant::Bf16 => "model.safetensors",
            LmVariant::Q8 => "model.q8.safetensors",
            LmVariant::Q4 => "model.q4.safetensors",
        }
    }
}

impl std::str::FromStr for LmVariant {
    type Err = String;

    /// `bf16`, `q8` or `q4` (as on the command line).
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "bf16" => Ok(LmVariant::Bf16),
            "q8" => Ok(LmVariant::Q8),
            "q4" => Ok(LmVariant::Q4),
            other => Err(format!(
                "unknown LM variant `{other}`, expected bf16, q8 or q4"
            )),
        }
    }
}

/// LM file names in order of preference when nothing else decides (`model.q8.gguf`: Kyutai's
/// candle q8 release, which has no config.json naming it).
const LM_FILE_NAMES: [&str; 4] = [
    "model.safetensors",
    "model.q8.safetensors",
    "model.q4.safetensors",
    "model.q8.gguf",
];

/// Explicit choices that win over what is found in the folder or repo.
#[derive(Clone, Debug, Default)]
pub struct SourceOverrides {
    pub lm_config: Option<PathBuf>,
    pub lm_weights: Option<PathBuf>,
    pub mimi_config: Option<PathBuf>,
    pub mimi_weights: Option<PathBuf>,
    pub tokenizer: Option<PathBuf>,
    pub variant: Option<LmVariant>,
    /// Hub settings; `None` reads them from the environment.
    pub hub: Option<HubSettings>,
}

/// Everything needed to build the model, with where each part came from.
#[derive(Clone, Debug)]
pub struct ResolvedModel {
    pub lm_config: LmConfig,
    /// A path, or `built-in moshiko-7b` for legacy repos without `config.json`.
    pub lm_config_source: String,
    pub lm_weights_path: PathBuf,
    pub layout: LmLayout,
    pub mimi_config: MimiConfig,
    /// A path, or `built-in mimi-v0_1`.
    pub mimi_config_source: String,
    pub mimi_weights_path: PathBuf,
    pub tokenizer_path: PathBuf,
    /// The LM config file read, if any (`None` for the built-in config).
    pub lm_config_path: Option<PathBuf>,
    /// The Mimi config file read, if any (`None` for the built-in config).
    pub mimi_config_path: Option<PathBuf>,
}

impl ResolvedModel {
    /// The model's folder: where its config was read, else its weights (a TTS model's `voices/`
    /// is looked for there).
    pub fn folder(&self) -> Option<&Path> {
        self.lm_config_path
            .as_deref()
            .unwrap_or(&self.lm_weights_path)
            .parent()
    }

    /// Every file the model is read from (weights, tokenizer, configs): what a command's outputs
    /// must not overwrite.
    pub fn input_paths(&self) -> Vec<&Path> {
        let mut paths = vec![
            self.lm_weights_path.as_path(),
            self.mimi_weights_path.as_path(),
            self.tokenizer_path.as_path(),
        ];
        paths.extend(self.lm_config_path.as_deref());
        paths.extend(self.mimi_config_path.as_deref());
        paths
    }
}

/// Entry point of model resolution.
pub struct ModelSource;

impl ModelSource {
    /// Resolves `spec`: a model folder, a checkpoint or `config.json` file (its folder supplies the
    /// rest), or a Hugging Face repo id such as `kyutai/moshiko-mlx-q4`.
    pub fn resolve(spec: &str, overrides: &SourceOverrides) -> Result<ResolvedModel> {
        let path = Path::new(spec);
        if path.is_dir() {
            return resolve_folder(path, overrides);
        }
        if path.is_file() {
            let folder = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            let mut o = overrides.clone();
            if path.extension().is_some_and(|e| e == "json") {
                o.lm_config.get_or_insert(path.to_path_buf());
            } else if detect_file_kind(path)? == CheckpointKind::Mimi {
                o.mimi_weights.get_or_insert(path.to_path_buf());
            } else {
                o.lm_weights.get_or_insert(path.to_path_buf());
            }
            return resolve_folder(folder, &o);
        }
        if is_repo_id(spec) {
            let settings = overrides.hub.clone().unwrap_or_else(HubSettings::from_env);
            return resolve_hub(spec, &settings, overrides);
        }
        Err(LoaderError::NotFound {
            what: spec.to_string(),
            reason:
                "no such file or folder, and not a Hugging Face repo id of the form `owner/name`"
                    .into(),
        })
    }
}

/// Whether `spec` has the form of a Hugging Face repo id (`owner/name`).
pub(crate) fn is_repo_id(spec: &str) -> bool {
    let mut parts = spec.split('/');
    let ok = |s: Option<&str>| {
        s.is_some_and(|s| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
                && s != "."
                && s != ".."
        })
    };
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
}

/// Reports config keys this engine does not know (kept, never fatal).
fn warn_unknown_keys(origin: &str, keys: impl Iterator<Item = String>) {
    let keys: Vec<String> = keys.collect();
    if !keys.is_empty() {
        tracing::warn!("{origin}: ignoring unknown config keys {keys:?}");
    }
}

fn load_lm_config(path: Option<&Path>) -> Result<(LmConfig, String)> {
    match path {
        Some(p) => {
            let cfg = LmConfig::from_file(p)?;
            warn_unknown_keys(&p.display().to_string(), cfg.unknown.keys().cloned());
            Ok((cfg, p.display().to_string()))
        }
        None => {
            tracing::info!("no config.json: using the built-in moshiko 7B config");
            Ok((LmConfig::moshiko_7b(), "built-in moshiko-7b".into()))
        }
    }
}

fn load_mimi_config(path: Option<&Path>) -> Result<(MimiConfig, String)> {
    match path {
        Some(p) => {
            let cfg = MimiConfig::from_file(p)?;
            warn_unknown_keys(&p.display().to_string(), cfg.unknown.keys().cloned());
            Ok((cfg, p.display().to_string()))
        }
        None => Ok((MimiConfig::v0_1(), "built-in mimi-v0_1".into())),
    }
}

/// File names picked from a listing (folder or repo); `None` where nothing fits.
#[derive(Debug, Default)]
struct FileChoice {
    lm: Option<String>,
    mimi: Option<String>,
    tokenizer: Option<String>,
    mimi_config: Option<String>,
}

/// Picks the model files among `names`; `kind_of` may inspect a file's tensors (folders) or not (hub).
fn choose_files(
    names: &BTreeSet<String>,
    cfg: Option<&LmConfig>,
    variant: Option<LmVariant>,
    kind_of: &dyn Fn(&str) -> Option<CheckpointKind>,
) -> FileChoice {
    let named = |n: &Option<String>| {
        let found = n.as_ref().filter(|n| names.contains(*n)).cloned();
        if let (Some(n), None) = (n, &found) {
            tracing::warn!("config.json names `{}`, which is not a file of the model folder: looking for the usual file names instead", crate::escape::escape_controls(n));
        }
        found
    };
    let safetensors = || names.iter().filter(|n| n.ends_with(".safetensors"));
    let lm = match variant {
        Some(v) => names
            .get(v.file_name())
            .or_else(|| {
                (v == LmVariant::Q8)
                    .then(|| names.get("model.q8.gguf"))
                    .flatten()
            })
            .cloned(),
        None => cfg
            .and_then(|c| named(&c.moshi_name))
            .or_else(|| {
                LM_FILE_NAMES
                    .iter()
                    .find(|n| names.contains(**n))
                    .map(|n| n.to_string())
            })
            .or_else(|| {
                safetensors()
                    .find(|n| matches!(kind_of(n), Some(CheckpointKind::Lm(_))))
                    .cloned()
            }),
    };
    let mimi = cfg
        .and_then(|c| named(&c.mimi_name))
        .or_else(|| safetensors().find(|n| n.starts_with("tokenizer-")).cloned())
        .or_else(|| {
            safetensors()
                .find(|n| kind_of(n) == Some(CheckpointKind::Mimi))
                .cloned()
        });
    let models: Vec<&String> = names.iter().filter(|n| n.ends_with(".model")).collect();
    let tokenizer = cfg.and_then(|c| named(&c.tokenizer_name)).or_else(|| {
        models
            .iter()
            .find(|n| n.contains("tokenizer"))
            .or(models.first())
            .map(|n| n.to_string())
    });
    let mimi_config = cfg
        .and_then(|c| named(&c.mimi_config_name))
        .or_else(|| names.get("mimi_config.json").cloned());
    FileChoice {
        lm,
        mimi,
        tokenizer,
        mimi_config,
    }
}

fn missing(what: &str, origin: &str, names: &BTreeSet<String>, hint: &str) -> LoaderError {
    LoaderError::NotFound {
        what: what.to_string(),
        reason: format!(
            "{origin} holds no {what} ({hint}); files there: {:?}",
            names.iter().take(20).collect::<Vec<_>>()
        ),
    }
}

fn list_folder(folder: &Path) -> Result<BTreeSet<String>> {
    let entries = std::fs::read_dir(folder).map_err(|e| LoaderError::io(folder, e))?;
    let mut names = BTreeSet::new();
    for entry in entries {
        let entry = entry.map_err(|e| LoaderError::io(folder, e))?;
        if entry.path().is_file() {
            names.insert(entry.file_name().to_string_lossy().into_owned());
        }
    }
    Ok(names)
}

/// Picks the model files in a local folder; overrides win.
fn resolve_folder(folder: &Path, o: &SourceOverrides) -> Result<ResolvedModel> {
    let names = list_folder(folder)?;
    let origin = folder.display().to_string();
    let config_path = o.lm_config.clone().or_else(|| {
        names
            .contains("config.json")
            .then(|| folder.join("config.json"))
    });
    let (lm_config, lm_config_source) = load_lm_config(config_path.as_deref())?;
    let cfg_for_names = config_path.is_some().then_some(&lm_config);
    let kind_of = |n: &str| {
        SafetensorsFile::open(folder.join(n))
            .ok()
            .and_then(|f| detect_kind(&f).ok())
    };
    let choice = choose_files(&names, cfg_for_names, o.variant, &kind_of);
    let lm_hint = match o.variant {
        Some(v) => format!("asked for `{}`", v.file_name()),
        None => {
            "model.safetensors, model.q8.safetensors, model.q4.safetensors or model.q8.gguf".into()
        }
    };
    let pick = |over: &Option<PathBuf>,
                chosen: Option<String>,
                what: &str,
                hint: &str|
     -> Result<PathBuf> {
        over.clone()
            .or_else(|| chosen.map(|n| folder.join(n)))
            .ok_or_else(|| missing(what, &origin, &names, hint))
    };
    let lm_weights_path = pick(&o.lm_weights, choice.lm, "LM checkpoint", &lm_hint)?;
    let mimi_weights_path = pick(
        &o.mimi_weights,
        choice.mimi,
        "Mimi checkpoint",
        "tokenizer-*.safetensors",
    )?;
    let tokenizer_path = pick(
        &o.tokenizer,
        choice.tokenizer,
        "text tokenizer",
        "a SentencePiece *.model file",
    )?;
    let mimi_config_path = o
        .mimi_config
        .clone()
        .or_else(|| choice.mimi_config.map(|n| folder.join(n)));
    let (mimi_config, mimi_config_source) = load_mimi_config(mimi_config_path.as_deref())?;
    let layout = match detect_file_kind(&lm_weights_path)? {
        CheckpointKind::Lm(l) => l,
        CheckpointKind::Mimi => {
            return Err(LoaderError::UnknownFormat {
                path: lm_weights_path,
                reason: "chosen as the LM checkpoint but holds a Mimi codec".into(),
            })
        }
    };
    Ok(ResolvedModel {
        lm_config,
        lm_config_source,
        lm_weights_path,
        layout,
        mimi_config,
        mimi_config_source,
        mimi_weights_path,
        tokenizer_path,
        lm_config_path: config_path,
        mimi_config_path,
    })
}

/// Resolves a Hub repo: the cached snapshot when offline, otherwise the listed files, downloaded.
fn resolve_hub(
    repo_id: &str,
    settings: &HubSettings,
    o: &SourceOverrides,
) -> Result<ResolvedModel> {
    let repo = HubRepo::new(repo_id, settings);
    if settings.offline {
        let snapshot = repo.cached_snapshot()?;
        return resolve_folder(&snapshot, o);
    }
    let names = repo.list_files()?;
    let config_path = match &o.lm_config {
        Some(p) => Some(p.clone()),
        None if names.contains("config.json") => Some(repo.download("config.json")?),
        None => None,
    };
    let (lm_config, _) = load_lm_config(config_path.as_deref())?;
    let choice = choose_files(
        &names,
        config_path.is_some().then_some(&lm_config),
        o.variant,
        &|_| None,
    );
    let origin = format!("Hugging Face repo `{repo_id}`");
    let mut downloaded = SourceOverrides {
        lm_config: config_path,
        variant: o.variant,
        ..SourceOverrides::default()
    };
    for (over, chosen, slot, what) in [
        (
            &o.lm_weights,
            choice.lm,
            &mut downloaded.lm_weights,
            "LM checkpoint",
        ),
        (
            &o.mimi_weights,
            choice.mimi,
            &mut downloaded.mimi_weights,
            "Mimi checkpoint",
        ),
        (
            &o.tokenizer,
            choice.tokenizer,
            &mut downloaded.tokenizer,
            "text tokenizer",
        ),
    ] {
        *slot = Some(match (over, chosen) {
            (Some(p), _) => p.clone(),
            (None, Some(name)) => repo.download(&name)?,
            (None, None) => return Err(missing(what, &origin, &names, "see the repo's file list")),
        });
    }
    downloaded.mimi_config = match (&o.mimi_config, choice.mimi_config) {
        (Some(p), _) => Some(p.clone()),
        (None, Some(name)) => Some(repo.download(&name)?),
        (None, None) => None,
    };
    let lm_path = downloaded.lm_weights.clone().expect("set above");
    let folder = lm_path.parent().unwrap_or(Path::new(".")).to_path_buf();
    resolve_folder(&folder, &downloaded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_are_told_apart_from_paths() {
        assert!(is_repo_id("kyutai/moshiko-mlx-q4"));
        assert!(is_repo_id("kyutai/moshika-pytorch-bf16"));
        assert!(!is_repo_id("kyutai"));
        assert!(!is_repo_id("a/b/c"));
        assert!(!is_repo_id("../x"));
        assert!(!is_repo_id("/abs"));
    }

    #[test]
    fn variants_parse_from_the_command_line() {
        assert_eq!("q4".parse::<LmVariant>(), Ok(LmVariant::Q4));
        assert_eq!("Q8".parse::<LmVariant>(), Ok(LmVariant::Q8));
        assert_eq!("bf16".parse::<LmVariant>(), Ok(LmVariant::Bf16));
        assert!("q3"
            .parse::<LmVariant>()
            .unwrap_err()
            .contains("expected bf16, q8 or q4"));
    }
}
