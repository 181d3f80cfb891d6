//! The whole-step contest (`peer-ggml step`): the engine's temporal transformer and text head
//! (moshi-model's `TemporalTransformer`, q4 group 64 in panels, as `moshi-rs` runs it) against
//! ggml's decode graph of the same transformer (`shim.c`'s `peer_step`: the products, norms,
//! rotary embedding, attention over an f16 KV cache and gated feed-forward as llama.cpp builds
//! them; its weights `q4_0` or `q4_K`, repacked by CPU_REPACK where it can). Moshi 7B's shapes:
//! dim 4096, 32 heads, hidden 11264, text head 32000 rows; `--layers` of its 32 layers, each
//! with weights of its own, so every step streams them from DRAM.
//!
//! Each round times `--steps` steps of every contestant back to back (the order rotating), and
//! the bandwidth probe before them; ratios are per round. Both sides' caches hold
//! `--kv-positions` positions (ours bf16, grown by one position a step from there; ggml's f16,
//! the last slot rewritten each step).

use std::time::Instant;

use moshi_bench::bandwidth::ReadBuffer;
use moshi_bench::hashed_weights::hashed_f32;
use moshi_bench::step_flags::{positive, StepFlags};
use moshi_bench::summary::{median, median_and_range};
use moshi_kernels::ActivationPrecision;
use moshi_loader::LmConfig;
use moshi_model::lm::temporal::{TemporalScratch, TemporalState};
use moshi_model::lm::{LmWeights, RandomWeightKind};
use moshi_model::nn::KvPrecision;
use rayon::ThreadPool;

use crate::ggml::{GgmlType, Runtime, Step, StepBlocks};

type Error = Box<dyn std::error::Error>;

pub struct StepOptions {
    pub flags: StepFlags,
    pub kv_positions: usize,
    pub formats: Vec<String>,
}

/// ggml step contestants: (name, ggml type, repacked).
const STEP_FORMATS: &[(&str, &str, bool)] = &[
    ("q4_0", "q4_0", false),
    ("q4_0x8", "q4_0", true),
    ("q4_K", "q4_K", false),
    ("q4_Kx8", "q4_K", true),
];

/// Our activation precisions, each a contestant.
const OURS: &[ActivationPrecision] = &ActivationPrecision::ALL;

pub fn parse(args: &[String]) -> Result<StepOptions, String> {
    let mut options = StepOptions {
        flags: StepFlags {
            threads: 2,
            rounds: 7,
            layers: 8,
            steps: 5,
        },
        kv_positions: 64,
        formats: vec!["q4_0x8".into(), "q4_Kx8".into()],
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        if options.flags.take(flag, value)? {
            continue;
        }
        match flag.as_str() {
            "--kv-positions" => {
                options.kv_positions = positive(flag, value)?;
                if options.kv_positions < 2 {
                    return Err(format!(
                        "--kv-positions {value}: at least 2 (the cached ones and the new one)"
                    ));
                }
            }
            "--formats" => options.formats = value.split(',').map(str::to_owned).collect(),
            _ => return Err(format!("step: unknown option {flag} (see src/step.rs)")),
        }
    }
    let known: Vec<&str> = STEP_FORMATS.iter().map(|f| f.0).collect();
    crate::check_formats(&options.formats, &known)?;
    Ok(options)
}

/// Our side: the temporal transformer of `layers` layers with random q4 g64 weights, one row.
struct Ours {
    lm: LmWeights,
    state: TemporalState,
    scratch: TemporalScratch,
    tokens: Vec<u32>,
    bytes: usize,
}

impl Ours {
    fn new(options: &StepOptions) -> Result<Self, Error> {
        let mut cfg = LmConfig::moshiko_7b();
        cfg.num_layers = options.flags.layers;
        let kind = RandomWeightKind::Quantized {
            bits: 4,
            group_size: 64,
        };
        let weights = moshi_model::lm::random::random_lm_weights(&cfg, 42, kind)?;
        let lm = LmWeights::load(&cfg, weights)?;
        let temporal = lm.temporal();
        let mut state = temporal.new_state(KvPrecision::Bf16);
        state.fill_caches_with_noise(options.kv_positions - 1, 7);
        let bytes = temporal
            .layers()
            .iter()
            .map(|l| l.weight_bytes())
            .sum::<usize>()
            + temporal.text_head_bytes();
        Ok(Self {
            lm,
            state,
            scratch: TemporalScratch::default(),
            tokens: vec![0; 1 + cfg.n_q],
            bytes,
        })
    }

    fn step(&mut self) {
        self.lm
            .temporal()
            .step_rows(&mut [&mut self.state], &self.tokens, &mut self.scratch);
        std::hint::black_box(self.state.text_logits());
    }
}

/// The ggml contestants' steps, built from ggml's quantization of hashed weights.
fn ggml_steps<'a>(
    options: &StepOptions,
    runtime: &'a Runtime,
) -> Result<Vec<(&'static str, Step<'a>, usize)>, Error> {
    let (dim, heads, hidden, vocab) = (4096, 32, 11264, 32000);
    let shapes = [
        (3 * dim, dim),
        (dim, dim),
        (2 * hidden, dim),
        (dim, hidden),
        (vocab, dim),
    ];
    let mut steps = Vec::new();
    for &(name, type_name, repack) in STEP_FORMATS {
        if !options.formats.iter().any(|f| f == name) {
            continue;
        }
        let ty = GgmlType::from_name(type_name)?;
        let blocks: Vec<Vec<u8>> = shapes
            .iter()
            .enumerate()
            .map(|(i, &(rows, cols))| {
                // Uniform in [-0.5, 0.5) scaled as the engine's random weights (std 1/sqrt(cols)).
                let dense: Vec<f32> = hashed_f32(rows * cols, 0x57e9 + i as u64)
                    .into_iter()
                    .map(|v| v * (12.0 / cols as f32).sqrt())
                    .collect();
                ty.quantize(&dense, rows, cols)
            })
            .collect::<Result<_, _>>()?;
        let step_blocks = StepBlocks {
            in_proj: &blocks[0],
            out_proj: &blocks[1],
            gating_in: &blocks[2],
            gating_out: &blocks[3],
            text_head: &blocks[4],
        };
        let bytes = options.flags.layers * blocks[..4].iter().map(Vec::len).sum::<usize>()
            + blocks[4].len();
        let step = Step::new(
            runtime,
            ty,
            repack,
            (
                options.flags.layers,
                dim,
                heads,
                hidden,
                vocab,
                options.kv_positions,
            ),
            &step_blocks,
        )?;
        steps.push((name, step, bytes));
    }
    Ok(steps)
}

pub fn run(options: &StepOptions, pool: &ThreadPool, runtime: &Runtime) -> Result<(), Error> {
    println!(
        "whole step: {} of Moshi 7B's 32 temporal layers + text head, 1 row, {} threads, {} rounds of {} steps, KV {} positions",
        options.flags.layers, options.flags.threads, options.flags.rounds, options.flags.steps, options.kv_positions
    );
    let mut ours = pool.install(|| Ours::new(options).map_err(|e| e.to_string()))?;
    let ggml = ggml_steps(options, runtime)?;
    let x = hashed_f32(4096, 0x1234);
    let mut logits = vec![0f32; 32000];
    for (name, step, _) in &ggml {
        step.compute(&x, Some(&mut logits))?;
        if logits.iter().any(|v| !v.is_finite()) {
            return Err(format!("ggml {name}: non-finite logits").into());
        }
    }
    runtime.pause();
    pool.install(|| ours.step());
    if ours.state.text_logits().iter().any(|v| !v.is_finite()) {
        return Err("moshi-rs: non-finite logits".into());
    }
    let probe = ReadBuffer::new(options.flags.threads, 1 << 30).ok_or("probe: no thread pool")?;
    // Contestants: ours at each precision, then the ggml steps.
    let count = OURS.len() + ggml.len();
    let mut ms: Vec<Vec<f64>> = vec![Vec::new(); count];
    let mut probes = Vec::new();
    for round in 0..options.flags.rounds {
        probes.push(probe.best_gbps(1));
        for k in 0..count {
            let who = (k + round) % count;
            let start = Instant::now();
            if who < OURS.len() {
                moshi_kernels::set_activation_precision(OURS[who]);
                pool.install(|| (0..options.flags.steps).for_each(|_| ours.step()));
            } else {
                let step = &ggml[who - OURS.len()].1;
                for _ in 0..options.flags.steps {
                    step.compute(&x, None)?;
                }
                runtime.pause();
            }
            ms[who].push(start.elapsed().as_secs_f64() * 1e3 / options.flags.steps as f64);
        }
    }
    report(&ms, &probes, &ours, &ggml);
    Ok(())
}

/// The tables: each contestant's step against the probe, then ours against each ggml step,
/// per-round ratios.
fn report(ms: &[Vec<f64>], probes: &[f64], ours: &Ours, ggml: &[(&str, Step<'_>, usize)]) {
    let probe_gbps = median(probes);
    let probe = median_and_range(probes, 1);
    println!("probe (one pass before each round): median {probe} GB/s");
    println!();
    println!(
        "| contestant | weights MB | ms / step: median [range] | GB/s | x the probe's bound |"
    );
    println!("|---|---:|---:|---:|---:|");
    let names: Vec<String> = OURS
        .iter()
        .map(|p| format!("moshi-rs q4 g64 panels, {p}"))
        .chain(ggml.iter().map(|g| format!("ggml {}", g.0)))
        .collect();
    let bytes: Vec<usize> = std::iter::repeat_n(ours.bytes, OURS.len())
        .chain(ggml.iter().map(|g| g.2))
        .collect();
    for (who, times) in ms.iter().enumerate() {
        let step_ms = median(times);
        let bound_ms = bytes[who] as f64 / probe_gbps / 1e6;
        println!(
            "| {} | {:.0} | {} | {:.1} | {:.2} |",
            names[who],
            bytes[who] as f64 / 1e6,
            median_and_range(times, 2),
            bytes[who] as f64 / step_ms / 1e6,
            step_ms / bound_ms
        );
    }
    println!();
    println!(
        "| ours / ggml (time, per round) | {} |",
        ggml.iter().map(|g| g.0).collect::<Vec<_>>().join(" | ")
    );
    println!("|---|{}", "---:|".repeat(ggml.len()));
    for (who, precision) in OURS.iter().enumerate() {
        let cells: Vec<String> = (0..ggml.len())
            .map(|g| {
                let ratios: Vec<f64> = ms[who]
                    .iter()
                    .zip(&ms[OURS.len() + g])
                    .map(|(a, b)| a / b)
                    .collect();
                median_and_range(&ratios, 2)
            })
            .collect();
        println!("| {precision} | {} |", cells.join(" | "));
    }
}
