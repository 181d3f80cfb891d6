//! AVX2 integer kernel for 4-bit codes: the arithmetic of the VNNI kernel (`quant::vnni`) on
//! CPUs without AVX-512. Each activation is held in the 24-bit fixed point of
//! `quant::fixed_point` (three signed 8-bit digits), and each lane's `Σ q · n` is an exact
//! integer sum; AVX2 has no byte dot product, so each of VNNI's `vpdpbusd` becomes `vpmaddubsw`
//! (code bytes times digit bytes, adjacent pairs summed into `i16`) and `vpmaddwd` by ones (pairs
//! of those into `i32`). Nothing saturates: a pair of products of a code (`≤ 15`) and a digit
//! (`|d| ≤ 128`) stays below 2^12 in magnitude, and the two nibble planes' pairs are added in
//! `i16` (below 2^13) before the widening. The integer sums, and so the accuracy, are those of
//! the VNNI kernel.
//!
//! **Activations** ([`arrange_activations`], once per product) are laid out exactly as for the
//! VNNI kernel (blocks of 128 columns, per digit a plane of the even columns' digits and one of
//! the odd columns', 64 bytes each, in the code bytes' order), and this kernel reads each block
//! as two halves of 32 code bytes (8 `i32` lanes, 64 columns).
//!
//! **Per half block** and weight row: one AND, one shift and one AND split the codes into their
//! low and high nibbles as bytes; per activation row and digit (most significant first) two
//! `vpmaddubsw`, one `vpaddw` and one `vpmaddwd`, the sum shifted up 8 bits between digits; the
//! lane sums are converted to f32 and accumulated with the factor `scale_g · u_g`. That is about
//! 20 vector operations per 64 columns and (weight row, activation row) pair, against 26 for the
//! f32 AVX2 lane kernel, whose converts share the FMA pipes on AMD Zen 3 (measured:
//! docs/performance.md#avx2-only-hosts-the-integer-kernel-for-one-activation-row-zen-3).

use std::arch::x86_64::*;

use crate::quant::avx2::{ffma, fload, fmul, fstore, fsum, fsums, fzero, widen_scales};
use crate::quant::fixed_point::{
    arrange_rows, group_unit_exp, held_group_sum, pow2, run_tiles, DigitTile, RowLayout, RowScale,
    DIGITS, I8_DIGITS, TWO_DIGITS,
};
use crate::quant::lanes::lane_groups;
use crate::quant::{CodePrefetch, RowRangeFn};
use crate::QuantizedMatrix;

/// `i32` lanes per vector (and `u32` code words per half block).
const LANES: usize = 8;

/// Code bytes per block of the shared layout (two vectors).
const BLOCK_BYTES: usize = 64;

/// Code bytes per half block (one vector).
const HALF_BYTES: usize = 32;

/// Columns per block (64 bytes of 4-bit codes).
const BLOCK_COLS: usize = 128;

/// Codes per `u32` lane.
const PER_LANE: usize = 8;

/// Byte vectors per digit and block: the low and high nibbles of the codes.
const PLANES: usize = 2;

/// Weight rows per pass of a matrix-vector product, from that many far-apart parts of the range,
/// each digit load shared by them. Four on long rows (as the f32 lane kernel takes) measured
/// slower than two in `kernel_ab` against the f32 kernel on an AVX2-only host
/// (docs/performance.md#rows-per-pass-and-prefetch-distances-qmv-weights-streamed-from-dram).
const MATVEC_ROWS: usize = 2;

/// Whether this CPU has AVX2 and FMA.
pub(crate) fn available() -> bool {
    crate::Kernel::Avx2Int.is_available()
}

/// `Some` for 4-bit codes in groups of 32, 64 or 128, with activations of `digits` digits
/// (`fixed_point::DIGITS`, exact, `fixed_point::TWO_DIGITS`, 16-bit, or
/// `fixed_point::I8_DIGITS`, 8-bit).
pub(crate) fn select(bits: u32, group_size: usize, digits: usize) -> Option<RowRangeFn> {
    match (bits, group_size, digits) {
        (4, 32, DIGITS) => Some(rows::<32, DIGITS> as RowRangeFn),
        (4, 64, DIGITS) => Some(rows::<64, DIGITS>),
        (4, 128, DIGITS) => Some(rows::<128, DIGITS>),
        (4, 32, TWO_DIGITS) => Some(rows::<32, TWO_DIGITS>),
        (4, 64, TWO_DIGITS) => Some(rows::<64, TWO_DIGITS>),
        (4, 128, TWO_DIGITS) => Some(rows::<128, TWO_DIGITS>),
        (4, 32, I8_DIGITS) => Some(rows::<32, I8_DIGITS>),
        (4, 64, I8_DIGITS) => Some(rows::<64, I8_DIGITS>),
        (4, 128, I8_DIGITS) => Some(rows::<128, I8_DIGITS>),
        _ => None,
    }
}

/// The arranged row of this kernel, activations of `digits` digits: the VNNI kernel's layout,
/// whose units and group sums are padded to its 16 lanes.
pub(crate) fn layout(cols: usize, group_size: usize, digits: usize) -> RowLayout {
    RowLayout::new(cols, group_size, BLOCK_COLS, 2 * LANES, digits)
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
    digits: usize,
) -> Option<Vec<f32>> {
    assert!(
        available(),
        "AVX2 integer kernel called on a CPU without it"
    );
    assert!(group_size.is_multiple_of(16) && cols.is_multiple_of(group_size));
    let layout = layout(cols, group_size, digits);
    arrange_rows(x, m, cols, layout, |row, dst| {
        // SAFETY: the CPU has the features (asserted above); rows of `cols`, a multiple of the
        // group size (a multiple of 16); `dst` laid out for them.
        unsafe { arrange_row(row, dst, group_size, layout) }
    })
}

/// The largest of 8 lanes.
#[target_feature(enable = "avx2")]
#[inline]
fn max_lane(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_shuffle_ps::<0b01>(m, m));
    _mm_cvtss_f32(m)
}

/// `(n - sext8(n)) >> 8`: what is left of `n` above its balanced low digit (exact).
#[target_feature(enable = "avx2")]
#[inline]
fn above_low_digit(n: __m256i) -> __m256i {
    _mm256_srai_epi32::<8>(_mm256_sub_epi32(
        n,
        _mm256_srai_epi32::<24>(_mm256_slli_epi32::<24>(n)),
    ))
}

/// One row of [`arrange_activations`] into the zeroed `dst`; false if it cannot be arranged.
/// Eight columns at a time (`group_size` is a multiple of 16).
///
/// # Safety
/// The CPU must have AVX2; `row.len()` is a multiple of `group_size`, itself a multiple of 16;
/// `dst` is laid out by `layout` for `row.len()` columns.
#[target_feature(enable = "avx2")]
unsafe fn arrange_row(row: &[f32], dst: &mut [f32], group_size: usize, layout: RowLayout) -> bool {
    debug_assert!(group_size.is_multiple_of(16) && row.len().is_multiple_of(group_size));
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
    let (mut max, mut nan) = (_mm256_setzero_ps(), 0);
    for v in row.chunks_exact(8) {
        // SAFETY: 8 floats.
        let v = unsafe { _mm256_loadu_ps(v.as_ptr()) };
        nan |= _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
        max = _mm256_max_ps(max, _mm256_and_ps(v, abs_mask));
    }
    let row_exp = match RowScale::of_row(max_lane(max), nan != 0) {
        None => return false,
        Some(RowScale::Zero) => {
            dst[layout.unscale_offset] = 1.0;
            return true;
        }
        Some(RowScale::Exponent(e)) => e,
    };
    let row_scale = _mm256_set1_ps(pow2(-row_exp));
    dst[layout.unscale_offset] = pow2(row_exp);
    let (digit_slots, tail) = dst.split_at_mut(layout.digits_len);
    let (units, tail) = tail.split_at_mut(layout.sums_offset - layout.units_offset);
    let sums = &mut tail[..layout.exps_offset - layout.sums_offset];
    let digits = digit_slots.as_mut_ptr() as *mut u8;
    let digit_stride = PLANES * BLOCK_BYTES;
    for (g, group) in row.chunks_exact(group_size).enumerate() {
        // The f32 group sum in column order, as the lane kernels' arrangement takes it.
        sums[g] = group.iter().sum();
        let mut group_max = _mm256_setzero_ps();
        for v in group.chunks_exact(8) {
            // SAFETY: 8 floats.
            let v = unsafe { _mm256_loadu_ps(v.as_ptr()) };
            group_max = _mm256_max_ps(group_max, _mm256_and_ps(v, abs_mask));
        }
        let unit_exp = group_unit_exp(max_lane(group_max) * pow2(-row_exp), layout.digits);
        units[g] = pow2(unit_exp);
        let inverse_unit = _mm256_set1_ps(pow2(-unit_exp));
        let mut n_total = 0;
        for (k, v) in group.chunks_exact(8).enumerate() {
            // SAFETY: 8 floats.
            let v = unsafe { _mm256_loadu_ps(v.as_ptr()) };
            // Exact scalings by powers of two, then one rounding (to nearest even, the default
            // rounding mode): |n| ≤ `digits_max` of the layout's digits by the choice of the unit.
            let n = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(v, row_scale), inverse_unit));
            if layout.digits < DIGITS {
                let mut lanes = [0i32; 8];
                // SAFETY: 8 i32.
                unsafe { _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, n) };
                n_total += lanes.iter().sum::<i32>();
            }
            let n1 = above_low_digit(n);
            let n2 = above_low_digit(n1);
            // Eight columns: one lane of a block, c a multiple of 8.
            let col = g * group_size + k * 8;
            let (block, c) = (col / BLOCK_COLS, col % BLOCK_COLS);
            let lane_at = block * layout.block_digit_bytes() + (c / PER_LANE) * 4;
            // The layout's digits of [n2, n1, n]: the top one is zero at two digits.
            for (d, value) in [n2, n1, n][DIGITS - layout.digits..]
                .iter()
                .copied()
                .enumerate()
            {
                let mut lanes = [0i32; 8];
                // SAFETY: 8 i32.
                unsafe { _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, value) };
                // Column j of the lane: plane j % 2, byte j / 2 (the nibble it meets).
                for (j, v) in lanes.iter().enumerate() {
                    let at = lane_at + d * digit_stride + (j % 2) * BLOCK_BYTES + j / 2;
                    // SAFETY: inside block `block` of the digit part (layout).
                    unsafe { *digits.add(at) = *v as u8 };
                }
            }
        }
        if layout.digits < DIGITS {
            sums[g] = held_group_sum(n_total, units[g], pow2(row_exp));
        }
    }
    true
}

fn rows<const GROUP: usize, const D: usize>(
    w: &QuantizedMatrix,
    xs: &[f32],
    m: usize,
    row_start: usize,
    out_t: &mut [f32],
) {
    assert!(
        available(),
        "AVX2 integer kernel called on a CPU without it"
    );
    let layout = layout(w.cols(), GROUP, D);
    // SAFETY: the CPU has the features (checked above).
    unsafe { run_tiles::<Avx2Int<D>, GROUP, MATVEC_ROWS>(w, xs, m, row_start, out_t, layout) }
}

/// The AVX2 integer kernel's vector code, for `fixed_point::DigitTiles`, for activations of `D`
/// digits.
struct Avx2Int<const D: usize>;

impl<const D: usize> DigitTile for Avx2Int<D> {
    const LANES: usize = LANES;
    const PAIRED_FROM_M: usize = 2;

    fn split_factors(_activation_rows: usize) -> bool {
        false
    }

    digit_tile_frame!("avx2,fma");

    /// The block loop of [`DigitTile::factored_sums`] in AVX2 (per half block: see the module
    /// docs). The half blocks go one at a time whatever `U` asks (the codes of several would not
    /// fit the 16 registers); each pair's arithmetic is the same in every tile shape.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn factored_sums<
        const GROUP: usize,
        const NR: usize,
        const MR: usize,
        const U: usize,
    >(
        w: &QuantizedMatrix,
        r0: usize,
        xs: *const f32,
        layout: RowLayout,
        windows: &[f32],
        window_len: usize,
        row_step: usize,
        prefetch: CodePrefetch,
    ) -> [[f32; MR]; NR] {
        let cols = w.cols();
        let row_code_bytes = cols / 2;
        // Which group each lane of a half block belongs to, relative to its first group.
        let lane_group = lane_groups::<LANES>(GROUP, PER_LANE);
        // SAFETY: LANES i32.
        let lane_group = unsafe { _mm256_loadu_si256(lane_group.as_ptr() as *const __m256i) };
        let halves = cols.div_ceil(BLOCK_COLS / 2);
        let codes = w.codes().as_ptr().wrapping_add(r0 * row_code_bytes / 4) as *const u8;
        let row_code_bytes = row_code_bytes * row_step;
        let digits = xs as *const u8;
        let stride_bytes = layout.stride * 4;
        let mut acc = [[_mm256_setzero_ps(); MR]; NR];
        for half in 0..halves {
            // Lanes of this half that hold codes (all of them but in a row's last one, when
            // `cols` is not a multiple of 64).
            let valid_lanes = ((cols - half * (BLOCK_COLS / 2)) / PER_LANE).min(LANES);
            // SAFETY (both calls): the valid lanes of the half lie inside every row of the tile;
            // `windows` holds NR·MR windows.
            let sums = unsafe {
                half_sums::<NR, MR, D>(
                    codes,
                    row_code_bytes,
                    half,
                    valid_lanes,
                    digits,
                    stride_bytes,
                    prefetch,
                )
            };
            unsafe {
                accumulate::<GROUP, NR, MR>(&mut acc, &sums, half, windows, window_len, lane_group)
            };
        }
        // Index loops, not `map` closures, which the release build left as calls (its symbols).
        let mut sums = [[0f32; MR]; NR];
        for r in 0..NR {
            for i in 0..MR {
                sums[r][i] = fsum(acc[r][i]);
            }
        }
        sums
    }
}

/// `acc += factor · sum` for half block `half` (the integer sums converted to f32): each lane's
/// factor is its group's `scale_g · u_g` from the window of its (weight row, activation row) pair
/// (`lane_group` maps lanes to groups when a half block holds two).
///
/// # Safety
/// The CPU must have AVX2 and FMA; `windows` must hold `NR · MR` windows of `window_len` floats
/// (the groups' factors, then at least one vector of zeros).
#[target_feature(enable = "avx2,fma")]
#[inline]
#[allow(clippy::needless_range_loop)] // plain index loops keep the vectors in registers
unsafe fn accumulate<const GROUP: usize, const NR: usize, const MR: usize>(
    acc: &mut [[__m256; MR]; NR],
    sums: &[[__m256i; MR]; NR],
    half: usize,
    windows: &[f32],
    window_len: usize,
    lane_group: __m256i,
) {
    let first_group = half * (BLOCK_COLS / 2) / GROUP;
    for r in 0..NR {
        for i in 0..MR {
            let window = windows
                .as_ptr()
                .wrapping_add((r * MR + i) * window_len + first_group);
            // SAFETY: first_group < groups and each window is padded by one vector.
            let factor = unsafe {
                if GROUP >= BLOCK_COLS / 2 {
                    _mm256_set1_ps(*window)
                } else {
                    _mm256_permutevar8x32_ps(_mm256_loadu_ps(window), lane_group)
                }
            };
            let sum = _mm256_cvtepi32_ps(sums[r][i]);
            acc[r][i] = _mm256_fmadd_ps(factor, sum, acc[r][i]);
        }
    }
}

/// Each lane's `Σ q · n` of half block `half` (exact `i32`), for `NR` weight rows and `MR`
/// arranged activation rows; lanes from `valid_lanes` on read as zero codes.
///
/// # Safety
/// The CPU must have AVX2; the first `valid_lanes` lanes of half `half` of each of the `NR` rows
/// (stride `row_code_bytes` from `codes`) must be readable; `digits` must point to `MR` arranged
/// rows (`stride_bytes` apart).
#[target_feature(enable = "avx2")]
#[inline]
#[allow(clippy::needless_range_loop)] // `i` also addresses the activation rows
unsafe fn half_sums<const NR: usize, const MR: usize, const D: usize>(
    codes: *const u8,
    row_code_bytes: usize,
    half: usize,
    valid_lanes: usize,
    digits: *const u8,
    stride_bytes: usize,
    prefetch: CodePrefetch,
) -> [[__m256i; MR]; NR] {
    let nibble = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    let digit_stride = PLANES * BLOCK_BYTES;
    // The half's place in its block of the shared layout.
    let (block, second) = (half / 2, half % 2);
    // Low and high nibbles (as bytes) per row.
    let mut q = [[_mm256_setzero_si256(); PLANES]; NR];
    for (r, q) in q.iter_mut().enumerate() {
        let p = codes.wrapping_add(r * row_code_bytes + half * HALF_BYTES);
        if second == 0 {
            prefetch.ahead_of(p);
        }
        // SAFETY: the valid lanes lie inside row r (caller's contract).
        let d = unsafe {
            if valid_lanes == LANES {
                _mm256_loadu_si256(p as *const __m256i)
            } else {
                let mask = _mm256_cmpgt_epi32(
                    _mm256_set1_epi32(valid_lanes as i32),
                    _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                );
                _mm256_maskload_epi32(p as *const i32, mask)
            }
        };
        q[0] = _mm256_and_si256(d, nibble);
        q[1] = _mm256_and_si256(_mm256_srli_epi32::<4>(d), nibble);
    }
    // Digit sums: the most significant digit first, shifted up 8 bits before each next digit.
    let mut sums = [[_mm256_setzero_si256(); MR]; NR];
    for digit in 0..D {
        for i in 0..MR {
            let at = i * stride_bytes
                + block * (D * digit_stride)
                + digit * digit_stride
                + second * HALF_BYTES;
            // SAFETY: both planes of digit `digit` of this half of arranged row i.
            let x = unsafe {
                [
                    _mm256_loadu_si256(digits.add(at) as *const __m256i),
                    _mm256_loadu_si256(digits.add(at + BLOCK_BYTES) as *const __m256i),
                ]
            };
            for r in 0..NR {
                // |pair| ≤ 2 · 15 · 128 per plane: no saturation, and their sum fits i16.
                let pairs = _mm256_add_epi16(
                    _mm256_maddubs_epi16(q[r][0], x[0]),
                    _mm256_maddubs_epi16(q[r][1], x[1]),
                );
                let lane_sums = _mm256_madd_epi16(pairs, ones);
                let sum = &mut sums[r][i];
                *sum = if digit == 0 {
                    lane_sums
                } else {
                    _mm256_add_epi32(_mm256_slli_epi32::<8>(*sum), lane_sums)
                };
            }
        }
    }
    sums
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::fixed_point::checks;

    #[test]
    fn arranged_activations_are_the_fixed_point_rule_digit_for_digit() {
        if !available() {
            return;
        }
        checks::arrangement_follows_the_rule(
            arrange_activations,
            layout,
            checks::GroupSums::ColumnOrder,
        );
    }

    /// The VNNI kernel's arrangement, where this CPU has it, holds the same digits, units and
    /// row scale (its group sums are added in another order): one layout, one rule.
    #[test]
    fn arranged_digits_equal_the_vnni_kernels() {
        if !available() || !crate::quant::vnni::available() {
            return;
        }
        let x: Vec<f32> = (0..2 * 320)
            .map(|j| ((j * 7919) % 1013) as f32 * 1e-3 - 0.5)
            .collect();
        for (group_size, digits) in [(32, DIGITS), (64, DIGITS), (64, TWO_DIGITS)] {
            let layout = layout(320, group_size, digits);
            // The VNNI rows also hold their blocks' lane exponents (after the group sums).
            let vnni_layout = crate::quant::vnni::layout(320, group_size, digits);
            let ours = arrange_activations(&x, 2, 320, group_size, digits).unwrap();
            let vnni =
                crate::quant::vnni::arrange_activations(&x, 2, 320, group_size, digits).unwrap();
            for (a, b) in ours
                .chunks_exact(layout.stride)
                .zip(vnni.chunks_exact(vnni_layout.stride))
            {
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&a[..layout.sums_offset]),
                    bits(&b[..layout.sums_offset]),
                    "group size {group_size}"
                );
                assert_eq!(a[layout.unscale_offset], b[vnni_layout.unscale_offset]);
            }
        }
    }

    #[test]
    fn rows_it_cannot_hold_are_refused_and_zero_rows_accepted() {
        if !available() {
            return;
        }
        checks::refuses_what_it_cannot_hold(arrange_activations, layout);
    }
}
