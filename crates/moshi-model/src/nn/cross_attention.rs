//! Multi-head cross-attention (Kyutai's `StreamingMultiheadAttention(cross_attention=True)`, the
//! TTS's speaker conditioning): queries from the stream, keys and values from a fixed source
//! (`[n, dim]`) computed once per session ([`CrossAttention::source_keys_values`]); no mask, no
//! RoPE, every source position attended. The fused `[3 * dim, dim]` projection of the checkpoint
//! is split at load into the query rows and the key/value rows, so a step reads only the
//! query's third.

use super::attention::{attend_over, Heads, Rows};
use super::linear::Linear;

/// Weights of one cross-attention block.
#[derive(Clone, Debug)]
pub struct CrossAttention {
    q_proj: Linear,
    kv_proj: Linear,
    out_proj: Linear,
    num_heads: usize,
    head_dim: usize,
}

/// Reusable buffers of a cross-attention block.
#[derive(Clone, Debug, Default)]
pub struct CrossAttentionScratch {
    q: Vec<f32>,
    attended: Vec<f32>,
    scores: Vec<f32>,
}

/// The keys and values of one source for one layer: `[n, 2 * dim]`, row `j` = `[k_j | v_j]`.
#[derive(Clone, Debug, PartialEq)]
pub struct CrossKeysValues {
    rows: Vec<f32>,
    positions: usize,
}

impl CrossKeysValues {
    /// Source positions.
    pub fn positions(&self) -> usize {
        self.positions
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.rows.len() * 4
    }
}

impl CrossAttention {
    /// From the checkpoint's fused projection `in_proj` (`[3 * dim, dim]`: queries, keys,
    /// values) and `out_proj` (`[dim, dim]`).
    ///
    /// # Panics
    /// If the shapes disagree (caller bug; the loader checks them).
    pub fn new(in_proj: Linear, out_proj: Linear, num_heads: usize) -> Self {
        let dim = out_proj.out_dim();
        assert_eq!(in_proj.out_dim(), 3 * dim, "cross-attention in_proj rows");
        let (q_proj, kv_proj) = in_proj.split_rows(dim);
        Self {
            q_proj,
            kv_proj,
            out_proj,
            num_heads,
            head_dim: dim / num_heads,
        }
    }

    pub fn dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Bytes of weights read per step (the query and output projections).
    pub fn weight_bytes(&self) -> usize {
        self.q_proj.weight_bytes() + self.out_proj.weight_bytes()
    }

    /// The keys and values of `source` (`[n, dim]`), computed once per session.
    pub fn source_keys_values(&self, source: &[f32]) -> CrossKeysValues {
        let positions = source.len() / self.dim();
        CrossKeysValues {
            rows: self.kv_proj.forward_vec(source, positions),
            positions,
        }
    }

    /// [`CrossAttention::source_keys_values`] computing only the rows `fresh` (ascending) of
    /// `source`, the others copied from `previous`: the keys and values of a source equal to
    /// this one at every row not in `fresh` (a row's keys and values depend on that row only).
    ///
    /// # Panics
    /// If a row outside `fresh` is past `previous` (caller bug).
    pub fn source_keys_values_reusing(
        &self,
        source: &[f32],
        fresh: &[usize],
        previous: &CrossKeysValues,
    ) -> CrossKeysValues {
        let dim = self.dim();
        let positions = source.len() / dim;
        let gathered: Vec<f32> = fresh
            .iter()
            .flat_map(|&j| source[j * dim..(j + 1) * dim].iter().copied())
            .collect();
        let computed = self.kv_proj.forward_vec(&gathered, fresh.len());
        let width = 2 * dim;
        let mut rows = vec![0f32; positions * width];
        let mut next_fresh = fresh.iter().zip(computed.chunks_exact(width)).peekable();
        for (j, row) in rows.chunks_exact_mut(width).enumerate() {
            match next_fresh.next_if(|(&f, _)| f == j) {
                Some((_, kv)) => row.copy_from_slice(kv),
                None => row.copy_from_slice(&previous.rows[j * width..(j + 1) * width]),
            }
        }
        CrossKeysValues { rows, positions }
    }

    /// `m` rows of `xs` (`[m, dim]`, already normalised), row `i` attending over `sources[i]`;
    /// the projected results go to `out` (`[m, dim]`). Row `i`'s result does not depend on the
    /// other rows.
    ///
    /// # Panics
    /// If the slices disagree on `m` (caller bug).
    pub fn step_rows(
        &self,
        xs: &[f32],
        m: usize,
        sources: &[&CrossKeysValues],
        scratch: &mut CrossAttentionScratch,
        out: &mut [f32],
    ) {
        let dim = self.dim();
        assert_eq!(sources.len(), m, "cross-attention: one source per row");
        scratch.q.resize(m * dim, 0.0);
        scratch.attended.resize(m * dim, 0.0);
        self.q_proj.forward(xs, m, &mut scratch.q);
        for ((q, attended), source) in scratch
            .q
            .chunks_exact(dim)
            .zip(scratch.attended.chunks_exact_mut(dim))
            .zip(sources)
        {
            let rows = Rows {
                keys: &source.rows[..],
                values: &source.rows[dim..],
                stride: 2 * dim,
                segments: [0..source.positions, 0..0],
                scales: None,
            };
            let heads = Heads {
                count: self.num_heads,
                kv_repeat: 1,
                dim: self.head_dim,
            };
            attend_over(heads, q, &rows, attended, &mut scratch.scores);
        }
        self.out_proj.forward(&scratch.attended, m, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a naive f64 softmax attention over the explicit keys and values.
    #[test]
    fn equals_naive_attention_over_the_projected_source() {
        let (dim, heads, n) = (8, 2, 7);
        let hd = dim / heads;
        let val = |i: usize| ((i * 37 % 101) as f32 / 101.0) - 0.5;
        let in_proj: Vec<f32> = (0..3 * dim * dim).map(val).collect();
        let out_proj: Vec<f32> = (0..dim * dim).map(|i| val(i + 7)).collect();
        let attn = CrossAttention::new(
            Linear::f32(in_proj.clone(), 3 * dim, dim),
            Linear::f32(out_proj.clone(), dim, dim),
            heads,
        );
        let source: Vec<f32> = (0..n * dim).map(|i| val(i + 3) * 2.0).collect();
        let x: Vec<f32> = (0..dim).map(|i| val(i + 11)).collect();
        let kv = attn.source_keys_values(&source);
        let mut out = vec![0f32; dim];
        let mut scratch = CrossAttentionScratch::default();
        attn.step_rows(&x, 1, &[&kv], &mut scratch, &mut out);

        let proj = |row: usize, v: &[f32]| -> f64 {
            (0..dim)
                .map(|c| in_proj[row * dim + c] as f64 * v[c] as f64)
                .sum()
        };
        let q: Vec<f64> = (0..dim).map(|r| proj(r, &x)).collect();
        let k: Vec<Vec<f64>> = (0..n)
            .map(|j| {
                (0..dim)
                    .map(|r| proj(dim + r, &source[j * dim..]))
                    .collect()
            })
            .collect();
        let v: Vec<Vec<f64>> = (0..n)
            .map(|j| {
                (0..dim)
                    .map(|r| proj(2 * dim + r, &source[j * dim..]))
                    .collect()
            })
            .collect();
        let mut attended = vec![0f64; dim];
        for h in 0..heads {
            let s: Vec<f64> = (0..n)
                .map(|j| {
                    (0..hd)
                        .map(|c| q[h * hd + c] * k[j][h * hd + c])
                        .sum::<f64>()
                        / (hd as f64).sqrt()
                })
                .collect();
            let max = s.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = s.iter().map(|v| (v - max).exp()).collect();
            let z: f64 = e.iter().sum();
            for j in 0..n {
                for c in 0..hd {
                    attended[h * hd + c] += e[j] / z * v[j][h * hd + c];
                }
            }
        }
        for r in 0..dim {
            let want: f64 = (0..dim)
                .map(|c| out_proj[r * dim + c] as f64 * attended[c])
                .sum();
            assert!(
                (out[r] as f64 - want).abs() < 1e-5,
                "{r}: {} vs {want}",
                out[r]
            );
        }

        // Rows 1 and 4 of another source computed, the rest reused from this one: the same
        // keys and values as computing them all.
        let mut other = source.clone();
        for j in [1, 4] {
            for v in &mut other[j * dim..(j + 1) * dim] {
                *v += 0.25;
            }
        }
        assert_eq!(
            attn.source_keys_values_reusing(&other, &[1, 4], &kv),
            attn.source_keys_values(&other)
        );
    }
}
