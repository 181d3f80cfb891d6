//! Describes a checkpoint file (safetensors or GGUF): detected format, dtypes, MLX bits/group
//! size or GGUF q8_0, parameter count,
//! and the tensors that are missing, unexpected or mis-shaped with respect to a config.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Serialize;

use moshi_kernels::Q8_0_BLOCK;

use crate::gguf_file::{GgmlType, GgufFile};
use crate::layout::{detect_gguf_kind, detect_kind, CheckpointKind, LmLayout};
use crate::lm_sources::lm_sources;
use crate::mlx_quant::{file_logical_shape, infer_in_dim, is_packed, quant_params_from_shapes};
use crate::{DType, LmConfig, MimiConfig, Result, SafetensorsFile};

/// The config a checkpoint is checked against.
#[derive(Clone, Copy, Debug)]
pub enum ConfigRef<'a> {
    Lm(&'a LmConfig),
    Mimi(&'a MimiConfig),
}

/// Bit width / group size of the packed matrices, with how many matrices use it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct QuantSummary {
    pub bits: u32,
    pub group_size: usize,
    pub matrices: usize,
}

/// What `moshi-rs inspect` prints for one checkpoint file.
#[derive(Clone, Debug, Serialize)]
pub struct CheckpointReport {
    pub path: PathBuf,
    /// `pytorch`, `candle`, `mlx` or `mimi`.
    pub format: String,
    pub file_size_bytes: u64,
    pub tensor_count: usize,
    /// Stored dtype -> number of tensors.
    pub dtypes: BTreeMap<String, usize>,
    /// Empty for dense checkpoints.
    pub quantization: Vec<QuantSummary>,
    /// Logical parameters (packed matrices counted unpacked; scales/biases not counted).
    pub parameter_count: u64,
    /// Problems met while working out bits/group sizes without a config.
    pub notes: Vec<String>,
    /// Present when a config was given.
    pub config_check: Option<ConfigCheck>,
}

/// Differences between a checkpoint and a config.
#[derive(Clone, Debug, Serialize, Default)]
pub struct ConfigCheck {
    /// What was compared.
    pub scope: String,
    pub missing: Vec<String>,
    pub unexpected: Vec<String>,
    /// `tensor: expected .., got ..` lines.
    pub mismatched: Vec<String>,
}

impl ConfigCheck {
    pub fn is_clean(&self) -> bool {
        self.missing.is_empty() && self.unexpected.is_empty() && self.mismatched.is_empty()
    }
}

/// Inspects `path` (safetensors or GGUF), checking it against `config` when given.
pub fn inspect_checkpoint(path: &Path, config: Option<ConfigRef<'_>>) -> Result<CheckpointReport> {
    if crate::gguf_file::is_gguf(path) {
        return inspect_gguf(path, config);
    }
    let file = SafetensorsFile::open(path)?;
    let kind = detect_kind(&file)?;
    let file_size_bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let mut dtypes = BTreeMap::new();
    for info in file.tensors().values() {
        *dtypes.entry(info.dtype.to_string()).or_insert(0) += 1;
    }
    let lm_cfg = match config {
        Some(ConfigRef::Lm(c)) => Some(c),
        _ => None,
    };
    let in_dims = match (kind, lm_cfg) {
        (CheckpointKind::Lm(LmLayout::Mlx), Some(cfg)) => lm_sources(LmLayout::Mlx, cfg)
            .into_iter()
            .filter(|s| s.canonical.shape.len() == 2)
            .map(|s| (s.stored_name, s.canonical.shape[1]))
            .collect(),
        _ => BTreeMap::new(),
    };
    let mut quant: BTreeMap<(u32, usize), usize> = BTreeMap::new();
    let mut notes = Vec::new();
    let mut parameter_count = 0u64;
    for (name, info) in file.tensors() {
        let prefix = name.strip_suffix(".weight");
        if let Some(prefix) = prefix.filter(|p| info.dtype == DType::U32 && is_packed(&file, p)) {
            // The file's own unquantized tensors first: a config that does not fit must not hide the bits.
            let in_dim = infer_in_dim(&file, prefix).or_else(|| in_dims.get(name).copied());
            let params = (if info.shape.len() == 2 {
                Ok(())
            } else {
                Err(format!(
                    "`.weight` has shape {:?}, expected [rows, packed columns]",
                    info.shape
                ))
            })
            .and_then(|()| in_dim.ok_or_else(|| "cannot tell its input width".to_string()))
            .and_then(|d| {
                let scales = file
                    .info(&format!("{prefix}.scales"))
                    .map_err(|e| e.to_string())?;
                quant_params_from_shapes(
                    info.shape[1],
                    scales.shape.get(1).copied().unwrap_or(0),
                    d,
                )
                .map(|p| (p, d))
            });
            match params {
                Ok((p, d)) => {
                    *quant.entry((p.bits, p.group_size)).or_insert(0) += 1;
                    parameter_count += (info.shape[0] * d) as u64;
                }
                Err(e) => notes.push(format!("{prefix}: {e}")),
            }
        } else if !(name.ends_with(".scales") || name.ends_with(".biases"))
            || !prefix_packed(&file, name)
        {
            parameter_count += info.numel() as u64;
        }
    }
    let quantization = quant
        .into_iter()
        .map(|((bits, group_size), matrices)| QuantSummary {
            bits,
            group_size,
            matrices,
        })
        .collect();
    let config_check = match (kind, config) {
        (CheckpointKind::Lm(layout), Some(ConfigRef::Lm(cfg))) => {
            Some(check_lm(&file, layout, cfg))
        }
        (CheckpointKind::Mimi, Some(ConfigRef::Mimi(cfg))) => Some(check_mimi(&file, cfg)),
        (_, Some(_)) => Some(ConfigCheck {
            scope: "kind of model".into(),
            mismatched: vec![format!(
                "the config is for the other kind of model than this {} checkpoint",
                kind.as_str()
            )],
            ..Default::default()
        }),
        (_, None) => None,
    };
    Ok(CheckpointReport {
        path: path.to_path_buf(),
        format: kind.as_str().to_string(),
        file_size_bytes,
        tensor_count: file.tensors().len(),
        dtypes,
        quantization,
        parameter_count,
        notes,
        config_check,
    })
}

/// [`inspect_checkpoint`] for a GGUF file: ggml types, q8_0 matrices (8 bits, groups of 32),
/// names and shapes against an LM config.
fn inspect_gguf(path: &Path, config: Option<ConfigRef<'_>>) -> Result<CheckpointReport> {
    let file = GgufFile::open(path)?;
    let kind = detect_gguf_kind(&file)?;
    let mut dtypes = BTreeMap::new();
    for info in file.tensors().values() {
        *dtypes
            .entry(info.ggml_type.as_str().to_string())
            .or_insert(0) += 1;
    }
    let q8_0 = dtypes.get(GgmlType::Q8_0.as_str()).copied().unwrap_or(0);
    let quantization = (q8_0 > 0)
        .then_some(QuantSummary {
            bits: 8,
            group_size: Q8_0_BLOCK,
            matrices: q8_0,
        })
        .into_iter()
        .collect();
    let config_check = match (kind, config) {
        (CheckpointKind::Lm(layout), Some(ConfigRef::Lm(cfg))) => {
            let shapes = file
                .tensors()
                .iter()
                .map(|(n, t)| (n.clone(), t.shape.clone()));
            Some(check_dense_lm(&shapes.collect(), layout, cfg))
        }
        (_, Some(_)) => Some(ConfigCheck {
            scope: "kind of model".into(),
            mismatched: vec![format!(
                "moshi-rs reads GGUF LM checkpoints only; this one is a {} checkpoint",
                kind.as_str()
            )],
            ..Default::default()
        }),
        (_, None) => None,
    };
    Ok(CheckpointReport {
        path: path.to_path_buf(),
        format: format!("{} (GGUF v{})", kind.as_str(), file.version()),
        file_size_bytes: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
        tensor_count: file.tensors().len(),
        dtypes,
        quantization,
        parameter_count: file.tensors().values().map(|t| t.numel() as u64).sum(),
        notes: Vec::new(),
        config_check,
    })
}

/// Names and shapes of a checkpoint with no packed MLX matrices against the LM tensors of `cfg`.
fn check_dense_lm(
    shapes: &BTreeMap<String, Vec<usize>>,
    layout: LmLayout,
    cfg: &LmConfig,
) -> ConfigCheck {
    let specs = lm_sources(layout, cfg);
    let mut check = ConfigCheck {
        scope: format!("names and shapes of all {} LM tensors", specs.len()),
        ..Default::default()
    };
    for spec in &specs {
        match shapes.get(&spec.stored_name) {
            None => check.missing.push(spec.stored_name.clone()),
            Some(shape) if *shape != spec.stored_shape => check.mismatched.push(format!(
                "{}: expected {:?}, got {shape:?}",
                spec.stored_name, spec.stored_shape
            )),
            Some(_) => {}
        }
    }
    let expected: BTreeSet<&str> = specs.iter().map(|s| s.stored_name.as_str()).collect();
    check.unexpected = shapes
        .keys()
        .filter(|n| !expected.contains(n.as_str()))
        .cloned()
        .collect();
    check
}

/// `x.scales` / `x.biases` of a packed `x.weight`.
fn prefix_packed(file: &SafetensorsFile, name: &str) -> bool {
    let prefix = name.rsplit_once('.').map(|(p, _)| p).unwrap_or(name);
    is_packed(file, prefix)
}

fn check_lm(file: &SafetensorsFile, layout: LmLayout, cfg: &LmConfig) -> ConfigCheck {
    let specs = lm_sources(layout, cfg);
    let mut check = ConfigCheck {
        scope: format!("names and shapes of all {} LM tensors", specs.len()),
        ..Default::default()
    };
    let mut expected = BTreeSet::new();
    for spec in specs {
        let name = &spec.stored_name;
        expected.insert(name.clone());
        let Some(info) = file.tensors().get(name) else {
            check.missing.push(name.clone());
            continue;
        };
        let prefix = name
            .strip_suffix(".weight")
            .filter(|p| layout == LmLayout::Mlx && is_packed(file, p));
        if let Some(prefix) = prefix {
            expected.insert(format!("{prefix}.scales"));
            expected.insert(format!("{prefix}.biases"));
            match file_logical_shape(file, prefix) {
                Some((shape, _)) if shape == spec.canonical.shape => {}
                Some((shape, p)) => check.mismatched.push(format!(
                    "{prefix}: expected {:?}, got {shape:?} ({}-bit, group size {})",
                    spec.canonical.shape, p.bits, p.group_size
                )),
                None => check.mismatched.push(format!(
                    "{prefix}: packed shapes give no valid bits/group size"
                )),
            }
        } else if info.shape != spec.stored_shape {
            check.mismatched.push(format!(
                "{name}: expected {:?}, got {:?}",
                spec.stored_shape, info.shape
            ));
        }
    }
    check.unexpected = file
        .tensors()
        .keys()
        .filter(|n| !expected.contains(*n))
        .cloned()
        .collect();
    check
}

/// Mimi checks that need no model code: codebook and transformer layer counts.
fn check_mimi(file: &SafetensorsFile, cfg: &MimiConfig) -> ConfigCheck {
    let mut check = ConfigCheck {
        scope: "codebook count, transformer layers and width".into(),
        ..Default::default()
    };
    let count = |prefix: &str| -> usize {
        file.tensors()
            .keys()
            .filter_map(|n| {
                n.strip_prefix(prefix)?
                    .split('.')
                    .next()?
                    .parse::<usize>()
                    .ok()
            })
            .collect::<BTreeSet<_>>()
            .len()
    };
    let codebooks =
        count("quantizer.rvq_first.vq.layers.") + count("quantizer.rvq_rest.vq.layers.");
    if codebooks != cfg.quantizer.n_q {
        check.mismatched.push(format!(
            "quantizer codebooks: expected {} (quantizer.n_q), got {codebooks}",
            cfg.quantizer.n_q
        ));
    }
    for part in ["encoder_transformer", "decoder_transformer"] {
        let layers = count(&format!("{part}.transformer.layers."));
        if layers != cfg.transformer.num_layers {
            check.mismatched.push(format!(
                "{part} layers: expected {} (transformer.num_layers), got {layers}",
                cfg.transformer.num_layers
            ));
        }
    }
    let dim = cfg.transformer.d_model;
    let name = "encoder_transformer.transformer.layers.0.self_attn.in_proj_weight";
    match file.tensors().get(name) {
        Some(i) if i.shape != [3 * dim, dim] => check.mismatched.push(format!(
            "{name}: expected {:?}, got {:?}",
            [3 * dim, dim],
            i.shape
        )),
        Some(_) => {}
        None => check.missing.push(name.into()),
    }
    check
}
