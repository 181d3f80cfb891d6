//! The weight formats `moshi-rs bench` measures (`--quant bf16|q8|q4`) and how a loaded
//! checkpoint's storage is recognised.

use moshi_loader::{WeightData, WeightMap};
use moshi_model::lm::RandomWeightKind;

/// How the benchmarked LM stores its weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// bf16 weights, upcast to f32 at use (the PyTorch / candle releases).
    Bf16,
    /// MLX affine 8-bit, group size 64 (Kyutai's `model.q8.safetensors`).
    Q8,
    /// MLX affine 4-bit, group size 32 (Kyutai's `model.q4.safetensors`).
    Q4,
}

impl WeightFormat {
    /// `bf16`, `q8` or `q4` (command line and reports).
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::Bf16 => "bf16",
            WeightFormat::Q8 => "q8",
            WeightFormat::Q4 => "q4",
        }
    }

    /// Random weights in this format, packed directly (no f32 copy of large tensors).
    pub fn random_kind(self) -> RandomWeightKind {
        match self {
            WeightFormat::Bf16 => RandomWeightKind::BF16,
            WeightFormat::Q8 => RandomWeightKind::Quantized {
                bits: 8,
                group_size: 64,
            },
            WeightFormat::Q4 => RandomWeightKind::Quantized {
                bits: 4,
                group_size: 32,
            },
        }
    }

    /// Conventional file name of this format in a Kyutai checkpoint folder (bf16: the config's
    /// `moshi_name`, usually `model.safetensors`).
    pub fn conventional_file_name(self) -> Option<&'static str> {
        match self {
            WeightFormat::Bf16 => None,
            WeightFormat::Q8 => Some("model.q8.safetensors"),
            WeightFormat::Q4 => Some("model.q4.safetensors"),
        }
    }
}

/// Storage of a loaded LM's linear layers, as found in its weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoredFormat {
    F32,
    Bf16,
    Packed { bits: u32, group_size: usize },
}

impl StoredFormat {
    /// Human-readable (`f32`, `bf16`, `4-bit group 32`).
    pub fn describe(self) -> String {
        match self {
            StoredFormat::F32 => "f32".into(),
            StoredFormat::Bf16 => "bf16".into(),
            StoredFormat::Packed { bits, group_size } => format!("{bits}-bit group {group_size}"),
        }
    }

    /// Whether this storage is what `format` benchmarks (any group size counts for q4/q8).
    pub fn provides(self, format: WeightFormat) -> bool {
        matches!(
            (self, format),
            (StoredFormat::Bf16, WeightFormat::Bf16)
                | (StoredFormat::Packed { bits: 8, .. }, WeightFormat::Q8)
                | (StoredFormat::Packed { bits: 4, .. }, WeightFormat::Q4)
        )
    }
}

/// The storage of the first temporal layer's attention input projection (`None` if absent).
pub fn stored_format(weights: &WeightMap) -> Option<StoredFormat> {
    let w = weights.get("transformer.layers.0.self_attn.in_proj")?;
    Some(match &w.data {
        WeightData::F32(_) => StoredFormat::F32,
        WeightData::BF16(_) => StoredFormat::Bf16,
        WeightData::Quantized(q) => StoredFormat::Packed {
            bits: q.bits(),
            group_size: q.group_size(),
        },
    })
}
