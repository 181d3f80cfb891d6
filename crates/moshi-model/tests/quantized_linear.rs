//! A linear layer over packed weights runs the packed kernels and agrees with the scalar reference product and
//! with a dense f32 layer built from the exactly dequantized weights.

use moshi_kernels::QuantizedMatrix;
use moshi_model::nn::{Linear, LinearWeights};
use moshi_test_support::hashed_uniform;

#[test]
fn quantized_linear_matches_reference_and_dense() {
    let (rows, cols) = (37, 256);
    let dense = hashed_uniform(rows * cols, 11);
    for (bits, group_size) in [(4, 32), (8, 64), (3, 128)] {
        let q = QuantizedMatrix::quantize(&dense, rows, cols, bits, group_size).unwrap();
        let dequantized = q.dequantize_f32();
        let lin = Linear::new(LinearWeights::Quantized(q.clone()), rows, cols);
        let dense_lin = Linear::f32(dequantized, rows, cols);
        for m in [1, 3] {
            let x = hashed_uniform(m * cols, 5 + m as u32);
            let got = lin.forward_vec(&x, m);
            let mut want = vec![0f32; m * rows];
            q.matmul_reference(&x, m, &mut want);
            let via_dense = dense_lin.forward_vec(&x, m);
            for ((g, w), d) in got.iter().zip(&want).zip(&via_dense) {
                // |x| ≤ 0.5, |w| ≤ 0.5, 256 terms: summation-order differences stay far below 1e-4.
                assert!(
                    (g - w).abs() < 1e-4,
                    "bits {bits} m {m}: {g} vs reference {w}"
                );
                assert!((g - d).abs() < 1e-4, "bits {bits} m {m}: {g} vs dense {d}");
            }
        }
    }
}
