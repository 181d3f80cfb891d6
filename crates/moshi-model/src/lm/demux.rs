//! A demuxed text embedding (Kyutai's `ScaledEmbedding(demux_second_stream=True)`, the TTS): one
//! token carries two text streams, `(second + 1) * card + main` with `second` -1 for none; both
//! read the same table, each through its own projection, `out1(E[main]) + out2(E[second])`
//! (the second term absent for -1), and [`ZERO_TOKEN`] is exactly zero.

use super::embedding::{Embedding, ZERO_TOKEN};
use crate::nn::Linear;

/// The two projections of a demuxed embedding.
#[derive(Clone, Debug)]
pub struct Demux {
    main: Linear,
    second: Linear,
    /// Values per stream (`text_card + 1`).
    card: usize,
}

/// Buffers of [`Demux::embed_rows`].
#[derive(Clone, Debug, Default)]
pub struct DemuxScratch {
    mains: Vec<f32>,
    seconds: Vec<f32>,
    projected: Vec<f32>,
}

impl Demux {
    /// `main` (`out1`) and `second` (`out2`), `[width, table width]` each; `card` values per
    /// stream.
    pub fn new(main: Linear, second: Linear, card: usize) -> Self {
        Self { main, second, card }
    }

    /// Bytes of the projections (read once per step).
    pub fn weight_bytes(&self) -> usize {
        self.main.weight_bytes() + self.second.weight_bytes()
    }

    /// The embeddings of `tokens` (each `< card²` or [`ZERO_TOKEN`], the caller's check) into
    /// `out` (`[m, width]`), both projections one product over all rows.
    pub fn embed_rows(
        &self,
        table: &Embedding,
        tokens: &[u32],
        scratch: &mut DemuxScratch,
        out: &mut [f32],
    ) {
        let (m, w, width) = (tokens.len(), table.dim(), self.main.out_dim());
        scratch.mains.resize(m * w, 0.0);
        scratch.seconds.resize(m * w, 0.0);
        for ((&t, main), second) in tokens
            .iter()
            .zip(scratch.mains.chunks_exact_mut(w))
            .zip(scratch.seconds.chunks_exact_mut(w))
        {
            let (main_token, second_token) = self.split(t);
            table.lookup_into(main_token as usize, main);
            // An absent second stream reads a zero row: its projection adds exactly zero.
            table.lookup_into(second_token.unwrap_or(ZERO_TOKEN) as usize, second);
        }
        let out = &mut out[..m * width];
        self.main.forward(&scratch.mains, m, out);
        scratch.projected.resize(m * width, 0.0);
        self.second
            .forward(&scratch.seconds, m, &mut scratch.projected);
        for ((o, p), &t) in out
            .chunks_exact_mut(width)
            .zip(scratch.projected.chunks_exact(width))
            .zip(tokens)
        {
            if t == ZERO_TOKEN {
                o.fill(0.0);
            } else {
                o.iter_mut().zip(p).for_each(|(a, b)| *a += b);
            }
        }
    }

    /// The main token and the second one (None for -1) of a muxed token.
    fn split(&self, token: u32) -> (u32, Option<u32>) {
        if token == ZERO_TOKEN {
            return (ZERO_TOKEN, None);
        }
        let card = self.card as u32;
        let second = (token / card).checked_sub(1);
        (token % card, second)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moshi_loader::{Weight, WeightData};

    #[test]
    fn muxed_tokens_sum_both_projections_and_zero_is_zero() {
        let (card, w) = (5, 2);
        let table = Embedding::from_weight(Weight {
            shape: vec![card, w],
            data: WeightData::F32((0..card * w).map(|i| i as f32).collect()),
        });
        // out1 = identity, out2 = 10 x identity.
        let demux = Demux::new(
            Linear::f32(vec![1.0, 0.0, 0.0, 1.0], w, w),
            Linear::f32(vec![10.0, 0.0, 0.0, 10.0], w, w),
            card,
        );
        let tokens = [3, 5 + 2, 2 * 5 + 4, ZERO_TOKEN];
        let mut out = vec![f32::NAN; tokens.len() * w];
        demux.embed_rows(&table, &tokens, &mut DemuxScratch::default(), &mut out);
        // E[r] = [2r, 2r + 1].
        let want = [
            6.0,
            7.0, // main 3, no second
            4.0,
            5.0 + 10.0, // main 2 + 10 x E[0] = [4, 5] + [0, 10]
            8.0 + 20.0,
            9.0 + 30.0, // main 4 + 10 x E[1]
            0.0,
            0.0,
        ];
        assert_eq!(out, want);
    }
}
