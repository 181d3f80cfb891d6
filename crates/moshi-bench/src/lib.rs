//! moshi-bench: how fast moshi-rs runs, kept out of the libraries. The `moshi-rs bench` run
//! ([`run::run_bench`]: random weights of the real shapes or a checkpoint, one stage or the whole
//! pipeline, driven frame by frame through the engine's own [`run_offline`]; a text-to-speech
//! model's streams and their time to first audio, [`tts`]) and its versioned
//! [`report`]; the memory read-bandwidth probe every speed is compared with ([`bandwidth`]);
//! Moshi 7B's and the speech-to-text 1B's product shapes ([`shapes`], shared with the peer
//! benchmarks `scripts/peer-candle` and `scripts/peer-ggml`, the latter also using
//! [`hashed_weights`], both [`summary`]'s median and range of their rounds and the flags of their
//! whole-step contests, [`step_flags`]); and, under `benches/`, the criterion benches of the
//! kernels, the LM, Mimi and the loader.
//!
//! Without the default `pipeline` feature only [`bandwidth`], [`shapes`], [`summary`],
//! [`step_flags`], [`mod@env`] (the benches' settings) and the f32 half of [`hashed_weights`] are
//! built.
//!
//! [`run_offline`]: moshi_runtime::engine::run_offline

// The links above name the pipeline's modules, absent from the peers' build without it.
#![cfg_attr(not(feature = "pipeline"), allow(rustdoc::broken_intra_doc_links))]

pub mod bandwidth;
pub mod env;
pub mod hashed_weights;
pub mod shapes;
pub mod step_flags;
pub mod summary;

#[cfg(feature = "pipeline")]
pub mod alternating;
#[cfg(feature = "pipeline")]
pub mod checkpoint;
#[cfg(feature = "pipeline")]
mod error;
#[cfg(feature = "pipeline")]
pub mod extrapolate;
#[cfg(feature = "pipeline")]
pub mod format;
#[cfg(feature = "pipeline")]
pub mod frame_probe;
#[cfg(feature = "pipeline")]
pub mod frames;
#[cfg(feature = "pipeline")]
pub mod kv_traffic;
#[cfg(feature = "pipeline")]
pub mod memory;
#[cfg(feature = "pipeline")]
pub mod report;
#[cfg(feature = "pipeline")]
pub mod run;
#[cfg(feature = "pipeline")]
pub mod sessions;
#[cfg(feature = "pipeline")]
pub mod span_timer;
#[cfg(feature = "pipeline")]
pub mod stages;
#[cfg(feature = "pipeline")]
pub mod synthetic_tokenizer;
#[cfg(feature = "pipeline")]
pub mod tts;

#[cfg(feature = "pipeline")]
pub use error::BenchError;
