//! Streaming multi-head self-attention for one new position: fused q/k/v projection
//! (`[3 * dim, dim]`, head-major rows as in PyTorch), optional RoPE, a ring KV cache and the
//! output projection. No biases.

use rayon::prelude::*;

use super::kv_cache::KvCache;
use super::rope::RopeRotation;
use crate::ops::Linear;

/// Above this many cached floats (keys of all heads), heads are processed on several threads.
const PARALLEL_MIN_CACHE_FLOATS: usize = 1 << 16;

/// Weights of one attention block.
#[derive(Clone, Debug)]
pub struct Attention {
    in_proj: Linear,
    out_proj: Linear,
    num_heads: usize,
    head_dim: usize,
}

/// Reusable buffers of [`Attention::step`].
#[derive(Clone, Debug, Default)]
pub struct AttentionScratch {
    qkv: Vec<f32>,
    attended: Vec<f32>,
    scores: Vec<f32>,
}

impl Attention {
    pub fn new(in_proj: Linear, out_proj: Linear, num_heads: usize) -> Self {
        let dim = out_proj.out_dim();
        Self { in_proj, out_proj, num_heads, head_dim: dim / num_heads }
    }

    pub fn dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    pub fn num_heads(&self) -> usize {
        self.num_heads
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Bytes of weights read per step.
    pub fn weight_bytes(&self) -> usize {
        self.in_proj.weight_bytes() + self.out_proj.weight_bytes()
    }

    /// Attends from the position of `x` (`[dim]`, already normalised) over the cached positions
    /// plus itself, writing the projected result into `out` (`[dim]`).
    pub fn step(
        &self,
        x: &[f32],
        rotation: Option<&RopeRotation>,
        cache: &mut KvCache,
        scratch: &mut AttentionScratch,
        out: &mut [f32],
    ) {
        let dim = self.dim();
        scratch.qkv.resize(3 * dim, 0.0);
        self.in_proj.matvec_into(x, &mut scratch.qkv);
        let (q, kv) = scratch.qkv.split_at_mut(dim);
        let (k, v) = kv.split_at_mut(dim);
        if let Some(rot) = rotation {
            rot.apply(q);
            rot.apply(k);
        }
        cache.push(k, v);

        let n = cache.len();
        let (keys, values) = (cache.keys(), cache.values());
        let hd = self.head_dim;
        let scale = 1.0 / (hd as f32).sqrt();
        scratch.attended.resize(dim, 0.0);
        let q: &[f32] = q;
        if n * dim >= PARALLEL_MIN_CACHE_FLOATS && self.num_heads > 1 {
            scratch.attended.par_chunks_mut(hd).enumerate().for_each(|(h, o)| {
                let mut scores = vec![0f32; n];
                attend_head(&q[h * hd..(h + 1) * hd], keys, values, dim, h * hd, scale, &mut scores, o);
            });
        } else {
            scratch.scores.resize(n, 0.0);
            for (h, o) in scratch.attended.chunks_mut(hd).enumerate() {
                attend_head(&q[h * hd..(h + 1) * hd], keys, values, dim, h * hd, scale, &mut scratch.scores, o);
            }
        }
        self.out_proj.matvec_into(&scratch.attended, out);
    }
}

/// One head: `out = softmax(q · K_hᵀ * scale) · V_h` over the `scores.len()` cached positions.
#[allow(clippy::too_many_arguments)]
fn attend_head(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    stride: usize,
    offset: usize,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let hd = q.len();
    let mut max = f32::NEG_INFINITY;
    for (j, s) in scores.iter_mut().enumerate() {
        let kr = &keys[j * stride + offset..j * stride + offset + hd];
        let dot: f32 = kr.iter().zip(q).map(|(a, b)| a * b).sum();
        *s = dot * scale;
        max = max.max(*s);
    }
    let mut sum = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    let inv = 1.0 / sum;
    out.fill(0.0);
    for (j, &p) in scores.iter().enumerate() {
        let w = p * inv;
        let vr = &values[j * stride + offset..j * stride + offset + hd];
        for (o, vv) in out.iter_mut().zip(vr) {
            *o += w * vv;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Naive attention over an explicit list of (position, k, v) for comparison.
    #[test]
    fn ring_window_equals_explicit_last_positions() {
        let (dim, heads, window) = (8usize, 2usize, 4usize);
        let eye = |n: usize| {
            let mut w = vec![0f32; n * n];
            for i in 0..n {
                w[i * n + i] = 1.0;
            }
            w
        };
        // in_proj = [I; 0.5 I; 2 I] so q = x, k = x/2, v = 2x; out_proj = I.
        let mut in_w = eye(dim);
        in_w.extend(eye(dim).iter().map(|v| v * 0.5));
        in_w.extend(eye(dim).iter().map(|v| v * 2.0));
        let attn = Attention::new(
            Linear::F32 { weight: in_w, out_dim: 3 * dim, in_dim: dim },
            Linear::F32 { weight: eye(dim), out_dim: dim, in_dim: dim },
            heads,
        );
        let mut cache = KvCache::new(window, dim);
        let mut scratch = AttentionScratch::default();
        let xs: Vec<Vec<f32>> = (0..9).map(|p| (0..dim).map(|i| ((p * dim + i) as f32 * 0.37).sin()).collect()).collect();
        for (p, x) in xs.iter().enumerate() {
            let mut out = vec![0f32; dim];
            attn.step(x, None, &mut cache, &mut scratch, &mut out);
            let hd = dim / heads;
            let first = (p + 1).saturating_sub(window);
            for h in 0..heads {
                let r = h * hd..(h + 1) * hd;
                let scores: Vec<f64> = (first..=p)
                    .map(|j| {
                        xs[p][r.clone()].iter().zip(&xs[j][r.clone()]).map(|(a, b)| (a * b * 0.5) as f64).sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                for (i, o) in r.clone().enumerate() {
                    let expect: f64 = (first..=p)
                        .zip(&scores)
                        .map(|(j, s)| (s - m).exp() / z * 2.0 * xs[j][h * hd + i] as f64)
                        .sum();
                    assert!((out[o] as f64 - expect).abs() < 1e-5, "pos {p} head {h}: {} vs {expect}", out[o]);
                }
            }
        }
        assert_eq!(cache.len(), window);
    }
}
