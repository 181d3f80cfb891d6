//! Token sampling as in the official generator: greedy argmax (first maximum), or
//! `softmax(logits / temperature)` -> keep the `top_k` most probable -> draw one, the draw done
//! as an exponential race (`argmax p_i / E_i`, `E_i ~ Exp(1)`) with our own seeded RNG.

use crate::rng::Rng;

/// Sampling parameters of the generator (defaults = the official `LMGen` defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingConfig {
    pub temp_text: f32,
    pub top_k_text: usize,
    pub temp_audio: f32,
    pub top_k_audio: usize,
    pub seed: u64,
    /// Argmax for text and audio (the seed is then unused).
    pub greedy: bool,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        Self {
            temp_text: 0.7,
            top_k_text: 25,
            temp_audio: 0.8,
            top_k_audio: 250,
            seed: 4242,
            greedy: false,
        }
    }
}

impl SamplingConfig {
    /// Checks the temperatures: finite and at least 0 (a negative or NaN temperature would
    /// silently change what is sampled). Top-k needs no check: 0 or more than the vocabulary
    /// means the whole distribution.
    pub fn validate(&self) -> crate::Result<()> {
        for (what, value) in [
            ("temp_text", self.temp_text),
            ("temp_audio", self.temp_audio),
        ] {
            if !value.is_finite() || value < 0.0 {
                return Err(crate::ModelError::BadSampling { what, value });
            }
        }
        Ok(())
    }

    /// Argmax everywhere.
    pub fn greedy() -> Self {
        Self {
            greedy: true,
            ..Self::default()
        }
    }
}

/// Index of the first maximum (NaN never wins).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = i;
        }
    }
    best as u32
}

/// Reusable buffers of [`sample_token`].
#[derive(Clone, Debug, Default)]
pub struct SamplerScratch {
    probs: Vec<(f32, u32)>,
}

/// Samples one token. `temperature <= 0` or `greedy` gives the argmax without touching `rng`;
/// `top_k == 0` or `top_k >= logits.len()` samples from the whole distribution.
pub fn sample_token(
    logits: &[f32],
    greedy: bool,
    temperature: f32,
    top_k: usize,
    rng: &mut Rng,
    scratch: &mut SamplerScratch,
) -> u32 {
    if greedy || temperature <= 0.0 || logits.len() <= 1 {
        return argmax(logits);
    }
    let candidates = &mut scratch.probs;
    top_candidates(logits, temperature, top_k, candidates);
    // softmax(logits / T) over the kept ones: exp(l_i / T - max). The race below picks
    // argmax p_i / E_i, which a common factor does not change, so the sum is never needed.
    let max = candidates[0].0;
    for p in candidates.iter_mut() {
        p.0 = (p.0 - max).exp();
    }
    // Exponential race: P(i wins) = p_i / sum_j p_j.
    let mut best = candidates[0].1;
    let mut best_score = f64::NEG_INFINITY;
    for &(p, i) in candidates.iter() {
        let score = p as f64 / rng.next_exponential();
        if score > best_score {
            best_score = score;
            best = i;
        }
    }
    best
}

/// Candidates per kept one from which [`top_candidates`] keeps a sorted list of the best so far
/// instead of selecting among all of them (each insertion shifts up to `top_k` entries, so the
/// list pays only where most candidates are turned away by one comparison).
const FEW_OF_MANY: usize = 16;

/// The `top_k` largest scaled logits `(logit / temperature, index)` (all of them for `top_k` 0
/// or beyond the vocabulary) into `out`, in decreasing order, equal values by increasing index:
/// the order that decides which are kept, so the kept set is the same however it is found. The
/// softmax is monotonic, so these are the `top_k` most probable tokens.
fn top_candidates(logits: &[f32], temperature: f32, top_k: usize, out: &mut Vec<(f32, u32)>) {
    let order = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    let scaled = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (l / temperature, i as u32));
    let k = if top_k == 0 {
        logits.len()
    } else {
        top_k.min(logits.len())
    };
    out.clear();
    if k.saturating_mul(FEW_OF_MANY) <= logits.len() {
        // The text vocabulary's top 25 of 32000: most candidates lose one comparison.
        for candidate in scaled {
            if out.len() == k {
                if order(&candidate, &out[k - 1]).is_ge() {
                    continue;
                }
                out.pop();
            }
            let at = out.partition_point(|kept| order(kept, &candidate).is_lt());
            out.insert(at, candidate);
        }
        return;
    }
    out.extend(scaled);
    if k < out.len() {
        out.select_nth_unstable_by(k - 1, order);
        out.truncate(k);
    }
    out.sort_unstable_by(order);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_is_first_max_and_ignores_rng() {
        let mut rng = Rng::new(1);
        let before = rng.clone().next_u64();
        let mut s = SamplerScratch::default();
        assert_eq!(
            sample_token(&[0.1, 3.0, 3.0, -1.0], true, 0.7, 25, &mut rng, &mut s),
            1
        );
        assert_eq!(
            sample_token(&[0.1, 3.0, 2.0], false, 0.0, 25, &mut rng, &mut s),
            1
        );
        assert_eq!(rng.next_u64(), before);
    }

    /// Both ways of finding the candidates keep the `k` best by (scaled logit, then index), in
    /// that order: ties and repeated values included, at every `k`.
    #[test]
    fn the_kept_candidates_are_the_k_best_in_order_either_way() {
        let logits: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919 % 61) as f32 * 0.37).sin().round() * 2.0 + (i % 7) as f32)
            .collect();
        let mut all: Vec<(f32, u32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (l / 0.7, i as u32))
            .collect();
        all.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut out = Vec::new();
        for k in [1, 2, 25, 62, 63, 250, 999, 1000] {
            top_candidates(&logits, 0.7, k, &mut out);
            assert_eq!(out, all[..k], "k = {k}");
        }
        top_candidates(&logits, 0.7, 0, &mut out);
        assert_eq!(out, all, "k = 0: all of them");
    }

    #[test]
    fn top_k_never_leaves_the_k_best_and_frequencies_follow_softmax() {
        let logits = [0.0f32, 1.0, 2.0, 0.5, -3.0, 1.5];
        let mut rng = Rng::new(99);
        let mut s = SamplerScratch::default();
        let n = 60_000;
        let mut counts = [0usize; 6];
        for _ in 0..n {
            counts[sample_token(&logits, false, 0.8, 3, &mut rng, &mut s) as usize] += 1;
        }
        // Top 3 are indices 2, 5, 1.
        assert_eq!(counts[0] + counts[3] + counts[4], 0, "{counts:?}");
        let z: f64 = [2.0f64, 1.5, 1.0].iter().map(|l| (l / 0.8).exp()).sum();
        for (i, l) in [(2usize, 2.0f64), (5, 1.5), (1, 1.0)] {
            let expect = (l / 0.8).exp() / z;
            let got = counts[i] as f64 / n as f64;
            assert!((got - expect).abs() < 0.01, "token {i}: {got} vs {expect}");
        }
    }
}
