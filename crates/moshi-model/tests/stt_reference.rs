//! Speech to text (dep_q 0, 32 user codebooks, extra heads) against the official PyTorch
//! `LMGen(temp=0, temp_text=0).step_with_extra_heads` run on the tiny-stt fixture
//! (`assets/tiny-stt/ref/stt_greedy.json`), fed as `stt_from_file_pytorch.py` feeds it: every
//! text token, every extra head's softmax output, and the words with their start and end, all
//! through `Generator::step`; and Mimi's 32 codes of the padded input and its trailing silence.
//!
//! Extra heads: within 2e-6 of the reference. The reference is f32 arithmetic rounded to 7
//! decimals (5e-8); the rest is the f32 summation order of torch's kernels against ours over
//! 2 layers, which moves the text logits of the tiny-a reference by a few 1e-6 and a probability
//! (softmax: a derivative at most 1/4 of its logits') by less.

mod common;

use common::{detailed, step_alone, u32s};

use moshi_loader::lm_weights::{load_lm_weights, WeightMode};
use moshi_loader::tokenizer::TextTokenizer;
use moshi_loader::{load_mimi_weights, LmConfig, MimiConfig};
use moshi_model::generator::{Generator, SamplingConfig, StepDetails, StepInput};
use moshi_model::kind::ModelKind;
use moshi_model::lm::LmWeights;
use moshi_model::mimi::Mimi;
use moshi_model::stt::{SttFeeding, TimedWord, WordTimer};
use serde_json::Value;

const FIXTURE: &str = "tiny-stt";
const FRAME: usize = 1920;
/// Largest difference allowed between an extra head's output and the reference (module docs).
const HEAD_TOL: f32 = 2e-6;

fn reference() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(common::fixture(FIXTURE, "ref/stt_greedy.json")).unwrap(),
    )
    .unwrap()
}

fn config() -> LmConfig {
    common::fixture_config(FIXTURE)
}

fn generator(mode: WeightMode) -> Generator {
    common::fixture_generator(FIXTURE, mode)
}

fn tokenizer() -> TextTokenizer {
    TextTokenizer::from_file(common::fixture(FIXTURE, "tokenizer.model")).unwrap()
}

/// The reference's fed user codes, one frame per step.
fn fed_codes(reference: &Value) -> Vec<Vec<u32>> {
    reference["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| u32s(&s["user_codes"]))
        .collect()
}

/// The greedy run of `g` on the reference's codes, one step per frame.
fn run(g: &Generator, codes: &[Vec<u32>]) -> Vec<StepDetails> {
    let mut session = g.new_session(detailed(SamplingConfig::greedy())).unwrap();
    codes
        .iter()
        .map(|c| step_alone(g, &mut session, StepInput::UserCodes(c)).unwrap())
        .collect()
}

/// The words of a run's text tokens, through the incremental timer.
fn words_of(cfg: &LmConfig, tokens: &[u32]) -> Vec<TimedWord> {
    let tok = tokenizer();
    let mut timer = WordTimer::new(cfg, SttFeeding::of(cfg, 12.5));
    let mut words = Vec::new();
    for &t in tokens {
        words.extend(timer.push(t, &tok).unwrap());
    }
    words.extend(timer.finish(&tok).unwrap());
    words
}

/// The reference's words. Their times are read from the JSON text with Rust's correctly
/// rounded `f64` parser: serde_json's default one may be 1 ulp off (0.45999999999999996 reads as
/// 0.46), and the times are compared exactly.
fn reference_words(reference: &Value) -> Vec<TimedWord> {
    let text = std::fs::read_to_string(common::fixture(FIXTURE, "ref/stt_greedy.json")).unwrap();
    let words_json = &text[text.find("\"words\"").unwrap()..text.find("\"steps\"").unwrap()];
    let times = |key: &str| -> Vec<f64> {
        words_json
            .match_indices(&format!("\"{key}\": "))
            .map(|(i, m)| {
                let rest = &words_json[i + m.len()..];
                let end = rest.find([',', '}', '\n']).unwrap();
                rest[..end].trim().parse::<f64>().unwrap()
            })
            .collect()
    };
    let (starts, ends) = (times("start_s"), times("end_s"));
    let words = reference["words"].as_array().unwrap();
    assert_eq!((starts.len(), ends.len()), (words.len(), words.len()));
    words
        .iter()
        .zip(starts.into_iter().zip(ends))
        .map(|(w, (start_s, end_s))| TimedWord {
            text: w["text"].as_str().unwrap().to_string(),
            start_s,
            end_s,
        })
        .collect()
}

/// Every text token equal, every extra head within [`HEAD_TOL`]; the largest difference.
fn check_against_reference(steps: &[StepDetails], reference: &Value, what: &str) -> f32 {
    let ref_steps = reference["steps"].as_array().unwrap();
    assert_eq!(steps.len(), ref_steps.len(), "{what}: steps");
    let mut worst = 0f32;
    for (s, (got, want)) in steps.iter().zip(ref_steps).enumerate() {
        assert_eq!(
            got.text_token,
            want["text_token"].as_u64().unwrap() as u32,
            "{what}: text token of step {s} ({})",
            want["fed"]
        );
        assert!(got.audio_tokens.is_empty(), "{what}: no audio at step {s}");
        let frame = got.frame.as_ref().expect("max delay 0: a frame every step");
        assert_eq!(
            frame.text, got.text_token,
            "{what}: returned text of step {s}"
        );
        assert!(frame.audio.is_empty());
        let heads = want["extra_heads"].as_array().unwrap();
        assert_eq!(
            got.extra_heads.len(),
            heads.len(),
            "{what}: heads of step {s}"
        );
        for (h, (g, w)) in got.extra_heads.iter().zip(heads).enumerate() {
            let w: Vec<f32> = w
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            let d = common::max_abs_diff(g, &w);
            worst = worst.max(d);
            assert!(
                d <= HEAD_TOL,
                "{what}: extra head {h} of step {s} differs by {d}: {g:?} vs {w:?}"
            );
        }
    }
    worst
}

#[test]
fn greedy_run_reproduces_official_text_tokens_extra_heads_and_words() {
    let reference = reference();
    let cfg = config();
    assert_eq!(ModelKind::of(&cfg), ModelKind::SpeechToText);
    let codes = fed_codes(&reference);
    let g = generator(WeightMode::Native);
    assert_eq!(g.weights().num_extra_heads(), 4);
    let steps = run(&g, &codes);
    let worst = check_against_reference(&steps, &reference, "bf16 weights");
    eprintln!("extra heads: largest difference {worst:e}");
    let tokens: Vec<u32> = steps.iter().map(|s| s.text_token).collect();
    assert_eq!(tokens, u32s(&reference["text_tokens"]));
    // Every word and both of its times exactly as the DSM script's (f64 arithmetic alike).
    let words = reference_words(&reference);
    assert_eq!(words.len(), 6);
    assert_eq!(words_of(&cfg, &tokens), words);
}

#[test]
fn f32_weights_reproduce_the_reference_too() {
    let reference = reference();
    let steps = run(
        &generator(WeightMode::DequantizeF32),
        &fed_codes(&reference),
    );
    check_against_reference(&steps, &reference, "f32 weights");
}

#[test]
fn the_feeding_follows_stt_config() {
    let reference = reference();
    let cfg = config();
    let f = SttFeeding::of(&cfg, 12.5);
    assert_eq!(
        f.prefix_frames as u64,
        reference["n_prefix_chunks"].as_u64().unwrap()
    );
    assert_eq!(
        f.suffix_frames as u64,
        reference["n_suffix_chunks"].as_u64().unwrap()
    );
    assert_eq!(f.offset_s, reference["offset_seconds"].as_f64().unwrap());
    // Kyutai's stt-2.6b-en: 1 s of silence before, 2.5 s of delay: 13 and 32 frames, offset
    // int(13 / 12.5) + 2.5.
    let mut big = cfg.clone();
    big.stt_config = Some(moshi_loader::SttConfig {
        audio_delay_seconds: Some(2.5),
        audio_silence_prefix_seconds: Some(1.0),
    });
    let f = SttFeeding::of(&big, 12.5);
    assert_eq!(
        (f.prefix_frames, f.suffix_frames, f.offset_s),
        (13, 32, 3.5)
    );
    assert_eq!(f.time_of(0), 0.0);
    // Left out: the scripts' defaults (1.0 s, 5.0 s).
    big.stt_config = None;
    let f = SttFeeding::of(&big, 12.5);
    assert_eq!((f.prefix_frames, f.suffix_frames), (13, 63));
}

#[test]
fn streaming_mimi_gives_the_reference_codes_of_the_padded_input_and_the_silence() {
    let reference = reference();
    let mcfg = MimiConfig::from_file(common::fixture(FIXTURE, "mimi_config.json")).unwrap();
    let weights = load_mimi_weights(&common::fixture(FIXTURE, "mimi.safetensors"), 32).unwrap();
    let mut mimi = Mimi::load(&mcfg, weights, 32).unwrap();
    let mut reader = hound::WavReader::open(common::fixture(FIXTURE, "input.wav")).unwrap();
    let mut pcm: Vec<f32> = reader
        .samples::<i16>()
        .map(|s| s.unwrap() as f32 / 32768.0)
        .collect();
    pcm.resize(pcm.len().div_ceil(FRAME) * FRAME, 0.0);
    let f = SttFeeding::of(&config(), 12.5);
    let silence = vec![0f32; FRAME];
    let chunks = std::iter::repeat_n(&silence[..], f.prefix_frames)
        .chain(pcm.chunks_exact(FRAME))
        .chain(std::iter::repeat_n(&silence[..], f.suffix_frames));
    let want = fed_codes(&reference);
    let mut n = 0;
    for (s, chunk) in chunks.enumerate() {
        assert_eq!(
            mimi.encode_frame(chunk).unwrap(),
            want[s],
            "codes of step {s}"
        );
        n += 1;
    }
    assert_eq!(n, want.len());
}

#[test]
fn quantized_weights_agree_with_the_same_weights_dequantized() {
    // q8 / q4 change the model: their tokens may differ from the f32 reference. What holds is
    // that the packed kernels compute that quantized model: the same run with its weights
    // expanded to f32 gives every token, and the extra heads within f32 rounding.
    let reference = reference();
    let codes = fed_codes(&reference);
    let cfg = config();
    for (bits, group_size) in [(8, 64), (4, 32)] {
        let mode = WeightMode::Quantize { bits, group_size };
        let path = common::fixture(FIXTURE, "model.safetensors");
        let packed = LmWeights::load(&cfg, load_lm_weights(&path, &cfg, mode).unwrap()).unwrap();
        let dense = {
            let mut w = load_lm_weights(&path, &cfg, mode).unwrap();
            let names: Vec<String> = w.names().map(str::to_string).collect();
            for n in names {
                let f32s = w.get(&n).unwrap().to_f32();
                let shape = w.get(&n).unwrap().shape.clone();
                let data = moshi_loader::WeightData::F32(f32s);
                w.insert(n, moshi_loader::Weight { shape, data });
            }
            LmWeights::load(&cfg, w).unwrap()
        };
        let a = run(&Generator::new(std::sync::Arc::new(packed)), &codes);
        let b = run(&Generator::new(std::sync::Arc::new(dense)), &codes);
        let mut worst = 0f32;
        for (s, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(
                x.text_token, y.text_token,
                "q{bits}: text token of step {s}"
            );
            for (hx, hy) in x.extra_heads.iter().zip(&y.extra_heads) {
                worst = worst.max(common::max_abs_diff(hx, hy));
            }
        }
        assert!(worst <= 1e-5, "q{bits}: extra heads differ by {worst}");
        let same = a
            .iter()
            .zip(reference["text_tokens"].as_array().unwrap())
            .filter(|(x, r)| u64::from(x.text_token) == r.as_u64().unwrap())
            .count();
        eprintln!(
            "q{bits}: extra heads within {worst:e} of the dequantized run; {same}/{} text tokens equal the f32 reference",
            a.len()
        );
    }
}

#[test]
fn random_weights_of_an_stt_config_have_the_extra_heads() {
    // What `bench --random-weights` builds for an STT config: every head a distribution.
    let cfg = config();
    let kind = moshi_model::lm::RandomWeightKind::Quantized {
        bits: 4,
        group_size: 32,
    };
    let g = Generator::random(&cfg, 7, kind).unwrap();
    let steps = run(&g, &fed_codes(&reference())[..3]);
    for s in &steps {
        assert_eq!(s.extra_heads.len(), 4);
        for h in &s.extra_heads {
            assert_eq!(h.len(), 6);
            let sum: f32 = h.iter().sum();
            assert!(
                (sum - 1.0).abs() < 1e-5 && h.iter().all(|&p| p > 0.0),
                "{h:?}"
            );
        }
    }
}
