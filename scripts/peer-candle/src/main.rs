//! Peer benchmark: moshi-kernels's matrix-vector products against candle's quantized matmul at the
//! Moshi 7B shapes, interleaved in one process so that both meet the same memory bandwidth.
//!
//! On a shared host the read bandwidth drifts by a factor of two between intervals of a few
//! seconds, so separate runs of two benchmarks compare the intervals as much as the kernels.
//! Here each round times one pass of candle and one of moshi-kernels back to back (alternating
//! which goes first), each pass rotating over ≥ `--rotation-mib` of copies of the matrix so the
//! weights stream from DRAM as in a decode step. The per-round ratio cancels the drift; the
//! table reports its median, its range and how many rounds moshi-kernels won.
//!
//! Pairs: MLX q4 (group 32, 5 bits per weight) against candle's `Q4K` (4.5 b/w, its best 4-bit
//! k-quant) and `Q4_1` (5 b/w, the same layout as MLX q4g32); MLX q8 (group 64, 8.5 b/w) against
//! `Q8_0` (8.5 b/w). Both sides quantize the same random matrix; ours is held as the engine holds
//! it (`KernelMatrix`: panels of 16 rows where the kernel is `avx512vnni`, else MLX's rows),
//! named in the table's moshi-kernels column. Before timing, each side's
//! output is checked against its own dequantized weights in f64, and the error printed: candle
//! rounds the activations to 8 bits, moshi-kernels keeps them f32 (VNNI: 24 bits per group).
//!
//! `cd scripts/peer-candle && cargo run --release -- [--threads 2] [--rounds 21]
//! [--rotation-mib 1024] [--formats q4,q8] [--shapes <substring>] [--activations exact|i8]`
//! (`--activations i8`: moshi-kernels rounds its activations to 8 bits per group, as candle does)
//!
//! `cargo run --release -- step [--layers 8] [--rounds 7] [--steps 4] [--warmup-steps 2]
//! [--threads 2]`: the whole LM step instead, the engine's against Kyutai's Rust crate's
//! (`step.rs`).

mod kyutai_lm;
mod step;

use std::time::Instant;

use candle_core::quantized::ggml_file::qtensor_from_ggml;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use moshi_bench::bandwidth::ReadBuffer;
use moshi_bench::shapes::{LARGE_SHAPES, MOSHI_7B_MATVEC_SHAPES};
use moshi_bench::summary::median;
use moshi_kernels::{Kernel, KernelMatrix, QuantizedMatrix};

/// (name, in_features, out_features): the 5 temporal-transformer shapes of `cargo bench -p
/// moshi-bench --bench qmv` and its first 2 depformer ones.
const SHAPES: &[(&str, usize, usize)] = MOSHI_7B_MATVEC_SHAPES.split_at(LARGE_SHAPES + 2).0;

/// Our side's product of one activation row, as the engine runs it (the detected kernel, the
/// process's activation precision).
fn ours_matvec(ours: &KernelMatrix, x: &[f32], y: &mut [f32]) {
    let precision = moshi_kernels::activation_precision();
    let ran = ours.matmul_with(Kernel::detect(), precision, x, 1, y);
    ran.expect("the detected kernel runs on this CPU");
}

struct Options {
    threads: usize,
    rounds: usize,
    rotation_bytes: usize,
    formats: Vec<String>,
    shapes: String,
}

fn parse_options(args: &[String]) -> Result<Options, String> {
    let mut options = Options {
        threads: 2,
        rounds: 21,
        rotation_bytes: 1024 << 20,
        formats: vec!["q4".into(), "q8".into()],
        shapes: String::new(),
    };
    let mut args = args.iter().cloned();
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<usize>()
                .map_err(|e| format!("{flag} {value}: {e}"))
        };
        match flag.as_str() {
            "--threads" => options.threads = number()?.max(1),
            "--rounds" => options.rounds = number()?.max(1),
            "--rotation-mib" => options.rotation_bytes = number()? << 20,
            "--formats" => options.formats = value.split(',').map(str::to_owned).collect(),
            "--shapes" => options.shapes = value,
            "--activations" => moshi_kernels::set_activation_precision(value.parse()?),
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(options)
}

/// Deterministic N(0, 0.02²) weights (xorshift + Box-Muller), the scale of trained projections.
fn random_weights(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..len)
        .map(|_| {
            let (u, v) = (uniform(), uniform());
            (0.02 * (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
        })
        .collect()
}

/// Largest |y - reference| over the largest |reference|, the reference in f64 from `dense`
/// (row-major `[rows, cols]`).
fn relative_error(y: &[f32], dense: &[f32], x: &[f32]) -> f64 {
    let cols = x.len();
    let (mut worst, mut largest) = (0f64, 0f64);
    for (row, &got) in dense.chunks_exact(cols).zip(y) {
        let exact: f64 = row.iter().zip(x).map(|(&w, &v)| w as f64 * v as f64).sum();
        worst = worst.max((got as f64 - exact).abs());
        largest = largest.max(exact.abs());
    }
    worst / largest
}

/// Seconds per product of one pass over `copies` (the pass's mean).
fn time_pass(copies: usize, mut product: impl FnMut(usize)) -> f64 {
    let start = Instant::now();
    for c in 0..copies {
        product(c);
    }
    start.elapsed().as_secs_f64() / copies as f64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "step") {
        let options = step::parse(&args[1..])?;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(options.flags.threads)
            .build()?;
        return step::run(&options, &pool).map_err(|e| e as Box<dyn std::error::Error>);
    }
    let options = parse_options(&args)?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(options.threads)
        .build()?;
    let kernel = Kernel::detect();
    let eight_bit = match kernel {
        Kernel::Avx2Int => " (8-bit products on the f32 avx2 kernel)",
        Kernel::NeonDot => " (8-bit products on the f32 neon kernel)",
        _ => "",
    };
    // Both run inside `pool`: candle's quantized matmul is a rayon parallel iterator, and
    // moshi-kernels's team takes at most the current pool's thread count.
    println!(
        "moshi-kernels kernel {}{eight_bit}; {} threads for both; {} rounds; rotation {} MiB",
        kernel.name(),
        options.threads,
        options.rounds,
        options.rotation_bytes >> 20
    );
    println!();
    println!("| shape | candle | candle µs (GB/s) | moshi-kernels | moshi-kernels µs (GB/s) | ours / candle: median [range] | rounds ours faster | read BW GB/s | check: rel. error candle / ours |");
    println!("|---|---|---:|---|---:|---:|---:|---:|---|");
    let device = Device::Cpu;
    for format in &options.formats {
        let (bits, group_size, peers): (u32, usize, &[GgmlDType]) = match format.as_str() {
            "q4" => (4, 32, &[GgmlDType::Q4K, GgmlDType::Q4_1]),
            // MLX's default group size: 4.5 bits per weight, as many as Q4K.
            "q4g64" => (4, 64, &[GgmlDType::Q4K]),
            "q8" => (8, 64, &[GgmlDType::Q8_0]),
            other => return Err(format!("unknown format {other} (q4, q4g64 or q8)").into()),
        };
        for (shape_index, &(name, cols, rows)) in SHAPES.iter().enumerate() {
            if !name.contains(&options.shapes) {
                continue;
            }
            let dense = random_weights(rows * cols, shape_index as u64 + 1);
            let x = random_weights(cols, 1000 + shape_index as u64)
                .iter()
                .map(|v| v * 50.0)
                .collect::<Vec<f32>>();
            let quantized_ours = QuantizedMatrix::quantize(&dense, rows, cols, bits, group_size)?;
            let ours_dense = quantized_ours.dequantize_f32();
            let ours = KernelMatrix::for_kernel(quantized_ours, kernel);
            let ours_bytes = ours.weight_bytes();
            let ours_copies = (options.rotation_bytes / ours_bytes).max(2);
            let mut y = vec![0f32; rows];
            pool.install(|| ours_matvec(&ours, &x, &mut y));
            let ours_error = relative_error(&y, &ours_dense, &x);
            drop(ours_dense);
            let ours_all: Vec<KernelMatrix> = (0..ours_copies).map(|_| ours.clone()).collect();
            let dense_tensor = Tensor::from_vec(dense, (rows, cols), &device)?;
            let x_tensor = Tensor::from_vec(x.clone(), (1, cols), &device)?;
            for &peer in peers {
                let quantized = QTensor::quantize(&dense_tensor, peer)?;
                let peer_bytes = quantized.storage_size_in_bytes();
                let peer_copies = (options.rotation_bytes / peer_bytes).max(2);
                let peer_dense = quantized
                    .dequantize(&device)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                // Copies from the raw blocks (re-quantizing each would take minutes).
                let (raw, dims) = (
                    quantized.data()?.into_owned(),
                    quantized.shape().dims().to_vec(),
                );
                let mut peer_all = vec![QMatMul::from_qtensor(quantized)?];
                for _ in 1..peer_copies {
                    let copy = qtensor_from_ggml(peer, &raw, dims.clone(), &device)?;
                    peer_all.push(QMatMul::from_qtensor(copy)?);
                }
                drop(raw);
                let peer_y = pool.install(|| peer_all[0].forward(&x_tensor))?;
                let peer_error =
                    relative_error(&peer_y.flatten_all()?.to_vec1::<f32>()?, &peer_dense, &x);
                drop(peer_dense);
                let probe = ReadBuffer::new(options.threads, 1 << 30)
                    .map(|b| b.best_gbps(3))
                    .unwrap_or(0.0);
                let (mut peer_us, mut ours_us, mut ratios) = (vec![], vec![], vec![]);
                pool.install(|| -> candle_core::Result<()> {
                    // One untimed pass each: page-ins and the team's first wake-up.
                    for m in &peer_all {
                        m.forward(&x_tensor)?;
                    }
                    for m in &ours_all {
                        ours_matvec(m, &x, &mut y);
                    }
                    for round in 0..options.rounds {
                        let peer_pass = || -> candle_core::Result<f64> {
                            let mut failed = None;
                            let seconds =
                                time_pass(peer_copies, |c| match peer_all[c].forward(&x_tensor) {
                                    Ok(out) => drop(std::hint::black_box(out)),
                                    Err(e) => failed = Some(e),
                                });
                            failed.map_or(Ok(seconds), Err)
                        };
                        let mut ours_pass = || {
                            time_pass(ours_copies, |c| {
                                ours_matvec(&ours_all[c], &x, &mut y);
                                std::hint::black_box(&y);
                            })
                        };
                        let (p, o) = if round % 2 == 0 {
                            let p = peer_pass()?;
                            (p, ours_pass())
                        } else {
                            let o = ours_pass();
                            (peer_pass()?, o)
                        };
                        peer_us.push(p * 1e6);
                        ours_us.push(o * 1e6);
                        ratios.push(o / p);
                    }
                    Ok(())
                })?;
                let wins = ratios.iter().filter(|&&r| r < 1.0).count();
                let (p, o) = (median(&peer_us), median(&ours_us));
                let r = median(&ratios);
                println!(
                    "| {name} {cols}->{rows} | {peer:?} | {p:.0} ({:.1}) | q{bits}g{group_size}{} | {o:.0} ({:.1}) | {r:.2} [{:.2}–{:.2}] | {wins}/{} | {probe:.1} | {peer_error:.1e} / {ours_error:.1e} |",
                    peer_bytes as f64 / p / 1e3,
                    if ours.is_panels() { " panels" } else { "" },
                    ours_bytes as f64 / o / 1e3,
                    ratios[0],
                    ratios[ratios.len() - 1],
                    ratios.len(),
                );
            }
        }
    }
    Ok(())
}
