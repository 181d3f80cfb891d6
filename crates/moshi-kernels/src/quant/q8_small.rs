//! Few-row products against MLX 8-bit affine weights (a [`QuantizedMatrix`] with 8 bits):
//! every packed weight row is streamed once for all left rows, activations and accumulation stay
//! f32. This is Mimi's memory-bound per-frame case (1-16 left rows) at ~1.06 bytes per weight
//! instead of 4, with strided left rows (overlapping convolution windows read in place), a
//! block view of the weights (row and group-aligned column offset) and an accumulating output.
//!
//! Math per output: `Σ_g scale_g · Σ_{p∈g} x_p q_p + Σ_g bias_g · Σ_{p∈g} x_p`, i.e. exactly the
//! dequantized `q · scale + bias` weights (f32 scale and bias from their bf16 or f16 bits), summed in a
//! different order than a scalar loop (f32 rounding only).

use crate::dense::gemm::{fma_lanes, par_ranges, PARALLEL_MIN_MACS};
use crate::elem::{reduce_lanes, LANES};
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use crate::InstructionSet;
use crate::{Kernel, QuantizedMatrix, ScaleFormat};

/// Left rows up to which [`gemm_nt_q8`] is used (the weight-streaming regime: each weight tile
/// is read from memory once and applied to all left rows from L1).
pub const Q8_MAX_ROWS: usize = 16;

/// Group sizes the kernel is instantiated for.
pub const Q8_GROUP_SIZES: [usize; 3] = [32, 64, 128];

/// `out[i * rs_out + j] (+)= Σ_p a[i * rs_a + p] · W[row0 + j][col0 + p]` for `i < m`, `j < n`,
/// `p < k`, with `W` the dequantized 8-bit matrix. Rows of `a` may overlap (`rs_a < k`). Output
/// columns are split over the [`crate::team`] when the product is large (same result for any thread
/// count: each output is computed by one thread in a fixed order).
///
/// Panics (internal invariants, never user input) unless `w` has 8 bits and a supported group
/// size, `1 <= m <= Q8_MAX_ROWS`, `col0` and `k` are multiples of the group size, the block is
/// inside `w` and the slices cover the strided ranges.
#[allow(clippy::too_many_arguments)]
pub fn gemm_nt_q8(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    rs_a: usize,
    w: &QuantizedMatrix,
    row0: usize,
    col0: usize,
    out: &mut [f32],
    rs_out: usize,
    accumulate: bool,
) {
    let g = w.group_size();
    assert_eq!(w.bits(), 8, "gemm_nt_q8 needs 8-bit weights");
    assert!(
        Q8_GROUP_SIZES.contains(&g),
        "gemm_nt_q8: group size {g} not supported"
    );
    assert!(
        (1..=Q8_MAX_ROWS).contains(&m),
        "gemm_nt_q8 takes 1..={Q8_MAX_ROWS} rows, got {m}"
    );
    if n == 0 {
        return;
    }
    assert!(
        k > 0 && k.is_multiple_of(g) && col0.is_multiple_of(g),
        "gemm_nt_q8: k {k} / col0 {col0} not multiples of the group {g}"
    );
    assert!(
        row0 + n <= w.rows() && col0 + k <= w.cols(),
        "gemm_nt_q8: block outside the matrix"
    );
    assert!(a.len() >= (m - 1) * rs_a + k, "lhs slice too short");
    assert!(
        rs_out >= n && out.len() >= (m - 1) * rs_out + n,
        "output slice too short"
    );
    let groups = k / g;
    XSUM.with(|cell| {
        let mut xsum = cell.borrow_mut();
        gemm_with_xsum(
            m, k, n, a, rs_a, w, row0, col0, out, rs_out, accumulate, groups, &mut xsum,
        );
    });
}

thread_local! {
    /// Per-thread scratch for the group sums (no allocation per call in steady state).
    static XSUM: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[allow(clippy::too_many_arguments)]
fn gemm_with_xsum(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    rs_a: usize,
    w: &QuantizedMatrix,
    row0: usize,
    col0: usize,
    out: &mut [f32],
    rs_out: usize,
    accumulate: bool,
    groups: usize,
    xsum: &mut Vec<f32>,
) {
    let g = w.group_size();
    // Σ x per left row and group, shared by every weight row.
    xsum.clear();
    xsum.resize(m * groups, 0.0);
    for i in 0..m {
        for (gi, s) in xsum[i * groups..(i + 1) * groups].iter_mut().enumerate() {
            *s = a[i * rs_a + gi * g..i * rs_a + (gi + 1) * g].iter().sum();
        }
    }
    // SAFETY (u8 view): the code words are plain u32s; reading them as bytes is always valid, and
    // on little-endian targets byte `4 w + b` of the words is column `4 w + b` (MLX packing).
    let codes: &[u8] =
        unsafe { std::slice::from_raw_parts(w.codes().as_ptr().cast::<u8>(), w.codes().len() * 4) };
    let (row_bytes, row_groups) = (w.cols(), w.cols() / g);
    let block = Q8Block {
        codes: codes[row0 * row_bytes + col0..].as_ptr(),
        scales: w.scales()[row0 * row_groups + col0 / g..].as_ptr(),
        biases: w.biases()[row0 * row_groups + col0 / g..].as_ptr(),
        format: w.scale_format(),
        row_bytes,
        row_groups,
        group: g,
        groups,
    };
    let args = Q8Args {
        m,
        k,
        a: a.as_ptr(),
        rs_a,
        xsum: xsum.as_ptr(),
        rs_out,
        accumulate,
    };
    let threads = crate::team::threads();
    if m * n * k < PARALLEL_MIN_MACS || threads < 2 {
        // SAFETY: bounds asserted above.
        unsafe { q8_dispatch(&args, &block, 0, n, out.as_mut_ptr()) };
        return;
    }
    let out_ptr = OutPtr(out.as_mut_ptr());
    par_ranges(0, n, threads.min(n.div_ceil(16)), &|lo, hi| {
        let op = out_ptr;
        // SAFETY: each range writes disjoint output columns, inside the asserted ranges.
        unsafe { q8_dispatch(&args, &block, lo, hi, op.0) };
    });
}

#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: hands disjoint output columns to scoped tasks.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// The weight block: row `j`'s codes at `codes + j * row_bytes`, its scales/biases at `+ j * row_groups`.
struct Q8Block {
    codes: *const u8,
    scales: *const u16,
    biases: *const u16,
    /// How the scale and bias bits are read.
    format: ScaleFormat,
    row_bytes: usize,
    row_groups: usize,
    group: usize,
    groups: usize,
}

struct Q8Args {
    m: usize,
    k: usize,
    a: *const f32,
    rs_a: usize,
    /// `[m][groups]`.
    xsum: *const f32,
    rs_out: usize,
    accumulate: bool,
}

// SAFETY: read-only views shared by scoped tasks of one call.
unsafe impl Sync for Q8Block {}
unsafe impl Sync for Q8Args {}

/// Output columns `lo..hi` (weight rows `lo..hi` of the block).
///
/// # Safety
/// The pointers of `args`/`block` cover the ranges checked by [`gemm_nt_q8`]; `out` columns
/// `lo..hi` of the `m` rows are not written concurrently by anyone else.
unsafe fn q8_dispatch(args: &Q8Args, block: &Q8Block, lo: usize, hi: usize, out: *mut f32) {
    match Kernel::detect().instruction_set() {
        // SAFETY (all arms): the detected kernel runs on this CPU; contract forwarded.
        #[cfg(target_arch = "x86_64")]
        InstructionSet::Avx512 => unsafe { q8_avx512(args, block, lo, hi, out) },
        #[cfg(target_arch = "x86_64")]
        InstructionSet::Avx2 => unsafe { q8_avx2(args, block, lo, hi, out) },
        // NEON and FMA are part of every aarch64 CPU: the fused body, vectorized by the compiler.
        #[cfg(target_arch = "aarch64")]
        InstructionSet::Neon => unsafe { q8_body::<true>(args, block, lo, hi, out) },
        _ => unsafe { q8_body::<false>(args, block, lo, hi, out) },
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
unsafe fn q8_avx512(args: &Q8Args, block: &Q8Block, lo: usize, hi: usize, out: *mut f32) {
    // SAFETY: contract forwarded.
    unsafe { q8_body::<true>(args, block, lo, hi, out) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn q8_avx2(args: &Q8Args, block: &Q8Block, lo: usize, hi: usize, out: *mut f32) {
    // SAFETY: contract forwarded.
    unsafe { q8_body::<true>(args, block, lo, hi, out) }
}

#[inline(always)]
unsafe fn q8_body<const FMA: bool>(
    args: &Q8Args,
    block: &Q8Block,
    lo: usize,
    hi: usize,
    out: *mut f32,
) {
    // The scale format is a constant of the tile, as the group size is: matched per group at run
    // time, its widening (for f16 a call into `half`) sat between the accumulators' loops, and
    // the accumulators lived in memory instead of registers.
    // SAFETY (all arms): contract forwarded.
    unsafe {
        match (block.format, block.group) {
            (ScaleFormat::Bf16, 32) => q8_rows::<32, false, FMA>(args, block, lo, hi, out),
            (ScaleFormat::Bf16, 64) => q8_rows::<64, false, FMA>(args, block, lo, hi, out),
            (ScaleFormat::Bf16, _) => q8_rows::<128, false, FMA>(args, block, lo, hi, out),
            (ScaleFormat::F16, 32) => q8_rows::<32, true, FMA>(args, block, lo, hi, out),
            (ScaleFormat::F16, 64) => q8_rows::<64, true, FMA>(args, block, lo, hi, out),
            (ScaleFormat::F16, _) => q8_rows::<128, true, FMA>(args, block, lo, hi, out),
        }
    }
}

/// The f32 value of scale or bias bits in f16 (`F16_SCALES`) or bf16.
#[inline(always)]
fn widen_scale<const F16_SCALES: bool>(bits: u16) -> f32 {
    if F16_SCALES {
        ScaleFormat::F16.to_f32(bits)
    } else {
        ScaleFormat::Bf16.to_f32(bits)
    }
}

/// Left rows per register tile.
const MR: usize = 4;

/// Weight rows `lo..hi` in tiles of 4 (1-2 left rows) or 2 weight rows; each tile is applied to
/// all left rows, [`MR`] at a time, while it is hot in L1 (the weights are read from memory once).
#[inline(always)]
unsafe fn q8_rows<const G: usize, const F16_SCALES: bool, const FMA: bool>(
    args: &Q8Args,
    block: &Q8Block,
    lo: usize,
    hi: usize,
    out: *mut f32,
) {
    let m = args.m;
    let mut j = lo;
    while j < hi {
        let nr = if m <= 2 && hi - j >= 4 {
            4
        } else if hi - j >= 2 {
            2
        } else {
            1
        };
        let mut i0 = 0;
        while i0 < m {
            let mc = (m - i0).min(MR);
            // SAFETY (all arms): contract forwarded (left rows i0..i0 + mc, weight rows j..j + nr).
            unsafe {
                match (mc, nr) {
                    (1, 4) => q8_tile::<1, 4, G, F16_SCALES, FMA>(args, block, i0, j, out),
                    (2, 4) => q8_tile::<2, 4, G, F16_SCALES, FMA>(args, block, i0, j, out),
                    (1, 2) => q8_tile::<1, 2, G, F16_SCALES, FMA>(args, block, i0, j, out),
                    (2, 2) => q8_tile::<2, 2, G, F16_SCALES, FMA>(args, block, i0, j, out),
                    (3, 2) => q8_tile::<3, 2, G, F16_SCALES, FMA>(args, block, i0, j, out),
                    (_, 2) => q8_tile::<4, 2, G, F16_SCALES, FMA>(args, block, i0, j, out),
                    (1, _) => q8_tile::<1, 1, G, F16_SCALES, FMA>(args, block, i0, j, out),
                    (2, _) => q8_tile::<2, 1, G, F16_SCALES, FMA>(args, block, i0, j, out),
                    (3, _) => q8_tile::<3, 1, G, F16_SCALES, FMA>(args, block, i0, j, out),
                    (_, _) => q8_tile::<4, 1, G, F16_SCALES, FMA>(args, block, i0, j, out),
                }
            }
            i0 += mc;
        }
        j += nr;
    }
}

/// Weight tiles ahead of the current one that are prefetched (the hardware prefetcher alone does
/// not keep 4-12 short interleaved row streams at full bandwidth).
const PREFETCH_TILES: usize = 2;

/// Prefetch hint for the `len` bytes at `p` (never faults, any address).
#[inline(always)]
fn prefetch(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let mut off = 0;
        while off < len {
            // SAFETY: prefetch is a hint; it does not access memory architecturally.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    p.wrapping_add(off).cast(),
                )
            };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

#[inline(always)]
fn scale_add<const FMA: bool>(total: &mut [f32; LANES], s: f32, v: &[f32; LANES]) {
    for l in 0..LANES {
        total[l] = if FMA {
            s.mul_add(v[l], total[l])
        } else {
            total[l] + s * v[l]
        };
    }
}

#[inline(always)]
fn u8_lanes(c: &[u8; LANES]) -> [f32; LANES] {
    let mut out = [0f32; LANES];
    for l in 0..LANES {
        out[l] = c[l] as f32;
    }
    out
}

/// Weight rows `j..j + NR` against left rows `i0..i0 + M`.
#[inline(always)]
unsafe fn q8_tile<
    const M: usize,
    const NR: usize,
    const G: usize,
    const F16_SCALES: bool,
    const FMA: bool,
>(
    args: &Q8Args,
    block: &Q8Block,
    i0: usize,
    j: usize,
    out: *mut f32,
) {
    let k = args.k;
    let groups = block.groups;
    let mut x: [&[f32]; M] = [&[]; M];
    let mut xs: [&[f32]; M] = [&[]; M];
    for i in 0..M {
        // SAFETY: left row i holds k values, its group sums `groups` (contract).
        unsafe {
            x[i] = std::slice::from_raw_parts(args.a.add((i0 + i) * args.rs_a), k);
            xs[i] = std::slice::from_raw_parts(args.xsum.add((i0 + i) * groups), groups);
        }
    }
    let mut q: [&[u8]; NR] = [&[]; NR];
    let mut sc: [&[u16]; NR] = [&[]; NR];
    let mut bi: [&[u16]; NR] = [&[]; NR];
    for r in 0..NR {
        // SAFETY: weight row j + r of the block holds k codes and `groups` scales/biases.
        unsafe {
            q[r] = std::slice::from_raw_parts(block.codes.add((j + r) * block.row_bytes), k);
            sc[r] =
                std::slice::from_raw_parts(block.scales.add((j + r) * block.row_groups), groups);
            bi[r] =
                std::slice::from_raw_parts(block.biases.add((j + r) * block.row_groups), groups);
        }
    }
    let mut total = [[[0f32; LANES]; NR]; M];
    let mut bias_part = [[0f32; NR]; M];
    for gi in 0..groups {
        let base = gi * G;
        for row in &q {
            // The same columns of the rows PREFETCH_TILES tiles ahead (rows are contiguous when the
            // block spans whole rows; otherwise this is only a harmless hint).
            prefetch(
                row.as_ptr()
                    .wrapping_add(base + PREFETCH_TILES * NR * block.row_bytes),
                G,
            );
        }
        let mut acc = [[[0f32; LANES]; NR]; M];
        let mut p = base;
        while p < base + G {
            let mut xc: [&[f32; LANES]; M] = [&[0f32; LANES]; M];
            for i in 0..M {
                xc[i] = x[i][p..p + LANES].try_into().expect("lane chunk");
            }
            for r in 0..NR {
                let wc = u8_lanes(q[r][p..p + LANES].try_into().expect("lane chunk"));
                for i in 0..M {
                    fma_lanes::<FMA>(&mut acc[i][r], xc[i], &wc);
                }
            }
            p += LANES;
        }
        for r in 0..NR {
            let (s, b) = (
                widen_scale::<F16_SCALES>(sc[r][gi]),
                widen_scale::<F16_SCALES>(bi[r][gi]),
            );
            for i in 0..M {
                scale_add::<FMA>(&mut total[i][r], s, &acc[i][r]);
                bias_part[i][r] += b * xs[i][gi];
            }
        }
    }
    for i in 0..M {
        for r in 0..NR {
            let v = reduce_lanes(&total[i][r]) + bias_part[i][r];
            // SAFETY: output (i, j + r) is in bounds and owned by this task (contract).
            unsafe {
                let o = out.add((i0 + i) * args.rs_out + j + r);
                *o = if args.accumulate { *o + v } else { v };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signal(n: usize, f: f32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32) * f).sin() + 0.3 * ((i as f32) * f * 3.7).cos())
            .collect()
    }

    /// Scalar f64 reference on the dequantized weights.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        m: usize,
        k: usize,
        n: usize,
        a: &[f32],
        rs_a: usize,
        w: &QuantizedMatrix,
        row0: usize,
        col0: usize,
    ) -> Vec<f32> {
        let deq = w.dequantize_f32();
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let wr = &deq[(row0 + j) * w.cols() + col0..];
                out[i * n + j] = (0..k)
                    .map(|p| a[i * rs_a + p] as f64 * wr[p] as f64)
                    .sum::<f64>() as f32;
            }
        }
        out
    }

    #[test]
    fn q8_gemm_matches_dequantized_reference() {
        // (m, k, n, rs_a, group, rows, cols, row0, col0): full matrices, overlapping left rows,
        // row and column blocks, the tail rows of each tile width, a threaded size.
        let cases = [
            (1, 64, 5, 64, 64, 5, 64, 0, 0),
            (2, 128, 9, 128, 32, 9, 128, 0, 0),
            (3, 256, 7, 64, 64, 7, 256, 0, 0),
            (4, 384, 11, 384, 128, 20, 512, 6, 128),
            (2, 64, 13, 96, 32, 30, 192, 17, 96),
            (2, 512, 1536, 512, 64, 1536, 512, 0, 0),
            (1, 2048, 512, 2048, 64, 512, 2048, 0, 0),
            (7, 192, 9, 64, 64, 9, 192, 0, 0),
            (16, 256, 33, 256, 32, 40, 320, 3, 64),
        ];
        for &(m, k, n, rs_a, g, rows, cols, row0, col0) in &cases {
            let wf = signal(rows * cols, 0.071);
            let w = QuantizedMatrix::quantize(&wf, rows, cols, 8, g).unwrap();
            let a = signal((m - 1) * rs_a + k, 0.13);
            let expected = reference(m, k, n, &a, rs_a, &w, row0, col0);
            let mut out = vec![7f32; m * n];
            gemm_nt_q8(m, k, n, &a, rs_a, &w, row0, col0, &mut out, n, false);
            let tol = 1e-5 * k as f32;
            for (idx, (x, y)) in out.iter().zip(&expected).enumerate() {
                assert!(
                    (x - y).abs() <= tol,
                    "m{m} k{k} n{n} g{g} at {idx}: {x} vs {y}"
                );
            }
            gemm_nt_q8(m, k, n, &a, rs_a, &w, row0, col0, &mut out, n, true);
            for (x, y) in out.iter().zip(&expected) {
                assert!(
                    (x - 2.0 * y).abs() <= 2.0 * tol,
                    "accumulate m{m} k{k} n{n}"
                );
            }
        }
    }

    /// GGUF q8_0 weights (f16 scales) through the same few-row kernel.
    #[test]
    fn q8_gemm_on_q8_0_blocks_matches_dequantized_reference() {
        let (m, k, n) = (3, 256, 9);
        let blocks: Vec<u8> = (0..n * k / 32)
            .flat_map(|b| {
                let d = half::f16::from_f32((b as f32 - 20.0) * 1e-3);
                let codes = (0..32).map(move |j| ((b * 37 + j * 11) % 256) as u8);
                d.to_le_bytes().into_iter().chain(codes)
            })
            .collect();
        let w = QuantizedMatrix::from_q8_0(n, k, &blocks).unwrap();
        let a = signal(m * k, 0.13);
        let expected = reference(m, k, n, &a, k, &w, 0, 0);
        let mut out = vec![7f32; m * n];
        gemm_nt_q8(m, k, n, &a, k, &w, 0, 0, &mut out, n, false);
        for (idx, (x, y)) in out.iter().zip(&expected).enumerate() {
            assert!((x - y).abs() <= 1e-5 * k as f32, "at {idx}: {x} vs {y}");
        }
    }

    #[test]
    fn q8_gemm_writes_only_its_strided_outputs_and_agrees_with_the_reference() {
        let (m, k, n, rs_out) = (2, 128, 6, 10);
        let wf = signal(n * k, 0.05);
        let w = QuantizedMatrix::quantize(&wf, n, k, 8, 64).unwrap();
        let a = signal(m * k, 0.2);
        let mut out = vec![-3f32; (m - 1) * rs_out + n + 4];
        gemm_nt_q8(m, k, n, &a, k, &w, 0, 0, &mut out, rs_out, false);
        let mut qmm = vec![0f32; m * n];
        w.matmul_reference(&a, m, &mut qmm);
        for i in 0..m {
            for j in 0..n {
                let (x, y) = (out[i * rs_out + j], qmm[i * n + j]);
                assert!(
                    (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
                    "({i}, {j}): {x} vs reference {y}"
                );
            }
        }
        assert!(
            out[n..rs_out]
                .iter()
                .chain(&out[rs_out + n..])
                .all(|&v| v == -3.0),
            "gaps untouched"
        );
    }
}
