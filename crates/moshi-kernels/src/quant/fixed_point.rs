//! The fixed point in which the integer kernels (x86-64 VNNI and AVX2 integer, aarch64 dot
//! product) hold activations, one rule for all, in `D` signed base-256 digits: three (24 bits,
//! exact: [`DIGITS`]) or two (16 bits, [`crate::ActivationPrecision::Int16`]: [`TWO_DIGITS`]).
//! A row is scaled by the power of two `2^-e` that brings its largest magnitude into [1, 2); each
//! quantization group `g` gets a unit `u_g`, the power of two `8·D - 2` binades below its largest
//! scaled magnitude (one binade higher when that largest value would round past
//! `digits_max(D)`), never below `2^MIN_UNIT_EXP`; every value becomes the integer
//! `n = round_ties_even(x · 2^-e / u_g)`, `|n| ≤ digits_max(D)`, held as `D` signed base-256
//! digits. So each activation is held to within half a unit: at most `2^-(8·D - 1)` of its
//! group's largest magnitude (`2^-23` with three digits, the size of one f32 rounding of that
//! value). Rows holding a NaN, an infinity or only subnormal magnitudes cannot be held (the
//! kernels then use their f32 sibling).
//!
//! This module is the rule itself, in scalar form (the unit's exponent is `quant::scale`'s), which
//! the kernels' arrangement tests check their vector arrangements against (`checks`, built for
//! tests), and what the kernels share around their vector code: the arranged row's layout
//! ([`RowLayout`], [`arrange_rows`]), the frame of their tiles ([`DigitTiles`], [`TileFrame`]: the
//! factor windows, the row scale and the bias terms around each kernel's block loop, [`DigitTile`])
//! and the factor windows' preparation in each instruction set (`digit_tile_frame!`).

use std::marker::PhantomData;

use crate::quant::int8::{i8_groups, i8_row_exp};
use crate::quant::passes::{run_passes, Tiles, MATMUL_ROWS};
#[cfg(test)]
use crate::quant::scale::{binade, digits_max, MIN_UNIT_EXP};
pub(crate) use crate::quant::scale::{group_unit_exp, pow2, RowScale};
#[cfg(test)]
use crate::quant::two_digits::round_activations_two_digits;
use crate::quant::{CodePrefetch, SCALE_PREFETCH_ROWS};
use crate::QuantizedMatrix;

/// Signed 8-bit digits per activation of the exact fixed point.
pub(crate) const DIGITS: usize = 3;

pub(crate) use crate::quant::two_digits::TWO_DIGITS;

/// Signed 8-bit digits per activation in the 8-bit activation mode
/// ([`crate::ActivationPrecision::Int8`], the rule of `quant::int8`).
pub(crate) const I8_DIGITS: usize = 1;

/// Largest `|n|` three signed 8-bit digits hold: `127 · (2^16 + 2^8 + 1)`.
#[cfg(test)]
pub(crate) const DIGITS_MAX: f32 = digits_max(DIGITS);

/// A group's sum as the rounded activation modes hold it, `Σ n · u_g · 2^e`, from the exact
/// integer `Σ n` (below `2^24`: at most 128 values of `|n| ≤ 32 639`), the unit `u_g` and the
/// row scale `2^e`: their bias terms multiply the rounded values, as their f32 kernels do.
pub(crate) fn held_group_sum(n_total: i32, unit: f32, unscale: f32) -> f32 {
    n_total as f32 * unit * unscale
}

/// One row of activations in the 8-bit activation mode into the zeroed `dst` laid out by
/// `layout` (one digit per value: its `n`; the units `u_g`; the group sums `Σ n · u_g · 2^e` of
/// the rounded values; the row scale `2^e`); false if the row cannot be held. Scalar and shared by
/// every integer kernel, whose layouts differ only in the block width.
pub(crate) fn arrange_row_i8(
    row: &[f32],
    dst: &mut [f32],
    group_size: usize,
    layout: RowLayout,
) -> bool {
    debug_assert_eq!(layout.digits, I8_DIGITS);
    let Some(row_exp) = i8_row_exp(row) else {
        return false;
    };
    let unscale = pow2(row_exp);
    let (digit_part, tail) = dst.split_at_mut(layout.digits_len);
    let (units, tail) = tail.split_at_mut(layout.sums_offset - layout.units_offset);
    let (sums, tail) = tail.split_at_mut(layout.exps_offset - layout.sums_offset);
    tail[layout.unscale_offset - layout.exps_offset] = unscale;
    // SAFETY: the digit part's floats viewed as bytes (no alignment needed, same memory).
    let digits = unsafe {
        std::slice::from_raw_parts_mut(digit_part.as_mut_ptr() as *mut u8, digit_part.len() * 4)
    };
    i8_groups(row, group_size, row_exp, |g, unit, n| {
        let mut total = 0i32;
        for (j, &n) in n.iter().enumerate() {
            digits[layout.digit_byte(g * group_size + j, 0)] = n as u8;
            total += n as i32;
        }
        units[g] = unit;
        sums[g] = held_group_sum(total, unit, unscale);
    });
    true
}

/// Where the parts of one arranged activation row of an integer kernel lie, in f32 slots: the
/// digit blocks, then each group's unit and each group's f32 sum (both zero-padded to whole
/// vectors), then where a kernel asks for them ([`RowLayout::with_lane_exponents`]) the unit
/// exponents of each block's lanes, then the row's scale `2^e` (one vector, first lane used).
///
/// The group sums are the f32 sums of the given values with exact activations (three digits), of
/// the held values ([`held_group_sum`]) with fewer.
///
/// The digits are laid out alike in every kernel, which differ only in the width of a block
/// (`block_cols` columns, as many as a vector of 4-bit codes holds): per block and digit (most
/// significant first) a plane of the even columns' digits, then one of the odd columns', each
/// `block_cols / 2` bytes, column `c` of the block at byte `c / 2` of its plane. Each plane is
/// thus the bytes that meet the low (even columns) or the high (odd columns) nibbles of the
/// block's code bytes.
#[derive(Clone, Copy)]
pub(crate) struct RowLayout {
    pub(crate) block_cols: usize,
    /// Digits per activation: [`DIGITS`] (exact) or [`I8_DIGITS`] (8-bit activations).
    pub(crate) digits: usize,
    pub(crate) digits_len: usize,
    pub(crate) units_offset: usize,
    pub(crate) sums_offset: usize,
    pub(crate) exps_offset: usize,
    pub(crate) unscale_offset: usize,
    pub(crate) stride: usize,
}

impl RowLayout {
    /// The layout of a row of `cols` activations in groups of `group_size`, `digits` digits
    /// each, for a kernel whose blocks cover `block_cols` columns (the last one zero-padded) and
    /// whose vectors hold `lanes` f32.
    pub(crate) fn new(
        cols: usize,
        group_size: usize,
        block_cols: usize,
        lanes: usize,
        digits: usize,
    ) -> Self {
        let digits_len = cols.div_ceil(block_cols) * block_cols * digits / 4;
        let groups_padded = (cols / group_size).next_multiple_of(lanes);
        let units_offset = digits_len;
        let sums_offset = units_offset + groups_padded;
        let exps_offset = sums_offset + groups_padded;
        let unscale_offset = exps_offset;
        RowLayout {
            block_cols,
            digits,
            digits_len,
            units_offset,
            sums_offset,
            exps_offset,
            unscale_offset,
            stride: unscale_offset + lanes,
        }
    }

    /// This layout with room for the unit exponents of each block's `lanes` lanes (`log2 u_g` as
    /// f32 of the group of the lane's columns, a block's lanes covering `block_cols / lanes`
    /// columns each; zero past the row's end): the VNNI kernel's tiles of several rows apply
    /// units by their exponents.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn with_lane_exponents(self, lanes: usize) -> Self {
        let blocks = self.digits_len * 4 / self.block_digit_bytes();
        let unscale_offset = self.exps_offset + blocks * lanes;
        RowLayout {
            unscale_offset,
            stride: unscale_offset + (self.stride - self.unscale_offset),
            ..self
        }
    }

    /// Bytes of one block's digits (all of them, both planes).
    pub(crate) fn block_digit_bytes(self) -> usize {
        self.digits * self.block_cols
    }

    /// Where digit `digit` (0: the most significant) of column `col` lies, in bytes from the
    /// start of the arranged row.
    pub(crate) fn digit_byte(self, col: usize, digit: usize) -> usize {
        let (block, c) = (col / self.block_cols, col % self.block_cols);
        let plane_bytes = self.block_cols / 2;
        block * self.block_digit_bytes() + (2 * digit + c % 2) * plane_bytes + c / 2
    }
}

/// `m` rows of `cols` activations arranged by `arrange_row` (a row and its zeroed `layout.stride`
/// floats; false if the fixed point cannot hold the row), or `None` if a row could not be.
pub(crate) fn arrange_rows(
    x: &[f32],
    m: usize,
    cols: usize,
    layout: RowLayout,
    mut arrange_row: impl FnMut(&[f32], &mut [f32]) -> bool,
) -> Option<Vec<f32>> {
    let mut out = vec![0f32; m * layout.stride];
    for (row, dst) in x
        .chunks_exact(cols)
        .zip(out.chunks_exact_mut(layout.stride))
    {
        if !arrange_row(row, dst) {
            return None;
        }
    }
    Some(out)
}

/// One integer kernel's vector code inside the frame of [`DigitTiles`]: the factor windows of a
/// weight row, and the block loop of a tile.
pub(crate) trait DigitTile {
    /// f32 lanes per vector: each factor window is the row's groups padded to whole vectors, plus
    /// one vector.
    const LANES: usize;

    /// [`crate::quant::passes::Tiles::PAIRED_FROM_M`] for this kernel.
    const PAIRED_FROM_M: usize;

    /// Whether a tile of `activation_rows` rows applies each group's factor `scale_g · u_{i,g}`
    /// in two parts in its block loop: the weight row's scales from one window per weight row,
    /// and each activation row's unit by its exponent (the arranged row's lane exponents). The
    /// tile then prepares `NR` windows instead of `NR · MR`.
    fn split_factors(activation_rows: usize) -> bool;

    /// Writes, for each of the `MR` arranged activation rows `i` at `xs`, weight row `r`'s
    /// factors `scale_g · u_{i,g}` into window `i` of `windows` (`window_len` floats each: the
    /// groups, then zeros; where [`DigitTile::split_factors`], the row's scales `scale_g` into
    /// window 0 alone), and returns the bias terms `Σ_g bias_g · Σ_{j∈g} x_{i,j}` (on the f32
    /// group sums, summed group by group in the kernel's lanes). Expanded by
    /// `digit_tile_frame!`.
    ///
    /// # Safety
    /// The CPU must have the kernel's features; `r < w.rows()`; `xs` must point to `MR` arranged
    /// rows of `layout`; `windows.len() >= MR · window_len`, `window_len >= ` the groups padded
    /// to whole vectors.
    unsafe fn prepare_row<const GROUP: usize, const MR: usize>(
        w: &QuantizedMatrix,
        r: usize,
        xs: *const f32,
        layout: RowLayout,
        windows: &mut [f32],
        window_len: usize,
    ) -> [f32; MR];

    /// For weight rows `r0 + k · row_step` (`k < NR`) and the `MR` arranged activation rows at
    /// `xs`, `U` code blocks a step: each pair's `Σ_g scale_g · u_g · Σ_{j∈g} q_j · n_j` over
    /// the whole row (the integer sums exact, the rest in f32), with the factors from window
    /// `k · MR + i` of `windows` (where [`DigitTile::split_factors`], the scales from window
    /// `k · MR` and the units from the arranged rows: see [`DigitTile::prepare_row`]).
    ///
    /// # Safety
    /// The CPU must have the kernel's features; those weight rows must exist in `w`; `xs` must
    /// point to `MR` arranged rows of `layout`; `windows` must hold `NR · MR` prepared windows of
    /// `window_len` floats.
    #[allow(clippy::too_many_arguments)] // the tile's whole state, passed as in the other kernels
    unsafe fn factored_sums<const GROUP: usize, const NR: usize, const MR: usize, const U: usize>(
        w: &QuantizedMatrix,
        r0: usize,
        xs: *const f32,
        layout: RowLayout,
        windows: &[f32],
        window_len: usize,
        row_step: usize,
        prefetch: CodePrefetch,
    ) -> [[f32; MR]; NR];

    /// The tile of weight rows `r0 + k · row_step` (`k < NR`) against the arranged rows of
    /// `frame`: [`TileFrame::run`] in the kernel's instruction set, so that its parts inline.
    /// Expanded by `digit_tile_frame!`.
    ///
    /// # Safety
    /// As for [`TileFrame::run`].
    unsafe fn tile<const GROUP: usize, const NR: usize, const MR: usize, const U: usize>(
        frame: TileFrame<'_>,
        r0: usize,
        row_step: usize,
    ) -> [[f32; MR]; NR];
}

/// An integer kernel's tiles for one product (see `quant::passes`), `MATVEC` weight rows per
/// matrix-vector pass. Each tile prepares its weight rows' factor windows and bias terms, runs
/// the kernel's block loop, and gives each pair `2^e · Σ + bias terms` (`2^e` the activation
/// row's scale).
pub(crate) struct DigitTiles<'a, K, const GROUP: usize, const MATVEC: usize> {
    w: &'a QuantizedMatrix,
    /// The arranged activation rows.
    xs: &'a [f32],
    layout: RowLayout,
    /// The factor windows of the largest tile, `window_len` floats each.
    windows: Vec<f32>,
    window_len: usize,
    prefetch: CodePrefetch,
    kernel: PhantomData<K>,
}

impl<'a, K: DigitTile, const GROUP: usize, const MATVEC: usize> DigitTiles<'a, K, GROUP, MATVEC> {
    /// The tiles of `w` against the rows of `xs`, arranged by `layout`.
    ///
    /// # Safety
    /// The CPU must have the kernel's features (every tile runs them).
    pub(crate) unsafe fn new(w: &'a QuantizedMatrix, xs: &'a [f32], layout: RowLayout) -> Self {
        let window_len = (w.cols() / GROUP).next_multiple_of(K::LANES) + K::LANES;
        DigitTiles {
            w,
            xs,
            layout,
            windows: vec![0f32; MATVEC.max(2 * MATMUL_ROWS) * window_len],
            window_len,
            prefetch: CodePrefetch::for_cpu(),
            kernel: PhantomData,
        }
    }
}

impl<K: DigitTile, const GROUP: usize, const MATVEC: usize> Tiles
    for DigitTiles<'_, K, GROUP, MATVEC>
{
    const MATVEC_ROWS: usize = MATVEC;
    const PAIRED_FROM_M: usize = K::PAIRED_FROM_M;

    unsafe fn tile<const NR: usize, const MR: usize, const U: usize>(
        &mut self,
        r0: usize,
        row_step: usize,
        first: usize,
    ) -> [[f32; MR]; NR] {
        let stride = self.layout.stride;
        let frame = TileFrame {
            w: self.w,
            arranged: &self.xs[first * stride..(first + MR) * stride],
            layout: self.layout,
            windows: &mut self.windows,
            window_len: self.window_len,
            prefetch: self.prefetch,
        };
        // SAFETY: the CPU has the features (`new`'s contract); the weight rows exist (forwarded
        // contract); the arranged rows are sliced above; the windows are sized for the largest
        // tile.
        unsafe { K::tile::<GROUP, NR, MR, U>(frame, r0, row_step) }
    }
}

/// What one tile of an integer kernel works on besides its weight rows: a view of [`DigitTiles`]
/// without its `MATVEC` parameter, so that each kernel's tile is compiled once per tile shape (with
/// `&mut DigitTiles` instead, the VNNI kernel's tiles doubled, 27 to 51 functions, and its block
/// loop no longer inlined into them).
pub(crate) struct TileFrame<'a> {
    w: &'a QuantizedMatrix,
    /// The tile's `MR` arranged activation rows.
    arranged: &'a [f32],
    layout: RowLayout,
    /// Room for `NR · MR` factor windows of `window_len` floats.
    windows: &'a mut [f32],
    window_len: usize,
    prefetch: CodePrefetch,
}

impl TileFrame<'_> {
    /// Kernel `K`'s tile: prefetches the scales of the weight rows a few tiles ahead, prepares
    /// each weight row's factor windows and bias terms ([`DigitTile::prepare_row`]), runs the
    /// block loop ([`DigitTile::factored_sums`]) and gives each pair `Σ · 2^e + bias terms`.
    /// Always inlined, into each kernel's [`DigitTile::tile`], where the kernel's parts inline in
    /// turn.
    ///
    /// # Safety
    /// The CPU must have the kernel's features; weight rows `r0 + k · row_step` (`k < NR`) must
    /// exist; the frame holds `MR` arranged rows and room for `NR · MR` windows.
    #[inline(always)]
    pub(crate) unsafe fn run<
        K: DigitTile,
        const GROUP: usize,
        const NR: usize,
        const MR: usize,
        const U: usize,
    >(
        self,
        r0: usize,
        row_step: usize,
    ) -> [[f32; MR]; NR] {
        let TileFrame {
            w,
            arranged,
            layout,
            windows,
            window_len,
            prefetch,
        } = self;
        assert!(arranged.len() == MR * layout.stride && windows.len() >= NR * MR * window_len);
        let xs = arranged.as_ptr();
        for r in 0..NR {
            prefetch.scales_of_row(w, r0 + r * row_step + SCALE_PREFETCH_ROWS);
        }
        let mut bias_terms = [[0f32; MR]; NR];
        for (r, terms) in bias_terms.iter_mut().enumerate() {
            let windows = &mut windows[r * MR * window_len..(r + 1) * MR * window_len];
            // SAFETY: the CPU has the features and row r0 + r · row_step exists (forwarded
            // contract); `xs` holds MR arranged rows and the windows cover the padded groups
            // (checked above).
            *terms = unsafe {
                K::prepare_row::<GROUP, MR>(w, r0 + r * row_step, xs, layout, windows, window_len)
            };
        }
        // SAFETY: as above; the windows are prepared for this tile.
        let sums = unsafe {
            K::factored_sums::<GROUP, NR, MR, U>(
                w, r0, xs, layout, windows, window_len, row_step, prefetch,
            )
        };
        let mut out = [[0f32; MR]; NR];
        for (out, (sums, bias_terms)) in out.iter_mut().zip(sums.iter().zip(&bias_terms)) {
            for (i, out) in out.iter_mut().enumerate() {
                let unscale = arranged[i * layout.stride + layout.unscale_offset];
                *out = sums[i] * unscale + bias_terms[i];
            }
        }
        out
    }
}

/// Rows `row_start..` of `out_t` (`m` values each) through kernel `K`'s tiles: weights `w`
/// against the `m` rows of `xs`, arranged by `layout`, `MATVEC` weight rows per matrix-vector
/// pass.
///
/// # Panics
/// If those weight rows do not exist or `xs` does not hold `m` arranged rows.
///
/// # Safety
/// The CPU must have the kernel's features.
pub(crate) unsafe fn run_tiles<K: DigitTile, const GROUP: usize, const MATVEC: usize>(
    w: &QuantizedMatrix,
    xs: &[f32],
    m: usize,
    row_start: usize,
    out_t: &mut [f32],
    layout: RowLayout,
) {
    let nrows = out_t.len() / m;
    assert!(row_start + nrows <= w.rows() && xs.len() == m * layout.stride);
    // SAFETY (both): the CPU has the features (forwarded contract); the tiles only read rows
    // `row_start..row_start + nrows` of `w` (checked in range) and `m` arranged rows of `xs`.
    let mut tiles = unsafe { DigitTiles::<K, GROUP, MATVEC>::new(w, xs, layout) };
    unsafe { run_passes(&mut tiles, m, row_start, out_t) }
}

/// Expands [`DigitTile::prepare_row`] and [`DigitTile::tile`] inside an integer kernel's `impl
/// DigitTile`, compiled with `$features` (those of the kernel's
/// [`DigitTile::factored_sums`], so that it inlines into the tile), from the f32 vector operations
/// of the instruction set's lane kernel module, which must be in scope (`fzero`, `fload`,
/// `fstore`, `fmul`, `ffma`, `fsums`, `widen_scales`, over vectors of `Self::LANES` ≤ 16 lanes). A
/// macro for the reason `lane_kernel!` is one: the `target_feature` attribute, needed so every
/// operation inlines, differs per instruction set.
macro_rules! digit_tile_frame {
    ($features:literal) => {
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn tile<const GROUP: usize, const NR: usize, const MR: usize, const U: usize>(
            frame: crate::quant::fixed_point::TileFrame<'_>,
            r0: usize,
            row_step: usize,
        ) -> [[f32; MR]; NR] {
            // SAFETY: forwarded contract.
            unsafe { frame.run::<Self, GROUP, NR, MR, U>(r0, row_step) }
        }

        /// One pass over the weight row's bf16 scales and biases.
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn prepare_row<const GROUP: usize, const MR: usize>(
            w: &crate::QuantizedMatrix,
            r: usize,
            xs: *const f32,
            layout: crate::quant::fixed_point::RowLayout,
            windows: &mut [f32],
            window_len: usize,
        ) -> [f32; MR] {
            let lanes = Self::LANES;
            let groups = w.cols() / GROUP;
            debug_assert!(
                window_len >= groups.next_multiple_of(lanes) && windows.len() >= MR * window_len
            );
            let row_scales = &w.scales()[r * groups..(r + 1) * groups];
            let row_biases = &w.biases()[r * groups..(r + 1) * groups];
            let mut bias_acc = [fzero(); MR];
            for g in (0..groups).step_by(lanes) {
                // The last vector of a row may hold fewer groups: copied out, zero-padded (zero
                // factors and bias terms).
                let (s, b) = if g + lanes <= groups {
                    // SAFETY: `lanes` bf16 of each slice from g.
                    unsafe {
                        (
                            widen_scales(w.scale_format(), row_scales.as_ptr().add(g)),
                            widen_scales(w.scale_format(), row_biases.as_ptr().add(g)),
                        )
                    }
                } else {
                    let (mut s16, mut b16) = ([0u16; 16], [0u16; 16]);
                    s16[..groups - g].copy_from_slice(&row_scales[g..]);
                    b16[..groups - g].copy_from_slice(&row_biases[g..]);
                    // SAFETY: 16 >= `lanes` u16 each.
                    unsafe {
                        (
                            widen_scales(w.scale_format(), s16.as_ptr()),
                            widen_scales(w.scale_format(), b16.as_ptr()),
                        )
                    }
                };
                for (i, acc) in bias_acc.iter_mut().enumerate() {
                    let row = xs.wrapping_add(i * layout.stride);
                    // SAFETY: units and group sums are zero-padded to whole vectors in each
                    // arranged row; window i holds `window_len >= g + lanes` floats.
                    unsafe {
                        if !Self::split_factors(MR) {
                            let units = fload(row.add(layout.units_offset + g));
                            fstore(windows.as_mut_ptr().add(i * window_len + g), fmul(s, units));
                        }
                        *acc = ffma(b, fload(row.add(layout.sums_offset + g)), *acc);
                    }
                }
                if Self::split_factors(MR) {
                    // SAFETY: window 0 holds `window_len >= g + lanes` floats.
                    unsafe { fstore(windows.as_mut_ptr().add(g), s) };
                }
            }
            fsums(bias_acc)
        }
    };
}

/// The integer `n` that holds `v` in a row of exponent `row_exp` and a group of unit
/// `2^unit_exp`: two exact scalings by powers of two (the first may round a value far below the
/// row's largest into the subnormals, where it rounds to 0 all the same), then one rounding to
/// nearest even, as the vector arrangements do it.
#[cfg(test)]
pub(crate) fn fixed(v: f32, row_exp: i32, unit_exp: i32) -> i32 {
    (v * pow2(-row_exp) * pow2(-unit_exp)).round_ties_even() as i32
}

/// The balanced base-256 digits of `n` (`|n| ≤ DIGITS_MAX`), most significant first:
/// `n = d0 · 2^16 + d1 · 2^8 + d2`.
#[cfg(test)]
pub(crate) fn digits(n: i32) -> [i8; DIGITS] {
    let low = n as i8;
    let n1 = (n - low as i32) >> 8;
    let mid = n1 as i8;
    let top = ((n1 - mid as i32) >> 8) as i8;
    [top, mid, low]
}

/// The arrangement tests every integer kernel runs on its own vector arrangement: the rule above,
/// digit for digit, and the rows it refuses.
#[cfg(test)]
pub(crate) mod checks {
    use moshi_test_support::XorShift64;

    use super::*;

    /// A kernel's `arrange_activations(x, m, cols, group_size, digits)`.
    pub(crate) type Arrange = fn(&[f32], usize, usize, usize, usize) -> Option<Vec<f32>>;

    /// A kernel's row layout for `(cols, group_size, digits)`.
    pub(crate) type LayoutOf = fn(usize, usize, usize) -> RowLayout;

    /// The digit counts of the fixed point the integer kernels arrange (exact and 16-bit).
    pub(crate) const FIXED_POINT_DIGITS: [usize; 2] = [DIGITS, TWO_DIGITS];

    /// How a kernel's arrangement adds each group's f32 sum.
    pub(crate) enum GroupSums {
        /// Column by column, as the lane kernels' arrangement does: equal to the bit.
        ColumnOrder,
        /// In the kernel's own order: within the bound of f32 summation (the VNNI kernel's).
        #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
        AnyOrder,
    }

    /// Signed values whose magnitudes spread evenly over 2^±40 in the exponent (xorshift, fixed
    /// seed): rows in which groups differ widely.
    pub(crate) struct SpreadValues(XorShift64);

    impl SpreadValues {
        pub(crate) fn new() -> Self {
            SpreadValues(XorShift64::new(0x2545_f491_4f6c_dd1d))
        }

        /// The next `n` values.
        pub(crate) fn take(&mut self, n: usize) -> Vec<f32> {
            let r = &mut self.0;
            (0..n)
                .map(|_| {
                    ((r.uniform_f64() - 0.5) * 2f64.powf(80.0 * r.uniform_f64() - 40.0)) as f32
                })
                .collect()
        }
    }

    /// Each column's digits (as many as the layout holds, the most significant first), read
    /// back from an arranged row of `cols` columns.
    pub(crate) fn digits_of(arranged: &[f32], layout: RowLayout, cols: usize) -> Vec<Vec<i8>> {
        let bytes: Vec<i8> = arranged[..layout.digits_len]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .map(|b| b as i8)
            .collect();
        (0..cols)
            .map(|col| {
                (0..layout.digits)
                    .map(|d| bytes[layout.digit_byte(col, d)])
                    .collect()
            })
            .collect()
    }

    /// Rows whose magnitudes spread over 2^±40 (so groups differ widely), two per arrangement,
    /// for every group size the kernels take and both digit counts, at a few groups and at more
    /// than 16 (an arrangement may take groups in batches): each arranged row holds the rule's row
    /// scale, and for each group its unit, its f32 sum and each column's digits.
    pub(crate) fn arrangement_follows_the_rule(
        arrange: Arrange,
        layout_of: LayoutOf,
        group_sums: GroupSums,
    ) {
        let mut spread = SpreadValues::new();
        for (group_size, digit_count, cols) in [32, 64, 128]
            .into_iter()
            .flat_map(|g| FIXED_POINT_DIGITS.map(|d| (g, d)))
            .flat_map(|(g, d)| [3 * 128 + g, 17 * g + 128].map(|cols| (g, d, cols)))
        {
            let x = spread.take(2 * cols);
            let arranged = arrange(&x, 2, cols, group_size, digit_count).unwrap();
            let layout = layout_of(cols, group_size, digit_count);
            assert_eq!(arranged.len(), 2 * layout.stride);
            for (row, arranged) in x
                .chunks_exact(cols)
                .zip(arranged.chunks_exact(layout.stride))
            {
                let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
                let row_exp = binade(max);
                assert_eq!(arranged[layout.unscale_offset], pow2(row_exp));
                let got = digits_of(arranged, layout, cols);
                for (g, group) in row.chunks_exact(group_size).enumerate() {
                    let group_max = group.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let unit_exp = group_unit_exp(group_max * pow2(-row_exp), digit_count);
                    assert_eq!(arranged[layout.units_offset + g], pow2(unit_exp));
                    let sum = arranged[layout.sums_offset + g];
                    let n_total = group.iter().map(|&v| fixed(v, row_exp, unit_exp)).sum();
                    let held = held_group_sum(n_total, pow2(unit_exp), pow2(row_exp));
                    match group_sums {
                        _ if digit_count < DIGITS => assert_eq!(sum, held, "group {g}"),
                        GroupSums::ColumnOrder => assert_eq!(
                            sum,
                            group.iter().sum::<f32>(),
                            "group size {group_size}, group {g}"
                        ),
                        GroupSums::AnyOrder => {
                            let exact: f64 = group.iter().map(|&v| v as f64).sum();
                            let magnitude: f64 = group.iter().map(|&v| v.abs() as f64).sum();
                            let bound = group_size as f64 * f32::EPSILON as f64 * magnitude;
                            assert!(
                                (sum as f64 - exact).abs() <= bound,
                                "group size {group_size}, group {g}: {sum} against {exact}"
                            );
                        }
                    }
                    for (j, &v) in group.iter().enumerate() {
                        let want = digits(fixed(v, row_exp, unit_exp));
                        // The digits above the kept ones are zero: |n| ≤ digits_max(D).
                        let (above, kept) = want.split_at(DIGITS - digit_count);
                        assert!(above.iter().all(|d| *d == 0), "{v}: {want:?}");
                        assert_eq!(
                            got[g * group_size + j],
                            kept,
                            "{digit_count} digits, column {j} of group {g}: {v}"
                        );
                    }
                }
            }
        }
    }

    /// A NaN or an infinity anywhere, or only subnormal magnitudes, refuse the arrangement; a row
    /// of zeros is arranged as zero digits with the row scale 1.
    pub(crate) fn refuses_what_it_cannot_hold(arrange: Arrange, layout_of: LayoutOf) {
        for digit_count in FIXED_POINT_DIGITS {
            let mut x = vec![0.5f32; 64];
            assert!(arrange(&x, 1, 64, 32, digit_count).is_some());
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                x[17] = bad;
                assert!(arrange(&x, 1, 64, 32, digit_count).is_none(), "{bad}");
            }
            let subnormal = vec![1e-40f32; 64];
            assert!(arrange(&subnormal, 1, 64, 32, digit_count).is_none());
            let zeros = vec![0f32; 64];
            let arranged = arrange(&zeros, 1, 64, 32, digit_count).unwrap();
            let layout = layout_of(64, 32, digit_count);
            assert!(digits_of(&arranged, layout, 64)
                .iter()
                .all(|d| d.len() == digit_count && d.iter().all(|d| *d == 0)));
            assert_eq!(arranged[layout.unscale_offset], 1.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::int8::round_row_i8;

    #[test]
    fn the_8_bit_arrangement_holds_the_rounded_values_in_every_kernels_layout() {
        let mut spread = checks::SpreadValues::new();
        // The VNNI and AVX2 integer kernels' blocks (128 columns, 16 lanes), the NEON one's (32, 4).
        for (block_cols, lanes) in [(128, 16), (32, 4)] {
            for group_size in [32, 64, 128] {
                let cols = 3 * 128 + group_size;
                let mut row = spread.take(cols);
                row[5] = 0.0;
                let layout = RowLayout::new(cols, group_size, block_cols, lanes, I8_DIGITS);
                let mut arranged = vec![0f32; layout.stride];
                assert!(arrange_row_i8(&row, &mut arranged, group_size, layout));
                let mut rounded = vec![f32::NAN; cols];
                assert!(round_row_i8(&row, group_size, &mut rounded));
                let unscale = arranged[layout.unscale_offset];
                let bytes: Vec<i8> = arranged[..layout.digits_len]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .map(|b| b as i8)
                    .collect();
                for (g, group) in rounded.chunks_exact(group_size).enumerate() {
                    let unit = arranged[layout.units_offset + g];
                    let mut total = 0i32;
                    for (j, &want) in group.iter().enumerate() {
                        let n = bytes[layout.digit_byte(g * group_size + j, 0)];
                        assert!(n != -128, "column {j} of group {g}");
                        assert_eq!(n as f32 * unit * unscale, want, "column {j} of group {g}");
                        total += n as i32;
                    }
                    assert_eq!(
                        arranged[layout.sums_offset + g],
                        total as f32 * unit * unscale
                    );
                    // Each value within half a unit of the exact one; the largest at ±127 units.
                    let exact = &row[g * group_size..(g + 1) * group_size];
                    let max = exact.iter().fold(0f32, |m, v| m.max(v.abs()));
                    for (&v, &r) in exact.iter().zip(group) {
                        let half_unit = 0.5 * max as f64 / 127.0;
                        assert!(
                            ((v - r) as f64).abs() <= half_unit * (1.0 + 1e-6),
                            "{v} {r}"
                        );
                    }
                }
            }
        }
        // Rows it cannot hold: refused by both.
        let layout = RowLayout::new(64, 32, 128, 16, I8_DIGITS);
        let mut arranged = vec![0f32; layout.stride];
        for bad in [f32::NAN, f32::INFINITY] {
            let mut row = vec![0.5f32; 64];
            row[3] = bad;
            assert!(!arrange_row_i8(&row, &mut arranged, 32, layout));
            assert!(!round_row_i8(&row, 32, &mut [0.0; 64]));
        }
    }

    #[test]
    fn digits_rebuild_every_held_integer() {
        let max = DIGITS_MAX as i32;
        for n in (-max..=max)
            .step_by(997)
            .chain([-max, -1, 0, 1, 127, 128, -128, -129, max])
        {
            let [a, b, c] = digits(n);
            assert_eq!(a as i32 * 65536 + b as i32 * 256 + c as i32, n, "{n}");
        }
    }

    #[test]
    fn values_are_held_within_half_a_unit_of_at_most_2_pow_minus_23_of_the_group_max() {
        let mut spread = checks::SpreadValues::new();
        for _ in 0..200 {
            // Magnitudes spread over 2^±40 within a row, so groups differ widely.
            let row = spread.take(256);
            let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
            let Some(RowScale::Exponent(e)) = RowScale::of_row(max, false) else {
                panic!("row of normal values refused")
            };
            for group in row.chunks_exact(32) {
                let group_max = group.iter().fold(0f32, |m, v| m.max(v.abs()));
                let unit_exp = group_unit_exp(group_max * pow2(-e), DIGITS);
                let unit = 2f64.powi(unit_exp + e);
                assert!(unit < 2.0 * group_max as f64 / DIGITS_MAX as f64 || unit_exp == -100);
                for &v in group {
                    let n = fixed(v, e, unit_exp);
                    assert!(n.unsigned_abs() <= DIGITS_MAX as u32);
                    assert!((n as f64 * unit - v as f64).abs() <= unit / 2.0, "{v}");
                }
            }
        }
    }

    #[test]
    fn two_digits_round_each_value_to_within_half_a_unit_of_at_most_2_pow_minus_15_of_its_group_max(
    ) {
        let mut spread = checks::SpreadValues::new();
        assert_eq!(digits_max(TWO_DIGITS), 32_639.0);
        for _ in 0..100 {
            let mut row = spread.take(256);
            row[7] = 0.0;
            let rounded = round_activations_two_digits(&row, 1, 256, 32);
            let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
            let e = binade(max);
            for (group, held) in row.chunks_exact(32).zip(rounded.chunks_exact(32)) {
                let group_max = group.iter().fold(0f32, |m, v| m.max(v.abs()));
                let unit_exp = group_unit_exp(group_max * pow2(-e), TWO_DIGITS);
                let unit = 2f64.powi(unit_exp + e);
                assert!(
                    unit < 2.0 * group_max as f64 / digits_max(TWO_DIGITS) as f64
                        || unit_exp == MIN_UNIT_EXP
                );
                for (&v, &r) in group.iter().zip(held) {
                    let n = fixed(v, e, unit_exp);
                    assert!(n.unsigned_abs() <= digits_max(TWO_DIGITS) as u32);
                    assert_eq!(r as f64, n as f64 * unit, "{v}");
                    assert!((r as f64 - v as f64).abs() <= unit / 2.0, "{v}");
                }
            }
        }
        // Rows it cannot hold are copied as they are.
        let mut row = vec![0.25f32; 64];
        row[9] = f32::NAN;
        let held = round_activations_two_digits(&row, 1, 64, 32);
        assert!(held[9].is_nan() && held[..9].iter().all(|v| *v == 0.25));
    }

    #[test]
    fn rows_it_cannot_hold_are_refused_and_zero_rows_accepted() {
        assert_eq!(RowScale::of_row(1.5, true), None);
        assert_eq!(RowScale::of_row(f32::INFINITY, false), None);
        assert_eq!(RowScale::of_row(1e-40, false), None);
        assert_eq!(RowScale::of_row(0.0, false), Some(RowScale::Zero));
        assert_eq!(RowScale::of_row(3.0, false), Some(RowScale::Exponent(1)));
        // Small integers are held exactly: 100 in a group whose largest is 100.
        let e = binade(100.0);
        let unit_exp = group_unit_exp(100.0 * pow2(-e), DIGITS);
        assert_eq!(
            fixed(100.0, e, unit_exp) as f64 * 2f64.powi(unit_exp + e),
            100.0
        );
    }
}
