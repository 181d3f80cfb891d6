//! Per-frame timing records, percentile summaries and the real-time factor, serialisable as
//! JSON Lines (`--profile FILE`). One record per processed model frame; the summary splits the
//! time by stage (Mimi encode, temporal LM, depformer, sampling, Mimi decode).

use std::io::Write;
use std::path::Path;

use serde::Serialize;

use crate::{Result, RuntimeError, FRAME_MS};

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
    /// Input waiting behind this frame when it was taken (24 kHz samples -> ms); live mode only.
    pub mic_backlog_ms: f64,
    /// Output queued ahead of this frame's first sample when it was pushed, ms; live mode only.
    pub speaker_queue_ms: f64,
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

/// Accumulates [`FrameRecord`]s.
#[derive(Debug, Default, Clone)]
pub struct Metrics {
    pub records: Vec<FrameRecord>,
}

impl Metrics {
    pub fn push(&mut self, record: FrameRecord) {
        self.records.push(record);
    }

    /// Percentiles of every stage and of the whole frame, and the real-time factor.
    pub fn summary(&self) -> RunSummary {
        let totals: Vec<f64> = self.records.iter().map(|r| r.total_ms).collect();
        let total_ms = Percentiles::of(&totals);
        let names = StageTimings::default().stages().map(|(n, _)| n);
        let stages = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let v: Vec<f64> = self
                    .records
                    .iter()
                    .map(|r| r.stages.stages()[i].1)
                    .collect();
                (name.to_string(), Percentiles::of(&v))
            })
            .collect();
        RunSummary {
            frames: self.records.len() as u64,
            total_ms,
            stages,
            real_time_factor: total_ms.mean / FRAME_MS,
        }
    }

    /// Writes every record as one JSON object per line, then a final `{"event":"summary",...}`.
    pub fn write_jsonl(&self, path: &Path) -> Result<()> {
        let err = |cause| RuntimeError::Write {
            path: path.to_path_buf(),
            cause,
        };
        let file = std::fs::File::create(path).map_err(err)?;
        let mut w = std::io::BufWriter::new(file);
        for r in &self.records {
            serde_json::to_writer(&mut w, r).map_err(|e| err(e.into()))?;
            w.write_all(b"\n").map_err(err)?;
        }
        let summary = serde_json::json!({ "event": "summary", "summary": self.summary() });
        serde_json::to_writer(&mut w, &summary).map_err(|e| err(e.into()))?;
        w.write_all(b"\n").map_err(err)?;
        w.flush().map_err(err)
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

    #[test]
    fn summary_and_jsonl() {
        let mut m = Metrics::default();
        for i in 0..4 {
            let stages = StageTimings {
                mimi_encode_ms: 1.0,
                lm_temporal_ms: 2.0 * i as f64,
                ..Default::default()
            };
            m.push(FrameRecord {
                event: "frame",
                frame: i,
                total_ms: 40.0,
                stages,
                ..Default::default()
            });
        }
        let s = m.summary();
        assert_eq!(s.frames, 4);
        assert!((s.real_time_factor - 0.5).abs() < 1e-12);
        assert_eq!(s.stages[1].1.max, 6.0);
        assert!(s.to_table().contains("real-time factor 0.500"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.jsonl");
        m.write_jsonl(&path).unwrap();
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
