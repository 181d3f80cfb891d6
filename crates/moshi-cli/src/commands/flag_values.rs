//! Parsers of numeric flag values with their ranges (clap `value_parser`s): a value out of range
//! is refused before anything runs, and clap's message names the flag, the value and the range.

use std::time::Duration;

/// Most timed or warm-up frames `bench` runs (a day of audio at 80 ms per frame).
pub const MAX_BENCH_FRAMES: usize = 1_080_000;
/// Largest buffer of the memory-bandwidth probe, MiB.
pub const MAX_BANDWIDTH_BUFFER_MIB: usize = 1 << 16;
/// Largest jitter margin of `chat`, milliseconds.
pub const MAX_JITTER_MS: f64 = 10_000.0;
/// Longest `chat --duration-s` (one year).
pub const MAX_DURATION_S: f64 = 365.0 * 24.0 * 3600.0;

fn parse_f64(s: &str) -> Result<f64, String> {
    s.trim()
        .parse::<f64>()
        .map_err(|_| format!("`{s}` is not a number"))
}

fn parse_usize(s: &str) -> Result<usize, String> {
    s.trim()
        .parse::<usize>()
        .map_err(|_| format!("`{s}` is not a whole number >= 0"))
}

/// A sampling temperature: finite and at least 0 (0 picks the most probable token).
pub fn temperature(s: &str) -> Result<f32, String> {
    let refuse = || {
        format!("{s}: a temperature must be a finite number >= 0 (0 picks the most probable token)")
    };
    let v = parse_f64(s).map_err(|_| refuse())?;
    if !v.is_finite() || v < 0.0 || v > f32::MAX as f64 {
        return Err(refuse());
    }
    Ok(v as f32)
}

/// A classifier-free guidance coefficient: finite, above 0, at most the cap the config's
/// `lm_gen_config.cfg_coef` has (the flag used to accept what the config refuses).
pub fn cfg_coef(s: &str) -> Result<f32, String> {
    let max = moshi_loader::config::limits::MAX_CFG_COEF;
    let v = parse_f64(s)?;
    if !(v.is_finite() && v > 0.0 && v <= max) {
        return Err(format!(
            "{s}: expected a positive number at most {max} (1 = no guidance)"
        ));
    }
    Ok(v as f32)
}

/// `serve --host`: an IP address, or `localhost` for 127.0.0.1 (RFC 6761 reserves the name for
/// loopback, so it needs no lookup). Other names are refused: a name resolving to several
/// addresses, or to a public one, would make what the server exposes depend on DNS.
pub fn host(s: &str) -> Result<std::net::IpAddr, String> {
    if s.eq_ignore_ascii_case("localhost") {
        return Ok(std::net::Ipv4Addr::LOCALHOST.into());
    }
    s.trim().parse().map_err(|_| {
        format!(
            "`{}` is not an IP address: use 127.0.0.1 (or localhost) for this machine only, \
             0.0.0.0 for every interface, or one of its addresses",
            moshi_loader::escape::escape_controls(s)
        )
    })
}

/// A duration in seconds: finite, above 0, at most a year.
pub fn duration_s(s: &str) -> Result<f64, String> {
    let v = parse_f64(s)?;
    if !(v.is_finite() && v > 0.0 && v <= MAX_DURATION_S) {
        return Err(format!(
            "{s}: expected a number of seconds above 0 and at most {MAX_DURATION_S} (a year)"
        ));
    }
    Duration::try_from_secs_f64(v).map_err(|e| format!("{s}: {e}"))?;
    Ok(v)
}

/// A jitter margin in milliseconds: finite, from 0 to [`MAX_JITTER_MS`].
pub fn jitter_ms(s: &str) -> Result<f64, String> {
    let v = parse_f64(s)?;
    if !(v.is_finite() && (0.0..=MAX_JITTER_MS).contains(&v)) {
        return Err(format!(
            "{s}: expected milliseconds from 0 to {MAX_JITTER_MS}"
        ));
    }
    Ok(v)
}

/// Compute threads: 1 to the machine's logical CPUs (the thread team spins while it waits, so
/// more threads than CPUs only slow every frame down).
pub fn threads(s: &str) -> Result<usize, String> {
    let v = parse_usize(s)?;
    let cpus = logical_cpus();
    if !(1..=cpus).contains(&v) {
        return Err(format!(
            "{s}: expected 1 to {cpus} (this machine's logical CPUs)"
        ));
    }
    Ok(v)
}

/// The machine's logical CPUs (1 when unknown).
pub fn logical_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Timed frames of `bench`: 1 to [`MAX_BENCH_FRAMES`].
pub fn bench_frames(s: &str) -> Result<usize, String> {
    in_range(s, 1, MAX_BENCH_FRAMES)
}

/// Warm-up frames of `bench`: 0 to [`MAX_BENCH_FRAMES`].
pub fn warmup_frames(s: &str) -> Result<usize, String> {
    in_range(s, 0, MAX_BENCH_FRAMES)
}

/// Most input frames `chat` lets wait behind the one being processed (20 s).
pub const MAX_BACKLOG_FRAMES: usize = 250;

/// `chat --max-backlog-frames`: 0 to [`MAX_BACKLOG_FRAMES`].
pub fn backlog_frames(s: &str) -> Result<usize, String> {
    in_range(s, 0, MAX_BACKLOG_FRAMES)
}

/// Most padding frames `speak --padding-between` forces between words (20 s at 12.5 Hz): past
/// it a short text made a run without end (the sweep's `--padding-between 100000000000`).
pub const MAX_PADDING_BETWEEN_FRAMES: usize = 250;

/// `speak --padding-between`: 0 to [`MAX_PADDING_BETWEEN_FRAMES`].
pub fn padding_between_frames(s: &str) -> Result<usize, String> {
    in_range(s, 0, MAX_PADDING_BETWEEN_FRAMES)
}

/// `bench --probe-every`: 0 (none) to [`MAX_BENCH_FRAMES`].
pub fn probe_every(s: &str) -> Result<usize, String> {
    in_range(s, 0, MAX_BENCH_FRAMES)
}

/// The bandwidth probe's buffer: 1 to [`MAX_BANDWIDTH_BUFFER_MIB`] MiB.
pub fn bandwidth_buffer_mib(s: &str) -> Result<usize, String> {
    in_range(s, 1, MAX_BANDWIDTH_BUFFER_MIB)
}

fn in_range(s: &str, min: usize, max: usize) -> Result<usize, String> {
    let v = parse_usize(s)?;
    if !(min..=max).contains(&v) {
        return Err(format!("{s}: expected {min} to {max}"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temperatures_are_finite_and_non_negative() {
        assert_eq!(temperature("0.8").unwrap(), 0.8);
        assert_eq!(temperature("0").unwrap(), 0.0);
        for bad in ["-1", "NaN", "nan", "inf", "-inf", "1e39", "hot"] {
            let e = temperature(bad).unwrap_err();
            assert!(e.contains(bad) && e.contains("temperature"), "{bad}: {e}");
        }
    }

    /// Issue #41 defect 22: `--cfg-coef 1001` was accepted while the config caps
    /// `lm_gen_config.cfg_coef` at 1000.
    #[test]
    fn cfg_coef_has_the_configs_cap() {
        assert_eq!(cfg_coef("3").unwrap(), 3.0);
        assert_eq!(cfg_coef("1000").unwrap(), 1000.0);
        for bad in ["1001", "1e9", "0", "-1", "NaN", "inf", "x"] {
            assert!(cfg_coef(bad).is_err(), "{bad}");
        }
        assert!(cfg_coef("1001").unwrap_err().contains("at most 1000"));
    }

    /// The sweep's find (issue #41): `speak --padding-between 100000000000 hi` ran without end.
    #[test]
    fn padding_between_is_bounded() {
        assert_eq!(padding_between_frames("1").unwrap(), 1);
        assert_eq!(padding_between_frames("250").unwrap(), 250);
        for bad in ["251", "100000000000", "-1", "x"] {
            assert!(padding_between_frames(bad).is_err(), "{bad}");
        }
    }

    /// Issue #41 defect 22: `--host localhost` was refused as an invalid IP address.
    #[test]
    fn host_takes_an_ip_address_or_localhost() {
        assert_eq!(host("localhost").unwrap().to_string(), "127.0.0.1");
        assert_eq!(host("LocalHost").unwrap().to_string(), "127.0.0.1");
        assert_eq!(host("0.0.0.0").unwrap().to_string(), "0.0.0.0");
        assert_eq!(host("::1").unwrap().to_string(), "::1");
        let e = host("example.com").unwrap_err();
        assert!(e.contains("example.com") && e.contains("127.0.0.1"), "{e}");
        // Untrusted text is echoed escaped.
        assert!(host("a\u{1b}[31m").unwrap_err().contains("\\u{1b}"));
    }

    #[test]
    fn durations_and_margins_are_bounded() {
        assert_eq!(duration_s("2.5").unwrap(), 2.5);
        for bad in ["0", "-1", "NaN", "inf", "1e300"] {
            assert!(duration_s(bad).is_err(), "{bad}");
        }
        assert_eq!(jitter_ms("0").unwrap(), 0.0);
        for bad in ["-0.5", "NaN", "1e12"] {
            assert!(jitter_ms(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn counts_are_bounded() {
        assert_eq!(threads("1").unwrap(), 1);
        let e = threads("10000").unwrap_err();
        assert!(e.contains("logical CPUs"), "{e}");
        assert!(threads("0").is_err());
        assert!(threads("-3").unwrap_err().contains("whole number"));
        assert!(bench_frames("0").is_err());
        assert_eq!(warmup_frames("0").unwrap(), 0);
        assert!(bandwidth_buffer_mib("100000000")
            .unwrap_err()
            .contains("1 to 65536"));
        assert_eq!(probe_every("0").unwrap(), 0);
        assert_eq!(probe_every("10").unwrap(), 10);
        assert!(probe_every("2000000").unwrap_err().contains("0 to 1080000"));
        assert!(probe_every("-1").unwrap_err().contains("whole number"));
    }
}
