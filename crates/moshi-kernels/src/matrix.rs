//! The packed affine matrix type (MLX's layout, and GGUF's q8_0 blocks carried in it) and its
//! scalar reference dequantization.

use crate::elem::bf16_bits_to_f32;
use crate::quant::qmm;
use crate::QuantError;
use crate::{activation_precision, ActivationPrecision, Kernel};

/// Bit widths MLX can produce.
pub const SUPPORTED_BITS: [u32; 6] = [2, 3, 4, 5, 6, 8];
/// Group sizes MLX can produce.
pub const SUPPORTED_GROUP_SIZES: [usize; 3] = [32, 64, 128];

/// Checks that MLX can produce this bit width and group size and that `cols` packs into whole
/// groups and whole `u32` words.
pub(crate) fn check_layout(cols: usize, bits: u32, group_size: usize) -> Result<(), QuantError> {
    if !SUPPORTED_BITS.contains(&bits) {
        return Err(QuantError::UnsupportedBits { bits });
    }
    if !SUPPORTED_GROUP_SIZES.contains(&group_size) {
        return Err(QuantError::UnsupportedGroupSize { group_size });
    }
    if !cols.is_multiple_of(group_size) || !(cols * bits as usize).is_multiple_of(32) {
        return Err(QuantError::ColsNotMultipleOfGroup { cols, group_size });
    }
    Ok(())
}

/// Values per GGUF q8_0 block (ggml's `QK8_0`).
pub const Q8_0_BLOCK: usize = 32;
/// Bytes per GGUF q8_0 block: its f16 scale, then its 32 signed 8-bit codes.
pub const Q8_0_BLOCK_BYTES: usize = 2 + Q8_0_BLOCK;

/// How the 16-bit scale and bias of each group are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleFormat {
    /// bf16 (MLX).
    Bf16,
    /// IEEE half (GGUF q8_0's block scale). Finite values only ([`QuantizedMatrix::from_q8_0`]
    /// refuses the others), so every kernel may widen them with the same bit arithmetic.
    F16,
}

impl ScaleFormat {
    /// The exact f32 value of `bits`.
    #[inline(always)]
    pub fn to_f32(self, bits: u16) -> f32 {
        match self {
            ScaleFormat::Bf16 => bf16_bits_to_f32(bits),
            ScaleFormat::F16 => half::f16::from_bits(bits).to_f32(),
        }
    }
}

/// A `[rows, cols]` matrix in MLX affine layout (see the crate docs).
#[derive(Clone, Debug)]
pub struct QuantizedMatrix {
    rows: usize,
    cols: usize,
    bits: u32,
    group_size: usize,
    codes: Vec<u32>,
    scales: Vec<u16>,
    biases: Vec<u16>,
    scale_format: ScaleFormat,
}

impl QuantizedMatrix {
    /// Builds a matrix from its MLX parts, checking every length.
    pub fn new(
        rows: usize,
        cols: usize,
        bits: u32,
        group_size: usize,
        codes: Vec<u32>,
        scales: Vec<u16>,
        biases: Vec<u16>,
    ) -> Result<Self, QuantError> {
        check_layout(cols, bits, group_size)?;
        let words_per_row = cols * bits as usize / 32;
        let groups_per_row = cols / group_size;
        let checks = [
            ("codes", rows * words_per_row, codes.len()),
            ("scales", rows * groups_per_row, scales.len()),
            ("biases", rows * groups_per_row, biases.len()),
        ];
        for (what, expected, got) in checks {
            if expected != got {
                return Err(QuantError::LengthMismatch {
                    what,
                    expected,
                    got,
                });
            }
        }
        Ok(Self {
            rows,
            cols,
            bits,
            group_size,
            codes,
            scales,
            biases,
            scale_format: ScaleFormat::Bf16,
        })
    }

    /// Builds a matrix from GGUF q8_0 blocks (row-major, `cols / 32` blocks per row, each an f16
    /// scale `d` then 32 `i8` codes `q`: `w = d · q`, no bias), kept packed: each code becomes the
    /// unsigned `q + 128` with f16 scale `d` and bias `-128 · d`, so every kernel of the 8-bit,
    /// group-32 format runs it, and `(q + 128) · d - 128 · d` is `d · q` exactly in f32 (both
    /// products have at most 19 significant bits). Refuses a non-finite `d`, or one whose
    /// `-128 · d` is not a finite f16 (`|d| > 511.75`; real scales are `max |w| / 127`).
    pub fn from_q8_0(rows: usize, cols: usize, blocks: &[u8]) -> Result<Self, QuantError> {
        check_layout(cols, 8, Q8_0_BLOCK)?;
        let groups = rows * cols / Q8_0_BLOCK;
        if blocks.len() != groups * Q8_0_BLOCK_BYTES {
            return Err(QuantError::LengthMismatch {
                what: "q8_0 block bytes",
                expected: groups * Q8_0_BLOCK_BYTES,
                got: blocks.len(),
            });
        }
        let (mut codes, mut scales, mut biases) = (
            Vec::with_capacity(rows * cols / 4),
            Vec::with_capacity(groups),
            Vec::with_capacity(groups),
        );
        for (index, block) in blocks.chunks_exact(Q8_0_BLOCK_BYTES).enumerate() {
            let d = half::f16::from_le_bytes([block[0], block[1]]);
            let bias = -(d.to_f32() * 128.0);
            if !d.is_finite() || bias.abs() > half::f16::MAX.to_f32() {
                return Err(QuantError::BadScale {
                    index,
                    value: d.to_f32(),
                });
            }
            scales.push(d.to_bits());
            biases.push(half::f16::from_f32(bias).to_bits());
            codes.extend(
                block[2..]
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) ^ 0x8080_8080),
            );
        }
        Ok(Self {
            rows,
            cols,
            bits: 8,
            group_size: Q8_0_BLOCK,
            codes,
            scales,
            biases,
            scale_format: ScaleFormat::F16,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn bits(&self) -> u32 {
        self.bits
    }
    pub fn group_size(&self) -> usize {
        self.group_size
    }
    /// Packed code words, `rows * cols * bits / 32`.
    pub fn codes(&self) -> &[u32] {
        &self.codes
    }
    /// Scale bits ([`QuantizedMatrix::scale_format`]), `rows * cols / group_size`.
    pub fn scales(&self) -> &[u16] {
        &self.scales
    }
    /// Bias bits ([`QuantizedMatrix::scale_format`]), `rows * cols / group_size`.
    pub fn biases(&self) -> &[u16] {
        &self.biases
    }
    /// How [`QuantizedMatrix::scales`] and [`QuantizedMatrix::biases`] are read.
    pub fn scale_format(&self) -> ScaleFormat {
        self.scale_format
    }
    /// The rows before `at` and the rows from `at` on, as two matrices (rows are packed
    /// independently: the codes, scales and biases of each part are its rows' own).
    ///
    /// # Panics
    /// If `at` is past the last row (caller bug).
    pub fn split_rows(mut self, at: usize) -> (Self, Self) {
        assert!(at <= self.rows, "split at row {at} of {}", self.rows);
        let words = at * self.cols * self.bits as usize / 32;
        let groups = at * self.cols / self.group_size;
        let tail = Self {
            rows: self.rows - at,
            cols: self.cols,
            bits: self.bits,
            group_size: self.group_size,
            codes: self.codes.split_off(words),
            scales: self.scales.split_off(groups),
            biases: self.biases.split_off(groups),
            scale_format: self.scale_format,
        };
        self.rows = at;
        (self, tail)
    }

    /// Bytes of weight data read by one full pass over the matrix.
    pub fn weight_bytes(&self) -> usize {
        self.codes.len() * 4 + (self.scales.len() + self.biases.len()) * 2
    }

    /// The integer code of element `(row, col)` (scalar reference; handles widths that
    /// straddle words, such as 3, 5 and 6 bits).
    #[inline]
    pub fn code(&self, row: usize, col: usize) -> u32 {
        let bits = self.bits as usize;
        let words_per_row = self.cols * bits / 32;
        let bit_pos = col * bits;
        let word = row * words_per_row + bit_pos / 32;
        let shift = bit_pos % 32;
        let mask = (1u64 << bits) - 1;
        let mut v = (self.codes[word] as u64) >> shift;
        if shift + bits > 32 {
            v |= (self.codes[word + 1] as u64) << (32 - shift);
        }
        (v & mask) as u32
    }

    /// Scalar reference dequantization of one row into `out` (`w = q * scale + bias` in f32).
    pub fn dequantize_row_f32(&self, row: usize, out: &mut [f32]) {
        let groups_per_row = self.cols / self.group_size;
        let cols = out.len().min(self.cols);
        for (g, outs) in out[..cols].chunks_mut(self.group_size).enumerate() {
            let at = row * groups_per_row + g;
            let scale = self.scale_format.to_f32(self.scales[at]);
            let bias = self.scale_format.to_f32(self.biases[at]);
            let first = g * self.group_size;
            for (col, o) in (first..).zip(outs) {
                *o = self.code(row, col) as f32 * scale + bias;
            }
        }
    }

    /// Scalar reference dequantization of the whole matrix, row-major f32.
    pub fn dequantize_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (row, chunk) in out.chunks_mut(self.cols).enumerate() {
            self.dequantize_row_f32(row, chunk);
        }
        out
    }

    /// MLX's native dequantization with the bf16 scales, `bf16(bf16(q * scale) + bias)`,
    /// row-major bf16 bits (what `mx.dequantize` returns for bf16 scales; the same rounding of
    /// the exact values for f16 scales).
    pub fn dequantize_bf16(&self) -> Vec<u16> {
        crate::quantize::dequantize_bf16(self)
    }

    /// Quantizes a row-major `[rows, cols]` matrix exactly like MLX's `mx.quantize` (affine mode;
    /// see the `quantize` module docs for the formula and its edge cases).
    pub fn quantize(
        weights: &[f32],
        rows: usize,
        cols: usize,
        bits: u32,
        group_size: usize,
    ) -> Result<Self, QuantError> {
        crate::quantize::quantize_mlx(weights, rows, cols, bits, group_size)
    }

    /// `y[rows] = dequant(W) · x[cols]` with the fastest kernel for this CPU, f32 accumulation.
    ///
    /// # Panics
    /// If `x.len() != cols` or `y.len() != rows` (caller bug).
    pub fn matvec(&self, x: &[f32], y: &mut [f32]) {
        self.matmul(x, 1, y);
    }

    /// `y[m, rows] = x[m, cols] · dequant(W)ᵀ` with the fastest kernel for this CPU, the
    /// activations held at the process's [`activation_precision`].
    ///
    /// # Panics
    /// If `x.len() != m * cols` or `y.len() != m * rows` (caller bug).
    pub fn matmul(&self, x: &[f32], m: usize, y: &mut [f32]) {
        // The detected kernel is always available, so this cannot fail.
        let detected = qmm(self, Kernel::detect(), activation_precision(), x, m, y);
        debug_assert!(detected.is_ok());
    }

    /// [`QuantizedMatrix::matmul`] with an explicit kernel; errors if this CPU cannot run it.
    pub fn matmul_with_kernel(
        &self,
        kernel: Kernel,
        x: &[f32],
        m: usize,
        y: &mut [f32],
    ) -> Result<(), QuantError> {
        qmm(self, kernel, activation_precision(), x, m, y)
    }

    /// [`QuantizedMatrix::matmul`] with an explicit kernel and activation precision; errors if
    /// this CPU cannot run the kernel.
    pub fn matmul_with(
        &self,
        kernel: Kernel,
        precision: ActivationPrecision,
        x: &[f32],
        m: usize,
        y: &mut [f32],
    ) -> Result<(), QuantError> {
        qmm(self, kernel, precision, x, m, y)
    }

    /// Scalar reference: each row dequantized with [`QuantizedMatrix::dequantize_row_f32`],
    /// dot products accumulated sequentially in f32, single-threaded.
    pub fn matmul_reference(&self, x: &[f32], m: usize, y: &mut [f32]) {
        crate::reference::qmm_reference(self, x, m, y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each part of a split holds exactly its rows of the whole (4 and 8 bits).
    #[test]
    fn split_rows_keeps_each_rows_codes_scales_and_biases() {
        let (rows, cols) = (6, 64);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 29 % 97) as f32 / 97.0) - 0.5)
            .collect();
        for bits in [4, 8] {
            let whole = QuantizedMatrix::quantize(&w, rows, cols, bits, 32).unwrap();
            let (head, tail) = whole.clone().split_rows(2);
            assert_eq!((head.rows(), tail.rows()), (2, 4));
            let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
            for r in 0..rows {
                whole.dequantize_row_f32(r, &mut a);
                match r < 2 {
                    true => head.dequantize_row_f32(r, &mut b),
                    false => tail.dequantize_row_f32(r - 2, &mut b),
                }
                assert_eq!(a, b, "{bits} bits, row {r}");
            }
        }
    }
}
