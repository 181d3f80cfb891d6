//! A weight matrix for Mimi's per-frame products, the single place that decides which weight
//! precision a product reads: f32 always (the exact path, and the packed sgemm for many rows),
//! plus an optional reduced-precision copy (bf16, or MLX 8-bit affine) that the weight-streaming
//! kernels read when a call has at most a few left rows (the memory-bound streaming case).

use std::sync::atomic::{AtomicU64, Ordering};

use moshi_kernels::dense::{gemm_nt_bf16, gemm_nt_strided};
use moshi_kernels::{f32_to_bf16_bits, gemm_nt_q8, QuantizedMatrix, Q8_MAX_ROWS};

/// Weight precision of Mimi's few-row (memory-bound) products. Activations, accumulation and
/// every many-row product stay f32 in all modes; codebooks and the depthwise upsampler stay f32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MimiWeights {
    /// Exact f32 weights (the reference behaviour).
    #[default]
    F32,
    /// bf16 copies (round to nearest even): half the bytes of f32.
    Bf16,
    /// MLX affine 8-bit, group 64 (group 32 where the columns are not a multiple of 64; bf16
    /// where not a multiple of 32): ~1.06 bytes per weight.
    Q8,
}

impl MimiWeights {
    pub const ALL: [MimiWeights; 3] = [MimiWeights::F32, MimiWeights::Bf16, MimiWeights::Q8];

    /// `"f32"`, `"bf16"` or `"q8"`.
    pub fn name(self) -> &'static str {
        match self {
            MimiWeights::F32 => "f32",
            MimiWeights::Bf16 => "bf16",
            MimiWeights::Q8 => "q8",
        }
    }
}

impl std::fmt::Display for MimiWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for MimiWeights {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        MimiWeights::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                format!("unknown Mimi weight precision `{s}` (expected f32, bf16 or q8)")
            })
    }
}

/// Group sizes tried for the 8-bit copy, preferred first.
const Q8_GROUPS: [usize; 2] = [64, 32];

/// Left-operand rows up to which the bf16 copy is used (the bf16 streaming kernel's limit).
const BF16_MAX_ROWS: usize = 4;

/// Weight bytes read by all Mimi products of this process (for benchmarks: bytes per frame).
static WEIGHT_BYTES_READ: AtomicU64 = AtomicU64::new(0);

/// Total weight bytes read by Mimi's matrix products in this process so far (all instances and
/// threads; the difference over a frame is that frame's weight traffic).
pub fn weight_bytes_read() -> u64 {
    WEIGHT_BYTES_READ.load(Ordering::Relaxed)
}

/// Adds `bytes` to [`weight_bytes_read`] (every product against Mimi weights reports here).
pub(crate) fn count_bytes(bytes: usize) {
    WEIGHT_BYTES_READ.fetch_add(bytes as u64, Ordering::Relaxed);
}

#[derive(Clone, Debug, Default)]
enum FewRowCopy {
    #[default]
    None,
    Bf16(Vec<u16>),
    Q8(QuantizedMatrix),
}

/// Row-major weights `[rows][cols]`; a product may read a block of it (row offset, column offset
/// and row stride `cols`) or, for the f32 path, any strided view.
#[derive(Clone, Debug, Default)]
pub struct WeightMatrix {
    f32: Vec<f32>,
    rows: usize,
    cols: usize,
    few_rows: FewRowCopy,
}

impl WeightMatrix {
    pub fn new(values: Vec<f32>, rows: usize, cols: usize) -> Self {
        assert_eq!(values.len(), rows * cols, "weight matrix size");
        Self {
            f32: values,
            rows,
            cols,
            few_rows: FewRowCopy::None,
        }
    }

    pub fn values(&self) -> &[f32] {
        &self.f32
    }

    /// Builds (or drops) the copy the few-row products read.
    pub fn set_weights(&mut self, mode: MimiWeights) {
        let bf16 = |v: &[f32]| FewRowCopy::Bf16(v.iter().map(|&x| f32_to_bf16_bits(x)).collect());
        self.few_rows = match mode {
            MimiWeights::F32 => FewRowCopy::None,
            MimiWeights::Bf16 => bf16(&self.f32),
            MimiWeights::Q8 => match Q8_GROUPS.into_iter().find(|&g| self.cols.is_multiple_of(g)) {
                // Quantization fails only on non-finite weights: such a matrix keeps a bf16 copy.
                Some(g) => match QuantizedMatrix::quantize(&self.f32, self.rows, self.cols, 8, g) {
                    Ok(q) => FewRowCopy::Q8(q),
                    Err(_) => bf16(&self.f32),
                },
                None => bf16(&self.f32),
            },
        };
    }

    /// `out[i * rs_out + j] (+)= Σ_p a[i * rs_a + p] · W[offset + j * rs_w + p]`.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(
        &self,
        m: usize,
        k: usize,
        n: usize,
        a: &[f32],
        rs_a: usize,
        offset: usize,
        rs_w: usize,
        out: &mut [f32],
        rs_out: usize,
        accumulate: bool,
    ) {
        if m == 0 || n == 0 {
            return;
        }
        match &self.few_rows {
            FewRowCopy::None => {}
            FewRowCopy::Bf16(w) => {
                if m <= BF16_MAX_ROWS {
                    count_bytes(n * k * 2);
                    gemm_nt_bf16(
                        m,
                        k,
                        n,
                        a,
                        rs_a,
                        &w[offset..],
                        rs_w,
                        out,
                        rs_out,
                        accumulate,
                    );
                    return;
                }
            }
            FewRowCopy::Q8(q) => {
                let g = q.group_size();
                let (row0, col0) = (offset / self.cols, offset % self.cols);
                if m <= Q8_MAX_ROWS
                    && rs_w == self.cols
                    && k.is_multiple_of(g)
                    && col0.is_multiple_of(g)
                {
                    count_bytes(n * k + n * (k / g) * 4);
                    gemm_nt_q8(m, k, n, a, rs_a, q, row0, col0, out, rs_out, accumulate);
                    return;
                }
            }
        }
        count_bytes(n * k * 4);
        gemm_nt_strided(
            m,
            k,
            n,
            a,
            rs_a,
            &self.f32[offset..],
            rs_w,
            1,
            out,
            rs_out,
            accumulate,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precision_names_round_trip_and_reject_unknown() {
        for m in MimiWeights::ALL {
            assert_eq!(m.name().parse::<MimiWeights>().unwrap(), m);
        }
        let err = "q4".parse::<MimiWeights>().unwrap_err();
        assert!(
            err.contains("q4") && err.contains("f32, bf16 or q8"),
            "{err}"
        );
        assert_eq!(MimiWeights::default(), MimiWeights::F32);
    }

    #[test]
    fn every_mode_computes_the_same_block_product_within_its_rounding() {
        let (rows, cols) = (12, 192);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i as f32) * 0.37).sin())
            .collect();
        let a: Vec<f32> = (0..2 * cols).map(|i| ((i as f32) * 0.11).cos()).collect();
        // rows 4..10, columns 64..192 of the matrix, 2 left rows.
        let (n, k, offset) = (6, 128, 4 * cols + 64);
        let mut exact = vec![0f32; 2 * n];
        let mut matrix = WeightMatrix::new(w.clone(), rows, cols);
        matrix.gemm(2, k, n, &a, cols, offset, cols, &mut exact, n, false);
        for i in 0..2 {
            for j in 0..n {
                let r: f64 = (0..k)
                    .map(|p| a[i * cols + p] as f64 * w[offset + j * cols + p] as f64)
                    .sum();
                assert!((exact[i * n + j] as f64 - r).abs() < 1e-4, "f32 ({i}, {j})");
            }
        }
        // bf16: relative weight error 2^-9; q8 group 64 over values in [-1, 1]: step ~2/255.
        for (mode, tol) in [(MimiWeights::Bf16, 0.05), (MimiWeights::Q8, 0.1)] {
            matrix.set_weights(mode);
            let before = weight_bytes_read();
            let mut out = vec![0f32; 2 * n];
            matrix.gemm(2, k, n, &a, cols, offset, cols, &mut out, n, false);
            assert!(weight_bytes_read() > before);
            let max = out
                .iter()
                .zip(&exact)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(max < tol && max > 0.0, "{mode}: max diff {max}");
        }
    }
}
