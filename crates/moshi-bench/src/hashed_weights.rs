//! Matrices of hashed weights for the kernel benches: the same values on every run, with no
//! checkpoint.

#[cfg(feature = "pipeline")]
use moshi_kernels::QuantizedMatrix;

/// `len` hashed values in [-0.5, 0.5) (xorshift from `seed`), row-major for a matrix.
pub fn hashed_f32(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

/// A `rows x cols` matrix of hashed weights ([`hashed_f32`]), quantized to 4 bits in groups of
/// 32, as Kyutai's q4 files are.
#[cfg(feature = "pipeline")]
pub fn hashed_q4(rows: usize, cols: usize, seed: u64) -> QuantizedMatrix {
    let weights = hashed_f32(rows * cols, seed);
    QuantizedMatrix::quantize(&weights, rows, cols, 4, 32).expect("4-bit, group 32")
}
