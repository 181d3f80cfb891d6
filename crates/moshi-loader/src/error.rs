//! Loader errors: every variant names the file and, where relevant, the tensor.

use std::path::PathBuf;

/// Everything that can go wrong while finding or reading checkpoints, configs and tokenizers.
#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a safetensors file: {reason}")]
    BadSafetensors { path: PathBuf, reason: String },
    #[error("{path}: file is truncated: header says {expected} bytes of tensor data, the file holds {got}")]
    Truncated {
        path: PathBuf,
        expected: usize,
        got: usize,
    },
    #[error("{path}: tensor `{name}` is missing")]
    MissingTensor { path: PathBuf, name: String },
    #[error("{path}: tensor `{name}` has shape {got:?}, expected {expected:?}")]
    ShapeMismatch {
        path: PathBuf,
        name: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    #[error("{path}: tensor `{name}` has dtype {got}, expected {expected}")]
    DTypeMismatch {
        path: PathBuf,
        name: String,
        expected: String,
        got: String,
    },
    #[error("{path}: tensor `{name}`: {reason}")]
    BadTensor {
        path: PathBuf,
        name: String,
        reason: String,
    },
    #[error("{path}: quantized tensor `{name}`: {reason}")]
    BadQuantized {
        path: PathBuf,
        name: String,
        reason: String,
    },
    #[error("{path}: unknown checkpoint format: {reason}")]
    UnknownFormat { path: PathBuf, reason: String },
    #[error("{path}: bad config: {reason}")]
    BadConfig { path: PathBuf, reason: String },
    #[error("{path}: checkpoint does not match the config: {reason}")]
    ConfigMismatch { path: PathBuf, reason: String },
    #[error("{path}: bad .npy file: {reason}")]
    BadNpy { path: PathBuf, reason: String },
    #[error("{path}: bad tokenizer: {reason}")]
    BadTokenizer { path: PathBuf, reason: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("cannot find `{what}`: {reason}")]
    NotFound { what: String, reason: String },
    #[error("download of `{file}` from `{repo}` failed: {reason}")]
    Download {
        repo: String,
        file: String,
        reason: String,
    },
}

impl LoaderError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}
