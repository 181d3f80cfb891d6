//! A 4-bit or 8-bit MLX matrix rearranged for products whose vector lanes run across weight rows
//! ([`QuantPanels`]): its rows in panels of 16, so that one integer dot product instruction
//! multiplies 16 rows' codes by one broadcast word of activation digits and each lane's sum is
//! one output's (no horizontal sums, no per-pair preparation). The one layout every row count
//! reads, so a row's bits never depend on the rows beside it.
//!
//! **Layout** (u32 words): panel `p` holds rows `16p..16p + 16` (past the matrix: zero codes and
//! zero factors); per quantization group of `G` columns, `G / 8` chunks of 8 columns, each one line
//! of 16 words at 4 bits (word `l` of chunk `c` being row `16p + l`'s MLX code word `c` of the
//! group: the low nibbles the even columns, the high nibbles the odd ones) or two at 8 bits (the
//! first line's word `l` the row's even columns' four codes, the second's its odd columns', as the
//! nibbles split them at 4 bits), then one word per row holding its bf16 bias in the high half and
//! its bf16 scale in the low half. Each panel is one sequential stream.
//!
//! **Products** take the activations in the VNNI kernel's fixed-point digits (`quant::vnni`,
//! `quant::fixed_point`: exact, 16-bit or 8-bit), whose digit planes meet the code words' nibbles
//! as they are. Per output and group the integer sums of the digits are exact; they are joined
//! into one f32 (three digits: `f32(Σ top) · 2^16 + f32(Σ lower two)`, the others converted once),
//! multiplied by the group's unit `u_g · 2^e` (a power of two with exact and 16-bit activations,
//! `max_g / 127 · 2^e` with 8-bit ones; rows whose units leave f32's normal range go to the scalar
//! path), and added as `total = fma(scale, v, total)`, then `fma(bias, Σ_g x, total)`,
//! group after group. The same operations in the same order for every tile shape, row count and
//! thread split. Rows the fixed point cannot hold (non-finite, subnormal) take the scalar
//! reference's arithmetic on the dequantized panel row.

#[cfg(target_arch = "x86_64")]
use crate::quant::vnni_panels;
use crate::{ActivationPrecision, Kernel, QuantizedMatrix, ScaleFormat};

/// Rows per panel (the `i32` lanes of a 512-bit vector).
pub(crate) const PANEL_ROWS: usize = 16;

/// Columns per chunk of a group: one 4-bit code word, two 8-bit ones.
const CHUNK_COLS: usize = 8;

/// A 4-bit or 8-bit matrix in panels of 16 rows for the AVX-512 VNNI panel kernel (module
/// docs): built from a [`QuantizedMatrix`] once at load ([`QuantPanels::from_matrix`]), read by
/// every product of any row count.
#[derive(Clone, Debug)]
pub struct QuantPanels {
    rows: usize,
    cols: usize,
    group_size: usize,
    bits: u32,
    lines: Vec<Line>,
}

/// One cache line of words: a chunk of 16 rows' code words, or their 16 factor words. Aligned, so
/// that each 64-byte load of the kernel reads one line.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct Line([u32; PANEL_ROWS]);

impl QuantPanels {
    /// The matrix rearranged into panels where `kernel` reads them (the AVX-512 VNNI kernel on a
    /// CPU that has it) and the format suits (4-bit or 8-bit codes with bf16 factors, groups of
    /// 32, 64 or 128); otherwise the matrix back, unchanged. The panels are written into a new
    /// buffer and the matrix dropped after: the peak is one matrix twice, never a second copy of
    /// a model.
    pub fn from_matrix(w: QuantizedMatrix, kernel: Kernel) -> Result<QuantPanels, QuantizedMatrix> {
        if !Self::suits(&w, kernel) {
            return Err(w);
        }
        let (rows, cols, group_size, bits) = (w.rows(), w.cols(), w.group_size(), w.bits());
        let layout = PanelLayout::new(rows, cols, group_size, bits);
        let mut lines = Vec::with_capacity(layout.panels * layout.panel_words / PANEL_ROWS);
        crate::huge_pages::advise(&mut lines);
        for panel in 0..layout.panels {
            push_panel(&w, panel, &layout, &mut lines);
        }
        Ok(QuantPanels {
            rows,
            cols,
            group_size,
            bits,
            lines,
        })
    }

    /// Whether [`QuantPanels::from_matrix`] rearranges `w` for `kernel`.
    pub fn suits(w: &QuantizedMatrix, kernel: Kernel) -> bool {
        kernel == Kernel::Avx512Vnni
            && kernel.is_available()
            && matches!(w.bits(), 4 | 8)
            && matches!(w.group_size(), 32 | 64 | 128)
            && w.scale_format() == ScaleFormat::Bf16
    }

    /// The matrix in MLX's row layout again (the inverse of [`QuantPanels::from_matrix`]).
    pub fn to_matrix(&self) -> QuantizedMatrix {
        let layout = self.layout();
        let groups = self.cols / self.group_size;
        let mut codes = Vec::with_capacity(self.rows * self.cols * self.bits as usize / 32);
        let (mut scales, mut biases) = (
            Vec::with_capacity(self.rows * groups),
            Vec::with_capacity(self.rows * groups),
        );
        let words = self.words();
        for row in 0..self.rows {
            for g in 0..groups {
                for chunk in 0..layout.chunks {
                    let line = |l: usize| words[layout.code_word(row, g, l)];
                    if self.bits == 4 {
                        codes.push(line(chunk));
                    } else {
                        codes.extend(mlx_words_of_lines(line(2 * chunk), line(2 * chunk + 1)));
                    }
                }
            }
            for g in 0..groups {
                let factors = words[layout.factor_word(row, g)];
                scales.push(factors as u16);
                biases.push((factors >> 16) as u16);
            }
        }
        let (rows, cols, bits, group) = (self.rows, self.cols, self.bits, self.group_size);
        QuantizedMatrix::new(rows, cols, bits, group, codes, scales, biases)
            .expect("a panel matrix holds a valid matrix")
    }

    /// Row `row`'s code of column `col`, from the panels.
    fn code(&self, layout: &PanelLayout, row: usize, col: usize) -> u32 {
        let (g, within) = (col / self.group_size, col % self.group_size);
        let (chunk, j) = (within / CHUNK_COLS, within % CHUNK_COLS);
        if self.bits == 4 {
            let word = self.words()[layout.code_word(row, g, chunk)];
            return (word >> (4 * j)) & 0xf;
        }
        // The even columns' line, then the odd columns'; byte `j / 2` of the row's word.
        let word = self.words()[layout.code_word(row, g, 2 * chunk + j % 2)];
        (word >> (8 * (j / 2))) & 0xff
    }

    /// Bits per code (4 or 8).
    pub fn bits(&self) -> u32 {
        self.bits
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn group_size(&self) -> usize {
        self.group_size
    }

    /// Bytes one full pass over the matrix reads (codes and factors, padding rows included).
    pub fn weight_bytes(&self) -> usize {
        self.lines.len() * std::mem::size_of::<Line>()
    }

    /// Scalar dequantization of one row into `out` (`w = q * scale + bias` in f32, as
    /// [`QuantizedMatrix::dequantize_row_f32`]).
    pub fn dequantize_row_f32(&self, row: usize, out: &mut [f32]) {
        let layout = self.layout();
        for (g, values) in out[..self.cols]
            .chunks_exact_mut(self.group_size)
            .enumerate()
        {
            let factors = self.words()[layout.factor_word(row, g)];
            let scale = ScaleFormat::Bf16.to_f32(factors as u16);
            let bias = ScaleFormat::Bf16.to_f32((factors >> 16) as u16);
            for (j, v) in values.iter_mut().enumerate() {
                let code = self.code(&layout, row, g * self.group_size + j);
                *v = code as f32 * scale + bias;
            }
        }
    }

    /// `y[m, rows] = x[m, cols] · dequant(W)ᵀ` with the process's activation precision, threaded
    /// over panels on the [`crate::team`].
    ///
    /// # Panics
    /// If `x.len() != m * cols` or `y.len() != m * rows` (caller bug).
    pub fn matmul(&self, x: &[f32], m: usize, y: &mut [f32]) {
        self.matmul_with(crate::activation_precision(), x, m, y);
    }

    /// [`QuantPanels::matmul`] with activations held at `precision`.
    ///
    /// # Panics
    /// As [`QuantPanels::matmul`].
    pub fn matmul_with(&self, precision: ActivationPrecision, x: &[f32], m: usize, y: &mut [f32]) {
        let (rows, cols) = (self.rows, self.cols);
        assert_eq!(x.len(), m * cols, "panel matmul: x must hold {m} x {cols}");
        assert_eq!(y.len(), m * rows, "panel matmul: y must hold {m} x {rows}");
        if m == 0 || rows == 0 {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            if vnni_panels::matmul(self, precision, x, m, y) {
                return;
            }
            if m > 1 {
                // A row the fixed point cannot hold: every row gets what it gets alone.
                for (xr, yr) in x.chunks_exact(cols).zip(y.chunks_exact_mut(rows)) {
                    self.matmul_with(precision, xr, 1, yr);
                }
                return;
            }
        }
        let _ = precision;
        self.row_by_reference(x, y);
    }

    /// One activation row the fixed point cannot hold, in the scalar reference's arithmetic
    /// (each dequantized row dotted in order of columns, in f32).
    fn row_by_reference(&self, x: &[f32], y: &mut [f32]) {
        let mut values = vec![0f32; self.cols];
        for (r, out) in y.iter_mut().enumerate() {
            self.dequantize_row_f32(r, &mut values);
            *out = crate::reference::dot_in_order(&values, x);
        }
    }

    pub(crate) fn layout(&self) -> PanelLayout {
        PanelLayout::new(self.rows, self.cols, self.group_size, self.bits)
    }

    /// The panels' words in order (the module docs' layout), starting on a cache line.
    pub(crate) fn words(&self) -> &[u32] {
        // SAFETY: `Line` is `repr(C)` over `[u32; 16]`, 64 bytes with no padding: the lines are
        // `16 · len` initialised words in a row.
        unsafe {
            std::slice::from_raw_parts(self.lines.as_ptr().cast(), self.lines.len() * PANEL_ROWS)
        }
    }
}

/// Where a panel matrix's words lie.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PanelLayout {
    pub(crate) panels: usize,
    pub(crate) groups: usize,
    /// Code chunks (8 columns) per group.
    pub(crate) chunks: usize,
    /// Code lines per chunk: 1 at 4 bits, 2 at 8.
    pub(crate) chunk_lines: usize,
    /// Words per group of a panel: its chunks' lines, then its factor words.
    pub(crate) group_words: usize,
    pub(crate) panel_words: usize,
}

impl PanelLayout {
    pub(crate) fn new(rows: usize, cols: usize, group_size: usize, bits: u32) -> Self {
        let (groups, chunks) = (cols / group_size, group_size / CHUNK_COLS);
        let chunk_lines = bits as usize / 4;
        let group_words = (chunks * chunk_lines + 1) * PANEL_ROWS;
        PanelLayout {
            panels: rows.div_ceil(PANEL_ROWS),
            groups,
            chunks,
            chunk_lines,
            group_words,
            panel_words: groups * group_words,
        }
    }

    /// The word of row `row`'s codes in code line `line` of group `g` (at 4 bits line `c` is
    /// chunk `c`; at 8 bits chunk `c`'s even columns are line `2c`, its odd ones `2c + 1`).
    pub(crate) fn code_word(&self, row: usize, g: usize, line: usize) -> usize {
        let (panel, lane) = (row / PANEL_ROWS, row % PANEL_ROWS);
        panel * self.panel_words + g * self.group_words + line * PANEL_ROWS + lane
    }

    /// The word of row `row`'s bias and scale of group `g`.
    pub(crate) fn factor_word(&self, row: usize, g: usize) -> usize {
        let code_lines = self.chunks * self.chunk_lines;
        self.code_word(row, g, code_lines)
    }
}

/// Appends panel `panel` of `w` to `lines` (layout in the module docs).
fn push_panel(w: &QuantizedMatrix, panel: usize, layout: &PanelLayout, lines: &mut Vec<Line>) {
    let (codes, scales, biases) = (w.codes(), w.scales(), w.biases());
    let words_per_row = w.cols() * w.bits() as usize / 32;
    let row_of = |lane: usize| Some(panel * PANEL_ROWS + lane).filter(|&r| r < w.rows());
    for g in 0..layout.groups {
        for line in 0..layout.chunks * layout.chunk_lines {
            lines.push(Line(std::array::from_fn(|lane| {
                row_of(lane).map_or(0, |r| {
                    let row_words = &codes[r * words_per_row..(r + 1) * words_per_row];
                    let first = g * layout.chunks * layout.chunk_lines;
                    code_line_word(row_words, w.bits(), first, line)
                })
            })));
        }
        lines.push(Line(std::array::from_fn(|lane| {
            row_of(lane).map_or(0, |r| {
                let at = r * layout.groups + g;
                (biases[at] as u32) << 16 | scales[at] as u32
            })
        })));
    }
}

/// One row's word of code line `line` of the group whose MLX code words start at `first`: the
/// word itself at 4 bits; at 8 bits the even (`line` even) or odd columns' codes of the chunk's two
/// words (each MLX word holds 4 columns, the lowest byte first).
fn code_line_word(row_words: &[u32], bits: u32, first: usize, line: usize) -> u32 {
    if bits == 4 {
        return row_words[first + line];
    }
    let (chunk, odd) = (line / 2, (line % 2) as u32);
    let (a, b) = (
        row_words[first + 2 * chunk],
        row_words[first + 2 * chunk + 1],
    );
    let byte = |w: u32, i: u32| (w >> (8 * i)) & 0xff;
    byte(a, odd) | byte(a, 2 + odd) << 8 | byte(b, odd) << 16 | byte(b, 2 + odd) << 24
}

/// The inverse of [`code_line_word`] at 8 bits: a chunk's two MLX words (columns 0-3, 4-7) from
/// its even and odd columns' line words.
fn mlx_words_of_lines(even: u32, odd: u32) -> [u32; 2] {
    let byte = |w: u32, i: u32| (w >> (8 * i)) & 0xff;
    let word = |i: u32| {
        byte(even, i) | byte(odd, i) << 8 | byte(even, i + 1) << 16 | byte(odd, i + 1) << 24
    };
    [word(0), word(2)]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The panels hold every row's codes and factors: back to rows they are the matrix again, and
    /// each row dequantizes to the same values (partial last panels included).
    #[test]
    fn panels_round_trip_to_the_row_layout() {
        if !Kernel::Avx512Vnni.is_available() {
            return;
        }
        let shapes = [(1, 32, 32), (20, 192, 64), (33, 256, 128), (48, 96, 32)];
        for ((rows, cols, g), bits) in shapes.into_iter().flat_map(|s| [(s, 4), (s, 8)]) {
            let values: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 7919 % 1013) as f32 / 1013.0) - 0.5)
                .collect();
            let w = QuantizedMatrix::quantize(&values, rows, cols, bits, g).unwrap();
            let panels = QuantPanels::from_matrix(w.clone(), Kernel::Avx512Vnni).unwrap();
            let back = panels.to_matrix();
            assert_eq!(back.codes(), w.codes());
            assert_eq!((back.scales(), back.biases()), (w.scales(), w.biases()));
            let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
            for r in 0..rows {
                w.dequantize_row_f32(r, &mut a);
                panels.dequantize_row_f32(r, &mut b);
                assert_eq!(a, b, "row {r}");
            }
            assert_eq!(panels.words().as_ptr() as usize % 64, 0, "lines aligned");
        }
    }

    /// Formats the kernel does not read come back unchanged.
    #[test]
    fn other_formats_and_kernels_are_refused() {
        let values: Vec<f32> = (0..16 * 64).map(|i| (i % 13) as f32 * 0.1).collect();
        // GGUF q8_0: f16 block scales (34 bytes a block of 32).
        let q8_0 = QuantizedMatrix::from_q8_0(16, 64, &[0u8; 32 * 34]).unwrap();
        assert!(QuantPanels::from_matrix(q8_0, Kernel::Avx512Vnni).is_err());
        let q4 = QuantizedMatrix::quantize(&values, 16, 64, 4, 64).unwrap();
        assert!(QuantPanels::from_matrix(q4, Kernel::Portable).is_err());
    }
}
