//! Rotary position embedding, computed in f32 exactly like the official `apply_rope`: pairs
//! interleaved `[r0, i0, r1, i1, ...]` (`interleave=True`, `rope`) or the two halves of each
//! head `[r0, r1, ..., i0, i1, ...]` (`interleave=False`, `rope_concat`).

/// The per-pair frequencies of one head width, and where a pair's two values are.
#[derive(Clone, Debug)]
pub struct Rope {
    freqs: Vec<f32>,
    halves: bool,
}

/// cos/sin of every pair at one position.
#[derive(Clone, Debug, Default)]
pub struct RopeRotation {
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// Pair `i` is `(x[i], x[i + head_dim / 2])`, not `(x[2i], x[2i + 1])`.
    halves: bool,
}

impl Rope {
    /// `freq[i] = exp(i * (-ln(max_period) * 2 / head_dim))`, in f32 like the reference.
    pub fn new(head_dim: usize, max_period: f64) -> Self {
        let step = (-max_period.ln() * 2.0 / head_dim as f64) as f32;
        let freqs = (0..head_dim / 2).map(|i| (i as f32 * step).exp()).collect();
        Self {
            freqs,
            halves: false,
        }
    }

    /// [`Rope::new`] rotating the two halves of each head (`rope_concat`).
    pub fn halves(head_dim: usize, max_period: f64) -> Self {
        Self {
            halves: true,
            ..Self::new(head_dim, max_period)
        }
    }

    pub fn head_dim(&self) -> usize {
        self.freqs.len() * 2
    }

    /// Fills `rot` with the rotation at time position `pos`.
    pub fn rotation_into(&self, pos: usize, rot: &mut RopeRotation) {
        let t = pos as f32;
        rot.cos.clear();
        rot.sin.clear();
        rot.halves = self.halves;
        for &f in &self.freqs {
            let angle = f * t;
            rot.cos.push(angle.cos());
            rot.sin.push(angle.sin());
        }
    }
}

impl RopeRotation {
    /// Rotates every head of `x` (`[heads * head_dim]`, head-major) in place.
    pub fn apply(&self, x: &mut [f32]) {
        let half = self.cos.len();
        if half == 0 {
            return;
        }
        for head in x.chunks_exact_mut(2 * half) {
            if self.halves {
                let (re, im) = head.split_at_mut(half);
                for (((r, i), &c), &s) in re.iter_mut().zip(im).zip(&self.cos).zip(&self.sin) {
                    (*r, *i) = (*r * c - *i * s, *r * s + *i * c);
                }
            } else {
                for ((pair, &c), &s) in head.chunks_exact_mut(2).zip(&self.cos).zip(&self.sin) {
                    let (r, i) = (pair[0], pair[1]);
                    pair[0] = r * c - i * s;
                    pair[1] = r * s + i * c;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity_and_rotation_preserves_pair_norms() {
        let rope = Rope::new(8, 10000.0);
        let mut rot = RopeRotation::default();
        let x0: Vec<f32> = (0..16).map(|i| (i as f32 * 0.3).sin()).collect();
        rope.rotation_into(0, &mut rot);
        let mut x = x0.clone();
        rot.apply(&mut x);
        assert_eq!(x, x0);
        rope.rotation_into(37, &mut rot);
        rot.apply(&mut x);
        for (a, b) in x.chunks(2).zip(x0.chunks(2)) {
            let (na, nb) = (a[0].hypot(a[1]), b[0].hypot(b[1]));
            assert!((na - nb).abs() < 1e-5);
        }
        // Pair 0 rotates by exactly `pos` radians (freq 1).
        let angle = x[1].atan2(x[0]) - x0[1].atan2(x0[0]);
        let wrapped = (angle - 37.0).rem_euclid(std::f32::consts::TAU);
        assert!(
            !(1e-3..=std::f32::consts::TAU - 1e-3).contains(&wrapped),
            "{angle}"
        );
    }

    /// The halves layout is the interleaved one on the de-interleaved head.
    #[test]
    fn halves_rotate_like_interleaved_pairs_moved_apart() {
        let (hd, pos) = (8, 13);
        let x: Vec<f32> = (0..2 * hd).map(|i| (i as f32 * 0.7).sin()).collect();
        let interleave = |x: &[f32]| -> Vec<f32> {
            x.chunks(hd)
                .flat_map(|h| (0..hd / 2).flat_map(move |i| [h[i], h[i + hd / 2]]))
                .collect()
        };
        let mut rot = RopeRotation::default();
        let mut halves = x.clone();
        Rope::halves(hd, 10000.0).rotation_into(pos, &mut rot);
        rot.apply(&mut halves);
        let mut pairs = interleave(&x);
        Rope::new(hd, 10000.0).rotation_into(pos, &mut rot);
        rot.apply(&mut pairs);
        assert_eq!(interleave(&halves), pairs);
    }

    #[test]
    fn relative_positions_give_position_independent_scores() {
        // RoPE's defining property: <R(p)q, R(p+d)k> depends only on d.
        let rope = Rope::new(16, 10000.0);
        let q: Vec<f32> = (0..16).map(|i| (i as f32 * 0.7).cos()).collect();
        let k: Vec<f32> = (0..16).map(|i| (i as f32 * 1.3).sin()).collect();
        let score = |p: usize, d: usize| {
            let mut rot = RopeRotation::default();
            let (mut qq, mut kk) = (q.clone(), k.clone());
            rope.rotation_into(p, &mut rot);
            rot.apply(&mut qq);
            rope.rotation_into(p + d, &mut rot);
            rot.apply(&mut kk);
            qq.iter().zip(&kk).map(|(a, b)| a * b).sum::<f32>()
        };
        assert!((score(0, 5) - score(11, 5)).abs() < 1e-4);
    }
}
