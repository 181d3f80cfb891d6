//! File translation with the tiny-hibiki model (`assets/tiny-hibiki`, official PyTorch
//! reference): the returned frames against `ref/hibiki_greedy.json`, the end-of-text rule
//! (EOS after the end of the input stops, EOS before it does not, the cap), and live
//! processing of the same model.

use std::path::PathBuf;
use std::sync::Arc;

use moshi_loader::{ModelSource, SourceOverrides, WeightMode};
use moshi_model::generator::SamplingConfig;
use moshi_model::mimi::MimiWeights;
use moshi_runtime::engine::FrameProcessor;
use moshi_runtime::pipeline::{MoshiModel, MoshiPipeline, SessionSettings};
use moshi_runtime::translate::{translate_offline, SliceFrames, TranslationEnd};
use moshi_runtime::{wav, RuntimeError, FRAME_SAMPLES};
use serde_json::Value;

fn tiny() -> PathBuf {
    moshi_test_support::fixture_dir("tiny-hibiki")
}

fn pipeline(cfg_coef: f32) -> MoshiPipeline {
    let model =
        ModelSource::resolve(tiny().to_str().unwrap(), &SourceOverrides::default()).unwrap();
    let model = MoshiModel::load(&model, WeightMode::Native, MimiWeights::F32).unwrap();
    let settings = SessionSettings {
        cfg_coef: Some(cfg_coef),
        ..SessionSettings::with_sampling(SamplingConfig::greedy())
    };
    MoshiPipeline::new(Arc::new(model), &settings).unwrap()
}

fn input() -> Vec<f32> {
    wav::read_mono(&tiny().join("input.wav")).unwrap().samples
}

/// `out_text_tokens` of the reference (51 returned frames: 44 for the input, 1 for the
/// end-of-stream step, 6 for the silence frames).
fn reference_text() -> Vec<u32> {
    let r: Value = serde_json::from_str(
        &std::fs::read_to_string(tiny().join("ref/hibiki_greedy.json")).unwrap(),
    )
    .unwrap();
    r["out_text_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

fn translate(end_text_id: Option<u32>, max_tail_frames: usize) -> (Vec<u32>, TranslationEnd) {
    let mut p = pipeline(3.0);
    let mut text = Vec::new();
    let mut samples = 0;
    let mut calls = 0u64;
    let input = input();
    let t = translate_offline(
        &mut p,
        &mut SliceFrames::new(&input),
        end_text_id,
        max_tail_frames,
        |i, o| -> Result<(), RuntimeError> {
            assert_eq!(i as usize, text.len());
            text.push(o.tokens.as_ref().unwrap().text);
            samples += o.pcm.len();
            Ok(())
        },
        |record| {
            assert_eq!(record.frame, calls);
            calls += 1;
        },
    )
    .unwrap();
    assert_eq!(t.metrics.frames(), calls);
    assert_eq!(t.frames_out as usize, text.len());
    assert_eq!(samples, text.len() * FRAME_SAMPLES);
    (text, t.end)
}

#[test]
fn translation_returns_the_reference_frames_and_stops_at_the_cap() {
    let p = pipeline(3.0);
    assert!(p.model().is_translation());
    assert_eq!(p.session().cfg_coef(), 3.0);
    let want = reference_text();
    // The fixture's tokenizer ends text with `</s>` (2), which random weights never sample.
    assert_eq!(p.model().eos_text_id(), Some(2));
    let (text, end) = translate(Some(2), 6);
    assert_eq!(text, want);
    assert_eq!(end, TranslationEnd::TailCapReached { tail_frames: 6 });
    // Without any silence: the input's frames and the end-of-stream step's.
    let (text, end) = translate(Some(2), 0);
    assert_eq!(text, want[..45]);
    assert_eq!(end, TranslationEnd::TailCapReached { tail_frames: 0 });
}

#[test]
fn the_end_of_text_counts_only_after_the_end_of_the_input() {
    let want = reference_text();
    // Returned frames 0..44 answer the input, frame 44 the end-of-stream step, 45.. silence.
    // Token 88 is first returned at frame 45 (the first silence frame): the translation ends
    // there, that frame included.
    assert_eq!(want.iter().position(|&t| t == 88), Some(45));
    let (text, end) = translate(Some(88), 100);
    assert_eq!(text, want[..46]);
    assert_eq!(end, TranslationEnd::Eos { tail_frames: 1 });
    // Token 64 is returned at frame 41 (an EOS sampled before the end of the input is ignored,
    // as in run_inference.py) and again at frame 44, the end-of-stream step's: it ends there.
    assert_eq!(want.iter().position(|&t| t == 64), Some(41));
    assert_eq!(want[44], 64);
    let (text, end) = translate(Some(64), 100);
    assert_eq!(text, want[..45]);
    assert_eq!(end, TranslationEnd::Eos { tail_frames: 0 });
}

#[test]
fn live_frames_of_a_translation_model_equal_the_file_run() {
    // Chat and serve feed frames through `process_frame`: the same frames as the file run for
    // the input part (the first frame answers with silence while the delays fill).
    let want = reference_text();
    let mut p = pipeline(3.0);
    let mut text = Vec::new();
    for (i, frame) in input().chunks_exact(FRAME_SAMPLES).enumerate() {
        let o = p.process_frame(frame).unwrap();
        assert_eq!(o.pcm.len(), FRAME_SAMPLES);
        match (i, &o.tokens) {
            (0, None) => {}
            (0, Some(_)) => panic!("the first frame cannot return tokens with delay 2"),
            (_, t) => text.push(t.as_ref().unwrap().text),
        }
    }
    assert_eq!(text, want[..44]);
}
