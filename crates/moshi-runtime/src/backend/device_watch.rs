//! Finds out that a live session's audio device is gone, as a typed [`DeviceLost`]: the host
//! said so (cpal's error callback sets `device_lost`), or the callbacks stopped coming, which is
//! all some hosts show when a device or sound server disappears (they report only generic I/O
//! errors, or nothing).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::ring::AudioCounters;

/// How a device was found lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DeviceLost {
    /// The host reported that a device disappeared.
    #[error("the host reported that an audio device disappeared")]
    Reported,
    /// Capture or playback callbacks stopped coming for at least this long.
    #[error("the audio callbacks stopped for {} ms", .0.as_millis())]
    Stalled(Duration),
}

/// Watches one session's devices between reconnections; poll it every few tens of ms.
#[derive(Debug)]
pub struct DeviceWatch {
    stall_limit: Duration,
    /// Whether playback callbacks must come too (`false`: a capture-only session).
    watch_playback: bool,
    /// Capture and playback callbacks seen at the last progress.
    callbacks_seen: Option<(u64, u64)>,
    last_progress: Instant,
}

impl DeviceWatch {
    /// How long callbacks may stop before the device counts as gone: well above a device
    /// buffer and a loaded machine's scheduling delays, well below a user's patience.
    pub const DEFAULT_STALL_LIMIT: Duration = Duration::from_secs(2);

    /// A watch starting now: the callbacks have `stall_limit` to show progress.
    pub fn new(stall_limit: Duration) -> Self {
        Self::starting_at(stall_limit, Instant::now())
    }

    /// A watch of a capture-only session (no playback callbacks ever come).
    pub fn capture_only(stall_limit: Duration) -> Self {
        Self {
            watch_playback: false,
            ..Self::new(stall_limit)
        }
    }

    fn starting_at(stall_limit: Duration, now: Instant) -> Self {
        Self {
            stall_limit,
            watch_playback: true,
            callbacks_seen: None,
            last_progress: now,
        }
    }

    /// `Some` once the device is lost: the host reported it, or neither side's callbacks
    /// both moved on within the stall limit.
    pub fn check(&mut self, counters: &AudioCounters) -> Option<DeviceLost> {
        self.check_at(counters, Instant::now())
    }

    fn check_at(&mut self, counters: &AudioCounters, now: Instant) -> Option<DeviceLost> {
        if counters.device_lost.load(Ordering::Relaxed) {
            return Some(DeviceLost::Reported);
        }
        let callbacks = (
            counters.capture_callbacks.load(Ordering::Relaxed),
            counters.playback_callbacks.load(Ordering::Relaxed),
        );
        // Progress: both sides called back since the last progress (one live side alone is
        // a half-dead device).
        let progressed = self.callbacks_seen.is_none_or(|seen| {
            callbacks.0 != seen.0 && (!self.watch_playback || callbacks.1 != seen.1)
        });
        if progressed {
            self.callbacks_seen = Some(callbacks);
            self.last_progress = now;
        }
        let silent_for = now.saturating_duration_since(self.last_progress);
        (silent_for > self.stall_limit).then_some(DeviceLost::Stalled(silent_for))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bump(counters: &AudioCounters, capture: bool, playback: bool) {
        if capture {
            counters.capture_callbacks.fetch_add(1, Ordering::Relaxed);
        }
        if playback {
            counters.playback_callbacks.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_reported_loss_is_typed() {
        let counters = AudioCounters::default();
        let mut watch = DeviceWatch::new(DeviceWatch::DEFAULT_STALL_LIMIT);
        assert_eq!(watch.check(&counters), None);
        counters.device_lost.store(true, Ordering::Relaxed);
        assert_eq!(watch.check(&counters), Some(DeviceLost::Reported));
        assert!(DeviceLost::Reported.to_string().contains("disappeared"));
    }

    #[test]
    fn callbacks_that_stop_on_either_side_are_a_lost_device() {
        let limit = Duration::from_millis(2000);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        for (capture, playback) in [(false, false), (true, false), (false, true)] {
            let counters = AudioCounters::default();
            let mut watch = DeviceWatch::starting_at(limit, t0);
            // Both sides running: never lost, however long.
            for ms in (0..5000).step_by(20) {
                bump(&counters, true, true);
                assert_eq!(watch.check_at(&counters, at(ms)), None, "{ms} ms");
            }
            // Then only these sides run.
            let mut lost = None;
            for ms in (5000..9000).step_by(20) {
                bump(&counters, capture, playback);
                if let Some(l) = watch.check_at(&counters, at(ms)) {
                    lost = Some((ms, l));
                    break;
                }
            }
            let (ms, lost) = lost.expect("a stall is found");
            assert_eq!(ms, 7000, "({capture}, {playback})");
            assert_eq!(lost, DeviceLost::Stalled(Duration::from_millis(2020)));
            assert_eq!(lost.to_string(), "the audio callbacks stopped for 2020 ms");
        }
    }

    #[test]
    fn a_capture_only_watch_needs_capture_callbacks_only() {
        let limit = Duration::from_millis(2000);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let counters = AudioCounters::default();
        let mut watch = DeviceWatch {
            last_progress: t0,
            ..DeviceWatch::capture_only(limit)
        };
        for ms in (0..5000).step_by(20) {
            bump(&counters, true, false);
            assert_eq!(watch.check_at(&counters, at(ms)), None, "{ms} ms");
        }
        // Capture stops: lost after the limit.
        let lost = (5000..9000)
            .step_by(20)
            .find_map(|ms| watch.check_at(&counters, at(ms)).map(|l| (ms, l)));
        assert_eq!(
            lost,
            Some((7000, DeviceLost::Stalled(Duration::from_millis(2020))))
        );
    }
}
