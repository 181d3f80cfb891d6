//! STREAM-like memory read bandwidth measurement: `threads` threads each sum their own slice of
//! a buffer much larger than the caches; the best of a few passes is reported. Used to express
//! kernel speed as a fraction of what the machine can read.

use std::time::{Duration, Instant};

use rayon::prelude::*;

/// Default buffer size: well above the last-level cache of ordinary machines.
pub const DEFAULT_BUFFER_BYTES: usize = 1 << 30;
/// Default number of timed passes (the fastest one is reported).
pub const DEFAULT_PASSES: usize = 5;

/// Read bandwidth in GB/s (1e9 bytes/s) with `threads` threads over a 1 GiB buffer.
pub fn measure_read_bandwidth_gbps(threads: usize) -> f64 {
    measure_read_bandwidth_gbps_with(threads, DEFAULT_BUFFER_BYTES, DEFAULT_PASSES)
}

/// Read bandwidth in GB/s with an explicit buffer size and number of timed passes.
///
/// Returns 0.0 for `threads == 0` or if the thread pool cannot be built.
pub fn measure_read_bandwidth_gbps_with(threads: usize, buffer_bytes: usize, passes: usize) -> f64 {
    ReadBuffer::new(threads, buffer_bytes).map_or(0.0, |buffer| buffer.best_gbps(passes))
}

/// A buffer that `threads` threads read in parallel, one slice each (for callers that time the
/// passes themselves, e.g. with CPU time as well as wall time).
pub struct ReadBuffer {
    pool: rayon::ThreadPool,
    words: Vec<u64>,
    per_thread: usize,
}

impl ReadBuffer {
    /// Allocates and first-touches about `buffer_bytes` from the reading threads (so pages land
    /// near them), on 2 MiB pages where Linux gives them, as the engine's weights are: read
    /// through 4 KiB pages the same memory reads slower, and the probe is meant to read as fast as
    /// the memory delivers. `None` for `threads == 0` or if the pool cannot be built.
    pub fn new(threads: usize, buffer_bytes: usize) -> Option<Self> {
        if threads == 0 {
            return None;
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .ok()?;
        let len = (buffer_bytes / 8).max(threads * 1024);
        let per_thread = len.div_ceil(threads);
        let mut words = vec![0u64; len];
        moshi_kernels::huge_pages::advise(&mut words);
        pool.install(|| {
            words
                .par_chunks_mut(per_thread)
                .enumerate()
                .for_each(|(t, chunk)| {
                    for (i, v) in chunk.iter_mut().enumerate() {
                        *v = (t * per_thread + i) as u64;
                    }
                })
        });
        Some(Self {
            pool,
            words,
            per_thread,
        })
    }

    /// Size of the buffer in bytes.
    pub fn bytes(&self) -> usize {
        self.words.len() * 8
    }

    /// GB/s of the fastest of `passes` passes (at least one) over the buffer.
    pub fn best_gbps(&self, passes: usize) -> f64 {
        let best = (0..passes.max(1))
            .map(|_| self.read_pass())
            .min()
            .unwrap_or(Duration::MAX);
        self.bytes() as f64 / best.as_secs_f64() / 1e9
    }

    /// Reads the whole buffer once with all threads; returns the wall time taken.
    pub fn read_pass(&self) -> Duration {
        self.pool.install(|| {
            let start = Instant::now();
            let sum: u64 = self
                .words
                .par_chunks(self.per_thread)
                .map(sum_words)
                .reduce(|| 0, u64::wrapping_add);
            let elapsed = start.elapsed();
            std::hint::black_box(sum);
            elapsed
        })
    }
}

/// Wrapping sum of `chunk`: memory-bound, not add-bound. On x86-64 the loads are explicit
/// 16-byte SSE2 loads into four independent accumulators: left to itself, LLVM vectorizes the
/// portable loop differently per target, and with `-C target-cpu=znver4` it chose strided
/// gathers that read far less than the loads below (docs/performance.md, "The bound").
fn sum_words(chunk: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        sum_words_sse2(chunk)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        sum_words_portable(chunk)
    }
}

#[cfg(target_arch = "x86_64")]
fn sum_words_sse2(chunk: &[u64]) -> u64 {
    use std::arch::x86_64::*;
    let mut it = chunk.chunks_exact(8);
    // SAFETY: SSE2 is part of the x86-64 baseline; each load reads 2 of the chunk's 8 words.
    let lanes = unsafe {
        let mut acc = [_mm_setzero_si128(); 4];
        for c in &mut it {
            for (k, a) in acc.iter_mut().enumerate() {
                let v = _mm_loadu_si128(c.as_ptr().add(2 * k) as *const __m128i);
                *a = _mm_add_epi64(*a, v);
            }
        }
        let pair = _mm_add_epi64(_mm_add_epi64(acc[0], acc[1]), _mm_add_epi64(acc[2], acc[3]));
        let mut out = [0u64; 2];
        _mm_storeu_si128(out.as_mut_ptr() as *mut __m128i, pair);
        out
    };
    let tail = it.remainder().iter().fold(0u64, |a, v| a.wrapping_add(*v));
    lanes.iter().fold(tail, |a, v| a.wrapping_add(*v))
}

#[cfg(any(test, not(target_arch = "x86_64")))]
fn sum_words_portable(chunk: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut it = chunk.chunks_exact(8);
    for c in &mut it {
        for l in 0..8 {
            acc[l] = acc[l].wrapping_add(c[l]);
        }
    }
    let tail = it.remainder().iter().fold(0u64, |a, v| a.wrapping_add(*v));
    acc.iter().fold(tail, |a, v| a.wrapping_add(*v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_sum_is_exact() {
        let v: Vec<u64> = (0..1003).collect();
        assert_eq!(sum_words(&v), 1002 * 1003 / 2);
        assert_eq!(sum_words_portable(&v), 1002 * 1003 / 2);
        let wrapping: Vec<u64> = vec![u64::MAX; 17];
        assert_eq!(sum_words(&wrapping), u64::MAX.wrapping_mul(17));
    }

    #[test]
    fn small_measurement_is_positive() {
        assert!(measure_read_bandwidth_gbps_with(2, 1 << 20, 1) > 0.0);
        assert_eq!(measure_read_bandwidth_gbps_with(0, 1 << 20, 1), 0.0);
        assert_eq!(ReadBuffer::new(3, 1 << 20).unwrap().bytes(), 1 << 20);
    }
}
