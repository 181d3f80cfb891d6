//! Token embedding tables (f32, bf16 or MLX-packed rows), looked up one token at a time.
//! [`ZERO_TOKEN`] (Kyutai's `zero_idx`, -1) is embedded as exactly zero by every table.

use moshi_kernels::QuantizedMatrix;
use moshi_loader::{Weight, WeightData};

/// Kyutai's `zero_idx` (-1 in PyTorch): a token every embedding maps to exactly zero. The TTS
/// feeds it for audio not generated yet and for an empty second text stream.
pub const ZERO_TOKEN: u32 = u32::MAX;

#[derive(Clone, Debug)]
enum Table {
    F32(Vec<f32>),
    BF16(Vec<u16>),
    Quantized(QuantizedMatrix),
}

/// A `[rows, dim]` embedding table.
#[derive(Clone, Debug)]
pub struct Embedding {
    table: Table,
    rows: usize,
    dim: usize,
}

impl Embedding {
    /// From a loader weight of logical shape `[rows, dim]`.
    pub fn from_weight(w: Weight) -> Self {
        let (rows, dim) = (w.shape[0], w.shape[1..].iter().product());
        let table = match w.data {
            WeightData::F32(v) => Table::F32(v),
            WeightData::BF16(v) => Table::BF16(v),
            WeightData::Quantized(q) => Table::Quantized(q),
        };
        Self { table, rows, dim }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn weight_bytes(&self) -> usize {
        match &self.table {
            Table::F32(v) => v.len() * 4,
            Table::BF16(v) => v.len() * 2,
            Table::Quantized(q) => q.weight_bytes(),
        }
    }

    /// Writes row `token` into `out` (`[dim]`), zeros for [`ZERO_TOKEN`]. `token < rows` is the
    /// caller's check.
    pub fn lookup_into(&self, token: usize, out: &mut [f32]) {
        if token == ZERO_TOKEN as usize {
            out.fill(0.0);
            return;
        }
        let r = token * self.dim..(token + 1) * self.dim;
        match &self.table {
            Table::F32(v) => out.copy_from_slice(&v[r]),
            Table::BF16(v) => {
                for (o, &b) in out.iter_mut().zip(&v[r]) {
                    *o = f32::from_bits((b as u32) << 16);
                }
            }
            Table::Quantized(q) => q.dequantize_row_f32(token, out),
        }
    }

    /// `acc += row(token)` (nothing for [`ZERO_TOKEN`]), using `tmp` (`[dim]`) as scratch.
    pub fn add_into(&self, token: usize, acc: &mut [f32], tmp: &mut [f32]) {
        if token == ZERO_TOKEN as usize {
            return;
        }
        self.lookup_into(token, tmp);
        for (a, t) in acc.iter_mut().zip(tmp.iter()) {
            *a += t;
        }
    }
}
