//! Products of any number of rows against bf16 weights arranged in column panels: Mimi's codebook
//! scoring, where every stream's residual meets each 2048-entry codebook. Each panel holds
//! [`PANEL_COLS`] output columns as `[k][PANEL_COLS]`, so a tile keeps one accumulator vector per
//! (row, panel) and adds one broadcast activation times one widened weight vector per step of `k`:
//! no horizontal sums, no packing at call time, and each weight panel read once per tile of rows.
//! Each output is `Σ_p a_p · w_p` in order of `p`, fused multiply-adds on the SIMD kernels
//! (multiply, then add, on the portable one), whatever the tile shape or the number of rows: a
//! row gets the same bits in a product of one row or of many.

use crate::dense::gemm::{par_ranges, PARALLEL_MIN_MACS};
use crate::elem::{bf16_bits_to_f32, f32_to_bf16_bits};
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use crate::InstructionSet;
use crate::Kernel;

/// Output columns per panel: one AVX-512 vector of f32.
pub const PANEL_COLS: usize = 16;

/// Elements (64 bytes) between one panel's end and the next one's start: a tile reads several
/// panels in step, and panels a multiple of 4 KiB apart would meet in the same L1 sets (one row
/// against 8 panels of the 256-column codebooks ran 4.6x slower than the same work in 4-row
/// calls before this gap).
const PANEL_GAP: usize = 32;

/// A `[n, k]` weight matrix rounded to bf16 (to nearest even) and stored as `n / PANEL_COLS`
/// panels (the last one zero-padded), each `[k][PANEL_COLS]`, [`PANEL_GAP`] elements apart.
#[derive(Clone, Debug)]
pub struct PanelMatrix {
    rows: usize,
    cols: usize,
    /// Elements from one panel's start to the next one's.
    panel_stride: usize,
    panels: Vec<u16>,
}

impl PanelMatrix {
    /// The panels of row-major `w` (`rows` rows of `cols` values).
    ///
    /// # Panics
    /// If `w.len() != rows * cols` (caller bug).
    pub fn from_rows(w: &[f32], rows: usize, cols: usize) -> Self {
        assert_eq!(w.len(), rows * cols, "PanelMatrix: {rows} x {cols} values");
        let panel_stride = PANEL_COLS * cols + PANEL_GAP;
        let mut panels = vec![0u16; rows.div_ceil(PANEL_COLS) * panel_stride];
        for (j, row) in w.chunks_exact(cols.max(1)).enumerate().take(rows) {
            let panel = &mut panels[j / PANEL_COLS * panel_stride..];
            for (p, &v) in row.iter().enumerate() {
                panel[p * PANEL_COLS + j % PANEL_COLS] = f32_to_bf16_bits(v);
            }
        }
        PanelMatrix {
            rows,
            cols,
            panel_stride,
            panels,
        }
    }

    /// Output columns `n` (the weight rows).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Inner dimension `k`.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Weight `(row, col)` as stored (the bf16 value, widened).
    pub fn get(&self, row: usize, col: usize) -> f32 {
        let at = row / PANEL_COLS * self.panel_stride + col * PANEL_COLS + row % PANEL_COLS;
        bf16_bits_to_f32(self.panels[at])
    }

    fn panel_count(&self) -> usize {
        self.rows.div_ceil(PANEL_COLS)
    }
}

/// `out[i * rs_out + j] = Σ_p a[i * rs_a + p] · W[j][p]` for `i < m`, `j < w.rows()`, with
/// [`Kernel::detect`]'s instruction set, the panels split over the [`crate::team`] when large.
///
/// # Panics
/// If a slice is too short for `m` rows at its stride (caller bug).
pub fn gemm_nt_panels(
    m: usize,
    a: &[f32],
    rs_a: usize,
    w: &PanelMatrix,
    out: &mut [f32],
    rs_out: usize,
) {
    gemm_nt_panels_with(Kernel::detect(), m, a, rs_a, w, out, rs_out);
}

/// [`gemm_nt_panels`] with `kernel`'s instruction set (the tests run each one).
///
/// # Panics
/// As [`gemm_nt_panels`].
pub fn gemm_nt_panels_with(
    kernel: Kernel,
    m: usize,
    a: &[f32],
    rs_a: usize,
    w: &PanelMatrix,
    out: &mut [f32],
    rs_out: usize,
) {
    let (n, k) = (w.rows, w.cols);
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        rs_a >= k && a.len() >= (m - 1) * rs_a + k,
        "gemm_nt_panels: left rows too short"
    );
    assert!(
        rs_out >= n && out.len() >= (m - 1) * rs_out + n,
        "gemm_nt_panels: output too short"
    );
    let panels = w.panel_count();
    let call = Call {
        m,
        k,
        n,
        a: a.as_ptr(),
        rs_a,
        w: w.panels.as_ptr(),
        panel_stride: w.panel_stride,
        out: out.as_mut_ptr(),
        rs_out,
    };
    let parts = if m * n * k < PARALLEL_MIN_MACS {
        1
    } else {
        crate::team::threads().min(panels)
    };
    if parts < 2 {
        // SAFETY: the call's slices hold what it reads and writes (asserted above).
        unsafe { run_panels(kernel, &call, 0, panels) };
        return;
    }
    par_ranges(0, panels, parts, &|lo, hi| {
        // SAFETY: as above; each range writes the output columns of its own panels.
        unsafe { run_panels(kernel, &call, lo, hi) };
    });
}

/// One product's operands, shared by the team's ranges of panels.
#[derive(Clone, Copy)]
struct Call {
    m: usize,
    k: usize,
    n: usize,
    a: *const f32,
    rs_a: usize,
    w: *const u16,
    panel_stride: usize,
    out: *mut f32,
    rs_out: usize,
}

// SAFETY: the left rows and panels are read only; each range of panels writes disjoint output
// columns.
unsafe impl Send for Call {}
unsafe impl Sync for Call {}

/// Panels `lo..hi` of `call` in `kernel`'s instruction set.
///
/// # Safety
/// The call's pointers must cover its `m` rows, its panels and its output; the CPU must have the
/// instruction set (it does for a detected or available kernel).
unsafe fn run_panels(kernel: Kernel, call: &Call, lo: usize, hi: usize) {
    // SAFETY (all arms): forwarded contract.
    unsafe {
        match kernel.instruction_set() {
            #[cfg(target_arch = "x86_64")]
            InstructionSet::Avx512 => panels_avx512(call, lo, hi),
            #[cfg(target_arch = "x86_64")]
            InstructionSet::Avx2 => panels_avx2(call, lo, hi),
            #[cfg(target_arch = "aarch64")]
            InstructionSet::Neon => panels_body::<Lanes<true>, 4>(call, lo, hi),
            _ => panels_body::<Lanes<false>, 4>(call, lo, hi),
        }
    }
}

/// AVX-512: 8 (row, panel) accumulators a tile, one register each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn panels_avx512(call: &Call, lo: usize, hi: usize) {
    // SAFETY: forwarded contract.
    unsafe { panels_body::<x86::Avx512, 8>(call, lo, hi) }
}

/// AVX2: 4 accumulators a tile, two registers each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn panels_avx2(call: &Call, lo: usize, hi: usize) {
    // SAFETY: forwarded contract.
    unsafe { panels_body::<x86::Avx2, 4>(call, lo, hi) }
}

/// One panel's worth of f32 lanes (`PANEL_COLS`) in an instruction set: the operations of a
/// tile's step. Implementations are `#[inline(always)]`, compiled into their instruction set's
/// entry point.
trait PanelVector: Copy {
    fn zero() -> Self;
    /// `PANEL_COLS` bf16 values at `at`, widened.
    ///
    /// # Safety
    /// They must be readable; the CPU must have the instruction set.
    unsafe fn widen(at: *const u16) -> Self;
    /// `acc + x · w` lane by lane (fused on the SIMD kernels).
    fn fma(x: f32, w: Self, acc: Self) -> Self;
    /// The first `cols` lanes into `out`.
    fn store(self, out: &mut [f32]);
}

/// The portable and NEON vector: plain lanes the compiler vectorizes, fused when `FMA`.
#[derive(Clone, Copy)]
struct Lanes<const FMA: bool>([f32; PANEL_COLS]);

impl<const FMA: bool> PanelVector for Lanes<FMA> {
    #[inline(always)]
    fn zero() -> Self {
        Lanes([0.0; PANEL_COLS])
    }

    #[inline(always)]
    unsafe fn widen(at: *const u16) -> Self {
        // SAFETY: PANEL_COLS values readable (caller contract).
        let bits = unsafe { &*(at as *const [u16; PANEL_COLS]) };
        Lanes(bits.map(bf16_bits_to_f32))
    }

    #[inline(always)]
    fn fma(x: f32, w: Self, acc: Self) -> Self {
        let mut out = acc.0;
        for (o, w) in out.iter_mut().zip(w.0) {
            *o = if FMA { x.mul_add(w, *o) } else { *o + x * w };
        }
        Lanes(out)
    }

    #[inline(always)]
    fn store(self, out: &mut [f32]) {
        out.copy_from_slice(&self.0[..out.len()]);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The x86 panel vectors, written out: the compiler vectorized the lanes' one-row tile
    //! across `k` with gathers.
    use super::{PanelVector, PANEL_COLS};
    use std::arch::x86_64::*;

    /// One AVX-512 register.
    #[derive(Clone, Copy)]
    pub(super) struct Avx512(__m512);

    impl PanelVector for Avx512 {
        #[inline(always)]
        fn zero() -> Self {
            // SAFETY: only compiled into `panels_avx512` (AVX-512F).
            Avx512(unsafe { _mm512_setzero_ps() })
        }

        #[inline(always)]
        unsafe fn widen(at: *const u16) -> Self {
            // SAFETY: 16 u16 readable; AVX-512F (caller contract).
            unsafe {
                let bits = _mm512_cvtepu16_epi32(_mm256_loadu_si256(at as *const __m256i));
                Avx512(_mm512_castsi512_ps(_mm512_slli_epi32::<16>(bits)))
            }
        }

        #[inline(always)]
        fn fma(x: f32, w: Self, acc: Self) -> Self {
            // SAFETY: as `zero`.
            Avx512(unsafe { _mm512_fmadd_ps(_mm512_set1_ps(x), w.0, acc.0) })
        }

        #[inline(always)]
        fn store(self, out: &mut [f32]) {
            let mask = ((1u32 << out.len().min(PANEL_COLS)) - 1) as __mmask16;
            // SAFETY: as `zero`; the mask covers `out`.
            unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr(), mask, self.0) };
        }
    }

    /// Two AVX2 registers.
    #[derive(Clone, Copy)]
    pub(super) struct Avx2([__m256; 2]);

    impl PanelVector for Avx2 {
        #[inline(always)]
        fn zero() -> Self {
            // SAFETY: only compiled into `panels_avx2` (AVX2, FMA).
            Avx2(unsafe { [_mm256_setzero_ps(); 2] })
        }

        #[inline(always)]
        unsafe fn widen(at: *const u16) -> Self {
            // SAFETY: 16 u16 readable; AVX2 (caller contract).
            unsafe {
                let half = |h: usize| {
                    let bits = _mm256_cvtepu16_epi32(_mm_loadu_si128(at.add(8 * h) as *const _));
                    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(bits))
                };
                Avx2([half(0), half(1)])
            }
        }

        #[inline(always)]
        fn fma(x: f32, w: Self, acc: Self) -> Self {
            // SAFETY: as `zero`.
            unsafe {
                let x = _mm256_set1_ps(x);
                Avx2([
                    _mm256_fmadd_ps(x, w.0[0], acc.0[0]),
                    _mm256_fmadd_ps(x, w.0[1], acc.0[1]),
                ])
            }
        }

        #[inline(always)]
        fn store(self, out: &mut [f32]) {
            let mut lanes = [0f32; PANEL_COLS];
            // SAFETY: as `zero`; 16 floats of room.
            unsafe {
                _mm256_storeu_ps(lanes.as_mut_ptr(), self.0[0]);
                _mm256_storeu_ps(lanes.as_mut_ptr().add(8), self.0[1]);
            }
            let cols = out.len();
            out.copy_from_slice(&lanes[..cols]);
        }
    }
}

/// Panels `lo..hi` in groups of `CHAINS` (8 or 4): each group meets the rows in tiles of `CHAINS`
/// (row, panel) accumulators, as many rows as there are (up to `CHAINS`) times as many panels as
/// fit, so that one row still keeps `CHAINS` independent sums in flight.
///
/// # Safety
/// As [`run_panels`].
#[inline(always)]
unsafe fn panels_body<V: PanelVector, const CHAINS: usize>(call: &Call, lo: usize, hi: usize) {
    let mut p0 = lo;
    while p0 < hi {
        let group = (hi - p0).min(CHAINS);
        let mut i = 0;
        while i < call.m {
            let rows = (call.m - i).min(CHAINS);
            // SAFETY (all arms): rows i..i + rows and panels p0..p0 + group exist.
            i += unsafe {
                match (CHAINS, rows) {
                    (8, 8) => tiles::<V, 8, 1>(call, i, p0, group),
                    (8, 4..) => tiles::<V, 4, 2>(call, i, p0, group),
                    (8, 2..) => tiles::<V, 2, 4>(call, i, p0, group),
                    (8, _) => tiles::<V, 1, 8>(call, i, p0, group),
                    (_, 4..) => tiles::<V, 4, 1>(call, i, p0, group),
                    (_, 2..) => tiles::<V, 2, 2>(call, i, p0, group),
                    _ => tiles::<V, 1, 4>(call, i, p0, group),
                }
            };
        }
        p0 += group;
    }
}

/// Rows `i..i + MR` against panels `p0..p0 + group`, `NP` panels a tile (the last ones one at a
/// time). Returns `MR`.
///
/// # Safety
/// As [`run_panels`], for those rows and panels.
#[inline(always)]
unsafe fn tiles<V: PanelVector, const MR: usize, const NP: usize>(
    call: &Call,
    i: usize,
    p0: usize,
    group: usize,
) -> usize {
    let mut p = p0;
    while p + NP <= p0 + group {
        // SAFETY: forwarded.
        unsafe { tile::<V, MR, NP>(call, i, p) };
        p += NP;
    }
    while p < p0 + group {
        // SAFETY: forwarded.
        unsafe { tile::<V, MR, 1>(call, i, p) };
        p += 1;
    }
    MR
}

/// Rows `i..i + MR` against panels `p..p + NP`: `MR · NP` accumulator vectors over the whole `k`.
///
/// # Safety
/// As [`run_panels`], for those rows and panels.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // index loops keep the accumulators in registers
unsafe fn tile<V: PanelVector, const MR: usize, const NP: usize>(call: &Call, i: usize, p: usize) {
    let mut acc = [[V::zero(); NP]; MR];
    for step in 0..call.k {
        let mut w = [V::zero(); NP];
        for q in 0..NP {
            // SAFETY: step `step` of panel p + q (PANEL_COLS values).
            w[q] = unsafe { V::widen(call.w.add((p + q) * call.panel_stride + step * PANEL_COLS)) };
        }
        for r in 0..MR {
            // SAFETY: element `step` of row i + r.
            let x = unsafe { *call.a.add((i + r) * call.rs_a + step) };
            for q in 0..NP {
                acc[r][q] = V::fma(x, w[q], acc[r][q]);
            }
        }
    }
    for r in 0..MR {
        for q in 0..NP {
            let first = (p + q) * PANEL_COLS;
            let cols = call.n.saturating_sub(first).min(PANEL_COLS);
            // SAFETY: output row i + r holds columns first..first + cols.
            let out = unsafe {
                std::slice::from_raw_parts_mut(call.out.add((i + r) * call.rs_out + first), cols)
            };
            acc[r][q].store(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The product as the module docs define it, one output at a time.
    fn reference(m: usize, a: &[f32], w: &PanelMatrix, fused: bool) -> Vec<f32> {
        let (n, k) = (w.rows(), w.cols());
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0f32;
                for p in 0..k {
                    let (x, v) = (a[i * k + p], w.get(j, p));
                    s = if fused { x.mul_add(v, s) } else { s + x * v };
                }
                out[i * n + j] = s;
            }
        }
        out
    }

    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
            })
            .collect()
    }

    #[test]
    fn the_panels_hold_each_weight_rounded_to_bf16() {
        let (n, k) = (37, 9);
        let w = values(n * k, 1);
        let panels = PanelMatrix::from_rows(&w, n, k);
        for j in 0..n {
            for p in 0..k {
                let expect = bf16_bits_to_f32(f32_to_bf16_bits(w[j * k + p]));
                assert_eq!(panels.get(j, p).to_bits(), expect.to_bits(), "({j}, {p})");
            }
        }
    }

    #[test]
    fn every_kernel_gives_each_row_the_reference_bits_at_any_row_count() {
        for (n, k) in [(16, 1), (33, 7), (2048, 256), (100, 64), (5, 300)] {
            let w = PanelMatrix::from_rows(&values(n * k, n as u64), n, k);
            for m in [1, 2, 3, 5, 8, 9, 17] {
                let a = values(m * k, (m * 31 + k) as u64);
                for kernel in Kernel::available() {
                    let fused = kernel.instruction_set() != crate::InstructionSet::Portable;
                    let expect = reference(m, &a, &w, fused);
                    let mut got = vec![f32::NAN; m * n];
                    gemm_nt_panels_with(kernel, m, &a, k, &w, &mut got, n);
                    let same = got
                        .iter()
                        .zip(&expect)
                        .all(|(g, e)| g.to_bits() == e.to_bits());
                    assert!(same, "{kernel:?}: m {m}, n {n}, k {k}");
                }
            }
        }
    }

    #[test]
    fn strided_rows_leave_the_gaps_untouched() {
        let (m, n, k) = (3, 20, 5);
        let w = PanelMatrix::from_rows(&values(n * k, 7), n, k);
        let a = values(m * k, 8);
        let mut strided_a = vec![f32::NAN; (m - 1) * 8 + k];
        for i in 0..m {
            strided_a[i * 8..i * 8 + k].copy_from_slice(&a[i * k..(i + 1) * k]);
        }
        let mut out = vec![-1f32; (m - 1) * 25 + n];
        gemm_nt_panels(m, &strided_a, 8, &w, &mut out, 25);
        let mut dense = vec![0f32; m * n];
        gemm_nt_panels(m, &a, k, &w, &mut dense, n);
        for i in 0..m {
            assert_eq!(&out[i * 25..i * 25 + n], &dense[i * n..(i + 1) * n]);
            if i + 1 < m {
                assert!(out[i * 25 + n..(i + 1) * 25].iter().all(|&v| v == -1.0));
            }
        }
    }
}
