//! Two quantized kernels side by side: the same 4-bit matrices (group 32, the 7B's shapes),
//! 1 and 4 activation rows, the two kernels alternating round by round in one process, so that
//! the ratio holds however the machine drifts. Used to choose each workload's default kernel
//! (`moshi_kernels::Workload`): on AVX2-only CPUs the integer kernel against the f32 one.
//!
//! `cargo bench -p moshi-bench --bench kernel_ab` (about 1 minute). Environment:
//! `MOSHI_BENCH_KERNELS=a,b` (default `avx2,avx2int`), `MOSHI_BENCH_ROUNDS` (default 9),
//! `MOSHI_BENCH_ROTATION_MB` (weights rotated over, default 1024: streamed from DRAM as in a
//! model's step; 0 for one cached copy).

use std::hint::black_box;

use moshi_bench::alternating::medians_per_call;
use moshi_bench::env::var_or;
use moshi_bench::hashed_weights::hashed_q4;
use moshi_kernels::{Kernel, QuantizedMatrix};

/// Activation rows of the batched case (4 sessions).
const BATCH_ROWS: usize = 4;

fn main() {
    let rounds = var_or("MOSHI_BENCH_ROUNDS", 9usize).max(1);
    let rotation_bytes = var_or("MOSHI_BENCH_ROTATION_MB", 1024usize) << 20;
    let names = std::env::var("MOSHI_BENCH_KERNELS").unwrap_or_else(|_| "avx2,avx2int".into());
    let kernels: Vec<Kernel> = names
        .split(',')
        .map(|name| match Kernel::from_name(name) {
            Some(k) if k.is_available() => k,
            _ => panic!("MOSHI_BENCH_KERNELS: {name} is not a kernel this CPU runs"),
        })
        .collect();
    let [a, b] = kernels[..] else {
        panic!("MOSHI_BENCH_KERNELS: expected two kernels, got {names}")
    };
    println!(
        "\n{} against {}, 2 threads, {rounds} rounds, weights rotated over {} MB; medians\n\n\
         | shape | rows | {} µs (GB/s) | {} µs (GB/s) | {} / {} |\n|---|---|---|---|---|",
        b.name(),
        a.name(),
        rotation_bytes >> 20,
        a.name(),
        b.name(),
        b.name(),
        a.name()
    );
    for (name, cols, out) in [
        ("attn out_proj", 4096, 4096),
        ("gating in", 4096, 22528),
        ("gating out", 11264, 4096),
        ("dep in_proj", 1024, 3072),
    ] {
        let one = hashed_q4(out, cols, 0x5eed + cols as u64);
        let copies = rotation_bytes.div_ceil(one.weight_bytes()).max(1);
        let mats: Vec<QuantizedMatrix> = (0..copies).map(|_| one.clone()).collect();
        for m in [1, BATCH_ROWS] {
            let [ta, tb] = time_alternating(&mats, [a, b], m, rounds);
            let gb = one.weight_bytes() as f64 / 1e9;
            println!(
                "| {name} {cols}->{out} | {m} | {:.0} ({:.1}) | {:.0} ({:.1}) | {:.2} |",
                ta * 1e6,
                gb / ta,
                tb * 1e6,
                gb / tb,
                tb / ta
            );
        }
    }
}

/// Median seconds per product of each kernel over `rounds` (after one warm-up round), the two
/// alternating within each round; each round runs every matrix once (at least 32 products).
fn time_alternating(
    mats: &[QuantizedMatrix],
    kernels: [Kernel; 2],
    m: usize,
    rounds: usize,
) -> [f64; 2] {
    let (rows, cols) = (mats[0].rows(), mats[0].cols());
    let x: Vec<f32> = (0..m * cols)
        .map(|j| ((j * 7919 % 1000) as f32 - 500.0) * 1e-3)
        .collect();
    let mut y = vec![0f32; m * rows];
    let calls = mats.len().max(32);
    medians_per_call(rounds, calls, |k, call| {
        mats[call % mats.len()]
            .matmul_with_kernel(kernels[k], black_box(&x), m, &mut y)
            .expect("an available kernel");
        black_box(&y);
    })
}
