//! The LM config in Kyutai's `config.json` format, typed (enums for the kinds of gating, norm and
//! positional embedding) and validated once at load: every size within this engine's limits
//! ([`limits`]) and every relation the model relies on checked before anything is allocated.
//! Mimi's config is in [`crate::mimi_config`].

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::conditioning::{validate_conditioning, ConditionerConfig, FuserConfig};
use crate::config_check::{config_from_file, config_from_json, ConfigChecker, ValidatedConfig};
pub use crate::mimi_config::{
    ConvNorm, MimiConfig, MimiTransformerConfig, PadMode, QuantizerConfig, SeanetActivation,
    SeanetConfig, MIMI_V0_1_JSON,
};
use crate::Result;

/// The largest values a config may give: generous for any Moshi-family model (the 7B uses a
/// quarter of each or less), small enough that nothing a config asks for can exhaust memory by
/// itself. One place for the numbers the LM and Mimi configs are checked against.
pub mod limits {
    /// Model width (`dim`, `depformer_dim`, Mimi `d_model`, codebook dimension).
    pub const MAX_WIDTH: usize = 16_384;
    /// Feed-forward hidden width.
    pub const MAX_FEEDFORWARD: usize = 1 << 18;
    /// Attention heads.
    pub const MAX_HEADS: usize = 256;
    /// Transformer layers.
    pub const MAX_LAYERS: usize = 256;
    /// Text vocabulary (`text_card`).
    pub const MAX_TEXT_CARD: usize = 1 << 20;
    /// Entries per audio codebook (`card`, Mimi `bins`).
    pub const MAX_CARD: usize = 1 << 16;
    /// Audio codebooks (`n_q`).
    pub const MAX_CODEBOOKS: usize = 64;
    /// Delay of one stream, in steps (80 ms each for Moshi: about 5.5 minutes).
    pub const MAX_DELAY_STEPS: usize = 4096;
    /// Attention window (`context`), in steps: 65536 LM steps are 87 minutes of conversation.
    pub const MAX_CONTEXT_STEPS: usize = 1 << 16;
    /// RoPE `max_period`.
    pub const MAX_ROPE_PERIOD: f64 = 1e9;
    /// `hidden_scale`.
    pub const MAX_HIDDEN_SCALE: f64 = 64.0;
    /// Parameters of the whole LM (the 7B has 7.7 billion).
    pub const MAX_PARAMETERS: u64 = 64_000_000_000;
    /// Bytes of the f32 KV caches at a full attention window, all layers (3.1 GB for the 7B).
    pub const MAX_KV_CACHE_BYTES: u64 = 64 << 30;
    /// Audio sample rate.
    pub const MAX_SAMPLE_RATE_HZ: usize = 384_000;
    /// Samples per codec frame (Mimi: 1920).
    pub const MAX_FRAME_SAMPLES: usize = 1 << 20;
    /// Convolution kernel size, in taps.
    pub const MAX_KERNEL_SIZE: usize = 1024;
    /// SEANet stride ratios and their count.
    pub const MAX_SEANET_RATIO: usize = 64;
    pub const MAX_SEANET_STAGES: usize = 16;
    /// SEANet residual blocks per stage and the dilation growth between them.
    pub const MAX_RESIDUAL_LAYERS: usize = 16;
    pub const MAX_DILATION_BASE: usize = 16;
    /// The largest dilated reach of one SEANet convolution (`(kernel - 1) x dilation`), in steps.
    pub const MAX_CONV_REACH: u64 = 1 << 16;
    /// Rows of a LUT conditioner's table (`n_bins`) and its width (`dim`).
    pub const MAX_CONDITIONER_BINS: usize = 1 << 16;
    pub const MAX_CONDITIONER_DIM: usize = 4096;
    /// Classifier-free guidance coefficient (`lm_gen_config.cfg_coef`; Kyutai uses 1 to 4).
    pub const MAX_CFG_COEF: f64 = 1000.0;
    /// Sampling temperature (`lm_gen_config.temp`, `temp_text`): the largest finite f32.
    pub const MAX_TEMPERATURE: f64 = f32::MAX as f64;
}

use limits::*;

/// `gating`: the feed-forward block of a transformer layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Gating {
    /// SiLU-gated (SwiGLU): `linear_out(silu(a) * b)` with `[a, b] = linear_in(x)` (the LM's).
    Silu,
    /// No gating: `linear2(gelu(linear1(x)))` (Mimi's transformer).
    None,
}

/// `norm`: the normalisation of a transformer layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormKind {
    /// RMSNorm, eps 1e-5.
    RmsNorm,
    /// RMSNorm computed in f32, eps 1e-8 (the 7B's).
    RmsNormF32,
    /// LayerNorm with bias, eps 1e-5 (Mimi's transformer).
    LayerNorm,
}

impl NormKind {
    /// The name in Kyutai's configs.
    pub fn name(self) -> &'static str {
        match self {
            NormKind::RmsNorm => "rms_norm",
            NormKind::RmsNormF32 => "rms_norm_f32",
            NormKind::LayerNorm => "layer_norm",
        }
    }
}

/// `positional_embedding` / `depformer_pos_emb`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PositionalEmbedding {
    /// Rotary embedding with interleaved pairs `[r0, i0, r1, i1, ...]`.
    Rope,
    /// Rotary embedding on the two halves of each head, `[r0, r1, ..., i0, i1, ...]`
    /// (Kyutai's `RotaryEmbedding(interleave=False)`; Hibiki-Zero's temporal transformer).
    RopeConcat,
    /// None (the depformer's).
    None,
    /// Sinusoidal embeddings added to the input: Kyutai's default when the key is absent, not
    /// implemented here (a config asking for it is refused).
    Sin,
}

impl PositionalEmbedding {
    /// Whether queries and keys are rotated (either rotary layout).
    pub fn is_rotary(self) -> bool {
        matches!(
            self,
            PositionalEmbedding::Rope | PositionalEmbedding::RopeConcat
        )
    }

    /// The name in Kyutai's configs.
    pub fn name(self) -> &'static str {
        match self {
            PositionalEmbedding::Rope => "rope",
            PositionalEmbedding::RopeConcat => "rope_concat",
            PositionalEmbedding::None => "none",
            PositionalEmbedding::Sin => "sin",
        }
    }
}

/// The sampling settings a config's `lm_gen_config` gives (Kyutai's `LMGen` keyword arguments,
/// which replace `LMGen`'s defaults in `run_inference.py` and `moshi.server`); `None` where the
/// config does not set one.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LmGenSampling {
    /// `use_sampling`: `false` means argmax everywhere.
    pub use_sampling: Option<bool>,
    /// `temp`: the audio temperature.
    pub temp_audio: Option<f32>,
    /// `temp_text`.
    pub temp_text: Option<f32>,
    /// `top_k`: the audio top-k.
    pub top_k_audio: Option<usize>,
    /// `top_k_text`.
    pub top_k_text: Option<usize>,
}

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
    pub gating: Gating,
    #[serde(default = "default_norm")]
    pub norm: NormKind,
    #[serde(default = "default_pos_emb")]
    pub positional_embedding: PositionalEmbedding,
    /// Grouped-query attention: the keys and values have `num_heads / kv_repeat` heads, query
    /// head `h` reading key/value head `h / kv_repeat` (Kyutai's `expand_repeated_kv`;
    /// Hibiki-Zero: 2). 1: every head its own.
    #[serde(default = "default_kv_repeat", skip_serializing_if = "is_one")]
    pub kv_repeat: usize,
    /// The depformer's `kv_repeat`; absent: the temporal one, as Kyutai's `LMModel` hands the
    /// temporal keyword arguments to the depformer unless a `depformer_` key replaces them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depformer_kv_repeat: Option<usize>,
    /// A norm on the depformer's output before each codebook's linear (`depformer_norms.{k}`;
    /// Hibiki-Zero: `layer_norm`, eps 1e-5 with bias). Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depformer_norm: Option<NormKind>,
    #[serde(default)]
    pub depformer_dim: usize,
    /// The depformer's feed-forward width; absent or null: `int(hidden_scale * depformer_dim)`,
    /// as Kyutai's `LMModel` (see [`LmConfig::depformer_feedforward`]).
    #[serde(default)]
    pub depformer_dim_feedforward: Option<usize>,
    #[serde(default)]
    pub depformer_num_heads: usize,
    #[serde(default)]
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
    pub depformer_gating: Gating,
    #[serde(default = "default_pos_emb")]
    pub depformer_pos_emb: PositionalEmbedding,
    #[serde(default = "default_true")]
    pub depformer_weights_per_step: bool,
    /// Which weight set each depformer sub-step uses (`schedule[k]`: its input projection,
    /// attention and feed-forward; Kyutai's Hibiki 2B and TTS share sets between the later
    /// codebooks). Absent: sub-step k uses set k.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depformer_weights_per_step_schedule: Option<Vec<usize>>,
    /// Width of the depformer's token embeddings when they are low-rank (a `[vocab, r]` table
    /// and a `[depformer_dim, r]` projection, Kyutai's `ScaledEmbedding(low_rank=r)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depformer_low_rank_embeddings: Option<usize>,
    pub delays: Vec<usize>,
    /// Conditioners by name (Hibiki: the LUT `description`); empty for Moshi.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub conditioners: BTreeMap<String, ConditionerConfig>,
    /// How the conditioners enter the model (Hibiki: `{"sum": ["description"]}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuser: Option<FuserConfig>,
    /// `moshi`, `hibiki`, `stt` or `tts` (Kyutai's `model_type`); absent in Moshi's configs. A
    /// conditioned model must say `hibiki` or `tts`, a model without a depformer (`dep_q` 0)
    /// `stt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_type: Option<String>,
    /// Linear heads read from the temporal output after `out_norm`, each a softmax over
    /// `extra_heads_dim` values (`LMGen.step_with_extra_heads`; Kyutai's STT models: semantic
    /// voice activity). 0: none (Kyutai's default).
    #[serde(default)]
    pub extra_heads_num_heads: usize,
    /// Width of each extra head; Kyutai's default 6.
    #[serde(default = "default_extra_heads_dim")]
    pub extra_heads_dim: usize,
    /// A speech-to-text model's feeding (`model_type` `stt`): the silence before the audio and
    /// the text's delay behind it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stt_config: Option<SttConfig>,
    /// A text-to-speech model's feeding (`model_type` `tts`): the audio's delay behind the text
    /// and the look-ahead of the second text stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tts_config: Option<TtsConfig>,
    /// Cross-attention in every temporal layer, on the conditioners of `fuser.cross` (Kyutai's
    /// TTS: the speaker embeddings).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cross_attention: bool,
    /// The text input carries two muxed streams, `(second + 1) * (text_card + 1) + main`
    /// (Kyutai's TTS: the words to say and a look-ahead), demuxed by the embeddings.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub demux_second_stream: bool,
    /// Width of the text head when it differs from `text_card` (Kyutai's `text_card_out`); only
    /// null or `text_card` is implemented (checked by [`LmConfig::validate`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_card_out: Option<usize>,
    /// The checkpoint's signature and epoch (Kyutai's TTS: voice files are named
    /// `<voice>.<sig>@<epoch>.safetensors`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_id: Option<ModelId>,
    /// The padding id the DSM scripts read for word boundaries of a speech-to-text model
    /// (`raw_config.get("text_padding_token_id", 3)`); absent in Kyutai's releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_padding_token_id: Option<u32>,
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
    /// Keys this engine does not know; kept and reported, never fatal (except a LoRA adapter,
    /// refused by [`LmConfig::validate`]).
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

fn default_pad() -> u32 {
    3
}
fn default_kv_repeat() -> usize {
    1
}
fn is_one(v: &usize) -> bool {
    *v == 1
}
fn default_extra_heads_dim() -> usize {
    6
}

/// `stt_config` of a speech-to-text model. A key left out takes the default of Kyutai's
/// `delayed-streams-modeling` scripts (`stt_config.get(key, default)`).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SttConfig {
    /// How far the text lags the audio; the scripts feed `ceil(delay x 12.5)` silence frames
    /// after the audio to flush it. Default 5.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio_delay_seconds: Option<f64>,
    /// Silence fed before the audio, `ceil(prefix x 12.5)` frames. Default 1.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio_silence_prefix_seconds: Option<f64>,
}

/// `tts_config` of a text-to-speech model (`moshi/models/tts.py` `TTSModel.from_checkpoint_info`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TtsConfig {
    /// How far the audio lags the text, in seconds; the state machine runs
    /// `int(audio_delay x 12.5)` steps ahead of the audio.
    pub audio_delay: f64,
    /// How many words ahead the second text stream looks (0: no second stream).
    #[serde(default)]
    pub second_stream_ahead: usize,
    /// Speaker slots of the cross-attention source; Kyutai's default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_speakers: Option<usize>,
    /// Kyutai's multistream TTS (two speakers' audio): not implemented, refused when true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multistream: Option<bool>,
    /// Other keys; kept, never used.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

/// Kyutai's default number of speaker slots (`DEFAULT_MAX_SPEAKERS`).
pub const TTS_DEFAULT_MAX_SPEAKERS: usize = 5;
/// The largest `tts_config.audio_delay` a config may give, in seconds.
pub const MAX_TTS_DELAY_SECONDS: f64 = 60.0;

impl TtsConfig {
    /// The audio's delay in steps, `int(audio_delay x 12.5)` as Kyutai's `TTSModel`.
    pub fn delay_steps(&self) -> usize {
        (self.audio_delay * 12.5) as usize
    }

    /// `max_speakers`, else Kyutai's 5.
    pub fn max_speakers(&self) -> usize {
        self.max_speakers.unwrap_or(TTS_DEFAULT_MAX_SPEAKERS)
    }
}

/// `model_id` of Kyutai's TTS configs.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ModelId {
    pub sig: String,
    pub epoch: u64,
}

impl ModelId {
    /// The suffix Kyutai's voice files carry for this model, `.<sig>@<epoch>.safetensors`.
    pub fn voice_suffix(&self) -> String {
        format!(".{}@{}.safetensors", self.sig, self.epoch)
    }
}

/// The DSM scripts' defaults of `stt_config` (`stt_from_file_pytorch.py`).
pub const STT_DEFAULT_DELAY_S: f64 = 5.0;
pub const STT_DEFAULT_SILENCE_PREFIX_S: f64 = 1.0;
/// The longest delay or silence prefix a config may give, in seconds.
pub const MAX_STT_SECONDS: f64 = 3600.0;

impl SttConfig {
    /// `audio_delay_seconds`, else the scripts' 5.0.
    pub fn delay_s(&self) -> f64 {
        self.audio_delay_seconds.unwrap_or(STT_DEFAULT_DELAY_S)
    }
    /// `audio_silence_prefix_seconds`, else the scripts' 1.0.
    pub fn silence_prefix_s(&self) -> f64 {
        self.audio_silence_prefix_seconds
            .unwrap_or(STT_DEFAULT_SILENCE_PREFIX_S)
    }
}
fn default_true() -> bool {
    true
}
fn default_max_period() -> f64 {
    10000.0
}
fn default_gating() -> Gating {
    Gating::Silu
}
fn default_norm() -> NormKind {
    NormKind::RmsNormF32
}
/// Kyutai's default of `positional_embedding` and `depformer_pos_emb` (`StreamingTransformer`,
/// `LMModel`): sinusoidal, which [`LmConfig::validate`] refuses, so that a config omitting the
/// key never runs a model other than the one Kyutai's code would build.
fn default_pos_emb() -> PositionalEmbedding {
    PositionalEmbedding::Sin
}

/// Hidden width of a SiLU-gated feed-forward of width `dim_feedforward` in a model of width
/// `dim`, as Kyutai's `ActivationGating`: `21 * dim / 8` when `dim_feedforward == 4 * dim`, else
/// `2 * dim_feedforward / 3` (rounded down).
pub fn gated_hidden_dim(dim: usize, dim_feedforward: usize) -> usize {
    if Some(dim_feedforward) == dim.checked_mul(4) {
        dim.saturating_mul(21) / 8
    } else {
        dim_feedforward.saturating_mul(2) / 3
    }
}

impl LmConfig {
    /// The temporal transformer's feed-forward width, `int(hidden_scale * dim)` (16896 for the 7B).
    pub fn feedforward(&self) -> usize {
        (self.hidden_scale * self.dim as f64) as usize
    }
    /// The depformer's feed-forward width: `depformer_dim_feedforward`, else
    /// `int(hidden_scale * depformer_dim)` (4224 for the 7B).
    pub fn depformer_feedforward(&self) -> usize {
        self.depformer_dim_feedforward
            .unwrap_or((self.hidden_scale * self.depformer_dim as f64) as usize)
    }
    /// Hidden width of the temporal SiLU-gated FFN (11264 for the 7B): [`gated_hidden_dim`] of
    /// `dim` and [`LmConfig::feedforward`].
    pub fn hidden_dim(&self) -> usize {
        gated_hidden_dim(self.dim, self.feedforward())
    }
    /// Hidden width of the depformer FFN (2816 for the 7B): [`gated_hidden_dim`] of
    /// `depformer_dim` and [`LmConfig::depformer_feedforward`].
    /// The weight set of depformer sub-step `k` (the schedule's entry, else `k`).
    pub fn depformer_weight_set(&self, k: usize) -> usize {
        self.depformer_weights_per_step_schedule
            .as_ref()
            .map_or(k, |s| s[k])
    }

    /// Depformer weight sets stored (`max(schedule) + 1`, else `dep_q`).
    pub fn depformer_weight_sets(&self) -> usize {
        self.depformer_weights_per_step_schedule
            .as_ref()
            .and_then(|s| s.iter().max())
            .map_or(self.dep_q, |m| m + 1)
    }

    /// Width of a depformer token embedding's table (the low rank, else `depformer_dim`).
    pub fn depformer_emb_width(&self) -> usize {
        self.depformer_low_rank_embeddings
            .unwrap_or(self.depformer_dim)
    }

    pub fn depformer_hidden_dim(&self) -> usize {
        gated_hidden_dim(self.depformer_dim, self.depformer_feedforward())
    }
    /// The depformer's `kv_repeat` (`depformer_kv_repeat`, else `kv_repeat`).
    pub fn depformer_kv_repeat(&self) -> usize {
        self.depformer_kv_repeat.unwrap_or(self.kv_repeat)
    }

    /// Width of the temporal keys (and values) of one position: `dim / kv_repeat`.
    pub fn kv_dim(&self) -> usize {
        self.dim / self.kv_repeat.max(1)
    }

    /// Width of the depformer's keys (and values) of one position.
    pub fn depformer_kv_dim(&self) -> usize {
        self.depformer_dim / self.depformer_kv_repeat().max(1)
    }

    /// Number of audio codebooks of the user stream (n_q - dep_q).
    pub fn user_codebooks(&self) -> usize {
        self.n_q.saturating_sub(self.dep_q)
    }
    pub fn max_delay(&self) -> usize {
        self.delays.iter().copied().max().unwrap_or(0)
    }

    /// `model_type` as a message shows it (quoted and escaped, or its default when absent).
    fn model_type_shown(&self) -> String {
        match &self.model_type {
            Some(t) => format!("{t:?}"),
            None => "absent (Kyutai's default: \"moshi\")".to_string(),
        }
    }

    /// Whether the model takes conditions (Hibiki's `description`) summed into its input.
    pub fn is_conditioned(&self) -> bool {
        !self.conditioners.is_empty()
    }

    /// A speech translation model (Hibiki): `model_type` `hibiki` (a conditioned model must be
    /// one: [`LmConfig::validate`]). Its input ends with an end-of-stream frame and it ends its
    /// output with EOS.
    pub fn is_translation(&self) -> bool {
        self.model_type.as_deref() == Some("hibiki")
    }

    /// Hibiki-Zero (Kyutai's `hibiki-zero` package): a translation model without conditioners.
    /// Hibiki-M and Hibiki 2B are conditioned on `description` (guidance); Hibiki-Zero's release
    /// has no conditioner and runs with `cfg_coef` 1, fed by `hibiki_zero.run.generate`'s
    /// conventions instead of `run_inference.py`'s.
    pub fn is_hibiki_zero(&self) -> bool {
        self.is_translation() && !self.is_conditioned()
    }

    /// A speech-to-text model (Kyutai's STT): `model_type` `stt`, `dep_q` 0 (checked together
    /// by [`LmConfig::validate`]): the user's codes in, text out, no audio.
    pub fn is_speech_to_text(&self) -> bool {
        self.model_type.as_deref() == Some("stt")
    }

    /// A text-to-speech model (Kyutai's TTS): `model_type` `tts`, every codebook generated
    /// (`dep_q` = `n_q`), a `tts_config` (checked together by [`LmConfig::validate`]).
    pub fn is_text_to_speech(&self) -> bool {
        self.model_type.as_deref() == Some("tts")
    }

    /// The suffix of this model's voice files ([`ModelId::voice_suffix`]; empty without
    /// `model_id`).
    pub fn voice_suffix(&self) -> String {
        self.model_id
            .as_ref()
            .map(ModelId::voice_suffix)
            .unwrap_or_default()
    }

    /// The text card of the muxed text input: `text_card + 1` values per stream.
    pub fn mux_card(&self) -> usize {
        self.text_card + 1
    }

    /// The largest text input token: `text_card` (the initial token), or with a muxed second
    /// stream `(text_card + 1)^2 - 1`.
    pub fn max_text_input(&self) -> usize {
        if self.demux_second_stream {
            self.mux_card() * self.mux_card() - 1
        } else {
            self.text_card
        }
    }

    /// `stt_config` with the DSM scripts' defaults for what it leaves out (all of it when absent).
    pub fn stt(&self) -> SttConfig {
        self.stt_config.unwrap_or_default()
    }

    /// The guidance coefficient of `lm_gen_config.cfg_coef`, else 1.0 (no guidance: Kyutai's
    /// default in `run_inference.py`, `moshi.server` and hibiki-rs).
    pub fn default_cfg_coef(&self) -> f32 {
        self.lm_gen_config
            .as_ref()
            .and_then(|g| g.get("cfg_coef"))
            .and_then(serde_json::Value::as_f64)
            .map_or(1.0, |c| c as f32)
    }

    /// The sampling settings of `lm_gen_config` (checked by [`LmConfig::validate`]).
    pub fn lm_gen_sampling(&self) -> LmGenSampling {
        let get = |key: &str| self.lm_gen_config.as_ref().and_then(|g| g.get(key));
        let temperature = |key: &str| {
            get(key)
                .and_then(serde_json::Value::as_f64)
                .map(|t| t as f32)
        };
        let top_k = |key: &str| {
            get(key)
                .and_then(serde_json::Value::as_u64)
                .and_then(|k| usize::try_from(k).ok())
        };
        LmGenSampling {
            use_sampling: get("use_sampling").and_then(serde_json::Value::as_bool),
            temp_audio: temperature("temp"),
            temp_text: temperature("temp_text"),
            top_k_audio: top_k("top_k"),
            top_k_text: top_k("top_k_text"),
        }
    }

    /// Checks the values of `lm_gen_config`: an object whose `cfg_coef`, temperatures, top-k
    /// and `use_sampling` (each optional) have the types and ranges `LMGen` takes.
    fn validate_lm_gen_config(&self, c: &ConfigChecker) -> Result<()> {
        let Some(gen) = &self.lm_gen_config else {
            return Ok(());
        };
        c.ensure(gen.is_object(), || {
            format!("`lm_gen_config` must be an object of generation settings, got {gen}")
        })?;
        if let Some(v) = gen.get("cfg_coef") {
            match v.as_f64() {
                Some(coef) => c.positive_real("lm_gen_config.cfg_coef", coef, MAX_CFG_COEF)?,
                None => c.ensure(false, || {
                    format!("lm_gen_config.cfg_coef must be a number, got {v}")
                })?,
            }
        }
        for key in ["temp", "temp_text"] {
            if let Some(v) = gen.get(key) {
                let key = format!("lm_gen_config.{key}");
                match v.as_f64() {
                    Some(t) => c.real(&key, t, 0.0, MAX_TEMPERATURE)?,
                    None => c.ensure(false, || {
                        format!("{key} must be a temperature (a number >= 0), got {v}")
                    })?,
                }
            }
        }
        for key in ["top_k", "top_k_text"] {
            if let Some(v) = gen.get(key) {
                let ok = v.as_u64().is_some_and(|k| usize::try_from(k).is_ok());
                c.ensure(ok, || {
                    format!("lm_gen_config.{key} must be a whole number >= 0 (a top-k), got {v}")
                })?;
            }
        }
        if let Some(v) = gen.get("use_sampling") {
            c.ensure(v.is_boolean(), || {
                format!("lm_gen_config.use_sampling must be true or false, got {v}")
            })?;
        }
        Ok(())
    }

    /// Refuses a LoRA fine-tune (`lora: true`, or an adapter named by `lora_name`): Kyutai's
    /// loader adds the adapter to the base weights, which this engine does not, so running it
    /// would silently give the untuned base model. `lora: false` (and `lora_rank`,
    /// `lora_scaling`, which then do nothing) is accepted.
    fn refuse_lora(&self, c: &ConfigChecker) -> Result<()> {
        const SUPPORTED: &str = "LoRA adapters are not supported: use a checkpoint with the \
                                 adapter merged into the weights, and `lora` false or absent";
        if let Some(v) = self.unknown.get("lora") {
            if !matches!(v, serde_json::Value::Bool(false) | serde_json::Value::Null) {
                return Err(c.unsupported("lora", v.to_string(), SUPPORTED));
            }
        }
        if let Some(v) = self.unknown.get("lora_name") {
            if !v.is_null() {
                return Err(c.unsupported("lora_name", v.to_string(), SUPPORTED));
            }
        }
        Ok(())
    }

    /// Refuses the keys of Kyutai's configs that change the architecture in ways this engine
    /// does not implement (any other value than the one that changes nothing): running such a
    /// model would fail on a tensor's shape at best, or compute another model silently.
    fn refuse_unimplemented_architecture(&self, c: &ConfigChecker) -> Result<()> {
        if let Some(out) = self.text_card_out.filter(|&o| o != self.text_card) {
            return Err(c.unsupported(
                "text_card_out",
                out.to_string(),
                "null or text_card: a text head of another size is not implemented",
            ));
        }
        if let Some(norm) = self.depformer_norm.filter(|&n| n != NormKind::LayerNorm) {
            return Err(c.unsupported(
                "depformer_norm",
                norm.name().into(),
                "null or layer_norm (Hibiki-Zero's): other norms on the depformer's output are \
                 not implemented",
            ));
        }
        Ok(())
    }

    /// `kv_repeat` (and the depformer's) divides its number of heads.
    fn validate_kv_repeat(&self, c: &ConfigChecker, has_depformer: bool) -> Result<()> {
        let temporal = ("kv_repeat", self.kv_repeat, "num_heads", self.num_heads);
        let depformer = (
            "depformer_kv_repeat",
            self.depformer_kv_repeat(),
            "depformer_num_heads",
            self.depformer_num_heads,
        );
        for (key, repeat, heads_key, heads) in
            std::iter::once(temporal).chain(has_depformer.then_some(depformer))
        {
            c.count(key, repeat, 1, heads.max(1))?;
            c.ensure(heads.is_multiple_of(repeat), || {
                format!("{key} {repeat} does not divide {heads_key} {heads}")
            })?;
        }
        Ok(())
    }

    /// The depformer's sizes (a model with `dep_q` > 0); each key named when out of range.
    fn validate_depformer(&self, c: &ConfigChecker) -> Result<()> {
        c.count("depformer_dim", self.depformer_dim, 1, MAX_WIDTH)?;
        c.count(
            "depformer_num_heads",
            self.depformer_num_heads,
            1,
            MAX_HEADS,
        )?;
        c.count(
            "depformer_num_layers",
            self.depformer_num_layers,
            1,
            MAX_LAYERS,
        )?;
        c.count(
            "depformer_dim_feedforward",
            self.depformer_feedforward(),
            2,
            MAX_FEEDFORWARD,
        )?;
        c.real(
            "depformer_max_period",
            self.depformer_max_period,
            1.0,
            MAX_ROPE_PERIOD,
        )?;
        if let Some(ctx) = self.depformer_context {
            c.count("depformer_context", ctx, 0, MAX_CONTEXT_STEPS)?;
        }
        if let Some(r) = self.depformer_low_rank_embeddings {
            c.count("depformer_low_rank_embeddings", r, 1, MAX_WIDTH)?;
        }
        self.validate_depformer_schedule(c)
    }

    /// A schedule names a weight set for each of the `dep_q` sub-steps, and every set from 0 to
    /// its largest is used (PyTorch stores `max + 1` sets).
    fn validate_depformer_schedule(&self, c: &ConfigChecker) -> Result<()> {
        let Some(schedule) = &self.depformer_weights_per_step_schedule else {
            return Ok(());
        };
        let shown = || format!("{schedule:?}");
        if schedule.len() != self.dep_q {
            return Err(c.unsupported(
                "depformer_weights_per_step_schedule",
                shown(),
                &format!(
                    "one weight set per depformer step: {} entries (dep_q)",
                    self.dep_q
                ),
            ));
        }
        let sets = self.depformer_weight_sets();
        if (0..sets).any(|set| !schedule.contains(&set)) {
            return Err(c.unsupported(
                "depformer_weights_per_step_schedule",
                shown(),
                "every weight set from 0 to the largest used at least once",
            ));
        }
        Ok(())
    }

    /// A speech-to-text model (`model_type` `stt`) has no depformer (`dep_q` 0) and a model
    /// without one is a speech-to-text model; `stt_config`'s seconds and the extra heads'
    /// sizes are in range.
    fn validate_speech_to_text(&self, c: &ConfigChecker) -> Result<()> {
        if self.is_speech_to_text() && self.dep_q != 0 {
            return Err(c.unsupported(
                "dep_q",
                self.dep_q.to_string(),
                "a speech-to-text model (`model_type` \"stt\") generates no audio: 0",
            ));
        }
        if self.dep_q == 0 && !self.is_speech_to_text() {
            return Err(c.unsupported(
                "model_type",
                self.model_type_shown(),
                "a model without a depformer (`dep_q` 0) runs only as speech-to-text, \"stt\", \
                 as Kyutai's STT releases",
            ));
        }
        if let Some(stt) = &self.stt_config {
            for (key, v) in [
                ("stt_config.audio_delay_seconds", stt.audio_delay_seconds),
                (
                    "stt_config.audio_silence_prefix_seconds",
                    stt.audio_silence_prefix_seconds,
                ),
            ] {
                if let Some(v) = v {
                    c.real(key, v, 0.0, MAX_STT_SECONDS)?;
                }
            }
        }
        if let Some(id) = self.text_padding_token_id {
            c.count(
                "text_padding_token_id",
                id as usize,
                0,
                self.text_card.saturating_sub(1),
            )?;
        }
        c.count(
            "extra_heads_num_heads",
            self.extra_heads_num_heads,
            0,
            MAX_HEADS,
        )?;
        if self.extra_heads_num_heads > 0 {
            c.count("extra_heads_dim", self.extra_heads_dim, 1, MAX_WIDTH)?;
        }
        Ok(())
    }

    /// A text-to-speech model (`model_type` `tts`) generates every codebook and has a
    /// `tts_config` in range; cross-attention and the muxed text stream only with it (no other
    /// model type uses them).
    fn validate_text_to_speech(&self, c: &ConfigChecker) -> Result<()> {
        if !self.is_text_to_speech() {
            for (key, on) in [
                ("cross_attention", self.cross_attention),
                ("demux_second_stream", self.demux_second_stream),
            ] {
                if on {
                    return Err(c.unsupported(
                        key,
                        "true".into(),
                        "false except in a text-to-speech model (`model_type` \"tts\")",
                    ));
                }
            }
            return Ok(());
        }
        let fuser_cross = self.fuser.as_ref().is_some_and(|f| !f.cross.is_empty());
        if self.cross_attention != fuser_cross {
            return Err(c.unsupported(
                "cross_attention",
                self.cross_attention.to_string(),
                "true exactly when `fuser.cross` names a conditioner",
            ));
        }
        if self.dep_q != self.n_q {
            return Err(c.unsupported(
                "dep_q",
                self.dep_q.to_string(),
                "a text-to-speech model generates every codebook: dep_q = n_q",
            ));
        }
        let Some(tts) = &self.tts_config else {
            return Err(c.unsupported(
                "tts_config",
                "absent".into(),
                "an object with `audio_delay` (seconds), as Kyutai's TTS releases",
            ));
        };
        c.real(
            "tts_config.audio_delay",
            tts.audio_delay,
            0.0,
            MAX_TTS_DELAY_SECONDS,
        )?;
        c.count(
            "tts_config.second_stream_ahead",
            tts.second_stream_ahead,
            0,
            64,
        )?;
        c.count("tts_config.max_speakers", tts.max_speakers(), 1, 64)?;
        if tts.second_stream_ahead > 0 && !self.demux_second_stream {
            return Err(c.unsupported(
                "demux_second_stream",
                "false".into(),
                "true when tts_config.second_stream_ahead > 0 (the look-ahead is the second stream)",
            ));
        }
        if tts.multistream == Some(true) {
            return Err(c.unsupported(
                "tts_config.multistream",
                "true".into(),
                "false: the multistream TTS (two speakers' audio) is not implemented",
            ));
        }
        Ok(())
    }

    /// Parses a config from JSON text and validates it; `origin` names the file in errors.
    pub fn from_json_str(text: &str, origin: &Path) -> Result<Self> {
        config_from_json(text, origin)
    }

    /// Reads (at most [`crate::MAX_CONFIG_BYTES`]) and validates a `config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        config_from_file(path.as_ref())
    }

    /// Checks every size against [`limits`] and every relation between keys the model relies
    /// on, so that building the model from a config that passes allocates only what the config
    /// plainly asks for. Errors name `origin`, the key, its value and the accepted range.
    pub fn validate(&self, origin: &Path) -> Result<()> {
        let c = ConfigChecker::new(origin);
        c.count("dim", self.dim, 1, MAX_WIDTH)?;
        c.count("num_heads", self.num_heads, 1, MAX_HEADS)?;
        c.count("num_layers", self.num_layers, 1, MAX_LAYERS)?;
        c.real("hidden_scale", self.hidden_scale, 0.0, MAX_HIDDEN_SCALE)?;
        c.count("text_card", self.text_card, 1, MAX_TEXT_CARD)?;
        c.count("card", self.card, 1, MAX_CARD)?;
        c.count("n_q", self.n_q, 1, MAX_CODEBOOKS)?;
        // dep_q 0 (no depformer, no audio generated) is a speech-to-text model, checked below.
        c.count("dep_q", self.dep_q, 0, MAX_CODEBOOKS)?;
        c.count("context", self.context, 1, MAX_CONTEXT_STEPS)?;
        c.real("max_period", self.max_period, 1.0, MAX_ROPE_PERIOD)?;
        self.validate_speech_to_text(&c)?;
        if self.dep_q > 0 {
            self.validate_depformer(&c)?;
        }
        for (i, &d) in self.delays.iter().enumerate() {
            c.count(&format!("delays[{i}]"), d, 0, MAX_DELAY_STEPS)?;
        }
        for (key, id) in [
            ("existing_text_padding_id", self.existing_text_padding_id),
            (
                "existing_text_end_padding_id",
                self.existing_text_end_padding_id,
            ),
        ] {
            c.count(key, id as usize, 0, self.text_card - 1)?;
        }

        // A model without a depformer (dep_q 0) ignores the depformer's keys, as Kyutai's
        // `LMModel` builds none.
        let has_depformer = self.dep_q > 0;
        for (key, gating) in [
            ("gating", self.gating),
            ("depformer_gating", self.depformer_gating),
        ]
        .into_iter()
        .filter(|(k, _)| has_depformer || !k.starts_with("depformer"))
        {
            if gating != Gating::Silu {
                return Err(c.unsupported(
                    key,
                    format!("{gating:?}").to_lowercase(),
                    "the LM's feed-forward is SiLU-gated: silu",
                ));
            }
        }
        if !matches!(self.norm, NormKind::RmsNorm | NormKind::RmsNormF32) {
            return Err(c.unsupported(
                "norm",
                self.norm.name().into(),
                "the LM uses rms_norm or rms_norm_f32",
            ));
        }
        for (key, scale) in [
            ("layer_scale", self.layer_scale),
            ("depformer_layer_scale", self.depformer_layer_scale),
        ]
        .into_iter()
        .filter(|(k, _)| has_depformer || !k.starts_with("depformer"))
        {
            if let Some(v) = scale {
                return Err(c.unsupported(
                    key,
                    v.to_string(),
                    "the LM's canonical weights have no layer scale: null",
                ));
            }
        }
        for (key, pos) in [
            ("positional_embedding", self.positional_embedding),
            ("depformer_pos_emb", self.depformer_pos_emb),
        ]
        .into_iter()
        .filter(|(k, _)| has_depformer || !k.starts_with("depformer"))
        {
            if pos == PositionalEmbedding::Sin {
                return Err(c.unsupported(
                    key,
                    pos.name().into(),
                    "rope or none; sin, Kyutai's default when the key is absent, is not implemented",
                ));
            }
        }
        if !self.causal {
            return Err(c.unsupported("causal", "false".into(), "a streaming LM is causal: true"));
        }

        if let Err(reason) = validate_conditioning(&self.conditioners, self.fuser.as_ref()) {
            c.ensure(false, || reason)?;
        }
        if self.is_conditioned() && !self.is_translation() && !self.is_text_to_speech() {
            return Err(c.unsupported(
                "model_type",
                self.model_type_shown(),
                "a model with `conditioners` runs only as a translation model, \"hibiki\", \
                 as in Kyutai's run_inference.py, or as text-to-speech, \"tts\"",
            ));
        }
        self.validate_text_to_speech(&c)?;
        self.validate_lm_gen_config(&c)?;
        self.refuse_lora(&c)?;
        self.refuse_unimplemented_architecture(&c)?;

        c.ensure(self.delays.len() == self.n_q + 1, || {
            format!(
                "`delays` has {} entries, expected n_q + 1 = {}",
                self.delays.len(),
                self.n_q + 1
            )
        })?;
        c.ensure(self.dep_q <= self.n_q, || {
            format!("dep_q {} is larger than n_q {}", self.dep_q, self.n_q)
        })?;
        for (dim_key, dim, heads_key, heads, pos) in [
            (
                "dim",
                self.dim,
                "num_heads",
                self.num_heads,
                self.positional_embedding,
            ),
            (
                "depformer_dim",
                self.depformer_dim,
                "depformer_num_heads",
                self.depformer_num_heads,
                self.depformer_pos_emb,
            ),
        ]
        .into_iter()
        .filter(|(k, ..)| has_depformer || !k.starts_with("depformer"))
        {
            c.ensure(dim.is_multiple_of(heads), || {
                format!("{dim_key} {dim} is not divisible by {heads_key} {heads}")
            })?;
            c.ensure(!pos.is_rotary() || (dim / heads).is_multiple_of(2), || {
                format!(
                    "RoPE needs an even head dimension, {dim_key} {dim} / {heads_key} {heads} = {}",
                    dim / heads
                )
            })?;
        }
        self.validate_kv_repeat(&c, has_depformer)?;
        c.ensure(
            (1..=MAX_FEEDFORWARD).contains(&self.hidden_dim()),
            || {
                format!(
                    "hidden_scale {} x dim {} gives a feed-forward width of {}, expected 1 to {MAX_FEEDFORWARD}",
                    self.hidden_scale,
                    self.dim,
                    self.hidden_dim()
                )
            },
        )?;
        // Every size is bounded above, so these products fit a u64.
        let params = self.parameter_count();
        c.ensure(params <= MAX_PARAMETERS, || {
            format!(
                "the config describes an LM of {params} parameters, above this engine's limit of {MAX_PARAMETERS}"
            )
        })?;
        c.product(
            "the f32 KV caches at a full window (context x dim x 2 x 4 bytes x num_layers)",
            &[
                self.context as u64,
                self.dim as u64,
                8,
                self.num_layers as u64,
            ],
            MAX_KV_CACHE_BYTES,
        )?;
        Ok(())
    }

    /// Parameters of the LM this config describes (temporal transformer, embeddings, text head,
    /// depformer); saturates instead of overflowing for a config that did not pass
    /// [`LmConfig::validate`].
    pub fn parameter_count(&self) -> u64 {
        let mul = |f: &[usize]| f.iter().fold(1u64, |acc, &x| acc.saturating_mul(x as u64));
        let sum = |t: &[u64]| t.iter().fold(0u64, |acc, &x| acc.saturating_add(x));
        // Attention (in_proj 3 d^2, out_proj d^2) and gated feed-forward (3 d hidden).
        let layer = |d: usize, hidden: usize| sum(&[mul(&[4, d, d]), mul(&[3, d, hidden])]);
        let (dim, ddim) = (self.dim, self.depformer_dim);
        let (text_rows, audio_rows) = (
            self.text_card.saturating_add(1),
            self.card.saturating_add(1),
        );
        // Embeddings, text head, the layers with their two norms each, the output norm.
        let temporal = sum(&[
            mul(&[text_rows, dim]),
            mul(&[self.n_q, audio_rows, dim]),
            mul(&[self.text_card, dim]),
            dim as u64,
            mul(&[self.num_layers])
                .saturating_mul(sum(&[layer(dim, self.hidden_dim()), mul(&[2, dim])])),
        ]);
        // Each depformer step: input projection, embedding, layers, output head; step 0 embeds
        // the text token, the others the previous audio token. The layers' norms are shared by
        // the steps (as the release stores them).
        let step = |emb_rows: usize| {
            sum(&[
                mul(&[dim, ddim]),
                mul(&[emb_rows, ddim]),
                mul(&[self.depformer_num_layers])
                    .saturating_mul(layer(ddim, self.depformer_hidden_dim())),
                mul(&[self.card, ddim]),
            ])
        };
        let depformer = match self.dep_q {
            0 => 0,
            n => sum(&[
                step(text_rows),
                mul(&[n - 1]).saturating_mul(step(audio_rows)),
                mul(&[self.depformer_num_layers, 2, ddim]),
            ]),
        };
        // Conditioners: the LUT, its projection and the learnt padding.
        let conditioners = sum(&self
            .conditioners
            .values()
            .filter_map(|c| c.lut())
            .map(|l| {
                sum(&[
                    mul(&[l.n_bins.saturating_add(1), l.dim]),
                    mul(&[dim, l.dim]),
                    dim as u64,
                ])
            })
            .collect::<Vec<_>>());
        let extra_heads = mul(&[self.extra_heads_num_heads, self.extra_heads_dim, dim]);
        sum(&[temporal, depformer, conditioners, extra_heads])
    }

    /// The built-in moshiko/moshika v0.1 7B config (`configs/moshiko-7b.json`).
    pub fn moshiko_7b() -> Self {
        Self::from_json_str(MOSHIKO_7B_JSON, Path::new("<built-in moshiko-7b>"))
            .expect("built-in config is valid")
    }
}

/// The 7B config shipped in the repo, embedded.
pub const MOSHIKO_7B_JSON: &str = include_str!("../../../configs/moshiko-7b.json");

impl ValidatedConfig for LmConfig {
    fn check(&self, origin: &Path) -> Result<()> {
        self.validate(origin)
    }
}
