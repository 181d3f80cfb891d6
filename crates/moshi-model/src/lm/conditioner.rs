//! Hibiki's conditioners (Kyutai's `ConditionProvider` + `ConditionFuser` "sum"): each LUT
//! conditioner turns a value (`description` = `very_good`, ...) into one vector of the model
//! width, `output_proj · embed[row]`, or its learnt padding when no value is given; the fused
//! vectors are summed and added to the temporal input at every step. Evaluated once per value,
//! in f32, as Kyutai keeps the condition provider in float32.

use moshi_loader::lm_names::CONDITIONER_PREFIX;
use moshi_loader::{LmConfig, WeightMap};

use crate::{ModelError, Result};

/// One LUT conditioner with its weights.
#[derive(Clone, Debug)]
pub struct LutConditioner {
    name: String,
    possible_values: Vec<String>,
    /// `[rows, dim]`.
    embed: Vec<f32>,
    /// `[d_model, dim]`.
    output_proj: Vec<f32>,
    /// `[d_model]`.
    learnt_padding: Vec<f32>,
    dim: usize,
}

impl LutConditioner {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn possible_values(&self) -> &[String] {
        &self.possible_values
    }

    /// The conditioner's vector for `value` (`output_proj · embed[row(value)]`), or its learnt
    /// padding for `None` (an absent attribute, as in Kyutai's `BaseConditioner.forward`).
    pub fn vector(&self, value: Option<&str>) -> Result<Vec<f32>> {
        let Some(value) = value else {
            return Ok(self.learnt_padding.clone());
        };
        let row = self
            .possible_values
            .iter()
            .position(|v| v == value)
            .ok_or_else(|| ModelError::UnknownConditionValue {
                conditioner: self.name.clone(),
                value: value.to_string(),
                possible: self.possible_values.clone(),
            })?;
        let e = &self.embed[row * self.dim..(row + 1) * self.dim];
        Ok(self
            .output_proj
            .chunks_exact(self.dim)
            .map(|w| w.iter().zip(e).map(|(a, b)| a * b).sum())
            .collect())
    }
}

/// The conditioners summed into the input, in the config's `fuser.sum` order.
#[derive(Clone, Debug, Default)]
pub struct ConditionProvider {
    conditioners: Vec<LutConditioner>,
}

impl ConditionProvider {
    /// Takes every conditioner tensor of `cfg` out of `weights` (shapes checked by the map).
    pub fn load(cfg: &LmConfig, weights: &mut WeightMap) -> Result<Self> {
        let sum = cfg.fuser.as_ref().map(|f| f.sum.as_slice()).unwrap_or(&[]);
        let mut conditioners = Vec::with_capacity(sum.len());
        // `LmConfig::validate` checked that every summed name is a LUT conditioner.
        for (name, lut) in sum
            .iter()
            .filter_map(|n| Some((n, cfg.conditioners.get(n)?.lut()?)))
        {
            let p = format!("{CONDITIONER_PREFIX}{name}");
            conditioners.push(LutConditioner {
                name: name.clone(),
                possible_values: lut.possible_values.clone().unwrap_or_default(),
                embed: weights.take_f32(&format!("{p}.embed"), &[lut.rows(), lut.dim])?,
                output_proj: weights.take_f32(&format!("{p}.output_proj"), &[cfg.dim, lut.dim])?,
                learnt_padding: weights.take_f32(&format!("{p}.learnt_padding"), &[cfg.dim])?,
                dim: lut.dim,
            });
        }
        Ok(Self { conditioners })
    }

    pub fn is_empty(&self) -> bool {
        self.conditioners.is_empty()
    }

    pub fn conditioners(&self) -> &[LutConditioner] {
        &self.conditioners
    }

    /// The sum of every conditioner's vector (`[d_model]`) for `values` (`(conditioner,
    /// value)` pairs; a conditioner not named takes its learnt padding). `None` for a model
    /// without conditioners, which then accepts no values.
    pub fn fused(&self, values: &[(&str, &str)]) -> Result<Option<Vec<f32>>> {
        if let Some((name, _)) = values
            .iter()
            .find(|(n, _)| !self.conditioners.iter().any(|c| c.name == *n))
        {
            return Err(ModelError::UnknownConditioner {
                name: name.to_string(),
                known: self.conditioners.iter().map(|c| c.name.clone()).collect(),
            });
        }
        let mut sum: Option<Vec<f32>> = None;
        for c in &self.conditioners {
            let value = values.iter().find(|(n, _)| *n == c.name).map(|(_, v)| *v);
            let v = c.vector(value)?;
            match &mut sum {
                None => sum = Some(v),
                Some(s) => s.iter_mut().zip(&v).for_each(|(a, b)| *a += b),
            }
        }
        Ok(sum)
    }
}
