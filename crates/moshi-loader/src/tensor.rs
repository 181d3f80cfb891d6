//! Owned tensors read from checkpoints: a shape and typed data.

use std::fmt;

/// Element types found in Moshi/Mimi checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
    BF16,
    U32,
    I64,
    I32,
    U8,
    I8,
}

impl DType {
    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::U32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::U8 | DType::I8 => 1,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::U32 => "U32",
            DType::I64 => "I64",
            DType::I32 => "I32",
            DType::U8 => "U8",
            DType::I8 => "I8",
        };
        f.write_str(s)
    }
}

/// Typed element storage.
#[derive(Clone, Debug)]
pub enum TensorData {
    F32(Vec<f32>),
    /// Raw bf16 bits.
    BF16(Vec<u16>),
    /// Raw f16 bits.
    F16(Vec<u16>),
    U32(Vec<u32>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    U8(Vec<u8>),
    I8(Vec<i8>),
}

/// A tensor read from a file.
#[derive(Clone, Debug)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: TensorData,
}

impl Tensor {
    pub fn dtype(&self) -> DType {
        match &self.data {
            TensorData::F32(_) => DType::F32,
            TensorData::BF16(_) => DType::BF16,
            TensorData::F16(_) => DType::F16,
            TensorData::U32(_) => DType::U32,
            TensorData::I64(_) => DType::I64,
            TensorData::I32(_) => DType::I32,
            TensorData::U8(_) => DType::U8,
            TensorData::I8(_) => DType::I8,
        }
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Converts float data to f32 (exact for bf16/f16); `None` for integer tensors.
    pub fn to_f32(&self) -> Option<Vec<f32>> {
        match &self.data {
            TensorData::F32(v) => Some(v.clone()),
            TensorData::BF16(v) => Some(
                v.iter()
                    .map(|&b| f32::from_bits((b as u32) << 16))
                    .collect(),
            ),
            TensorData::F16(v) => Some(
                v.iter()
                    .map(|&b| half::f16::from_bits(b).to_f32())
                    .collect(),
            ),
            _ => None,
        }
    }
}
