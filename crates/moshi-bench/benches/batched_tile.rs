//! Where a batched 4-bit product's time goes (issue #20): the kernel's cycles per (weight row,
//! activation row, 128-column block) at 1 and 4 activation rows, with the weights cached and
//! streamed from DRAM, against the floor the core's execution ports allow.
//!
//! 1. **The core** (x86-64 with AVX-512 VNNI): the clock from a chain of dependent adds; the rate
//!    of independent `vpdpbusd`, of `vfmadd231ps`, and of the two mixed 3:1 (if the mix runs at
//!    the rate of either alone, they share ports); the latency of `vpdpbusd`; and the rate of the
//!    batched tile's whole instruction mix at 16-bit activations, on registers. The VNNI kernel
//!    needs 6 `vpdpbusd` and one `vfmadd231ps` per (weight row, activation row) pair and block of
//!    128 columns (3 activation digits x 2 nibble planes, then the group factor), so the floor per
//!    pair-block is 7 instructions at their shared rate. On x86-64 with AVX2 and FMA only (where
//!    the f32 lane kernel of `quant::avx2` runs): the rate of `vfmadd231ps` and `vcvtdq2ps` on ymm
//!    registers, and of the batched tile's own mix (2 weight rows x 4 activation rows: per code
//!    position 2 ANDs, 2 converts and 8 FMAs). That kernel needs 16 FMAs (one per 8 columns) and 2
//!    group-scale FMAs per pair and 128 columns, its decode shared by the 4 activation rows, so the
//!    floor per pair-block is 18 FMAs at the mix's rate; and the machine's f32 rate is 16 FLOP per
//!    FMA at that rate and clock, per core.
//! 2. **The product**: `QuantizedMatrix::matmul` (q4, group 32, the detected kernel), and where
//!    this CPU's kernel reads them the same matrices as `QuantPanels` (the engine's layout on
//!    AVX-512 VNNI), at three of
//!    the 7B's shapes (1024, 4096 and 11264 columns: at 1024, 4 arranged activation rows take 16
//!    KiB and fit in L1; at the others they do not), 1 and 4 activation rows, on one thread and on
//!    every thread, with the weights cached (one matrix, 1.7, 9 or 26 MB: in a last-level cache of
//!    32 MB, as on the development VMs) and streamed (copies rotated over 1 GiB, as a model streams its
//!    weights). The cases alternate round by round; the table gives medians over the rounds, in
//!    cycles per pair-block and core (wall time x threads x clock / pair-blocks).
//!
//! `cargo bench -p moshi-bench --bench batched_tile` (about 2 minutes; `MOSHI_BENCH_ROUNDS`,
//! default 15; `MOSHI_BENCH_ACTIVATIONS=exact|i16|i8`, default exact, whose digits set the floor;
//! `MOSHI_BENCH_ROWS`, the batched case's activation rows, default 4; `MOSHI_BENCH_SHAPES=stt-1b`
//! for the speech-to-text 1B's four temporal shapes instead of the 7B's three).

use std::hint::black_box;
use std::time::Instant;

use moshi_bench::alternating::medians_per_call;
use moshi_bench::env::var_or;
use moshi_bench::hashed_weights::hashed_q4;
use moshi_kernels::{ActivationPrecision, Kernel, QuantPanels, QuantizedMatrix};

/// Bytes of weights the streamed cases rotate over (well above the last-level cache).
const STREAM_BYTES: usize = 1 << 30;

/// Activation rows of the batched case by default (4 sessions).
const BATCH_ROWS: usize = 4;

/// (name, columns, rows) of the 7B's shapes measured by default.
const SHAPES_7B: [(&str, usize, usize); 3] = [
    ("dep in_proj", 1024, 3072),
    ("attn out_proj", 4096, 4096),
    ("gating out", 11264, 4096),
];

/// Columns per block of the 4-bit kernels (64 bytes of codes).
const BLOCK_COLS: usize = 128;

fn main() {
    let rounds: usize = var_or("MOSHI_BENCH_ROUNDS", 15);
    let batch_rows: usize = var_or("MOSHI_BENCH_ROWS", BATCH_ROWS);
    let activations: ActivationPrecision =
        var_or("MOSHI_BENCH_ACTIVATIONS", ActivationPrecision::Exact);
    moshi_kernels::set_activation_precision(activations);
    let shapes: Vec<(&str, usize, usize)> = match std::env::var("MOSHI_BENCH_SHAPES").as_deref() {
        Ok("stt-1b") => moshi_bench::shapes::STT_1B_MATVEC_SHAPES.to_vec(),
        _ => SHAPES_7B.to_vec(),
    };
    println!(
        "activations: {}, batched rows: {batch_rows}",
        activations.name()
    );
    let clock_ns = core_probe(activations);
    let threads_all = moshi_kernels::team::threads();
    println!(
        "\n| shape | weights | layout | threads | rows | ms per product | cycles per pair-block and \
         core | x 1 row |\n|---|---|---|---|---|---|---|---|"
    );
    for (name, cols, out) in shapes {
        let one = vec![hashed_q4(out, cols, 0x5eed + cols as u64)];
        let copies = STREAM_BYTES.div_ceil(one[0].codes().len() * 4);
        let streamed: Vec<QuantizedMatrix> = (0..copies).map(|_| one[0].clone()).collect();
        for (memory, mats) in [("one copy (cached)", &one), ("streamed", &streamed)] {
            let panels: Vec<QuantPanels> = mats
                .iter()
                .filter_map(|w| QuantPanels::from_matrix(w.clone(), Kernel::detect()).ok())
                .collect();
            for threads in [1, threads_all] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .expect("a rayon pool");
                let per_call = pool.install(|| time_alternating(mats, &panels, batch_rows, rounds));
                let cases = [
                    ("rows", 1, per_call[0], per_call[0]),
                    ("rows", batch_rows, per_call[1], per_call[0]),
                    ("panels", 1, per_call[2], per_call[2]),
                    ("panels", batch_rows, per_call[3], per_call[2]),
                ];
                let measured = if panels.is_empty() { 2 } else { 4 };
                for (layout, m, seconds, one_row) in &cases[..measured] {
                    let w = &mats[0];
                    let pair_blocks = (w.rows() * w.cols() / BLOCK_COLS * m) as f64;
                    let cycles = seconds * 1e9 * threads as f64 / clock_ns / pair_blocks;
                    println!(
                        "| {name} {cols}->{} | {memory} | {layout} | {threads} | {m} | {:.3} | \
                         {cycles:.2} | {:.2} |",
                        w.rows(),
                        seconds * 1e3,
                        seconds / one_row,
                    );
                }
            }
        }
    }
}

/// Median seconds per product over `rounds`, for 1 and `batch_rows` activation rows on the row
/// layout, then on the panels (zero where there are none), the four alternating within each
/// round; each round runs every matrix once per case (at least 64 products).
fn time_alternating(
    mats: &[QuantizedMatrix],
    panels: &[QuantPanels],
    batch_rows: usize,
    rounds: usize,
) -> [f64; 4] {
    let (rows, cols) = (mats[0].rows(), mats[0].cols());
    let row_counts = [1, batch_rows, 1, batch_rows];
    let xs = row_counts.map(|m| {
        (0..m * cols)
            .map(|j| ((j * 7919 % 1000) as f32 - 500.0) * 1e-3)
            .collect::<Vec<f32>>()
    });
    let mut ys = row_counts.map(|m| vec![0f32; m * rows]);
    let calls = mats.len().max(64);
    medians_per_call(rounds, calls, |k, call| {
        let (x, m, y) = (black_box(&xs[k]), row_counts[k], &mut ys[k]);
        match (k, panels.is_empty()) {
            (0 | 1, _) => mats[call % mats.len()].matmul(x, m, y),
            (_, false) => panels[call % panels.len()].matmul(x, m, y),
            (_, true) => {}
        }
        black_box(&ys[k]);
    })
}

/// Prints the core's clock and port figures (x86-64 with AVX-512 VNNI, or with AVX2 and FMA) and
/// returns ns per cycle; elsewhere prints that the port figures need one of those and returns the
/// clock alone. The VNNI tile's floor counts the `vpdpbusd` of `activations`' digits.
fn core_probe(activations: ActivationPrecision) -> f64 {
    let clock_ns = best_ns_per_iteration(add_chain) / ADDS_PER_ITERATION;
    println!("core clock: {:.2} GHz (dependent adds)", 1.0 / clock_ns);
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vnni") {
        // SAFETY (all): the CPU has AVX-512F and VNNI (checked above).
        let cycles = |f, per| unsafe { cycles_per_instruction(f, per, clock_ns) };
        let dp = cycles(ports::vpdpbusd_12, 12.0);
        let fma = cycles(ports::fma_12, 12.0);
        let mixed = cycles(ports::vpdpbusd_12_fma_4, 16.0);
        let latency = cycles(ports::vpdpbusd_chain_4, 4.0);
        println!(
            "vpdpbusd zmm: {:.2} per cycle, latency {latency:.1} cycles; vfmadd231ps zmm: {:.2} per \
             cycle; the two mixed 3:1: {:.2} per cycle ({})",
            1.0 / dp,
            1.0 / fma,
            1.0 / mixed,
            if mixed > 0.8 * dp.min(fma) { "shared ports" } else { "separate ports" },
        );
        let dot_products = 2.0 * digits_of(activations);
        let floor = if mixed > 0.8 * dp.min(fma) {
            (dot_products + 1.0) * mixed
        } else {
            (dot_products * dp).max(fma)
        };
        println!(
            "floor of the VNNI tile: {dot_products} vpdpbusd + 1 vfmadd231ps per pair-block = \
             {floor:.2} cycles"
        );
        let permutes = cycles(ports::vpdpbusd_8_vpermps_8, 8.0);
        let tests = cycles(ports::vpdpbusd_8_vptestmd_8, 8.0);
        println!(
            "beside each vpdpbusd, a vpermps: {permutes:.2} cycles per pair of them; a vptestmd: \
             {tests:.2}"
        );
        let mix = cycles(ports::tile_mix_i16, 2.0);
        println!(
            "the 2 x 4 tile's instruction mix at 16-bit activations (registers only): {mix:.2} \
             cycles per pair-block, {:.2}x its 4 vpdpbusd + 1 vfmadd231ps",
            mix / (5.0 * mixed)
        );
        return clock_ns;
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY (all): the CPU has AVX2 and FMA (checked above).
        let cycles = |f, per| unsafe { cycles_per_instruction(f, per, clock_ns) };
        let fma = cycles(ymm_ports::fma_12, 12.0);
        let cvt = cycles(ymm_ports::cvt_12, 12.0);
        let mix_fma = cycles(ymm_ports::lane_tile_mix, 8.0);
        println!(
            "vfmadd231ps ymm: {:.2} per cycle; vcvtdq2ps ymm: {:.2} per cycle; the AVX2 tile's mix \
             (2 vpand + 2 vcvtdq2ps + 8 vfmadd231ps): {:.2} FMAs per cycle",
            1.0 / fma,
            1.0 / cvt,
            1.0 / mix_fma,
        );
        println!(
            "floor of the AVX2 lane tile (2 x 4 rows): 18 FMAs per pair-block = {:.2} cycles; \
             f32 peak {:.0} GFLOP/s per core ({:.0} with the tile's decode)",
            18.0 * mix_fma,
            16.0 / fma / clock_ns,
            16.0 / mix_fma / clock_ns,
        );
        return clock_ns;
    }
    println!("(the port figures need x86-64 with AVX-512 VNNI, or AVX2 and FMA)");
    clock_ns
}

/// Signed 8-bit digits per activation the integer kernels hold at `activations`.
#[cfg(target_arch = "x86_64")]
fn digits_of(activations: ActivationPrecision) -> f64 {
    match activations {
        ActivationPrecision::Exact => 3.0,
        ActivationPrecision::Int16 => 2.0,
        ActivationPrecision::Int8 => 1.0,
    }
}

/// Cycles per instruction of the timed loop `f`, which runs `per` of them per iteration.
///
/// # Safety
/// The CPU must have the features `f` is compiled with.
#[cfg(target_arch = "x86_64")]
unsafe fn cycles_per_instruction(f: unsafe fn(u64), per: f64, clock_ns: f64) -> f64 {
    // SAFETY: forwarded contract.
    best_ns_per_iteration(|n| unsafe { f(n) }) / per / clock_ns
}

/// Iterations of each timed loop.
const ITERATIONS: u64 = 20_000_000;

/// Dependent adds per iteration of [`add_chain`].
const ADDS_PER_ITERATION: f64 = 4.0;

/// Best of 5 runs of `f(ITERATIONS)`, in ns per iteration.
fn best_ns_per_iteration(f: impl Fn(u64)) -> f64 {
    f(ITERATIONS / 10);
    (0..5)
        .map(|_| {
            let start = Instant::now();
            f(ITERATIONS);
            start.elapsed().as_secs_f64() * 1e9 / ITERATIONS as f64
        })
        .fold(f64::MAX, f64::min)
}

/// `n` iterations of 4 dependent integer adds (one cycle each on every current core).
fn add_chain(n: u64) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: registers only.
    unsafe {
        std::arch::asm!(
            "2:", "add {x}, 1", "add {x}, 1", "add {x}, 1", "add {x}, 1", "dec {n}", "jnz 2b",
            n = inout(reg) n => _, x = out(reg) _, options(nostack, nomem),
        );
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: registers only.
    unsafe {
        std::arch::asm!(
            "mov {x}, 0", "2:", "add {x}, {x}, 1", "add {x}, {x}, 1", "add {x}, {x}, 1",
            "add {x}, {x}, 1", "subs {n}, {n}, 1", "b.ne 2b",
            n = inout(reg) n => _, x = out(reg) _, options(nostack, nomem),
        );
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    compile_error!("batched_tile's clock probe is written for x86-64 and aarch64");
}

/// Defines `pub unsafe fn $name(n: u64)`: `n` iterations of the given instructions on registers
/// only (no memory operands), compiled with `$features`, after the `$setup` lines; every register
/// in `$regs` is declared clobbered.
#[cfg(target_arch = "x86_64")]
macro_rules! timed_loop {
    ($features:literal, [$($setup:literal),*], [$($reg:tt),*], $name:ident, $($line:literal),+) => {
        /// `n` iterations of the instructions in the name (see the module docs).
        ///
        /// # Safety
        /// The CPU must have the features the function is compiled with.
        #[target_feature(enable = $features)]
        pub unsafe fn $name(n: u64) {
            // SAFETY: registers only; every register written is declared clobbered.
            unsafe {
                std::arch::asm!(
                    $($setup,)*
                    "2:",
                    $($line,)+
                    "dec {n}",
                    "jnz 2b",
                    n = inout(reg) n => _,
                    $(out($reg) _,)*
                    options(nostack, nomem),
                );
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod ports {
    //! Timed loops of AVX-512 instructions on registers only (no memory operands).

    macro_rules! zmm_loop {
        ($name:ident, $($line:literal),+) => {
            timed_loop!(
                "avx512f,avx512vnni",
                ["vpxord zmm20, zmm20, zmm20", "vpxord zmm21, zmm21, zmm21"],
                ["zmm0", "zmm1", "zmm2", "zmm3", "zmm4", "zmm5", "zmm6", "zmm7", "zmm8", "zmm9",
                 "zmm10", "zmm11", "zmm12", "zmm13", "zmm14", "zmm15", "zmm20", "zmm21", "k1", "k2", "k3", "k4"],
                $name,
                $($line),+
            );
        };
    }

    zmm_loop!(
        vpdpbusd_12,
        "vpdpbusd zmm0, zmm20, zmm21",
        "vpdpbusd zmm1, zmm20, zmm21",
        "vpdpbusd zmm2, zmm20, zmm21",
        "vpdpbusd zmm3, zmm20, zmm21",
        "vpdpbusd zmm4, zmm20, zmm21",
        "vpdpbusd zmm5, zmm20, zmm21",
        "vpdpbusd zmm6, zmm20, zmm21",
        "vpdpbusd zmm7, zmm20, zmm21",
        "vpdpbusd zmm8, zmm20, zmm21",
        "vpdpbusd zmm9, zmm20, zmm21",
        "vpdpbusd zmm10, zmm20, zmm21",
        "vpdpbusd zmm11, zmm20, zmm21"
    );
    zmm_loop!(
        fma_12,
        "vfmadd231ps zmm0, zmm20, zmm21",
        "vfmadd231ps zmm1, zmm20, zmm21",
        "vfmadd231ps zmm2, zmm20, zmm21",
        "vfmadd231ps zmm3, zmm20, zmm21",
        "vfmadd231ps zmm4, zmm20, zmm21",
        "vfmadd231ps zmm5, zmm20, zmm21",
        "vfmadd231ps zmm6, zmm20, zmm21",
        "vfmadd231ps zmm7, zmm20, zmm21",
        "vfmadd231ps zmm8, zmm20, zmm21",
        "vfmadd231ps zmm9, zmm20, zmm21",
        "vfmadd231ps zmm10, zmm20, zmm21",
        "vfmadd231ps zmm11, zmm20, zmm21"
    );
    zmm_loop!(
        vpdpbusd_12_fma_4,
        "vpdpbusd zmm0, zmm20, zmm21",
        "vpdpbusd zmm1, zmm20, zmm21",
        "vpdpbusd zmm2, zmm20, zmm21",
        "vfmadd231ps zmm12, zmm20, zmm21",
        "vpdpbusd zmm3, zmm20, zmm21",
        "vpdpbusd zmm4, zmm20, zmm21",
        "vpdpbusd zmm5, zmm20, zmm21",
        "vfmadd231ps zmm13, zmm20, zmm21",
        "vpdpbusd zmm6, zmm20, zmm21",
        "vpdpbusd zmm7, zmm20, zmm21",
        "vpdpbusd zmm8, zmm20, zmm21",
        "vfmadd231ps zmm14, zmm20, zmm21",
        "vpdpbusd zmm9, zmm20, zmm21",
        "vpdpbusd zmm10, zmm20, zmm21",
        "vpdpbusd zmm11, zmm20, zmm21",
        "vfmadd231ps zmm15, zmm20, zmm21"
    );
    // The 2 x 4 tile's block at 16-bit activations, per 2 of its 8 pairs: 8 `vpdpbusd`, the 2
    // factor FMAs, and beside them the 2 conversions, 2 factor permutations, 2 digit shifts and 2
    // nibble ANDs (the code shifts and ANDs of the whole block, rounded up).
    zmm_loop!(
        tile_mix_i16,
        "vpdpbusd zmm0, zmm20, zmm21",
        "vpdpbusd zmm1, zmm20, zmm21",
        "vcvtdq2ps zmm8, zmm20",
        "vpdpbusd zmm2, zmm20, zmm21",
        "vpermps zmm9, zmm20, zmm21",
        "vpdpbusd zmm3, zmm20, zmm21",
        "vpslld zmm10, zmm20, 8",
        "vfmadd231ps zmm12, zmm20, zmm21",
        "vpdpbusd zmm4, zmm20, zmm21",
        "vpandq zmm11, zmm20, zmm21",
        "vpdpbusd zmm5, zmm20, zmm21",
        "vcvtdq2ps zmm8, zmm21",
        "vpdpbusd zmm6, zmm20, zmm21",
        "vpermps zmm9, zmm21, zmm20",
        "vpdpbusd zmm7, zmm20, zmm21",
        "vpslld zmm10, zmm21, 8",
        "vpandq zmm11, zmm21, zmm20",
        "vfmadd231ps zmm13, zmm20, zmm21"
    );
    // 8 `vpdpbusd` with 8 `vpermps`, then with 8 `vptestmd`, beside them: what the other
    // instructions a tile might use cost when there are as many of them as products.
    zmm_loop!(
        vpdpbusd_8_vpermps_8,
        "vpdpbusd zmm0, zmm20, zmm21",
        "vpermps zmm8, zmm20, zmm21",
        "vpdpbusd zmm1, zmm20, zmm21",
        "vpermps zmm9, zmm21, zmm20",
        "vpdpbusd zmm2, zmm20, zmm21",
        "vpermps zmm10, zmm20, zmm21",
        "vpdpbusd zmm3, zmm20, zmm21",
        "vpermps zmm11, zmm21, zmm20",
        "vpdpbusd zmm4, zmm20, zmm21",
        "vpermps zmm12, zmm20, zmm21",
        "vpdpbusd zmm5, zmm20, zmm21",
        "vpermps zmm13, zmm21, zmm20",
        "vpdpbusd zmm6, zmm20, zmm21",
        "vpermps zmm14, zmm20, zmm21",
        "vpdpbusd zmm7, zmm20, zmm21",
        "vpermps zmm15, zmm21, zmm20"
    );
    zmm_loop!(
        vpdpbusd_8_vptestmd_8,
        "vpdpbusd zmm0, zmm20, zmm21",
        "vptestmd k1, zmm20, zmm20",
        "vpdpbusd zmm1, zmm20, zmm21",
        "vptestmd k2, zmm21, zmm21",
        "vpdpbusd zmm2, zmm20, zmm21",
        "vptestmd k3, zmm20, zmm20",
        "vpdpbusd zmm3, zmm20, zmm21",
        "vptestmd k4, zmm21, zmm21",
        "vpdpbusd zmm4, zmm20, zmm21",
        "vptestmd k1, zmm20, zmm20",
        "vpdpbusd zmm5, zmm20, zmm21",
        "vptestmd k2, zmm21, zmm21",
        "vpdpbusd zmm6, zmm20, zmm21",
        "vptestmd k3, zmm20, zmm20",
        "vpdpbusd zmm7, zmm20, zmm21",
        "vptestmd k4, zmm21, zmm21"
    );
    zmm_loop!(
        vpdpbusd_chain_4,
        "vpdpbusd zmm0, zmm20, zmm21",
        "vpdpbusd zmm0, zmm20, zmm21",
        "vpdpbusd zmm0, zmm20, zmm21",
        "vpdpbusd zmm0, zmm20, zmm21"
    );
}

#[cfg(target_arch = "x86_64")]
mod ymm_ports {
    //! Timed loops of AVX2 and FMA instructions on registers only (no memory operands).

    macro_rules! ymm_loop {
        ($name:ident, $($line:literal),+) => {
            timed_loop!(
                "avx2,fma",
                ["vpxor ymm14, ymm14, ymm14", "vpxor ymm15, ymm15, ymm15"],
                ["ymm0", "ymm1", "ymm2", "ymm3", "ymm4", "ymm5", "ymm6", "ymm7", "ymm8", "ymm9",
                 "ymm10", "ymm11", "ymm12", "ymm13", "ymm14", "ymm15"],
                $name,
                $($line),+
            );
        };
    }

    ymm_loop!(
        fma_12,
        "vfmadd231ps ymm0, ymm14, ymm15",
        "vfmadd231ps ymm1, ymm14, ymm15",
        "vfmadd231ps ymm2, ymm14, ymm15",
        "vfmadd231ps ymm3, ymm14, ymm15",
        "vfmadd231ps ymm4, ymm14, ymm15",
        "vfmadd231ps ymm5, ymm14, ymm15",
        "vfmadd231ps ymm6, ymm14, ymm15",
        "vfmadd231ps ymm7, ymm14, ymm15",
        "vfmadd231ps ymm8, ymm14, ymm15",
        "vfmadd231ps ymm9, ymm14, ymm15",
        "vfmadd231ps ymm10, ymm14, ymm15",
        "vfmadd231ps ymm11, ymm14, ymm15"
    );
    ymm_loop!(
        cvt_12,
        "vcvtdq2ps ymm0, ymm14",
        "vcvtdq2ps ymm1, ymm14",
        "vcvtdq2ps ymm2, ymm14",
        "vcvtdq2ps ymm3, ymm14",
        "vcvtdq2ps ymm4, ymm14",
        "vcvtdq2ps ymm5, ymm14",
        "vcvtdq2ps ymm6, ymm14",
        "vcvtdq2ps ymm7, ymm14",
        "vcvtdq2ps ymm8, ymm14",
        "vcvtdq2ps ymm9, ymm14",
        "vcvtdq2ps ymm10, ymm14",
        "vcvtdq2ps ymm11, ymm14"
    );
    ymm_loop!(
        lane_tile_mix,
        "vpand ymm12, ymm14, ymm15",
        "vcvtdq2ps ymm12, ymm12",
        "vpand ymm13, ymm15, ymm14",
        "vcvtdq2ps ymm13, ymm13",
        "vfmadd231ps ymm0, ymm12, ymm14",
        "vfmadd231ps ymm1, ymm12, ymm15",
        "vfmadd231ps ymm2, ymm12, ymm14",
        "vfmadd231ps ymm3, ymm12, ymm15",
        "vfmadd231ps ymm4, ymm13, ymm14",
        "vfmadd231ps ymm5, ymm13, ymm15",
        "vfmadd231ps ymm6, ymm13, ymm14",
        "vfmadd231ps ymm7, ymm13, ymm15"
    );
}
