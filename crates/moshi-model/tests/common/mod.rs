//! Helpers shared by the model's reference tests: the fixtures under `assets/` (tiny-a,
//! tiny-hibiki), their models, and comparisons with the official JSON and `.npy` references.

#![allow(dead_code)]

use moshi_loader::lm_weights::{load_lm_weights, WeightMode};
use moshi_loader::LmConfig;
use moshi_model::lm::LmModel;
use serde_json::Value;

/// `assets/<fixture>/<rel>`.
pub use moshi_test_support::fixture;

/// The fixture's `config.json`.
pub fn fixture_config(name: &str) -> LmConfig {
    LmConfig::from_file(fixture(name, "config.json")).unwrap()
}

/// The fixture's LM (`model.safetensors`) with weights handed over as `mode` says.
pub fn fixture_model(name: &str, mode: WeightMode) -> LmModel {
    let cfg = fixture_config(name);
    let weights = load_lm_weights(&fixture(name, "model.safetensors"), &cfg, mode).unwrap();
    LmModel::load(&cfg, weights).unwrap()
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
