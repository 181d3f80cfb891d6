//! Mimi's weights, read like the LM's: a Mimi safetensors checkpoint (PyTorch release names, the
//! canonical names of Mimi) -> a [`WeightMap`] of f32 tensors for `moshi_model::mimi::Mimi::load`,
//! which checks every shape against the config as it takes them. Codebooks beyond the ones asked
//! for and PyTorch's `_initialized` flags are not read.

use std::path::Path;

use crate::layout::{detect_kind, CheckpointKind};
use crate::{LoaderError, Result, SafetensorsFile, Weight, WeightData, WeightMap};

/// Whether the model reads tensor `name` when it uses `num_codebooks` codebooks: the first
/// codebook is `rvq_first`'s only level, codebook `k >= 1` is `rvq_rest` level `k - 1`.
pub fn mimi_tensor_is_used(name: &str, num_codebooks: usize) -> bool {
    if name.ends_with("._initialized") {
        return false;
    }
    let Some(rest) = name.strip_prefix("quantizer.rvq_rest.") else {
        return true;
    };
    if num_codebooks <= 1 {
        return false;
    }
    match rest
        .strip_prefix("vq.layers.")
        .and_then(|l| l.split('.').next())
        .and_then(|level| level.parse::<usize>().ok())
    {
        Some(level) => level + 1 < num_codebooks,
        None => true,
    }
}

/// Reads the tensors of the Mimi checkpoint at `path` that a Mimi with `num_codebooks`
/// codebooks uses, as f32 (the release stores f32; bf16/f16 are widened exactly). Fails, naming
/// the file, on an LM checkpoint, an unknown format or a non-float tensor.
pub fn load_mimi_weights(path: &Path, num_codebooks: usize) -> Result<WeightMap> {
    let file = SafetensorsFile::open(path)?;
    if let CheckpointKind::Lm(layout) = detect_kind(&file)? {
        return Err(LoaderError::UnknownFormat {
            path: path.to_path_buf(),
            reason: format!(
                "this is a Moshi LM checkpoint ({} layout), expected a Mimi codec checkpoint",
                layout.as_str()
            ),
        });
    }
    let mut map = WeightMap::new(path);
    for (name, info) in file.tensors() {
        if !mimi_tensor_is_used(name, num_codebooks) {
            continue;
        }
        let data = file.read_f32(name, &info.shape)?;
        map.insert(
            name.clone(),
            Weight {
                shape: info.shape.clone(),
                data: WeightData::F32(data),
            },
        );
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_unused_codebooks_and_flags() {
        let level = |l: usize| format!("quantizer.rvq_rest.vq.layers.{l}._codebook.embedding_sum");
        assert!(mimi_tensor_is_used("encoder.model.0.conv.conv.weight", 8));
        assert!(mimi_tensor_is_used(
            "quantizer.rvq_first.vq.layers.0._codebook.embedding_sum",
            1
        ));
        assert!(!mimi_tensor_is_used(
            "quantizer.rvq_first.vq.layers.0._codebook._initialized",
            8
        ));
        assert!(mimi_tensor_is_used(
            "quantizer.rvq_rest.input_proj.weight",
            2
        ));
        assert!(!mimi_tensor_is_used(
            "quantizer.rvq_rest.input_proj.weight",
            1
        ));
        assert!(mimi_tensor_is_used(&level(6), 8));
        assert!(!mimi_tensor_is_used(&level(7), 8));
        assert!(!mimi_tensor_is_used(&level(10), 8));
    }
}
