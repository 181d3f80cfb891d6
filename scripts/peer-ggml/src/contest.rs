//! One shape's contest: both sides' matrices and rotation copies, the f64 check of every output,
//! the interleaved rounds and the table rows; and the summary over shapes.

use std::time::Instant;

use moshi_bench::bandwidth::ReadBuffer;
use moshi_bench::hashed_weights::hashed_f32;
use moshi_bench::summary::{median, range};
use moshi_kernels::{ActivationPrecision, Kernel, KernelMatrix, QuantizedMatrix};
use rayon::prelude::*;
use rayon::ThreadPool;

use crate::ggml::{GgmlType, Matrix, Runtime};
use crate::FORMATS;

pub struct Options {
    pub threads: usize,
    pub rounds: usize,
    pub rotation_bytes: usize,
    pub formats: Vec<String>,
    pub shapes: String,
    pub rows: Vec<usize>,
}

type Error = Box<dyn std::error::Error>;

/// The two sides' threads and moshi-kernels's kernel, the same for every shape.
pub struct Runners<'a> {
    /// moshi-kernels's team takes at most this pool's thread count.
    pub pool: &'a ThreadPool,
    /// ggml's backend and its own pool of as many threads.
    pub runtime: &'a Runtime,
    pub kernel: Kernel,
}

/// `[rows][max_m]` products of a dequantized `[rows, cols]` matrix with the `max_m` activation
/// rows `x`, in f64.
fn reference_products(pool: &ThreadPool, dense: &[f32], x: &[f32], cols: usize) -> Vec<f64> {
    let max_m = x.len() / cols;
    let mut out = vec![0f64; dense.len() / cols * max_m];
    pool.install(|| {
        out.par_chunks_mut(max_m)
            .zip(dense.par_chunks(cols))
            .for_each(|(products, row)| {
                for (product, activations) in products.iter_mut().zip(x.chunks_exact(cols)) {
                    *product = row
                        .iter()
                        .zip(activations)
                        .map(|(&w, &v)| w as f64 * v as f64)
                        .sum();
                }
            })
    });
    out
}

/// Largest |y - reference| over the largest |reference| for `y[m, rows]`.
fn relative_error(y: &[f32], reference: &[f64], m: usize) -> f64 {
    let rows = y.len() / m;
    let max_m = reference.len() / rows;
    let (mut worst, mut largest) = (0f64, 0f64);
    for (i, &got) in y.iter().enumerate() {
        let exact = reference[(i % rows) * max_m + i / rows];
        worst = worst.max((got as f64 - exact).abs());
        largest = largest.max(exact.abs());
    }
    worst / largest
}

/// Seconds per product of one pass over `copies` (the pass's mean).
fn time_pass(
    copies: usize,
    mut product: impl FnMut(usize) -> Result<(), String>,
) -> Result<f64, String> {
    let start = Instant::now();
    for c in 0..copies {
        product(c)?;
    }
    Ok(start.elapsed().as_secs_f64() / copies as f64)
}

/// One moshi-kernels format: its rotation copies and the reference products of its weights.
struct MoshiSide {
    bits: u32,
    group_size: usize,
    copies: Vec<KernelMatrix>,
    reference: Vec<f64>,
}

/// One ggml contestant, its moshi-kernels partner (index into the `MoshiSide`s) and the reference
/// products of its weights (index into the ggml references).
struct GgmlSide<'a> {
    name: &'static str,
    matrix: Matrix<'a>,
    copies: usize,
    bytes: usize,
    partner: usize,
    reference: usize,
}

/// Who runs a timed pass.
#[derive(Clone, Copy)]
enum Contestant {
    Moshi(usize, ActivationPrecision),
    Ggml(usize),
}

fn rotation_copies(options: &Options, bytes: usize) -> usize {
    (options.rotation_bytes / bytes).max(2)
}

fn moshi_sides(
    options: &Options,
    pool: &ThreadPool,
    dense: &[f32],
    x: &[f32],
    (rows, cols): (usize, usize),
) -> Result<Vec<MoshiSide>, Error> {
    let mut sides: Vec<MoshiSide> = Vec::new();
    for &(name, _, _, bits, group_size) in FORMATS {
        let wanted = options.formats.iter().any(|f| f == name);
        if !wanted
            || sides
                .iter()
                .any(|s| (s.bits, s.group_size) == (bits, group_size))
        {
            continue;
        }
        let matrix = QuantizedMatrix::quantize(dense, rows, cols, bits, group_size)?;
        let reference = reference_products(pool, &matrix.dequantize_f32(), x, cols);
        let matrix = KernelMatrix::for_kernel(matrix, Kernel::detect());
        let copies = vec![matrix.clone(); rotation_copies(options, matrix.weight_bytes())];
        sides.push(MoshiSide {
            bits,
            group_size,
            copies,
            reference,
        });
    }
    Ok(sides)
}

/// The ggml contestants, their quantized copies (repacked where asked) and the reference
/// products of each ggml type's weights.
#[allow(clippy::type_complexity)]
fn ggml_sides<'a>(
    options: &Options,
    pool: &ThreadPool,
    runtime: &'a Runtime,
    moshi: &[MoshiSide],
    (dense, x): (&[f32], &[f32]),
    (rows, cols): (usize, usize),
) -> Result<(Vec<GgmlSide<'a>>, Vec<Vec<f64>>), Error> {
    let (mut sides, mut references, mut quantized) =
        (Vec::new(), Vec::new(), Vec::<(&str, Vec<u8>)>::new());
    for &(name, type_name, repack, bits, group_size) in FORMATS {
        if !options.formats.iter().any(|f| f == name) {
            continue;
        }
        let ty = GgmlType::from_name(type_name)?;
        let reference = match quantized.iter().position(|(t, _)| *t == type_name) {
            Some(index) => index,
            None => {
                let blocks = ty.quantize(dense, rows, cols)?;
                references.push(reference_products(
                    pool,
                    &ty.dequantize(&blocks, rows, cols),
                    x,
                    cols,
                ));
                quantized.push((type_name, blocks));
                quantized.len() - 1
            }
        };
        let blocks = &quantized[reference].1;
        let copies = rotation_copies(options, blocks.len());
        let matrix = Matrix::new(runtime, ty, repack, (rows, cols), blocks, copies)?;
        let partner = moshi
            .iter()
            .position(|s| (s.bits, s.group_size) == (bits, group_size))
            .expect("moshi_sides makes every wanted format's partner");
        sides.push(GgmlSide {
            name,
            matrix,
            copies,
            bytes: blocks.len(),
            partner,
            reference,
        });
    }
    Ok((sides, references))
}

/// One pass of `who` at `m` rows: seconds per product.
fn pass(
    runners: &Runners,
    who: Contestant,
    moshi: &[MoshiSide],
    ggml: &[GgmlSide],
    x: &[f32],
    y: &mut [f32],
) -> Result<f64, String> {
    match who {
        Contestant::Moshi(side, precision) => {
            let copies = &moshi[side].copies;
            let (m, kernel) = (x.len() / copies[0].cols(), runners.kernel);
            runners.pool.install(|| {
                time_pass(copies.len(), |c| {
                    copies[c]
                        .matmul_with(kernel, precision, x, m, y)
                        .map_err(|e| e.to_string())?;
                    std::hint::black_box(&y);
                    Ok(())
                })
            })
        }
        Contestant::Ggml(side) => {
            let seconds = time_pass(ggml[side].copies, |c| ggml[side].matrix.compute(c));
            runners.runtime.pause();
            seconds
        }
    }
}

/// Checks every contestant's output at `m` rows against its own weights; returns the relative
/// errors of the ggml sides and of the moshi sides (exact, int8). Parks ggml's pool after.
fn check(
    runners: &Runners,
    moshi: &[MoshiSide],
    ggml: &[GgmlSide],
    references: &[Vec<f64>],
    x: &[f32],
    m: usize,
) -> Result<(Vec<f64>, Vec<[f64; 2]>), Error> {
    let mut ggml_errors = Vec::new();
    for side in ggml {
        side.matrix.compute(0)?;
        ggml_errors.push(relative_error(
            &side.matrix.output(0),
            &references[side.reference],
            m,
        ));
    }
    runners.runtime.pause();
    let mut moshi_errors = Vec::new();
    for side in moshi {
        let matrix = &side.copies[0];
        let mut errors = [0f64; 2];
        for (error, precision) in errors
            .iter_mut()
            .zip([ActivationPrecision::Exact, ActivationPrecision::Int8])
        {
            let mut y = vec![0f32; m * matrix.rows()];
            let kernel = runners.kernel;
            runners
                .pool
                .install(|| matrix.matmul_with(kernel, precision, x, m, &mut y))?;
            *error = relative_error(&y, &side.reference, m);
        }
        moshi_errors.push(errors);
    }
    Ok((ggml_errors, moshi_errors))
}

/// Per-pair medians over the shapes, printed as the closing table.
#[derive(Default)]
pub struct Summary {
    /// (ggml name, moshi format, M, exact ratio, int8 ratio)
    entries: Vec<(&'static str, String, usize, f64, f64)>,
}

impl Summary {
    pub fn print(&self) {
        println!("| ggml | ours | M | exact / ggml: median over shapes [range] | int8 / ggml: median over shapes [range] | shapes |");
        println!("|---|---|---:|---:|---:|---:|");
        let mut keys: Vec<(&str, &str, usize)> = Vec::new();
        for (name, ours, m, _, _) in &self.entries {
            if !keys.contains(&(name, ours, *m)) {
                keys.push((name, ours, *m));
            }
        }
        for (name, ours, m) in keys {
            let matching = || {
                self.entries
                    .iter()
                    .filter(move |e| (e.0, e.1.as_str(), e.2) == (name, ours, m))
            };
            let exact: Vec<f64> = matching().map(|e| e.3).collect();
            let int8: Vec<f64> = matching().map(|e| e.4).collect();
            let ((el, eh), (il, ih)) = (range(&exact), range(&int8));
            println!(
                "| {name} | {ours} | {m} | {:.2} [{el:.2}–{eh:.2}] | {:.2} [{il:.2}–{ih:.2}] | {} |",
                median(&exact),
                median(&int8),
                exact.len()
            );
        }
    }
}

fn rate(seconds: f64, bytes: usize, m: usize, (rows, cols): (usize, usize)) -> f64 {
    if m == 1 {
        bytes as f64 / seconds / 1e9
    } else {
        2.0 * (m * rows * cols) as f64 / seconds / 1e9
    }
}

/// Runs one shape at every M; prints its table rows, adds to `summary` and returns the ggml
/// contestants' weight buffer types.
pub fn run_shape(
    options: &Options,
    runners: &Runners,
    (name, cols, rows): (&str, usize, usize),
    index: usize,
    summary: &mut Summary,
) -> Result<Vec<String>, Error> {
    let max_m = options.rows.iter().copied().max().unwrap_or(1);
    let dense = hashed_f32(rows * cols, 0x5eed + index as u64);
    let x = hashed_f32(max_m * cols, 0xacc + index as u64);
    let moshi = moshi_sides(options, runners.pool, &dense, &x, (rows, cols))?;
    let (mut ggml, references) = ggml_sides(
        options,
        runners.pool,
        runners.runtime,
        &moshi,
        (&dense, &x),
        (rows, cols),
    )?;
    drop(dense);
    let bandwidth = ReadBuffer::new(options.threads, 1 << 30)
        .map(|b| b.best_gbps(3))
        .unwrap_or(0.0);
    let mut contestants: Vec<Contestant> = Vec::new();
    for side in 0..moshi.len() {
        contestants.push(Contestant::Moshi(side, ActivationPrecision::Exact));
        contestants.push(Contestant::Moshi(side, ActivationPrecision::Int8));
    }
    contestants.extend((0..ggml.len()).map(Contestant::Ggml));
    let mut y = vec![0f32; max_m * rows];
    for &m in &options.rows {
        let x_m = &x[..m * cols];
        for side in &mut ggml {
            side.matrix.bind(x_m, m)?;
        }
        let (ggml_errors, moshi_errors) = check(runners, &moshi, &ggml, &references, x_m, m)?;
        // Round 0 is untimed: page-ins and the threads' first wake-up at this M.
        let mut seconds = vec![Vec::new(); contestants.len()];
        for round in 0..=options.rounds {
            for k in 0..contestants.len() {
                let who = (k + round) % contestants.len();
                let s = pass(
                    runners,
                    contestants[who],
                    &moshi,
                    &ggml,
                    x_m,
                    &mut y[..m * rows],
                )?;
                if round > 0 {
                    seconds[who].push(s);
                }
            }
        }
        let moshi_index = |side: usize, precision: usize| 2 * side + precision;
        for (g, side) in ggml.iter().enumerate() {
            let theirs = &seconds[2 * moshi.len() + g];
            let partner = &moshi[side.partner];
            let ours_name = format!(
                "q{}g{}{}",
                partner.bits,
                partner.group_size,
                if partner.copies[0].is_panels() {
                    " panels"
                } else {
                    ""
                }
            );
            let ours_bytes = partner.copies[0].weight_bytes();
            let mut cells = Vec::new();
            let mut ratio_medians = [0f64; 2];
            for precision in 0..2 {
                let ours = &seconds[moshi_index(side.partner, precision)];
                let ratios: Vec<f64> = ours.iter().zip(theirs).map(|(o, t)| o / t).collect();
                let (low, high) = range(&ratios);
                let wins = ratios.iter().filter(|&&r| r < 1.0).count();
                ratio_medians[precision] = median(&ratios);
                let o = median(ours);
                cells.push(format!(
                    "{:.0} ({:.1}) | {:.2} [{low:.2}–{high:.2}] | {wins}/{}",
                    o * 1e6,
                    rate(o, ours_bytes, m, (rows, cols)),
                    ratio_medians[precision],
                    ratios.len()
                ));
            }
            let t = median(theirs);
            let [exact_error, int8_error] = moshi_errors[side.partner];
            println!(
                "| {name} {cols}->{rows} | {m} | {} | {:.0} ({:.1}) | {ours_name} | {} | {} | {:.1e} / {exact_error:.1e} / {int8_error:.1e} |",
                side.name,
                t * 1e6,
                rate(t, side.bytes, m, (rows, cols)),
                cells[0],
                cells[1],
                ggml_errors[g],
            );
            summary
                .entries
                .push((side.name, ours_name, m, ratio_medians[0], ratio_medians[1]));
        }
    }
    eprintln!("{name} {cols}->{rows}: read bandwidth {bandwidth:.1} GB/s");
    Ok(ggml
        .iter()
        .map(|s| format!("{} in {}", s.name, s.matrix.buffer_type))
        .collect())
}
