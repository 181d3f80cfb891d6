//! Writes a quantized LM `WeightMap` (canonical names) as a safetensors file in the layout of the
//! Kyutai MLX releases (`model.q4/q8.safetensors`): packed U32 `.weight` + bf16 `.scales` /
//! `.biases`, 1-D bf16 norms, f32 conditioner tensors (Hibiki); names from the same table the
//! loader reads MLX files with.

use crate::output_file::OutputFile;
use std::collections::BTreeMap;
use std::path::Path;

use crate::layout::LmLayout;
use crate::lm_names::TensorRole;
use crate::lm_sources::lm_sources;
use crate::{DType, LmConfig, LoaderError, Result, Weight, WeightData, WeightMap};

/// One tensor of the output file, its bytes produced on demand (the 7B is written streaming).
struct Entry<'a> {
    dtype: DType,
    shape: Vec<usize>,
    bytes: Box<dyn Fn() -> Vec<u8> + 'a>,
}

fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn u16_bytes(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Canonical name -> MLX release name (with its `.weight` suffix), for every tensor of `cfg`.
pub fn mlx_release_names(cfg: &LmConfig) -> Vec<(String, String)> {
    lm_sources(LmLayout::Mlx, cfg)
        .into_iter()
        .map(|s| (s.canonical.name, s.stored_name))
        .collect()
}

fn entries<'a>(
    weights: &'a WeightMap,
    cfg: &LmConfig,
    out: &Path,
) -> Result<BTreeMap<String, Entry<'a>>> {
    let mut map = BTreeMap::new();
    // The checkpoint's group size: a matrix narrower than whole groups was left dense on load.
    let group_size = weights.names().find_map(|n| match &weights.get(n)?.data {
        WeightData::Quantized(q) => Some(q.group_size()),
        _ => None,
    });
    let left_dense =
        |w: &Weight| group_size.is_some_and(|g| w.shape.last().is_some_and(|&cols| cols % g != 0));
    for spec in lm_sources(LmLayout::Mlx, cfg) {
        let name = &spec.canonical.name;
        let w = weights
            .get(name)
            .ok_or_else(|| LoaderError::MissingTensor {
                path: weights.source().to_path_buf(),
                name: name.clone(),
            })?;
        match (&w.data, spec.canonical.role) {
            (WeightData::Quantized(q), TensorRole::Linear | TensorRole::Embedding) => {
                if q.scale_format() != moshi_kernels::ScaleFormat::Bf16 {
                    return Err(LoaderError::BadQuantized {
                        path: weights.source().to_path_buf(),
                        name: name.clone(),
                        reason: "holds GGUF q8_0 blocks, whose f16 scales MLX's bf16 scales cannot hold \
                                 exactly: quantize a dense (bf16) checkpoint instead"
                            .into(),
                    });
                }
                let prefix = spec
                    .stored_name
                    .strip_suffix(".weight")
                    .expect("MLX names of matrices end in .weight")
                    .to_string();
                let groups = q.cols() / q.group_size();
                let packed_cols = q.cols() * q.bits() as usize / 32;
                map.insert(
                    format!("{prefix}.weight"),
                    Entry {
                        dtype: DType::U32,
                        shape: vec![q.rows(), packed_cols],
                        bytes: Box::new(|| u32_bytes(q.codes())),
                    },
                );
                map.insert(
                    format!("{prefix}.scales"),
                    Entry {
                        dtype: DType::BF16,
                        shape: vec![q.rows(), groups],
                        bytes: Box::new(|| u16_bytes(q.scales())),
                    },
                );
                map.insert(
                    format!("{prefix}.biases"),
                    Entry {
                        dtype: DType::BF16,
                        shape: vec![q.rows(), groups],
                        bytes: Box::new(|| u16_bytes(q.biases())),
                    },
                );
            }
            (WeightData::F32(v), TensorRole::Norm) => {
                let bytes = move || v.iter().flat_map(|x| half::bf16::from_f32(*x).to_bits().to_le_bytes()).collect();
                map.insert(
                    spec.stored_name.clone(),
                    Entry { dtype: DType::BF16, shape: w.shape.clone(), bytes: Box::new(bytes) },
                );
            }
            (WeightData::BF16(v), TensorRole::Linear | TensorRole::Embedding) if left_dense(w) => {
                map.insert(
                    spec.stored_name.clone(),
                    Entry { dtype: DType::BF16, shape: w.shape.clone(), bytes: Box::new(|| u16_bytes(v)) },
                );
            }
            (WeightData::F32(v), TensorRole::Linear | TensorRole::Embedding) if left_dense(w) => {
                let bytes = move || v.iter().flat_map(|x| x.to_le_bytes()).collect();
                map.insert(
                    spec.stored_name.clone(),
                    Entry { dtype: DType::F32, shape: w.shape.clone(), bytes: Box::new(bytes) },
                );
            }
            (WeightData::BF16(v), TensorRole::Norm) => {
                map.insert(
                    spec.stored_name.clone(),
                    Entry { dtype: DType::BF16, shape: w.shape.clone(), bytes: Box::new(|| u16_bytes(v)) },
                );
            }
            (WeightData::F32(v), TensorRole::Conditioner) => {
                // Kept dense and exact, in the stored shape (`learnt_padding` is [1, 1, dim]).
                let bytes = move || v.iter().flat_map(|x| x.to_le_bytes()).collect();
                map.insert(
                    spec.stored_name.clone(),
                    Entry { dtype: DType::F32, shape: spec.stored_shape.clone(), bytes: Box::new(bytes) },
                );
            }
            (_, role) => {
                return Err(LoaderError::BadTensor {
                    path: out.to_path_buf(),
                    name: name.clone(),
                    reason: format!(
                        "{role:?} weight is not quantized; load the checkpoint with WeightMode::Quantize first"
                    ),
                })
            }
        }
    }
    Ok(map)
}

/// Writes `weights` (every Linear/Embedding `Quantized`) to `out` in the MLX release layout,
/// through [`OutputFile`]: complete or absent, mode 0666 minus the umask, a device written in
/// place.
pub fn write_mlx_quantized(weights: &WeightMap, cfg: &LmConfig, out: &Path) -> Result<()> {
    let entries = entries(weights, cfg, out)?;
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, e) in &entries {
        let len = e.shape.iter().product::<usize>() * e.dtype.size_bytes();
        header.insert(
            name.clone(),
            serde_json::json!({ "dtype": e.dtype.to_string(), "shape": e.shape, "data_offsets": [offset, offset + len] }),
        );
        offset += len;
    }
    header.insert(
        "__metadata__".into(),
        serde_json::json!({ "format": "mlx" }),
    );
    let mut header_bytes = serde_json::to_vec(&header).expect("JSON of strings and numbers");
    while !header_bytes.len().is_multiple_of(8) {
        header_bytes.push(b' ');
    }
    let mut file = OutputFile::create(out)?;
    file.write_bytes(&(header_bytes.len() as u64).to_le_bytes())?;
    file.write_bytes(&header_bytes)?;
    for e in entries.values() {
        file.write_bytes(&(e.bytes)())?;
    }
    file.commit()?;
    Ok(())
}
