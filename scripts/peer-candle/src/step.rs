//! The whole-LM-step contest (`peer-candle step`): the engine's LM step (moshi-model's
//! `Generator`, random q4 group 64 weights, temporal transformer, text head, depformer and
//! sampling, as `moshi-rs bench --stage lm` runs it) against Kyutai's Rust crate's (`moshi`
//! 0.6.4 on candle, random `Q4K` weights: `kyutai_lm`), Moshi 7B's shapes with `--layers` of its
//! 32 temporal layers, one session, f32 KV caches on both sides.
//!
//! Each round takes a pass of the bandwidth probe, then times `--steps` steps of every
//! contestant back to back, the order rotating; ratios are per round, so the host's drift
//! cancels. Ours runs at each activation precision (exact, 16-bit, 8-bit), each its own session
//! so that every contestant's caches hold as many positions as Kyutai's.

use std::time::Instant;

use moshi_bench::bandwidth::ReadBuffer;
use moshi_bench::step_flags::{positive, StepFlags};
use moshi_bench::summary::{median, median_and_range};
use moshi_kernels::ActivationPrecision;
use moshi_loader::LmConfig;
use moshi_model::generator::{
    Conditioning, Generator, LmSession, LmSessionSettings, SamplingConfig, StepInput,
};
use moshi_model::lm::RandomWeightKind;
use moshi_model::nn::KvPrecision;
use rayon::ThreadPool;

use crate::kyutai_lm::KyutaiLm;

type Error = Box<dyn std::error::Error + Send + Sync>;

pub struct StepOptions {
    pub flags: StepFlags,
    pub warmup_steps: usize,
}

/// Our activation precisions, each a contestant.
const OURS: &[ActivationPrecision] = &ActivationPrecision::ALL;

pub fn parse(args: &[String]) -> Result<StepOptions, String> {
    let mut options = StepOptions {
        flags: StepFlags {
            threads: 2,
            rounds: 7,
            layers: 8,
            steps: 4,
        },
        warmup_steps: 2,
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        if options.flags.take(flag, value)? {
            continue;
        }
        match flag.as_str() {
            "--warmup-steps" => options.warmup_steps = positive(flag, value)?,
            _ => return Err(format!("step: unknown option {flag} (see src/step.rs)")),
        }
    }
    Ok(options)
}

/// Our side: one generator, a session per activation precision.
struct Ours {
    generator: Generator,
    sessions: Vec<LmSession>,
    bytes_per_step: usize,
}

impl Ours {
    fn new(layers: usize) -> Result<Self, Error> {
        let mut cfg = LmConfig::moshiko_7b();
        cfg.num_layers = layers;
        let kind = RandomWeightKind::Quantized {
            bits: 4,
            group_size: 64,
        };
        let generator = Generator::random(&cfg, 42, kind)?;
        let sessions = OURS
            .iter()
            .map(|_| {
                generator.new_session(LmSessionSettings {
                    sampling: SamplingConfig::default(),
                    kv_precision: KvPrecision::F32,
                    conditioning: Conditioning::none(),
                    record_details: false,
                    tts: Default::default(),
                })
            })
            .collect::<Result<_, _>>()?;
        let bytes_per_step = generator.weights().weight_bytes().read_per_step();
        Ok(Self {
            generator,
            sessions,
            bytes_per_step,
        })
    }

    /// One step of contestant `who`: (temporal transformer and text head, sampling and
    /// depformer) in ms, the parts of `KyutaiTimings`.
    fn step(&mut self, who: usize, user: &[u32]) -> Result<(f64, f64), Error> {
        moshi_kernels::set_activation_precision(OURS[who]);
        let session = &mut self.sessions[who];
        let mut results = self
            .generator
            .step(&mut [session], &[StepInput::UserCodes(user)]);
        let t = results.remove(0)?.timings;
        Ok((t.temporal_ms, t.depformer_ms + t.sampling_ms))
    }
}

/// Per-round milliseconds of one contestant: whole step, temporal part, depformer and sampling.
#[derive(Default, Clone)]
struct Times {
    step: Vec<f64>,
    temporal: Vec<f64>,
    depformer: Vec<f64>,
}

impl Times {
    fn push(&mut self, steps: usize, elapsed_ms: f64, temporal_ms: f64, depformer_ms: f64) {
        let n = steps as f64;
        self.step.push(elapsed_ms / n);
        self.temporal.push(temporal_ms / n);
        self.depformer.push(depformer_ms / n);
    }
}

/// Steps contestant `who` (`OURS.len()` is Kyutai's) `steps` times; adds the round's times.
fn time_steps(
    who: usize,
    steps: usize,
    ours: &mut Ours,
    kyutai: &mut KyutaiLm,
    user: &[u32],
    times: &mut Times,
) -> Result<(), Error> {
    let generated = vec![0u32; user.len()];
    let (mut temporal, mut depformer) = (0.0, 0.0);
    let start = Instant::now();
    for _ in 0..steps {
        let (t, d) = if who < OURS.len() {
            ours.step(who, user)?
        } else {
            let k = kyutai.step(&generated, user)?;
            (k.temporal_ms, k.depformer_ms)
        };
        temporal += t;
        depformer += d;
    }
    let elapsed_ms = start.elapsed().as_secs_f64() * 1e3;
    times.push(steps, elapsed_ms, temporal, depformer);
    Ok(())
}

pub fn run(options: &StepOptions, pool: &ThreadPool) -> Result<(), Error> {
    println!(
        "whole LM step: {} of Moshi 7B's 32 temporal layers + text head + depformer + sampling, \
         1 session, {} threads, {} rounds of {} steps",
        options.flags.layers, options.flags.threads, options.flags.rounds, options.flags.steps
    );
    let mut kyutai = pool.install(|| KyutaiLm::new(options.flags.layers))?;
    let mut ours = pool.install(|| Ours::new(options.flags.layers))?;
    // The user's codes: fixed (the step's time does not depend on them).
    let user: Vec<u32> = (0..8).map(|k| 100 + 37 * k).collect();
    let count = OURS.len() + 1;
    // Warm-up steps, not counted: pages, caches and the thread team.
    pool.install(|| {
        (0..count).try_for_each(|who| {
            let steps = options.warmup_steps;
            time_steps(
                who,
                steps,
                &mut ours,
                &mut kyutai,
                &user,
                &mut Times::default(),
            )
        })
    })?;
    let mut times = vec![Times::default(); count];
    let probe = ReadBuffer::new(options.flags.threads, 1 << 30).ok_or("probe: no thread pool")?;
    let mut probes = Vec::new();
    for round in 0..options.flags.rounds {
        probes.push(probe.best_gbps(1));
        for k in 0..count {
            let who = (k + round) % count;
            pool.install(|| {
                time_steps(
                    who,
                    options.flags.steps,
                    &mut ours,
                    &mut kyutai,
                    &user,
                    &mut times[who],
                )
            })?;
        }
    }
    let bytes: Vec<usize> = std::iter::repeat_n(ours.bytes_per_step, OURS.len())
        .chain([kyutai.bytes_per_step])
        .collect();
    report(&times, &probes, &bytes);
    Ok(())
}

/// The tables: each contestant's step and parts against the probe, then ours against Kyutai's,
/// per-round ratios.
fn report(times: &[Times], probes: &[f64], bytes: &[usize]) {
    let probe = median_and_range(probes, 1);
    println!("probe (one pass before each round): median {probe} GB/s");
    println!();
    println!(
        "| contestant | matrices MB / step | step ms: median [range] | temporal ms | depformer + sampling ms | GB/s | x the bound, per round: median [range] |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let names: Vec<String> = OURS
        .iter()
        .map(|p| format!("moshi-rs q4 g64, {p}"))
        .chain(["Kyutai `moshi` 0.6.4 (candle) Q4K".to_string()])
        .collect();
    for (who, t) in times.iter().enumerate() {
        let step_ms = median(&t.step);
        // The bound of each round: the contestant's bytes at that round's probe.
        let to_bound: Vec<f64> = t
            .step
            .iter()
            .zip(probes)
            .map(|(ms, gbps)| ms / (bytes[who] as f64 / gbps / 1e6))
            .collect();
        println!(
            "| {} | {:.0} | {} | {:.2} | {:.2} | {:.1} | {} |",
            names[who],
            bytes[who] as f64 / 1e6,
            median_and_range(&t.step, 2),
            median(&t.temporal),
            median(&t.depformer),
            bytes[who] as f64 / step_ms / 1e6,
            median_and_range(&to_bound, 2)
        );
    }
    println!();
    println!("| ours / Kyutai's (time, per round): median [range] | step | temporal | depformer + sampling |");
    println!("|---|---:|---:|---:|");
    let kyutai = &times[OURS.len()];
    let ratio = |a: &[f64], b: &[f64]| {
        let ratios: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
        median_and_range(&ratios, 2)
    };
    for (who, precision) in OURS.iter().enumerate() {
        let t = &times[who];
        println!(
            "| {precision} | {} | {} | {} |",
            ratio(&t.step, &kyutai.step),
            ratio(&t.temporal, &kyutai.temporal),
            ratio(&t.depformer, &kyutai.depformer)
        );
    }
}
