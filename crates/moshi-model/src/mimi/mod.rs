//! Mimi, Kyutai's streaming neural audio codec: 24 kHz mono PCM <-> 12.5 Hz frames of RVQ codes.
//! Encode: SEANet encoder -> encoder transformer (25 Hz) -> learnt downsample (12.5 Hz) -> split
//! RVQ. Decode: RVQ lookup -> depthwise upsample (25 Hz) -> decoder transformer -> SEANet decoder.
//! The streaming path follows PyTorch `moshi` exactly (see `assets/tiny-a/MANIFEST.md`): one
//! 1920-sample frame at a time, 2 transformer steps per frame as one chunk.

pub mod conv;
pub mod quantizer;
pub mod resample;
pub mod seanet;
pub mod transformer;
mod weights;

pub use crate::nn::linear::{weight_bytes_read, ReducedPrecision as MimiWeights};

use std::path::Path;
use std::sync::Arc;

use moshi_loader::{MimiConfig, WeightMap};

use self::conv::{Conv1dState, ConvCall, ConvScratch, ConvTr1dState};
use self::quantizer::{QuantizerScratch, SplitQuantizer};
use self::resample::{Downsample, Upsample};
use self::seanet::{SeanetDecoder, SeanetDecoderState, SeanetEncoder, SeanetEncoderState};
use self::transformer::{AttentionMode, MimiTransformer, TransformerState};
use self::weights::{RandomWeights, WeightSource};
use crate::{ModelError, Result};

/// The immutable part of Mimi: every module's weights and shapes.
#[derive(Clone, Debug)]
struct MimiModules {
    encoder: SeanetEncoder,
    encoder_transformer: MimiTransformer,
    downsample: Downsample,
    quantizer: SplitQuantizer,
    upsample: Upsample,
    decoder_transformer: MimiTransformer,
    decoder: SeanetDecoder,
}

/// Streaming state of the encoder half, with its activation buffers.
#[derive(Clone, Debug)]
struct EncoderState {
    seanet: SeanetEncoderState,
    transformer: TransformerState,
    downsample: Conv1dState,
    quantizer: QuantizerScratch,
    latent25: Vec<f32>,
    latent12: Vec<f32>,
    codes: Vec<u32>,
    /// Buffers of the encodes this stream leads ([`Mimi::encode_frames`]).
    streams: StreamsScratch,
}

/// Buffers of several streams' shared products: the convolutions' gathered windows, and the
/// quantizer's stacked latents and codes.
#[derive(Clone, Debug, Default)]
struct StreamsScratch {
    conv: ConvScratch,
    quantizer: QuantizerScratch,
    latent: Vec<f32>,
    codes: Vec<u32>,
}

/// Streaming state of the decoder half, with its activation buffers.
#[derive(Clone, Debug)]
struct DecoderState {
    /// Codebooks a frame brings (the quantizer's, or fewer: [`Mimi::set_decode_codebooks`]).
    codebooks: usize,
    quantizer: QuantizerScratch,
    upsample: ConvTr1dState,
    transformer: TransformerState,
    seanet: SeanetDecoderState,
    latent12: Vec<f32>,
    latent25: Vec<f32>,
    pcm: Vec<f32>,
    /// Buffers of the decodes this stream leads ([`Mimi::decode_frames`]).
    streams: ConvScratch,
}

/// The Mimi codec with its streaming encoder and decoder states. The weights are shared: a
/// clone is another stream (its own states) over the same weights.
#[derive(Clone, Debug)]
pub struct Mimi {
    modules: Arc<MimiModules>,
    encoder_state: EncoderState,
    decoder_state: DecoderState,
    sample_rate: usize,
    frame_size: usize,
    weights: MimiWeights,
}

impl Mimi {
    /// Builds Mimi from the weights of a checkpoint (`moshi_loader::mimi_weights::load_mimi_weights`
    /// of e.g. `tokenizer-e351c8d8-checkpoint125.safetensors`), using the first `num_codebooks`
    /// codebooks. Every tensor's shape is checked against `cfg`, and a tensor left unused means
    /// the checkpoint was made for another config: an error naming it.
    pub fn load(cfg: &MimiConfig, mut weights: WeightMap, num_codebooks: usize) -> Result<Mimi> {
        let mimi = Self::build(cfg, &mut weights, num_codebooks)?;
        let left = weights.remaining();
        if !left.is_empty() {
            return Err(ModelError::UnusedTensors {
                path: weights.source().to_path_buf(),
                count: left.len(),
                config: format!(
                    "Mimi with {num_codebooks} codebooks, {} SEANet stages, {} transformer layers",
                    cfg.seanet.ratios.len(),
                    cfg.transformer.num_layers
                ),
                shown: left.iter().take(5).cloned().collect::<Vec<_>>().join(", "),
            });
        }
        Ok(mimi)
    }

    /// A Mimi of the given shape with deterministic random weights (for benchmarks and tests of
    /// shapes whose checkpoint is not at hand). Same seed, same weights.
    pub fn random(cfg: &MimiConfig, num_codebooks: usize, seed: u64) -> Result<Mimi> {
        let mut src = RandomWeights::new(seed);
        Self::build(cfg, &mut src, num_codebooks)
    }

    fn build(cfg: &MimiConfig, src: &mut dyn WeightSource, num_codebooks: usize) -> Result<Mimi> {
        // A no-op for a config read by `MimiConfig::from_file` (validated there); a config built
        // or changed in code is checked before anything is allocated from it.
        cfg.validate(Path::new("<Mimi config>"))?;
        let frame_size = cfg.frame_size_samples();
        let encoder = SeanetEncoder::load(src, "encoder", &cfg.seanet)?;
        let stride = frame_size / encoder.hop();
        let dim = cfg.seanet.dimension;
        let encoder_transformer =
            MimiTransformer::load(src, "encoder_transformer", &cfg.transformer)?;
        let downsample = Downsample::load(src, dim, stride)?;
        let quantizer = SplitQuantizer::load(src, &cfg.quantizer, num_codebooks)?;
        let upsample = Upsample::load(src, dim, stride)?;
        let decoder_transformer =
            MimiTransformer::load(src, "decoder_transformer", &cfg.transformer)?;
        let decoder = SeanetDecoder::load(src, "decoder", &cfg.seanet)?;
        let modules = MimiModules {
            encoder,
            encoder_transformer,
            downsample,
            quantizer,
            upsample,
            decoder_transformer,
            decoder,
        };
        let encoder_state = modules.new_encoder_state();
        let decoder_state = modules.new_decoder_state();
        Ok(Mimi {
            modules: Arc::new(modules),
            encoder_state,
            decoder_state,
            sample_rate: cfg.sample_rate,
            frame_size,
            weights: MimiWeights::F32,
        })
    }

    /// Weight precision of the per-frame products (see [`MimiWeights`]). [`MimiWeights::F32`]
    /// (the default) is exact f32 math, the reference behaviour. The other modes keep a reduced
    /// copy of the weights of every product that runs on few rows per call (bf16: at most 4, q8:
    /// at most 16; the transformers, the 12.5/25 Hz and the deepest SEANet convolutions, the
    /// quantizer projections) and read it instead: the streaming path is bound by weight
    /// bandwidth, so fewer bytes are less time. Activations and accumulation stay f32; the
    /// codebooks (whose streaming scoring is exact in every mode), the depthwise upsampler and
    /// the many-row 24 kHz-side convolutions stay f32. Costs the memory of the reduced copies.
    /// Weights shared with clones are copied first (set the mode before cloning streams).
    pub fn set_weights(&mut self, mode: MimiWeights) {
        if mode == self.weights {
            return;
        }
        let m = Arc::make_mut(&mut self.modules);
        m.encoder.set_weights(mode);
        m.encoder_transformer.set_weights(mode);
        m.downsample.set_weights(mode);
        m.quantizer.set_weights(mode);
        m.decoder_transformer.set_weights(mode);
        m.decoder.set_weights(mode);
        self.weights = mode;
    }

    /// The mode set by [`Mimi::set_weights`].
    pub fn weights(&self) -> MimiWeights {
        self.weights
    }

    /// Samples per frame (1920 at 24 kHz).
    pub fn frame_size_samples(&self) -> usize {
        self.frame_size
    }

    /// Codebooks produced per frame.
    pub fn num_codebooks(&self) -> usize {
        self.modules.quantizer.num_codebooks()
    }

    /// Entries per codebook (valid codes are `0..cardinality`).
    pub fn cardinality(&self) -> usize {
        self.modules.quantizer.bins()
    }

    pub fn sample_rate(&self) -> usize {
        self.sample_rate
    }

    /// Resets both streaming states (encoder and decoder) to the start of a stream.
    pub fn reset(&mut self) {
        self.reset_encoder();
        self.reset_decoder();
    }

    pub fn reset_encoder(&mut self) {
        let st = &mut self.encoder_state;
        st.seanet.reset();
        st.transformer.reset();
        st.downsample.reset();
    }

    pub fn reset_decoder(&mut self) {
        let st = &mut self.decoder_state;
        st.upsample.reset();
        st.transformer.reset();
        st.seanet.reset();
    }

    /// Streaming encode of exactly one frame -> `num_codebooks` codes.
    pub fn encode_frame(&mut self, pcm: &[f32]) -> Result<Vec<u32>> {
        let mut codes = vec![0u32; self.num_codebooks()];
        self.encode_frame_into(pcm, &mut codes)?;
        Ok(codes)
    }

    /// Allocation-free variant of [`Mimi::encode_frame`]: `codes` must hold `num_codebooks` entries.
    pub fn encode_frame_into(&mut self, pcm: &[f32], codes: &mut [u32]) -> Result<()> {
        self.check_encode(pcm, codes)?;
        let _span = tracing::trace_span!("mimi_encode").entered();
        self.modules
            .encode(&mut self.encoder_state, pcm, AttentionMode::Streaming);
        codes.copy_from_slice(&self.encoder_state.codes);
        Ok(())
    }

    /// Streaming encode of any whole number of frames (frame by frame, so the result does not
    /// depend on how the audio was chunked) -> codes `[codebook][frame]`.
    pub fn encode_step(&mut self, pcm: &[f32]) -> Result<Vec<Vec<u32>>> {
        if !pcm.len().is_multiple_of(self.frame_size) {
            return Err(ModelError::WrongLength {
                what: "mimi encode_step: samples (a whole number of frames)",
                expected: pcm.len() / self.frame_size * self.frame_size,
                got: pcm.len(),
            });
        }
        let k = self.num_codebooks();
        let frames = pcm.len() / self.frame_size;
        let mut out = vec![Vec::with_capacity(frames); k];
        let mut codes = vec![0u32; k];
        for frame in pcm.chunks_exact(self.frame_size) {
            self.encode_frame_into(frame, &mut codes)?;
            for (o, c) in out.iter_mut().zip(&codes) {
                o.push(*c);
            }
        }
        Ok(out)
    }

    /// Non-streaming encode of a whole signal (zero-padded to whole frames), with fresh state,
    /// like PyTorch's `mimi.encode` outside `streaming()` -> codes `[codebook][frame]`.
    pub fn encode_batch(&self, pcm: &[f32]) -> Result<Vec<Vec<u32>>> {
        if pcm.is_empty() {
            return Err(ModelError::EmptySignal);
        }
        let frames = pcm.len().div_ceil(self.frame_size);
        let mut padded = pcm.to_vec();
        padded.resize(frames * self.frame_size, 0.0);
        let mut st = self.modules.new_encoder_state();
        self.modules.encode(&mut st, &padded, AttentionMode::Batch);
        Ok(transpose_codes(&st.codes, frames, self.num_codebooks()))
    }

    /// Decodes frames of the first `codebooks` codebooks from now on (Kyutai's
    /// `set_num_codebooks`, as its TTS does when it generates fewer codebooks than it has);
    /// this stream only, the weights untouched.
    pub fn set_decode_codebooks(&mut self, codebooks: usize) -> Result<()> {
        if codebooks == 0 || codebooks > self.num_codebooks() {
            return Err(ModelError::CodebooksUnavailable {
                requested: codebooks,
                available: self.num_codebooks(),
            });
        }
        self.decoder_state.codebooks = codebooks;
        Ok(())
    }

    /// Streaming decode of one frame of `num_codebooks` codes (or as many as
    /// [`Mimi::set_decode_codebooks`] says) -> `frame_size` samples.
    pub fn decode_frame(&mut self, codes: &[u32]) -> Result<Vec<f32>> {
        let mut pcm = vec![0f32; self.frame_size];
        self.decode_frame_into(codes, &mut pcm)?;
        Ok(pcm)
    }

    /// Allocation-free variant of [`Mimi::decode_frame`]: `pcm` must hold `frame_size` samples.
    pub fn decode_frame_into(&mut self, codes: &[u32], pcm: &mut [f32]) -> Result<()> {
        self.check_decode(codes, pcm)?;
        let _span = tracing::trace_span!("mimi_decode").entered();
        self.modules
            .decode(&mut self.decoder_state, codes, AttentionMode::Streaming);
        pcm.copy_from_slice(&self.decoder_state.pcm);
        Ok(())
    }

    /// Streaming encode of one frame for each of several streams at once (the sessions of a
    /// server): `pcms[i]` into `codes[i]` for `mimis[i]`. The streams that share their weights
    /// with the first valid one run together: the encoder transformer once for all of them
    /// ([`MimiTransformer::forward_streams`]), the SEANet encoder, the downsampling and the
    /// quantizer in products shared by as many of them as each kernel takes without changing
    /// its sums ([`SeanetEncoder::forward_streams`]): the weights read once for several streams.
    /// The others run alone. Stream `i` gets what [`Mimi::encode_frame_into`] gives it alone,
    /// bit for bit; its error (a wrong length) is its own.
    ///
    /// # Panics
    /// If the three slices differ in length (caller bug).
    pub fn encode_frames(
        mimis: &mut [&mut Mimi],
        pcms: &[&[f32]],
        codes: &mut [&mut [u32]],
    ) -> Vec<Result<()>> {
        assert!(
            mimis.len() == pcms.len() && mimis.len() == codes.len(),
            "mimi encode_frames: one frame and one codes buffer per stream"
        );
        let checked: Vec<Result<()>> = mimis
            .iter()
            .zip(pcms)
            .zip(codes.iter())
            .map(|((m, pcm), c)| m.check_encode(pcm, c))
            .collect();
        let batch = shared_batch(mimis, &checked);
        let _span = tracing::trace_span!("mimi_encode", streams = batch.len()).entered();
        for (i, (m, pcm)) in mimis.iter_mut().zip(pcms).enumerate() {
            if checked[i].is_ok() && !batch.contains(&i) {
                m.modules
                    .encode(&mut m.encoder_state, pcm, AttentionMode::Streaming);
            }
        }
        if let Some(&lead) = batch.first() {
            let modules = Arc::clone(&mimis[lead].modules);
            let mut scratch = std::mem::take(&mut mimis[lead].encoder_state.streams);
            let batch_pcms: Vec<&[f32]> = batch.iter().map(|&i| pcms[i]).collect();
            modules.encoder_streams(
                &mut encoder_states(mimis, &batch),
                &batch_pcms,
                &mut scratch,
            );
            transformer_streams(
                mimis,
                &batch,
                |m| &m.encoder_transformer,
                |m| {
                    let st = &mut m.encoder_state;
                    (&mut st.transformer, &mut st.latent25)
                },
            );
            modules
                .encode_after_transformer_streams(&mut encoder_states(mimis, &batch), &mut scratch);
            mimis[lead].encoder_state.streams = scratch;
        }
        for ((m, c), r) in mimis.iter().zip(codes.iter_mut()).zip(&checked) {
            if r.is_ok() {
                c.copy_from_slice(&m.encoder_state.codes);
            }
        }
        checked
    }

    /// Streaming decode of one frame for each of several streams at once: `codes[i]` into
    /// `pcms[i]` for `mimis[i]`, the decoder transformer once for the streams sharing weights and
    /// the SEANet decoder in shared products (as [`Mimi::encode_frames`]). Stream `i` gets what [`Mimi::decode_frame_into`] gives it alone,
    /// bit for bit; its error (a wrong length, a code out of range) is its own.
    ///
    /// # Panics
    /// If the three slices differ in length (caller bug).
    pub fn decode_frames(
        mimis: &mut [&mut Mimi],
        codes: &[&[u32]],
        pcms: &mut [&mut [f32]],
    ) -> Vec<Result<()>> {
        assert!(
            mimis.len() == codes.len() && mimis.len() == pcms.len(),
            "mimi decode_frames: one codes frame and one output buffer per stream"
        );
        let checked: Vec<Result<()>> = mimis
            .iter()
            .zip(codes)
            .zip(pcms.iter())
            .map(|((m, c), pcm)| m.check_decode(c, pcm))
            .collect();
        let batch = shared_batch(mimis, &checked);
        let _span = tracing::trace_span!("mimi_decode", streams = batch.len()).entered();
        for (i, (m, c)) in mimis.iter_mut().zip(codes).enumerate() {
            if checked[i].is_err() {
                continue;
            }
            if batch.contains(&i) {
                m.modules.decode_before_transformer(&mut m.decoder_state, c);
            } else {
                m.modules
                    .decode(&mut m.decoder_state, c, AttentionMode::Streaming);
            }
        }
        let streams = transformer_streams(
            mimis,
            &batch,
            |m| &m.decoder_transformer,
            |m| {
                let st = &mut m.decoder_state;
                (&mut st.transformer, &mut st.latent25)
            },
        );
        if let Some(modules) = streams {
            let lead = batch[0];
            let mut scratch = std::mem::take(&mut mimis[lead].decoder_state.streams);
            let mut states: Vec<&mut DecoderState> = mimis
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| batch.contains(i))
                .map(|(_, m)| &mut m.decoder_state)
                .collect();
            modules.decoder_streams(&mut states, &mut scratch);
            mimis[lead].decoder_state.streams = scratch;
        }
        for ((m, pcm), r) in mimis.iter().zip(pcms.iter_mut()).zip(&checked) {
            if r.is_ok() {
                pcm.copy_from_slice(&m.decoder_state.pcm);
            }
        }
        checked
    }

    /// The checks of a streaming encode: a frame of samples in, a codes buffer of
    /// `num_codebooks` out.
    fn check_encode(&self, pcm: &[f32], codes: &[u32]) -> Result<()> {
        if pcm.len() != self.frame_size {
            return Err(ModelError::WrongLength {
                what: "mimi encode: samples per frame",
                expected: self.frame_size,
                got: pcm.len(),
            });
        }
        if codes.len() != self.num_codebooks() {
            return Err(ModelError::WrongLength {
                what: "mimi encode: codes buffer (codebooks)",
                expected: self.num_codebooks(),
                got: codes.len(),
            });
        }
        Ok(())
    }

    /// The checks of a streaming decode: `num_codebooks` codes in range in, a frame of samples
    /// out.
    fn check_decode(&self, codes: &[u32], pcm: &[f32]) -> Result<()> {
        if codes.len() != self.decoder_state.codebooks {
            return Err(ModelError::WrongLength {
                what: "mimi decode: codes per frame",
                expected: self.decoder_state.codebooks,
                got: codes.len(),
            });
        }
        if pcm.len() != self.frame_size {
            return Err(ModelError::WrongLength {
                what: "mimi decode: output buffer (samples)",
                expected: self.frame_size,
                got: pcm.len(),
            });
        }
        self.modules.quantizer.check_codes(codes)
    }

    /// Checks frame-major codes (`[frame][codebook]`, any number of whole frames) for range;
    /// the error names the codebook and the frame of the first bad code.
    pub fn check_codes(&self, frame_major: &[u32]) -> Result<()> {
        let k = self.num_codebooks();
        if !frame_major.len().is_multiple_of(k) {
            return Err(ModelError::WrongLength {
                what: "mimi: codes (a whole number of frames)",
                expected: frame_major.len() / k * k,
                got: frame_major.len(),
            });
        }
        self.modules.quantizer.check_codes(frame_major)
    }

    /// Streaming decode of codes `[codebook][frame]`, frame by frame -> PCM.
    pub fn decode_step(&mut self, codes: &[Vec<u32>]) -> Result<Vec<f32>> {
        let flat = self.flatten_checked(codes)?;
        let k = self.num_codebooks();
        let mut out = Vec::with_capacity(flat.len() / k * self.frame_size);
        for frame_codes in flat.chunks_exact(k) {
            self.modules.decode(
                &mut self.decoder_state,
                frame_codes,
                AttentionMode::Streaming,
            );
            out.extend_from_slice(&self.decoder_state.pcm);
        }
        Ok(out)
    }

    /// Non-streaming decode of codes `[codebook][frame]` with fresh state -> PCM.
    pub fn decode_batch(&self, codes: &[Vec<u32>]) -> Result<Vec<f32>> {
        let flat = self.flatten_checked(codes)?;
        let mut st = self.modules.new_decoder_state();
        self.modules.decode(&mut st, &flat, AttentionMode::Batch);
        Ok(st.pcm)
    }

    /// `[codebook][frame]` -> frame-major codes, checking the shape and every code's range.
    fn flatten_checked(&self, codes: &[Vec<u32>]) -> Result<Vec<u32>> {
        let k = self.num_codebooks();
        if codes.len() != k {
            return Err(ModelError::WrongLength {
                what: "mimi decode: codebooks",
                expected: k,
                got: codes.len(),
            });
        }
        let frames = codes[0].len();
        if let Some((q, row)) = codes.iter().enumerate().find(|(_, r)| r.len() != frames) {
            return Err(ModelError::RaggedCodes {
                codebook: q,
                frames: row.len(),
                first_frames: frames,
            });
        }
        let mut flat = vec![0u32; frames * k];
        for (q, row) in codes.iter().enumerate() {
            for (t, &c) in row.iter().enumerate() {
                flat[t * k + q] = c;
            }
        }
        self.modules.quantizer.check_codes(&flat)?;
        Ok(flat)
    }
}

/// The encoder states of the streams `batch` of `mimis`.
fn encoder_states<'a>(mimis: &'a mut [&mut Mimi], batch: &[usize]) -> Vec<&'a mut EncoderState> {
    mimis
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| batch.contains(i))
        .map(|(_, m)| &mut m.encoder_state)
        .collect()
}

/// The streams of a batched step whose transformer runs together: those that passed their checks
/// and share their weights (the same modules) with the first of them.
fn shared_batch(mimis: &[&mut Mimi], checked: &[Result<()>]) -> Vec<usize> {
    let valid = || (0..mimis.len()).filter(|&i| checked[i].is_ok());
    let Some(first) = valid().next() else {
        return Vec::new();
    };
    valid()
        .filter(|&i| Arc::ptr_eq(&mimis[i].modules, &mimis[first].modules))
        .collect()
}

fn transpose_codes(frame_major: &[u32], frames: usize, k: usize) -> Vec<Vec<u32>> {
    (0..k)
        .map(|q| (0..frames).map(|t| frame_major[t * k + q]).collect())
        .collect()
}

impl MimiModules {
    fn new_encoder_state(&self) -> EncoderState {
        EncoderState {
            seanet: self.encoder.new_state(),
            transformer: self.encoder_transformer.new_state(),
            downsample: Conv1dState::default(),
            quantizer: QuantizerScratch::default(),
            latent25: Vec::new(),
            latent12: Vec::new(),
            codes: Vec::new(),
            streams: StreamsScratch::default(),
        }
    }

    fn new_decoder_state(&self) -> DecoderState {
        DecoderState {
            codebooks: self.quantizer.num_codebooks(),
            quantizer: QuantizerScratch::default(),
            upsample: ConvTr1dState::default(),
            transformer: self.decoder_transformer.new_state(),
            seanet: self.decoder.new_state(),
            latent12: Vec::new(),
            latent25: Vec::new(),
            pcm: Vec::new(),
            streams: ConvScratch::default(),
        }
    }

    /// PCM (whole frames) -> `st.codes` (`[frame][codebook]`).
    fn encode(&self, st: &mut EncoderState, pcm: &[f32], mode: AttentionMode) {
        self.encoder.forward(&mut st.seanet, pcm, &mut st.latent25);
        self.encoder_transformer
            .forward(&mut st.transformer, &mut st.latent25, mode);
        self.encode_after_transformer(st);
    }

    /// The 25 Hz latent (`st.latent25`, through the transformer) -> `st.codes`.
    fn encode_after_transformer(&self, st: &mut EncoderState) {
        self.downsample
            .forward(&mut st.downsample, &st.latent25, &mut st.latent12);
        let frames = st.latent12.len() / self.quantizer.input_dim();
        st.codes.resize(frames * self.quantizer.num_codebooks(), 0);
        self.quantizer
            .encode(&st.latent12, &mut st.quantizer, &mut st.codes);
    }

    /// [`SeanetEncoder::forward`] of several streams' frames (`pcms[i]` into `states[i]`'s 25 Hz
    /// latent), the products shared.
    fn encoder_streams(
        &self,
        states: &mut [&mut EncoderState],
        pcms: &[&[f32]],
        scratch: &mut StreamsScratch,
    ) {
        let (mut seanets, mut latents): (Vec<_>, Vec<_>) = states
            .iter_mut()
            .map(|st| (&mut st.seanet, &mut st.latent25))
            .unzip();
        self.encoder
            .forward_streams(&mut seanets, pcms, &mut latents, &mut scratch.conv);
    }

    /// [`MimiModules::encode_after_transformer`] of several streams (each the same number of
    /// rows), the downsampling's and the quantizer's products shared.
    fn encode_after_transformer_streams(
        &self,
        states: &mut [&mut EncoderState],
        scratch: &mut StreamsScratch,
    ) {
        let mut calls: Vec<ConvCall<'_>> = states
            .iter_mut()
            .map(|st| ConvCall {
                state: &mut st.downsample,
                x: &st.latent25[..],
                out: &mut st.latent12,
            })
            .collect();
        self.downsample
            .forward_streams(&mut calls, &mut scratch.conv);
        let frame_len = states[0].latent12.len();
        let rows = frame_len / self.quantizer.input_dim();
        let k = self.quantizer.num_codebooks();
        scratch.latent.clear();
        for st in states.iter() {
            assert_eq!(
                st.latent12.len(),
                frame_len,
                "mimi: streams of unequal frames"
            );
            scratch.latent.extend_from_slice(&st.latent12);
        }
        scratch.codes.clear();
        scratch.codes.resize(states.len() * rows * k, 0);
        self.quantizer.encode_streams(
            &scratch.latent,
            rows,
            &mut scratch.quantizer,
            &mut scratch.codes,
        );
        for (st, codes) in states.iter_mut().zip(scratch.codes.chunks_exact(rows * k)) {
            st.codes.clear();
            st.codes.extend_from_slice(codes);
        }
    }

    /// [`SeanetDecoder::forward`] of several streams' 25 Hz latents into their PCM, the products
    /// shared.
    fn decoder_streams(&self, states: &mut [&mut DecoderState], scratch: &mut ConvScratch) {
        let mut seanets = Vec::with_capacity(states.len());
        let mut latents = Vec::with_capacity(states.len());
        let mut pcms = Vec::with_capacity(states.len());
        for st in states.iter_mut() {
            let DecoderState {
                seanet,
                latent25,
                pcm,
                ..
            } = &mut **st;
            seanets.push(seanet);
            latents.push(&latent25[..]);
            pcms.push(pcm);
        }
        self.decoder
            .forward_streams(&mut seanets, &latents, &mut pcms, scratch);
    }

    /// Codes (`[frame][codebook]`, checked) -> `st.pcm`.
    fn decode(&self, st: &mut DecoderState, codes: &[u32], mode: AttentionMode) {
        self.decode_before_transformer(st, codes);
        self.decoder_transformer
            .forward(&mut st.transformer, &mut st.latent25, mode);
        self.decoder
            .forward(&mut st.seanet, &st.latent25, &mut st.pcm);
    }

    /// Codes -> the 25 Hz latent `st.latent25` the decoder transformer takes.
    fn decode_before_transformer(&self, st: &mut DecoderState, codes: &[u32]) {
        self.quantizer
            .decode(codes, st.codebooks, &mut st.quantizer, &mut st.latent12);
        self.upsample
            .forward(&mut st.upsample, &st.latent12, &mut st.latent25);
    }
}

/// Runs the transformer `which` picks over the 25 Hz latents of the streams `batch` of `mimis`
/// (which share their modules) at once ([`MimiTransformer::forward_streams`]); `half` gives a
/// stream's transformer state and latent (each the same number of rows). Returns the shared
/// modules, `None` for an empty batch.
fn transformer_streams(
    mimis: &mut [&mut Mimi],
    batch: &[usize],
    which: impl Fn(&MimiModules) -> &MimiTransformer,
    half: impl Fn(&mut Mimi) -> (&mut TransformerState, &mut Vec<f32>),
) -> Option<Arc<MimiModules>> {
    let modules = Arc::clone(&mimis[*batch.first()?].modules);
    let transformer = which(&modules);
    let (mut states, mut latents): (Vec<_>, Vec<_>) = mimis
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| batch.contains(i))
        .map(|(_, m)| half(m))
        .unzip();
    if let [latent] = &mut latents[..] {
        // One stream: through the transformer in place.
        let rows = latent.len() / transformer.dim();
        transformer.forward_streams(&mut states, latent, rows);
        return Some(modules);
    }
    let frame_len = latents[0].len();
    let mut gathered = Vec::with_capacity(latents.len() * frame_len);
    for latent in &latents {
        assert_eq!(latent.len(), frame_len, "mimi: streams of unequal frames");
        gathered.extend_from_slice(latent);
    }
    transformer.forward_streams(&mut states, &mut gathered, frame_len / transformer.dim());
    for (latent, rows) in latents.into_iter().zip(gathered.chunks_exact(frame_len)) {
        latent.copy_from_slice(rows);
    }
    Some(modules)
}
