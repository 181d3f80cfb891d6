//! Mimi's learnt frame-rate converters between the 25 Hz encoder/decoder rate and the 12.5 Hz
//! code rate: `ConvDownsample1d` (conv, kernel 2*stride, no bias, replicate padding of the first
//! step) and `ConvTrUpsample1d` (depthwise transposed conv, kernel 2*stride, no bias).

use super::conv::{
    Conv1dState, ConvCall, ConvScratch, ConvTr1dState, PreActivation, StreamingConv1d,
    StreamingConvTranspose1d,
};
use super::weights::WeightSource;
use super::MimiWeights;
use crate::Result;

/// Learnt causal downsampling by `stride` (weights `downsample.conv.conv.conv.weight`).
#[derive(Clone, Debug)]
pub struct Downsample {
    conv: StreamingConv1d,
}

impl Downsample {
    pub(crate) fn load(src: &mut dyn WeightSource, dim: usize, stride: usize) -> Result<Self> {
        let w = src.tensor("downsample.conv.conv.conv.weight", &[dim, dim, 2 * stride])?;
        Ok(Self {
            conv: StreamingConv1d::new(&w, None, dim, dim, 2 * stride, stride, 1, true),
        })
    }

    pub fn stride(&self) -> usize {
        self.conv.stride()
    }

    pub fn set_weights(&mut self, mode: MimiWeights) {
        self.conv.set_weights(mode);
    }

    /// `x` (`[t][dim]`, t a multiple of the stride) -> `out` (`[t / stride][dim]`).
    pub fn forward(&self, st: &mut Conv1dState, x: &[f32], out: &mut Vec<f32>) {
        self.conv.forward(st, x, PreActivation::None, out, false);
    }

    /// [`Downsample::forward`] for several streams, the product shared
    /// ([`StreamingConv1d::forward_streams`]).
    pub fn forward_streams(&self, calls: &mut [ConvCall<'_>], scratch: &mut ConvScratch) {
        self.conv
            .forward_streams(calls, PreActivation::None, false, scratch);
    }
}

/// Learnt causal depthwise upsampling by `stride` (weights `upsample.convtr.convtr.convtr.weight`).
#[derive(Clone, Debug)]
pub struct Upsample {
    convtr: StreamingConvTranspose1d,
}

impl Upsample {
    pub(crate) fn load(src: &mut dyn WeightSource, dim: usize, stride: usize) -> Result<Self> {
        let w = src.tensor(
            "upsample.convtr.convtr.convtr.weight",
            &[dim, 1, 2 * stride],
        )?;
        Ok(Self {
            convtr: StreamingConvTranspose1d::new(&w, None, dim, dim, 2 * stride, stride, true),
        })
    }

    /// `x` (`[t][dim]`) -> `out` (`[t * stride][dim]`).
    pub fn forward(&self, st: &mut ConvTr1dState, x: &[f32], out: &mut Vec<f32>) {
        self.convtr.forward(st, x, PreActivation::None, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mimi::weights::RandomWeights;

    fn signal(t: usize, d: usize) -> Vec<f32> {
        (0..t * d)
            .map(|i| ((i as f32) * 0.23).sin() + 0.5)
            .collect()
    }

    #[test]
    fn downsample_streams_like_batch_with_replicated_first_step() {
        let (d, stride) = (8, 2);
        let down = Downsample::load(&mut RandomWeights::new(3), d, stride).unwrap();
        let x = signal(20, d);
        let mut batch = Vec::new();
        down.forward(&mut Conv1dState::default(), &x, &mut batch);
        // First output = weights applied to the window [x0, x0, x0, x1] (two replicated steps of history).
        let w = raw_down_weight(d, stride);
        let window = [0usize, 0, 0, 1];
        for o in 0..d {
            let y0: f32 = (0..d)
                .flat_map(|i| (0..4).map(move |j| (i, j)))
                .map(|(i, j)| w[(o * d + i) * 4 + j] * x[window[j] * d + i])
                .sum();
            assert!(
                (y0 - batch[o]).abs() < 1e-5,
                "channel {o}: {y0} vs {}",
                batch[o]
            );
        }
        for chunk in [1, 2, 5] {
            let mut st = Conv1dState::default();
            let (mut streamed, mut out) = (Vec::new(), Vec::new());
            for part in x.chunks(chunk * stride * d) {
                down.forward(&mut st, part, &mut out);
                streamed.extend_from_slice(&out);
            }
            assert_eq!(streamed.len(), batch.len());
            assert!(
                streamed
                    .iter()
                    .zip(&batch)
                    .all(|(a, b)| (a - b).abs() < 1e-5),
                "chunk {chunk}"
            );
        }
    }

    fn raw_down_weight(d: usize, stride: usize) -> Vec<f32> {
        RandomWeights::new(3)
            .tensor("downsample.conv.conv.conv.weight", &[d, d, 2 * stride])
            .unwrap()
    }

    #[test]
    fn upsample_streams_like_batch() {
        let (d, stride) = (8, 2);
        let up = Upsample::load(&mut RandomWeights::new(4), d, stride).unwrap();
        let x = signal(9, d);
        let mut batch = Vec::new();
        up.forward(&mut ConvTr1dState::default(), &x, &mut batch);
        assert_eq!(batch.len(), 9 * stride * d);
        for chunk in [1, 2, 4] {
            let mut st = ConvTr1dState::default();
            let (mut streamed, mut out) = (Vec::new(), Vec::new());
            for part in x.chunks(chunk * d) {
                up.forward(&mut st, part, &mut out);
                streamed.extend_from_slice(&out);
            }
            assert!(
                streamed
                    .iter()
                    .zip(&batch)
                    .all(|(a, b)| (a - b).abs() < 1e-5),
                "chunk {chunk}"
            );
        }
    }
}
