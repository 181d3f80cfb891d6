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

/// Encodes the streams present at each frame together, then decodes their codes together,
/// and compares each with its own copy run alone.
struct Streams {
    batched: Vec<Mimi>,
    alone: Vec<Mimi>,
}

impl Streams {
    fn new(streams: Vec<Mimi>) -> Self {
        Self {
            alone: streams.clone(),
            batched: streams,
        }
    }

    /// One frame of the streams `present` (`pcms[j]` for stream `present[j]`): codes and
    /// samples compared bit for bit with each stream alone. Returns the codes.
    fn step(&mut self, present: &[usize], pcms: &[Vec<f32>], what: &str) -> Vec<Vec<u32>> {
        let k = self.batched[0].num_codebooks();
        let mut codes = vec![vec![0u32; k]; present.len()];
        {
            let mut mimis = present_streams(&mut self.batched, present);
            let pcm_refs: Vec<&[f32]> = pcms.iter().map(|p| &p[..]).collect();
            let mut code_refs: Vec<&mut [u32]> = codes.iter_mut().map(|c| &mut c[..]).collect();
            for r in Mimi::encode_frames(&mut mimis, &pcm_refs, &mut code_refs) {
                r.unwrap();
            }
        }
        for (j, &s) in present.iter().enumerate() {
            let expected = self.alone[s].encode_frame(&pcms[j]).unwrap();
            assert_eq!(codes[j], expected, "{what}: stream {s} codes");
        }
        let mut out = vec![vec![0f32; FRAME]; present.len()];
        {
            let mut mimis = present_streams(&mut self.batched, present);
            let code_refs: Vec<&[u32]> = codes.iter().map(|c| &c[..]).collect();
            let mut out_refs: Vec<&mut [f32]> = out.iter_mut().map(|o| &mut o[..]).collect();
            for r in Mimi::decode_frames(&mut mimis, &code_refs, &mut out_refs) {
                r.unwrap();
            }
        }
        for (j, &s) in present.iter().enumerate() {
            let expected = self.alone[s].decode_frame(&codes[j]).unwrap();
            assert_eq!(bits(&out[j]), bits(&expected), "{what}: stream {s} samples");
        }
        codes
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Stream `s` joins at frame `join[s]` (so the streams sit at different positions); every
/// frame the streams present run together and each is compared with itself alone.
fn check_joining_streams(streams: Vec<Mimi>, join: &[usize], frames: usize, what: &str) {
    let mut run = Streams::new(streams);
    for frame in 0..frames {
        let present: Vec<usize> = (0..join.len()).filter(|&s| join[s] <= frame).collect();
        let pcms: Vec<Vec<f32>> = present
            .iter()
            .map(|&s| frame_pcm(s as u32, frame - join[s]))
            .collect();
        run.step(&present, &pcms, &format!("{what}, frame {frame}"));
    }
}

fn check_streams_against_alone(mode: MimiWeights) {
    let shared = tiny_mimi(mode);
    // Stream 3 has weights of its own (another seed): it runs alone inside the batched call.
    let cfg = MimiConfig::from_file(tiny_a("mimi_config.json")).unwrap();
    let mut own = Mimi::random(&cfg, 8, 99).unwrap();
    own.set_weights(mode);
    let streams = vec![shared.clone(), shared.clone(), shared, own];
    check_joining_streams(streams, &[0, 2, 1, 3], FRAMES, &format!("{mode:?}"));
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

/// 1, 2, 3 and 8 streams sharing weights, joining at different frames: the products shared by
/// a kernel's whole row limit, by part of it and by more streams than one product takes.
#[test]
fn one_to_eight_streams_equal_streams_alone_in_every_mode() {
    for mode in MimiWeights::ALL {
        let shared = tiny_mimi(mode);
        for n in [1, 2, 3, 8] {
            let join: Vec<usize> = (0..n).map(|s| s % 3).collect();
            let streams = vec![shared.clone(); n];
            check_joining_streams(streams, &join, 6, &format!("{mode:?}, {n} streams"));
        }
    }
}

/// Mimi's real shape (random weights): its channel counts put the products on other kernels
/// than the tiny fixture's (q8 group 64 blocks, packed f32 products of many rows, threads).
#[test]
fn eight_streams_of_the_real_shape_equal_streams_alone() {
    let cfg = MimiConfig::v0_1();
    let mut shared = Mimi::random(&cfg, 32, 5).unwrap();
    for mode in [MimiWeights::Q8, MimiWeights::F32] {
        shared.set_weights(mode);
        let join: Vec<usize> = (0..8).map(|s| s % 2).collect();
        check_joining_streams(vec![shared.clone(); 8], &join, 3, &format!("real {mode:?}"));
    }
}

/// A frame of the wrong length among good ones fails its stream alone and leaves its state as
/// it was: the good streams, and the bad one's next frames, match their runs alone.
#[test]
fn a_bad_frame_among_good_ones_fails_its_stream_alone() {
    let shared = tiny_mimi(MimiWeights::Q8);
    let mut run = Streams::new(vec![shared; 5]);
    let all: Vec<usize> = (0..5).collect();
    for frame in 0..4 {
        let mut pcms: Vec<Vec<f32>> = all.iter().map(|&s| frame_pcm(s as u32, frame)).collect();
        if frame == 2 {
            pcms[3].truncate(FRAME - 5);
            let k = run.batched[0].num_codebooks();
            let mut codes = vec![vec![0u32; k]; 5];
            let mut mimis = present_streams(&mut run.batched, &all);
            let pcm_refs: Vec<&[f32]> = pcms.iter().map(|p| &p[..]).collect();
            let mut code_refs: Vec<&mut [u32]> = codes.iter_mut().map(|c| &mut c[..]).collect();
            let results = Mimi::encode_frames(&mut mimis, &pcm_refs, &mut code_refs);
            let err = results[3].as_ref().unwrap_err().to_string();
            assert!(err.contains("1920") && err.contains("1915"), "{err}");
            assert_eq!(codes[3], vec![0u32; k], "the bad stream's codes untouched");
            for s in [0, 1, 2, 4] {
                results[s].as_ref().unwrap();
                let expected = run.alone[s].encode_frame(&pcms[s]).unwrap();
                assert_eq!(codes[s], expected, "stream {s} beside a bad frame");
            }
            // Keep the decoders in step with the alone copies: decode the good streams' codes.
            let good = [0usize, 1, 2, 4];
            let mut mimis = present_streams(&mut run.batched, &good);
            let code_refs: Vec<&[u32]> = good.iter().map(|&s| &codes[s][..]).collect();
            let mut out = vec![vec![0f32; FRAME]; good.len()];
            let mut out_refs: Vec<&mut [f32]> = out.iter_mut().map(|o| &mut o[..]).collect();
            for r in Mimi::decode_frames(&mut mimis, &code_refs, &mut out_refs) {
                r.unwrap();
            }
            for (j, &s) in good.iter().enumerate() {
                let expected = run.alone[s].decode_frame(&codes[s]).unwrap();
                assert_eq!(bits(&out[j]), bits(&expected), "stream {s} samples");
            }
        } else {
            run.step(&all, &pcms, &format!("frame {frame}"));
        }
    }
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
