//! Drives a [`FrameProcessor`] through warm-up and timed frames of a deterministic input signal,
//! recording one [`FrameRecord`] per timed frame and the time of one temporal layer per frame.

use std::time::Instant;

use crate::engine::FrameProcessor;
use crate::metrics::FrameRecord;
use crate::{FRAME_SAMPLES, SAMPLE_RATE_HZ};

use super::span_timer::SpanTotals;
use super::BenchError;

/// Span wrapped around every temporal layer by the model.
pub const TEMPORAL_LAYER_SPAN: &str = "lm_temporal_layer";

/// What a run produced.
#[derive(Clone, Debug, Default)]
pub struct FrameRun {
    /// One record per timed frame.
    pub records: Vec<FrameRecord>,
    /// Mean time of one temporal layer in each timed frame, ms (empty when no layer ran or no
    /// span timer was attached).
    pub layer_ms: Vec<f64>,
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

/// Runs `warmup` untimed then `frames` timed frames through `processor`. With `spans`, the
/// [`TEMPORAL_LAYER_SPAN`] totals are read after every frame.
pub fn run_frames(
    processor: &mut dyn FrameProcessor,
    warmup: usize,
    frames: usize,
    seed: u64,
    spans: Option<&SpanTotals>,
) -> Result<FrameRun, BenchError> {
    let inputs: Vec<Vec<f32>> = (0..warmup + frames)
        .map(|i| bench_input_frame(i, seed))
        .collect();
    for (i, pcm) in inputs[..warmup].iter().enumerate() {
        processor
            .process_frame(pcm)
            .map_err(|source| BenchError::Frame { frame: i, source })?;
    }
    if let Some(s) = spans {
        s.take();
    }
    let mut run = FrameRun::default();
    let start = Instant::now();
    for (i, pcm) in inputs[warmup..].iter().enumerate() {
        let _span = tracing::trace_span!("frame", index = i).entered();
        let t0 = Instant::now();
        let out = processor
            .process_frame(pcm)
            .map_err(|source| BenchError::Frame {
                frame: warmup + i,
                source,
            })?;
        let total_ms = t0.elapsed().as_secs_f64() * 1e3;
        run.records.push(FrameRecord {
            event: "frame",
            frame: i as u64,
            t_ms: start.elapsed().as_secs_f64() * 1e3,
            total_ms,
            stages: out.timings,
            ..Default::default()
        });
        if let Some(s) = spans {
            if let Some(layer) = s.take().get(TEMPORAL_LAYER_SPAN).filter(|t| t.count > 0) {
                run.layer_ms
                    .push(layer.busy.as_secs_f64() * 1e3 / layer.count as f64);
            }
        }
    }
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::FrameOutput;
    use crate::metrics::StageTimings;

    /// Counts frames and checks every input is a full frame.
    struct Counter {
        seen: usize,
    }

    impl FrameProcessor for Counter {
        fn process_frame(&mut self, pcm_in: &[f32]) -> crate::Result<FrameOutput> {
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
        let run = run_frames(&mut p, 2, 3, 1, None).unwrap();
        assert_eq!(p.seen, 5);
        assert_eq!(run.records.len(), 3);
        let stage: Vec<f64> = run
            .records
            .iter()
            .map(|r| r.stages.mimi_encode_ms)
            .collect();
        assert_eq!(stage, vec![3.0, 4.0, 5.0]);
        assert!(run.records.windows(2).all(|w| w[1].t_ms >= w[0].t_ms));
        assert!(run.layer_ms.is_empty());
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
