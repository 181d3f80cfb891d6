//! Peer benchmark: moshi-kernels's quantized products against ggml's CPU backend (llama.cpp's
//! kernels) at Moshi 7B's temporal shapes and the speech-to-text 1B's, M = 1 to 16 activation
//! rows, interleaved in one process so that both meet the same memory bandwidth.
//!
//! As in `scripts/peer-candle`, each round times one pass of every contestant back to back (the
//! order rotating from round to round), each pass rotating over ≥ `--rotation-mib` of copies of
//! its matrix so the weights stream from DRAM; the per-round ratio cancels the host's drift.
//! Contestants: ggml's `q4_0`, `q4_0x8` (`q4_0` in the CPU_REPACK buffer type, interleaved for
//! its gemv/gemm kernels, as llama.cpp loads weights), `q4_K`, `q4_Kx8` and `q8_0`, each against
//! its moshi-kernels partner (MLX q4 group 32, Kyutai's 5 bits per weight, for the `q4_0`s; q4
//! group 64, 4.5 bits like `q4_0` and `q4_K`, for the `q4_K`s; q8 group 64 for `q8_0`) with exact
//! and with 8-bit activations, ours held as the engine holds them (4-bit and 8-bit codes in
//! `QuantPanels` where the kernel is `avx512vnni`, "panels" in the tables). ggml rounds its
//! activations to 8 bits (`q8_0`/`q8_K`) inside `mul_mat`, so `int8` is like for like. The run
//! prints the layout CPU_REPACK chose (from ggml's log), the evidence that the repacked kernels
//! are the ones timed.
//! Both sides quantize the same hashed matrix; before timing, every output at every M is checked
//! against the contestant's own dequantized weights in f64 and the error printed.
//!
//! ggml runs on its own persistent thread pool (no OpenMP), paused after each of its passes so
//! that its workers do not poll while moshi-kernels's team runs; the team parks within 40 µs.
//!
//! `cd scripts/peer-ggml && GGML_SRC=.. GGML_DIR=.. cargo run --release -- [--threads 2]
//! [--rounds 7] [--rotation-mib 256] [--formats q4_0,q4_0x8,q4_K,q4_Kx8,q8_0]
//! [--shapes <substring>] [--rows 1,2,4,8,16]`
//!
//! `... cargo run --release -- step [--layers 8] [--steps 5] [--rounds 7] [--kv-positions 64]
//! [--formats q4_0,q4_0x8,q4_K,q4_Kx8]`: the whole decode step instead (src/step.rs).

mod contest;
mod ggml;
mod step;

use moshi_bench::shapes::{LARGE_SHAPES, MOSHI_7B_MATVEC_SHAPES, STT_1B_MATVEC_SHAPES};
use moshi_kernels::Kernel;

use contest::{run_shape, Options, Runners, Summary};

/// ggml contestants and their moshi-kernels partner: (ggml name, ggml type, repacked, bits,
/// group size).
pub const FORMATS: &[(&str, &str, bool, u32, usize)] = &[
    ("q4_0", "q4_0", false, 4, 32),
    ("q4_0x8", "q4_0", true, 4, 32),
    ("q4_K", "q4_K", false, 4, 64),
    ("q4_Kx8", "q4_K", true, 4, 64),
    ("q8_0", "q8_0", false, 8, 64),
];

fn parse_options() -> Result<Options, String> {
    let mut options = Options {
        threads: 2,
        rounds: 7,
        rotation_bytes: 256 << 20,
        formats: FORMATS.iter().map(|f| f.0.to_owned()).collect(),
        shapes: String::new(),
        rows: vec![1, 2, 4, 8, 16],
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let number = |text: &str| {
            text.parse::<usize>()
                .map_err(|e| format!("{flag} {text}: {e} (expected a positive integer)"))
        };
        match flag.as_str() {
            "--threads" => options.threads = number(&value)?.max(1),
            "--rounds" => options.rounds = number(&value)?.max(1),
            "--rotation-mib" => options.rotation_bytes = number(&value)? << 20,
            "--formats" => options.formats = value.split(',').map(str::to_owned).collect(),
            "--shapes" => options.shapes = value,
            "--rows" => {
                options.rows = value.split(',').map(number).collect::<Result<_, _>>()?;
                if options.rows.contains(&0) {
                    return Err(format!(
                        "--rows {value}: every row count must be at least 1"
                    ));
                }
            }
            _ => {
                return Err(format!(
                    "unknown option {flag} (see the header of src/main.rs)"
                ))
            }
        }
    }
    let known: Vec<&str> = FORMATS.iter().map(|f| f.0).collect();
    check_formats(&options.formats, &known)?;
    Ok(options)
}

/// An error naming the first of `formats` that is not one of `known`.
pub fn check_formats(formats: &[String], known: &[&str]) -> Result<(), String> {
    match formats.iter().find(|f| !known.contains(&f.as_str())) {
        Some(format) => Err(format!(
            "--formats: unknown {format} (expected some of {known:?})"
        )),
        None => Ok(()),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("step") {
        let options = step::parse(&args[1..])?;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(options.flags.threads)
            .build()?;
        let runtime = ggml::Runtime::new(options.flags.threads)?;
        return step::run(&options, &pool, &runtime);
    }
    let options = parse_options()?;
    let shapes: Vec<(&str, usize, usize)> = MOSHI_7B_MATVEC_SHAPES[..LARGE_SHAPES]
        .iter()
        .chain(&STT_1B_MATVEC_SHAPES)
        .copied()
        .collect();
    if !shapes.iter().any(|s| s.0.contains(&options.shapes)) {
        let names: Vec<&str> = shapes.iter().map(|s| s.0).collect();
        return Err(format!("--shapes {}: matches none of {names:?}", options.shapes).into());
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(options.threads)
        .build()?;
    let runtime = ggml::Runtime::new(options.threads)?;
    let kernel = Kernel::detect();
    println!(
        "moshi-kernels kernel {}; {} threads on both sides; {} rounds; rotation {} MiB; M = {:?}",
        kernel.name(),
        options.threads,
        options.rounds,
        options.rotation_bytes >> 20,
        options.rows
    );
    println!("rate: GB/s of weights at M = 1, GFLOP/s (2·M·rows·cols) above; ratio: ours / ggml time, < 1 is ours faster");
    println!();
    println!("| shape | M | ggml | ggml µs (rate) | ours | exact µs (rate) | exact / ggml: median [range] | won | int8 µs (rate) | int8 / ggml: median [range] | won | rel. error ggml / exact / int8 |");
    println!("|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---|");
    let runners = Runners {
        pool: &pool,
        runtime: &runtime,
        kernel,
    };
    let mut summary = Summary::default();
    let mut buffer_types = Vec::new();
    for (index, &(name, cols, rows)) in shapes.iter().enumerate() {
        if name.contains(&options.shapes) {
            let types = run_shape(&options, &runners, (name, cols, rows), index, &mut summary)?;
            if buffer_types.is_empty() {
                buffer_types = types;
            }
        }
    }
    println!();
    println!("ggml weight buffer types: {}", buffer_types.join(", "));
    println!();
    summary.print();
    Ok(())
}
