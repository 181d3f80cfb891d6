//! Where Mimi's tensors come from: the weights `moshi_loader::mimi_weights` read from a
//! checkpoint (PyTorch release names), or a deterministic random generator with the same names
//! and shapes (benchmarks of the real shape without the file).

use moshi_loader::WeightMap;

use crate::Result;

/// A provider of f32 tensors by PyTorch release name and expected shape.
pub(crate) trait WeightSource {
    fn tensor(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>>;
}

/// Tensors handed over by the loader: each taken once, its shape checked.
impl WeightSource for WeightMap {
    fn tensor(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        Ok(self.take_f32(name, shape)?)
    }
}

/// Deterministic random tensors, scaled so that activations keep a sane range through the
/// whole codec: convolutions get He-uniform weights, linears `U(±sqrt(3/fan_in))`, norms one,
/// layer scales 0.01, codebooks unit-variance entries with usage 1.
pub(crate) struct RandomWeights {
    state: u64,
}

impl RandomWeights {
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            state: seed ^ 0x9E37_79B9_7F4A_7C15,
        }
    }

    /// SplitMix64 step mapped to a uniform f32 in [-1, 1).
    fn next_uniform(&mut self) -> f32 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn uniform(&mut self, n: usize, bound: f32) -> Vec<f32> {
        (0..n).map(|_| self.next_uniform() * bound).collect()
    }
}

impl WeightSource for RandomWeights {
    fn tensor(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let n: usize = shape.iter().product();
        let v = if name.ends_with("_initialized") || name.ends_with("cluster_usage") {
            vec![1.0; n]
        } else if name.ends_with("layer_scale_1.scale") || name.ends_with("layer_scale_2.scale") {
            vec![0.01; n]
        } else if name.contains(".norm") && name.ends_with(".weight") {
            vec![1.0; n]
        } else if name.ends_with(".bias") {
            if name.contains(".norm") {
                vec![0.0; n]
            } else {
                self.uniform(n, 0.01)
            }
        } else if name.ends_with("embedding_sum") {
            self.uniform(n, 3f32.sqrt())
        } else if name.contains("convtr.weight") {
            // [in, out/groups, k]: each output sample sums over in * k / stride (= 2) taps.
            let fan_in = (shape[0] * shape[2] / 2).max(1);
            self.uniform(n, (6.0 / fan_in as f32).sqrt())
        } else if name.contains("conv.weight") {
            let fan_in = shape[1..].iter().product::<usize>().max(1);
            self.uniform(n, (6.0 / fan_in as f32).sqrt())
        } else {
            let fan_in = shape[1..].iter().product::<usize>().max(1);
            self.uniform(n, (3.0 / fan_in as f32).sqrt())
        };
        Ok(v)
    }
}
