//! Loads the LM of a checkpoint for `moshi-rs bench`: resolves the model with the loader's
//! [`ModelSource`] (folder, file or Hub repo; `--quant` picks the file), checks that the weights
//! really are in the requested format, and keeps only the first `--layers` temporal layers.

use moshi_loader::lm_weights::{load_lm_weights, WeightMode};
use moshi_loader::{
    LmConfig, LmVariant, LoaderError, ModelSource, ResolvedModel, SourceOverrides, WeightMap,
};

use crate::format::{stored_format, StoredFormat, WeightFormat};
use crate::BenchError;

/// The loader's file variant holding `format`.
pub fn variant_of(format: WeightFormat) -> LmVariant {
    match format {
        WeightFormat::Bf16 => LmVariant::Bf16,
        WeightFormat::Q8 => LmVariant::Q8,
        WeightFormat::Q4 => LmVariant::Q4,
    }
}

/// Resolves `spec` (folder, checkpoint file or Hub repo id) for `format` (`None`: whatever the
/// folder's config names), with `config` overriding its `config.json`.
pub fn resolve_model(
    spec: &str,
    config: Option<&std::path::Path>,
    format: Option<WeightFormat>,
) -> Result<ResolvedModel, BenchError> {
    let overrides = SourceOverrides {
        lm_config: config.map(|p| p.to_path_buf()),
        variant: format.map(variant_of),
        ..SourceOverrides::default()
    };
    ModelSource::resolve(spec, &overrides).map_err(|source| match (format, &source) {
        (Some(format), LoaderError::NotFound { what, .. }) if what == "LM checkpoint" => {
            BenchError::FormatFileMissing {
                spec: spec.to_string(),
                format,
                source: Box::new(source),
            }
        }
        _ => BenchError::Checkpoint {
            spec: spec.to_string(),
            source: Box::new(source),
        },
    })
}

/// Which benchmark format a stored LM is, or an error naming what it holds.
fn format_of(stored: StoredFormat, model: &ResolvedModel) -> Result<WeightFormat, BenchError> {
    [WeightFormat::Bf16, WeightFormat::Q8, WeightFormat::Q4]
        .into_iter()
        .find(|f| stored.provides(*f))
        .ok_or_else(|| BenchError::UnmeasuredFormat {
            path: model.lm_weights_path.clone(),
            stored: stored.describe(),
        })
}

/// Loads the LM weights of `model` as stored, checks they are `format` (when given), and keeps
/// only the first `layers` temporal layers. Returns the weights, the config for that depth and
/// the format found.
pub fn load_checkpoint_lm(
    model: &ResolvedModel,
    format: Option<WeightFormat>,
    layers: usize,
) -> Result<(WeightMap, LmConfig, WeightFormat), BenchError> {
    let full = &model.lm_config;
    let mut weights = load_lm_weights(&model.lm_weights_path, full, WeightMode::Native)?;
    let stored = stored_format(&weights).ok_or_else(|| BenchError::NoTemporalLayer {
        path: model.lm_weights_path.clone(),
    })?;
    let found = match format {
        Some(f) if !stored.provides(f) => {
            return Err(BenchError::FormatMismatch {
                format: f,
                path: model.lm_weights_path.clone(),
                stored: stored.describe(),
            })
        }
        Some(f) => f,
        None => format_of(stored, model)?,
    };
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
            let shape = weights
                .get(&name)
                .map(|w| w.shape.clone())
                .unwrap_or_default();
            weights.take(&name, &shape)?;
        }
        cfg.num_layers = layers;
    }
    Ok((weights, cfg, found))
}

#[cfg(test)]
mod tests {
    use super::*;
    use moshi_test_support::{copy_tiny_a_files, tiny_a_dir};

    #[test]
    fn loads_each_format_of_the_tiny_checkpoint_with_fewer_layers() {
        let spec = tiny_a_dir().display().to_string();
        for format in [WeightFormat::Bf16, WeightFormat::Q8, WeightFormat::Q4] {
            let model = resolve_model(&spec, None, Some(format)).unwrap();
            let (weights, cfg, found) = load_checkpoint_lm(&model, Some(format), 1).unwrap();
            assert_eq!(found, format);
            assert_eq!(cfg.num_layers, 1);
            assert!(weights.contains("transformer.layers.0.self_attn.in_proj"));
            assert!(!weights.contains("transformer.layers.1.self_attn.in_proj"));
            assert!(stored_format(&weights).unwrap().provides(format));
        }
        let model = resolve_model(&spec, None, None).unwrap();
        let (_, cfg, found) = load_checkpoint_lm(&model, None, 2).unwrap();
        assert_eq!(
            (found, cfg.num_layers),
            (WeightFormat::Bf16, 2),
            "default: the config's model.safetensors"
        );
    }

    #[test]
    fn a_format_the_checkpoint_lacks_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        copy_tiny_a_files(
            dir.path(),
            &[
                "config.json",
                "mimi_config.json",
                "mimi.safetensors",
                "tokenizer.model",
                "model.q8.safetensors",
            ],
        );
        let spec = dir.path().display().to_string();
        let err = resolve_model(&spec, None, Some(WeightFormat::Q4))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot provide --quant q4") && err.contains("model.q4.safetensors"),
            "{err}"
        );
        assert!(
            err.contains("moshi-rs quantize model.safetensors model.q4.safetensors --bits 4"),
            "{err}"
        );
        // A bf16 request served by a file that actually holds 8-bit weights.
        std::fs::rename(
            dir.path().join("model.q8.safetensors"),
            dir.path().join("model.safetensors"),
        )
        .unwrap();
        let model = resolve_model(&spec, None, Some(WeightFormat::Bf16)).unwrap();
        let err = load_checkpoint_lm(&model, Some(WeightFormat::Bf16), 2)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot provide --quant bf16") && err.contains("8-bit group 64"),
            "{err}"
        );
    }
}
