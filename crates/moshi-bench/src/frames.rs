//! The benchmark's input signal and its frame loop: warm-up and timed frames go through the
//! engine's own offline driver ([`OfflineRunner`], as in `moshi-rs file`). Memory stays flat
//! whatever `--frames`: each input frame is made when it is needed, the timings go into
//! streaming statistics ([`StageSeries`]: exact up to
//! [`moshi_runtime::metrics::EXACT_VALUES`] frames, within 0.1 % past them), and the records
//! the `--json` report lists go to a file on disk ([`FrameLog`]), not to memory.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom, Write};

use moshi_runtime::engine::{FrameProcessor, OfflineRunner};
use moshi_runtime::metrics::{FrameRecord, LatencyStats, StageTimings};
use moshi_runtime::{FRAME_SAMPLES, SAMPLE_RATE_HZ};
use serde::ser::{Error as _, SerializeSeq};

use crate::frame_probe::FrameProbe;
use crate::report::{lm_step_ms, StageStats};
use crate::span_timer::SpanTotals;
use crate::BenchError;

/// Span wrapped around every temporal layer by the model.
pub const TEMPORAL_LAYER_SPAN: &str = "lm_temporal_layer";

/// What a run produced.
#[derive(Debug, Default)]
pub struct FrameRun {
    /// Statistics of every stage over the timed frames.
    pub stages: StageSeries,
    /// Mean time of one temporal layer in each timed frame, ms (empty when no layer ran or no
    /// span timer was attached).
    pub layer_ms: LatencyStats,
    /// Every timed frame's record, when asked for.
    pub log: Option<FrameLog>,
}

/// Streaming statistics of every stage, the LM step and the whole frame.
#[derive(Debug, Default, Clone)]
pub struct StageSeries {
    stages: [LatencyStats; 5],
    lm_step: LatencyStats,
    total: LatencyStats,
}

impl StageSeries {
    pub fn push(&mut self, r: &FrameRecord) {
        for (stats, (_, v)) in self.stages.iter_mut().zip(r.stages.stages()) {
            stats.push(v);
        }
        self.lm_step.push(lm_step_ms(r));
        self.total.push(r.total_ms);
    }

    /// Frames pushed.
    pub fn frames(&self) -> u64 {
        self.total.count()
    }

    /// Percentiles of every series.
    pub fn stats(&self) -> StageStats {
        let [encode, temporal, depformer, sampling, decode] =
            self.stages.each_ref().map(LatencyStats::percentiles);
        StageStats {
            mimi_encode_ms: encode,
            lm_temporal_ms: temporal,
            lm_depformer_ms: depformer,
            sampling_ms: sampling,
            mimi_decode_ms: decode,
            lm_step_ms: self.lm_step.percentiles(),
            total_ms: self.total.percentiles(),
        }
    }
}

/// Bytes of one record in a [`FrameLog`]: the frame number and nine f64 fields.
const RECORD_BYTES: usize = 80;

/// Records written to the file at a time.
const LOG_BUFFER_RECORDS: usize = 1024;

/// The timed frames' records in an anonymous temporary file (removed by the system when the
/// process ends, however it ends), `RECORD_BYTES` each: a run of a million frames keeps
/// them on disk, not in memory. Serialises as the list of records, read back one at a time.
#[derive(Debug)]
pub struct FrameLog {
    file: File,
    buffer: Vec<u8>,
    records: u64,
}

impl FrameLog {
    /// An empty log in the system's temporary folder (`TMPDIR`).
    pub fn create() -> std::io::Result<Self> {
        Ok(Self {
            file: tempfile::tempfile()?,
            buffer: Vec::with_capacity(LOG_BUFFER_RECORDS * RECORD_BYTES),
            records: 0,
        })
    }

    /// Appends one record.
    pub fn push(&mut self, r: &FrameRecord) -> std::io::Result<()> {
        let s = &r.stages;
        self.buffer.extend_from_slice(&r.frame.to_le_bytes());
        for v in [
            r.t_ms,
            r.total_ms,
            s.mimi_encode_ms,
            s.lm_temporal_ms,
            s.lm_depformer_ms,
            s.sampling_ms,
            s.mimi_decode_ms,
            r.mic_backlog_ms,
            r.speaker_queue_ms,
        ] {
            self.buffer.extend_from_slice(&v.to_le_bytes());
        }
        self.records += 1;
        if self.buffer.len() >= LOG_BUFFER_RECORDS * RECORD_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.write_all(&self.buffer)?;
        self.buffer.clear();
        Ok(())
    }

    /// Records logged.
    pub fn len(&self) -> u64 {
        self.records
    }

    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// The records, from the first, read back one at a time.
    pub fn records(
        &self,
    ) -> std::io::Result<impl Iterator<Item = std::io::Result<FrameRecord>> + '_> {
        let mut file = &self.file;
        file.seek(SeekFrom::Start(0))?;
        let mut reader = BufReader::new(file);
        Ok((0..self.records).map(move |_| {
            let mut b = [0u8; RECORD_BYTES];
            reader.read_exact(&mut b)?;
            let f = |i: usize| f64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"));
            Ok(FrameRecord {
                event: "frame",
                frame: u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
                t_ms: f(1),
                total_ms: f(2),
                stages: StageTimings {
                    mimi_encode_ms: f(3),
                    lm_temporal_ms: f(4),
                    lm_depformer_ms: f(5),
                    sampling_ms: f(6),
                    mimi_decode_ms: f(7),
                },
                mic_backlog_ms: f(8),
                speaker_queue_ms: f(9),
                echo: None,
            })
        }))
    }

    /// Writes the buffered records out: call once the run is over, before reading.
    pub fn finish(mut self) -> std::io::Result<Self> {
        self.flush()?;
        Ok(self)
    }
}

impl serde::Serialize for FrameLog {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.records as usize))?;
        let records = self.records().map_err(S::Error::custom)?;
        for r in records {
            seq.serialize_element(&r.map_err(S::Error::custom)?)?;
        }
        seq.end()
    }
}

/// Input frame `index`: a voiced, speech-like signal (harmonics of a gliding 110-220 Hz pitch
/// with a syllable-rate envelope) plus low noise, about -20 dBFS. Deterministic in `seed`.
pub fn bench_input_frame(index: usize, seed: u64) -> Vec<f32> {
    let mut state = seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xA5A5_5A5A;
    let mut noise = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let sr = SAMPLE_RATE_HZ as f32;
    (0..FRAME_SAMPLES)
        .map(|i| {
            let t = (index * FRAME_SAMPLES + i) as f32 / sr;
            let pitch = 165.0 + 55.0 * (2.0 * std::f32::consts::PI * 0.7 * t).sin();
            let envelope = 0.5 + 0.5 * (2.0 * std::f32::consts::PI * 4.0 * t).sin().abs();
            let phase = 2.0 * std::f32::consts::PI * pitch * t;
            let voiced: f32 = (1..=5).map(|h| (phase * h as f32).sin() / h as f32).sum();
            0.06 * envelope * voiced + 0.005 * noise()
        })
        .collect()
}

/// Runs `warmup` untimed frames then `frames` timed ones through [`OfflineRunner`], their
/// timings into streaming statistics and, with `log`, every timed frame's record into it. With
/// `spans`, the [`TEMPORAL_LAYER_SPAN`] totals are read after every frame; with `probe`, its
/// passes run between the timed frames (untimed) and it gets every frame's LM step.
pub fn run_frames(
    processor: &mut dyn FrameProcessor,
    warmup: usize,
    frames: usize,
    seed: u64,
    spans: Option<&SpanTotals>,
    mut log: Option<FrameLog>,
    mut probe: Option<&mut FrameProbe>,
) -> Result<FrameRun, BenchError> {
    let mut warmup_runner = OfflineRunner::new();
    for i in 0..warmup {
        warmup_runner
            .process(processor, &bench_input_frame(i, seed))
            .map_err(|source| BenchError::Frame { frame: i, source })?;
    }
    if let Some(s) = spans {
        s.take();
    }
    let mut runner = OfflineRunner::new();
    let mut run = FrameRun::default();
    for i in warmup..warmup + frames {
        if let Some(p) = probe.as_deref_mut() {
            p.before_frame(i - warmup);
        }
        let (record, _) = runner
            .process(processor, &bench_input_frame(i, seed))
            .map_err(|source| BenchError::Frame { frame: i, source })?;
        if let Some(p) = probe.as_deref_mut() {
            p.after_frame(lm_step_ms(&record));
        }
        run.stages.push(&record);
        if let Some(log) = log.as_mut() {
            log.push(&record).map_err(BenchError::FrameLog)?;
        }
        if let Some(s) = spans {
            if let Some(layer) = s.take().get(TEMPORAL_LAYER_SPAN).filter(|t| t.count > 0) {
                run.layer_ms
                    .push(layer.busy.as_secs_f64() * 1e3 / layer.count as f64);
            }
        }
    }
    run.log = log
        .map(FrameLog::finish)
        .transpose()
        .map_err(BenchError::FrameLog)?;
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use moshi_runtime::engine::FrameOutput;
    use moshi_runtime::metrics::StageTimings;

    /// Counts frames and checks every input is a full frame.
    struct Counter {
        seen: usize,
    }

    impl FrameProcessor for Counter {
        fn process_frame(&mut self, pcm_in: &[f32]) -> moshi_runtime::Result<FrameOutput> {
            assert_eq!(pcm_in.len(), FRAME_SAMPLES);
            self.seen += 1;
            let timings = StageTimings {
                mimi_encode_ms: self.seen as f64,
                ..Default::default()
            };
            Ok(FrameOutput {
                pcm: vec![0.0; FRAME_SAMPLES],
                timings,
                ..Default::default()
            })
        }
    }

    #[test]
    fn warmup_frames_are_run_but_not_recorded() {
        let mut p = Counter { seen: 0 };
        let run = run_frames(
            &mut p,
            2,
            3,
            1,
            None,
            Some(FrameLog::create().unwrap()),
            None,
        )
        .unwrap();
        assert_eq!(p.seen, 5);
        assert_eq!(run.stages.frames(), 3);
        let records: Vec<FrameRecord> = run
            .log
            .as_ref()
            .unwrap()
            .records()
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let stage: Vec<f64> = records.iter().map(|r| r.stages.mimi_encode_ms).collect();
        assert_eq!(stage, vec![3.0, 4.0, 5.0]);
        assert_eq!(run.stages.stats().mimi_encode_ms.max, 5.0);
        assert!(records.windows(2).all(|w| w[1].t_ms >= w[0].t_ms));
        assert_eq!(run.layer_ms.count(), 0);
    }

    /// The records read back from the log equal those written, bit for bit, and serialise as
    /// the list of them (the `--json` report's `frames`).
    #[test]
    fn the_frame_log_gives_back_its_records() {
        let mut log = FrameLog::create().unwrap();
        let written: Vec<FrameRecord> = (0..2500u64)
            .map(|i| FrameRecord {
                event: "frame",
                frame: i,
                t_ms: i as f64 * 80.125,
                total_ms: 1.0 / (i + 1) as f64,
                stages: StageTimings {
                    lm_temporal_ms: i as f64 * 0.5,
                    ..Default::default()
                },
                mic_backlog_ms: -0.0,
                speaker_queue_ms: 3.5,
                echo: None,
            })
            .collect();
        for r in &written {
            log.push(r).unwrap();
        }
        let log = log.finish().unwrap();
        assert_eq!(log.len(), 2500);
        let back: Vec<FrameRecord> = log.records().unwrap().map(Result::unwrap).collect();
        assert_eq!(back, written);
        assert_eq!(
            serde_json::to_value(&log).unwrap(),
            serde_json::to_value(&written).unwrap()
        );
    }

    #[test]
    fn input_is_deterministic_bounded_and_not_silent() {
        let a = bench_input_frame(3, 9);
        assert_eq!(a, bench_input_frame(3, 9));
        assert_ne!(a, bench_input_frame(4, 9));
        let peak = a.iter().fold(0f32, |m, v| m.max(v.abs()));
        let rms = (a.iter().map(|v| v * v).sum::<f32>() / a.len() as f32).sqrt();
        assert!(peak < 0.5 && rms > 0.01, "peak {peak}, rms {rms}");
    }
}
