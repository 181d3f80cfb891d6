//! The null backend: a virtual device driven by a virtual clock, for tests and CI. A thread
//! plays a given signal into the capture callback in device-sized buffers and pulls the
//! playback callback for the same number of frames per tick, keeping what it played.
//!
//! Clocks: [`NullClock::Paced`] sleeps buffer_duration / speed between ticks (speed > 1 runs
//! faster than real time; a slow engine then falls behind exactly as it would on a device);
//! [`NullClock::Lockstep`] waits after each capture until the engine has handled every complete
//! frame, so nothing is ever late (deterministic output for equality tests).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::AudioBackend;
use crate::engine::StreamFormat;
use crate::ring::{
    capture_callback, playback_callback, AudioCounters, SampleConsumer, SampleProducer,
};
use crate::{Result, RuntimeError, SAMPLE_RATE_HZ};

/// How the virtual clock advances.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NullClock {
    /// Real-time pacing scaled by `speed` (2.0 = twice as fast as real time).
    Paced { speed: f64 },
    /// Each tick waits for the engine to catch up (never late, deterministic).
    Lockstep,
}

/// Settings of the null backend.
#[derive(Debug, Clone)]
pub struct NullConfig {
    /// Device frames per callback (per channel).
    pub buffer_frames: usize,
    pub clock: NullClock,
    pub input_format: StreamFormat,
    pub output_format: StreamFormat,
    /// Paced clock: virtual time played after the input ends with an empty speaker ring
    /// before the backend declares itself finished.
    pub tail_ms: f64,
    /// Times the input is played back to back (1: once). Long sessions from a short clip.
    pub input_loops: u64,
    /// Keep what the speaker played (returned by `stop`); off for long sessions, whose memory
    /// must not grow with their length.
    pub keep_played: bool,
}

impl NullConfig {
    /// 24 kHz mono both ways, 480-frame (20 ms) buffers.
    pub fn moshi(clock: NullClock) -> Self {
        Self {
            buffer_frames: 480,
            clock,
            input_format: StreamFormat::MOSHI,
            output_format: StreamFormat::MOSHI,
            tail_ms: 500.0,
            input_loops: 1,
            keep_played: true,
        }
    }
}

/// A virtual device playing `input` (interleaved, in `input_format`) as its microphone.
pub struct NullBackend {
    config: NullConfig,
    input: Arc<Vec<f32>>,
    thread: Option<JoinHandle<Vec<f32>>>,
    stop: Arc<AtomicBool>,
    input_finished: Arc<AtomicBool>,
    finished: Arc<AtomicBool>,
}

impl NullBackend {
    pub fn new(config: NullConfig, input: Vec<f32>) -> Result<Self> {
        if config.buffer_frames == 0 {
            return Err(RuntimeError::Device(
                "null backend: buffer_frames must be > 0".into(),
            ));
        }
        Ok(Self {
            config,
            input: Arc::new(input),
            thread: None,
            stop: Arc::new(AtomicBool::new(false)),
            input_finished: Arc::new(AtomicBool::new(false)),
            finished: Arc::new(AtomicBool::new(false)),
        })
    }
}

impl AudioBackend for NullBackend {
    fn describe(&self) -> String {
        format!(
            "null device ({:?}, {} frames per callback)",
            self.config.clock, self.config.buffer_frames
        )
    }
    fn input_format(&self) -> StreamFormat {
        self.config.input_format
    }
    fn output_format(&self) -> StreamFormat {
        self.config.output_format
    }
    fn start(
        &mut self,
        mut mic: SampleProducer,
        mut speaker: SampleConsumer,
        counters: Arc<AudioCounters>,
    ) -> Result<()> {
        let config = self.config.clone();
        let input = self.input.clone();
        let (stop, input_finished, finished) = (
            self.stop.clone(),
            self.input_finished.clone(),
            self.finished.clone(),
        );
        let thread = std::thread::Builder::new()
            .name("null-audio-device".into())
            .spawn(move || {
                let in_step = config.buffer_frames * config.input_format.channels as usize;
                let out_step = config.buffer_frames * config.output_format.channels as usize;
                let tick = Duration::from_secs_f64(
                    config.buffer_frames as f64 / config.output_format.sample_rate_hz as f64,
                );
                let mut out = vec![0f32; out_step];
                let mut played = Vec::with_capacity(if config.keep_played {
                    input.len() + 1
                } else {
                    0
                });
                // Position in the clip, loops started, samples captured in all.
                let mut pos = 0usize;
                let mut loops_done = 0u64;
                let mut captured = 0u64;
                let loops = config.input_loops.max(1);
                let mut idle_ticks = 0usize;
                let mut deadline = Instant::now();
                let tail_ticks = (config.tail_ms / 1e3 / tick.as_secs_f64()).ceil() as usize;
                // One device buffer of capture; a looping clip continues into its next loop
                // within the buffer (a short buffer at each loop's end would make the device
                // play more than it captured: an underrun a real device would not have).
                let mut tick_in = Vec::with_capacity(in_step);
                while !stop.load(Ordering::Relaxed) {
                    tick_in.clear();
                    while tick_in.len() < in_step && pos < input.len() {
                        let end = (pos + in_step - tick_in.len()).min(input.len());
                        tick_in.extend_from_slice(&input[pos..end]);
                        pos = end;
                        if pos == input.len() && loops_done + 1 < loops {
                            pos = 0;
                            loops_done += 1;
                        }
                    }
                    if !tick_in.is_empty() {
                        capture_callback(&tick_in, &mut mic, &counters, None);
                        captured += tick_in.len() as u64;
                        if pos == input.len() {
                            input_finished.store(true, Ordering::Release);
                        }
                    }
                    let all_captured = pos >= input.len() && loops_done + 1 >= loops;
                    if config.clock == NullClock::Lockstep {
                        // The engine must have handled everything captured so far before playback.
                        while counters
                            .engine_input_consumed_samples
                            .load(Ordering::Acquire)
                            < captured
                            && !stop.load(Ordering::Relaxed)
                        {
                            std::thread::sleep(Duration::from_micros(200));
                        }
                        if all_captured && speaker.slots() == 0 {
                            break;
                        }
                    }
                    playback_callback(&mut out, &mut speaker, &counters, None);
                    if config.keep_played {
                        played.extend_from_slice(&out);
                    }
                    if all_captured && config.clock != NullClock::Lockstep {
                        if speaker.slots() == 0 {
                            idle_ticks += 1;
                            if idle_ticks > tail_ticks {
                                break;
                            }
                        } else {
                            idle_ticks = 0;
                        }
                    }
                    if let NullClock::Paced { speed } = config.clock {
                        // Absolute deadlines: oversleeping one tick does not slow the clock down.
                        deadline += tick.div_f64(speed.max(1e-3));
                        let now = Instant::now();
                        if deadline > now {
                            std::thread::sleep(deadline - now);
                        }
                    }
                }
                finished.store(true, Ordering::Release);
                played
            })
            .map_err(|e| {
                RuntimeError::Device(format!("cannot start the null device thread: {e}"))
            })?;
        self.thread = Some(thread);
        Ok(())
    }
    fn input_finished(&self) -> bool {
        self.input_finished.load(Ordering::Acquire)
    }
    fn finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }
    fn stop(&mut self) -> Result<Vec<f32>> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| RuntimeError::Device("null device thread panicked".into())),
            None => Ok(Vec::new()),
        }
    }
}

/// Convenience for tests: the 24 kHz rate as f64.
pub const SAMPLE_RATE_F64: f64 = SAMPLE_RATE_HZ as f64;
