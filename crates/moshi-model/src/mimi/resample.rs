//! Mimi's learnt frame-rate converters between the 25 Hz encoder/decoder rate and the 12.5 Hz
//! code rate: `ConvDownsample1d` (conv, kernel 2*stride, no bias, replicate padding of the first
//! step) and `ConvTrUpsample1d` (depthwise transposed conv, kernel 2*stride, no bias).

use super::conv::{Conv1dState, ConvTr1dState, PreActivation, StreamingConv1d, StreamingConvTranspose1d};
use super::weights::WeightSource;
use crate::Result;

/// Learnt causal downsampling by `stride` (weights `downsample.conv.conv.conv.weight`).
#[derive(Clone, Debug)]
pub struct Downsample {
    conv: StreamingConv1d,
}

impl Downsample {
    pub(crate) fn load(src: &mut dyn WeightSource, dim: usize, stride: usize) -> Result<Self> {
        let w = src.tensor("downsample.conv.conv.conv.weight", &[dim, dim, 2 * stride])?;
        Ok(Self { conv: StreamingConv1d::new(&w, None, dim, dim, 2 * stride, stride, 1, true) })
    }

    pub fn stride(&self) -> usize {
        self.conv.stride()
    }

    /// `x` (`[t][dim]`, t a multiple of the stride) -> `out` (`[t / stride][dim]`).
    pub fn forward(&self, st: &mut Conv1dState, x: &[f32], out: &mut Vec<f32>) {
        self.conv.forward(st, x, PreActivation::None, out, false);
    }
}

/// Learnt causal depthwise upsampling by `stride` (weights `upsample.convtr.convtr.convtr.weight`).
#[derive(Clone, Debug)]
pub struct Upsample {
    convtr: StreamingConvTranspose1d,
}

impl Upsample {
    pub(crate) fn load(src: &mut dyn WeightSource, dim: usize, stride: usize) -> Result<Self> {
        let w = src.tensor("upsample.convtr.convtr.convtr.weight", &[dim, 1, 2 * stride])?;
        Ok(Self { convtr: StreamingConvTranspose1d::new(&w, None, dim, dim, 2 * stride, stride, true) })
    }

    /// `x` (`[t][dim]`) -> `out` (`[t * stride][dim]`).
    pub fn forward(&self, st: &mut ConvTr1dState, x: &[f32], out: &mut Vec<f32>) {
        self.convtr.forward(st, x, PreActivation::None, out);
    }
}
