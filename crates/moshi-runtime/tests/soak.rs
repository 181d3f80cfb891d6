//! Soak: a long conversation with the tiny model through the null backend on a simulated
//! (lockstep) clock, the input a short clip played back to back. Resident memory must be flat
//! after warm-up (within 5 %), the LM's KV caches bounded by the attention window, and no frame
//! dropped. `short_conversation_is_flat` (3 simulated minutes) runs with every `cargo test`;
//! `one_hour_conversation_is_flat` is the hour (`scripts/soak.sh`; results in docs/soak.md).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use moshi_loader::{ModelSource, SourceOverrides, WeightMode};
use moshi_model::generator::SamplingConfig;
use moshi_model::mimi::MimiWeights;
use moshi_runtime::backend::null::{NullBackend, NullClock, NullConfig};
use moshi_runtime::backend::{start_session, AudioBackend, RingSizes};
use moshi_runtime::engine::{DropPolicy, EngineEvent, FrameOutput, FrameProcessor};
use moshi_runtime::pipeline::{MoshiModel, MoshiPipeline, SessionSettings};
use moshi_runtime::{wav, Result, FRAME_SAMPLES, SAMPLE_RATE_HZ};

fn tiny() -> PathBuf {
    moshi_test_support::tiny_a_dir()
}

/// The pipeline, with the largest KV cache size it reached.
struct Watched {
    inner: MoshiPipeline,
    kv_bytes_max: Arc<AtomicU64>,
}

impl FrameProcessor for Watched {
    fn process_frame(&mut self, pcm_in: &[f32]) -> Result<FrameOutput> {
        let out = self.inner.process_frame(pcm_in)?;
        self.kv_bytes_max.fetch_max(
            self.inner.session().kv_cache_bytes() as u64,
            Ordering::Relaxed,
        );
        Ok(out)
    }
}

fn resident_bytes() -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .expect("VmRSS in /proc/self/status")
        * 1024
}

fn soak(minutes: f64) {
    let model =
        ModelSource::resolve(tiny().to_str().unwrap(), &SourceOverrides::default()).unwrap();
    let pipeline = MoshiPipeline::new(
        Arc::new(MoshiModel::load(&model, WeightMode::Native, MimiWeights::F32).unwrap()),
        &SessionSettings::with_sampling(SamplingConfig::default()),
    )
    .unwrap();
    let context = model.lm_config.context as u64;
    let kv_bound = context * model.lm_config.dim as u64 * 2 * 4 * model.lm_config.num_layers as u64;
    let kv_bytes_max = Arc::new(AtomicU64::new(0));
    let clip = wav::read_mono(&tiny().join("input.wav")).unwrap().samples;
    let wanted_samples = (minutes * 60.0 * SAMPLE_RATE_HZ as f64) as u64;
    let loops = wanted_samples.div_ceil(clip.len() as u64);
    let total_frames = loops * clip.len() as u64 / FRAME_SAMPLES as u64;
    let config = NullConfig {
        input_loops: loops,
        keep_played: false,
        ..NullConfig::moshi(NullClock::Lockstep)
    };
    let mut backend = NullBackend::new(config, clip).unwrap();
    let session = start_session(
        &mut backend,
        Box::new(Watched {
            inner: pipeline,
            kv_bytes_max: kv_bytes_max.clone(),
        }),
        DropPolicy::RealTime {
            max_backlog_frames: 2,
        },
        0.0,
        None,
        RingSizes::default(),
    )
    .unwrap();

    // Resident memory every simulated minute (750 frames).
    let frames_per_sample = 750;
    let warm_up_frames = (total_frames / 5).max(frames_per_sample);
    let started = Instant::now();
    let mut frames = 0u64;
    let mut samples: Vec<(u64, u64)> = vec![(0, resident_bytes())];
    let mut kv_after_warm_up = None;
    while !backend.finished() {
        while let Ok(event) = session.engine.events().try_recv() {
            if let EngineEvent::Frame { .. } = event {
                frames += 1;
                if frames.is_multiple_of(frames_per_sample) {
                    samples.push((frames, resident_bytes()));
                }
                if frames == warm_up_frames {
                    kv_after_warm_up = Some(kv_bytes_max.load(Ordering::Relaxed));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    session.engine.input_done();
    backend.stop().unwrap();
    loop {
        let finished = session.engine.is_finished();
        while let Ok(event) = session.engine.events().try_recv() {
            if let EngineEvent::Frame { .. } = event {
                frames += 1;
            }
        }
        if finished {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let report = session.engine.join().unwrap();
    let c = session.counters.snapshot();
    let wall_s = started.elapsed().as_secs_f64();

    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    eprintln!(
        "soak: {total_frames} frames ({:.1} simulated minutes) in {wall_s:.1} s wall; resident memory by simulated minute:",
        total_frames as f64 * 0.08 / 60.0
    );
    for (f, rss) in &samples {
        eprintln!(
            "  minute {:5.1}: {:7.2} MiB",
            *f as f64 * 0.08 / 60.0,
            mib(*rss)
        );
    }
    let kv_max = kv_bytes_max.load(Ordering::Relaxed);
    eprintln!(
        "KV caches: {kv_max} bytes at most (bound: context {context} x dim x 2 x 4 bytes x layers = {kv_bound}); dropped {}, underruns {}",
        report.frames_dropped, c.underrun_events
    );

    assert_eq!(
        report.frames_processed, total_frames,
        "every frame processed"
    );
    assert_eq!(frames, total_frames, "one event per frame");
    assert_eq!(report.frames_dropped, 0, "no frame dropped");
    assert_eq!(c.engine_frames_dropped, 0);
    // The lockstep clock plays only what the engine has answered: the speaker never runs dry,
    // across every loop of the clip included.
    assert_eq!(c.underrun_events, 0, "underruns on a lockstep clock");
    assert!(kv_max <= kv_bound, "KV caches {kv_max} > bound {kv_bound}");
    assert_eq!(
        kv_after_warm_up,
        Some(kv_max),
        "the KV caches kept growing after warm-up"
    );
    let at_warm_up = samples
        .iter()
        .find(|(f, _)| *f >= warm_up_frames)
        .map(|(_, r)| *r)
        .expect("a sample after warm-up");
    let later_max = samples
        .iter()
        .filter(|(f, _)| *f >= warm_up_frames)
        .map(|(_, r)| *r)
        .max()
        .unwrap();
    assert!(
        later_max as f64 <= at_warm_up as f64 * 1.05,
        "resident memory grew from {:.2} MiB after warm-up to {:.2} MiB",
        mib(at_warm_up),
        mib(later_max)
    );
}

#[test]
fn short_conversation_is_flat() {
    soak(3.0);
}

#[test]
#[ignore = "an hour of simulated conversation (a few minutes of compute): scripts/soak.sh"]
fn one_hour_conversation_is_flat() {
    soak(60.0);
}
