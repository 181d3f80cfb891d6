//! AVX-512F kernels for 4- and 8-bit codes, specialised on (bits, group size) and on the number
//! of activation rows handled per pass (1..=4, so the matrix-vector case has its own code).
//!
//! 4 bits: 16 code bytes (32 columns) are widened to 16 u32 lanes; the low nibbles are the even
//! columns and the high nibbles the odd ones, so the activations are pre-arranged per block of
//! [`NIBBLE_BLOCK`] columns as [even, odd] (see `kernels::split_nibble_blocks`).
//! 8 bits: 16 code bytes are 16 consecutive columns, natural activation layout.
//! Weights are dequantized as `fma(q, scale, bias)` (4 bits: through a 16-entry table per group)
//! and accumulated in f32.

use std::arch::x86_64::*;

use crate::kernels::{RowRangeFn, PREFETCH_BYTES};
use crate::{bf16_bits_to_f32, QuantizedMatrix};

/// Column block of the even/odd activation arrangement for 4-bit codes.
pub(crate) const NIBBLE_BLOCK: usize = 32;

/// Weight rows per pass of the matrix-vector kernel on long rows (see
/// `kernels::MULTI_ROW_MIN_ROW_BYTES`): each activation chunk is loaded once for all of them.
pub(crate) const MATVEC_ROWS: usize = 4;

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
        is_x86_feature_detected!("avx512f"),
        "AVX-512 kernel called on a CPU without AVX-512F"
    );
    let nrows = out_t.len() / m;
    assert!(row_start + nrows <= w.rows() && xs.len() == m * w.cols());
    // SAFETY: AVX-512F is present (checked above); `rows_impl` only reads rows
    // `row_start..row_start + nrows` of `w` (checked in range) and `m` activation rows of `xs`.
    unsafe { rows_impl::<BITS, GROUP>(w, xs, m, row_start, out_t) }
}

x86_rows_impl!("avx512f");

/// The dequantized weights of the 32 columns `32 * c..32 * c + 32` of a row, as two vectors
/// (4 bits: even then odd columns; 8 bits: consecutive columns).
///
/// 4 bits: the 16 possible values `fma(q, scale, bias)` of the group form a table that
/// `vpermps` indexes with the nibbles directly (its index uses the low 4 bits of each lane).
///
/// # Safety
/// AVX-512F must be available; `codes` must hold the row's code bytes and `c < cols / 32`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn weights32<const BITS: usize, const GROUP: usize>(
    codes: *const u8,
    scales: &[f32],
    biases: &[f32],
    c: usize,
) -> (__m512, __m512) {
    let g = c * 32 / GROUP;
    let scale = _mm512_set1_ps(scales[g]);
    let bias = _mm512_set1_ps(biases[g]);
    if BITS == 4 {
        let levels = _mm512_setr_ps(
            0., 1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12., 13., 14., 15.,
        );
        let table = _mm512_fmadd_ps(levels, scale, bias);
        // SAFETY: the 16 code bytes of columns 32c..32c+32 lie inside the row.
        let v =
            _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(codes.add(c * 16) as *const __m128i) });
        (
            _mm512_permutexvar_ps(v, table),
            _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(v), table),
        )
    } else {
        // SAFETY: the 32 code bytes of columns 32c..32c+32 lie inside the row.
        let (v0, v1) = unsafe {
            (
                _mm_loadu_si128(codes.add(c * 32) as *const __m128i),
                _mm_loadu_si128(codes.add(c * 32 + 16) as *const __m128i),
            )
        };
        let q0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v0));
        let q1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v1));
        (
            _mm512_fmadd_ps(q0, scale, bias),
            _mm512_fmadd_ps(q1, scale, bias),
        )
    }
}

/// Dot products of one weight row with `MR` activation rows (`x`, row stride `cols`); two
/// 32-column chunks per step into four independent accumulators per activation row.
///
/// # Safety
/// AVX-512F must be available; `codes` must point to the row's `cols * BITS / 8` code bytes;
/// `x` must point to `MR` rows of `cols` floats; `scales`/`biases` hold `cols / GROUP` values.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn row_dot<const BITS: usize, const GROUP: usize, const MR: usize>(
    codes: *const u8,
    scales: &[f32],
    biases: &[f32],
    x: *const f32,
    cols: usize,
) -> [f32; MR] {
    let mut acc = [[_mm512_setzero_ps(); 4]; MR];
    let chunks = cols / 32;
    let mut c = 0;
    while c + 2 <= chunks {
        // Software prefetch of the code stream (a hint: never faults, so the address may run
        // past the row; `wrapping_add` keeps the pointer arithmetic defined).
        _mm_prefetch::<_MM_HINT_T0>(codes.wrapping_add(c * 4 * BITS + PREFETCH_BYTES) as *const i8);
        // SAFETY: c + 1 < chunks (the caller's contract covers the row and the activations).
        let (a0, a1) = unsafe { weights32::<BITS, GROUP>(codes, scales, biases, c) };
        let (b0, b1) = unsafe { weights32::<BITS, GROUP>(codes, scales, biases, c + 1) };
        for (i, acc) in acc.iter_mut().enumerate() {
            // SAFETY: columns 32c..32c+64 of activation row i < MR.
            let p = unsafe { x.add(i * cols + c * 32) };
            let (x0, x1, x2, x3) = unsafe {
                (
                    _mm512_loadu_ps(p),
                    _mm512_loadu_ps(p.add(16)),
                    _mm512_loadu_ps(p.add(32)),
                    _mm512_loadu_ps(p.add(48)),
                )
            };
            acc[0] = _mm512_fmadd_ps(a0, x0, acc[0]);
            acc[1] = _mm512_fmadd_ps(a1, x1, acc[1]);
            acc[2] = _mm512_fmadd_ps(b0, x2, acc[2]);
            acc[3] = _mm512_fmadd_ps(b1, x3, acc[3]);
        }
        c += 2;
    }
    if c < chunks {
        // SAFETY: c < chunks.
        let (a0, a1) = unsafe { weights32::<BITS, GROUP>(codes, scales, biases, c) };
        for (i, acc) in acc.iter_mut().enumerate() {
            // SAFETY: columns 32c..32c+32 of activation row i < MR.
            let p = unsafe { x.add(i * cols + c * 32) };
            let (x0, x1) = unsafe { (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))) };
            acc[0] = _mm512_fmadd_ps(a0, x0, acc[0]);
            acc[1] = _mm512_fmadd_ps(a1, x1, acc[1]);
        }
    }
    let mut out = [0f32; MR];
    for (o, a) in out.iter_mut().zip(&acc) {
        *o = reduce4(a);
    }
    out
}

/// Dot products of `NR` consecutive weight rows with one activation row: the same arithmetic per
/// row as `row_dot::<_, _, 1>` (same four accumulators, same reduction), so results are identical,
/// but each activation chunk is loaded once for all `NR` rows.
///
/// # Safety
/// AVX-512F must be available; `codes` must point to `NR` consecutive rows of `row_code_bytes`
/// code bytes; `x` must hold `cols` floats; `scales`/`biases` hold `NR * groups_per_row` values
/// (row-major).
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn multi_row_dot<const BITS: usize, const GROUP: usize, const NR: usize>(
    codes: *const u8,
    row_code_bytes: usize,
    scales: &[f32],
    biases: &[f32],
    x: *const f32,
    cols: usize,
) -> [f32; NR] {
    let groups_per_row = cols / GROUP;
    let mut acc = [[_mm512_setzero_ps(); 4]; NR];
    let chunks = cols / 32;
    let mut c = 0;
    while c + 2 <= chunks {
        // SAFETY: columns 32c..32c+64 of the activation row.
        let (x0, x1, x2, x3) = unsafe {
            let p = x.add(c * 32);
            (
                _mm512_loadu_ps(p),
                _mm512_loadu_ps(p.add(16)),
                _mm512_loadu_ps(p.add(32)),
                _mm512_loadu_ps(p.add(48)),
            )
        };
        for (r, acc) in acc.iter_mut().enumerate() {
            let row_codes = codes.wrapping_add(r * row_code_bytes);
            // A hint: never faults, so the address may run past the row.
            _mm_prefetch::<_MM_HINT_T0>(
                row_codes.wrapping_add(c * 4 * BITS + PREFETCH_BYTES) as *const i8,
            );
            let (s, b) = (
                &scales[r * groups_per_row..(r + 1) * groups_per_row],
                &biases[r * groups_per_row..(r + 1) * groups_per_row],
            );
            // SAFETY: row r < NR, chunks c and c + 1 < chunks.
            let (a0, a1) = unsafe { weights32::<BITS, GROUP>(row_codes, s, b, c) };
            let (b0, b1) = unsafe { weights32::<BITS, GROUP>(row_codes, s, b, c + 1) };
            acc[0] = _mm512_fmadd_ps(a0, x0, acc[0]);
            acc[1] = _mm512_fmadd_ps(a1, x1, acc[1]);
            acc[2] = _mm512_fmadd_ps(b0, x2, acc[2]);
            acc[3] = _mm512_fmadd_ps(b1, x3, acc[3]);
        }
        c += 2;
    }
    if c < chunks {
        // SAFETY: columns 32c..32c+32 of the activation row.
        let (x0, x1) = unsafe { (_mm512_loadu_ps(x.add(c * 32)), _mm512_loadu_ps(x.add(c * 32 + 16))) };
        for (r, acc) in acc.iter_mut().enumerate() {
            let row_codes = codes.wrapping_add(r * row_code_bytes);
            let (s, b) = (
                &scales[r * groups_per_row..(r + 1) * groups_per_row],
                &biases[r * groups_per_row..(r + 1) * groups_per_row],
            );
            // SAFETY: row r < NR, c < chunks.
            let (a0, a1) = unsafe { weights32::<BITS, GROUP>(row_codes, s, b, c) };
            acc[0] = _mm512_fmadd_ps(a0, x0, acc[0]);
            acc[1] = _mm512_fmadd_ps(a1, x1, acc[1]);
        }
    }
    let mut out = [0f32; NR];
    for (o, a) in out.iter_mut().zip(&acc) {
        *o = reduce4(a);
    }
    out
}

/// The sum of one activation row's four accumulators, in one fixed order (shared by the one-row
/// and the multi-row kernels, so both give the same bits).
#[target_feature(enable = "avx512f")]
#[inline]
fn reduce4(a: &[__m512; 4]) -> f32 {
    _mm512_reduce_add_ps(_mm512_add_ps(
        _mm512_add_ps(a[0], a[1]),
        _mm512_add_ps(a[2], a[3]),
    ))
}
