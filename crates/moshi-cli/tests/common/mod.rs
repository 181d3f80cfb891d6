//! Helpers shared by the tests that run the built `moshi-rs` binary: fixture folders, running a
//! command offline, reading its outputs, checking a clear failure.

#![allow(dead_code, unused_imports)] // each test binary uses its own subset

use std::path::Path;
use std::process::Output;

/// `assets/<fixture>` (`tiny-a`, `tiny-hibiki`).
pub use moshi_test_support::fixture_dir as asset_dir;
/// A path as `&str`.
pub use moshi_test_support::path_str as s;
/// One JSON value per line.
pub use moshi_test_support::read_json_lines as jsonl;

/// Runs `moshi-rs args` with the Hugging Face hub offline.
pub fn moshi(args: &[&str]) -> Output {
    moshi_test_support::run_binary(env!("CARGO_BIN_EXE_moshi-rs"), args)
}

/// The samples of a 24 kHz mono 16-bit WAV.
pub fn read_i16(path: &Path) -> Vec<i16> {
    let mut r = hound::WavReader::open(path).unwrap();
    assert_eq!(r.spec().sample_rate, 24_000);
    assert_eq!(r.spec().channels, 1);
    assert_eq!(r.spec().bits_per_sample, 16);
    r.samples::<i16>().map(|x| x.unwrap()).collect()
}

/// The command failed, without a panic, and its stderr names every one of `needles`.
pub fn assert_fails(o: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "expected a failure, got success; stderr: {stderr}"
    );
    for n in needles {
        assert!(stderr.contains(n), "stderr should mention {n:?}: {stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Starting `moshi-rs serve` and checking what its clients got (the serve tests).
pub mod serve;
