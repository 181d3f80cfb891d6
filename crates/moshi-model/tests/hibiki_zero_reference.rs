//! Hibiki-Zero (grouped-query attention, `rope_concat`, the depformer's LayerNorm, `hidden_scale`
//! 6, no conditioner) against the official run on the tiny-hibiki-zero fixture
//! (`assets/tiny-hibiki-zero/ref/hibiki_zero_greedy.json`, logits `.npy`): `LMGen` greedy on
//! PyTorch `moshi` 0.2.13, fed as Kyutai's `hibiki-zero` 0.0.4 `generate` feeds it (warm-up
//! frames of silence, each frame once, the end-of-input frame in place of the frame at the
//! input's end).

mod common;

use std::sync::Arc;

use common::{detailed, max_abs_diff, step_alone, u32s};

use moshi_loader::lm_weights::WeightMode;
use moshi_loader::{npy, LmConfig, PositionalEmbedding};
use moshi_model::generator::{
    Generator, LmSessionSettings, SamplingConfig, StepDetails, StepInput,
};
use moshi_model::lm::LmScratch;
use moshi_model::nn::KvPrecision;
use serde_json::Value;

const FIXTURE: &str = "tiny-hibiki-zero";

fn reference() -> Value {
    let text = std::fs::read_to_string(common::fixture(FIXTURE, "ref/hibiki_zero_greedy.json"));
    serde_json::from_str(&text.unwrap()).unwrap()
}

/// What each step is fed (`ref/fed_codes.npy`, `[steps, n_user]`): `None` for the end-of-input
/// frame (every user code `card`).
fn feed(cfg: &LmConfig) -> Vec<Option<Vec<u32>>> {
    let codes = npy::read_i64(common::fixture(FIXTURE, "ref/fed_codes.npy")).unwrap();
    codes
        .data
        .chunks_exact(codes.shape[1])
        .map(|row| {
            let row: Vec<u32> = row.iter().map(|&c| c as u32).collect();
            (!row.iter().all(|&c| c as usize == cfg.card)).then_some(row)
        })
        .collect()
}

fn input(f: &Option<Vec<u32>>) -> StepInput<'_> {
    match f {
        Some(codes) => StepInput::UserCodes(codes),
        None => StepInput::EndOfInput,
    }
}

/// A greedy run over the whole feed, one session, its KV caches of `precision`.
fn run(g: &Generator, precision: KvPrecision) -> Vec<StepDetails> {
    let settings = LmSessionSettings {
        kv_precision: precision,
        ..detailed(SamplingConfig::greedy())
    };
    let mut session = g.new_session(settings).unwrap();
    feed(g.weights().config())
        .iter()
        .map(|f| step_alone(g, &mut session, input(f)).unwrap())
        .collect()
}

#[test]
fn the_fixture_has_hibiki_zeros_architecture() {
    let cfg = common::fixture_config(FIXTURE);
    assert_eq!((cfg.kv_repeat, cfg.depformer_kv_repeat()), (2, 2));
    assert_eq!(cfg.positional_embedding, PositionalEmbedding::RopeConcat);
    assert!(cfg.depformer_norm.is_some() && !cfg.is_conditioned());
    assert_eq!(cfg.hidden_scale, 6.0);
    let g = common::fixture_generator(FIXTURE, WeightMode::Native);
    let layer = &g.weights().temporal().layers()[0];
    assert_eq!(layer.attention().kv_dim(), cfg.dim / 2);
    // The end-of-input frame is fed once, after the input's frames and before the silence.
    let fed = feed(&cfg);
    let eos = reference()["eos_frame"].as_u64().unwrap() as usize;
    let warmup = reference()["warmup_frames"].as_u64().unwrap() as usize;
    assert_eq!(fed.iter().filter(|f| f.is_none()).count(), 1);
    assert!(fed[warmup + eos].is_none());
}

#[test]
fn greedy_bf16_weights_reproduce_the_official_tokens_and_logits() {
    reproduces_official_run(WeightMode::Native);
}

#[test]
fn greedy_f32_weights_reproduce_the_official_tokens_and_logits() {
    reproduces_official_run(WeightMode::DequantizeF32);
}

fn reproduces_official_run(mode: WeightMode) {
    let g = common::fixture_generator(FIXTURE, mode);
    let steps = run(&g, KvPrecision::F32);
    let reference = reference();
    let ref_steps = reference["steps"].as_array().unwrap();
    assert_eq!(steps.len(), ref_steps.len());
    // More steps than the temporal window (16): the ring of kv_dim-wide rows wraps.
    assert!(steps.len() > g.weights().config().context + 2);
    let text_logits = npy::read_f32(common::fixture(FIXTURE, "ref/text_logits.npy")).unwrap();
    let audio_logits = npy::read_f32(common::fixture(FIXTURE, "ref/audio_logits.npy")).unwrap();
    let (tc, dq, card) = (
        text_logits.shape[1],
        audio_logits.shape[1],
        audio_logits.shape[2],
    );
    let (mut returned, mut worst_text, mut worst_audio) = (Vec::new(), 0f32, 0f32);
    for (s, (got, want)) in steps.iter().zip(ref_steps).enumerate() {
        let text = want["text_token"].as_u64().unwrap() as u32;
        assert_eq!(
            got.text_token, text,
            "text token of step {s} ({})",
            want["fed"]
        );
        assert_eq!(
            got.audio_tokens,
            u32s(&want["audio_tokens"]),
            "audio of step {s}"
        );
        match (&got.frame, &want["returned"]) {
            (None, Value::Null) => {}
            (Some(f), r) if !r.is_null() => {
                assert_eq!(f.text, r["text"].as_u64().unwrap() as u32, "step {s}");
                assert_eq!(f.audio, u32s(&r["audio"]), "returned audio of step {s}");
                returned.push(f.text);
            }
            (g, r) => panic!("step {s}: returned {g:?}, reference {r}"),
        }
        let d = max_abs_diff(&got.text_logits, &text_logits.data[s * tc..(s + 1) * tc]);
        assert!(d < 1e-4, "text logits of step {s} differ by {d}");
        worst_text = worst_text.max(d);
        for k in 0..dq {
            let o = (s * dq + k) * card;
            let d = max_abs_diff(&got.audio_logits[k], &audio_logits.data[o..o + card]);
            assert!(
                d < 1e-4,
                "audio logits of step {s} codebook {k} differ by {d}"
            );
            worst_audio = worst_audio.max(d);
        }
    }
    eprintln!(
        "{mode:?}: max |diff| vs torch: text logits {worst_text:.2e}, audio {worst_audio:.2e}"
    );
    assert_eq!(returned, u32s(&reference["out_text_tokens"]));
}

/// bf16 KV caches: half the bytes of f32 ones, each `num_heads / kv_repeat` heads wide, and
/// text logits within bf16 rounding of the f32 ones over the same inputs (those of the
/// reference run).
#[test]
fn bf16_kv_caches_hold_the_grouped_heads_within_bf16_rounding() {
    let g = common::fixture_generator(FIXTURE, WeightMode::Native);
    let inputs: Vec<Vec<u32>> = run(&g, KvPrecision::F32)
        .into_iter()
        .map(|s| s.model_input)
        .collect();
    let lm = g.weights();
    let cfg = lm.config().clone();
    let logits = |precision| {
        let mut row = lm.new_row(&[], precision).unwrap();
        let mut scratch = LmScratch::default();
        let out: Vec<Vec<f32>> = inputs
            .iter()
            .map(|tokens| {
                lm.forward_text_rows(&mut [&mut row], tokens, &mut scratch)
                    .unwrap();
                row.text_logits().to_vec()
            })
            .collect();
        (out, row.kv_cache_bytes())
    };
    let ((exact, f32_bytes), (rounded, bf16_bytes)) =
        (logits(KvPrecision::F32), logits(KvPrecision::Bf16));
    let (mut worst, mut largest) = (0f32, 0f32);
    for (e, r) in exact.iter().zip(&rounded) {
        worst = worst.max(max_abs_diff(e, r));
        largest = largest.max(e.iter().fold(0f32, |m, v| m.max(v.abs())));
    }
    eprintln!("bf16 KV: max |diff| {worst:.3e}, max |logit| {largest:.3e}");
    assert!(worst > 0.0, "bf16 caches changed nothing");
    // The arithmetic over bf16 keys and values is exact (nn::attention's unit test against a
    // naive attention over the rounded values, grouped heads included); what is left is the
    // rounding itself, carried through 2 layers and 66 steps: within 2^-8 (two bf16 steps)
    // of the largest logit.
    assert!(
        worst < largest / 256.0,
        "max |diff| {worst} vs max |logit| {largest}"
    );
    // A full window of kv_dim-wide keys and values per layer.
    let kv_floats = cfg.num_layers * cfg.context * 2 * cfg.kv_dim();
    assert_eq!((f32_bytes, bf16_bytes), (4 * kv_floats, 2 * kv_floats));
}

/// Sessions stepped together (one batch, each at its own position) get the bits each gets
/// alone.
#[test]
fn batched_sessions_equal_each_session_alone() {
    let g = common::fixture_generator(FIXTURE, WeightMode::Native);
    let alone = run(&g, KvPrecision::F32);
    let fed = feed(g.weights().config());
    let lag = 5;
    let mut a = g.new_session(detailed(SamplingConfig::greedy())).unwrap();
    let mut b = g.new_session(detailed(SamplingConfig::greedy())).unwrap();
    for f in &fed[..lag] {
        step_alone(&g, &mut a, input(f)).unwrap();
    }
    for s in lag..fed.len() {
        let inputs = [input(&fed[s]), input(&fed[s - lag])];
        let results = g.step(&mut [&mut a, &mut b], &inputs);
        let [ra, rb]: [_; 2] = results.try_into().unwrap();
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        for (got, want, at) in [(&ra, &alone[s], s), (&rb, &alone[s - lag], s - lag)] {
            assert_eq!(got.text_token, want.text_token, "step {at}");
            assert_eq!(got.audio_tokens, want.audio_tokens, "step {at}");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got.text_logits), bits(&want.text_logits), "step {at}");
        }
    }
}

/// q8 / q4 change the model, so their tokens may differ from the reference; what holds is that
/// the packed kernels compute that quantized model: the same weights expanded to f32 give every
/// token, and the logits within f32 rounding.
#[test]
fn quantized_weights_agree_with_the_same_weights_dequantized() {
    for (bits, group_size) in [(8, 64), (4, 32)] {
        let (packed, dense) = common::packed_and_dequantized(FIXTURE, bits, group_size);
        let a = run(&Generator::new(Arc::new(packed)), KvPrecision::F32);
        let b = run(&Generator::new(Arc::new(dense)), KvPrecision::F32);
        let mut worst = 0f32;
        for (s, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(
                x.text_token, y.text_token,
                "q{bits}: text token of step {s}"
            );
            assert_eq!(x.audio_tokens, y.audio_tokens, "q{bits}: audio of step {s}");
            worst = worst.max(max_abs_diff(&x.text_logits, &y.text_logits));
        }
        assert!(worst <= 1e-4, "q{bits}: text logits differ by {worst}");
        let same = a
            .iter()
            .zip(reference()["steps"].as_array().unwrap())
            .filter(|(x, r)| u64::from(x.text_token) == r["text_token"].as_u64().unwrap())
            .count();
        eprintln!(
            "q{bits}: logits within {worst:e} of the dequantized run; {same}/{} text tokens equal the f32 reference",
            a.len()
        );
    }
}
