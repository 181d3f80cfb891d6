//! Mimi against the official PyTorch references of `assets/tiny-a` (streaming and batch encode,
//! streaming decode, 16 kHz resampled input), plus reset and error behaviour.

use moshi_loader::{load_mimi_weights, npy, MimiConfig, WeightMap};
use moshi_model::mimi::{Mimi, MimiWeights};
use moshi_test_support::tiny_a;

/// tiny-a's Mimi weights for `codebooks` codebooks, read by the loader.
fn weights(codebooks: usize) -> WeightMap {
    load_mimi_weights(&tiny_a("mimi.safetensors"), codebooks).unwrap()
}

fn load_mimi() -> Mimi {
    let cfg = MimiConfig::from_file(tiny_a("mimi_config.json")).unwrap();
    Mimi::load(&cfg, weights(8), 8).unwrap()
}

/// input.wav as int16 / 32768, full frames only (what the reference used).
fn input_pcm(frame: usize) -> Vec<f32> {
    let mut reader = hound::WavReader::open(tiny_a("input.wav")).unwrap();
    assert_eq!(reader.spec().sample_rate, 24000);
    let pcm: Vec<f32> = reader
        .samples::<i16>()
        .map(|s| s.unwrap() as f32 / 32768.0)
        .collect();
    let frames = pcm.len() / frame;
    pcm[..frames * frame].to_vec()
}

fn reference_codes(name: &str) -> Vec<Vec<u32>> {
    let arr = npy::read_i64(tiny_a(name)).unwrap();
    assert_eq!(arr.shape.len(), 2);
    let (k, t) = (arr.shape[0], arr.shape[1]);
    (0..k)
        .map(|q| {
            arr.data[q * t..(q + 1) * t]
                .iter()
                .map(|&c| c as u32)
                .collect()
        })
        .collect()
}

fn mismatches(a: &[Vec<u32>], b: &[Vec<u32>]) -> Vec<(usize, usize, u32, u32)> {
    assert_eq!(a.len(), b.len(), "codebook count");
    let mut out = Vec::new();
    for (q, (ra, rb)) in a.iter().zip(b).enumerate() {
        assert_eq!(ra.len(), rb.len(), "frame count of codebook {q}");
        for (t, (x, y)) in ra.iter().zip(rb).enumerate() {
            if x != y {
                out.push((q, t, *x, *y));
            }
        }
    }
    out
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn streaming_encode_matches_reference_exactly() {
    let mut mimi = load_mimi();
    let pcm = input_pcm(mimi.frame_size_samples());
    let mut codes = vec![Vec::new(); 8];
    for frame in pcm.chunks_exact(mimi.frame_size_samples()) {
        let c = mimi.encode_frame(frame).unwrap();
        for (row, v) in codes.iter_mut().zip(c) {
            row.push(v);
        }
    }
    let expected = reference_codes("ref/mimi_codes.npy");
    assert_eq!(
        mismatches(&codes, &expected),
        vec![],
        "streaming codes (codebook, frame, ours, reference)"
    );
}

#[test]
fn encode_step_equals_frame_by_frame_and_reset_repeats() {
    let mut mimi = load_mimi();
    let frame = mimi.frame_size_samples();
    let pcm = input_pcm(frame);
    let whole = mimi.encode_step(&pcm).unwrap();
    mimi.reset();
    let mut chunked: Vec<Vec<u32>> = vec![Vec::new(); 8];
    for chunk in pcm.chunks(frame * 3) {
        for (row, part) in chunked.iter_mut().zip(mimi.encode_step(chunk).unwrap()) {
            row.extend(part);
        }
    }
    assert_eq!(whole, chunked);
    assert_eq!(whole, reference_codes("ref/mimi_codes.npy"));
}

#[test]
fn batch_encode_matches_reference_exactly() {
    let mimi = load_mimi();
    let pcm = input_pcm(mimi.frame_size_samples());
    let codes = mimi.encode_batch(&pcm).unwrap();
    let expected = reference_codes("ref/mimi_codes_batch.npy");
    assert_eq!(
        mismatches(&codes, &expected),
        vec![],
        "batch codes (codebook, frame, ours, reference)"
    );
}

#[test]
fn streaming_decode_matches_reference() {
    let mut mimi = load_mimi();
    let codes = reference_codes("ref/mimi_codes.npy");
    let expected = npy::read_f32(tiny_a("ref/mimi_decoded.npy")).unwrap().data;
    let pcm = mimi.decode_step(&codes).unwrap();
    let diff = max_abs_diff(&pcm, &expected);
    eprintln!("streaming decode max abs diff vs reference: {diff:e}");
    assert!(diff < 1e-4, "streaming decode max abs diff {diff}");
    // Reset gives the identical output a second time, frame by frame.
    mimi.reset();
    let frames = codes[0].len();
    let mut again = Vec::new();
    for t in 0..frames {
        let frame: Vec<u32> = codes.iter().map(|r| r[t]).collect();
        again.extend(mimi.decode_frame(&frame).unwrap());
    }
    assert_eq!(pcm, again);
}

#[test]
fn resampled_16k_input_matches_reference_codes() {
    let mut mimi = load_mimi();
    let pcm = npy::read_f32(tiny_a("ref/input_16k_resampled.npy"))
        .unwrap()
        .data;
    let frame = mimi.frame_size_samples();
    let frames = pcm.len() / frame;
    let codes = mimi.encode_step(&pcm[..frames * frame]).unwrap();
    let expected = reference_codes("ref/mimi_codes_16k.npy");
    assert_eq!(
        mismatches(&codes, &expected),
        vec![],
        "16 kHz codes (codebook, frame, ours, reference)"
    );
}

#[test]
fn bad_inputs_get_clear_errors() {
    let mut mimi = load_mimi();
    let err = mimi.encode_frame(&[0.0; 100]).unwrap_err().to_string();
    assert!(err.contains("1920") && err.contains("100"), "{err}");
    let err = mimi.encode_step(&[0.0; 1921]).unwrap_err().to_string();
    assert!(err.contains("1921"), "{err}");
    let err = mimi.decode_frame(&[0, 1, 2]).unwrap_err().to_string();
    assert!(err.contains("8") && err.contains("3"), "{err}");
    let err = mimi
        .decode_frame(&[0, 1, 2, 3, 64, 5, 6, 7])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("64") && err.contains("codebook 4") && err.contains("out of range"),
        "{err}"
    );
    let cfg = MimiConfig::from_file(tiny_a("mimi_config.json")).unwrap();
    let err = Mimi::load(&cfg, weights(13), 13).unwrap_err().to_string();
    assert!(err.contains("13") && err.contains("12"), "{err}");
    let err = Mimi::load(&MimiConfig::v0_1(), weights(8), 8)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("mimi.safetensors") && err.contains("shape"),
        "{err}"
    );
    // A tensor the config does not use: the checkpoint was made for another config.
    let mut extra = weights(8);
    extra.insert(
        "encoder.model.99.conv.conv.weight",
        moshi_loader::Weight {
            shape: vec![1],
            data: moshi_loader::WeightData::F32(vec![0.0]),
        },
    );
    let err = Mimi::load(&cfg, extra, 8).unwrap_err().to_string();
    assert!(
        err.contains("1 tensors are not used") && err.contains("encoder.model.99."),
        "{err}"
    );
}

#[test]
fn batch_decode_equals_streaming_decode_before_the_window_fills() {
    // 16 frames = 32 decoder-transformer steps = exactly the context: no key has left the ring.
    let mut mimi = load_mimi();
    let codes: Vec<Vec<u32>> = reference_codes("ref/mimi_codes.npy")
        .into_iter()
        .map(|r| r[..16].to_vec())
        .collect();
    let streamed = mimi.decode_step(&codes).unwrap();
    let batch = mimi.decode_batch(&codes).unwrap();
    let diff = max_abs_diff(&streamed, &batch);
    assert!(diff < 1e-5, "batch vs streaming decode {diff}");
    let reference = npy::read_f32(tiny_a("ref/mimi_decoded.npy")).unwrap().data;
    assert!(max_abs_diff(&batch, &reference[..batch.len()]) < 1e-4);
}

/// Decoded SNR in dB of `ours` against `reference`.
fn snr_db(ours: &[f32], reference: &[f32]) -> f64 {
    assert_eq!(ours.len(), reference.len(), "length");
    let signal: f64 = reference.iter().map(|x| (*x as f64).powi(2)).sum();
    let noise: f64 = ours
        .iter()
        .zip(reference)
        .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
        .sum();
    10.0 * (signal / noise.max(f64::MIN_POSITIVE)).log10()
}

/// Reduced weight precision against the exact reference: the fraction of identical streaming
/// codes and the SNR of the streaming decode of the reference codes. tiny-a has d_model 32, so
/// q8 uses group 32 for its 32-column products (group 64 where the columns allow). The q8 mode's
/// whole-matrix layers take the process's activation precision where the CPU has AVX-512 VNNI:
/// exact and 16-bit (`chat`'s and `serve`'s default) are both held to the contract. No other test
/// of this binary runs quantized products, so setting the precision here is safe.
#[test]
fn reduced_precision_weight_modes_stay_close_to_the_f32_reference() {
    let mut mimi = load_mimi();
    let codes = reference_codes("ref/mimi_codes.npy");
    let reference = npy::read_f32(tiny_a("ref/mimi_decoded.npy")).unwrap().data;
    let pcm = input_pcm(mimi.frame_size_samples());
    use moshi_kernels::ActivationPrecision::{Exact, Int16};
    // (mode, activations, minimum fraction of equal codes, minimum decoded SNR in dB)
    for (mode, activations, min_equal, min_snr_db) in [
        (MimiWeights::Bf16, Exact, 0.95, 42.0),
        (MimiWeights::Q8, Exact, 0.88, 30.0),
        (MimiWeights::Q8, Int16, 0.88, 30.0),
    ] {
        moshi_kernels::set_activation_precision(activations);
        mimi.set_weights(mode);
        mimi.reset();
        assert_eq!(mimi.weights(), mode);
        let decoded = mimi.decode_step(&codes).unwrap();
        let snr = snr_db(&decoded, &reference);
        let ours = mimi.encode_step(&pcm).unwrap();
        let total: usize = ours.iter().map(Vec::len).sum();
        let equal = (total - mismatches(&ours, &codes).len()) as f64 / total as f64;
        let first_equal = ours[0]
            .iter()
            .zip(&codes[0])
            .filter(|(a, b)| a == b)
            .count();
        eprintln!("{mode} weights, {activations} activations: codes equal {:.1}% (semantic codebook {first_equal}/{}), decoded SNR {snr:.1} dB", 100.0 * equal, codes[0].len());
        assert!(
            equal >= min_equal,
            "{mode}: only {:.1}% of codes equal",
            100.0 * equal
        );
        assert!(snr >= min_snr_db, "{mode}: decoded SNR {snr:.1} dB");
    }
    moshi_kernels::set_activation_precision(Exact);
    mimi.set_weights(MimiWeights::F32);
    mimi.reset();
    assert!(
        max_abs_diff(&mimi.decode_step(&codes).unwrap(), &reference) < 1e-4,
        "f32 mode restored"
    );
    assert_eq!(
        mimi.encode_step(&pcm).unwrap(),
        codes,
        "f32 mode restored: exact codes"
    );
}

#[test]
fn random_weights_are_deterministic_and_keep_signals_bounded() {
    let cfg = MimiConfig::from_file(tiny_a("mimi_config.json")).unwrap();
    let pcm = input_pcm(1920)[..4 * 1920].to_vec();
    let run = |seed: u64| {
        let mut mimi = Mimi::random(&cfg, 8, seed).unwrap();
        let codes = mimi.encode_step(&pcm).unwrap();
        let out = mimi.decode_step(&codes).unwrap();
        (codes, out)
    };
    let (codes_a, out_a) = run(7);
    let (codes_b, out_b) = run(7);
    let (codes_c, _) = run(8);
    assert_eq!(codes_a, codes_b);
    assert_eq!(out_a, out_b);
    assert_ne!(codes_a, codes_c, "another seed gives other weights");
    let peak = out_a.iter().fold(0f32, |m, x| m.max(x.abs()));
    assert!(peak.is_finite() && peak < 100.0, "decoded peak {peak}");
}
