//! Quantized matrix-vector product at the Moshi 7B shapes (temporal transformer, text head,
//! depformer), q4 (group 32 and 64), q8 (group 64) and GGUF q8_0 (8-bit group 32, f16 scales, as
//! Kyutai's candle release holds), against the machine's measured read bandwidth,
//! plus a naive dequantize-then-sgemv and dense f32 weights for comparison. Where the kernel
//! is AVX-512 VNNI, each MLX-format case runs twice: on MLX's row layout, and on the panels the
//! engine rearranges such matrices into at load (`QuantPanels`, the case named `…-panels`).
//!
//! Each case rotates over enough copies of the matrix to exceed 1 GiB, so weights come from
//! DRAM as they do when a whole model is streamed every step. Threads: `MOSHI_BENCH_THREADS`
//! (default 2); kernel:
//! `MOSHI_BENCH_KERNEL=avx512vnni|avx512|avx2int|avx2|neondot|neon|portable` (default: detected);
//! activations: `MOSHI_BENCH_ACTIVATIONS=exact|i16|i8` (default exact).
//! Prints a markdown summary table at the end: speeds from wall time (mean, and the fastest
//! sample as STREAM reports its best pass), each against the read bandwidth measured right before
//! that case (a shared host's bandwidth drifts between cases), and from process CPU
//! time (`/proc/self/stat`; bytes per CPU-second × threads): on a loaded machine that one says
//! what the kernels do with the cores they actually get.
//!
//! `cargo bench -p moshi-bench --bench qmv`

use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{black_box, Criterion, Throughput};
use moshi_bench::bandwidth::{ReadBuffer, DEFAULT_BUFFER_BYTES};
use moshi_bench::env::var_or;
use moshi_kernels::{ActivationPrecision, Kernel, QuantPanels, QuantizedMatrix};

/// Bytes each case rotates over by default (well above the last-level cache);
/// `MOSHI_BENCH_ROTATION_MB=0` keeps one copy (in-cache compute speed).
const DEFAULT_ROTATION_MB: usize = 1024;

/// (name, in_features, out_features).
const SHAPES: [(&str, usize, usize); 11] = moshi_bench::shapes::MOSHI_7B_MATVEC_SHAPES;

struct Row {
    case: String,
    weight_bytes: usize,
    seconds_per_call: f64,
    /// Per call, in the fastest criterion sample (like STREAM's best-of-N passes).
    fastest_seconds_per_call: f64,
    /// Read bandwidth measured right before this case (best of a few passes), GB/s: the
    /// machine's bandwidth drifts with other tenants, so each case is compared with its own.
    probe_gbps: f64,
    cpu_seconds_per_call: f64,
    /// Threads the case keeps busy (the baselines are single-threaded).
    threads: usize,
}

/// CPU time of this process (all threads), from /proc/self/stat (Linux; clock ticks of 10 ms).
fn process_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_name = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// (wall GB/s, CPU-time GB/s) of the read-bandwidth probe: best wall pass, total CPU over all passes.
fn measure_bandwidth(threads: usize) -> (f64, f64) {
    let buffer = ReadBuffer::new(threads, DEFAULT_BUFFER_BYTES).expect("read-bandwidth buffer");
    let passes = 8;
    let cpu_start = process_cpu_seconds();
    let best = (0..passes).map(|_| buffer.read_pass()).min().unwrap();
    let cpu = process_cpu_seconds() - cpu_start;
    let bytes = buffer.bytes() as f64;
    (
        bytes / best.as_secs_f64() / 1e9,
        bytes * passes as f64 / (cpu / threads as f64) / 1e9,
    )
}

static RESULTS: Mutex<Vec<Row>> = Mutex::new(Vec::new());

fn random_matrix(
    rows: usize,
    cols: usize,
    bits: u32,
    group_size: usize,
    seed: u64,
) -> QuantizedMatrix {
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let codes = (0..rows * cols * bits as usize / 32)
        .map(|_| next() as u32)
        .collect();
    let groups = rows * cols / group_size;
    let bf16 = |v: f32| half::bf16::from_f32(v).to_bits();
    let scales = (0..groups)
        .map(|i| bf16(0.001 + (i % 97) as f32 * 1e-5))
        .collect();
    let biases = (0..groups)
        .map(|i| bf16(-0.05 + (i % 89) as f32 * 1e-3))
        .collect();
    QuantizedMatrix::new(rows, cols, bits, group_size, codes, scales, biases).unwrap()
}

/// A `[rows, cols]` matrix of random GGUF q8_0 blocks (f16 scales, `i8` codes).
fn random_q8_0(rows: usize, cols: usize, seed: u64) -> QuantizedMatrix {
    let mut s = seed | 1;
    let blocks: Vec<u8> = (0..rows * cols / moshi_kernels::Q8_0_BLOCK)
        .flat_map(|i| {
            let d = half::f16::from_f32(0.001 + (i % 97) as f32 * 1e-5);
            let codes: Vec<u8> = (0..moshi_kernels::Q8_0_BLOCK)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    s as u8
                })
                .collect();
            d.to_le_bytes().into_iter().chain(codes)
        })
        .collect();
    QuantizedMatrix::from_q8_0(rows, cols, &blocks).unwrap()
}

/// Best-of-`passes` read bandwidth (GB/s) of `probe`, wall clock.
fn probe_gbps(probe: &ReadBuffer, passes: usize) -> f64 {
    let best = (0..passes).map(|_| probe.read_pass()).min().unwrap();
    probe.bytes() as f64 / best.as_secs_f64() / 1e9
}

/// Passes of the read probe taken right before each case.
const ADJACENT_PROBE_PASSES: usize = 3;

/// What every case is timed with: criterion, the pool the products run in, the read probe.
struct Bench<'a> {
    c: Criterion,
    pool: &'a rayon::ThreadPool,
    probe: &'a ReadBuffer,
}

/// Times `call(copy_index)` rotating over `copies`, recording the mean and fastest-sample time
/// per call and the read bandwidth measured just before.
fn bench_rotating(
    bench: &mut Bench<'_>,
    threads: usize,
    group: &str,
    case: String,
    weight_bytes: usize,
    copies: usize,
    mut call: impl FnMut(usize) + Send,
) {
    let (c, pool, probe) = (&mut bench.c, bench.pool, bench.probe);
    let probe_gbps = probe_gbps(probe, ADJACENT_PROBE_PASSES);
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Bytes(weight_bytes as u64));
    let (mut total, mut calls, mut cpu) = (Duration::ZERO, 0u64, 0f64);
    let mut fastest = f64::MAX;
    g.bench_function(&case, |b| {
        b.iter_custom(|iters| {
            pool.install(|| {
                let cpu_start = process_cpu_seconds();
                let start = Instant::now();
                for i in 0..iters {
                    call(i as usize % copies);
                }
                let elapsed = start.elapsed();
                cpu += process_cpu_seconds() - cpu_start;
                total += elapsed;
                calls += iters;
                fastest = fastest.min(elapsed.as_secs_f64() / iters.max(1) as f64);
                elapsed
            })
        })
    });
    g.finish();
    if calls > 0 {
        RESULTS.lock().unwrap().push(Row {
            case,
            weight_bytes,
            seconds_per_call: total.as_secs_f64() / calls as f64,
            fastest_seconds_per_call: fastest,
            probe_gbps,
            cpu_seconds_per_call: cpu / calls as f64,
            threads,
        });
    }
}

fn main() {
    let threads: usize = var_or("MOSHI_BENCH_THREADS", 2);
    let rotation_bytes = var_or("MOSHI_BENCH_ROTATION_MB", DEFAULT_ROTATION_MB) << 20;
    // Same substring filter as criterion's first free argument, applied before building matrices.
    let filter = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_default();
    let wanted = |case: &str| case.contains(filter.as_str());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(10)
        .configure_from_args();

    let bandwidth = measure_bandwidth(threads);
    let probe = ReadBuffer::new(threads, DEFAULT_BUFFER_BYTES).expect("read-bandwidth buffer");
    let mut bench = Bench {
        c,
        pool: &pool,
        probe: &probe,
    };
    println!(
        "measured read bandwidth, {threads} threads: {:.2} GB/s wall, {:.2} GB/s per CPU time",
        bandwidth.0, bandwidth.1
    );
    let kernel = match std::env::var("MOSHI_BENCH_KERNEL") {
        Ok(name) => Kernel::from_name(&name).expect(
            "MOSHI_BENCH_KERNEL: avx512vnni, avx512, avx2int, avx2, neondot, neon or portable",
        ),
        Err(_) => Kernel::detect(),
    };
    assert!(
        kernel.is_available(),
        "kernel {} is not available on this CPU",
        kernel.name()
    );
    println!("kernel: {}", kernel.name());
    let activations = var_or("MOSHI_BENCH_ACTIVATIONS", ActivationPrecision::Exact);
    moshi_kernels::set_activation_precision(activations);
    println!("activations: {activations}");

    for (format, bits, group_size) in [
        ("q4g32", 4u32, 32usize),
        ("q4g64", 4, 64),
        ("q8g64", 8, 64),
        ("q8_0", 8, 32),
    ] {
        for (i, &(name, cols, rows)) in SHAPES.iter().enumerate() {
            let case = format!(
                "{} {activations} {format} {name} {cols}->{rows}",
                kernel.name()
            );
            let panels_case = format!(
                "{}-panels {activations} {format} {name} {cols}->{rows}",
                kernel.name()
            );
            if !wanted(&case) && !wanted(&panels_case) {
                continue;
            }
            let seed = 0x9E37 + i as u64;
            let w = match format {
                "q8_0" => random_q8_0(rows, cols, seed),
                _ => random_matrix(rows, cols, bits, group_size, seed),
            };
            let copies = rotation_bytes.div_ceil(w.weight_bytes()).max(1);
            let x: Vec<f32> = (0..cols)
                .map(|j| ((j * 7919) % 1000) as f32 / 1000.0 - 0.5)
                .collect();
            let mut y = vec![0f32; rows];
            if wanted(&case) {
                let mats: Vec<QuantizedMatrix> = (0..copies).map(|_| w.clone()).collect();
                bench_rotating(
                    &mut bench,
                    threads,
                    "qmv",
                    case,
                    w.weight_bytes(),
                    copies,
                    |k| {
                        if kernel == Kernel::detect() {
                            mats[k].matvec(black_box(&x), &mut y);
                        } else {
                            mats[k]
                                .matmul_with_kernel(kernel, black_box(&x), 1, &mut y)
                                .unwrap();
                        }
                        black_box(&y);
                    },
                );
            }
            if wanted(&panels_case) && QuantPanels::suits(&w, kernel) {
                let panels: Vec<QuantPanels> = (0..copies)
                    .map(|_| {
                        QuantPanels::from_matrix(w.clone(), kernel).unwrap_or_else(|_| {
                            panic!("{panels_case}: panels refused a suited matrix")
                        })
                    })
                    .collect();
                bench_rotating(
                    &mut bench,
                    threads,
                    "qmv",
                    panels_case,
                    w.weight_bytes(),
                    copies,
                    |k| {
                        panels[k].matmul(black_box(&x), 1, &mut y);
                        black_box(&y);
                    },
                );
            }
        }
    }

    // Baselines on two shapes: dense f32 weights (dequantized at load) with matrixmultiply's
    // sgemv, and a naive per-call scalar dequantization followed by that sgemv. Both are
    // single-threaded (matrixmultiply without its threading feature); their "per CPU time"
    // column is per one thread and their "%" columns compare against the {threads}-thread probe.
    for &(name, cols, rows) in [SHAPES[1], SHAPES[6]].iter() {
        if !wanted(&format!("baseline {name}")) {
            continue;
        }
        let w = random_matrix(rows, cols, 4, 32, 77);
        let dense = w.dequantize_f32();
        let x: Vec<f32> = (0..cols)
            .map(|j| ((j * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let mut y = vec![0f32; rows];
        let dense_bytes = dense.len() * 4;
        let copies = rotation_bytes.div_ceil(dense_bytes).max(1);
        let denses: Vec<Vec<f32>> = (0..copies).map(|_| dense.clone()).collect();
        bench_rotating(
            &mut bench,
            1,
            "baseline",
            format!("baseline f32 dense sgemv {name} {cols}->{rows}"),
            dense_bytes,
            copies,
            |k| {
                sgemv(&denses[k], rows, cols, black_box(&x), &mut y);
                black_box(&y);
            },
        );
        let mut scratch = vec![0f32; rows * cols];
        bench_rotating(
            &mut bench,
            1,
            "baseline",
            format!("baseline naive q4 dequant+sgemv {name} {cols}->{rows}"),
            w.weight_bytes(),
            1,
            |_| {
                for r in 0..rows {
                    w.dequantize_row_f32(r, &mut scratch[r * cols..(r + 1) * cols]);
                }
                sgemv(&scratch, rows, cols, black_box(&x), &mut y);
                black_box(&y);
            },
        );
    }

    bench.c.final_summary();
    print_table(threads, bandwidth);
}

/// `y = W x` with matrixmultiply (W row-major `[rows, cols]`).
fn sgemv(w: &[f32], rows: usize, cols: usize, x: &[f32], y: &mut [f32]) {
    // SAFETY: w holds rows * cols floats, x holds cols, y holds rows; strides describe them.
    unsafe {
        matrixmultiply::sgemm(
            rows,
            cols,
            1,
            1.0,
            w.as_ptr(),
            cols as isize,
            1,
            x.as_ptr(),
            1,
            1,
            0.0,
            y.as_mut_ptr(),
            1,
            1,
        );
    }
}

fn print_table(threads: usize, (bw_wall, bw_cpu): (f64, f64)) {
    println!(
        "\n| case ({threads} threads) | weight MB | µs/call | GB/s (mean) | GB/s (fastest sample) \
         | read BW beside it | % of it (mean / fastest) | GB/s per CPU time | % of read BW per CPU \
         time ({bw_cpu:.1} GB/s) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in RESULTS.lock().unwrap().iter() {
        let gbps = r.weight_bytes as f64 / r.seconds_per_call / 1e9;
        let fastest_gbps = r.weight_bytes as f64 / r.fastest_seconds_per_call / 1e9;
        let cpu_gbps = r.weight_bytes as f64 / (r.cpu_seconds_per_call / r.threads as f64) / 1e9;
        println!(
            "| {} | {:.2} | {:.1} | {:.2} | {:.2} | {:.1} | {:.0}% / {:.0}% | {:.2} | {:.0}% |",
            r.case,
            r.weight_bytes as f64 / 1e6,
            r.seconds_per_call * 1e6,
            gbps,
            fastest_gbps,
            r.probe_gbps,
            100.0 * gbps / r.probe_gbps,
            100.0 * fastest_gbps / r.probe_gbps,
            cpu_gbps,
            100.0 * cpu_gbps / bw_cpu
        );
    }
    println!("\nread bandwidth at the start: {bw_wall:.1} GB/s wall (best of 8 passes)");
}
