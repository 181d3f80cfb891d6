//! Several Mimi streams (a server's sessions) encoded and decoded together share one product per
//! transformer layer, yet each gets exactly what it gets alone: codes and every output sample bit
//! for bit, in every weight mode (f32, bf16, q8: the reduced modes take fewer streams per product),
//! streams joining at different frames (so at different positions, their KV rings wrapping at
//! different times). A stream with weights of its own runs alone in the same call; a stream's bad
//! input fails that stream alone.

use moshi_loader::{load_mimi_weights, MimiConfig};
use moshi_model::mimi::{Mimi, MimiWeights};
use moshi_test_support::tiny_a;

const FRAME: usize = 1920;
const FRAMES: usize = 14;

fn tiny_mimi(mode: MimiWeights) -> Mimi {
    let cfg = MimiConfig::from_file(tiny_a("mimi_config.json")).unwrap();
    let weights = load_mimi_weights(&tiny_a("mimi.safetensors"), 8).unwrap();
    let mut mimi = Mimi::load(&cfg, weights, 8).unwrap();
    mimi.set_weights(mode);
    mimi
}

/// A deterministic speech-like frame of stream `seed` at `frame`.
fn frame_pcm(seed: u32, frame: usize) -> Vec<f32> {
    (0..FRAME)
        .map(|i| {
            let t = (frame * FRAME + i) as f32 / 24000.0;
            let f = 140.0 + 37.0 * seed as f32;
            0.3 * (2.0 * std::f32::consts::PI * f * t).sin()
                + 0.1 * (2.0 * std::f32::consts::PI * 3.1 * f * t + seed as f32).sin()
        })
        .collect()
}

/// The streams `present` of `all` (in order).
fn present_streams<'a>(all: &'a mut [Mimi], present: &[usize]) -> Vec<&'a mut Mimi> {
    all.iter_mut()
        .enumerate()
        .filter(|(s, _)| present.contains(s))
        .map(|(_, m)| m)
        .collect()
}

/// Stream `s` joins at frame `join[s]`; every frame the streams present are encoded together,
/// then their codes decoded together, and each is compared with its own copy run alone.
fn check_streams_against_alone(mode: MimiWeights) {
    let shared = tiny_mimi(mode);
    // Stream 3 has weights of its own (another seed): it runs alone inside the batched call.
    let cfg = MimiConfig::from_file(tiny_a("mimi_config.json")).unwrap();
    let mut own = Mimi::random(&cfg, 8, 99).unwrap();
    own.set_weights(mode);
    let join = [0usize, 2, 1, 3];
    let mut batched: Vec<Mimi> = vec![shared.clone(), shared.clone(), shared.clone(), own];
    let mut alone: Vec<Mimi> = batched.clone();
    let k = shared.num_codebooks();
    for frame in 0..FRAMES {
        let present: Vec<usize> = (0..join.len()).filter(|&s| join[s] <= frame).collect();
        let pcms: Vec<Vec<f32>> = present
            .iter()
            .map(|&s| frame_pcm(s as u32, frame - join[s]))
            .collect();
        let mut codes = vec![vec![0u32; k]; present.len()];
        {
            let mut mimis = present_streams(&mut batched, &present);
            let pcm_refs: Vec<&[f32]> = pcms.iter().map(|p| &p[..]).collect();
            let mut code_refs: Vec<&mut [u32]> = codes.iter_mut().map(|c| &mut c[..]).collect();
            for r in Mimi::encode_frames(&mut mimis, &pcm_refs, &mut code_refs) {
                r.unwrap();
            }
        }
        for (j, &s) in present.iter().enumerate() {
            let expected = alone[s].encode_frame(&pcms[j]).unwrap();
            assert_eq!(
                codes[j], expected,
                "{mode:?}: stream {s} codes at frame {frame}"
            );
        }
        let mut out = vec![vec![0f32; FRAME]; present.len()];
        {
            let mut mimis = present_streams(&mut batched, &present);
            let code_refs: Vec<&[u32]> = codes.iter().map(|c| &c[..]).collect();
            let mut out_refs: Vec<&mut [f32]> = out.iter_mut().map(|o| &mut o[..]).collect();
            for r in Mimi::decode_frames(&mut mimis, &code_refs, &mut out_refs) {
                r.unwrap();
            }
        }
        for (j, &s) in present.iter().enumerate() {
            let expected = alone[s].decode_frame(&codes[j]).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&out[j]),
                bits(&expected),
                "{mode:?}: stream {s} samples at frame {frame}"
            );
        }
    }
}

#[test]
fn streams_together_equal_streams_alone_in_f32() {
    check_streams_against_alone(MimiWeights::F32);
}

#[test]
fn streams_together_equal_streams_alone_in_bf16() {
    check_streams_against_alone(MimiWeights::Bf16);
}

#[test]
fn streams_together_equal_streams_alone_in_q8() {
    check_streams_against_alone(MimiWeights::Q8);
}

#[test]
fn a_bad_frame_fails_its_stream_alone() {
    let shared = tiny_mimi(MimiWeights::F32);
    let mut batched = [shared.clone(), shared.clone()];
    let mut alone = shared.clone();
    let good = frame_pcm(1, 0);
    let short = vec![0f32; FRAME - 1];
    let k = shared.num_codebooks();
    let (mut c0, mut c1) = (vec![0u32; k], vec![0u32; k]);
    let [a, b] = &mut batched;
    let results = Mimi::encode_frames(&mut [a, b], &[&short, &good], &mut [&mut c0, &mut c1]);
    let err = results[0].as_ref().unwrap_err().to_string();
    assert!(err.contains("1920") && err.contains("1919"), "{err}");
    results[1].as_ref().unwrap();
    assert_eq!(c1, alone.encode_frame(&good).unwrap());
    // Out-of-range codes and a wrong output length fail only their stream.
    let bad_codes = vec![u32::MAX; k];
    let (mut p0, mut p1) = (vec![0f32; FRAME], vec![0f32; FRAME]);
    let [a, b] = &mut batched;
    let results = Mimi::decode_frames(&mut [a, b], &[&bad_codes, &c1], &mut [&mut p0, &mut p1]);
    assert!(results[0].is_err());
    results[1].as_ref().unwrap();
    assert_eq!(p1, alone.decode_frame(&c1).unwrap());
    let mut wrong = vec![0f32; 7];
    let [a, _] = &mut batched;
    let results = Mimi::decode_frames(&mut [a], &[&c1], &mut [&mut wrong]);
    let err = results[0].as_ref().unwrap_err().to_string();
    assert!(err.contains("1920") && err.contains('7'), "{err}");
}
