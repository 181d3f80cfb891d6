//! moshi-kernels: every compute kernel of moshi-rs, dense and quantized, with one CPU dispatch.
//!
//! * [`Kernel`]: the kernels as an [`InstructionSet`] (portable; AVX2+FMA, AVX-512 on x86-64;
//!   NEON on aarch64) and a [`QuantAlgorithm`] for 4-bit products (f32, or integer digits: AVX2
//!   integer, AVX-512 VNNI, NEON dot product), which of them this CPU runs, and the one choice
//!   every product follows, fixed once per process from the declared [`Workload`]
//!   ([`Kernel::init`], or [`Kernel::detect`]'s one-row default; [`KERNEL_ENV`] overrides,
//!   [`LEGACY_KERNEL_ENV`] is still honoured).
//! * [`dense`]: f32/bf16 matrix-vector products in one fixed summation order (every instruction
//!   set gives the same bits), attention's value accumulation, Mimi's few- and many-row products,
//!   activations.
//! * Quantized: MLX "affine" packed matrices ([`QuantizedMatrix`]) and their products. A
//!   `[rows, cols]` matrix is stored as
//!   - `codes`: `u32` words, `cols * bits / 32` per row, element `j` of a row in bits
//!     `[(j % (32 / bits)) * bits, +bits)` of word `j / (32 / bits)` (least significant first);
//!   - `scales`, `biases`: bf16, `cols / group_size` per row;
//!   - value `w[r, j] = q * scale[r, j / group_size] + bias[r, j / group_size]`.
//!
//!   GGUF q8_0 blocks ([`QuantizedMatrix::from_q8_0`]) are carried in the same layout (8 bits,
//!   groups of 32) with f16 scales and biases ([`ScaleFormat::F16`]), and run the same kernels.
//!
//!   Products `y = x · dequant(W)ᵀ` keep the weights packed: [`QuantizedMatrix::matvec`] /
//!   [`QuantizedMatrix::matmul`] run the detected kernel, threaded over output rows on the
//!   persistent spinning [`team`] (capped by the current rayon pool's thread count).
//!   Accumulation is f32; the f32 kernels take the activations as they are, the VNNI and NEON
//!   dot-product kernels as 24-bit fixed point per quantization group (within 2^-23 of each
//!   group's largest value, the size of one f32 rounding of it).
//!   [`ActivationPrecision::Int16`] and [`ActivationPrecision::Int8`] round the activations per
//!   group to two signed 8-bit digits or to one instead (two or one byte dot products per code
//!   vector; [`set_activation_precision`], [`round_activations_two_digits`],
//!   [`round_activations_i8`]).
//!   [`QuantizedMatrix::matmul_reference`] is the scalar reference. Mimi's 8-bit products read
//!   such a matrix rearranged into [`dense::PanelMatrix`] panels.
//! * [`team`]: the persistent thread team all threaded kernels run on; [`cores`]: how many
//!   threads to run by default (the performance cores of a big/little CPU); [`huge_pages`]: large
//!   weight buffers on 2 MiB pages where Linux gives them; [`pages_ahead`]: a growing buffer's
//!   next pages faulted in by the team's idle helpers.

pub mod cores;
mod cpu;
pub mod dense;
mod elem;
mod error;
pub mod huge_pages;
mod matrix;
pub mod pages_ahead;
mod precision;
mod quant;
mod quantize;
mod reference;
pub mod team;

pub use cpu::{InstructionSet, Kernel, QuantAlgorithm, Workload, KERNEL_ENV, LEGACY_KERNEL_ENV};
pub use elem::{bf16_bits_to_f32, f32_to_bf16_bits, reduce_lanes, WeightElem, LANES};
pub use error::{KernelAlreadyChosen, QuantError};
pub use matrix::{
    QuantizedMatrix, ScaleFormat, Q8_0_BLOCK, Q8_0_BLOCK_BYTES, SUPPORTED_BITS,
    SUPPORTED_GROUP_SIZES,
};
pub use precision::{activation_precision, set_activation_precision, ActivationPrecision};
pub use quant::{round_activations_i8, round_activations_two_digits, KernelMatrix, QuantPanels};
