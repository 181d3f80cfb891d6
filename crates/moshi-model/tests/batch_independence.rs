//! Sessions stepped together share one product per linear layer, yet each gets exactly what it
//! gets alone: tokens and every logit bit for bit, for f32, bf16, q8 and q4 weights, greedy and
//! sampled, sessions joining and leaving at any frame (so at different positions, the caches
//! wrapping their ring at different times), with f32, bf16 or 8-bit KV caches, with and without
//! classifier-free guidance (two rows per session). A session's bad input or weights of its own
//! fail that session alone.

mod common;

use std::sync::Arc;

use common::{detailed, fixture_file_weights, fixture_generator, step_alone};
use moshi_loader::lm_weights::WeightMode;
use moshi_model::generator::{
    Conditioning, Generator, LmSession, LmSessionSettings, SamplingConfig, StepDetails, StepInput,
};
use moshi_model::nn::KvPrecision;
use moshi_model::ModelError;

/// One session of a test schedule.
#[derive(Clone)]
struct Plan {
    sampling: SamplingConfig,
    kv: KvPrecision,
    /// Guidance coefficient (1: none).
    cfg_coef: f32,
    /// Frames at which it is stepped: `first..last` (joins at `first`, leaves after `last - 1`).
    first: usize,
    last: usize,
    /// Seed of its user codes.
    codes_seed: u32,
}

fn user_codes(seed: u32, step: usize, n: usize, card: usize) -> Vec<u32> {
    (0..n)
        .map(|i| {
            let x = (seed as usize * 7919 + step * 104_729 + i * 31).wrapping_mul(2_654_435_761);
            ((x >> 7) % card) as u32
        })
        .collect()
}

/// A session of `plan` over `g`'s weights, recording its steps' details.
fn session(g: &Generator, plan: &Plan) -> LmSession {
    let conditioning = if plan.cfg_coef != 1.0 {
        Conditioning::new(
            &[("description", "very_good")],
            &[("description", "very_bad")],
            plan.cfg_coef,
        )
    } else {
        Conditioning::none()
    };
    g.new_session(LmSessionSettings {
        kv_precision: plan.kv,
        conditioning,
        ..detailed(plan.sampling.clone())
    })
    .unwrap()
}

/// Every step of `plan` run alone.
fn alone(g: &Generator, plan: &Plan) -> Vec<StepDetails> {
    let cfg = g.config();
    let mut s = session(g, plan);
    (0..plan.last - plan.first)
        .map(|t| {
            let codes = user_codes(plan.codes_seed, t, cfg.user_codebooks(), cfg.card);
            step_alone(g, &mut s, StepInput::UserCodes(&codes)).unwrap()
        })
        .collect()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

fn assert_same(got: &StepDetails, want: &StepDetails, what: &str) {
    assert_eq!(got.model_input, want.model_input, "{what}: inputs");
    assert_eq!(got.text_token, want.text_token, "{what}: text token");
    assert_eq!(got.audio_tokens, want.audio_tokens, "{what}: audio tokens");
    assert_eq!(got.frame, want.frame, "{what}: frame");
    assert!(
        same_bits(&got.text_logits, &want.text_logits),
        "{what}: text logits"
    );
    assert!(
        same_bits(&got.transformer_out, &want.transformer_out),
        "{what}: transformer out"
    );
    assert_eq!(got.audio_logits.len(), want.audio_logits.len());
    for (k, (a, b)) in got.audio_logits.iter().zip(&want.audio_logits).enumerate() {
        assert!(same_bits(a, b), "{what}: audio logits of codebook {k}");
    }
}

/// Runs the plans' schedule as batches (whoever is active at each frame) and checks every
/// session against its run alone.
fn check_schedule(g: &Generator, plans: &[Plan], label: &str) {
    let cfg = g.config();
    let references: Vec<Vec<StepDetails>> = plans.iter().map(|p| alone(g, p)).collect();
    let mut sessions: Vec<LmSession> = plans.iter().map(|p| session(g, p)).collect();
    let frames = plans.iter().map(|p| p.last).max().unwrap();
    let mut largest_batch = 0;
    for t in 0..frames {
        let active: Vec<usize> = (0..plans.len())
            .filter(|&i| (plans[i].first..plans[i].last).contains(&t))
            .collect();
        let codes: Vec<Vec<u32>> = active
            .iter()
            .map(|&i| {
                let p = &plans[i];
                user_codes(p.codes_seed, t - p.first, cfg.user_codebooks(), cfg.card)
            })
            .collect();
        let inputs: Vec<StepInput> = codes.iter().map(|c| StepInput::UserCodes(c)).collect();
        let mut batch: Vec<&mut LmSession> = sessions
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| active.contains(i))
            .map(|(_, s)| s)
            .collect();
        largest_batch = largest_batch.max(batch.len());
        let results = g.step(&mut batch, &inputs);
        assert_eq!(
            results.len(),
            active.len(),
            "{label}: one result per session"
        );
        for (&i, r) in active.iter().zip(results) {
            let got = r.unwrap();
            let s = t - plans[i].first;
            assert_same(
                &got,
                &references[i][s],
                &format!("{label} session {i} step {s}"),
            );
        }
    }
    assert!(largest_batch >= 3, "{label}: sessions overlapped");
}

fn plans(cfg_coef: f32) -> Vec<Plan> {
    let sampled = |seed| SamplingConfig {
        seed,
        ..SamplingConfig::default()
    };
    vec![
        Plan {
            sampling: SamplingConfig::greedy(),
            kv: KvPrecision::F32,
            cfg_coef,
            first: 0,
            last: 40,
            codes_seed: 1,
        },
        Plan {
            sampling: sampled(7),
            kv: KvPrecision::F32,
            cfg_coef,
            first: 3,
            last: 25,
            codes_seed: 2,
        },
        Plan {
            sampling: SamplingConfig {
                top_k_text: 3,
                temp_audio: 1.1,
                ..sampled(8)
            },
            kv: KvPrecision::Bf16,
            cfg_coef,
            first: 9,
            last: 40,
            codes_seed: 3,
        },
        // Joins when the others' caches have wrapped (context 16), alone at the end; 8-bit
        // caches.
        Plan {
            sampling: SamplingConfig::greedy(),
            kv: KvPrecision::I8,
            cfg_coef,
            first: 21,
            last: 44,
            codes_seed: 4,
        },
    ]
}

fn tiny_a_generator(file: &str, mode: WeightMode) -> Generator {
    Generator::new(Arc::new(fixture_file_weights("tiny-a", file, mode)))
}

#[test]
fn batched_sessions_equal_sessions_alone_for_every_weight_format() {
    for (label, file, mode) in [
        ("f32", "model.safetensors", WeightMode::DequantizeF32),
        ("bf16", "model.q8.safetensors", WeightMode::DequantizeBf16),
        ("q8", "model.q8.safetensors", WeightMode::Native),
        ("q4", "model.q4.safetensors", WeightMode::Native),
    ] {
        check_schedule(&tiny_a_generator(file, mode), &plans(1.0), label);
    }
}

#[test]
fn batched_guidance_rows_equal_sessions_alone() {
    let g = fixture_generator("tiny-hibiki", WeightMode::Native);
    let mut mixed = plans(3.0);
    // Sessions with and without guidance in one batch (one row and two rows).
    mixed[1].cfg_coef = 1.0;
    check_schedule(&g, &mixed, "tiny-hibiki");
}

#[test]
fn a_failing_session_leaves_the_others_of_its_batch_alone() {
    let g = tiny_a_generator("model.q4.safetensors", WeightMode::Native);
    let cfg = g.config().clone();
    let plan = plans(1.0).remove(0);
    let reference = alone(&g, &plan);
    let mut good = session(&g, &plan);
    let mut bad_input = session(&g, &plan);
    // Same shapes, other weights: cannot share the batch.
    let other = tiny_a_generator("model.q8.safetensors", WeightMode::Native);
    let mut foreign = session(&other, &plan);
    for (s, want) in reference.iter().enumerate().take(6) {
        let codes = user_codes(plan.codes_seed, s, cfg.user_codebooks(), cfg.card);
        let too_short = &codes[1..];
        let inputs = [
            StepInput::UserCodes(too_short),
            StepInput::UserCodes(&codes),
            StepInput::UserCodes(&codes),
        ];
        let mut batch = [&mut bad_input, &mut good, &mut foreign];
        let results = g.step(&mut batch, &inputs);
        assert_eq!(results.len(), 3);
        assert!(matches!(results[0], Err(ModelError::WrongLength { .. })));
        assert_same(results[1].as_ref().unwrap(), want, "the good session");
        assert!(matches!(results[2], Err(ModelError::BatchWeightsDiffer)));
    }
    assert_eq!(bad_input.step_index(), 0, "a refused step is not taken");
    assert_eq!(foreign.step_index(), 0, "a refused session is not stepped");
    // The same weights loaded twice are other weights too (the check is by load, not by shape
    // or content): a session of one generator is refused by the other.
    let twin = tiny_a_generator("model.q4.safetensors", WeightMode::Native);
    let codes = user_codes(plan.codes_seed, 0, cfg.user_codebooks(), cfg.card);
    let mut fresh = session(&twin, &plan);
    assert!(matches!(
        step_alone(&g, &mut fresh, StepInput::UserCodes(&codes)),
        Err(ModelError::BatchWeightsDiffer)
    ));
    // A clone of the generator shares its weights: its sessions step on either.
    let clone = g.clone();
    let mut shared = session(&clone, &plan);
    let got = step_alone(&g, &mut shared, StepInput::UserCodes(&codes)).unwrap();
    assert_same(&got, &reference[0], "a session of a clone");
}
