//! SEANet encoder and decoder (causal, ELU, residual blocks with identity skips), streaming over
//! channels-last buffers. Layer indices follow PyTorch's `nn.Sequential` so weight names match
//! (`encoder.model.{i}.conv.conv.*`, `decoder.model.{i}.convtr.convtr.*`, `....block.{1,3}.conv.conv.*`).

use moshi_loader::config::SeanetConfig;

use super::conv::{
    Conv1dState, ConvCall, ConvScratch, ConvTr1dState, PreActivation, StreamingConv1d,
    StreamingConvTranspose1d,
};
use super::weights::WeightSource;
use super::MimiWeights;
use crate::Result;

fn load_conv(
    src: &mut dyn WeightSource,
    prefix: &str,
    cin: usize,
    cout: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
) -> Result<StreamingConv1d> {
    let w = src.tensor(&format!("{prefix}.conv.conv.weight"), &[cout, cin, kernel])?;
    let b = src.tensor(&format!("{prefix}.conv.conv.bias"), &[cout])?;
    Ok(StreamingConv1d::new(
        &w,
        Some(b),
        cin,
        cout,
        kernel,
        stride,
        dilation,
        false,
    ))
}

/// Residual unit: `x + conv_1x1(elu(conv_k(elu(x))))`.
#[derive(Clone, Debug)]
struct ResidualBlock {
    conv_k: StreamingConv1d,
    conv_1: StreamingConv1d,
}

#[derive(Clone, Debug, Default)]
struct ResidualState {
    conv_k: Conv1dState,
    conv_1: Conv1dState,
    hidden: Vec<f32>,
}

impl ResidualBlock {
    fn set_weights(&mut self, mode: MimiWeights) {
        self.conv_k.set_weights(mode);
        self.conv_1.set_weights(mode);
    }

    fn load(
        src: &mut dyn WeightSource,
        prefix: &str,
        dim: usize,
        cfg: &SeanetConfig,
        dilation: usize,
    ) -> Result<Self> {
        let hidden = dim / cfg.compress;
        Ok(Self {
            conv_k: load_conv(
                src,
                &format!("{prefix}.block.1"),
                dim,
                hidden,
                cfg.residual_kernel_size,
                1,
                dilation,
            )?,
            conv_1: load_conv(src, &format!("{prefix}.block.3"), hidden, dim, 1, 1, 1)?,
        })
    }

    /// In place on `x` (`[t][dim]`).
    fn forward(&self, st: &mut ResidualState, x: &mut Vec<f32>) {
        self.conv_k
            .forward(&mut st.conv_k, x, PreActivation::Elu, &mut st.hidden, false);
        self.conv_1
            .forward(&mut st.conv_1, &st.hidden, PreActivation::Elu, x, true);
    }

    /// [`ResidualBlock::forward`] for several streams (each its state and its `x`), the
    /// convolutions' products shared ([`StreamingConv1d::forward_streams`]).
    fn forward_streams(
        &self,
        streams: &mut [(&mut ResidualState, &mut Vec<f32>)],
        scratch: &mut ConvScratch,
    ) {
        let mut calls: Vec<ConvCall<'_>> = streams
            .iter_mut()
            .map(|(st, x)| ConvCall {
                state: &mut st.conv_k,
                x: &x[..],
                out: &mut st.hidden,
            })
            .collect();
        self.conv_k
            .forward_streams(&mut calls, PreActivation::Elu, false, scratch);
        let mut calls: Vec<ConvCall<'_>> = streams
            .iter_mut()
            .map(|(st, x)| ConvCall {
                state: &mut st.conv_1,
                x: &st.hidden[..],
                out: x,
            })
            .collect();
        self.conv_1
            .forward_streams(&mut calls, PreActivation::Elu, true, scratch);
    }

    fn reset(st: &mut ResidualState) {
        st.conv_k.reset();
        st.conv_1.reset();
    }
}

/// One encoder stage: residual blocks, then ELU + strided conv (channels x 2).
#[derive(Clone, Debug)]
struct EncoderStage {
    residuals: Vec<ResidualBlock>,
    down: StreamingConv1d,
}

/// SEANet encoder: 24 kHz mono PCM -> latent frames at `sample_rate / hop` (25 Hz for Mimi).
#[derive(Clone, Debug)]
pub struct SeanetEncoder {
    input: StreamingConv1d,
    stages: Vec<EncoderStage>,
    output: StreamingConv1d,
    hop: usize,
}

/// Streaming state of a [`SeanetEncoder`] plus its two ping-pong activation buffers.
#[derive(Clone, Debug, Default)]
pub struct SeanetEncoderState {
    input: Conv1dState,
    residuals: Vec<Vec<ResidualState>>,
    downs: Vec<Conv1dState>,
    output: Conv1dState,
    a: Vec<f32>,
    b: Vec<f32>,
}

impl SeanetEncoderState {
    pub fn reset(&mut self) {
        self.input.reset();
        self.residuals
            .iter_mut()
            .flatten()
            .for_each(ResidualBlock::reset);
        self.downs.iter_mut().for_each(Conv1dState::reset);
        self.output.reset();
    }
}

impl SeanetEncoder {
    pub(crate) fn load(
        src: &mut dyn WeightSource,
        prefix: &str,
        cfg: &SeanetConfig,
    ) -> Result<Self> {
        let nf = cfg.n_filters;
        let input = load_conv(
            src,
            &format!("{prefix}.model.0"),
            cfg.channels,
            nf,
            cfg.kernel_size,
            1,
            1,
        )?;
        let mut idx = 1;
        let mut mult = 1;
        let mut stages = Vec::new();
        for &ratio in cfg.ratios.iter().rev() {
            let dim = mult * nf;
            let mut residuals = Vec::new();
            for j in 0..cfg.n_residual_layers {
                residuals.push(ResidualBlock::load(
                    src,
                    &format!("{prefix}.model.{idx}"),
                    dim,
                    cfg,
                    cfg.dilation_base.pow(j as u32),
                )?);
                idx += 1;
            }
            idx += 1; // ELU
            let down = load_conv(
                src,
                &format!("{prefix}.model.{idx}"),
                dim,
                2 * dim,
                2 * ratio,
                ratio,
                1,
            )?;
            idx += 1;
            stages.push(EncoderStage { residuals, down });
            mult *= 2;
        }
        idx += 1; // ELU
        let output = load_conv(
            src,
            &format!("{prefix}.model.{idx}"),
            mult * nf,
            cfg.dimension,
            cfg.last_kernel_size,
            1,
            1,
        )?;
        Ok(Self {
            input,
            stages,
            output,
            hop: cfg.ratios.iter().product(),
        })
    }

    /// Weight precision of few-row products.
    pub fn set_weights(&mut self, mode: MimiWeights) {
        self.input.set_weights(mode);
        for st in &mut self.stages {
            st.residuals.iter_mut().for_each(|r| r.set_weights(mode));
            st.down.set_weights(mode);
        }
        self.output.set_weights(mode);
    }

    /// Input samples per output latent step.
    pub fn hop(&self) -> usize {
        self.hop
    }

    pub fn new_state(&self) -> SeanetEncoderState {
        SeanetEncoderState {
            residuals: self
                .stages
                .iter()
                .map(|s| vec![ResidualState::default(); s.residuals.len()])
                .collect(),
            downs: vec![Conv1dState::default(); self.stages.len()],
            ..Default::default()
        }
    }

    /// `pcm` (a multiple of the hop, channels-last) -> `out` (`[pcm / hop][dimension]`).
    pub fn forward(&self, st: &mut SeanetEncoderState, pcm: &[f32], out: &mut Vec<f32>) {
        let SeanetEncoderState {
            input,
            residuals,
            downs,
            output,
            a,
            b,
        } = st;
        self.input
            .forward(input, pcm, PreActivation::None, a, false);
        for ((stage, res_states), down_state) in self
            .stages
            .iter()
            .zip(residuals.iter_mut())
            .zip(downs.iter_mut())
        {
            for (block, rs) in stage.residuals.iter().zip(res_states.iter_mut()) {
                block.forward(rs, a);
            }
            stage
                .down
                .forward(down_state, a, PreActivation::Elu, b, false);
            std::mem::swap(a, b);
        }
        self.output
            .forward(output, a, PreActivation::Elu, out, false);
    }

    /// [`SeanetEncoder::forward`] of one step for each of several streams (`states[i]`,
    /// `pcms[i]` into `outs[i]`), each convolution's products shared across the streams where
    /// that reads its weights once for several ([`StreamingConv1d::forward_streams`]); stream `i`
    /// gets exactly what `forward` gives it alone.
    ///
    /// # Panics
    /// If the three slices differ in length (caller bug).
    pub fn forward_streams(
        &self,
        states: &mut [&mut SeanetEncoderState],
        pcms: &[&[f32]],
        outs: &mut [&mut Vec<f32>],
        scratch: &mut ConvScratch,
    ) {
        assert!(states.len() == pcms.len() && states.len() == outs.len());
        let mut calls: Vec<ConvCall<'_>> = states
            .iter_mut()
            .zip(pcms)
            .map(|(st, pcm)| ConvCall {
                state: &mut st.input,
                x: pcm,
                out: &mut st.a,
            })
            .collect();
        self.input
            .forward_streams(&mut calls, PreActivation::None, false, scratch);
        for (s, stage) in self.stages.iter().enumerate() {
            for (r, block) in stage.residuals.iter().enumerate() {
                let mut streams: Vec<_> = states
                    .iter_mut()
                    .map(|st| {
                        let SeanetEncoderState { residuals, a, .. } = &mut **st;
                        (&mut residuals[s][r], a)
                    })
                    .collect();
                block.forward_streams(&mut streams, scratch);
            }
            let mut calls: Vec<ConvCall<'_>> = states
                .iter_mut()
                .map(|st| {
                    let SeanetEncoderState { downs, a, b, .. } = &mut **st;
                    ConvCall {
                        state: &mut downs[s],
                        x: &a[..],
                        out: b,
                    }
                })
                .collect();
            stage
                .down
                .forward_streams(&mut calls, PreActivation::Elu, false, scratch);
            for st in states.iter_mut() {
                std::mem::swap(&mut st.a, &mut st.b);
            }
        }
        let mut calls: Vec<ConvCall<'_>> = states
            .iter_mut()
            .zip(outs.iter_mut())
            .map(|(st, out)| ConvCall {
                state: &mut st.output,
                x: &st.a[..],
                out,
            })
            .collect();
        self.output
            .forward_streams(&mut calls, PreActivation::Elu, false, scratch);
    }
}

/// One decoder stage: ELU + transposed conv (channels / 2), then residual blocks.
#[derive(Clone, Debug)]
struct DecoderStage {
    up: StreamingConvTranspose1d,
    residuals: Vec<ResidualBlock>,
}

/// SEANet decoder: latent frames -> PCM.
#[derive(Clone, Debug)]
pub struct SeanetDecoder {
    input: StreamingConv1d,
    stages: Vec<DecoderStage>,
    output: StreamingConv1d,
}

/// Streaming state of a [`SeanetDecoder`].
#[derive(Clone, Debug, Default)]
pub struct SeanetDecoderState {
    input: Conv1dState,
    ups: Vec<ConvTr1dState>,
    residuals: Vec<Vec<ResidualState>>,
    output: Conv1dState,
    a: Vec<f32>,
    b: Vec<f32>,
}

impl SeanetDecoderState {
    pub fn reset(&mut self) {
        self.input.reset();
        self.ups.iter_mut().for_each(ConvTr1dState::reset);
        self.residuals
            .iter_mut()
            .flatten()
            .for_each(ResidualBlock::reset);
        self.output.reset();
    }
}

impl SeanetDecoder {
    pub(crate) fn load(
        src: &mut dyn WeightSource,
        prefix: &str,
        cfg: &SeanetConfig,
    ) -> Result<Self> {
        let nf = cfg.n_filters;
        let mut mult = 1usize << cfg.ratios.len();
        let input = load_conv(
            src,
            &format!("{prefix}.model.0"),
            cfg.dimension,
            mult * nf,
            cfg.kernel_size,
            1,
            1,
        )?;
        let mut idx = 1;
        let mut stages = Vec::new();
        for &ratio in &cfg.ratios {
            let (cin, cout) = (mult * nf, mult * nf / 2);
            idx += 1; // ELU
            let name = format!("{prefix}.model.{idx}.convtr.convtr");
            let w = src.tensor(&format!("{name}.weight"), &[cin, cout, 2 * ratio])?;
            let bias = src.tensor(&format!("{name}.bias"), &[cout])?;
            let up =
                StreamingConvTranspose1d::new(&w, Some(bias), cin, cout, 2 * ratio, ratio, false);
            idx += 1;
            let mut residuals = Vec::new();
            for j in 0..cfg.n_residual_layers {
                residuals.push(ResidualBlock::load(
                    src,
                    &format!("{prefix}.model.{idx}"),
                    cout,
                    cfg,
                    cfg.dilation_base.pow(j as u32),
                )?);
                idx += 1;
            }
            stages.push(DecoderStage { up, residuals });
            mult /= 2;
        }
        idx += 1; // ELU
        let output = load_conv(
            src,
            &format!("{prefix}.model.{idx}"),
            nf,
            cfg.channels,
            cfg.last_kernel_size,
            1,
            1,
        )?;
        Ok(Self {
            input,
            stages,
            output,
        })
    }

    /// Weight precision of few-row products.
    pub fn set_weights(&mut self, mode: MimiWeights) {
        self.input.set_weights(mode);
        for st in &mut self.stages {
            st.up.set_weights(mode);
            st.residuals.iter_mut().for_each(|r| r.set_weights(mode));
        }
        self.output.set_weights(mode);
    }

    pub fn new_state(&self) -> SeanetDecoderState {
        SeanetDecoderState {
            ups: vec![ConvTr1dState::default(); self.stages.len()],
            residuals: self
                .stages
                .iter()
                .map(|s| vec![ResidualState::default(); s.residuals.len()])
                .collect(),
            ..Default::default()
        }
    }

    /// [`SeanetDecoder::forward`] of one step for each of several streams (`states[i]`,
    /// `latents[i]` into `outs[i]`), the products shared as in
    /// [`SeanetEncoder::forward_streams`]; stream `i` gets exactly what `forward` gives it alone.
    ///
    /// # Panics
    /// If the three slices differ in length (caller bug).
    pub fn forward_streams(
        &self,
        states: &mut [&mut SeanetDecoderState],
        latents: &[&[f32]],
        outs: &mut [&mut Vec<f32>],
        scratch: &mut ConvScratch,
    ) {
        assert!(states.len() == latents.len() && states.len() == outs.len());
        let mut calls: Vec<ConvCall<'_>> = states
            .iter_mut()
            .zip(latents)
            .map(|(st, latent)| ConvCall {
                state: &mut st.input,
                x: latent,
                out: &mut st.a,
            })
            .collect();
        self.input
            .forward_streams(&mut calls, PreActivation::None, false, scratch);
        for (s, stage) in self.stages.iter().enumerate() {
            let mut calls: Vec<ConvCall<'_, ConvTr1dState>> = states
                .iter_mut()
                .map(|st| {
                    let SeanetDecoderState { ups, a, b, .. } = &mut **st;
                    ConvCall {
                        state: &mut ups[s],
                        x: &a[..],
                        out: b,
                    }
                })
                .collect();
            stage
                .up
                .forward_streams(&mut calls, PreActivation::Elu, scratch);
            for st in states.iter_mut() {
                std::mem::swap(&mut st.a, &mut st.b);
            }
            for (r, block) in stage.residuals.iter().enumerate() {
                let mut streams: Vec<_> = states
                    .iter_mut()
                    .map(|st| {
                        let SeanetDecoderState { residuals, a, .. } = &mut **st;
                        (&mut residuals[s][r], a)
                    })
                    .collect();
                block.forward_streams(&mut streams, scratch);
            }
        }
        let mut calls: Vec<ConvCall<'_>> = states
            .iter_mut()
            .zip(outs.iter_mut())
            .map(|(st, out)| ConvCall {
                state: &mut st.output,
                x: &st.a[..],
                out,
            })
            .collect();
        self.output
            .forward_streams(&mut calls, PreActivation::Elu, false, scratch);
    }

    /// `latent` (`[t][dimension]`) -> `out` (`[t * hop][channels]`).
    pub fn forward(&self, st: &mut SeanetDecoderState, latent: &[f32], out: &mut Vec<f32>) {
        let SeanetDecoderState {
            input,
            ups,
            residuals,
            output,
            a,
            b,
        } = st;
        self.input
            .forward(input, latent, PreActivation::None, a, false);
        for ((stage, up_state), res_states) in self
            .stages
            .iter()
            .zip(ups.iter_mut())
            .zip(residuals.iter_mut())
        {
            stage.up.forward(up_state, a, PreActivation::Elu, b);
            std::mem::swap(a, b);
            for (block, rs) in stage.residuals.iter().zip(res_states.iter_mut()) {
                block.forward(rs, a);
            }
        }
        self.output
            .forward(output, a, PreActivation::Elu, out, false);
    }
}
