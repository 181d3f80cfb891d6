//! bf16 temporal KV caches: a greedy run of the tiny model stays close to the f32 one (the
//! difference is bf16 rounding of keys and values, not a different computation), the setting
//! takes effect, and another precision is another row (or session), which starts the
//! conversation from scratch.

mod common;

use common::{cache_lens, fixture_config};
use moshi_loader::LmConfig;
use moshi_model::generator::{Generator, LmSessionSettings};
use moshi_model::lm::{LmRowState, LmScratch, LmWeights, RandomWeightKind};
use moshi_model::nn::KvPrecision;

/// Text logits of `steps` temporal steps of `row` over a fixed token sequence.
fn logits(lm: &LmWeights, row: &mut LmRowState, steps: usize) -> Vec<Vec<f32>> {
    let cfg: &LmConfig = lm.config();
    let mut scratch = LmScratch::default();
    (0..steps)
        .map(|s| {
            let mut tokens = vec![((s * 7) % cfg.text_card) as u32];
            tokens.extend((0..cfg.n_q).map(|k| ((s * 13 + k * 5) % cfg.card) as u32));
            lm.forward_text_rows(&mut [&mut *row], &tokens, &mut scratch)
                .unwrap();
            row.text_logits().to_vec()
        })
        .collect()
}

#[test]
fn bf16_caches_stay_within_bf16_rounding_of_f32() {
    let cfg = fixture_config("tiny-a");
    // More steps than the context (16): the ring wraps in both precisions.
    let steps = 40;
    let lm = LmWeights::random(&cfg, 3, RandomWeightKind::F32).unwrap();
    let mut f32_row = lm.new_row(&[], KvPrecision::F32).unwrap();
    let exact = logits(&lm, &mut f32_row, steps);
    let mut row = lm.new_row(&[], KvPrecision::Bf16).unwrap();
    assert_eq!(row.kv_precision(), KvPrecision::Bf16);
    // Another precision is a fresh row: the conversation starts over.
    assert_eq!(row.position(), 0);
    assert_eq!(cache_lens(&row), vec![0; cfg.num_layers]);
    let rounded = logits(&lm, &mut row, steps);
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
    let bf16_bytes = row.kv_cache_bytes();
    let mut f32_row = lm.new_row(&[], KvPrecision::F32).unwrap();
    logits(&lm, &mut f32_row, steps);
    assert_eq!(2 * bf16_bytes, f32_row.kv_cache_bytes());
}

/// A session's KV precision is a setting of the session: its rows have it from step 0.
#[test]
fn a_session_keeps_the_kv_precision_it_was_made_with() {
    let cfg = fixture_config("tiny-a");
    let g = Generator::random(&cfg, 3, RandomWeightKind::F32).unwrap();
    for precision in [KvPrecision::F32, KvPrecision::Bf16] {
        let mut session = g
            .new_session(LmSessionSettings {
                kv_precision: precision,
                ..LmSessionSettings::default()
            })
            .unwrap();
        assert_eq!(session.kv_precision(), precision);
        assert_eq!(session.row().kv_precision(), precision);
        session.reset();
        assert_eq!(session.row().kv_precision(), precision, "reset keeps it");
    }
}
