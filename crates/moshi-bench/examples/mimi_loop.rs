//! Scratch profiling loop: streaming Mimi encode or decode at the real shape, for `perf record`.
//! Usage: `cargo run --release -p moshi-bench --example mimi_loop -- encode|decode [frames]
//! [f32|bf16|q8]`.
use moshi_loader::MimiConfig;
use moshi_model::mimi::{Mimi, MimiWeights};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let what = args.get(1).map(String::as_str).unwrap_or("encode");
    let frames: usize = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(200);
    let mode: MimiWeights = args
        .get(3)
        .map(|v| v.parse().expect("weight mode"))
        .unwrap_or_default();
    let cfg = MimiConfig::v0_1();
    let mut mimi = Mimi::random(&cfg, 8, 42).expect("random Mimi");
    mimi.set_weights(mode);
    let frame = mimi.frame_size_samples();
    let pcm: Vec<f32> = (0..frame)
        .map(|i| 0.1 * ((i as f32) * 0.05).sin())
        .collect();
    let mut codes = vec![0u32; mimi.num_codebooks()];
    let mut out = vec![0f32; frame];
    for _ in 0..130 {
        mimi.encode_frame_into(&pcm, &mut codes).unwrap();
        mimi.decode_frame_into(&codes, &mut out).unwrap();
    }
    let t = std::time::Instant::now();
    for _ in 0..frames {
        if what == "encode" {
            mimi.encode_frame_into(&pcm, &mut codes).unwrap();
        } else {
            mimi.decode_frame_into(&codes, &mut out).unwrap();
        }
    }
    println!(
        "{what} {mode}: {:.2} ms/frame",
        t.elapsed().as_secs_f64() * 1e3 / frames as f64
    );
}
