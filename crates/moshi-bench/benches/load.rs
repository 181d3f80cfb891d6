//! Loader and tokenizer speed on the tiny-a fixtures: checkpoint -> canonical WeightMap per layout
//! and mode (reported in MB/s of file), and text decoding per token.
//!
//! Run: `cargo bench -p moshi-bench --bench load`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use moshi_loader::tokenizer::TextTokenizer;
use moshi_loader::{load_lm_weights, LmConfig, WeightMode};
use moshi_test_support::tiny_a;

fn bench_load(c: &mut Criterion) {
    let cfg = LmConfig::from_file(tiny_a("config.json")).unwrap();
    let mut group = c.benchmark_group("load_lm_weights");
    for file in [
        "model.safetensors",
        "model.q8.safetensors",
        "model.q4.safetensors",
    ] {
        let path = tiny_a(file);
        group.throughput(Throughput::Bytes(std::fs::metadata(&path).unwrap().len()));
        for (mode_name, mode) in [
            ("native", WeightMode::Native),
            ("f32", WeightMode::DequantizeF32),
        ] {
            group.bench_function(format!("{file}/{mode_name}"), |b| {
                b.iter(|| load_lm_weights(&path, &cfg, mode).unwrap());
            });
        }
    }
    group.finish();
}

fn bench_tokenizer(c: &mut Criterion) {
    let tok = TextTokenizer::from_file(tiny_a("tokenizer.model")).unwrap();
    let ids: Vec<u32> = (0..1000u32).map(|i| (i * 7919) % 384).collect();
    let mut group = c.benchmark_group("tokenizer");
    group.throughput(Throughput::Elements(ids.len() as u64));
    group.bench_function("decode_1000_ids", |b| b.iter(|| tok.decode(&ids).unwrap()));
    group.bench_function("incremental_1000_ids", |b| {
        b.iter(|| {
            let mut dec = tok.incremental_decoder();
            let mut n = 0;
            for &id in &ids {
                n += dec.push(id).len();
            }
            n + dec.finish().len()
        })
    });
    group.finish();
}

criterion_group!(benches, bench_load, bench_tokenizer);
criterion_main!(benches);
