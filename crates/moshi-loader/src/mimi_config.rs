//! Mimi's config in Kyutai's `mimi_config.json` format (the dict of `loaders._mimi_config`),
//! typed and validated once at load like the LM's (see [`crate::config::limits`]).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::limits::*;
use crate::config::{Gating, NormKind, PositionalEmbedding};
use crate::config_check::{config_from_file, config_from_json, ConfigChecker, ValidatedConfig};
use crate::Result;

/// The real Mimi config shipped in the repo, embedded.
pub const MIMI_V0_1_JSON: &str = include_str!("../../../configs/mimi-v0_1.json");

/// SEANet `activation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SeanetActivation {
    /// ELU with alpha 1.
    #[serde(rename = "ELU")]
    Elu,
}

/// SEANet `pad_mode` of the causal convolutions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PadMode {
    /// Zero padding on the left.
    Constant,
}

/// SEANet `norm` of the convolutions' weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConvNorm {
    /// Plain weights (weight norm already folded, as in the release checkpoint).
    #[default]
    #[serde(alias = "")]
    None,
}

/// SEANet part of the Mimi config.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SeanetConfig {
    pub channels: usize,
    pub dimension: usize,
    pub causal: bool,
    pub n_filters: usize,
    pub n_residual_layers: usize,
    pub activation: SeanetActivation,
    pub compress: usize,
    pub dilation_base: usize,
    #[serde(default)]
    pub disable_norm_outer_blocks: usize,
    pub kernel_size: usize,
    pub residual_kernel_size: usize,
    pub last_kernel_size: usize,
    #[serde(default)]
    pub norm: ConvNorm,
    pub pad_mode: PadMode,
    pub ratios: Vec<usize>,
    pub true_skip: bool,
}

impl SeanetConfig {
    /// Input samples per latent step: the product of `ratios` (960 for Mimi).
    pub fn hop_samples(&self) -> usize {
        self.ratios
            .iter()
            .fold(1usize, |acc, &r| acc.saturating_mul(r))
    }
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
    pub gating: Gating,
    pub norm: NormKind,
    pub positional_embedding: PositionalEmbedding,
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
    /// Keys this engine does not know; kept and reported, never fatal.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

impl MimiConfig {
    /// Samples per codec frame (1920 at 24 kHz / 12.5 Hz).
    pub fn frame_size_samples(&self) -> usize {
        (self.sample_rate as f64 / self.frame_rate).round() as usize
    }

    /// Parses and validates a config; `origin` names the file in errors.
    pub fn from_json_str(text: &str, origin: &Path) -> Result<Self> {
        config_from_json(text, origin)
    }

    /// Reads (at most [`crate::MAX_CONFIG_BYTES`]) and validates a `mimi_config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        config_from_file(path.as_ref())
    }

    /// The real Mimi (`tokenizer-e351c8d8-checkpoint125.safetensors`) config.
    pub fn v0_1() -> Self {
        Self::from_json_str(MIMI_V0_1_JSON, Path::new("<built-in mimi-v0_1>"))
            .expect("built-in config is valid")
    }

    /// Checks every size against [`crate::config::limits`] and what this engine implements
    /// (mono, causal SEANet with ELU and identity skips, a causal RoPE transformer without
    /// gating or projections), before anything is allocated. Errors name `origin` and the key.
    pub fn validate(&self, origin: &Path) -> Result<()> {
        let c = ConfigChecker::new(origin);
        c.count("sample_rate", self.sample_rate, 1, MAX_SAMPLE_RATE_HZ)?;
        c.real("frame_rate", self.frame_rate, 0.01, self.sample_rate as f64)?;
        let frame = self.frame_size_samples();
        c.ensure((1..=MAX_FRAME_SAMPLES).contains(&frame), || {
            format!(
                "sample_rate {} / frame_rate {} gives frames of {frame} samples, expected 1 to {MAX_FRAME_SAMPLES}",
                self.sample_rate, self.frame_rate
            )
        })?;
        if self.channels != 1 {
            return Err(c.unsupported("channels", self.channels.to_string(), "mono: 1"));
        }
        self.validate_seanet(&c.nested("seanet."))?;
        let hop = self.seanet.hop_samples();
        c.ensure(frame.is_multiple_of(hop), || {
            format!(
                "a frame of {frame} samples (sample_rate / frame_rate) is not a whole number of \
                 SEANet hops of {hop} samples (the product of seanet.ratios {:?})",
                self.seanet.ratios
            )
        })?;
        let dim = self.seanet.dimension;
        c.ensure(
            self.transformer.d_model == dim
                && self.quantizer.input_dimension == dim
                && self.quantizer.output_dimension == dim,
            || {
                format!(
                    "seanet.dimension {dim} must equal transformer.d_model {} and \
                     quantizer.input_dimension / output_dimension {} / {}",
                    self.transformer.d_model,
                    self.quantizer.input_dimension,
                    self.quantizer.output_dimension
                )
            },
        )?;
        self.validate_quantizer(&c.nested("quantizer."))?;
        self.validate_transformer(&c.nested("transformer."))
    }

    fn validate_seanet(&self, c: &ConfigChecker) -> Result<()> {
        let s = &self.seanet;
        if s.channels != 1 {
            return Err(c.unsupported("channels", s.channels.to_string(), "mono: 1"));
        }
        for (key, ok) in [("causal", s.causal), ("true_skip", s.true_skip)] {
            if !ok {
                return Err(c.unsupported(key, "false".into(), "true"));
            }
        }
        c.count("dimension", s.dimension, 1, MAX_WIDTH)?;
        c.count("n_filters", s.n_filters, 1, MAX_WIDTH)?;
        c.count(
            "n_residual_layers",
            s.n_residual_layers,
            0,
            MAX_RESIDUAL_LAYERS,
        )?;
        c.count("dilation_base", s.dilation_base, 1, MAX_DILATION_BASE)?;
        c.count("compress", s.compress, 1, s.n_filters)?;
        for (key, k) in [
            ("kernel_size", s.kernel_size),
            ("residual_kernel_size", s.residual_kernel_size),
            ("last_kernel_size", s.last_kernel_size),
        ] {
            c.count(key, k, 1, MAX_KERNEL_SIZE)?;
        }
        c.count("ratios (their count)", s.ratios.len(), 1, MAX_SEANET_STAGES)?;
        for (i, &r) in s.ratios.iter().enumerate() {
            c.count(&format!("ratios[{i}]"), r, 1, MAX_SEANET_RATIO)?;
        }
        c.product(
            "the widest SEANet layer (n_filters x 2^len(ratios) channels)",
            &[s.n_filters as u64, 1u64 << s.ratios.len()],
            MAX_WIDTH as u64 * 4,
        )?;
        let dilations = s.n_residual_layers.saturating_sub(1) as u32;
        c.product(
            "the reach of the most dilated residual convolution \
             ((residual_kernel_size - 1) x dilation_base^(n_residual_layers - 1))",
            &[
                s.residual_kernel_size as u64 - 1,
                (s.dilation_base as u64).pow(dilations),
            ],
            MAX_CONV_REACH,
        )?;
        c.product(
            "the SEANet hop (the product of ratios, samples)",
            &s.ratios.iter().map(|&r| r as u64).collect::<Vec<_>>(),
            MAX_FRAME_SAMPLES as u64,
        )?;
        Ok(())
    }

    fn validate_quantizer(&self, c: &ConfigChecker) -> Result<()> {
        let q = &self.quantizer;
        c.count("dimension", q.dimension, 1, MAX_WIDTH)?;
        c.count("n_q", q.n_q, 1, MAX_CODEBOOKS)?;
        c.count("bins", q.bins, 1, MAX_CARD)?;
        Ok(())
    }

    fn validate_transformer(&self, c: &ConfigChecker) -> Result<()> {
        let t = &self.transformer;
        for (key, ok) in [("causal", t.causal), ("conv_layout", t.conv_layout)] {
            if !ok {
                return Err(c.unsupported(key, "false".into(), "true"));
            }
        }
        if t.gating != Gating::None {
            return Err(c.unsupported(
                "gating",
                "silu".into(),
                "Mimi's transformer has a plain GELU feed-forward: none",
            ));
        }
        if t.norm != NormKind::LayerNorm {
            return Err(c.unsupported("norm", t.norm.name().into(), "layer_norm"));
        }
        if t.positional_embedding != PositionalEmbedding::Rope {
            return Err(c.unsupported(
                "positional_embedding",
                t.positional_embedding.name().into(),
                "rope",
            ));
        }
        c.count("num_heads", t.num_heads, 1, MAX_HEADS)?;
        c.count("num_layers", t.num_layers, 0, MAX_LAYERS)?;
        c.count("context", t.context, 1, MAX_CONTEXT_STEPS)?;
        c.count("dim_feedforward", t.dim_feedforward, 1, MAX_FEEDFORWARD)?;
        c.real("max_period", t.max_period, 1.0, MAX_ROPE_PERIOD)?;
        if let Some(scale) = t.layer_scale {
            c.real("layer_scale", scale, -1e6, 1e6)?;
        }
        c.ensure(
            t.d_model.is_multiple_of(t.num_heads) && (t.d_model / t.num_heads).is_multiple_of(2),
            || {
                format!(
                    "transformer.d_model {} is not a multiple of 2 x transformer.num_heads {} \
                     (RoPE needs an even head dimension)",
                    t.d_model, t.num_heads
                )
            },
        )?;
        c.ensure(
            t.input_dimension == t.d_model && t.output_dimensions == [t.d_model],
            || {
                format!(
                    "input/output projections are not supported: transformer.input_dimension {} \
                     and transformer.output_dimensions {:?} must be d_model {} and [{}]",
                    t.input_dimension, t.output_dimensions, t.d_model, t.d_model
                )
            },
        )?;
        // Encoder and decoder transformers each hold a [context][d_model] ring of keys and
        // values per layer.
        c.product(
            "the KV rings of both transformers (2 x num_layers x context x d_model x 2 x 4 bytes)",
            &[
                2,
                t.num_layers as u64,
                t.context as u64,
                t.d_model as u64,
                8,
            ],
            MAX_KV_CACHE_BYTES,
        )?;
        Ok(())
    }
}

impl ValidatedConfig for MimiConfig {
    fn check(&self, origin: &Path) -> Result<()> {
        self.validate(origin)
    }
}
