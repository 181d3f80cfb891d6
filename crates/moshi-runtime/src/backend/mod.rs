//! Audio backends behind one trait: [`cpal::CpalBackend`] (real devices), [`file::FileBackend`]
//! (a WAV file played as the microphone) and [`null::NullBackend`] (a virtual clock, for tests;
//! can run faster than real time or in lockstep with the engine).
//!
//! A backend owns the device side of the two rings: it moves the mic ring's producer into its
//! capture callback and the speaker ring's consumer into its playback callback. All three
//! backends call the same callback bodies ([`crate::ring::capture_callback`],
//! [`crate::ring::playback_callback`]).

pub mod cpal;
pub mod device_watch;
pub mod file;
pub mod null;

use std::sync::Arc;

use crate::echo_cancel::EchoCancelConfig;
use crate::engine::MAX_EXTRA_OUTPUT_QUEUE_MS;
use crate::engine::{
    spawn_engine, DropPolicy, EngineConfig, EngineHandle, EngineIo, FrameProcessor, FrameRecorder,
    Reconnect, StreamFormat,
};
use crate::ring::{sample_ring, AudioCounters, SampleConsumer, SampleProducer};
use crate::{Result, FRAME_MS};

/// A source of microphone samples and a sink for speaker samples.
pub trait AudioBackend {
    /// Human-readable description (device names, formats).
    fn describe(&self) -> String;
    /// Format of the samples the backend pushes into the mic ring.
    fn input_format(&self) -> StreamFormat;
    /// Format of the samples the backend pulls from the speaker ring.
    fn output_format(&self) -> StreamFormat;
    /// Whether the backend plays the speaker ring; `false`: capture only (it drops the ring's
    /// consumer, and the engine queues nothing for it).
    fn plays_output(&self) -> bool {
        true
    }
    /// Starts capture and playback with these ring ends.
    fn start(
        &mut self,
        mic: SampleProducer,
        speaker: SampleConsumer,
        counters: Arc<AudioCounters>,
    ) -> Result<()>;
    /// True once a finite input (file, test signal) has been fully captured. Live devices: never.
    fn input_finished(&self) -> bool;
    /// True once the backend has nothing more to play or record (finite backends only).
    fn finished(&self) -> bool;
    /// Stops the streams. Returns what was played (finite backends keep it; devices: empty).
    fn stop(&mut self) -> Result<Vec<f32>>;
}

/// Sizes of the two rings, in milliseconds of device audio.
#[derive(Debug, Clone, Copy)]
pub struct RingSizes {
    pub mic_ms: u32,
    pub speaker_ms: u32,
}

impl Default for RingSizes {
    fn default() -> Self {
        Self {
            mic_ms: 2000,
            speaker_ms: 2000,
        }
    }
}

impl RingSizes {
    /// Default sizes, with a speaker ring that also holds the largest output queue live mode
    /// keeps: the jitter margin (`prefill_ms`), [`MAX_EXTRA_OUTPUT_QUEUE_MS`] more before the
    /// engine trims, two frames in flight and the device buffer. (A smaller ring would drop
    /// the excess of a large `--jitter-ms` as overflow.)
    pub fn for_output_queue(prefill_ms: f64, device_buffer_ms: u32) -> Self {
        let needed_ms = prefill_ms.max(0.0)
            + MAX_EXTRA_OUTPUT_QUEUE_MS
            + 2.0 * FRAME_MS
            + f64::from(device_buffer_ms);
        let default = Self::default();
        Self {
            speaker_ms: default
                .speaker_ms
                .max(needed_ms.ceil().min(u32::MAX as f64) as u32),
            ..default
        }
    }
}

fn ring_samples(format: StreamFormat, ms: u32) -> usize {
    (format.sample_rate_hz as u64 * format.channels as u64 * ms as u64 / 1000) as usize
}

/// A running backend + engine pair.
pub struct Session {
    pub engine: EngineHandle,
    pub counters: Arc<AudioCounters>,
}

/// What a live session does to the microphone before the model hears it.
#[derive(Default)]
pub struct MicProcessing {
    /// Echo cancellation with the speaker's samples as the reference.
    pub echo_cancel: Option<EchoCancelConfig>,
    /// Takes every input frame as captured, before echo cancellation.
    pub raw_recorder: Option<Box<dyn FrameRecorder>>,
}

/// Creates the rings and counters, starts `backend`, then the engine thread running `processor`
/// (handing every frame in and out to `recorder`, when there is one).
pub fn start_session(
    backend: &mut dyn AudioBackend,
    processor: Box<dyn FrameProcessor>,
    drop_policy: DropPolicy,
    prefill_ms: f64,
    recorder: Option<Box<dyn FrameRecorder>>,
    rings: RingSizes,
) -> Result<Session> {
    start_session_with_mic(
        backend,
        processor,
        drop_policy,
        prefill_ms,
        recorder,
        rings,
        MicProcessing::default(),
    )
}

/// [`start_session`], the microphone processed as `mic` says.
pub fn start_session_with_mic(
    backend: &mut dyn AudioBackend,
    processor: Box<dyn FrameProcessor>,
    drop_policy: DropPolicy,
    prefill_ms: f64,
    recorder: Option<Box<dyn FrameRecorder>>,
    rings: RingSizes,
    mic: MicProcessing,
) -> Result<Session> {
    let input = backend.input_format();
    let output = backend.output_format();
    let (mic_p, mic_c) = sample_ring(ring_samples(input, rings.mic_ms));
    let (spk_p, spk_c) = sample_ring(ring_samples(output, rings.speaker_ms));
    let counters = Arc::new(AudioCounters::default());
    let config = EngineConfig {
        input,
        output,
        drop_policy,
        prefill_ms,
        play_output: backend.plays_output(),
        echo_cancel: mic.echo_cancel,
        ..EngineConfig::lossless()
    };
    // The engine starts first so that no captured sample waits for it.
    let engine = spawn_engine(
        processor,
        config,
        EngineIo {
            mic: mic_c,
            speaker: spk_p,
            counters: counters.clone(),
            recorder,
            raw_mic: mic.raw_recorder,
        },
    )?;
    if let Err(e) = backend.start(mic_p, spk_c, counters.clone()) {
        engine.request_stop();
        let _ = engine.join();
        return Err(e);
    }
    Ok(Session { engine, counters })
}

/// Connects a new (reopened) backend to a running session: new rings for its formats, handed to
/// the engine, then the backend is started. The old backend must be stopped first.
pub fn reconnect_session(
    session: &Session,
    backend: &mut dyn AudioBackend,
    rings: RingSizes,
) -> Result<()> {
    let input = backend.input_format();
    let output = backend.output_format();
    let (mic_p, mic_c) = sample_ring(ring_samples(input, rings.mic_ms));
    let (spk_p, spk_c) = sample_ring(ring_samples(output, rings.speaker_ms));
    session
        .counters
        .device_lost
        .store(false, std::sync::atomic::Ordering::Relaxed);
    session
        .counters
        .playback_started
        .store(false, std::sync::atomic::Ordering::Relaxed);
    session.engine.reconnect(Reconnect {
        mic: mic_c,
        speaker: spk_p,
        input,
        output,
    })?;
    backend.start(mic_p, spk_c, session.counters.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_speaker_ring_holds_the_largest_output_queue() {
        let rings = RingSizes::for_output_queue(10_000.0, 40);
        assert!(
            f64::from(rings.speaker_ms)
                >= 10_000.0 + MAX_EXTRA_OUTPUT_QUEUE_MS + 2.0 * FRAME_MS + 40.0,
            "{rings:?}"
        );
        assert_eq!(rings.mic_ms, RingSizes::default().mic_ms);
        // A small margin keeps the default.
        assert_eq!(RingSizes::for_output_queue(30.0, 40).speaker_ms, 2000);
    }
}
