//! A live Hibiki-Zero session (what `chat` and `serve` run) on assets/tiny-hibiki-zero, fed the
//! input's whole frames one at a time: every returned frame's tokens equal those of Kyutai's
//! own live server on the same frames (`hibiki_zero.inference.ServerState.recv_loop`, greedy:
//! ref/server_greedy.json): no warm-up frames, each frame fed once, streaming Mimi with its
//! encoder restarted after the first frame. And `inspect`'s model name.

use std::sync::Arc;

use moshi_loader::{ModelSource, SourceOverrides, WeightMode};
use moshi_model::generator::SamplingConfig;
use moshi_model::kind::ModelKind;
use moshi_model::mimi::MimiWeights;
use moshi_runtime::engine::FrameProcessor;
use moshi_runtime::pipeline::{MoshiModel, MoshiPipeline, SessionSettings};
use moshi_runtime::{wav, FRAME_SAMPLES};
use serde_json::Value;

#[test]
fn a_live_session_returns_the_official_servers_tokens() {
    let dir = moshi_test_support::fixture_dir("tiny-hibiki-zero");
    let model = ModelSource::resolve(dir.to_str().unwrap(), &SourceOverrides::default()).unwrap();
    let model = MoshiModel::load(&model, WeightMode::Native, MimiWeights::F32).unwrap();
    assert_eq!(model.kind(), ModelKind::TranslationZero);
    let settings = SessionSettings::with_sampling(SamplingConfig::greedy());
    let mut p = MoshiPipeline::new(Arc::new(model), &settings).unwrap();
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("ref/server_greedy.json")).unwrap())
            .unwrap();
    let input = wav::read_mono(&dir.join("input.wav")).unwrap().samples;
    let mut returned = Vec::new();
    for frame in input.chunks_exact(FRAME_SAMPLES) {
        if let Some(t) = p.process_frame(frame).unwrap().tokens {
            returned.push((t.text, t.audio));
        }
    }
    assert_eq!(reference["input_frames"], input.len() / FRAME_SAMPLES);
    let (text, audio) = (
        reference["out_text_tokens"].as_array().unwrap(),
        reference["out_audio_tokens"].as_array().unwrap(),
    );
    assert_eq!(returned.len(), text.len(), "returned frames");
    for (i, (t, a)) in returned.iter().enumerate() {
        assert_eq!(text[i], *t, "text token of frame {i}");
        assert_eq!(audio[i], serde_json::json!(a), "audio tokens of frame {i}");
    }
}
