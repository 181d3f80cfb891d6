//! Text to speech against the official PyTorch run (`TTSModel.generate` as
//! `delayed-streams-modeling/scripts/tts_pytorch.py` drives it, greedy, cfg 2.0 as a condition)
//! on `assets/tiny-tts` (cross-attention on a voice, the `cfg` and `control` LUTs summed, the
//! muxed look-ahead stream, the depformer's weight schedule and low-rank embeddings, 32
//! codebooks): the script's entries, then at every one of the 64 steps the model input, the
//! sampled text, what the state machine feeds, the depformer's tokens, the audio after the TTS
//! hook and the returned frame, all through `Generator::step`; the text and audio logits; the
//! consumption times, transcript and end step.
//!
//! Logits: within 5e-5 of the reference (bf16 weights run in f32: torch's summation orders
//! against ours over 2 layers with a 625-position cross-attention; the greedy margins are
//! 5.4e-3 for text and 1.4e-4 for audio, and every token is compared exactly). Sessions stepped
//! together get the bits they get alone; q8 and q4 compute the quantized model.

mod common;

use std::sync::Arc;

use common::{detailed, step_alone};
use moshi_loader::lm_weights::WeightMode;
use moshi_loader::npy;
use moshi_loader::tokenizer::TextTokenizer;
use moshi_loader::voice::load_voice;
use moshi_model::generator::{Generator, SamplingConfig, StepDetails, StepInput};
use moshi_model::lm::embedding::ZERO_TOKEN;
use moshi_model::tts::machine::Entry;
use moshi_model::tts::script::{ScriptOptions, ScriptReader, WordEncoder};
use moshi_model::tts::SPEAKER_CONDITIONER;
use moshi_model::tts::{session_conditioning, speaker_condition};
use serde_json::Value;

const FIXTURE: &str = "tiny-tts";
const VOICE: &str = "voices/expresso/ex03-ex01_happy_001_channel1_334s.wav.f00d4040@12.safetensors";
const LOGIT_TOL: f32 = 5e-5;

fn reference() -> Value {
    let text = std::fs::read_to_string(common::fixture(FIXTURE, "ref/tts_greedy.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// A JSON array of tokens where -1 is [`ZERO_TOKEN`].
fn tokens(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| match x.as_i64().unwrap() {
            -1 => ZERO_TOKEN,
            t => t as u32,
        })
        .collect()
}

fn entries(reference: &Value) -> Vec<Entry> {
    let tokenizer = TextTokenizer::from_file(common::fixture(FIXTURE, "tokenizer.model")).unwrap();
    let encode = |w: &str| Ok(tokenizer.encode(w).unwrap());
    let encode: &WordEncoder = &encode;
    let mut reader = ScriptReader::new(
        encode,
        ScriptOptions {
            multi_speaker: true,
            padding_between: 1,
            moshi_server: false,
        },
    );
    reader
        .script(&[reference["script"].as_str().unwrap()])
        .unwrap()
}

/// The official run's steps through `Generator::step`: every step's details until the stream
/// is finished.
fn run(
    generator: &Generator,
    entries: Vec<Entry>,
) -> (Vec<StepDetails>, moshi_model::generator::LmSession) {
    run_with(generator, entries, None)
}

/// [`run`] generating `n_q` audio codebooks (None: all).
fn run_with(
    generator: &Generator,
    entries: Vec<Entry>,
    n_q: Option<usize>,
) -> (Vec<StepDetails>, moshi_model::generator::LmSession) {
    let mut session = new_session_with(generator, entries, n_q);
    let mut steps = Vec::new();
    while !session.tts().unwrap().is_finished(session.step_index()) {
        steps.push(step_alone(generator, &mut session, StepInput::UserCodes(&[])).unwrap());
        assert!(steps.len() < 1000, "the stream does not end");
    }
    (steps, session)
}

#[test]
fn entries_follow_script_to_entries() {
    let reference = reference();
    let got = entries(&reference);
    let want = reference["entries"].as_array().unwrap();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.text, w["text"].as_str().unwrap());
        assert_eq!(g.tokens, tokens(&w["tokens"]), "{}", g.text);
        assert_eq!(
            g.padding as u64,
            w["padding"].as_u64().unwrap(),
            "{}",
            g.text
        );
    }
}

fn check_against_reference(mode: WeightMode) {
    let reference = reference();
    let generator = common::fixture_generator(FIXTURE, mode);
    let (steps, session) = run(&generator, entries(&reference));
    let ref_steps = reference["steps"].as_array().unwrap();
    assert_eq!(steps.len(), ref_steps.len(), "steps until the end");
    let text_logits = npy::read_f32(common::fixture(FIXTURE, "ref/tts_text_logits.npy")).unwrap();
    let audio_logits = npy::read_f32(common::fixture(FIXTURE, "ref/tts_audio_logits.npy")).unwrap();
    let (tc, dq, card) = (
        text_logits.shape[1],
        audio_logits.shape[1],
        audio_logits.shape[2],
    );
    let (mut worst_text, mut worst_audio) = (0f32, 0f32);
    for (s, (got, want)) in steps.iter().zip(ref_steps).enumerate() {
        assert_eq!(
            got.model_input,
            tokens(&want["model_input"]),
            "model input of step {s}"
        );
        assert_eq!(
            got.text_sampled as u64,
            want["text_sampled"].as_u64().unwrap(),
            "sampled text of step {s}"
        );
        assert_eq!(
            got.text_token as u64,
            want["text_fed"].as_u64().unwrap(),
            "fed text of step {s}"
        );
        assert_eq!(
            got.audio_tokens,
            tokens(&want["audio_fed"]),
            "fed audio of step {s}"
        );
        let returned = got.frame.as_ref().map(|f| {
            let mut v = vec![f.text];
            v.extend(&f.audio);
            v
        });
        assert_eq!(
            returned,
            (!want["returned"].is_null()).then(|| tokens(&want["returned"])),
            "frame of step {s}"
        );
        let want_text = &text_logits.data[s * tc..(s + 1) * tc];
        worst_text = worst_text.max(common::max_abs_diff(&got.text_logits, want_text));
        if want["depformer_ran"].as_bool().unwrap() {
            assert_eq!(got.audio_logits.len(), dq, "step {s}");
            for (k, logits) in got.audio_logits.iter().enumerate() {
                let at = (s * dq + k) * card;
                worst_audio = worst_audio.max(common::max_abs_diff(
                    logits,
                    &audio_logits.data[at..at + card],
                ));
            }
        } else {
            assert!(got.audio_logits.is_empty(), "no depformer at step {s}");
        }
    }
    assert!(worst_text < LOGIT_TOL, "text logits differ by {worst_text}");
    assert!(
        worst_audio < LOGIT_TOL,
        "audio logits differ by {worst_audio}"
    );
    let machine = session.tts().unwrap().machine();
    assert_eq!(
        machine.end_step(),
        reference["end_step"].as_u64().map(|e| e as usize)
    );
    let consumed: Vec<u64> = machine
        .consumption_times()
        .iter()
        .map(|&t| t as u64)
        .collect();
    let want: Vec<u64> = reference["consumption_times"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(consumed, want);
    let transcript: Vec<(String, u64)> = machine
        .transcript()
        .iter()
        .map(|w| (w.text.clone(), w.step as u64))
        .collect();
    let want: Vec<(String, u64)> = reference["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_str().unwrap().to_string(), p[1].as_u64().unwrap()))
        .collect();
    assert_eq!(transcript, want);
    eprintln!("{mode:?}: text logits within {worst_text}, audio logits within {worst_audio}");
}

#[test]
fn bf16_weights_reproduce_every_step_of_the_official_run() {
    check_against_reference(WeightMode::Native);
}

#[test]
fn f32_weights_reproduce_every_step_of_the_official_run() {
    check_against_reference(WeightMode::DequantizeF32);
}

#[test]
fn sessions_batched_with_others_get_their_own_bits() {
    let reference = reference();
    let generator = common::fixture_generator(FIXTURE, WeightMode::Native);
    let all = entries(&reference);
    let (alone, _) = run(&generator, all.clone());
    let (short_alone, _) = run(&generator, all[..3].to_vec());
    let (fewer_alone, _) = run_with(&generator, all.clone(), Some(24));
    // The three stepped together (the shorter one finishes first and drops out; one generates
    // 24 of the 32 codebooks).
    let mut sessions: Vec<_> = [(all.clone(), None), (all_but(3), None), (all, Some(24))]
        .into_iter()
        .map(|(e, n_q)| new_session_with(&generator, e, n_q))
        .collect();
    let mut together: [Vec<StepDetails>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    loop {
        let mut stepping: Vec<(usize, &mut moshi_model::generator::LmSession)> = sessions
            .iter_mut()
            .enumerate()
            .filter(|(_, s)| !s.tts().unwrap().is_finished(s.step_index()))
            .collect();
        if stepping.is_empty() {
            break;
        }
        let inputs = vec![StepInput::UserCodes(&[]); stepping.len()];
        let mut refs: Vec<&mut moshi_model::generator::LmSession> =
            stepping.iter_mut().map(|(_, s)| &mut **s).collect();
        let results = generator.step(&mut refs, &inputs);
        for ((i, _), r) in stepping.iter().zip(results) {
            together[*i].push(r.unwrap());
        }
    }
    // Everything but the wall-clock timings.
    let untimed = |steps: &[StepDetails]| -> Vec<StepDetails> {
        steps
            .iter()
            .map(|s| StepDetails {
                timings: Default::default(),
                ..s.clone()
            })
            .collect()
    };
    assert!(untimed(&together[0]) == untimed(&alone), "the long script");
    assert!(
        untimed(&together[1]) == untimed(&short_alone),
        "the short script"
    );
    assert!(
        untimed(&together[2]) == untimed(&fewer_alone),
        "24 codebooks"
    );
    assert!(short_alone.len() < alone.len());
    assert!(fewer_alone
        .iter()
        .all(|s| s.audio_tokens[24..].iter().all(|&t| t == ZERO_TOKEN)));
}

/// The first `n` entries of the fixture's script.
fn all_but(n: usize) -> Vec<Entry> {
    entries(&reference())[..n].to_vec()
}

fn new_session_with(
    generator: &Generator,
    entries: Vec<Entry>,
    n_q: Option<usize>,
) -> moshi_model::generator::LmSession {
    let cfg = generator.config();
    let voice = load_voice(&common::fixture(FIXTURE, VOICE), 32).unwrap();
    let speakers =
        speaker_condition(&[voice], cfg.tts_config.as_ref().unwrap().max_speakers()).unwrap();
    let mut settings = detailed(SamplingConfig::greedy());
    settings.conditioning = session_conditioning(cfg, 2.0, Some(Arc::new(speakers))).unwrap();
    settings.tts.n_q = n_q;
    let mut session = generator.new_session(settings).unwrap();
    let tts = session.tts_mut().unwrap();
    for e in entries {
        tts.machine_mut().push(e);
    }
    tts.machine_mut().finish_text();
    session
}

#[test]
fn quantized_weights_agree_with_the_same_weights_dequantized() {
    // q8 / q4 change the model, so their tokens may leave the f32 reference; what holds is that
    // the packed kernels compute that quantized model: the same run with the quantized weights
    // expanded to f32 gives every token.
    let reference = reference();
    for (bits, group_size) in [(8, 64), (4, 32)] {
        let (packed, dense) = common::packed_and_dequantized(FIXTURE, bits, group_size);
        let (a, _) = run(&Generator::new(Arc::new(packed)), entries(&reference));
        let (b, _) = run(&Generator::new(Arc::new(dense)), entries(&reference));
        assert_eq!(a.len(), b.len(), "q{bits}: steps");
        let mut worst = 0f32;
        for (s, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(
                (x.text_token, &x.audio_tokens),
                (y.text_token, &y.audio_tokens),
                "q{bits}: step {s}"
            );
            worst = worst.max(common::max_abs_diff(&x.text_logits, &y.text_logits));
        }
        assert!(worst <= 1e-4, "q{bits}: text logits differ by {worst}");
        let frames_equal = a
            .iter()
            .zip(reference["steps"].as_array().unwrap())
            .filter(|(x, r)| x.audio_tokens == tokens(&r["audio_fed"]))
            .count();
        eprintln!(
            "q{bits}: text logits within {worst:e} of the dequantized run; {frames_equal}/{} steps' audio equal the f32 reference",
            a.len()
        );
    }
}

#[test]
fn sessions_of_one_voice_share_its_cross_attention_keys_and_values() {
    let generator = common::fixture_generator(FIXTURE, WeightMode::Native);
    let cfg = generator.config();
    let voice = load_voice(&common::fixture(FIXTURE, VOICE), 32).unwrap();
    let max = cfg.tts_config.as_ref().unwrap().max_speakers();
    let speakers = Arc::new(speaker_condition(std::slice::from_ref(&voice), max).unwrap());
    let session = |s: &Arc<moshi_model::lm::conditioner::TensorCondition>| {
        let mut settings = detailed(SamplingConfig::greedy());
        settings.conditioning = session_conditioning(cfg, 2.0, Some(s.clone())).unwrap();
        generator.new_session(settings).unwrap()
    };
    let (a, b) = (session(&speakers), session(&speakers));
    let kv = |s: &moshi_model::generator::LmSession| s.row().temporal().cross().unwrap().clone();
    assert!(Arc::ptr_eq(&kv(&a), &kv(&b)), "one voice, one copy");
    // The same values in another condition: computed again, to the same bits.
    let other = Arc::new(speaker_condition(std::slice::from_ref(&voice), max).unwrap());
    let c = session(&other);
    assert!(!Arc::ptr_eq(&kv(&a), &kv(&c)));
    assert_eq!(*kv(&a), *kv(&c));
    // Once no session holds them, they are freed (the last computed, c's, stays: the next
    // voice reuses its rows).
    let weak = Arc::downgrade(&kv(&a));
    drop((a, b));
    assert!(weak.upgrade().is_none());
    // Another voice reuses the rows of the empty speaker slots computed for the last one: its
    // keys and values are those computed from scratch, bit for bit.
    let mut louder = voice.clone();
    louder.values.iter_mut().for_each(|v| *v *= 1.5);
    let louder = Arc::new(speaker_condition(&[louder], max).unwrap());
    let d = session(&louder);
    let weights = generator.weights();
    let source = weights
        .conditions()
        .cross_source(&[(SPEAKER_CONDITIONER, louder.as_ref())])
        .unwrap()
        .unwrap();
    let scratch = weights.temporal().cross_keys_values(&source).unwrap();
    assert_eq!(*kv(&d), scratch);
    assert_ne!(*kv(&d), *kv(&c));
}
