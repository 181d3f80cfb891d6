//! aarch64 NEON dot-product kernel for 4-bit codes: codes and activations meet in integer dot
//! products (`sdot`, 16 byte products into 4 `i32` lanes per instruction), each activation held
//! in the 24-bit fixed point of `quant::fixed_point` as three signed 8-bit digits: the aarch64
//! sibling of the x86-64 VNNI kernel (`quant::vnni`), with the same arithmetic and so the same
//! accuracy. (8-bit products go to the f32 NEON lane kernel, as VNNI leaves them to the f32
//! AVX-512 one: with one code per byte there is no unpacking to save, and `sdot` multiplies signed
//! bytes, which codes up to 255 are not.) `sdot` is written as inline assembly: its intrinsic
//! `vdotq_s32` is not stable Rust yet.
//!
//! **Activations** ([`arrange_activations`], once per product, NEON): the row's scale, each
//! group's unit and f32 sum, and the digits, laid out per block of 32 columns as six 16-byte
//! vectors: for each digit (most significant first) the digits of the block's even columns, then
//! of its odd ones. Rows the fixed point cannot hold (a NaN, an infinity, only subnormal
//! magnitudes) are not arranged (`None`); the caller then uses the f32 NEON kernel.
//!
//! **Per block** of 16 code bytes (4 `i32` lanes: 32 columns, all of one quantization group, the
//! smallest being 32) and weight row: one AND and one shift split the codes into their low
//! (even columns) and high (odd columns) nibbles as bytes, and each lane's `Σ q · n` over its 8
//! columns is built digit by digit with two `sdot`s per digit, most significant first, the sum
//! shifted up 8 bits between digits. Integer sums are exact and fit `i32`: 8 products of a code
//! and a digit stay below 2^14, so the whole sum stays below 2^30. The lane sums are converted to
//! f32 and accumulated with the group's factor `scale_g · u_g` (exact: `u_g` is a power of two).
//! A row's result is `2^e · Σ + Σ_g bias_g · Σ_{j∈g} x_j`, the bias part on f32 group sums.
//!
//! Per 64 bytes of 4-bit codes and (weight row, activation row) pair that is 48 vector
//! operations (24 of them `sdot`) and 32 loads against 100 and 40 for the f32 NEON lane kernel
//! (counted as in `docs/performance.md`, which says what that means on Apple M-series cores; not
//! measured).

use std::arch::aarch64::*;
use std::arch::asm;

use crate::quant::fixed_point::{
    arrange_rows, group_unit_exp, held_group_sum, pow2, run_tiles, DigitTile, RowLayout, RowScale,
    DIGITS, I8_DIGITS, TWO_DIGITS,
};
use crate::quant::neon::{ffma, fload, fmul, fstore, fsum, fsums, fzero, widen_scales};
use crate::quant::{CodePrefetch, RowRangeFn};
use crate::QuantizedMatrix;

/// `i32` lanes per vector (and `u32` code words per block).
const LANES: usize = 4;

/// Code bytes per block (one vector).
const BLOCK_BYTES: usize = 16;

/// Columns per block (16 bytes of 4-bit codes).
const BLOCK_COLS: usize = 32;

/// Byte vectors per digit and block: the low and high nibbles of the codes.
const PLANES: usize = 2;

/// Weight rows per pass of a matrix-vector product, taken from that many equal parts of the rows
/// so that their code streams lie far apart, each digit load shared by them. Two, as the VNNI
/// kernel measured best for rows whose activations stay in L1 (which on Apple's 128 KiB L1d is
/// every Moshi width); not measured on an aarch64 machine.
const MATVEC_ROWS: usize = 2;

/// Whether this CPU has the dot-product extension (NEON itself is part of every aarch64 CPU).
fn available() -> bool {
    crate::Kernel::NeonDot.is_available()
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

/// The arranged row of this kernel, activations of `digits` digits.
pub(crate) fn layout(cols: usize, group_size: usize, digits: usize) -> RowLayout {
    RowLayout::new(cols, group_size, BLOCK_COLS, LANES, digits)
}

/// Lays out `m` rows of `cols` activations for this kernel (see the module docs), or `None` if a
/// row holds a non-finite value or only subnormal magnitudes.
///
/// # Panics
/// If the CPU lacks the dot product (callers pick this kernel only where [`available`]), or the
/// group size is not a multiple of 32 dividing `cols`.
pub(crate) fn arrange_activations(
    x: &[f32],
    m: usize,
    cols: usize,
    group_size: usize,
    digits: usize,
) -> Option<Vec<f32>> {
    assert!(
        available(),
        "NEON dot-product kernel called on a CPU without it"
    );
    assert!(group_size.is_multiple_of(BLOCK_COLS) && cols.is_multiple_of(group_size));
    let layout = layout(cols, group_size, digits);
    arrange_rows(x, m, cols, layout, |row, dst| {
        // SAFETY: NEON is part of aarch64; rows of `cols`, a multiple of the group size (a
        // multiple of 32); `dst` laid out for them.
        unsafe { arrange_row(row, dst, group_size, layout) }
    })
}

/// The low bytes of 16 `i32` (4 vectors, in order) as 16 `i8`.
#[target_feature(enable = "neon")]
#[inline]
fn low_bytes(v: [int32x4_t; 4]) -> int8x16_t {
    let h0 = vmovn_high_s32(vmovn_s32(v[0]), v[1]);
    let h1 = vmovn_high_s32(vmovn_s32(v[2]), v[3]);
    vmovn_high_s16(vmovn_s16(h0), h1)
}

/// `(n - sext8(n)) >> 8`: what is left of `n` above its balanced low digit (exact).
#[target_feature(enable = "neon")]
#[inline]
fn above_low_digit(n: int32x4_t) -> int32x4_t {
    vshrq_n_s32::<8>(vsubq_s32(n, vshrq_n_s32::<24>(vshlq_n_s32::<24>(n))))
}

/// One row of [`arrange_activations`] into the zeroed `dst`; false if it cannot be arranged.
/// Sixteen columns at a time (`group_size` is a multiple of 32).
///
/// # Safety
/// `row.len()` is a multiple of `group_size`, itself a multiple of 32; `dst` is laid out by
/// `layout` for `row.len()` columns.
#[target_feature(enable = "neon")]
unsafe fn arrange_row(row: &[f32], dst: &mut [f32], group_size: usize, layout: RowLayout) -> bool {
    debug_assert!(group_size.is_multiple_of(BLOCK_COLS) && row.len().is_multiple_of(group_size));
    let (mut max, mut nan) = (vdupq_n_f32(0.0), vdupq_n_u32(0));
    for v in row.chunks_exact(4) {
        // SAFETY: 4 floats.
        let v = unsafe { vld1q_f32(v.as_ptr()) };
        nan = vorrq_u32(nan, vmvnq_u32(vceqq_f32(v, v)));
        max = vmaxq_f32(max, vabsq_f32(v));
    }
    let row_exp = match RowScale::of_row(vmaxvq_f32(max), vmaxvq_u32(nan) != 0) {
        None => return false,
        Some(RowScale::Zero) => {
            dst[layout.unscale_offset] = 1.0;
            return true;
        }
        Some(RowScale::Exponent(e)) => e,
    };
    let row_scale = vdupq_n_f32(pow2(-row_exp));
    dst[layout.unscale_offset] = pow2(row_exp);
    let (digit_slots, tail) = dst.split_at_mut(layout.digits_len);
    let (units, tail) = tail.split_at_mut(layout.sums_offset - layout.units_offset);
    let sums = &mut tail[..layout.exps_offset - layout.sums_offset];
    let digits = digit_slots.as_mut_ptr() as *mut i8;
    let plane_stride = PLANES * BLOCK_BYTES;
    for (g, group) in row.chunks_exact(group_size).enumerate() {
        // The f32 group sum in column order, as the lane kernels' arrangement takes it.
        sums[g] = group.iter().sum();
        let mut group_max = vdupq_n_f32(0.0);
        for v in group.chunks_exact(4) {
            // SAFETY: 4 floats.
            group_max = vmaxq_f32(group_max, vabsq_f32(unsafe { vld1q_f32(v.as_ptr()) }));
        }
        let unit_exp = group_unit_exp(vmaxvq_f32(group_max) * pow2(-row_exp), layout.digits);
        units[g] = pow2(unit_exp);
        let inverse_unit = vdupq_n_f32(pow2(-unit_exp));
        let mut n_total = 0;
        for (k, sixteen) in group.chunks_exact(16).enumerate() {
            // Exact scalings by powers of two, then one rounding (to nearest even): |n| ≤
            // `digits_max` of the layout's digits by the choice of the unit.
            let n: [int32x4_t; 4] = std::array::from_fn(|q| {
                // SAFETY: 4 of the 16 floats.
                let v = unsafe { vld1q_f32(sixteen.as_ptr().add(4 * q)) };
                vcvtnq_s32_f32(vmulq_f32(vmulq_f32(v, row_scale), inverse_unit))
            });
            if layout.digits < DIGITS {
                n_total += n.iter().map(|&n| vaddvq_s32(n)).sum::<i32>();
            }
            let n1 = n.map(|n| above_low_digit(n));
            let n2 = n1.map(|n| above_low_digit(n));
            let col = g * group_size + k * 16;
            let (block, c) = (col / BLOCK_COLS, col % BLOCK_COLS);
            // The layout's digits of [n2, n1, n]: the top one is zero at two digits.
            for (d, value) in [n2, n1, n][DIGITS - layout.digits..]
                .iter()
                .copied()
                .enumerate()
            {
                let bytes = low_bytes(value);
                let at = block * layout.block_digit_bytes() + d * plane_stride + c / 2;
                // SAFETY: inside block `block` of the digit part (layout): bytes c/2..c/2 + 8 of
                // both planes of digit d.
                unsafe {
                    vst1_s8(digits.add(at), vget_low_s8(vuzp1q_s8(bytes, bytes)));
                    vst1_s8(
                        digits.add(at + BLOCK_BYTES),
                        vget_low_s8(vuzp2q_s8(bytes, bytes)),
                    );
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
        "NEON dot-product kernel called on a CPU without it"
    );
    let layout = layout(w.cols(), GROUP, D);
    // SAFETY: the CPU has the dot product (checked above).
    unsafe { run_tiles::<NeonDot<D>, GROUP, MATVEC_ROWS>(w, xs, m, row_start, out_t, layout) }
}

/// The NEON dot-product kernel's vector code, for `fixed_point::DigitTiles`, for activations of
/// `D` digits.
struct NeonDot<const D: usize>;

impl<const D: usize> DigitTile for NeonDot<D> {
    const LANES: usize = LANES;
    // One weight row per matrix-matrix tile (two, as on x86, not measured on an aarch64 machine).
    const PAIRED_FROM_M: usize = usize::MAX;

    fn split_factors(_activation_rows: usize) -> bool {
        false
    }

    digit_tile_frame!("neon,dotprod");

    /// The block loop of [`DigitTile::factored_sums`] in NEON with `sdot` (per block: see the
    /// module docs).
    #[target_feature(enable = "neon,dotprod")]
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
        let blocks = cols / BLOCK_COLS;
        let row_code_bytes = cols / 2;
        let codes = w.codes().as_ptr().wrapping_add(r0 * row_code_bytes / 4) as *const u8;
        let row_code_bytes = row_code_bytes * row_step;
        let digits = xs as *const i8;
        let stride_bytes = layout.stride * 4;
        let mut acc = [[vdupq_n_f32(0.0); MR]; NR];
        let mut b = 0;
        while b + U <= blocks {
            // SAFETY: blocks b..b + U lie inside every row of the tile.
            let sums = unsafe {
                block_sums::<NR, MR, U, D>(codes, row_code_bytes, b, digits, stride_bytes, prefetch)
            };
            accumulate::<GROUP, NR, MR, U>(&mut acc, &sums, b, windows, window_len);
            b += U;
        }
        while b < blocks {
            // SAFETY: as above, one block.
            let sums = unsafe {
                block_sums::<NR, MR, 1, D>(codes, row_code_bytes, b, digits, stride_bytes, prefetch)
            };
            accumulate::<GROUP, NR, MR, 1>(&mut acc, &sums, b, windows, window_len);
            b += 1;
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

/// `acc += factor · sum` for each block from `b` on (the integer sums converted to f32): the
/// factor `scale_g · u_g` of the block's group, from the window of its (weight row, activation
/// row) pair (`window_len` floats each; a block lies inside one group).
#[target_feature(enable = "neon")]
#[inline]
#[allow(clippy::needless_range_loop)] // plain index loops keep the vectors in registers
fn accumulate<const GROUP: usize, const NR: usize, const MR: usize, const U: usize>(
    acc: &mut [[float32x4_t; MR]; NR],
    sums: &[[[int32x4_t; MR]; NR]; U],
    b: usize,
    windows: &[f32],
    window_len: usize,
) {
    for u in 0..U {
        let group = (b + u) * BLOCK_COLS / GROUP;
        for r in 0..NR {
            for i in 0..MR {
                let factor = windows[(r * MR + i) * window_len + group];
                acc[r][i] = vfmaq_n_f32(acc[r][i], vcvtq_f32_s32(sums[u][r][i]), factor);
            }
        }
    }
}

/// `acc + Σ` of the products of the 4 bytes of `a` and `b` in each lane (signed, exact).
#[target_feature(enable = "neon,dotprod")]
#[inline]
fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: `sdot` reads and writes these registers only; the CPU has the dot product (this
    // function's target feature).
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        )
    };
    acc
}

/// Each lane's `Σ q · n` of blocks `b..b + U` (exact `i32`), for `NR` weight rows and `MR` arranged
/// activation rows. The `U · NR · MR` chains are interleaved digit by digit.
///
/// # Safety
/// The CPU must have the dot product; blocks `b..b + U` of each of the `NR` rows (stride
/// `row_code_bytes` from `codes`) must be readable; `digits` must point to `MR` arranged rows
/// (`stride_bytes` apart).
#[target_feature(enable = "neon,dotprod")]
#[inline]
#[allow(clippy::needless_range_loop)] // `i` also addresses the activation rows
unsafe fn block_sums<const NR: usize, const MR: usize, const U: usize, const D: usize>(
    codes: *const u8,
    row_code_bytes: usize,
    b: usize,
    digits: *const i8,
    stride_bytes: usize,
    prefetch: CodePrefetch,
) -> [[[int32x4_t; MR]; NR]; U] {
    let nibble = vdupq_n_u8(0x0f);
    let plane_stride = PLANES * BLOCK_BYTES;
    // Low and high nibbles (as bytes) per (block, row).
    let mut q = [[[vdupq_n_s8(0); PLANES]; NR]; U];
    for (u, q) in q.iter_mut().enumerate() {
        for (r, q) in q.iter_mut().enumerate() {
            let p = codes.wrapping_add(r * row_code_bytes + (b + u) * BLOCK_BYTES);
            prefetch.ahead_of(p);
            // SAFETY: block b + u lies inside row r (caller's contract).
            let d = unsafe { vld1q_u8(p) };
            q[0] = vreinterpretq_s8_u8(vandq_u8(d, nibble));
            q[1] = vreinterpretq_s8_u8(vshrq_n_u8::<4>(d));
        }
    }
    // Digit sums: the most significant digit first, shifted up 8 bits before each next digit.
    let mut sums = [[[vdupq_n_s32(0); MR]; NR]; U];
    for digit in 0..D {
        for u in 0..U {
            for i in 0..MR {
                let block = digits.wrapping_add(
                    i * stride_bytes + (b + u) * (D * plane_stride) + digit * plane_stride,
                );
                // SAFETY: both planes of digit `digit` of block b + u of arranged row i.
                let x = unsafe { [vld1q_s8(block), vld1q_s8(block.add(BLOCK_BYTES))] };
                for r in 0..NR {
                    let sum = &mut sums[u][r][i];
                    if digit > 0 {
                        *sum = vshlq_n_s32::<8>(*sum);
                    }
                    for p in 0..PLANES {
                        *sum = sdot(*sum, q[u][r][p], x[p]);
                    }
                }
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

    #[test]
    fn rows_it_cannot_hold_are_refused_and_zero_rows_accepted() {
        if !available() {
            return;
        }
        checks::refuses_what_it_cannot_hold(arrange_activations, layout);
    }
}
