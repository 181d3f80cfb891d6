//! Matrices of hashed weights for the kernel benches: the same values on every run, with no
//! checkpoint.

use moshi_kernels::QuantizedMatrix;

/// A `rows x cols` matrix of hashed weights in [-0.5, 0.5) (xorshift from `seed`), quantized to
/// 4 bits in groups of 32, as Kyutai's q4 files are.
pub fn hashed_q4(rows: usize, cols: usize, seed: u64) -> QuantizedMatrix {
    let mut state = seed | 1;
    let weights: Vec<f32> = (0..rows * cols)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect();
    QuantizedMatrix::quantize(&weights, rows, cols, 4, 32).expect("4-bit, group 32")
}
