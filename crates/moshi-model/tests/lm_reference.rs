//! The LM and generator against the official PyTorch `LMGen` run on the tiny-a fixture
//! (`assets/tiny-a/ref/lm_greedy.json`, logits `.npy`), plus sampling, long-session and
//! bad-input behaviour.

mod common;

use std::path::PathBuf;

use std::sync::Arc;

use common::{cache_lens, detailed, max_abs_diff, step_alone, u32s};

use moshi_loader::lm_weights::{load_lm_weights, WeightMode};
use moshi_loader::{npy, LmConfig, WeightMap};
use moshi_model::generator::{
    Generator, LmSessionSettings, SamplingConfig, StepDetails, StepInput,
};
use moshi_model::lm::{LmScratch, LmWeights, RandomWeightKind};
use moshi_model::nn::KvPrecision;
use serde_json::Value;

fn asset(rel: &str) -> PathBuf {
    common::fixture("tiny-a", rel)
}

fn tiny_config() -> LmConfig {
    common::fixture_config("tiny-a")
}

fn tiny_generator(mode: WeightMode) -> Generator {
    common::fixture_generator("tiny-a", mode)
}

/// `ref/mimi_codes.npy` as frames `[T][8]`.
fn user_frames() -> Vec<Vec<u32>> {
    let codes = npy::read_i64(asset("ref/mimi_codes.npy")).unwrap();
    let (k, t) = (codes.shape[0], codes.shape[1]);
    (0..t)
        .map(|f| (0..k).map(|c| codes.data[c * t + f] as u32).collect())
        .collect()
}

/// The run_inference convention: frame 0 twice, then frames 1..T-1 (T + 1 steps).
fn fed_frames() -> Vec<Vec<u32>> {
    let frames = user_frames();
    let mut fed = vec![frames[0].clone()];
    fed.extend(frames.iter().cloned());
    fed
}

fn run_greedy(g: &Generator, seed: u64) -> Vec<StepDetails> {
    let mut session = g
        .new_session(detailed(SamplingConfig {
            seed,
            ..SamplingConfig::greedy()
        }))
        .unwrap();
    fed_frames()
        .iter()
        .map(|f| step_alone(g, &mut session, StepInput::UserCodes(f)).unwrap())
        .collect()
}

/// Checks every step of `steps` against lm_greedy.json and the logits fixtures.
fn check_against_torch(steps: &[StepDetails]) {
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(asset("ref/lm_greedy.json")).unwrap())
            .unwrap();
    let ref_steps = reference["steps"].as_array().unwrap();
    assert_eq!(steps.len(), ref_steps.len());
    let text_logits = npy::read_f32(asset("ref/lm_text_logits.npy")).unwrap();
    let audio_logits = npy::read_f32(asset("ref/lm_audio_logits.npy")).unwrap();
    let tout = npy::read_f32(asset("ref/lm_transformer_out.npy")).unwrap();
    let (tc, dq, card, dim) = (
        text_logits.shape[1],
        audio_logits.shape[1],
        audio_logits.shape[2],
        tout.shape[1],
    );
    let mut returned = 0;
    let mut worst = [0f32; 3];
    for (s, (got, want)) in steps.iter().zip(ref_steps).enumerate() {
        assert_eq!(
            got.model_input,
            u32s(&want["model_input"]),
            "model_input of step {s}"
        );
        assert_eq!(
            got.text_token,
            want["text_token"].as_u64().unwrap() as u32,
            "text token of step {s}"
        );
        assert_eq!(
            got.audio_tokens,
            u32s(&want["audio_tokens"]),
            "audio tokens of step {s}"
        );
        match (&got.frame, &want["returned"]) {
            (None, Value::Null) => {}
            (Some(f), r) if !r.is_null() => {
                assert_eq!(
                    f.text,
                    r["text"].as_u64().unwrap() as u32,
                    "returned text of step {s}"
                );
                assert_eq!(f.audio, u32s(&r["audio"]), "returned audio of step {s}");
                returned += 1;
            }
            (g, r) => panic!("step {s}: returned {g:?}, reference {r}"),
        }
        let d = max_abs_diff(&got.transformer_out, &tout.data[s * dim..(s + 1) * dim]);
        assert!(d < 1e-4, "transformer_out of step {s} differs by {d}");
        worst[0] = worst[0].max(d);
        let d = max_abs_diff(&got.text_logits, &text_logits.data[s * tc..(s + 1) * tc]);
        assert!(d < 1e-4, "text logits of step {s} differ by {d}");
        worst[1] = worst[1].max(d);
        for k in 0..dq {
            let o = (s * dq + k) * card;
            let d = max_abs_diff(&got.audio_logits[k], &audio_logits.data[o..o + card]);
            assert!(
                d < 1e-4,
                "audio logits of step {s} codebook {k} differ by {d}"
            );
            worst[2] = worst[2].max(d);
        }
    }
    eprintln!(
        "max |diff| vs torch: transformer_out {:.2e}, text logits {:.2e}, audio logits {:.2e}",
        worst[0], worst[1], worst[2]
    );
    // The flattened outputs of the reference, too.
    let frames: Vec<_> = steps.iter().filter_map(|s| s.frame.clone()).collect();
    assert_eq!(returned, frames.len());
    let out_text: Vec<u32> = frames.iter().map(|f| f.text).collect();
    assert_eq!(out_text, u32s(&reference["out_text_tokens"]));
    let out_audio: Vec<Vec<u32>> = reference["out_audio_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(u32s)
        .collect();
    assert_eq!(
        frames.iter().map(|f| f.audio.clone()).collect::<Vec<_>>(),
        out_audio
    );
}

#[test]
fn greedy_bf16_weights_reproduce_lmgen_tokens_and_logits() {
    let steps = run_greedy(&tiny_generator(WeightMode::Native), 1);
    // More steps than the window: the sliding window is exercised.
    assert!(steps.len() > tiny_config().context + 2);
    check_against_torch(&steps);
}

#[test]
fn greedy_f32_weights_reproduce_lmgen_tokens_and_logits() {
    check_against_torch(&run_greedy(&tiny_generator(WeightMode::DequantizeF32), 2));
}

#[test]
fn greedy_tokens_do_not_depend_on_the_seed() {
    let key = |d: StepDetails| {
        (
            d.model_input,
            d.text_token,
            d.audio_tokens,
            d.frame,
            d.text_logits,
        )
    };
    let a: Vec<_> = run_greedy(&tiny_generator(WeightMode::Native), 1)
        .into_iter()
        .map(key)
        .collect();
    let b: Vec<_> = run_greedy(&tiny_generator(WeightMode::Native), 987654321)
        .into_iter()
        .map(key)
        .collect();
    assert_eq!(a, b);
    // Greedy text with sampled audio: the text tokens of the first step never depend on the seed.
    let sampling = |seed| SamplingConfig {
        temp_text: 0.0,
        seed,
        ..SamplingConfig::default()
    };
    let (g1, g2) = (
        tiny_generator(WeightMode::Native),
        tiny_generator(WeightMode::Native),
    );
    let mut s1 = g1.new_session(detailed(sampling(5))).unwrap();
    let mut s2 = g2.new_session(detailed(sampling(6))).unwrap();
    let frame = StepInput::UserCodes(&user_frames()[0]);
    assert_eq!(
        step_alone(&g1, &mut s1, frame).unwrap().text_token,
        step_alone(&g2, &mut s2, frame).unwrap().text_token
    );
}

fn sampled_tokens(seed: u64) -> Vec<(u32, Vec<u32>)> {
    let g = tiny_generator(WeightMode::Native);
    let mut session = g
        .new_session(detailed(SamplingConfig {
            seed,
            ..SamplingConfig::default()
        }))
        .unwrap();
    fed_frames()
        .iter()
        .map(|f| step_alone(&g, &mut session, StepInput::UserCodes(f)).unwrap())
        .map(|d| (d.text_token, d.audio_tokens))
        .collect()
}

#[test]
fn seeded_sampling_is_reproducible_and_seed_dependent() {
    let a = sampled_tokens(42);
    assert_eq!(a, sampled_tokens(42));
    let b = sampled_tokens(43);
    assert_ne!(a, b);
    // Sampling actually samples: it departs from the greedy run.
    let greedy: Vec<(u32, Vec<u32>)> = run_greedy(&tiny_generator(WeightMode::Native), 0)
        .into_iter()
        .map(|d| (d.text_token, d.audio_tokens))
        .collect();
    assert_ne!(a, greedy);
    // Every sampled audio code is a real code (< card), every text token < text_card.
    let cfg = tiny_config();
    assert!(a.iter().all(
        |(t, au)| (*t as usize) < cfg.text_card && au.iter().all(|&c| (c as usize) < cfg.card)
    ));
}

#[test]
fn reset_restarts_the_session_exactly() {
    let g = tiny_generator(WeightMode::Native);
    let mut session = g
        .new_session(LmSessionSettings::with_sampling(SamplingConfig {
            seed: 3,
            ..SamplingConfig::default()
        }))
        .unwrap();
    let fed = fed_frames();
    let frames = |session: &mut _| -> Vec<_> {
        fed.iter()
            .take(20)
            .map(|f| {
                step_alone(&g, session, StepInput::UserCodes(f))
                    .unwrap()
                    .frame
            })
            .collect()
    };
    let first = frames(&mut session);
    session.reset();
    assert_eq!(session.step_index(), 0);
    let again = frames(&mut session);
    assert_eq!(first, again);
}

#[test]
fn long_sessions_keep_a_bounded_window() {
    let cfg = tiny_config();
    let g = tiny_generator(WeightMode::Native);
    let mut session = g.new_session(LmSessionSettings::default()).unwrap();
    let frames = user_frames();
    let mut bytes_at_window = 0;
    let steps = cfg.context * 5 + 3;
    for s in 0..steps {
        let out = step_alone(
            &g,
            &mut session,
            StepInput::UserCodes(&frames[s % frames.len()]),
        )
        .unwrap()
        .frame;
        assert_eq!(out.is_some(), s >= cfg.max_delay());
        let lens = cache_lens(session.row());
        assert_eq!(
            lens,
            vec![(s + 1).min(cfg.context); cfg.num_layers],
            "step {s}"
        );
        if s + 1 == cfg.context {
            bytes_at_window = session.kv_cache_bytes();
        }
        if s + 1 >= cfg.context {
            assert_eq!(
                session.kv_cache_bytes(),
                bytes_at_window,
                "KV memory grew at step {s}"
            );
        }
    }
    assert_eq!(session.row().position(), steps);
    // Bounded by the window: 2 (k, v) * context * dim floats per layer.
    assert!(bytes_at_window <= cfg.num_layers * 2 * cfg.context * cfg.dim * 4);
}

#[test]
fn bad_delays_are_a_config_error() {
    let mut cfg = tiny_config();
    cfg.delays.pop();
    let weights = load_lm_weights(
        &asset("model.safetensors"),
        &tiny_config(),
        WeightMode::Native,
    )
    .unwrap();
    let err = LmWeights::load(&cfg, weights).unwrap_err().to_string();
    assert!(
        err.contains("delays") && err.contains("16") && err.contains("17"),
        "{err}"
    );
    let err = LmWeights::random(&cfg, 0, RandomWeightKind::F32)
        .unwrap_err()
        .to_string();
    assert!(err.contains("delays"), "{err}");
}

#[test]
fn bad_user_codes_are_input_errors() {
    let cfg = tiny_config();
    let g = tiny_generator(WeightMode::Native);
    let mut session = g
        .new_session(LmSessionSettings::with_sampling(SamplingConfig::greedy()))
        .unwrap();
    let mut frame = user_frames()[0].clone();
    frame[3] = cfg.card as u32;
    let err = step_alone(&g, &mut session, StepInput::UserCodes(&frame))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("codebook 3") && err.contains(&cfg.card.to_string()),
        "{err}"
    );
    let err = step_alone(&g, &mut session, StepInput::UserCodes(&frame[..5]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("expected 8") && err.contains("got 5"), "{err}");
    // Nothing was consumed by the failed calls.
    assert_eq!(session.step_index(), 0);
    // Sampling settings are checked when the session is made.
    let err = g
        .new_session(LmSessionSettings::with_sampling(SamplingConfig {
            temp_text: -1.0,
            ..SamplingConfig::default()
        }))
        .unwrap_err()
        .to_string();
    assert!(err.contains("temp_text"), "{err}");
    // Direct model inputs are checked too.
    let weights = g.weights();
    let mut row = weights.new_row(&[], KvPrecision::F32).unwrap();
    let mut scratch = LmScratch::default();
    let mut forward_text =
        |row: &mut _, tokens: &[u32]| weights.forward_text_rows(&mut [row], tokens, &mut scratch);
    let mut tokens = vec![cfg.card as u32; cfg.n_q + 1];
    tokens[0] = cfg.text_card as u32 + 1;
    assert!(forward_text(&mut row, &tokens)
        .unwrap_err()
        .to_string()
        .contains("text token"));
    tokens[0] = 0;
    tokens[5] = cfg.card as u32 + 1;
    assert!(forward_text(&mut row, &tokens)
        .unwrap_err()
        .to_string()
        .contains("stream 4"));
    // Depformer sub-steps run in order, with in-range previous tokens.
    let mut scratch = LmScratch::default();
    let mut depformer_step = |row: &mut _, k: usize, prev: u32| {
        weights.depformer_step_rows(k, &mut [row], &[prev], &mut scratch)
    };
    row.depformer_reset();
    assert!(depformer_step(&mut row, 1, 0)
        .unwrap_err()
        .to_string()
        .contains("sub-step 1"));
    assert!(depformer_step(&mut row, 0, cfg.text_card as u32 + 1)
        .unwrap_err()
        .to_string()
        .contains("out of range"));
    depformer_step(&mut row, 0, 5).unwrap();
    assert_eq!(row.depformer_logits().len(), cfg.card);
    assert!(depformer_step(&mut row, 1, cfg.card as u32 + 1)
        .unwrap_err()
        .to_string()
        .contains("out of range"));
    depformer_step(&mut row, 1, 7).unwrap();
    assert_eq!(row.depformer_logits().len(), cfg.card);
}

#[test]
fn checkpoint_of_another_config_is_rejected_with_the_tensor_name() {
    // Loader level: a config with more layers than the checkpoint.
    let mut cfg = tiny_config();
    cfg.num_layers = 3;
    let err = load_lm_weights(&asset("model.safetensors"), &cfg, WeightMode::Native)
        .unwrap_err()
        .to_string();
    assert!(err.contains("model.safetensors"), "{err}");
    // Model level: weights of the tiny config, model of a different width.
    let mut wide = tiny_config();
    wide.dim = 512;
    wide.num_heads = 8;
    let weights = load_lm_weights(
        &asset("model.safetensors"),
        &tiny_config(),
        WeightMode::Native,
    )
    .unwrap();
    let err = LmWeights::load(&wide, weights).unwrap_err().to_string();
    assert!(
        err.contains("text_emb") && err.contains("512") && err.contains("256"),
        "{err}"
    );
    // Model level: leftover tensors (checkpoint with more layers than the config).
    let mut fewer = tiny_config();
    fewer.num_layers = 1;
    let weights = load_lm_weights(
        &asset("model.safetensors"),
        &tiny_config(),
        WeightMode::Native,
    )
    .unwrap();
    let err = LmWeights::load(&fewer, weights).unwrap_err().to_string();
    assert!(
        err.contains("transformer.layers.1") && err.contains("not used"),
        "{err}"
    );
    // A missing tensor is named.
    let mut weights: WeightMap = load_lm_weights(
        &asset("model.safetensors"),
        &tiny_config(),
        WeightMode::Native,
    )
    .unwrap();
    let _ = weights.take("depformer.3.linear_out", &[64, 64]).unwrap();
    let err = LmWeights::load(&tiny_config(), weights)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("depformer.3.linear_out") && err.contains("missing"),
        "{err}"
    );
}

#[test]
fn random_models_run_for_every_weight_kind() {
    let cfg = tiny_config();
    let mut first_text = Vec::new();
    for kind in [
        RandomWeightKind::F32,
        RandomWeightKind::BF16,
        RandomWeightKind::Quantized {
            bits: 8,
            group_size: 64,
        },
        RandomWeightKind::Quantized {
            bits: 4,
            group_size: 32,
        },
    ] {
        let g = Generator::random(&cfg, 11, kind).unwrap();
        let g2 = Generator::random(&cfg, 11, kind).unwrap();
        let mut s = g.new_session(detailed(SamplingConfig::greedy())).unwrap();
        let mut s2 = g2.new_session(detailed(SamplingConfig::greedy())).unwrap();
        let frame = StepInput::UserCodes(&user_frames()[0]);
        let (a, b) = (
            step_alone(&g, &mut s, frame).unwrap(),
            step_alone(&g2, &mut s2, frame).unwrap(),
        );
        assert_eq!(
            a.text_logits, b.text_logits,
            "{kind:?} is not deterministic"
        );
        assert!(a.text_logits.iter().all(|v| v.is_finite()));
        first_text.push(a.text_logits);
    }
    // F32 and BF16 draws of the same seed are close (bf16 rounding only), quantized ones differ.
    assert!(
        max_abs_diff(&first_text[0], &first_text[1])
            < 0.05 * first_text[0].iter().fold(0f32, |m, v| m.max(v.abs()))
    );
}

/// The MLX-packed checkpoints, computed in f32 (dequantized exactly), against moshi_mlx run on
/// the same dequantized weights with f32 math and the torch attention window
/// (`ref/mlx_q{8,4}_f32math_*`): same steps as lm_greedy.json.
fn check_against_mlx_f32math(bits: u32, mode: WeightMode) {
    check_file_against_mlx_f32math(&format!("model.q{bits}.safetensors"), bits, mode);
}

/// [`check_against_mlx_f32math`] loading `file` (a packed file, or the dense one with `Quantize`).
fn check_file_against_mlx_f32math(file: &str, bits: u32, mode: WeightMode) {
    let cfg = tiny_config();
    let weights = load_lm_weights(&asset(file), &cfg, mode).unwrap();
    let g = Generator::new(Arc::new(LmWeights::load(&cfg, weights).unwrap()));
    let steps = run_greedy(&g, 0);
    let reference: Value = serde_json::from_str(
        &std::fs::read_to_string(asset(&format!("ref/mlx_q{bits}_f32math_greedy.json"))).unwrap(),
    )
    .unwrap();
    let logits = npy::read_f32(asset(&format!("ref/mlx_q{bits}_f32math_text_logits.npy"))).unwrap();
    let tc = logits.shape[1];
    let ref_steps = reference["steps"].as_array().unwrap();
    assert_eq!(steps.len(), ref_steps.len());
    let mut worst = 0f32;
    for (s, (got, want)) in steps.iter().zip(ref_steps).enumerate() {
        assert_eq!(
            got.text_token,
            want["text_token"].as_u64().unwrap() as u32,
            "q{bits} text token of step {s}"
        );
        assert_eq!(
            got.audio_tokens,
            u32s(&want["audio_tokens"]),
            "q{bits} audio tokens of step {s}"
        );
        if let (Some(f), false) = (&got.frame, want["last_audio_tokens"].is_null()) {
            assert_eq!(
                f.audio,
                u32s(&want["last_audio_tokens"]),
                "q{bits} returned audio of step {s}"
            );
        }
        let d = max_abs_diff(&got.text_logits, &logits.data[s * tc..(s + 1) * tc]);
        assert!(d < 1e-4, "q{bits} text logits of step {s} differ by {d}");
        worst = worst.max(d);
    }
    eprintln!("q{bits} {mode:?}: max |text logit diff| vs mlx f32 math {worst:.2e}");
}

#[test]
fn q8_weights_in_f32_math_reproduce_mlx_f32_math() {
    check_against_mlx_f32math(8, WeightMode::DequantizeF32);
    check_against_mlx_f32math(8, WeightMode::Native);
}

#[test]
fn q4_weights_in_f32_math_reproduce_mlx_f32_math() {
    check_against_mlx_f32math(4, WeightMode::DequantizeF32);
    check_against_mlx_f32math(4, WeightMode::Native);
}

#[test]
fn bf16_weights_quantized_on_load_reproduce_mlx_q8_and_q4_tokens() {
    check_file_against_mlx_f32math(
        "model.safetensors",
        8,
        WeightMode::Quantize {
            bits: 8,
            group_size: 64,
        },
    );
    check_file_against_mlx_f32math(
        "model.safetensors",
        4,
        WeightMode::Quantize {
            bits: 4,
            group_size: 32,
        },
    );
}

/// candle's q8_0 GGUF of tiny-a (`assets/tiny-a-gguf`, written by candle's own quantizer) run
/// packed through the q8_0 kernels gives, at every step, the greedy tokens and returned frames of
/// the same model with its weights dequantized from the GGUF to f32, and text logits within f32
/// rounding of it.
#[test]
fn gguf_q8_0_packed_reproduces_its_weights_dequantized_in_f32() {
    let cfg = tiny_config();
    let path = common::fixture("tiny-a-gguf", "model.q8.gguf");
    let run = |mode| {
        let weights = load_lm_weights(&path, &cfg, mode).unwrap();
        run_greedy(
            &Generator::new(Arc::new(LmWeights::load(&cfg, weights).unwrap())),
            0,
        )
    };
    let (packed, dense) = (run(WeightMode::Native), run(WeightMode::DequantizeF32));
    assert_eq!(packed.len(), fed_frames().len());
    let mut worst = 0f32;
    for (s, (p, d)) in packed.iter().zip(&dense).enumerate() {
        assert_eq!(p.text_token, d.text_token, "text token of step {s}");
        assert_eq!(p.audio_tokens, d.audio_tokens, "audio tokens of step {s}");
        assert_eq!(
            p.frame.as_ref().map(|f| &f.audio),
            d.frame.as_ref().map(|f| &f.audio),
            "returned audio of step {s}"
        );
        let diff = max_abs_diff(&p.text_logits, &d.text_logits);
        assert!(diff < 1e-4, "text logits of step {s} differ by {diff}");
        worst = worst.max(diff);
    }
    let distinct: std::collections::BTreeSet<u32> = packed.iter().map(|p| p.text_token).collect();
    assert!(
        distinct.len() > 1,
        "a run that only repeats one token checks little"
    );
    eprintln!("gguf q8_0 packed vs dequantized f32: max |text logit diff| {worst:.2e}");
}

/// Delays other than moshiko's (acoustic delay 2, a delayed text stream): inputs and returned
/// frames follow the LMGen rules for every stream.
#[test]
fn generator_follows_the_config_delays() {
    let mut cfg = tiny_config();
    cfg.delays = vec![1, 0, 2, 2, 2, 2, 2, 2, 2, 0, 2, 2, 2, 2, 2, 2, 2];
    let max_delay = 2;
    let g = Generator::random(&cfg, 5, RandomWeightKind::F32).unwrap();
    let mut session = g
        .new_session(detailed(SamplingConfig {
            seed: 8,
            ..SamplingConfig::default()
        }))
        .unwrap();
    let fed: Vec<Vec<u32>> = user_frames().into_iter().take(12).collect();
    let steps: Vec<StepDetails> = fed
        .iter()
        .map(|f| step_alone(&g, &mut session, StepInput::UserCodes(f)).unwrap())
        .collect();
    let sampled = |s: usize, i: usize| {
        if i == 0 {
            steps[s].text_token
        } else {
            steps[s].audio_tokens[i - 1]
        }
    };
    for (s, d) in steps.iter().enumerate() {
        for (i, &delay) in cfg.delays.iter().enumerate() {
            let expect = if s <= delay {
                if i == 0 {
                    cfg.text_card as u32
                } else {
                    cfg.card as u32
                }
            } else if i <= cfg.dep_q {
                sampled(s - 1, i)
            } else {
                fed[s - delay][i - cfg.dep_q - 1]
            };
            assert_eq!(d.model_input[i], expect, "step {s} stream {i}");
        }
        match &d.frame {
            None => assert!(s < max_delay, "no frame at step {s}"),
            Some(f) => {
                assert!(s >= max_delay);
                assert_eq!(
                    f.text,
                    sampled(s - max_delay + cfg.delays[0], 0),
                    "text of step {s}"
                );
                for k in 0..cfg.dep_q {
                    let at = s - max_delay + cfg.delays[k + 1];
                    assert_eq!(f.audio[k], sampled(at, k + 1), "audio {k} of step {s}");
                }
            }
        }
    }
}
