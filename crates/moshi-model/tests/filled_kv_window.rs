//! The benchmarks' filled KV window: `fill_temporal_caches_with_noise` leaves every temporal
//! cache holding `min(positions, context)` positions, advances the position by `positions`, and
//! the model steps on from there with finite outputs.

use moshi_loader::LmConfig;
use moshi_model::lm::{LmModel, RandomWeightKind};
use moshi_test_support::tiny_a;

fn tiny_config() -> LmConfig {
    LmConfig::from_file(tiny_a("config.json")).expect("tiny-a config")
}

#[test]
fn filled_window_holds_the_context_and_steps_on() {
    let cfg = tiny_config();
    let mut lm = LmModel::random(&cfg, 5, RandomWeightKind::F32).unwrap();
    let layers = cfg.num_layers;
    lm.fill_temporal_caches_with_noise(10, 1);
    assert_eq!(lm.temporal_cache_lens(), vec![10; layers]);
    assert_eq!(lm.position(), 10);
    // Past the context: the ring keeps the last `context` positions.
    lm.fill_temporal_caches_with_noise(3 * cfg.context, 2);
    assert_eq!(lm.temporal_cache_lens(), vec![cfg.context; layers]);
    assert_eq!(lm.position(), 10 + 3 * cfg.context);

    let mut tokens = vec![cfg.text_card as u32];
    tokens.extend(std::iter::repeat_n(cfg.card as u32, cfg.n_q));
    lm.forward_text(&tokens).unwrap();
    assert_eq!(lm.temporal_cache_lens(), vec![cfg.context; layers]);
    assert_eq!(lm.position(), 11 + 3 * cfg.context);
    assert!(lm.text_logits().iter().all(|v| v.is_finite()));
    // The noise is part of what it attends over: the same step from empty caches differs.
    let filled_logits = lm.text_logits().to_vec();
    lm.reset();
    lm.forward_text(&tokens).unwrap();
    assert_ne!(lm.text_logits(), &filled_logits[..]);
}
