//! LM benchmarks at the real moshiko 7B dimensions (configs/moshiko-7b.json) from random bf16
//! weights: one temporal layer step, a temporal step with 2 layers (+ embeddings, out_norm, text
//! head), one full depformer pass (8 sub-steps x 6 layers), attention over a full 3000-position
//! window, the bf16 matrix-vector kernel (portable / AVX2 / AVX-512, 1 thread / all threads), the
//! gated feed-forward's SiLU and the machine's memory read bandwidth (the bound for one-token
//! inference).
//!
//! Run: `cargo bench -p moshi-bench --bench lm`

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use moshi_bench::bandwidth::{ReadBuffer, DEFAULT_BUFFER_BYTES};
use moshi_kernels::dense::matvec_with;
use moshi_kernels::Kernel;
use moshi_loader::LmConfig;
use moshi_model::lm::transformer::LayerScratch;
use moshi_model::lm::{LmScratch, LmWeights, RandomWeightKind};
use moshi_model::nn::{KvCache, KvPrecision, Rope, RopeRotation};
use moshi_model::rng::Rng;

const TEMPORAL_LAYERS: usize = 2;

fn config_7b(temporal_layers: usize) -> LmConfig {
    let mut cfg = LmConfig::moshiko_7b();
    cfg.num_layers = temporal_layers;
    cfg
}

fn input_tokens(cfg: &LmConfig, step: usize) -> Vec<u32> {
    let mut t = vec![(step * 7 % cfg.text_card) as u32];
    t.extend((0..cfg.n_q).map(|k| ((step * 13 + k * 5) % cfg.card) as u32));
    t
}

fn lm_benches(c: &mut Criterion) {
    let cfg = config_7b(TEMPORAL_LAYERS);
    let t0 = std::time::Instant::now();
    let model = LmWeights::random(&cfg, 7, RandomWeightKind::BF16).expect("random 7B-shaped model");
    // One row (f32 KV caches, no condition) stepped through the weights' row API.
    let mut row = model
        .new_row(&[], KvPrecision::F32)
        .expect("a row of a model without conditioners");
    let mut scratch = LmScratch::default();
    let bytes = model.weight_bytes();
    eprintln!(
        "random 7B-shaped model ({TEMPORAL_LAYERS} temporal layers, {} depformer layers) built in {:.1} s; \
         weights read per step: temporal layers {:.3} GB ({:.3} GB/layer), text head {:.3} GB, depformer pass {:.3} GB; \
         embedding tables held {:.3} GB; rayon threads {}",
        cfg.depformer_num_layers,
        t0.elapsed().as_secs_f64(),
        bytes.temporal_layers as f64 / 1e9,
        bytes.temporal_layers as f64 / TEMPORAL_LAYERS as f64 / 1e9,
        bytes.text_head as f64 / 1e9,
        bytes.depformer as f64 / 1e9,
        bytes.embedding_tables as f64 / 1e9,
        rayon::current_num_threads(),
    );

    let mut g = c.benchmark_group("lm_7b");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));

    // One temporal layer, short context (cache restarted every 64 positions).
    let layer_bytes = bytes.temporal_layers / TEMPORAL_LAYERS;
    g.throughput(Throughput::Bytes(layer_bytes as u64));
    {
        let layer = &model.temporal().layers()[0];
        let rope = Rope::new(cfg.dim / cfg.num_heads, cfg.max_period);
        let mut rot = RopeRotation::default();
        let mut cache = KvCache::new(cfg.context, cfg.dim);
        let mut scratch = LayerScratch::default();
        let mut x: Vec<f32> = (0..cfg.dim).map(|i| ((i as f32) * 0.37).sin()).collect();
        let mut pos = 0usize;
        g.bench_function("temporal_layer_step", |b| {
            b.iter(|| {
                if pos.is_multiple_of(64) {
                    cache.reset();
                }
                rope.rotation_into(pos, &mut rot);
                layer.step_rows(
                    &mut x,
                    1,
                    Some(std::slice::from_ref(&rot)),
                    &mut [&mut cache],
                    &mut scratch,
                );
                // Keep the residual bounded over many iterations.
                let n = x.iter().map(|v| v * v).sum::<f32>().sqrt() / (cfg.dim as f32).sqrt();
                x.iter_mut().for_each(|v| *v /= n.max(1e-6));
                pos += 1;
            })
        });
    }

    // A whole temporal step: embeddings + 2 layers + out_norm + text head.
    g.throughput(Throughput::Bytes(
        (bytes.temporal_layers + bytes.text_head) as u64,
    ));
    let mut step = 0usize;
    g.bench_function(format!("temporal_step_{TEMPORAL_LAYERS}_layers"), |b| {
        b.iter(|| {
            if row.position() >= 64 {
                row.reset();
            }
            model
                .forward_text_rows(&mut [&mut row], &input_tokens(&cfg, step), &mut scratch)
                .expect("valid tokens");
            step += 1;
            black_box(row.text_logits()[0]);
        })
    });

    // One full depformer pass on the last transformer_out.
    g.throughput(Throughput::Bytes(bytes.depformer as u64));
    g.bench_function("depformer_pass", |b| {
        b.iter(|| {
            row.depformer_reset();
            let mut prev = 0u32;
            for k in 0..cfg.dep_q {
                model
                    .depformer_step_rows(k, &mut [&mut row], &[prev], &mut scratch)
                    .expect("in order");
                prev = moshi_model::generator::sampling::argmax(row.depformer_logits());
            }
            black_box(prev);
        })
    });

    // Attention of one layer over a full window of `context` (3000) positions.
    {
        let attn = model.temporal().layers()[0].attention();
        let rope = Rope::new(cfg.dim / cfg.num_heads, cfg.max_period);
        let mut rot = RopeRotation::default();
        let mut cache = KvCache::new(cfg.context, cfg.dim);
        let mut rng = Rng::new(3);
        let mut kv = vec![0f32; cfg.dim];
        for _ in 0..cfg.context {
            kv.iter_mut().for_each(|v| *v = rng.next_f32() - 0.5);
            cache.push(&kv, &kv);
        }
        let x: Vec<f32> = (0..cfg.dim).map(|i| ((i as f32) * 0.11).cos()).collect();
        let mut out = vec![0f32; cfg.dim];
        let mut scratch = Default::default();
        let mut pos = cfg.context;
        g.throughput(Throughput::Bytes(
            (attn.weight_bytes() + 2 * cfg.context * cfg.dim * 4) as u64,
        ));
        g.bench_function("attention_full_context_3000", |b| {
            b.iter(|| {
                rope.rotation_into(pos, &mut rot);
                attn.step_rows(
                    &x,
                    1,
                    Some(std::slice::from_ref(&rot)),
                    &mut [&mut cache],
                    &mut scratch,
                    &mut out,
                );
                pos += 1;
                black_box(out[0]);
            })
        });
    }
    g.finish();
}

/// One temporal layer at 7B dims with MLX-packed weights (the `moshi-kernels` kernels).
fn quantized_layer_benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("lm_7b_quantized");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for (name, bits, group_size) in [
        ("temporal_layer_step_q8g64", 8, 64),
        ("temporal_layer_step_q4g32", 4, 32),
    ] {
        let mut cfg = config_7b(1);
        // The fewest the config allows: the depformer is not run here.
        cfg.depformer_num_layers = 1;
        let model = LmWeights::random(&cfg, 9, RandomWeightKind::Quantized { bits, group_size })
            .expect("random q model");
        let layer = &model.temporal().layers()[0];
        g.throughput(Throughput::Bytes(layer.weight_bytes() as u64));
        let rope = Rope::new(cfg.dim / cfg.num_heads, cfg.max_period);
        let mut rot = RopeRotation::default();
        let mut cache = KvCache::new(cfg.context, cfg.dim);
        let mut scratch = LayerScratch::default();
        let mut x: Vec<f32> = (0..cfg.dim).map(|i| ((i as f32) * 0.37).sin()).collect();
        let mut pos = 0usize;
        g.bench_function(name, |b| {
            b.iter(|| {
                if pos.is_multiple_of(64) {
                    cache.reset();
                }
                rope.rotation_into(pos, &mut rot);
                layer.step_rows(
                    &mut x,
                    1,
                    Some(std::slice::from_ref(&rot)),
                    &mut [&mut cache],
                    &mut scratch,
                );
                let n = x.iter().map(|v| v * v).sum::<f32>().sqrt() / (cfg.dim as f32).sqrt();
                x.iter_mut().for_each(|v| *v /= n.max(1e-6));
                pos += 1;
            })
        });
    }
    g.finish();
}

fn kernel_benches(c: &mut Criterion) {
    // The largest temporal matrix: gating.linear_in [2 * 11264, 4096].
    let (n, k) = (2 * 11264, 4096);
    let w: Vec<u16> = (0..n * k)
        .map(|i| half::bf16::from_f32(((i % 977) as f32 * 0.01).sin()).to_bits())
        .collect();
    let x: Vec<f32> = (0..k).map(|i| (i as f32 * 0.3).cos()).collect();
    let mut y = vec![0f32; n];
    let mut g = c.benchmark_group("matvec_bf16_22528x4096");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Bytes((n * k * 2) as u64));
    for (name, kernel, par) in [
        ("scalar_1thread", Kernel::Portable, false),
        ("avx2_1thread", Kernel::Avx2, false),
        ("avx512_1thread", Kernel::Avx512, false),
        ("avx2_threads", Kernel::Avx2, true),
        ("avx512_threads", Kernel::Avx512, true),
    ] {
        if kernel.is_available() {
            g.bench_function(name, |b| {
                b.iter(|| matvec_with(&w, n, k, &x, &mut y, kernel, par))
            });
        }
    }
    g.finish();

    // Memory read bandwidth: the probe of `moshi-rs bench` over 1 GiB (the ceiling for weight
    // streaming), with every rayon thread and with one.
    let mut g = c.benchmark_group("memory");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for (name, threads) in [
        ("read_1gib_all_threads", rayon::current_num_threads()),
        ("read_1gib_1thread", 1),
    ] {
        let buffer = ReadBuffer::new(threads, DEFAULT_BUFFER_BYTES).expect("read buffer");
        g.throughput(Throughput::Bytes(buffer.bytes() as u64));
        g.bench_function(name, |b| b.iter(|| black_box(buffer.read_pass())));
    }
    g.finish();
}

/// The gated feed-forward's `silu(gate) · value` at the 7B's widths (temporal 11264, depformer
/// 2816): the vectorized `silu_mul_slice` against the libm form `x / (1 + exp(-x))` it replaced.
fn gate_benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("silu_mul");
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1));
    for n in [2816, 11264] {
        let gate: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) * 3e-3)
            .collect();
        let value: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut out = vec![0f32; n];
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(format!("vectorized_{n}"), |b| {
            b.iter(|| moshi_kernels::dense::silu_mul_slice(&mut out, &gate, &value))
        });
        g.bench_function(format!("libm_{n}"), |b| {
            b.iter(|| {
                for ((o, &x), &v) in out.iter_mut().zip(&gate).zip(&value) {
                    *o = x / (1.0 + (-x).exp()) * v;
                }
                black_box(&out);
            })
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    kernel_benches,
    lm_benches,
    quantized_layer_benches,
    gate_benches
);
criterion_main!(benches);
