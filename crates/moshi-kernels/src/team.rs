//! A small persistent team of worker threads for the many short parallel regions of one Mimi
//! frame (about a hundred matrix products, each short next to a thread's wake-up:
//! docs/performance.md#rows-per-pass-and-prefetch-distances-qmv-weights-streamed-from-dram)
//! and of one LM step (the quantized products). Between regions the helpers spin for a bounded
//! time (`SPIN`) and only then park, so back-to-back regions do not pay a futex wake-up and a
//! sleep each (expensive under virtualization), unlike a fresh `rayon::join` per product.
//!
//! Parts of a region are claimed dynamically by the caller and the helpers alike: a helper that is
//! slow to wake simply finds nothing left, the caller never waits for an unclaimed part. Results do
//! not depend on who runs which part (each part is a fixed computation), so they are the same for
//! any thread count. One region runs at a time; a caller that finds the team busy (another thread,
//! or a nested call) runs all parts itself, so the team can never deadlock, also not when called
//! from inside a rayon pool.

use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle helper spins for the next region before parking.
const SPIN: Duration = Duration::from_micros(40);

/// Most parts per region (the claim word has 16 bits for the part count and index).
pub const MAX_PARTS: usize = 1 << 15;

/// The work of one region: `f(part)` for every part.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
}

struct Shared {
    /// `epoch << 32 | parts << 16 | next unclaimed part`; a new region bumps the epoch.
    claim: AtomicU64,
    /// The current region's job (valid while one of its parts is claimed and not finished).
    job: AtomicPtr<Job<'static>>,
    /// Finished parts of the current region.
    done: AtomicUsize,
    /// Helpers parked (or about to park) on `wake`.
    sleepers: AtomicUsize,
    sleep_lock: Mutex<()>,
    wake: Condvar,
}

struct Team {
    helpers: usize,
    /// Held by the thread that runs a region.
    busy: Mutex<()>,
    shared: &'static Shared,
}

fn epoch_of(claim: u64) -> u64 {
    claim >> 32
}

fn team() -> &'static Team {
    static TEAM: OnceLock<Team> = OnceLock::new();
    TEAM.get_or_init(|| {
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            claim: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            done: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
        }));
        // Sized by the machine, not by the pool current at first use: each call is capped by its
        // own pool (see `threads`), and unused helpers just stay parked.
        let wanted = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .saturating_sub(1);
        let mut helpers = 0;
        for i in 0..wanted {
            let spawned = std::thread::Builder::new()
                .name(format!("moshi-team-{i}"))
                .spawn(move || helper_loop(shared));
            if spawned.is_ok() {
                helpers += 1;
            }
        }
        Team {
            helpers,
            busy: Mutex::new(()),
            shared,
        }
    })
}

/// Threads a region may use here: the caller plus the team's helpers, at most the current rayon
/// pool's thread count (so `RAYON_NUM_THREADS` and `ThreadPool::install` still bound Mimi).
pub fn threads() -> usize {
    (team().helpers + 1).min(rayon::current_num_threads().max(1))
}

/// Runs `f(part)` for every `part < parts` on the caller and the team, returning when all are
/// done. Panics in `f` abort the process (a part may run on a helper thread).
pub fn run(parts: usize, f: &(dyn Fn(usize) + Sync)) {
    assert!(parts <= MAX_PARTS, "team::run: {parts} parts > {MAX_PARTS}");
    let team = team();
    let busy = if parts > 1 && threads() > 1 {
        team.busy.try_lock().ok()
    } else {
        None
    };
    let Some(_busy) = busy else {
        (0..parts).for_each(f);
        return;
    };
    let shared = team.shared;
    let job = Job { f };
    // SAFETY (lifetime erasure): the pointer is only dereferenced by whoever claims a part of this
    // region, and this function does not return before every claimed part has finished.
    let job_ptr = (&job as *const Job<'_>).cast_mut().cast::<Job<'static>>();
    shared.job.store(job_ptr, Ordering::Relaxed);
    shared.done.store(0, Ordering::Relaxed);
    let epoch = epoch_of(shared.claim.load(Ordering::Relaxed)) + 1;
    let epoch = epoch & 0xFFFF_FFFF;
    shared
        .claim
        .store(epoch << 32 | (parts as u64) << 16, Ordering::SeqCst);
    if shared.sleepers.load(Ordering::SeqCst) > 0 {
        let _guard = shared.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
        shared.wake.notify_all();
    }
    work(shared, epoch);
    let mut spins = 0u32;
    while shared.done.load(Ordering::Acquire) < parts {
        spins += 1;
        if spins < 1 << 12 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
    shared.job.store(std::ptr::null_mut(), Ordering::Relaxed);
}

/// Claims and runs parts of region `epoch` until none is left (or the region is over).
fn work(shared: &Shared, epoch: u64) {
    let mut claim = shared.claim.load(Ordering::Acquire);
    loop {
        let (parts, next) = ((claim >> 16) & 0xFFFF, claim & 0xFFFF);
        if epoch_of(claim) != epoch || next >= parts {
            return;
        }
        match shared.claim.compare_exchange_weak(
            claim,
            claim + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                // SAFETY: part `next` of this region is claimed and not finished, so the caller
                // is still inside `run` and the job it published (before the claim word) is alive.
                let job = unsafe { &*shared.job.load(Ordering::Relaxed) };
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    (job.f)(next as usize)
                }));
                if outcome.is_err() {
                    // The caller would wait forever for this part: fail loudly instead.
                    std::process::abort();
                }
                shared.done.fetch_add(1, Ordering::Release);
                claim = shared.claim.load(Ordering::Acquire);
            }
            Err(current) => claim = current,
        }
    }
}

fn helper_loop(shared: &'static Shared) {
    let mut seen = epoch_of(shared.claim.load(Ordering::Acquire));
    loop {
        let start = Instant::now();
        let mut polls = 0u32;
        let epoch = loop {
            let e = epoch_of(shared.claim.load(Ordering::Acquire));
            if e != seen {
                break e;
            }
            polls += 1;
            if polls.is_multiple_of(64) && start.elapsed() > SPIN {
                let guard = shared.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
                shared.sleepers.fetch_add(1, Ordering::SeqCst);
                let mut guard = guard;
                while epoch_of(shared.claim.load(Ordering::SeqCst)) == seen {
                    guard = shared.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
                }
                shared.sleepers.fetch_sub(1, Ordering::SeqCst);
                drop(guard);
                polls = 0;
            } else {
                std::hint::spin_loop();
            }
        };
        seen = epoch;
        work(shared, epoch);
    }
}

/// Runs `f(lo, hi)` over `parts` near-equal sub-ranges of `lo..hi` on the team.
pub fn run_ranges(lo: usize, hi: usize, parts: usize, f: &(dyn Fn(usize, usize) + Sync)) {
    let parts = parts.clamp(1, (hi - lo).max(1)).min(MAX_PARTS);
    run(parts, &|i| {
        let (a, b) = (lo + (hi - lo) * i / parts, lo + (hi - lo) * (i + 1) / parts);
        if a < b {
            f(a, b);
        }
    });
}

/// Runs `f(first, chunk)` on the team for each chunk of `out` cut every `chunk_len` values (the
/// last one may be shorter), `first` being the chunk's offset in `out`. Each part gets its own
/// disjoint chunk as a plain `&mut` slice, so callers need no raw pointers.
pub fn run_chunks_mut(out: &mut [f32], chunk_len: usize, f: &(dyn Fn(usize, &mut [f32]) + Sync)) {
    let len = out.len();
    let chunk_len = chunk_len.max(1);
    let base = OutBase(out.as_mut_ptr());
    run(len.div_ceil(chunk_len), &|i| {
        let base = &base;
        let lo = i * chunk_len;
        let hi = (lo + chunk_len).min(len);
        // SAFETY: part `i` alone touches `lo..hi`, in bounds of `out`, which stays mutably
        // borrowed until `run` returns, i.e. after every part has finished.
        let chunk = unsafe { std::slice::from_raw_parts_mut(base.0.add(lo), hi - lo) };
        f(lo, chunk);
    });
}

/// The start of the slice [`run_chunks_mut`] hands out in disjoint chunks.
struct OutBase(*mut f32);
// SAFETY: only dereferenced through the disjoint chunks of `run_chunks_mut`.
unsafe impl Sync for OutBase {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn chunks_tile_the_slice_with_their_offsets() {
        for (len, chunk) in [(0, 4), (10, 3), (64, 16), (5, 100)] {
            let mut out = vec![-1f32; len];
            run_chunks_mut(&mut out, chunk, &|first, c| {
                assert!(c.len() <= chunk && !c.is_empty());
                for (j, v) in c.iter_mut().enumerate() {
                    *v = (first + j) as f32;
                }
            });
            assert!(
                out.iter().enumerate().all(|(i, &v)| v == i as f32),
                "{len} {chunk}"
            );
        }
    }

    #[test]
    fn every_part_runs_exactly_once_and_ranges_tile() {
        for parts in [0, 1, 2, 3, 7, 64] {
            let hits: Vec<AtomicU32> = (0..parts).map(|_| AtomicU32::new(0)).collect();
            run(parts, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "{parts} parts"
            );
        }
        let covered: Vec<AtomicU32> = (0..100).map(|_| AtomicU32::new(0)).collect();
        run_ranges(10, 97, 4, &|a, b| {
            for c in &covered[a..b] {
                c.fetch_add(1, Ordering::Relaxed);
            }
        });
        for (i, c) in covered.iter().enumerate() {
            assert_eq!(
                c.load(Ordering::Relaxed),
                u32::from((10..97).contains(&i)),
                "index {i}"
            );
        }
    }

    #[test]
    fn concurrent_and_nested_callers_and_rayon_workers_never_deadlock() {
        let total = AtomicU32::new(0);
        rayon::scope(|s| {
            for _ in 0..4 {
                s.spawn(|_| {
                    for _ in 0..200 {
                        run(3, &|_| {
                            // nested region: runs serially on whoever holds the part
                            run(2, &|_| {
                                total.fetch_add(1, Ordering::Relaxed);
                            });
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 4 * 200 * 3 * 2);
    }
}
