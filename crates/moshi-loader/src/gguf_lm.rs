//! Loads an LM checkpoint stored as GGUF (Kyutai's candle release `model.q8.gguf`: candle's
//! tensor names, q8_0 matrices, f32 norm gains) into a `WeightMap` under the canonical names,
//! checking every shape against the `LmConfig`. q8_0 matrices stay packed
//! ([`QuantizedMatrix::from_q8_0`]) and run through the packed kernels; F32, F16 and BF16
//! tensors are dense, as from a safetensors file.

use std::collections::BTreeSet;

use moshi_kernels::QuantizedMatrix;
use rayon::prelude::*;

use crate::gguf_file::{GgmlType, GgufFile};
use crate::layout::{detect_gguf_kind, CheckpointKind};
use crate::lm_sources::{lm_sources, SourceSpec};
use crate::lm_weights::{
    check_all_used, check_quantization, check_supported, dense_data, finish_dense, packed_data,
    shape_mismatch,
};
use crate::{DType, LmConfig, LoaderError, Result, Weight, WeightMap, WeightMode};

/// Loads every canonical LM tensor of `cfg` from the GGUF `file`.
pub fn load_lm_weights_gguf(
    file: &GgufFile,
    cfg: &LmConfig,
    mode: WeightMode,
) -> Result<WeightMap> {
    let layout = match detect_gguf_kind(file)? {
        CheckpointKind::Lm(l) => l,
        CheckpointKind::Mimi => {
            return Err(LoaderError::UnknownFormat {
                path: file.path().to_path_buf(),
                reason: "this is a Mimi codec checkpoint, expected a Moshi LM checkpoint".into(),
            })
        }
    };
    check_supported(file.path(), cfg)?;
    check_quantization(file.path(), mode)?;
    let specs = lm_sources(layout, cfg);
    let mut used = BTreeSet::new();
    for spec in &specs {
        let info = file.info(&spec.stored_name)?;
        if info.shape != spec.stored_shape {
            return Err(shape_mismatch(file.path(), spec, &info.shape));
        }
        used.insert(spec.stored_name.clone());
    }
    check_all_used(file.path(), file.tensors().keys(), &used, cfg)?;
    let weights: Vec<Weight> = specs
        .par_iter()
        .map(|spec| materialize(file, spec, mode))
        .collect::<Result<_>>()?;
    let mut map = WeightMap::new(file.path());
    for (spec, weight) in specs.iter().zip(weights) {
        map.insert(spec.canonical.name.clone(), weight);
    }
    Ok(map)
}

/// The canonical weight of `spec`: its rows of the stored tensor, packed or dense.
fn materialize(file: &GgufFile, spec: &SourceSpec, mode: WeightMode) -> Result<Weight> {
    let info = file.info(&spec.stored_name)?;
    let shape = spec.canonical.shape.clone();
    let (block, block_bytes) = info.ggml_type.block();
    // Whole rows of whole blocks (checked at open: the innermost dimension is a block multiple).
    let row_elems: usize = spec.stored_shape[1..].iter().product();
    let numel: usize = shape.iter().product();
    let start = spec.row_start * row_elems / block * block_bytes;
    let bytes = &file.bytes(&spec.stored_name)?[start..start + numel / block * block_bytes];
    let dtype = match info.ggml_type {
        GgmlType::Q8_0 => {
            let cols = shape.last().copied().unwrap_or(1);
            let q = QuantizedMatrix::from_q8_0(numel / cols, cols, bytes).map_err(|e| {
                LoaderError::BadQuantized {
                    path: file.path().to_path_buf(),
                    name: spec.stored_name.clone(),
                    reason: format!("q8_0 {shape:?}: {e}"),
                }
            })?;
            let data = packed_data(file.path(), &spec.stored_name, spec.canonical.role, q, mode)?;
            return Ok(Weight { shape, data });
        }
        GgmlType::F32 => DType::F32,
        GgmlType::F16 => DType::F16,
        GgmlType::BF16 => DType::BF16,
    };
    let data = dense_data(file.path(), spec, dtype, bytes, mode)?;
    finish_dense(file.path(), spec, data, mode)
}
