//! Causal streaming 1-D convolutions over channels-last `[time][channel]` buffers: `StreamingConv1d`
//! (left context carried between calls, optional replicate padding of the very first step) and
//! `StreamingConvTranspose1d` (overlapping tails kept as partial sums). Both run as one strided
//! matrix product per call; a fresh state over the whole signal is the non-streaming forward.

use moshi_kernels::dense::elu_slice_par;

use super::MimiWeights;
use crate::nn::linear::Q8_COPY_MAX_ROWS;
use crate::nn::Linear;

/// Copies a row-major `[d0][d1][d2]` array into a new one of the same size, element `(a, b, c)`
/// going to index `dst_index(a, b, c)` (which must be a bijection onto `0..d0 * d1 * d2`).
fn permute_3d(
    src: &[f32],
    [d0, d1, d2]: [usize; 3],
    dst_index: impl Fn(usize, usize, usize) -> usize,
) -> Vec<f32> {
    let mut dst = vec![0f32; src.len()];
    for a in 0..d0 {
        for b in 0..d1 {
            for c in 0..d2 {
                dst[dst_index(a, b, c)] = src[(a * d1 + b) * d2 + c];
            }
        }
    }
    dst
}

/// Activation applied to a convolution's input as it is copied into the convolution's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreActivation {
    None,
    Elu,
}

impl PreActivation {
    fn copy_into(self, dst: &mut [f32], src: &[f32]) {
        match self {
            PreActivation::None => dst.copy_from_slice(src),
            PreActivation::Elu => elu_slice_par(dst, src),
        }
    }
}

/// A causal Conv1d (groups 1) with PyTorch `[out, in, kernel]` weights, stored `[out][kernel][in]`
/// so that one output row is a dot product with a contiguous window of the channels-last input.
#[derive(Clone, Debug)]
pub struct StreamingConv1d {
    in_channels: usize,
    out_channels: usize,
    kernel_size: usize,
    stride: usize,
    dilation: usize,
    replicate_pad: bool,
    /// `[out][kernel][in]`.
    weight: Linear,
    bias: Option<Vec<f32>>,
}

/// Streaming state of a [`StreamingConv1d`]: the buffer whose first `history` rows are the inputs
/// carried over from the previous call.
#[derive(Clone, Debug, Default)]
pub struct Conv1dState {
    buf: Vec<f32>,
    started: bool,
}

impl Conv1dState {
    pub fn reset(&mut self) {
        self.buf.clear();
        self.started = false;
    }
}

impl StreamingConv1d {
    /// `weight_pt` is PyTorch's `[out, in, kernel]`, row-major.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        weight_pt: &[f32],
        bias: Option<Vec<f32>>,
        in_channels: usize,
        out_channels: usize,
        kernel_size: usize,
        stride: usize,
        dilation: usize,
        replicate_pad: bool,
    ) -> Self {
        assert_eq!(
            weight_pt.len(),
            out_channels * in_channels * kernel_size,
            "conv weight size"
        );
        assert!(stride >= 1 && dilation >= 1 && kernel_size >= 1);
        // PyTorch [out][in][tap] -> [out][tap][in].
        let weight = permute_3d(
            weight_pt,
            [out_channels, in_channels, kernel_size],
            |o, i, j| (o * kernel_size + j) * in_channels + i,
        );
        if let Some(b) = &bias {
            assert_eq!(b.len(), out_channels, "conv bias size");
        }
        Self {
            in_channels,
            out_channels,
            kernel_size,
            stride,
            dilation,
            replicate_pad,
            weight: Linear::f32(weight, out_channels, kernel_size * in_channels).into_panels(),
            bias,
        }
    }

    /// Weight precision of few-row products (see [`Linear::set_reduced_precision`]).
    pub fn set_weights(&mut self, mode: MimiWeights) {
        self.weight.set_reduced_precision(mode);
    }

    pub fn in_channels(&self) -> usize {
        self.in_channels
    }

    pub fn out_channels(&self) -> usize {
        self.out_channels
    }

    pub fn stride(&self) -> usize {
        self.stride
    }

    /// Input rows carried between calls: effective kernel minus stride.
    pub fn history(&self) -> usize {
        ((self.kernel_size - 1) * self.dilation + 1).saturating_sub(self.stride)
    }

    /// Convolves `t_in` new input rows (`x` is `[t_in][in]`, `t_in` a multiple of the stride) and
    /// writes `t_in / stride` rows of `[out]` into `out` (resized), or adds them to `out` when
    /// `accumulate` (then `out` must already hold that many rows). Returns the output row count.
    pub fn forward(
        &self,
        st: &mut Conv1dState,
        x: &[f32],
        act: PreActivation,
        out: &mut Vec<f32>,
        accumulate: bool,
    ) -> usize {
        let t_out = self.load_input(st, x, act);
        self.start_output(out, t_out, accumulate);
        let (s, d, cin) = (self.stride, self.dilation, self.in_channels);
        self.product(&st.buf, s * cin, d * cin, t_out, out);
        self.keep_history(st, t_out);
        t_out
    }

    /// [`StreamingConv1d::forward`] of one step for each of several streams (`calls`, each with
    /// its own state, input and output): stream `i` gets exactly what `forward` gives it alone.
    /// Streams with few output rows (the weight-bound case) share products, their windows
    /// gathered into `scratch`: the weights are read once for as many streams as the kernel of a
    /// stream's product alone takes ([`Linear::gemm_same_bits_rows`]), so every output keeps its
    /// summation order. Streams with many rows (compute-bound) run one by one.
    pub fn forward_streams(
        &self,
        calls: &mut [ConvCall<'_>],
        act: PreActivation,
        accumulate: bool,
        scratch: &mut ConvScratch,
    ) {
        let t_outs: Vec<usize> = calls
            .iter_mut()
            .map(|c| {
                let t_out = self.load_input(c.state, c.x, act);
                self.start_output(c.out, t_out, accumulate);
                t_out
            })
            .collect();
        let mut first = 0;
        while first < calls.len() {
            let last = shared_group_end(&t_outs, first, |rows| self.same_bits_rows(rows));
            self.product_streams(&mut calls[first..last], t_outs[first], scratch);
            first = last;
        }
        for (c, t_out) in calls.iter_mut().zip(t_outs) {
            self.keep_history(c.state, t_out);
        }
    }

    /// The product of streams with `t_out` output rows each (their inputs loaded, their outputs
    /// started): one stream in place, several through `scratch` (windows gathered, outputs
    /// gathered and scattered back).
    fn product_streams(&self, calls: &mut [ConvCall<'_>], t_out: usize, scratch: &mut ConvScratch) {
        let (k, s, d, cin, cout) = (
            self.kernel_size,
            self.stride,
            self.dilation,
            self.in_channels,
            self.out_channels,
        );
        if let [call] = calls {
            self.product(&call.state.buf, s * cin, d * cin, t_out, call.out);
            return;
        }
        let window = k * cin;
        scratch.windows.clear();
        scratch.out.clear();
        for call in calls.iter() {
            for t in 0..t_out {
                for j in 0..k {
                    let at = (t * s + j * d) * cin;
                    scratch
                        .windows
                        .extend_from_slice(&call.state.buf[at..at + cin]);
                }
            }
            scratch.out.extend_from_slice(call.out);
        }
        let m = calls.len() * t_out;
        self.product(&scratch.windows, window, cin, m, &mut scratch.out);
        for (call, rows) in calls.iter_mut().zip(scratch.out.chunks_exact(t_out * cout)) {
            call.out.copy_from_slice(rows);
        }
    }

    /// The rows a product may stack while each keeps the bits of a product of `t_out` rows
    /// (the smallest over the products [`StreamingConv1d::product`] makes).
    fn same_bits_rows(&self, t_out: usize) -> usize {
        let (k, cin) = (self.kernel_size, self.in_channels);
        if self.dilation == 1 {
            self.weight.gemm_same_bits_rows(t_out, k * cin, 0, k * cin)
        } else {
            (0..k)
                .map(|j| {
                    self.weight
                        .gemm_same_bits_rows(t_out, cin, j * cin, k * cin)
                })
                .min()
                .unwrap_or(usize::MAX)
        }
    }

    /// Checks `x`, appends it (activated) to the state's history and returns the output row
    /// count.
    fn load_input(&self, st: &mut Conv1dState, x: &[f32], act: PreActivation) -> usize {
        let cin = self.in_channels;
        assert_eq!(x.len() % cin, 0, "conv input is not a whole number of rows");
        let t_in = x.len() / cin;
        assert!(
            t_in > 0 && t_in.is_multiple_of(self.stride),
            "conv input length {t_in} is not a positive multiple of the stride {}",
            self.stride
        );
        let hist = self.history();
        if !st.started {
            st.buf.clear();
            st.buf.resize(hist * cin, 0.0);
        }
        st.buf.resize((hist + t_in) * cin, 0.0);
        act.copy_into(&mut st.buf[hist * cin..], x);
        if self.replicate_pad && !st.started {
            let (head, rest) = st.buf.split_at_mut(hist * cin);
            for row in head.chunks_exact_mut(cin) {
                row.copy_from_slice(&rest[..cin]);
            }
        }
        st.started = true;
        t_in / self.stride
    }

    /// Sizes `out` for `t_out` rows (zeroed, or checked when `accumulate`) and adds the bias.
    fn start_output(&self, out: &mut Vec<f32>, t_out: usize, accumulate: bool) {
        let cout = self.out_channels;
        if accumulate {
            assert_eq!(
                out.len(),
                t_out * cout,
                "accumulating conv output has the wrong size"
            );
        } else {
            out.clear();
            out.resize(t_out * cout, 0.0);
        }
        if let Some(b) = &self.bias {
            for row in out.chunks_exact_mut(cout) {
                for (o, bv) in row.iter_mut().zip(b) {
                    *o += bv;
                }
            }
        }
    }

    /// Adds the convolution of `m` windows to `out` (`[m][out]`): window `i` starts at
    /// `a[i * rs_a]`, its tap `j` at `j * tap_stride` further (the state's buffer read in
    /// place, or gathered windows). The same products whatever the layout, so each output's
    /// summation order is the same.
    fn product(&self, a: &[f32], rs_a: usize, tap_stride: usize, m: usize, out: &mut [f32]) {
        let (k, cin, cout) = (self.kernel_size, self.in_channels, self.out_channels);
        if self.dilation == 1 {
            // Taps are contiguous: one product over the whole window.
            debug_assert_eq!(tap_stride, cin);
            self.weight
                .gemm(m, k * cin, cout, a, rs_a, 0, k * cin, out, cout, true);
        } else {
            for j in 0..k {
                let a = &a[j * tap_stride..];
                self.weight
                    .gemm(m, cin, cout, a, rs_a, j * cin, k * cin, out, cout, true);
            }
        }
    }

    /// Keeps the last `history` input rows of the buffer for the next call.
    fn keep_history(&self, st: &mut Conv1dState, t_out: usize) {
        let (hist, cin) = (self.history(), self.in_channels);
        let t_in = t_out * self.stride;
        if hist > 0 {
            st.buf.copy_within(t_in * cin..(t_in + hist) * cin, 0);
        }
        st.buf.truncate(hist * cin);
    }
}

/// Output rows per stream up to which [`StreamingConv1d::forward_streams`] shares products across
/// streams: the products of few rows are bound by their weight bytes (read once for all
/// streams), those of many rows by their multiply-adds (the same work stacked or not).
const SHARED_PRODUCT_MAX_ROWS: usize = Q8_COPY_MAX_ROWS;

/// The end of the group of streams from `first` that share one product: the following streams
/// with `rows[first]` rows, as many as the kernel of one stream's product takes
/// (`same_bits_rows(rows) / rows`), and only products of few rows (at most
/// [`SHARED_PRODUCT_MAX_ROWS`]); a stream alone otherwise.
fn shared_group_end(
    rows: &[usize],
    first: usize,
    same_bits_rows: impl Fn(usize) -> usize,
) -> usize {
    let r = rows[first];
    let group = if r > 0 && r <= SHARED_PRODUCT_MAX_ROWS {
        (same_bits_rows(r) / r).max(1)
    } else {
        1
    };
    let last = (first + group).min(rows.len());
    first + rows[first..last].iter().take_while(|&&t| t == r).count()
}

/// One stream's part of a [`StreamingConv1d::forward_streams`] (or, with a [`ConvTr1dState`],
/// of a [`StreamingConvTranspose1d::forward_streams`]): its state, its input rows and its
/// output.
pub struct ConvCall<'a, S = Conv1dState> {
    pub state: &'a mut S,
    pub x: &'a [f32],
    pub out: &'a mut Vec<f32>,
}

/// Buffers of [`StreamingConv1d::forward_streams`]: the gathered windows and outputs of the
/// streams sharing a product (kept between calls).
#[derive(Clone, Debug, Default)]
pub struct ConvScratch {
    windows: Vec<f32>,
    out: Vec<f32>,
}

/// A causal ConvTranspose1d with PyTorch `[in, out / groups, kernel]` weights; groups is 1 or the
/// channel count (depthwise, Mimi's upsampler). Output rows past `t_in * stride` stay in the state
/// as partial sums (without bias) and are added to the next call's first rows.
#[derive(Clone, Debug)]
pub struct StreamingConvTranspose1d {
    in_channels: usize,
    out_channels: usize,
    kernel_size: usize,
    stride: usize,
    depthwise: bool,
    /// groups 1: `[kernel][out][in]` (one contiguous weight row per output tap and channel);
    /// depthwise: `[channel][kernel]` as in PyTorch.
    weight: Linear,
    bias: Option<Vec<f32>>,
}

/// Streaming state of a [`StreamingConvTranspose1d`].
#[derive(Clone, Debug, Default)]
pub struct ConvTr1dState {
    /// `[kernel - stride][out]` partial sums carried over.
    partial: Vec<f32>,
    /// Activated input.
    xbuf: Vec<f32>,
    /// Overlap-add accumulator.
    acc: Vec<f32>,
}

impl ConvTr1dState {
    pub fn reset(&mut self) {
        self.partial.clear();
    }
}

impl StreamingConvTranspose1d {
    /// `weight_pt` is PyTorch's `[in, out / groups, kernel]`.
    pub fn new(
        weight_pt: &[f32],
        bias: Option<Vec<f32>>,
        in_channels: usize,
        out_channels: usize,
        kernel_size: usize,
        stride: usize,
        depthwise: bool,
    ) -> Self {
        assert!(
            kernel_size >= stride && stride >= 1,
            "transposed conv needs kernel >= stride"
        );
        let weight = if depthwise {
            assert_eq!(
                in_channels, out_channels,
                "depthwise transposed conv keeps the channel count"
            );
            assert_eq!(
                weight_pt.len(),
                in_channels * kernel_size,
                "depthwise convtr weight size"
            );
            weight_pt.to_vec()
        } else {
            assert_eq!(
                weight_pt.len(),
                in_channels * out_channels * kernel_size,
                "convtr weight size"
            );
            // PyTorch [in][out][tap] -> [tap][out][in].
            permute_3d(
                weight_pt,
                [in_channels, out_channels, kernel_size],
                |i, o, j| (j * out_channels + o) * in_channels + i,
            )
        };
        if let Some(b) = &bias {
            assert_eq!(b.len(), out_channels, "convtr bias size");
        }
        let (rows, cols) = if depthwise {
            (in_channels, kernel_size)
        } else {
            (kernel_size * out_channels, in_channels)
        };
        Self {
            in_channels,
            out_channels,
            kernel_size,
            stride,
            depthwise,
            weight: if depthwise {
                Linear::f32(weight, rows, cols)
            } else {
                Linear::f32(weight, rows, cols).into_panels()
            },
            bias,
        }
    }

    /// Weight precision of few-row products (groups 1 only; depthwise stays f32).
    pub fn set_weights(&mut self, mode: MimiWeights) {
        if !self.depthwise {
            self.weight.set_reduced_precision(mode);
        }
    }

    pub fn out_channels(&self) -> usize {
        self.out_channels
    }

    /// `x` is `[t_in][in]`; writes `t_in * stride` rows of `[out]` into `out` (resized).
    pub fn forward(
        &self,
        st: &mut ConvTr1dState,
        x: &[f32],
        act: PreActivation,
        out: &mut Vec<f32>,
    ) -> usize {
        let t_in = self.load_input(st, x, act);
        if self.depthwise {
            self.depthwise_product(st, x, act, t_in);
        } else {
            for (j0, j1) in self.tap_blocks() {
                self.product_block(
                    &st.xbuf,
                    t_in,
                    j0,
                    j1,
                    &mut st.acc[j0 * self.out_channels..],
                );
            }
        }
        self.finish(st, t_in, out)
    }

    /// [`StreamingConvTranspose1d::forward`] of one step for each of several streams, as
    /// [`StreamingConv1d::forward_streams`]: streams with few input rows share products (groups
    /// 1; depthwise runs each stream alone), each stream getting exactly what `forward` gives it.
    pub fn forward_streams(
        &self,
        calls: &mut [ConvCall<'_, ConvTr1dState>],
        act: PreActivation,
        scratch: &mut ConvScratch,
    ) {
        if self.depthwise {
            for c in calls.iter_mut() {
                self.forward(c.state, c.x, act, c.out);
            }
            return;
        }
        let t_ins: Vec<usize> = calls
            .iter_mut()
            .map(|c| self.load_input(c.state, c.x, act))
            .collect();
        let mut first = 0;
        while first < calls.len() {
            let last = shared_group_end(&t_ins, first, |rows| self.same_bits_rows(rows));
            self.product_streams(&mut calls[first..last], t_ins[first], scratch);
            first = last;
        }
        for (c, t_in) in calls.iter_mut().zip(t_ins) {
            self.finish(c.state, t_in, c.out);
        }
    }

    /// The products of streams with `t_in` input rows each (inputs loaded): one stream in
    /// place; several with their inputs stacked in `scratch`, and each tap block's output rows
    /// gathered there and scattered back (block by block, the order of the products alone).
    fn product_streams(
        &self,
        calls: &mut [ConvCall<'_, ConvTr1dState>],
        t_in: usize,
        scratch: &mut ConvScratch,
    ) {
        let (cout, s) = (self.out_channels, self.stride);
        if let [call] = calls {
            for (j0, j1) in self.tap_blocks() {
                let st = &mut *call.state;
                self.product_block(&st.xbuf, t_in, j0, j1, &mut st.acc[j0 * cout..]);
            }
            return;
        }
        scratch.windows.clear();
        for call in calls.iter() {
            scratch.windows.extend_from_slice(&call.state.xbuf);
        }
        for (j0, j1) in self.tap_blocks() {
            let n = (j1 - j0) * cout;
            scratch.out.clear();
            for call in calls.iter() {
                for i in 0..t_in {
                    let at = (i * s + j0) * cout;
                    scratch.out.extend_from_slice(&call.state.acc[at..at + n]);
                }
            }
            let m = calls.len() * t_in;
            self.weight.gemm(
                m,
                self.in_channels,
                n,
                &scratch.windows,
                self.in_channels,
                j0 * cout * self.in_channels,
                self.in_channels,
                &mut scratch.out,
                n,
                true,
            );
            for (call, rows) in calls.iter_mut().zip(scratch.out.chunks_exact(t_in * n)) {
                for (i, row) in rows.chunks_exact(n).enumerate() {
                    let at = (i * s + j0) * cout;
                    call.state.acc[at..at + n].copy_from_slice(row);
                }
            }
        }
    }

    /// Taps `[j0, j1)` of all inputs land on disjoint output rows: one product each.
    fn tap_blocks(&self) -> impl Iterator<Item = (usize, usize)> {
        let (k, s) = (self.kernel_size, self.stride);
        (0..k).step_by(s).map(move |j0| (j0, (j0 + s).min(k)))
    }

    /// The rows a product may stack while each keeps the bits of a product of `t_in` rows.
    fn same_bits_rows(&self, t_in: usize) -> usize {
        let (cin, cout) = (self.in_channels, self.out_channels);
        self.tap_blocks()
            .map(|(j0, _)| {
                self.weight
                    .gemm_same_bits_rows(t_in, cin, j0 * cout * cin, cin)
            })
            .min()
            .unwrap_or(usize::MAX)
    }

    /// Adds taps `[j0, j1)` of the `t_in` inputs `x` to `acc` (from the block's first row on,
    /// input rows `stride` output rows apart).
    fn product_block(&self, x: &[f32], t_in: usize, j0: usize, j1: usize, acc: &mut [f32]) {
        let (cin, cout) = (self.in_channels, self.out_channels);
        self.weight.gemm(
            t_in,
            cin,
            (j1 - j0) * cout,
            x,
            cin,
            j0 * cout * cin,
            cin,
            acc,
            self.stride * cout,
            true,
        );
    }

    /// Checks `x`, starts the overlap-add accumulator from the carried partial sums and (groups
    /// 1) activates the input into the state. Returns the input row count.
    fn load_input(&self, st: &mut ConvTr1dState, x: &[f32], act: PreActivation) -> usize {
        let (cin, cout, k, s) = (
            self.in_channels,
            self.out_channels,
            self.kernel_size,
            self.stride,
        );
        assert_eq!(
            x.len() % cin,
            0,
            "convtr input is not a whole number of rows"
        );
        let t_in = x.len() / cin;
        let tail = k - s;
        let rows = t_in * s + tail;
        st.acc.clear();
        st.acc.resize(rows * cout, 0.0);
        if st.partial.len() == tail * cout {
            st.acc[..tail * cout].copy_from_slice(&st.partial);
        }
        if !self.depthwise {
            st.xbuf.resize(x.len(), 0.0);
            act.copy_into(&mut st.xbuf, x);
        }
        t_in
    }

    /// The depthwise product (per channel, no matrix product).
    fn depthwise_product(
        &self,
        st: &mut ConvTr1dState,
        x: &[f32],
        act: PreActivation,
        t_in: usize,
    ) {
        let (cin, cout, k, s) = (
            self.in_channels,
            self.out_channels,
            self.kernel_size,
            self.stride,
        );
        let xin: &[f32] = match act {
            PreActivation::None => x,
            PreActivation::Elu => {
                st.xbuf.resize(x.len(), 0.0);
                act.copy_into(&mut st.xbuf, x);
                &st.xbuf
            }
        };
        for t in 0..t_in {
            let xr = &xin[t * cin..(t + 1) * cin];
            for j in 0..k {
                let orow = &mut st.acc[(t * s + j) * cout..(t * s + j + 1) * cout];
                for (c, o) in orow.iter_mut().enumerate() {
                    *o += xr[c] * self.weight.values()[c * k + j];
                }
            }
        }
    }

    /// Keeps the rows past `t_in * stride` as the next call's partial sums and writes the
    /// finished rows (plus bias) to `out`. Returns the output row count.
    fn finish(&self, st: &mut ConvTr1dState, t_in: usize, out: &mut Vec<f32>) -> usize {
        let (cout, s) = (self.out_channels, self.stride);
        st.partial.clear();
        st.partial.extend_from_slice(&st.acc[t_in * s * cout..]);
        out.clear();
        out.extend_from_slice(&st.acc[..t_in * s * cout]);
        if let Some(b) = &self.bias {
            for row in out.chunks_exact_mut(cout) {
                for (o, bv) in row.iter_mut().zip(b) {
                    *o += bv;
                }
            }
        }
        t_in * s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moshi_kernels::dense::elu;

    fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[allow(clippy::too_many_arguments)]
    /// Direct PyTorch-semantics causal conv (`[out, in, k]` weights) over `[t][in]` input.
    fn naive_conv(
        x: &[f32],
        cin: usize,
        w: &[f32],
        b: &[f32],
        cout: usize,
        k: usize,
        s: usize,
        d: usize,
        replicate: bool,
    ) -> Vec<f32> {
        let t = x.len() / cin;
        let pad = (k - 1) * d + 1 - s;
        let at = |i: isize, c: usize| -> f32 {
            if i >= 0 {
                x[i as usize * cin + c]
            } else if replicate {
                x[c]
            } else {
                0.0
            }
        };
        let t_out = t / s;
        let mut y = vec![0f32; t_out * cout];
        for to in 0..t_out {
            for o in 0..cout {
                let mut acc = b[o] as f64;
                for i in 0..cin {
                    for j in 0..k {
                        let pos = (to * s + j * d) as isize - pad as isize;
                        acc += (w[(o * cin + i) * k + j] * at(pos, i)) as f64;
                    }
                }
                y[to * cout + o] = acc as f32;
            }
        }
        y
    }

    #[allow(clippy::too_many_arguments)]
    fn naive_convtr(
        x: &[f32],
        cin: usize,
        w: &[f32],
        b: &[f32],
        cout: usize,
        k: usize,
        s: usize,
        depthwise: bool,
    ) -> Vec<f32> {
        let t = x.len() / cin;
        let mut y = vec![0f64; (t * s + k) * cout];
        for ti in 0..t {
            for j in 0..k {
                for o in 0..cout {
                    let v = if depthwise {
                        (x[ti * cin + o] * w[o * k + j]) as f64
                    } else {
                        (0..cin)
                            .map(|i| (x[ti * cin + i] * w[(i * cout + o) * k + j]) as f64)
                            .sum()
                    };
                    y[(ti * s + j) * cout + o] += v;
                }
            }
        }
        (0..t * s * cout)
            .map(|i| (y[i] + b[i % cout] as f64) as f32)
            .collect()
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    #[test]
    fn conv1d_batch_matches_naive_and_stream_matches_batch() {
        // (kernel, stride, dilation, replicate)
        for &(k, s, d, rep) in &[
            (7, 1, 1, false),
            (3, 1, 2, false),
            (8, 4, 1, false),
            (4, 2, 1, true),
            (1, 1, 1, false),
            (10, 5, 1, false),
        ] {
            let (cin, cout) = (5, 6);
            let w = rand_vec(cout * cin * k, 1 + k as u64);
            let b = rand_vec(cout, 2);
            let conv = StreamingConv1d::new(&w, Some(b.clone()), cin, cout, k, s, d, rep);
            let t = s * 30;
            let x = rand_vec(t * cin, 3 + s as u64);
            let mut batch = Vec::new();
            conv.forward(
                &mut Conv1dState::default(),
                &x,
                PreActivation::None,
                &mut batch,
                false,
            );
            let reference = naive_conv(&x, cin, &w, &b, cout, k, s, d, rep);
            assert!(
                max_diff(&batch, &reference) < 1e-5,
                "k{k} s{s} d{d}: batch vs naive {}",
                max_diff(&batch, &reference)
            );
            for chunk_steps in [1, 2, 3, 7] {
                let mut st = Conv1dState::default();
                let mut streamed = Vec::new();
                let mut out = Vec::new();
                for chunk in x.chunks(chunk_steps * s * cin) {
                    conv.forward(&mut st, chunk, PreActivation::None, &mut out, false);
                    streamed.extend_from_slice(&out);
                }
                assert!(
                    max_diff(&streamed, &batch) < 1e-5,
                    "k{k} s{s} d{d} chunk {chunk_steps}: stream vs batch"
                );
                // reset gives a fresh stream
                st.reset();
                conv.forward(&mut st, &x, PreActivation::None, &mut out, false);
                assert_eq!(out, batch);
            }
        }
    }

    #[test]
    fn conv1d_elu_preactivation_and_accumulate() {
        let (cin, cout, k) = (3, 4, 3);
        let w = rand_vec(cout * cin * k, 9);
        let b = rand_vec(cout, 10);
        let conv = StreamingConv1d::new(&w, Some(b.clone()), cin, cout, k, 1, 1, false);
        let x = rand_vec(20 * cin, 11);
        let xe: Vec<f32> = x.iter().map(|&v| elu(v)).collect();
        let mut y = Vec::new();
        conv.forward(
            &mut Conv1dState::default(),
            &x,
            PreActivation::Elu,
            &mut y,
            false,
        );
        assert!(max_diff(&y, &naive_conv(&xe, cin, &w, &b, cout, k, 1, 1, false)) < 1e-5);
        let base = rand_vec(20 * cout, 12);
        let mut acc = base.clone();
        conv.forward(
            &mut Conv1dState::default(),
            &x,
            PreActivation::Elu,
            &mut acc,
            true,
        );
        let expected: Vec<f32> = base.iter().zip(&y).map(|(a, b)| a + b).collect();
        assert!(max_diff(&acc, &expected) < 1e-5);
    }

    #[test]
    fn conv_transpose_batch_matches_naive_and_stream_matches_batch() {
        for &(s, depthwise) in &[
            (1, false),
            (2, false),
            (4, false),
            (5, false),
            (2, true),
            (3, true),
        ] {
            let k = 2 * s;
            let (cin, cout) = if depthwise { (6, 6) } else { (5, 7) };
            let w = rand_vec(
                if depthwise { cin * k } else { cin * cout * k },
                20 + s as u64,
            );
            let b = rand_vec(cout, 21);
            let convtr =
                StreamingConvTranspose1d::new(&w, Some(b.clone()), cin, cout, k, s, depthwise);
            let x = rand_vec(24 * cin, 22);
            let mut batch = Vec::new();
            convtr.forward(
                &mut ConvTr1dState::default(),
                &x,
                PreActivation::None,
                &mut batch,
            );
            let reference = naive_convtr(&x, cin, &w, &b, cout, k, s, depthwise);
            assert!(
                max_diff(&batch, &reference) < 1e-5,
                "s{s} dw {depthwise}: batch vs naive"
            );
            for chunk_steps in [1, 2, 5] {
                let mut st = ConvTr1dState::default();
                let (mut streamed, mut out) = (Vec::new(), Vec::new());
                for chunk in x.chunks(chunk_steps * cin) {
                    convtr.forward(&mut st, chunk, PreActivation::None, &mut out);
                    streamed.extend_from_slice(&out);
                }
                assert!(
                    max_diff(&streamed, &batch) < 1e-5,
                    "s{s} chunk {chunk_steps}: stream vs batch"
                );
                st.reset();
                convtr.forward(&mut st, &x, PreActivation::None, &mut out);
                assert_eq!(out, batch);
            }
        }
    }
}
