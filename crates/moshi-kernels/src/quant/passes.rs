//! The pass shapes shared by the SIMD quantized kernels (the lane kernels of `lanes`, `vnni` and
//! `dotprod`): which weight rows meet which activation rows in each call of a kernel's tile. Each
//! kernel computes one tile (a few weight rows against a few arranged activation rows) in its own
//! instruction set ([`Tiles`]); [`run_passes`] covers a range of output rows with those tiles.
//!
//! - A matrix-vector product (one activation row) takes [`Tiles::MATVEC_ROWS`] weight rows per
//!   pass, one from each of that many equal parts of the range, so that their code streams lie
//!   far apart in memory while each activation load serves all of them; the rows left over go
//!   one at a time.
//! - Otherwise each weight row meets up to [`MATMUL_ROWS`] activation rows per pass, so that each
//!   block of codes is decoded once for all of them; from [`Tiles::PAIRED_FROM_M`] activation rows
//!   on, two adjacent weight rows per pass, so that each block of the activation rows is loaded
//!   once for both (with several rows of the 7B's widths they outgrow L1, and their reloads, not
//!   the arithmetic, set the pace: with two weight rows per pass the q4 LM step of `moshi-rs
//!   bench --sessions N` ran faster than with one at 2 to 8 sessions; docs/performance.md). With
//!   more activation rows than one tile takes, the pairs go in panels of [`PANEL_ROWS`] weight
//!   rows, each tile of activation rows meeting the whole panel before the next.
//!
//! Every (weight row, activation row) pair goes through the same arithmetic whatever the tile
//! shape (the blocks of a row are accumulated in order however many a step takes), so a
//! matrix-vector product equals the row of a matrix-matrix product bit for bit.

/// Activation rows per pass of a matrix-matrix product: each code block is decoded once for all
/// of them.
pub(crate) const MATMUL_ROWS: usize = 4;

/// Weight rows per panel of a paired matrix-matrix product ([`panels`]): with more
/// activation rows than one tile takes, each tile of them meets the whole panel before the next
/// tile starts. Eight: faster than one pair per panel at 8 and 16 activation rows, as fast as 16,
/// and 32 slower at the widest rows (docs/performance.md, "The batched tile at 16-bit
/// activations").
const PANEL_ROWS: usize = 8;

/// One kernel's dot products of weight rows with arranged activation rows, a tile at a time, for
/// one product: it holds the weights, the arranged activations and its scratch space, sized for
/// its largest tile (`MATVEC_ROWS` weight rows against one activation row, or two against
/// [`MATMUL_ROWS`]).
pub(crate) trait Tiles {
    /// Weight rows per pass of a matrix-vector product: 1 (one at a time), 2, 4 or 6.
    const MATVEC_ROWS: usize;

    /// Activation rows from which a matrix-matrix pass takes two adjacent weight rows per tile
    /// (`usize::MAX`: never).
    const PAIRED_FROM_M: usize;

    /// Dot products of weight rows `r0 + k · row_step` (`k < NR`) with the `MR` arranged
    /// activation rows from `first`, `U` code blocks a step.
    ///
    /// # Safety
    /// Those weight rows and activation rows exist; the tile is no larger than the largest one
    /// above.
    unsafe fn tile<const NR: usize, const MR: usize, const U: usize>(
        &mut self,
        r0: usize,
        row_step: usize,
        first: usize,
    ) -> [[f32; MR]; NR];
}

/// Rows of `out_t` (`m` values each: weight row `row_start + local`'s products with the `m`
/// activation rows) through `tiles`, in the pass shapes of the module docs.
///
/// # Safety
/// Rows `row_start..row_start + out_t.len() / m` must exist in the kernel's weights, which must
/// be multiplied by `m` arranged activation rows.
pub(crate) unsafe fn run_passes<T: Tiles>(
    tiles: &mut T,
    m: usize,
    row_start: usize,
    out_t: &mut [f32],
) {
    let nrows = out_t.len() / m;
    let mut single_from = 0;
    if m == 1 {
        // SAFETY (all): forwarded contract, one activation row.
        single_from = unsafe {
            match T::MATVEC_ROWS {
                6 => far_passes::<T, 6, 1>(tiles, row_start, out_t),
                4 => far_passes::<T, 4, 1>(tiles, row_start, out_t),
                2 => far_passes::<T, 2, 2>(tiles, row_start, out_t),
                _ => 0,
            }
        };
    }
    let paired_end = if m >= T::PAIRED_FROM_M {
        single_from + (nrows - single_from) / 2 * 2
    } else {
        single_from
    };
    // SAFETY (both): the rows lie in the range (forwarded contract).
    unsafe {
        panels::<T, 2>(
            tiles,
            m,
            row_start,
            single_from..paired_end,
            PANEL_ROWS,
            out_t,
        );
        // One row per panel: as measured on the kernels that never pair (NEON's).
        panels::<T, 1>(tiles, m, row_start, paired_end..nrows, 1, out_t);
    }
}

/// Weight rows `row_start + rows` (a multiple of `NR`) against all `m` activation rows, `NR`
/// weight rows and up to [`MATMUL_ROWS`] activation rows per tile, in panels of `panel_rows`
/// weight rows (a multiple of `NR`): within a panel, each tile of activation rows meets every
/// weight row before the next tile starts, so those rows' arranged digits stay in L1 across the
/// panel, and the panel's codes, read from memory for the first tile, come from L1 or L2 for the
/// next.
///
/// # Safety
/// As for [`run_passes`], for those weight rows.
unsafe fn panels<T: Tiles, const NR: usize>(
    tiles: &mut T,
    m: usize,
    row_start: usize,
    rows: std::ops::Range<usize>,
    panel_rows: usize,
    out_t: &mut [f32],
) {
    for panel_start in rows.clone().step_by(panel_rows) {
        let panel = panel_start..(panel_start + panel_rows).min(rows.end);
        let mut i = 0;
        while i < m {
            for r in panel.clone().step_by(NR) {
                let out_rows = &mut out_t[r * m..(r + NR) * m];
                // SAFETY: weight rows row_start + r.. row_start + r + NR lie in the range
                // (forwarded); activation rows i.. exist.
                unsafe { activation_tile::<T, NR>(tiles, m, i, row_start + r, out_rows) };
            }
            i += (m - i).min(MATMUL_ROWS);
        }
    }
}

/// Weight rows `r..r + NR` against activation rows `i..i + min(m - i, MATMUL_ROWS)`. With one
/// weight row, more blocks a step where fewer activation rows leave registers free.
///
/// # Safety
/// As for [`run_passes`], for those weight rows.
unsafe fn activation_tile<T: Tiles, const NR: usize>(
    tiles: &mut T,
    m: usize,
    i: usize,
    r: usize,
    out_rows: &mut [f32],
) {
    // SAFETY (all arms): forwarded contract; activation rows i..i + MR ≤ m exist.
    unsafe {
        match m - i {
            1 if NR == 1 => store(out_rows, m, i, tiles.tile::<NR, 1, 4>(r, 1, i)),
            1 => store(out_rows, m, i, tiles.tile::<NR, 1, 2>(r, 1, i)),
            2 => store(out_rows, m, i, tiles.tile::<NR, 2, 2>(r, 1, i)),
            3 if NR == 1 => store(out_rows, m, i, tiles.tile::<NR, 3, 2>(r, 1, i)),
            3 => store(out_rows, m, i, tiles.tile::<NR, 3, 1>(r, 1, i)),
            _ => store(out_rows, m, i, tiles.tile::<NR, MATMUL_ROWS, 1>(r, 1, i)),
        }
    }
}

/// Writes a tile's results: weight row `k` of the tile, activation rows `i..i + MR`, into row `k`
/// of `out_rows` (`m` values each).
fn store<const NR: usize, const MR: usize>(
    out_rows: &mut [f32],
    m: usize,
    i: usize,
    tile: [[f32; MR]; NR],
) {
    for (k, values) in tile.iter().enumerate() {
        out_rows[k * m + i..k * m + i + MR].copy_from_slice(values);
    }
}

/// The passes of a matrix-vector product over the rows of `out_t` (one value each): weight rows
/// `row_start + j + k · part` (`k < NR`) into `out_t[j + k · part]`, `part = out_t.len() / NR`.
/// Returns how many rows they covered (those left over go one at a time).
///
/// # Safety
/// As for [`run_passes`] with `m = 1`.
unsafe fn far_passes<T: Tiles, const NR: usize, const U: usize>(
    tiles: &mut T,
    row_start: usize,
    out_t: &mut [f32],
) -> usize {
    let part = out_t.len() / NR;
    for j in 0..part {
        // SAFETY: rows row_start + j + k·part (k < NR) lie in the range; one activation row.
        let d = unsafe { tiles.tile::<NR, 1, U>(row_start + j, part, 0) };
        for (k, v) in d.iter().enumerate() {
            out_t[j + k * part] = v[0];
        }
    }
    NR * part
}
