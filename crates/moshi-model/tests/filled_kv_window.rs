//! The benchmarks' filled KV window: `fill_temporal_caches_with_noise` leaves every temporal
//! cache holding `min(positions, context)` positions, advances the position by `positions`, and
//! the model steps on from there with finite outputs.

mod common;

use common::{cache_lens, fixture_config};
use moshi_model::lm::{LmScratch, LmWeights, RandomWeightKind};
use moshi_model::nn::KvPrecision;

#[test]
fn filled_window_holds_the_context_and_steps_on() {
    let cfg = fixture_config("tiny-a");
    let lm = LmWeights::random(&cfg, 5, RandomWeightKind::F32).unwrap();
    let mut row = lm.new_row(&[], KvPrecision::F32).unwrap();
    let mut scratch = LmScratch::default();
    let layers = cfg.num_layers;
    row.fill_temporal_caches_with_noise(10, 1);
    assert_eq!(cache_lens(&row), vec![10; layers]);
    assert_eq!(row.position(), 10);
    // Past the context: the ring keeps the last `context` positions.
    row.fill_temporal_caches_with_noise(3 * cfg.context, 2);
    assert_eq!(cache_lens(&row), vec![cfg.context; layers]);
    assert_eq!(row.position(), 10 + 3 * cfg.context);

    let mut tokens = vec![cfg.text_card as u32];
    tokens.extend(std::iter::repeat_n(cfg.card as u32, cfg.n_q));
    lm.forward_text_rows(&mut [&mut row], &tokens, &mut scratch)
        .unwrap();
    assert_eq!(cache_lens(&row), vec![cfg.context; layers]);
    assert_eq!(row.position(), 11 + 3 * cfg.context);
    assert!(row.text_logits().iter().all(|v| v.is_finite()));
    // The noise is part of what it attends over: the same step from empty caches differs.
    let filled_logits = row.text_logits().to_vec();
    row.reset();
    lm.forward_text_rows(&mut [&mut row], &tokens, &mut scratch)
        .unwrap();
    assert_ne!(row.text_logits(), &filled_logits[..]);
}
