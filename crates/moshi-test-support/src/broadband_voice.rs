//! tiny-a with a broadband voice: a copy of the fixture whose Mimi decoder upsamples without
//! the tones of its random transposed convolutions, for tests that need Moshi's voice to excite
//! every band (an echo canceller adapts only on such a reference).
//!
//! A transposed convolution of stride S and kernel 2S gives output sample `t*S + p` the taps
//! `p` and `p + S` of each input channel. With random weights the two taps' sum (the phase's
//! gain at 0 Hz) differs from phase to phase, so whatever is slow in the layer's input (the
//! biases, the ELUs' offsets) comes out periodic in S samples: a tone at `rate / S` and its
//! harmonics (tiny-a's voice: 6 kHz after the last stride 4, 1.2 kHz after 4 * 5). As an
//! interpolation filter, the kernel lets the images of 0 Hz through. Moving each tap pair by
//! half its distance to the mean over phases gives every phase the same gain at 0 Hz (the
//! filter has a zero at every multiple of `rate / S`) and leaves the rest of the random taps,
//! and so the broadband rest of the voice, as they were.

use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;

use crate::{copy_tiny_a_files, tiny_a};

/// Whether `name` is the weight of a transposed convolution on Mimi's decoding side (SEANet's
/// upsampling layers and the frame-rate upsampler).
fn is_decoder_upsampling(name: &str) -> bool {
    (name.starts_with("decoder.") || name.starts_with("upsample."))
        && name.contains("convtr")
        && name.ends_with(".weight")
}

/// For each kernel (the last axis, length 2S): the taps `p` and `p + S` moved by the same
/// amount so that their sum is the mean of those sums over the phases `p`.
fn equalize_phase_gains(weights: &mut [f32], kernel: usize) {
    assert!(
        kernel.is_multiple_of(2),
        "transposed convolution kernel {kernel}: expected twice the stride"
    );
    let stride = kernel / 2;
    for k in weights.chunks_exact_mut(kernel) {
        let mean_gain = k.iter().map(|&w| f64::from(w)).sum::<f64>() / stride as f64;
        for p in 0..stride {
            let shift = ((f64::from(k[p]) + f64::from(k[p + stride]) - mean_gain) / 2.0) as f32;
            k[p] -= shift;
            k[p + stride] -= shift;
        }
    }
}

/// Writes into `dir` tiny-a's model files (config, LM weights, tokenizer, Mimi config) and a
/// `mimi.safetensors` whose decoding transposed convolutions give every phase the same gain at 0 Hz (see the module
/// docs); `dir` is then a model folder for `--model`.
pub fn write_tiny_a_with_broadband_voice(dir: &Path) {
    copy_tiny_a_files(
        dir,
        &[
            "config.json",
            "model.safetensors",
            "tokenizer.model",
            "mimi_config.json",
        ],
    );
    let path = tiny_a("mimi.safetensors");
    let bytes =
        std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let st = SafeTensors::deserialize(&bytes)
        .unwrap_or_else(|e| panic!("{}: not safetensors: {e}", path.display()));
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut changed = 0;
    for (name, view) in st.tensors() {
        let mut data = view.data().to_vec();
        if is_decoder_upsampling(&name) {
            assert_eq!(view.dtype(), Dtype::F32, "{name}: expected f32");
            let mut w: Vec<f32> = data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            equalize_phase_gains(&mut w, *view.shape().last().unwrap());
            data = w.iter().flat_map(|v| v.to_le_bytes()).collect();
            changed += 1;
        }
        tensors.push((name, view.dtype(), view.shape().to_vec(), data));
    }
    assert_eq!(
        changed,
        5,
        "{}: expected 4 SEANet upsampling layers and the frame-rate upsampler",
        path.display()
    );
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            (
                name.clone(),
                TensorView::new(*dtype, shape.clone(), data).unwrap(),
            )
        })
        .collect();
    let out = dir.join("mimi.safetensors");
    safetensors::serialize_to_file(views, &None, &out)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", out.display()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_phase_gets_the_mean_gain_and_equal_gains_stay() {
        // Stride 2: phase gains 1 + 5 = 6 and 3 + 7 = 10, mean 8; then 4 - 2 = 0 + 2.
        let mut w = vec![1.0, 3.0, 5.0, 7.0, 4.0, 0.0, -2.0, 2.0];
        equalize_phase_gains(&mut w, 4);
        assert_eq!(w, vec![2.0, 2.0, 6.0, 6.0, 4.0, 0.0, -2.0, 2.0]);
    }
}
