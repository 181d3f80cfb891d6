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
use moshi_model::generator::{SamplingConfig, StepDetails, StepInput};

/// A greedy run of the fixture's LM handed over as `mode`, products at `precision`.
fn run(fixture: &str, mode: WeightMode, precision: ActivationPrecision) -> Vec<StepDetails> {
    set_activation_precision(precision);
    let g = common::fixture_generator(fixture, mode);
    let mut session = g
        .new_session(common::detailed(SamplingConfig::greedy()))
        .unwrap();
    common::fed_frames(fixture)
        .iter()
        .map(|f| common::step_alone(&g, &mut session, StepInput::UserCodes(f)).unwrap())
        .collect()
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
            let weights = common::distance(&dense, &exact);
            for precision in [Int16, Int8] {
                let activations = common::distance(&exact, &run(fixture, mode, precision));
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
