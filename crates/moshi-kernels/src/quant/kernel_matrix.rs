//! A quantized matrix as a kernel reads it best: in panels (4-bit or 8-bit codes) where that
//! kernel reads them ([`QuantPanels::from_matrix`]), else in MLX's rows. The one place that
//! choice is made, for the engine's layers and the peer benchmarks alike.

use crate::{ActivationPrecision, Kernel, QuantError, QuantPanels, QuantizedMatrix};

/// A quantized matrix in the layout its kernel reads.
#[derive(Clone, Debug)]
pub enum KernelMatrix {
    /// MLX's row layout (every kernel reads it).
    Rows(QuantizedMatrix),
    /// Panels of 16 rows (the AVX-512 VNNI kernel's 4-bit layout).
    Panels(QuantPanels),
}

impl KernelMatrix {
    /// `w` held as `kernel` reads it best.
    pub fn for_kernel(w: QuantizedMatrix, kernel: Kernel) -> Self {
        match QuantPanels::from_matrix(w, kernel) {
            Ok(panels) => KernelMatrix::Panels(panels),
            Err(rows) => KernelMatrix::Rows(rows),
        }
    }

    /// Whether the matrix is in panels.
    pub fn is_panels(&self) -> bool {
        matches!(self, KernelMatrix::Panels(_))
    }

    pub fn rows(&self) -> usize {
        match self {
            KernelMatrix::Rows(q) => q.rows(),
            KernelMatrix::Panels(p) => p.rows(),
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            KernelMatrix::Rows(q) => q.cols(),
            KernelMatrix::Panels(p) => p.cols(),
        }
    }

    /// Bytes of codes and factors one product reads.
    pub fn weight_bytes(&self) -> usize {
        match self {
            KernelMatrix::Rows(q) => q.weight_bytes(),
            KernelMatrix::Panels(p) => p.weight_bytes(),
        }
    }

    /// `y[m, rows] = x[m, cols] · dequant(W)ᵀ` with activations at `precision`: the rows on
    /// `kernel` (an error if this CPU cannot run it), the panels on their own kernel.
    pub fn matmul_with(
        &self,
        kernel: Kernel,
        precision: ActivationPrecision,
        x: &[f32],
        m: usize,
        y: &mut [f32],
    ) -> Result<(), QuantError> {
        match self {
            KernelMatrix::Rows(q) => q.matmul_with(kernel, precision, x, m, y),
            KernelMatrix::Panels(p) => {
                p.matmul_with(precision, x, m, y);
                Ok(())
            }
        }
    }
}
