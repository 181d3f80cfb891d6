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

/// Every canonical LM weight name with its logical shape, in load order.
pub fn canonical_lm_shapes(cfg: &LmConfig) -> Vec<(String, Vec<usize>)> {
    let (dim, ddim) = (cfg.dim, cfg.depformer_dim);
    let (hidden, dhidden) = (cfg.hidden_dim(), cfg.depformer_hidden_dim());
    let mut v: Vec<(String, Vec<usize>)> = vec![("text_emb".into(), vec![cfg.text_card + 1, dim])];
    for i in 0..cfg.n_q {
        v.push((format!("emb.{i}"), vec![cfg.card + 1, dim]));
    }
    v.push(("text_linear".into(), vec![cfg.text_card, dim]));
    v.push(("out_norm".into(), vec![dim]));
    let layer = |v: &mut Vec<(String, Vec<usize>)>, p: &str, d: usize, h: usize| {
        v.push((format!("{p}.norm1"), vec![d]));
        v.push((format!("{p}.norm2"), vec![d]));
        v.push((format!("{p}.self_attn.in_proj"), vec![3 * d, d]));
        v.push((format!("{p}.self_attn.out_proj"), vec![d, d]));
        v.push((format!("{p}.gating.linear_in"), vec![2 * h, d]));
        v.push((format!("{p}.gating.linear_out"), vec![d, h]));
    };
    for l in 0..cfg.num_layers {
        layer(&mut v, &format!("transformer.layers.{l}"), dim, hidden);
    }
    for k in 0..cfg.dep_q {
        v.push((format!("depformer.{k}.linear_in"), vec![ddim, dim]));
        v.push((
            format!("depformer.{k}.emb"),
            vec![
                if k == 0 {
                    cfg.text_card + 1
                } else {
                    cfg.card + 1
                },
                ddim,
            ],
        ));
        v.push((format!("depformer.{k}.linear_out"), vec![cfg.card, ddim]));
        for l in 0..cfg.depformer_num_layers {
            layer(&mut v, &format!("depformer.{k}.layers.{l}"), ddim, dhidden);
        }
    }
    // Last, so that the seeds of the tensors above do not depend on them.
    for i in 0..cfg.extra_heads_num_heads {
        v.push((format!("extra_heads.{i}"), vec![cfg.extra_heads_dim, dim]));
    }
    v
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

/// Random weights for every canonical name of `cfg`: matrices uniform with standard deviation
/// `1 / sqrt(fan_in)`, embedding rows with standard deviation 1, norm gains in `[0.8, 1.2)`.
pub fn random_lm_weights(cfg: &LmConfig, seed: u64, kind: RandomWeightKind) -> Result<WeightMap> {
    let mut map = WeightMap::new(format!("<random weights, seed {seed}>"));
    for (i, (name, shape)) in canonical_lm_shapes(cfg).into_iter().enumerate() {
        let s = seed.wrapping_mul(0x2545_F491_4F6C_DD1D)
            ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let data = if shape.len() == 1 {
            let mut rng = Rng::new(s);
            WeightData::F32((0..shape[0]).map(|_| 0.8 + 0.4 * rng.next_f32()).collect())
        } else {
            let is_embedding = name.ends_with("emb") || name.starts_with("emb.");
            let std = if is_embedding {
                1.0
            } else {
                1.0 / (shape[1] as f32).sqrt()
            };
            random_matrix(shape[0], shape[1], s, kind, std).map_err(|cause| {
                ModelError::RandomWeight {
                    name: name.clone(),
                    shape: shape.clone(),
                    cause,
                }
            })?
        };
        map.insert(name, Weight { shape, data });
    }
    // Conditioners (Hibiki): f32 as in checkpoints loaded by any mode. The projection is scaled
    // so that a condition is about a tenth of a token embedding (as trained weights keep it);
    // the learnt padding has Kyutai's init scale, 0.2.
    let conditioner_tensors = canonical_lm_tensors(cfg)
        .into_iter()
        .filter(|t| t.role == TensorRole::Conditioner);
    for (i, t) in conditioner_tensors.enumerate() {
        let s = seed.wrapping_mul(0x2545_F491_4F6C_DD1D)
            ^ 0xC0D1
            ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let (rows, cols) = (t.shape[0], t.shape.get(1).copied().unwrap_or(1));
        let std = if t.name.ends_with(".embed") {
            1.0
        } else if t.name.ends_with(".output_proj") {
            0.1 / (cols as f32).sqrt()
        } else {
            0.2
        };
        let data = random_matrix(rows, cols, s, RandomWeightKind::F32, std).map_err(|cause| {
            ModelError::RandomWeight {
                name: t.name.clone(),
                shape: t.shape.clone(),
                cause,
            }
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
