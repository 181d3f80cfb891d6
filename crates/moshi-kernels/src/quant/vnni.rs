//! AVX-512 VNNI kernel for 4-bit codes: codes and activations meet in integer dot products
//! (`vpdpbusd`, 64 byte products per instruction), each activation held as a 24-bit fixed-point
//! number of its quantization group, in three signed 8-bit digits. (8-bit products are memory
//! bound with the exact-f32 lane kernel already, and measured no faster here, so
//! `Kernel::Avx512Vnni` leaves them to it.)
//!
//! **Activations** ([`arrange_activations`], once per product), in the fixed point of
//! `quant::fixed_point`. A row is scaled by the power of
//! two `2^-e` that brings its largest magnitude into [1, 2). Each group `g` then gets a unit
//! `u_g`: the power of two 22 binades below its largest scaled magnitude (one binade higher when
//! that largest value would round past `DIGITS_MAX`), never below `2^MIN_UNIT_EXP`. Every value
//! becomes the integer `n = round(x · 2^-e / u_g)`, `|n| ≤ 8355711`, split into three signed
//! base-256 digits. So each activation is held to within half a unit: at most `2^-23` of its
//! group's largest magnitude, the size of one f32 rounding of that value. Values with no more
//! than 22 significant bits below their group's largest (small integers, for one) are exact.
//! Rows holding a NaN, an infinity or only subnormal magnitudes are not arranged (`None`); the
//! caller then uses the f32 AVX-512 kernel.
//!
//! **Per block** of 64 code bytes (16 `i32` lanes: 128 columns) and weight row: the codes are
//! split into their low and high nibbles (one AND, one shift and one AND give two vectors of
//! bytes), and each lane's `Σ q · n` over its 8 columns is built digit by digit, most
//! significant first, the sum shifted up 8 bits between digits. Integer sums are exact and fit
//! `i32`: a lane's 8 products of a code and a digit (`|d| ≤ 128`) stay below 2^14, so the whole
//! sum stays below 2^30. Each lane's sum is then
//! converted to f32 and accumulated with the factor `scale_g · u_g` (prepared per weight row and
//! activation row, exact: `u_g` is a power of two). A row's result is
//! `2^e · Σ + Σ_g bias_g · Σ_{j∈g} x_j`, the bias part on f32 group sums as in the other kernels.
//!
//! Against the f32 lane kernel (`quant::lanes`) this is 14 vector operations per 64 bytes of
//! 4-bit codes instead of about 26, and six of them are integer dot products: enough to leave
//! 4-bit products bound by memory rather than by arithmetic on two Zen 4 cores. The kernel tests
//! hold it to the same error bound as the f32 kernels.

use std::arch::x86_64::*;

use crate::quant::fixed_point::{
    arrange_rows, group_unit_exp, pow2, DigitTile, DigitTiles, RowLayout, RowScale, DIGITS,
};
use crate::quant::lanes::MULTI_ROW_MIN_ACTIVATION_BYTES;
use crate::quant::passes::run_passes;
use crate::quant::{CodePrefetch, RowRangeFn, SCALE_PREFETCH_ROWS};
use crate::QuantizedMatrix;

/// `i32` lanes per vector (and `u32` code words per block).
const LANES: usize = 16;

/// Code bytes per block (one vector).
const BLOCK_BYTES: usize = 64;

/// Whether this CPU has AVX-512F, BW (for the activation arrangement) and VNNI.
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
}

/// `Some` for 4-bit codes in groups of 32, 64 or 128.
pub(crate) fn select(bits: u32, group_size: usize) -> Option<RowRangeFn> {
    match (bits, group_size) {
        (4, 32) => Some(rows::<32> as RowRangeFn),
        (4, 64) => Some(rows::<64>),
        (4, 128) => Some(rows::<128>),
        _ => None,
    }
}

/// Columns per block (64 bytes of 4-bit codes).
const BLOCK_COLS: usize = 128;

/// Codes per `u32` lane.
const PER_LANE: usize = 8;

/// Byte vectors per digit and block: the low and high nibbles of the codes.
const PLANES: usize = 2;

/// Digit bytes per block of arranged activations.
const BLOCK_DIGIT_BYTES: usize = DIGITS * PLANES * BLOCK_BYTES;

fn row_layout(cols: usize, group_size: usize) -> RowLayout {
    RowLayout::new(cols, group_size, BLOCK_COLS, LANES)
}

/// Lays out `m` rows of `cols` activations for this kernel (see the module docs), or `None` if a
/// row holds a non-finite value or only subnormal magnitudes.
///
/// # Panics
/// If the CPU lacks the features (callers pick this kernel only where [`available`]), or the
/// group size is not a multiple of 16 dividing `cols`.
pub(crate) fn arrange_activations(
    x: &[f32],
    m: usize,
    cols: usize,
    group_size: usize,
) -> Option<Vec<f32>> {
    assert!(available(), "VNNI kernel called on a CPU without it");
    assert!(group_size.is_multiple_of(16) && cols.is_multiple_of(group_size));
    let layout = row_layout(cols, group_size);
    arrange_rows(x, m, cols, layout, |row, dst| {
        // SAFETY: the CPU has the features (asserted above); rows of `cols`, a multiple of the
        // group size (a multiple of 16 for every specialised kernel); `dst` laid out for them.
        unsafe { arrange_row(row, dst, group_size, layout) }
    })
}

/// One row of [`arrange_activations`] into the zeroed `dst`; false if it cannot be arranged.
/// Sixteen columns at a time (`group_size` is a multiple of 16).
///
/// # Safety
/// The CPU must have AVX-512F and AVX-512BW; `row.len()` is a multiple of `group_size`, itself
/// a multiple of 16; `dst` is laid out by `layout` for `row.len()` columns.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn arrange_row(row: &[f32], dst: &mut [f32], group_size: usize, layout: RowLayout) -> bool {
    debug_assert!(group_size.is_multiple_of(16) && row.len().is_multiple_of(group_size));
    let mut max = _mm512_setzero_ps();
    let mut nan = 0u16;
    for v in row.chunks_exact(16) {
        // SAFETY: 16 floats.
        let v = unsafe { _mm512_loadu_ps(v.as_ptr()) };
        nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
        max = _mm512_max_ps(max, _mm512_abs_ps(v));
    }
    let row_exp = match RowScale::of_row(_mm512_reduce_max_ps(max), nan != 0) {
        None => return false,
        Some(RowScale::Zero) => {
            dst[layout.unscale_offset] = 1.0;
            return true;
        }
        Some(RowScale::Exponent(e)) => e,
    };
    let row_scale = _mm512_set1_ps(pow2(-row_exp));
    dst[layout.unscale_offset] = pow2(row_exp);
    let (digit_slots, tail) = dst.split_at_mut(layout.digits_len);
    let (units, tail) = tail.split_at_mut(layout.sums_offset - layout.units_offset);
    let sums = &mut tail[..layout.unscale_offset - layout.sums_offset];
    let digits = digit_slots.as_mut_ptr() as *mut u8;
    let digit_stride = PLANES * BLOCK_BYTES;
    // Even columns first, then odd ones: the low- and high-nibble planes.
    let even_odd = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    for (g, group) in row.chunks_exact(group_size).enumerate() {
        let (mut sum, mut group_max) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        for v in group.chunks_exact(16) {
            // SAFETY: 16 floats.
            let v = unsafe { _mm512_loadu_ps(v.as_ptr()) };
            sum = _mm512_add_ps(sum, v);
            group_max = _mm512_max_ps(group_max, _mm512_abs_ps(v));
        }
        sums[g] = _mm512_reduce_add_ps(sum);
        let unit_exp = group_unit_exp(_mm512_reduce_max_ps(group_max) * pow2(-row_exp));
        units[g] = pow2(unit_exp);
        let inverse_unit = _mm512_set1_ps(pow2(-unit_exp));
        for (k, v) in group.chunks_exact(16).enumerate() {
            // SAFETY: 16 floats.
            let v = unsafe { _mm512_loadu_ps(v.as_ptr()) };
            // Exact scalings by powers of two, then one rounding (to nearest even): |n| ≤
            // DIGITS_MAX by the choice of the unit.
            let n = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(v, row_scale), inverse_unit));
            // Balanced base-256 digits: d0 = n's low byte as i8, n1 = (n - d0) / 256, ...
            let n1 = _mm512_srai_epi32::<8>(_mm512_sub_epi32(
                n,
                _mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(n)),
            ));
            let n2 = _mm512_srai_epi32::<8>(_mm512_sub_epi32(
                n1,
                _mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(n1)),
            ));
            let col = g * group_size + k * 16;
            let (block, c) = (col / BLOCK_COLS, col % BLOCK_COLS);
            let block_at = block * BLOCK_DIGIT_BYTES;
            for (d, value) in [n2, n1, n].into_iter().enumerate() {
                let bytes = _mm512_cvtepi32_epi8(value);
                let at = block_at + d * digit_stride;
                // Lanes c/8 and c/8 + 1: their codes' bytes are plane bytes c/2.. c/2 + 8.
                let split = _mm_shuffle_epi8(bytes, even_odd);
                // SAFETY: inside block `block` of the digit part (layout).
                unsafe {
                    let low = digits.add(at + c / 2);
                    _mm_storel_epi64(low as *mut __m128i, split);
                    _mm_storel_epi64(
                        low.add(BLOCK_BYTES) as *mut __m128i,
                        _mm_unpackhi_epi64(split, split),
                    );
                }
            }
        }
    }
    true
}

fn rows<const GROUP: usize>(
    w: &QuantizedMatrix,
    xs: &[f32],
    m: usize,
    row_start: usize,
    out_t: &mut [f32],
) {
    assert!(available(), "VNNI kernel called on a CPU without it");
    let nrows = out_t.len() / m;
    let layout = row_layout(w.cols(), GROUP);
    assert!(row_start + nrows <= w.rows() && xs.len() == m * layout.stride);
    // SAFETY (both): the CPU has the features (checked above); the tiles only read rows
    // `row_start..row_start + nrows` of `w` (checked in range) and `m` arranged rows of `xs`.
    if six_rows_per_matvec_pass(layout.stride * 4) {
        let mut tiles = unsafe { DigitTiles::<Vnni, GROUP, 6>::new(w, xs, layout) };
        unsafe { run_passes(&mut tiles, m, row_start, out_t) }
    } else {
        let mut tiles = unsafe { DigitTiles::<Vnni, GROUP, 2>::new(w, xs, layout) };
        unsafe { run_passes(&mut tiles, m, row_start, out_t) }
    }
}

/// The VNNI kernel's tile, for [`DigitTiles`].
struct Vnni;

impl DigitTile for Vnni {
    const LANES: usize = LANES;
    // Two weight rows per matrix-matrix tile from 2 activation rows on: their digits (6 vectors a
    // block each) are otherwise reloaded for every weight row (measured: LM step 0.60-0.68x at
    // 2 to 8 sessions, q4).
    const PAIRED_FROM_M: usize = 2;

    /// The tile of [`DigitTile::tile`] in AVX-512 VNNI (per block: see the module docs).
    #[target_feature(enable = "avx512f,avx512vnni")]
    #[inline]
    unsafe fn tile<const GROUP: usize, const NR: usize, const MR: usize, const UNROLL: usize>(
        w: &QuantizedMatrix,
        r0: usize,
        xs: *const f32,
        layout: RowLayout,
        scales: &mut [f32],
        row_step: usize,
        prefetch: CodePrefetch,
    ) -> [[f32; MR]; NR] {
        let cols = w.cols();
        let blocks = cols.div_ceil(BLOCK_COLS);
        let groups = cols / GROUP;
        let padded = groups.next_multiple_of(LANES) + LANES;
        let row_code_bytes = cols / 2;
        for r in 0..NR {
            prefetch.scales_of_row(w, r0 + r * row_step + SCALE_PREFETCH_ROWS);
        }
        let mut bias_terms = [[0f32; MR]; NR];
        for (r, terms) in bias_terms.iter_mut().enumerate() {
            // SAFETY: forwarded contract; windows r·MR.. of `padded` floats each.
            *terms = unsafe {
                prepare_row::<GROUP, MR>(
                    w,
                    r0 + r * row_step,
                    xs,
                    layout,
                    &mut scales[r * MR * padded..(r + 1) * MR * padded],
                    padded,
                )
            };
        }
        // Which group each lane of a block belongs to, relative to the block's first group.
        let lanes_per_group = (GROUP / PER_LANE).min(LANES);
        let mut lane_group = [0i32; LANES];
        for (lane, g) in lane_group.iter_mut().enumerate() {
            *g = (lane / lanes_per_group) as i32;
        }
        // SAFETY: LANES i32.
        let lane_group = unsafe { _mm512_loadu_si512(lane_group.as_ptr() as *const _) };
        let full_blocks = cols / BLOCK_COLS;
        let tail_lanes = (cols % BLOCK_COLS) / PER_LANE;
        let codes = w.codes().as_ptr().wrapping_add(r0 * row_code_bytes / 4) as *const u8;
        let row_code_bytes = row_code_bytes * row_step;
        let digits = xs as *const u8;
        let stride_bytes = layout.stride * 4;
        let mut acc = [[_mm512_setzero_ps(); MR]; NR];
        let mut b = 0;
        while b + UNROLL <= full_blocks {
            // SAFETY (both calls): blocks b..b + UNROLL are whole blocks of every row of the tile;
            // `scales` holds NR·MR windows.
            let sums = unsafe {
                block_sums::<NR, MR, UNROLL>(
                    codes,
                    row_code_bytes,
                    b,
                    LANES,
                    digits,
                    stride_bytes,
                    prefetch,
                )
            };
            unsafe {
                accumulate::<GROUP, NR, MR, UNROLL>(&mut acc, &sums, b, scales, padded, lane_group)
            };
            b += UNROLL;
        }
        while b < blocks {
            let valid_lanes = if b == full_blocks { tail_lanes } else { LANES };
            // SAFETY (both calls): the valid lanes of block b lie inside every row of the tile; as
            // above.
            let sums = unsafe {
                block_sums::<NR, MR, 1>(
                    codes,
                    row_code_bytes,
                    b,
                    valid_lanes,
                    digits,
                    stride_bytes,
                    prefetch,
                )
            };
            unsafe {
                accumulate::<GROUP, NR, MR, 1>(&mut acc, &sums, b, scales, padded, lane_group)
            };
            b += 1;
        }
        let mut out = [[0f32; MR]; NR];
        for r in 0..NR {
            for i in 0..MR {
                // SAFETY: the row scale lies in arranged row i.
                let unscale = unsafe { *xs.add(i * layout.stride + layout.unscale_offset) };
                out[r][i] = _mm512_reduce_add_ps(acc[r][i]) * unscale + bias_terms[r][i];
            }
        }
        out
    }
}

/// Writes, for each of the `MR` activation rows `i`, row `r`'s factors `scale_g · u_{i,g}` into
/// window `i` of `windows` (`padded` floats each: the groups, then zeros), and returns the bias
/// terms `Σ_g bias_g · Σ_{j∈g} x_{i,j}` (f32 group sums, summed group by group in 16 lanes as in
/// the lane kernels). One pass over the row's bf16 scales and biases.
///
/// # Safety
/// The CPU must have AVX-512F; `r < w.rows()`; `xs` must point to `MR` arranged rows;
/// `windows.len() >= MR * padded` with `padded = groups padded to LANES + LANES`, zero past each
/// window's groups.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn prepare_row<const GROUP: usize, const MR: usize>(
    w: &QuantizedMatrix,
    r: usize,
    xs: *const f32,
    layout: RowLayout,
    windows: &mut [f32],
    padded: usize,
) -> [f32; MR] {
    let groups = w.cols() / GROUP;
    let row_scales = &w.scales()[r * groups..(r + 1) * groups];
    let row_biases = &w.biases()[r * groups..(r + 1) * groups];
    let mut bias_acc = [_mm512_setzero_ps(); MR];
    for g in (0..groups).step_by(LANES) {
        // bf16 → f32: the 16 bits as the high half of an f32. The last vector of a row may hold
        // fewer groups: copied out, zero-padded (zero factors and bias terms).
        let widen =
            |h: __m256i| _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)));
        let (s, b) = if g + LANES <= groups {
            // SAFETY: LANES bf16 of each slice from g.
            unsafe {
                (
                    _mm256_loadu_si256(row_scales.as_ptr().add(g) as *const __m256i),
                    _mm256_loadu_si256(row_biases.as_ptr().add(g) as *const __m256i),
                )
            }
        } else {
            let (mut s16, mut b16) = ([0u16; LANES], [0u16; LANES]);
            s16[..groups - g].copy_from_slice(&row_scales[g..]);
            b16[..groups - g].copy_from_slice(&row_biases[g..]);
            // SAFETY: LANES u16 each.
            unsafe {
                (
                    _mm256_loadu_si256(s16.as_ptr() as *const __m256i),
                    _mm256_loadu_si256(b16.as_ptr() as *const __m256i),
                )
            }
        };
        let (s, b) = (widen(s), widen(b));
        for (i, acc) in bias_acc.iter_mut().enumerate() {
            let row = xs.wrapping_add(i * layout.stride);
            // SAFETY: units and group sums are zero-padded to whole vectors in each arranged row;
            // window i holds `padded >= g + LANES` floats.
            unsafe {
                let units = _mm512_loadu_ps(row.add(layout.units_offset + g));
                let sums = _mm512_loadu_ps(row.add(layout.sums_offset + g));
                _mm512_storeu_ps(
                    windows.as_mut_ptr().add(i * padded + g),
                    _mm512_mul_ps(s, units),
                );
                *acc = _mm512_fmadd_ps(b, sums, *acc);
            }
        }
    }
    bias_acc.map(|acc| _mm512_reduce_add_ps(acc))
}

/// `acc += factor · sum` for each block from `b` on (the integer sums converted to f32): each
/// lane's factor is its group's `scale_g · u_g` from the window of its (weight row, activation
/// row) pair (`lane_group` maps lanes to groups when a block holds several).
///
/// # Safety
/// The CPU must have AVX-512F; `scales` must hold `NR · MR` windows of `padded` floats (the
/// groups' factors, then at least one vector of zeros).
#[target_feature(enable = "avx512f")]
#[inline]
#[allow(clippy::needless_range_loop)] // plain index loops keep the vectors in registers
unsafe fn accumulate<const GROUP: usize, const NR: usize, const MR: usize, const U: usize>(
    acc: &mut [[__m512; MR]; NR],
    sums: &[[[__m512i; MR]; NR]; U],
    b: usize,
    scales: &[f32],
    padded: usize,
    lane_group: __m512i,
) {
    for u in 0..U {
        let first_group = (b + u) * BLOCK_COLS / GROUP;
        for r in 0..NR {
            for i in 0..MR {
                let window = scales
                    .as_ptr()
                    .wrapping_add((r * MR + i) * padded + first_group);
                // SAFETY: first_group < groups and each window is padded by one vector.
                let factor = unsafe {
                    if GROUP >= BLOCK_COLS {
                        _mm512_set1_ps(*window)
                    } else {
                        _mm512_permutexvar_ps(lane_group, _mm512_loadu_ps(window))
                    }
                };
                let sum = _mm512_cvtepi32_ps(sums[u][r][i]);
                acc[r][i] = _mm512_fmadd_ps(factor, sum, acc[r][i]);
            }
        }
    }
}

/// Each lane's `Σ q · n` of blocks `b..b + U` (exact `i32`), for `NR` weight rows and `MR` arranged
/// activation rows; lanes from `valid_lanes` on read as zero codes. The `U · NR · MR` chains are
/// interleaved digit by digit.
///
/// # Safety
/// The CPU must have AVX-512F and VNNI; the first `valid_lanes` lanes of blocks `b..b + U` of
/// each of the `NR` rows (stride `row_code_bytes` from `codes`) must be readable; `digits` must
/// point to `MR` arranged rows (`stride_bytes` apart).
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
#[allow(clippy::needless_range_loop)] // `i` also addresses the activation rows
unsafe fn block_sums<const NR: usize, const MR: usize, const U: usize>(
    codes: *const u8,
    row_code_bytes: usize,
    b: usize,
    valid_lanes: usize,
    digits: *const u8,
    stride_bytes: usize,
    prefetch: CodePrefetch,
) -> [[[__m512i; MR]; NR]; U] {
    let nibble = _mm512_set1_epi8(0x0f);
    let digit_stride = PLANES * BLOCK_BYTES;
    // Low and high nibbles (as bytes) per (block, row).
    let mut q = [[[_mm512_setzero_si512(); PLANES]; NR]; U];
    for (u, q) in q.iter_mut().enumerate() {
        for (r, q) in q.iter_mut().enumerate() {
            let p = codes.wrapping_add(r * row_code_bytes + (b + u) * BLOCK_BYTES);
            prefetch.ahead_of(p);
            // SAFETY: the valid lanes lie inside row r (caller's contract).
            let d = unsafe {
                if valid_lanes == LANES {
                    _mm512_loadu_si512(p as *const _)
                } else {
                    _mm512_maskz_loadu_epi32(
                        ((1u32 << valid_lanes) - 1) as __mmask16,
                        p as *const _,
                    )
                }
            };
            q[0] = _mm512_and_si512(d, nibble);
            q[1] = _mm512_and_si512(_mm512_srli_epi32::<4>(d), nibble);
        }
    }
    // Digit sums: the most significant digit first, shifted up 8 bits before each next digit.
    let mut sums = [[[_mm512_setzero_si512(); MR]; NR]; U];
    for digit in 0..DIGITS {
        for u in 0..U {
            for i in 0..MR {
                let block = digits.wrapping_add(
                    i * stride_bytes + (b + u) * BLOCK_DIGIT_BYTES + digit * digit_stride,
                );
                // SAFETY: both planes of digit `digit` of block b + u of arranged row i.
                let x = unsafe {
                    [
                        _mm512_loadu_si512(block as *const _),
                        _mm512_loadu_si512(block.add(BLOCK_BYTES) as *const _),
                    ]
                };
                for r in 0..NR {
                    let sum = &mut sums[u][r][i];
                    if digit > 0 {
                        *sum = _mm512_slli_epi32::<8>(*sum);
                    }
                    for p in 0..PLANES {
                        *sum = _mm512_dpbusd_epi32(*sum, q[u][r][p], x[p]);
                    }
                }
            }
        }
    }
    sums
}

/// Whether a matrix-vector product takes 6 weight rows per pass rather than 2, each pass taking
/// its rows from that many equal parts of the range. Several rows per pass share each activation
/// load, which leaves the products bound by the code stream rather than by loads; taking the rows
/// from far-apart parts keeps their code streams from slowing each other in DRAM, as adjacent
/// rows did. Measured with
/// weights streamed from DRAM (Zen 4, 2 threads, GB/s):
/// - 4-bit, 4096 columns (medians of 15 interleaved rounds): 1 row 22.0, 2 far rows 26.2, 4 far
///   rows 23.4;
/// - 4-bit, 11264 columns (activations out of L1): 4 adjacent rows 19.9, 4 far rows 21.6
///   (medians of 15); 6 far rows 21.9 / 22.4 / 23.2 against 4 far rows 20.1 / 21.7 / 20.3 (3
///   alternating `qmv` bench rounds).
fn six_rows_per_matvec_pass(arranged_row_bytes: usize) -> bool {
    arranged_row_bytes >= MULTI_ROW_MIN_ACTIVATION_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::fixed_point::DIGITS_MAX;

    /// The activations an arranged row stands for: `n · u_g · 2^e` per column.
    fn rebuild(arranged: &[f32], cols: usize, group_size: usize) -> Vec<f64> {
        let layout = row_layout(cols, group_size);
        let bytes: Vec<u8> = arranged[..layout.digits_len]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let unscale = arranged[layout.unscale_offset] as f64;
        (0..cols)
            .map(|col| {
                let (block, c) = (col / BLOCK_COLS, col % BLOCK_COLS);
                let (lane, k) = (c / PER_LANE, c % PER_LANE);
                // Code k of a lane sits in byte k / 2: the low nibble (plane 0) for even k.
                let (plane, byte) = (k % 2, k / 2);
                let at = block * BLOCK_DIGIT_BYTES + plane * BLOCK_BYTES + lane * 4 + byte;
                let digit_stride = PLANES * BLOCK_BYTES;
                let n = (0..DIGITS).fold(0i64, |n, d| {
                    n * 256 + bytes[at + d * digit_stride] as i8 as i64
                });
                let unit = arranged[layout.units_offset + col / group_size] as f64;
                n as f64 * unit * unscale
            })
            .collect()
    }

    #[test]
    fn arranged_activations_are_within_half_a_unit_of_at_most_2_pow_minus_23_of_the_group_max() {
        if !available() {
            return;
        }
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut uniform = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for group_size in [32, 64, 128] {
            let cols = 3 * 128 + group_size;
            // Magnitudes spread over 2^±40 within a row, so groups differ widely.
            let x: Vec<f32> = (0..cols)
                .map(|_| ((uniform() - 0.5) * 2f64.powf(80.0 * uniform() - 40.0)) as f32)
                .collect();
            let arranged = arrange_activations(&x, 1, cols, group_size).unwrap();
            let layout = row_layout(cols, group_size);
            let unscale = arranged[layout.unscale_offset] as f64;
            let got = rebuild(&arranged, cols, group_size);
            for (g, group) in x.chunks_exact(group_size).enumerate() {
                let max = group.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
                let unit = arranged[layout.units_offset + g] as f64 * unscale;
                assert!(
                    unit < 2.0 * max / DIGITS_MAX as f64,
                    "group size {group_size}, group {g}"
                );
                for (j, &v) in group.iter().enumerate() {
                    let err = (got[g * group_size + j] - v as f64).abs();
                    assert!(
                        err <= unit / 2.0,
                        "group size {group_size}, column {j}: {v} off by {err}"
                    );
                }
            }
        }
    }

    #[test]
    fn small_integers_are_held_exactly() {
        if !available() {
            return;
        }
        let x: Vec<f32> = (0..256).map(|j| ((j * 37) % 201) as f32 - 100.0).collect();
        for group_size in [32, 128] {
            let arranged = arrange_activations(&x, 1, 256, group_size).unwrap();
            let got = rebuild(&arranged, 256, group_size);
            assert!(got.iter().zip(&x).all(|(a, b)| *a == *b as f64));
        }
    }

    #[test]
    fn rows_it_cannot_hold_are_refused_and_zero_rows_accepted() {
        if !available() {
            return;
        }
        let mut x = vec![0.5f32; 64];
        assert!(arrange_activations(&x, 1, 64, 32).is_some());
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            x[17] = bad;
            assert!(arrange_activations(&x, 1, 64, 32).is_none(), "{bad}");
        }
        let subnormal = vec![1e-40f32; 64];
        assert!(arrange_activations(&subnormal, 1, 64, 32).is_none());
        let zeros = vec![0f32; 64];
        let arranged = arrange_activations(&zeros, 1, 64, 32).unwrap();
        assert!(rebuild(&arranged, 64, 32).iter().all(|v| *v == 0.0));
    }
}
