//! Rotary position embedding with interleaved pairs `[r0, i0, r1, i1, ...]`, computed in f32
//! exactly like the official `apply_rope(interleave=True)`.

/// The per-pair frequencies of one head width.
#[derive(Clone, Debug)]
pub struct Rope {
    freqs: Vec<f32>,
}

/// cos/sin of every pair at one position.
#[derive(Clone, Debug, Default)]
pub struct RopeRotation {
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Rope {
    /// `freq[i] = exp(i * (-ln(max_period) * 2 / head_dim))`, in f32 like the reference.
    pub fn new(head_dim: usize, max_period: f64) -> Self {
        let step = (-max_period.ln() * 2.0 / head_dim as f64) as f32;
        let freqs = (0..head_dim / 2).map(|i| (i as f32 * step).exp()).collect();
        Self { freqs }
    }

    pub fn head_dim(&self) -> usize {
        self.freqs.len() * 2
    }

    /// Fills `rot` with the rotation at time position `pos`.
    pub fn rotation_into(&self, pos: usize, rot: &mut RopeRotation) {
        let t = pos as f32;
        rot.cos.clear();
        rot.sin.clear();
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
            for ((pair, &c), &s) in head.chunks_exact_mut(2).zip(&self.cos).zip(&self.sin) {
                let (r, i) = (pair[0], pair[1]);
                pair[0] = r * c - i * s;
                pair[1] = r * s + i * c;
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
