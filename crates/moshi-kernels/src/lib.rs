//! moshi-kernels: MLX-affine packed weight matrices and the quantized matrix kernels.
//!
//! MLX "affine" quantization stores a `[rows, cols]` matrix as
//! * `codes`: `u32` words, `cols * bits / 32` per row, element `j` of a row in bits
//!   `[(j % (32 / bits)) * bits, +bits)` of word `j / (32 / bits)` (least significant first);
//! * `scales`, `biases`: bf16, `cols / group_size` per row;
//! * value `w[r, j] = q * scale[r, j / group_size] + bias[r, j / group_size]`.
//!
//! Products `y = x · dequant(W)ᵀ` keep the weights packed: [`QuantizedMatrix::matvec`] /
//! [`QuantizedMatrix::matmul`] pick the fastest [`Kernel`] for the CPU (AVX-512 VNNI, AVX-512,
//! AVX2+FMA or portable; [`KERNEL_ENV`] overrides), threaded over output rows on the persistent
//! spinning [`team`] (capped by the current rayon pool's thread count). Accumulation is f32; the
//! f32 kernels take the activations as they are, the VNNI kernel as 24-bit fixed point per
//! quantization group (within 2^-23 of each group's largest value, the size of one f32 rounding
//! of it). [`QuantizedMatrix::matmul_reference`] is the scalar reference.

mod error;
mod kernels;
mod matrix;
mod quantize;
mod reference;
pub mod team;

pub use error::QuantError;
pub use kernels::{Kernel, KERNEL_ENV};
pub use matrix::{bf16_bits_to_f32, QuantizedMatrix, SUPPORTED_BITS, SUPPORTED_GROUP_SIZES};
