//! Helpers shared by the model's reference tests: the fixtures under `assets/` (tiny-a,
//! tiny-hibiki), their weights and generators, one session's step, and comparisons with the
//! official JSON and `.npy` references.

#![allow(dead_code)]

use std::sync::Arc;

use moshi_loader::lm_weights::{load_lm_weights, WeightMode};
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
