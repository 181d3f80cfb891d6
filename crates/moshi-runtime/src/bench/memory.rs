//! Process memory figures for benchmark reports: peak and current resident set size.
//!
//! Linux reports them in `/proc/self/status` (`VmHWM`, the high-water mark of the resident set,
//! and `VmRSS`). Elsewhere the figures are unavailable and reported as `None`, never guessed.

/// Peak resident set size of this process in bytes (`VmHWM`), `None` where the OS does not say.
pub fn peak_resident_bytes() -> Option<u64> {
    status_field_bytes("VmHWM")
}

/// Current resident set size of this process in bytes (`VmRSS`), `None` where the OS does not say.
pub fn current_resident_bytes() -> Option<u64> {
    status_field_bytes("VmRSS")
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
    #[cfg(target_os = "linux")]
    fn peak_is_at_least_the_current_resident_set_on_linux() {
        let block = vec![1u8; 8 << 20];
        let current = current_resident_bytes().expect("VmRSS on Linux");
        let peak = peak_resident_bytes().expect("VmHWM on Linux");
        assert!(peak >= current, "peak {peak} < current {current}");
        assert!(current >= block.len() as u64, "resident {current} below an 8 MiB live block");
        drop(block);
    }
}
