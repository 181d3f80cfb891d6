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
/// Writes `samples` as a 24 kHz mono 16-bit WAV.
pub fn write_wav_24k(path: &Path, samples: impl IntoIterator<Item = i16>) {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 24_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    for s in samples {
        w.write_sample(s).unwrap();
    }
    w.finalize().unwrap();
}

pub fn read_i16(path: &Path) -> Vec<i16> {
    let mut r = hound::WavReader::open(path).unwrap();
    assert_eq!(r.spec().sample_rate, 24_000);
    assert_eq!(r.spec().channels, 1);
    assert_eq!(r.spec().bits_per_sample, 16);
    r.samples::<i16>().map(|x| x.unwrap()).collect()
}

/// A `--tokens-out` file (`lines`, one JSON object per frame) holds, frame for frame, the
/// reference run's text and audio tokens (`out_text_tokens`, `out_audio_tokens`) and no more.
pub fn assert_tokens_match_reference(lines: &[serde_json::Value], reference: &serde_json::Value) {
    let want_text = reference["out_text_tokens"].as_array().unwrap();
    let want_audio = reference["out_audio_tokens"].as_array().unwrap();
    assert_eq!(lines.len(), want_text.len(), "returned frames");
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["frame"], i, "frame index");
        assert_eq!(line["text"], want_text[i], "text token of frame {i}");
        assert_eq!(line["audio"], want_audio[i], "audio tokens of frame {i}");
    }
}

/// The WAV `ours` has the reference WAV's length and lies within `max_lsb` of it sample for
/// sample; returns the largest difference.
pub fn assert_wav_within_lsb(ours: &Path, reference: &Path, max_lsb: i32) -> i32 {
    let (ours_samples, theirs) = (read_i16(ours), read_i16(reference));
    assert_eq!(
        ours_samples.len(),
        theirs.len(),
        "{} samples",
        ours.display()
    );
    let worst = ours_samples
        .iter()
        .zip(&theirs)
        .map(|(a, b)| (*a as i32 - *b as i32).abs())
        .max()
        .unwrap_or(0);
    assert!(
        worst <= max_lsb,
        "{} differs from {} by {worst} LSB",
        ours.display(),
        reference.display()
    );
    worst
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
pub mod asr;
pub mod balancer;
pub mod chat;
pub mod serve;
