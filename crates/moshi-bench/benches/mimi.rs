//! Mimi at the real shape (configs/mimi-v0_1.json, random weights, 8 codebooks): time per 80 ms
//! frame of streaming encode and of streaming decode, in steady state (transformer window full),
//! in every weight mode (`MimiWeights`: exact f32, bf16, q8), plus the weight bytes read per frame.
//!
//! Run: `cargo bench -p moshi-bench --bench mimi`

use criterion::{criterion_group, criterion_main, Criterion};
use moshi_loader::MimiConfig;
use moshi_model::mimi::{weight_bytes_read, Mimi, MimiWeights};

fn bench_mimi(c: &mut Criterion) {
    report_accuracy(&MimiConfig::v0_1(), 50);
    for mode in MimiWeights::ALL {
        bench_precision(c, mode);
    }
}

fn bench_precision(c: &mut Criterion, mode: MimiWeights) {
    let cfg = MimiConfig::v0_1();
    let mut mimi = Mimi::random(&cfg, 8, 42).expect("random Mimi");
    mimi.set_weights(mode);
    let label = mode.name();
    let frame = mimi.frame_size_samples();
    let pcm: Vec<f32> = (0..frame)
        .map(|i| 0.1 * ((i as f32) * 0.05).sin() + 0.05 * ((i as f32) * 0.31).cos())
        .collect();
    let mut codes = vec![0u32; mimi.num_codebooks()];
    let mut out = vec![0f32; frame];
    // Fill the transformer windows (context 250 steps = 125 frames) so the timing is steady state.
    for _ in 0..130 {
        mimi.encode_frame_into(&pcm, &mut codes).expect("encode");
        mimi.decode_frame_into(&codes, &mut out).expect("decode");
    }
    report_cpu_time(label, &mut mimi, &pcm, &mut codes, &mut out);
    let mut group = c.benchmark_group(format!("mimi_v0_1_{label}"));
    group.sample_size(30);
    group.measurement_time(std::time::Duration::from_secs(4));
    group.warm_up_time(std::time::Duration::from_secs(1));
    group.bench_function("encode_80ms_frame", |b| {
        b.iter(|| mimi.encode_frame_into(&pcm, &mut codes).expect("encode"))
    });
    group.bench_function("decode_80ms_frame", |b| {
        b.iter(|| mimi.decode_frame_into(&codes, &mut out).expect("decode"))
    });
    group.finish();
}

criterion_group!(benches, bench_mimi);
criterion_main!(benches);

/// CPU time of this process's threads (ns), from /proc (Linux); None elsewhere.
fn process_cpu_ns() -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// Wall and CPU milliseconds and weight megabytes read per frame over 100 frames, printed before
/// the criterion runs: on a shared machine the CPU time shows the cost independent of other
/// processes' load.
fn report_cpu_time(label: &str, mimi: &mut Mimi, pcm: &[f32], codes: &mut [u32], out: &mut [f32]) {
    const FRAMES: u32 = 100;
    // "encode+decode": both halves per frame, as the live pipeline runs them (their weights then
    // compete for the caches, unlike back-to-back frames of one half).
    for (name, encode, decode) in [
        ("encode", true, false),
        ("decode", false, true),
        ("encode+decode", true, true),
    ] {
        let (cpu0, bytes0, t0) = (
            process_cpu_ns(),
            weight_bytes_read(),
            std::time::Instant::now(),
        );
        for _ in 0..FRAMES {
            if encode {
                mimi.encode_frame_into(pcm, codes).expect("encode");
            }
            if decode {
                mimi.decode_frame_into(codes, out).expect("decode");
            }
        }
        let wall_ms = t0.elapsed().as_secs_f64() * 1e3 / FRAMES as f64;
        let weight_mb = (weight_bytes_read() - bytes0) as f64 / 1e6 / FRAMES as f64;
        match (cpu0, process_cpu_ns()) {
            (Some(a), Some(b)) => {
                let cpu_ms = (b - a) as f64 / 1e6 / FRAMES as f64;
                println!("mimi_v0_1 {label} {name}: {wall_ms:.2} ms/frame wall, {cpu_ms:.2} ms/frame CPU (all threads), {weight_mb:.1} MB weights read/frame");
            }
            _ => println!("mimi_v0_1 {label} {name}: {wall_ms:.2} ms/frame wall, {weight_mb:.1} MB weights read/frame"),
        }
    }
}

/// A speech-like test signal: a voiced source (10 harmonics, 1/h amplitudes) whose pitch glides
/// around 120 Hz, shaped by a 4 Hz syllable envelope, plus a little noise.
fn speech_like(samples: usize, sample_rate: f32) -> Vec<f32> {
    let mut noise_state = 0x2545_F491_4F6C_DD1Du64;
    let mut phase = 0f32;
    (0..samples)
        .map(|i| {
            let t = i as f32 / sample_rate;
            let f0 = 120.0 + 40.0 * (std::f32::consts::TAU * 0.7 * t).sin();
            phase = (phase + std::f32::consts::TAU * f0 / sample_rate) % std::f32::consts::TAU;
            let voiced: f32 = (1..=10).map(|h| (h as f32 * phase).sin() / h as f32).sum();
            let envelope = 0.5 * (1.0 - (std::f32::consts::TAU * 4.0 * t).cos());
            noise_state ^= noise_state << 13;
            noise_state ^= noise_state >> 7;
            noise_state ^= noise_state << 17;
            let noise = (noise_state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            0.15 * envelope * voiced + 0.005 * noise
        })
        .collect()
}

/// Accuracy of the reduced weight modes against exact f32 at the real shape (random weights):
/// the fraction of identical streaming codes over `frames` frames of a speech-like signal, and
/// the SNR of the streaming decode of the exact codes.
fn report_accuracy(cfg: &MimiConfig, frames: usize) {
    let mut exact = Mimi::random(cfg, 8, 42).expect("random Mimi");
    let pcm = speech_like(
        frames * exact.frame_size_samples(),
        exact.sample_rate() as f32,
    );
    let codes = exact.encode_step(&pcm).expect("encode");
    let decoded = exact.decode_step(&codes).expect("decode");
    let signal: f64 = decoded.iter().map(|x| (*x as f64).powi(2)).sum();
    for mode in [MimiWeights::Bf16, MimiWeights::Q8] {
        let mut mimi = exact.clone();
        mimi.reset();
        mimi.set_weights(mode);
        let ours = mimi.encode_step(&pcm).expect("encode");
        let total: usize = codes.iter().map(Vec::len).sum();
        let equal: usize = ours
            .iter()
            .zip(&codes)
            .map(|(a, b)| a.iter().zip(b).filter(|(x, y)| x == y).count())
            .sum();
        let first_equal = ours[0]
            .iter()
            .zip(&codes[0])
            .filter(|(x, y)| x == y)
            .count();
        let out = mimi.decode_step(&codes).expect("decode");
        let noise: f64 = out
            .iter()
            .zip(&decoded)
            .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
            .sum();
        let snr_db = 10.0 * (signal / noise.max(f64::MIN_POSITIVE)).log10();
        println!(
            "mimi_v0_1 accuracy {mode} vs f32 ({frames} frames, speech-like signal): codes equal {:.1}% (semantic codebook {first_equal}/{frames}), decoded SNR {snr_db:.1} dB",
            100.0 * equal as f64 / total as f64
        );
    }
}
