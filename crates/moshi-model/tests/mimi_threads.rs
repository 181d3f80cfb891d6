//! Mimi at the real shape gives bit-identical codes and PCM whatever the thread count, in every
//! weight mode: products are split over output rows/columns only, never over a reduction.

use moshi_loader::MimiConfig;
use moshi_model::mimi::{Mimi, MimiWeights};

#[test]
fn real_shape_output_is_identical_for_one_and_two_threads() {
    let base = Mimi::random(&MimiConfig::v0_1(), 8, 3).unwrap();
    let frames = 3;
    let pcm: Vec<f32> = (0..frames * base.frame_size_samples())
        .map(|i| 0.2 * ((i as f32) * 0.031).sin() * ((i as f32) * 0.0007).cos())
        .collect();
    let pool = |n: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .unwrap()
    };
    let (one, two) = (pool(1), pool(2));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(one.install(moshi_model::team::threads), 1);
    assert_eq!(
        two.install(moshi_model::team::threads),
        cores.min(2),
        "the 2-thread run must split the products"
    );
    for mode in MimiWeights::ALL {
        let run = || {
            let mut mimi = base.clone();
            mimi.set_weights(mode);
            let codes = mimi.encode_step(&pcm).unwrap();
            let out = mimi.decode_step(&codes).unwrap();
            (codes, out.iter().map(|x| x.to_bits()).collect::<Vec<u32>>())
        };
        let (codes_1, pcm_1) = one.install(run);
        let (codes_2, pcm_2) = two.install(run);
        assert_eq!(codes_1, codes_2, "{mode}: codes");
        assert!(
            pcm_1 == pcm_2,
            "{mode}: decoded PCM differs between 1 and 2 threads"
        );
        assert!(
            pcm_1.iter().any(|&b| f32::from_bits(b) != 0.0),
            "{mode}: silent output"
        );
    }
}
