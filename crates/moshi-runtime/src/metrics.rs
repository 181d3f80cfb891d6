//! Per-frame timing records, percentile summaries and the real-time factor. A run's [`Metrics`]
//! take bounded memory whatever its length (an hour-long conversation included): exact count,
//! mean, min and max, exact percentiles up to [`EXACT_VALUES`] frames and from fine log-spaced
//! histograms past them. Records go to a
//! [`ProfileWriter`] (JSON Lines, `--profile FILE`) as they are made. The summary splits the time
//! by stage (Mimi encode, temporal LM, depformer, sampling, Mimi decode).

use std::collections::BTreeMap;
use std::path::Path;

use moshi_loader::output_file::{FinishedOutput, OutputFile};
use serde::Serialize;

use crate::{Result, FRAME_MS};

/// Time spent in each stage of one frame, milliseconds. Stages a processor does not have stay 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StageTimings {
    pub mimi_encode_ms: f64,
    pub lm_temporal_ms: f64,
    pub lm_depformer_ms: f64,
    pub sampling_ms: f64,
    pub mimi_decode_ms: f64,
}

impl StageTimings {
    /// Names and values, in pipeline order.
    pub fn stages(&self) -> [(&'static str, f64); 5] {
        [
            ("mimi_encode", self.mimi_encode_ms),
            ("lm_temporal", self.lm_temporal_ms),
            ("lm_depformer", self.lm_depformer_ms),
            ("sampling", self.sampling_ms),
            ("mimi_decode", self.mimi_decode_ms),
        ]
    }
}

/// One processed frame, as written to the `--profile` JSON Lines file.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FrameRecord {
    /// Always "frame" (lets other event kinds share the file).
    pub event: &'static str,
    /// Index of the processed frame (dropped frames are not numbered).
    pub frame: u64,
    /// Wall-clock time since the run started, milliseconds, when the frame finished.
    pub t_ms: f64,
    /// Whole `process_frame` call, milliseconds.
    pub total_ms: f64,
    #[serde(flatten)]
    pub stages: StageTimings,
    /// Input waiting behind this frame when it was taken (24 kHz samples -> ms): the mic ring,
    /// the input resampler's ready output, pending input and group delay; live mode only.
    pub mic_backlog_ms: f64,
    /// Output queued ahead of this frame's first sample when it was pushed, ms: the speaker
    /// ring's queue plus the output resampler's pending input and group delay; live mode only.
    pub speaker_queue_ms: f64,
    /// The echo canceller after this frame (live mode with `--echo-cancel`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub echo: Option<Box<crate::echo_cancel::EchoStats>>,
}

/// min / p50 / p95 / p99 / max / mean of a series.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub min: f64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `values` (all zeros for an empty series).
    pub fn of(values: &[f64]) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        let mut v = values.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        let rank =
            |p: f64| v[(((p / 100.0) * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Self {
            min: v[0],
            p50: rank(50.0),
            p95: rank(95.0),
            p99: rank(99.0),
            max: v[v.len() - 1],
            mean: v.iter().sum::<f64>() / v.len() as f64,
        }
    }
}

/// Summary of a run: per-stage percentiles and the real-time factor.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunSummary {
    pub frames: u64,
    pub total_ms: Percentiles,
    pub stages: Vec<(String, Percentiles)>,
    /// Mean compute time per frame / 80 ms. Below 1: faster than real time.
    pub real_time_factor: f64,
}

/// Width of a histogram bin: values within 0.1 % of each other share a bin.
const BIN_RATIO: f64 = 1.001;

/// Values kept as they are while a series has at most this many (about 11 minutes of 80 ms
/// frames, 64 KiB): its percentiles are then the exact nearest-rank ones.
pub const EXACT_VALUES: usize = 8192;

/// Statistics of one quantity over a run in bounded memory: exact count, mean, min and max;
/// exact percentiles up to [`EXACT_VALUES`] values, past them percentiles from a histogram of
/// bins `BIN_RATIO` wide (at most a few thousand bins over any plausible range), each within
/// 0.1 % of the exact nearest-rank value.
#[derive(Debug, Clone, Default)]
pub struct LatencyStats {
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
    /// Bin index (log base [`BIN_RATIO`]; `i32::MIN` for values <= 0) -> count.
    bins: BTreeMap<i32, u64>,
    /// Every value while there are at most [`EXACT_VALUES`]; emptied (and freed) past them.
    exact: Vec<f64>,
}

impl LatencyStats {
    fn bin_of(v: f64) -> i32 {
        if v > 0.0 && v.is_finite() {
            (v.ln() / BIN_RATIO.ln()).floor() as i32
        } else {
            i32::MIN
        }
    }

    /// Adds one value (non-finite values count as 0).
    pub fn push(&mut self, v: f64) {
        let v = if v.is_finite() { v } else { 0.0 };
        if self.count == 0 {
            (self.min, self.max) = (v, v);
        } else {
            self.min = self.min.min(v);
            self.max = self.max.max(v);
        }
        self.count += 1;
        self.sum += v;
        *self.bins.entry(Self::bin_of(v)).or_insert(0) += 1;
        if self.count <= EXACT_VALUES as u64 {
            self.exact.push(v);
        } else if !self.exact.is_empty() {
            self.exact = Vec::new();
        }
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// Nearest-rank percentiles, min, max and mean: exact up to [`EXACT_VALUES`] values, then
    /// min, max and mean exact and each percentile within 0.1 % of the exact value.
    pub fn percentiles(&self) -> Percentiles {
        if self.count == 0 {
            return Percentiles::default();
        }
        if self.exact.len() as u64 == self.count {
            return Percentiles::of(&self.exact);
        }
        let rank = |p: f64| {
            let want = ((p / 100.0 * self.count as f64).ceil() as u64).clamp(1, self.count);
            let mut seen = 0;
            for (&bin, &n) in &self.bins {
                seen += n;
                if seen >= want {
                    if bin == i32::MIN {
                        return self.min.min(0.0).max(self.min);
                    }
                    let center = ((bin as f64 + 0.5) * BIN_RATIO.ln()).exp();
                    return center.clamp(self.min, self.max);
                }
            }
            self.max
        };
        Percentiles {
            min: self.min,
            p50: rank(50.0),
            p95: rank(95.0),
            p99: rank(99.0),
            max: self.max,
            mean: self.sum / self.count as f64,
        }
    }
}

/// A run's frame timings: the whole frame and each stage, in bounded memory.
#[derive(Debug, Default, Clone)]
pub struct Metrics {
    total: LatencyStats,
    stages: [LatencyStats; 5],
}

impl Metrics {
    pub fn push(&mut self, record: &FrameRecord) {
        self.total.push(record.total_ms);
        for (stats, (_, v)) in self.stages.iter_mut().zip(record.stages.stages()) {
            stats.push(v);
        }
    }

    /// Frames recorded.
    pub fn frames(&self) -> u64 {
        self.total.count()
    }

    /// Percentiles of every stage and of the whole frame, and the real-time factor.
    pub fn summary(&self) -> RunSummary {
        let total_ms = self.total.percentiles();
        let names = StageTimings::default().stages().map(|(n, _)| n);
        let stages = names
            .iter()
            .zip(&self.stages)
            .map(|(name, stats)| (name.to_string(), stats.percentiles()))
            .collect();
        RunSummary {
            frames: self.frames(),
            total_ms,
            stages,
            real_time_factor: total_ms.mean / FRAME_MS,
        }
    }
}

/// `--profile FILE`: one JSON object per frame as it is processed, then `{"event": "summary",
/// ...}`; written through `moshi_loader::output_file` (complete or absent).
pub struct ProfileWriter {
    out: OutputFile,
}

impl ProfileWriter {
    pub fn create(path: &Path) -> Result<Self> {
        Ok(Self {
            out: OutputFile::create(path)?,
        })
    }

    fn line(&mut self, value: &impl Serialize) -> Result<()> {
        let mut line = serde_json::to_vec(value).expect("records serialise");
        line.push(b'\n');
        Ok(self.out.write_bytes(&line)?)
    }

    /// Appends one frame's record.
    pub fn write(&mut self, record: &FrameRecord) -> Result<()> {
        self.line(record)
    }

    /// Appends the summary line and commits the file.
    pub fn finish(self, summary: &RunSummary) -> Result<()> {
        Ok(self.complete(summary)?.commit()?)
    }

    /// [`Self::finish`] without putting the file in place (committed with the run's other
    /// outputs by `moshi_loader::output_file::commit_all`).
    pub fn complete(mut self, summary: &RunSummary) -> Result<FinishedOutput> {
        self.line(&serde_json::json!({ "event": "summary", "summary": summary }))?;
        Ok(self.out.finish()?)
    }
}

impl RunSummary {
    /// Human-readable table: time per frame split by stage, and the real-time factor.
    pub fn to_table(&self) -> String {
        let mut s = format!(
            "{:<14} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}\n",
            "stage (ms)", "min", "p50", "p95", "p99", "max", "mean"
        );
        let row = |name: &str, p: &Percentiles| {
            format!(
                "{:<14} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}\n",
                name, p.min, p.p50, p.p95, p.p99, p.max, p.mean
            )
        };
        for (name, p) in &self.stages {
            s += &row(name, p);
        }
        s += &row("frame total", &self.total_ms);
        s += &format!(
            "{} frames, real-time factor {:.3} (compute per 80 ms frame / 80 ms; < 1 is faster than real time)\n",
            self.frames, self.real_time_factor
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = Percentiles::of(&v);
        assert_eq!(
            (p.min, p.p50, p.p95, p.p99, p.max),
            (1.0, 50.0, 95.0, 99.0, 100.0)
        );
        assert!((p.mean - 50.5).abs() < 1e-12);
        let p = Percentiles::of(&[3.0]);
        assert_eq!((p.min, p.p50, p.p99, p.max), (3.0, 3.0, 3.0, 3.0));
    }

    /// The histogram percentiles stay within 0.1 % of the exact nearest-rank ones, min, max and
    /// mean exact; memory is bounded by the bins, not the values.
    #[test]
    fn bounded_percentiles_match_exact_ones() {
        let values: Vec<f64> = (0..100_000)
            .map(|i| 20.0 + 15.0 * ((i as f64) * 0.37).sin().abs() + (i % 7) as f64 * 0.01)
            .collect();
        let mut stats = LatencyStats::default();
        values.iter().for_each(|&v| stats.push(v));
        let (got, exact) = (stats.percentiles(), Percentiles::of(&values));
        assert!(stats.exact.capacity() == 0, "values kept past EXACT_VALUES");
        assert_eq!((got.min, got.max), (exact.min, exact.max));
        assert!((got.mean - exact.mean).abs() < 1e-9 * exact.mean);
        for (g, e) in [
            (got.p50, exact.p50),
            (got.p95, exact.p95),
            (got.p99, exact.p99),
        ] {
            assert!((g - e).abs() <= 1e-3 * e, "{g} vs {e}");
        }
        assert!(stats.bins.len() < 1000, "{} bins", stats.bins.len());
        // Up to EXACT_VALUES values the percentiles are the exact ones.
        let mut few = LatencyStats::default();
        values[..EXACT_VALUES].iter().for_each(|&v| few.push(v));
        assert_eq!(few.percentiles(), Percentiles::of(&values[..EXACT_VALUES]));
        let mut zeros = LatencyStats::default();
        zeros.push(0.0);
        zeros.push(0.0);
        assert_eq!(zeros.percentiles().p50, 0.0);
    }

    #[test]
    fn summary_and_jsonl() {
        let mut m = Metrics::default();
        let mut records = Vec::new();
        for i in 0..4 {
            let stages = StageTimings {
                mimi_encode_ms: 1.0,
                lm_temporal_ms: 2.0 * i as f64,
                ..Default::default()
            };
            let record = FrameRecord {
                event: "frame",
                frame: i,
                total_ms: 40.0,
                stages,
                ..Default::default()
            };
            m.push(&record);
            records.push(record);
        }
        let s = m.summary();
        assert_eq!(s.frames, 4);
        assert!((s.real_time_factor - 0.5).abs() < 1e-12);
        assert_eq!(s.stages[1].1.max, 6.0);
        assert!(s.to_table().contains("real-time factor 0.500"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.jsonl");
        let mut w = ProfileWriter::create(&path).unwrap();
        for r in &records {
            w.write(r).unwrap();
        }
        w.finish(&s).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 5);
        assert_eq!(lines[2]["lm_temporal_ms"], 4.0);
        assert_eq!(lines[4]["event"], "summary");
    }
}
