//! Building blocks of `moshi-rs bench`: single-stage frame processors, the frame driver with
//! per-layer span timing, peak memory, the extrapolation to full depth and the versioned report.

pub mod checkpoint;
pub mod extrapolate;
pub mod format;
pub mod kv_traffic;
pub mod memory;
pub mod report;
pub mod runner;
pub mod span_timer;
pub mod stages;
pub mod synthetic_tokenizer;

use moshi_model::ModelError;

use crate::RuntimeError;

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("benchmark frame {frame}: {source}")]
    Frame { frame: usize, source: RuntimeError },
    #[error("{0}")]
    Setup(String),
}
