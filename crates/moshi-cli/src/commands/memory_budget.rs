//! Refuses, before allocating, what a flag or config asks for beyond the memory the machine has
//! available (Linux `MemAvailable`): an error naming the flag and both sizes instead of an
//! allocation failure that aborts the process.

/// Memory the kernel says can be allocated without swapping (`MemAvailable` of `/proc/meminfo`),
/// `None` where it is not reported.
pub fn available_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&text)
}

fn parse_mem_available(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let rest = line.strip_prefix("MemAvailable:")?;
        let mut parts = rest.split_whitespace();
        let kib: u64 = parts.next()?.parse().ok()?;
        (parts.next() == Some("kB")).then(|| kib.saturating_mul(1024))
    })
}

/// `bytes` as GiB with two decimals.
pub fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Fails when `needed_bytes` is more than the available memory; `what` says who asks (a flag
/// with its value). Where the OS does not say, nothing is refused.
pub fn ensure_fits(what: &str, needed_bytes: u64) -> anyhow::Result<()> {
    check_fits(what, needed_bytes, available_memory_bytes())
}

fn check_fits(what: &str, needed_bytes: u64, available: Option<u64>) -> anyhow::Result<()> {
    match available {
        Some(avail) if needed_bytes > avail => anyhow::bail!(
            "{what} needs about {} of memory, the machine has {} available",
            gib(needed_bytes),
            gib(avail)
        ),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mem_available_and_refuses_what_does_not_fit() {
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   2097152 kB\n";
        assert_eq!(parse_mem_available(text), Some(2 << 30));
        assert_eq!(parse_mem_available("MemTotal: 5 kB\n"), None);
        let e = check_fits("--kv-prefill 3000", 3 << 30, Some(2 << 30))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--kv-prefill 3000") && e.contains("3.00 GiB") && e.contains("2.00 GiB"),
            "{e}"
        );
        assert!(check_fits("x", 1 << 30, Some(2 << 30)).is_ok());
        assert!(check_fits("x", u64::MAX, None).is_ok());
        #[cfg(target_os = "linux")]
        assert!(available_memory_bytes().is_some_and(|b| b > 0));
    }
}
