//! AVX-512 VNNI kernel for 4-bit codes: codes and activations meet in integer dot products
//! (`vpdpbusd`, 64 byte products per instruction), each activation held as a 24-bit fixed-point
//! number of its quantization group, in three signed 8-bit digits (two at 16 bits, one at 8: the
//! same code with fewer digits, `ActivationPrecision::Int16` and `Int8`). And for 8-bit codes with
//! 16-bit or 8-bit activations ([`Bytes`]: the same arrangement in blocks of 64 columns, each
//! block's code bytes reordered to meet it); with exact activations `Kernel::Avx512Vnni` leaves
//! 8-bit codes to the f32 lane kernel (three digits would overflow a lane's sum).
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
use std::marker::PhantomData;

use crate::quant::avx512::{ffma, fload, fmul, fstore, fsums, fzero, widen_scales};
use crate::quant::fixed_point::{
    arrange_rows, group_unit_exp, held_group_sum, pow2, run_tiles, DigitTile, RowLayout, RowScale,
    DIGITS, I8_DIGITS, TWO_DIGITS,
};
use crate::quant::int8::i8_group_unit;
use crate::quant::lanes::{lane_groups, MULTI_ROW_MIN_ACTIVATION_BYTES};
use crate::quant::{CodePrefetch, RowRangeFn};
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

/// `Some` for 4-bit codes in groups of 32, 64 or 128, with activations of `digits` digits
/// (`fixed_point::DIGITS`, exact, `fixed_point::TWO_DIGITS`, 16-bit, or
/// `fixed_point::I8_DIGITS`, 8-bit), and for 8-bit codes with 16-bit or 8-bit activations (three
/// digits of 8-bit codes would overflow a lane's `i32` sum: [`CodeBlocks::MAX_DIGITS`]).
pub(crate) fn select(bits: u32, group_size: usize, digits: usize) -> Option<RowRangeFn> {
    match (bits, group_size, digits) {
        (4, 32, DIGITS) => Some(rows::<Nibbles, 32, DIGITS> as RowRangeFn),
        (4, 64, DIGITS) => Some(rows::<Nibbles, 64, DIGITS>),
        (4, 128, DIGITS) => Some(rows::<Nibbles, 128, DIGITS>),
        (4, 32, TWO_DIGITS) => Some(rows::<Nibbles, 32, TWO_DIGITS>),
        (4, 64, TWO_DIGITS) => Some(rows::<Nibbles, 64, TWO_DIGITS>),
        (4, 128, TWO_DIGITS) => Some(rows::<Nibbles, 128, TWO_DIGITS>),
        (4, 32, I8_DIGITS) => Some(rows::<Nibbles, 32, I8_DIGITS>),
        (4, 64, I8_DIGITS) => Some(rows::<Nibbles, 64, I8_DIGITS>),
        (4, 128, I8_DIGITS) => Some(rows::<Nibbles, 128, I8_DIGITS>),
        (8, 32, TWO_DIGITS) => Some(rows::<Bytes, 32, TWO_DIGITS>),
        (8, 64, TWO_DIGITS) => Some(rows::<Bytes, 64, TWO_DIGITS>),
        (8, 128, TWO_DIGITS) => Some(rows::<Bytes, 128, TWO_DIGITS>),
        (8, 32, I8_DIGITS) => Some(rows::<Bytes, 32, I8_DIGITS>),
        (8, 64, I8_DIGITS) => Some(rows::<Bytes, 64, I8_DIGITS>),
        (8, 128, I8_DIGITS) => Some(rows::<Bytes, 128, I8_DIGITS>),
        _ => None,
    }
}

/// Columns per block (64 bytes of 4-bit codes).
const BLOCK_COLS: usize = 128;

/// Codes per `u32` lane.
const PER_LANE: usize = 8;

/// Byte vectors per digit and block: the low and high nibbles of the codes.
const PLANES: usize = 2;

/// The arranged row of this kernel, activations of `digits` digits.
pub(crate) fn layout(cols: usize, group_size: usize, digits: usize) -> RowLayout {
    layout_for::<Nibbles>(cols, group_size, digits)
}

/// The arranged row for `C`'s codes: blocks of `C::BLOCK_COLS` columns.
fn layout_for<C: CodeBlocks>(cols: usize, group_size: usize, digits: usize) -> RowLayout {
    RowLayout::new(cols, group_size, C::BLOCK_COLS, LANES, digits).with_lane_exponents(LANES)
}

/// Columns per block of 8-bit codes (one vector of 64 code bytes).
const BLOCK_COLS_8: usize = 64;

/// The arranged row of this kernel for 8-bit codes, activations of `digits` digits: the layout of
/// the 4-bit codes' with blocks of 64 columns (each digit's even and odd columns one vector).
#[cfg(test)]
fn layout8(cols: usize, group_size: usize, digits: usize) -> RowLayout {
    layout_for::<Bytes>(cols, group_size, digits)
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
    arrange_in::<Nibbles>(x, m, cols, group_size, digits)
}

/// [`arrange_activations`] for 8-bit codes (blocks of 64 columns: each digit's even and odd
/// columns one vector).
pub(crate) fn arrange_activations8(
    x: &[f32],
    m: usize,
    cols: usize,
    group_size: usize,
    digits: usize,
) -> Option<Vec<f32>> {
    arrange_in::<Bytes>(x, m, cols, group_size, digits)
}

/// `m` rows arranged for `C`'s codes.
fn arrange_in<C: CodeBlocks>(
    x: &[f32],
    m: usize,
    cols: usize,
    group_size: usize,
    digits: usize,
) -> Option<Vec<f32>> {
    assert!(available(), "VNNI kernel called on a CPU without it");
    assert!(group_size.is_multiple_of(16) && cols.is_multiple_of(group_size));
    let layout = layout_for::<C>(cols, group_size, digits);
    // Only tiles of several rows read the lane exponents ([`split_factors`]): one row (each
    // single-session product) skips them, and so do 8-bit activations, whose units are not
    // powers of two (`fixed_point::arrange_row_i8`'s layout, bit for bit).
    let lane_groups = (m >= 2 && digits != I8_DIGITS).then(|| C::lane_groups(group_size));
    arrange_rows(x, m, cols, layout, |row, dst| {
        // SAFETY: the CPU has the features (asserted above); rows of `cols`, a multiple of the
        // group size (a multiple of 16 for every specialised kernel); `dst` laid out for them.
        unsafe { arrange_row(row, dst, group_size, layout, lane_groups) }
    })
}

/// One row at `precision` into the zeroed `dst`, laid out by [`layout`] for its digits, without
/// lane exponents (the panel tiles do not read them): false if it cannot be held. The rows of
/// [`arrange_activations`] (exact and 16-bit) and of `fixed_point::arrange_row_i8` (8-bit), bit
/// for bit.
///
/// # Panics
/// If the CPU lacks the features (callers pick this kernel only where [`available`]).
pub(crate) fn arrange_row_at(
    precision: crate::ActivationPrecision,
    row: &[f32],
    dst: &mut [f32],
    group_size: usize,
    layout: RowLayout,
) -> bool {
    assert!(available(), "VNNI kernel called on a CPU without it");
    debug_assert_eq!(layout.digits, crate::quant::digits_of(precision));
    // SAFETY: the CPU has the features (asserted above); the caller's row and layout agree
    // (group sizes of the specialised kernels are multiples of 16).
    unsafe { arrange_row(row, dst, group_size, layout, None) }
}

/// Groups whose sums and units [`arrange_row`] finds before it cuts their digits.
const GROUPS_AT_ONCE: usize = 16;

/// One row of [`arrange_activations`] into the zeroed `dst` (its lane exponents from
/// `lane_groups`, left zero without); false if it cannot be arranged. At one digit, the 8-bit
/// rule of `fixed_point::arrange_row_i8` (units `max / 127`, no lane exponents).
/// Sixteen columns at a time (`group_size` is a multiple of 16).
///
/// # Safety
/// The CPU must have AVX-512F and AVX-512BW; `row.len()` is a multiple of `group_size`, itself
/// a multiple of 16; `dst` is laid out by `layout` for `row.len()` columns.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn arrange_row(
    row: &[f32],
    dst: &mut [f32],
    group_size: usize,
    layout: RowLayout,
    lane_groups: Option<[i32; LANES]>,
) -> bool {
    debug_assert!(group_size.is_multiple_of(16) && row.len().is_multiple_of(group_size));
    // Lane exponents assume power-of-two units.
    debug_assert!(lane_groups.is_none() || layout.digits != I8_DIGITS);
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
    let (sums, tail) = tail.split_at_mut(layout.exps_offset - layout.sums_offset);
    let exps = &mut tail[..layout.unscale_offset - layout.exps_offset];
    let digits = digit_slots.as_mut_ptr() as *mut u8;
    // Per block and digit, a plane of the even columns' digits, then one of the odd columns'.
    let (block_cols, plane_bytes) = (layout.block_cols, layout.block_cols / PLANES);
    // A shift, not a division, per 16 columns below (the layouts' blocks are powers of two).
    debug_assert!(block_cols.is_power_of_two());
    let block_shift = block_cols.trailing_zeros();
    // Even columns first, then odd ones: the low- and high-nibble planes.
    let even_odd = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    // Groups in batches: first every group's sum and unit (independent reductions the core
    // overlaps), then their digits; one group at a time, each group's digits waited for its unit.
    let mut inverses = [0f32; GROUPS_AT_ONCE];
    for (batch, groups) in row.chunks(GROUPS_AT_ONCE * group_size).enumerate() {
        let first = batch * GROUPS_AT_ONCE;
        for (j, group) in groups.chunks_exact(group_size).enumerate() {
            let (mut sum, mut group_max) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            for v in group.chunks_exact(16) {
                // SAFETY: 16 floats.
                let v = unsafe { _mm512_loadu_ps(v.as_ptr()) };
                sum = _mm512_add_ps(sum, v);
                group_max = _mm512_max_ps(group_max, _mm512_abs_ps(v));
            }
            sums[first + j] = _mm512_reduce_add_ps(sum);
            let scaled_max = _mm512_reduce_max_ps(group_max) * pow2(-row_exp);
            let (unit, inverse) = if layout.digits == I8_DIGITS {
                i8_group_unit(scaled_max)
            } else {
                let unit_exp = group_unit_exp(scaled_max, layout.digits);
                (pow2(unit_exp), pow2(-unit_exp))
            };
            units[first + j] = unit;
            inverses[j] = inverse;
        }
        for (j, group) in groups.chunks_exact(group_size).enumerate() {
            let g = first + j;
            let inverse_unit = _mm512_set1_ps(inverses[j]);
            let mut n_total = _mm512_setzero_si512();
            for (k, v) in group.chunks_exact(16).enumerate() {
                // SAFETY: 16 floats.
                let v = unsafe { _mm512_loadu_ps(v.as_ptr()) };
                // Exact scalings by powers of two, then one rounding (to nearest even): |n| ≤
                // `digits_max` of the layout's digits by the choice of the unit.
                let n =
                    _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(v, row_scale), inverse_unit));
                n_total = _mm512_add_epi32(n_total, n);
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
                let (block, c) = (col >> block_shift, col & (block_cols - 1));
                let block_at = block * layout.block_digit_bytes();
                // The layout's digits of [n2, n1, n]: the top one is zero at two digits. (Picked
                // in registers: an array of the three would go through the stack.)
                for d in 0..layout.digits {
                    let value = match DIGITS - layout.digits + d {
                        0 => n2,
                        1 => n1,
                        _ => n,
                    };
                    let bytes = _mm512_cvtepi32_epi8(value);
                    let at = block_at + d * block_cols;
                    // Lanes c/8 and c/8 + 1: their codes' bytes are plane bytes c/2.. c/2 + 8.
                    let split = _mm_shuffle_epi8(bytes, even_odd);
                    // SAFETY: inside block `block` of the digit part (layout).
                    unsafe {
                        let low = digits.add(at + c / 2);
                        _mm_storel_epi64(low as *mut __m128i, split);
                        _mm_storel_epi64(
                            low.add(plane_bytes) as *mut __m128i,
                            _mm_unpackhi_epi64(split, split),
                        );
                    }
                }
            }
            if layout.digits < DIGITS {
                let total = _mm512_reduce_add_epi32(n_total);
                sums[g] = held_group_sum(total, units[g], pow2(row_exp));
            }
        }
    }
    if let Some(lane_groups) = lane_groups {
        let groups = &units[..row.len() / group_size];
        lane_exponents(groups, exps, group_size, layout.block_cols, lane_groups);
    }
    true
}

/// Each block's lanes' unit exponents (`exps`, [`RowLayout::with_lane_exponents`]) from the
/// groups' units (powers of two, normal: at least `2^MIN_UNIT_EXP`), each lane's group the
/// block's first plus `lane_groups` ([`CodeBlocks::lane_groups`]); a lane past the last group
/// keeps its zero.
fn lane_exponents(
    units: &[f32],
    exps: &mut [f32],
    group_size: usize,
    block_cols: usize,
    lane_groups: [i32; LANES],
) {
    for (block, exps) in exps.chunks_exact_mut(LANES).enumerate() {
        let first_group = block * block_cols / group_size;
        for (exp, lane_group) in exps.iter_mut().zip(lane_groups) {
            if let Some(unit) = units.get(first_group + lane_group as usize) {
                *exp = ((unit.to_bits() >> 23) as i32 - 127) as f32;
            }
        }
    }
}

/// The row function for `C`'s codes in groups of `GROUP`, activations of `D` digits.
fn rows<C: CodeBlocks, const GROUP: usize, const D: usize>(
    w: &QuantizedMatrix,
    xs: &[f32],
    m: usize,
    row_start: usize,
    out_t: &mut [f32],
) {
    assert!(available(), "VNNI kernel called on a CPU without it");
    assert!(
        D <= C::MAX_DIGITS,
        "{D} activation digits overflow these codes' sums"
    );
    let layout = layout_for::<C>(w.cols(), GROUP, D);
    // SAFETY (both): the CPU has the features (checked above).
    // What a pass of one activation row reads of it: its digits, units and group sums (the lane
    // exponents after them serve the tiles of several rows).
    if six_rows_per_matvec_pass(layout.exps_offset * 4) {
        unsafe { run_tiles::<Vnni<C, D>, GROUP, 6>(w, xs, m, row_start, out_t, layout) }
    } else {
        unsafe { run_tiles::<Vnni<C, D>, GROUP, 2>(w, xs, m, row_start, out_t, layout) }
    }
}

/// The VNNI kernel's vector code, for `fixed_point::DigitTiles`, for `C`'s codes and
/// activations of `D` digits.
struct Vnni<C, const D: usize>(PhantomData<C>);

impl<C: CodeBlocks, const D: usize> DigitTile for Vnni<C, D> {
    const LANES: usize = LANES;
    // Two weight rows per matrix-matrix tile from 2 activation rows on: their digits (6 vectors a
    // block each) are otherwise reloaded for every weight row (the q4 LM step ran faster than
    // with one weight row at 2 to 8 sessions:
    // docs/performance.md#why-the-kernels-are-shaped-as-they-are).
    const PAIRED_FROM_M: usize = 2;

    fn split_factors(activation_rows: usize) -> bool {
        split_factors(D, activation_rows)
    }

    digit_tile_frame!("avx512f,avx512bw,avx512vnni");

    /// The block loop of [`DigitTile::factored_sums`] in AVX-512 VNNI (per block: see the module
    /// docs).
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn factored_sums<
        const GROUP: usize,
        const NR: usize,
        const MR: usize,
        const UNROLL: usize,
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
        let row_code_bytes = w.cols() * C::BITS / 8;
        let tile = CodeTile {
            codes: w.codes().as_ptr().wrapping_add(r0 * row_code_bytes / 4) as *const u8,
            row_code_bytes: row_code_bytes * row_step,
            digits: xs as *const u8,
            stride_bytes: layout.stride * 4,
            exps: xs.wrapping_add(layout.exps_offset),
            stride: layout.stride,
            prefetch,
        };
        // SAFETY: the tile's rows and windows as `factored_sums` receives them (its contract).
        unsafe { run_blocks::<C, GROUP, NR, MR, UNROLL, D>(&tile, w.cols(), windows, window_len) }
    }
}

/// A tile's factor windows ([`DigitTile::prepare_row`]) and which group of a block each lane
/// belongs to.
struct Factors<'a> {
    windows: &'a [f32],
    window_len: usize,
    lane_group: __m512i,
}

/// `acc += factor · sum` for each block of `C::BLOCK_COLS` columns from `b` on (the integer sums
/// converted to f32): each lane's factor is its group's `scale_g · u_g` (`lane_group` maps lanes
/// to groups when a block holds several), from the window of its (weight row, activation row)
/// pair, or where [`split_factors`] as the weight row's scale (window `r · MR`) times `2^{exp_g}`
/// from the activation row's lane exponents (`tile.exps`): the same product, `2^{exp_g} · sum`
/// being exact.
///
/// # Safety
/// The CPU must have AVX-512F; the windows must be `NR · MR` of `window_len` floats (the groups'
/// factors or scales, then at least one vector of zeros); where [`split_factors`], the tile's `MR`
/// arranged rows must hold their lane exponents.
#[target_feature(enable = "avx512f")]
#[inline]
#[allow(clippy::needless_range_loop)] // plain index loops keep the vectors in registers
unsafe fn accumulate<
    C: CodeBlocks,
    const GROUP: usize,
    const NR: usize,
    const MR: usize,
    const U: usize,
    const D: usize,
>(
    acc: &mut [[__m512; MR]; NR],
    sums: &[[[__m512i; MR]; NR]; U],
    b: usize,
    tile: &CodeTile,
    factors: &Factors<'_>,
) {
    let block_cols = C::BLOCK_COLS;
    // SAFETY: `at` points to the group factors of the block, padded by one vector.
    let lanes_of = |at: *const f32| unsafe {
        if GROUP >= block_cols {
            _mm512_set1_ps(*at)
        } else {
            _mm512_permutexvar_ps(factors.lane_group, _mm512_loadu_ps(at))
        }
    };
    for u in 0..U {
        let first_group = (b + u) * block_cols / GROUP;
        let window = |k: usize| {
            factors
                .windows
                .as_ptr()
                .wrapping_add(k * factors.window_len + first_group)
        };
        if split_factors(D, MR) {
            let mut scales = [_mm512_setzero_ps(); NR];
            for r in 0..NR {
                scales[r] = lanes_of(window(r * MR));
            }
            let mut exps = [_mm512_setzero_ps(); MR];
            for i in 0..MR {
                let at = tile.exps.wrapping_add(i * tile.stride + (b + u) * LANES);
                // SAFETY: each arranged row holds its blocks' lane exponents.
                exps[i] = unsafe { _mm512_loadu_ps(at) };
            }
            for r in 0..NR {
                for i in 0..MR {
                    let sum = _mm512_scalef_ps(_mm512_cvtepi32_ps(sums[u][r][i]), exps[i]);
                    acc[r][i] = _mm512_fmadd_ps(scales[r], sum, acc[r][i]);
                }
            }
        } else {
            for r in 0..NR {
                for i in 0..MR {
                    let sum = _mm512_cvtepi32_ps(sums[u][r][i]);
                    acc[r][i] = _mm512_fmadd_ps(lanes_of(window(r * MR + i)), sum, acc[r][i]);
                }
            }
        }
    }
}

/// Whether a tile of `rows` activation rows of `digits` digits splits its factors
/// ([`DigitTile::split_factors`]): from two rows on, where a window per pair cost more than the
/// `vscalefps` per pair-block, which issues beside the products (docs/performance.md, "The
/// batched tile's factors and sums"), and at two and three digits, whose units are powers of two
/// (at one digit a unit is its group's largest value over 127).
const fn split_factors(digits: usize, rows: usize) -> bool {
    digits >= 2 && rows >= 2
}

/// 4-bit codes: each block's 64 code bytes split into their low and high nibbles (two byte
/// vectors, meeting the arranged digits' even and odd planes), 128 columns a block.
struct Nibbles;

impl CodeBlocks for Nibbles {
    const BITS: usize = 4;
    // A lane's 8 products of a code and a digit stay below 2^14: three digits below 2^30.
    const MAX_DIGITS: usize = DIGITS;
    const BLOCK_COLS: usize = BLOCK_COLS;
    const COLS_PER_LANE: usize = PER_LANE;

    fn lane_groups(group_size: usize) -> [i32; LANES] {
        lane_groups::<LANES>(group_size, PER_LANE)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    #[allow(clippy::needless_range_loop)] // `i` also addresses the activation rows
    unsafe fn block_sums<const NR: usize, const MR: usize, const U: usize, const D: usize>(
        tile: &CodeTile,
        b: usize,
        valid_lanes: usize,
    ) -> [[[__m512i; MR]; NR]; U] {
        let nibble = _mm512_set1_epi8(0x0f);
        let digit_stride = PLANES * BLOCK_BYTES;
        let block_digit_bytes = D * digit_stride;
        // Low and high nibbles (as bytes) per (block, row).
        let mut q = [[[_mm512_setzero_si512(); PLANES]; NR]; U];
        for (u, q) in q.iter_mut().enumerate() {
            for (r, q) in q.iter_mut().enumerate() {
                let p = tile
                    .codes
                    .wrapping_add(r * tile.row_code_bytes + (b + u) * BLOCK_BYTES);
                tile.prefetch.ahead_of(p);
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
        for digit in 0..D {
            for u in 0..U {
                for i in 0..MR {
                    let block = tile.digits.wrapping_add(
                        i * tile.stride_bytes + (b + u) * block_digit_bytes + digit * digit_stride,
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
}

/// Where a tile reads: its first weight row's codes (the others `row_code_bytes` apart) and its
/// arranged activation rows (`stride_bytes` apart), their unit exponents among them.
struct CodeTile {
    codes: *const u8,
    row_code_bytes: usize,
    digits: *const u8,
    stride_bytes: usize,
    /// The first arranged row's unit exponents (the others `stride` floats apart).
    exps: *const f32,
    stride: usize,
    prefetch: CodePrefetch,
}

/// A code width's blocks: how wide, which group each lane's columns belong to, and the integer
/// sums of a few blocks of a tile.
trait CodeBlocks {
    /// Bits per code.
    const BITS: usize;
    /// The most activation digits whose sums fit a lane's `i32`.
    const MAX_DIGITS: usize;
    /// Columns per block (64 code bytes).
    const BLOCK_COLS: usize;
    /// Columns a lane's `i32` of codes holds.
    const COLS_PER_LANE: usize;

    /// Which group each lane of a block belongs to, relative to the block's first group.
    fn lane_groups(group_size: usize) -> [i32; LANES];

    /// Each lane's `Σ q · n` of blocks `b..b + U` (exact `i32`) for the tile's `NR` weight rows
    /// and `MR` activation rows, the `U · NR · MR` chains interleaved digit by digit; lanes from
    /// `valid_lanes` on read as zero codes.
    ///
    /// # Safety
    /// The CPU must have AVX-512F, BW and VNNI; the first `valid_lanes` lanes of blocks
    /// `b..b + U` of each weight row must be readable, and `MR` arranged rows of `D` digits at
    /// the tile's `digits`.
    unsafe fn block_sums<const NR: usize, const MR: usize, const U: usize, const D: usize>(
        tile: &CodeTile,
        b: usize,
        valid_lanes: usize,
    ) -> [[[__m512i; MR]; NR]; U];
}

/// The block loop of both code widths: `UNROLL` blocks a step while they are whole, then one at a
/// time (the last one masked), each block's sums converted and accumulated with their factors;
/// then each pair's lanes summed.
///
/// # Safety
/// The CPU must have AVX-512F, BW and VNNI; the tile's `NR` weight rows of `cols` columns and its
/// `MR` arranged rows must exist; `windows` must hold `NR · MR` prepared windows.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn run_blocks<
    C: CodeBlocks,
    const GROUP: usize,
    const NR: usize,
    const MR: usize,
    const UNROLL: usize,
    const D: usize,
>(
    tile: &CodeTile,
    cols: usize,
    windows: &[f32],
    window_len: usize,
) -> [[f32; MR]; NR] {
    let lane_group = C::lane_groups(GROUP);
    let factors = Factors {
        windows,
        window_len,
        // SAFETY: LANES i32.
        lane_group: unsafe { _mm512_loadu_si512(lane_group.as_ptr() as *const _) },
    };
    let full_blocks = cols / C::BLOCK_COLS;
    let tail_lanes = (cols % C::BLOCK_COLS) / C::COLS_PER_LANE;
    let mut acc = [[_mm512_setzero_ps(); MR]; NR];
    let mut b = 0;
    while b + UNROLL <= full_blocks {
        // SAFETY (both calls): blocks b..b + UNROLL are whole blocks of every row of the tile;
        // `windows` holds NR·MR windows.
        let sums = unsafe { C::block_sums::<NR, MR, UNROLL, D>(tile, b, LANES) };
        unsafe { accumulate::<C, GROUP, NR, MR, UNROLL, D>(&mut acc, &sums, b, tile, &factors) };
        b += UNROLL;
    }
    while b < cols.div_ceil(C::BLOCK_COLS) {
        let valid_lanes = if b == full_blocks { tail_lanes } else { LANES };
        // SAFETY (both calls): the valid lanes of block b lie inside every row of the tile; as
        // above.
        let sums = unsafe { C::block_sums::<NR, MR, 1, D>(tile, b, valid_lanes) };
        unsafe { accumulate::<C, GROUP, NR, MR, 1, D>(&mut acc, &sums, b, tile, &factors) };
        b += 1;
    }
    // An index loop, not a `map` closure, which the release build left as a call (its symbols).
    let mut sums = [[0f32; MR]; NR];
    for r in 0..NR {
        sums[r] = fsums(acc[r]);
    }
    sums
}

/// 8-bit codes: each block's 64 code bytes (64 columns) reordered once into the arranged digits'
/// order (even columns, then odd).
struct Bytes;

impl CodeBlocks for Bytes {
    const BITS: usize = 8;
    // A lane's 4 products of a code (≤ 255) and a digit reach 2^17: two digits stay below 2^26,
    // a third would overflow.
    const MAX_DIGITS: usize = TWO_DIGITS;
    const BLOCK_COLS: usize = BLOCK_COLS_8;
    const COLS_PER_LANE: usize = 4;

    /// After the reordering lane `l` holds 4 of the columns `8 · (l mod 8)..8 · (l mod 8) + 8`.
    fn lane_groups(group_size: usize) -> [i32; LANES] {
        std::array::from_fn(|lane| (8 * (lane % 8) / group_size) as i32)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    #[allow(clippy::needless_range_loop)] // `i` also addresses the activation rows
    unsafe fn block_sums<const NR: usize, const MR: usize, const U: usize, const D: usize>(
        tile: &CodeTile,
        b: usize,
        valid_lanes: usize,
    ) -> [[[__m512i; MR]; NR]; U] {
        // Within each 16 bytes the even columns' codes, then the odd ones'; then the 8-byte halves
        // of all four 16-byte lanes gathered: the even columns of the block, then the odd.
        let even_odd = _mm512_broadcast_i32x4(_mm_setr_epi8(
            0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
        ));
        let halves = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
        let mut q = [[_mm512_setzero_si512(); NR]; U];
        for (u, q) in q.iter_mut().enumerate() {
            for (r, q) in q.iter_mut().enumerate() {
                let p = tile
                    .codes
                    .wrapping_add(r * tile.row_code_bytes + (b + u) * BLOCK_COLS_8);
                tile.prefetch.ahead_of(p);
                let mask = ((1u32 << valid_lanes) - 1) as __mmask16;
                // SAFETY: the valid lanes lie inside row r (caller's contract).
                let d = unsafe {
                    if valid_lanes == LANES {
                        _mm512_loadu_si512(p as *const _)
                    } else {
                        _mm512_maskz_loadu_epi32(mask, p as *const _)
                    }
                };
                *q = _mm512_permutexvar_epi64(halves, _mm512_shuffle_epi8(d, even_odd));
            }
        }
        let mut sums = [[[_mm512_setzero_si512(); MR]; NR]; U];
        for digit in 0..D {
            for u in 0..U {
                for i in 0..MR {
                    let at = i * tile.stride_bytes + ((b + u) * D + digit) * BLOCK_COLS_8;
                    // SAFETY: digit `digit` of block b + u of arranged row i (both planes).
                    let x = unsafe { _mm512_loadu_si512(tile.digits.wrapping_add(at) as *const _) };
                    for r in 0..NR {
                        let sum = &mut sums[u][r][i];
                        if digit > 0 {
                            *sum = _mm512_slli_epi32::<8>(*sum);
                        }
                        *sum = _mm512_dpbusd_epi32(*sum, q[u][r], x);
                    }
                }
            }
        }
        sums
    }
}

/// Whether a matrix-vector product takes 6 weight rows per pass rather than 2, each pass taking
/// its rows from that many equal parts of the range. Several rows per pass share each activation
/// load, which leaves the products bound by the code stream rather than by loads; taking the rows
/// from far-apart parts keeps their code streams from slowing each other in DRAM, as adjacent
/// rows did. With 4-bit weights streamed from DRAM, 2 far rows read faster than 1 or 4 at 4096
/// columns, and 6 far rows faster than 4 at 11264 columns, whose activations are out of L1
/// (docs/performance.md#rows-per-pass-and-prefetch-distances-qmv-weights-streamed-from-dram).
fn six_rows_per_matvec_pass(arranged_row_bytes: usize) -> bool {
    arranged_row_bytes >= MULTI_ROW_MIN_ACTIVATION_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::fixed_point::checks::{self, Arrange};

    #[test]
    fn arranged_activations_are_the_fixed_point_rule_digit_for_digit() {
        if !available() {
            return;
        }
        // Its group sums are added 16 lanes at a time; both code widths' blocks.
        checks::arrangement_follows_the_rule(
            arrange_activations,
            layout,
            checks::GroupSums::AnyOrder,
        );
        checks::arrangement_follows_the_rule(
            arrange_activations8,
            layout8,
            checks::GroupSums::AnyOrder,
        );
    }

    /// The 8-bit arrangement, of one row (the panels) or of several (the row kernels, both code
    /// widths), is the shared scalar rule's, bit for bit: digits, units, group sums and row scale,
    /// with groups of zeros, groups far below the row's largest, rows of zeros, and rows refused
    /// alike.
    #[test]
    fn eight_bit_rows_equal_the_scalar_rule_bit_for_bit() {
        if !available() {
            return;
        }
        let mut spread = crate::quant::fixed_point::checks::SpreadValues::new();
        let kernels: [(checks::LayoutOf, checks::Arrange); 2] = [
            (layout, arrange_activations),
            (layout8, arrange_activations8),
        ];
        for (group_size, (layout_of, arrange)) in [32, 64, 128]
            .into_iter()
            .flat_map(|g| kernels.map(|k| (g, k)))
        {
            let cols = 3 * 128 + group_size;
            let layout = layout_of(cols, group_size, I8_DIGITS);
            let mut rows = [spread.take(cols), vec![0.0; cols], spread.take(cols)];
            rows[0][group_size..2 * group_size].fill(0.0);
            rows[2][..group_size].iter_mut().for_each(|v| *v *= 1e-30);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let scalar: Vec<Vec<f32>> = rows
                .iter()
                .map(|row| {
                    let mut scalar = vec![0f32; layout.stride];
                    let rule = crate::quant::fixed_point::arrange_row_i8;
                    assert!(rule(row, &mut scalar, group_size, layout));
                    scalar
                })
                .collect();
            for (r, row) in rows.iter().enumerate() {
                let mut fast = vec![0f32; layout.stride];
                let i8 = crate::ActivationPrecision::Int8;
                assert!(arrange_row_at(i8, row, &mut fast, group_size, layout));
                assert_eq!(bits(&fast), bits(&scalar[r]), "group {group_size} row {r}");
            }
            let batch = arrange(&rows.concat(), 3, cols, group_size, I8_DIGITS).unwrap();
            assert_eq!(
                bits(&batch),
                bits(&scalar.concat()),
                "group {group_size}, 3 rows"
            );
            let mut refused = spread.take(cols);
            refused[7] = f32::NAN;
            let mut dst = vec![0f32; layout.stride];
            let i8 = crate::ActivationPrecision::Int8;
            assert!(!arrange_row_at(i8, &refused, &mut dst, group_size, layout));
            assert!(arrange(&refused, 1, cols, group_size, I8_DIGITS).is_none());
        }
    }

    #[test]
    fn rows_it_cannot_hold_are_refused_and_zero_rows_accepted() {
        if !available() {
            return;
        }
        checks::refuses_what_it_cannot_hold(arrange_activations, layout);
        checks::refuses_what_it_cannot_hold(arrange_activations8, layout8);
    }

    /// The lane exponents the tiles of several rows multiply by: each lane's is the unit exponent
    /// of the group of its columns (a 4-bit block's lane l: columns 8l..8l + 8; an 8-bit block's:
    /// the even or odd ones of 8 (l mod 8)..8 (l mod 8) + 8), at every group size the kernel
    /// takes, with a partial last block; zero past the row.
    #[test]
    fn each_lanes_exponent_is_its_groups_unit_exponent() {
        if !available() {
            return;
        }
        type Case = (
            Arrange,
            fn(usize, usize, usize) -> RowLayout,
            usize,
            fn(usize) -> usize,
        );
        let cases: [Case; 2] = [
            (arrange_activations, layout, 128, |l| 8 * l),
            (arrange_activations8, layout8, 64, |l| 8 * (l % 8)),
        ];
        for (group_size, cols) in [(32, 448), (64, 448), (128, 384)] {
            let x: Vec<f32> = (0..cols)
                .map(|j| ((j * 7919) % 1013) as f32 * 2f32.powi((j / 32) as i32 - 5) - 3.0)
                .collect();
            for (arrange, layout_of, block_cols, lane_col) in cases {
                for digits in [DIGITS, TWO_DIGITS] {
                    let layout = layout_of(cols, group_size, digits);
                    // One row alone is never in a tile of several: no exponents.
                    let alone = arrange(&x, 1, cols, group_size, digits).unwrap();
                    let exps = &alone[layout.exps_offset..layout.unscale_offset];
                    assert!(exps.iter().all(|&e| e == 0.0));
                    let two = [&x[..], &x[..]].concat();
                    let rows = arrange(&two, 2, cols, group_size, digits).unwrap();
                    let row = &rows[layout.stride..];
                    let exps = &row[layout.exps_offset..layout.unscale_offset];
                    assert_eq!(exps.len(), cols.div_ceil(block_cols) * LANES);
                    for (lane, &exp) in exps.iter().enumerate() {
                        let col = lane / LANES * block_cols + lane_col(lane % LANES);
                        let want = if col < cols {
                            row[layout.units_offset + col / group_size].log2()
                        } else {
                            0.0
                        };
                        assert_eq!(exp, want, "group size {group_size}, lane {lane}");
                    }
                }
            }
        }
    }

    #[test]
    fn each_lane_of_an_8_bit_block_belongs_to_the_group_of_its_columns() {
        // Lane l holds the even (l < 8) or odd columns of 8 · (l mod 8)..8 · (l mod 8) + 8.
        assert_eq!(
            Bytes::lane_groups(32),
            [0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1]
        );
        assert_eq!(Bytes::lane_groups(64), [0; LANES]);
    }
}
