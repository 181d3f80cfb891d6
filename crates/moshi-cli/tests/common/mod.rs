//! Helpers shared by the tests that run the built `moshi-rs` binary: fixture folders, running a
//! command offline, reading its outputs, checking a clear failure.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// `assets/<fixture>` (`tiny-a`, `tiny-hibiki`).
pub fn asset_dir(fixture: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../assets")
        .join(fixture)
}

/// Runs `moshi-rs args` with the Hugging Face hub offline.
pub fn moshi(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moshi-rs"))
        .args(args)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap()
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The samples of a 24 kHz mono 16-bit WAV.
pub fn read_i16(path: &Path) -> Vec<i16> {
    let mut r = hound::WavReader::open(path).unwrap();
    assert_eq!(r.spec().sample_rate, 24_000);
    assert_eq!(r.spec().channels, 1);
    assert_eq!(r.spec().bits_per_sample, 16);
    r.samples::<i16>().map(|x| x.unwrap()).collect()
}

/// One JSON value per line.
pub fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
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
