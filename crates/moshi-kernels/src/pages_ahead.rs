//! The fresh pages just past a growing buffer's end, faulted in by the thread team's idle helpers
//! before its writer reaches them.
//!
//! A buffer that grows a little every frame (a KV cache: one position a frame, for the first
//! minutes of a conversation) meets fresh pages as it grows, and the first write to a fresh page
//! is a page fault: the kernel finds, clears and maps the page (in a VM the host may have to back
//! it first), on the writing thread, in the middle of a step, while the memory bus idles. The
//! [`team`](crate::team)'s helpers spin with nothing to do between regions; [`PagesAhead`] queues
//! the spare capacity just past a buffer's end and an idle helper populates it (Linux
//! `madvise(MADV_POPULATE_WRITE)`: the pages are faulted in writable, their contents untouched),
//! so that the writer finds them present. Elsewhere (another system, a kernel before 5.14, a
//! single thread) nothing is queued, and the writer faults its pages in itself.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Spans waiting at most; a request beyond them is left to its writer.
const MAX_QUEUED_SPANS: usize = 256;

/// Bytes a helper populates between two looks for a new region (a helper busy populating joins a
/// region late by at most this much work).
const CHUNK_BYTES: usize = 16 << 10;

/// Address spans waiting for a helper, oldest first. Held by a helper for the whole of one
/// population, so [`PagesAhead::forget`] returns only when no helper works on its spans.
static QUEUE: Mutex<VecDeque<Range<usize>>> = Mutex::new(VecDeque::new());

/// Spans in [`QUEUE`] (read by idle helpers without taking the lock).
static QUEUED_SPANS: AtomicUsize = AtomicUsize::new(0);

/// Cleared when the kernel does not know the advice: nothing is queued from then on.
static SUPPORTED: AtomicBool = AtomicBool::new(cfg!(target_os = "linux"));

/// What one buffer has queued: the spare capacity from its end up to `queued_to` (addresses).
/// A clone has queued nothing. Drop it before the buffer it tracks, or call
/// [`PagesAhead::forget`] before the buffer reallocates: a helper never populates a span after
/// `forget` returns (before, it would populate memory the buffer no longer owns; that changes no
/// contents, so it is only wasted work).
#[derive(Debug, Default)]
pub struct PagesAhead {
    base: usize,
    queued_to: usize,
}

impl PagesAhead {
    /// Queues the pages of `buffer`'s spare capacity up to `ahead` elements past its length that
    /// are not queued yet, for an idle helper to fault in; true where a span was queued. A request
    /// that finds the queue busy or full is dropped (the next one covers its span).
    pub fn request<T>(&mut self, buffer: &Vec<T>, ahead: usize) -> bool {
        let base = buffer.as_ptr() as usize;
        if base != self.base {
            self.forget();
            (self.base, self.queued_to) = (base, base);
        }
        let size = std::mem::size_of::<T>();
        let wanted = buffer.len().saturating_add(ahead).min(buffer.capacity());
        let span = self.next_span(base + buffer.len() * size, base + wanted * size);
        let queued = span.is_some_and(queue);
        if queued {
            self.queued_to = base + wanted * size;
        }
        queued
    }

    /// The addresses from the buffer's end (`written_end`) to `wanted_end` not queued yet.
    fn next_span(&self, written_end: usize, wanted_end: usize) -> Option<Range<usize>> {
        let from = self.queued_to.max(written_end);
        (wanted_end > from).then_some(from..wanted_end)
    }

    /// Withdraws every span this buffer queued, waiting for a helper populating one of them.
    pub fn forget(&mut self) {
        if self.queued_to > self.base {
            withdraw(self.base..self.queued_to);
        }
        self.queued_to = self.base;
    }
}

impl Clone for PagesAhead {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl Drop for PagesAhead {
    fn drop(&mut self) {
        self.forget();
    }
}

/// Adds `span` to the queue (joined to the last span where it continues it); false where it was
/// not queued: unsupported, no helper to populate it, the queue busy or full.
fn queue(span: Range<usize>) -> bool {
    if !SUPPORTED.load(Ordering::Relaxed) || crate::team::threads() < 2 {
        return false;
    }
    let Ok(mut spans) = QUEUE.try_lock() else {
        return false;
    };
    let full = spans.len() >= MAX_QUEUED_SPANS;
    match spans.back_mut() {
        Some(last) if last.end == span.start => last.end = span.end,
        _ if full => return false,
        _ => spans.push_back(span),
    }
    QUEUED_SPANS.store(spans.len(), Ordering::Release);
    true
}

/// Removes the queued spans overlapping `span`.
fn withdraw(span: Range<usize>) {
    let mut spans = QUEUE.lock().unwrap_or_else(|e| e.into_inner());
    spans.retain(|s| s.end <= span.start || s.start >= span.end);
    QUEUED_SPANS.store(spans.len(), Ordering::Release);
}

/// Populates up to [`CHUNK_BYTES`] of the oldest queued span; false where there was nothing to do
/// (or the queue was busy). Called by idle helpers between their looks for a new region.
pub(crate) fn populate_next() -> bool {
    if QUEUED_SPANS.load(Ordering::Acquire) == 0 {
        return false;
    }
    let Ok(mut spans) = QUEUE.try_lock() else {
        return false;
    };
    let Some(front) = spans.front_mut() else {
        return false;
    };
    let chunk = front.start..front.end.min(front.start + CHUNK_BYTES);
    front.start = chunk.end;
    if front.start >= front.end {
        spans.pop_front();
        QUEUED_SPANS.store(spans.len(), Ordering::Release);
    }
    if !populate(chunk) {
        SUPPORTED.store(false, Ordering::Relaxed);
        spans.clear();
        QUEUED_SPANS.store(0, Ordering::Release);
    }
    true
}

/// Faults in the pages overlapping `span` writable, contents untouched; false where the kernel
/// does not know the advice.
#[cfg(target_os = "linux")]
fn populate(span: Range<usize>) -> bool {
    let page = page_bytes();
    let start = span.start / page * page;
    // SAFETY: the advice only faults pages in (as a write to each would, without writing): it
    // changes no memory contents, whoever owns the span now; where part of it is not mapped, or
    // not writable, the kernel refuses it (ENOMEM, EFAULT) and nothing happens.
    let rc = unsafe {
        libc::madvise(
            start as *mut libc::c_void,
            span.end - start,
            libc::MADV_POPULATE_WRITE,
        )
    };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL)
}

#[cfg(not(target_os = "linux"))]
fn populate(_span: Range<usize>) -> bool {
    false
}

#[cfg(target_os = "linux")]
fn page_bytes() -> usize {
    // SAFETY: sysconf has no preconditions.
    let bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(bytes).unwrap_or(4096).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_request_queues_only_what_is_past_the_end_and_not_queued_yet() {
        let ahead = PagesAhead {
            base: 1000,
            queued_to: 1400,
        };
        // Written to 1200, wanted to 1600: from the queued end on.
        assert_eq!(ahead.next_span(1200, 1600), Some(1400..1600));
        // Written past what was queued (a cleared buffer refilled, or pages reached first).
        assert_eq!(ahead.next_span(1500, 1600), Some(1500..1600));
        // Nothing new wanted.
        assert_eq!(ahead.next_span(1200, 1400), None);
        assert_eq!(ahead.next_span(1700, 1700), None);
    }

    /// Pages of a fresh mapping are not resident until the idle helpers populate what a
    /// `PagesAhead` queued.
    #[cfg(target_os = "linux")]
    #[test]
    fn idle_helpers_fault_in_the_queued_pages() {
        const BUFFER_BYTES: usize = 64 << 20;
        const AHEAD_BYTES: usize = 1 << 20;
        if crate::team::threads() < 2 {
            eprintln!("skipped: one thread, no idle helper to populate pages");
            return;
        }
        // A mapping of its own, never written past the allocator's header in its first page.
        let mut buffer: Vec<u8> = Vec::with_capacity(BUFFER_BYTES);
        let page = page_bytes();
        buffer.resize(page, 0);
        let start = buffer.as_ptr() as usize + page;
        let tail = start + BUFFER_BYTES - AHEAD_BYTES - page..start + BUFFER_BYTES - page;
        assert_eq!(resident_pages(start + page..start + AHEAD_BYTES), 0);
        if !populate(tail.clone()) || resident_pages(tail.clone()) == 0 {
            if cfg!(target_arch = "x86_64") {
                panic!("madvise(MADV_POPULATE_WRITE) populated nothing on x86-64");
            }
            eprintln!("skipped: the kernel (or an emulator's user mode) does not populate pages");
            return;
        }
        let mut ahead = PagesAhead::default();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let pages = AHEAD_BYTES.div_ceil(page);
        while resident_pages(start..start + AHEAD_BYTES) < pages {
            assert!(
                std::time::Instant::now() < deadline,
                "{} of {pages} queued pages resident after 5 s",
                resident_pages(start..start + AHEAD_BYTES)
            );
            ahead.request(&buffer, AHEAD_BYTES);
            // A region wakes the helpers; between regions they populate.
            crate::team::run(2, &|_| {});
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Resident pages of `span` (`mincore`).
    #[cfg(target_os = "linux")]
    fn resident_pages(span: Range<usize>) -> usize {
        let page = page_bytes();
        let start = span.start / page * page;
        let mut flags = vec![0u8; (span.end - start).div_ceil(page)];
        // SAFETY: `start` is page-aligned, the span is mapped (a live allocation) and `flags` has
        // a byte for each of its pages.
        let rc = unsafe {
            libc::mincore(
                start as *mut libc::c_void,
                span.end - start,
                flags.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        flags.iter().filter(|&&f| f & 1 == 1).count()
    }
}
