//! The runtime's error type: WAV I/O, resampling, devices, the engine and the model pipeline.

use std::path::PathBuf;

/// Everything that can go wrong in moshi-runtime. Messages name the file or device and say
/// what was expected and what was found. An underlying I/O or WAV error is part of the message
/// (`cause`), not a separate `source`, so that a printed chain says it once.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("input file {path} does not exist")]
    MissingFile { path: PathBuf },
    #[error("cannot read {path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{path} is not a readable WAV file: {detail}")]
    NotWav { path: PathBuf, detail: String },
    #[error("{path}: unsupported WAV format: {detail}")]
    UnsupportedWav { path: PathBuf, detail: String },
    #[error("{path} ends before the {announced_samples} samples its header announces")]
    TruncatedWav {
        path: PathBuf,
        announced_samples: u64,
    },
    #[error(
        "{path}: sample {sample_index} (channel {channel}) is {value}, expected a finite number"
    )]
    NonFiniteSample {
        path: PathBuf,
        /// Index of the (multi-channel) sample frame in the file, from 0.
        sample_index: u64,
        channel: usize,
        value: f32,
    },
    #[error("{path} contains no audio samples")]
    EmptyWav { path: PathBuf },
    #[error("{path} is too short: {got_samples} samples at 24 kHz after resampling, need at least one {need_samples}-sample frame (80 ms)")]
    TooShort {
        path: PathBuf,
        got_samples: usize,
        need_samples: usize,
    },
    #[error("cannot write {path}: {cause}")]
    Write {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{path}: {frames} frames of {channels} channels are too long for a WAV (at most 4 GiB of samples)")]
    WavTooLong {
        path: PathBuf,
        frames: u64,
        channels: u16,
    },
    #[error("{path}: {written} frames written, the WAV header announced {announced}")]
    WavLength {
        path: PathBuf,
        written: u64,
        announced: u64,
    },
    #[error("resampler {from_hz} Hz -> {to_hz} Hz: {detail}")]
    Resample {
        from_hz: u32,
        to_hz: u32,
        detail: String,
    },
    #[error("audio device: {0}")]
    Device(String),
    #[error("echo canceller: {detail}")]
    EchoCancel { detail: String },
    #[error("frame processor expected {expected} samples per frame, got {got}")]
    FrameSize { expected: usize, got: usize },
    #[error("a frame of user codes needs at least {expected} codes (the model's user codebooks), got {got}")]
    CodesPerFrame { expected: usize, got: usize },
    #[error(transparent)]
    Model(#[from] moshi_model::ModelError),
    #[error(transparent)]
    Loader(#[from] moshi_loader::LoaderError),
    #[error("the engine thread has ended")]
    EngineEnded,
    #[error("the engine thread panicked")]
    EnginePanicked,
    #[error("cannot start the engine thread: {cause}")]
    EngineSpawn { cause: std::io::Error },
    #[error("engine: cannot read {requested} samples from the microphone ring: {cause}")]
    MicRing {
        requested: usize,
        cause: rtrb::chunks::ChunkError,
    },
    #[error(
        "Mimi has {mimi} codebooks, the LM needs {user} user and {generated} generated codebooks"
    )]
    CodebooksMismatch {
        mimi: usize,
        user: usize,
        generated: usize,
    },
    #[error("the model is {kind}, not a speech-to-text model (`model_type` \"stt\")")]
    NotSpeechToText { kind: &'static str },
    #[error(
        "the model is text to speech (`model_type` \"tts\"): it takes text, not audio; use `moshi-rs speak`, or `serve` for /api/tts_streaming"
    )]
    TextToSpeechModel,
}
