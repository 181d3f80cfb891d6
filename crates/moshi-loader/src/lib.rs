//! moshi-loader: find Moshi/Mimi checkpoints, read their headers, detect the layout from names
//! and shapes, map names onto one canonical set, and load configs and the text tokenizer.

pub mod conditioning;
pub mod config;
mod config_check;
mod error;
pub mod escape;
pub mod gguf_file;
mod gguf_lm;
pub mod hub;
pub mod input_file;
pub mod inspect;
pub mod layout;
pub mod lm_names;
mod lm_sources;
pub mod lm_weights;
pub mod mimi_config;
pub mod mimi_weights;
pub mod mlx_export;
pub mod mlx_quant;
pub mod npy;
pub mod output_file;
mod safetensors_file;
mod safetensors_header;
pub mod sentencepiece_proto;
pub mod source;
mod tensor;
mod text_decode;
pub mod tokenizer;
pub mod voice;
mod weight_map;

pub use config::{
    Gating, LmConfig, LmGenSampling, ModelId, NormKind, PositionalEmbedding, SttConfig, TtsConfig,
};
pub use config_check::{read_config_text, MAX_CONFIG_BYTES};
pub use error::LoaderError;
pub use layout::{CheckpointKind, LmLayout};
pub use lm_weights::{load_lm_weights, WeightMode};
pub use mimi_config::MimiConfig;
pub use mimi_weights::load_mimi_weights;
pub use safetensors_file::{SafetensorsFile, TensorInfo};
pub use source::{LmVariant, ModelSource, ResolvedModel, SourceOverrides};
pub use tensor::{DType, Tensor, TensorData};
pub use weight_map::{Weight, WeightData, WeightMap};

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, LoaderError>;
