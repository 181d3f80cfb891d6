//! How many compute threads to run by default: the performance cores on a big/little CPU (Apple
//! M-series, Arm big.LITTLE and DynamIQ, Intel hybrid), every logical CPU elsewhere. A frame's
//! products are split evenly over the threads, so one thread on an efficiency core (a third to a
//! half of a performance core's speed) would make every product wait for it.
//!
//! - macOS: `sysctl hw.nperflevels` > 1 marks a big/little CPU; `hw.perflevel0.logicalcpu` counts
//!   its performance cores (equal to `hw.perflevel0.physicalcpu` on Apple silicon, which has no
//!   SMT).
//! - Linux: each CPU this process may run on (`Cpus_allowed_list` of `/proc/self/status`, within
//!   `/sys/devices/system/cpu/online`) is rated by `cpuN/cpu_capacity` (arm64's scheduler
//!   capacity, 1024 for the biggest core) or, where that is missing, by
//!   `cpuN/cpufreq/cpuinfo_max_freq`; the cores within [`PERFORMANCE_FRACTION`] of the best count
//!   as performance cores. The margin keeps Intel's favoured cores (a few percent faster) from
//!   splitting a homogeneous CPU.
//!
//! Anything missing, unreadable, malformed or all equal means no big/little split is known, and
//! every CPU the process may use counts ([`std::thread::available_parallelism`]).

use std::path::Path;
use std::sync::OnceLock;

/// Cores rated at least this fraction of the best one count as performance cores.
pub const PERFORMANCE_FRACTION: f64 = 0.9;

/// Most CPU numbers a list is read to (larger numbers are treated as malformed input).
const MAX_CPUS: usize = 4096;

/// The default compute thread count (decided once): the performance cores this process may run on
/// where a big/little split is known, else every CPU it may run on.
pub fn default_compute_threads() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| {
        let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
        match performance_cores() {
            Some(n) => n.clamp(1, logical),
            None => logical,
        }
    })
}

/// The performance cores of a big/little CPU this process may run on, or `None` where no such
/// split is known (a homogeneous CPU, or nothing to tell them apart).
pub fn performance_cores() -> Option<usize> {
    #[cfg(target_os = "macos")]
    {
        macos::performance_cores()
    }
    #[cfg(target_os = "linux")]
    {
        let allowed = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|status| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                    .and_then(|list| parse_cpu_list(list.trim()))
            });
        performance_cores_from_sysfs(Path::new("/sys/devices/system/cpu"), allowed.as_deref())
    }
    #[cfg(not(any(target_os = "macos", target_os = "linux")))]
    {
        None
    }
}

/// [`performance_cores`] from a sysfs CPU folder (`/sys/devices/system/cpu` or a copy of its
/// `online`, `cpuN/cpu_capacity` and `cpuN/cpufreq/cpuinfo_max_freq` files), among the CPUs
/// `allowed` (all online ones if `None`).
pub fn performance_cores_from_sysfs(cpu_dir: &Path, allowed: Option<&[usize]>) -> Option<usize> {
    let online = parse_cpu_list(std::fs::read_to_string(cpu_dir.join("online")).ok()?.trim())?;
    let cpus: Vec<usize> = match allowed {
        Some(allowed) => online.into_iter().filter(|c| allowed.contains(c)).collect(),
        None => online,
    };
    let rate = |file: &str| -> Option<Vec<u64>> {
        cpus.iter()
            .map(|c| {
                let text = std::fs::read_to_string(cpu_dir.join(format!("cpu{c}")).join(file));
                text.ok()?.trim().parse::<u64>().ok()
            })
            .collect()
    };
    let ratings = rate("cpu_capacity").or_else(|| rate("cpufreq/cpuinfo_max_freq"))?;
    let best = *ratings.iter().max()?;
    if best == 0 || ratings.iter().all(|&r| r == best) {
        return None;
    }
    let performance = ratings
        .iter()
        .filter(|&&r| r as f64 >= PERFORMANCE_FRACTION * best as f64)
        .count();
    Some(performance)
}

/// A kernel CPU list (`0-3,6,8-11`), or `None` if malformed or naming a CPU past `MAX_CPUS`.
pub fn parse_cpu_list(list: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.trim().parse().ok()?, hi.trim().parse().ok()?),
            None => {
                let cpu: usize = part.parse().ok()?;
                (cpu, cpu)
            }
        };
        if lo > hi || hi >= MAX_CPUS {
            return None;
        }
        cpus.extend(lo..=hi);
    }
    (!cpus.is_empty()).then_some(cpus)
}

#[cfg(target_os = "macos")]
mod macos {
    use std::ffi::CString;

    /// An integer sysctl by name, if it exists.
    fn sysctl_u32(name: &str) -> Option<u32> {
        let name = CString::new(name).ok()?;
        let mut value: u32 = 0;
        let mut len = std::mem::size_of::<u32>();
        // SAFETY: `name` is a NUL-terminated string; `value` and `len` describe a writable buffer
        // of `len` bytes; no new value is set.
        let rc = unsafe {
            libc::sysctlbyname(
                name.as_ptr(),
                (&mut value as *mut u32).cast(),
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        (rc == 0 && len == std::mem::size_of::<u32>()).then_some(value)
    }

    /// `hw.perflevel0.logicalcpu` where `hw.nperflevels` > 1.
    pub(super) fn performance_cores() -> Option<usize> {
        if sysctl_u32("hw.nperflevels")? < 2 {
            return None;
        }
        let cores = sysctl_u32("hw.perflevel0.logicalcpu")?;
        (cores > 0).then_some(cores as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake sysfs CPU folder: `online`, and per CPU the given capacity and/or max frequency.
    fn fake_sysfs(
        online: &str,
        capacity: &[Option<u64>],
        max_freq: &[Option<u64>],
    ) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("online"), format!("{online}\n")).unwrap();
        for (c, cap) in capacity.iter().enumerate() {
            let cpu = dir.path().join(format!("cpu{c}"));
            std::fs::create_dir_all(cpu.join("cpufreq")).unwrap();
            if let Some(cap) = cap {
                std::fs::write(cpu.join("cpu_capacity"), format!("{cap}\n")).unwrap();
            }
            if let Some(Some(f)) = max_freq.get(c) {
                std::fs::write(cpu.join("cpufreq/cpuinfo_max_freq"), format!("{f}\n")).unwrap();
            }
        }
        dir
    }

    #[test]
    fn cpu_lists_parse_and_malformed_ones_are_refused() {
        assert_eq!(parse_cpu_list("0-3,6,8-9"), Some(vec![0, 1, 2, 3, 6, 8, 9]));
        assert_eq!(parse_cpu_list("5"), Some(vec![5]));
        for bad in ["", "3-1", "a", "0-", "1,,x", "0-4294967295", "99999"] {
            assert_eq!(parse_cpu_list(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn big_cores_are_counted_by_capacity() {
        // Four big cores at 1024, four little at 446 (an arm64 big.LITTLE phone or board).
        let caps = [1024, 1024, 1024, 1024, 446, 446, 446, 446].map(Some);
        let dir = fake_sysfs("0-7", &caps, &[]);
        assert_eq!(performance_cores_from_sysfs(dir.path(), None), Some(4));
        // Pinned to two big and all little cores: the two big ones.
        let allowed = parse_cpu_list("0,1,4-7").unwrap();
        assert_eq!(
            performance_cores_from_sysfs(dir.path(), Some(&allowed)),
            Some(2)
        );
        // Pinned to little cores only: they are all alike, no split.
        let little = parse_cpu_list("4-7").unwrap();
        assert_eq!(
            performance_cores_from_sysfs(dir.path(), Some(&little)),
            None
        );
        // A CPU offline is not counted.
        let dir = fake_sysfs("0-2,4-7", &caps, &[]);
        assert_eq!(performance_cores_from_sysfs(dir.path(), None), Some(3));
    }

    #[test]
    fn max_frequency_rates_cores_without_capacity_and_favoured_cores_do_not_split() {
        // An Intel hybrid part: 2 P-cores at 5.0 GHz, 4 E-cores at 3.8 GHz.
        let freqs = [
            5_000_000, 5_000_000, 3_800_000, 3_800_000, 3_800_000, 3_800_000,
        ]
        .map(Some);
        let dir = fake_sysfs("0-5", &[None; 6], &freqs);
        assert_eq!(performance_cores_from_sysfs(dir.path(), None), Some(2));
        // A homogeneous part whose favoured cores boost 4% higher: all of them count.
        let freqs = [5_200_000, 5_000_000, 5_000_000, 5_200_000].map(Some);
        let dir = fake_sysfs("0-3", &[None; 4], &freqs);
        assert_eq!(performance_cores_from_sysfs(dir.path(), None), Some(4));
    }

    #[test]
    fn missing_malformed_or_equal_ratings_mean_no_split() {
        // A VM: no capacity, no cpufreq.
        let dir = fake_sysfs("0-1", &[None, None], &[]);
        assert_eq!(performance_cores_from_sysfs(dir.path(), None), None);
        // One CPU's capacity missing and no frequencies: no rating for all of them.
        let dir = fake_sysfs("0-2", &[Some(1024), None, Some(512)], &[]);
        assert_eq!(performance_cores_from_sysfs(dir.path(), None), None);
        // Garbage in a rating file.
        let dir = fake_sysfs("0-1", &[Some(1024), Some(512)], &[]);
        std::fs::write(dir.path().join("cpu1/cpu_capacity"), "big\n").unwrap();
        assert_eq!(performance_cores_from_sysfs(dir.path(), None), None);
        // All equal.
        let dir = fake_sysfs("0-3", &[Some(1024); 4], &[]);
        assert_eq!(performance_cores_from_sysfs(dir.path(), None), None);
        // No online list at all, or a malformed one.
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(performance_cores_from_sysfs(dir.path(), None), None);
        std::fs::write(dir.path().join("online"), "zero\n").unwrap();
        assert_eq!(performance_cores_from_sysfs(dir.path(), None), None);
    }

    #[test]
    fn the_default_is_at_least_one_and_at_most_the_logical_cpus() {
        let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = default_compute_threads();
        assert!((1..=logical).contains(&threads));
    }
}
