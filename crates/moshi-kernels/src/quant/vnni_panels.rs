//! AVX-512 VNNI tiles over a [`QuantPanels`] matrix: lanes across 16 weight rows, each
//! `vpdpbusd` multiplying a chunk's low or high nibbles (4-bit codes) or its even or odd columns'
//! line (8-bit codes) by one broadcast word of an activation row's digits (the arithmetic is in
//! `quant::panel_matrix`'s docs).
//!
//! A tile holds `MR` activation rows and `NP` panels: per group, `D · MR · NP` integer sums, then
//! `MR · NP` f32 totals. Rows go in tiles of 8 (three digits: 4), then 4, 2, 1, each meeting the
//! weights of a pass of 8 panels while those sit in L1/L2, so the weights stream from memory once
//! per product. A single row takes [`SINGLE_ROW_STREAMS`] panels a tile, one from each equal span
//! of the panels, so that each of a thread's streams runs on through memory from tile to tile; the
//! prefetch covers them. The threads start on equal runs of tiles (passes) and finish each other's
//! (`team::run_balanced`).

use std::arch::x86_64::*;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::quant::fixed_point::{RowLayout, DIGITS, I8_DIGITS, TWO_DIGITS};
use crate::quant::panel_matrix::{PanelLayout, PANEL_ROWS};
use crate::quant::{digits_of, vnni, CodePrefetch, MIN_TASK_WEIGHT_BYTES};
use crate::{ActivationPrecision, QuantPanels};

/// Streams (panels a tile) of each thread in a single-row product. 3 rather than 4: in the Zen 4
/// host's fast spells the temporal layers' shapes read faster with 3 streams a thread (or 2) than
/// with 4, and as fast in its slow state (docs/performance.md, "Three streams a thread").
const SINGLE_ROW_STREAMS: usize = 3;

/// Panels each pass of row tiles meets (their weights stay in L1/L2 between the row tiles).
const PANELS_PER_PASS: usize = 8;

/// Bytes of one digit's two planes in a block of the VNNI arrangement (128 columns).
const DIGIT_BYTES: usize = 128;

/// Bytes of one plane (the even or the odd columns of a block).
const PLANE_BYTES: usize = 64;

/// Code words per block of the VNNI arrangement.
const BLOCK_WORDS: usize = 16;

/// The largest group factor the tiles apply: every integer sum (below `2^31`) times it stays
/// finite in f32. The smallest is f32's smallest normal, so that the products stay normal too.
const MAX_GROUP_FACTOR: f32 = f32::from_bits((96 + 127) << 23);

/// `y = x · dequant(W)ᵀ` for `m` rows at `precision` on the panels, threaded; false (nothing
/// written) if a row cannot be held in the fixed point or a group factor leaves f32's normal range
/// ([`group_factors`]).
pub(crate) fn matmul(
    w: &QuantPanels,
    precision: ActivationPrecision,
    x: &[f32],
    m: usize,
    y: &mut [f32],
) -> bool {
    assert!(
        vnni::available(),
        "VNNI panel kernel called on a CPU without it"
    );
    let (cols, group_size) = (w.cols(), w.group_size());
    let digits = digits_of(precision);
    let row_layout = vnni::layout(cols, group_size, digits);
    let layout = w.layout();
    SCRATCH.with(|cell| {
        // A nested product on this thread (none today) would find the scratch taken.
        let mut fresh = Scratch::default();
        let mut held = cell.try_borrow_mut();
        let scratch = held.as_deref_mut().unwrap_or(&mut fresh);
        if !arranged_rows(precision, x, m, group_size, row_layout, &mut scratch.xs)
            || !group_factors(&scratch.xs, row_layout, layout.groups, &mut scratch.factors)
        {
            return false;
        }
        let frame = Frame {
            words: w.words(),
            layout,
            xs: &scratch.xs,
            sums_offset: row_layout.sums_offset,
            stride: row_layout.stride,
            factors: &scratch.factors,
            m,
            prefetch: CodePrefetch::for_panel_rows(m),
        };
        run_tiles(w, &frame, select(group_size, digits, w.bits()), y);
        true
    })
}

/// The arranged activation rows and their group factors of one product, kept by each thread
/// between its products (no allocation, and no fresh pages, per product).
#[derive(Default)]
struct Scratch {
    xs: Vec<f32>,
    factors: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// The tiles of `frame` over every panel of `w` into `y`, its units ([`units`]) shared out
/// between the team's threads.
fn run_tiles(w: &QuantPanels, frame: &Frame<'_>, tiles: TilesFn, y: &mut [f32]) {
    let threads = crate::team::threads().min((w.weight_bytes() / MIN_TASK_WEIGHT_BYTES).max(1));
    let out = Out {
        y: y.as_mut_ptr(),
        rows: w.rows(),
    };
    crate::team::run_balanced(threads, units(frame), &|unit| {
        // SAFETY: the CPU has the features (asserted by `matmul`); each unit runs once and the
        // units' panels are disjoint, so are the columns of `y` they write (`Out`).
        unsafe { tiles(frame, &out, unit) };
    });
}

/// The units a product's tiles are shared out in: with a single row, [`SINGLE_ROW_STREAMS`]
/// panels a span apart (the span a third of the panels), then the panels left one by one; with
/// several, passes of [`PANELS_PER_PASS`] panels.
fn units(frame: &Frame<'_>) -> usize {
    let panels = frame.layout.panels;
    if frame.m == 1 {
        let span = panels / SINGLE_ROW_STREAMS;
        span + (panels - SINGLE_ROW_STREAMS * span)
    } else {
        panels.div_ceil(PANELS_PER_PASS)
    }
}

/// The `m` activation rows of `x` in the VNNI kernel's digits at `precision` (`layout`) into
/// `xs` (each part zeroing its rows first), the rows split between the team's threads; false if
/// one cannot be held.
fn arranged_rows(
    precision: ActivationPrecision,
    x: &[f32],
    m: usize,
    group_size: usize,
    layout: RowLayout,
    xs: &mut Vec<f32>,
) -> bool {
    let cols = x.len() / m;
    // Every part zeroes its own rows below (a grown vector is zeroed here too).
    xs.resize(m * layout.stride, 0.0);
    let refused = AtomicBool::new(false);
    let rows_per_part = m.div_ceil(crate::team::threads());
    crate::team::run_chunks_mut(xs, rows_per_part * layout.stride, &|first, part| {
        part.fill(0.0);
        let rows = x[first / layout.stride * cols..].chunks_exact(cols);
        for (row, dst) in rows.zip(part.chunks_exact_mut(layout.stride)) {
            if !vnni::arrange_row_at(precision, row, dst, group_size, layout) {
                refused.store(true, Ordering::Relaxed);
            }
        }
    });
    !refused.into_inner()
}

/// Each arranged row's group factors `u_g · 2^e` (the unit of the group's integers: a power of
/// two with 16-bit or exact activations, `max_g / 127` with 8-bit ones), `[m][groups]`, into
/// `factors`; false if one lies outside `f32::MIN_POSITIVE..=MAX_GROUP_FACTOR`. A group held as
/// zeros keeps 0.
fn group_factors(xs: &[f32], layout: RowLayout, groups: usize, factors: &mut Vec<f32>) -> bool {
    let rows = xs.len() / layout.stride;
    factors.clear();
    factors.resize(rows * groups, 0.0);
    for (row, factors) in xs
        .chunks_exact(layout.stride)
        .zip(factors.chunks_exact_mut(groups))
    {
        let unscale = row[layout.unscale_offset];
        let units = &row[layout.units_offset..layout.units_offset + groups];
        for (factor, &unit) in factors.iter_mut().zip(units).filter(|(_, &u)| u != 0.0) {
            // Exact: `unscale` is a power of two and the product stays normal (checked).
            *factor = unit * unscale;
            if !(f32::MIN_POSITIVE..=MAX_GROUP_FACTOR).contains(factor) {
                return false;
            }
        }
    }
    true
}

/// What the tiles of one product read.
struct Frame<'a> {
    /// The panels' words (cache-line aligned).
    words: &'a [u32],
    layout: PanelLayout,
    /// The arranged activation rows, `stride` floats apart (digits first, group sums at
    /// `sums_offset`).
    xs: &'a [f32],
    sums_offset: usize,
    stride: usize,
    /// `[m][groups]` group factors.
    factors: &'a [f32],
    m: usize,
    prefetch: CodePrefetch,
}

/// Runs the tiles of one unit ([`units`]) into its columns of `out`.
type TilesFn = unsafe fn(&Frame<'_>, &Out, usize);

/// The tiles for codes of `bits` bits, groups of `group_size` and activations of `digits`
/// digits.
fn select(group_size: usize, digits: usize, bits: u32) -> TilesFn {
    if bits == 8 {
        select_bits::<8>(group_size, digits)
    } else {
        select_bits::<4>(group_size, digits)
    }
}

/// [`select`] for `BITS`-bit codes.
fn select_bits<const BITS: usize>(group_size: usize, digits: usize) -> TilesFn {
    match (group_size, digits) {
        (32, DIGITS) => tiles::<32, DIGITS, BITS>,
        (64, DIGITS) => tiles::<64, DIGITS, BITS>,
        (128, DIGITS) => tiles::<128, DIGITS, BITS>,
        (32, TWO_DIGITS) => tiles::<32, TWO_DIGITS, BITS>,
        (64, TWO_DIGITS) => tiles::<64, TWO_DIGITS, BITS>,
        (128, TWO_DIGITS) => tiles::<128, TWO_DIGITS, BITS>,
        (32, I8_DIGITS) => tiles::<32, I8_DIGITS, BITS>,
        (64, I8_DIGITS) => tiles::<64, I8_DIGITS, BITS>,
        (128, I8_DIGITS) => tiles::<128, I8_DIGITS, BITS>,
        _ => unreachable!("panels are built for groups of 32, 64 or 128 and 1-3 digits"),
    }
}

/// The tiles of unit `unit` ([`units`]): with a single row, one tile of its panels; with several,
/// its pass of panels against every activation row (module docs for the tile shapes).
///
/// # Safety
/// The CPU must have AVX-512F, BW and VNNI; the unit must exist; `out` must hold the product's `m`
/// rows, and no other thread write this unit's columns meanwhile.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tiles<const G: usize, const D: usize, const BITS: usize>(
    frame: &Frame<'_>,
    out: &Out,
    unit: usize,
) {
    const NP: usize = SINGLE_ROW_STREAMS;
    let panels = frame.layout.panels;
    if frame.m == 1 {
        let span = panels / NP;
        // SAFETY (both): as this function's contract; the panels exist.
        unsafe {
            if unit < span {
                let streams = std::array::from_fn(|s| unit + s * span);
                tile::<G, D, BITS, 1, NP>(frame, out, 0, streams, 1);
            } else {
                tile::<G, D, BITS, 1, 1>(frame, out, 0, [NP * span + unit - span], 1);
            }
        }
        return;
    }
    let (pass, pass_end) = (
        unit * PANELS_PER_PASS,
        (unit * PANELS_PER_PASS + PANELS_PER_PASS).min(panels),
    );
    let mut row = 0;
    while row < frame.m {
        let left = frame.m - row;
        // SAFETY (each): as this function's contract, rows `row..row + MR` exist.
        row += unsafe {
            match (D, left) {
                (DIGITS, 4..) => run::<G, D, BITS, 4, 1>(frame, out, row, pass, pass_end),
                (DIGITS, 2..) => run::<G, D, BITS, 2, 2>(frame, out, row, pass, pass_end),
                (DIGITS, _) => run::<G, D, BITS, 1, 4>(frame, out, row, pass, pass_end),
                (_, 8..) => run::<G, D, BITS, 8, 1>(frame, out, row, pass, pass_end),
                (_, 4..) => run::<G, D, BITS, 4, 2>(frame, out, row, pass, pass_end),
                (_, 2..) => run::<G, D, BITS, 2, 2>(frame, out, row, pass, pass_end),
                (_, _) => run::<G, D, BITS, 1, 4>(frame, out, row, pass, pass_end),
            }
        };
    }
}

/// Where the tiles write: the product's output, `m` rows of `rows` values from `y`; panel `p`'s
/// outputs are columns `16p..16p + 16` of each row (the last panel's cut to `rows`).
struct Out {
    y: *mut f32,
    rows: usize,
}

// SAFETY: the tasks sharing an `Out` write disjoint panels' columns (`tiles`' contract), and the
// output outlives the team region that writes it.
unsafe impl Sync for Out {}

/// Rows `row..row + MR` against panels `first..last`, `NP` adjacent panels a tile (the rest one
/// by one); returns `MR`.
///
/// # Safety
/// As [`tiles`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn run<
    const G: usize,
    const D: usize,
    const BITS: usize,
    const MR: usize,
    const NP: usize,
>(
    frame: &Frame<'_>,
    out: &Out,
    row: usize,
    first: usize,
    last: usize,
) -> usize {
    let mut panel = first;
    while panel + NP <= last {
        let panels = std::array::from_fn(|p| panel + p);
        // SAFETY: as this function's contract.
        unsafe { tile::<G, D, BITS, MR, NP>(frame, out, row, panels, NP) };
        panel += NP;
    }
    while panel < last {
        // SAFETY: as above.
        unsafe { tile::<G, D, BITS, MR, 1>(frame, out, row, [panel], 1) };
        panel += 1;
    }
    MR
}

/// One tile: activation rows `row0..row0 + MR` and `panels`, every group in order (module docs of
/// `quant::panel_matrix` for the arithmetic), its totals stored to `out`. `stream_step`: how many
/// panels further each panel's stream goes on in the next tile (where the prefetch past a panel's
/// end goes).
///
/// # Safety
/// As [`tiles`]; the rows and panels exist.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
#[allow(clippy::needless_range_loop)] // `i` and `p` address several arrays at once
unsafe fn tile<
    const G: usize,
    const D: usize,
    const BITS: usize,
    const MR: usize,
    const NP: usize,
>(
    frame: &Frame<'_>,
    out: &Out,
    row0: usize,
    panels: [usize; NP],
    stream_step: usize,
) {
    let layout = frame.layout;
    let (words, digits) = (frame.words.as_ptr(), frame.xs.as_ptr().cast::<u8>());
    let (factors, group_sums) = (
        frame.factors.as_ptr(),
        frame.xs.as_ptr().wrapping_add(frame.sums_offset),
    );
    // Code lines per chunk of 8 columns (4-bit: one, its nibbles split; 8-bit: two).
    let (chunks, chunk_lines) = (G / 8, BITS / 4);
    let nibble = _mm512_set1_epi8(0x0f);
    let high_halves = _mm512_set1_epi32(0xffff_0000_u32 as i32);
    let panel_words: [*const u32; NP] =
        std::array::from_fn(|p| words.wrapping_add(panels[p] * layout.panel_words));
    let mut total = [[_mm512_setzero_ps(); NP]; MR];
    for g in 0..layout.groups {
        let mut sums = [[[_mm512_setzero_si512(); NP]; MR]; D];
        for c in 0..chunks {
            let word = g * chunks + c;
            let digit_at = word / BLOCK_WORDS * D * DIGIT_BYTES + 4 * (word % BLOCK_WORDS);
            let (mut low, mut high) = ([_mm512_setzero_si512(); NP], [_mm512_setzero_si512(); NP]);
            for p in 0..NP {
                let line = g * layout.group_words + c * chunk_lines * PANEL_ROWS;
                let at = panel_words[p].wrapping_add(line);
                prefetch_stream(frame, panel_words[p], line, stream_step);
                if BITS == 8 {
                    let odd = at.wrapping_add(PANEL_ROWS);
                    prefetch_stream(frame, panel_words[p], line + PANEL_ROWS, stream_step);
                    // SAFETY: chunk c of group g of an existing panel: two aligned lines.
                    unsafe {
                        low[p] = _mm512_load_si512(at.cast());
                        high[p] = _mm512_load_si512(odd.cast());
                    }
                    continue;
                }
                // SAFETY: chunk c of group g of an existing panel: one aligned line.
                let codes = unsafe { _mm512_load_si512(at.cast()) };
                low[p] = _mm512_and_si512(codes, nibble);
                high[p] = _mm512_and_si512(_mm512_srli_epi32::<4>(codes), nibble);
            }
            for i in 0..MR {
                let row = digits.wrapping_add((row0 + i) * frame.stride * 4 + digit_at);
                for d in 0..D {
                    let even = row.wrapping_add(d * DIGIT_BYTES);
                    let odd = even.wrapping_add(PLANE_BYTES);
                    for p in 0..NP {
                        // SAFETY (both): the words of this code word's columns in digit d's even
                        // and odd planes of an existing arranged row.
                        let sum = unsafe { dpbusd_broadcast(sums[d][i][p], low[p], even) };
                        sums[d][i][p] = unsafe { dpbusd_broadcast(sum, high[p], odd) };
                    }
                }
            }
        }
        let (mut scale, mut bias) = ([_mm512_setzero_ps(); NP], [_mm512_setzero_ps(); NP]);
        for p in 0..NP {
            let factor_line = g * layout.group_words + chunks * chunk_lines * PANEL_ROWS;
            let at = panel_words[p].wrapping_add(factor_line);
            prefetch_stream(frame, panel_words[p], factor_line, stream_step);
            // SAFETY: the factor line of group g of an existing panel.
            let factors = unsafe { _mm512_load_si512(at.cast()) };
            scale[p] = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(factors));
            bias[p] = _mm512_castsi512_ps(_mm512_and_si512(factors, high_halves));
        }
        for i in 0..MR {
            // SAFETY: group g's factor and sum of an existing arranged row.
            let (factor, group_sum) = unsafe {
                (
                    _mm512_set1_ps(*factors.add((row0 + i) * layout.groups + g)),
                    _mm512_set1_ps(*group_sums.add((row0 + i) * frame.stride + g)),
                )
            };
            for p in 0..NP {
                let digit_sums: [__m512i; D] = std::array::from_fn(|d| sums[d][i][p]);
                let v = _mm512_mul_ps(joined(digit_sums), factor);
                total[i][p] = _mm512_fmadd_ps(scale[p], v, total[i][p]);
                total[i][p] = _mm512_fmadd_ps(bias[p], group_sum, total[i][p]);
            }
        }
    }
    for i in 0..MR {
        for p in 0..NP {
            let col = panels[p] * PANEL_ROWS;
            let lanes = (out.rows - col).min(PANEL_ROWS);
            // SAFETY: this panel's columns of an existing output row (as `tiles`'s contract),
            // the last panel's past the matrix masked off.
            unsafe {
                let at = out.y.add((row0 + i) * out.rows + col);
                _mm512_mask_storeu_ps(
                    at,
                    (1u32 << lanes).wrapping_sub(1) as __mmask16,
                    total[i][p],
                );
            }
        }
    }
}

/// Prefetches the line the frame's distance past word `word` of the panel at `panel`, whose stream
/// goes on `stream_step` panels further. Near the panel's end the plain distance lands in the
/// next panel, which a tile of adjacent panels already reads (its next stream); the hint goes to
/// the stream's own next panel instead, so the next tile's streams start warm.
#[inline(always)]
fn prefetch_stream(frame: &Frame<'_>, panel: *const u32, word: usize, stream_step: usize) {
    let panel_bytes = frame.layout.panel_words * 4;
    let mut target = word * 4 + frame.prefetch.distance_bytes();
    if target >= panel_bytes {
        target += (stream_step - 1) * panel_bytes;
    }
    frame.prefetch.line(panel.cast::<u8>().wrapping_add(target));
}

/// `acc + Σ` over each lane's 4 bytes of `codes` (unsigned) times the 4 bytes at `word`
/// (signed), the word broadcast to every lane from memory inside the instruction (`{1to16}`):
/// written as intrinsics, LLVM hoists a tile's broadcasts into registers and, at 8 activation
/// rows, spills them to the stack (a 64-byte store and load for each 4-byte word).
///
/// # Safety
/// The CPU must have AVX-512 VNNI; 4 bytes must be readable at `word`.
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
unsafe fn dpbusd_broadcast(acc: __m512i, codes: __m512i, word: *const u8) -> __m512i {
    let mut acc = acc;
    // SAFETY: reads the 4 bytes at `word` (the caller's contract) and these registers only.
    unsafe {
        std::arch::asm!(
            "vpdpbusd {acc}, {codes}, dword ptr [{word}]{{1to16}}",
            acc = inout(zmm_reg) acc,
            codes = in(zmm_reg) codes,
            word = in(reg) word,
            options(pure, readonly, nostack, preserves_flags),
        )
    };
    acc
}

/// A group's digit sums (the most significant first) joined into one f32: one digit converted,
/// two joined exactly in `i32` and converted, three as `f32(top) · 2^16 + f32(the lower two)`
/// (the top digit's sum shifted 16 bits would overflow `i32`).
#[target_feature(enable = "avx512f")]
#[inline]
fn joined<const D: usize>(sums: [__m512i; D]) -> __m512 {
    match D {
        1 => _mm512_cvtepi32_ps(sums[0]),
        2 => _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32::<8>(sums[0]), sums[1])),
        _ => {
            let lower = _mm512_add_epi32(_mm512_slli_epi32::<8>(sums[1]), sums[2]);
            _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(sums[0]),
                _mm512_set1_ps(65536.0),
                _mm512_cvtepi32_ps(lower),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Kernel, QuantizedMatrix};
    use moshi_test_support::XorShift64Star;

    /// A random matrix of `bits`-bit codes with bf16 factors of both signs.
    fn random_matrix(
        rng: &mut XorShift64Star,
        rows: usize,
        cols: usize,
        g: usize,
        bits: u32,
    ) -> QuantizedMatrix {
        let bf16 = crate::f32_to_bf16_bits;
        let codes = (0..rows * cols * bits as usize / 32)
            .map(|_| rng.next_u64() as u32)
            .collect();
        let scales = (0..rows * cols / g)
            .map(|_| bf16(rng.uniform(-0.05, 0.05)))
            .collect();
        let biases = (0..rows * cols / g)
            .map(|_| bf16(rng.uniform(-0.5, 0.5)))
            .collect();
        QuantizedMatrix::new(rows, cols, bits, g, codes, scales, biases).unwrap()
    }

    /// The module's arithmetic in scalar code: exact integer digit sums, joined, times the group
    /// factor, then the two fused adds, group by group.
    fn emulated(
        w: &QuantizedMatrix,
        precision: ActivationPrecision,
        x: &[f32],
        m: usize,
    ) -> Vec<f32> {
        let (rows, cols, g) = (w.rows(), w.cols(), w.group_size());
        let digits = digits_of(precision);
        let layout = vnni::layout(cols, g, digits);
        let (mut xs, mut factors) = (Vec::new(), Vec::new());
        assert!(arranged_rows(precision, x, m, g, layout, &mut xs));
        assert!(group_factors(&xs, layout, cols / g, &mut factors));
        let to_f32 = crate::bf16_bits_to_f32;
        let mut y = vec![0f32; m * rows];
        for (i, row) in xs.chunks_exact(layout.stride).enumerate() {
            let bytes: Vec<u8> = row.iter().flat_map(|v| v.to_ne_bytes()).collect();
            for r in 0..rows {
                let mut total = 0f32;
                for group in 0..cols / g {
                    let sums: Vec<i64> = (0..digits)
                        .map(|d| {
                            (group * g..(group + 1) * g)
                                .map(|j| {
                                    let digit = bytes[layout.digit_byte(j, d)] as i8;
                                    w.code(r, j) as i64 * digit as i64
                                })
                                .sum()
                        })
                        .collect();
                    let v = match digits {
                        1 => sums[0] as i32 as f32,
                        2 => ((sums[0] << 8) + sums[1]) as i32 as f32,
                        _ => (sums[0] as i32 as f32)
                            .mul_add(65536.0, ((sums[1] << 8) + sums[2]) as i32 as f32),
                    };
                    let v = v * factors[i * (cols / g) + group];
                    let at = r * (cols / g) + group;
                    total = to_f32(w.scales()[at]).mul_add(v, total);
                    total = to_f32(w.biases()[at]).mul_add(row[layout.sums_offset + group], total);
                }
                y[i * rows + r] = total;
            }
        }
        y
    }

    /// Every tile shape, row count (1-9: each tile and its remainders), group size, code width,
    /// precision and thread count gives the emulation's bits, partial last panels included.
    #[test]
    fn tiles_give_the_scalar_emulations_bits_at_every_row_count_and_thread_count() {
        if !vnni::available() {
            return;
        }
        let mut rng = XorShift64Star::new(0x5eed);
        for (g, bits) in [32, 64, 128].into_iter().flat_map(|g| [(g, 4), (g, 8)]) {
            for (rows, cols) in [(20, 3 * g), (16 * 11, 2 * g)] {
                let w = random_matrix(&mut rng, rows, cols, g, bits);
                let panels = QuantPanels::from_matrix(w.clone(), Kernel::Avx512Vnni).unwrap();
                for m in 1..=9 {
                    let x: Vec<f32> = (0..m * cols).map(|_| rng.uniform(-2.0, 2.0)).collect();
                    for precision in ActivationPrecision::ALL {
                        let want = emulated(&w, precision, &x, m);
                        for threads in [1, 2, 3] {
                            let pool = rayon::ThreadPoolBuilder::new()
                                .num_threads(threads)
                                .build()
                                .unwrap();
                            let mut got = vec![f32::NAN; m * rows];
                            pool.install(|| panels.matmul_with(precision, &x, m, &mut got));
                            let same = got
                                .iter()
                                .zip(&want)
                                .all(|(a, b)| a.to_bits() == b.to_bits());
                            assert!(
                                same,
                                "q{bits} g{g} {rows}x{cols} m {m} {precision} {threads} threads"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Rows whose group factors would leave f32's normal range go to the scalar reference path
    /// (and every other row of the batch keeps its bits).
    #[test]
    fn rows_out_of_the_factor_range_take_the_scalar_path() {
        if !vnni::available() {
            return;
        }
        let mut rng = XorShift64Star::new(3);
        let (rows, cols) = (18, 128);
        let w = random_matrix(&mut rng, rows, cols, 32, 4);
        let panels = QuantPanels::from_matrix(w.clone(), Kernel::Avx512Vnni).unwrap();
        let mut x: Vec<f32> = (0..2 * cols).map(|_| rng.uniform(-1.0, 1.0)).collect();
        // Row 1: normal values whose smallest groups' units fall below f32's normal range.
        for (j, v) in x[cols..].iter_mut().enumerate() {
            *v *= if j < 32 { 1e-20 } else { 1e-37 };
        }
        let layout = vnni::layout(cols, 32, DIGITS);
        let mut xs = Vec::new();
        assert!(arranged_rows(
            ActivationPrecision::Exact,
            &x,
            2,
            32,
            layout,
            &mut xs
        ));
        assert!(!group_factors(&xs, layout, 4, &mut Vec::new()));
        let mut want = vec![0f32; 2 * rows];
        w.matmul_reference(&x, 2, &mut want);
        let mut got = vec![f32::NAN; 2 * rows];
        panels.matmul_with(ActivationPrecision::Exact, &x, 2, &mut got);
        assert_eq!(&got[rows..], &want[rows..], "the scalar path's bits");
        let mut alone = vec![f32::NAN; rows];
        panels.matmul_with(ActivationPrecision::Exact, &x[..cols], 1, &mut alone);
        assert_eq!(&got[..rows], &alone[..]);
    }
}
