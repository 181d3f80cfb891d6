//! `run_bench` on the tiny configs with random weights, every stage, one and several sessions,
//! guided (Hibiki) and not: each run drives its frames through the model's one step
//! (`MoshiModel::step`, `Generator::step`, the weights' row API for the depformer alone) and
//! writes a report whose stage timings, row and session counts and KV traffic follow the options
//! (no timing thresholds). And the N-session pipeline of `--sessions N` is the batched step of the
//! library: its first session's audio, tokens and text equal that session run alone, bit for bit.

#![cfg(feature = "pipeline")]

use std::sync::Arc;

use moshi_bench::kv_traffic::kv_read_per_layer_bytes;
use moshi_bench::report::BenchReport;
use moshi_bench::run::{run_bench, BenchOptions, Stage, WeightSource};
use moshi_bench::sessions::SessionsPipeline;
use moshi_bench::BenchError;
use moshi_loader::{LmConfig, ModelSource, SourceOverrides, WeightMode};
use moshi_model::generator::SamplingConfig;
use moshi_model::mimi::MimiWeights;
use moshi_model::nn::KvPrecision;
use moshi_runtime::engine::FrameProcessor;
use moshi_runtime::pipeline::{MoshiModel, MoshiPipeline, SessionSettings};
use moshi_runtime::{wav, FRAME_SAMPLES};
use moshi_test_support::{fixture, tiny_a, tiny_a_dir};

/// A small run of `stage` on the fixture's config: 1 warm-up and 2 timed frames, f32 caches.
fn options(fixture_name: &str, stage: Stage, sessions: usize) -> BenchOptions {
    BenchOptions {
        weights: WeightSource::Random,
        config: Some(fixture(fixture_name, "config.json")),
        layers: None,
        quant: None,
        group_size: None,
        frames: 2,
        warmup: 1,
        kv_prefill: 0,
        kv_cache: KvPrecision::F32,
        activations: moshi_kernels::ActivationPrecision::Exact,
        threads: 1,
        stage,
        seed: 3,
        mimi_weights: MimiWeights::F32,
        bandwidth_buffer_mib: 1,
        probe_every: 1,
        cfg_coef: None,
        sessions,
        tts_n_q: None,
        keep_frames: true,
    }
}

fn run(options: &BenchOptions) -> BenchReport {
    run_bench(options, None, &mut |_| {}).unwrap_or_else(|e| {
        panic!(
            "stage {} with {} sessions: {e}",
            options.stage.name(),
            options.sessions
        )
    })
}

/// Every timed frame ran the parts of the pipeline `stage` runs, and no other.
fn check_stage_timings(report: &BenchReport, stage: Stage) {
    let frames: Vec<_> = report
        .frames
        .as_ref()
        .expect("frames kept")
        .records()
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(frames.len(), 2);
    assert_eq!(report.run.stage, stage.name());
    let (mimi, temporal, depformer) = match stage {
        Stage::All => (true, true, true),
        Stage::Mimi => (true, false, false),
        Stage::Lm => (false, true, true),
        Stage::Depformer => (false, false, true),
        // The canceller alone: no model stage, its time is the frame's.
        Stage::EchoCancel => (false, false, false),
    };
    for r in &frames {
        let s = &r.stages;
        assert_eq!(s.mimi_encode_ms > 0.0, mimi, "{stage:?}: {s:?}");
        assert_eq!(s.mimi_decode_ms > 0.0, mimi, "{stage:?}: {s:?}");
        assert_eq!(s.lm_temporal_ms > 0.0, temporal, "{stage:?}: {s:?}");
        assert_eq!(s.lm_depformer_ms > 0.0, depformer, "{stage:?}: {s:?}");
        assert_eq!(s.sampling_ms > 0.0, depformer, "{stage:?}: {s:?}");
    }
}

/// A stage that reads the LM's weights probed the bandwidth before each of its 2 frames and set
/// both frames against it; the others took no probe.
fn check_probes_beside_frames(report: &BenchReport, stage: Stage) {
    let beside = report.bound.beside_frames.as_ref();
    if !matches!(stage, Stage::All | Stage::Lm | Stage::Depformer) {
        assert!(beside.is_none(), "{stage:?}");
        return;
    }
    let beside = beside.unwrap_or_else(|| panic!("{stage:?}: no probes beside the frames"));
    assert_eq!(beside.every_frames, 1);
    let (probes, ratios) = (&beside.probes_gbps, &beside.ratio_to_bound);
    assert!(probes.min > 0.0 && probes.max.is_finite(), "{probes:?}");
    assert!(ratios.min > 0.0 && ratios.max.is_finite(), "{ratios:?}");
    // Each frame's ratio is its LM step over the bytes' time at its probe's bandwidth.
    let (steps, bytes) = (
        &report.stages.lm_step_ms,
        report.weights.lm_read_per_frame_bytes() as f64,
    );
    let ratio = |ms: f64, gbps: f64| ms / (bytes / (gbps * 1e6));
    let slack = 1e-9;
    assert!(
        ratios.min >= ratio(steps.min, probes.min) * (1.0 - slack),
        "{ratios:?}"
    );
    assert!(
        ratios.max <= ratio(steps.max, probes.max) * (1.0 + slack),
        "{ratios:?}"
    );
}

#[test]
fn every_stage_runs_and_reports_its_parts() {
    for stage in [
        Stage::All,
        Stage::Mimi,
        Stage::Lm,
        Stage::Depformer,
        Stage::EchoCancel,
    ] {
        let report = run(&options("tiny-a", stage, 1));
        check_stage_timings(&report, stage);
        check_probes_beside_frames(&report, stage);
        assert_eq!(report.run.sessions, 1);
        assert_eq!(report.run.lm_rows, 1);
        assert_eq!(report.run.cfg_coef, 1.0);
    }
}

#[test]
fn several_sessions_step_together_with_prefilled_caches() {
    let cfg = LmConfig::from_file(tiny_a("config.json")).unwrap();
    // f32 caches, and 8-bit ones: a byte a value and an f32 scale a head.
    let kv_caches = [
        (Stage::All, KvPrecision::F32, 4 * cfg.dim),
        (Stage::Lm, KvPrecision::F32, 4 * cfg.dim),
        (Stage::Lm, KvPrecision::I8, cfg.dim + 4 * cfg.num_heads),
    ];
    for (stage, kv_cache, position_bytes) in kv_caches {
        let mut o = options("tiny-a", stage, 3);
        o.kv_prefill = 5;
        o.kv_cache = kv_cache;
        let report = run(&o);
        assert_eq!(report.run.kv_cache, kv_cache.name());
        check_stage_timings(&report, stage);
        assert_eq!(report.run.sessions, 3);
        assert_eq!(report.run.kv_prefill_positions, 5);
        assert_eq!(report.weights.weight_passes_per_frame, 1);
        // The pipeline's first frame takes 2 LM steps (the model type's conventions), the LM
        // stage's 1; the prefilled positions come before either.
        let first_frame_steps = if stage == Stage::All { 2 } else { 1 };
        let per_session =
            kv_read_per_layer_bytes(position_bytes, cfg.context, 5 + first_frame_steps, 1, 2);
        assert_eq!(report.weights.kv_cache_layer_read_bytes, 3 * per_session);
        assert_eq!(
            report.weights.kv_cache_read_per_frame_bytes,
            3 * per_session * cfg.num_layers as u64
        );
    }
}

#[test]
fn a_guided_translation_model_runs_two_rows_per_session() {
    for stage in [Stage::All, Stage::Lm] {
        let mut o = options("tiny-hibiki", stage, 2);
        o.cfg_coef = Some(3.0);
        o.kv_cache = KvPrecision::Bf16;
        let report = run(&o);
        check_stage_timings(&report, stage);
        assert_eq!(report.run.cfg_coef, 3.0);
        assert_eq!(report.run.lm_rows, 2);
        assert_eq!(report.run.sessions, 2);
        assert_eq!(report.run.kv_cache, "bf16");
    }
    // The depformer alone runs no guidance: a coefficient is refused there.
    let mut o = options("tiny-hibiki", Stage::Depformer, 1);
    o.cfg_coef = Some(3.0);
    assert!(matches!(
        run_bench(&o, None, &mut |_| {}),
        Err(BenchError::GuidanceStage {
            stage: "depformer",
            ..
        })
    ));
}

#[test]
fn the_sessions_pipeline_is_the_batched_step_of_the_library() {
    let resolved =
        ModelSource::resolve(tiny_a_dir().to_str().unwrap(), &SourceOverrides::default()).unwrap();
    let model =
        Arc::new(MoshiModel::load(&resolved, WeightMode::Native, MimiWeights::F32).unwrap());
    let settings = |seed| {
        SessionSettings::with_sampling(SamplingConfig {
            seed,
            ..SamplingConfig::default()
        })
    };
    let sessions = (0..3)
        .map(|i| model.new_session(&settings(7 + i)).unwrap())
        .collect();
    let mut batched = SessionsPipeline::new(model.clone(), sessions);
    let mut alone = MoshiPipeline::new(model, &settings(7)).unwrap();
    let input = wav::read_mono(&tiny_a("input.wav")).unwrap().samples;
    let mut tokens = 0;
    for (f, frame) in input.chunks_exact(FRAME_SAMPLES).enumerate() {
        let got = batched.process_frame(frame).unwrap();
        let want = alone.process_frame(frame).unwrap();
        assert!(
            got.same_output(&want),
            "frame {f} differs from the session alone"
        );
        tokens += usize::from(got.tokens.is_some());
    }
    assert!(tokens > 0, "the sessions produced frames");
}
