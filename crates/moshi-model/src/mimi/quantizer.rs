//! Split residual vector quantizer: `rvq_first` (1 semantic codebook) and `rvq_rest` (acoustic
//! codebooks) each project the same latent with their own 1x1 `input_proj`, quantize residually,
//! and decode through their own `output_proj`; the two decodes are summed. Codebook vectors are
//! `embedding_sum / max(cluster_usage, 1e-5)`. Nearest neighbour: one matrix product per codebook
//! for `|c|² - 2 x·c`, then every candidate within rounding distance of the best is re-scored
//! exactly in f64 (ties go to the lowest index, like `argmin`). The products score against a
//! bf16 copy of the codebook in column panels (half the bytes, every row of a call in one pass over
//! them; the candidate margin covers the bf16 rounding, so the chosen code is still the exact
//! argmin, whatever the rows scored together).

use moshi_kernels::dense::{gemm_nt_panels, PanelBlock, PanelMatrix};
use moshi_loader::config::QuantizerConfig;

use super::weights::WeightSource;
use super::MimiWeights;
use crate::nn::linear::count_bytes;
use crate::nn::Linear;
use crate::{ModelError, Result};

const CLUSTER_USAGE_EPSILON: f32 = 1e-5;

#[derive(Clone, Debug)]
struct Codebook {
    /// `[bins][dim]`.
    vectors: Vec<f32>,
    /// The vectors rounded to bf16, in the scoring kernel's panels.
    panels: PanelMatrix,
    /// `|c|²` per entry.
    norms2: Vec<f32>,
    max_norm2: f32,
}

/// Bound on the relative rounding error of f32 -> bf16 (round to nearest even): 2^-9.
const BF16_RELATIVE_ERROR: f32 = 1.0 / 512.0;

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
        let norms2: Vec<f32> = vectors
            .chunks_exact(dim)
            .map(|r| r.iter().map(|v| v * v).sum())
            .collect();
        let max_norm2 = norms2.iter().copied().fold(0f32, f32::max);
        let panels = PanelMatrix::bf16(&vectors, bins, dim);
        Ok(Self {
            vectors,
            panels,
            norms2,
            max_norm2,
        })
    }
}

/// One residual VQ group with its projections.
#[derive(Clone, Debug)]
struct ResidualVq {
    /// `[dim][in]`.
    input_proj: Linear,
    /// `[out][dim]`.
    output_proj: Linear,
    codebooks: Vec<Codebook>,
}

impl ResidualVq {
    fn load(
        src: &mut dyn WeightSource,
        prefix: &str,
        cfg: &QuantizerConfig,
        n: usize,
    ) -> Result<Self> {
        let d = cfg.dimension;
        let input_proj = src.tensor(
            &format!("{prefix}.input_proj.weight"),
            &[d, cfg.input_dimension, 1],
        )?;
        let output_proj = src.tensor(
            &format!("{prefix}.output_proj.weight"),
            &[cfg.output_dimension, d, 1],
        )?;
        let codebooks = (0..n)
            .map(|i| Codebook::load(src, &format!("{prefix}.vq.layers.{i}"), cfg.bins, d))
            .collect::<Result<_>>()?;
        Ok(Self {
            input_proj: Linear::f32(input_proj, d, cfg.input_dimension),
            output_proj: Linear::f32(output_proj, cfg.output_dimension, d),
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
    pub(crate) fn load(
        src: &mut dyn WeightSource,
        cfg: &QuantizerConfig,
        num_codebooks: usize,
    ) -> Result<Self> {
        if num_codebooks == 0 || num_codebooks > cfg.n_q {
            return Err(ModelError::CodebooksUnavailable {
                requested: num_codebooks,
                available: cfg.n_q,
            });
        }
        let first = ResidualVq::load(src, "quantizer.rvq_first", cfg, 1)?;
        let rest = if num_codebooks > 1 {
            Some(ResidualVq::load(
                src,
                "quantizer.rvq_rest",
                cfg,
                num_codebooks - 1,
            )?)
        } else {
            None
        };
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
            g.input_proj.set_reduced_precision(mode);
            g.output_proj.set_reduced_precision(mode);
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
        self.encode_rows(latent, t.max(1), scratch, codes);
    }

    /// [`SplitQuantizer::encode`] of several streams' latents, `rows` each, stacked in `latent`
    /// (codes stacked the same way): the input projections take as many streams a product as
    /// keep the kernels of one stream's encode, so each stream gets the residuals of its encode
    /// alone; every codebook then scores all the rows in one product (the codes are the exact
    /// nearest entries whatever the rows scored together: the module docs).
    pub fn encode_streams(
        &self,
        latent: &[f32],
        rows: usize,
        scratch: &mut QuantizerScratch,
        codes: &mut [u32],
    ) {
        let streams = (self.same_bits_rows(rows) / rows).max(1);
        self.encode_rows(latent, streams * rows, scratch, codes);
    }

    /// [`SplitQuantizer::encode`] with at most `projection_rows` rows a product of the input
    /// projections.
    fn encode_rows(
        &self,
        latent: &[f32],
        projection_rows: usize,
        scratch: &mut QuantizerScratch,
        codes: &mut [u32],
    ) {
        let t = latent.len() / self.in_dim;
        let k = self.num_codebooks;
        assert_eq!(codes.len(), t * k, "codes buffer size");
        let d = self.dim;
        let mut offset = 0;
        for group in std::iter::once(&self.first).chain(self.rest.as_ref()) {
            scratch.residual.resize(t * d, 0.0);
            for (x, residual) in latent
                .chunks(projection_rows * self.in_dim)
                .zip(scratch.residual.chunks_mut(projection_rows * d))
            {
                let rows = x.len() / self.in_dim;
                group.input_proj.gemm(
                    rows,
                    self.in_dim,
                    d,
                    x,
                    self.in_dim,
                    0,
                    self.in_dim,
                    residual,
                    d,
                    false,
                );
            }
            for cb in &group.codebooks {
                scratch.scores.resize(t * self.bins, 0.0);
                count_bytes(cb.vectors.len() * 2);
                let all = PanelBlock::all(&cb.panels);
                let scores = &mut scratch.scores;
                gemm_nt_panels(
                    t,
                    &scratch.residual,
                    d,
                    &cb.panels,
                    all,
                    scores,
                    self.bins,
                    false,
                );
                for i in 0..t {
                    let x = &mut scratch.residual[i * d..(i + 1) * d];
                    let scores = &scratch.scores[i * self.bins..(i + 1) * self.bins];
                    let code = nearest(cb, x, scores, d, true);
                    codes[i * k + offset] = code as u32;
                    for (v, c) in x.iter_mut().zip(&cb.vectors[code * d..(code + 1) * d]) {
                        *v -= c;
                    }
                }
                offset += 1;
            }
        }
    }

    /// The rows an input projection of [`SplitQuantizer::encode`] may take while each row gets
    /// what it gets in an encode of `rows` rows (the projections' kernels stay the same).
    fn same_bits_rows(&self, rows: usize) -> usize {
        std::iter::once(&self.first)
            .chain(self.rest.as_ref())
            .map(|g| {
                g.input_proj
                    .gemm_same_bits_rows(rows, self.in_dim, 0, self.in_dim)
            })
            .fold(usize::MAX, usize::min)
    }

    /// Checks every code against the codebook size. `codes` is `[t][num_codebooks]`.
    pub fn check_codes(&self, codes: &[u32]) -> Result<()> {
        if let Some((i, &c)) = codes
            .iter()
            .enumerate()
            .find(|(_, &c)| c as usize >= self.bins)
        {
            return Err(ModelError::TokenOutOfRange {
                what: "mimi: code",
                value: c,
                at: format!(
                    " of codebook {} at frame {}",
                    i % self.num_codebooks,
                    i / self.num_codebooks
                ),
                max: self.bins - 1,
                note: ": the codebook size - 1",
            });
        }
        Ok(())
    }

    /// `codes` (`[t][codebooks]`, already checked; `codebooks` from 1 to `num_codebooks`) ->
    /// `latent` (`[t][out]`, resized): the first `codebooks` codebooks' vectors summed, as
    /// Kyutai's quantizer after `set_num_codebooks(codebooks)` (the acoustic group only when
    /// there is more than the semantic codebook).
    pub fn decode(
        &self,
        codes: &[u32],
        codebooks: usize,
        scratch: &mut QuantizerScratch,
        latent: &mut Vec<f32>,
    ) {
        let k = codebooks;
        let t = codes.len() / k;
        let d = self.dim;
        latent.clear();
        latent.resize(t * self.out_dim, 0.0);
        let mut offset = 0;
        for group in std::iter::once(&self.first).chain(self.rest.as_ref()) {
            if offset >= k {
                break;
            }
            scratch.sum.clear();
            scratch.sum.resize(t * d, 0.0);
            for (q, cb) in group.codebooks.iter().take(k - offset).enumerate() {
                for i in 0..t {
                    let code = codes[i * k + offset + q] as usize;
                    for (s, c) in scratch.sum[i * d..(i + 1) * d]
                        .iter_mut()
                        .zip(&cb.vectors[code * d..(code + 1) * d])
                    {
                        *s += c;
                    }
                }
            }
            offset += group.codebooks.len();
            scratch.out.resize(t * self.out_dim, 0.0);
            group.output_proj.gemm(
                t,
                d,
                self.out_dim,
                &scratch.sum,
                d,
                0,
                d,
                &mut scratch.out,
                self.out_dim,
                false,
            );
            for (l, o) in latent.iter_mut().zip(&scratch.out) {
                *l += o;
            }
        }
    }
}

/// Index of the codebook entry nearest to `x`, given approximate scores `|c|² - 2 x·c` (with
/// `x·c` summed in f32 over the `d` products in order, against the bf16 codebook copy when
/// `bf16`).
fn nearest(cb: &Codebook, x: &[f32], scores: &[f32], d: usize, bf16: bool) -> usize {
    let mut best = f32::INFINITY;
    for (s, n2) in scores.iter().zip(&cb.norms2) {
        best = best.min(n2 - 2.0 * s);
    }
    let x_norm2: f32 = x.iter().map(|v| v * v).sum();
    // Rounding of the norms and of the subtraction: a few ulps of the magnitudes involved.
    let mut tol = 1e-5 * (x_norm2 + cb.max_norm2) + f32::MIN_POSITIVE;
    // |x·c - fl(x·c)| <= d·2^-24 |x| |c| for a sum in order (Cauchy-Schwarz bounds Σ|x_p c_p|),
    // and |x·c - x·bf16(c)| <= 2^-9 |x| |c|: each score is off by at most twice their sum, and
    // the best and a candidate may be off in opposite directions.
    let mut relative = d as f32 * f32::EPSILON / 2.0;
    if bf16 {
        relative += BF16_RELATIVE_ERROR;
    }
    tol += 4.0 * relative * (x_norm2 * cb.max_norm2).sqrt() * 1.01;
    let mut best_index = 0;
    let mut best_exact = f64::INFINITY;
    for (j, (s, n2)) in scores.iter().zip(&cb.norms2).enumerate() {
        if n2 - 2.0 * s <= best + tol {
            let c = &cb.vectors[j * d..(j + 1) * d];
            let exact: f64 = x
                .iter()
                .zip(c)
                .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
                .sum();
            if exact < best_exact {
                best_exact = exact;
                best_index = j;
            }
        }
    }
    best_index
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uniform(state: &mut u64) -> f32 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        ((*state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn codebook(vectors: Vec<f32>, d: usize) -> Codebook {
        let norms2: Vec<f32> = vectors
            .chunks_exact(d)
            .map(|r| r.iter().map(|v| v * v).sum())
            .collect();
        let max_norm2 = norms2.iter().copied().fold(0f32, f32::max);
        let panels = PanelMatrix::bf16(&vectors, vectors.len() / d, d);
        Codebook {
            vectors,
            panels,
            norms2,
            max_norm2,
        }
    }

    #[test]
    fn bf16_scoring_still_picks_the_exact_nearest_entry() {
        let (bins, d) = (256, 64);
        let mut state = 0x1234_5678_9ABC_DEF1u64;
        let mut vectors: Vec<f32> = (0..bins * d).map(|_| uniform(&mut state)).collect();
        // Near-duplicates: entry 2k+1 is entry 2k plus a perturbation below bf16 resolution.
        for k in 0..bins / 2 {
            for c in 0..d {
                vectors[(2 * k + 1) * d + c] =
                    vectors[2 * k * d + c] * (1.0 + 1e-4 * uniform(&mut state));
            }
        }
        let cb = codebook(vectors, d);
        let exact_argmin = |x: &[f32]| -> usize {
            let dist = |j: usize| {
                x.iter()
                    .zip(&cb.vectors[j * d..(j + 1) * d])
                    .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
                    .sum::<f64>()
            };
            (0..bins).fold(0, |best, j| if dist(j) < dist(best) { j } else { best })
        };
        let mut scores = vec![0f32; bins];
        let mut disagreements_without_margin = 0;
        for trial in 0..400 {
            // Half the queries sit right between a near-duplicate pair.
            let x: Vec<f32> = if trial % 2 == 0 {
                (0..d).map(|_| uniform(&mut state)).collect()
            } else {
                let k = (trial / 2) % (bins / 2);
                (0..d)
                    .map(|c| {
                        0.5 * (cb.vectors[2 * k * d + c] + cb.vectors[(2 * k + 1) * d + c])
                            + 1e-6 * uniform(&mut state)
                    })
                    .collect()
            };
            let all = PanelBlock::all(&cb.panels);
            gemm_nt_panels(1, &x, d, &cb.panels, all, &mut scores, bins, false);
            let expected = exact_argmin(&x);
            assert_eq!(
                nearest(&cb, &x, &scores, d, true),
                expected,
                "trial {trial}"
            );
            if nearest(&cb, &x, &scores, d, false) != expected {
                disagreements_without_margin += 1;
            }
        }
        // The bf16 margin is what makes it exact: the f32 margin alone misses some near-ties.
        assert!(
            disagreements_without_margin > 0,
            "the test must contain near-ties that bf16 scores get wrong"
        );
    }
}
