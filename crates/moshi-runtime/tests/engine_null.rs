//! Engine tests on the null backend (virtual clock) with test-double frame processors:
//! frame accounting, lockstep output == offline output, deliberate frame dropping with bounded
//! backlog under a slow processor, and device-format conversion (48 kHz stereo) round trips.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use moshi_runtime::backend::null::{NullBackend, NullClock, NullConfig};
use moshi_runtime::backend::{start_session, AudioBackend, RingSizes, Session};
use moshi_runtime::engine::{
    run_offline, DropPolicy, EngineEvent, FrameOutput, FrameProcessor, FrameRecorder, StreamFormat,
};
use moshi_runtime::metrics::FrameRecord;
use moshi_runtime::{wav, FRAME_SAMPLES};
use moshi_test_support::tiny_a;

/// Test double: a stateful echo (output = 0.5 * input delayed by `delay` samples), plus a text
/// piece every 4 frames. Any lost, repeated or misaligned sample changes its output.
struct Echo {
    history: Vec<f32>,
    frames: u64,
    sleep: Duration,
}

impl Echo {
    fn new(delay: usize, sleep: Duration) -> Self {
        Self {
            history: vec![0.0; delay],
            frames: 0,
            sleep,
        }
    }
}

impl FrameProcessor for Echo {
    fn process_frame(&mut self, pcm_in: &[f32]) -> moshi_runtime::Result<FrameOutput> {
        assert_eq!(pcm_in.len(), FRAME_SAMPLES);
        if !self.sleep.is_zero() {
            std::thread::sleep(self.sleep);
        }
        self.history.extend_from_slice(pcm_in);
        let pcm: Vec<f32> = self.history[..FRAME_SAMPLES]
            .iter()
            .map(|x| 0.5 * x)
            .collect();
        self.history.drain(..FRAME_SAMPLES);
        self.frames += 1;
        let text = self
            .frames
            .is_multiple_of(4)
            .then(|| format!(" w{}", self.frames));
        Ok(FrameOutput {
            pcm,
            text,
            ..Default::default()
        })
    }
}

/// Keeps what the engine records (input, output), for the assertions.
#[derive(Clone, Default)]
struct Kept(Arc<Mutex<(Vec<f32>, Vec<f32>)>>);

impl FrameRecorder for Kept {
    fn record(&mut self, input: &[f32], output: &[f32]) {
        let mut kept = self.0.lock().unwrap();
        kept.0.extend_from_slice(input);
        kept.1.extend_from_slice(output);
    }
}

impl Kept {
    fn recorder(&self) -> Option<Box<dyn FrameRecorder>> {
        Some(Box::new(self.clone()))
    }
    fn take(&self) -> (Vec<f32>, Vec<f32>) {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// A session of `backend` around an echo with no delay and no compute time.
fn echo_session(backend: &mut NullBackend, policy: DropPolicy) -> Session {
    start_session(
        backend,
        Box::new(Echo::new(0, Duration::ZERO)),
        policy,
        0.0,
        None,
        RingSizes::default(),
    )
    .unwrap()
}

/// A lockstep null device of `fmt` both ways that plays 500 ms past its input, once.
fn lockstep_config(fmt: StreamFormat) -> NullConfig {
    NullConfig {
        buffer_frames: 960,
        clock: NullClock::Lockstep,
        input_format: fmt,
        output_format: fmt,
        tail_ms: 500.0,
        input_loops: 1,
        keep_played: true,
    }
}

fn input_wav() -> Vec<f32> {
    wav::read_mono(&tiny_a("input.wav")).unwrap().samples
}

/// The frame records among `events`.
fn frame_records(events: &[EngineEvent]) -> impl Iterator<Item = &FrameRecord> {
    events.iter().filter_map(|e| match e {
        EngineEvent::Frame { record, .. } => Some(record),
        _ => None,
    })
}

fn run_to_end(
    backend: &mut dyn AudioBackend,
    session: moshi_runtime::backend::Session,
) -> (
    Vec<f32>,
    moshi_runtime::engine::EngineReport,
    Vec<EngineEvent>,
) {
    while !backend.finished() {
        std::thread::sleep(Duration::from_millis(2));
    }
    session.engine.input_done();
    let played = backend.stop().unwrap();
    let events: Vec<EngineEvent> = std::iter::from_fn(|| {
        session
            .engine
            .events()
            .recv_timeout(Duration::from_millis(1))
            .ok()
    })
    .collect();
    let mut rest = Vec::new();
    let report = session.engine.join().unwrap();
    rest.extend(events);
    (played, report, rest)
}

#[test]
fn lockstep_output_equals_offline_output_and_frames_add_up() {
    let input = input_wav();
    let frames = input.len() / FRAME_SAMPLES;
    let (offline, offline_metrics) =
        run_offline(&mut Echo::new(700, Duration::ZERO), &input, |_, _| {}).unwrap();
    assert_eq!(offline.len(), frames * FRAME_SAMPLES);
    assert_eq!(offline_metrics.frames(), frames as u64);

    let mut backend =
        NullBackend::new(NullConfig::moshi(NullClock::Lockstep), input.clone()).unwrap();
    let kept = Kept::default();
    let session = start_session(
        &mut backend,
        Box::new(Echo::new(700, Duration::ZERO)),
        DropPolicy::RealTime {
            max_backlog_frames: 1,
        },
        0.0,
        kept.recorder(),
        RingSizes::default(),
    )
    .unwrap();
    let counters = session.counters.clone();
    let (played, report, events) = run_to_end(&mut backend, session);
    let c = counters.snapshot();

    assert_eq!(report.frames_processed as usize, frames);
    assert_eq!(report.frames_dropped, 0);
    assert_eq!(c.captured_samples as usize, input.len());
    assert_eq!(c.overrun_samples, 0);
    assert_eq!(
        c.underrun_samples, 0,
        "lockstep playback must never underrun"
    );
    assert_eq!(c.played_samples as usize, frames * FRAME_SAMPLES);
    // Speaker = startup silence, then exactly the offline output.
    let startup = c.startup_silence_samples as usize;
    assert_eq!(
        startup,
        FRAME_SAMPLES - 480,
        "first frame completes on the 4th 480-sample callback"
    );
    assert!(played[..startup].iter().all(|&s| s == 0.0));
    assert_eq!(&played[startup..startup + offline.len()], &offline[..]);
    // --record data: input and output frame-aligned.
    let (recorded_input, recorded_output) = kept.take();
    assert_eq!(recorded_input, input[..frames * FRAME_SAMPLES]);
    assert_eq!(recorded_output, offline);
    // One event per frame, text every 4th frame.
    let texts: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            EngineEvent::Frame { text, .. } => text.clone(),
            _ => None,
        })
        .collect();
    assert_eq!(texts.len(), frames / 4);
    assert_eq!(texts[0], " w4");
}

#[test]
fn slow_processor_drops_frames_keeps_backlog_bounded_and_accounts_for_every_frame() {
    let input = input_wav();
    let frames = (input.len() / FRAME_SAMPLES) as u64;
    // Virtual clock 8x real time: a frame arrives every 10 ms; the processor takes 40 ms,
    // i.e. 4x slower than (virtual) real time.
    let mut backend = NullBackend::new(
        NullConfig::moshi(NullClock::Paced { speed: 8.0 }),
        input.clone(),
    )
    .unwrap();
    let max_backlog_frames = 1;
    let kept = Kept::default();
    let session = start_session(
        &mut backend,
        Box::new(Echo::new(0, Duration::from_millis(40))),
        DropPolicy::RealTime { max_backlog_frames },
        0.0,
        kept.recorder(),
        RingSizes::default(),
    )
    .unwrap();
    let counters = session.counters.clone();
    let (_played, report, events) = run_to_end(&mut backend, session);
    let c = counters.snapshot();
    assert_eq!(c.captured_samples as usize, input.len());
    assert_eq!(
        c.overrun_samples, 0,
        "the engine drains the mic ring even when the model is slow"
    );
    eprintln!(
        "processed {} dropped {} wall {:.3}s backlogs {:?}",
        report.frames_processed,
        report.frames_dropped,
        report.wall_s,
        frame_records(&events)
            .map(|r| r.mic_backlog_ms as i64)
            .collect::<Vec<_>>()
    );
    assert!(
        report.frames_dropped > 0,
        "a 4x-too-slow processor must drop frames"
    );
    assert_eq!(
        report.frames_processed + report.frames_dropped,
        frames,
        "every complete frame is processed or dropped"
    );
    assert_eq!(c.engine_frames_dropped, report.frames_dropped);
    let dropped_events: u64 = events
        .iter()
        .map(|e| match e {
            EngineEvent::Dropped { frames } => *frames,
            _ => 0,
        })
        .sum();
    assert_eq!(dropped_events, report.frames_dropped);
    // Backlog behind a frame when it is taken: at most max_backlog frames + one callback.
    let bound_ms = (max_backlog_frames as f64 + 1.0) * 80.0 + 20.0;
    assert_eq!(report.metrics.frames(), report.frames_processed);
    for r in frame_records(&events) {
        assert!(
            r.mic_backlog_ms <= bound_ms,
            "frame {}: backlog {} ms > {bound_ms} ms",
            r.frame,
            r.mic_backlog_ms
        );
    }
    // Recording keeps alignment: dropped frames are silence on the right channel.
    let (recorded_input, recorded_output) = kept.take();
    assert_eq!(recorded_input.len() as u64, frames * FRAME_SAMPLES as u64);
    assert_eq!(recorded_output.len(), recorded_input.len());
    // The speaker underran (the model is too slow), and that is counted.
    assert!(c.underrun_samples > 0);
}

#[test]
fn device_formats_48k_stereo_round_trip_through_the_engine() {
    // 24 kHz speech -> a "48 kHz stereo device" -> engine (mix, resample) -> identity-ish echo
    // -> resample, upmix -> speaker. The played left channel, brought back to 24 kHz, must be
    // the echo of the input (normalised cross-correlation at the best lag).
    let input24 = input_wav();
    let up = moshi_runtime::resample::resample_to(&input24, 24_000, 48_000).unwrap();
    let stereo: Vec<f32> = up.iter().flat_map(|&s| [s, s]).collect();
    let fmt = StreamFormat {
        sample_rate_hz: 48_000,
        channels: 2,
    };
    let config = lockstep_config(fmt);
    let mut backend = NullBackend::new(config, stereo).unwrap();
    let session = echo_session(&mut backend, DropPolicy::Lossless);
    let counters = session.counters.clone();
    let (played, report, _) = run_to_end(&mut backend, session);
    assert!(report.frames_processed >= (input24.len() / FRAME_SAMPLES) as u64 - 1);
    assert_eq!(counters.snapshot().overrun_samples, 0);
    assert_eq!(counters.snapshot().underrun_samples, 0);
    let left: Vec<f32> = played.chunks_exact(2).map(|f| f[0]).collect();
    let right: Vec<f32> = played.chunks_exact(2).map(|f| f[1]).collect();
    assert_eq!(left, right, "mono output is duplicated on both channels");
    let back = moshi_runtime::resample::resample_to(&left, 48_000, 24_000).unwrap();
    let (lag, ncc) = best_lag_ncc(&input24, &back, 24_000);
    eprintln!("48k stereo round trip: lag {lag} samples, ncc {ncc:.5}");
    assert!(ncc > 0.99, "ncc {ncc} at lag {lag}");
}

/// Brute-force best lag (recording later than reference) and its normalised correlation.
fn best_lag_ncc(reference: &[f32], rec: &[f32], max_lag: usize) -> (usize, f64) {
    let mut best = (0, -1.0);
    for lag in 0..max_lag.min(rec.len()) {
        let n = reference.len().min(rec.len() - lag);
        let (mut xy, mut xx, mut yy) = (0f64, 0f64, 0f64);
        for i in (0..n).step_by(3) {
            let (x, y) = (reference[i] as f64, rec[i + lag] as f64);
            xy += x * y;
            xx += x * x;
            yy += y * y;
        }
        let ncc = xy / (xx * yy).sqrt().max(1e-20);
        if ncc > best.1 {
            best = (lag, ncc);
        }
    }
    best
}

#[test]
fn stalled_playback_is_trimmed_back_to_bounded_latency() {
    // Drive the engine's rings by hand: 20 frames of input arrive while nothing is played.
    use moshi_runtime::engine::{spawn_engine, EngineConfig, EngineIo, MAX_EXTRA_OUTPUT_QUEUE_MS};
    use moshi_runtime::ring::{sample_ring, AudioCounters};
    let (mut mic_p, mic_c) = sample_ring(48_000);
    let (spk_p, spk_c) = sample_ring(48_000);
    let counters = Arc::new(AudioCounters::default());
    let prefill_ms = 20.0;
    let config = EngineConfig {
        drop_policy: DropPolicy::RealTime {
            max_backlog_frames: 100,
        },
        prefill_ms,
        ..EngineConfig::lossless()
    };
    let engine = spawn_engine(
        Box::new(Echo::new(0, Duration::ZERO)),
        config,
        EngineIo {
            mic: mic_c,
            speaker: spk_p,
            counters: counters.clone(),
            recorder: None,
            raw_mic: None,
        },
    )
    .unwrap();
    for _ in 0..20 {
        let _ = mic_p.push_partial_slice(&[0.1; FRAME_SAMPLES]);
        std::thread::sleep(Duration::from_millis(5));
    }
    engine.input_done();
    let report = engine.join().unwrap();
    assert_eq!(report.frames_processed, 20);
    assert!(report.latency_trimmed_samples > 0);
    // What waits in the speaker ring stays within the jitter margin + the allowance + one frame.
    let queued_ms = spk_c.slots() as f64 / 24.0;
    assert!(
        queued_ms <= prefill_ms + MAX_EXTRA_OUTPUT_QUEUE_MS + 80.0,
        "queued {queued_ms} ms"
    );
    assert_eq!(
        spk_c.slots() as u64 + report.latency_trimmed_samples,
        20 * FRAME_SAMPLES as u64 + (prefill_ms * 24.0) as u64,
        "every output sample is either queued or counted as trimmed"
    );
}

#[test]
fn a_lost_device_is_replaced_and_the_conversation_goes_on() {
    // First device: 24 kHz mono, stopped after its input ends (as if it disappeared).
    let input = input_wav();
    let frames = (input.len() / FRAME_SAMPLES) as u64;
    let mut first =
        NullBackend::new(NullConfig::moshi(NullClock::Lockstep), input.clone()).unwrap();
    let session = echo_session(
        &mut first,
        DropPolicy::RealTime {
            max_backlog_frames: 2,
        },
    );
    while !first.finished() {
        std::thread::sleep(Duration::from_millis(2));
    }
    first.stop().unwrap();
    // The replacement is a 48 kHz stereo device: the engine rebuilds its converters.
    let up = moshi_runtime::resample::resample_to(&input, 24_000, 48_000).unwrap();
    let stereo: Vec<f32> = up.iter().flat_map(|&s| [s, s]).collect();
    let fmt = StreamFormat {
        sample_rate_hz: 48_000,
        channels: 2,
    };
    let config = lockstep_config(fmt);
    let mut second = NullBackend::new(config, stereo).unwrap();
    moshi_runtime::backend::reconnect_session(&session, &mut second, RingSizes::default()).unwrap();
    while !second.finished() {
        std::thread::sleep(Duration::from_millis(2));
    }
    session.engine.input_done();
    let played = second.stop().unwrap();
    let report = session.engine.join().unwrap();
    assert_eq!(report.reconnects, 1);
    assert_eq!(session.counters.snapshot().overrun_samples, 0);
    assert!(
        report.frames_processed >= 2 * frames - 2,
        "{} frames over two devices",
        report.frames_processed
    );
    assert_eq!(report.frames_dropped, 0);
    let left: Vec<f32> = played.chunks_exact(2).map(|f| f[0]).collect();
    let back = moshi_runtime::resample::resample_to(&left, 48_000, 24_000).unwrap();
    let (_, ncc) = best_lag_ncc(&input, &back, 24_000);
    assert!(ncc > 0.99, "second device output ncc {ncc}");
}

/// A jitter margin larger than the default 2 s speaker ring: with the default rings the excess is
/// dropped and counted as an audible glitch; with the rings sized for the margin nothing is lost.
#[test]
fn a_large_jitter_margin_fits_a_ring_sized_for_it_and_overflow_is_a_glitch() {
    let prefill_ms = 3000.0;
    let input = input_wav();
    let mut overflows = Vec::new();
    for rings in [
        RingSizes::default(),
        RingSizes::for_output_queue(prefill_ms, 40),
    ] {
        let mut backend =
            NullBackend::new(NullConfig::moshi(NullClock::Lockstep), input.clone()).unwrap();
        let session = start_session(
            &mut backend,
            Box::new(Echo::new(700, Duration::ZERO)),
            DropPolicy::RealTime {
                max_backlog_frames: 1,
            },
            prefill_ms,
            None,
            rings,
        )
        .unwrap();
        let counters = session.counters.clone();
        let (_, report, _) = run_to_end(&mut backend, session);
        let c = counters.snapshot();
        assert_eq!(
            c.engine_speaker_overflow_events > 0,
            report.speaker_overflow_samples > 0,
            "{rings:?}"
        );
        assert!(c.audible_glitch_events() >= c.engine_speaker_overflow_events);
        overflows.push(report.speaker_overflow_samples);
    }
    assert!(
        overflows[0] > 0,
        "the default ring overflows: {overflows:?}"
    );
    assert_eq!(overflows[1], 0, "the sized ring holds the margin");
}

/// `chat --record`'s WAV, written by its own thread as the conversation goes, is the stereo
/// WAV of the whole conversation (`wav::write_stereo_i16` of the input and of the output, you
/// left, Moshi right), byte for byte.
#[test]
fn the_conversation_wav_is_the_stereo_recording_of_the_whole_conversation() {
    use moshi_runtime::recorder::ConversationWav;
    let input = input_wav();
    let frames = input.len() / FRAME_SAMPLES;
    let (offline, _) = run_offline(&mut Echo::new(700, Duration::ZERO), &input, |_, _| {}).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("conversation.wav");
    let recording = ConversationWav::spawn(&path, ConversationWav::QUEUE_FRAMES).unwrap();
    let mut backend =
        NullBackend::new(NullConfig::moshi(NullClock::Lockstep), input.clone()).unwrap();
    let session = start_session(
        &mut backend,
        Box::new(Echo::new(700, Duration::ZERO)),
        DropPolicy::RealTime {
            max_backlog_frames: 1,
        },
        0.0,
        Some(Box::new(recording.queue())),
        RingSizes::default(),
    )
    .unwrap();
    let (_, report, _) = run_to_end(&mut backend, session);
    assert_eq!(report.frames_processed as usize, frames);
    let finished = recording.finish(()).unwrap();
    assert_eq!(finished.frames_dropped, 0);
    assert_eq!(finished.done.samples, (frames * FRAME_SAMPLES) as u64);
    let reference = dir.path().join("reference.wav");
    wav::write_stereo_i16(
        &reference,
        &input[..frames * FRAME_SAMPLES],
        &offline,
        moshi_runtime::SAMPLE_RATE_HZ,
    )
    .unwrap();
    assert_eq!(
        std::fs::read(&path).unwrap(),
        std::fs::read(&reference).unwrap()
    );
}

/// A device whose callbacks stop (here: the null device is stopped, as a lost device stops
/// calling back) is reported as a typed loss, not before the stall limit.
#[test]
fn a_device_that_stops_calling_back_is_a_typed_loss() {
    use moshi_runtime::backend::device_watch::{DeviceLost, DeviceWatch};
    let input = input_wav();
    let config = NullConfig {
        input_loops: 1000,
        keep_played: false,
        ..NullConfig::moshi(NullClock::Paced { speed: 1.0 })
    };
    let mut backend = NullBackend::new(config, input).unwrap();
    let session = echo_session(
        &mut backend,
        DropPolicy::RealTime {
            max_backlog_frames: 2,
        },
    );
    let limit = Duration::from_millis(300);
    let mut watch = DeviceWatch::new(limit);
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_millis(600) {
        assert_eq!(watch.check(&session.counters), None, "the device is alive");
        std::thread::sleep(Duration::from_millis(20));
    }
    backend.stop().unwrap();
    let stopped = std::time::Instant::now();
    let lost = loop {
        if let Some(lost) = watch.check(&session.counters) {
            break lost;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(5),
            "never found lost"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        matches!(lost, DeviceLost::Stalled(d) if d > limit),
        "{lost:?}"
    );
    assert!(stopped.elapsed() >= limit - Duration::from_millis(40));
    session.engine.request_stop();
    session.engine.join().unwrap();
}
