//! 16-bit and 8-bit activations (`moshi_kernels::ActivationPrecision::Int16`, `Int8`) against the
//! exact path on every fixture's LM, quantized on load to q4 group 64 and q8 group 64: the text
//! logits' error and the greedy tokens' agreement, next to the 4-bit weights' own error (the dense
//! f32 model against its q4 copy, exact activations). The accuracy contract of issue #40: the
//! live commands may default to rounded activations only where greedy tokens agree and their
//! error is below the weights' own (docs/performance.md, "Rounded activations").
//!
//! One test: the activation precision is process-wide, and this file is its own process.

mod common;

use moshi_kernels::{set_activation_precision, ActivationPrecision};
use moshi_loader::lm_weights::WeightMode;
use moshi_loader::npy;
use moshi_model::generator::{SamplingConfig, StepDetails, StepInput};
use serde_json::Value;

/// Each fixture's user codes, one frame per step (the frames its reference tests feed).
fn fed_frames(fixture: &str) -> Vec<Vec<u32>> {
    let from_npy = |file: &str| {
        let codes = npy::read_i64(common::fixture(fixture, file)).unwrap();
        let (k, t) = (codes.shape[0], codes.shape[1]);
        (0..t)
            .map(|f| (0..k).map(|c| codes.data[c * t + f] as u32).collect())
            .collect()
    };
    match fixture {
        "tiny-a" => from_npy("ref/mimi_codes.npy"),
        "tiny-hibiki" | "tiny-hibiki2b" => from_npy("ref/mimi_codes_with_silence.npy"),
        _ => {
            let text = std::fs::read_to_string(common::fixture(fixture, "ref/stt_greedy.json"));
            let reference: Value = serde_json::from_str(&text.unwrap()).unwrap();
            reference["steps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| common::u32s(&s["user_codes"]))
                .collect()
        }
    }
}

/// A greedy run of the fixture's LM handed over as `mode`, products at `precision`.
fn run(fixture: &str, mode: WeightMode, precision: ActivationPrecision) -> Vec<StepDetails> {
    set_activation_precision(precision);
    let g = common::fixture_generator(fixture, mode);
    let mut session = g
        .new_session(common::detailed(SamplingConfig::greedy()))
        .unwrap();
    fed_frames(fixture)
        .iter()
        .map(|f| common::step_alone(&g, &mut session, StepInput::UserCodes(f)).unwrap())
        .collect()
}

/// How far run `b` is from run `a`: the steps whose sampled tokens (text and audio) agree before
/// the first that does not, and the largest text-logit difference over those steps (after a
/// disagreement the runs are fed different tokens), relative to the largest logit magnitude.
struct Distance {
    agreeing_steps: usize,
    steps: usize,
    logit_error: f32,
}

fn distance(a: &[StepDetails], b: &[StepDetails]) -> Distance {
    let agreeing_steps = a
        .iter()
        .zip(b)
        .take_while(|(x, y)| x.text_token == y.text_token && x.audio_tokens == y.audio_tokens)
        .count();
    let compared = (agreeing_steps + 1).min(a.len());
    let (mut error, mut scale) = (0f32, 0f32);
    for (x, y) in a[..compared].iter().zip(&b[..compared]) {
        error = error.max(common::max_abs_diff(&x.text_logits, &y.text_logits));
        scale = scale.max(x.text_logits.iter().fold(0f32, |m, v| m.max(v.abs())));
    }
    Distance {
        agreeing_steps,
        steps: a.len(),
        logit_error: error / scale,
    }
}

#[test]
fn rounded_activations_against_the_exact_path_and_the_weights_own_error_on_every_fixture() {
    use ActivationPrecision::{Exact, Int16, Int8};
    let fixtures = [
        "tiny-a",
        "tiny-hibiki",
        "tiny-hibiki2b",
        "tiny-stt",
        "tiny-stt-2b6",
    ];
    for fixture in fixtures {
        let dense = run(fixture, WeightMode::Native, Exact);
        for bits in [4, 8] {
            let mode = WeightMode::Quantize {
                bits,
                group_size: 64,
            };
            let exact = run(fixture, mode, Exact);
            let weights = distance(&dense, &exact);
            for precision in [Int16, Int8] {
                let activations = distance(&exact, &run(fixture, mode, precision));
                eprintln!(
                    "{fixture} q{bits} g64: {precision} activations: tokens agree {}/{} steps, text logit error {:.2e} (of the largest logit); q{bits} weights: {}/{} steps, {:.2e}",
                    activations.agreeing_steps,
                    activations.steps,
                    activations.logit_error,
                    weights.agreeing_steps,
                    weights.steps,
                    weights.logit_error
                );
                assert!(activations.logit_error.is_finite() && activations.logit_error > 0.0);
                // The contract's error condition, for the 4-bit weights it is meant for: well
                // below their own error (docs/performance.md, "Rounded activations").
                if bits == 4 {
                    assert!(
                        activations.logit_error < weights.logit_error / 4.0,
                        "{fixture}: {precision} activations' logit error {} against q4 weights' {}",
                        activations.logit_error,
                        weights.logit_error
                    );
                }
                // Its token condition: 16-bit activations give the exact path's greedy tokens on
                // every step of every fixture. 8-bit ones do not (these random tiny models sit on
                // near-ties), which is why no command defaults to them.
                if precision == Int16 {
                    assert_eq!(
                        activations.agreeing_steps, activations.steps,
                        "{fixture} q{bits}: 16-bit activations' greedy tokens"
                    );
                }
            }
        }
    }
    set_activation_precision(Exact);
}
