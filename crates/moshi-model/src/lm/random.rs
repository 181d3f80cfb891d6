//! Deterministic random LM weights of a config's shapes, under the canonical names (for
//! benchmarks at the real 7B dimensions and for tests that need no checkpoint).

use moshi_kernels::QuantizedMatrix;
use moshi_loader::lm_names::{canonical_lm_tensors, TensorRole};
use moshi_loader::{LmConfig, Weight, WeightData, WeightMap};
use rayon::prelude::*;

use crate::rng::Rng;
use crate::{ModelError, Result};

/// Storage of the random matrices (norms are always f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RandomWeightKind {
    F32,
    BF16,
    /// MLX affine packing with these parameters.
    Quantized {
        bits: u32,
        group_size: usize,
    },
}

impl RandomWeightKind {
    /// The storage of a matrix `cols` wide: a matrix narrower than one group (the TTS's small
    /// low-rank embeddings) stays bf16, as quantizing on load leaves it (mlx-lm's predicate).
    fn for_width(self, cols: usize) -> Self {
        match self {
            RandomWeightKind::Quantized { group_size, .. } if cols < group_size => {
                RandomWeightKind::BF16
            }
            kind => kind,
        }
    }
}

/// Fills `out` with uniform values in `[-a, a)`, in parallel chunks seeded from `seed`.
fn fill_uniform<T: Send>(out: &mut [T], seed: u64, a: f32, f: impl Fn(f32) -> T + Sync) {
    const CHUNK: usize = 1 << 16;
    out.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(c, chunk)| {
            let mut rng = Rng::new(seed ^ (c as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            for o in chunk {
                *o = f((rng.next_f32() * 2.0 - 1.0) * a);
            }
        });
}

fn random_matrix(
    rows: usize,
    cols: usize,
    seed: u64,
    kind: RandomWeightKind,
    std: f32,
) -> std::result::Result<WeightData, moshi_kernels::QuantError> {
    let a = std * 3f32.sqrt();
    Ok(match kind {
        RandomWeightKind::F32 => {
            let mut v = vec![0f32; rows * cols];
            fill_uniform(&mut v, seed, a, |x| x);
            WeightData::F32(v)
        }
        RandomWeightKind::BF16 => {
            let mut v = vec![0u16; rows * cols];
            fill_uniform(&mut v, seed, a, |x| half::bf16::from_f32(x).to_bits());
            WeightData::BF16(v)
        }
        RandomWeightKind::Quantized { bits, group_size } => {
            let words = rows * cols * bits as usize / 32;
            let groups = rows * (cols / group_size.max(1));
            let mut codes = vec![0u32; words];
            moshi_kernels::huge_pages::advise(&mut codes);
            codes
                .par_chunks_mut(1 << 16)
                .enumerate()
                .for_each(|(c, chunk)| {
                    let mut rng =
                        Rng::new(seed ^ 0x5151 ^ (c as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                    chunk.iter_mut().for_each(|w| *w = rng.next_u32());
                });
            let levels = ((1u32 << bits) - 1) as f32;
            let scales = vec![half::bf16::from_f32(2.0 * a / levels).to_bits(); groups];
            let biases = vec![half::bf16::from_f32(-a).to_bits(); groups];
            let q = QuantizedMatrix::new(rows, cols, bits, group_size, codes, scales, biases)?;
            WeightData::Quantized(q)
        }
    })
}

/// Random weights for every canonical name of `cfg` ([`canonical_lm_tensors`]): matrices uniform
/// with standard deviation `1 / sqrt(fan_in)`, embedding rows with standard deviation 1, norm
/// gains in `[0.8, 1.2)`, the cross-attention LayerNorm's bias in `[-0.1, 0.1)`. Conditioners
/// (Hibiki, the TTS) are f32 as in checkpoints loaded by any mode: the projection scaled so that
/// a condition is about a tenth of a token embedding (as trained weights keep it), the learnt
/// padding at Kyutai's init scale, 0.2.
pub fn random_lm_weights(cfg: &LmConfig, seed: u64, kind: RandomWeightKind) -> Result<WeightMap> {
    let mut map = WeightMap::new(format!("<random weights, seed {seed}>"));
    for (i, t) in canonical_lm_tensors(cfg).into_iter().enumerate() {
        let s = seed.wrapping_mul(0x2545_F491_4F6C_DD1D)
            ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let (rows, cols) = (t.shape[0], t.shape.get(1).copied().unwrap_or(1));
        let data = match t.role {
            TensorRole::Norm => {
                let mut rng = Rng::new(s);
                let (low, width) = if t.name.ends_with(".bias") {
                    (-0.1, 0.2)
                } else {
                    (0.8, 0.4)
                };
                Ok(WeightData::F32(
                    (0..rows).map(|_| low + width * rng.next_f32()).collect(),
                ))
            }
            TensorRole::Embedding => random_matrix(rows, cols, s, kind.for_width(cols), 1.0),
            TensorRole::Linear => {
                let std = 1.0 / (cols as f32).sqrt();
                random_matrix(rows, cols, s, kind.for_width(cols), std)
            }
            TensorRole::Conditioner => {
                let std = if t.name.ends_with(".embed") {
                    1.0
                } else if t.name.ends_with(".output_proj") {
                    0.1 / (cols as f32).sqrt()
                } else {
                    0.2
                };
                random_matrix(rows, cols, s, RandomWeightKind::F32, std)
            }
        }
        .map_err(|cause| ModelError::RandomWeight {
            name: t.name.clone(),
            shape: t.shape.clone(),
            cause,
        })?;
        map.insert(
            t.name,
            Weight {
                shape: t.shape,
                data,
            },
        );
    }
    Ok(map)
}
