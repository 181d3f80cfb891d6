//! The conditioners of Hibiki and the TTS (Kyutai's `ConditionProvider` + `ConditionFuser`):
//! each LUT conditioner turns a value (`description` = `very_good`, `cfg` = `2.0`, ...) into one
//! vector of the model width, `output_proj · embed[row]`, or its learnt padding when no value is
//! given; the `sum` vectors are added to the temporal input at every step. Each tensor
//! conditioner (the TTS's `speaker_wavs`) projects a given `[T, dim]` tensor with `output_proj`
//! where its mask is set and takes its learnt padding elsewhere; the `cross` tensors are
//! concatenated, sinusoidal positions added, and become the cross-attention source. Evaluated
//! once per session, in f32, as Kyutai keeps the condition provider in float32.

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

/// A given tensor condition: `[positions, dim]` values and which positions hold one (the others
/// take the conditioner's learnt padding), as Kyutai's `TensorCondition`.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorCondition {
    pub values: Vec<f32>,
    pub mask: Vec<bool>,
    pub dim: usize,
}

impl TensorCondition {
    pub fn positions(&self) -> usize {
        self.mask.len()
    }
}

/// One tensor conditioner with its weights.
#[derive(Clone, Debug)]
pub struct TensorConditioner {
    name: String,
    dim: usize,
    /// `[d_model, dim]`.
    output_proj: Vec<f32>,
    /// `[d_model]`.
    learnt_padding: Vec<f32>,
}

impl TensorConditioner {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Width of the tensors it takes.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// `[positions, d_model]`: `output_proj · x` where the mask is set, the learnt padding
    /// elsewhere.
    fn project(&self, condition: &TensorCondition) -> Result<Vec<f32>> {
        if condition.dim != self.dim || condition.values.len() != condition.positions() * self.dim {
            return Err(ModelError::WrongLength {
                what: "tensor condition: values (positions x the conditioner's dim)",
                expected: condition.positions() * self.dim,
                got: condition.values.len(),
            });
        }
        let mut out = Vec::with_capacity(condition.positions() * self.learnt_padding.len());
        for (x, &set) in condition.values.chunks_exact(self.dim).zip(&condition.mask) {
            if set {
                out.extend(
                    self.output_proj
                        .chunks_exact(self.dim)
                        .map(|w| w.iter().zip(x).map(|(a, b)| a * b).sum::<f32>()),
                );
            } else {
                out.extend_from_slice(&self.learnt_padding);
            }
        }
        Ok(out)
    }
}

/// The conditioners: LUTs summed into the input (`fuser.sum` order) and tensors that are the
/// cross-attention source (`fuser.cross` order).
#[derive(Clone, Debug, Default)]
pub struct ConditionProvider {
    conditioners: Vec<LutConditioner>,
    cross: Vec<TensorConditioner>,
    /// Scale of the sinusoidal positions added to the cross source (none when 0).
    cross_pos_emb_scale: f32,
    d_model: usize,
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
        let fuser = cfg.fuser.clone().unwrap_or_default();
        let mut cross = Vec::with_capacity(fuser.cross.len());
        for (name, tensor) in fuser
            .cross
            .iter()
            .filter_map(|n| Some((n, cfg.conditioners.get(n)?.tensor()?)))
        {
            let p = format!("{CONDITIONER_PREFIX}{name}");
            cross.push(TensorConditioner {
                name: name.clone(),
                dim: tensor.dim,
                output_proj: weights
                    .take_f32(&format!("{p}.output_proj"), &[cfg.dim, tensor.dim])?,
                learnt_padding: weights.take_f32(&format!("{p}.learnt_padding"), &[cfg.dim])?,
            });
        }
        let cross_pos_emb_scale = if fuser.cross_attention_pos_emb {
            fuser.cross_attention_pos_emb_scale as f32
        } else {
            0.0
        };
        Ok(Self {
            conditioners,
            cross,
            cross_pos_emb_scale,
            d_model: cfg.dim,
        })
    }

    /// Whether the model has no LUT conditioner (nothing summed into its input).
    pub fn is_empty(&self) -> bool {
        self.conditioners.is_empty()
    }

    /// The tensor conditioners of the cross-attention source.
    pub fn cross_conditioners(&self) -> &[TensorConditioner] {
        &self.cross
    }

    /// The cross-attention source (`[positions, d_model]`) for `tensors` (`(conditioner,
    /// condition)` pairs, one for every cross conditioner): the projected tensors concatenated in
    /// `fuser.cross` order, plus `scale x` sinusoidal positions (Kyutai's `ConditionFuser.get_cross`).
    /// `None` for a model without cross conditioners, which then accepts no tensors.
    pub fn cross_source(&self, tensors: &[(&str, &TensorCondition)]) -> Result<Option<Vec<f32>>> {
        if let Some((name, _)) = tensors
            .iter()
            .find(|(n, _)| !self.cross.iter().any(|c| c.name == *n))
        {
            return Err(ModelError::UnknownConditioner {
                name: name.to_string(),
                known: self.cross.iter().map(|c| c.name.clone()).collect(),
            });
        }
        if self.cross.is_empty() {
            return Ok(None);
        }
        let mut source = Vec::new();
        for c in &self.cross {
            let Some((_, condition)) = tensors.iter().find(|(n, _)| *n == c.name) else {
                return Err(ModelError::MissingTensorCondition {
                    name: c.name.clone(),
                });
            };
            source.extend(c.project(condition)?);
        }
        if self.cross_pos_emb_scale != 0.0 {
            add_sin_positions(&mut source, self.d_model, self.cross_pos_emb_scale);
        }
        Ok(Some(source))
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

/// `x[p] += scale * [cos(p / 10000^(i / (h - 1))), sin(..)]` for `i < h = dim / 2`, in f32
/// (Kyutai's `create_sin_embedding`, max period 10000).
fn add_sin_positions(x: &mut [f32], dim: usize, scale: f32) {
    let half = dim / 2;
    let periods: Vec<f32> = (0..half)
        .map(|i| 10000f32.powf(i as f32 / (half as f32 - 1.0)))
        .collect();
    for (p, row) in x.chunks_exact_mut(dim).enumerate() {
        let (cos, sin) = row.split_at_mut(half);
        for ((c, s), period) in cos.iter_mut().zip(sin.iter_mut()).zip(&periods) {
            let phase = p as f32 / period;
            *c += scale * phase.cos();
            *s += scale * phase.sin();
        }
    }
}
