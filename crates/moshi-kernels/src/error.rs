//! Errors of the kernels crate: packed matrices and the process-wide kernel choice.

use crate::{Kernel, Workload};

/// Everything that can go wrong when building or using a packed matrix.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    #[error("unsupported bit width {bits} (supported: 2, 3, 4, 5, 6, 8)")]
    UnsupportedBits { bits: u32 },
    #[error("unsupported group size {group_size} (supported: 32, 64, 128)")]
    UnsupportedGroupSize { group_size: usize },
    #[error("{what}: expected {expected} values, got {got}")]
    LengthMismatch {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("input width {cols} is not a multiple of the group size {group_size}")]
    ColsNotMultipleOfGroup { cols: usize, group_size: usize },
    #[error("cannot quantize a non-finite weight: element {index} is {value}")]
    NonFinite { index: usize, value: f32 },
    #[error(
        "q8_0 block {index} has scale {value}, expected a finite f16 of magnitude at most 511.75"
    )]
    BadScale { index: usize, value: f32 },
    #[error("kernel {kernel} is not available on this CPU")]
    KernelUnavailable { kernel: &'static str },
    #[error("shape mismatch in {op}: {detail}")]
    Shape { op: &'static str, detail: String },
}

/// [`Kernel::init`] came after the process's kernel was fixed (by an earlier call, or by a
/// product that ran first with the one-row default), and its workload selects another kernel.
/// Products keep using [`KernelAlreadyChosen::chosen`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the {chosen} kernel was already chosen for this process's products; the {workload:?} \
     workload selects {wanted} (declare the workload before the first product)"
)]
pub struct KernelAlreadyChosen {
    /// The kernel every product uses.
    pub chosen: Kernel,
    /// The kernel the declared workload selects.
    pub wanted: Kernel,
    /// The declared workload.
    pub workload: Workload,
}
