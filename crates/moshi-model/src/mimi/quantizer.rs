//! Split residual vector quantizer: `rvq_first` (1 semantic codebook) and `rvq_rest` (acoustic
//! codebooks) each project the same latent with their own 1x1 `input_proj`, quantize residually,
//! and decode through their own `output_proj`; the two decodes are summed. Codebook vectors are
//! `embedding_sum / max(cluster_usage, 1e-5)`. Nearest neighbour: one matrix product per codebook
//! for `|c|² - 2 x·c`, then every candidate within rounding distance of the best is re-scored
//! exactly in f64 (ties go to the lowest index, like `argmin`).

use moshi_loader::config::QuantizerConfig;

use super::weights::WeightSource;
use super::matrix::{MimiWeights, WeightMatrix};
use crate::ops::gemm_nt_strided;
use crate::{ModelError, Result};

const CLUSTER_USAGE_EPSILON: f32 = 1e-5;

#[derive(Clone, Debug)]
struct Codebook {
    /// `[bins][dim]`.
    vectors: Vec<f32>,
    /// `|c|²` per entry.
    norms2: Vec<f32>,
    max_norm2: f32,
}

impl Codebook {
    fn load(src: &mut dyn WeightSource, prefix: &str, bins: usize, dim: usize) -> Result<Self> {
        let sum = src.tensor(&format!("{prefix}._codebook.embedding_sum"), &[bins, dim])?;
        let usage = src.tensor(&format!("{prefix}._codebook.cluster_usage"), &[bins])?;
        let mut vectors = sum;
        for (row, u) in vectors.chunks_exact_mut(dim).zip(&usage) {
            let denom = u.max(CLUSTER_USAGE_EPSILON);
            for v in row.iter_mut() {
                *v /= denom;
            }
        }
        let norms2: Vec<f32> = vectors.chunks_exact(dim).map(|r| r.iter().map(|v| v * v).sum()).collect();
        let max_norm2 = norms2.iter().copied().fold(0f32, f32::max);
        Ok(Self { vectors, norms2, max_norm2 })
    }
}

/// One residual VQ group with its projections.
#[derive(Clone, Debug)]
struct ResidualVq {
    /// `[dim][in]`.
    input_proj: WeightMatrix,
    /// `[out][dim]`.
    output_proj: WeightMatrix,
    codebooks: Vec<Codebook>,
}

impl ResidualVq {
    fn load(src: &mut dyn WeightSource, prefix: &str, cfg: &QuantizerConfig, n: usize) -> Result<Self> {
        let d = cfg.dimension;
        let input_proj = src.tensor(&format!("{prefix}.input_proj.weight"), &[d, cfg.input_dimension, 1])?;
        let output_proj = src.tensor(&format!("{prefix}.output_proj.weight"), &[cfg.output_dimension, d, 1])?;
        let codebooks = (0..n).map(|i| Codebook::load(src, &format!("{prefix}.vq.layers.{i}"), cfg.bins, d)).collect::<Result<_>>()?;
        Ok(Self {
            input_proj: WeightMatrix::new(input_proj, d, cfg.input_dimension),
            output_proj: WeightMatrix::new(output_proj, cfg.output_dimension, d),
            codebooks,
        })
    }
}

/// Scratch buffers of the quantizer (kept to avoid allocating per frame).
#[derive(Clone, Debug, Default)]
pub struct QuantizerScratch {
    residual: Vec<f32>,
    scores: Vec<f32>,
    sum: Vec<f32>,
    out: Vec<f32>,
}

/// Mimi's `SplitResidualVectorQuantizer`, restricted to the first `num_codebooks` codebooks.
#[derive(Clone, Debug)]
pub struct SplitQuantizer {
    first: ResidualVq,
    rest: Option<ResidualVq>,
    dim: usize,
    in_dim: usize,
    out_dim: usize,
    bins: usize,
    num_codebooks: usize,
}

impl SplitQuantizer {
    pub(crate) fn load(src: &mut dyn WeightSource, cfg: &QuantizerConfig, num_codebooks: usize) -> Result<Self> {
        if num_codebooks == 0 || num_codebooks > cfg.n_q {
            return Err(ModelError::Config(format!(
                "mimi: {num_codebooks} codebooks requested, the quantizer has 1..={} (n_q)",
                cfg.n_q
            )));
        }
        if cfg.bins == 0 || cfg.dimension == 0 {
            return Err(ModelError::Config(format!("mimi quantizer: bins {} / dimension {} must be positive", cfg.bins, cfg.dimension)));
        }
        let first = ResidualVq::load(src, "quantizer.rvq_first", cfg, 1)?;
        let rest = if num_codebooks > 1 { Some(ResidualVq::load(src, "quantizer.rvq_rest", cfg, num_codebooks - 1)?) } else { None };
        Ok(Self {
            first,
            rest,
            dim: cfg.dimension,
            in_dim: cfg.input_dimension,
            out_dim: cfg.output_dimension,
            bins: cfg.bins,
            num_codebooks,
        })
    }

    pub fn num_codebooks(&self) -> usize {
        self.num_codebooks
    }

    /// Weight precision of the projections' few-row products (codebooks stay f32).
    pub fn set_weights(&mut self, mode: MimiWeights) {
        for g in std::iter::once(&mut self.first).chain(self.rest.as_mut()) {
            g.input_proj.set_weights(mode);
            g.output_proj.set_weights(mode);
        }
    }

    pub fn bins(&self) -> usize {
        self.bins
    }

    pub fn input_dim(&self) -> usize {
        self.in_dim
    }

    pub fn output_dim(&self) -> usize {
        self.out_dim
    }

    /// `latent` (`[t][in]`) -> `codes` (`[t][num_codebooks]`, frame-major).
    pub fn encode(&self, latent: &[f32], scratch: &mut QuantizerScratch, codes: &mut [u32]) {
        let t = latent.len() / self.in_dim;
        let k = self.num_codebooks;
        assert_eq!(codes.len(), t * k, "codes buffer size");
        let mut offset = 0;
        for group in std::iter::once(&self.first).chain(self.rest.as_ref()) {
            let d = self.dim;
            scratch.residual.resize(t * d, 0.0);
            group.input_proj.gemm(t, self.in_dim, d, latent, self.in_dim, 0, self.in_dim, &mut scratch.residual, d, false);
            for cb in &group.codebooks {
                scratch.scores.resize(t * self.bins, 0.0);
                gemm_nt_strided(t, d, self.bins, &scratch.residual, d, &cb.vectors, d, 1, &mut scratch.scores, self.bins, false);
                for i in 0..t {
                    let x = &mut scratch.residual[i * d..(i + 1) * d];
                    let code = nearest(cb, x, &scratch.scores[i * self.bins..(i + 1) * self.bins], d);
                    codes[i * k + offset] = code as u32;
                    for (v, c) in x.iter_mut().zip(&cb.vectors[code * d..(code + 1) * d]) {
                        *v -= c;
                    }
                }
                offset += 1;
            }
        }
    }

    /// Checks every code against the codebook size. `codes` is `[t][num_codebooks]`.
    pub fn check_codes(&self, codes: &[u32]) -> Result<()> {
        if let Some((i, &c)) = codes.iter().enumerate().find(|(_, &c)| c as usize >= self.bins) {
            return Err(ModelError::Input(format!(
                "mimi: code {c} of codebook {} at frame {} is out of range (codebook size {})",
                i % self.num_codebooks,
                i / self.num_codebooks,
                self.bins
            )));
        }
        Ok(())
    }

    /// `codes` (`[t][num_codebooks]`, already checked) -> `latent` (`[t][out]`, resized).
    pub fn decode(&self, codes: &[u32], scratch: &mut QuantizerScratch, latent: &mut Vec<f32>) {
        let k = self.num_codebooks;
        let t = codes.len() / k;
        let d = self.dim;
        latent.clear();
        latent.resize(t * self.out_dim, 0.0);
        let mut offset = 0;
        for group in std::iter::once(&self.first).chain(self.rest.as_ref()) {
            scratch.sum.clear();
            scratch.sum.resize(t * d, 0.0);
            for (q, cb) in group.codebooks.iter().enumerate() {
                for i in 0..t {
                    let code = codes[i * k + offset + q] as usize;
                    for (s, c) in scratch.sum[i * d..(i + 1) * d].iter_mut().zip(&cb.vectors[code * d..(code + 1) * d]) {
                        *s += c;
                    }
                }
            }
            offset += group.codebooks.len();
            scratch.out.resize(t * self.out_dim, 0.0);
            group.output_proj.gemm(t, d, self.out_dim, &scratch.sum, d, 0, d, &mut scratch.out, self.out_dim, false);
            for (l, o) in latent.iter_mut().zip(&scratch.out) {
                *l += o;
            }
        }
    }
}

/// Index of the codebook entry nearest to `x`, given approximate scores `|c|² - 2 x·c`.
fn nearest(cb: &Codebook, x: &[f32], scores: &[f32], d: usize) -> usize {
    let mut best = f32::INFINITY;
    for (s, n2) in scores.iter().zip(&cb.norms2) {
        best = best.min(n2 - 2.0 * s);
    }
    let x_norm2: f32 = x.iter().map(|v| v * v).sum();
    // Rounding bound of the f32 score: a few ulps of the magnitudes involved.
    let tol = 1e-5 * (x_norm2 + cb.max_norm2) + f32::MIN_POSITIVE;
    let mut best_index = 0;
    let mut best_exact = f64::INFINITY;
    for (j, (s, n2)) in scores.iter().zip(&cb.norms2).enumerate() {
        if n2 - 2.0 * s <= best + tol {
            let c = &cb.vectors[j * d..(j + 1) * d];
            let exact: f64 = x.iter().zip(c).map(|(a, b)| (*a as f64 - *b as f64).powi(2)).sum();
            if exact < best_exact {
                best_exact = exact;
                best_index = j;
            }
        }
    }
    best_index
}
