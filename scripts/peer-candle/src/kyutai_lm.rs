//! Kyutai's Rust crate (`moshi` 0.6.4, on candle) as its server runs Moshi 7B at 4 bits: an
//! `LmModel` of `lm::Config::v0_1_streaming(8)` (Moshi 7B; `--layers` of its 32 temporal layers)
//! loaded from a GGUF of random `Q4K` weights, stepped as `lm_generate_multistream::State::step_`
//! steps it: the temporal transformer and text head over the text token and 16 audio tokens,
//! the text token sampled, then the depformer's 8 slices each sampling one audio token.
//!
//! The GGUF holds every matrix as `Q4K` (4.5 bits per weight, as moshi-rs's q4 group 64) and the
//! norm gains as f32; the blocks are random bytes with fixed block scales (the step's time does
//! not depend on the values, only finite logits are checked). It is written to a temporary file
//! and read back by candle's own GGUF reader, the path `lm::load_lm_model` takes.

use std::io::Write;
use std::path::PathBuf;

use candle_core::quantized::{gguf_file, GgmlDType, QStorage, QTensor};
use candle_core::{Device, IndexOp, Tensor};
use candle_transformers::generation::{LogitsProcessor, Sampling};
use candle_transformers::quantized_var_builder::VarBuilder as QuantizedVarBuilder;
use moshi::lm::{Config, LmModel};
use moshi::nn::MaybeQuantizedVarBuilder;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Bytes of one `Q4K` block of 256 weights: f16 scale and minimum, 12 bytes of 6-bit sub-block
/// scales and minimums, 128 bytes of 4-bit codes.
const Q4K_BLOCK_BYTES: usize = 144;
const Q4K_BLOCK_WEIGHTS: usize = 256;
/// f16 bit patterns of the blocks' scale (2^-13) and minimum (2^-10): weights of about 0.02, the
/// scale of trained projections.
const BLOCK_SCALE_F16: u16 = 0x0800;
const BLOCK_MIN_F16: u16 = 0x1400;

/// Moshi 7B in candle's layout with `layers` temporal layers.
pub fn config(layers: usize) -> Config {
    let mut cfg = Config::v0_1_streaming(8);
    cfg.transformer.num_layers = layers;
    cfg
}

/// The gated feed-forward's hidden width, as `moshi` 0.6.4 derives it.
fn gating_hidden(d_model: usize, dim_feedforward: usize) -> usize {
    if dim_feedforward == 4 * d_model {
        11 * d_model / 4
    } else {
        2 * dim_feedforward / 3
    }
}

/// The tensors of one transformer's layers under `prefix`: (name, shape).
fn transformer_tensors(
    prefix: &str,
    cfg: &moshi::transformer::Config,
    out: &mut Vec<(String, Vec<usize>)>,
) {
    let d = cfg.d_model;
    let hidden = gating_hidden(d, cfg.dim_feedforward);
    for l in 0..cfg.num_layers {
        let layer = format!("{prefix}.layers.{l}");
        out.push((format!("{layer}.norm1.alpha"), vec![1, 1, d]));
        out.push((format!("{layer}.norm2.alpha"), vec![1, 1, d]));
        out.push((format!("{layer}.self_attn.in_proj_weight"), vec![3 * d, d]));
        out.push((format!("{layer}.self_attn.out_proj.weight"), vec![d, d]));
        out.push((
            format!("{layer}.gating.linear_in.weight"),
            vec![2 * hidden, d],
        ));
        out.push((format!("{layer}.gating.linear_out.weight"), vec![d, hidden]));
    }
}

/// Every tensor `LmModel::new` reads for `cfg` (candle's names, Kyutai's `import_rust.py`
/// layout): (name, shape).
fn tensor_shapes(cfg: &Config) -> Result<Vec<(String, Vec<usize>)>, Error> {
    let d = cfg.transformer.d_model;
    let mut out = vec![
        ("text_emb.weight".into(), vec![cfg.text_in_vocab_size, d]),
        ("out_norm.alpha".into(), vec![1, 1, d]),
        (
            "text_linear.weight".into(),
            vec![cfg.text_out_vocab_size, d],
        ),
    ];
    for k in 0..cfg.audio_codebooks {
        out.push((format!("emb.{k}.weight"), vec![cfg.audio_vocab_size, d]));
    }
    transformer_tensors("transformer", &cfg.transformer, &mut out);
    let dep = cfg
        .depformer
        .as_ref()
        .ok_or("the config has no depformer")?;
    let dep_d = dep.transformer.d_model;
    for k in 0..dep.num_slices {
        let slice = format!("depformer.{k}");
        let in_vocab = if k == 0 {
            cfg.text_in_vocab_size
        } else {
            cfg.audio_vocab_size
        };
        out.push((format!("{slice}.emb.weight"), vec![in_vocab, dep_d]));
        out.push((format!("{slice}.linear_in.weight"), vec![dep_d, d]));
        // The depformer cannot emit the audio padding token.
        let out_vocab = cfg.audio_vocab_size - 1;
        out.push((format!("{slice}.linear_out.weight"), vec![out_vocab, dep_d]));
        transformer_tensors(&format!("{slice}.transformer"), &dep.transformer, &mut out);
    }
    Ok(out)
}

/// Random `Q4K` blocks for `weights` weights (xorshift bytes, fixed block scales).
fn random_q4k_blocks(weights: usize, seed: u64) -> Vec<u8> {
    let blocks = weights / Q4K_BLOCK_WEIGHTS;
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut bytes = vec![0u8; blocks * Q4K_BLOCK_BYTES];
    for block in bytes.chunks_exact_mut(Q4K_BLOCK_BYTES) {
        block[0..2].copy_from_slice(&BLOCK_SCALE_F16.to_le_bytes());
        block[2..4].copy_from_slice(&BLOCK_MIN_F16.to_le_bytes());
        for word in block[4..].chunks_exact_mut(4) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            word.copy_from_slice(&(state as u32).to_le_bytes());
        }
    }
    bytes
}

/// One tensor of the GGUF: `Q4K` where its rows are whole blocks (every matrix), else ones in
/// f32 (the norm gains).
fn random_tensor(shape: &[usize], seed: u64) -> Result<QTensor, Error> {
    let count: usize = shape.iter().product();
    let cols = shape[shape.len() - 1];
    if shape.len() == 2 && cols.is_multiple_of(Q4K_BLOCK_WEIGHTS) {
        let bytes = random_q4k_blocks(count, seed);
        // Borrowed: candle 0.9.2's `from_data` reads an owned buffer after dropping it.
        let bytes = std::borrow::Cow::Borrowed(bytes.as_slice());
        let storage = QStorage::from_data(bytes, &Device::Cpu, GgmlDType::Q4K)?;
        Ok(QTensor::new(storage, shape)?)
    } else {
        let ones = Tensor::ones(shape, candle_core::DType::F32, &Device::Cpu)?;
        Ok(QTensor::quantize(&ones, GgmlDType::F32)?)
    }
}

/// A file removed when dropped (the GGUF, once read).
struct TemporaryFile(PathBuf);

impl Drop for TemporaryFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Writes the random GGUF of `cfg` to a temporary file; returns it and the bytes of the matrices
/// one step reads (every matrix but the embedding tables, of which a step reads one row each).
fn write_random_gguf(cfg: &Config) -> Result<(TemporaryFile, usize), Error> {
    let shapes = tensor_shapes(cfg)?;
    let mut tensors = Vec::with_capacity(shapes.len());
    let mut read_per_step = 0;
    for (i, (name, shape)) in shapes.iter().enumerate() {
        let tensor = random_tensor(shape, 0x6b79 + i as u64)?;
        let embedding_table = name.starts_with("emb.") || name.ends_with("emb.weight");
        if tensor.dtype() == GgmlDType::Q4K && !embedding_table {
            read_per_step += tensor.storage_size_in_bytes();
        }
        tensors.push((name.as_str(), tensor));
    }
    let path = std::env::temp_dir().join(format!("peer-candle-step-{}.gguf", std::process::id()));
    let file = TemporaryFile(path);
    let mut writer = std::io::BufWriter::new(std::fs::File::create(&file.0)?);
    let named: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (*n, t)).collect();
    gguf_file::write(&mut writer, &[], &named)?;
    writer.flush()?;
    Ok((file, read_per_step))
}

/// Kyutai's LM and its samplers (Kyutai's server defaults: text top-k 25 at 0.7, audio top-k 250
/// at 0.8).
pub struct KyutaiLm {
    model: LmModel,
    text_sampler: LogitsProcessor,
    audio_sampler: LogitsProcessor,
    text_token: u32,
    /// Matrix bytes one step reads.
    pub bytes_per_step: usize,
}

/// Milliseconds of one step's two parts.
#[derive(Clone, Copy, Default)]
pub struct KyutaiTimings {
    /// Embeddings, temporal transformer and text head (candle computes eagerly on the CPU).
    pub temporal_ms: f64,
    /// The text token's sampling and the depformer's 8 slices with theirs.
    pub depformer_ms: f64,
}

impl KyutaiLm {
    pub fn new(layers: usize) -> Result<Self, Error> {
        let cfg = config(layers);
        let (file, bytes_per_step) = write_random_gguf(&cfg)?;
        let weights = QuantizedVarBuilder::from_gguf(&file.0, &Device::Cpu)?;
        drop(file);
        let model = LmModel::new(&cfg, MaybeQuantizedVarBuilder::Quantized(weights))?;
        let sampler = |seed, k, temperature| {
            LogitsProcessor::from_sampling(seed, Sampling::TopK { k, temperature })
        };
        Ok(Self {
            model,
            text_sampler: sampler(4242, 25, 0.7),
            audio_sampler: sampler(4243, 250, 0.8),
            text_token: cfg.text_in_vocab_size as u32 - 1,
            bytes_per_step,
        })
    }

    /// One step fed its previous text token, `generated` (the codes of Moshi's own 8 streams)
    /// and `user` (the user's 8): what `State::step_` computes, without its bookkeeping of the
    /// delayed streams. The contest feeds fixed codes (the step's time does not depend on them).
    pub fn step(&mut self, generated: &[u32], user: &[u32]) -> Result<KyutaiTimings, Error> {
        let start = std::time::Instant::now();
        let token = |t: u32| Tensor::from_vec(vec![t], (1, 1), &Device::Cpu);
        let text = token(self.text_token)?;
        let audio = generated
            .iter()
            .chain(user)
            .map(|&t| token(t).map(Some))
            .collect::<Result<Vec<_>, _>>()?;
        let (logits, hidden) = self.model.forward(Some(text), audio, &().into())?;
        let temporal = start.elapsed();
        let logits = logits.i((0, 0))?;
        // As the engine's generator refuses them (a copy of 32000 values: microseconds).
        if logits.to_vec1::<f32>()?.iter().any(|v| !v.is_finite()) {
            return Err("Kyutai's LM: non-finite text logits".into());
        }
        self.text_token = self.text_sampler.sample(&logits)?;
        let codes = self.model.depformer_sample(
            &hidden,
            Some(self.text_token),
            &[],
            &mut self.audio_sampler,
        )?;
        let codes = codes.ok_or("the model has no depformer")?;
        if codes.len() != generated.len() {
            return Err(format!(
                "{} depformer codes, expected {}",
                codes.len(),
                generated.len()
            )
            .into());
        }
        Ok(KyutaiTimings {
            temporal_ms: temporal.as_secs_f64() * 1e3,
            depformer_ms: (start.elapsed() - temporal).as_secs_f64() * 1e3,
        })
    }
}
