//! Multi-head self-attention for the LM and Mimi: fused q/k/v projection (`[dim + 2 * kv_dim,
//! dim]`, head-major rows as in PyTorch; `kv_dim = dim` but for grouped-query attention, where
//! query head `h` reads key/value head `h / kv_repeat`, as Kyutai's `expand_repeated_kv`),
//! optional RoPE, a ring KV cache of `kv_dim` wide rows and the output projection, no biases.
//! Two ways in:
//! - [`Attention::step_rows`] (the LM): `m` rows, each one new position of its own stream over its
//!   own cache: the sessions of a batch share the projections (weights read once) and attend
//!   apart, each at its own position.
//! - [`Attention::forward_streams`] (Mimi): `t` consecutive positions of each of several streams
//!   (sessions; one for a single stream), each over its own ring cache (streaming, as PyTorch's
//!   `RingKVCache`: the chunk's keys are written first, then the query at `p` sees the held keys
//!   with `p - context < p' <= p`), the projections shared;
//!   [`Attention::forward_sequence`]: a whole sequence without a cache (non-streaming).
//!
//! Scores are dot products in the fixed order of `moshi_kernels::dense`, 4 cached positions per
//! step; values are accumulated position by position in the order given. An 8-bit cache's codes
//! go through the same kernels, each head's scale applied to its dot product (keys) and to its
//! attention weight (values). A single row's heads are split over the thread team when its cache
//! is large; the rows of a batched step (or of Mimi's streams) attend in one team region, a row
//! (or some of its heads) a part. Each head's arithmetic is the same whoever runs it.

use std::cell::RefCell;
use std::ops::Range;

use moshi_kernels::dense::{accumulate_rows, dot_rows, prefetch_l1};
use moshi_kernels::{Kernel, WeightElem};

use super::kv_cache::{KvCache, KvRows};
use super::linear::Linear;
use super::rope::RopeRotation;

/// Above this many cached floats (keys of all heads), heads are processed on several threads.
const PARALLEL_MIN_CACHE_FLOATS: usize = 1 << 16;

/// Cached positions per step of both passes: each head's query is loaded once for this many key
/// rows, and its output loaded and stored once for this many value rows.
const POSITIONS_PER_STEP: usize = 4;

/// Cached positions ahead of the step whose keys (values) are prefetched, head by head. A thread
/// reads its heads' part of each position (4 KiB of a 7B bf16 row on 2 threads): each part starts
/// a new page, where the hardware prefetcher stops, so without it every part waited for DRAM.
/// 8 ahead measured clearly faster than no prefetch and no slower than 4 or 16 (figures:
/// docs/performance.md, "Why the kernels are shaped as they are").
const PREFETCH_POSITIONS: usize = 8;

thread_local! {
    /// Scores of the heads a thread attends in the threaded path (reused across calls).
    static GROUP_SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Weights of one attention block.
#[derive(Clone, Debug)]
pub struct Attention {
    in_proj: Linear,
    out_proj: Linear,
    num_heads: usize,
    /// Key/value heads: `num_heads` but for grouped-query attention.
    kv_heads: usize,
    head_dim: usize,
}

/// Reusable buffers of an attention block.
#[derive(Clone, Debug, Default)]
pub struct AttentionScratch {
    qkv: Vec<f32>,
    attended: Vec<f32>,
    scores: Vec<f32>,
}

/// Where the keys and values a query attends over are: rows `segments` (in that order) of
/// `keys`/`values`, row `j` at `j * stride`, 8-bit codes with their `scales`.
pub(super) struct Rows<'a, E> {
    pub(super) keys: &'a [E],
    pub(super) values: &'a [E],
    pub(super) stride: usize,
    pub(super) segments: [Range<usize>; 2],
    pub(super) scales: Option<HeadScales<'a>>,
}

/// The scales of 8-bit keys and values: key/value head `g` of row `j` is its codes times
/// `keys[j * heads + g]` (`values[..]`).
#[derive(Clone, Copy)]
pub(super) struct HeadScales<'a> {
    pub(super) keys: &'a [f32],
    pub(super) values: &'a [f32],
    pub(super) heads: usize,
}

impl<E> Rows<'_, E> {
    fn len(&self) -> usize {
        self.segments.iter().map(|s| s.len()).sum()
    }

    /// `dot`, a query's dot product with key head `g`'s stored elements at row `j`, in the keys'
    /// units (times the head's scale where the keys are 8-bit codes).
    #[inline(always)]
    fn key_units(&self, dot: f32, j: usize, g: usize) -> f32 {
        match &self.scales {
            None => dot,
            Some(s) => dot * s.keys[j * s.heads + g],
        }
    }

    /// `weight`, a row's attention weight, times value head `g`'s scale at row `j` where the
    /// values are 8-bit codes.
    #[inline(always)]
    fn value_units(&self, weight: f32, j: usize, g: usize) -> f32 {
        match &self.scales {
            None => weight,
            Some(s) => weight * s.values[j * s.heads + g],
        }
    }
}

impl Attention {
    /// `num_heads` query heads; the key/value heads follow from `in_proj`'s rows
    /// (`dim + 2 * kv_heads * head_dim`, checked against the config by the loader).
    pub fn new(in_proj: Linear, out_proj: Linear, num_heads: usize) -> Self {
        let dim = out_proj.out_dim();
        let head_dim = dim / num_heads;
        let kv_heads = in_proj.out_dim().saturating_sub(dim) / 2 / head_dim.max(1);
        debug_assert_eq!(in_proj.out_dim(), dim + 2 * kv_heads * head_dim);
        debug_assert!(kv_heads > 0 && num_heads.is_multiple_of(kv_heads));
        Self {
            in_proj,
            out_proj,
            num_heads,
            kv_heads,
            head_dim,
        }
    }

    pub fn dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Width of one position's keys (and values): what a KV cache row of this block holds.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Query heads per key/value head (`kv_repeat`; 1 but for grouped-query attention).
    pub fn kv_repeat(&self) -> usize {
        self.num_heads / self.kv_heads
    }

    /// Width of one projected row: queries, keys, values.
    fn qkv_width(&self) -> usize {
        self.dim() + 2 * self.kv_dim()
    }

    pub fn num_heads(&self) -> usize {
        self.num_heads
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    pub fn in_proj(&self) -> &Linear {
        &self.in_proj
    }

    pub fn out_proj(&self) -> &Linear {
        &self.out_proj
    }

    /// Mutable projections (Mimi sets their reduced copies).
    pub fn projections_mut(&mut self) -> [&mut Linear; 2] {
        [&mut self.in_proj, &mut self.out_proj]
    }

    /// Bytes of weights read per step (few rows).
    pub fn weight_bytes(&self) -> usize {
        self.in_proj.weight_bytes() + self.out_proj.weight_bytes()
    }

    /// `m` rows of `xs` (`[m, dim]`, already normalised), row `i` one new position of its own
    /// stream: rotated by `rotations[i]` (if any), pushed into `caches[i]`, attending over that
    /// cache. Writes the projected results into `out` (`[m, dim]`). Row `i`'s result does not
    /// depend on the other rows.
    ///
    /// # Panics
    /// If the slices disagree on `m` (caller bug).
    pub fn step_rows(
        &self,
        xs: &[f32],
        m: usize,
        rotations: Option<&[RopeRotation]>,
        caches: &mut [&mut KvCache],
        scratch: &mut AttentionScratch,
        out: &mut [f32],
    ) {
        let dim = self.dim();
        assert!(
            caches.len() == m && rotations.is_none_or(|r| r.len() == m),
            "attention: {m} rows, {} caches",
            caches.len()
        );
        self.project_and_rotate(xs, m, rotations, scratch);
        let kv_dim = self.kv_dim();
        for (qkv, cache) in scratch
            .qkv
            .chunks_exact(self.qkv_width())
            .zip(caches.iter_mut())
        {
            cache.push(&qkv[dim..dim + kv_dim], &qkv[dim + kv_dim..]);
        }
        // Each row over its whole cache, in slot order.
        let whole = |cache: &KvCache, _: usize| [0..cache.len(), 0..0];
        self.attend_rows(caches, &whole, scratch);
        self.out_proj.forward(&scratch.attended, m, out);
    }

    /// Each row of `scratch.qkv` (projected and rotated, its key and value already pushed)
    /// attends over the slots `segments(cache, i)` of its cache into its row of
    /// `scratch.attended`: the rows are `caches.len()` equal chunks, row `i` of a chunk reading
    /// that chunk's cache. A single row splits its heads over the team when its cache is large;
    /// several share one team region ([`Attention::attend_parts`]).
    fn attend_rows(
        &self,
        caches: &[&mut KvCache],
        segments: &Segments<'_>,
        scratch: &mut AttentionScratch,
    ) {
        let AttentionScratch {
            qkv,
            attended,
            scores,
        } = scratch;
        match caches {
            [cache] if attended.len() == self.dim() => {
                let (q, window) = (&qkv[..self.dim()], segments(cache, 0));
                self.attend_cache(q, cache, window, HeadSpan::All, attended, scores);
            }
            _ => self.attend_parts(qkv, caches, segments, crate::team::threads(), attended),
        }
    }

    /// [`Attention::attend_rows`] of several rows in one team region of parts for `threads`
    /// threads: a row a part, or with fewer rows than threads, a row's heads in several parts.
    fn attend_parts(
        &self,
        qkv: &[f32],
        caches: &[&mut KvCache],
        segments: &Segments<'_>,
        threads: usize,
        attended: &mut [f32],
    ) {
        let (dim, hd, width) = (self.dim(), self.head_dim, self.qkv_width());
        let (rows, heads) = (attended.len() / dim, self.num_heads);
        let rows_per_cache = rows / caches.len().max(1);
        let parts_per_row = threads.div_ceil(rows.max(1)).clamp(1, heads);
        // Parts of whole heads, equal within a row (`run_chunks_mut` cuts evenly).
        let heads_per_part = (heads.div_ceil(parts_per_row)..=heads)
            .find(|&d| heads.is_multiple_of(d))
            .unwrap_or(heads);
        crate::team::run_chunks_mut(attended, heads_per_part * hd, &|first, out| {
            let (row, column) = (first / dim, first % dim);
            let cache = &*caches[row / rows_per_cache];
            let window = segments(cache, row % rows_per_cache);
            let q = &qkv[row * width + column..][..out.len()];
            let span = HeadSpan::From(column / hd);
            GROUP_SCORES
                .with_borrow_mut(|scores| self.attend_cache(q, cache, window, span, out, scores));
        });
    }

    /// `t` rows of `xs` (`[t, dim]`, already normalised): a whole sequence of one stream (no
    /// cache; streaming chunks go through [`Attention::forward_streams`]), row `i` rotated by
    /// `rotations[i]` (if any); the query at `p` attends over rows `max(0, p + 1 - context)..=p`.
    /// Writes the projected results into `out` (`[t, dim]`).
    ///
    /// # Panics
    /// If the slices disagree on `t` (caller bug).
    pub fn forward_sequence(
        &self,
        xs: &[f32],
        t: usize,
        rotations: Option<&[RopeRotation]>,
        context: usize,
        scratch: &mut AttentionScratch,
        out: &mut [f32],
    ) {
        let dim = self.dim();
        assert!(
            rotations.is_none_or(|r| r.len() == t),
            "one rotation per row"
        );
        self.project_and_rotate(xs, t, rotations, scratch);
        let (qkv, width) = (&scratch.qkv, self.qkv_width());
        // Keys and values read in place from the qkv rows.
        let (keys, values) = (&qkv[dim..], &qkv[dim + self.kv_dim()..]);
        for (p, attended) in scratch.attended.chunks_exact_mut(dim).enumerate() {
            let rows = Rows {
                keys,
                values,
                stride: width,
                segments: [(p + 1).saturating_sub(context)..p + 1, 0..0],
                scales: None,
            };
            let q = &qkv[p * width..p * width + dim];
            self.attend(q, &rows, HeadSpan::All, attended, &mut scratch.scores);
        }
        self.out_proj.forward(&scratch.attended, t, out);
    }

    /// `streams` chunks of `t` rows of `xs` (`[streams * t, dim]`, already normalised), chunk `s`
    /// the next `t` positions of stream `s` (streaming, as PyTorch's `RingKVCache`): row `i`
    /// rotated by `rotations[i]` (if any), the chunk's keys and values pushed into `caches[s]`
    /// first (`t <= capacity`, positions counted from the cache's last reset), then the query at
    /// `p` attends over the held positions `p' > p - capacity`. The projections take every row at
    /// once (their weights read once for all streams); each stream's rows get the bits they get
    /// as the only stream while the projections give each row its own bits at `streams * t` rows
    /// ([`Linear::same_bits_rows`]).
    ///
    /// # Panics
    /// If a chunk does not fit its cache or the slices disagree on `streams` and `t` (caller
    /// bug).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_streams(
        &self,
        xs: &[f32],
        streams: usize,
        t: usize,
        rotations: Option<&[RopeRotation]>,
        caches: &mut [&mut KvCache],
        scratch: &mut AttentionScratch,
        out: &mut [f32],
    ) {
        let (dim, rows) = (self.dim(), streams * t);
        assert!(
            caches.len() == streams && rotations.is_none_or(|r| r.len() == rows),
            "attention: {streams} streams of {t} rows, {} caches",
            caches.len()
        );
        self.project_and_rotate(xs, rows, rotations, scratch);
        if t > 0 {
            let (kv_dim, width) = (self.kv_dim(), self.qkv_width());
            for (qkv, cache) in scratch.qkv.chunks_exact(t * width).zip(caches.iter_mut()) {
                assert!(t <= cache.capacity(), "a chunk of {t} exceeds the context");
                for row in qkv.chunks_exact(width) {
                    cache.push(&row[dim..dim + kv_dim], &row[dim + kv_dim..]);
                }
            }
            // The query at position p sees the held positions p' > p - capacity, oldest first.
            let window = |cache: &KvCache, i: usize| {
                let last = cache.positions_seen();
                let p = last - t + i;
                let oldest = (last - cache.len()).max((p + 1).saturating_sub(cache.capacity()));
                cache.slots(oldest, p)
            };
            self.attend_rows(caches, &window, scratch);
        }
        self.out_proj.forward(&scratch.attended, rows, out);
    }

    /// The projected queries, keys and values of the `rows` rows of `xs` into `scratch.qkv`
    /// (`[rows, dim + 2 * kv_dim]`), queries and keys rotated by `rotations` (one per row, if
    /// any); `scratch.attended` sized for the rows.
    fn project_and_rotate(
        &self,
        xs: &[f32],
        rows: usize,
        rotations: Option<&[RopeRotation]>,
        scratch: &mut AttentionScratch,
    ) {
        let dim = self.dim();
        scratch.qkv.resize(rows * self.qkv_width(), 0.0);
        scratch.attended.resize(rows * dim, 0.0);
        self.in_proj.forward(xs, rows, &mut scratch.qkv);
        if let Some(rotations) = rotations {
            rotate_queries_and_keys(&mut scratch.qkv, dim, self.kv_dim(), rotations);
        }
    }

    /// [`Attention::attend`] over the slots `segments` (in that order) of `cache`, f32, bf16 or
    /// 8-bit.
    fn attend_cache(
        &self,
        q: &[f32],
        cache: &KvCache,
        segments: [Range<usize>; 2],
        span: HeadSpan,
        attended: &mut [f32],
        scores: &mut Vec<f32>,
    ) {
        let stride = self.kv_dim();
        match cache.rows() {
            KvRows::F32 { keys, values } => {
                let rows = Rows {
                    keys,
                    values,
                    stride,
                    segments,
                    scales: None,
                };
                self.attend(q, &rows, span, attended, scores)
            }
            KvRows::Bf16 { keys, values } => {
                let rows = Rows {
                    keys,
                    values,
                    stride,
                    segments,
                    scales: None,
                };
                self.attend(q, &rows, span, attended, scores)
            }
            KvRows::I8 {
                keys,
                values,
                key_scales,
                value_scales,
                head_dim,
            } => {
                assert_eq!(
                    head_dim, self.head_dim,
                    "an 8-bit cache's scales are per head"
                );
                let rows = Rows {
                    keys,
                    values,
                    stride,
                    segments,
                    scales: Some(HeadScales {
                        keys: key_scales,
                        values: value_scales,
                        heads: stride / head_dim,
                    }),
                };
                self.attend(q, &rows, span, attended, scores)
            }
        }
    }

    /// The heads `span` of this block attend from `q` over `rows` into `attended`.
    fn attend<E: WeightElem>(
        &self,
        q: &[f32],
        rows: &Rows<'_, E>,
        span: HeadSpan,
        attended: &mut [f32],
        scores: &mut Vec<f32>,
    ) {
        let heads = Heads {
            count: self.num_heads,
            kv_repeat: self.kv_repeat(),
            dim: self.head_dim,
        };
        match span {
            HeadSpan::All => attend_over(heads, q, rows, attended, scores),
            HeadSpan::From(first) => attend_span(heads, first, q, rows, scores, attended),
        }
    }
}

/// The query heads one call attends: all of a block's (split over the team when the cache is
/// large), or those from head `first` on that the query slice holds, on the calling thread.
#[derive(Clone, Copy, Debug)]
enum HeadSpan {
    All,
    From(usize),
}

/// The slots (in that order) a row attends over, given its cache and its index in its chunk.
type Segments<'a> = dyn Fn(&KvCache, usize) -> [Range<usize>; 2] + Sync + 'a;

/// The heads of an attention: `count` query heads of width `dim`, query head `h` reading
/// key/value head `h / kv_repeat`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Heads {
    pub(super) count: usize,
    pub(super) kv_repeat: usize,
    pub(super) dim: usize,
}

/// `attended` (`[num_heads * head_dim]`) = every head's attention from `q` over `rows` (no mask:
/// every row is attended); `scores` is scratch.
pub(super) fn attend_over<E: WeightElem>(
    heads: Heads,
    q: &[f32],
    rows: &Rows<'_, E>,
    attended: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let (num_heads, head_dim) = (heads.count, heads.dim);
    let dim = num_heads * head_dim;
    let (hd, n) = (head_dim, rows.len());
    if n * dim >= PARALLEL_MIN_CACHE_FLOATS && num_heads > 1 {
        // Contiguous groups of heads per thread of the team (no futex wake-up per call); each
        // group streams its part of every cached row, with its scores in a buffer of the
        // thread that runs it.
        let groups = crate::team::threads().clamp(1, num_heads);
        let heads_per_group = num_heads.div_ceil(groups);
        crate::team::run_chunks_mut(attended, heads_per_group * hd, &|first, o| {
            let q = &q[first..first + o.len()];
            GROUP_SCORES
                .with_borrow_mut(|scores| attend_span(heads, first / hd, q, rows, scores, o));
        });
    } else {
        attend_span(heads, 0, q, rows, scores, attended);
    }
}

/// The query heads `first..` of `heads` that `q` holds (`out` as wide) attend over `rows`, on
/// the calling thread; `scores` is scratch.
fn attend_span<E: WeightElem>(
    heads: Heads,
    first: usize,
    q: &[f32],
    rows: &Rows<'_, E>,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let hd = heads.dim;
    let scale = 1.0 / (hd as f32).sqrt();
    scores.resize(q.len() / hd * rows.len(), 0.0);
    attend_heads(q, rows, HeadRange { first, heads }, scale, scores, out);
}

/// Rotates the query (`dim` wide) and the key (`kv_dim`) of each projected row of `qkv`
/// (`[q, k, v]`) by its rotation.
fn rotate_queries_and_keys(qkv: &mut [f32], dim: usize, kv_dim: usize, rotations: &[RopeRotation]) {
    for (row, rot) in qkv.chunks_exact_mut(dim + 2 * kv_dim).zip(rotations) {
        let (q, kv) = row.split_at_mut(dim);
        rot.apply(q);
        rot.apply(&mut kv[..kv_dim]);
    }
}

/// The query heads `first..` of a block's `heads` that one call of [`attend_heads`] attends.
#[derive(Clone, Copy, Debug)]
struct HeadRange {
    first: usize,
    heads: Heads,
}

impl HeadRange {
    /// The key/value head that local query head `h` reads.
    fn kv_head(&self, h: usize) -> usize {
        (self.first + h) / self.heads.kv_repeat
    }

    /// Column of the key/value head that local query head `h` reads.
    fn kv_column(&self, h: usize) -> usize {
        self.kv_head(h) * self.heads.dim
    }
}

/// Prefetches columns `col..col + len` of the [`POSITIONS_PER_STEP`] rows (`stride` apart in
/// `data`) [`PREFETCH_POSITIONS`] after row `j`. A hint: rows past the data are harmless.
#[inline(always)]
fn prefetch_ahead<E>(data: &[E], stride: usize, j: usize, col: usize, len: usize) {
    for r in 0..POSITIONS_PER_STEP {
        let at = (j + PREFETCH_POSITIONS + r) * stride + col;
        prefetch_l1(data.as_ptr().wrapping_add(at), len);
    }
}

/// Query heads `range.first ..` (as many as `q.len() / hd`): `out_h = softmax(q_h · K_gᵀ * scale)
/// · V_g`, `g` the key/value head of `h`, over the rows of `rows` (`n = scores.len() / heads` of
/// them), in segment order. Rows are walked in order so every cached row is read once,
/// contiguously, for all heads of the group.
fn attend_heads<E: WeightElem>(
    q: &[f32],
    rows: &Rows<'_, E>,
    range: HeadRange,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let hd = range.heads.dim;
    let heads = q.len() / hd;
    if heads == 0 {
        return;
    }
    let n = scores.len() / heads;
    let kernel = Kernel::detect();
    // Key/value head columns of the group's query heads.
    let (first_col, end_col) = (range.kv_column(0), range.kv_column(heads - 1) + hd);
    let col = |h: usize| range.kv_column(h) - first_col;
    let key = |j: usize| &rows.keys[j * rows.stride + first_col..j * rows.stride + end_col];
    let value = |j: usize| &rows.values[j * rows.stride + first_col..j * rows.stride + end_col];
    // Scores: POSITIONS_PER_STEP cached keys per step, each head's dot products taken together
    // (every dot product in the fixed order, as one at a time).
    let mut at = 0;
    for segment in rows.segments.iter().cloned() {
        let mut j = segment.start;
        while j + POSITIONS_PER_STEP <= segment.end {
            let ks: [&[E]; POSITIONS_PER_STEP] = std::array::from_fn(|r| key(j + r));
            for (h, qh) in q.chunks_exact(hd).enumerate() {
                let c = col(h);
                prefetch_ahead(rows.keys, rows.stride, j, first_col + c, hd);
                let g = range.kv_head(h);
                let dots = dot_rows(kernel, ks.map(|k| &k[c..c + hd]), qh);
                for (r, &d) in dots.iter().enumerate() {
                    scores[h * n + at + r] = rows.key_units(d, j + r, g) * scale;
                }
            }
            j += POSITIONS_PER_STEP;
            at += POSITIONS_PER_STEP;
        }
        for j in j..segment.end {
            let k = key(j);
            for (h, qh) in q.chunks_exact(hd).enumerate() {
                let c = col(h);
                let d = dot_rows(kernel, [&k[c..c + hd]], qh)[0];
                scores[h * n + at] = rows.key_units(d, j, range.kv_head(h)) * scale;
            }
            at += 1;
        }
    }
    for sh in scores.chunks_exact_mut(n) {
        let max = sh.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for s in sh.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        let inv = 1.0 / sum;
        for s in sh.iter_mut() {
            *s *= inv;
        }
    }
    // out_h += p_hj · v_hj in row order, POSITIONS_PER_STEP rows per call (the same sums, in the
    // same order, as one row at a time).
    out.fill(0.0);
    let mut at = 0;
    for segment in rows.segments.iter().cloned() {
        let mut j = segment.start;
        while j + POSITIONS_PER_STEP <= segment.end {
            let vs: [&[E]; POSITIONS_PER_STEP] = std::array::from_fn(|r| value(j + r));
            for (h, o) in out.chunks_exact_mut(hd).enumerate() {
                let c = col(h);
                prefetch_ahead(rows.values, rows.stride, j, first_col + c, hd);
                let g = range.kv_head(h);
                accumulate_rows(
                    kernel,
                    o,
                    std::array::from_fn(|r| rows.value_units(scores[h * n + at + r], j + r, g)),
                    vs.map(|v| &v[c..c + hd]),
                );
            }
            j += POSITIONS_PER_STEP;
            at += POSITIONS_PER_STEP;
        }
        for j in j..segment.end {
            let v = value(j);
            for (h, o) in out.chunks_exact_mut(hd).enumerate() {
                let c = col(h);
                let weight = rows.value_units(scores[h * n + at], j, range.kv_head(h));
                accumulate_rows(kernel, o, [weight], [&v[c..c + hd]]);
            }
            at += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::KvPrecision;

    /// Small caches run on the calling thread, large ones split heads over threads: both must
    /// equal a naive f64 attention over the explicit last `window` positions, in f32, bf16 and
    /// 8-bit caches (the naive attention then takes the keys and values as stored: rounded to
    /// bf16, or each head's codes times its scale).
    #[test]
    fn ring_window_equals_explicit_last_positions() {
        for precision in [KvPrecision::F32, KvPrecision::Bf16, KvPrecision::I8] {
            // Every head its own keys, then grouped-query attention (kv_repeat 2 and 4).
            for kv_repeat in [1, 2, 4] {
                check_against_naive(16, 4, kv_repeat, 4, 9, precision);
                // 256 * 300 cached floats >= PARALLEL_MIN_CACHE_FLOATS: the threaded path.
                const { assert!(256 * 300 >= PARALLEL_MIN_CACHE_FLOATS) };
                check_against_naive(256, 4, kv_repeat, 300, 310, precision);
            }
        }
    }

    fn check_against_naive(
        dim: usize,
        heads: usize,
        kv_repeat: usize,
        window: usize,
        steps: usize,
        precision: KvPrecision,
    ) {
        // A head's values as the cache holds them.
        let stored = |head: Vec<f32>| -> Vec<f32> {
            match precision {
                KvPrecision::F32 => head,
                KvPrecision::Bf16 => head
                    .iter()
                    .map(|&v| half::bf16::from_f32(v).to_f32())
                    .collect(),
                KvPrecision::I8 => {
                    let scale = head.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                    head.iter().map(|&v| (v / scale).round() * scale).collect()
                }
            }
        };
        let eye = |n: usize| {
            let mut w = vec![0f32; n * n];
            for i in 0..n {
                w[i * n + i] = 1.0;
            }
            w
        };
        // in_proj = [I; 0.5 I'; 2 I'] (I' the first kv_dim rows of I) so q = x and, for key/value
        // head g, k = x_g / 2, v = 2 x_g (x_g the g-th head_dim slice of x); out_proj = I.
        let kv_dim = dim / kv_repeat;
        let mut in_w = eye(dim);
        in_w.extend(eye(dim)[..kv_dim * dim].iter().map(|v| v * 0.5));
        in_w.extend(eye(dim)[..kv_dim * dim].iter().map(|v| v * 2.0));
        let attn = Attention::new(
            Linear::f32(in_w, dim + 2 * kv_dim, dim),
            Linear::f32(eye(dim), dim, dim),
            heads,
        );
        assert_eq!((attn.kv_dim(), attn.kv_repeat()), (kv_dim, kv_repeat));
        let hd = dim / heads;
        let mut cache = KvCache::with_precision(window, kv_dim, hd, precision);
        let mut scratch = AttentionScratch::default();
        let xs: Vec<Vec<f32>> = (0..steps)
            .map(|p| {
                (0..dim)
                    .map(|i| ((p * dim + i) as f32 * 0.37).sin())
                    .collect()
            })
            .collect();
        for (p, x) in xs.iter().enumerate() {
            let mut out = vec![0f32; dim];
            attn.step_rows(x, 1, None, &mut [&mut cache], &mut scratch, &mut out);
            let first = (p + 1).saturating_sub(window);
            for h in 0..heads {
                let r = h * hd..(h + 1) * hd;
                let g = h / kv_repeat;
                let kv = g * hd..(g + 1) * hd;
                let key = |j: usize| stored(xs[j][kv.clone()].iter().map(|b| b * 0.5).collect());
                let value = |j: usize| stored(xs[j][kv.clone()].iter().map(|b| b * 2.0).collect());
                let scores: Vec<f64> = (first..=p)
                    .map(|j| {
                        xs[p][r.clone()]
                            .iter()
                            .zip(key(j))
                            .map(|(a, b)| (a * b) as f64)
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                let values: Vec<Vec<f32>> = (first..=p).map(value).collect();
                for (i, o) in r.clone().enumerate() {
                    let expect: f64 = values
                        .iter()
                        .zip(&scores)
                        .map(|(v, s)| (s - m).exp() / z * v[i] as f64)
                        .sum();
                    assert!(
                        (out[o] as f64 - expect).abs() < 1e-5,
                        "{precision:?} pos {p} head {h}: {} vs {expect}",
                        out[o]
                    );
                }
            }
        }
        assert_eq!(cache.len(), window);
    }

    fn random_attention(dim: usize, heads: usize, seed: u64) -> Attention {
        let mut rng = crate::rng::Rng::new(seed);
        let mut w = |n: usize| (0..n).map(|_| rng.next_f32() - 0.5).collect::<Vec<f32>>();
        Attention::new(
            Linear::f32(w(3 * dim * dim), 3 * dim, dim),
            Linear::f32(w(dim * dim), dim, dim),
            heads,
        )
    }

    /// Rows of one batched step, each over its own cache at its own position, give the bits each
    /// row gets alone.
    #[test]
    fn batched_rows_equal_each_row_alone_bit_for_bit() {
        for precision in [KvPrecision::F32, KvPrecision::I8] {
            batched_rows_equal_each_row_alone(precision);
        }
    }

    fn batched_rows_equal_each_row_alone(precision: KvPrecision) {
        let (dim, heads) = (32, 4);
        let attn = random_attention(dim, heads, 3);
        let rope = crate::nn::Rope::new(dim / heads, 10000.0);
        let history = [5usize, 0, 12];
        let input = |s: usize, p: usize| -> Vec<f32> {
            (0..dim)
                .map(|i| ((s * 1000 + p * dim + i) as f32 * 0.29).sin())
                .collect()
        };
        let mut alone: Vec<KvCache> = (0..3)
            .map(|_| KvCache::with_precision(8, dim, dim / heads, precision))
            .collect();
        let mut batched = alone.clone();
        let mut scratch = AttentionScratch::default();
        // Sessions at different positions: fill each cache with its own history first.
        for (s, &len) in history.iter().enumerate() {
            for p in 0..len {
                let mut rot = crate::nn::RopeRotation::default();
                rope.rotation_into(p, &mut rot);
                let mut out = vec![0f32; dim];
                let x = input(s, p);
                for cache in [&mut alone[s], &mut batched[s]] {
                    attn.step_rows(
                        &x,
                        1,
                        Some(std::slice::from_ref(&rot)),
                        &mut [cache],
                        &mut scratch,
                        &mut out,
                    );
                }
            }
        }
        for step in 0..3 {
            let rots: Vec<crate::nn::RopeRotation> = history
                .iter()
                .map(|&len| {
                    let mut rot = crate::nn::RopeRotation::default();
                    rope.rotation_into(len + step, &mut rot);
                    rot
                })
                .collect();
            let xs: Vec<f32> = (0..3).flat_map(|s| input(s, history[s] + step)).collect();
            let mut out = vec![0f32; 3 * dim];
            let mut caches: Vec<&mut KvCache> = batched.iter_mut().collect();
            attn.step_rows(&xs, 3, Some(&rots), &mut caches, &mut scratch, &mut out);
            // The same attention in parts for 8 threads (each row's heads in parts of 1 head).
            let mut split = vec![0f32; 3 * dim];
            let whole = |cache: &KvCache, _: usize| [0..cache.len(), 0..0];
            attn.attend_parts(&scratch.qkv, &caches, &whole, 8, &mut split);
            assert_eq!(
                split, scratch.attended,
                "step {step}: parts of single heads"
            );
            for s in 0..3 {
                let mut one = vec![0f32; dim];
                attn.step_rows(
                    &xs[s * dim..(s + 1) * dim],
                    1,
                    Some(&rots[s..s + 1]),
                    &mut [&mut alone[s]],
                    &mut scratch,
                    &mut one,
                );
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&out[s * dim..(s + 1) * dim]),
                    bits(&one),
                    "step {step} session {s}"
                );
            }
        }
    }

    /// Streaming chunks over a ring equal the whole sequence at once until the ring drops a
    /// position the whole-sequence window still holds (the first query of a chunk).
    #[test]
    fn chunks_over_a_ring_equal_the_whole_sequence_within_the_window() {
        let (dim, heads, context) = (16, 2, 6);
        let attn = random_attention(dim, heads, 9);
        let t = 5;
        let xs: Vec<f32> = (0..t * dim).map(|i| (i as f32 * 0.41).cos()).collect();
        let mut scratch = AttentionScratch::default();
        let mut whole = vec![0f32; t * dim];
        attn.forward_sequence(&xs, t, None, context, &mut scratch, &mut whole);
        let mut cache = KvCache::new(context, dim);
        let mut streamed = vec![0f32; t * dim];
        for (x, o) in xs.chunks(2 * dim).zip(streamed.chunks_mut(2 * dim)) {
            let rows = x.len() / dim;
            attn.forward_streams(x, 1, rows, None, &mut [&mut cache], &mut scratch, o);
        }
        let diff = whole
            .iter()
            .zip(&streamed)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-6, "stream vs whole {diff}");
        assert_eq!(cache.positions_seen(), t);
    }
}
