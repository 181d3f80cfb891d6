//! Hibiki (conditioner + classifier-free guidance) against the official PyTorch `LMGen(cfg_coef=3,
//! condition_tensors)` run on the tiny-hibiki fixture (`assets/tiny-hibiki/ref/hibiki_greedy.json`,
//! CFG-mixed logits `.npy`), fed as `run_inference.py` feeds a Hibiki model: frame 0 twice, the
//! input frames, one end-of-stream frame, then silence frames.

mod common;

use std::path::PathBuf;

use common::{detailed, max_abs_diff, step_alone, u32s};

use moshi_loader::lm_weights::{load_lm_weights, WeightMode};
use moshi_loader::{npy, LmConfig};
use moshi_model::generator::{
    Conditioning, Generator, LmSession, LmSessionSettings, SamplingConfig, StepDetails, StepInput,
};
use moshi_model::lm::{LmScratch, LmWeights};
use moshi_model::nn::KvPrecision;
use serde_json::Value;

const HIBIKI: &str = "tiny-hibiki";
const HIBIKI_2B: &str = "tiny-hibiki2b";

const GOOD: &[(&str, &str)] = &[("description", "very_good")];
const BAD: &[(&str, &str)] = &[("description", "very_bad")];

fn asset(fixture: &str, rel: &str) -> PathBuf {
    common::fixture(fixture, rel)
}

fn tiny_config() -> LmConfig {
    common::fixture_config("tiny-hibiki")
}

fn tiny_generator(mode: WeightMode) -> Generator {
    common::fixture_generator("tiny-hibiki", mode)
}

/// A greedy session conditioned on very_good, guided against very_bad with `cfg_coef`,
/// recording its steps' details.
fn guided_session(g: &Generator, cfg_coef: f32) -> LmSession {
    g.new_session(LmSessionSettings {
        conditioning: Conditioning::new(GOOD, BAD, cfg_coef),
        ..detailed(SamplingConfig::greedy())
    })
    .unwrap()
}

/// The step input of a [`feed`] entry.
fn input(f: &Option<Vec<u32>>) -> StepInput<'_> {
    match f {
        Some(codes) => StepInput::UserCodes(codes),
        None => StepInput::EndOfInput,
    }
}

fn reference(fixture: &str) -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(asset(fixture, "ref/hibiki_greedy.json")).unwrap(),
    )
    .unwrap()
}

/// What each step is fed: `Some(codes)` or `None` for the end-of-stream frame. Built from
/// `ref/mimi_codes_with_silence.npy` (input + silence encoded in one stream) and the number of
/// input frames, as the fixture's generator builds it.
fn feed(fixture: &str) -> Vec<Option<Vec<u32>>> {
    let codes = npy::read_i64(asset(fixture, "ref/mimi_codes_with_silence.npy")).unwrap();
    let (k, cols) = (codes.shape[0], codes.shape[1]);
    let col = |f: usize| Some((0..k).map(|c| codes.data[c * cols + f] as u32).collect());
    let frames = reference(fixture)["num_frames"].as_u64().unwrap() as usize;
    let mut fed = vec![col(0)];
    fed.extend((0..frames).map(col));
    fed.push(None);
    fed.extend((frames..cols).map(col));
    fed
}

fn run(fixture: &str, g: &Generator, cfg_coef: f32) -> Vec<StepDetails> {
    let mut session = guided_session(g, cfg_coef);
    feed(fixture)
        .iter()
        .map(|f| step_alone(g, &mut session, input(f)).unwrap())
        .collect()
}

#[test]
fn guided_greedy_run_reproduces_official_tokens_and_mixed_logits() {
    reproduces_official_run(HIBIKI);
}

/// Hibiki 2B's depformer: 8 codebooks over 5 weight sets (`depformer_weights_per_step_schedule`)
/// and low-rank token embeddings (`depformer_low_rank_embeddings`).
#[test]
fn hibiki_2b_depformer_schedule_and_low_rank_embeddings_reproduce_official_tokens() {
    let cfg = common::fixture_config(HIBIKI_2B);
    assert_eq!(cfg.depformer_weight_sets(), 5);
    assert_eq!(cfg.depformer_low_rank_embeddings, Some(8));
    reproduces_official_run(HIBIKI_2B);
}

fn reproduces_official_run(fixture: &str) {
    let g = common::fixture_generator(fixture, WeightMode::Native);
    // The conditions of the reference run are the model type's conventions.
    let conventions = g.kind().conventions();
    assert_eq!(
        (conventions.conditions, conventions.negative_conditions),
        (GOOD, BAD)
    );
    let steps = run(fixture, &g, 3.0);
    let reference = reference(fixture);
    let ref_steps = reference["steps"].as_array().unwrap();
    assert_eq!(steps.len(), ref_steps.len());
    let text_logits = npy::read_f32(asset(fixture, "ref/hibiki_text_logits.npy")).unwrap();
    let audio_logits = npy::read_f32(asset(fixture, "ref/hibiki_audio_logits.npy")).unwrap();
    let (tc, dq, card) = (
        text_logits.shape[1],
        audio_logits.shape[1],
        audio_logits.shape[2],
    );
    let (mut returned, mut worst_text, mut worst_audio) = (Vec::new(), 0f32, 0f32);
    for (s, (got, want)) in steps.iter().zip(ref_steps).enumerate() {
        // The user semantic stream (delay 0) reads the fed code from step 1 on (every stream
        // takes its initial token at step 0).
        let fed = u32s(&want["fed_user_codes"]);
        if s > 0 {
            assert_eq!(
                got.model_input[9], fed[0],
                "user semantic input of step {s}"
            );
        }
        assert_eq!(
            got.text_token,
            want["text_token"].as_u64().unwrap() as u32,
            "text token of step {s} ({})",
            want["fed"]
        );
        assert_eq!(
            got.audio_tokens,
            u32s(&want["audio_tokens"]),
            "audio tokens of step {s}"
        );
        match (&got.frame, &want["returned"]) {
            (None, Value::Null) => {}
            (Some(f), r) if !r.is_null() => {
                assert_eq!(f.text, r["text"].as_u64().unwrap() as u32, "step {s}");
                assert_eq!(f.audio, u32s(&r["audio"]), "returned audio of step {s}");
                returned.push(f.clone());
            }
            (g, r) => panic!("step {s}: returned {g:?}, reference {r}"),
        }
        let d = max_abs_diff(&got.text_logits, &text_logits.data[s * tc..(s + 1) * tc]);
        assert!(d < 1e-4, "mixed text logits of step {s} differ by {d}");
        worst_text = worst_text.max(d);
        for k in 0..dq {
            let o = (s * dq + k) * card;
            let d = max_abs_diff(&got.audio_logits[k], &audio_logits.data[o..o + card]);
            assert!(
                d < 1e-4,
                "mixed audio logits of step {s} codebook {k} differ by {d}"
            );
            worst_audio = worst_audio.max(d);
        }
    }
    eprintln!("max |diff| vs torch: mixed text logits {worst_text:.2e}, mixed audio logits {worst_audio:.2e}");
    assert_eq!(returned.len(), 51);
    let out_text = u32s(&reference["out_text_tokens"]);
    assert_eq!(
        returned.iter().map(|f| f.text).collect::<Vec<_>>(),
        out_text
    );
    // The end-of-stream step fed `card` on every user codebook.
    let eos = steps
        .iter()
        .skip(1)
        .position(|s| s.model_input[9] == 64)
        .unwrap()
        + 1;
    assert_eq!(ref_steps[eos]["fed"], "end of stream");
}

#[test]
fn guidance_changes_the_output_and_one_row_is_the_plain_conditioned_model() {
    let reference = reference(HIBIKI);
    let want: Vec<u32> = reference["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["text_token"].as_u64().unwrap() as u32)
        .collect();
    // Without guidance (one row, conditioned on very_good), most tokens differ (the fixture was
    // made so that skipping or misapplying guidance fails token for token).
    let g = tiny_generator(WeightMode::Native);
    let plain = run(HIBIKI, &g, 1.0);
    let same = plain
        .iter()
        .zip(&want)
        .filter(|(s, w)| s.text_token == **w)
        .count();
    assert!(
        same <= 5,
        "{same} of {} text tokens equal without guidance",
        want.len()
    );

    // A coefficient of 1 with a negative row would mix to the conditioned logits: one row.
    let session = guided_session(&g, 1.0);
    assert_eq!(session.cfg_coef(), 1.0);
    assert_eq!(session.rows_per_step(), 1);
}

#[test]
fn guided_runs_repeat_exactly_after_reset_and_on_quantized_weights_stay_close() {
    let g = tiny_generator(WeightMode::Native);
    let mut session = guided_session(&g, 3.0);
    let fed = feed(HIBIKI);
    let mut first = Vec::new();
    for round in 0..2 {
        let tokens: Vec<u32> = fed
            .iter()
            .map(|f| step_alone(&g, &mut session, input(f)).unwrap().text_token)
            .collect();
        if round == 0 {
            first = tokens;
        } else {
            assert_eq!(tokens, first, "the second run after reset differs");
        }
        session.reset();
    }
    // 8-bit weights (quantized at load, the conditioner kept f32) run the whole guided loop.
    let q8 = run(
        HIBIKI,
        &tiny_generator(WeightMode::Quantize {
            bits: 8,
            group_size: 64,
        }),
        3.0,
    );
    assert_eq!(q8.len(), first.len());
    assert!(q8
        .iter()
        .all(|s| s.text_logits.iter().all(|v| v.is_finite())));
}

#[test]
fn bad_conditions_and_coefficients_are_errors() {
    let g = tiny_generator(WeightMode::Native);
    let new_session = |values: &[(&str, &str)], cfg_coef: f32, negative: &[(&str, &str)]| {
        g.new_session(LmSessionSettings {
            conditioning: Conditioning::new(values, negative, cfg_coef),
            ..LmSessionSettings::with_sampling(SamplingConfig::greedy())
        })
    };
    let err = |r: moshi_model::Result<LmSession>| r.unwrap_err().to_string();
    let e = err(new_session(&[("description", "excellent")], 3.0, BAD));
    assert!(e.contains("excellent") && e.contains("very_good"), "{e}");
    let e = err(new_session(GOOD, 3.0, &[("genre", "jazz")]));
    assert!(e.contains("no conditioner `genre`"), "{e}");
    for c in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let e = err(new_session(GOOD, c, BAD));
        assert!(e.contains("positive"), "{c}: {e}");
    }
    // Guidance needs conditioners: the unconditioned tiny-a refuses it.
    let moshi = common::fixture_generator("tiny-a", WeightMode::Native);
    let e = moshi
        .new_session(LmSessionSettings {
            conditioning: Conditioning::new(&[], &[], 3.0),
            ..LmSessionSettings::default()
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("conditioned model"), "{e}");
    // After the errors the generator still runs (nothing half-applied): a session of the
    // default settings has no guidance and steps.
    let mut session = g.new_session(LmSessionSettings::default()).unwrap();
    assert_eq!(session.cfg_coef(), 1.0);
    let frame = feed(HIBIKI)[0].clone().unwrap();
    step_alone(&g, &mut session, StepInput::UserCodes(&frame)).unwrap();
    // The end-of-stream frame is `card`; ordinary frames may not carry it.
    let e = step_alone(&g, &mut session, StepInput::UserCodes(&[64; 8]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("out of range"), "{e}");
}

#[test]
fn conditioner_vectors_follow_the_lut_and_the_learnt_padding() {
    let g = tiny_generator(WeightMode::Native);
    let provider = g.weights().conditions();
    assert_eq!(provider.conditioners().len(), 1);
    let lut = &provider.conditioners()[0];
    assert_eq!(lut.name(), "description");
    let good = lut.vector(Some("very_good")).unwrap();
    let bad = lut.vector(Some("very_bad")).unwrap();
    let padding = lut.vector(None).unwrap();
    assert_eq!(good.len(), 256);
    assert_ne!(good, bad);
    assert_ne!(good, padding);
    // Without values every conditioner takes its learnt padding.
    assert_eq!(provider.fused(&[]).unwrap().unwrap(), padding);
    assert_eq!(provider.fused(GOOD).unwrap().unwrap(), good);
    // output_proj · embed[4], checked in f64 against the stored tensors.
    let cfg = tiny_config();
    let w = load_lm_weights(
        &asset(HIBIKI, "model.safetensors"),
        &cfg,
        WeightMode::DequantizeF32,
    )
    .unwrap();
    let embed = w
        .get("condition_provider.conditioners.description.embed")
        .unwrap()
        .to_f32();
    let proj = w
        .get("condition_provider.conditioners.description.output_proj")
        .unwrap()
        .to_f32();
    for (i, v) in good.iter().enumerate() {
        let want: f64 = (0..16)
            .map(|j| proj[i * 16 + j] as f64 * embed[4 * 16 + j] as f64)
            .sum();
        assert!((*v as f64 - want).abs() < 1e-6, "row {i}: {v} vs {want}");
    }
}

#[test]
fn eos_input_reads_as_pad_for_model_type_hibiki_only() {
    // Kyutai's loader copies PAD's text embedding row (3) over EOS's (2) for model_type "hibiki":
    // an EOS sampled before the end of the input is fed back as a pause. A conditioned config
    // must be Hibiki, so the other case is the unconditioned tiny-a (no model_type: Moshi).
    let text_logits_after = |model_type: Option<&str>, text: u32| {
        let fixture = if model_type == Some("hibiki") {
            "tiny-hibiki"
        } else {
            "tiny-a"
        };
        let mut cfg = common::fixture_config(fixture);
        cfg.model_type = model_type.map(str::to_string);
        let weights = load_lm_weights(
            &common::fixture(fixture, "model.safetensors"),
            &cfg,
            WeightMode::Native,
        )
        .unwrap();
        let lm = LmWeights::load(&cfg, weights).unwrap();
        let mut row = lm.new_row(&[], KvPrecision::F32).unwrap();
        let mut tokens = vec![64u32; 17];
        tokens[0] = text;
        lm.forward_text_rows(&mut [&mut row], &tokens, &mut LmScratch::default())
            .unwrap();
        row.text_logits().to_vec()
    };
    assert_eq!(
        text_logits_after(Some("hibiki"), 2),
        text_logits_after(Some("hibiki"), 3)
    );
    assert_ne!(text_logits_after(None, 2), text_logits_after(None, 3));
    assert_ne!(
        text_logits_after(Some("hibiki"), 1),
        text_logits_after(Some("hibiki"), 3)
    );
}
