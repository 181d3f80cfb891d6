//! moshi-runtime: everything between the model and the outside world. WAV files, rubato
//! resampling, lock-free rings with counters, audio backends (cpal, file, null/virtual clock),
//! the real-time engine thread that runs one [`engine::FrameProcessor`] step per 80 ms frame,
//! the Moshi pipeline (Mimi encode -> LM step -> Mimi decode), file translation with Hibiki
//! models and latency metrics.
//!
//! Units: Moshi works on 24 kHz mono f32 PCM in frames of [`FRAME_SAMPLES`] samples (80 ms).

pub mod alloc_check;
pub mod backend;
pub mod continuity;
pub mod echo_cancel;
pub mod engine;
mod error;
pub mod metrics;
pub mod pipeline;
pub mod player;
pub mod recorder;
pub mod resample;
pub mod riff;
pub mod ring;
pub mod speak;
pub mod transcribe;
pub mod translate;
pub mod wav;
pub mod wav_frames;

pub use error::RuntimeError;

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, RuntimeError>;

/// Moshi's (and Mimi's) sample rate.
pub const SAMPLE_RATE_HZ: u32 = 24_000;
/// Samples per model frame: 80 ms at 24 kHz (Mimi's 12.5 Hz frame rate).
pub const FRAME_SAMPLES: usize = 1920;
/// Duration of one model frame in milliseconds.
pub const FRAME_MS: f64 = 80.0;
