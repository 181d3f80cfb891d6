//! Portable kernels for 4- and 8-bit codes, specialised on the group size: codes are unpacked
//! straight from the `u32` words (endianness-independent), `w = q * scale + bias`, 16
//! accumulator lanes per activation row so the compiler can vectorize. Natural activation layout.

use crate::quant::RowRangeFn;
use crate::QuantizedMatrix;

const LANES: usize = 16;

pub(crate) fn select(bits: u32, group_size: usize) -> Option<RowRangeFn> {
    select_specialised_rows!(rows, bits, group_size)
}

fn rows<const BITS: usize, const GROUP: usize>(
    w: &QuantizedMatrix,
    xs: &[f32],
    m: usize,
    row_start: usize,
    out_t: &mut [f32],
) {
    let cols = w.cols();
    let words_per_row = cols * BITS / 32;
    let groups_per_row = cols / GROUP;
    let format = w.scale_format();
    let mut acc = vec![[0f32; LANES]; m];
    for (local, out_row) in out_t.chunks_exact_mut(m).enumerate() {
        let r = row_start + local;
        let codes = &w.codes()[r * words_per_row..(r + 1) * words_per_row];
        let scales = &w.scales()[r * groups_per_row..(r + 1) * groups_per_row];
        let biases = &w.biases()[r * groups_per_row..(r + 1) * groups_per_row];
        acc.iter_mut().for_each(|a| *a = [0f32; LANES]);
        // One chunk = LANES consecutive columns = LANES * BITS / 32 words.
        let words_per_chunk = LANES * BITS / 32;
        for (c, chunk_words) in codes.chunks_exact(words_per_chunk).enumerate() {
            let g = c * LANES / GROUP;
            let (scale, bias) = (format.to_f32(scales[g]), format.to_f32(biases[g]));
            let mut wv = [0f32; LANES];
            let per_word = 32 / BITS;
            for (k, word) in chunk_words.iter().enumerate() {
                for e in 0..per_word {
                    let q = (word >> (e * BITS)) & ((1u32 << BITS) - 1);
                    wv[k * per_word + e] = q as f32 * scale + bias;
                }
            }
            let col = c * LANES;
            for (i, a) in acc.iter_mut().enumerate() {
                let x = &xs[i * cols + col..i * cols + col + LANES];
                for l in 0..LANES {
                    a[l] += wv[l] * x[l];
                }
            }
        }
        for (o, a) in out_row.iter_mut().zip(&acc) {
            *o = a.iter().sum();
        }
    }
}
