//! Several sessions of the whole pipeline (Mimi encode, LM, Mimi decode) over one set of weights,
//! their frames processed together by `MoshiModel::step`: each session's audio
//! (bit for bit), tokens and words equal its run alone, whoever shares its batches, with
//! sessions joining and leaving at any frame (a joining session takes its first frame's extra
//! LM step), greedy and sampled, q4 and bf16 weights, Moshi and Hibiki with guidance. A wrong
//! frame fails its own session only.

use std::sync::Arc;

use moshi_loader::{ModelSource, SourceOverrides, WeightMode};
use moshi_model::generator::SamplingConfig;
use moshi_model::mimi::MimiWeights;
use moshi_runtime::engine::{FrameOutput, FrameProcessor};
use moshi_runtime::pipeline::{
    FrameInput, MoshiModel, MoshiPipeline, MoshiSession, SessionSettings,
};
use moshi_runtime::{wav, RuntimeError, FRAME_SAMPLES};
use moshi_test_support::{fixture, fixture_dir, hashed_uniform};

fn load(fixture_name: &str, mode: WeightMode) -> Arc<MoshiModel> {
    let dir = fixture_dir(fixture_name);
    let mut overrides = SourceOverrides::default();
    if fixture_name == "tiny-a" && mode == WeightMode::Native {
        overrides.lm_weights = Some(dir.join("model.q4.safetensors"));
    }
    let model = ModelSource::resolve(dir.to_str().unwrap(), &overrides).unwrap();
    Arc::new(MoshiModel::load(&model, mode, MimiWeights::F32).unwrap())
}

/// `sampling` with the guidance `cfg_coef` (`None`: the config's).
fn settings(sampling: &SamplingConfig, cfg_coef: Option<f32>) -> SessionSettings {
    SessionSettings {
        cfg_coef,
        ..SessionSettings::with_sampling(sampling.clone())
    }
}

/// Session `i`'s input: the fixture's speech for the even sessions, noise for the odd ones.
fn input(fixture_name: &str, i: usize, frames: usize) -> Vec<f32> {
    let mut pcm = if i.is_multiple_of(2) {
        wav::read_mono(&fixture(fixture_name, "input.wav"))
            .unwrap()
            .samples
    } else {
        hashed_uniform(frames * FRAME_SAMPLES, i as u32)
            .iter()
            .map(|v| v * 0.2)
            .collect()
    };
    pcm.resize(frames * FRAME_SAMPLES, 0.0);
    pcm
}

/// (first frame, frames, sampling) of each session.
fn schedule() -> Vec<(usize, usize, SamplingConfig)> {
    let seeded = |seed| SamplingConfig {
        seed,
        ..SamplingConfig::default()
    };
    vec![
        (0, 30, SamplingConfig::greedy()),
        (2, 12, seeded(5)),
        (5, 30, seeded(6)),
        (13, 20, SamplingConfig::greedy()),
    ]
}

fn check(fixture_name: &str, model: &Arc<MoshiModel>, cfg_coef: Option<f32>) {
    let plan = schedule();
    let alone: Vec<Vec<FrameOutput>> = plan
        .iter()
        .enumerate()
        .map(|(i, (_, frames, sampling))| {
            let mut p = MoshiPipeline::new(model.clone(), &settings(sampling, cfg_coef)).unwrap();
            input(fixture_name, i, *frames)
                .chunks_exact(FRAME_SAMPLES)
                .map(|f| p.process_frame(f).unwrap())
                .collect()
        })
        .collect();
    let mut sessions: Vec<MoshiSession> = plan
        .iter()
        .map(|(_, _, sampling)| model.new_session(&settings(sampling, cfg_coef)).unwrap())
        .collect();
    let inputs: Vec<Vec<f32>> = plan
        .iter()
        .enumerate()
        .map(|(i, (_, frames, _))| input(fixture_name, i, *frames))
        .collect();
    let end = plan.iter().map(|(first, n, _)| first + n).max().unwrap();
    let mut largest = 0;
    for t in 0..end {
        let active: Vec<usize> = (0..plan.len())
            .filter(|&i| (plan[i].0..plan[i].0 + plan[i].1).contains(&t))
            .collect();
        let frames: Vec<FrameInput> = active
            .iter()
            .map(|&i| {
                let f = t - plan[i].0;
                FrameInput::Pcm(&inputs[i][f * FRAME_SAMPLES..(f + 1) * FRAME_SAMPLES])
            })
            .collect();
        let mut batch: Vec<&mut MoshiSession> = sessions
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| active.contains(i))
            .map(|(_, p)| p)
            .collect();
        largest = largest.max(batch.len());
        let outputs = model.step(&mut batch, &frames);
        for (&i, out) in active.iter().zip(outputs) {
            let f = t - plan[i].0;
            assert!(
                out.unwrap().same_output(&alone[i][f]),
                "{fixture_name}: session {i} frame {f} differs from its run alone"
            );
        }
    }
    assert!(largest >= 3, "sessions overlapped");
    assert!(
        alone.iter().flatten().any(|o| o.tokens.is_some()),
        "the sessions produced frames"
    );
}

#[test]
fn batched_sessions_equal_sessions_alone() {
    check("tiny-a", &load("tiny-a", WeightMode::Native), None);
    check("tiny-a", &load("tiny-a", WeightMode::DequantizeBf16), None);
    let hibiki = load("tiny-hibiki", WeightMode::Native);
    check("tiny-hibiki", &hibiki, Some(3.0));
}

#[test]
fn a_wrong_frame_fails_its_own_session_only() {
    let model = load("tiny-a", WeightMode::Native);
    let greedy = settings(&SamplingConfig::greedy(), None);
    let mut reference = MoshiPipeline::new(model.clone(), &greedy).unwrap();
    let mut good = model.new_session(&greedy).unwrap();
    let mut bad = model.new_session(&greedy).unwrap();
    let pcm = input("tiny-a", 0, 4);
    for f in pcm.chunks_exact(FRAME_SAMPLES) {
        let want = reference.process_frame(f).unwrap();
        let short = &f[1..];
        let mut batch = [&mut bad, &mut good];
        let out = model.step(&mut batch, &[FrameInput::Pcm(short), FrameInput::Pcm(f)]);
        assert!(matches!(
            out[0],
            Err(RuntimeError::FrameSize {
                expected: FRAME_SAMPLES,
                got
            }) if got == FRAME_SAMPLES - 1
        ));
        assert!(out[1].as_ref().unwrap().same_output(&want));
    }
}
