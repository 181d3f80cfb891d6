//! Errors of the quantization crate.

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
    #[error("kernel {kernel} is not available on this CPU")]
    KernelUnavailable { kernel: &'static str },
    #[error("shape mismatch in {op}: {detail}")]
    Shape { op: &'static str, detail: String },
}
