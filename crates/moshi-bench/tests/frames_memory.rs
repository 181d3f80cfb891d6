//! `moshi-rs bench` keeps flat memory whatever `--frames` (issue #41 item 6: about 9 KB a frame,
//! gigabytes at `--frames 1080000`): the input signal is made a frame at a time, the timings go
//! into streaming statistics and the records for `--json` into a temporary file. Measured with
//! an allocator that tracks the heap's peak, so the check is exact and needs no timing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use moshi_bench::frames::{run_frames, FrameLog};
use moshi_runtime::engine::{FrameOutput, FrameProcessor};
use moshi_runtime::metrics::{StageTimings, EXACT_VALUES};
use moshi_runtime::FRAME_SAMPLES;

/// Heap bytes in use, and the most in use since the last reset.
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

struct PeakTracking;

fn grew(by: usize) {
    let live = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: every method forwards to `System` unchanged; the counters touch no allocation.
unsafe impl GlobalAlloc for PeakTracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        grew(new_size);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: PeakTracking = PeakTracking;

/// A processor that answers silence at once, with varied stage timings.
struct Silence {
    frames: u64,
}

impl FrameProcessor for Silence {
    fn process_frame(&mut self, pcm_in: &[f32]) -> moshi_runtime::Result<FrameOutput> {
        self.frames += 1;
        Ok(FrameOutput {
            pcm: vec![pcm_in[0] * 0.0; FRAME_SAMPLES],
            timings: StageTimings {
                lm_temporal_ms: (self.frames % 997) as f64 * 0.01,
                ..Default::default()
            },
            ..Default::default()
        })
    }
}

/// Most heap in use during a run of `frames` timed frames, above what was in use before it.
fn peak_heap_bytes_of_a_run(frames: usize) -> usize {
    let log = FrameLog::create().unwrap();
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let run = run_frames(
        &mut Silence { frames: 0 },
        3,
        frames,
        7,
        None,
        Some(log),
        None,
    )
    .unwrap();
    let peak = PEAK.load(Ordering::Relaxed) - before;
    assert_eq!(run.stages.frames(), frames as u64);
    assert_eq!(run.log.as_ref().unwrap().len(), frames as u64);
    peak
}

#[test]
fn peak_heap_does_not_grow_with_the_frames() {
    // Both past the frames whose timings are kept exactly (64 KiB a series).
    let short = peak_heap_bytes_of_a_run(EXACT_VALUES + 1000);
    let long = peak_heap_bytes_of_a_run(2 * EXACT_VALUES);
    eprintln!(
        "peak heap: {short} bytes for {} frames, {long} for {}",
        EXACT_VALUES + 1000,
        2 * EXACT_VALUES
    );
    // Before: the input signal (7.7 KB a frame) and every record were kept in memory.
    assert!(long <= short + (64 << 10), "{long} bytes vs {short}");
    assert!(long < 4 << 20, "{long} bytes");
}
