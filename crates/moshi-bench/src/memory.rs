//! Memory figures for benchmark runs: peak and current resident set size for the report, and the
//! memory available, so that what a flag asks for is refused before allocating instead of
//! aborting the process.
//!
//! Linux reports them in `/proc/self/status` (`VmHWM`, the high-water mark of the resident set,
//! and `VmRSS`) and `/proc/meminfo` (`MemAvailable`). Elsewhere the figures are unavailable and
//! reported as `None`, never guessed (and nothing is refused).

use crate::BenchError;

/// Peak resident set size of this process in bytes (`VmHWM`), `None` where the OS does not say.
pub fn peak_resident_bytes() -> Option<u64> {
    status_field_bytes("VmHWM")
}

/// Current resident set size of this process in bytes (`VmRSS`), `None` where the OS does not say.
pub fn current_resident_bytes() -> Option<u64> {
    status_field_bytes("VmRSS")
}

/// Resets the peak resident set size to the current one (Linux: writes `5` to
/// `/proc/self/clear_refs`). Returns whether the OS accepted it.
pub fn reset_peak_resident() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Memory the kernel says can be allocated without swapping (`MemAvailable` of `/proc/meminfo`),
/// `None` where it is not reported.
pub fn available_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_status_field_bytes(&text, "MemAvailable")
}

/// Fails when `needed_bytes` is more than the available memory; `what` says who asks (a flag
/// with its value). Where the OS does not say, nothing is refused.
pub fn ensure_fits(what: impl FnOnce() -> String, needed_bytes: u64) -> Result<(), BenchError> {
    check_fits(what, needed_bytes, available_memory_bytes())
}

fn check_fits(
    what: impl FnOnce() -> String,
    needed_bytes: u64,
    available_bytes: Option<u64>,
) -> Result<(), BenchError> {
    match available_bytes {
        Some(available_bytes) if needed_bytes > available_bytes => {
            Err(BenchError::NotEnoughMemory {
                what: what(),
                needed_bytes,
                available_bytes,
            })
        }
        _ => Ok(()),
    }
}

fn status_field_bytes(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_status_field_bytes(&text, field)
}

/// Finds `field:   <n> kB` in a `/proc/<pid>/status` text and returns `n * 1024`.
pub fn parse_status_field_bytes(status_text: &str, field: &str) -> Option<u64> {
    status_text.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        let mut parts = rest.split_whitespace();
        let value: u64 = parts.next()?.parse().ok()?;
        match parts.next() {
            Some("kB") | None => Some(value * 1024),
            Some(_) => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kilobyte_fields_and_rejects_missing_ones() {
        let text = "Name:\tmoshi-rs\nVmPeak:\t  200 kB\nVmHWM:\t   12345 kB\nVmRSS:\t    100 kB\n";
        assert_eq!(parse_status_field_bytes(text, "VmHWM"), Some(12345 * 1024));
        assert_eq!(parse_status_field_bytes(text, "VmRSS"), Some(100 * 1024));
        assert_eq!(parse_status_field_bytes(text, "VmSwap"), None);
        assert_eq!(parse_status_field_bytes("VmHWM:\tlots kB\n", "VmHWM"), None);
    }

    #[test]
    fn reads_mem_available_and_refuses_what_does_not_fit() {
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   2097152 kB\n";
        assert_eq!(
            parse_status_field_bytes(text, "MemAvailable"),
            Some(2 << 30)
        );
        assert_eq!(
            parse_status_field_bytes("MemTotal: 5 kB\n", "MemAvailable"),
            None
        );
        let e = check_fits(|| "--kv-prefill 3000".into(), 3 << 30, Some(2 << 30))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--kv-prefill 3000") && e.contains("3.00 GiB") && e.contains("2.00 GiB"),
            "{e}"
        );
        assert!(check_fits(|| "x".into(), 1 << 30, Some(2 << 30)).is_ok());
        assert!(check_fits(|| "x".into(), u64::MAX, None).is_ok());
        #[cfg(target_os = "linux")]
        assert!(available_memory_bytes().is_some_and(|b| b > 0));
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn peak_is_at_least_the_current_resident_set_on_linux() {
        // Kept by `black_box`: an allocation whose bytes are never read may be left out.
        let block = std::hint::black_box(vec![1u8; 8 << 20]);
        let current = current_resident_bytes().expect("VmRSS on Linux");
        let peak = peak_resident_bytes().expect("VmHWM on Linux");
        assert!(peak >= current, "peak {peak} < current {current}");
        assert!(
            current >= block.len() as u64,
            "resident {current} below an 8 MiB live block"
        );
        drop(block);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn reset_brings_the_peak_back_to_the_current_resident_set() {
        let block = std::hint::black_box(vec![1u8; 64 << 20]);
        let peak_with_block = peak_resident_bytes().unwrap();
        drop(block);
        if !reset_peak_resident() {
            eprintln!("/proc/self/clear_refs not writable here; reset not exercised");
            return;
        }
        let peak = peak_resident_bytes().unwrap();
        let current = current_resident_bytes().unwrap();
        assert!(
            peak < peak_with_block,
            "peak {peak} not reset below {peak_with_block}"
        );
        assert!(
            peak + (8 << 20) >= current,
            "peak {peak} far below current {current}"
        );
    }
}
