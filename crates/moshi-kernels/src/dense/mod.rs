//! Dense (f32 and bf16) kernels: fixed-order matrix-vector products and their multi-row form,
//! attention's value accumulation, few- and many-row products for Mimi, activations. Each runs
//! the instruction set ([`crate::Kernel::instruction_set`]) of [`crate::Kernel::detect`]'s kernel
//! (or of the one passed in), with a portable fallback; software prefetch for the access patterns
//! hardware prefetchers miss.

mod accumulate;
mod activations;
pub(crate) mod gemm;
mod matvec;
mod panels;
mod prefetch;

pub use accumulate::accumulate_rows;
pub use activations::{
    elu, elu_slice, elu_slice_par, erf_rational, gelu_erf, gelu_slice, silu, silu_mul_slice,
};
pub use gemm::{gemm_nt_bf16, gemm_nt_strided, matmul_t, SMALL_M};
pub use matvec::{
    dot_bf16_scalar, dot_f32, dot_f32_scalar, dot_rows, matmul, matmul_with, matvec, matvec_with,
};
pub use panels::{
    bf16_pair_operand, bf16_pair_step, bf16_pairs_native, gemm_nt_panels, gemm_nt_panels_with,
    PanelBlock, PanelMatrix, PANEL_COLS,
};
pub use prefetch::prefetch_l1;
