//! A memory read-bandwidth probe taken between the timed frames, so that every frame's LM step is
//! set against the bandwidth of its own minutes: a shared host's bandwidth changes within a run
//! (docs/performance.md, "The machines"), and the probes before and after the run say little
//! about the frames between them when it does.

use moshi_runtime::metrics::{LatencyStats, Percentiles};
use serde::Serialize;

use crate::bandwidth::ReadBuffer;

/// Most bytes of the buffer the probe reads between frames: it stays allocated during the run,
/// so smaller than the probes before and after, still several times a last-level cache.
pub const MAX_PROBE_BYTES: usize = 256 << 20;

/// The faster of two passes over a buffer before every `every_frames`-th timed frame, and each
/// frame's LM step against the bound the latest probe gives.
pub struct FrameProbe {
    buffer: ReadBuffer,
    every_frames: usize,
    lm_read_bytes: u64,
    latest_gbps: f64,
    probes_gbps: LatencyStats,
    ratios: LatencyStats,
}

/// What the probes beside the frames measured (`bound.beside_frames` of the report).
#[derive(Clone, Debug, Serialize)]
pub struct ProbesBesideFrames {
    /// A probe (the faster of two passes) before every this many timed frames.
    pub every_frames: usize,
    /// Bytes each probe reads.
    pub probe_bytes: u64,
    /// The probes' read bandwidths, GB/s.
    pub probes_gbps: Percentiles,
    /// Each frame's LM step over the bound of the probe taken before it.
    pub ratio_to_bound: Percentiles,
}

impl FrameProbe {
    /// The buffer a probe of `threads` threads reads, about `buffer_bytes` (at most
    /// [`MAX_PROBE_BYTES`]), made before the model is loaded so that the run's peak memory holds
    /// it from its start (and its bytes can be taken off that peak exactly).
    pub fn buffer(threads: usize, buffer_bytes: usize) -> Option<ReadBuffer> {
        ReadBuffer::new(threads, buffer_bytes.min(MAX_PROBE_BYTES))
    }

    /// A probe over `buffer` before every `every_frames`-th frame, for frames whose LM step reads
    /// `lm_read_bytes`; `None` when `every_frames` or `lm_read_bytes` is 0.
    pub fn new(buffer: ReadBuffer, every_frames: usize, lm_read_bytes: u64) -> Option<Self> {
        if every_frames == 0 || lm_read_bytes == 0 {
            return None;
        }
        Some(Self {
            buffer,
            every_frames,
            lm_read_bytes,
            latest_gbps: 0.0,
            probes_gbps: LatencyStats::default(),
            ratios: LatencyStats::default(),
        })
    }

    /// Before timed frame `index` (counted from 0): a pass over the buffer on every
    /// `every_frames`-th.
    pub fn before_frame(&mut self, index: usize) {
        if !index.is_multiple_of(self.every_frames) {
            return;
        }
        // Two passes: the first also wakes the probe's threads.
        let gbps = self.buffer.best_gbps(2);
        if gbps.is_finite() && gbps > 0.0 {
            self.latest_gbps = gbps;
            self.probes_gbps.push(gbps);
        }
    }

    /// After a timed frame whose LM step took `lm_step_ms`: its ratio to the latest bound.
    pub fn after_frame(&mut self, lm_step_ms: f64) {
        if self.latest_gbps > 0.0 {
            let bound_ms = self.lm_read_bytes as f64 / (self.latest_gbps * 1e6);
            self.ratios.push(lm_step_ms / bound_ms);
        }
    }

    /// The probes and ratios so far.
    pub fn figures(&self) -> ProbesBesideFrames {
        ProbesBesideFrames {
            every_frames: self.every_frames,
            probe_bytes: self.buffer.bytes() as u64,
            probes_gbps: self.probes_gbps.percentiles(),
            ratio_to_bound: self.ratios.percentiles(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_every_nth_frame_and_sets_each_frame_against_the_latest() {
        let buffer = FrameProbe::buffer(1, 8 << 20).unwrap();
        let mut probe = FrameProbe::new(buffer, 3, 1_000_000_000).unwrap();
        for i in 0..7 {
            probe.before_frame(i);
            probe.after_frame(1.0);
        }
        let figures = probe.figures();
        // Frames 0, 3 and 6 were probed; every frame has a ratio.
        assert_eq!(probe.probes_gbps.count(), 3);
        assert_eq!(probe.ratios.count(), 7);
        let gbps = figures.probes_gbps.min;
        assert!(gbps > 0.0 && gbps.is_finite(), "{gbps}");
        // A 1 ms step reading 1 GB against a bound of 1e9 / (gbps · 1e6) ms.
        let want = figures.probes_gbps.max / 1000.0;
        assert!(figures.ratio_to_bound.max <= want * (1.0 + 1e-12));
        assert!(figures.ratio_to_bound.min > 0.0);
    }

    #[test]
    fn no_probe_without_frames_to_probe_or_bytes_to_bound() {
        let buffer = || FrameProbe::buffer(1, 1 << 20).unwrap();
        assert!(FrameProbe::new(buffer(), 0, 1).is_none());
        assert!(FrameProbe::new(buffer(), 5, 0).is_none());
        assert!(FrameProbe::buffer(0, 1 << 20).is_none());
    }
}
