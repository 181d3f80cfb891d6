//! The file backend: a WAV file played as the microphone through a virtual clock (the null
//! backend's device thread), with the speaker output kept in memory. Real-time pacing (speed
//! 1.0) simulates a live session from a recording; lockstep processes every frame.

use std::path::Path;
use std::sync::Arc;

use super::null::{NullBackend, NullClock, NullConfig};
use super::AudioBackend;
use crate::engine::StreamFormat;
use crate::ring::{AudioCounters, SampleConsumer, SampleProducer};
use crate::{wav, Result};

/// A WAV file as the microphone; the speaker is recorded in memory at 24 kHz mono.
pub struct FileBackend {
    inner: NullBackend,
    description: String,
}

impl FileBackend {
    /// Opens `path` (any WAV the reader supports). Lockstep needs 24 kHz input: other rates are
    /// resampled here first.
    pub fn open(path: &Path, clock: NullClock, buffer_frames: usize) -> Result<Self> {
        let audio = wav::read_mono(path)?;
        let (samples, rate) =
            if clock == NullClock::Lockstep && audio.sample_rate_hz != crate::SAMPLE_RATE_HZ {
                (
                    crate::resample::resample_to(
                        &audio.samples,
                        audio.sample_rate_hz,
                        crate::SAMPLE_RATE_HZ,
                    )?,
                    crate::SAMPLE_RATE_HZ,
                )
            } else {
                (audio.samples, audio.sample_rate_hz)
            };
        let config = NullConfig {
            buffer_frames,
            clock,
            input_format: StreamFormat {
                sample_rate_hz: rate,
                channels: 1,
            },
            output_format: StreamFormat::MOSHI,
            tail_ms: 500.0,
            input_loops: 1,
            keep_played: true,
        };
        let description = format!(
            "file {} ({} Hz) as microphone, {clock:?}",
            path.display(),
            rate
        );
        Ok(Self {
            inner: NullBackend::new(config, samples)?,
            description,
        })
    }
}

impl AudioBackend for FileBackend {
    fn describe(&self) -> String {
        self.description.clone()
    }
    fn input_format(&self) -> StreamFormat {
        self.inner.input_format()
    }
    fn output_format(&self) -> StreamFormat {
        self.inner.output_format()
    }
    fn start(
        &mut self,
        mic: SampleProducer,
        speaker: SampleConsumer,
        counters: Arc<AudioCounters>,
    ) -> Result<()> {
        self.inner.start(mic, speaker, counters)
    }
    fn input_finished(&self) -> bool {
        self.inner.input_finished()
    }
    fn finished(&self) -> bool {
        self.inner.finished()
    }
    fn stop(&mut self) -> Result<Vec<f32>> {
        self.inner.stop()
    }
}
