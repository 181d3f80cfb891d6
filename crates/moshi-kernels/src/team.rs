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
//!
//! Between regions an idle helper also faults in the pages growing buffers queued
//! ([`crate::pages_ahead`]), a chunk at a time, looking for a new region between chunks.
//!
//! A balanced region ([`run_balanced`]) cuts its work in many small units instead of one part a
//! thread: each thread starts on its equal share and, done with it, takes half of what is left
//! of another's, so a thread that runs slower (the two vCPUs of a VM do not always run at the same
//! speed) or wakes late no longer holds the region up.

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
    /// The threads' runs of units in a `run_balanced` region (one a thread).
    runs: Box<[UnitRun]>,
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
            runs: (0..=helpers).map(|_| UnitRun(AtomicU64::new(0))).collect(),
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
    match team.hold(parts) {
        Some(_busy) => run_region(team.shared, parts, f),
        None => (0..parts).for_each(f),
    }
}

/// Runs `f(unit)` for every `unit < units` on `threads` threads at most, each starting on an equal
/// run of consecutive units and, when its run is done, taking the later half of what another
/// thread has left (down to single units). Consecutive units stay together on one thread as long
/// as the threads keep pace, and a slower thread (a vCPU sharing its core, a late wake-up) no
/// longer holds the others up at the end of the region: they finish its run. Panics in `f` abort
/// the process.
pub fn run_balanced(max_threads: usize, units: usize, f: &(dyn Fn(usize) + Sync)) {
    assert!(
        u32::try_from(units).is_ok(),
        "team::run_balanced: {units} units"
    );
    let team = team();
    let threads = max_threads.min(threads()).min(units).min(team.runs.len());
    let busy = team.hold(threads);
    let Some(_busy) = busy else {
        (0..units).for_each(f);
        return;
    };
    let runs = &team.runs[..threads];
    for (i, run) in runs.iter().enumerate() {
        run.set(units * i / threads, units * (i + 1) / threads);
    }
    // `run_region` publishes the runs to the helpers with the region (its claim word's store).
    run_region(team.shared, threads, &|own| {
        runs[own].drain(f);
        while let Some(stolen) = steal(runs) {
            runs[own].set(stolen.start, stolen.end);
            runs[own].drain(f);
        }
    });
}

/// The later half (rounded up, at least one unit) of the largest run another thread has left, its
/// units removed from that run; `None` once every run is empty.
fn steal(runs: &[UnitRun]) -> Option<std::ops::Range<usize>> {
    loop {
        let (victim, (front, back)) = runs
            .iter()
            .map(UnitRun::get)
            .enumerate()
            .max_by_key(|&(_, (front, back))| back.saturating_sub(front))?;
        if front >= back {
            return None;
        }
        let middle = back - (back - front).div_ceil(2);
        if runs[victim].shrink(front, back, middle) {
            return Some(middle..back);
        }
    }
}

/// One thread's run of units `front..back`, in one word (`front << 32 | back`) on its own cache
/// line: the thread takes units from its front, others shorten its back.
#[repr(align(128))]
struct UnitRun(AtomicU64);

impl UnitRun {
    fn get(&self) -> (usize, usize) {
        let word = self.0.load(Ordering::Acquire);
        ((word >> 32) as usize, (word & 0xFFFF_FFFF) as usize)
    }

    fn set(&self, front: usize, back: usize) {
        self.0
            .store((front as u64) << 32 | back as u64, Ordering::Release);
    }

    /// Runs `f` on each unit of the run, front first, until the run is empty.
    fn drain(&self, f: &(dyn Fn(usize) + Sync)) {
        loop {
            let word = self.0.load(Ordering::Acquire);
            let (front, back) = (word >> 32, word & 0xFFFF_FFFF);
            if front >= back {
                return;
            }
            if self
                .0
                .compare_exchange_weak(word, word + (1 << 32), Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                f(front as usize);
            }
        }
    }

    /// Cuts the run `front..back` (as last read) to `front..middle`; false if it changed meanwhile.
    /// A run's words never repeat while it holds units (each unit is handed out once), so an
    /// unchanged word means an unchanged run.
    fn shrink(&self, front: usize, back: usize, middle: usize) -> bool {
        let word = (front as u64) << 32 | back as u64;
        let cut = (front as u64) << 32 | middle as u64;
        self.0
            .compare_exchange(word, cut, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }
}

impl Team {
    /// The team for a region of `parts` parts, or `None` where the region should run on the
    /// caller alone (one part, one thread, or the team busy with another region).
    fn hold(&self, parts: usize) -> Option<std::sync::MutexGuard<'_, ()>> {
        (parts > 1 && threads() > 1)
            .then(|| self.busy.try_lock().ok())
            .flatten()
    }
}

/// Publishes region `f` of `parts` parts to the helpers, works on it, and returns once every part
/// is done. The caller holds the team (`Team::hold`).
fn run_region(shared: &Shared, parts: usize, f: &(dyn Fn(usize) + Sync)) {
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
            if !polls.is_multiple_of(64) {
                std::hint::spin_loop();
            } else if crate::pages_ahead::populate_next() {
                // Idle time put to use; look for a region again before the next chunk.
            } else if start.elapsed() > SPIN {
                let guard = shared.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
                shared.sleepers.fetch_add(1, Ordering::SeqCst);
                let mut guard = guard;
                while epoch_of(shared.claim.load(Ordering::SeqCst)) == seen {
                    guard = shared.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
                }
                shared.sleepers.fetch_sub(1, Ordering::SeqCst);
                drop(guard);
                polls = 0;
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
    let chunks = Chunks::new(out, chunk_len);
    // SAFETY: `run` runs each part once.
    run(chunks.count, &|i| unsafe { chunks.run(i, f) });
}

/// [`run_chunks_mut`] as a balanced region ([`run_balanced`]) on `max_threads` threads at most:
/// the chunks are its units.
pub fn run_balanced_chunks_mut(
    max_threads: usize,
    out: &mut [f32],
    chunk_len: usize,
    f: &(dyn Fn(usize, &mut [f32]) + Sync),
) {
    let chunks = Chunks::new(out, chunk_len);
    // SAFETY: `run_balanced` runs each unit once.
    run_balanced(max_threads, chunks.count, &|i| unsafe { chunks.run(i, f) });
}

/// A slice handed out in disjoint chunks of `chunk_len` values, one to each part of a region.
struct Chunks<'a> {
    base: *mut f32,
    len: usize,
    chunk_len: usize,
    count: usize,
    _out: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: only dereferenced through disjoint chunks (`Chunks::run`'s contract).
unsafe impl Sync for Chunks<'_> {}

impl<'a> Chunks<'a> {
    /// The chunks of `out`, which stays mutably borrowed as long as they live.
    fn new(out: &'a mut [f32], chunk_len: usize) -> Self {
        let chunk_len = chunk_len.max(1);
        Self {
            base: out.as_mut_ptr(),
            len: out.len(),
            chunk_len,
            count: out.len().div_ceil(chunk_len),
            _out: std::marker::PhantomData,
        }
    }

    /// `f(first, chunk)` for chunk `i`.
    ///
    /// # Safety
    /// Each chunk must be run once at a time (so its slice is borrowed mutably once).
    unsafe fn run(&self, i: usize, f: &(dyn Fn(usize, &mut [f32]) + Sync)) {
        let lo = i * self.chunk_len;
        let hi = (lo + self.chunk_len).min(self.len);
        // SAFETY: `lo..hi` lies in the slice `new` borrowed, and only this call touches it (the
        // function's contract).
        let chunk = unsafe { std::slice::from_raw_parts_mut(self.base.add(lo), hi - lo) };
        f(lo, chunk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32};

    /// Each chunk comes once, with its offset (every value starts at -1 and gets its index + 1).
    #[test]
    fn chunks_tile_the_slice_with_their_offsets() {
        type ChunksFn = fn(&mut [f32], usize, &(dyn Fn(usize, &mut [f32]) + Sync));
        let balanced: ChunksFn = |out, chunk, f| run_balanced_chunks_mut(2, out, chunk, f);
        for (name, chunks) in [
            ("run_chunks_mut", run_chunks_mut as ChunksFn),
            ("balanced", balanced),
        ] {
            for (len, chunk) in [(0, 4), (10, 3), (64, 16), (5, 100), (1000, 7)] {
                let mut out = vec![-1f32; len];
                chunks(&mut out, chunk, &|first, c| {
                    assert!(c.len() <= chunk && !c.is_empty());
                    for (j, v) in c.iter_mut().enumerate() {
                        *v += (first + j) as f32 + 1.0;
                    }
                });
                assert!(
                    out.iter().enumerate().all(|(i, &v)| v == i as f32),
                    "{name}: {len} {chunk}"
                );
            }
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
    fn balanced_regions_run_every_unit_exactly_once() {
        for (threads, units) in [(1, 5), (2, 0), (2, 1), (2, 2), (2, 7), (3, 100), (8, 1000)] {
            let hits: Vec<AtomicU32> = (0..units).map(|_| AtomicU32::new(0)).collect();
            run_balanced(threads, units, &|u| {
                hits[u].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "{threads} threads, {units} units"
            );
        }
    }

    /// The first unit waits for all the others, which only the other thread can run, by taking
    /// the rest of the first thread's run (a region the team was too busy for, because another
    /// test held it, runs on the caller alone: it is tried again).
    #[test]
    fn a_stalled_thread_s_units_are_taken_by_the_other() {
        if threads() < 2 {
            eprintln!("skipped: one thread");
            return;
        }
        const UNITS: usize = 64;
        for _ in 0..100 {
            let (done, first_thread) = (AtomicUsize::new(0), OnceLock::new());
            let other_threads = AtomicUsize::new(0);
            let waited = AtomicBool::new(false);
            run_balanced(2, UNITS, &|u| {
                let me = std::thread::current().id();
                if u == 0 {
                    first_thread.set(me).unwrap();
                    let start = Instant::now();
                    while done.load(Ordering::Acquire) < UNITS - 1 {
                        // Alone (nobody ran a unit within 200 ms: the caller alone), or stuck.
                        let waited_for = start.elapsed();
                        let alone = done.load(Ordering::Acquire) == 0
                            && waited_for > Duration::from_millis(200);
                        if alone || waited_for > Duration::from_secs(5) {
                            return;
                        }
                        std::hint::spin_loop();
                    }
                    waited.store(true, Ordering::Relaxed);
                    return;
                }
                if first_thread.get().is_some_and(|&t| t != me) {
                    other_threads.fetch_add(1, Ordering::Relaxed);
                }
                done.fetch_add(1, Ordering::Release);
            });
            if other_threads.load(Ordering::Relaxed) > 0 {
                assert!(
                    waited.load(Ordering::Relaxed),
                    "units left behind the stalled one"
                );
                return;
            }
        }
        panic!("the team never took a balanced region");
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
