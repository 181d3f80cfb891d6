//! STREAM-like memory read bandwidth measurement: `threads` threads each sum their own slice of
//! a buffer much larger than the caches; the best of a few passes is reported. Used to express
//! kernel speed as a fraction of what the machine can read.

use std::time::Instant;

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
    if threads == 0 {
        return 0.0;
    }
    let Ok(pool) = rayon::ThreadPoolBuilder::new().num_threads(threads).build() else {
        return 0.0;
    };
    let words = (buffer_bytes / 8).max(threads * 1024);
    pool.install(|| {
        let per_thread = words.div_ceil(threads);
        // Each thread writes (first touch) its own slice, so pages land near the thread that reads them.
        let mut buffer = vec![0u64; words];
        buffer.par_chunks_mut(per_thread).enumerate().for_each(|(t, chunk)| {
            for (i, v) in chunk.iter_mut().enumerate() {
                *v = (t * per_thread + i) as u64;
            }
        });
        let mut best_s = f64::INFINITY;
        let mut checksum = 0u64;
        for _ in 0..passes.max(1) {
            let start = Instant::now();
            let sum: u64 = buffer.par_chunks(per_thread).map(sum_words).reduce(|| 0, u64::wrapping_add);
            best_s = best_s.min(start.elapsed().as_secs_f64());
            checksum = checksum.wrapping_add(sum);
        }
        std::hint::black_box(checksum);
        (words * 8) as f64 / best_s / 1e9
    })
}

/// Wrapping sum with independent accumulators (vectorizes; memory-bound, not add-bound).
fn sum_words(chunk: &[u64]) -> u64 {
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
    }

    #[test]
    fn small_measurement_is_positive() {
        assert!(measure_read_bandwidth_gbps_with(2, 1 << 20, 1) > 0.0);
        assert_eq!(measure_read_bandwidth_gbps_with(0, 1 << 20, 1), 0.0);
    }
}
