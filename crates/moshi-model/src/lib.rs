//! moshi-model: the streaming modules of Moshi (convolutions, transformers with KV caches,
//! Mimi, the temporal LM and depformer, the generator). Pure and deterministic: no I/O
//! beyond the weights handed over by `moshi-loader`, no audio devices, no async runtime.

mod error;
pub mod generator;
pub mod kind;
pub mod lm;
pub mod mimi;
pub mod nn;
pub mod rng;
pub mod stt;
pub mod tts;
pub mod word_events;
pub use moshi_kernels::team;

pub use error::ModelError;

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, ModelError>;
