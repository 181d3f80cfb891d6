//! A ring buffer of keys and values holding at most `capacity` positions (the attention
//! window, current position included), for the LM and Mimi alike. Position `p` (counted from the
//! last reset) lives in slot `p % capacity`. Memory is bounded by `capacity` whatever the session
//! length; storage grows lazily up to that bound, its next pages faulted in ahead of the pushes
//! by the thread team's idle helpers ([`PagesAhead`]).

use moshi_kernels::pages_ahead::PagesAhead;

/// Element type of the cached keys and values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvPrecision {
    /// f32, exact (the default; what the exactness tests compare against the official runs).
    #[default]
    F32,
    /// bf16, rounded to nearest even on push, as PyTorch's `.to(torch.bfloat16)`: half the memory
    /// and half the bytes attention reads per step.
    Bf16,
    /// 8-bit codes with one f32 scale per head of a position (`max |x| / 127`, rounded to
    /// nearest): a quarter of f32's memory and bytes read, plus the scales (1/32 more at heads of
    /// 128). An approximation of its own (docs/performance.md, "8-bit keys and values").
    I8,
}

impl KvPrecision {
    /// Bytes one position of `width` values in heads of `head_dim` takes in one of the two
    /// streams (keys or values), scales included.
    pub fn bytes_per_position(self, width: usize, head_dim: usize) -> usize {
        match self {
            KvPrecision::F32 => 4 * width,
            KvPrecision::Bf16 => 2 * width,
            KvPrecision::I8 => width + 4 * width.div_ceil(head_dim.max(1)),
        }
    }

    /// `f32`, `bf16` or `i8` (command line and reports).
    pub fn name(self) -> &'static str {
        match self {
            KvPrecision::F32 => "f32",
            KvPrecision::Bf16 => "bf16",
            KvPrecision::I8 => "i8",
        }
    }
}

impl std::fmt::Display for KvPrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvPrecision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [KvPrecision::F32, KvPrecision::Bf16, KvPrecision::I8]
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown KV cache precision `{s}` (expected f32, bf16 or i8)"))
    }
}

/// One head's values as 8-bit codes `round(x / scale)` with `scale = max |x| / 127` (0 for a
/// head of zeros, whose codes are then 0); returns the scale. A non-finite value makes the scale
/// non-finite, so attention over the head gives NaN as it would over the f32 values.
fn quantize_head(head: &[f32], codes: &mut [i8]) -> f32 {
    let max = head.iter().fold(0f32, |m, &x| m.max(x.abs()));
    let max = if head.iter().any(|x| !x.is_finite()) {
        f32::NAN
    } else {
        max
    };
    let scale = max / 127.0;
    if scale == 0.0 || !scale.is_finite() {
        codes.fill(0);
        return scale;
    }
    for (c, &x) in codes.iter_mut().zip(head) {
        // |x / scale| <= 127 up to rounding; the cast saturates.
        *c = (x / scale).round() as i8;
    }
    scale
}

/// One of the two cached streams, in the cache's precision.
#[derive(Clone, Debug)]
enum Stream {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
    /// 8-bit codes and one scale per `head_dim` codes (a head of a position).
    I8 {
        codes: Vec<i8>,
        scales: Vec<f32>,
        head_dim: usize,
    },
}

impl Stream {
    fn new(precision: KvPrecision, head_dim: usize) -> Self {
        match precision {
            KvPrecision::F32 => Stream::F32(Vec::new()),
            KvPrecision::Bf16 => Stream::Bf16(Vec::new()),
            KvPrecision::I8 => Stream::I8 {
                codes: Vec::new(),
                scales: Vec::new(),
                head_dim,
            },
        }
    }

    fn len(&self) -> usize {
        match self {
            Stream::F32(v) => v.len(),
            Stream::Bf16(v) => v.len(),
            Stream::I8 { codes, .. } => codes.len(),
        }
    }

    fn capacity(&self) -> usize {
        match self {
            Stream::F32(v) => v.capacity(),
            Stream::Bf16(v) => v.capacity(),
            Stream::I8 { codes, .. } => codes.capacity(),
        }
    }

    fn allocated_bytes(&self) -> usize {
        match self {
            Stream::F32(v) => v.capacity() * 4,
            Stream::Bf16(v) => v.capacity() * 2,
            Stream::I8 { codes, scales, .. } => codes.capacity() + scales.capacity() * 4,
        }
    }

    fn reserve_exact(&mut self, more: usize) {
        match self {
            Stream::F32(v) => v.reserve_exact(more),
            Stream::Bf16(v) => v.reserve_exact(more),
            Stream::I8 {
                codes,
                scales,
                head_dim,
            } => {
                codes.reserve_exact(more);
                scales.reserve_exact(more / *head_dim);
            }
        }
    }

    fn push(&mut self, row: &[f32]) {
        let at = self.len();
        let len = at + row.len();
        match self {
            Stream::F32(v) => v.resize(len, 0.0),
            Stream::Bf16(v) => v.resize(len, 0),
            Stream::I8 {
                codes,
                scales,
                head_dim,
            } => {
                codes.resize(len, 0);
                scales.resize(len / *head_dim, 0.0);
            }
        }
        self.overwrite(at, row);
    }

    fn overwrite(&mut self, at: usize, row: &[f32]) {
        match self {
            Stream::F32(v) => v[at..at + row.len()].copy_from_slice(row),
            Stream::Bf16(v) => {
                for (d, &x) in v[at..at + row.len()].iter_mut().zip(row) {
                    *d = half::bf16::from_f32(x).to_bits();
                }
            }
            Stream::I8 {
                codes,
                scales,
                head_dim,
            } => {
                let heads = row.chunks_exact(*head_dim);
                let head_codes = codes[at..at + row.len()].chunks_exact_mut(*head_dim);
                let head_scales = &mut scales[at / *head_dim..];
                for ((head, codes), scale) in heads.zip(head_codes).zip(head_scales) {
                    *scale = quantize_head(head, codes);
                }
            }
        }
    }

    /// The held values as f32 (bf16 widened exactly, codes times their scale).
    fn to_f32(&self) -> Vec<f32> {
        match self {
            Stream::F32(v) => v.clone(),
            Stream::Bf16(v) => v
                .iter()
                .map(|&b| f32::from_bits((b as u32) << 16))
                .collect(),
            Stream::I8 {
                codes,
                scales,
                head_dim,
            } => codes
                .chunks_exact(*head_dim)
                .zip(scales)
                .flat_map(|(head, &scale)| head.iter().map(move |&c| f32::from(c) * scale))
                .collect(),
        }
    }

    /// The same values in `precision` (rounded to bf16 or 8-bit codes, or widened to f32).
    fn converted(&self, precision: KvPrecision, head_dim: usize) -> Stream {
        let mut out = Stream::new(precision, head_dim);
        out.reserve_exact(self.len());
        out.push(&self.to_f32());
        out
    }

    /// Queues the pages of the spare capacity up to `ahead_positions` of `width` values past the
    /// held ones for the team's idle helpers to fault in (the 8-bit scales, a 32nd of the codes,
    /// are left to fault in as they are written).
    fn request_pages_ahead(&self, pages: &mut PagesAhead, ahead_positions: usize, width: usize) {
        let ahead = ahead_positions * width;
        // A request the queue did not take is covered by the next one.
        let _queued = match self {
            Stream::F32(v) => pages.request(v, ahead),
            Stream::Bf16(v) => pages.request(v, ahead),
            Stream::I8 { codes, .. } => pages.request(codes, ahead),
        };
    }

    fn clear(&mut self) {
        match self {
            Stream::F32(v) => v.clear(),
            Stream::Bf16(v) => v.clear(),
            Stream::I8 { codes, scales, .. } => {
                codes.clear();
                scales.clear();
            }
        }
    }
}

/// The held keys and values, `[len, width]` each in slot order, in the cache's precision.
#[derive(Clone, Copy, Debug)]
pub enum KvRows<'a> {
    F32 {
        keys: &'a [f32],
        values: &'a [f32],
    },
    /// bf16 bits.
    Bf16 {
        keys: &'a [u16],
        values: &'a [u16],
    },
    /// 8-bit codes, and `[len, width / head_dim]` scales: value `i` of slot `j` is
    /// `codes[j * width + i] * scales[j * width / head_dim + i / head_dim]`.
    I8 {
        keys: &'a [i8],
        values: &'a [i8],
        key_scales: &'a [f32],
        value_scales: &'a [f32],
        head_dim: usize,
    },
}

/// Positions past the held ones whose fresh pages a growing cache has faulted in ahead of its
/// pushes ([`PagesAhead`]).
const PAGES_AHEAD_POSITIONS: usize = 8;

/// Keys and values of one attention layer, `width = heads * head_dim` values per position.
#[derive(Clone, Debug)]
pub struct KvCache {
    /// The growing keys' and values' next pages queued for the team's idle helpers (declared
    /// before `keys` and `values`, so withdrawn before they are freed).
    keys_ahead: PagesAhead,
    values_ahead: PagesAhead,
    capacity: usize,
    width: usize,
    /// Values per scale of an 8-bit cache (one head).
    head_dim: usize,
    precision: KvPrecision,
    keys: Stream,
    values: Stream,
    /// Slot written by the next `push` once the ring is full.
    next_slot: usize,
    /// Positions pushed since the last reset.
    pushed: usize,
}

impl KvCache {
    /// An f32 cache.
    pub fn new(capacity: usize, width: usize) -> Self {
        Self::with_precision(capacity, width, width, KvPrecision::F32)
    }

    /// A cache of `width` values a position in heads of `head_dim` (the unit of an 8-bit
    /// cache's scales).
    pub fn with_precision(
        capacity: usize,
        width: usize,
        head_dim: usize,
        precision: KvPrecision,
    ) -> Self {
        assert!(
            capacity > 0,
            "a KV cache needs room for at least the current position"
        );
        assert!(
            head_dim > 0 && width.is_multiple_of(head_dim),
            "a KV cache of width {width} in heads of {head_dim}"
        );
        Self {
            keys_ahead: PagesAhead::default(),
            values_ahead: PagesAhead::default(),
            capacity,
            width,
            head_dim,
            precision,
            keys: Stream::new(precision, head_dim),
            values: Stream::new(precision, head_dim),
            next_slot: 0,
            pushed: 0,
        }
    }

    /// Maximum number of positions kept.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn precision(&self) -> KvPrecision {
        self.precision
    }

    /// Values per position (keys, and values, each).
    pub fn width(&self) -> usize {
        self.width
    }

    /// Positions currently held (`min(pushed, capacity)`).
    pub fn len(&self) -> usize {
        self.keys.len() / self.width.max(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Positions pushed since the last reset.
    pub fn positions_seen(&self) -> usize {
        self.pushed
    }

    /// Bytes of keys and values currently allocated.
    pub fn allocated_bytes(&self) -> usize {
        self.keys.allocated_bytes() + self.values.allocated_bytes()
    }

    /// Appends one position (rounded to the cache's precision), overwriting the oldest one when
    /// full.
    pub fn push(&mut self, key: &[f32], value: &[f32]) {
        debug_assert_eq!(key.len(), self.width);
        debug_assert_eq!(value.len(), self.width);
        if self.len() < self.capacity {
            if self.keys.capacity() == 0 {
                // Grow in a few steps; never beyond the window.
                let first = self.capacity.min(64) * self.width;
                self.keys.reserve_exact(first);
                self.values.reserve_exact(first);
            } else if self.keys.len() == self.keys.capacity() {
                let target = (self.keys.capacity() * 2).min(self.capacity * self.width);
                self.keys_ahead.forget();
                self.values_ahead.forget();
                self.keys.reserve_exact(target - self.keys.len());
                self.values.reserve_exact(target - self.values.len());
            }
            self.keys.push(key);
            self.values.push(value);
            let (ahead, width) = (PAGES_AHEAD_POSITIONS, self.width);
            self.keys
                .request_pages_ahead(&mut self.keys_ahead, ahead, width);
            self.values
                .request_pages_ahead(&mut self.values_ahead, ahead, width);
        } else {
            let at = self.next_slot * self.width;
            self.keys.overwrite(at, key);
            self.values.overwrite(at, value);
            self.next_slot = (self.next_slot + 1) % self.capacity;
        }
        self.pushed += 1;
    }

    /// The slots of positions `first..=last` (counted from the last reset), oldest first: one
    /// range, or two where the positions wrap around the ring.
    ///
    /// # Panics
    /// If a position is not held (caller bug).
    pub fn slots(&self, first: usize, last: usize) -> [std::ops::Range<usize>; 2] {
        let held = self.pushed - self.len()..self.pushed;
        assert!(
            first <= last && held.contains(&first) && held.contains(&last),
            "positions {first}..={last} are not all held ({held:?})"
        );
        let (a, b) = (first % self.capacity, last % self.capacity);
        if a <= b {
            [a..b + 1, 0..0]
        } else {
            [a..self.capacity, 0..b + 1]
        }
    }

    /// Values per head (the unit of an 8-bit cache's scales).
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Stores the held positions as `precision` from now on, keeping them (rounded to bf16 or
    /// 8-bit codes, or widened to f32).
    pub fn convert(&mut self, precision: KvPrecision) {
        if precision != self.precision {
            self.keys_ahead.forget();
            self.values_ahead.forget();
            self.keys = self.keys.converted(precision, self.head_dim);
            self.values = self.values.converted(precision, self.head_dim);
            self.precision = precision;
        }
    }

    /// Keys and values of the held positions.
    pub fn rows(&self) -> KvRows<'_> {
        match (&self.keys, &self.values) {
            (Stream::F32(keys), Stream::F32(values)) => KvRows::F32 { keys, values },
            (Stream::Bf16(keys), Stream::Bf16(values)) => KvRows::Bf16 { keys, values },
            (
                Stream::I8 {
                    codes: keys,
                    scales: key_scales,
                    ..
                },
                Stream::I8 {
                    codes: values,
                    scales: value_scales,
                    ..
                },
            ) => KvRows::I8 {
                keys,
                values,
                key_scales,
                value_scales,
                head_dim: self.head_dim,
            },
            _ => unreachable!("keys and values share the cache's precision"),
        }
    }

    /// Forgets every position (keeps the allocation).
    pub fn reset(&mut self) {
        self.keys.clear();
        self.values.clear();
        self.next_slot = 0;
        self.pushed = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_capacity_positions_with_bounded_memory() {
        let mut c = KvCache::new(3, 2);
        for p in 0..10 {
            let v = p as f32;
            c.push(&[v, v], &[-v, -v]);
            assert_eq!(c.len(), (p + 1).min(3));
        }
        let KvRows::F32 { keys, .. } = c.rows() else {
            panic!("an f32 cache")
        };
        let mut held: Vec<f32> = keys.chunks(2).map(|k| k[0]).collect();
        held.sort_by(f32::total_cmp);
        assert_eq!(held, vec![7.0, 8.0, 9.0]);
        assert!(c.allocated_bytes() <= 2 * 3 * 2 * 4);
        assert_eq!(c.positions_seen(), 10);
        c.reset();
        assert!(c.is_empty());
    }

    #[test]
    fn slots_follow_positions_around_the_ring_and_conversion_keeps_them() {
        let mut c = KvCache::new(4, 1);
        for p in 0..6 {
            c.push(&[p as f32 + 0.1], &[-(p as f32)]);
        }
        // Positions 2..=5 are held, in slots 2, 3, 0, 1.
        assert_eq!(c.slots(2, 5), [2..4, 0..2]);
        assert_eq!(c.slots(4, 5), [0..2, 0..0]);
        assert_eq!(c.slots(3, 3), [3..4, 0..0]);
        let std::panic::AssertUnwindSafe(held) = std::panic::AssertUnwindSafe(&c);
        assert!(std::panic::catch_unwind(|| held.slots(1, 5)).is_err());
        c.convert(KvPrecision::Bf16);
        let KvRows::Bf16 { keys, values } = c.rows() else {
            panic!("converted to bf16")
        };
        assert_eq!(keys[0], half::bf16::from_f32(4.1).to_bits());
        assert_eq!(values[3], half::bf16::from_f32(-3.0).to_bits());
        c.convert(KvPrecision::F32);
        let KvRows::F32 { keys, .. } = c.rows() else {
            panic!("back to f32")
        };
        assert_eq!(keys[0], half::bf16::from_f32(4.1).to_f32());
        assert_eq!(c.positions_seen(), 6);
    }

    #[test]
    fn bf16_cache_rounds_to_nearest_even_and_halves_the_memory() {
        let mut c = KvCache::with_precision(4, 3, 3, KvPrecision::Bf16);
        // 1 + 2^-8 is halfway between two bf16 values: it rounds to the even one, 1.0.
        let key = [1.0 + 1.0 / 256.0, -3.140625, 1e-3];
        let value = [0.5, 1.0 + 3.0 / 256.0, -7.0];
        for _ in 0..6 {
            c.push(&key, &value);
        }
        assert_eq!(c.len(), 4);
        let KvRows::Bf16 { keys, values } = c.rows() else {
            panic!("a bf16 cache")
        };
        let widen = |b: u16| f32::from_bits((b as u32) << 16);
        assert_eq!(widen(keys[0]), 1.0);
        assert_eq!(widen(keys[1]), -3.140625);
        assert_eq!(keys[2], half::bf16::from_f32(1e-3).to_bits());
        assert_eq!(widen(values[1]), 1.0 + 4.0 / 256.0);
        assert_eq!(widen(values[2]), -7.0);
        assert_eq!(c.allocated_bytes(), 2 * 4 * 3 * 2);
    }

    #[test]
    fn i8_cache_holds_each_head_as_codes_of_its_largest_value() {
        // Two heads of 3: one with a largest value of 2.54 (scale 0.02), one of zeros.
        let mut c = KvCache::with_precision(2, 6, 3, KvPrecision::I8);
        let key = [2.54, -1.0, 0.013, 0.0, 0.0, 0.0];
        let value = [-0.5, 0.25, 0.125, 1e-3, -4.0, 7.0];
        for p in 0..3 {
            c.push(&key, &value.map(|v| v * (p + 1) as f32));
        }
        assert_eq!(c.len(), 2);
        let KvRows::I8 {
            keys,
            values,
            key_scales,
            value_scales,
            head_dim,
        } = c.rows()
        else {
            panic!("an 8-bit cache")
        };
        assert_eq!(head_dim, 3);
        assert_eq!(&keys[..6], &[127, -50, 1, 0, 0, 0]);
        assert_eq!(key_scales[..2], [2.54 / 127.0, 0.0]);
        // Slot 0 was overwritten by position 2 (values times 3).
        assert_eq!(&values[..3], &[-127, 64, 32]);
        assert_eq!(value_scales[0], 1.5 / 127.0);
        assert_eq!(&values[3..6], &[0, -73, 127]);
        assert_eq!(c.allocated_bytes(), 2 * (2 * 6 + 2 * 2 * 4));
        // Back to f32: each code times its scale.
        c.convert(KvPrecision::F32);
        let KvRows::F32 { keys, .. } = c.rows() else {
            panic!("widened to f32")
        };
        assert_eq!(keys[1], -50.0 * (2.54f32 / 127.0));
        // A non-finite value makes its head's scale non-finite, not a finite wrong value.
        let mut c = KvCache::with_precision(2, 2, 1, KvPrecision::I8);
        c.push(&[f32::INFINITY, 1.0], &[f32::NAN, 1.0]);
        let KvRows::I8 {
            key_scales,
            value_scales,
            ..
        } = c.rows()
        else {
            panic!("an 8-bit cache")
        };
        assert!(!key_scales[0].is_finite() && !value_scales[0].is_finite());
        assert_eq!((key_scales[1], value_scales[1]), (1.0 / 127.0, 1.0 / 127.0));
    }
}
