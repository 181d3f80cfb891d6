//! Lock-free single-producer/single-consumer sample rings (rtrb) between the audio callbacks
//! and the engine thread, the atomic counters they bump, and the callback bodies themselves.
//!
//! The callback bodies ([`capture_callback`], [`playback_callback`]) are plain functions over a
//! ring end and the counters, so the cpal backend, the null backend and the tests run the exact
//! same code. They never allocate, lock, log or block: they copy samples, fill silence on
//! underrun and bump relaxed atomics (orderings: see [`AudioCounters`]). In debug/test builds they mark the thread as an audio
//! callback for the duration of the call ([`crate::alloc_check`]), so an allocation inside them
//! is counted and a test can assert there is none.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Producer end of a sample ring.
pub type SampleProducer = rtrb::Producer<f32>;
/// Consumer end of a sample ring.
pub type SampleConsumer = rtrb::Consumer<f32>;

/// A new ring holding `capacity_samples` f32 samples (allocated once, here).
pub fn sample_ring(capacity_samples: usize) -> (SampleProducer, SampleConsumer) {
    rtrb::RingBuffer::new(capacity_samples.max(1))
}

/// Defines [`AudioCounters`], [`CounterSnapshot`] and [`AudioCounters::snapshot`] from one list,
/// so that a counter is named once: its atomic, its copy, its read and its name in the JSON and
/// the summary cannot drift apart.
macro_rules! audio_counters {
    (
        flags { $( $(#[$flag_meta:meta])* $flag:ident, )* }
        counters { $( $(#[$meta:meta])* $name:ident, )* }
    ) => {
        /// Counters shared between the callbacks (writers) and the engine/console (readers).
        ///
        /// Orderings: the flags and counters are statistics, written and read with `Relaxed`,
        /// except `engine_input_consumed_samples`, a hand-over: the engine stores it with
        /// `Release` once the output of the frames those samples completed is in the speaker
        /// ring, and the null backend's lockstep clock loads it with `Acquire` before playing,
        /// so the playback that follows finds that output.
        #[derive(Debug, Default)]
        pub struct AudioCounters {
            $( $(#[$flag_meta])* pub $flag: AtomicBool, )*
            $( $(#[$meta])* pub $name: AtomicU64, )*
        }

        /// A plain copy of the counters of [`AudioCounters`] at one instant (not the flags). Its
        /// field names are the keys of `--stats-json`'s `counters`.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
        pub struct CounterSnapshot {
            $( $(#[$meta])* pub $name: u64, )*
        }

        impl CounterSnapshot {
            /// The counters' names, in the order of the JSON output.
            pub const NAMES: [&'static str; [$(stringify!($name)),*].len()] =
                [$(stringify!($name)),*];

            /// Each counter's name and value, in the order of [`Self::NAMES`].
            pub fn named_values(&self) -> [(&'static str, u64); Self::NAMES.len()] {
                [$((stringify!($name), self.$name)),*]
            }
        }

        impl AudioCounters {
            /// Reads every counter (relaxed: a snapshot of statistics, not a hand-over).
            pub fn snapshot(&self) -> CounterSnapshot {
                CounterSnapshot {
                    $( $name: self.$name.load(Ordering::Relaxed), )*
                }
            }
        }
    };
}

audio_counters! {
    flags {
        /// Set by the playback callback once it has played a real sample.
        playback_started,
        /// Set when the host reports that a device disappeared.
        device_lost,
    }
    counters {
        /// Samples the capture callback received from the device (all channels).
        captured_samples,
        /// Captured samples dropped because the mic ring was full (engine not reading): overruns.
        overrun_samples,
        /// Capture callbacks that hit a full mic ring.
        overrun_events,
        /// Samples the playback callback wrote from the speaker ring (all channels).
        played_samples,
        /// Silence written because the speaker ring ran dry after playback had started: underruns.
        underrun_samples,
        /// Playback callbacks that ran dry after playback had started.
        underrun_events,
        /// Silence written before the first engine output arrived (expected at start, not an
        /// underrun).
        startup_silence_samples,
        /// Device errors reported through the error callback (all kinds).
        device_errors,
        /// Device latency reported by the host for the last capture callback, microseconds.
        input_device_latency_us,
        /// Device latency reported by the host for the last playback callback, microseconds.
        output_device_latency_us,
        /// Number of capture callbacks.
        capture_callbacks,
        /// Number of playback callbacks.
        playback_callbacks,
        /// Written by the engine thread: model frames processed so far.
        engine_frames_processed,
        /// Written by the engine thread: input frames dropped deliberately (engine behind).
        engine_frames_dropped,
        /// Written by the engine thread: device samples it has taken from the mic ring AND fully
        /// handled (every frame they completed has been processed or dropped).
        engine_input_consumed_samples,
        /// Written by the engine thread: times it skipped queued output to bring latency back
        /// after playback fell behind (each one a skip a listener hears).
        engine_output_trim_events,
        /// Written by the engine thread: times its output did not fit in a full speaker ring and
        /// the rest was dropped (live mode; each one a skip a listener hears).
        engine_speaker_overflow_events,
        /// Discontinuities of the capture stream's clock (see `continuity::StreamContinuity`):
        /// the device captured samples that never reached the callback (an overrun below us,
        /// e.g. the host's buffer overflowed while the callback thread was late).
        input_lost_events,
        /// Frames (one per channel set) of those lost captures.
        input_lost_frames,
        /// Discontinuities of the capture stream's clock the other way: frames delivered twice
        /// or out of nowhere (the host rewound or re-synchronised the capture).
        input_inserted_events,
        /// Frames of those insertions.
        input_inserted_frames,
        /// Discontinuities of the playback stream's clock: the device played frames nobody
        /// wrote (an underrun below us: silence inserted).
        output_gap_events,
        /// Frames of that inserted silence.
        output_gap_frames,
        /// Discontinuities of the playback stream's clock the other way: the device dropped
        /// frames that were written.
        output_discarded_events,
        /// Frames of that discarded output.
        output_discarded_frames,
        /// Playback callbacks that found the device buffer (nearly) drained, with no clock step
        /// seen: the host ran out of samples for a moment too short to measure (a click).
        output_buffer_drained_events,
        /// Capture callbacks that found the device buffer (nearly) full, with no clock step
        /// seen: the host may have overwritten a few captured samples.
        input_buffer_full_events,
    }
}

impl CounterSnapshot {
    /// Discontinuities a listener would hear as a click or a skip, wherever they happened:
    /// underruns of the speaker ring, overruns of the mic ring, output the engine skipped to
    /// bound latency or dropped because the speaker ring was full, and the device streams' own
    /// lost, inserted or discarded samples. (Input frames the engine drops because the model is
    /// slow are counted apart.)
    pub fn audible_glitch_events(&self) -> u64 {
        self.underrun_events
            + self.overrun_events
            + self.engine_output_trim_events
            + self.engine_speaker_overflow_events
            + self.input_lost_events
            + self.input_inserted_events
            + self.output_gap_events
            + self.output_discarded_events
            + self.output_buffer_drained_events
            + self.input_buffer_full_events
    }
}

/// Audio-callback body, capture side: pushes the device's interleaved samples into the mic ring.
/// Whatever does not fit is dropped and counted as an overrun. `device_latency_us`: the host's
/// capture-to-callback delay when it reports one.
pub fn capture_callback(
    input: &[f32],
    mic: &mut SampleProducer,
    counters: &AudioCounters,
    device_latency_us: Option<u64>,
) {
    let _guard = crate::alloc_check::AudioCallbackGuard::enter();
    counters.capture_callbacks.fetch_add(1, Ordering::Relaxed);
    counters
        .captured_samples
        .fetch_add(input.len() as u64, Ordering::Relaxed);
    let (_, rest) = mic.push_partial_slice(input);
    if !rest.is_empty() {
        counters
            .overrun_samples
            .fetch_add(rest.len() as u64, Ordering::Relaxed);
        counters.overrun_events.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(us) = device_latency_us {
        counters
            .input_device_latency_us
            .store(us, Ordering::Relaxed);
    }
}

/// Audio-callback body, playback side: fills `output` (interleaved) from the speaker ring and
/// writes silence for what is missing (counted as startup silence before the first real sample,
/// as an underrun afterwards).
pub fn playback_callback(
    output: &mut [f32],
    speaker: &mut SampleConsumer,
    counters: &AudioCounters,
    device_latency_us: Option<u64>,
) {
    let _guard = crate::alloc_check::AudioCallbackGuard::enter();
    counters.playback_callbacks.fetch_add(1, Ordering::Relaxed);
    let (filled, missing) = speaker.pop_partial_slice(output);
    let got = filled.len();
    missing.fill(0.0);
    let missing_len = missing.len();
    counters
        .played_samples
        .fetch_add(got as u64, Ordering::Relaxed);
    if got > 0 {
        counters.playback_started.store(true, Ordering::Relaxed);
    }
    if missing_len > 0 {
        if counters.playback_started.load(Ordering::Relaxed) {
            counters
                .underrun_samples
                .fetch_add(missing_len as u64, Ordering::Relaxed);
            counters.underrun_events.fetch_add(1, Ordering::Relaxed);
        } else {
            counters
                .startup_silence_samples
                .fetch_add(missing_len as u64, Ordering::Relaxed);
        }
    }
    if let Some(us) = device_latency_us {
        counters
            .output_device_latency_us
            .store(us, Ordering::Relaxed);
    }
}

/// Integer device samples (i16, u16) converted in the callback with fixed scratch: the capture
/// side converts into a caller-provided preallocated buffer.
pub trait DeviceSample: Copy + Send + 'static {
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
}

impl DeviceSample for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl DeviceSample for i16 {
    fn to_f32(self) -> f32 {
        self as f32 / 32768.0
    }
    fn from_f32(x: f32) -> Self {
        (x.clamp(-1.0, 1.0) * 32767.0) as i16
    }
}

/// Capture body for non-f32 devices: converts through `scratch` (preallocated by the caller,
/// processed in `scratch.len()` pieces) and then runs [`capture_callback`].
pub fn capture_callback_converting<S: DeviceSample>(
    input: &[S],
    scratch: &mut [f32],
    mic: &mut SampleProducer,
    counters: &AudioCounters,
    device_latency_us: Option<u64>,
) {
    for piece in input.chunks(scratch.len().max(1)) {
        let dst = &mut scratch[..piece.len()];
        for (d, s) in dst.iter_mut().zip(piece) {
            *d = s.to_f32();
        }
        capture_callback(dst, mic, counters, device_latency_us);
    }
}

/// Playback body for non-f32 devices (see [`capture_callback_converting`]).
pub fn playback_callback_converting<S: DeviceSample>(
    output: &mut [S],
    scratch: &mut [f32],
    speaker: &mut SampleConsumer,
    counters: &AudioCounters,
    device_latency_us: Option<u64>,
) {
    let n = scratch.len().max(1);
    for piece in output.chunks_mut(n) {
        let src = &mut scratch[..piece.len()];
        playback_callback(src, speaker, counters, device_latency_us);
        for (d, s) in piece.iter_mut().zip(src.iter()) {
            *d = S::from_f32(*s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--stats-json`'s `counters` keys and their order, which tests, scripts and docs read.
    #[test]
    fn snapshot_names_are_unchanged() {
        const EXPECTED: [&str; 27] = [
            "captured_samples",
            "overrun_samples",
            "overrun_events",
            "played_samples",
            "underrun_samples",
            "underrun_events",
            "startup_silence_samples",
            "device_errors",
            "input_device_latency_us",
            "output_device_latency_us",
            "capture_callbacks",
            "playback_callbacks",
            "engine_frames_processed",
            "engine_frames_dropped",
            "engine_input_consumed_samples",
            "engine_output_trim_events",
            "engine_speaker_overflow_events",
            "input_lost_events",
            "input_lost_frames",
            "input_inserted_events",
            "input_inserted_frames",
            "output_gap_events",
            "output_gap_frames",
            "output_discarded_events",
            "output_discarded_frames",
            "output_buffer_drained_events",
            "input_buffer_full_events",
        ];
        assert_eq!(CounterSnapshot::NAMES, EXPECTED);
        let counters = AudioCounters::default();
        counters.captured_samples.fetch_add(7, Ordering::Relaxed);
        counters
            .input_buffer_full_events
            .fetch_add(3, Ordering::Relaxed);
        let snapshot = counters.snapshot();
        // The serialised object: every key, in this order, with its own value.
        let expected_json = EXPECTED
            .iter()
            .map(|name| match *name {
                "captured_samples" => format!("\"{name}\":7"),
                "input_buffer_full_events" => format!("\"{name}\":3"),
                _ => format!("\"{name}\":0"),
            })
            .collect::<Vec<_>>()
            .join(",");
        assert_eq!(
            serde_json::to_string(&snapshot).unwrap(),
            format!("{{{expected_json}}}")
        );
        let named = snapshot.named_values();
        assert_eq!(named[0], ("captured_samples", 7));
        assert_eq!(named[26], ("input_buffer_full_events", 3));
    }

    #[test]
    fn speaker_overflow_is_an_audible_glitch() {
        let counters = AudioCounters::default();
        counters
            .engine_speaker_overflow_events
            .fetch_add(2, Ordering::Relaxed);
        let s = counters.snapshot();
        assert_eq!(s.engine_speaker_overflow_events, 2);
        assert_eq!(s.audible_glitch_events(), 2);
    }

    #[test]
    fn overrun_and_underrun_accounting() {
        let counters = AudioCounters::default();
        let (mut mic_p, mic_c) = sample_ring(10);
        capture_callback(&[0.5; 6], &mut mic_p, &counters, Some(1234));
        capture_callback(&[0.25; 6], &mut mic_p, &counters, None);
        let s = counters.snapshot();
        assert_eq!(
            (s.captured_samples, s.overrun_samples, s.overrun_events),
            (12, 2, 1)
        );
        assert_eq!(s.input_device_latency_us, 1234);
        assert_eq!(mic_c.slots(), 10);

        let (mut spk_p, mut spk_c) = sample_ring(16);
        let mut out = [9.0f32; 4];
        playback_callback(&mut out, &mut spk_c, &counters, None);
        assert_eq!(out, [0.0; 4]);
        assert_eq!(counters.snapshot().startup_silence_samples, 4);
        assert_eq!(counters.snapshot().underrun_events, 0);
        let _ = spk_p.push_partial_slice(&[1.0, 2.0, 3.0]);
        playback_callback(&mut out, &mut spk_c, &counters, None);
        assert_eq!(out, [1.0, 2.0, 3.0, 0.0]);
        let s = counters.snapshot();
        assert_eq!(
            (s.played_samples, s.underrun_samples, s.underrun_events),
            (3, 1, 1)
        );

        let mut out16 = [7i16; 3];
        let mut scratch = [0f32; 2];
        let _ = spk_p.push_partial_slice(&[0.5, -0.5, 1.5]);
        playback_callback_converting(&mut out16, &mut scratch, &mut spk_c, &counters, None);
        assert_eq!(out16, [16383, -16383, 32767]);
    }
}
