//! Safe handles on `shim.c`: ggml's CPU backend with a persistent thread pool, quantization to a
//! ggml type, and copies of one quantized matrix with a `ggml_mul_mat` graph each.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

extern "C" {
    fn peer_type_from_name(name: *const c_char) -> c_int;
    fn peer_row_bytes(ty: c_int, cols: i64) -> usize;
    fn peer_block_size(ty: c_int) -> i64;
    fn peer_quantize(ty: c_int, src: *const f32, rows: i64, cols: i64, dst: *mut c_void) -> usize;
    fn peer_dequantize(ty: c_int, src: *const c_void, rows: i64, cols: i64, dst: *mut f32);
    fn peer_runtime_new(threads: c_int) -> *mut c_void;
    fn peer_runtime_pause(runtime: *mut c_void);
    fn peer_runtime_free(runtime: *mut c_void);
    #[allow(clippy::too_many_arguments)]
    fn peer_matrix_new(
        runtime: *mut c_void,
        ty: c_int,
        repack: c_int,
        rows: i64,
        cols: i64,
        blocks: *const c_void,
        copies: c_int,
        buffer_name: *mut c_char,
        name_len: usize,
        error: *mut c_char,
        error_len: usize,
    ) -> *mut c_void;
    fn peer_matrix_bind(
        matrix: *mut c_void,
        x: *const f32,
        m: c_int,
        error: *mut c_char,
        error_len: usize,
    ) -> c_int;
    fn peer_matrix_compute(matrix: *mut c_void, copy: c_int) -> c_int;
    fn peer_matrix_output(matrix: *mut c_void, copy: c_int, y: *mut f32);
    fn peer_matrix_free(matrix: *mut c_void);
    fn peer_step_new(
        runtime: *mut c_void,
        ty: c_int,
        repack: c_int,
        shape: *const StepShape,
        error: *mut c_char,
        error_len: usize,
    ) -> *mut c_void;
    fn peer_step_compute(step: *mut c_void, x: *const f32, logits: *mut f32) -> c_int;
    fn peer_step_free(step: *mut c_void);
}

/// One of ggml's weight types, by its ggml name (`q4_0`, `q4_K`, `q8_0`).
#[derive(Clone, Copy)]
pub struct GgmlType(c_int);

impl GgmlType {
    pub fn from_name(name: &str) -> Result<Self, String> {
        let c_name = CString::new(name).map_err(|e| format!("ggml type {name:?}: {e}"))?;
        // SAFETY: a NUL-terminated string that outlives the call.
        match unsafe { peer_type_from_name(c_name.as_ptr()) } {
            id if id >= 0 => Ok(Self(id)),
            _ => Err(format!("ggml type {name}: expected q4_0, q4_K or q8_0")),
        }
    }

    /// Bytes of a quantized `[rows, cols]` matrix; errors unless `cols` fills whole blocks.
    pub fn matrix_bytes(self, rows: usize, cols: usize) -> Result<usize, String> {
        // SAFETY: plain functions of the type id.
        let block = unsafe { peer_block_size(self.0) } as usize;
        if !cols.is_multiple_of(block) {
            return Err(format!(
                "{cols} columns: not a multiple of the block size {block}"
            ));
        }
        Ok(rows * unsafe { peer_row_bytes(self.0, cols as i64) })
    }

    /// ggml's quantization of the row-major `[rows, cols]` matrix `dense` (no importance matrix).
    pub fn quantize(self, dense: &[f32], rows: usize, cols: usize) -> Result<Vec<u8>, String> {
        assert_eq!(dense.len(), rows * cols);
        let mut blocks = vec![0u8; self.matrix_bytes(rows, cols)?];
        // SAFETY: `dense` holds rows * cols floats, `blocks` the bytes ggml writes for them.
        let written = unsafe {
            peer_quantize(
                self.0,
                dense.as_ptr(),
                rows as i64,
                cols as i64,
                blocks.as_mut_ptr().cast(),
            )
        };
        assert_eq!(written, blocks.len());
        Ok(blocks)
    }

    /// The weights `blocks` stand for, by ggml's own `to_float`.
    pub fn dequantize(self, blocks: &[u8], rows: usize, cols: usize) -> Vec<f32> {
        assert_eq!(Ok(blocks.len()), self.matrix_bytes(rows, cols));
        let mut dense = vec![0f32; rows * cols];
        // SAFETY: sizes checked above.
        unsafe {
            peer_dequantize(
                self.0,
                blocks.as_ptr().cast(),
                rows as i64,
                cols as i64,
                dense.as_mut_ptr(),
            )
        };
        dense
    }
}

/// ggml's CPU backend on a persistent pool of `threads` (the calling thread included).
pub struct Runtime(*mut c_void);

impl Runtime {
    pub fn new(threads: usize) -> Result<Self, String> {
        // SAFETY: returns an owned handle or null.
        let handle = unsafe { peer_runtime_new(threads as c_int) };
        if handle.is_null() {
            return Err(format!(
                "ggml: could not start a CPU backend with {threads} threads"
            ));
        }
        Ok(Self(handle))
    }

    /// Parks the pool's workers until the next product (they poll for work otherwise).
    pub fn pause(&self) {
        // SAFETY: a live handle.
        unsafe { peer_runtime_pause(self.0) }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // SAFETY: owned, freed once; every Matrix borrows the runtime so is gone by now.
        unsafe { peer_runtime_free(self.0) }
    }
}

fn error_text(buffer: &[u8]) -> String {
    CStr::from_bytes_until_nul(buffer)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `copies` tensors holding one quantized matrix, each with a product graph for the bound
/// activations.
pub struct Matrix<'a> {
    handle: *mut c_void,
    _runtime: &'a Runtime,
    rows: usize,
    cols: usize,
    m: usize,
    copies: usize,
    /// The ggml buffer type the weights live in (`CPU` or `CPU_REPACK`).
    pub buffer_type: String,
}

impl<'a> Matrix<'a> {
    /// Copies `blocks` (of `ty`, `[rows, cols]`) `copies` times into the CPU buffer type or,
    /// with `repack`, into CPU_REPACK, which interleaves them for ggml's gemv/gemm kernels.
    pub fn new(
        runtime: &'a Runtime,
        ty: GgmlType,
        repack: bool,
        (rows, cols): (usize, usize),
        blocks: &[u8],
        copies: usize,
    ) -> Result<Self, String> {
        assert_eq!(Ok(blocks.len()), ty.matrix_bytes(rows, cols));
        let (mut name, mut error) = ([0u8; 128], [0u8; 256]);
        // SAFETY: `blocks` holds the matrix's bytes; the text buffers have the lengths passed.
        let handle = unsafe {
            peer_matrix_new(
                runtime.0,
                ty.0,
                repack.into(),
                rows as i64,
                cols as i64,
                blocks.as_ptr().cast(),
                copies as c_int,
                name.as_mut_ptr().cast(),
                name.len(),
                error.as_mut_ptr().cast(),
                error.len(),
            )
        };
        if handle.is_null() {
            return Err(format!("ggml: {}", error_text(&error)));
        }
        let buffer_type = error_text(&name);
        Ok(Self {
            handle,
            _runtime: runtime,
            rows,
            cols,
            m: 0,
            copies,
            buffer_type,
        })
    }

    /// Builds the graphs of `y[m, rows] = x[m, cols] · Wᵀ` for every copy, `x` copied in.
    pub fn bind(&mut self, x: &[f32], m: usize) -> Result<(), String> {
        assert_eq!(x.len(), m * self.cols);
        let mut error = [0u8; 256];
        // SAFETY: `x` holds m * cols floats, copied by ggml before the call returns.
        let status = unsafe {
            peer_matrix_bind(
                self.handle,
                x.as_ptr(),
                m as c_int,
                error.as_mut_ptr().cast(),
                error.len(),
            )
        };
        if status != 0 {
            return Err(format!("ggml: {}", error_text(&error)));
        }
        self.m = m;
        Ok(())
    }

    /// Runs copy `copy`'s product graph.
    pub fn compute(&self, copy: usize) -> Result<(), String> {
        assert!(
            self.m > 0 && copy < self.copies,
            "copy {copy} of {} unbound or out of range",
            self.copies
        );
        // SAFETY: a bound handle and a copy it holds.
        match unsafe { peer_matrix_compute(self.handle, copy as c_int) } {
            0 => Ok(()),
            _ => Err(format!("ggml: graph of copy {copy} failed")),
        }
    }

    /// Copy `copy`'s last product, `m * rows` floats.
    pub fn output(&self, copy: usize) -> Vec<f32> {
        assert!(
            self.m > 0 && copy < self.copies,
            "copy {copy} of {} unbound or out of range",
            self.copies
        );
        let mut y = vec![0f32; self.m * self.rows];
        // SAFETY: `y` holds the output tensor's m * rows floats.
        unsafe { peer_matrix_output(self.handle, copy as c_int, y.as_mut_ptr()) };
        y
    }
}

impl Drop for Matrix<'_> {
    fn drop(&mut self) {
        // SAFETY: owned, freed once.
        unsafe { peer_matrix_free(self.handle) }
    }
}

/// `shim.c`'s `peer_step_shape`: the sizes of one decode step and the quantized blocks every
/// layer's matrices are copied from.
#[repr(C)]
pub struct StepShape {
    pub layers: i64,
    pub dim: i64,
    pub heads: i64,
    pub hidden: i64,
    pub vocab: i64,
    pub kv_positions: i64,
    pub in_proj: *const c_void,
    pub out_proj: *const c_void,
    pub gating_in: *const c_void,
    pub gating_out: *const c_void,
    pub text_head: *const c_void,
}

/// Quantized blocks of the step's five matrices (the layers share them), in `StepShape`'s order.
pub struct StepBlocks<'b> {
    pub in_proj: &'b [u8],
    pub out_proj: &'b [u8],
    pub gating_in: &'b [u8],
    pub gating_out: &'b [u8],
    pub text_head: &'b [u8],
}

/// One decode step of a transformer built as llama.cpp builds its decode graph: `layers` layers
/// of attention (fused QKV, rotary embedding, an f16 KV cache of `kv_positions`) and a gated
/// feed-forward, then the output norm and the head. One ggml graph.
pub struct Step<'a> {
    handle: *mut c_void,
    _runtime: &'a Runtime,
    dim: usize,
    vocab: usize,
}

impl<'a> Step<'a> {
    /// Sizes: `(layers, dim, heads, hidden, vocab, kv_positions)`; `blocks` of `ty` for each
    /// matrix (checked against the sizes), in CPU_REPACK with `repack`.
    pub fn new(
        runtime: &'a Runtime,
        ty: GgmlType,
        repack: bool,
        (layers, dim, heads, hidden, vocab, kv_positions): (
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
        ),
        blocks: &StepBlocks<'_>,
    ) -> Result<Self, String> {
        for (name, b, rows, cols) in [
            ("in_proj", blocks.in_proj, 3 * dim, dim),
            ("out_proj", blocks.out_proj, dim, dim),
            ("gating_in", blocks.gating_in, 2 * hidden, dim),
            ("gating_out", blocks.gating_out, dim, hidden),
            ("text_head", blocks.text_head, vocab, dim),
        ] {
            let want = ty.matrix_bytes(rows, cols)?;
            if b.len() != want {
                return Err(format!("{name}: {} bytes, expected {want}", b.len()));
            }
        }
        let shape = StepShape {
            layers: layers as i64,
            dim: dim as i64,
            heads: heads as i64,
            hidden: hidden as i64,
            vocab: vocab as i64,
            kv_positions: kv_positions as i64,
            in_proj: blocks.in_proj.as_ptr().cast(),
            out_proj: blocks.out_proj.as_ptr().cast(),
            gating_in: blocks.gating_in.as_ptr().cast(),
            gating_out: blocks.gating_out.as_ptr().cast(),
            text_head: blocks.text_head.as_ptr().cast(),
        };
        let mut error = [0u8; 256];
        // SAFETY: the shape's block pointers hold the sizes checked above and outlive the call
        // (ggml copies them into its own buffers).
        let handle = unsafe {
            peer_step_new(
                runtime.0,
                ty.0,
                repack.into(),
                &shape,
                error.as_mut_ptr().cast(),
                error.len(),
            )
        };
        if handle.is_null() {
            return Err(format!("ggml: {}", error_text(&error)));
        }
        Ok(Self {
            handle,
            _runtime: runtime,
            dim,
            vocab,
        })
    }

    /// One step on the input `x`; the text logits into `logits` when given.
    pub fn compute(&self, x: &[f32], logits: Option<&mut [f32]>) -> Result<(), String> {
        assert_eq!(x.len(), self.dim);
        let out = match logits {
            Some(l) => {
                assert_eq!(l.len(), self.vocab);
                l.as_mut_ptr()
            }
            None => std::ptr::null_mut(),
        };
        // SAFETY: a live handle; `x` and `logits` hold dim and vocab floats.
        match unsafe { peer_step_compute(self.handle, x.as_ptr(), out) } {
            0 => Ok(()),
            _ => Err("ggml: the step's graph failed".into()),
        }
    }
}

impl Drop for Step<'_> {
    fn drop(&mut self) {
        // SAFETY: owned, freed once.
        unsafe { peer_step_free(self.handle) }
    }
}
