//! Discontinuities of a device stream below the audio callbacks: samples the host lost,
//! inserted or threw away without telling us (cpal's ALSA backend, for one, recovers from xruns
//! silently), found from the stream's own timestamps and buffer fill.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::ring::AudioCounters;

/// Which side of the duplex a [`StreamContinuity`] watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamSide {
    Capture,
    Playback,
}

/// Watches one device stream for discontinuities that the ring counters cannot see.
///
/// **Clock steps.** Each callback brings the stream time (nanoseconds on the host's stream
/// clock) of its first frame: when it was captured, or when it will be played. Without a
/// discontinuity every callback starts where the frames before it end, so `offset = start -
/// frames_before / rate` stays on one level. A host-side underrun (the device played silence
/// nobody wrote, e.g. while the callback thread was descheduled) raises that level for good by
/// the silence inserted; a host-side overrun (captured frames that never reached the callback)
/// raises it by the frames lost; frames written and then thrown away lower it. The hosts'
/// timestamps jitter by a few milliseconds from one callback to the next (PulseAudio
/// interpolates its latency), but a jittered timestamp returns to the level within a callback
/// or two, and a shifted estimate can hold for some 20 ms. So a change counts only once the offset has held a new level (within the tolerance)
/// for [`StreamContinuity::CONFIRM_CALLBACKS`] callbacks spanning [`StreamContinuity::CONFIRM_NS`];
/// within the tolerance the level follows slowly (device-clock drift).
///
/// **Exhausted buffers.** A playback callback asked for (nearly) the whole device buffer found
/// it drained: the host had nothing left to play. A capture callback handed (nearly) a whole
/// buffer found it full. Either is counted as a glitch of its own unless a clock step confirms
/// it within [`StreamContinuity::ATTRIBUTE_NS`] (then the step is the one event): this catches
/// gaps shorter than the timestamp jitter (a few samples of silence are still a click).
///
/// The first [`StreamContinuity::SETTLE_NS`] of a stream (start-up) only set the level. Lives in
/// the callback's closure: no allocation, no lock, relaxed atomics only.
#[derive(Debug, Clone)]
pub struct StreamContinuity {
    side: StreamSide,
    sample_rate_hz: u64,
    tolerance_ns: f64,
    buffer_frames: Option<u64>,
    frames_before: u64,
    origin_ns: Option<u64>,
    level_ns: Option<f64>,
    candidate: Option<LevelCandidate>,
    exhausted_at_ns: Option<u64>,
}

#[derive(Debug, Clone, Copy)]
struct LevelCandidate {
    level_ns: f64,
    first_start_ns: u64,
    callbacks: u32,
}

impl StreamContinuity {
    /// Callbacks a new offset level must hold before it counts as a discontinuity.
    pub const CONFIRM_CALLBACKS: u32 = 5;
    /// Stream time a new offset level must hold before it counts.
    pub const CONFIRM_NS: u64 = 50_000_000;
    /// Stream time at the start during which the level is only learned.
    pub const SETTLE_NS: u64 = 200_000_000;
    /// How long after an exhausted buffer a clock step is taken as the same event.
    pub const ATTRIBUTE_NS: u64 = 100_000_000;
    /// Fraction of a within-tolerance deviation the level follows per callback (clock drift).
    const FOLLOW: f64 = 0.02;
    /// The timestamp jitter a device backend should tolerate: 2 ms (48 samples at 24 kHz).
    /// Replayed on 19 callback traces of clean runs over PulseAudio (6 idle, 13 under CPU
    /// stalls; single timestamps off by up to 29 ms), 1 ms would have confirmed none either;
    /// on 10 traces of glitched runs, 2 ms found the 3-4 ms jumps the speaker recordings showed
    /// (half a 10 ms period, the tolerance before, missed them) and 1 ms one jump too many.
    pub const TIMESTAMP_TOLERANCE_MS: f64 = 2.0;

    /// `tolerance_ms`: level changes smaller than this are jitter (the cpal backend uses
    /// [`Self::TIMESTAMP_TOLERANCE_MS`]). `buffer_frames`: the device buffer, when known.
    pub fn new(
        side: StreamSide,
        sample_rate_hz: u32,
        tolerance_ms: f64,
        buffer_frames: Option<u32>,
    ) -> Self {
        Self {
            side,
            sample_rate_hz: u64::from(sample_rate_hz.max(1)),
            tolerance_ns: tolerance_ms.max(0.0) * 1e6,
            buffer_frames: buffer_frames.map(u64::from).filter(|&b| b > 0),
            frames_before: 0,
            origin_ns: None,
            level_ns: None,
            candidate: None,
            exhausted_at_ns: None,
        }
    }

    /// Checks one callback of `frames` frames whose first frame is at `start_ns` on the
    /// stream clock, and counts a discontinuity in `counters`.
    pub fn observe(&mut self, start_ns: u64, frames: usize, counters: &AudioCounters) {
        let origin = *self.origin_ns.get_or_insert(start_ns);
        let expected_ns = self.frames_before as f64 * 1e9 / self.sample_rate_hz as f64;
        let offset = start_ns as f64 - origin as f64 - expected_ns;
        self.frames_before += frames as u64;
        let level = match self.level_ns {
            Some(level) if start_ns.saturating_sub(origin) >= Self::SETTLE_NS => level,
            _ => {
                self.level_ns = Some(offset);
                return;
            }
        };
        self.watch_fill(start_ns, frames, counters);
        if (offset - level).abs() <= self.tolerance_ns {
            self.level_ns = Some(level + (offset - level) * Self::FOLLOW);
            self.candidate = None;
            return;
        }
        let candidate = match self.candidate {
            Some(c) if (offset - c.level_ns).abs() <= self.tolerance_ns => LevelCandidate {
                callbacks: c.callbacks + 1,
                ..c
            },
            _ => LevelCandidate {
                level_ns: offset,
                first_start_ns: start_ns,
                callbacks: 1,
            },
        };
        if candidate.callbacks >= Self::CONFIRM_CALLBACKS
            && start_ns.saturating_sub(candidate.first_start_ns) >= Self::CONFIRM_NS
        {
            self.count_step(candidate.level_ns - level, counters);
            self.level_ns = Some(candidate.level_ns);
            self.candidate = None;
            self.exhausted_at_ns = None;
        } else {
            self.candidate = Some(candidate);
        }
    }

    /// Exhausted-buffer bookkeeping: counts an earlier exhaustion no step explained, and notes
    /// a new one.
    fn watch_fill(&mut self, start_ns: u64, frames: usize, counters: &AudioCounters) {
        if let Some(at) = self.exhausted_at_ns {
            if start_ns.saturating_sub(at) > Self::ATTRIBUTE_NS {
                let events = match self.side {
                    StreamSide::Capture => &counters.input_buffer_full_events,
                    StreamSide::Playback => &counters.output_buffer_drained_events,
                };
                events.fetch_add(1, Ordering::Relaxed);
                self.exhausted_at_ns = None;
            }
        }
        let exhausted = self
            .buffer_frames
            .is_some_and(|b| frames as u64 * 8 >= b * 7);
        if exhausted && self.exhausted_at_ns.is_none() {
            self.exhausted_at_ns = Some(start_ns);
        }
    }

    fn count_step(&self, step_ns: f64, counters: &AudioCounters) {
        let frames = (step_ns.abs() * self.sample_rate_hz as f64 / 1e9).round() as u64;
        let (events, total): (&AtomicU64, &AtomicU64) = match (self.side, step_ns > 0.0) {
            (StreamSide::Capture, true) => {
                (&counters.input_lost_events, &counters.input_lost_frames)
            }
            (StreamSide::Capture, false) => (
                &counters.input_inserted_events,
                &counters.input_inserted_frames,
            ),
            (StreamSide::Playback, true) => {
                (&counters.output_gap_events, &counters.output_gap_frames)
            }
            (StreamSide::Playback, false) => (
                &counters.output_discarded_events,
                &counters.output_discarded_frames,
            ),
        };
        events.fetch_add(1, Ordering::Relaxed);
        total.fetch_add(frames, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `n` callbacks of `frames` frames at 24 kHz starting at `t0_ns`; `disturb(i)` adds
    /// nanoseconds to callback i's timestamp only; `step_at`: (callback index, ns) added to every
    /// timestamp from there on (a real discontinuity). Returns the next start time.
    fn feed(
        watch: &mut StreamContinuity,
        counters: &AudioCounters,
        t0_ns: u64,
        n: usize,
        frames: usize,
        disturb: impl Fn(usize) -> i64,
        step_at: Option<(usize, i64)>,
    ) -> u64 {
        let period_ns = frames as u64 * 1_000_000_000 / 24_000;
        for i in 0..n {
            let step = step_at.map_or(0, |(at, ns)| if i >= at { ns } else { 0 });
            let t = (t0_ns + i as u64 * period_ns) as i64 + disturb(i) + step;
            watch.observe(t as u64, frames, counters);
        }
        t0_ns + n as u64 * period_ns
    }

    fn glitches(c: &AudioCounters) -> (u64, u64, u64, u64) {
        let s = c.snapshot();
        (
            s.input_lost_events + s.input_inserted_events,
            s.output_gap_events,
            s.output_discarded_events,
            s.output_gap_frames + s.output_discarded_frames + s.input_lost_frames,
        )
    }

    #[test]
    fn a_timestamp_going_back_behind_a_new_level_neither_panics_nor_confirms_it() {
        let c = AudioCounters::default();
        let mut w = StreamContinuity::new(StreamSide::Playback, 24_000, 2.0, None);
        // 300 ms of regular 10 ms callbacks: the level is learned (0).
        let next_ns = feed(&mut w, &c, 0, 30, 240, |_| 0, None);
        // Empty callbacks 10 ms late start a new level candidate; the 5th (enough callbacks)
        // goes back in time, before the candidate's first one.
        for late_us in [10_000, 10_500, 11_000, 11_500, 9_000] {
            w.observe(next_ns + late_us * 1_000, 0, &c);
        }
        assert_eq!(glitches(&c), (0, 0, 0, 0));
    }

    #[test]
    fn stream_clock_jitter_that_returns_to_its_level_is_not_a_glitch() {
        let c = AudioCounters::default();
        let mut w = StreamContinuity::new(StreamSide::Playback, 24_000, 2.5, None);
        // 5 ms callbacks for 10 s; every 7th timestamp 4 ms late, every 11th 3.5 ms early, and
        // pairs of +-6 ms as PulseAudio produces them.
        feed(
            &mut w,
            &c,
            0,
            2000,
            120,
            |i| match i % 23 {
                _ if i % 7 == 0 => 4_000_000,
                _ if i % 11 == 0 => -3_500_000,
                5 => 6_000_000,
                6 => -6_000_000,
                _ => 0,
            },
            None,
        );
        assert_eq!(glitches(&c), (0, 0, 0, 0));
    }

    #[test]
    fn a_4_ms_gap_is_counted_at_the_backend_tolerance_and_stalled_timestamps_are_not() {
        let c = AudioCounters::default();
        let tolerance = StreamContinuity::TIMESTAMP_TOLERANCE_MS;
        let mut w = StreamContinuity::new(StreamSide::Playback, 24_000, tolerance, Some(960));
        // 10 ms callbacks (a 40 ms buffer) for 6 s: +-1.5 ms jitter, and as under CPU stalls,
        // runs of 1-3 timestamps 8-25 ms off that come back to the level.
        let stalled = |i: usize| match i % 37 {
            0 => 25_000_000,
            1 => 12_000_000,
            2 => -8_000_000,
            _ if i.is_multiple_of(5) => 1_500_000,
            _ if i.is_multiple_of(3) => -1_500_000,
            _ => 0,
        };
        feed(&mut w, &c, 0, 600, 240, stalled, None);
        assert_eq!(glitches(&c), (0, 0, 0, 0));
        // 4 ms (96 samples) of silence inserted by the host at callback 300: the jump a
        // half-period tolerance (5 ms) let through in a speaker recording.
        let c = AudioCounters::default();
        let mut w = StreamContinuity::new(StreamSide::Playback, 24_000, tolerance, Some(960));
        feed(&mut w, &c, 0, 600, 240, stalled, Some((300, 4_000_000)));
        let s = c.snapshot();
        assert_eq!((s.output_gap_events, s.output_discarded_events), (1, 0));
        assert!(
            (s.output_gap_frames as i64 - 96).abs() <= 2,
            "{}",
            s.output_gap_frames
        );
    }

    #[test]
    fn stream_clock_drift_is_followed_not_counted() {
        let c = AudioCounters::default();
        let mut w = StreamContinuity::new(StreamSide::Playback, 24_000, 2.0, None);
        // A device clock 200 ppm fast against the host clock, for 60 s.
        feed(
            &mut w,
            &c,
            0,
            12_000,
            120,
            |i| (i as f64 * 5e6 * 200e-6) as i64,
            None,
        );
        assert_eq!(glitches(&c), (0, 0, 0, 0));
    }

    #[test]
    fn inserted_silence_and_discarded_output_are_counted_with_their_length() {
        let c = AudioCounters::default();
        let mut w = StreamContinuity::new(StreamSide::Playback, 24_000, 2.5, None);
        // 10 ms of silence inserted by the host at callback 300, with jitter around it.
        let t = feed(
            &mut w,
            &c,
            0,
            600,
            120,
            |i| if i == 299 { 3_000_000 } else { 0 },
            Some((300, 10_000_000)),
        );
        let s = c.snapshot();
        assert_eq!((s.output_gap_events, s.output_discarded_events), (1, 0));
        assert!(
            (s.output_gap_frames as i64 - 240).abs() <= 2,
            "{}",
            s.output_gap_frames
        );
        // Then 20 ms of written output thrown away (timestamps earlier than the frames imply).
        let next = t + 10_000_000;
        feed(&mut w, &c, next - 20_000_000, 600, 120, |_| 0, None);
        let s = c.snapshot();
        assert_eq!((s.output_gap_events, s.output_discarded_events), (1, 1));
        assert!(
            (s.output_discarded_frames as i64 - 480).abs() <= 2,
            "{}",
            s.output_discarded_frames
        );
    }

    #[test]
    fn lost_capture_frames_are_counted_and_start_up_is_not() {
        let c = AudioCounters::default();
        let mut w = StreamContinuity::new(StreamSide::Capture, 24_000, 2.0, None);
        // Start-up: the first 200 ms jump around as streams start; only learned.
        feed(
            &mut w,
            &c,
            0,
            30,
            120,
            |i| if i == 10 { 40_000_000 } else { 0 },
            Some((20, 15_000_000)),
        );
        assert_eq!(glitches(&c), (0, 0, 0, 0));
        // 35 ms of captured frames never delivered.
        let c = AudioCounters::default();
        let mut w = StreamContinuity::new(StreamSide::Capture, 24_000, 2.0, None);
        feed(&mut w, &c, 0, 400, 120, |_| 0, Some((200, 35_000_000)));
        let s = c.snapshot();
        assert_eq!((s.input_lost_events, s.input_inserted_events), (1, 0));
        assert!(
            (s.input_lost_frames as i64 - 840).abs() <= 2,
            "{}",
            s.input_lost_frames
        );
        assert_eq!(s.audible_glitch_events(), 1);
    }

    #[test]
    fn an_exhausted_buffer_is_one_glitch_with_or_without_a_clock_step() {
        // 480-frame device buffer, 120-frame callbacks every 5 ms.
        let run = |step_ns: i64| {
            let c = AudioCounters::default();
            let mut w = StreamContinuity::new(StreamSide::Playback, 24_000, 2.5, Some(480));
            let mut t = 0i64;
            for i in 0..400 {
                // Callback 200 comes 15 ms late and finds the buffer drained: 480 frames.
                let frames = if i == 200 { 480 } else { 120 };
                if i == 200 {
                    t += 15_000_000 + step_ns;
                }
                w.observe(t as u64, frames, &c);
                t += frames as i64 * 1_000_000_000 / 24_000;
            }
            c.snapshot()
        };
        // A drain too short to move the clock: counted as a drained buffer.
        let s = run(-15_000_000);
        assert_eq!(
            (s.output_buffer_drained_events, s.output_gap_events),
            (1, 0)
        );
        assert_eq!(s.audible_glitch_events(), 1);
        // 10 ms of silence inserted: the step explains the drain, one event.
        let s = run(-5_000_000);
        assert_eq!(
            (s.output_buffer_drained_events, s.output_gap_events),
            (0, 1)
        );
        assert!(
            (s.output_gap_frames as i64 - 240).abs() <= 2,
            "{}",
            s.output_gap_frames
        );
        assert_eq!(s.audible_glitch_events(), 1);
        // Capture: a full buffer at start-up is not counted.
        let c = AudioCounters::default();
        let mut w = StreamContinuity::new(StreamSide::Capture, 24_000, 2.5, Some(480));
        w.observe(0, 480, &c);
        for i in 0..100u64 {
            w.observe(20_000_000 + i * 5_000_000, 120, &c);
        }
        assert_eq!(c.snapshot().audible_glitch_events(), 0);
    }
}
