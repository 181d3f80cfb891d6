//! The lane-blocked quantized kernel shared by the AVX-512, AVX2 and NEON modules: 16, 8 or 4
//! `u32` code lanes (64, 32 or 16 code bytes) per step, each code masked in place and converted to
//! f32 with no shuffle.
//!
//! A lane holds `32 / BITS` codes; code `k` of every lane is `lane & (mask << BITS·k)`, which a
//! convert turns into `q · 2^(BITS·k)` exactly (AVX2 has no unsigned convert, so it shifts the top
//! code down to `q` instead). The activations are pre-arranged once per product
//! ([`arrange_activations`]) so that vector `k` of a block holds, for each lane, the column of that
//! lane's code `k` times the inverse power of two (exact for activations above 2^-98 in magnitude),
//! plus each group's activation sum. A row's dot product is then regrouped as MLX's own kernels do:
//! `Σ_g scale_g · Σ_{j∈g} q_j x_j + bias_g · Σ_{j∈g} x_j`, f32 throughout: the exact dequantized
//! product up to rounding order. Per block that is one AND (or shift), one convert and one FMA per
//! lane-vector of codes plus one scale FMA; the former table lookup needed two shuffles and one
//! more FMA per 32 codes, which left 4-bit products bound by the arithmetic rather than by memory
//! (docs/performance.md#rows-per-pass-and-prefetch-distances-qmv-weights-streamed-from-dram).
//!
//! `lane_kernel!` expands the kernel inside an instruction-set module, which provides `LANES`,
//! `TOP_UNSCALED`, `PAIRED_FROM_M`, the vector types `F`/`I`, `available()` and the small
//! `#[target_feature]` ops it calls (`fzero`, `izero`, `fload`, `fstore`, `fset1`, `fmul`, `ffma`,
//! `fsum`, `fpermute`, `iload`, `iload_lanes`, `widen_scales`, `decode`). A macro because the
//! `target_feature` attribute, needed so every op inlines, differs per instruction set.

/// Weight rows per pass of the matrix-vector kernel on long rows: each activation vector is
/// loaded once for all of them. They are taken from that many equal parts of the thread's rows,
/// so their code streams lie far apart: at 11264 columns with weights streamed from DRAM, far rows
/// read faster than 4 adjacent rows (or the same), q4 and q8, with the AVX-512 and AVX2 kernels
/// (docs/performance.md#rows-per-pass-and-prefetch-distances-qmv-weights-streamed-from-dram).
pub(crate) const MATVEC_ROWS: usize = 4;

/// Arranged activation bytes from which the matrix-vector kernel takes [`MATVEC_ROWS`] weight rows
/// per pass. With weights streamed from DRAM and adjacent rows, on a core with a 32 KiB L1d: at
/// 11264 columns (45 KiB of activations, out of L1) four rows per pass read faster (q4 and q8);
/// at 4096 columns (16 KiB, in L1) one row per pass did, as the four interleaved code streams
/// slow DRAM streaming more than the shared activation loads save
/// (docs/performance.md#rows-per-pass-and-prefetch-distances-qmv-weights-streamed-from-dram).
pub(crate) const MULTI_ROW_MIN_ACTIVATION_BYTES: usize = 24 * 1024;

/// Columns covered by one block of `lanes` `u32` lanes of `bits`-bit codes.
pub(crate) const fn block_cols(bits: usize, lanes: usize) -> usize {
    lanes * (32 / bits)
}

/// Floats per activation row in the arranged layout: the blocks (the last one zero-padded), then
/// the per-group sums zero-padded to a whole vector.
pub(crate) fn arranged_row_len(cols: usize, bits: u32, group_size: usize, lanes: usize) -> usize {
    let bc = block_cols(bits as usize, lanes);
    cols.div_ceil(bc) * bc + (cols / group_size).next_multiple_of(lanes)
}

/// Which quantization group each of a block's `N` lanes (of `cols_per_lane` columns each) belongs
/// to, relative to the block's first group (all of them to the first when a group spans the
/// block): the lane kernels' and the integer kernels' permutation of a window of group factors.
pub(crate) fn lane_groups<const N: usize>(group_size: usize, cols_per_lane: usize) -> [i32; N] {
    let lanes_per_group = (group_size / cols_per_lane).min(N);
    std::array::from_fn(|lane| (lane / lanes_per_group) as i32)
}

/// Lays out `m` rows of `cols` activations for a lane kernel of `lanes` lanes (see the module
/// docs): within block `b`, element `k · lanes + lane` is column
/// `b · block_cols + lane · (32 / bits) + k` times `2^-(bits · k)` (times 1 for the top code when
/// `top_unscaled`); then the sum of each group's columns.
pub(crate) fn arrange_activations(
    x: &[f32],
    m: usize,
    cols: usize,
    bits: u32,
    group_size: usize,
    lanes: usize,
    top_unscaled: bool,
) -> Vec<f32> {
    let stride = arranged_row_len(cols, bits, group_size, lanes);
    let mut out = vec![0f32; m * stride];
    for (row, dst) in x.chunks_exact(cols).zip(out.chunks_exact_mut(stride)) {
        let blocks_len = match bits {
            4 => arrange_row::<8>(row, dst, lanes, top_unscaled),
            _ => arrange_row::<4>(row, dst, lanes, top_unscaled),
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
fn arrange_row<const PER_LANE: usize>(
    row: &[f32],
    dst: &mut [f32],
    lanes: usize,
    top_unscaled: bool,
) -> usize {
    let bc = lanes * PER_LANE;
    let bits = 32 / PER_LANE;
    // 2^-(bits k): exact powers of two (bits·k ≤ 28).
    let unscale: [f32; PER_LANE] = std::array::from_fn(|k| {
        if top_unscaled && k == PER_LANE - 1 {
            1.0
        } else {
            f32::from_bits(((127 - bits * k) as u32) << 23)
        }
    });
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
                block[k * lanes + lane] = v * u;
            }
        }
        len += bc;
    }
    len
}

/// Expands the lane kernel (`select` and its helpers) in an instruction-set module compiled with
/// `$features` (see the module docs for what the module must provide).
macro_rules! lane_kernel {
    ($features:literal) => {
        use crate::quant::lanes::{
            arranged_row_len, block_cols, MATVEC_ROWS, MULTI_ROW_MIN_ACTIVATION_BYTES,
        };
        use crate::quant::passes::{run_passes, Tiles};
        use crate::quant::CodePrefetch;
        use crate::QuantizedMatrix;

        pub(crate) fn select(bits: u32, group_size: usize) -> Option<crate::quant::RowRangeFn> {
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
                available(),
                concat!("kernel for ", $features, " called on a CPU without it")
            );
            let cols = w.cols();
            let nrows = out_t.len() / m;
            let stride = arranged_row_len(cols, BITS as u32, GROUP, LANES);
            assert!(row_start + nrows <= w.rows() && xs.len() == m * stride);
            // SAFETY (both): the CPU has the features (checked above); the tiles only read rows
            // `row_start..row_start + nrows` of `w` (checked in range) and `m` arranged rows of
            // `xs`.
            if stride * 4 >= MULTI_ROW_MIN_ACTIVATION_BYTES {
                let mut tiles = LaneTiles::<BITS, GROUP, MATVEC_ROWS>::new(w, xs, stride);
                unsafe { run_passes(&mut tiles, m, row_start, out_t) }
            } else {
                let mut tiles = LaneTiles::<BITS, GROUP, 1>::new(w, xs, stride);
                unsafe { run_passes(&mut tiles, m, row_start, out_t) }
            }
        }

        /// The lane kernel's tiles for one product (see `quant::passes`): `MATVEC` weight rows
        /// per matrix-vector pass ([`MATVEC_ROWS`] on long rows, else 1).
        struct LaneTiles<'a, const BITS: usize, const GROUP: usize, const MATVEC: usize> {
            w: &'a QuantizedMatrix,
            /// The arranged activation rows, `stride` floats each.
            xs: &'a [f32],
            stride: usize,
            /// Room for the scales of [`MATVEC_ROWS`] weight rows (see [`prepare_row`]).
            scales: Vec<f32>,
            prefetch: CodePrefetch,
        }

        impl<'a, const BITS: usize, const GROUP: usize, const MATVEC: usize>
            LaneTiles<'a, BITS, GROUP, MATVEC>
        {
            fn new(w: &'a QuantizedMatrix, xs: &'a [f32], stride: usize) -> Self {
                let padded = (w.cols() / GROUP).next_multiple_of(LANES) + LANES;
                LaneTiles {
                    w,
                    xs,
                    stride,
                    scales: vec![0f32; MATVEC_ROWS * padded],
                    prefetch: CodePrefetch::for_cpu(),
                }
            }
        }

        impl<const BITS: usize, const GROUP: usize, const MATVEC: usize> Tiles
            for LaneTiles<'_, BITS, GROUP, MATVEC>
        {
            const MATVEC_ROWS: usize = MATVEC;
            const PAIRED_FROM_M: usize = PAIRED_FROM_M;

            unsafe fn tile<const NR: usize, const MR: usize, const U: usize>(
                &mut self,
                r0: usize,
                row_step: usize,
                first: usize,
            ) -> [[f32; MR]; NR] {
                // SAFETY: the CPU has the features (checked before the passes); forwarded
                // contract (activation row `first` exists).
                unsafe {
                    let x = self.xs.as_ptr().add(first * self.stride);
                    tile::<BITS, GROUP, NR, MR, U>(
                        self.w,
                        r0,
                        x,
                        &mut self.scales,
                        self.prefetch,
                        row_step,
                    )
                }
            }
        }

        /// Writes row `r`'s scales into `scales` as f32, then zeros (so a block's window of LANES
        /// scales can always be loaded whole), and returns its bias terms `Σ_g bias_g · Σ_{j∈g}
        /// x_j` against `MR` arranged activation rows.
        ///
        /// # Safety
        /// The CPU must have the module's features; `r < w.rows()`; `xs` must point to `MR`
        /// arranged rows of `stride` floats whose group sums start at `sums_offset`; `scales.len()
        /// >= groups + LANES`.
        #[target_feature(enable = $features)]
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
            let mut bias_acc = [fzero(); MR];
            let mut g = 0;
            while g < groups {
                let (s, b) = if g + LANES <= groups {
                    // SAFETY: LANES bf16 of each slice from g.
                    unsafe {
                        (
                            widen_scales(w.scale_format(), row_scales.as_ptr().add(g)),
                            widen_scales(w.scale_format(), row_biases.as_ptr().add(g)),
                        )
                    }
                } else {
                    let n = groups - g;
                    let (mut s16, mut b16) = ([0u16; 16], [0u16; 16]);
                    s16[..n].copy_from_slice(&row_scales[g..]);
                    b16[..n].copy_from_slice(&row_biases[g..]);
                    // SAFETY: 16 >= LANES u16 each.
                    unsafe {
                        (
                            widen_scales(w.scale_format(), s16.as_ptr()),
                            widen_scales(w.scale_format(), b16.as_ptr()),
                        )
                    }
                };
                // SAFETY: g + LANES <= groups + LANES <= scales.len().
                unsafe { fstore(scales.as_mut_ptr().add(g), s) };
                for (i, acc) in bias_acc.iter_mut().enumerate() {
                    // SAFETY: the group sums are zero-padded to a whole vector.
                    let sums = unsafe { fload(xs.add(i * stride + sums_offset + g)) };
                    *acc = ffma(b, sums, *acc);
                }
                g += LANES;
            }
            scales[g..g + LANES].fill(0.0);
            let mut bias_terms = [0f32; MR];
            for (t, acc) in bias_terms.iter_mut().zip(&bias_acc) {
                *t = fsum(*acc);
            }
            bias_terms
        }

        /// Dot products of weight rows `r0 + k · row_step` (`k < NR`) with `MR` arranged activation
        /// rows (`xs`, row stride `arranged_row_len`).
        ///
        /// # Safety
        /// The CPU must have the module's features; rows `r0 + k · row_step` (`k < NR`) must exist
        /// in `w`; `xs` must point to `MR` arranged rows; `scales.len() >= NR * (groups padded to
        /// LANES + LANES)`.
        #[target_feature(enable = $features)]
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
            prefetch: CodePrefetch,
            row_step: usize,
        ) -> [[f32; MR]; NR] {
            let per_lane = 32 / BITS;
            let bc = block_cols(BITS, LANES);
            let cols = w.cols();
            let stride = arranged_row_len(cols, BITS as u32, GROUP, LANES);
            let blocks = cols.div_ceil(bc);
            let sums_offset = blocks * bc;
            let groups = cols / GROUP;
            let padded = groups.next_multiple_of(LANES) + LANES;
            let row_code_bytes = cols * BITS / 8;
            let mut bias_terms = [[0f32; MR]; NR];
            for (r, terms) in bias_terms.iter_mut().enumerate() {
                // SAFETY: forwarded contract; row r0 + r exists; scales window r holds `padded`
                // floats.
                *terms = unsafe {
                    prepare_row::<GROUP, MR>(
                        w,
                        r0 + r * row_step,
                        xs,
                        stride,
                        sums_offset,
                        &mut scales[r * padded..(r + 1) * padded],
                    )
                };
            }
            // Which group each lane of a block belongs to (blocks hold several groups when
            // GROUP < block_cols).
            let lane_group = crate::quant::lanes::lane_groups::<LANES>(GROUP, per_lane);
            // SAFETY: LANES i32.
            let lane_group = unsafe { iload(lane_group.as_ptr()) };
            let full_blocks = cols / bc;
            // Lanes of the last block that hold codes (all of them unless cols % block_cols != 0).
            let tail_lanes = (cols % bc) / per_lane;
            let codes = w.codes().as_ptr().wrapping_add(r0 * row_code_bytes / 4) as *const u8;
            let row_code_bytes = row_code_bytes * row_step;
            let mut acc = [[fzero(); MR]; NR];
            let mut b = 0;
            while b + UNROLL <= full_blocks {
                // SAFETY: blocks b..b + UNROLL are whole blocks of every row of the tile.
                let parts = unsafe {
                    block_partials::<BITS, NR, MR, UNROLL>(
                        codes,
                        row_code_bytes,
                        b,
                        LANES,
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
                let valid_lanes = if b == full_blocks { tail_lanes } else { LANES };
                // SAFETY: the valid lanes of block b lie inside every row of the tile.
                let [part] = unsafe {
                    block_partials::<BITS, NR, MR, 1>(
                        codes,
                        row_code_bytes,
                        b,
                        valid_lanes,
                        xs,
                        stride,
                        prefetch,
                    )
                };
                // SAFETY: as above.
                unsafe {
                    accumulate_scaled::<BITS, GROUP, NR, MR>(
                        &mut acc, &part, scales, padded, b, lane_group,
                    )
                };
                b += 1;
            }
            let mut out = [[0f32; MR]; NR];
            for r in 0..NR {
                for i in 0..MR {
                    out[r][i] = fsum(acc[r][i]) + bias_terms[r][i];
                }
            }
            out
        }

        /// The partial sums `Σ_k q_k · x_k` of blocks `b..b + U` (codes as `q · 2^(BITS·k)`,
        /// activations pre-scaled by `2^-(BITS·k)`) for `NR` weight rows and `MR` arranged
        /// activation rows; lanes from `valid_lanes` on read as zero codes. The `U · NR · MR`
        /// chains are interleaved code by code, so their FMAs issue side by side.
        ///
        /// # Safety
        /// The CPU must have the module's features; the first `valid_lanes` lanes of blocks `b..b +
        /// U` of each of the `NR` rows (stride `row_code_bytes` from `codes`) must be readable;
        /// `xs` must point to `MR` arranged rows.
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn block_partials<
            const BITS: usize,
            const NR: usize,
            const MR: usize,
            const U: usize,
        >(
            codes: *const u8,
            row_code_bytes: usize,
            b: usize,
            valid_lanes: usize,
            xs: *const f32,
            stride: usize,
            prefetch: CodePrefetch,
        ) -> [[[F; MR]; NR]; U] {
            let per_lane = 32 / BITS;
            let bc = block_cols(BITS, LANES);
            let mut d = [[izero(); NR]; U];
            for (u, d) in d.iter_mut().enumerate() {
                for (r, d) in d.iter_mut().enumerate() {
                    let p = codes.wrapping_add(r * row_code_bytes + (b + u) * LANES * 4);
                    prefetch.ahead_of(p);
                    // SAFETY: the valid lanes lie inside row r (caller's contract).
                    *d = unsafe {
                        if valid_lanes == LANES {
                            iload(p as *const i32)
                        } else {
                            iload_lanes(p as *const i32, valid_lanes)
                        }
                    };
                }
            }
            let mut part = [[[fzero(); MR]; NR]; U];
            for k in 0..per_lane {
                for u in 0..U {
                    let mut x = [fzero(); MR];
                    for (i, x) in x.iter_mut().enumerate() {
                        // SAFETY: vector k of block b + u of arranged row i.
                        *x = unsafe { fload(xs.add(i * stride + (b + u) * bc + k * LANES)) };
                    }
                    for r in 0..NR {
                        let q = decode::<BITS>(d[u][r], k);
                        for i in 0..MR {
                            part[u][r][i] = if k == 0 {
                                fmul(q, x[i])
                            } else {
                                ffma(q, x[i], part[u][r][i])
                            };
                        }
                    }
                }
            }
            part
        }

        /// `acc += scale · part` for block `b`: each lane's scale is its group's (`lane_group` maps
        /// lanes to groups when a block holds several).
        ///
        /// # Safety
        /// The CPU must have the module's features; `scales` must hold `NR` windows of `padded`
        /// floats (each row's scales, zero-padded by one vector).
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn accumulate_scaled<
            const BITS: usize,
            const GROUP: usize,
            const NR: usize,
            const MR: usize,
        >(
            acc: &mut [[F; MR]; NR],
            part: &[[F; MR]; NR],
            scales: &[f32],
            padded: usize,
            b: usize,
            lane_group: I,
        ) {
            let bc = block_cols(BITS, LANES);
            let first_group = b * bc / GROUP;
            for r in 0..NR {
                let row_scales = scales.as_ptr().wrapping_add(r * padded + first_group);
                // SAFETY: first_group < groups and each window is padded by one vector.
                let s = unsafe {
                    if GROUP >= bc {
                        fset1(*row_scales)
                    } else {
                        fpermute(lane_group, fload(row_scales))
                    }
                };
                for i in 0..MR {
                    acc[r][i] = ffma(s, part[r][i], acc[r][i]);
                }
            }
        }
    };
}
