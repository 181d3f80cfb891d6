//! One linear layer (no bias) for the LM and Mimi: weights `[out_dim, in_dim]` row-major as in
//! PyTorch checkpoints, kept as f32, bf16 (widened exactly at use) or MLX-packed, or for Mimi's
//! convolutions as f32 column panels, plus, for Mimi's reduced modes, an optional copy (bf16, or
//! MLX 8-bit in panels) that few-row products read instead (the memory-bound streaming case) and,
//! in the 8-bit mode, for a convolution where the CPU has a bf16 dot product, bf16 pair panels
//! that its many-row products read (the compute-bound case). Every product runs in `moshi-kernels`.
//!
//! [`Linear::forward`] over up to [`EXACT_ROWS_MAX`] rows gives each row the bits it gets alone
//! (dense weights: the fixed-order kernels; packed weights: the quantized kernels, exact per row),
//! so sessions batched into one product do not depend on each other. [`Linear::gemm`] is Mimi's
//! block view of f32 weights for convolutions.

use std::sync::atomic::{AtomicU64, Ordering};

use moshi_kernels::dense::{
    bf16_pairs_native, gemm_nt_bf16, gemm_nt_panels, gemm_nt_strided, matmul, matmul_t, PanelBlock,
    PanelMatrix, SMALL_M,
};
use moshi_kernels::{f32_to_bf16_bits, Kernel, KernelMatrix, QuantPanels, QuantizedMatrix};
use moshi_loader::{Weight, WeightData};

/// Rows up to which [`Linear::forward`] on dense weights uses the fixed-order kernels (each row
/// the bits of its matrix-vector product, the weights read once); f32 products of more rows go to
/// the packed sgemm (compute-bound, another summation order).
pub const EXACT_ROWS_MAX: usize = 64;

/// Left-operand rows up to which a bf16 reduced copy is used (the bf16 streaming kernel's limit).
const BF16_COPY_MAX_ROWS: usize = SMALL_M;

/// Left-operand rows up to which an 8-bit reduced copy is used: each weight is read once for all
/// of them, and beyond, the f32 products' multiply-adds, not the weight bytes, set the pace.
pub const Q8_COPY_MAX_ROWS: usize = 16;

/// Left-operand rows up to which an 8-bit reduced copy is used where the layer also has bf16
/// pairs: the pairs' multiply-adds are twice as fast, so they take over at fewer rows (the
/// weight bytes of the 8-bit copy win only at a few).
const Q8_BEFORE_PAIRS_MAX_ROWS: usize = 4;

/// Group sizes tried for an 8-bit reduced copy, preferred first.
const Q8_GROUPS: [usize; 2] = [64, 32];

/// Mimi's weight modes: the precision of the copy a layer's few-row products read (their
/// activations and accumulation f32, but for the 8-bit mode's whole-matrix layers on AVX-512
/// VNNI, whose activations take the process's precision as the LM's products do) and, in the
/// 8-bit mode, of a convolution's many-row products where the CPU has AVX512-BF16 (weights and
/// activations rounded to bf16, f32 sums: twice the multiply-adds of f32 a cycle; elsewhere, and
/// in the other modes, they stay f32).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ReducedPrecision {
    /// No copy: the layer's own weights (exact f32 for Mimi, the reference behaviour).
    #[default]
    F32,
    /// bf16 copies (round to nearest even): half the bytes of f32.
    Bf16,
    /// MLX affine 8-bit, group 64 (group 32 where the columns are not a multiple of 64; bf16
    /// where not a multiple of 32): ~1.06 bytes per weight.
    Q8,
}

impl ReducedPrecision {
    pub const ALL: [ReducedPrecision; 3] = [
        ReducedPrecision::F32,
        ReducedPrecision::Bf16,
        ReducedPrecision::Q8,
    ];

    /// `"f32"`, `"bf16"` or `"q8"`.
    pub fn name(self) -> &'static str {
        match self {
            ReducedPrecision::F32 => "f32",
            ReducedPrecision::Bf16 => "bf16",
            ReducedPrecision::Q8 => "q8",
        }
    }
}

impl std::fmt::Display for ReducedPrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ReducedPrecision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ReducedPrecision::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                format!("unknown Mimi weight precision `{s}` (expected f32, bf16 or q8)")
            })
    }
}

/// Weight bytes read by the products that count their traffic (Mimi's: [`Linear::gemm`] and the
/// callers of [`count_bytes`]), for benchmarks: bytes per frame.
static WEIGHT_BYTES_READ: AtomicU64 = AtomicU64::new(0);

/// Total weight bytes counted so far (all instances and threads; the difference over a frame is
/// that frame's weight traffic).
pub fn weight_bytes_read() -> u64 {
    WEIGHT_BYTES_READ.load(Ordering::Relaxed)
}

/// Adds `bytes` to [`weight_bytes_read`].
pub fn count_bytes(bytes: usize) {
    WEIGHT_BYTES_READ.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// The kernel a [`Linear::gemm`] runs. Each output's bits depend on it, not on the row count
/// (the kernels' contracts): rows stacked into one call keep their bits while it stays the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GemmKernel {
    Bf16Copy,
    Q8Copy,
    /// The 8-bit copy in VNNI panels: whole-matrix products of few rows.
    Q8Vnni,
    /// The bf16 pair panels of a convolution in the 8-bit mode, many rows.
    Bf16Pairs,
    F32Streaming,
    F32Packed,
    /// The layer's own f32 panels, any number of rows.
    F32Panels,
}

/// The weights of a layer.
#[derive(Clone, Debug)]
pub enum LinearWeights {
    F32(Vec<f32>),
    /// f32 in the panel kernel's column panels (Mimi's convolutions: [`Linear::into_panels`]).
    F32Panels(PanelMatrix),
    /// bf16 bits.
    Bf16(Vec<u16>),
    Quantized(QuantizedMatrix),
    /// A 4-bit or 8-bit matrix in panels of 16 rows, where the process's kernel reads them
    /// (AVX-512 VNNI): every product of any row count reads it ([`Linear::from_weight`]).
    QuantPanels(QuantPanels),
}

impl LinearWeights {
    /// A quantized matrix as the process's kernel reads it best ([`KernelMatrix::for_kernel`]
    /// for [`Kernel::anticipated`]).
    pub fn quantized(q: QuantizedMatrix) -> Self {
        match KernelMatrix::for_kernel(q, Kernel::anticipated()) {
            KernelMatrix::Panels(panels) => LinearWeights::QuantPanels(panels),
            KernelMatrix::Rows(q) => LinearWeights::Quantized(q),
        }
    }
}

/// The reduced copy few-row products read.
#[derive(Clone, Debug, Default)]
enum FewRowCopy {
    #[default]
    None,
    Bf16(Vec<u16>),
    /// MLX 8-bit codes in the panel kernel's layout (f32 activations).
    Q8(PanelMatrix),
    /// MLX 8-bit codes in the VNNI kernel's panels, activations at the process's precision
    /// ([`moshi_kernels::activation_precision`]): a layer of whole-matrix products (Mimi's
    /// transformers and quantizer projections) where the CPU has AVX-512 VNNI.
    Q8Vnni(QuantPanels),
}

/// A linear layer without bias.
#[derive(Clone, Debug)]
pub struct Linear {
    weights: LinearWeights,
    out_dim: usize,
    in_dim: usize,
    few_rows: FewRowCopy,
    /// The 8-bit mode, f32 panels, a CPU with a bf16 dot product: the bf16 pair panels the
    /// products of more rows than `few_rows` serves read.
    many_rows: Option<PanelMatrix>,
}

impl Linear {
    /// Builds a layer from a loader weight of logical shape `[out_dim, in_dim]`.
    pub fn from_weight(w: Weight) -> Self {
        let (out_dim, in_dim) = (w.shape[0], w.shape[1..].iter().product());
        let weights = match w.data {
            WeightData::F32(v) => LinearWeights::F32(v),
            WeightData::BF16(v) => LinearWeights::Bf16(v),
            WeightData::Quantized(q) => LinearWeights::quantized(q),
        };
        Self::new(weights, out_dim, in_dim)
    }

    /// A layer of `out_dim` rows of `in_dim` weights.
    ///
    /// # Panics
    /// If the weights do not hold `out_dim * in_dim` values (caller bug; loaders check shapes).
    pub fn new(weights: LinearWeights, out_dim: usize, in_dim: usize) -> Self {
        let len = match &weights {
            LinearWeights::F32(v) => v.len(),
            LinearWeights::Bf16(v) => v.len(),
            LinearWeights::Quantized(q) => {
                assert_eq!((q.rows(), q.cols()), (out_dim, in_dim), "linear shape");
                out_dim * in_dim
            }
            LinearWeights::F32Panels(p) => {
                assert_eq!((p.rows(), p.cols()), (out_dim, in_dim), "linear shape");
                out_dim * in_dim
            }
            LinearWeights::QuantPanels(p) => {
                assert_eq!((p.rows(), p.cols()), (out_dim, in_dim), "linear shape");
                out_dim * in_dim
            }
        };
        assert_eq!(len, out_dim * in_dim, "linear weight count");
        Self {
            weights,
            out_dim,
            in_dim,
            few_rows: FewRowCopy::None,
            many_rows: None,
        }
    }

    /// An f32 layer (Mimi's weights).
    pub fn f32(values: Vec<f32>, out_dim: usize, in_dim: usize) -> Self {
        Self::new(LinearWeights::F32(values), out_dim, in_dim)
    }

    /// The layer with its f32 weights rearranged into column panels, which every
    /// [`Linear::gemm`] and [`Linear::forward`] then reads (any number of rows, each row's bits
    /// the same: Mimi's convolutions, a few rows a frame for one stream, hundreds for the first
    /// layers or many streams, without packing at each call). Other weights are left as they are.
    pub fn into_panels(mut self) -> Self {
        if let LinearWeights::F32(values) = &self.weights {
            let panels = PanelMatrix::f32(values, self.out_dim, self.in_dim);
            self.weights = LinearWeights::F32Panels(panels);
        }
        self
    }

    /// Output rows before `at` and from `at` on, as two layers (reduced copies are dropped).
    ///
    /// # Panics
    /// If `at` is past the last row (caller bug).
    pub fn split_rows(self, at: usize) -> (Linear, Linear) {
        assert!(at <= self.out_dim, "split at row {at} of {}", self.out_dim);
        let (rows, cols) = (self.out_dim, self.in_dim);
        let weights = match self.weights {
            LinearWeights::F32Panels(p) => LinearWeights::F32(p.to_rows()),
            LinearWeights::QuantPanels(p) => LinearWeights::Quantized(p.to_matrix()),
            other => other,
        };
        let (head, tail) = match weights {
            LinearWeights::F32Panels(_) | LinearWeights::QuantPanels(_) => {
                unreachable!("rearranged into rows above")
            }
            LinearWeights::F32(mut v) => {
                let tail = v.split_off(at * cols);
                (LinearWeights::F32(v), LinearWeights::F32(tail))
            }
            LinearWeights::Bf16(mut v) => {
                let tail = v.split_off(at * cols);
                (LinearWeights::Bf16(v), LinearWeights::Bf16(tail))
            }
            LinearWeights::Quantized(q) => {
                let (h, t) = q.split_rows(at);
                (LinearWeights::quantized(h), LinearWeights::quantized(t))
            }
        };
        (
            Linear::new(head, at, cols),
            Linear::new(tail, rows - at, cols),
        )
    }

    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    pub fn in_dim(&self) -> usize {
        self.in_dim
    }

    pub fn weights(&self) -> &LinearWeights {
        &self.weights
    }

    /// The f32 weights.
    ///
    /// # Panics
    /// If the layer's weights are not f32 (Mimi's layers always are).
    pub fn values(&self) -> &[f32] {
        match &self.weights {
            LinearWeights::F32(v) => v,
            _ => panic!("an f32 layer was expected"),
        }
    }

    /// Bytes of the layer's own weights (what one product of few rows reads without a copy).
    pub fn weight_bytes(&self) -> usize {
        match &self.weights {
            LinearWeights::F32(v) => v.len() * 4,
            LinearWeights::Bf16(v) => v.len() * 2,
            LinearWeights::Quantized(q) => q.weight_bytes(),
            LinearWeights::F32Panels(p) => p.weight_bytes(),
            LinearWeights::QuantPanels(p) => p.weight_bytes(),
        }
    }

    /// Weight bytes a [`Linear::forward`] of `m` rows reads (a reduced copy where it applies).
    pub fn forward_bytes(&self, m: usize) -> usize {
        match (&self.few_rows, &self.many_rows) {
            (FewRowCopy::Bf16(w), _) if m <= BF16_COPY_MAX_ROWS => w.len() * 2,
            (FewRowCopy::Q8(q), _) if m <= self.q8_copy_max_rows() => q.weight_bytes(),
            (FewRowCopy::Q8Vnni(q), _) if m <= Q8_COPY_MAX_ROWS => q.weight_bytes(),
            (_, Some(pairs)) => pairs.weight_bytes(),
            _ => self.weight_bytes(),
        }
    }

    /// The most rows one [`Linear::forward`] takes while giving each row the bits it gets alone
    /// (and while a reduced copy, where there is one, still serves it): more rows would change
    /// the kernel. Callers batching the rows of independent streams keep to it.
    pub fn same_bits_rows(&self) -> usize {
        match (&self.few_rows, &self.weights) {
            (FewRowCopy::Bf16(_), _) => BF16_COPY_MAX_ROWS,
            (FewRowCopy::Q8(_), _) => self.q8_copy_max_rows(),
            (FewRowCopy::Q8Vnni(_), _) => Q8_COPY_MAX_ROWS,
            (FewRowCopy::None, LinearWeights::F32(_)) => EXACT_ROWS_MAX,
            (
                FewRowCopy::None,
                LinearWeights::Bf16(_)
                | LinearWeights::Quantized(_)
                | LinearWeights::F32Panels(_)
                | LinearWeights::QuantPanels(_),
            ) => usize::MAX,
        }
    }

    /// The most rows an 8-bit reduced copy serves.
    fn q8_copy_max_rows(&self) -> usize {
        if self.many_rows.is_some() {
            Q8_BEFORE_PAIRS_MAX_ROWS
        } else {
            Q8_COPY_MAX_ROWS
        }
    }

    /// Builds (or drops) the reduced copies: the one few-row products read and, in the 8-bit
    /// mode, for f32 panels of an even column count where [`bf16_pairs_native`], the bf16 pairs
    /// of many-row products.
    /// Needs f32 weights (the copies are made from them); other layers keep their weights and
    /// ignore the request.
    pub fn set_reduced_precision(&mut self, precision: ReducedPrecision) {
        let values = match &self.weights {
            LinearWeights::F32(values) => std::borrow::Cow::Borrowed(values.as_slice()),
            LinearWeights::F32Panels(p) => std::borrow::Cow::Owned(p.to_rows()),
            _ => return,
        };
        let values = values.as_ref();
        let bf16 = |v: &[f32]| FewRowCopy::Bf16(v.iter().map(|&x| f32_to_bf16_bits(x)).collect());
        let (rows, cols) = (self.out_dim, self.in_dim);
        let pairs = precision == ReducedPrecision::Q8
            && matches!(self.weights, LinearWeights::F32Panels(_))
            && cols.is_multiple_of(2)
            && bf16_pairs_native(Kernel::detect());
        self.many_rows = pairs.then(|| PanelMatrix::bf16_pairs(values, rows, cols));
        // Convolutions take blocks of their weights ([`Linear::gemm`]); the other layers whole
        // products only, which the VNNI panels serve.
        let whole_products = matches!(self.weights, LinearWeights::F32(_));
        self.few_rows = match precision {
            ReducedPrecision::F32 => FewRowCopy::None,
            ReducedPrecision::Bf16 => bf16(values),
            ReducedPrecision::Q8 => match Q8_GROUPS.into_iter().find(|&g| cols.is_multiple_of(g)) {
                // Quantization fails only on non-finite weights: such a matrix keeps a bf16 copy.
                Some(g) => match QuantizedMatrix::quantize(values, rows, cols, 8, g) {
                    Ok(q) if whole_products => {
                        match QuantPanels::from_matrix(q, Kernel::detect()) {
                            Ok(panels) => FewRowCopy::Q8Vnni(panels),
                            Err(q) => FewRowCopy::Q8(PanelMatrix::q8(&q)),
                        }
                    }
                    Ok(q) => FewRowCopy::Q8(PanelMatrix::q8(&q)),
                    Err(_) => bf16(values),
                },
                None => bf16(values),
            },
        };
    }

    /// `out[m, out_dim] = x[m, in_dim] · Wᵀ`. Up to [`EXACT_ROWS_MAX`] rows, each output row has
    /// the bits it gets in a product of that row alone (a reduced copy, where set, is read by
    /// products of at most its few rows: bf16 4, q8 16).
    ///
    /// # Panics
    /// If `x` or `out` is shorter than `m` rows (caller bug).
    pub fn forward(&self, x: &[f32], m: usize, out: &mut [f32]) {
        let (n, k) = (self.out_dim, self.in_dim);
        assert!(
            x.len() >= m * k && out.len() >= m * n,
            "linear: {m} rows need {} inputs and {} outputs, got {} and {}",
            m * k,
            m * n,
            x.len(),
            out.len()
        );
        let (x, out) = (&x[..m * k], &mut out[..m * n]);
        match &self.few_rows {
            FewRowCopy::Bf16(w) if m <= BF16_COPY_MAX_ROWS => {
                return gemm_nt_bf16(m, k, n, x, k, w, k, out, n, false);
            }
            FewRowCopy::Q8(q) if m <= self.q8_copy_max_rows() && m > 0 => {
                return gemm_nt_panels(m, x, k, q, PanelBlock::all(q), out, n, false);
            }
            FewRowCopy::Q8Vnni(q) if m <= Q8_COPY_MAX_ROWS => return q.matmul(x, m, out),
            _ => {}
        }
        if let Some(pairs) = &self.many_rows {
            return gemm_nt_panels(m, x, k, pairs, PanelBlock::all(pairs), out, n, false);
        }
        match &self.weights {
            LinearWeights::F32(w) if m > EXACT_ROWS_MAX => matmul_t(x, m, k, w, n, out, false),
            LinearWeights::F32(w) => matmul(w, n, k, x, m, out),
            LinearWeights::Bf16(w) => matmul(w, n, k, x, m, out),
            LinearWeights::Quantized(q) => q.matmul(x, m, out),
            LinearWeights::QuantPanels(p) => p.matmul(x, m, out),
            LinearWeights::F32Panels(p) => {
                gemm_nt_panels(m, x, k, p, PanelBlock::all(p), out, n, false)
            }
        }
    }

    /// Allocating variant of [`Linear::forward`].
    pub fn forward_vec(&self, x: &[f32], m: usize) -> Vec<f32> {
        let mut out = vec![0f32; m * self.out_dim];
        self.forward(x, m, &mut out);
        out
    }

    /// The panels' block of a [`Linear::gemm`] (whole weight rows, `rs_w` = `in_dim`): `n`
    /// weight rows and `k` columns from the weight at `offset`.
    fn panel_block(&self, offset: usize, n: usize, k: usize) -> PanelBlock {
        PanelBlock {
            row0: offset / self.in_dim,
            n,
            col0: offset % self.in_dim,
            k,
        }
    }

    /// The kernel a [`Linear::gemm`] of `m` rows over the block (`k` columns from `offset`,
    /// weight rows `rs_w` apart) runs.
    fn gemm_kernel(&self, m: usize, k: usize, offset: usize, rs_w: usize) -> GemmKernel {
        let whole = offset == 0 && k == self.in_dim && rs_w == self.in_dim;
        match &self.few_rows {
            FewRowCopy::Bf16(_) if m <= BF16_COPY_MAX_ROWS => return GemmKernel::Bf16Copy,
            FewRowCopy::Q8Vnni(_) if m <= Q8_COPY_MAX_ROWS && whole => return GemmKernel::Q8Vnni,
            FewRowCopy::Q8(q) => {
                let g = q.group_size();
                if m <= self.q8_copy_max_rows()
                    && rs_w == self.in_dim
                    && k.is_multiple_of(g)
                    && (offset % self.in_dim).is_multiple_of(g)
                {
                    return GemmKernel::Q8Copy;
                }
            }
            _ => {}
        }
        if let LinearWeights::F32Panels(_) = self.weights {
            assert_eq!(
                rs_w, self.in_dim,
                "a block of panels takes whole weight rows"
            );
            let whole_pairs = k.is_multiple_of(2) && (offset % self.in_dim).is_multiple_of(2);
            if self.many_rows.is_some() && whole_pairs {
                GemmKernel::Bf16Pairs
            } else {
                GemmKernel::F32Panels
            }
        } else if m <= SMALL_M {
            GemmKernel::F32Streaming
        } else {
            GemmKernel::F32Packed
        }
    }

    /// The most rows a [`Linear::gemm`] over the block may take while each row still gets the
    /// bits it gets in a product of `m` rows (the same kernel runs): callers stacking the rows of
    /// several streams into one product, the weights read once, keep to it.
    pub fn gemm_same_bits_rows(&self, m: usize, k: usize, offset: usize, rs_w: usize) -> usize {
        match self.gemm_kernel(m, k, offset, rs_w) {
            GemmKernel::Bf16Copy => BF16_COPY_MAX_ROWS,
            GemmKernel::Q8Copy => self.q8_copy_max_rows(),
            GemmKernel::Q8Vnni => Q8_COPY_MAX_ROWS,
            GemmKernel::F32Streaming => SMALL_M,
            GemmKernel::F32Packed | GemmKernel::F32Panels | GemmKernel::Bf16Pairs => usize::MAX,
        }
    }

    /// Mimi's block view of f32 weights: `out[i * rs_out + j] (+)= Σ_p a[i * rs_a + p] ·
    /// W[offset + j * rs_w + p]` for `i < m`, `j < n`, `p < k`, rows of `a` possibly overlapping
    /// (convolution windows read in place). Reads the reduced copy for few rows where it covers
    /// the block; counts its weight bytes in [`weight_bytes_read`].
    ///
    /// # Panics
    /// If the weights are not f32, or the block or slices are out of range (caller bug).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(
        &self,
        m: usize,
        k: usize,
        n: usize,
        a: &[f32],
        rs_a: usize,
        offset: usize,
        rs_w: usize,
        out: &mut [f32],
        rs_out: usize,
        accumulate: bool,
    ) {
        if m == 0 || n == 0 {
            return;
        }
        match (&self.few_rows, self.gemm_kernel(m, k, offset, rs_w)) {
            (FewRowCopy::Q8Vnni(q), GemmKernel::Q8Vnni) => {
                count_bytes(q.weight_bytes());
                if rs_a == k && rs_out == n && !accumulate {
                    return q.matmul(&a[..m * k], m, &mut out[..m * n]);
                }
                // Strided or accumulated (no caller today): through contiguous copies.
                let rows = |i: usize| &a[i * rs_a..i * rs_a + k];
                let x: std::borrow::Cow<[f32]> = if rs_a == k {
                    std::borrow::Cow::Borrowed(&a[..m * k])
                } else {
                    std::borrow::Cow::Owned((0..m).flat_map(rows).copied().collect())
                };
                let mut y = vec![0f32; m * n];
                q.matmul(&x, m, &mut y);
                for (i, row) in y.chunks_exact(n).enumerate() {
                    let dst = &mut out[i * rs_out..i * rs_out + n];
                    if accumulate {
                        dst.iter_mut().zip(row).for_each(|(d, v)| *d += v);
                    } else {
                        dst.copy_from_slice(row);
                    }
                }
                return;
            }
            (FewRowCopy::Bf16(w), GemmKernel::Bf16Copy) => {
                count_bytes(n * k * 2);
                let w = &w[offset..];
                return gemm_nt_bf16(m, k, n, a, rs_a, w, rs_w, out, rs_out, accumulate);
            }
            (FewRowCopy::Q8(q), GemmKernel::Q8Copy) => {
                let g = q.group_size();
                count_bytes(n * k + n * (k / g) * 8);
                let block = self.panel_block(offset, n, k);
                return gemm_nt_panels(m, a, rs_a, q, block, out, rs_out, accumulate);
            }
            (_, GemmKernel::Bf16Pairs) => {
                let Some(pairs) = &self.many_rows else {
                    unreachable!("the pair kernel runs on pair panels")
                };
                count_bytes(n * k * 2);
                let block = self.panel_block(offset, n, k);
                return gemm_nt_panels(m, a, rs_a, pairs, block, out, rs_out, accumulate);
            }
            (_, GemmKernel::F32Panels) => {
                let LinearWeights::F32Panels(panels) = &self.weights else {
                    unreachable!("the panels kernel runs on panels")
                };
                count_bytes(n * k * 4);
                let block = self.panel_block(offset, n, k);
                return gemm_nt_panels(m, a, rs_a, panels, block, out, rs_out, accumulate);
            }
            _ => {}
        }
        count_bytes(n * k * 4);
        gemm_nt_strided(
            m,
            k,
            n,
            a,
            rs_a,
            &self.values()[offset..],
            rs_w,
            1,
            out,
            rs_out,
            accumulate,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` test weights, `sin(0.37 i)`.
    fn weights(n: usize) -> Vec<f32> {
        (0..n).map(|i| ((i as f32) * 0.37).sin()).collect()
    }

    /// `n` test activations, `cos(0.11 i)`.
    fn activations(n: usize) -> Vec<f32> {
        (0..n).map(|i| ((i as f32) * 0.11).cos()).collect()
    }

    /// A 4-bit layer held as the process's kernel reads it (panels on AVX-512 VNNI) splits into two
    /// layers whose rows give the whole layer's bits, held the same way.
    #[test]
    fn a_quantized_layer_splits_into_its_rows() {
        let (rows, cols, at) = (40, 128, 24);
        let w = weights(rows * cols);
        let q = QuantizedMatrix::quantize(&w, rows, cols, 4, 32).unwrap();
        let whole = Linear::new(LinearWeights::quantized(q), rows, cols);
        let panels = matches!(whole.weights(), LinearWeights::QuantPanels(_));
        assert_eq!(panels, Kernel::anticipated() == Kernel::Avx512Vnni);
        let x = activations(3 * cols);
        let all = whole.forward_vec(&x, 3);
        let (head, tail) = whole.split_rows(at);
        for (part, first, n) in [(head, 0, at), (tail, at, rows - at)] {
            assert_eq!(
                matches!(part.weights(), LinearWeights::QuantPanels(_)),
                panels
            );
            let got = part.forward_vec(&x, 3);
            for i in 0..3 {
                let want = &all[i * rows + first..i * rows + first + n];
                assert_eq!(&got[i * n..(i + 1) * n], want, "row {i}");
            }
        }
    }

    #[test]
    fn precision_names_round_trip_and_reject_unknown() {
        for m in ReducedPrecision::ALL {
            assert_eq!(m.name().parse::<ReducedPrecision>().unwrap(), m);
        }
        let err = "q4".parse::<ReducedPrecision>().unwrap_err();
        assert!(
            err.contains("q4") && err.contains("f32, bf16 or q8"),
            "{err}"
        );
        assert_eq!(ReducedPrecision::default(), ReducedPrecision::F32);
    }

    #[test]
    fn every_mode_computes_the_same_block_product_within_its_rounding() {
        let (rows, cols) = (12, 192);
        let w = weights(rows * cols);
        let a = activations(2 * cols);
        // rows 4..10, columns 64..192 of the matrix, 2 left rows.
        let (n, k, offset) = (6, 128, 4 * cols + 64);
        let mut exact = vec![0f32; 2 * n];
        // Blocks are a convolution's products: its weights in panels.
        let mut matrix = Linear::f32(w.clone(), rows, cols).into_panels();
        matrix.gemm(2, k, n, &a, cols, offset, cols, &mut exact, n, false);
        for i in 0..2 {
            for j in 0..n {
                let r: f64 = (0..k)
                    .map(|p| a[i * cols + p] as f64 * w[offset + j * cols + p] as f64)
                    .sum();
                assert!((exact[i * n + j] as f64 - r).abs() < 1e-4, "f32 ({i}, {j})");
            }
        }
        // bf16: relative weight error 2^-9; q8 group 64 over values in [-1, 1]: step ~2/255.
        for (mode, tol) in [(ReducedPrecision::Bf16, 0.05), (ReducedPrecision::Q8, 0.1)] {
            matrix.set_reduced_precision(mode);
            let before = weight_bytes_read();
            let mut out = vec![0f32; 2 * n];
            matrix.gemm(2, k, n, &a, cols, offset, cols, &mut out, n, false);
            assert!(weight_bytes_read() > before);
            let max = out
                .iter()
                .zip(&exact)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(max < tol && max > 0.0, "{mode}: max diff {max}");
        }
    }

    /// A whole-matrix layer (Mimi's transformers) in the 8-bit mode on AVX-512 VNNI reads its
    /// 8-bit copy in the VNNI panels, through `forward` and whole-matrix `gemm` alike (strided or
    /// accumulated too): each row the panels' bits at any row count up to 16, within the 8-bit
    /// weights' error of the exact product.
    #[test]
    fn whole_matrix_layers_in_the_8_bit_mode_read_vnni_panels_where_available() {
        let (rows, cols, m) = (48, 128, 5);
        let w = weights(rows * cols);
        let x = activations(m * cols);
        let mut layer = Linear::f32(w.clone(), rows, cols);
        let exact = layer.forward_vec(&x, m);
        layer.set_reduced_precision(ReducedPrecision::Q8);
        let FewRowCopy::Q8Vnni(panels) = &layer.few_rows else {
            assert!(QuantPanels::from_matrix(
                QuantizedMatrix::quantize(&w, rows, cols, 8, 64).unwrap(),
                Kernel::detect()
            )
            .is_err());
            eprintln!("no AVX-512 VNNI here: the 8-bit copy stays in the f32 panels");
            return;
        };
        let mut want = vec![0f32; m * rows];
        panels.matmul(&x, m, &mut want);
        assert_eq!(layer.forward_vec(&x, m), want, "forward: the panels' bits");
        for i in 0..m {
            let alone = layer.forward_vec(&x[i * cols..(i + 1) * cols], 1);
            assert_eq!(alone, want[i * rows..(i + 1) * rows], "row {i} alone");
        }
        let max = want.iter().zip(&exact).map(|(a, b)| (a - b).abs());
        let max = max.fold(0f32, f32::max);
        assert!(max > 0.0 && max < 0.1, "8-bit copy: max diff {max}");
        assert_eq!(
            layer.gemm_same_bits_rows(m, cols, 0, cols),
            Q8_COPY_MAX_ROWS
        );
        // Strided rows, a strided output, accumulated onto ones.
        let (rs_a, rs_out) = (cols + 3, rows + 2);
        let mut strided = vec![0f32; m * rs_a];
        for i in 0..m {
            strided[i * rs_a..i * rs_a + cols].copy_from_slice(&x[i * cols..(i + 1) * cols]);
        }
        let mut out = vec![1f32; m * rs_out];
        layer.gemm(
            m, cols, rows, &strided, rs_a, 0, cols, &mut out, rs_out, true,
        );
        for i in 0..m {
            for j in 0..rows {
                assert_eq!(out[i * rs_out + j], 1.0 + want[i * rows + j], "({i}, {j})");
            }
        }
        let mut out = vec![0f32; m * rows];
        layer.gemm(m, cols, rows, &x, cols, 0, cols, &mut out, rows, false);
        assert_eq!(out, want, "gemm of the whole matrix: the panels' bits");
    }

    /// A convolution's panels in the 8-bit mode: where the CPU has AVX512-BF16, products of more
    /// than `Q8_BEFORE_PAIRS_MAX_ROWS` rows read the bf16 pairs (the kernel's bits, any row
    /// count, half f32's bytes), fewer the 8-bit copy; elsewhere, and in the bf16 mode, many
    /// rows stay on the exact f32 panels.
    #[test]
    fn many_rows_of_a_convolution_in_the_8_bit_mode_read_bf16_pairs_where_native() {
        let (rows, cols, m) = (40, 96, 37);
        let w = weights(rows * cols);
        let a = activations(m * cols);
        let conv = Linear::f32(w.clone(), rows, cols).into_panels();
        let exact = conv.forward_vec(&a, m);
        let native = bf16_pairs_native(Kernel::detect());
        for mode in [ReducedPrecision::Bf16, ReducedPrecision::Q8] {
            let mut layer = conv.clone();
            layer.set_reduced_precision(mode);
            let pairs = native && mode == ReducedPrecision::Q8;
            assert_eq!(layer.many_rows.is_some(), pairs, "{mode}");
            let got = layer.forward_vec(&a, m);
            if !pairs {
                assert_eq!(got, exact, "{mode}: many rows on the f32 panels");
                continue;
            }
            let reference = PanelMatrix::bf16_pairs(&w, rows, cols);
            let mut want = vec![0f32; m * rows];
            let all = PanelBlock::all(&reference);
            gemm_nt_panels(m, &a, cols, &reference, all, &mut want, rows, false);
            assert_eq!(got, want, "the pair kernel's bits");
            let max = got.iter().zip(&exact).map(|(x, y)| (x - y).abs());
            let max = max.fold(0f32, f32::max);
            assert!(max > 0.0 && max < 0.05, "bf16 pairs: max diff {max}");
            assert_eq!(layer.forward_bytes(m), reference.weight_bytes());
            assert_eq!(layer.gemm_same_bits_rows(m, cols, 0, cols), usize::MAX);
            let few = Q8_BEFORE_PAIRS_MAX_ROWS;
            assert_eq!(layer.gemm_same_bits_rows(few, cols, 0, cols), few);
            assert!(
                layer.forward_bytes(few) < reference.weight_bytes(),
                "8-bit copy"
            );
        }
        if !native {
            eprintln!("no AVX512-BF16 here: the 8-bit mode keeps many rows on f32 panels");
        }
    }

    #[test]
    fn bf16_linear_equals_f32_linear_on_upcast_weights() {
        let (n, k) = (7, 19);
        let w16: Vec<u16> = (0..n * k)
            .map(|i| f32_to_bf16_bits((i as f32 * 0.3).sin()))
            .collect();
        let w32: Vec<f32> = w16
            .iter()
            .map(|&b| f32::from_bits((b as u32) << 16))
            .collect();
        let x: Vec<f32> = (0..2 * k).map(|i| (i as f32 * 0.7).cos()).collect();
        let a = Linear::new(LinearWeights::Bf16(w16), n, k).forward_vec(&x, 2);
        let b = Linear::f32(w32, n, k).forward_vec(&x, 2);
        assert_eq!(a, b, "the same fixed-order product of the same values");
    }

    /// Every row of a batched product has the bits of that row alone, for dense and packed
    /// weights, up to `EXACT_ROWS_MAX` rows.
    #[test]
    fn batched_rows_equal_single_rows_bit_for_bit() {
        let (n, k) = (70, 256);
        let values: Vec<f32> = (0..n * k)
            .map(|i| ((i * 31 % 997) as f32 * 0.01).sin())
            .collect();
        let layers = [
            Linear::f32(values.clone(), n, k),
            Linear::new(
                LinearWeights::Bf16(values.iter().map(|&v| f32_to_bf16_bits(v)).collect()),
                n,
                k,
            ),
            Linear::new(
                LinearWeights::Quantized(QuantizedMatrix::quantize(&values, n, k, 4, 32).unwrap()),
                n,
                k,
            ),
            Linear::new(
                LinearWeights::Quantized(QuantizedMatrix::quantize(&values, n, k, 8, 64).unwrap()),
                n,
                k,
            ),
        ];
        for m in [2, 5, EXACT_ROWS_MAX] {
            let xs: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.23).cos()).collect();
            for layer in &layers {
                let batched = layer.forward_vec(&xs, m);
                for (i, x) in xs.chunks_exact(k).enumerate() {
                    let alone = layer.forward_vec(x, 1);
                    let row = &batched[i * n..(i + 1) * n];
                    assert!(
                        row.iter()
                            .zip(&alone)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{:?} m {m} row {i}",
                        std::mem::discriminant(layer.weights())
                    );
                }
            }
        }
    }

    /// Blocks of `m` rows stacked into one [`Linear::gemm`] of up to `gemm_same_bits_rows(m)`
    /// rows (every mode, overlapping windows, a block view, accumulating) each get the bits of
    /// their product alone: what batching Mimi's streams relies on.
    #[test]
    fn stacked_blocks_keep_their_bits_up_to_the_same_bits_rows() {
        let (rows, cols) = (40, 256);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 17 % 613) as f32 * 0.013).sin())
            .collect();
        // Columns 64..256 of rows 3..40, windows 32 apart (overlapping, as a convolution's).
        let (n, k, offset, rs_a) = (37, 192, 3 * cols + 64, 32);
        for mode in ReducedPrecision::ALL {
            let mut layer = Linear::f32(w.clone(), rows, cols);
            layer.set_reduced_precision(mode);
            for m in [1, 2, 3, 4, 5, 16, 17] {
                let max = layer.gemm_same_bits_rows(m, k, offset, cols);
                assert!(max >= m, "{mode} m {m}: {max}");
                let blocks = (max / m).min(40 / m + 2);
                let total = blocks * m;
                let a: Vec<f32> = (0..(total - 1) * rs_a + k)
                    .map(|i| (i as f32 * 0.37).cos())
                    .collect();
                let init: Vec<f32> = (0..total * n).map(|i| (i as f32 * 0.05).sin()).collect();
                let mut stacked = init.clone();
                layer.gemm(total, k, n, &a, rs_a, offset, cols, &mut stacked, n, true);
                for b in 0..blocks {
                    let mut alone = init[b * m * n..(b + 1) * m * n].to_vec();
                    let a_block = &a[b * m * rs_a..];
                    layer.gemm(m, k, n, a_block, rs_a, offset, cols, &mut alone, n, true);
                    let got = &stacked[b * m * n..(b + 1) * m * n];
                    assert!(
                        got.iter()
                            .zip(&alone)
                            .all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{mode} m {m}: block {b} of {blocks}"
                    );
                }
            }
        }
    }
}
