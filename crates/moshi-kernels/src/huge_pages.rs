//! Large read-mostly buffers (weights, the bandwidth probe's buffer) on 2 MiB pages where Linux
//! gives them: a hint asked before the buffer is first written.
//!
//! Read through 4 KiB pages, a stream of weights takes a page walk every 4 KiB and the hardware
//! prefetchers stop at every page's end; on 2 MiB pages (transparent huge pages) neither happens.
//! Measured on the development VM (docs/performance.md, "Weights and the probe on 2 MiB pages"):
//! the plain read the bandwidth probe does gained the most, the VNNI products, whose software
//! prefetch already runs across 4 KiB pages, up to a few percent. The cost is paid once, at the
//! first write: the kernel clears 2 MiB a fault, compacting memory first where it is fragmented
//! (or falling back to 4 KiB pages).

/// Bytes of one transparent huge page on x86-64 (and aarch64 with 4 KiB base pages): the span
/// whose whole, aligned copies inside a buffer are advised.
pub const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Asks Linux to back the whole, aligned 2 MiB spans inside `buffer`'s capacity (its length and
/// its spare capacity) with transparent huge pages. Pages already written keep their 4 KiB
/// backing until the kernel's background collapse, so call it right after allocating. It takes
/// effect where the kernel's setting (`/sys/kernel/mm/transparent_hugepage/enabled`) is `madvise`,
/// Debian's default, or `always`; elsewhere, and on other systems, it changes nothing. Returns the
/// bytes advised (0 where none were, or the kernel refused the advice).
pub fn advise<T>(buffer: &mut Vec<T>) -> usize {
    let start = buffer.as_mut_ptr() as usize;
    let bytes = buffer.capacity() * std::mem::size_of::<T>();
    let first = start.next_multiple_of(HUGE_PAGE_BYTES);
    let end = (start + bytes) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
    if end <= first {
        return 0;
    }
    advise_span(first, end - first)
}

#[cfg(target_os = "linux")]
fn advise_span(first: usize, bytes: usize) -> usize {
    // SAFETY: the span lies inside the allocation of the `Vec` that `advise` borrows mutably, and
    // starts on a page boundary; the advice changes how the kernel backs those pages, never their
    // contents, and a refusal (a kernel without transparent huge pages) leaves them as they were.
    let rc = unsafe { libc::madvise(first as *mut libc::c_void, bytes, libc::MADV_HUGEPAGE) };
    if rc == 0 {
        bytes
    } else {
        tracing::debug!(
            bytes,
            error = %std::io::Error::last_os_error(),
            "transparent huge pages refused; the buffer stays on 4 KiB pages"
        );
        0
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_span(_first: usize, _bytes: usize) -> usize {
    0
}

/// The kernel's transparent huge page setting (`always`, `madvise` or `never`: the bracketed
/// word of `/sys/kernel/mm/transparent_hugepage/enabled`), or `None` where there is none (another
/// system, or a kernel built without them). Reports record it beside the measured bandwidth.
pub fn transparent_huge_pages_setting() -> Option<String> {
    let text = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    let (_, rest) = text.split_once('[')?;
    let (word, _) = rest.split_once(']')?;
    Some(word.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_aligned_spans_inside_the_capacity_are_advised() {
        let mut small: Vec<u8> = Vec::with_capacity(HUGE_PAGE_BYTES - 1);
        assert_eq!(advise(&mut small), 0);
        let mut buffer: Vec<u64> = Vec::with_capacity(3 * HUGE_PAGE_BYTES / 8);
        let advised = advise(&mut buffer);
        let enabled = transparent_huge_pages_setting();
        if cfg!(target_os = "linux") && enabled.as_deref().is_some_and(|s| s != "never") {
            // 3 spans of capacity hold 2 or 3 whole aligned spans, whatever the start.
            assert!(
                advised == 2 * HUGE_PAGE_BYTES || advised == 3 * HUGE_PAGE_BYTES,
                "advised {advised} bytes"
            );
        }
        assert!(advised <= 3 * HUGE_PAGE_BYTES);
        assert!(buffer.is_empty(), "the advice writes nothing");
    }

    /// Where the kernel takes the advice, an advised buffer written afterwards is backed by huge
    /// pages (the `AnonHugePages` of its mapping in `/proc/self/smaps`).
    #[cfg(target_os = "linux")]
    #[test]
    fn an_advised_buffer_is_backed_by_huge_pages_where_the_kernel_allows() {
        let setting = transparent_huge_pages_setting();
        if setting.as_deref() != Some("madvise") && setting.as_deref() != Some("always") {
            eprintln!("skipped: transparent huge pages are {setting:?} on this kernel");
            return;
        }
        // A mapping of its own (above glibc's largest mmap threshold, 32 MiB), never heap pages
        // that other tests wrote and freed, which keep their 4 KiB backing.
        let bytes = 32 * HUGE_PAGE_BYTES;
        let mut buffer: Vec<u8> = Vec::with_capacity(bytes);
        assert!(advise(&mut buffer) >= bytes - HUGE_PAGE_BYTES);
        let fallbacks_before = vmstat("thp_fault_fallback");
        buffer.resize(bytes, 1);
        // The advice splits the mapping at the first whole span: look inside it.
        let first_span = (buffer.as_ptr() as usize).next_multiple_of(HUGE_PAGE_BYTES);
        let [flags, huge] = smaps_fields_of_mapping_at(first_span, ["VmFlags", "AnonHugePages"]);
        if !flags.split_whitespace().any(|flag| flag == "hg") {
            // The mapping does not carry the advice: it never reached the kernel. Only an
            // emulator does that (qemu's user mode, the aarch64 suite, takes no advice).
            if cfg!(target_arch = "x86_64") {
                panic!("the advice did not reach the kernel (VmFlags {flags})");
            }
            eprintln!("skipped: the advice did not reach the kernel (VmFlags {flags})");
            return;
        }
        let huge_kib: u64 = huge
            .trim_end_matches("kB")
            .trim()
            .parse()
            .expect("a kB figure");
        if huge_kib == 0 && vmstat("thp_fault_fallback") > fallbacks_before {
            // The kernel took the advice and found no free 2 MiB of memory (a fragmented host):
            // what the advice can do, it did.
            eprintln!("skipped: the kernel tried huge pages and fell back (fragmented memory)");
            return;
        }
        assert!(
            huge_kib >= (HUGE_PAGE_BYTES / 1024) as u64,
            "the buffer's mapping holds {huge_kib} KiB of huge pages"
        );
    }

    /// A counter of `/proc/vmstat` (0 where absent).
    #[cfg(target_os = "linux")]
    fn vmstat(name: &str) -> u64 {
        let text = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The values of the fields `names` of the mapping that holds `address`, from
    /// `/proc/self/smaps`.
    #[cfg(target_os = "linux")]
    fn smaps_fields_of_mapping_at<const N: usize>(address: usize, names: [&str; N]) -> [String; N] {
        let text = std::fs::read_to_string("/proc/self/smaps").expect("/proc/self/smaps");
        let mut inside = false;
        let mut found: [Option<String>; N] = std::array::from_fn(|_| None);
        for line in text.lines() {
            if let Some((start, end)) = mapping_bounds(line) {
                inside = (start..end).contains(&address);
            } else if let Some((name, value)) = line.split_once(':').filter(|_| inside) {
                if let Some(i) = names.iter().position(|n| *n == name) {
                    found[i] = Some(value.trim().to_string());
                }
            }
        }
        found.map(|v| v.unwrap_or_else(|| panic!("no mapping with {names:?} holds {address:#x}")))
    }

    /// `(start, end)` of a `/proc/self/smaps` mapping line (`start-end perms ...`), or `None`
    /// for a field line.
    #[cfg(target_os = "linux")]
    fn mapping_bounds(line: &str) -> Option<(usize, usize)> {
        let (start, end) = line.split_whitespace().next()?.split_once('-')?;
        Some((
            usize::from_str_radix(start, 16).ok()?,
            usize::from_str_radix(end, 16).ok()?,
        ))
    }
}
