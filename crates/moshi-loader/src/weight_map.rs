//! Canonically named weights, handed to the model: dense (f32 or bf16) or still packed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use moshi_kernels::QuantizedMatrix;

use crate::{LoaderError, Result};

/// Weight storage as handed to the model.
#[derive(Clone, Debug)]
pub enum WeightData {
    F32(Vec<f32>),
    /// Raw bf16 bits, kept as stored (upcast to f32 exactly at use).
    BF16(Vec<u16>),
    /// MLX-affine packed matrix for `moshi-kernels` kernels.
    Quantized(QuantizedMatrix),
}

/// One weight with its logical shape (for a packed matrix: `[rows, cols]` unpacked).
#[derive(Clone, Debug)]
pub struct Weight {
    pub shape: Vec<usize>,
    pub data: WeightData,
}

impl Weight {
    /// Dense f32 copy of the weight (dequantizing a packed one).
    pub fn to_f32(&self) -> Vec<f32> {
        match &self.data {
            WeightData::F32(v) => v.clone(),
            WeightData::BF16(v) => v
                .iter()
                .map(|&b| f32::from_bits((b as u32) << 16))
                .collect(),
            WeightData::Quantized(q) => q.dequantize_f32(),
        }
    }
}

/// Weights under canonical names, with the file they came from for error messages.
#[derive(Debug, Default)]
pub struct WeightMap {
    source: PathBuf,
    map: BTreeMap<String, Weight>,
}

impl WeightMap {
    pub fn new(source: impl Into<PathBuf>) -> Self {
        Self {
            source: source.into(),
            map: BTreeMap::new(),
        }
    }

    pub fn source(&self) -> &Path {
        &self.source
    }

    pub fn insert(&mut self, name: impl Into<String>, weight: Weight) {
        self.map.insert(name.into(), weight);
    }

    pub fn contains(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    pub fn get(&self, name: &str) -> Option<&Weight> {
        self.map.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.map.keys().map(|s| s.as_str())
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Removes and returns a weight, checking its logical shape.
    pub fn take(&mut self, name: &str, expected_shape: &[usize]) -> Result<Weight> {
        let w = self
            .map
            .remove(name)
            .ok_or_else(|| LoaderError::MissingTensor {
                path: self.source.clone(),
                name: name.to_string(),
            })?;
        if w.shape != expected_shape {
            return Err(LoaderError::ShapeMismatch {
                path: self.source.clone(),
                name: name.to_string(),
                expected: expected_shape.to_vec(),
                got: w.shape,
            });
        }
        Ok(w)
    }

    /// Removes a weight and returns it as dense f32, checking its shape.
    pub fn take_f32(&mut self, name: &str, expected_shape: &[usize]) -> Result<Vec<f32>> {
        Ok(self.take(name, expected_shape)?.to_f32())
    }

    /// Names still present (weights the model did not consume).
    pub fn remaining(&self) -> Vec<String> {
        self.map.keys().cloned().collect()
    }
}
