//! bf16 temporal KV caches: a greedy run of the tiny model stays close to the f32 one (the
//! difference is bf16 rounding of keys and values, not a different computation), the setting
//! takes effect, and changing it restarts the conversation.

use moshi_loader::LmConfig;
use moshi_model::lm::{LmModel, RandomWeightKind};
use moshi_model::nn::KvPrecision;
use moshi_test_support::tiny_a;

fn tiny_config() -> LmConfig {
    LmConfig::from_file(tiny_a("config.json")).expect("tiny-a config")
}

/// Text logits of `steps` temporal steps over a fixed token sequence.
fn logits(lm: &mut LmModel, cfg: &LmConfig, steps: usize) -> Vec<Vec<f32>> {
    (0..steps)
        .map(|s| {
            let mut tokens = vec![((s * 7) % cfg.text_card) as u32];
            tokens.extend((0..cfg.n_q).map(|k| ((s * 13 + k * 5) % cfg.card) as u32));
            lm.forward_text(&tokens).unwrap();
            lm.text_logits().to_vec()
        })
        .collect()
}

#[test]
fn bf16_caches_stay_within_bf16_rounding_of_f32() {
    let cfg = tiny_config();
    // More steps than the context (16): the ring wraps in both precisions.
    let steps = 40;
    let mut lm = LmModel::random(&cfg, 3, RandomWeightKind::F32).unwrap();
    let exact = logits(&mut lm, &cfg, steps);
    lm.set_kv_precision(KvPrecision::Bf16);
    assert_eq!(lm.kv_precision(), KvPrecision::Bf16);
    // Changing the precision restarts the conversation.
    assert_eq!(lm.position(), 0);
    assert_eq!(lm.temporal_cache_lens(), vec![0; cfg.num_layers]);
    let rounded = logits(&mut lm, &cfg, steps);
    let (mut worst, mut largest) = (0f32, 0f32);
    for (e, r) in exact.iter().zip(&rounded) {
        for (a, b) in e.iter().zip(r) {
            worst = worst.max((a - b).abs());
            largest = largest.max(a.abs());
        }
    }
    eprintln!("bf16 KV: max |diff| {worst:.3e}, max |logit| {largest:.3e}");
    // The rounding takes effect, and stays at the size of bf16's relative precision (2^-9 per
    // key and value), not beyond.
    assert!(worst > 0.0, "bf16 caches changed nothing");
    assert!(
        worst < 2e-3 * largest,
        "max |diff| {worst} vs max |logit| {largest}"
    );
    // And the KV memory is half of f32's.
    let bf16_bytes = lm.kv_cache_bytes();
    lm.set_kv_precision(KvPrecision::F32);
    logits(&mut lm, &cfg, steps);
    assert_eq!(2 * bf16_bytes, lm.kv_cache_bytes());
}
