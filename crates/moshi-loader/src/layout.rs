//! Decides what a checkpoint (safetensors or GGUF) is from its tensor names and shapes (never
//! its file name): a PyTorch, candle or MLX release of the Moshi LM, or a Mimi codec.

use std::collections::BTreeMap;
use std::path::Path;

use crate::gguf_file::GgufFile;
use crate::{LoaderError, Result, SafetensorsFile};

/// Naming scheme of an LM checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LmLayout {
    /// Kyutai's PyTorch release: `in_proj_weight`, `norm*.alpha` of shape `[1, 1, D]`, stacked depformer.
    PyTorch,
    /// Kyutai's candle release: PyTorch names, depformer re-laid per slice (`depformer.{i}.*`).
    Candle,
    /// Kyutai's MLX release: `in_proj.weight`, `audio_embs.N`, `depformer.slices.{i}.*`, 1-D norms,
    /// optionally MLX-affine packed (`.weight` U32 + `.scales`/`.biases`).
    Mlx,
}

impl LmLayout {
    pub fn as_str(self) -> &'static str {
        match self {
            LmLayout::PyTorch => "pytorch",
            LmLayout::Candle => "candle",
            LmLayout::Mlx => "mlx",
        }
    }
}

/// What a checkpoint file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointKind {
    Lm(LmLayout),
    Mimi,
}

impl CheckpointKind {
    /// `pytorch`, `candle`, `mlx` or `mimi`.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckpointKind::Lm(l) => l.as_str(),
            CheckpointKind::Mimi => "mimi",
        }
    }
}

fn is_slice_index(rest: &str) -> bool {
    rest.split_once('.')
        .is_some_and(|(i, _)| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
}

/// Detects the checkpoint kind of a safetensors file (see [`detect_kind_of`]).
pub fn detect_kind(file: &SafetensorsFile) -> Result<CheckpointKind> {
    let shapes = file
        .tensors()
        .iter()
        .map(|(n, t)| (n.as_str(), t.shape.as_slice()));
    detect_kind_of(file.path(), &shapes.collect())
}

/// Detects the checkpoint kind of a GGUF file (see [`detect_kind_of`]).
pub fn detect_gguf_kind(file: &GgufFile) -> Result<CheckpointKind> {
    let shapes = file
        .tensors()
        .iter()
        .map(|(n, t)| (n.as_str(), t.shape.as_slice()));
    detect_kind_of(file.path(), &shapes.collect())
}

/// Detects the checkpoint kind of the safetensors or GGUF file at `path`.
pub fn detect_file_kind(path: &Path) -> Result<CheckpointKind> {
    if crate::gguf_file::is_gguf(path) {
        return detect_gguf_kind(&GgufFile::open(path)?);
    }
    detect_kind(&SafetensorsFile::open(path)?)
}

/// Detects the checkpoint kind of the file at `path` from its tensors' names, then confirms it
/// with the shape of the final norm.
pub fn detect_kind_of(path: &Path, shapes: &BTreeMap<&str, &[usize]>) -> Result<CheckpointKind> {
    let names: Vec<&str> = shapes.keys().copied().collect();
    let any = |f: &dyn Fn(&str) -> bool| names.iter().any(|n| f(n));
    let unknown = |reason: String| LoaderError::UnknownFormat {
        path: path.to_path_buf(),
        reason,
    };
    if any(&|n| n.starts_with("encoder.model.")) && any(&|n| n.starts_with("quantizer.")) {
        return Ok(CheckpointKind::Mimi);
    }
    if let Some(n) = names.iter().find(|n| n.ends_with("weight_scb")) {
        return Err(unknown(format!(
            "`{n}` marks a bitsandbytes int8 checkpoint (kyutai/moshiko-pytorch-q8), which moshi-rs does not read; use \
             the MLX q8 release (kyutai/moshiko-mlx-q8) or the bf16 release"
        )));
    }
    let layout = if any(&|n| {
        n.starts_with("depformer_in.")
            || n.starts_with("depformer.layers.")
            || n.starts_with("linears.")
    }) {
        LmLayout::PyTorch
    } else if any(&|n| {
        n.starts_with("depformer.slices.")
            || n.starts_with("audio_embs.")
            || n.ends_with(".in_proj.weight")
    }) {
        LmLayout::Mlx
    } else if any(&|n| n.strip_prefix("depformer.").is_some_and(is_slice_index)) {
        LmLayout::Candle
    } else if any(&|n| n.starts_with("emb.")) && any(&|n| n.starts_with("transformer.layers.")) {
        // No depformer (a speech-to-text model, dep_q 0): PyTorch and candle name every other
        // tensor alike, so reading it as PyTorch reads either.
        LmLayout::PyTorch
    } else {
        let sample: Vec<&str> = names.iter().take(5).copied().collect();
        return Err(unknown(format!(
            "{} tensors, none named like a Moshi LM (PyTorch `depformer_in.*`, candle `depformer.0.*`, MLX \
             `depformer.slices.*`) or a Mimi codec (`encoder.model.*`, `quantizer.*`); first names: {sample:?}",
            names.len()
        )));
    };
    // Shapes: PyTorch/candle keep RMSNorm gains as `alpha` [1, 1, D], MLX squeezes them to `weight` [D].
    let (norm_name, rank) = match layout {
        LmLayout::Mlx => ("out_norm.weight", 1),
        _ => ("out_norm.alpha", 3),
    };
    let shape = shapes.get(norm_name).ok_or_else(|| {
        unknown(format!(
            "names look like the {} layout, but its final norm `{norm_name}` is missing",
            layout.as_str()
        ))
    })?;
    let shape_ok = shape.len() == rank && (rank == 1 || shape[..2] == [1, 1]);
    if !shape_ok {
        let expected = if rank == 1 { "[D]" } else { "[1, 1, D]" };
        return Err(unknown(format!(
            "names look like the {} layout, whose `{norm_name}` has shape {expected}, got {:?}",
            layout.as_str(),
            shape
        )));
    }
    Ok(CheckpointKind::Lm(layout))
}
