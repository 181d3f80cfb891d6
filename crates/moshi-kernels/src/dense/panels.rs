//! Products of any number of rows against weights arranged in column panels, f32, bf16, bf16
//! pairs or MLX 8-bit: Mimi's products (its transformers, its convolutions, its codebook scoring) for one
//! stream or many stacked. Each panel holds [`PANEL_COLS`] output columns as
//! `[k][PANEL_COLS]`, so a tile keeps one accumulator vector per (row, panel) and adds one
//! broadcast activation times one widened weight vector per step of `k`: no horizontal sums, no
//! packing at call time, each weight panel read once per tile of rows.
//!
//! Each output is, in this order, with fused multiply-adds on the SIMD kernels (multiply, then
//! add, on the portable one):
//! - f32 and bf16: `Σ_p a_p · w_p` over `p` in order;
//! - 8-bit (codes `q`, per group `g` of columns a scale `s_g` and bias `b_g`): per group in
//!   order, `total = s_g · (Σ_{p∈g} a_p · q_p) + total`, then `total = Σ_{p∈g} a_p · b_g + total`
//!   (the group's activation sum summed in order first), the dequantized weights' product,
//!   regrouped;
//! - bf16 pairs (weights and activations both rounded to bf16, subnormals to signed zero), per
//!   pair of columns in order, `total = total + a_{2t+1} · w_{2t+1}`, then `total = total + a_{2t}
//!   · w_{2t}`, each step rounded once and a subnormal result flushed to zero: what AVX512-BF16's
//!   `vdpbf16ps` computes (twice f32's multiply-adds a cycle), emulated lane by lane elsewhere;
//!
//! whatever the tile shape and the number of rows: a row gets the same bits in a product of one
//! row or of many.

use crate::dense::gemm::{par_ranges, PARALLEL_MIN_MACS};
use crate::elem::{bf16_bits_to_f32, f32_to_bf16_bits};
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use crate::InstructionSet;
use crate::{Kernel, QuantizedMatrix};

/// Output columns per panel: one AVX-512 vector of f32.
pub const PANEL_COLS: usize = 16;

/// Bytes between one panel's end and the next one's start: a tile reads several panels in step,
/// and panels a multiple of 4 KiB apart would meet in the same L1 sets.
const PANEL_GAP_BYTES: usize = 64;

/// A `[n, k]` weight matrix as panels of [`PANEL_COLS`] rows (the last one zero-padded), each
/// `[k][PANEL_COLS]`, 64 bytes apart.
#[derive(Clone, Debug)]
pub struct PanelMatrix {
    rows: usize,
    cols: usize,
    /// Elements from one panel's start to the next one's.
    panel_stride: usize,
    codes: PanelCodes,
}

/// The elements of a [`PanelMatrix`].
#[derive(Clone, Debug)]
enum PanelCodes {
    F32(Vec<f32>),
    /// bf16 bits.
    Bf16(Vec<u16>),
    /// bf16 bits ([`bf16_pair_operand`]), each lane's columns `2t, 2t + 1` side by side.
    Bf16Pairs(Vec<u16>),
    /// MLX 8-bit codes in groups of `group` columns; `factors` holds per panel and group the
    /// scales of its 16 rows, then their biases (f32, widened exactly).
    Q8 {
        codes: Vec<u8>,
        group: usize,
        factors: Vec<f32>,
    },
}

impl PanelMatrix {
    /// The panels of row-major `w` (`rows` rows of `cols` values), exact.
    ///
    /// # Panics
    /// If `w.len() != rows * cols` (caller bug).
    pub fn f32(w: &[f32], rows: usize, cols: usize) -> Self {
        assert_eq!(w.len(), rows * cols, "PanelMatrix: {rows} x {cols} values");
        let (panel_stride, panels) = arrange(rows, cols, |j, p| w[j * cols + p]);
        PanelMatrix {
            rows,
            cols,
            panel_stride,
            codes: PanelCodes::F32(panels),
        }
    }

    /// The panels of row-major `w` (`rows` rows of `cols` values) rounded to bf16 (to nearest
    /// even).
    ///
    /// # Panics
    /// If `w.len() != rows * cols` (caller bug).
    pub fn bf16(w: &[f32], rows: usize, cols: usize) -> Self {
        assert_eq!(w.len(), rows * cols, "PanelMatrix: {rows} x {cols} values");
        let (panel_stride, panels) = arrange(rows, cols, |j, p| f32_to_bf16_bits(w[j * cols + p]));
        PanelMatrix {
            rows,
            cols,
            panel_stride,
            codes: PanelCodes::Bf16(panels),
        }
    }

    /// The panels of row-major `w` (`rows` rows of an even number `cols` of values) as bf16
    /// pairs ([`bf16_pair_operand`]): the products then round their activations to bf16 too
    /// (the module's pair order).
    ///
    /// # Panics
    /// If `w.len() != rows * cols` or `cols` is odd (caller bugs).
    pub fn bf16_pairs(w: &[f32], rows: usize, cols: usize) -> Self {
        assert_eq!(w.len(), rows * cols, "PanelMatrix: {rows} x {cols} values");
        assert!(
            cols.is_multiple_of(2),
            "PanelMatrix: bf16 pairs need even columns, got {cols}"
        );
        let element = |j: usize, p: usize| bf16_pair_operand(w[j * cols + p]);
        let (panel_stride, panels) = arrange_pairs(rows, cols, element);
        PanelMatrix {
            rows,
            cols,
            panel_stride,
            codes: PanelCodes::Bf16Pairs(panels),
        }
    }

    /// The panels of an 8-bit [`QuantizedMatrix`] (the same codes, scales and biases).
    ///
    /// # Panics
    /// If `q` does not have 8 bits (caller bug).
    pub fn q8(q: &QuantizedMatrix) -> Self {
        assert_eq!(q.bits(), 8, "PanelMatrix::q8 takes 8-bit weights");
        let (rows, cols, group) = (q.rows(), q.cols(), q.group_size());
        let groups = cols / group;
        let (panel_stride, codes) = arrange(rows, cols, |j, p| q.code(j, p) as u8);
        let mut factors = vec![0f32; rows.div_ceil(PANEL_COLS) * groups * 2 * PANEL_COLS];
        let format = q.scale_format();
        for j in 0..rows {
            let (panel, lane) = (j / PANEL_COLS, j % PANEL_COLS);
            for g in 0..groups {
                let at = (panel * groups + g) * 2 * PANEL_COLS + lane;
                factors[at] = format.to_f32(q.scales()[j * groups + g]);
                factors[at + PANEL_COLS] = format.to_f32(q.biases()[j * groups + g]);
            }
        }
        PanelMatrix {
            rows,
            cols,
            panel_stride,
            codes: PanelCodes::Q8 {
                codes,
                group,
                factors,
            },
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

    /// Columns per 8-bit group, or 2 for bf16 pairs: a block's columns must be whole groups (1
    /// for f32 and bf16).
    pub fn group_size(&self) -> usize {
        match &self.codes {
            PanelCodes::F32(_) | PanelCodes::Bf16(_) => 1,
            PanelCodes::Bf16Pairs(_) => 2,
            PanelCodes::Q8 { group, .. } => *group,
        }
    }

    /// Weight bytes one full product reads.
    pub fn weight_bytes(&self) -> usize {
        match &self.codes {
            PanelCodes::F32(v) => v.len() * 4,
            PanelCodes::Bf16(v) | PanelCodes::Bf16Pairs(v) => v.len() * 2,
            PanelCodes::Q8 { codes, factors, .. } => codes.len() + factors.len() * 4,
        }
    }

    /// The weights as the products use them, row-major `[rows][cols]`.
    pub fn to_rows(&self) -> Vec<f32> {
        (0..self.rows * self.cols)
            .map(|i| self.get(i / self.cols, i % self.cols))
            .collect()
    }

    /// Weight `(row, col)` as the products use it (bf16 widened, or `q · s + b` for 8-bit codes).
    pub fn get(&self, row: usize, col: usize) -> f32 {
        let (panel, lane) = (row / PANEL_COLS, row % PANEL_COLS);
        let at = panel * self.panel_stride + col * PANEL_COLS + lane;
        match &self.codes {
            PanelCodes::F32(v) => v[at],
            PanelCodes::Bf16(v) => bf16_bits_to_f32(v[at]),
            PanelCodes::Bf16Pairs(v) => {
                bf16_bits_to_f32(v[panel * self.panel_stride + pair_offset(col, lane)])
            }
            PanelCodes::Q8 {
                codes,
                group,
                factors,
            } => {
                let f = (panel * (self.cols / group) + col / group) * 2 * PANEL_COLS + lane;
                codes[at] as f32 * factors[f] + factors[f + PANEL_COLS]
            }
        }
    }
}

/// The `rows` x `cols` elements `element(row, col)` in panels: the panel stride (elements) and
/// the panels.
fn arrange<E: Copy + Default>(
    rows: usize,
    cols: usize,
    element: impl Fn(usize, usize) -> E,
) -> (usize, Vec<E>) {
    let panel_stride = PANEL_COLS * cols + PANEL_GAP_BYTES / std::mem::size_of::<E>();
    let mut panels = vec![E::default(); rows.div_ceil(PANEL_COLS) * panel_stride];
    for j in 0..rows {
        let panel = &mut panels[j / PANEL_COLS * panel_stride..];
        for p in 0..cols {
            panel[p * PANEL_COLS + j % PANEL_COLS] = element(j, p);
        }
    }
    (panel_stride, panels)
}

/// Where column `col` of lane `lane` lies in a panel of bf16 pairs: the lanes' pairs of columns
/// `col & !1` and `col | 1` side by side, one 64-byte vector a pair.
fn pair_offset(col: usize, lane: usize) -> usize {
    (col & !1) * PANEL_COLS + 2 * lane + (col & 1)
}

/// [`arrange`] for bf16 pairs: the same panels, each lane's pair of columns adjacent.
fn arrange_pairs(
    rows: usize,
    cols: usize,
    element: impl Fn(usize, usize) -> u16,
) -> (usize, Vec<u16>) {
    let panel_stride = PANEL_COLS * cols + PANEL_GAP_BYTES / 2;
    let mut panels = vec![0u16; rows.div_ceil(PANEL_COLS) * panel_stride];
    for j in 0..rows {
        let panel = &mut panels[j / PANEL_COLS * panel_stride..];
        for p in 0..cols {
            panel[pair_offset(p, j % PANEL_COLS)] = element(j, p);
        }
    }
    (panel_stride, panels)
}

/// `x` rounded to bf16 as the pair products read their operands: to nearest even
/// ([`f32_to_bf16_bits`]), a subnormal to a zero of its sign (`vdpbf16ps` reads subnormal inputs
/// as zero; flushing them first makes every kernel's inputs the same).
#[inline]
pub fn bf16_pair_operand(x: f32) -> u16 {
    if x.is_subnormal() {
        return ((x.to_bits() >> 16) & 0x8000) as u16;
    }
    f32_to_bf16_bits(x)
}

/// One step of a pair product as `vdpbf16ps` takes it, for the activation pair `x` and the
/// weight pair `w` (bf16 bits, the even column in the low half): `acc + x₁ · w₁` then `+ x₀ ·
/// w₀`, each rounded once (the products are exact in f32), a subnormal sum flushed to a zero of
/// its sign.
#[inline(always)]
pub fn bf16_pair_step(x: u32, w: u32, acc: f32) -> f32 {
    let high = |v: u32| f32::from_bits(v & 0xFFFF_0000);
    let low = |v: u32| f32::from_bits(v << 16);
    let flush = |v: f32| {
        if v.is_subnormal() {
            0f32.copysign(v)
        } else {
            v
        }
    };
    let acc = flush(high(x).mul_add(high(w), acc));
    flush(low(x).mul_add(low(w), acc))
}

/// Whether [`Kernel`]'s bf16 pair products run natively (AVX-512 with AVX512-BF16's
/// `vdpbf16ps`): elsewhere they are emulated lane by lane, exact but slower than f32 panels.
pub fn bf16_pairs_native(kernel: Kernel) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        kernel.instruction_set() == InstructionSet::Avx512
            && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = kernel;
        false
    }
}

/// The block of a [`PanelMatrix`] a product reads: weight rows `row0..row0 + n` (the output
/// columns) and columns `col0..col0 + k` (8-bit panels: whole groups).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PanelBlock {
    pub row0: usize,
    pub n: usize,
    pub col0: usize,
    pub k: usize,
}

impl PanelBlock {
    /// The whole matrix.
    pub fn all(w: &PanelMatrix) -> Self {
        PanelBlock {
            row0: 0,
            n: w.rows,
            col0: 0,
            k: w.cols,
        }
    }
}

/// `out[i * rs_out + j] (+)= Σ_p a[i * rs_a + p] · W[row0 + j][col0 + p]` for `i < m`, `j < n`,
/// `p < k` (the block), in the module's order, with [`Kernel::detect`]'s instruction set, the
/// panels split over the [`crate::team`] when large. Rows of `a` may overlap (`rs_a < k`).
///
/// # Panics
/// If the block is outside the matrix or (8-bit) not group-aligned, or a slice is too short for
/// `m` rows at its stride (caller bugs).
#[allow(clippy::too_many_arguments)] // the strided operands of Mimi's convolutions, as in `gemm`
pub fn gemm_nt_panels(
    m: usize,
    a: &[f32],
    rs_a: usize,
    w: &PanelMatrix,
    block: PanelBlock,
    out: &mut [f32],
    rs_out: usize,
    accumulate: bool,
) {
    gemm_nt_panels_with(
        Kernel::detect(),
        m,
        a,
        rs_a,
        w,
        block,
        out,
        rs_out,
        accumulate,
    );
}

/// [`gemm_nt_panels`] with `kernel`'s instruction set (the tests run each one).
///
/// # Panics
/// As [`gemm_nt_panels`].
#[allow(clippy::too_many_arguments)]
pub fn gemm_nt_panels_with(
    kernel: Kernel,
    m: usize,
    a: &[f32],
    rs_a: usize,
    w: &PanelMatrix,
    block: PanelBlock,
    out: &mut [f32],
    rs_out: usize,
    accumulate: bool,
) {
    let PanelBlock { row0, n, col0, k } = block;
    assert!(
        row0 + n <= w.rows && col0 + k <= w.cols,
        "gemm_nt_panels: block outside the {} x {} matrix",
        w.rows,
        w.cols
    );
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        a.len() >= (m - 1) * rs_a + k,
        "gemm_nt_panels: left rows too short"
    );
    assert!(
        rs_out >= n && out.len() >= (m - 1) * rs_out + n,
        "gemm_nt_panels: output too short"
    );
    // f32 and bf16: the block's columns as one group.
    let (kind, codes, group, factors) = match &w.codes {
        PanelCodes::F32(v) => (F32, v.as_ptr() as *const u8, k.max(1), std::ptr::null()),
        PanelCodes::Bf16(v) => (BF16, v.as_ptr() as *const u8, k.max(1), std::ptr::null()),
        PanelCodes::Bf16Pairs(v) => {
            assert!(
                col0.is_multiple_of(2) && k.is_multiple_of(2),
                "gemm_nt_panels: columns {col0}..{} not whole pairs",
                col0 + k
            );
            (PAIRS, v.as_ptr() as *const u8, k.max(2), std::ptr::null())
        }
        PanelCodes::Q8 {
            codes,
            group,
            factors,
        } => {
            assert!(
                col0.is_multiple_of(*group) && k.is_multiple_of(*group),
                "gemm_nt_panels: columns {col0}..{} not whole groups of {group}",
                col0 + k
            );
            (Q8, codes.as_ptr(), *group, factors.as_ptr())
        }
    };
    SCRATCH.with(|cell| {
        let Scratch { xsum, pairs } = &mut *cell.borrow_mut();
        xsum.clear();
        if kind == Q8 {
            for i in 0..m {
                let row = &a[i * rs_a..i * rs_a + k];
                xsum.extend(row.chunks_exact(group).map(|g| g.iter().sum::<f32>()));
            }
        }
        let rs_pairs = if kind == PAIRS {
            round_pair_operands(bf16_pairs_native(kernel), m, a, rs_a, k, pairs)
        } else {
            0
        };
        let call = Call {
            m,
            block,
            a: a.as_ptr(),
            rs_a,
            pairs: pairs.as_ptr(),
            rs_pairs,
            codes,
            panel_stride: w.panel_stride,
            group,
            groups: w.cols / group,
            factors,
            xsum: xsum.as_ptr(),
            out: out.as_mut_ptr(),
            rs_out,
            accumulate,
        };
        let (first, end) = (row0 / PANEL_COLS, (row0 + n).div_ceil(PANEL_COLS));
        let threads = if m * n * k < PARALLEL_MIN_MACS {
            1
        } else {
            crate::team::threads()
        };
        if threads < 2 {
            // SAFETY: the call's slices hold what it reads and writes (asserted above).
            unsafe { run_panels(kernel, kind, &call, first, end) };
        } else if end - first >= threads || m < 2 * CHAINS_MAX {
            par_ranges(first, end, threads.min(end - first), &|lo, hi| {
                // SAFETY: as above; each range writes the output columns of its own panels.
                unsafe { run_panels(kernel, kind, &call, lo, hi) };
            });
        } else {
            // Fewer panels than threads (the first convolutions: 32 or 64 columns, hundreds of
            // rows): the rows split instead, in whole tiles.
            let tiles = m.div_ceil(CHAINS_MAX);
            par_ranges(0, tiles, threads.min(tiles), &|lo, hi| {
                let rows = lo * CHAINS_MAX..(hi * CHAINS_MAX).min(m);
                // SAFETY: as above; each range writes its own output rows.
                unsafe { run_panels(kernel, kind, &call.rows(rows), first, end) };
            });
        }
    });
}

/// Per-thread scratch of the products' prepared activations (no allocation per call in steady
/// state).
#[derive(Default)]
struct Scratch {
    /// The 8-bit products' group sums.
    xsum: Vec<f32>,
    /// The pair products' activations as [`bf16_pair_operand`]s.
    pairs: Vec<u16>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// Rounds the `m` rows of `k` activations (`rs_a` apart) into `pairs` as
/// [`bf16_pair_operand`]s (with `vcvtneps2bf16` where `native`) and returns their stride there:
/// overlapping rows (convolution windows, `rs_a <= k`) keep their layout, one conversion per
/// element; rows with gaps are packed.
fn round_pair_operands(
    native: bool,
    m: usize,
    a: &[f32],
    rs_a: usize,
    k: usize,
    pairs: &mut Vec<u16>,
) -> usize {
    pairs.clear();
    if rs_a <= k {
        let span = &a[..(m - 1) * rs_a + k];
        pairs.resize(span.len(), 0);
        round_slice(native, span, pairs);
        return rs_a;
    }
    pairs.resize(m * k, 0);
    for (i, dst) in pairs.chunks_exact_mut(k).enumerate() {
        round_slice(native, &a[i * rs_a..i * rs_a + k], dst);
    }
    k
}

/// `dst[i] = bf16_pair_operand(src[i])`, 16 at a time with `vcvtneps2bf16` where `native`.
fn round_slice(native: bool, src: &[f32], dst: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if native {
        // SAFETY: `native` means the CPU has AVX-512F and AVX512-BF16.
        return unsafe { x86::round_avx512bf16(src, dst) };
    }
    let _ = native;
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = bf16_pair_operand(x);
    }
}

/// One product's operands, shared by the team's ranges of panels.
#[derive(Clone, Copy)]
struct Call {
    m: usize,
    block: PanelBlock,
    a: *const f32,
    rs_a: usize,
    /// Pair products: the activations rounded ([`round_pair_operands`]), `rs_pairs` apart.
    pairs: *const u16,
    rs_pairs: usize,
    /// The panels' first byte (f32, bf16, bf16 pairs or 8-bit codes).
    codes: *const u8,
    /// Elements from one panel to the next.
    panel_stride: usize,
    /// Columns per group (f32, bf16 and bf16 pairs: the block's `k`, one group).
    group: usize,
    /// Groups per weight row (8-bit).
    groups: usize,
    /// 8-bit: per panel and group, 16 scales then 16 biases; null for f32 and bf16.
    factors: *const f32,
    /// 8-bit: `[m][k / group]` activation sums of the block's groups.
    xsum: *const f32,
    out: *mut f32,
    rs_out: usize,
    accumulate: bool,
}

impl Call {
    /// The same product restricted to left rows `rows`.
    fn rows(&self, rows: std::ops::Range<usize>) -> Call {
        let groups_in_block = self.block.k / self.group;
        Call {
            m: rows.len(),
            a: self.a.wrapping_add(rows.start * self.rs_a),
            pairs: self.pairs.wrapping_add(rows.start * self.rs_pairs),
            xsum: self.xsum.wrapping_add(rows.start * groups_in_block),
            out: self.out.wrapping_add(rows.start * self.rs_out),
            ..*self
        }
    }
}

/// The most left rows a tile takes (the AVX-512 tiles'), the unit of a split by rows.
const CHAINS_MAX: usize = 8;

// SAFETY: the left rows, panels and sums are read only; each range of panels (or of rows)
// writes disjoint outputs.
unsafe impl Send for Call {}
unsafe impl Sync for Call {}

/// The element kinds of the panels, as the kernels' const parameter.
const F32: u8 = 0;
const BF16: u8 = 1;
const Q8: u8 = 2;
const PAIRS: u8 = 3;

/// Panels `lo..hi` of `call`, elements of `kind`, in `kernel`'s instruction set.
///
/// # Safety
/// The call's pointers must cover its `m` rows, its panels and its output; the CPU must have the
/// instruction set (it does for a detected or available kernel).
unsafe fn run_panels(kernel: Kernel, kind: u8, call: &Call, lo: usize, hi: usize) {
    if kind == PAIRS {
        // SAFETY: forwarded contract (the native kernel only where the CPU has it).
        unsafe {
            #[cfg(target_arch = "x86_64")]
            if bf16_pairs_native(kernel) {
                return panels_avx512bf16(call, lo, hi);
            }
            return panels_body::<Lanes<true>, PAIRS, 4>(call, lo, hi);
        }
    }
    // SAFETY (all arms): forwarded contract.
    unsafe {
        match (kernel.instruction_set(), kind) {
            #[cfg(target_arch = "x86_64")]
            (InstructionSet::Avx512, F32) => panels_avx512::<F32>(call, lo, hi),
            #[cfg(target_arch = "x86_64")]
            (InstructionSet::Avx512, BF16) => panels_avx512::<BF16>(call, lo, hi),
            #[cfg(target_arch = "x86_64")]
            (InstructionSet::Avx512, _) => panels_avx512::<Q8>(call, lo, hi),
            #[cfg(target_arch = "x86_64")]
            (InstructionSet::Avx2, F32) => panels_avx2::<F32>(call, lo, hi),
            #[cfg(target_arch = "x86_64")]
            (InstructionSet::Avx2, BF16) => panels_avx2::<BF16>(call, lo, hi),
            #[cfg(target_arch = "x86_64")]
            (InstructionSet::Avx2, _) => panels_avx2::<Q8>(call, lo, hi),
            #[cfg(target_arch = "aarch64")]
            (InstructionSet::Neon, F32) => panels_body::<Lanes<true>, F32, 4>(call, lo, hi),
            #[cfg(target_arch = "aarch64")]
            (InstructionSet::Neon, BF16) => panels_body::<Lanes<true>, BF16, 4>(call, lo, hi),
            #[cfg(target_arch = "aarch64")]
            (InstructionSet::Neon, _) => panels_body::<Lanes<true>, Q8, 4>(call, lo, hi),
            (_, F32) => panels_body::<Lanes<false>, F32, 4>(call, lo, hi),
            (_, BF16) => panels_body::<Lanes<false>, BF16, 4>(call, lo, hi),
            _ => panels_body::<Lanes<false>, Q8, 4>(call, lo, hi),
        }
    }
}

/// AVX-512: 8 (row, panel) accumulators a tile, one register each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn panels_avx512<const KIND: u8>(call: &Call, lo: usize, hi: usize) {
    // SAFETY: forwarded contract.
    unsafe { panels_body::<x86::Avx512, KIND, 8>(call, lo, hi) }
}

/// AVX-512 with AVX512-BF16: the pair products, 8 accumulators a tile.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16,avx2,fma")]
unsafe fn panels_avx512bf16(call: &Call, lo: usize, hi: usize) {
    // SAFETY: forwarded contract.
    unsafe { panels_body::<x86::Avx512, PAIRS, 8>(call, lo, hi) }
}

/// AVX2: 4 accumulators a tile, two registers each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn panels_avx2<const KIND: u8>(call: &Call, lo: usize, hi: usize) {
    // SAFETY: forwarded contract.
    unsafe { panels_body::<x86::Avx2, KIND, 4>(call, lo, hi) }
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
    unsafe fn widen_bf16(at: *const u16) -> Self;
    /// `PANEL_COLS` unsigned bytes at `at`, as f32.
    ///
    /// # Safety
    /// As [`PanelVector::widen_bf16`].
    unsafe fn widen_u8(at: *const u8) -> Self;
    /// `PANEL_COLS` f32 at `at`.
    ///
    /// # Safety
    /// As [`PanelVector::widen_bf16`].
    unsafe fn load(at: *const f32) -> Self;
    /// `acc + x · w` lane by lane (fused on the SIMD kernels).
    fn fma(x: f32, w: Self, acc: Self) -> Self;
    /// `acc + x · w` lane by lane, `x` a vector.
    fn fma_lanes(x: Self, w: Self, acc: Self) -> Self;

    /// `PANEL_COLS` bf16 pairs at `at` (any alignment), each lane's pair as the bits of its f32.
    ///
    /// # Safety
    /// As [`PanelVector::widen_bf16`].
    #[inline(always)]
    unsafe fn load_pairs(at: *const u16) -> Self {
        // SAFETY: 32 bf16 readable (caller contract).
        let pairs = unsafe { (at as *const [u32; PANEL_COLS]).read_unaligned() };
        let lanes = pairs.map(f32::from_bits);
        // SAFETY: 16 floats readable.
        unsafe { Self::load(lanes.as_ptr()) }
    }

    /// [`bf16_pair_step`] lane by lane: `w`'s lanes hold bf16 pairs (their bits), `x` one pair.
    #[inline(always)]
    fn dot_bf16_pairs(x: u32, w: Self, acc: Self) -> Self {
        let (w, acc) = (w.to_array(), acc.to_array());
        let lanes: [f32; PANEL_COLS] =
            std::array::from_fn(|l| bf16_pair_step(x, w[l].to_bits(), acc[l]));
        // SAFETY: 16 floats readable.
        unsafe { Self::load(lanes.as_ptr()) }
    }

    #[inline(always)]
    fn to_array(self) -> [f32; PANEL_COLS] {
        let mut lanes = [0f32; PANEL_COLS];
        // SAFETY: 16 floats of room; the implementations run in their instruction set's code.
        unsafe { self.store(lanes.as_mut_ptr()) };
        lanes
    }

    /// The lanes to `PANEL_COLS` f32 at `at`.
    ///
    /// # Safety
    /// They must be writable; the CPU must have the instruction set.
    unsafe fn store(self, at: *mut f32);
}

/// The portable and NEON vector: plain lanes the compiler vectorizes, fused when `FMA`.
#[derive(Clone, Copy)]
struct Lanes<const FMA: bool>([f32; PANEL_COLS]);

impl<const FMA: bool> Lanes<FMA> {
    #[inline(always)]
    fn madd(x: f32, w: f32, acc: f32) -> f32 {
        if FMA {
            x.mul_add(w, acc)
        } else {
            acc + x * w
        }
    }
}

impl<const FMA: bool> PanelVector for Lanes<FMA> {
    #[inline(always)]
    fn zero() -> Self {
        Lanes([0.0; PANEL_COLS])
    }

    #[inline(always)]
    unsafe fn widen_bf16(at: *const u16) -> Self {
        // SAFETY: PANEL_COLS values readable (caller contract).
        let bits = unsafe { &*(at as *const [u16; PANEL_COLS]) };
        Lanes(bits.map(bf16_bits_to_f32))
    }

    #[inline(always)]
    unsafe fn widen_u8(at: *const u8) -> Self {
        // SAFETY: PANEL_COLS values readable (caller contract).
        let codes = unsafe { &*(at as *const [u8; PANEL_COLS]) };
        Lanes(codes.map(f32::from))
    }

    #[inline(always)]
    unsafe fn load(at: *const f32) -> Self {
        // SAFETY: PANEL_COLS values readable (caller contract).
        Lanes(unsafe { *(at as *const [f32; PANEL_COLS]) })
    }

    #[inline(always)]
    fn fma(x: f32, w: Self, acc: Self) -> Self {
        Self::fma_lanes(Lanes([x; PANEL_COLS]), w, acc)
    }

    #[inline(always)]
    fn fma_lanes(x: Self, w: Self, acc: Self) -> Self {
        Lanes(std::array::from_fn(|l| {
            Self::madd(x.0[l], w.0[l], acc.0[l])
        }))
    }

    #[inline(always)]
    unsafe fn store(self, at: *mut f32) {
        // SAFETY: PANEL_COLS values writable (caller contract).
        unsafe { *(at as *mut [f32; PANEL_COLS]) = self.0 };
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The x86 panel vectors, written out: the compiler vectorized the lanes' one-row tile
    //! across `k` with gathers.
    use super::PanelVector;
    use std::arch::x86_64::*;

    /// [`super::round_slice`] with `vcvtneps2bf16`, which rounds to nearest even, reads
    /// subnormals as zero and quiets NaNs as [`super::bf16_pair_operand`] does.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX512-BF16.
    #[target_feature(enable = "avx512f,avx512bf16,avx2")]
    pub(super) unsafe fn round_avx512bf16(src: &[f32], dst: &mut [u16]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: elements i..i + 16 of both slices exist.
            unsafe {
                let rounded = _mm512_cvtneps_pbh(_mm512_loadu_ps(src.as_ptr().add(i)));
                let bits: __m256i = std::mem::transmute(rounded);
                _mm256_storeu_si256(dst.as_mut_ptr().add(i) as *mut __m256i, bits);
            }
            i += 16;
        }
        for j in i..n {
            dst[j] = super::bf16_pair_operand(src[j]);
        }
    }

    /// One AVX-512 register.
    #[derive(Clone, Copy)]
    pub(super) struct Avx512(__m512);

    // SAFETY (every `unsafe` block of this impl): only compiled into `panels_avx512` (AVX-512F);
    // the loads read what their caller's contract makes readable.
    impl PanelVector for Avx512 {
        #[inline(always)]
        fn zero() -> Self {
            Avx512(unsafe { _mm512_setzero_ps() })
        }

        #[inline(always)]
        unsafe fn widen_bf16(at: *const u16) -> Self {
            unsafe {
                let bits = _mm512_cvtepu16_epi32(_mm256_loadu_si256(at as *const __m256i));
                Avx512(_mm512_castsi512_ps(_mm512_slli_epi32::<16>(bits)))
            }
        }

        #[inline(always)]
        unsafe fn widen_u8(at: *const u8) -> Self {
            unsafe {
                let codes = _mm512_cvtepu8_epi32(_mm_loadu_si128(at as *const __m128i));
                Avx512(_mm512_cvtepi32_ps(codes))
            }
        }

        #[inline(always)]
        unsafe fn load(at: *const f32) -> Self {
            Avx512(unsafe { _mm512_loadu_ps(at) })
        }

        #[inline(always)]
        fn fma(x: f32, w: Self, acc: Self) -> Self {
            Avx512(unsafe { _mm512_fmadd_ps(_mm512_set1_ps(x), w.0, acc.0) })
        }

        #[inline(always)]
        fn fma_lanes(x: Self, w: Self, acc: Self) -> Self {
            Avx512(unsafe { _mm512_fmadd_ps(x.0, w.0, acc.0) })
        }

        #[inline(always)]
        unsafe fn load_pairs(at: *const u16) -> Self {
            Avx512(unsafe { _mm512_loadu_ps(at as *const f32) })
        }

        /// `vdpbf16ps` (only reached from `panels_avx512bf16`, which has AVX512-BF16).
        #[inline(always)]
        fn dot_bf16_pairs(x: u32, w: Self, acc: Self) -> Self {
            unsafe {
                let w: __m512bh = std::mem::transmute(w.0);
                let x: __m512bh = std::mem::transmute(_mm512_set1_epi32(x as i32));
                Avx512(_mm512_dpbf16_ps(acc.0, w, x))
            }
        }

        #[inline(always)]
        unsafe fn store(self, at: *mut f32) {
            unsafe { _mm512_storeu_ps(at, self.0) };
        }
    }

    /// Two AVX2 registers.
    #[derive(Clone, Copy)]
    pub(super) struct Avx2([__m256; 2]);

    // SAFETY (every `unsafe` block of this impl): only compiled into `panels_avx2` (AVX2, FMA);
    // the loads read what their caller's contract makes readable.
    impl PanelVector for Avx2 {
        #[inline(always)]
        fn zero() -> Self {
            Avx2(unsafe { [_mm256_setzero_ps(); 2] })
        }

        #[inline(always)]
        unsafe fn widen_bf16(at: *const u16) -> Self {
            unsafe {
                let half = |h: usize| {
                    let bits = _mm256_cvtepu16_epi32(_mm_loadu_si128(at.add(8 * h) as *const _));
                    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(bits))
                };
                Avx2([half(0), half(1)])
            }
        }

        #[inline(always)]
        unsafe fn widen_u8(at: *const u8) -> Self {
            unsafe {
                let half = |h: usize| {
                    let codes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(at.add(8 * h) as *const _));
                    _mm256_cvtepi32_ps(codes)
                };
                Avx2([half(0), half(1)])
            }
        }

        #[inline(always)]
        unsafe fn load(at: *const f32) -> Self {
            unsafe { Avx2([_mm256_loadu_ps(at), _mm256_loadu_ps(at.add(8))]) }
        }

        #[inline(always)]
        fn fma(x: f32, w: Self, acc: Self) -> Self {
            Self::fma_lanes(Avx2(unsafe { [_mm256_set1_ps(x); 2] }), w, acc)
        }

        #[inline(always)]
        fn fma_lanes(x: Self, w: Self, acc: Self) -> Self {
            unsafe {
                Avx2([
                    _mm256_fmadd_ps(x.0[0], w.0[0], acc.0[0]),
                    _mm256_fmadd_ps(x.0[1], w.0[1], acc.0[1]),
                ])
            }
        }

        #[inline(always)]
        unsafe fn store(self, at: *mut f32) {
            unsafe {
                _mm256_storeu_ps(at, self.0[0]);
                _mm256_storeu_ps(at.add(8), self.0[1]);
            }
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
unsafe fn panels_body<V: PanelVector, const KIND: u8, const CHAINS: usize>(
    call: &Call,
    lo: usize,
    hi: usize,
) {
    let mut p0 = lo;
    while p0 < hi {
        let group = (hi - p0).min(CHAINS);
        let mut i = 0;
        while i < call.m {
            let rows = (call.m - i).min(CHAINS);
            // SAFETY (all arms): rows i..i + rows and panels p0..p0 + group exist.
            i += unsafe {
                match (CHAINS, rows) {
                    (8, 8) => tiles::<V, KIND, 8, 1>(call, i, p0, group),
                    (8, 4..) => tiles::<V, KIND, 4, 2>(call, i, p0, group),
                    (8, 2..) => tiles::<V, KIND, 2, 4>(call, i, p0, group),
                    (8, _) => tiles::<V, KIND, 1, 8>(call, i, p0, group),
                    (_, 4..) => tiles::<V, KIND, 4, 1>(call, i, p0, group),
                    (_, 2..) => tiles::<V, KIND, 2, 2>(call, i, p0, group),
                    _ => tiles::<V, KIND, 1, 4>(call, i, p0, group),
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
unsafe fn tiles<V: PanelVector, const KIND: u8, const MR: usize, const NP: usize>(
    call: &Call,
    i: usize,
    p0: usize,
    group: usize,
) -> usize {
    let mut p = p0;
    while p + NP <= p0 + group {
        // SAFETY: forwarded.
        unsafe { tile::<V, KIND, MR, NP>(call, i, p) };
        p += NP;
    }
    while p < p0 + group {
        // SAFETY: forwarded.
        unsafe { tile::<V, KIND, MR, 1>(call, i, p) };
        p += 1;
    }
    MR
}

/// Rows `i..i + MR` against panels `p..p + NP` over the block's columns, a group at a time:
/// `MR · NP` accumulator vectors for the group's sums and as many for the totals.
///
/// # Safety
/// As [`run_panels`], for those rows and panels.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // index loops keep the accumulators in registers
unsafe fn tile<V: PanelVector, const KIND: u8, const MR: usize, const NP: usize>(
    call: &Call,
    i: usize,
    p: usize,
) {
    let (k, col0, group) = (call.block.k, call.block.col0, call.group);
    if KIND == PAIRS {
        // SAFETY: forwarded.
        let total = unsafe { pair_sums::<V, MR, NP>(call, i, p) };
        for r in 0..MR {
            for q in 0..NP {
                // SAFETY: forwarded (row i + r of the output, the panel's columns in the block).
                unsafe { store(call, i + r, p + q, total[r][q]) };
            }
        }
        return;
    }
    let mut total = [[V::zero(); NP]; MR];
    for g in 0..k / group {
        let mut acc = [[V::zero(); NP]; MR];
        for col in col0 + g * group..col0 + (g + 1) * group {
            let mut w = [V::zero(); NP];
            for q in 0..NP {
                let at = (p + q) * call.panel_stride + col * PANEL_COLS;
                // SAFETY: column `col` of panel p + q (PANEL_COLS codes).
                w[q] = unsafe {
                    match KIND {
                        F32 => V::load((call.codes as *const f32).add(at)),
                        BF16 => V::widen_bf16((call.codes as *const u16).add(at)),
                        _ => V::widen_u8(call.codes.add(at)),
                    }
                };
            }
            for r in 0..MR {
                // SAFETY: element `col - col0` of row i + r.
                let x = unsafe { *call.a.add((i + r) * call.rs_a + col - col0) };
                for q in 0..NP {
                    acc[r][q] = V::fma(x, w[q], acc[r][q]);
                }
            }
        }
        if KIND != Q8 {
            total = acc;
            continue;
        }
        for q in 0..NP {
            let at = ((p + q) * call.groups + col0 / group + g) * 2 * PANEL_COLS;
            // SAFETY: the panel's scales and biases of group col0 / group + g.
            let (scales, biases) = unsafe {
                (
                    V::load(call.factors.add(at)),
                    V::load(call.factors.add(at + PANEL_COLS)),
                )
            };
            for r in 0..MR {
                // SAFETY: the group sum of row i + r.
                let xsum = unsafe { *call.xsum.add((i + r) * (k / group) + g) };
                total[r][q] = V::fma_lanes(scales, acc[r][q], total[r][q]);
                total[r][q] = V::fma(xsum, biases, total[r][q]);
            }
        }
    }
    for r in 0..MR {
        for q in 0..NP {
            // SAFETY: forwarded (row i + r of the output, the panel's columns in the block).
            unsafe { store(call, i + r, p + q, total[r][q]) };
        }
    }
}

/// The pair products' sums of rows `i..i + MR` against panels `p..p + NP` over the block's
/// columns, a pair at a time.
///
/// # Safety
/// As [`run_panels`], for those rows and panels.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // index loops keep the accumulators in registers
unsafe fn pair_sums<V: PanelVector, const MR: usize, const NP: usize>(
    call: &Call,
    i: usize,
    p: usize,
) -> [[V; NP]; MR] {
    let (k, col0) = (call.block.k, call.block.col0);
    let mut acc = [[V::zero(); NP]; MR];
    let mut col = col0;
    while col < col0 + k {
        let mut w = [V::zero(); NP];
        for q in 0..NP {
            let at = (p + q) * call.panel_stride + col * PANEL_COLS;
            // SAFETY: the pair of columns `col, col + 1` of panel p + q (32 bf16, read as bits).
            w[q] = unsafe { V::load_pairs((call.codes as *const u16).add(at)) };
        }
        for r in 0..MR {
            // SAFETY: elements `col - col0` and the next of row i + r's rounded activations.
            let x = unsafe {
                let at = call.pairs.add((i + r) * call.rs_pairs + col - col0);
                (at as *const u32).read_unaligned()
            };
            for q in 0..NP {
                acc[r][q] = V::dot_bf16_pairs(x, w[q], acc[r][q]);
            }
        }
        col += 2;
    }
    acc
}

/// Writes (or adds) panel `panel`'s lanes into output row `row`, those of weight rows inside the
/// block.
///
/// # Safety
/// Output row `row` must hold the block's `n` columns.
#[inline(always)]
unsafe fn store<V: PanelVector>(call: &Call, row: usize, panel: usize, v: V) {
    let PanelBlock { row0, n, .. } = call.block;
    let first = (panel * PANEL_COLS).max(row0);
    let end = ((panel + 1) * PANEL_COLS).min(row0 + n);
    let at = row * call.rs_out + first - row0;
    if end - first == PANEL_COLS && first == panel * PANEL_COLS {
        // SAFETY: the panel's 16 columns lie inside output row `row`.
        unsafe {
            let out = call.out.add(at);
            let v = if call.accumulate {
                V::fma(1.0, V::load(out), v)
            } else {
                v
            };
            v.store(out);
        }
        return;
    }
    let lanes = v.to_array();
    for j in first..end {
        // SAFETY: column j - row0 < n of output row `row`.
        let out = unsafe { &mut *call.out.add(row * call.rs_out + j - row0) };
        let v = lanes[j - panel * PANEL_COLS];
        *out = if call.accumulate { *out + v } else { v };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pair product of `x` and weight row `r` (columns from `col0`), as the module docs
    /// define it.
    fn pair_reference(x: &[f32], w: &PanelMatrix, r: usize, col0: usize) -> f32 {
        let pair =
            |lo: f32, hi: f32| (bf16_pair_operand(hi) as u32) << 16 | bf16_pair_operand(lo) as u32;
        (0..x.len() / 2).fold(0.0, |total, t| {
            let (c, p) = (col0 + 2 * t, 2 * t);
            let weights = pair(w.get(r, c), w.get(r, c + 1));
            bf16_pair_step(pair(x[p], x[p + 1]), weights, total)
        })
    }

    /// The product as the module docs define it, one output at a time, from the bf16 values or
    /// the 8-bit matrix `q` itself.
    fn reference(
        m: usize,
        a: &[f32],
        rs_a: usize,
        w: &PanelMatrix,
        q: Option<&QuantizedMatrix>,
        block: PanelBlock,
        fused: bool,
    ) -> Vec<f32> {
        let madd = |x: f32, y: f32, acc: f32| {
            if fused {
                x.mul_add(y, acc)
            } else {
                acc + x * y
            }
        };
        let PanelBlock { row0, n, col0, k } = block;
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            let x = &a[i * rs_a..i * rs_a + k];
            for j in 0..n {
                let r = row0 + j;
                out[i * n + j] = match q {
                    None if w.group_size() == 2 => pair_reference(x, w, r, col0),
                    None => (0..k).fold(0.0, |s, p| madd(x[p], w.get(r, col0 + p), s)),
                    Some(q) => {
                        let g = q.group_size();
                        let groups = q.cols() / g;
                        let mut total = 0f32;
                        for g0 in (0..k).step_by(g) {
                            let c0 = col0 + g0;
                            let factor =
                                |v: &[u16]| q.scale_format().to_f32(v[r * groups + c0 / g]);
                            let (scale, bias) = (factor(q.scales()), factor(q.biases()));
                            let sum = (0..g)
                                .fold(0.0, |s, p| madd(x[g0 + p], q.code(r, c0 + p) as f32, s));
                            let xsum: f32 = x[g0..g0 + g].iter().sum();
                            total = madd(scale, sum, total);
                            total = madd(xsum, bias, total);
                        }
                        total
                    }
                };
            }
        }
        out
    }

    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed | 1;
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
    fn bf16_panels_hold_each_weight_rounded_to_bf16() {
        let (n, k) = (37, 9);
        let w = values(n * k, 1);
        let panels = PanelMatrix::bf16(&w, n, k);
        for j in 0..n {
            for p in 0..k {
                let expect = bf16_bits_to_f32(f32_to_bf16_bits(w[j * k + p]));
                assert_eq!(panels.get(j, p).to_bits(), expect.to_bits(), "({j}, {p})");
            }
        }
    }

    #[test]
    fn f32_panels_hold_each_weight() {
        let (n, k) = (19, 5);
        let w = values(n * k, 9);
        let panels = PanelMatrix::f32(&w, n, k);
        for j in 0..n {
            for p in 0..k {
                assert_eq!(
                    panels.get(j, p).to_bits(),
                    w[j * k + p].to_bits(),
                    "({j}, {p})"
                );
            }
        }
    }

    #[test]
    fn q8_panels_hold_the_matrix_dequantized() {
        let (n, k) = (21, 128);
        let q = QuantizedMatrix::quantize(&values(n * k, 2), n, k, 8, 32).unwrap();
        let panels = PanelMatrix::q8(&q);
        let deq = q.dequantize_f32();
        for j in 0..n {
            for p in 0..k {
                assert_eq!(panels.get(j, p), deq[j * k + p], "({j}, {p})");
            }
        }
    }

    /// Every kernel, every tile shape (1-17 rows), full matrices and blocks, overlapping and
    /// strided rows (bf16 pairs: read at odd offsets too), written and accumulated, threaded by
    /// panels and by rows: the reference's bits. Where the CPU has AVX512-BF16 the AVX-512
    /// kernels run `vdpbf16ps` against the emulated reference.
    #[test]
    fn every_kernel_gives_each_row_the_reference_bits_at_any_row_count() {
        if !Kernel::available().into_iter().any(bf16_pairs_native) {
            eprintln!("no AVX512-BF16 here: the bf16 pair products run emulated on every kernel");
        }
        // (rows, cols, 8-bit group, or 0 for bf16, 1 for f32 and 2 for bf16 pairs, block)
        let cases = [
            (16, 1, 0, None),
            (33, 7, 0, None),
            (2048, 256, 0, None),
            (100, 64, 0, Some((5, 40, 16, 48))),
            (5, 300, 0, None),
            (40, 64, 64, None),
            (37, 256, 32, Some((3, 30, 64, 128))),
            (512, 256, 64, None),
            (64, 384, 128, Some((16, 32, 128, 256))),
            (32, 7, 1, None),
            (70, 96, 1, Some((16, 48, 5, 80))),
            (20, 33, 1, Some((2, 17, 0, 33))),
            // One panel, enough work to thread: the rows split (17 rows).
            (16, 1024, 0, None),
            (16, 1024, 64, None),
            (33, 8, 2, None),
            (2048, 256, 2, None),
            (100, 64, 2, Some((5, 40, 16, 48))),
            (5, 300, 2, None),
            (70, 96, 2, Some((16, 48, 6, 80))),
            (16, 1024, 2, None),
        ];
        for (case, &(n_all, k_all, group, block)) in cases.iter().enumerate() {
            let weights = values(n_all * k_all, case as u64 + 3);
            let q = (group > 2)
                .then(|| QuantizedMatrix::quantize(&weights, n_all, k_all, 8, group).unwrap());
            let w = match (&q, group) {
                (Some(q), _) => PanelMatrix::q8(q),
                (None, 0) => PanelMatrix::bf16(&weights, n_all, k_all),
                (None, 1) => PanelMatrix::f32(&weights, n_all, k_all),
                (None, _) => PanelMatrix::bf16_pairs(&weights, n_all, k_all),
            };
            let block = block.map_or(PanelBlock::all(&w), |(row0, n, col0, k)| PanelBlock {
                row0,
                n,
                col0,
                k,
            });
            for m in [1, 2, 3, 5, 8, 9, 17] {
                for rs_a in [block.k, block.k / 2 + 1, block.k + 3] {
                    let a = values((m - 1) * rs_a + block.k, (m * 31 + rs_a) as u64);
                    let rs_out = block.n + 2;
                    for kernel in Kernel::available() {
                        let fused = kernel.instruction_set() != crate::InstructionSet::Portable;
                        let expect = reference(m, &a, rs_a, &w, q.as_ref(), block, fused);
                        let mut got = vec![-1f32; (m - 1) * rs_out + block.n + 1];
                        gemm_nt_panels_with(
                            kernel, m, &a, rs_a, &w, block, &mut got, rs_out, false,
                        );
                        let what = format!("{kernel:?}: case {case}, m {m}, rs_a {rs_a}");
                        for i in 0..m {
                            let row = &got[i * rs_out..i * rs_out + block.n];
                            let want = &expect[i * block.n..(i + 1) * block.n];
                            let same = row
                                .iter()
                                .zip(want)
                                .all(|(g, e)| g.to_bits() == e.to_bits());
                            assert!(same, "{what}, row {i}");
                            assert_eq!(got[i * rs_out + block.n], -1.0, "{what}: gap of row {i}");
                        }
                        gemm_nt_panels_with(kernel, m, &a, rs_a, &w, block, &mut got, rs_out, true);
                        for i in 0..m {
                            for j in 0..block.n {
                                let twice = expect[i * block.n + j] + expect[i * block.n + j];
                                assert_eq!(
                                    got[i * rs_out + j],
                                    twice,
                                    "{what}: accumulated ({i}, {j})"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// The native rounding of activations gives [`bf16_pair_operand`]'s bits on subnormals,
    /// ties, NaNs, infinities and random bit patterns.
    #[test]
    fn native_rounding_of_pair_operands_equals_the_scalar_rule() {
        let native = Kernel::available().into_iter().any(bf16_pairs_native);
        if !native {
            eprintln!("no AVX512-BF16 here: only the scalar rounding exists");
        }
        let mut rng = moshi_test_support::XorShift64Star::new(0x9E37_79B9);
        let mut bits: Vec<u32> = (0..1 << 20).map(|_| rng.next_u64() as u32).collect();
        bits.extend([
            0,
            0x8000_0000,
            1,
            0x8000_0001,
            0x007F_FFFF,
            0x0080_0000,
            0x3F80_8000,
        ]);
        bits.extend([
            0x3F81_8000,
            0x7F7F_FFFF,
            0x7F80_0000,
            0xFF80_0000,
            0x7F80_0001,
            0xFFC0_0000,
        ]);
        let src: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
        let mut got = vec![0u16; src.len()];
        round_slice(native, &src, &mut got);
        for (x, g) in src.iter().zip(&got) {
            assert_eq!(*g, bf16_pair_operand(*x), "{:#010x}", x.to_bits());
        }
    }

    #[test]
    fn bf16_pair_panels_hold_each_weight_rounded_to_bf16() {
        let (n, k) = (37, 10);
        let mut w = values(n * k, 4);
        w[3] = f32::MIN_POSITIVE / 4.0;
        let panels = PanelMatrix::bf16_pairs(&w, n, k);
        assert_eq!(panels.group_size(), 2);
        for j in 0..n {
            for p in 0..k {
                let expect = bf16_bits_to_f32(bf16_pair_operand(w[j * k + p]));
                assert_eq!(panels.get(j, p).to_bits(), expect.to_bits(), "({j}, {p})");
            }
        }
        assert_eq!(panels.get(0, 3), 0.0, "a subnormal weight is read as zero");
    }

    /// The order and rounding `vdpbf16ps` has (odd column first, each step rounded, subnormals
    /// flushed), on values where another order or one rounding would differ.
    #[test]
    fn a_pair_step_adds_the_odd_product_first_and_rounds_each_step() {
        let bits = |x: f32| f32_to_bf16_bits(x) as u32;
        let pair = |even: f32, odd: f32| bits(odd) << 16 | bits(even);
        // 1 + (-1) first, then the tiny even product survives; even first it would be lost.
        let tiny = 2f32.powi(-30);
        assert_eq!(bf16_pair_step(pair(tiny, 1.0), pair(1.0, -1.0), 1.0), tiny);
        // Each step rounds: 1 + 2^-24 (a tie, to even) stays 1 twice over, where one rounding of
        // the exact sum 1 + 2^-23 would not.
        let half_ulp = 2f32.powi(-24);
        assert_eq!(
            bf16_pair_step(pair(half_ulp, half_ulp), pair(1.0, 1.0), 1.0),
            1.0
        );
        // A subnormal sum becomes a zero of its sign.
        let small = 2f32.powi(-70);
        assert_eq!(
            bf16_pair_step(pair(small, 0.0), pair(-small, 0.0), 0.0).to_bits(),
            (-0f32).to_bits()
        );
        assert_eq!(bf16_pair_operand(-f32::MIN_POSITIVE / 2.0), 0x8000);
        assert_eq!(bf16_pair_operand(1.0), 0x3F80);
        // The same cases through every kernel (`vdpbf16ps` where the CPU has it): columns 0, 1
        // make the sum 1, then 3 adds -1 before 2 adds the tiny product; a one-pair product
        // whose sum is subnormal.
        let ordered = PanelMatrix::bf16_pairs(&[1.0, 0.0, tiny, -1.0], 1, 4);
        let flushed = PanelMatrix::bf16_pairs(&[-small, 0.0], 1, 2);
        for kernel in Kernel::available() {
            let mut out = [f32::NAN];
            let all = PanelBlock::all(&ordered);
            gemm_nt_panels_with(kernel, 1, &[1.0; 4], 4, &ordered, all, &mut out, 1, false);
            assert_eq!(out[0], tiny, "{kernel:?}: the odd column first");
            let all = PanelBlock::all(&flushed);
            gemm_nt_panels_with(
                kernel,
                1,
                &[small, 0.0],
                2,
                &flushed,
                all,
                &mut out,
                1,
                false,
            );
            assert_eq!(out[0].to_bits(), (-0f32).to_bits(), "{kernel:?}: flushed");
        }
    }

    #[test]
    fn blocks_outside_the_matrix_or_across_groups_are_refused() {
        let q = QuantizedMatrix::quantize(&values(32 * 128, 5), 32, 128, 8, 64).unwrap();
        let w = PanelMatrix::q8(&q);
        let refused = |block: PanelBlock| {
            std::panic::catch_unwind(|| {
                let mut out = vec![0f32; 32];
                gemm_nt_panels(1, &[0f32; 128], 128, &w, block, &mut out, 32, false)
            })
            .is_err()
        };
        let block = |row0, n, col0, k| PanelBlock { row0, n, col0, k };
        assert!(refused(block(20, 13, 0, 128)), "rows past the end");
        assert!(refused(block(0, 32, 32, 64)), "columns across groups");
        assert!(!refused(block(0, 32, 64, 64)), "a whole group");
        let w = PanelMatrix::bf16_pairs(&values(32 * 128, 6), 32, 128);
        let refused = |block: PanelBlock| {
            std::panic::catch_unwind(|| {
                let mut out = vec![0f32; 32];
                gemm_nt_panels(1, &[0f32; 128], 128, &w, block, &mut out, 32, false)
            })
            .is_err()
        };
        assert!(refused(block(0, 32, 3, 64)), "columns across pairs");
        assert!(refused(block(0, 32, 0, 5)), "an odd column count");
        assert!(!refused(block(0, 32, 2, 64)), "whole pairs");
        assert!(std::panic::catch_unwind(|| PanelMatrix::bf16_pairs(&[0f32; 6], 2, 3)).is_err());
    }
}
