//! Helpers shared by the model's reference tests: the fixtures under `assets/` (tiny-a,
//! tiny-hibiki), their weights and generators, one session's step, and comparisons with the
//! official JSON and `.npy` references.

#![allow(dead_code)]

use std::sync::Arc;

use moshi_loader::lm_weights::{load_lm_weights, WeightMode};
use moshi_loader::npy;
use moshi_loader::LmConfig;
use moshi_model::generator::{
    Generator, LmSession, LmSessionSettings, SamplingConfig, StepDetails, StepInput,
};
use moshi_model::lm::{LmRowState, LmWeights};
use serde_json::Value;

/// `assets/<fixture>/<rel>`.
pub use moshi_test_support::fixture;

/// The fixture's `config.json`.
pub fn fixture_config(name: &str) -> LmConfig {
    LmConfig::from_file(fixture(name, "config.json")).unwrap()
}

/// The fixture's LM weights (`model.safetensors`), handed over as `mode` says.
pub fn fixture_weights(name: &str, mode: WeightMode) -> LmWeights {
    fixture_file_weights(name, "model.safetensors", mode)
}

/// The LM weights of the fixture's `file` (e.g. `model.q8.safetensors`), handed over as `mode`
/// says.
pub fn fixture_file_weights(name: &str, file: &str, mode: WeightMode) -> LmWeights {
    let cfg = fixture_config(name);
    let weights = load_lm_weights(&fixture(name, file), &cfg, mode).unwrap();
    LmWeights::load(&cfg, weights).unwrap()
}

/// The fixture's LM quantized at load (`bits`, `group_size`) twice: kept packed, and the same
/// quantized weights expanded to f32 (what the packed kernels must compute).
pub fn packed_and_dequantized(name: &str, bits: u32, group_size: usize) -> (LmWeights, LmWeights) {
    let mode = WeightMode::Quantize { bits, group_size };
    let packed = fixture_weights(name, mode);
    let cfg = fixture_config(name);
    let mut w = load_lm_weights(&fixture(name, "model.safetensors"), &cfg, mode).unwrap();
    let names: Vec<String> = w.names().map(str::to_string).collect();
    for n in names {
        let weight = w.get(&n).unwrap();
        let (shape, data) = (weight.shape.clone(), weight.to_f32());
        let data = moshi_loader::WeightData::F32(data);
        w.insert(n, moshi_loader::Weight { shape, data });
    }
    (packed, LmWeights::load(&cfg, w).unwrap())
}

/// A generator over the fixture's LM ([`fixture_weights`]).
pub fn fixture_generator(name: &str, mode: WeightMode) -> Generator {
    Generator::new(Arc::new(fixture_weights(name, mode)))
}

/// Session settings with `sampling` that record each step's model input, logits and temporal
/// output (what the tests compare).
pub fn detailed(sampling: SamplingConfig) -> LmSessionSettings {
    LmSessionSettings {
        record_details: true,
        ..LmSessionSettings::with_sampling(sampling)
    }
}

/// One step of `session` alone (a batch of one).
pub fn step_alone(
    generator: &Generator,
    session: &mut LmSession,
    input: StepInput<'_>,
) -> moshi_model::Result<StepDetails> {
    let mut results = generator.step(&mut [session], &[input]);
    assert_eq!(results.len(), 1, "one session in, one result out");
    results.pop().unwrap()
}

/// Positions held by each temporal layer's KV cache of `row` (≤ `context`).
pub fn cache_lens(row: &LmRowState) -> Vec<usize> {
    row.temporal().caches().iter().map(|c| c.len()).collect()
}

/// A JSON array of token ids.
pub fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Largest absolute difference of two equally long series.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Each fixture's user codes, one frame per step (the frames its reference tests feed).
pub fn fed_frames(name: &str) -> Vec<Vec<u32>> {
    let from_npy = |file: &str| {
        let codes = npy::read_i64(fixture(name, file)).unwrap();
        let (k, t) = (codes.shape[0], codes.shape[1]);
        (0..t)
            .map(|f| (0..k).map(|c| codes.data[c * t + f] as u32).collect())
            .collect()
    };
    match name {
        "tiny-a" => from_npy("ref/mimi_codes.npy"),
        "tiny-hibiki" | "tiny-hibiki2b" => from_npy("ref/mimi_codes_with_silence.npy"),
        _ => {
            let text = std::fs::read_to_string(fixture(name, "ref/stt_greedy.json"));
            reference_user_codes(&serde_json::from_str(&text.unwrap()).unwrap())
        }
    }
}

/// A JSON reference's fed user codes (`steps[i].user_codes`), one frame per step.
pub fn reference_user_codes(reference: &Value) -> Vec<Vec<u32>> {
    reference["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| u32s(&s["user_codes"]))
        .collect()
}

/// How far run `b` is from run `a`: the steps whose sampled tokens (text and audio) agree before
/// the first that does not, and the largest text-logit difference over those steps (after a
/// disagreement the runs are fed different tokens), relative to the largest logit magnitude.
pub struct Distance {
    pub agreeing_steps: usize,
    pub steps: usize,
    pub logit_error: f32,
}

pub fn distance(a: &[StepDetails], b: &[StepDetails]) -> Distance {
    let agreeing_steps = a
        .iter()
        .zip(b)
        .take_while(|(x, y)| x.text_token == y.text_token && x.audio_tokens == y.audio_tokens)
        .count();
    let compared = (agreeing_steps + 1).min(a.len());
    let (mut error, mut scale) = (0f32, 0f32);
    for (x, y) in a[..compared].iter().zip(&b[..compared]) {
        error = error.max(max_abs_diff(&x.text_logits, &y.text_logits));
        scale = scale.max(x.text_logits.iter().fold(0f32, |m, v| m.max(v.abs())));
    }
    Distance {
        agreeing_steps,
        steps: a.len(),
        logit_error: error / scale,
    }
}
