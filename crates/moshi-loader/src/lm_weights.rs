//! Loads an LM checkpoint of any layout (PyTorch, candle, MLX dense or packed) into a `WeightMap`
//! under the canonical names, checking every shape against the `LmConfig`.

use std::collections::BTreeSet;
use std::path::Path;

use moshi_kernels::{f32_to_bf16_bits, QuantizedMatrix, ScaleFormat};
use rayon::prelude::*;

use crate::layout::{detect_kind, CheckpointKind, LmLayout};
use crate::lm_names::TensorRole;
use crate::lm_sources::{lm_sources, SourceSpec};
use crate::mlx_quant::{derive_quant_params, file_logical_shape, is_packed, read_quantized};
use crate::{DType, LmConfig, LoaderError, Result, SafetensorsFile, Weight, WeightData, WeightMap};

/// How weights are handed to the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightMode {
    /// bf16 stays `BF16`, f32 stays `F32`, MLX packed stays `Quantized` (f16 becomes f32).
    Native,
    /// Everything becomes `F32` (packed matrices are dequantized: `q * scale + bias` in f32).
    DequantizeF32,
    /// Packed matrices become `BF16` exactly as `mx.dequantize` makes them with bf16 scales
    /// (`bf16(bf16(q * scale) + bias)`); dense tensors stay as in `Native`.
    DequantizeBf16,
    /// Every Linear and Embedding matrix becomes `Quantized` with these parameters, as MLX's
    /// `nn.quantize` makes it from the stored values (norms stay f32). A packed checkpoint must
    /// already hold exactly these parameters (it is used as is; a mismatch is an error).
    Quantize { bits: u32, group_size: usize },
}

impl WeightMode {
    /// MLX's default group size for `bits` as used by the Moshi releases (q4 -> 32, q8 -> 64).
    pub fn default_group_size(bits: u32) -> usize {
        if bits == 4 {
            32
        } else {
            64
        }
    }
}

/// Opens `path` (safetensors, or GGUF such as candle's `model.q8.gguf`), detects its layout and loads every
/// canonical LM tensor of `cfg`.
pub fn load_lm_weights(path: &Path, cfg: &LmConfig, mode: WeightMode) -> Result<WeightMap> {
    if crate::gguf_file::is_gguf(path) {
        let file = crate::gguf_file::GgufFile::open(path)?;
        return crate::gguf_lm::load_lm_weights_gguf(&file, cfg, mode);
    }
    let file = SafetensorsFile::open(path)?;
    load_lm_weights_from(&file, cfg, mode)
}

/// [`load_lm_weights`] on an already opened file.
pub fn load_lm_weights_from(
    file: &SafetensorsFile,
    cfg: &LmConfig,
    mode: WeightMode,
) -> Result<WeightMap> {
    let layout = lm_layout_of(file)?;
    check_supported(file.path(), cfg)?;
    check_quantization(file.path(), mode)?;
    let specs = lm_sources(layout, cfg);
    let used = check_names_and_shapes(file, layout, &specs)?;
    check_all_used(file.path(), file.tensors().keys(), &used, cfg)?;
    // Tensors are independent: convert / dequantize them on all cores.
    let weights: Vec<Weight> = specs
        .par_iter()
        .map(|spec| materialize(file, layout, spec, mode))
        .collect::<Result<_>>()?;
    let mut map = WeightMap::new(file.path());
    for (spec, weight) in specs.iter().zip(weights) {
        map.insert(spec.canonical.name.clone(), weight);
    }
    Ok(map)
}

/// Fails when a stored tensor is not among the `used` ones (the config and the checkpoint
/// disagree).
pub(crate) fn check_all_used<'a>(
    path: &Path,
    stored: impl Iterator<Item = &'a String>,
    used: &BTreeSet<String>,
    cfg: &LmConfig,
) -> Result<()> {
    let unexpected: Vec<&String> = stored.filter(|n| !used.contains(n.as_str())).collect();
    let Some(first) = unexpected.first() else {
        return Ok(());
    };
    Err(LoaderError::ConfigMismatch {
        path: path.to_path_buf(),
        reason: format!(
            "{} tensor(s) are not used by the config, first `{first}` (the config has num_layers {}, n_q {}, dep_q {}, \
             depformer_num_layers {}: do they match the checkpoint?)",
            unexpected.len(),
            cfg.num_layers,
            cfg.n_q,
            cfg.dep_q,
            cfg.depformer_num_layers
        ),
    })
}

/// The LM layout of `file`, or an error if it is a Mimi checkpoint.
pub fn lm_layout_of(file: &SafetensorsFile) -> Result<LmLayout> {
    match detect_kind(file)? {
        CheckpointKind::Lm(l) => Ok(l),
        CheckpointKind::Mimi => Err(LoaderError::UnknownFormat {
            path: file.path().to_path_buf(),
            reason: "this is a Mimi codec checkpoint, expected a Moshi LM checkpoint".into(),
        }),
    }
}

/// A stored tensor whose shape is not the one the config gives it.
pub(crate) fn shape_mismatch(path: &Path, spec: &SourceSpec, stored: &[usize]) -> LoaderError {
    LoaderError::ConfigMismatch {
        path: path.to_path_buf(),
        reason: format!(
            "tensor `{}` has shape {:?}, the config expects {:?} (for `{}`)",
            spec.stored_name, stored, spec.stored_shape, spec.canonical.name
        ),
    }
}

pub(crate) fn check_supported(path: &Path, cfg: &LmConfig) -> Result<()> {
    if !cfg.depformer_weights_per_step || !cfg.depformer_multi_linear {
        return Err(LoaderError::BadConfig {
            path: path.to_path_buf(),
            reason: format!(
                "depformer_weights_per_step = {} and depformer_multi_linear = {}: only true/true (every Moshi release) is supported",
                cfg.depformer_weights_per_step, cfg.depformer_multi_linear
            ),
        });
    }
    Ok(())
}

/// Checks from the header alone that every source exists with the shape the config implies;
/// returns the set of stored names that will be read.
fn check_names_and_shapes(
    file: &SafetensorsFile,
    layout: LmLayout,
    specs: &[SourceSpec],
) -> Result<BTreeSet<String>> {
    let mut used = BTreeSet::new();
    for spec in specs {
        let info = file.info(&spec.stored_name)?;
        let prefix = spec.stored_name.strip_suffix(".weight");
        if layout == LmLayout::Mlx && prefix.is_some_and(|p| is_packed(file, p)) {
            let prefix = prefix.expect("checked");
            // Only matrices are packed: a packed (U32) norm or vector is not a layout MLX writes.
            if spec.canonical.shape.len() != 2 {
                return Err(LoaderError::BadQuantized {
                    path: file.path().to_path_buf(),
                    name: prefix.to_string(),
                    reason: format!(
                        "`{}` is stored packed ({} {:?}), expected an unpacked F32/BF16/F16 tensor of shape {:?} \
                         (only matrices are quantized)",
                        spec.stored_name, info.dtype, info.shape, spec.stored_shape
                    ),
                });
            }
            // Cross-check: the widths the file's own unpacked tensors imply must be the config's
            // (bits and group size alone can be ambiguous: q8/g64 at 256 reads as q4/g128 at 512).
            if let Some((shape, p)) =
                file_logical_shape(file, prefix).filter(|(s, _)| *s != spec.canonical.shape)
            {
                return Err(LoaderError::ConfigMismatch {
                    path: file.path().to_path_buf(),
                    reason: format!(
                        "packed tensor `{prefix}` holds {shape:?} ({}-bit, group size {}), the config expects {:?}",
                        p.bits, p.group_size, spec.canonical.shape
                    ),
                });
            }
            derive_quant_params(
                file,
                prefix,
                spec.canonical.shape[0],
                spec.canonical.shape[1],
            )?;
            used.insert(format!("{prefix}.scales"));
            used.insert(format!("{prefix}.biases"));
        } else if info.shape != spec.stored_shape {
            return Err(shape_mismatch(file.path(), spec, &info.shape));
        }
        used.insert(spec.stored_name.clone());
    }
    Ok(used)
}

fn materialize(
    file: &SafetensorsFile,
    layout: LmLayout,
    spec: &SourceSpec,
    mode: WeightMode,
) -> Result<Weight> {
    let shape = spec.canonical.shape.clone();
    if layout == LmLayout::Mlx {
        if let Some(prefix) = spec
            .stored_name
            .strip_suffix(".weight")
            .filter(|p| is_packed(file, p))
        {
            let q = read_quantized(file, prefix, shape[0], shape[1])?;
            let data = packed_data(file.path(), prefix, spec.canonical.role, q, mode)?;
            return Ok(Weight { shape, data });
        }
    }
    let info = file.info(&spec.stored_name)?;
    let row_elems: usize = spec.stored_shape[1..].iter().product();
    let numel: usize = shape.iter().product();
    let esize = info.dtype.size_bytes();
    let start = spec.row_start * row_elems * esize;
    let bytes = &file.bytes(&spec.stored_name)?[start..start + numel * esize];
    let data = dense_data(file.path(), spec, info.dtype, bytes, mode)?;
    finish_dense(file.path(), spec, data, mode)
}

/// A packed matrix as `mode` hands it over: kept packed (`Native`, or a `Quantize` of its own
/// parameters), or dequantized (norms and conditioners always: they are used as f32 vectors).
/// `DequantizeBf16` rounds as `mx.dequantize` does for MLX's bf16 scales, and the exact values
/// once to bf16 for GGUF's f16 ones.
pub(crate) fn packed_data(
    path: &Path,
    name: &str,
    role: TensorRole,
    q: QuantizedMatrix,
    mode: WeightMode,
) -> Result<WeightData> {
    Ok(match (role, mode) {
        (TensorRole::Norm | TensorRole::Conditioner, _) | (_, WeightMode::DequantizeF32) => {
            WeightData::F32(q.dequantize_f32())
        }
        (_, WeightMode::DequantizeBf16) => match q.scale_format() {
            ScaleFormat::Bf16 => WeightData::BF16(q.dequantize_bf16()),
            ScaleFormat::F16 => {
                WeightData::BF16(q.dequantize_f32().into_iter().map(f32_to_bf16_bits).collect())
            }
        },
        (_, WeightMode::Quantize { bits, group_size })
            if (bits, group_size) != (q.bits(), q.group_size()) =>
        {
            return Err(LoaderError::BadQuantized {
                path: path.to_path_buf(),
                name: name.to_string(),
                reason: format!(
                    "stored as {}-bit, group size {}; requested {bits}-bit, group size {group_size} \
                     (requantizing a packed checkpoint is not supported: load it natively or quantize \
                     the dense checkpoint)",
                    q.bits(),
                    q.group_size()
                ),
            })
        }
        (_, WeightMode::Native | WeightMode::Quantize { .. }) => WeightData::Quantized(q),
    })
}

/// The dense weight of `spec` from its stored `bytes` of `dtype`: f32 for norms, conditioners and
/// [`WeightMode::DequantizeF32`], else as stored (f16 widened to f32).
pub(crate) fn dense_data(
    path: &Path,
    spec: &SourceSpec,
    dtype: DType,
    bytes: &[u8],
    mode: WeightMode,
) -> Result<WeightData> {
    let as_f32 = matches!(
        spec.canonical.role,
        TensorRole::Norm | TensorRole::Conditioner
    ) || mode == WeightMode::DequantizeF32;
    let u16s = || {
        bytes
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
    };
    Ok(match dtype {
        DType::F32 => WeightData::F32(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        DType::BF16 if as_f32 => {
            WeightData::F32(u16s().map(|b| f32::from_bits((b as u32) << 16)).collect())
        }
        DType::BF16 => WeightData::BF16(u16s().collect()),
        DType::F16 => WeightData::F32(u16s().map(|b| half::f16::from_bits(b).to_f32()).collect()),
        other => {
            return Err(LoaderError::DTypeMismatch {
                path: path.to_path_buf(),
                name: spec.stored_name.clone(),
                expected: "F32, BF16 or F16 (or an MLX packed U32 with .scales/.biases)".into(),
                got: other.to_string(),
            })
        }
    })
}

/// A dense weight as `mode` hands it over: quantized under [`WeightMode::Quantize`] (Linear and
/// Embedding matrices of whole groups), else as it is.
pub(crate) fn finish_dense(
    path: &Path,
    spec: &SourceSpec,
    data: WeightData,
    mode: WeightMode,
) -> Result<Weight> {
    let shape = spec.canonical.shape.clone();
    if let (WeightMode::Quantize { bits, group_size }, TensorRole::Linear | TensorRole::Embedding) =
        (mode, spec.canonical.role)
    {
        // A matrix narrower than whole groups (a small low-rank projection) stays as stored, as
        // mlx-lm's quantization predicate leaves such layers.
        if shape.last().is_some_and(|&cols| cols % group_size == 0) {
            return quantize_dense(path, spec, data, bits, group_size);
        }
    }
    Ok(Weight { shape, data })
}

/// A quantization MLX can produce (checked before any tensor: a matrix narrower than a group
/// is left dense, so a bad group size would otherwise quantize nothing).
pub(crate) fn check_quantization(path: &Path, mode: WeightMode) -> Result<()> {
    use moshi_kernels::{SUPPORTED_BITS, SUPPORTED_GROUP_SIZES};
    let WeightMode::Quantize { bits, group_size } = mode else {
        return Ok(());
    };
    if SUPPORTED_BITS.contains(&bits) && SUPPORTED_GROUP_SIZES.contains(&group_size) {
        return Ok(());
    }
    Err(LoaderError::UnsupportedQuantization {
        path: path.to_path_buf(),
        bits,
        group_size,
        supported_bits: format!("{SUPPORTED_BITS:?}"),
        supported_group_sizes: format!("{SUPPORTED_GROUP_SIZES:?}"),
    })
}

/// Quantizes a dense matrix exactly as MLX's `mx.quantize` does from the same values.
fn quantize_dense(
    path: &Path,
    spec: &SourceSpec,
    data: WeightData,
    bits: u32,
    group_size: usize,
) -> Result<Weight> {
    let shape = spec.canonical.shape.clone();
    let values = match data {
        WeightData::F32(v) => v,
        WeightData::BF16(v) => v
            .into_iter()
            .map(|b| f32::from_bits((b as u32) << 16))
            .collect(),
        WeightData::Quantized(q) => {
            return Ok(Weight {
                shape,
                data: WeightData::Quantized(q),
            })
        }
    };
    let q =
        QuantizedMatrix::quantize(&values, shape[0], shape[1], bits, group_size).map_err(|e| {
            LoaderError::BadQuantized {
                path: path.to_path_buf(),
                name: spec.stored_name.clone(),
                reason: format!(
                    "cannot quantize {shape:?} to {bits}-bit, group size {group_size}: {e}"
                ),
            }
        })?;
    Ok(Weight {
        shape,
        data: WeightData::Quantized(q),
    })
}
