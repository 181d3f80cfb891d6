//! AVX2 + FMA kernels for 4- and 8-bit codes, specialised on (bits, group size) and on the
//! number of activation rows handled per pass (1..=4).
//!
//! 4 bits: 8 code bytes (16 columns) are widened to 8 u32 lanes; low nibbles are the even
//! columns, high nibbles the odd ones, so activations are pre-arranged per block of
//! [`NIBBLE_BLOCK`] columns as [even, odd]. 8 bits: 8 code bytes are 8 consecutive columns.
//! Weights are dequantized as `fma(q, scale, bias)` and accumulated in f32.

use std::arch::x86_64::*;

use crate::kernels::RowRangeFn;
use crate::{bf16_bits_to_f32, QuantizedMatrix};

/// Column block of the even/odd activation arrangement for 4-bit codes.
pub(crate) const NIBBLE_BLOCK: usize = 16;

pub(crate) fn select(bits: u32, group_size: usize) -> Option<RowRangeFn> {
    Some(match (bits, group_size) {
        (4, 32) => rows::<4, 32>,
        (4, 64) => rows::<4, 64>,
        (4, 128) => rows::<4, 128>,
        (8, 32) => rows::<8, 32>,
        (8, 64) => rows::<8, 64>,
        (8, 128) => rows::<8, 128>,
        _ => return None,
    })
}

fn rows<const BITS: usize, const GROUP: usize>(
    w: &QuantizedMatrix,
    xs: &[f32],
    m: usize,
    row_start: usize,
    out_t: &mut [f32],
) {
    assert!(
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
        "AVX2 kernel called on a CPU without AVX2+FMA"
    );
    let nrows = out_t.len() / m;
    assert!(row_start + nrows <= w.rows() && xs.len() == m * w.cols());
    // SAFETY: AVX2 and FMA are present (checked above); `rows_impl` only reads rows
    // `row_start..row_start + nrows` of `w` (checked in range) and `m` activation rows of `xs`.
    unsafe { rows_impl::<BITS, GROUP>(w, xs, m, row_start, out_t) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn rows_impl<const BITS: usize, const GROUP: usize>(
    w: &QuantizedMatrix,
    xs: &[f32],
    m: usize,
    row_start: usize,
    out_t: &mut [f32],
) {
    let cols = w.cols();
    let row_code_bytes = cols * BITS / 8;
    let groups_per_row = cols / GROUP;
    let codes = w.codes().as_ptr() as *const u8;
    for (local, out_row) in out_t.chunks_exact_mut(m).enumerate() {
        let r = row_start + local;
        // SAFETY (all calls below): row `r` is in range, so its `row_code_bytes` code bytes and
        // `groups_per_row` scales/biases are in bounds; activation rows `i..i + MR` are < m.
        let row_codes = unsafe { codes.add(r * row_code_bytes) };
        let scales = &w.scales()[r * groups_per_row..(r + 1) * groups_per_row];
        let biases = &w.biases()[r * groups_per_row..(r + 1) * groups_per_row];
        let mut i = 0;
        while i + 4 <= m {
            let d = unsafe { row_dot::<BITS, GROUP, 4>(row_codes, scales, biases, xs.as_ptr().add(i * cols), cols) };
            out_row[i..i + 4].copy_from_slice(&d);
            i += 4;
        }
        let x = unsafe { xs.as_ptr().add(i * cols) };
        match m - i {
            3 => out_row[i..].copy_from_slice(&unsafe { row_dot::<BITS, GROUP, 3>(row_codes, scales, biases, x, cols) }),
            2 => out_row[i..].copy_from_slice(&unsafe { row_dot::<BITS, GROUP, 2>(row_codes, scales, biases, x, cols) }),
            1 => out_row[i..].copy_from_slice(&unsafe { row_dot::<BITS, GROUP, 1>(row_codes, scales, biases, x, cols) }),
            _ => {}
        }
    }
}

/// Horizontal sum of 8 lanes.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
    _mm_cvtss_f32(s)
}

/// Dot products of one weight row with `MR` activation rows (`x`, row stride `cols`).
///
/// # Safety
/// AVX2+FMA must be available; `codes` must point to the row's `cols * BITS / 8` code bytes;
/// `x` must point to `MR` rows of `cols` floats; `scales`/`biases` hold `cols / GROUP` values.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn row_dot<const BITS: usize, const GROUP: usize, const MR: usize>(
    codes: *const u8,
    scales: &[u16],
    biases: &[u16],
    x: *const f32,
    cols: usize,
) -> [f32; MR] {
    let mut acc0 = [_mm256_setzero_ps(); MR];
    let mut acc1 = [_mm256_setzero_ps(); MR];
    let low_nibble = _mm256_set1_epi32(0xF);
    let group_code_bytes = GROUP * BITS / 8;
    for (g, (&s, &b)) in scales.iter().zip(biases).enumerate() {
        let scale = _mm256_set1_ps(bf16_bits_to_f32(s));
        let bias = _mm256_set1_ps(bf16_bits_to_f32(b));
        // SAFETY: group `g` is within the row (the caller's contract).
        let gc = unsafe { codes.add(g * group_code_bytes) };
        // 16 columns per step: 8 code bytes (4 bits) or 16 code bytes (8 bits).
        for c in 0..GROUP / 16 {
            let (w0, w1) = if BITS == 4 {
                // SAFETY: bytes c*8..c*8+8 of the group's GROUP / 2 bytes.
                let v = _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(gc.add(c * 8) as *const __m128i) });
                let lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, low_nibble));
                let hi = _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(v));
                (_mm256_fmadd_ps(lo, scale, bias), _mm256_fmadd_ps(hi, scale, bias))
            } else {
                // SAFETY: bytes c*16..c*16+16 of the group's GROUP bytes.
                let v = unsafe { _mm_loadu_si128(gc.add(c * 16) as *const __m128i) };
                let q0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
                let q1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(v, v)));
                (_mm256_fmadd_ps(q0, scale, bias), _mm256_fmadd_ps(q1, scale, bias))
            };
            let col = g * GROUP + c * 16;
            for i in 0..MR {
                // SAFETY: columns col..col+16 of activation row i < MR.
                let (x0, x1) = unsafe {
                    let p = x.add(i * cols + col);
                    (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
                };
                acc0[i] = _mm256_fmadd_ps(w0, x0, acc0[i]);
                acc1[i] = _mm256_fmadd_ps(w1, x1, acc1[i]);
            }
        }
    }
    let mut out = [0f32; MR];
    for i in 0..MR {
        // SAFETY: AVX2 is available (this function's contract).
        out[i] = unsafe { hsum(_mm256_add_ps(acc0[i], acc1[i])) };
    }
    out
}
