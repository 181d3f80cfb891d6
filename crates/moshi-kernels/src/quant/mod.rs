//! Fast quantized matrix products: the code a kernel runs (its [`Kernel::pair`]: the instruction
//! set's integer-digit kernel for [`QuantAlgorithm::IntegerDigits`] where it covers the format,
//! else the instruction set's f32 lane kernel, else the portable code), activation layout, and
//! multi-threading over output rows.
//!
//! Every kernel computes, for a range of weight rows, `out_t[r, i] = Σ_j x[i, j] · w[r, j]` with
//! `w = q * scale + bias` and f32 accumulation: the exact dequantized matrix times the
//! activations, up to rounding. The portable kernel dequantizes each weight; the AVX-512, AVX2
//! and NEON lane kernels regroup the sum per quantization group as `scale · Σ q x + bias · Σ x`,
//! as MLX's own kernels do (see `lanes`); the VNNI, AVX2 integer and NEON dot-product kernels do
//! the same with `Σ q x` as exact integer dot products of the codes with 24-bit fixed-point
//! activations (see `vnni`, `avx2int`, `dotprod` and `fixed_point`). All of them are held to the
//! same error bound against the scalar reference in the kernel tests.

/// `Some(rows::<BITS, GROUP>)` for the (bits, group size) pairs the specialised kernels cover
/// (4 and 8 bits, groups of 32, 64 or 128), `None` otherwise. A macro because every kernel
/// module has its own generic `rows` function.
macro_rules! select_specialised_rows {
    ($rows:ident, $bits:expr, $group_size:expr) => {
        match ($bits, $group_size) {
            (4, 32) => Some($rows::<4, 32> as crate::quant::RowRangeFn),
            (4, 64) => Some($rows::<4, 64>),
            (4, 128) => Some($rows::<4, 128>),
            (8, 32) => Some($rows::<8, 32>),
            (8, 64) => Some($rows::<8, 64>),
            (8, 128) => Some($rows::<8, 128>),
            _ => None,
        }
    };
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[macro_use]
mod lanes;
// Before the integer kernels, which expand its `digit_tile_frame!`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[macro_use]
mod fixed_point;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2int;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "aarch64")]
mod dotprod;
mod generic;
mod int8;
mod kernel_matrix;
#[cfg(target_arch = "aarch64")]
mod neon;
mod panel_matrix;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod passes;
mod portable;
mod scale;
mod two_digits;
#[cfg(target_arch = "x86_64")]
mod vnni;
#[cfg(target_arch = "x86_64")]
mod vnni_panels;

pub use int8::round_activations_i8;
pub use kernel_matrix::KernelMatrix;
pub use panel_matrix::QuantPanels;
pub use two_digits::round_activations_two_digits;

use std::borrow::Cow;
#[cfg(target_arch = "x86_64")]
use std::sync::OnceLock;

use crate::{
    ActivationPrecision, InstructionSet, Kernel, QuantAlgorithm, QuantError, QuantizedMatrix,
};

/// Weight bytes below which a task is not split further (waking a thread costs about what
/// reading this much weight data takes:
/// docs/performance.md#rows-per-pass-and-prefetch-distances-qmv-weights-streamed-from-dram).
const MIN_TASK_WEIGHT_BYTES: usize = 128 * 1024;

/// How the x86 kernels prefetch their code streams in software: one hint per 64 code bytes of
/// each stream, a fixed distance ahead of the load. Chosen once per CPU ([`CodePrefetch::for_cpu`]).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CodePrefetch {
    /// `prefetcht0` 1 KiB ahead, into L1: Intel. On an Intel Xeon guest the hardware prefetcher
    /// alone left matrix-vector products well short of the read bandwidth, and this prefetch
    /// closed the gap (2 KiB ahead did the same;
    /// docs/performance.md#rows-per-pass-and-prefetch-distances-qmv-weights-streamed-from-dram).
    L1Near,
    /// `prefetcht1` 4 KiB ahead, into L2: elsewhere. On AMD Zen 4 it read faster than the earlier
    /// choice there (`prefetcht0` 1 KiB ahead for 4-bit codes, none for single-row 8-bit passes)
    /// with the VNNI (one and two threads), AVX-512 and AVX2 kernels, or the same (AVX-512 q8 at
    /// 4096 columns); figures in
    /// docs/performance.md#rows-per-pass-and-prefetch-distances-qmv-weights-streamed-from-dram.
    ///
    /// The hint lands in L2 early enough to cover DRAM latency while the decode keeps the core
    /// busy; a `prefetcht0` that far ahead, or the hardware prefetcher alone, did not.
    L2Far,
    /// `prefetcht1` 1 KiB ahead, into L2: the VNNI panels' single-row tile off Intel (a stream per
    /// panel of the tile). Measured against 4 KiB, 2 KiB and none on Zen 4, the probe read between
    /// the passes: 1 KiB and none read 0.98-0.99 of the probe at 30-34 GB/s where 4 KiB read
    /// 0.91-0.94, and 47-51 GB/s where 4 KiB capped at 40-42 in the host's fast spells; the
    /// batched tiles (4 and 8 rows) keep [`CodePrefetch::L2Far`], 6-12% faster there
    /// (docs/performance.md, "The single-row panels' prefetch distance").
    L2Near,
}

/// How many rows ahead [`CodePrefetch::scales_of_row`] is asked for (within each far-apart part of
/// a thread's rows).
#[cfg(target_arch = "x86_64")]
pub(crate) const SCALE_PREFETCH_ROWS: usize = 4;

#[cfg(target_arch = "x86_64")]
impl CodePrefetch {
    /// [`CodePrefetch::L1Near`] on Intel CPUs, [`CodePrefetch::L2Far`] elsewhere.
    pub(crate) fn for_cpu() -> Self {
        static INTEL: OnceLock<bool> = OnceLock::new();
        let intel = *INTEL.get_or_init(|| {
            let id = std::arch::x86_64::__cpuid(0);
            // Vendor string "GenuineIntel" in ebx, edx, ecx.
            (id.ebx, id.edx, id.ecx) == (0x756e_6547, 0x4965_6e69, 0x6c65_746e)
        });
        if intel {
            CodePrefetch::L1Near
        } else {
            CodePrefetch::L2Far
        }
    }

    /// Prefetches the scale and bias lines of weight row `row` of `w`, a few rows before the
    /// kernel reaches it ([`SCALE_PREFETCH_ROWS`]): `prefetcht1` under [`CodePrefetch::L2Far`],
    /// nothing under [`CodePrefetch::L1Near`] (not measured there). A row's few lines of each
    /// stream are read once at its start, and the hardware prefetcher did not fetch them in time:
    /// prefetched 4 rows ahead, they made the VNNI kernel read faster on Zen 4; 2 and 8 rows ahead
    /// did the same, `prefetcht0` and 1 row ahead no better than none
    /// (docs/performance.md#rows-per-pass-and-prefetch-distances-qmv-weights-streamed-from-dram).
    /// A hint: a row past the matrix is harmless.
    #[inline(always)]
    pub(crate) fn scales_of_row(self, w: &QuantizedMatrix, row: usize) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        if self != CodePrefetch::L2Far {
            return;
        }
        let groups = w.cols() / w.group_size();
        for stream in [w.scales(), w.biases()] {
            let at = stream.as_ptr().wrapping_add(row * groups).cast::<u8>();
            for byte in (0..groups * 2).step_by(64) {
                // SAFETY: SSE is part of x86-64; a prefetch reads nothing.
                unsafe { _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(byte).cast()) };
            }
        }
    }

    /// The choice for the VNNI panels' tiles over `m` activation rows: [`CodePrefetch::L2Near`]
    /// for one row where [`CodePrefetch::for_cpu`] picks [`CodePrefetch::L2Far`], else that.
    pub(crate) fn for_panel_rows(m: usize) -> Self {
        match Self::for_cpu() {
            CodePrefetch::L2Far if m == 1 => CodePrefetch::L2Near,
            choice => choice,
        }
    }

    /// Prefetches the code line this choice's distance past `p`. A hint: it never faults, so
    /// the address may run past the row or the matrix.
    #[inline(always)]
    pub(crate) fn ahead_of(self, p: *const u8) {
        self.line(p.wrapping_add(self.distance_bytes()));
    }

    /// How far ahead of the load this choice prefetches, in bytes.
    #[inline(always)]
    pub(crate) fn distance_bytes(self) -> usize {
        match self {
            CodePrefetch::L1Near | CodePrefetch::L2Near => 1024,
            CodePrefetch::L2Far => 4096,
        }
    }

    /// Prefetches the line at `p` with this choice's hint (`prefetcht0` for
    /// [`CodePrefetch::L1Near`], `prefetcht1` otherwise). A hint: it never faults.
    #[inline(always)]
    pub(crate) fn line(self, p: *const u8) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
        // SAFETY: SSE is part of x86-64; a prefetch reads nothing.
        unsafe {
            match self {
                CodePrefetch::L1Near => _mm_prefetch::<_MM_HINT_T0>(p.cast()),
                CodePrefetch::L2Far | CodePrefetch::L2Near => _mm_prefetch::<_MM_HINT_T1>(p.cast()),
            }
        }
    }
}

/// How the aarch64 kernels prefetch their code streams: not in software. Apple's M-series and
/// Arm's Neoverse cores detect sequential streams in hardware and fetch ahead on their own; no
/// software hint has been measured on an aarch64 machine yet (see
/// `docs/performance.md#aarch64-neon-on-paper`), so none is issued rather than one whose effect
/// nobody has seen. The interface is the x86 one, so the shared lane kernel calls it the same way.
#[cfg(target_arch = "aarch64")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CodePrefetch {
    /// The hardware prefetchers alone.
    Hardware,
}

/// How many rows ahead [`CodePrefetch::scales_of_row`] is asked for.
#[cfg(target_arch = "aarch64")]
pub(crate) const SCALE_PREFETCH_ROWS: usize = 4;

#[cfg(target_arch = "aarch64")]
impl CodePrefetch {
    /// [`CodePrefetch::Hardware`] on every aarch64 CPU.
    pub(crate) fn for_cpu() -> Self {
        CodePrefetch::Hardware
    }

    /// Nothing under [`CodePrefetch::Hardware`].
    #[inline(always)]
    pub(crate) fn scales_of_row(self, _w: &QuantizedMatrix, _row: usize) {}

    /// Nothing under [`CodePrefetch::Hardware`].
    #[inline(always)]
    pub(crate) fn ahead_of(self, _p: *const u8) {}
}

/// `2^112`: an f16's magnitude bits shifted into f32's places read as its value times `2^-112`
/// (the exponent biases are 15 and 127), so the widening kernels without an f16 conversion
/// multiply by this.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) const F16_TO_F32: f32 = f32::from_bits((112 + 127) << 23);

/// Weight bytes of each unit a threaded product's rows are shared out in (whole rows, at least
/// 16): small enough for the threads to even out at the end, large enough that a unit's call costs
/// nothing next to its rows.
const UNIT_WEIGHT_BYTES: usize = 64 * 1024;

/// Computes `out_t[(r - row_start) * m + i]` for the rows `row_start..row_start + out_t.len() / m`,
/// given the activations `xs` (`m` rows of `cols`, in the kernel's layout).
pub(crate) type RowRangeFn = fn(&QuantizedMatrix, &[f32], usize, usize, &mut [f32]);

/// How a kernel wants the activations laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// Natural order.
    Natural,
    /// The lane kernels' arrangement plus group sums (`lanes::arrange_activations`).
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    Lanes { lanes: usize, top_unscaled: bool },
    /// The integer kernel's fixed-point digits (`vnni::arrange_activations` or
    /// `avx2int::arrange_activations` on x86-64, `dotprod::arrange_activations` on aarch64).
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    Digits,
}

/// How a kernel wants the activations laid out, and which function computes a row range.
struct Plan {
    layout: Layout,
    rows_fn: RowRangeFn,
}

/// The plan of `kernel` for `bits`-bit codes in groups of `group_size` and activations held at
/// `precision`: its instruction set's integer-digit kernel where the algorithm asks for it and
/// covers the format (4-bit codes), else the instruction set's f32 lane kernel where it covers
/// the format, else the portable code.
fn plan(kernel: Kernel, bits: u32, group_size: usize, precision: ActivationPrecision) -> Plan {
    let (instruction_set, algorithm) = kernel.pair();
    let digits = match algorithm {
        QuantAlgorithm::IntegerDigits => {
            digit_rows(instruction_set, bits, group_size, digits_of(precision))
        }
        QuantAlgorithm::F32 => None,
    };
    if let Some(rows_fn) = digits {
        return Plan {
            layout: Layout::Digits,
            rows_fn,
        };
    }
    if let Some((rows_fn, layout)) = lane_rows(instruction_set, bits, group_size) {
        return Plan { layout, rows_fn };
    }
    let rows_fn = portable::select(bits, group_size).unwrap_or(generic::rows);
    Plan {
        layout: Layout::Natural,
        rows_fn,
    }
}

/// Signed 8-bit digits per activation the integer kernels take at `precision`.
fn digits_of(precision: ActivationPrecision) -> usize {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    return match precision {
        ActivationPrecision::Exact => fixed_point::DIGITS,
        ActivationPrecision::Int16 => two_digits::TWO_DIGITS,
        ActivationPrecision::Int8 => fixed_point::I8_DIGITS,
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    match precision {
        ActivationPrecision::Exact => 3,
        ActivationPrecision::Int16 => 2,
        ActivationPrecision::Int8 => 1,
    }
}

/// The integer-digit kernel of `instruction_set` for the format and activations of `digits`
/// digits, if it has one (4-bit codes only; see `vnni`, `avx2int`, `dotprod`).
fn digit_rows(
    instruction_set: InstructionSet,
    bits: u32,
    group_size: usize,
    digits: usize,
) -> Option<RowRangeFn> {
    match instruction_set {
        #[cfg(target_arch = "x86_64")]
        InstructionSet::Avx512 => vnni::select(bits, group_size, digits),
        #[cfg(target_arch = "x86_64")]
        InstructionSet::Avx2 => avx2int::select(bits, group_size, digits),
        #[cfg(target_arch = "aarch64")]
        InstructionSet::Neon => dotprod::select(bits, group_size, digits),
        _ => {
            let _ = (bits, group_size, digits);
            None
        }
    }
}

/// The f32 lane kernel of `instruction_set` for the format, with its activation layout, if it has
/// one.
fn lane_rows(
    instruction_set: InstructionSet,
    bits: u32,
    group_size: usize,
) -> Option<(RowRangeFn, Layout)> {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    let layout = |lanes, top_unscaled| Layout::Lanes {
        lanes,
        top_unscaled,
    };
    match instruction_set {
        #[cfg(target_arch = "x86_64")]
        InstructionSet::Avx512 => avx512::select(bits, group_size)
            .map(|f| (f, layout(avx512::LANES, avx512::TOP_UNSCALED))),
        #[cfg(target_arch = "x86_64")]
        InstructionSet::Avx2 => {
            avx2::select(bits, group_size).map(|f| (f, layout(avx2::LANES, avx2::TOP_UNSCALED)))
        }
        #[cfg(target_arch = "aarch64")]
        InstructionSet::Neon => {
            neon::select(bits, group_size).map(|f| (f, layout(neon::LANES, neon::TOP_UNSCALED)))
        }
        _ => {
            let _ = (bits, group_size);
            None
        }
    }
}

/// `m` rows of activations in the digits of `instruction_set`'s integer kernel for `bits`-bit
/// codes at `precision`, or `None` where a row cannot be held (see `fixed_point` and `int8`).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn digit_activations(
    instruction_set: InstructionSet,
    precision: ActivationPrecision,
    bits: u32,
    x: &[f32],
    m: usize,
    cols: usize,
    group_size: usize,
) -> Option<Vec<f32>> {
    // Only the VNNI kernel has a layout of its own for 8-bit codes.
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bits;
    // AVX-512 arranges every digit count sixteen values at a time (below); the other integer
    // kernels take 8-bit activations through the shared scalar rule.
    #[cfg(target_arch = "x86_64")]
    let avx512 = instruction_set == InstructionSet::Avx512;
    #[cfg(not(target_arch = "x86_64"))]
    let avx512 = false;
    if precision == ActivationPrecision::Int8 && !avx512 {
        let layout = match instruction_set {
            #[cfg(target_arch = "x86_64")]
            InstructionSet::Avx2 => avx2int::layout(cols, group_size, fixed_point::I8_DIGITS),
            #[cfg(target_arch = "aarch64")]
            InstructionSet::Neon => dotprod::layout(cols, group_size, fixed_point::I8_DIGITS),
            _ => unreachable!("no integer-digit kernel for {instruction_set:?}"),
        };
        return fixed_point::arrange_rows(x, m, cols, layout, |row, dst| {
            fixed_point::arrange_row_i8(row, dst, group_size, layout)
        });
    }
    let digits = digits_of(precision);
    match instruction_set {
        #[cfg(target_arch = "x86_64")]
        InstructionSet::Avx512 if bits == 8 => {
            vnni::arrange_activations8(x, m, cols, group_size, digits)
        }
        #[cfg(target_arch = "x86_64")]
        InstructionSet::Avx512 => vnni::arrange_activations(x, m, cols, group_size, digits),
        #[cfg(target_arch = "x86_64")]
        InstructionSet::Avx2 => avx2int::arrange_activations(x, m, cols, group_size, digits),
        #[cfg(target_arch = "aarch64")]
        InstructionSet::Neon => dotprod::arrange_activations(x, m, cols, group_size, digits),
        _ => unreachable!("no integer-digit kernel for {instruction_set:?}"),
    }
}

/// Each of `N` vectors' horizontal sums by `sum`, one after the other: the `fsums` of the kernels
/// without a form that folds several (AVX-512 has one). Always inlined, so that `sum` inlines with
/// its caller's features.
#[inline(always)]
pub(crate) fn sums_one_by_one<F: Copy, const N: usize>(
    v: [F; N],
    sum: impl Fn(F) -> f32,
) -> [f32; N] {
    // An index loop, not a `map` closure, which the release build left as a call.
    let mut out = [0f32; N];
    for k in 0..N {
        out[k] = sum(v[k]);
    }
    out
}

/// `y[m, rows] = x[m, cols] · dequant(W)ᵀ` with the given kernel, the activations held at
/// `precision`, threaded over output rows on the current rayon pool. Fails only if `kernel` is
/// not available on this CPU.
///
/// # Panics
/// If `x.len() != m * cols` or `y.len() != m * rows` (caller bug, not user input).
pub(crate) fn qmm(
    w: &QuantizedMatrix,
    kernel: Kernel,
    precision: ActivationPrecision,
    x: &[f32],
    m: usize,
    y: &mut [f32],
) -> Result<(), QuantError> {
    let (rows, cols) = (w.rows(), w.cols());
    assert_eq!(
        x.len(),
        m * cols,
        "quantized matmul: x must hold m * cols = {m} * {cols} values"
    );
    assert_eq!(
        y.len(),
        m * rows,
        "quantized matmul: y must hold m * rows = {m} * {rows} values"
    );
    if !kernel.is_available() {
        return Err(QuantError::KernelUnavailable {
            kernel: kernel.name(),
        });
    }
    if m == 0 || rows == 0 {
        return Ok(());
    }
    let Some((plan, xs)) = arranged(kernel, precision, w, x, m) else {
        // A row the fixed point cannot hold goes to the f32 kernel on its own: every row gets
        // the result it gets alone, whoever shares its product.
        for (xr, yr) in x.chunks_exact(cols).zip(y.chunks_exact_mut(rows)) {
            qmm(w, kernel, precision, xr, 1, yr)?;
        }
        return Ok(());
    };
    if m == 1 {
        run_threaded(w, &plan, &xs, 1, y);
    } else {
        let mut out_t = vec![0f32; rows * m];
        run_threaded(w, &plan, &xs, m, &mut out_t);
        for (r, vals) in out_t.chunks_exact(m).enumerate() {
            for (i, v) in vals.iter().enumerate() {
                y[i * rows + r] = *v;
            }
        }
    }
    Ok(())
}

/// The plan for `kernel` and the activations in its layout at `precision` (the f32 kernels take
/// 8-bit and 16-bit activations as their rounded values, `int8::round_activations_i8` and
/// `two_digits::round_activations_two_digits`); activations the
/// integer kernels cannot hold go to the f32 kernel of their instruction set (AVX-512, AVX2,
/// NEON): a single row here, several rows one by one (`None`: the caller runs each row alone, so
/// that it gets the bits it gets alone).
fn arranged<'x>(
    kernel: Kernel,
    precision: ActivationPrecision,
    w: &QuantizedMatrix,
    x: &'x [f32],
    m: usize,
) -> Option<(Plan, Cow<'x, [f32]>)> {
    let (bits, group_size, cols) = (w.bits(), w.group_size(), w.cols());
    let plan = plan(kernel, bits, group_size, precision);
    let held = || match precision {
        ActivationPrecision::Exact => Cow::Borrowed(x),
        ActivationPrecision::Int16 => {
            Cow::Owned(round_activations_two_digits(x, m, cols, group_size))
        }
        ActivationPrecision::Int8 => Cow::Owned(round_activations_i8(x, m, cols, group_size)),
    };
    match plan.layout {
        Layout::Natural => Some((plan, held())),
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        Layout::Lanes {
            lanes,
            top_unscaled,
        } => {
            let xs =
                lanes::arrange_activations(&held(), m, cols, bits, group_size, lanes, top_unscaled);
            Some((plan, Cow::Owned(xs)))
        }
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        Layout::Digits => {
            match digit_activations(
                kernel.instruction_set(),
                precision,
                bits,
                x,
                m,
                cols,
                group_size,
            ) {
                Some(xs) => Some((plan, Cow::Owned(xs))),
                None if m > 1 => None,
                None => arranged(kernel.f32_sibling(), precision, w, x, m),
            }
        }
    }
}

/// Runs the rows on the [`crate::team`]'s threads (capped by the current rayon pool), none with
/// less than [`MIN_TASK_WEIGHT_BYTES`] of weights, in units of [`UNIT_WEIGHT_BYTES`] shared out by
/// a balanced region (each thread on its run of consecutive rows, finishing a slower thread's),
/// each unit on its own chunk of `out_t`.
fn run_threaded(w: &QuantizedMatrix, plan: &Plan, xs: &[f32], m: usize, out_t: &mut [f32]) {
    let rows = w.rows();
    let threads = crate::team::threads()
        .min((w.weight_bytes() / MIN_TASK_WEIGHT_BYTES).max(1))
        .min(rows);
    if threads <= 1 {
        (plan.rows_fn)(w, xs, m, 0, out_t);
        return;
    }
    let row_bytes = (w.weight_bytes() / rows).max(1);
    let unit_rows = (UNIT_WEIGHT_BYTES / row_bytes).next_multiple_of(16).max(16);
    crate::team::run_balanced_chunks_mut(threads, out_t, unit_rows * m, &|first, chunk| {
        (plan.rows_fn)(w, xs, m, first / m, chunk)
    });
}
