//! Loader errors: every variant names the file and, where relevant, the tensor.

use std::path::PathBuf;

/// Everything that can go wrong while finding or reading checkpoints, configs and tokenizers.
/// An underlying I/O error is part of the message (`cause`), not a separate `source`, so that a
/// printed chain says it once.
#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    #[error("{path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{path}: not a safetensors file: {reason}")]
    BadSafetensors { path: PathBuf, reason: String },
    #[error("{path}: file is truncated: header says {expected} bytes of tensor data, the file holds {got}")]
    Truncated {
        path: PathBuf,
        expected: usize,
        got: usize,
    },
    #[error("{path}: not a GGUF file moshi-rs reads: {reason}")]
    BadGguf { path: PathBuf, reason: String },
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
    #[error("{path}: cannot quantize to {bits}-bit, group size {group_size}: expected bits in {supported_bits} and a group size in {supported_group_sizes}")]
    UnsupportedQuantization {
        path: PathBuf,
        bits: u32,
        group_size: usize,
        supported_bits: String,
        supported_group_sizes: String,
    },
    #[error("{path}: unknown checkpoint format: {reason}")]
    UnknownFormat { path: PathBuf, reason: String },
    #[error("{path}: bad config: {reason}")]
    BadConfig { path: PathBuf, reason: String },
    #[error("{path}: config key `{key}`: {reason}")]
    ConfigValue {
        path: PathBuf,
        key: String,
        reason: String,
    },
    #[error("{path}: config key `{key}` is {value}, expected {expected}")]
    ConfigOutOfRange {
        path: PathBuf,
        key: String,
        value: String,
        expected: String,
    },
    #[error(
        "{path}: config key `{key}` is {value}, which this engine does not support ({supported})"
    )]
    ConfigUnsupported {
        path: PathBuf,
        key: String,
        value: String,
        supported: String,
    },
    #[error("{path}: checkpoint does not match the config: {reason}")]
    ConfigMismatch { path: PathBuf, reason: String },
    #[error("cannot write {path}: {cause}")]
    Write {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{output}: is the same file as the input {input}; refusing to overwrite an input")]
    OutputIsInput { output: PathBuf, input: PathBuf },
    #[error("{second_what} {second} and {first_what} {first} are the same file: each output needs its own file")]
    OutputsCollide {
        first_what: String,
        first: PathBuf,
        second_what: String,
        second: PathBuf,
    },
    #[error("{path}: more than {limit_bytes} bytes, too large for {what}")]
    InputTooLarge {
        path: PathBuf,
        what: &'static str,
        limit_bytes: u64,
    },
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
    pub(crate) fn io(path: impl Into<PathBuf>, cause: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            cause,
        }
    }
}
