//! Mimi at the real shape (configs/mimi-v0_1.json, random weights, 8 codebooks): time per 80 ms
//! frame of streaming encode and of streaming decode, in steady state (transformer window full).

use criterion::{criterion_group, criterion_main, Criterion};
use moshi_loader::MimiConfig;
use moshi_model::mimi::Mimi;

fn bench_mimi(c: &mut Criterion) {
    let cfg = MimiConfig::v0_1();
    let mut mimi = Mimi::random(&cfg, 8, 42).expect("random Mimi");
    let frame = mimi.frame_size_samples();
    let pcm: Vec<f32> = (0..frame).map(|i| 0.1 * ((i as f32) * 0.05).sin() + 0.05 * ((i as f32) * 0.31).cos()).collect();
    let mut codes = vec![0u32; mimi.num_codebooks()];
    let mut out = vec![0f32; frame];
    // Fill the transformer windows (context 250 steps = 125 frames) so the timing is steady state.
    for _ in 0..130 {
        mimi.encode_frame_into(&pcm, &mut codes).expect("encode");
        mimi.decode_frame_into(&codes, &mut out).expect("decode");
    }
    let mut group = c.benchmark_group("mimi_v0_1_frame");
    group.sample_size(30);
    group.measurement_time(std::time::Duration::from_secs(4));
    group.warm_up_time(std::time::Duration::from_secs(1));
    group.bench_function("encode_80ms_frame", |b| b.iter(|| mimi.encode_frame_into(&pcm, &mut codes).expect("encode")));
    group.bench_function("decode_80ms_frame", |b| b.iter(|| mimi.decode_frame_into(&codes, &mut out).expect("decode")));
    group.finish();
}

criterion_group!(benches, bench_mimi);
criterion_main!(benches);
