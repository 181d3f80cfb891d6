//! The runtime's error type: WAV I/O, resampling, devices, the engine and the model pipeline.

use std::path::PathBuf;

/// Everything that can go wrong in moshi-runtime. Messages name the file or device and say
/// what was expected and what was found.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("input file {path} does not exist")]
    MissingFile { path: PathBuf },
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a readable WAV file: {source}")]
    NotWav {
        path: PathBuf,
        #[source]
        source: hound::Error,
    },
    #[error("{path}: unsupported WAV format: {detail}")]
    UnsupportedWav { path: PathBuf, detail: String },
    #[error("{path} contains no audio samples")]
    EmptyWav { path: PathBuf },
    #[error("{path} is too short: {got_samples} samples at 24 kHz after resampling, need at least one {need_samples}-sample frame (80 ms)")]
    TooShort {
        path: PathBuf,
        got_samples: usize,
        need_samples: usize,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write WAV {path}: {source}")]
    WavWrite {
        path: PathBuf,
        #[source]
        source: hound::Error,
    },
    #[error("resampler {from_hz} Hz -> {to_hz} Hz: {detail}")]
    Resample {
        from_hz: u32,
        to_hz: u32,
        detail: String,
    },
    #[error("audio device: {0}")]
    Device(String),
    #[error("frame processor expected {expected} samples per frame, got {got}")]
    FrameSize { expected: usize, got: usize },
    #[error(transparent)]
    Model(#[from] moshi_model::ModelError),
    #[error(transparent)]
    Loader(#[from] moshi_loader::LoaderError),
    #[error("engine thread: {0}")]
    Engine(String),
}
