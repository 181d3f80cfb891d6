//! Software prefetch of rows a kernel reads soon, for access patterns the hardware prefetchers
//! miss (attention reads its part of each cached position, a few KiB that start a new 4 KiB page
//! each time: a stream prefetcher stops at page boundaries).

/// Asks the CPU to bring the `len` elements from `start` into L1 (x86-64: one `prefetcht0` per
/// 64-byte line; nothing on other architectures, where it has not been measured). A hint: it
/// reads nothing and never faults, so `start` may point anywhere, past the data included.
#[inline(always)]
pub fn prefetch_l1<E>(start: *const E, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let start = start.cast::<i8>();
        for byte in (0..len * std::mem::size_of::<E>()).step_by(64) {
            // SAFETY: SSE is part of x86-64; a prefetch reads no memory and never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(byte)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (start, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hint on any address, valid or not, changes nothing and does not fault.
    #[test]
    fn prefetching_anywhere_is_harmless() {
        let data = vec![1.5f32; 64];
        prefetch_l1(data.as_ptr(), data.len());
        prefetch_l1(data.as_ptr().wrapping_add(1 << 40), 512);
        prefetch_l1(std::ptr::null::<u16>(), 128);
        assert!(data.iter().all(|&v| v == 1.5));
    }
}
