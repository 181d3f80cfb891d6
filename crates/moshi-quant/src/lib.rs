//! moshi-quant: MLX-affine packed weight matrices and the quantized matrix kernels.
//!
//! MLX "affine" quantization stores a `[rows, cols]` matrix as
//! * `codes`: `u32` words, `cols * bits / 32` per row, element `j` of a row in bits
//!   `[(j % (32 / bits)) * bits, +bits)` of word `j / (32 / bits)` (least significant first);
//! * `scales`, `biases`: bf16, `cols / group_size` per row;
//! * value `w[r, j] = q * scale[r, j / group_size] + bias[r, j / group_size]`.

mod error;
mod matrix;

pub use error::QuantError;
pub use matrix::{bf16_bits_to_f32, QuantizedMatrix, SUPPORTED_BITS, SUPPORTED_GROUP_SIZES};
