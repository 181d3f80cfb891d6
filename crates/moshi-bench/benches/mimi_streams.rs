//! Mimi's encoder for several streams at once (a speech-to-text server's sessions) against the
//! same streams encoded one by one, interleaved frame by frame in one process: Mimi at the real
//! shape (configs/mimi-v0_1.json, random weights, 32 codebooks as Kyutai's STT), f32 and q8
//! weights. Per frame of all streams: wall and CPU milliseconds (CPU time shows the cost whatever
//! else the machine runs) and the weight megabytes read. The decoder likewise.
//!
//! Run: `cargo bench -p moshi-bench --bench mimi_streams [-- STREAMS]` (default 8).

use std::time::Instant;

use moshi_loader::MimiConfig;
use moshi_model::mimi::{weight_bytes_read, Mimi, MimiWeights};

/// Frames timed per way (after the warm-up), alternating between the two ways.
const FRAMES: usize = 30;
const WARMUP_FRAMES: usize = 5;

fn main() {
    let streams: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(8);
    let cfg = MimiConfig::v0_1();
    let base = Mimi::random(&cfg, 32, 42).expect("random Mimi");
    for mode in [MimiWeights::Q8, MimiWeights::F32] {
        let mut mimi = base.clone();
        mimi.set_weights(mode);
        measure(&mimi, streams, mode);
    }
}

/// Cost of one frame of every stream, summed over the timed frames.
#[derive(Default)]
struct Cost {
    wall_ms: f64,
    cpu_ms: f64,
    weight_mb: f64,
}

impl Cost {
    fn add(&mut self, f: impl FnOnce()) {
        let (cpu0, bytes0, t0) = (process_cpu_ns(), weight_bytes_read(), Instant::now());
        f();
        self.wall_ms += t0.elapsed().as_secs_f64() * 1e3;
        self.cpu_ms += (process_cpu_ns() - cpu0) as f64 / 1e6;
        self.weight_mb += (weight_bytes_read() - bytes0) as f64 / 1e6;
    }

    fn line(&self, what: &str, frames: usize) -> String {
        let n = frames as f64;
        format!(
            "{what}: {:.1} ms wall, {:.1} ms CPU, {:.1} MB weights a frame",
            self.wall_ms / n,
            self.cpu_ms / n,
            self.weight_mb / n
        )
    }
}

fn measure(mimi: &Mimi, streams: usize, mode: MimiWeights) {
    let frame = mimi.frame_size_samples();
    let k = mimi.num_codebooks();
    let pcms: Vec<Vec<f32>> = (0..streams).map(|s| speech(frame, s)).collect();
    let mut together = vec![mimi.clone(); streams];
    let mut alone = vec![mimi.clone(); streams];
    let mut codes = vec![vec![0u32; k]; streams];
    let mut pcm_out = vec![vec![0f32; frame]; streams];
    let (mut enc_together, mut enc_alone) = (Cost::default(), Cost::default());
    let (mut dec_together, mut dec_alone) = (Cost::default(), Cost::default());
    for f in 0..WARMUP_FRAMES + FRAMES {
        let timed = f >= WARMUP_FRAMES;
        let mut scratch = (Cost::default(), Cost::default());
        let (et, dt) = if timed {
            (&mut enc_together, &mut dec_together)
        } else {
            (&mut scratch.0, &mut scratch.1)
        };
        et.add(|| {
            let mut mimis: Vec<&mut Mimi> = together.iter_mut().collect();
            let refs: Vec<&[f32]> = pcms.iter().map(|p| &p[..]).collect();
            let mut outs: Vec<&mut [u32]> = codes.iter_mut().map(|c| &mut c[..]).collect();
            for r in Mimi::encode_frames(&mut mimis, &refs, &mut outs) {
                r.expect("encode");
            }
        });
        dt.add(|| {
            let mut mimis: Vec<&mut Mimi> = together.iter_mut().collect();
            let refs: Vec<&[u32]> = codes.iter().map(|c| &c[..]).collect();
            let mut outs: Vec<&mut [f32]> = pcm_out.iter_mut().map(|p| &mut p[..]).collect();
            for r in Mimi::decode_frames(&mut mimis, &refs, &mut outs) {
                r.expect("decode");
            }
        });
        let (ea, da) = if timed {
            (&mut enc_alone, &mut dec_alone)
        } else {
            (&mut scratch.0, &mut scratch.1)
        };
        ea.add(|| {
            for ((m, p), c) in alone.iter_mut().zip(&pcms).zip(codes.iter_mut()) {
                m.encode_frame_into(p, c).expect("encode");
            }
        });
        da.add(|| {
            for ((m, c), o) in alone.iter_mut().zip(&codes).zip(pcm_out.iter_mut()) {
                m.decode_frame_into(c, o).expect("decode");
            }
        });
    }
    let label = format!("mimi_v0_1 {mode}, {streams} streams");
    println!(
        "{label}, encode together   {}",
        enc_together.line("", FRAMES)
    );
    println!("{label}, encode one by one {}", enc_alone.line("", FRAMES));
    println!(
        "{label}, decode together   {}",
        dec_together.line("", FRAMES)
    );
    println!("{label}, decode one by one {}", dec_alone.line("", FRAMES));
}

/// A voiced frame whose pitch depends on the stream.
fn speech(samples: usize, stream: usize) -> Vec<f32> {
    let f0 = 110.0 + 23.0 * stream as f32;
    (0..samples)
        .map(|i| {
            let t = i as f32 / 24000.0;
            (1..6)
                .map(|h| 0.2 / h as f32 * (2.0 * std::f32::consts::PI * f0 * h as f32 * t).sin())
                .sum()
        })
        .collect()
}

/// CPU time of this process's threads (ns), from /proc (Linux); 0 elsewhere.
fn process_cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}
