//! The engine thread: takes device samples from the mic ring, converts them to 24 kHz mono
//! (channel mix + rubato), runs a [`FrameProcessor`] on every 1920 samples, converts the answer
//! to the device format and feeds the speaker ring.
//!
//! Two policies: [`DropPolicy::Lossless`] (files, tests: every frame is processed, the engine
//! waits for room in the speaker ring) and [`DropPolicy::RealTime`] (live chat: when the model
//! falls behind, whole input frames are dropped deliberately, counted and reported, so latency
//! stays bounded). [`run_offline`] drives a processor over a whole signal with no rings at all
//! (file mode); the live engine must produce exactly the same output for the same input.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::echo_cancel::{EchoCancelConfig, EchoCanceller, EchoStats};
use crate::metrics::{FrameRecord, Metrics, StageTimings};
use crate::resample::StreamResampler;
use crate::ring::{AudioCounters, SampleConsumer, SampleProducer};
use crate::{Result, RuntimeError, FRAME_SAMPLES, SAMPLE_RATE_HZ};

/// Input chunk of the output resampler (24 kHz samples): 10 ms, so that resampling to the
/// device rate adds little latency (an FFT resampler delays by about one chunk).
const OUT_RESAMPLER_CHUNK: usize = 240;

/// Output queued ahead of a new frame beyond the jitter margin that triggers trimming (live mode).
pub const MAX_EXTRA_OUTPUT_QUEUE_MS: f64 = 60.0;

/// The tokens behind one output frame (for `--tokens-out`).
#[derive(Debug, Clone, PartialEq)]
pub struct FrameTokens {
    pub text: u32,
    pub audio: Vec<u32>,
    /// The extra heads' softmax outputs of the step, `[head][value]` (a speech-to-text model's
    /// voice activity; empty for a model without extra heads).
    pub extra_heads: Vec<Vec<f32>>,
}

/// What a processor returns for one 1920-sample input frame.
#[derive(Debug, Clone, Default)]
pub struct FrameOutput {
    /// Exactly [`FRAME_SAMPLES`] output samples (24 kHz mono).
    pub pcm: Vec<f32>,
    /// New text decoded in this frame, if any.
    pub text: Option<String>,
    /// The tokens of this output frame, when the processor has them.
    pub tokens: Option<FrameTokens>,
    /// Time per stage.
    pub timings: StageTimings,
}

impl FrameOutput {
    /// The same audio (bit for bit), tokens and text; timings aside.
    pub fn same_output(&self, other: &FrameOutput) -> bool {
        self.pcm.len() == other.pcm.len()
            && self
                .pcm
                .iter()
                .zip(&other.pcm)
                .all(|(x, y)| x.to_bits() == y.to_bits())
            && self.tokens == other.tokens
            && self.text == other.text
    }
}

/// One model step per 80 ms frame: 1920 samples (24 kHz mono) in, 1920 samples out. `Any`, so
/// that the processor an engine hands back ([`EngineHandle::join_with_processor`]) can be had as
/// its own type again.
pub trait FrameProcessor: Send + std::any::Any {
    fn process_frame(&mut self, pcm_in: &[f32]) -> Result<FrameOutput>;
}

/// Sample rate and channel count of one side of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamFormat {
    pub sample_rate_hz: u32,
    pub channels: u16,
}

impl StreamFormat {
    /// 24 kHz mono: Moshi's own format (no conversion).
    pub const MOSHI: StreamFormat = StreamFormat {
        sample_rate_hz: SAMPLE_RATE_HZ,
        channels: 1,
    };
}

/// What the engine does when it cannot keep up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropPolicy {
    /// Process every frame; wait for room in the speaker ring (files, tests).
    Lossless,
    /// Drop the oldest input frames when more than `max_backlog_frames` complete frames wait
    /// behind the one about to be processed (live audio).
    RealTime { max_backlog_frames: usize },
}

impl DropPolicy {
    /// How many of the oldest frames to drop when `waiting_frames` complete input frames wait,
    /// the one about to be processed included.
    pub fn frames_to_drop(self, waiting_frames: usize) -> usize {
        match self {
            DropPolicy::Lossless => 0,
            DropPolicy::RealTime { max_backlog_frames } => {
                waiting_frames.saturating_sub(max_backlog_frames + 1)
            }
        }
    }
}

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub input: StreamFormat,
    pub output: StreamFormat,
    pub drop_policy: DropPolicy,
    /// Silence queued ahead of the first output frame: a jitter margin so variations in
    /// compute time do not underrun the speaker (adds this much latency).
    pub prefill_ms: f64,
    /// How long the engine sleeps when there is nothing to do.
    pub poll_interval: Duration,
    /// Whether the answers go to the speaker ring; `false`: capture only (live speech to
    /// text), the output frames are recorded but never queued, and no jitter margin is.
    pub play_output: bool,
    /// Echo cancellation of the input with the output as its reference
    /// ([`crate::echo_cancel`]); only when the output is played.
    pub echo_cancel: Option<EchoCancelConfig>,
}

impl EngineConfig {
    /// Lossless, 24 kHz mono both ways, no prefill.
    pub fn lossless() -> Self {
        Self {
            input: StreamFormat::MOSHI,
            output: StreamFormat::MOSHI,
            drop_policy: DropPolicy::Lossless,
            prefill_ms: 0.0,
            poll_interval: Duration::from_micros(500),
            play_output: true,
            echo_cancel: None,
        }
    }
}

/// Takes every input frame with Moshi's answer to it (`--record`), on the engine thread, in
/// order: a dropped input frame comes with silence as its answer, so the two stay aligned.
/// It must not block: the engine is real-time (see [`crate::recorder`] for a queue to a
/// writing thread).
pub trait FrameRecorder: Send {
    /// One 24 kHz frame in and the one out, [`FRAME_SAMPLES`] samples each.
    fn record(&mut self, input: &[f32], output: &[f32]);

    /// An input frame the engine dropped (never processed); by default recorded with silence
    /// as its answer. A recorder of what the model was fed overrides it to leave it out.
    fn dropped(&mut self, input: &[f32]) {
        self.record(input, &SILENT_FRAME);
    }
}

/// Ring ends and counters handed to the engine, and where it records the conversation.
pub struct EngineIo {
    pub mic: SampleConsumer,
    pub speaker: SampleProducer,
    pub counters: Arc<AudioCounters>,
    pub recorder: Option<Box<dyn FrameRecorder>>,
    /// Takes every input frame as captured, before echo cancellation (`--record-raw-mic`); its
    /// output argument is the frame's answer as for `recorder`.
    pub raw_mic: Option<Box<dyn FrameRecorder>>,
}

/// Sent by the engine thread as it goes.
#[derive(Debug, Clone)]
pub enum EngineEvent {
    /// A frame was processed.
    Frame {
        record: FrameRecord,
        text: Option<String>,
        tokens: Option<FrameTokens>,
    },
    /// Input frames were dropped because the engine was behind (count of this batch).
    Dropped { frames: u64 },
}

/// What the engine thread returns when it ends.
#[derive(Debug, Default)]
pub struct EngineReport {
    pub metrics: Metrics,
    pub frames_processed: u64,
    pub frames_dropped: u64,
    /// Output samples (device side, all channels) dropped because the speaker ring was full.
    pub speaker_overflow_samples: u64,
    /// 24 kHz output samples skipped to bring latency back after playback fell behind.
    pub latency_trimmed_samples: u64,
    /// Times the engine was handed new rings (a device reopened).
    pub reconnects: u64,
    pub wall_s: f64,
    /// The echo canceller's state at the end (`None`: no echo cancellation).
    pub echo: Option<EchoStats>,
}

/// A running engine thread.
pub struct EngineHandle {
    thread: JoinHandle<Result<(EngineReport, Box<dyn FrameProcessor>)>>,
    stop: Arc<AtomicBool>,
    input_done: Arc<AtomicBool>,
    events: mpsc::Receiver<EngineEvent>,
    reconnect: mpsc::Sender<(Reconnect, mpsc::Sender<()>)>,
}

/// New ring ends (and device formats) for a running engine, after a device was reopened.
pub struct Reconnect {
    pub mic: SampleConsumer,
    pub speaker: SampleProducer,
    pub input: StreamFormat,
    pub output: StreamFormat,
}

impl EngineHandle {
    /// Hands the engine new rings (a reopened device). It drops what it had buffered for the
    /// old device, rebuilds its converters for the new formats and queues the jitter margin again.
    /// Returns once the engine uses the new rings (so the device can start right after).
    pub fn reconnect(&self, r: Reconnect) -> Result<()> {
        let ended = || RuntimeError::EngineEnded;
        let (ack_tx, ack_rx) = mpsc::channel();
        self.reconnect.send((r, ack_tx)).map_err(|_| ended())?;
        ack_rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| ended())
    }
    /// Events (frames, drops) as they happen.
    pub fn events(&self) -> &mpsc::Receiver<EngineEvent> {
        &self.events
    }
    /// Asks the thread to stop as soon as possible.
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
    /// Tells the thread no more input is coming: it processes every complete frame left, then ends.
    /// Release, paired with the engine's Acquire load: input pushed before this call is seen.
    pub fn input_done(&self) {
        self.input_done.store(true, Ordering::Release);
    }
    /// Whether the thread has ended.
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }
    /// Waits for the thread and returns its report (or the processor's error).
    pub fn join(self) -> Result<EngineReport> {
        Ok(self.join_with_processor()?.0)
    }

    /// [`Self::join`], and the processor back, in the state its last frame left it (to go on
    /// with it off the engine: a speech-to-text stream's flush at the end of listening).
    pub fn join_with_processor(self) -> Result<(EngineReport, Box<dyn FrameProcessor>)> {
        self.thread
            .join()
            .map_err(|_| RuntimeError::EnginePanicked)?
    }
}

/// Starts the engine thread.
pub fn spawn_engine(
    processor: Box<dyn FrameProcessor>,
    config: EngineConfig,
    io: EngineIo,
) -> Result<EngineHandle> {
    let stop = Arc::new(AtomicBool::new(false));
    let input_done = Arc::new(AtomicBool::new(false));
    let (events, events_rx) = mpsc::channel();
    let (reconnect_tx, reconnects) = mpsc::channel();
    let echo = match config.echo_cancel {
        Some(c) if config.play_output => Some(EchoCanceller::new(c)?),
        _ => None,
    };
    let mut state = EngineState {
        device: DeviceSide::new(config.input, config.output, io.mic, io.speaker)?,
        echo,
        raw_mic: io.raw_mic,
        raw_frame: vec![0.0; FRAME_SAMPLES],
        processor,
        drop_policy: config.drop_policy,
        prefill_ms: config.prefill_ms,
        poll_interval: config.poll_interval,
        play_output: config.play_output,
        counters: io.counters,
        recorder: io.recorder,
        stop: stop.clone(),
        input_done: input_done.clone(),
        events,
        reconnects,
        frame: vec![0.0; FRAME_SAMPLES],
        report: EngineReport::default(),
        started: Instant::now(),
    };
    let thread = std::thread::Builder::new()
        .name("moshi-engine".into())
        .spawn(move || {
            let report = state.run()?;
            Ok((report, state.processor))
        })
        .map_err(|cause| RuntimeError::EngineSpawn { cause })?;
    Ok(EngineHandle {
        thread,
        stop,
        input_done,
        events: events_rx,
        reconnect: reconnect_tx,
    })
}

/// Silence recorded as Moshi's answer to a dropped input frame (by default).
static SILENT_FRAME: [f32; FRAME_SAMPLES] = [0.0; FRAME_SAMPLES];

/// What belongs to the devices in use: their ring ends and formats, the converters between
/// them and 24 kHz mono, and what those hold. A reopened device gets a new one, so nothing
/// buffered for the old device reaches the new one.
struct DeviceSide {
    mic: SampleConsumer,
    speaker: SampleProducer,
    input: StreamFormat,
    output: StreamFormat,
    in_resampler: StreamResampler,
    out_resampler: StreamResampler,
    interleaved_in: Vec<f32>,
    mono_in: Vec<f32>,
    mono_out: Vec<f32>,
    interleaved_out: Vec<f32>,
    /// Whether the jitter margin has been queued ahead of this device's first frame.
    prefilled: bool,
    /// Device samples taken from this device's mic ring.
    drained_samples: u64,
}

impl DeviceSide {
    fn new(
        input: StreamFormat,
        output: StreamFormat,
        mic: SampleConsumer,
        speaker: SampleProducer,
    ) -> Result<Self> {
        for (side, f) in [("input", input), ("output", output)] {
            if f.channels == 0 || f.sample_rate_hz == 0 {
                return Err(RuntimeError::Device(format!(
                    "{side} format {f:?}: need >= 1 channel and a rate > 0"
                )));
            }
        }
        let mic_capacity = mic.buffer().capacity();
        let in_chunk = (input.sample_rate_hz as usize / 100).max(1); // 10 ms
        let in_resampler = StreamResampler::new(
            input.sample_rate_hz,
            SAMPLE_RATE_HZ,
            in_chunk,
            mic_capacity + 4 * FRAME_SAMPLES,
        )?;
        let out_resampler = StreamResampler::new(
            SAMPLE_RATE_HZ,
            output.sample_rate_hz,
            OUT_RESAMPLER_CHUNK,
            8 * FRAME_SAMPLES * (output.sample_rate_hz as usize / SAMPLE_RATE_HZ as usize + 1),
        )?;
        let out_frame_max =
            FRAME_SAMPLES * (output.sample_rate_hz as usize).div_ceil(SAMPLE_RATE_HZ as usize) * 4;
        Ok(Self {
            mic,
            speaker,
            input,
            output,
            in_resampler,
            out_resampler,
            interleaved_in: Vec::with_capacity(mic_capacity),
            mono_in: Vec::with_capacity(mic_capacity),
            mono_out: vec![0.0; out_frame_max],
            interleaved_out: Vec::with_capacity(out_frame_max * output.channels as usize),
            prefilled: false,
            drained_samples: 0,
        })
    }

    /// Moves everything in the mic ring through channel mixing and resampling. Returns whether
    /// anything was read.
    fn drain_mic(&mut self) -> Result<bool> {
        let channels = self.input.channels as usize;
        let available = self.mic.slots() / channels * channels;
        if available == 0 {
            return Ok(false);
        }
        let chunk = self
            .mic
            .read_chunk(available)
            .map_err(|cause| RuntimeError::MicRing {
                requested: available,
                cause,
            })?;
        self.drained_samples += available as u64;
        let (a, b) = chunk.as_slices();
        self.interleaved_in.clear();
        self.interleaved_in.extend_from_slice(a);
        self.interleaved_in.extend_from_slice(b);
        chunk.commit_all();
        self.mono_in.clear();
        if channels == 1 {
            self.mono_in.extend_from_slice(&self.interleaved_in);
        } else {
            let inv = 1.0 / channels as f32;
            self.mono_in.extend(
                self.interleaved_in
                    .chunks_exact(channels)
                    .map(|f| f.iter().sum::<f32>() * inv),
            );
        }
        self.in_resampler.push(&self.mono_in)?;
        Ok(true)
    }

    /// Complete 24 kHz input frames waiting.
    fn frames_waiting(&self) -> usize {
        self.in_resampler.available() / FRAME_SAMPLES
    }

    /// Input waiting behind the frame just taken, in ms: the input resampler's ready output,
    /// pending input and group delay, and the mic ring.
    fn mic_backlog_ms(&self) -> f64 {
        let ring_samples_24k = (self.mic.slots() / self.input.channels as usize) as f64
            * SAMPLE_RATE_HZ as f64
            / self.input.sample_rate_hz as f64;
        let samples = self.in_resampler.available() as f64
            + self.in_resampler.delay_out_samples()
            + ring_samples_24k;
        samples * 1e3 / SAMPLE_RATE_HZ as f64
    }

    /// 24 kHz samples between the speaker sample pushed last and the one that was playing when
    /// the last input frame's last sample was captured: the output queued ahead (speaker ring,
    /// output resampler, the host's playback latency) and the input behind the frame (the host's
    /// capture latency, `mic_backlog_ms`).
    fn loop_delay_samples(&self, counters: &AudioCounters, mic_backlog_ms: f64) -> f64 {
        let c = counters.snapshot();
        let ms = self.queued_output_ms()
            + self.out_resampler_delay_ms()
            + c.output_device_latency_us as f64 / 1e3
            + c.input_device_latency_us as f64 / 1e3
            + mic_backlog_ms;
        ms * SAMPLE_RATE_HZ as f64 / 1e3
    }

    /// Output already queued in the speaker ring, in ms of audio.
    fn queued_output_ms(&self) -> f64 {
        let cap = self.speaker.buffer().capacity();
        let queued = cap - self.speaker.slots();
        queued as f64 / self.output.channels as f64 * 1e3 / self.output.sample_rate_hz as f64
    }

    /// What the output resampler holds back (pending input and group delay), in ms.
    fn out_resampler_delay_ms(&self) -> f64 {
        self.out_resampler.delay_out_samples() * 1e3 / f64::from(self.output.sample_rate_hz.max(1))
    }
}

/// The engine thread's state: the processor and the conversation's accounting, which live as
/// long as the engine, and the [`DeviceSide`], replaced when a device is reopened.
struct EngineState {
    processor: Box<dyn FrameProcessor>,
    device: DeviceSide,
    /// The echo canceller, when the input is cleaned of the output's echo.
    echo: Option<EchoCanceller>,
    raw_mic: Option<Box<dyn FrameRecorder>>,
    /// The input frame being handled as captured (before echo cancellation).
    raw_frame: Vec<f32>,
    drop_policy: DropPolicy,
    prefill_ms: f64,
    poll_interval: Duration,
    play_output: bool,
    counters: Arc<AudioCounters>,
    recorder: Option<Box<dyn FrameRecorder>>,
    stop: Arc<AtomicBool>,
    input_done: Arc<AtomicBool>,
    events: mpsc::Sender<EngineEvent>,
    reconnects: mpsc::Receiver<(Reconnect, mpsc::Sender<()>)>,
    /// The 24 kHz input frame being handled.
    frame: Vec<f32>,
    report: EngineReport,
    started: Instant,
}

impl EngineState {
    fn run(&mut self) -> Result<EngineReport> {
        self.started = Instant::now();
        loop {
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            if let Ok((r, ack)) = self.reconnects.try_recv() {
                self.apply_reconnect(r)?;
                let _ = ack.send(());
            }
            // Read the flag before draining: input pushed before it was set is then drained too.
            let input_done = self.input_done.load(Ordering::Acquire);
            let (got_input, processed) = self.process_available()?;
            if input_done && !got_input && self.device.frames_waiting() == 0 {
                break;
            }
            if !got_input && !processed {
                std::thread::sleep(self.poll_interval);
            }
        }
        self.report.wall_s = self.started.elapsed().as_secs_f64();
        self.report.echo = self.echo.as_ref().map(EchoCanceller::stats);
        Ok(std::mem::take(&mut self.report))
    }

    /// Same processor, same conversation; a fresh device side for the new device.
    fn apply_reconnect(&mut self, r: Reconnect) -> Result<()> {
        self.device = DeviceSide::new(r.input, r.output, r.mic, r.speaker)?;
        if let Some(echo) = &mut self.echo {
            echo.realign();
        }
        // Release: the lockstep clock's Acquire load then counts from the new device's start.
        self.counters
            .engine_input_consumed_samples
            .store(0, Ordering::Release);
        self.report.reconnects += 1;
        Ok(())
    }

    /// Drains the mic ring and processes (or drops) every complete frame, draining again before
    /// each decision so the backlog seen is current. Returns (read any input, handled any frame).
    fn process_available(&mut self) -> Result<(bool, bool)> {
        let mut got_input = false;
        let mut handled = false;
        let mut dropped_now = 0u64;
        loop {
            got_input |= self.device.drain_mic()?;
            let waiting = self.device.frames_waiting();
            if waiting == 0 || self.stop.load(Ordering::Relaxed) {
                break;
            }
            handled = true;
            if self.drop_policy.frames_to_drop(waiting) > 0 {
                self.drop_frame();
                dropped_now += 1;
            } else {
                self.process_frame()?;
            }
        }
        if dropped_now > 0 {
            // The receiver may be gone (nobody listening): not an error.
            let _ = self.events.send(EngineEvent::Dropped {
                frames: dropped_now,
            });
        }
        // Release: see `AudioCounters` (the lockstep clock plays what these samples produced).
        self.counters
            .engine_input_consumed_samples
            .store(self.device.drained_samples, Ordering::Release);
        Ok((got_input, handled))
    }

    /// Drops the oldest waiting frame (the engine is behind): handed to the recorder as
    /// dropped ([`FrameRecorder::dropped`]), and counted.
    fn drop_frame(&mut self) {
        self.device.in_resampler.pop_into(&mut self.frame);
        if let Some(recorder) = &mut self.recorder {
            recorder.dropped(&self.frame);
        }
        if let Some(raw) = &mut self.raw_mic {
            raw.dropped(&self.frame);
        }
        if let Some(echo) = &mut self.echo {
            echo.skip_frame();
        }
        self.report.frames_dropped += 1;
        self.counters
            .engine_frames_dropped
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Runs the processor on the oldest waiting frame, queues its answer for the speaker (after
    /// the jitter margin, trimmed when playback fell behind), records it and reports it.
    fn process_frame(&mut self) -> Result<()> {
        self.device.in_resampler.pop_into(&mut self.frame);
        let mic_backlog_ms = self.device.mic_backlog_ms();
        self.cancel_echo(mic_backlog_ms)?;
        let (out, total_ms) = self.run_processor()?;
        let ring_queue_ms = self.device.queued_output_ms();
        // What a sample pushed now waits for: the ring's queue and the output resampler.
        let speaker_queue_ms = ring_queue_ms + self.device.out_resampler_delay_ms();
        if self.play_output {
            self.prefill_once()?;
            let skip = self.latency_trim(ring_queue_ms);
            self.push_output(&out.pcm[skip..])?;
        }
        self.record(&out.pcm);
        if let Some(raw) = &mut self.raw_mic {
            raw.record(&self.raw_frame, &out.pcm);
        }
        let record = FrameRecord {
            event: "frame",
            frame: self.report.frames_processed,
            t_ms: self.started.elapsed().as_secs_f64() * 1e3,
            total_ms,
            stages: out.timings,
            mic_backlog_ms,
            speaker_queue_ms,
            echo: self.echo.as_ref().map(|e| Box::new(e.stats())),
        };
        self.publish_frame(record, out.text, out.tokens);
        Ok(())
    }

    /// Keeps the frame as captured (`raw_frame`) and removes the output's echo from `frame`,
    /// the reference aligned with the loop delay measured now (before the frame's output is
    /// pushed: the history and the speaker queue are read at the same moment).
    fn cancel_echo(&mut self, mic_backlog_ms: f64) -> Result<()> {
        self.raw_frame.copy_from_slice(&self.frame);
        let Some(echo) = &mut self.echo else {
            return Ok(());
        };
        let loop_delay = self
            .device
            .loop_delay_samples(&self.counters, mic_backlog_ms);
        echo.process(&mut self.frame, loop_delay)
    }

    /// The processor's answer to `self.frame` (checked to be one frame) and its time, ms.
    fn run_processor(&mut self) -> Result<(FrameOutput, f64)> {
        let t0 = Instant::now();
        let out = self.processor.process_frame(&self.frame)?;
        let total_ms = t0.elapsed().as_secs_f64() * 1e3;
        if out.pcm.len() != FRAME_SAMPLES {
            return Err(RuntimeError::FrameSize {
                expected: FRAME_SAMPLES,
                got: out.pcm.len(),
            });
        }
        Ok((out, total_ms))
    }

    /// Queues the jitter margin's silence ahead of the device's first frame.
    fn prefill_once(&mut self) -> Result<()> {
        if self.device.prefilled {
            return Ok(());
        }
        self.device.prefilled = true;
        let prefill = (self.prefill_ms * SAMPLE_RATE_HZ as f64 / 1e3).round() as usize;
        if prefill > 0 {
            self.push_output(&vec![0.0; prefill])?;
        }
        Ok(())
    }

    /// Latency bound on the output side (live mode): if playback fell behind (a stalled or
    /// starved output stream), the queue ahead of this frame grows and would stay grown. Returns
    /// how many samples to skip from the frame's start so that latency returns to the target.
    fn latency_trim(&mut self, ring_queue_ms: f64) -> usize {
        let DropPolicy::RealTime { .. } = self.drop_policy else {
            return 0;
        };
        if ring_queue_ms <= self.prefill_ms + MAX_EXTRA_OUTPUT_QUEUE_MS {
            return 0;
        }
        let excess_ms = ring_queue_ms - self.prefill_ms;
        let skip = ((excess_ms * SAMPLE_RATE_HZ as f64 / 1e3).round() as usize).min(FRAME_SAMPLES);
        self.report.latency_trimmed_samples += skip as u64;
        self.counters
            .engine_output_trim_events
            .fetch_add(1, Ordering::Relaxed);
        skip
    }

    /// Hands `self.frame` and its answer to the recorder, if any.
    fn record(&mut self, output: &[f32]) {
        if let Some(recorder) = &mut self.recorder {
            recorder.record(&self.frame, output);
        }
    }

    /// Counts a processed frame, adds it to the metrics and sends its event.
    fn publish_frame(
        &mut self,
        record: FrameRecord,
        text: Option<String>,
        tokens: Option<FrameTokens>,
    ) {
        self.report.frames_processed += 1;
        self.counters
            .engine_frames_processed
            .fetch_add(1, Ordering::Relaxed);
        self.report.metrics.push(&record);
        // The receiver may be gone (nobody listening): not an error.
        let _ = self.events.send(EngineEvent::Frame {
            record,
            text,
            tokens,
        });
    }

    /// 24 kHz mono -> device rate and channels -> speaker ring.
    fn push_output(&mut self, pcm: &[f32]) -> Result<()> {
        let channels = self.device.output.channels as usize;
        for piece in pcm.chunks(FRAME_SAMPLES) {
            if let Some(echo) = &mut self.echo {
                echo.played(piece);
            }
            self.device.out_resampler.push(piece)?;
            loop {
                let n = self
                    .device
                    .out_resampler
                    .pop_into(&mut self.device.mono_out);
                if n == 0 {
                    break;
                }
                let out = &mut self.device.interleaved_out;
                out.clear();
                for &s in &self.device.mono_out[..n] {
                    out.extend(std::iter::repeat_n(s, channels));
                }
                self.write_speaker();
            }
        }
        Ok(())
    }

    /// Pushes `device.interleaved_out` into the speaker ring: waiting for room (lossless), or
    /// dropping and counting what does not fit (live).
    fn write_speaker(&mut self) {
        let mut rest: &[f32] = &self.device.interleaved_out;
        loop {
            let (_, left) = self.device.speaker.push_partial_slice(rest);
            rest = left;
            if rest.is_empty() {
                return;
            }
            match self.drop_policy {
                DropPolicy::Lossless => {
                    if self.stop.load(Ordering::Relaxed) || self.device.speaker.is_abandoned() {
                        return;
                    }
                    std::thread::sleep(self.poll_interval);
                }
                DropPolicy::RealTime { .. } => {
                    self.report.speaker_overflow_samples += rest.len() as u64;
                    self.counters
                        .engine_speaker_overflow_events
                        .fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
        }
    }
}

/// Runs frames through a processor one at a time with no rings (file mode), timing each and
/// keeping the run's [`Metrics`] (bounded memory): the frame loop of [`run_offline`] and of
/// streaming file processing.
pub struct OfflineRunner {
    started: Instant,
    metrics: Metrics,
}

impl Default for OfflineRunner {
    fn default() -> Self {
        Self::new()
    }
}

impl OfflineRunner {
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            metrics: Metrics::default(),
        }
    }

    /// Frames processed so far.
    pub fn frames(&self) -> u64 {
        self.metrics.frames()
    }

    /// Processes one 24 kHz frame; returns its timing record and the processor's output (whose
    /// PCM is checked to be one frame).
    pub fn process(
        &mut self,
        processor: &mut dyn FrameProcessor,
        frame: &[f32],
    ) -> Result<(FrameRecord, FrameOutput)> {
        self.run(|| processor.process_frame(frame))
    }

    /// Times one processor call (a frame, or another step such as a translation model's
    /// end-of-input step), checks its output is one frame and records it.
    pub fn run(
        &mut self,
        call: impl FnOnce() -> Result<FrameOutput>,
    ) -> Result<(FrameRecord, FrameOutput)> {
        let index = self.metrics.frames();
        let t0 = Instant::now();
        let o = {
            let _span = tracing::trace_span!("frame", index).entered();
            call()?
        };
        let total_ms = t0.elapsed().as_secs_f64() * 1e3;
        if o.pcm.len() != FRAME_SAMPLES {
            return Err(RuntimeError::FrameSize {
                expected: FRAME_SAMPLES,
                got: o.pcm.len(),
            });
        }
        let record = FrameRecord {
            event: "frame",
            frame: index,
            t_ms: self.started.elapsed().as_secs_f64() * 1e3,
            total_ms,
            stages: o.timings,
            ..Default::default()
        };
        self.metrics.push(&record);
        Ok((record, o))
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn into_metrics(self) -> Metrics {
        self.metrics
    }
}

/// Runs `processor` over a whole 24 kHz mono signal, frame by frame, with no rings (file mode).
/// Only whole frames are processed (T = len / 1920 frames in, T frames out). `on_frame` sees
/// every frame's output as it is produced (outside the frame's time). Each frame runs in a
/// `frame` trace span ([`OfflineRunner`]). `moshi-rs bench` drives its frames through here too.
pub fn run_offline(
    processor: &mut dyn FrameProcessor,
    pcm: &[f32],
    mut on_frame: impl FnMut(u64, &FrameOutput),
) -> Result<(Vec<f32>, Metrics)> {
    let frames = pcm.len() / FRAME_SAMPLES;
    let mut out = Vec::with_capacity(frames * FRAME_SAMPLES);
    let mut runner = OfflineRunner::new();
    for (i, frame) in pcm.chunks_exact(FRAME_SAMPLES).enumerate() {
        let (_, o) = runner.process(processor, frame)?;
        out.extend_from_slice(&o.pcm);
        on_frame(i as u64, &o);
    }
    Ok((out, runner.into_metrics()))
}
