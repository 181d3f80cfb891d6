//! Debug/test enforcement of "no allocation in audio callbacks".
//!
//! The callback bodies in [`crate::ring`] hold an [`AudioCallbackGuard`] while they run; in
//! debug builds the guard sets a thread-local flag. [`CountingAllocator`] (install it with
//! `#[global_allocator]` in a test or a debug binary) counts every allocation made while the
//! flag is set; [`callback_allocations`] reads the count. Release builds compile the guard to
//! nothing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

thread_local! {
    static IN_AUDIO_CALLBACK: Cell<bool> = const { Cell::new(false) };
}

static CALLBACK_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// Allocations (and reallocations) counted inside audio callbacks since start, when
/// [`CountingAllocator`] is the global allocator.
pub fn callback_allocations() -> u64 {
    CALLBACK_ALLOCATIONS.load(Ordering::Relaxed)
}

/// Whether the checks are compiled in (debug builds).
pub const ENABLED: bool = cfg!(debug_assertions);

/// Marks the current thread as inside an audio callback until dropped (debug builds only).
pub struct AudioCallbackGuard {
    previous: bool,
}

impl AudioCallbackGuard {
    /// Enters the audio-callback section.
    #[inline]
    pub fn enter() -> Self {
        let previous = if ENABLED {
            IN_AUDIO_CALLBACK.with(|f| f.replace(true))
        } else {
            false
        };
        Self { previous }
    }
}

impl Drop for AudioCallbackGuard {
    #[inline]
    fn drop(&mut self) {
        if ENABLED {
            let previous = self.previous;
            IN_AUDIO_CALLBACK.with(|f| f.set(previous));
        }
    }
}

fn note_allocation() {
    // try_with: the thread-local may already be destroyed during thread teardown.
    if IN_AUDIO_CALLBACK.try_with(|f| f.get()).unwrap_or(false) {
        CALLBACK_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

/// The system allocator, counting allocations made inside audio callbacks.
pub struct CountingAllocator;

// SAFETY: every method forwards to `System` unchanged; the counter touches no allocation.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note_allocation();
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}
