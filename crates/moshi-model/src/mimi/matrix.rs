//! A weight matrix for Mimi's per-frame products: f32 always (exact path, and the packed sgemm for
//! many rows), plus an optional bf16 copy that the weight-streaming kernel reads when a product
//! has at most a few rows (the memory-bound per-frame case), halving the bytes read.

use crate::ops::{f32_to_bf16_bits, gemm_nt_bf16, gemm_nt_strided};

/// Row-major weights `[n][k]` (possibly a view with a row stride).
#[derive(Clone, Debug, Default)]
pub struct WeightMatrix {
    f32: Vec<f32>,
    bf16: Option<Vec<u16>>,
}

/// Left-operand rows up to which the bf16 copy is used.
const BF16_MAX_ROWS: usize = 4;

impl WeightMatrix {
    pub fn new(values: Vec<f32>) -> Self {
        Self { f32: values, bf16: None }
    }

    pub fn values(&self) -> &[f32] {
        &self.f32
    }

    /// Keeps (or drops) a bf16 copy for the few-row products.
    pub fn set_bf16(&mut self, on: bool) {
        self.bf16 = on.then(|| self.f32.iter().map(|&x| f32_to_bf16_bits(x)).collect());
    }

    /// `out[i * rs_out + j] (+)= Σ_p a[i * rs_a + p] · W[offset + j * rs_w + p]`.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(&self, m: usize, k: usize, n: usize, a: &[f32], rs_a: usize, offset: usize, rs_w: usize, out: &mut [f32], rs_out: usize, accumulate: bool) {
        match &self.bf16 {
            Some(w) if m <= BF16_MAX_ROWS => gemm_nt_bf16(m, k, n, a, rs_a, &w[offset..], rs_w, out, rs_out, accumulate),
            _ => gemm_nt_strided(m, k, n, a, rs_a, &self.f32[offset..], rs_w, 1, out, rs_out, accumulate),
        }
    }
}
