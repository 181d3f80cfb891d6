//! AVX2 + FMA kernels for 4- and 8-bit codes, specialised on (bits, group size) and on the
//! number of activation rows handled per pass (1..=4).
//!
//! 4 bits: 8 code bytes (16 columns) are widened to 8 u32 lanes; low nibbles are the even
//! columns, high nibbles the odd ones, so activations are pre-arranged per block of
//! [`NIBBLE_BLOCK`] columns as [even, odd]. 8 bits: 8 code bytes are 8 consecutive columns.
//! Weights are dequantized as `fma(q, scale, bias)` and accumulated in f32.

use std::arch::x86_64::*;

use crate::kernels::{RowRangeFn, PREFETCH_BYTES};
use crate::{bf16_bits_to_f32, QuantizedMatrix};

/// Column block of the even/odd activation arrangement for 4-bit codes.
pub(crate) const NIBBLE_BLOCK: usize = 16;

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

/// Per weight row: upcasts its scales and biases to f32, then calls [`row_dot`] on 4 activation
/// rows at a time and once more on the last 1..=3.
///
/// # Safety
/// AVX2 and FMA must be available; rows `row_start..row_start + out_t.len() / m` must exist in
/// `w`; `xs` must hold `m * w.cols()` values.
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
    // The row's scales and biases as f32, so the group loop broadcasts them straight from
    // memory.
    let mut scales = vec![0f32; groups_per_row];
    let mut biases = vec![0f32; groups_per_row];
    for (local, out_row) in out_t.chunks_exact_mut(m).enumerate() {
        let r = row_start + local;
        let groups = r * groups_per_row..(r + 1) * groups_per_row;
        for ((s, b), (&sb, &bb)) in scales
            .iter_mut()
            .zip(biases.iter_mut())
            .zip(w.scales()[groups.clone()].iter().zip(&w.biases()[groups]))
        {
            *s = bf16_bits_to_f32(sb);
            *b = bf16_bits_to_f32(bb);
        }
        // SAFETY (all calls below): row `r` is in range, so its `row_code_bytes` code
        // bytes are in bounds; activation rows `i..i + MR` are < m, each `cols` long.
        let row_codes = unsafe { codes.add(r * row_code_bytes) };
        let mut i = 0;
        while i + 4 <= m {
            let d = unsafe {
                row_dot::<BITS, GROUP, 4>(
                    row_codes,
                    &scales,
                    &biases,
                    xs.as_ptr().add(i * cols),
                    cols,
                )
            };
            out_row[i..i + 4].copy_from_slice(&d);
            i += 4;
        }
        let x = unsafe { xs.as_ptr().add(i * cols) };
        match m - i {
            3 => out_row[i..].copy_from_slice(&unsafe {
                row_dot::<BITS, GROUP, 3>(row_codes, &scales, &biases, x, cols)
            }),
            2 => out_row[i..].copy_from_slice(&unsafe {
                row_dot::<BITS, GROUP, 2>(row_codes, &scales, &biases, x, cols)
            }),
            1 => out_row[i..].copy_from_slice(&unsafe {
                row_dot::<BITS, GROUP, 1>(row_codes, &scales, &biases, x, cols)
            }),
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

/// The dequantized weights of the 16 columns `16 * c..16 * c + 16` of a row, as two vectors
/// (4 bits: even then odd columns; 8 bits: consecutive columns), `fma(q, scale, bias)`.
///
/// # Safety
/// AVX2+FMA must be available; `codes` must hold the row's code bytes and `c < cols / 16`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn weights16<const BITS: usize, const GROUP: usize>(
    codes: *const u8,
    scales: &[f32],
    biases: &[f32],
    c: usize,
) -> (__m256, __m256) {
    let g = c * 16 / GROUP;
    let scale = _mm256_set1_ps(scales[g]);
    let bias = _mm256_set1_ps(biases[g]);
    let (q0, q1) = if BITS == 4 {
        // SAFETY: the 8 code bytes of columns 16c..16c+16 lie inside the row.
        let v =
            _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(codes.add(c * 8) as *const __m128i) });
        let lo = _mm256_and_si256(v, _mm256_set1_epi32(0xF));
        (
            _mm256_cvtepi32_ps(lo),
            _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(v)),
        )
    } else {
        // SAFETY: the 16 code bytes of columns 16c..16c+16 lie inside the row.
        let v = unsafe { _mm_loadu_si128(codes.add(c * 16) as *const __m128i) };
        (
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)),
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(v, v))),
        )
    };
    (
        _mm256_fmadd_ps(q0, scale, bias),
        _mm256_fmadd_ps(q1, scale, bias),
    )
}

/// Dot products of one weight row with `MR` activation rows (`x`, row stride `cols`); two
/// 16-column chunks per step into four independent accumulators per activation row.
///
/// # Safety
/// AVX2+FMA must be available; `codes` must point to the row's `cols * BITS / 8` code bytes;
/// `x` must point to `MR` rows of `cols` floats; `scales`/`biases` hold `cols / GROUP` values.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn row_dot<const BITS: usize, const GROUP: usize, const MR: usize>(
    codes: *const u8,
    scales: &[f32],
    biases: &[f32],
    x: *const f32,
    cols: usize,
) -> [f32; MR] {
    let mut acc = [[_mm256_setzero_ps(); 4]; MR];
    let chunks = cols / 16;
    let mut c = 0;
    while c + 2 <= chunks {
        // Software prefetch of the code stream (a hint: never faults, so the address may run
        // past the row; `wrapping_add` keeps the pointer arithmetic defined).
        _mm_prefetch::<_MM_HINT_T0>(codes.wrapping_add(c * 2 * BITS + PREFETCH_BYTES) as *const i8);
        // SAFETY: c + 1 < chunks (the caller's contract covers the row and the activations).
        let (a0, a1) = unsafe { weights16::<BITS, GROUP>(codes, scales, biases, c) };
        let (b0, b1) = unsafe { weights16::<BITS, GROUP>(codes, scales, biases, c + 1) };
        for (i, acc) in acc.iter_mut().enumerate() {
            // SAFETY: columns 16c..16c+32 of activation row i < MR.
            let p = unsafe { x.add(i * cols + c * 16) };
            let (x0, x1, x2, x3) = unsafe {
                (
                    _mm256_loadu_ps(p),
                    _mm256_loadu_ps(p.add(8)),
                    _mm256_loadu_ps(p.add(16)),
                    _mm256_loadu_ps(p.add(24)),
                )
            };
            acc[0] = _mm256_fmadd_ps(a0, x0, acc[0]);
            acc[1] = _mm256_fmadd_ps(a1, x1, acc[1]);
            acc[2] = _mm256_fmadd_ps(b0, x2, acc[2]);
            acc[3] = _mm256_fmadd_ps(b1, x3, acc[3]);
        }
        c += 2;
    }
    if c < chunks {
        // SAFETY: c < chunks.
        let (a0, a1) = unsafe { weights16::<BITS, GROUP>(codes, scales, biases, c) };
        for (i, acc) in acc.iter_mut().enumerate() {
            // SAFETY: columns 16c..16c+16 of activation row i < MR.
            let p = unsafe { x.add(i * cols + c * 16) };
            let (x0, x1) = unsafe { (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))) };
            acc[0] = _mm256_fmadd_ps(a0, x0, acc[0]);
            acc[1] = _mm256_fmadd_ps(a1, x1, acc[1]);
        }
    }
    let mut out = [0f32; MR];
    for (o, a) in out.iter_mut().zip(&acc) {
        // SAFETY: AVX2 is available (this function's contract).
        *o = unsafe {
            hsum(_mm256_add_ps(
                _mm256_add_ps(a[0], a[1]),
                _mm256_add_ps(a[2], a[3]),
            ))
        };
    }
    out
}
