//! The benchmark's input signal and its frame loop: warm-up and timed frames go through the
//! engine's own offline driver ([`run_offline`], [`OfflineRunner`], as in `moshi-rs file`), recording one
//! [`FrameRecord`] per timed frame and the time of one temporal layer per frame.

use moshi_runtime::engine::{run_offline, FrameProcessor, OfflineRunner};
use moshi_runtime::metrics::FrameRecord;
use moshi_runtime::{FRAME_SAMPLES, SAMPLE_RATE_HZ};

use crate::span_timer::SpanTotals;
use crate::BenchError;

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

/// Runs `warmup` untimed frames ([`run_offline`]) then `frames` timed ones ([`OfflineRunner`],
/// each frame's record kept). With `spans`, the [`TEMPORAL_LAYER_SPAN`] totals are read after every frame.
pub fn run_frames(
    processor: &mut dyn FrameProcessor,
    warmup: usize,
    frames: usize,
    seed: u64,
    spans: Option<&SpanTotals>,
) -> Result<FrameRun, BenchError> {
    let input: Vec<f32> = (0..warmup + frames)
        .flat_map(|i| bench_input_frame(i, seed))
        .collect();
    let (warmup_pcm, timed_pcm) = input.split_at(warmup * FRAME_SAMPLES);
    // `run_offline` names no frame in its errors: count the frames that completed.
    let mut completed = 0;
    run_offline(processor, warmup_pcm, |_, _| completed += 1).map_err(|source| {
        BenchError::Frame {
            frame: completed,
            source,
        }
    })?;
    if let Some(s) = spans {
        s.take();
    }
    // The timed frames through the engine's offline frame loop, keeping each frame's record.
    let mut runner = OfflineRunner::new();
    let mut records = Vec::with_capacity(frames);
    let mut layer_ms = Vec::new();
    for (i, frame) in timed_pcm.chunks_exact(FRAME_SAMPLES).enumerate() {
        let (record, _) = runner
            .process(processor, frame)
            .map_err(|source| BenchError::Frame {
                frame: warmup + i,
                source,
            })?;
        records.push(record);
        if let Some(s) = spans {
            if let Some(layer) = s.take().get(TEMPORAL_LAYER_SPAN).filter(|t| t.count > 0) {
                layer_ms.push(layer.busy.as_secs_f64() * 1e3 / layer.count as f64);
            }
        }
    }
    Ok(FrameRun { records, layer_ms })
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
