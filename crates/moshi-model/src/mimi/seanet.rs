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
        first_conv_streams(&self.input, states, pcms, scratch);
        for (s, stage) in self.stages.iter().enumerate() {
            for (r, block) in stage.residuals.iter().enumerate() {
                residual_streams(block, states, s, r, scratch);
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
            swap_streams(states);
        }
        last_conv_streams(&self.output, states, outs, scratch);
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
        first_conv_streams(&self.input, states, latents, scratch);
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
            swap_streams(states);
            for (r, block) in stage.residuals.iter().enumerate() {
                residual_streams(block, states, s, r, scratch);
            }
        }
        last_conv_streams(&self.output, states, outs, scratch);
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

/// The buffers of one stream that the encoder's and the decoder's stream steps both walk: the
/// first and last convolutions' states, the residual blocks' states, and the two activation
/// buffers `a` (the current activations) and `b`.
trait StreamBuffers {
    /// The first convolution's state and `a`, its output.
    fn input_and_a(&mut self) -> (&mut Conv1dState, &mut Vec<f32>);
    /// The last convolution's state and `a`, its input.
    fn output_and_a(&mut self) -> (&mut Conv1dState, &Vec<f32>);
    /// Residual block `r` of stage `s`'s state and `a`, which it updates in place.
    fn residual_and_a(&mut self, s: usize, r: usize) -> (&mut ResidualState, &mut Vec<f32>);
    /// Makes `b` (a stage's output) the current activations.
    fn swap_a_b(&mut self);
}

/// [`StreamBuffers`] for a state with the fields `input`, `output`, `residuals`, `a` and `b` (the
/// encoder's and the decoder's alike).
macro_rules! stream_buffers {
    ($state:ty) => {
        impl StreamBuffers for $state {
            fn input_and_a(&mut self) -> (&mut Conv1dState, &mut Vec<f32>) {
                (&mut self.input, &mut self.a)
            }
            fn output_and_a(&mut self) -> (&mut Conv1dState, &Vec<f32>) {
                (&mut self.output, &self.a)
            }
            fn residual_and_a(
                &mut self,
                s: usize,
                r: usize,
            ) -> (&mut ResidualState, &mut Vec<f32>) {
                (&mut self.residuals[s][r], &mut self.a)
            }
            fn swap_a_b(&mut self) {
                std::mem::swap(&mut self.a, &mut self.b);
            }
        }
    };
}

stream_buffers!(SeanetEncoderState);
stream_buffers!(SeanetDecoderState);

/// The first convolution of every stream (`xs[i]` into its `a`), products shared.
fn first_conv_streams<S: StreamBuffers>(
    conv: &StreamingConv1d,
    states: &mut [&mut S],
    xs: &[&[f32]],
    scratch: &mut ConvScratch,
) {
    let mut calls: Vec<ConvCall<'_>> = states
        .iter_mut()
        .zip(xs)
        .map(|(st, x)| {
            let (state, out) = st.input_and_a();
            ConvCall { state, x, out }
        })
        .collect();
    conv.forward_streams(&mut calls, PreActivation::None, false, scratch);
}

/// Residual block `r` of stage `s` on every stream's `a`.
fn residual_streams<S: StreamBuffers>(
    block: &ResidualBlock,
    states: &mut [&mut S],
    s: usize,
    r: usize,
    scratch: &mut ConvScratch,
) {
    let mut streams: Vec<_> = states
        .iter_mut()
        .map(|st| st.residual_and_a(s, r))
        .collect();
    block.forward_streams(&mut streams, scratch);
}

/// Every stream's stage output (`b`) made its current activations (`a`).
fn swap_streams<S: StreamBuffers>(states: &mut [&mut S]) {
    states.iter_mut().for_each(|st| st.swap_a_b());
}

/// The last convolution of every stream (its `a`, activated, into `outs[i]`), products shared.
fn last_conv_streams<S: StreamBuffers>(
    conv: &StreamingConv1d,
    states: &mut [&mut S],
    outs: &mut [&mut Vec<f32>],
    scratch: &mut ConvScratch,
) {
    let mut calls: Vec<ConvCall<'_>> = states
        .iter_mut()
        .zip(outs.iter_mut())
        .map(|(st, out)| {
            let (state, a) = st.output_and_a();
            ConvCall {
                state,
                x: &a[..],
                out,
            }
        })
        .collect();
    conv.forward_streams(&mut calls, PreActivation::Elu, false, scratch);
}
