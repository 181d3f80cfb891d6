//! Command-line options shared by `file` and `chat`: where the model comes from, and sampling.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use moshi_kernels::ActivationPrecision;
use moshi_loader::input_file::{check_input_file, InputKind};
use moshi_loader::{LmConfig, ModelSource, ResolvedModel, SourceOverrides, WeightMode};
use moshi_model::generator::SamplingConfig;
use moshi_model::mimi::MimiWeights;
use moshi_model::nn::KvPrecision;
use moshi_runtime::pipeline::{MoshiModel, MoshiPipeline, SessionSettings};

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
    /// Dequantize a packed q4/q8 checkpoint to f32 at load (more memory; f32 matmuls).
    #[arg(long, conflicts_with = "quantize")]
    pub dequantize: bool,
    /// Quantize a dense (bf16/f32) checkpoint at load, exactly as MLX's `nn.quantize`:
    /// q4 (4-bit, group 32) or q8 (8-bit, group 64), as in the Kyutai MLX releases, or q4g64
    /// (4-bit, group 64: MLX's default, 4.5 bits per weight instead of 5). A packed checkpoint
    /// must already be that format.
    #[arg(long, value_enum, value_name = "q4|q8|q4g64")]
    pub quantize: Option<QuantizeLevel>,
    /// Mimi weight precision of the per-frame (memory-bound) products: f32 (exact, default),
    /// bf16 or q8 (MLX 8-bit affine, group 64), their activations f32. With q8, convolutions of
    /// many rows round their weights and activations to bf16 on CPUs with AVX512-BF16, and the
    /// transformers' activations take the quantized products' precision on AVX-512 VNNI.
    #[arg(long, value_name = "f32|bf16|q8", default_value_t = MimiWeights::F32)]
    pub mimi_weights: MimiWeights,
    /// Element type of the LM's temporal KV caches: f32 (exact), bf16 (rounded to nearest
    /// even: half the memory, and half the bytes read per frame late in a conversation, when a
    /// full 3000-position window is about as large as the q4 weights) or i8 (8-bit codes, one
    /// scale per head of a position: about a quarter; an approximation of its own, see
    /// docs/performance.md). Default: bf16 for the live commands (chat, serve), as Kyutai's own
    /// runtimes do; f32 for file.
    #[arg(long, value_name = "f32|bf16|i8")]
    pub kv_cache: Option<KvPrecision>,
    /// How the LM's q4/q8 products hold their activations: exact, i16 (rounded per quantization
    /// group to 16 bits: two byte dot products per code vector instead of three) or i8 (to 8
    /// bits: one). Default: i16 for the live commands (chat, serve), whose greedy tokens it
    /// leaves equal to exact on every reference fixture; exact for file, transcribe and speak
    /// (docs/performance.md, "Rounded activations", says why).
    #[arg(long, value_name = "exact|i16|i8")]
    pub activations: Option<ActivationPrecision>,
}

/// What a command runs with unless its flags say otherwise.
#[derive(Clone, Copy, Debug)]
pub struct CommandDefaults {
    /// `--kv-cache`.
    pub kv_cache: KvPrecision,
    /// `--activations`.
    pub activations: ActivationPrecision,
}

/// The live commands' (`chat`, `serve`) defaults: bf16 KV caches, 16-bit activations (the
/// accuracy contract of issue #40: greedy tokens equal to exact on every fixture, logit error far
/// below the 4-bit weights' own; docs/performance.md, "Rounded activations").
pub const LIVE_DEFAULTS: CommandDefaults = CommandDefaults {
    kv_cache: KvPrecision::Bf16,
    activations: ActivationPrecision::Int16,
};
/// `file`'s defaults (and `transcribe`'s): exact KV caches and activations.
pub const FILE_DEFAULTS: CommandDefaults = CommandDefaults {
    kv_cache: KvPrecision::F32,
    activations: ActivationPrecision::Exact,
};

/// `--quantize`: MLX affine quantization, with the group size of the Kyutai MLX releases (`q4`,
/// `q8`) or MLX's default group size (`q4g64`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantizeLevel {
    Q4,
    Q8,
    Q4g64,
}

impl QuantizeLevel {
    pub fn bits(self) -> u32 {
        match self {
            QuantizeLevel::Q4 | QuantizeLevel::Q4g64 => 4,
            QuantizeLevel::Q8 => 8,
        }
    }

    pub fn group_size(self) -> usize {
        match self {
            QuantizeLevel::Q4g64 => 64,
            QuantizeLevel::Q4 | QuantizeLevel::Q8 => WeightMode::default_group_size(self.bits()),
        }
    }

    /// The flag's value, as typed.
    pub fn name(self) -> &'static str {
        match self {
            QuantizeLevel::Q4 => "q4",
            QuantizeLevel::Q8 => "q8",
            QuantizeLevel::Q4g64 => "q4g64",
        }
    }
}

/// Sampling options. Each one left out takes the model config's `lm_gen_config` value (as
/// Kyutai's `run_inference.py` and `moshi.server` do), else the official `LMGen` default.
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Audio sampling temperature (finite, >= 0; 0 picks the most probable code). Default: the
    /// config's `lm_gen_config.temp`, else 0.8.
    #[arg(
        long,
        allow_negative_numbers = true,
        value_parser = super::flag_values::temperature
    )]
    pub temp: Option<f32>,
    /// Text sampling temperature (finite, >= 0; 0 picks the most probable token). Default: the
    /// config's `lm_gen_config.temp_text`, else 0.7.
    #[arg(
        long,
        allow_negative_numbers = true,
        value_parser = super::flag_values::temperature
    )]
    pub temp_text: Option<f32>,
    /// Audio top-k. Default: the config's `lm_gen_config.top_k`, else 250.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Text top-k. Default: the config's `lm_gen_config.top_k_text`, else 25.
    #[arg(long)]
    pub top_k_text: Option<usize>,
    /// Random seed.
    #[arg(long, default_value_t = 4242)]
    pub seed: u64,
    /// Argmax everywhere (deterministic, ignores temperatures and seed). Also the default when
    /// the config's `lm_gen_config.use_sampling` is false.
    #[arg(long)]
    pub greedy: bool,
    /// Classifier-free guidance of a conditioned model (Hibiki): logits mixed as
    /// `null + (cond - null) * COEF` between rows conditioned on `very_good` and `very_bad`.
    /// 1 = no guidance (one row). Default: the config's `lm_gen_config.cfg_coef`, else 1
    /// (Kyutai's default; 3 is Kyutai's usual value for Hibiki).
    #[arg(long, value_name = "COEF", value_parser = super::flag_values::cfg_coef)]
    pub cfg_coef: Option<f32>,
}

impl SamplingArgs {
    /// The sampling flags given on the command line (the seed and `--greedy` aside), by name.
    pub fn given(&self) -> Vec<&'static str> {
        let flags = [
            ("--temp", self.temp.is_some()),
            ("--temp-text", self.temp_text.is_some()),
            ("--top-k", self.top_k.is_some()),
            ("--top-k-text", self.top_k_text.is_some()),
            ("--cfg-coef", self.cfg_coef.is_some()),
        ];
        flags
            .into_iter()
            .filter(|(_, on)| *on)
            .map(|(f, _)| f)
            .collect()
    }

    /// The sampling in force for a model whose config is `lm`: each flag given, else the
    /// config's `lm_gen_config` value, else the built-in (official) default.
    pub fn config(&self, lm: &LmConfig) -> SamplingConfig {
        let from_config = lm.lm_gen_sampling();
        let builtin = SamplingConfig::default();
        SamplingConfig {
            temp_text: self
                .temp_text
                .or(from_config.temp_text)
                .unwrap_or(builtin.temp_text),
            top_k_text: self
                .top_k_text
                .or(from_config.top_k_text)
                .unwrap_or(builtin.top_k_text),
            temp_audio: self
                .temp
                .or(from_config.temp_audio)
                .unwrap_or(builtin.temp_audio),
            top_k_audio: self
                .top_k
                .or(from_config.top_k_audio)
                .unwrap_or(builtin.top_k_audio),
            seed: self.seed,
            greedy: self.greedy || from_config.use_sampling == Some(false),
        }
    }
}

impl ModelArgs {
    /// Finds every file of the model. A failure on the default repo says how to run offline.
    pub fn resolve(&self) -> anyhow::Result<ResolvedModel> {
        self.resolve_or(DEFAULT_MODEL_REPO, "assets/tiny-a")
    }

    /// [`Self::resolve`] with another default repo (`transcribe`: a speech-to-text model) and
    /// bundled test model named in the offline hint.
    pub fn resolve_or(&self, default_repo: &str, tiny: &str) -> anyhow::Result<ResolvedModel> {
        let overrides = SourceOverrides {
            lm_config: self.config.clone(),
            lm_weights: self.weights.clone(),
            mimi_config: None,
            mimi_weights: self.mimi.clone(),
            tokenizer: self.tokenizer.clone(),
            variant: None,
            hub: None,
        };
        for (flag, path, kind) in [
            ("--weights", &self.weights, InputKind::RegularFile),
            ("--mimi", &self.mimi, InputKind::RegularFile),
            ("--tokenizer", &self.tokenizer, InputKind::Readable),
            ("--config", &self.config, InputKind::Readable),
        ] {
            if let Some(p) = path {
                check_input_file(p, kind).with_context(|| flag.to_string())?;
            }
        }
        match &self.model {
            Some(spec) => ModelSource::resolve(spec, &overrides).with_context(|| format!("resolving the model {spec}")),
            None => ModelSource::resolve(default_repo, &overrides).with_context(|| {
                format!(
                    "the default model {default_repo} is not in the local Hugging Face cache and could not be downloaded; \
                     to run on a local folder pass --model DIR (a folder laid out like a Kyutai repo: config.json, \
                     model*.safetensors, the Mimi .safetensors and the tokenizer .model), e.g. \
                     `--model {tiny}` for the bundled random-weight test model"
                )
            }),
        }
    }

    /// How the LM weights are handed to the model (`--dequantize`, `--quantize`, else as stored).
    pub fn weight_mode(&self) -> anyhow::Result<WeightMode> {
        match (self.dequantize, self.quantize) {
            (true, Some(q)) => anyhow::bail!(
                "--dequantize and --quantize {} contradict each other: pick one (or neither to run the weights as stored)",
                q.name()
            ),
            (true, None) => Ok(WeightMode::DequantizeF32),
            (false, Some(q)) => {
                Ok(WeightMode::Quantize { bits: q.bits(), group_size: q.group_size() })
            }
            (false, None) => Ok(WeightMode::Native),
        }
    }

    /// Loads a resolved text-to-speech model (`speak`, `serve`), its products' activation
    /// precision `--activations` or the command's `defaults`: a model of another type is an
    /// error naming the file.
    pub fn load_text_to_speech(
        &self,
        resolved: &ResolvedModel,
        defaults: CommandDefaults,
    ) -> anyhow::Result<MoshiModel> {
        moshi_kernels::set_activation_precision(self.activations_or(defaults));
        anyhow::ensure!(
            resolved.lm_config.is_text_to_speech(),
            "speak needs a text-to-speech model (`model_type` \"tts\"); {} is not one",
            resolved.lm_weights_path.display(),
        );
        MoshiModel::load(resolved, self.weight_mode()?, self.mimi_weights).with_context(|| {
            format!(
                "loading the model from {}",
                resolved.lm_weights_path.display()
            )
        })
    }

    /// `--kv-cache`, else the command's default.
    pub fn kv_cache_or(&self, defaults: CommandDefaults) -> KvPrecision {
        self.kv_cache.unwrap_or(defaults.kv_cache)
    }

    /// `--activations`, else the command's default.
    pub fn activations_or(&self, defaults: CommandDefaults) -> ActivationPrecision {
        self.activations.unwrap_or(defaults.activations)
    }

    /// The flag checks of [`Self::load_resolved_model`] that need no model.
    fn check_load_flags(&self, sampling: &SamplingArgs) -> anyhow::Result<()> {
        self.weight_mode()?;
        if let Some(c) = sampling.cfg_coef {
            anyhow::ensure!(
                c.is_finite() && c > 0.0,
                "--cfg-coef {c}: expected a positive number (1 = no guidance)"
            );
        }
        Ok(())
    }

    /// Loads a model resolved by [`Self::resolve`], and one session's settings from `sampling`
    /// (guidance included; each one not given on the command line from the config's
    /// `lm_gen_config`) and `--kv-cache` or the command's `default_kv_cache`, and declares the
    /// kernels' workload for up to `sessions` sessions stepped together.
    pub fn load_resolved_model(
        &self,
        resolved: ResolvedModel,
        sampling: &SamplingArgs,
        defaults: CommandDefaults,
        sessions: usize,
    ) -> anyhow::Result<LoadedModel> {
        self.check_load_flags(sampling)?;
        let mode = self.weight_mode()?;
        let model = MoshiModel::load(&resolved, mode, self.mimi_weights).with_context(|| {
            format!(
                "loading the model from {}",
                resolved.lm_weights_path.display()
            )
        })?;
        let settings = SessionSettings {
            sampling: sampling.config(&resolved.lm_config),
            kv_precision: self.kv_cache_or(defaults),
            cfg_coef: sampling.cfg_coef,
        };
        // A session now: settings the model refuses (guidance on a model without
        // conditioners) are an error naming the flag before anything else starts.
        model
            .new_session(&settings)
            .with_context(|| match sampling.cfg_coef {
                Some(c) => format!(
                    "--cfg-coef {c} with the model {}",
                    resolved.lm_weights_path.display()
                ),
                None => format!("a session of {}", resolved.lm_weights_path.display()),
            })?;
        super::declare_workload(sessions * model.rows_per_session(&settings));
        let activations = self.activations_or(defaults);
        moshi_kernels::set_activation_precision(activations);
        tracing::info!("activations of the q4/q8 products: {activations}");
        Ok(LoadedModel {
            resolved,
            model: Arc::new(model),
            settings,
        })
    }
}

/// A loaded model and the settings of its sessions.
pub struct LoadedModel {
    pub resolved: ResolvedModel,
    pub model: Arc<MoshiModel>,
    pub settings: SessionSettings,
}

impl LoadedModel {
    /// The model with one session of `settings`.
    pub fn into_pipeline(self) -> anyhow::Result<(ResolvedModel, MoshiPipeline)> {
        let pipeline = MoshiPipeline::new(self.model, &self.settings)?;
        Ok((self.resolved, pipeline))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sampling: SamplingArgs,
    }

    fn sampling_args(flags: &[&str]) -> SamplingArgs {
        Cli::try_parse_from(std::iter::once("moshi-rs").chain(flags.iter().copied()))
            .unwrap()
            .sampling
    }

    fn config_with_lm_gen(gen: serde_json::Value) -> LmConfig {
        let mut v: serde_json::Value =
            serde_json::from_str(moshi_loader::config::MOSHIKO_7B_JSON).unwrap();
        v["lm_gen_config"] = gen;
        LmConfig::from_json_str(&v.to_string(), std::path::Path::new("config.json")).unwrap()
    }

    /// Issue #41 defect 22: the flag is refused above the config's cap, naming the flag.
    #[test]
    fn cfg_coef_above_the_configs_cap_is_refused() {
        assert_eq!(sampling_args(&["--cfg-coef", "3"]).cfg_coef, Some(3.0));
        let e = Cli::try_parse_from(["moshi-rs", "--cfg-coef", "1001"])
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("--cfg-coef") && e.contains("at most 1000"),
            "{e}"
        );
    }

    #[test]
    fn without_flags_or_lm_gen_config_the_official_defaults_apply() {
        let s = sampling_args(&[]).config(&LmConfig::moshiko_7b());
        assert_eq!(s, SamplingConfig::default());
    }

    #[test]
    fn lm_gen_config_changes_the_defaults_and_flags_override_it() {
        let lm = config_with_lm_gen(serde_json::json!({
            "temp": 0.6, "temp_text": 0.4, "top_k": 100, "top_k_text": 10
        }));
        let s = sampling_args(&[]).config(&lm);
        assert_eq!(
            (
                s.temp_audio,
                s.temp_text,
                s.top_k_audio,
                s.top_k_text,
                s.greedy
            ),
            (0.6, 0.4, 100, 10, false)
        );
        let s = sampling_args(&["--temp", "0.9", "--top-k-text", "3"]).config(&lm);
        assert_eq!(
            (s.temp_audio, s.temp_text, s.top_k_audio, s.top_k_text),
            (0.9, 0.4, 100, 3)
        );
        let greedy = config_with_lm_gen(serde_json::json!({"use_sampling": false}));
        assert!(sampling_args(&[]).config(&greedy).greedy);
        assert!(sampling_args(&["--greedy"]).config(&lm).greedy);
    }
}
