//! Finds what `moshi-rs bench --model DIR --quant Q` runs: the LM config, the LM file that holds
//! format Q, and Mimi's weights and config; loads the LM with only the first `--layers` layers.

use std::path::{Path, PathBuf};

use moshi_loader::lm_weights::{load_lm_weights, WeightMode};
use moshi_loader::{LmConfig, MimiConfig, WeightMap};

use super::format::{stored_format, WeightFormat};
use super::BenchError;

/// Files of a local checkpoint folder.
#[derive(Clone, Debug)]
pub struct CheckpointFiles {
    pub dir: PathBuf,
    /// Where the LM config came from (a file, or the built-in 7B config).
    pub lm_config_origin: String,
    pub lm_config: LmConfig,
    /// The LM weights holding the requested format.
    pub lm_weights: PathBuf,
    pub format: WeightFormat,
    /// Mimi weights (`mimi_name` of the config), if present.
    pub mimi_weights: Option<PathBuf>,
    pub mimi_config: MimiConfig,
}

fn setup(msg: String) -> BenchError {
    BenchError::Setup(msg)
}

/// LM `.safetensors` files of `dir` (everything but the Mimi weights), sorted.
fn lm_files(dir: &Path, mimi_name: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".safetensors") && n != mimi_name)
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Resolves the files of the checkpoint folder `dir` for `format` (default: the config's
/// `moshi_name`, taken to be bf16). `config` overrides `dir/config.json`; without either the
/// built-in moshiko 7B config is used.
pub fn resolve_checkpoint(dir: &Path, config: Option<&Path>, format: Option<WeightFormat>) -> Result<CheckpointFiles, BenchError> {
    if !dir.is_dir() {
        return Err(setup(format!(
            "--model {}: no such folder (bench reads a local checkpoint folder; fetch a Hub repo first, e.g. \
             `huggingface-cli download kyutai/moshiko-mlx-q4 --local-dir DIR`)",
            dir.display()
        )));
    }
    let default_config = dir.join("config.json");
    let (lm_config, lm_config_origin) = match config {
        Some(p) => (LmConfig::from_file(p).map_err(|e| setup(e.to_string()))?, p.display().to_string()),
        None if default_config.is_file() => (
            LmConfig::from_file(&default_config).map_err(|e| setup(e.to_string()))?,
            default_config.display().to_string(),
        ),
        None => (LmConfig::moshiko_7b(), "<built-in moshiko-7b>".to_string()),
    };
    let moshi_name = lm_config.moshi_name.clone().unwrap_or_else(|| "model.safetensors".into());
    let mimi_name = lm_config.mimi_name.clone().unwrap_or_else(|| "tokenizer-e351c8d8-checkpoint125.safetensors".into());
    let available = lm_files(dir, &mimi_name);
    let format = format.unwrap_or(WeightFormat::Bf16);
    let wanted = format.conventional_file_name().map(str::to_string).unwrap_or(moshi_name);
    let lm_weights = dir.join(&wanted);
    if !lm_weights.is_file() {
        return Err(setup(format!(
            "checkpoint {} cannot provide --quant {}: {} is missing (LM files there: {})",
            dir.display(),
            format.name(),
            wanted,
            if available.is_empty() { "none".to_string() } else { available.join(", ") }
        )));
    }
    let mimi_path = dir.join(&mimi_name);
    let mimi_config = match lm_config.mimi_config_name.as_deref().map(|n| dir.join(n)) {
        Some(p) if p.is_file() => MimiConfig::from_file(&p).map_err(|e| setup(e.to_string()))?,
        _ => MimiConfig::v0_1(),
    };
    Ok(CheckpointFiles {
        dir: dir.to_path_buf(),
        lm_config_origin,
        lm_config,
        lm_weights,
        format,
        mimi_weights: mimi_path.is_file().then_some(mimi_path),
        mimi_config,
    })
}

/// Loads the LM weights of `files` as stored, checks they are in the requested format, and keeps
/// only the first `layers` temporal layers. Returns the weights and the config for that depth.
pub fn load_checkpoint_lm(files: &CheckpointFiles, layers: usize) -> Result<(WeightMap, LmConfig), BenchError> {
    let full = &files.lm_config;
    let mut weights = load_lm_weights(&files.lm_weights, full, WeightMode::Native).map_err(|e| setup(e.to_string()))?;
    let stored = stored_format(&weights).ok_or_else(|| {
        setup(format!("{}: no temporal layer 0 attention weights to benchmark", files.lm_weights.display()))
    })?;
    if !stored.provides(files.format) {
        return Err(setup(format!(
            "checkpoint {} cannot provide --quant {}: {} holds {} weights",
            files.dir.display(),
            files.format.name(),
            files.lm_weights.display(),
            stored.describe()
        )));
    }
    let mut cfg = full.clone();
    if layers < full.num_layers {
        let doomed: Vec<String> = weights
            .names()
            .filter(|n| {
                n.strip_prefix("transformer.layers.")
                    .and_then(|r| r.split('.').next())
                    .and_then(|l| l.parse::<usize>().ok())
                    .is_some_and(|l| l >= layers)
            })
            .map(str::to_string)
            .collect();
        for name in doomed {
            let shape = weights.get(&name).map(|w| w.shape.clone()).unwrap_or_default();
            weights.take(&name, &shape).map_err(|e| setup(e.to_string()))?;
        }
        cfg.num_layers = layers;
    }
    Ok((weights, cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/tiny-a")
    }

    #[test]
    fn finds_each_format_of_the_tiny_checkpoint_and_loads_fewer_layers() {
        for format in [WeightFormat::Bf16, WeightFormat::Q8, WeightFormat::Q4] {
            let files = resolve_checkpoint(&tiny_dir(), None, Some(format)).unwrap();
            assert_eq!(files.lm_config.num_layers, 2);
            assert!(files.mimi_weights.is_some());
            assert_eq!(files.mimi_config.quantizer.bins, 64, "tiny Mimi config from mimi_config.json");
            let (weights, cfg) = load_checkpoint_lm(&files, 1).unwrap();
            assert_eq!(cfg.num_layers, 1);
            assert!(weights.contains("transformer.layers.0.self_attn.in_proj"));
            assert!(!weights.contains("transformer.layers.1.self_attn.in_proj"));
            assert!(stored_format(&weights).unwrap().provides(format));
        }
    }

    #[test]
    fn a_missing_format_or_folder_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(tiny_dir().join("config.json"), dir.path().join("config.json")).unwrap();
        std::fs::copy(tiny_dir().join("model.q8.safetensors"), dir.path().join("model.q8.safetensors")).unwrap();
        let err = resolve_checkpoint(dir.path(), None, Some(WeightFormat::Q4)).unwrap_err().to_string();
        assert!(err.contains("cannot provide --quant q4") && err.contains("model.q8.safetensors"), "{err}");
        // A bf16 request served by a file that actually holds 8-bit weights.
        std::fs::rename(dir.path().join("model.q8.safetensors"), dir.path().join("model.safetensors")).unwrap();
        let files = resolve_checkpoint(dir.path(), None, Some(WeightFormat::Bf16)).unwrap();
        let err = load_checkpoint_lm(&files, 2).unwrap_err().to_string();
        assert!(err.contains("cannot provide --quant bf16") && err.contains("8-bit group 64"), "{err}");
        let err = resolve_checkpoint(&dir.path().join("nope"), None, None).unwrap_err().to_string();
        assert!(err.contains("no such folder"), "{err}");
    }
}
