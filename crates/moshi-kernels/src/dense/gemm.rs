//! Dense f32 and bf16 products of a few to many left rows against row-major weights (PyTorch's
//! `[out, in]` layout): Mimi's convolutions and projections. Up to [`SMALL_M`] left rows stream
//! each weight row once with fused multiply-adds (the memory-bound per-frame case); more rows go to
//! `matrixmultiply`'s packed sgemm. Large products split their output over the [`crate::team`].

use crate::elem::{reduce_lanes, WeightElem, LANES};
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use crate::InstructionSet;
use crate::Kernel;

/// `out[m, n] = x[m, k] · w[n, k]ᵀ` (+ `out` if `accumulate`), with `w` row-major `[n, k]`
/// as stored in PyTorch checkpoints.
pub fn matmul_t(
    x: &[f32],
    m: usize,
    k: usize,
    w: &[f32],
    n: usize,
    out: &mut [f32],
    accumulate: bool,
) {
    debug_assert!(x.len() >= m * k && w.len() >= n * k && out.len() >= m * n);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            out[..m * n].fill(0.0);
        }
        return;
    }
    let beta = if accumulate { 1.0 } else { 0.0 };
    // SAFETY: the slices cover the strided ranges checked above; `out` does not alias `x`/`w`.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            x.as_ptr(),
            k as isize,
            1,
            w.as_ptr(),
            1,
            k as isize,
            beta,
            out.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// Work (multiply-adds) under which a product stays on the calling thread.
pub(crate) const PARALLEL_MIN_MACS: usize = 1 << 18;

/// A row-strided f32 product against row-major weights, the kernel behind Mimi's convolutions:
/// `out[i * rs_out + j] (+)= Σ_p a[i * rs_a + p] · w[j * rs_w + p * cs_w]` for `i < m`, `j < n`, `p < k`.
/// Rows of `a` may overlap (`rs_a < k`): a causal convolution over a channels-last buffer reads its
/// windows in place this way, without an im2col copy. Splits the work over the [`crate::team`] when large.
///
/// Panics if a slice is too short for the strides (an internal invariant, never user input).
#[allow(clippy::too_many_arguments)]
pub fn gemm_nt_strided(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    rs_a: usize,
    w: &[f32],
    rs_w: usize,
    cs_w: usize,
    out: &mut [f32],
    rs_out: usize,
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(rs_out >= n, "output rows overlap: rs_out {rs_out} < n {n}");
    assert!(out.len() >= (m - 1) * rs_out + n, "output slice too short");
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                out[i * rs_out..i * rs_out + n].fill(0.0);
            }
        }
        return;
    }
    assert!(a.len() >= (m - 1) * rs_a + k, "lhs slice too short");
    assert!(
        w.len() > (n - 1) * rs_w + (k - 1) * cs_w,
        "weight slice too short"
    );
    let macs = m * n * k;
    let threads = crate::team::threads();
    if macs < PARALLEL_MIN_MACS || threads < 2 {
        // SAFETY: bounds asserted above; `out` is a unique borrow so it cannot alias `a`/`w`.
        unsafe {
            gemm_raw(
                m,
                k,
                n,
                a.as_ptr(),
                rs_a,
                w.as_ptr(),
                rs_w,
                cs_w,
                out.as_mut_ptr(),
                rs_out,
                accumulate,
            )
        };
        return;
    }
    let parts = threads
        .min(if m >= n {
            m.div_ceil(16)
        } else {
            n.div_ceil(16)
        })
        .max(1);
    let (ap, wp, op) = (
        SendPtr(a.as_ptr() as *mut f32),
        SendPtr(w.as_ptr() as *mut f32),
        SendPtr(out.as_mut_ptr()),
    );
    let split_rows = m >= n;
    let total = if split_rows { m } else { n };
    par_ranges(0, total, parts, &|lo, hi| {
        let (ap, wp, op) = (ap, wp, op);
        // SAFETY: each range writes a disjoint block of rows (or columns) of `out`, all inside
        // the ranges asserted above.
        unsafe {
            if split_rows {
                gemm_raw(
                    hi - lo,
                    k,
                    n,
                    ap.0.add(lo * rs_a),
                    rs_a,
                    wp.0,
                    rs_w,
                    cs_w,
                    op.0.add(lo * rs_out),
                    rs_out,
                    accumulate,
                );
            } else {
                gemm_raw(
                    m,
                    k,
                    hi - lo,
                    ap.0,
                    rs_a,
                    wp.0.add(lo * rs_w),
                    rs_w,
                    cs_w,
                    op.0.add(lo),
                    rs_out,
                    accumulate,
                );
            }
        }
    });
}

/// Runs `f` over `parts` near-equal sub-ranges of `lo..hi` on the persistent [`crate::team`]
/// (no thread wake-up and sleep per product).
pub(crate) fn par_ranges(lo: usize, hi: usize, parts: usize, f: &(dyn Fn(usize, usize) + Sync)) {
    crate::team::run_ranges(lo, hi, parts, f);
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: used only to hand disjoint output blocks and shared read-only inputs to scoped tasks.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

/// # Safety
/// The strided ranges must be in bounds and `out` must not alias `a` or `w`.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_raw(
    m: usize,
    k: usize,
    n: usize,
    a: *const f32,
    rs_a: usize,
    w: *const f32,
    rs_w: usize,
    cs_w: usize,
    out: *mut f32,
    rs_out: usize,
    accumulate: bool,
) {
    if m <= SMALL_M && cs_w == 1 {
        // SAFETY: forwarded caller contract.
        unsafe { small_m_nt(m, k, n, a, rs_a, w, rs_w, out, rs_out, accumulate) };
        return;
    }
    if n == 1 && cs_w == 1 && rs_out == 1 {
        // One output column (e.g. a convolution to mono PCM): a matrix-vector product with the
        // left rows as the streamed matrix, instead of packing all of `a` for a 1-column sgemm.
        // SAFETY: forwarded caller contract; out[j] for j < m is out[j * rs_out] with rs_out 1.
        unsafe { small_m_nt(1, k, m, w, k, a, rs_a, out, 1, accumulate) };
        return;
    }
    let beta = if accumulate { 1.0 } else { 0.0 };
    // SAFETY: forwarded caller contract. B = wᵀ is [k, n] with strides (cs_w, rs_w).
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a,
            rs_a as isize,
            1,
            w,
            cs_w as isize,
            rs_w as isize,
            beta,
            out,
            rs_out as isize,
            1,
        );
    }
}

/// Like [`gemm_nt_strided`] with contiguous weight rows stored as bf16 bits, for at most
/// `SMALL_M` left rows (the memory-bound per-frame case: half the weight bytes of f32).
#[allow(clippy::too_many_arguments)]
pub fn gemm_nt_bf16(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    rs_a: usize,
    w: &[u16],
    rs_w: usize,
    out: &mut [f32],
    rs_out: usize,
    accumulate: bool,
) {
    assert!(
        m <= SMALL_M,
        "gemm_nt_bf16 takes at most {SMALL_M} rows, got {m}"
    );
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        rs_out >= n && out.len() >= (m - 1) * rs_out + n,
        "output slice too short"
    );
    assert!(
        k > 0 && a.len() >= (m - 1) * rs_a + k,
        "lhs slice too short"
    );
    assert!(w.len() >= (n - 1) * rs_w + k, "weight slice too short");
    let threads = crate::team::threads();
    if m * n * k < PARALLEL_MIN_MACS || threads < 2 {
        // SAFETY: bounds asserted above.
        unsafe {
            small_m_nt(
                m,
                k,
                n,
                a.as_ptr(),
                rs_a,
                w.as_ptr(),
                rs_w,
                out.as_mut_ptr(),
                rs_out,
                accumulate,
            )
        };
        return;
    }
    let parts = threads.min(n.div_ceil(16));
    let (ap, wp, op) = (
        SendPtr(a.as_ptr() as *mut f32),
        SendPtrU16(w.as_ptr() as *mut u16),
        SendPtr(out.as_mut_ptr()),
    );
    par_ranges(0, n, parts, &|lo, hi| {
        let (ap, wp, op) = (ap, wp, op);
        // SAFETY: disjoint output columns per range, all in the asserted ranges.
        unsafe {
            small_m_nt(
                m,
                k,
                hi - lo,
                ap.0,
                rs_a,
                wp.0.add(lo * rs_w),
                rs_w,
                op.0.add(lo),
                rs_out,
                accumulate,
            )
        };
    });
}

#[derive(Clone, Copy)]
struct SendPtrU16(*mut u16);
// SAFETY: shared read-only weights handed to scoped tasks.
unsafe impl Send for SendPtrU16 {}
unsafe impl Sync for SendPtrU16 {}

/// Rows of the left operand up to which the weight-streaming kernel beats a packed sgemm. Each
/// output's summation order depends on which of the two runs, not on the row count: up to this
/// many rows a row gets the same bits for any row count, and above it too (the sgemm sums every
/// output over `k` in the same blocks wherever its tile lies).
pub const SMALL_M: usize = 4;

/// `out = a · wᵀ` for at most [`SMALL_M`] rows: streams each weight row once, no packing (the
/// transformer and quantizer projections at 1-2 tokens per frame are memory-bound matrix-vector work).
///
/// # Safety
/// Same contract as [`gemm_raw`], with `m <= SMALL_M` and contiguous weight rows.
#[allow(clippy::too_many_arguments)]
unsafe fn small_m_nt<W: WeightElem>(
    m: usize,
    k: usize,
    n: usize,
    a: *const f32,
    rs_a: usize,
    w: *const W,
    rs_w: usize,
    out: *mut f32,
    rs_out: usize,
    accumulate: bool,
) {
    match Kernel::detect().instruction_set() {
        // SAFETY (all arms): the detected kernel runs on this CPU; caller contract forwarded.
        #[cfg(target_arch = "x86_64")]
        InstructionSet::Avx512 => unsafe {
            small_m_nt_avx512(m, k, n, a, rs_a, w, rs_w, out, rs_out, accumulate)
        },
        #[cfg(target_arch = "x86_64")]
        InstructionSet::Avx2 => unsafe {
            small_m_nt_avx2(m, k, n, a, rs_a, w, rs_w, out, rs_out, accumulate)
        },
        // NEON and FMA are part of every aarch64 CPU: the fused body, vectorized by the compiler.
        #[cfg(target_arch = "aarch64")]
        InstructionSet::Neon => unsafe {
            small_m_nt_body::<W, true>(m, k, n, a, rs_a, w, rs_w, out, rs_out, accumulate)
        },
        _ => unsafe {
            small_m_nt_body::<W, false>(m, k, n, a, rs_a, w, rs_w, out, rs_out, accumulate)
        },
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn small_m_nt_avx512<W: WeightElem>(
    m: usize,
    k: usize,
    n: usize,
    a: *const f32,
    rs_a: usize,
    w: *const W,
    rs_w: usize,
    out: *mut f32,
    rs_out: usize,
    accumulate: bool,
) {
    // SAFETY: caller contract forwarded.
    unsafe { small_m_nt_body::<W, true>(m, k, n, a, rs_a, w, rs_w, out, rs_out, accumulate) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn small_m_nt_avx2<W: WeightElem>(
    m: usize,
    k: usize,
    n: usize,
    a: *const f32,
    rs_a: usize,
    w: *const W,
    rs_w: usize,
    out: *mut f32,
    rs_out: usize,
    accumulate: bool,
) {
    // SAFETY: caller contract forwarded.
    unsafe { small_m_nt_body::<W, true>(m, k, n, a, rs_a, w, rs_w, out, rs_out, accumulate) }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn small_m_nt_body<W: WeightElem, const FMA: bool>(
    m: usize,
    k: usize,
    n: usize,
    a: *const f32,
    rs_a: usize,
    w: *const W,
    rs_w: usize,
    out: *mut f32,
    rs_out: usize,
    accumulate: bool,
) {
    // SAFETY (all arms): caller contract forwarded.
    unsafe {
        match m {
            1 => small_m_fixed::<W, 1, FMA>(k, n, a, rs_a, w, rs_w, out, rs_out, accumulate),
            2 => small_m_fixed::<W, 2, FMA>(k, n, a, rs_a, w, rs_w, out, rs_out, accumulate),
            3 => small_m_fixed::<W, 3, FMA>(k, n, a, rs_a, w, rs_w, out, rs_out, accumulate),
            _ => small_m_fixed::<W, 4, FMA>(k, n, a, rs_a, w, rs_w, out, rs_out, accumulate),
        }
    }
}

/// Weight rows processed together (independent memory streams and accumulator chains).
const NR: usize = 4;

/// `acc += x · w` lane by lane (fused when `FMA`).
#[inline(always)]
pub(crate) fn fma_lanes<const FMA: bool>(
    acc: &mut [f32; LANES],
    x: &[f32; LANES],
    w: &[f32; LANES],
) {
    for l in 0..LANES {
        acc[l] = if FMA {
            x[l].mul_add(w[l], acc[l])
        } else {
            acc[l] + x[l] * w[l]
        };
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn small_m_fixed<W: WeightElem, const M: usize, const FMA: bool>(
    k: usize,
    n: usize,
    a: *const f32,
    rs_a: usize,
    w: *const W,
    rs_w: usize,
    out: *mut f32,
    rs_out: usize,
    accumulate: bool,
) {
    let mut rows: [&[f32]; M] = [&[]; M];
    for (i, r) in rows.iter_mut().enumerate() {
        // SAFETY: row i of `a` holds k values (caller contract).
        *r = unsafe { std::slice::from_raw_parts(a.add(i * rs_a), k) };
    }
    let full = k - k % LANES;
    let store = |i: usize, j: usize, s: f32| {
        // SAFETY: element (i, j) of `out` is in bounds (caller contract).
        unsafe {
            let o = out.add(i * rs_out + j);
            *o = if accumulate { *o + s } else { s };
        }
    };
    let mut j = 0;
    while j + NR <= n {
        let mut wr: [&[W]; NR] = [&[]; NR];
        for (r, wrow) in wr.iter_mut().enumerate() {
            // SAFETY: weight row j + r holds k values (caller contract).
            *wrow = unsafe { std::slice::from_raw_parts(w.add((j + r) * rs_w), k) };
        }
        let mut acc = [[[0f32; LANES]; NR]; M];
        let mut p = 0;
        while p < full {
            let mut xc: [&[f32; LANES]; M] = [&[0f32; LANES]; M];
            for i in 0..M {
                xc[i] = rows[i][p..p + LANES].try_into().expect("lane chunk");
            }
            for r in 0..NR {
                let wc = W::lanes(&wr[r][p..p + LANES]);
                for i in 0..M {
                    fma_lanes::<FMA>(&mut acc[i][r], xc[i], &wc);
                }
            }
            p += LANES;
        }
        for i in 0..M {
            for r in 0..NR {
                let mut s = reduce_lanes(&acc[i][r]);
                for q in full..k {
                    s += rows[i][q] * wr[r][q].to_f32();
                }
                store(i, j + r, s);
            }
        }
        j += NR;
    }
    while j < n {
        // SAFETY: weight row j holds k values (caller contract).
        let wrow = unsafe { std::slice::from_raw_parts(w.add(j * rs_w), k) };
        let mut acc = [[0f32; LANES]; M];
        let mut p = 0;
        while p < full {
            let wc = W::lanes(&wrow[p..p + LANES]);
            for i in 0..M {
                let xc: &[f32; LANES] = rows[i][p..p + LANES].try_into().expect("lane chunk");
                fma_lanes::<FMA>(&mut acc[i], xc, &wc);
            }
            p += LANES;
        }
        for i in 0..M {
            let mut s = reduce_lanes(&acc[i]);
            for q in full..k {
                s += rows[i][q] * wrow[q].to_f32();
            }
            store(i, j, s);
        }
        j += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elem::f32_to_bf16_bits;

    #[allow(clippy::too_many_arguments)]
    fn naive_strided(
        m: usize,
        k: usize,
        n: usize,
        a: &[f32],
        rs_a: usize,
        w: &[f32],
        rs_w: usize,
        cs_w: usize,
    ) -> Vec<f32> {
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k)
                    .map(|p| a[i * rs_a + p] as f64 * w[j * rs_w + p * cs_w] as f64)
                    .sum::<f64>() as f32;
            }
        }
        out
    }

    #[test]
    fn gemm_nt_strided_matches_scalar_reference() {
        // small-m kernel, packed sgemm, overlapping lhs rows, strided weights, parallel split
        for &(m, k, n, rs_a, cs_w) in &[
            (300, 448, 1, 64, 1),
            (2000, 448, 1, 64, 1),
            (1, 37, 5, 37, 1),
            (2, 64, 33, 64, 1),
            (4, 100, 7, 50, 1),
            (9, 24, 12, 6, 1),
            (3, 8, 5, 8, 3),
            (200, 96, 64, 48, 1),
            (2, 512, 1536, 512, 1),
            (3, 40, 9, 40, 1),
            (1, 300, 2051, 300, 1),
        ] {
            let a: Vec<f32> = (0..(m - 1) * rs_a + k)
                .map(|i| (i as f32 * 0.13).sin())
                .collect();
            let rs_w = if cs_w == 1 { k } else { 1 };
            let wlen = (n - 1) * rs_w + (k - 1) * cs_w + 1;
            let w: Vec<f32> = (0..wlen).map(|i| (i as f32 * 0.071).cos()).collect();
            let reference = naive_strided(m, k, n, &a, rs_a, &w, rs_w, cs_w);
            let mut out = vec![1f32; m * n];
            gemm_nt_strided(m, k, n, &a, rs_a, &w, rs_w, cs_w, &mut out, n, false);
            let tol = 1e-4 * (k as f32).sqrt();
            for (x, y) in out.iter().zip(&reference) {
                assert!((x - y).abs() < tol, "m{m} k{k} n{n}: {x} vs {y}");
            }
            gemm_nt_strided(m, k, n, &a, rs_a, &w, rs_w, cs_w, &mut out, n, true);
            for (x, y) in out.iter().zip(&reference) {
                assert!((x - 2.0 * y).abs() < 2.0 * tol, "accumulate m{m} k{k} n{n}");
            }
        }
    }

    #[test]
    fn gemm_bf16_matches_f32_on_rounded_weights() {
        for &(m, k, n) in &[(1, 37, 5), (2, 512, 1536), (4, 64, 9), (3, 100, 33)] {
            let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.13).sin()).collect();
            let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.071).cos()).collect();
            let w16: Vec<u16> = w.iter().map(|&x| f32_to_bf16_bits(x)).collect();
            let rounded: Vec<f32> = w16.iter().map(|&b| b.to_f32()).collect();
            for (x, r) in w.iter().zip(&rounded) {
                assert!((x - r).abs() <= x.abs() / 256.0);
            }
            let reference = naive_strided(m, k, n, &a, k, &rounded, k, 1);
            let mut out = vec![0f32; m * n];
            gemm_nt_bf16(m, k, n, &a, k, &w16, k, &mut out, n, false);
            let tol = 1e-4 * (k as f32).sqrt();
            for (x, y) in out.iter().zip(&reference) {
                assert!((x - y).abs() < tol, "m{m} k{k} n{n}: {x} vs {y}");
            }
        }
        assert_eq!(f32_to_bf16_bits(1.0), 0x3F80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3F80_8000)), 0x3F80); // tie -> even
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3F81_8000)), 0x3F82);
    }

    #[test]
    fn matmul_t_matches_naive() {
        let (m, k, n) = (3, 5, 4);
        let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut out = vec![0f32; m * n];
        matmul_t(&x, m, k, &w, n, &mut out, false);
        for i in 0..m {
            for j in 0..n {
                let r: f32 = (0..k).map(|t| x[i * k + t] * w[j * k + t]).sum();
                assert!((out[i * n + j] - r).abs() < 1e-5);
            }
        }
    }
}
