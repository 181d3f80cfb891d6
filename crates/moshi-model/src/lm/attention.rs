//! Streaming multi-head self-attention for one new position: fused q/k/v projection
//! (`[3 * dim, dim]`, head-major rows as in PyTorch), optional RoPE, a ring KV cache and the
//! output projection. No biases.

use std::cell::RefCell;

use super::kv_cache::{KvCache, KvRows};
use super::rope::RopeRotation;
use moshi_kernels::dense::{accumulate_rows, dot_rows};
use moshi_kernels::{Kernel, WeightElem};

use crate::ops::Linear;

/// Above this many cached floats (keys of all heads), heads are processed on several threads.
const PARALLEL_MIN_CACHE_FLOATS: usize = 1 << 16;

/// Cached positions per step of both passes: each head's query is loaded once for this many key
/// rows, and its output loaded and stored once for this many value rows.
const POSITIONS_PER_STEP: usize = 4;

thread_local! {
    /// Scores of the heads a thread attends in the threaded path (reused across calls).
    static GROUP_SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

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
        Self {
            in_proj,
            out_proj,
            num_heads,
            head_dim: dim / num_heads,
        }
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
        scratch.attended.resize(dim, 0.0);
        match cache.rows() {
            KvRows::F32 { keys, values } => self.attend(
                q,
                keys,
                values,
                n,
                &mut scratch.attended,
                &mut scratch.scores,
            ),
            KvRows::Bf16 { keys, values } => self.attend(
                q,
                keys,
                values,
                n,
                &mut scratch.attended,
                &mut scratch.scores,
            ),
        }
        self.out_proj.matvec_into(&scratch.attended, out);
    }
    /// `attended` (`[dim]`) = every head's attention from `q` over the `n` cached positions
    /// (`keys`, `values`: `[n, dim]`, f32 or bf16 bits); `scores` is scratch space.
    fn attend<E: WeightElem>(
        &self,
        q: &[f32],
        keys: &[E],
        values: &[E],
        n: usize,
        attended: &mut [f32],
        scores: &mut Vec<f32>,
    ) {
        let dim = self.dim();
        let hd = self.head_dim;
        let scale = 1.0 / (hd as f32).sqrt();
        if n * dim >= PARALLEL_MIN_CACHE_FLOATS && self.num_heads > 1 {
            // Contiguous groups of heads per thread of the team (no futex wake-up per call); each
            // group streams its part of every cached row, with its scores in a buffer of the
            // thread that runs it.
            let groups = crate::team::threads().clamp(1, self.num_heads);
            let heads_per_group = self.num_heads.div_ceil(groups);
            crate::team::run_chunks_mut(attended, heads_per_group * hd, &|first, o| {
                GROUP_SCORES.with_borrow_mut(|scores| {
                    scores.resize((o.len() / hd) * n, 0.0);
                    attend_heads(
                        &q[first..first + o.len()],
                        keys,
                        values,
                        dim,
                        first,
                        hd,
                        scale,
                        scores,
                        o,
                    );
                });
            });
        } else {
            scores.resize(self.num_heads * n, 0.0);
            attend_heads(q, keys, values, dim, 0, hd, scale, scores, attended);
        }
    }
}

/// Heads `offset / hd ..` (as many as `q.len() / hd`): `out_h = softmax(q_h · K_hᵀ * scale) · V_h`
/// over the `n = scores.len() / heads` cached positions. Rows are walked in order so every cached
/// row is read once, contiguously, for all heads of the group.
#[allow(clippy::too_many_arguments)]
fn attend_heads<E: WeightElem>(
    q: &[f32],
    keys: &[E],
    values: &[E],
    stride: usize,
    offset: usize,
    hd: usize,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let width = q.len();
    let heads = width / hd;
    let n = scores.len() / heads.max(1);
    // Scores: POSITIONS_PER_STEP cached keys per step, each head's dot products taken together
    // (every dot product in the fixed order of `moshi_kernels::dense`, as one at a time).
    let kernel = Kernel::detect();
    let key = |j: usize| &keys[j * stride + offset..j * stride + offset + width];
    let mut j = 0;
    while j + POSITIONS_PER_STEP <= n {
        let rows: [&[E]; POSITIONS_PER_STEP] = std::array::from_fn(|r| key(j + r));
        for (h, qh) in q.chunks_exact(hd).enumerate() {
            let dots = dot_rows(kernel, rows.map(|k| &k[h * hd..(h + 1) * hd]), qh);
            for (r, d) in dots.iter().enumerate() {
                scores[h * n + j + r] = d * scale;
            }
        }
        j += POSITIONS_PER_STEP;
    }
    for j in j..n {
        let k = key(j);
        for (h, qh) in q.chunks_exact(hd).enumerate() {
            scores[h * n + j] = dot_rows(kernel, [&k[h * hd..(h + 1) * hd]], qh)[0] * scale;
        }
    }
    for sh in scores.chunks_exact_mut(n) {
        let max = sh.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for s in sh.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        let inv = 1.0 / sum;
        for s in sh.iter_mut() {
            *s *= inv;
        }
    }
    // out_h += p_hj · v_hj in position order, POSITIONS_PER_STEP positions per call (the same
    // sums, in the same order, as one position at a time).
    out.fill(0.0);
    let row = |j: usize| &values[j * stride + offset..j * stride + offset + width];
    let mut j = 0;
    while j + POSITIONS_PER_STEP <= n {
        let rows: [&[E]; POSITIONS_PER_STEP] = std::array::from_fn(|r| row(j + r));
        for (h, o) in out.chunks_exact_mut(hd).enumerate() {
            accumulate_rows(
                kernel,
                o,
                std::array::from_fn(|r| scores[h * n + j + r]),
                rows.map(|v| &v[h * hd..(h + 1) * hd]),
            );
        }
        j += POSITIONS_PER_STEP;
    }
    for j in j..n {
        let v = row(j);
        for (h, o) in out.chunks_exact_mut(hd).enumerate() {
            accumulate_rows(kernel, o, [scores[h * n + j]], [&v[h * hd..(h + 1) * hd]]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lm::kv_cache::KvPrecision;

    /// Small caches run on the calling thread, large ones split heads over threads: both must
    /// equal a naive f64 attention over the explicit last `window` positions, in f32 and in
    /// bf16 caches (the naive attention then takes the keys and values rounded to bf16).
    #[test]
    fn ring_window_equals_explicit_last_positions() {
        for precision in [KvPrecision::F32, KvPrecision::Bf16] {
            check_against_naive(8, 2, 4, 9, precision);
            // 256 * 300 cached floats >= PARALLEL_MIN_CACHE_FLOATS: the threaded path.
            const { assert!(256 * 300 >= PARALLEL_MIN_CACHE_FLOATS) };
            check_against_naive(256, 4, 300, 310, precision);
        }
    }

    fn check_against_naive(
        dim: usize,
        heads: usize,
        window: usize,
        steps: usize,
        precision: KvPrecision,
    ) {
        let stored = |v: f32| match precision {
            KvPrecision::F32 => v,
            KvPrecision::Bf16 => half::bf16::from_f32(v).to_f32(),
        };
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
            Linear::F32 {
                weight: in_w,
                out_dim: 3 * dim,
                in_dim: dim,
            },
            Linear::F32 {
                weight: eye(dim),
                out_dim: dim,
                in_dim: dim,
            },
            heads,
        );
        let mut cache = KvCache::with_precision(window, dim, precision);
        let mut scratch = AttentionScratch::default();
        let xs: Vec<Vec<f32>> = (0..steps)
            .map(|p| {
                (0..dim)
                    .map(|i| ((p * dim + i) as f32 * 0.37).sin())
                    .collect()
            })
            .collect();
        for (p, x) in xs.iter().enumerate() {
            let mut out = vec![0f32; dim];
            attn.step(x, None, &mut cache, &mut scratch, &mut out);
            let hd = dim / heads;
            let first = (p + 1).saturating_sub(window);
            for h in 0..heads {
                let r = h * hd..(h + 1) * hd;
                let scores: Vec<f64> = (first..=p)
                    .map(|j| {
                        xs[p][r.clone()]
                            .iter()
                            .zip(&xs[j][r.clone()])
                            .map(|(a, b)| (a * stored(b * 0.5)) as f64)
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                for (i, o) in r.clone().enumerate() {
                    let expect: f64 = (first..=p)
                        .zip(&scores)
                        .map(|(j, s)| (s - m).exp() / z * stored(2.0 * xs[j][h * hd + i]) as f64)
                        .sum();
                    assert!(
                        (out[o] as f64 - expect).abs() < 1e-5,
                        "{precision:?} pos {p} head {h}: {} vs {expect}",
                        out[o]
                    );
                }
            }
        }
        assert_eq!(cache.len(), window);
    }
}
