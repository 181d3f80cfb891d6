//! Model configs in Kyutai's `config.json` (LM) and `mimi_config.json` (Mimi) formats.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{LoaderError, Result};

/// The LM hyper-parameters (`loaders._lm_kwargs` keys) plus the repo file names.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LmConfig {
    pub dim: usize,
    pub text_card: usize,
    #[serde(default = "default_pad")]
    pub existing_text_padding_id: u32,
    #[serde(default)]
    pub existing_text_end_padding_id: u32,
    pub n_q: usize,
    pub dep_q: usize,
    pub card: usize,
    pub num_heads: usize,
    pub num_layers: usize,
    pub hidden_scale: f64,
    #[serde(default = "default_true")]
    pub causal: bool,
    #[serde(default)]
    pub layer_scale: Option<f64>,
    pub context: usize,
    #[serde(default = "default_max_period")]
    pub max_period: f64,
    #[serde(default = "default_gating")]
    pub gating: String,
    #[serde(default = "default_norm")]
    pub norm: String,
    #[serde(default = "default_pos_emb")]
    pub positional_embedding: String,
    pub depformer_dim: usize,
    pub depformer_dim_feedforward: usize,
    pub depformer_num_heads: usize,
    pub depformer_num_layers: usize,
    #[serde(default)]
    pub depformer_layer_scale: Option<f64>,
    #[serde(default = "default_true")]
    pub depformer_multi_linear: bool,
    #[serde(default)]
    pub depformer_context: Option<usize>,
    #[serde(default = "default_max_period")]
    pub depformer_max_period: f64,
    #[serde(default = "default_gating")]
    pub depformer_gating: String,
    #[serde(default = "default_dep_pos_emb")]
    pub depformer_pos_emb: String,
    #[serde(default = "default_true")]
    pub depformer_weights_per_step: bool,
    pub delays: Vec<usize>,
    #[serde(default)]
    pub moshi_name: Option<String>,
    #[serde(default)]
    pub mimi_name: Option<String>,
    #[serde(default)]
    pub tokenizer_name: Option<String>,
    #[serde(default)]
    pub mimi_config_name: Option<String>,
    #[serde(default)]
    pub lm_gen_config: Option<serde_json::Value>,
    /// Keys this engine does not know; kept and reported, never fatal.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

fn default_pad() -> u32 {
    3
}
fn default_true() -> bool {
    true
}
fn default_max_period() -> f64 {
    10000.0
}
fn default_gating() -> String {
    "silu".into()
}
fn default_norm() -> String {
    "rms_norm_f32".into()
}
fn default_pos_emb() -> String {
    "rope".into()
}
fn default_dep_pos_emb() -> String {
    "none".into()
}

impl LmConfig {
    /// Hidden width of the temporal SiLU-gated FFN (11264 for the 7B): `2 * int(hidden_scale * dim) / 3`.
    pub fn hidden_dim(&self) -> usize {
        2 * ((self.hidden_scale * self.dim as f64) as usize) / 3
    }
    /// Hidden width of the depformer FFN (2816 for the 7B): `2 * depformer_dim_feedforward / 3`.
    pub fn depformer_hidden_dim(&self) -> usize {
        2 * self.depformer_dim_feedforward / 3
    }
    /// Number of audio codebooks of the user stream (n_q - dep_q).
    pub fn user_codebooks(&self) -> usize {
        self.n_q - self.dep_q
    }
    pub fn max_delay(&self) -> usize {
        self.delays.iter().copied().max().unwrap_or(0)
    }

    /// Parses a config from JSON text; `origin` names the file in errors.
    pub fn from_json_str(text: &str, origin: &Path) -> Result<Self> {
        let cfg: Self = serde_json::from_str(text).map_err(|e| LoaderError::BadConfig {
            path: origin.to_path_buf(),
            reason: e.to_string(),
        })?;
        cfg.validate(origin)?;
        Ok(cfg)
    }

    /// Reads and validates a `config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| LoaderError::io(path, e))?;
        Self::from_json_str(&text, path)
    }

    /// Checks the relations between fields that the model relies on.
    pub fn validate(&self, origin: &Path) -> Result<()> {
        let bad = |reason: String| {
            Err(LoaderError::BadConfig {
                path: origin.to_path_buf(),
                reason,
            })
        };
        if self.delays.len() != self.n_q + 1 {
            return bad(format!(
                "`delays` has {} entries, expected n_q + 1 = {}",
                self.delays.len(),
                self.n_q + 1
            ));
        }
        if self.dep_q > self.n_q {
            return bad(format!(
                "dep_q {} is larger than n_q {}",
                self.dep_q, self.n_q
            ));
        }
        if self.num_heads == 0 || !self.dim.is_multiple_of(self.num_heads) {
            return bad(format!(
                "dim {} is not divisible by num_heads {}",
                self.dim, self.num_heads
            ));
        }
        if self.depformer_num_heads == 0
            || !self.depformer_dim.is_multiple_of(self.depformer_num_heads)
        {
            return bad(format!(
                "depformer_dim {} is not divisible by depformer_num_heads {}",
                self.depformer_dim, self.depformer_num_heads
            ));
        }
        if self.gating != "silu" || self.depformer_gating != "silu" {
            return bad(format!(
                "only silu gating is supported, got {} / {}",
                self.gating, self.depformer_gating
            ));
        }
        if !self.norm.starts_with("rms_norm") {
            return bad(format!(
                "only rms_norm / rms_norm_f32 is supported, got {}",
                self.norm
            ));
        }
        Ok(())
    }

    /// The built-in moshiko/moshika v0.1 7B config (`configs/moshiko-7b.json`).
    pub fn moshiko_7b() -> Self {
        Self::from_json_str(MOSHIKO_7B_JSON, Path::new("<built-in moshiko-7b>"))
            .expect("built-in config is valid")
    }
}

/// The 7B config shipped in the repo, embedded.
pub const MOSHIKO_7B_JSON: &str = include_str!("../../../configs/moshiko-7b.json");
/// The real Mimi config shipped in the repo, embedded.
pub const MIMI_V0_1_JSON: &str = include_str!("../../../configs/mimi-v0_1.json");

/// SEANet part of the Mimi config.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SeanetConfig {
    pub channels: usize,
    pub dimension: usize,
    pub causal: bool,
    pub n_filters: usize,
    pub n_residual_layers: usize,
    pub activation: String,
    pub compress: usize,
    pub dilation_base: usize,
    #[serde(default)]
    pub disable_norm_outer_blocks: usize,
    pub kernel_size: usize,
    pub residual_kernel_size: usize,
    pub last_kernel_size: usize,
    #[serde(default)]
    pub norm: String,
    pub pad_mode: String,
    pub ratios: Vec<usize>,
    pub true_skip: bool,
}

/// Split RVQ part of the Mimi config.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct QuantizerConfig {
    pub dimension: usize,
    pub n_q: usize,
    pub bins: usize,
    pub input_dimension: usize,
    pub output_dimension: usize,
}

/// Transformer part of the Mimi config.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct MimiTransformerConfig {
    pub d_model: usize,
    pub num_heads: usize,
    pub num_layers: usize,
    pub causal: bool,
    pub layer_scale: Option<f64>,
    pub context: usize,
    pub conv_layout: bool,
    pub max_period: f64,
    pub gating: String,
    pub norm: String,
    pub positional_embedding: String,
    pub dim_feedforward: usize,
    pub input_dimension: usize,
    pub output_dimensions: Vec<usize>,
}

/// `mimi_config.json` (same dict shape as `loaders._mimi_config`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct MimiConfig {
    pub sample_rate: usize,
    pub channels: usize,
    pub frame_rate: f64,
    pub seanet: SeanetConfig,
    pub quantizer: QuantizerConfig,
    pub transformer: MimiTransformerConfig,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

impl MimiConfig {
    /// Samples per codec frame (1920 at 24 kHz / 12.5 Hz).
    pub fn frame_size_samples(&self) -> usize {
        (self.sample_rate as f64 / self.frame_rate).round() as usize
    }

    pub fn from_json_str(text: &str, origin: &Path) -> Result<Self> {
        serde_json::from_str(text).map_err(|e| LoaderError::BadConfig {
            path: origin.to_path_buf(),
            reason: e.to_string(),
        })
    }

    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| LoaderError::io(path, e))?;
        Self::from_json_str(&text, path)
    }

    /// The real Mimi (`tokenizer-e351c8d8-checkpoint125.safetensors`) config.
    pub fn v0_1() -> Self {
        Self::from_json_str(MIMI_V0_1_JSON, Path::new("<built-in mimi-v0_1>"))
            .expect("built-in config is valid")
    }
}
