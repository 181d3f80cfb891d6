//! Generic kernel for any bit width (used for 2, 3, 5 and 6 bits): each group of a row is
//! unpacked into a small f32 buffer, dequantized as `q * scale + bias`, then dotted with every
//! activation row. Natural activation layout.

use crate::QuantizedMatrix;

/// Largest supported group size.
const MAX_GROUP: usize = 128;
/// Accumulator lanes (lets the compiler vectorize the dot products).
const LANES: usize = 8;

pub(crate) fn rows(w: &QuantizedMatrix, xs: &[f32], m: usize, row_start: usize, out_t: &mut [f32]) {
    let (cols, group_size) = (w.cols(), w.group_size());
    let groups_per_row = cols / group_size;
    let mut values = [0f32; MAX_GROUP];
    let mut acc = vec![[0f32; LANES]; m];
    for (local, out_row) in out_t.chunks_exact_mut(m).enumerate() {
        let r = row_start + local;
        acc.iter_mut().for_each(|a| *a = [0f32; LANES]);
        for g in 0..groups_per_row {
            let scale = w.scale_format().to_f32(w.scales()[r * groups_per_row + g]);
            let bias = w.scale_format().to_f32(w.biases()[r * groups_per_row + g]);
            let values = &mut values[..group_size];
            for (j, v) in values.iter_mut().enumerate() {
                *v = w.code(r, g * group_size + j) as f32 * scale + bias;
            }
            for (i, a) in acc.iter_mut().enumerate() {
                let x = &xs[i * cols + g * group_size..i * cols + (g + 1) * group_size];
                for (wc, xc) in values.chunks_exact(LANES).zip(x.chunks_exact(LANES)) {
                    for l in 0..LANES {
                        a[l] += wc[l] * xc[l];
                    }
                }
            }
        }
        for (o, a) in out_row.iter_mut().zip(&acc) {
            *o = a.iter().sum();
        }
    }
}
