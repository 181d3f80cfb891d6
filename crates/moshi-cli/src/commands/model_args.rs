//! Command-line options shared by `file` and `chat`: where the model comes from, and sampling.

use std::path::PathBuf;

use anyhow::Context;
use moshi_loader::{ModelSource, ResolvedModel, SourceOverrides, WeightMode};
use moshi_model::generator::SamplingConfig;
use moshi_runtime::pipeline::MoshiPipeline;

/// The official Kyutai repo best suited to a CPU: 4-bit MLX weights (smallest, fastest to read).
pub const DEFAULT_MODEL_REPO: &str = "kyutai/moshiko-mlx-q4";

/// Where the model comes from.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// Model folder (Kyutai repo layout) or Hugging Face repo id. Default: kyutai/moshiko-mlx-q4.
    /// `assets/tiny-a` is a bundled tiny model with RANDOM weights, for testing the pipeline offline.
    #[arg(long, value_name = "DIR|REPO")]
    pub model: Option<String>,
    /// LM weights file (overrides the one found in --model).
    #[arg(long, value_name = "FILE")]
    pub weights: Option<PathBuf>,
    /// Mimi weights file.
    #[arg(long, value_name = "FILE")]
    pub mimi: Option<PathBuf>,
    /// Text tokenizer (SentencePiece .model).
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// LM config (Kyutai config.json).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// Sampling options (defaults: the official ones).
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Audio sampling temperature.
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    /// Text sampling temperature.
    #[arg(long, default_value_t = 0.7)]
    pub temp_text: f32,
    /// Audio top-k.
    #[arg(long, default_value_t = 250)]
    pub top_k: usize,
    /// Text top-k.
    #[arg(long, default_value_t = 25)]
    pub top_k_text: usize,
    /// Random seed.
    #[arg(long, default_value_t = 4242)]
    pub seed: u64,
    /// Argmax everywhere (deterministic, ignores temperatures and seed).
    #[arg(long)]
    pub greedy: bool,
}

impl SamplingArgs {
    pub fn config(&self) -> SamplingConfig {
        SamplingConfig {
            temp_text: self.temp_text,
            top_k_text: self.top_k_text,
            temp_audio: self.temp,
            top_k_audio: self.top_k,
            seed: self.seed,
            greedy: self.greedy,
        }
    }
}

impl ModelArgs {
    /// Finds every file of the model. A failure on the default repo says how to run offline.
    pub fn resolve(&self) -> anyhow::Result<ResolvedModel> {
        let overrides = SourceOverrides {
            lm_config: self.config.clone(),
            lm_weights: self.weights.clone(),
            mimi_config: None,
            mimi_weights: self.mimi.clone(),
            tokenizer: self.tokenizer.clone(),
            variant: None,
            hub: None,
        };
        for (flag, path) in [("--weights", &self.weights), ("--mimi", &self.mimi), ("--tokenizer", &self.tokenizer), ("--config", &self.config)] {
            if let Some(p) = path {
                anyhow::ensure!(p.is_file(), "{flag} {}: no such file", p.display());
            }
        }
        match &self.model {
            Some(spec) => ModelSource::resolve(spec, &overrides).with_context(|| format!("resolving the model {spec}")),
            None => ModelSource::resolve(DEFAULT_MODEL_REPO, &overrides).with_context(|| {
                format!(
                    "the default model {DEFAULT_MODEL_REPO} is not in the local Hugging Face cache and could not be downloaded; \
                     to run on a local folder pass --model DIR (a folder laid out like a Kyutai repo: config.json, \
                     model*.safetensors, the Mimi .safetensors and the tokenizer .model), e.g. \
                     `--model assets/tiny-a` for the bundled random-weight test model"
                )
            }),
        }
    }

    /// Resolves and loads the whole pipeline.
    pub fn load_pipeline(&self, sampling: SamplingConfig) -> anyhow::Result<(ResolvedModel, MoshiPipeline)> {
        let model = self.resolve()?;
        let pipeline = MoshiPipeline::load(&model, sampling, WeightMode::Native)
            .with_context(|| format!("loading the model from {}", model.lm_weights_path.display()))?;
        Ok((model, pipeline))
    }
}
