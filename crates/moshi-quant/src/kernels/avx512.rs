//! AVX-512F kernels for 4- and 8-bit codes, specialised on (bits, group size): 64 code bytes
//! (16 `u32` lanes) per step, each code masked in place and converted to f32 with no shuffle.
//!
//! A lane holds `32 / BITS` codes; code `k` of every lane is `(lane & mask << BITS·k)`, which
//! `vcvtudq2ps` turns into `q · 2^(BITS·k)` exactly. The activations are pre-arranged once per
//! product ([`arrange_activations`]) so that vector `k` of a block holds, for each lane, the
//! column of that lane's code `k` times `2^-(BITS·k)` (exact for activations above 2^-98 in
//! magnitude), plus each group's activation sum.
//! A row's dot product is then regrouped as MLX's own kernels do:
//! `Σ_g scale_g · Σ_{j∈g} q_j x_j + bias_g · Σ_{j∈g} x_j`, f32 throughout: the exact
//! dequantized product up to rounding order. Per 64 code bytes that is one AND, one convert and
//! one FMA per 16 codes plus one scale FMA; the former table lookup needed two shuffles and one
//! more FMA per 32 codes, which capped 4-bit products at ~22 GB/s on two Zen 4 cores.

use std::arch::x86_64::*;

use crate::kernels::{RowRangeFn, PREFETCH_BYTES};
use crate::QuantizedMatrix;

/// f32 lanes per vector (and `u32` code words per 64-byte block).
const LANES: usize = 16;

/// Weight rows per pass of the matrix-vector kernel on long rows: each activation vector is
/// loaded once for all of them.
const MATVEC_ROWS: usize = 4;

/// Arranged activation bytes from which the matrix-vector kernel takes [`MATVEC_ROWS`] weight rows
/// per pass. Measured with weights streamed from DRAM (Zen 4, 32 KiB L1d): at 11264 columns
/// (45 KiB of activations, out of L1) four rows per pass read 24-41% faster (q4 and q8); at 4096
/// columns (16 KiB, in L1) one row per pass reads 40-50% faster, as the four interleaved code
/// streams slow DRAM streaming more than the shared activation loads save.
const MULTI_ROW_MIN_ACTIVATION_BYTES: usize = 24 * 1024;

/// Activation rows per pass of the matrix-matrix kernel: each code block is decoded once for all
/// of them.
const MATMUL_ROWS: usize = 4;

/// Columns covered by one 64-byte block of `bits`-bit codes.
const fn block_cols(bits: usize) -> usize {
    LANES * (32 / bits)
}

/// Floats per activation row in the arranged layout: the blocks (the last one zero-padded), then
/// the per-group sums zero-padded to a whole vector.
pub(crate) fn arranged_row_len(cols: usize, bits: u32, group_size: usize) -> usize {
    let bc = block_cols(bits as usize);
    cols.div_ceil(bc) * bc + (cols / group_size).next_multiple_of(LANES)
}

/// Lays out `m` rows of `cols` activations for [`select`]'s kernels (see the module docs):
/// within block `b`, element `k · 16 + lane` is column `b · block_cols + lane · (32 / bits) + k`
/// times `2^-(bits · k)`; then the sum of each group's columns.
pub(crate) fn arrange_activations(
    x: &[f32],
    m: usize,
    cols: usize,
    bits: u32,
    group_size: usize,
) -> Vec<f32> {
    let stride = arranged_row_len(cols, bits, group_size);
    let mut out = vec![0f32; m * stride];
    for (row, dst) in x.chunks_exact(cols).zip(out.chunks_exact_mut(stride)) {
        let blocks_len = match bits {
            4 => arrange_row::<8>(row, dst),
            _ => arrange_row::<4>(row, dst),
        };
        for (sum, group) in dst[blocks_len..]
            .iter_mut()
            .zip(row.chunks_exact(group_size))
        {
            *sum = group.iter().sum();
        }
    }
    out
}

/// The block part of [`arrange_activations`] for one row, `PER_LANE` codes per lane; returns
/// its length (whole blocks, the last one zero-padded in `dst`).
fn arrange_row<const PER_LANE: usize>(row: &[f32], dst: &mut [f32]) -> usize {
    let bc = LANES * PER_LANE;
    let bits = 32 / PER_LANE;
    // 2^-(bits k): exact powers of two (bits·k ≤ 28).
    let unscale: [f32; PER_LANE] =
        std::array::from_fn(|k| f32::from_bits(((127 - bits * k) as u32) << 23));
    let mut padded = [0f32; 128];
    let mut len = 0;
    for src in row.chunks(bc) {
        let src = if src.len() == bc {
            src
        } else {
            padded[..src.len()].copy_from_slice(src);
            &padded[..bc]
        };
        let block = &mut dst[len..len + bc];
        for (lane, codes) in src.chunks_exact(PER_LANE).enumerate() {
            for (k, (&v, u)) in codes.iter().zip(unscale).enumerate() {
                block[k * LANES + lane] = v * u;
            }
        }
        len += bc;
    }
    len
}

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
    let stride = arranged_row_len(w.cols(), BITS as u32, GROUP);
    assert!(row_start + nrows <= w.rows() && xs.len() == m * stride);
    // SAFETY: AVX-512F is present (checked above); `rows_impl` only reads rows
    // `row_start..row_start + nrows` of `w` (checked in range) and `m` arranged rows of `xs`.
    unsafe { rows_impl::<BITS, GROUP>(w, xs, m, row_start, out_t) }
}

/// Writes row `r`'s scales into `scales` as f32, then zeros (so a block's window of 16 scales can
/// always be loaded whole), and returns its bias terms `Σ_g bias_g · Σ_{j∈g} x_j` against `MR`
/// arranged activation rows.
///
/// # Safety
/// AVX-512F must be available; `r < w.rows()`; `xs` must point to `MR` arranged rows of
/// `stride` floats whose group sums start at `sums_offset`; `scales.len() >= groups + LANES`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn prepare_row<const GROUP: usize, const MR: usize>(
    w: &QuantizedMatrix,
    r: usize,
    xs: *const f32,
    stride: usize,
    sums_offset: usize,
    scales: &mut [f32],
) -> [f32; MR] {
    let groups = w.cols() / GROUP;
    let row_scales = &w.scales()[r * groups..(r + 1) * groups];
    let row_biases = &w.biases()[r * groups..(r + 1) * groups];
    // bf16 → f32: the bits shifted into the high half.
    let widen = |h: __m256i| _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)));
    let mut bias_acc = [_mm512_setzero_ps(); MR];
    let mut g = 0;
    while g < groups {
        let (s, b) = if g + LANES <= groups {
            // SAFETY: 16 bf16 of each slice from g.
            unsafe {
                (
                    _mm256_loadu_si256(row_scales.as_ptr().add(g) as *const __m256i),
                    _mm256_loadu_si256(row_biases.as_ptr().add(g) as *const __m256i),
                )
            }
        } else {
            let n = groups - g;
            let (mut s16, mut b16) = ([0u16; LANES], [0u16; LANES]);
            s16[..n].copy_from_slice(&row_scales[g..]);
            b16[..n].copy_from_slice(&row_biases[g..]);
            // SAFETY: 16 u16 each.
            unsafe {
                (
                    _mm256_loadu_si256(s16.as_ptr() as *const __m256i),
                    _mm256_loadu_si256(b16.as_ptr() as *const __m256i),
                )
            }
        };
        // SAFETY: g + LANES <= groups + LANES <= scales.len().
        unsafe { _mm512_storeu_ps(scales.as_mut_ptr().add(g), widen(s)) };
        let b = widen(b);
        for (i, acc) in bias_acc.iter_mut().enumerate() {
            // SAFETY: the group sums are zero-padded to a whole vector.
            let sums = unsafe { _mm512_loadu_ps(xs.add(i * stride + sums_offset + g)) };
            *acc = _mm512_fmadd_ps(b, sums, *acc);
        }
        g += LANES;
    }
    scales[g..g + LANES].fill(0.0);
    let mut bias_terms = [0f32; MR];
    for (t, acc) in bias_terms.iter_mut().zip(&bias_acc) {
        *t = _mm512_reduce_add_ps(*acc);
    }
    bias_terms
}

/// Rows of `out_t` (`m` values each) for weight rows `row_start..`: on long rows of a
/// matrix-vector product [`MATVEC_ROWS`] weight rows per pass, otherwise one weight row against
/// up to [`MATMUL_ROWS`] activation rows. Every (weight row, activation row) pair goes through the
/// same arithmetic whatever the pass shape, so results are identical bit for bit.
///
/// # Safety
/// AVX-512F must be available; rows `row_start..row_start + out_t.len() / m` must exist in `w`;
/// `xs` must hold `m` arranged rows.
#[target_feature(enable = "avx512f")]
unsafe fn rows_impl<const BITS: usize, const GROUP: usize>(
    w: &QuantizedMatrix,
    xs: &[f32],
    m: usize,
    row_start: usize,
    out_t: &mut [f32],
) {
    let cols = w.cols();
    let stride = arranged_row_len(cols, BITS as u32, GROUP);
    let groups = cols / GROUP;
    let padded = groups.next_multiple_of(LANES) + LANES;
    let nrows = out_t.len() / m;
    let mut scales = vec![0f32; MATVEC_ROWS * padded];
    let mut local = 0;
    if m == 1 && stride * 4 >= MULTI_ROW_MIN_ACTIVATION_BYTES {
        while local + MATVEC_ROWS <= nrows {
            // SAFETY: rows row_start + local.. + MATVEC_ROWS exist; one arranged row.
            let d = unsafe {
                tile::<BITS, GROUP, MATVEC_ROWS, 1, 1>(
                    w,
                    row_start + local,
                    xs.as_ptr(),
                    &mut scales,
                )
            };
            for (o, v) in out_t[local..local + MATVEC_ROWS].iter_mut().zip(d) {
                *o = v[0];
            }
            local += MATVEC_ROWS;
        }
    }
    for local in local..nrows {
        let r = row_start + local;
        let out_row = &mut out_t[local * m..(local + 1) * m];
        let mut i = 0;
        // SAFETY (all calls): row r exists; activation rows i..i + MR < m are arranged rows.
        while i + MATMUL_ROWS <= m {
            let x = unsafe { xs.as_ptr().add(i * stride) };
            let d = unsafe { tile::<BITS, GROUP, 1, MATMUL_ROWS, 1>(w, r, x, &mut scales) };
            out_row[i..i + MATMUL_ROWS].copy_from_slice(&d[0]);
            i += MATMUL_ROWS;
        }
        let x = unsafe { xs.as_ptr().add(i * stride) };
        match m - i {
            3 => out_row[i..]
                .copy_from_slice(&unsafe { tile::<BITS, GROUP, 1, 3, 2>(w, r, x, &mut scales) }[0]),
            2 => out_row[i..]
                .copy_from_slice(&unsafe { tile::<BITS, GROUP, 1, 2, 2>(w, r, x, &mut scales) }[0]),
            1 => out_row[i..]
                .copy_from_slice(&unsafe { tile::<BITS, GROUP, 1, 1, 4>(w, r, x, &mut scales) }[0]),
            _ => {}
        }
    }
}

/// Dot products of weight rows `r0..r0 + NR` with `MR` arranged activation rows (`xs`, row
/// stride `arranged_row_len`).
///
/// # Safety
/// AVX-512F must be available; rows `r0..r0 + NR` must exist in `w`; `xs` must point to `MR`
/// arranged rows; `scales.len() >= NR * (groups padded to 16 + 16)`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn tile<
    const BITS: usize,
    const GROUP: usize,
    const NR: usize,
    const MR: usize,
    const UNROLL: usize,
>(
    w: &QuantizedMatrix,
    r0: usize,
    xs: *const f32,
    scales: &mut [f32],
) -> [[f32; MR]; NR] {
    let per_lane = 32 / BITS;
    let bc = block_cols(BITS);
    let cols = w.cols();
    let stride = arranged_row_len(cols, BITS as u32, GROUP);
    let blocks = cols.div_ceil(bc);
    let sums_offset = blocks * bc;
    let groups = cols / GROUP;
    let padded = groups.next_multiple_of(LANES) + LANES;
    let row_code_bytes = cols * BITS / 8;
    let mut bias_terms = [[0f32; MR]; NR];
    for (r, terms) in bias_terms.iter_mut().enumerate() {
        // SAFETY: forwarded contract; row r0 + r exists; scales window r holds `padded` floats.
        *terms = unsafe {
            prepare_row::<GROUP, MR>(
                w,
                r0 + r,
                xs,
                stride,
                sums_offset,
                &mut scales[r * padded..(r + 1) * padded],
            )
        };
    }
    // Which group each lane of a block belongs to, relative to the block's first group (blocks
    // hold several groups when GROUP < block_cols).
    let lanes_per_group = (GROUP / per_lane).min(LANES);
    let mut lane_group = [0i32; LANES];
    for (lane, g) in lane_group.iter_mut().enumerate() {
        *g = (lane / lanes_per_group) as i32;
    }
    // SAFETY: 16 i32.
    let lane_group = unsafe { _mm512_loadu_si512(lane_group.as_ptr() as *const _) };
    let full_blocks = cols / bc;
    // Several weight rows per pass are several code streams, which the software prefetch helps
    // on every CPU (q8 `gating out` on Zen 4: +4-7% in 3 back-to-back rounds).
    let prefetch = NR > 1 || crate::kernels::software_prefetch(BITS);
    // Lanes of the last block that hold codes (all of them unless cols % block_cols != 0).
    let tail_lanes = (cols % bc) / per_lane;
    let codes = w.codes().as_ptr().wrapping_add(r0 * row_code_bytes / 4) as *const u8;
    let mut acc = [[_mm512_setzero_ps(); MR]; NR];
    let mut b = 0;
    while b + UNROLL <= full_blocks {
        // SAFETY: blocks b..b + UNROLL are whole blocks of every row of the tile.
        let parts = unsafe {
            block_partials::<BITS, NR, MR, UNROLL>(
                codes,
                row_code_bytes,
                b,
                !0,
                xs,
                stride,
                prefetch,
            )
        };
        for (u, part) in parts.iter().enumerate() {
            // SAFETY: rows r < NR have `padded` scales each.
            unsafe {
                accumulate_scaled::<BITS, GROUP, NR, MR>(
                    &mut acc,
                    part,
                    scales,
                    padded,
                    b + u,
                    lane_group,
                )
            };
        }
        b += UNROLL;
    }
    while b < blocks {
        let lane_mask: __mmask16 = if b == full_blocks {
            ((1u32 << tail_lanes) - 1) as __mmask16
        } else {
            !0
        };
        // SAFETY: the masked lanes of block b lie inside every row of the tile.
        let [part] = unsafe {
            block_partials::<BITS, NR, MR, 1>(
                codes,
                row_code_bytes,
                b,
                lane_mask,
                xs,
                stride,
                prefetch,
            )
        };
        // SAFETY: as above.
        unsafe {
            accumulate_scaled::<BITS, GROUP, NR, MR>(&mut acc, &part, scales, padded, b, lane_group)
        };
        b += 1;
    }
    let mut out = [[0f32; MR]; NR];
    for r in 0..NR {
        for i in 0..MR {
            out[r][i] = _mm512_reduce_add_ps(acc[r][i]) + bias_terms[r][i];
        }
    }
    out
}

/// The partial sums `Σ_k q_k · x_k` of blocks `b..b + U` (codes as `q · 2^(BITS·k)`, activations
/// pre-scaled by `2^-(BITS·k)`) for `NR` weight rows and `MR` arranged activation rows; lanes
/// outside `lane_mask` read as zero codes. The `U · NR · MR` chains are interleaved code by code,
/// so their FMAs issue side by side.
///
/// # Safety
/// AVX-512F must be available; the masked lanes of blocks `b..b + U` of each of the `NR` rows
/// (stride `row_code_bytes` from `codes`) must be readable; `xs` must point to `MR` arranged rows.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn block_partials<const BITS: usize, const NR: usize, const MR: usize, const U: usize>(
    codes: *const u8,
    row_code_bytes: usize,
    b: usize,
    lane_mask: __mmask16,
    xs: *const f32,
    stride: usize,
    prefetch: bool,
) -> [[[__m512; MR]; NR]; U] {
    let per_lane = 32 / BITS;
    let bc = block_cols(BITS);
    let code_mask = (1u32 << BITS) - 1;
    let mut d = [[_mm512_setzero_si512(); NR]; U];
    for (u, d) in d.iter_mut().enumerate() {
        for (r, d) in d.iter_mut().enumerate() {
            let p = codes.wrapping_add(r * row_code_bytes + (b + u) * 64);
            if prefetch {
                // A hint: never faults, so the address may run past the row.
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_BYTES) as *const i8);
            }
            // SAFETY: the masked lanes lie inside row r (caller's contract).
            *d = unsafe {
                if lane_mask == !0 {
                    _mm512_loadu_si512(p as *const _)
                } else {
                    _mm512_maskz_loadu_epi32(lane_mask, p as *const i32)
                }
            };
        }
    }
    let mut part = [[[_mm512_setzero_ps(); MR]; NR]; U];
    for k in 0..per_lane {
        let mask = _mm512_set1_epi32((code_mask << (BITS * k)) as i32);
        for u in 0..U {
            let mut x = [_mm512_setzero_ps(); MR];
            for (i, x) in x.iter_mut().enumerate() {
                // SAFETY: vector k of block b + u of arranged row i.
                *x = unsafe { _mm512_loadu_ps(xs.add(i * stride + (b + u) * bc + k * LANES)) };
            }
            for r in 0..NR {
                let q = _mm512_cvtepu32_ps(_mm512_and_si512(d[u][r], mask));
                for i in 0..MR {
                    part[u][r][i] = if k == 0 {
                        _mm512_mul_ps(q, x[i])
                    } else {
                        _mm512_fmadd_ps(q, x[i], part[u][r][i])
                    };
                }
            }
        }
    }
    part
}

/// `acc += scale · part` for block `b`: each lane's scale is its
/// group's (`lane_group` maps lanes to groups when a block holds several).
///
/// # Safety
/// AVX-512F must be available; `scales` must hold `NR` windows of `padded` floats (each row's
/// scales, zero-padded by one vector).
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn accumulate_scaled<
    const BITS: usize,
    const GROUP: usize,
    const NR: usize,
    const MR: usize,
>(
    acc: &mut [[__m512; MR]; NR],
    part: &[[__m512; MR]; NR],
    scales: &[f32],
    padded: usize,
    b: usize,
    lane_group: __m512i,
) {
    let bc = block_cols(BITS);
    let first_group = b * bc / GROUP;
    for r in 0..NR {
        let row_scales = scales.as_ptr().wrapping_add(r * padded + first_group);
        // SAFETY: first_group < groups and each window is padded by one vector.
        let s = unsafe {
            if GROUP >= bc {
                _mm512_set1_ps(*row_scales)
            } else {
                _mm512_permutexvar_ps(lane_group, _mm512_loadu_ps(row_scales))
            }
        };
        for i in 0..MR {
            acc[r][i] = _mm512_fmadd_ps(s, part[r][i], acc[r][i]);
        }
    }
}
