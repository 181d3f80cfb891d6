//! WAV input/output. Reads any PCM WAV (8/16/24/32-bit integer or 32-bit float, any channel
//! count, any rate) as mono f32 (channels averaged); writes 24 kHz int16 mono or stereo WAVs
//! atomically (temp file in the same folder, then rename: nothing half-written on error).
//!
//! Integer samples are scaled by 1/2^(bits-1) (i16 / 32768, as symphonia/sphn read them); output
//! samples are `trunc(clamp(x, -1, 1) * 32767)`, as `sphn.write_wav` writes them.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use crate::{Result, RuntimeError};

/// A WAV file read into memory as mono f32 at its own sample rate.
#[derive(Debug, Clone)]
pub struct MonoAudio {
    /// Mono samples (all channels averaged), nominally in [-1, 1].
    pub samples: Vec<f32>,
    /// The file's sample rate.
    pub sample_rate_hz: u32,
    /// Channel count of the file before mixing.
    pub source_channels: u16,
}

/// Reads `path` as mono f32. Errors name the file: missing, not a WAV, unsupported sample
/// format, no samples.
pub fn read_mono(path: &Path) -> Result<MonoAudio> {
    if !path.exists() {
        return Err(RuntimeError::MissingFile {
            path: path.to_path_buf(),
        });
    }
    let file = File::open(path).map_err(|source| RuntimeError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut reader = hound::WavReader::new(std::io::BufReader::new(file)).map_err(|source| {
        RuntimeError::NotWav {
            path: path.to_path_buf(),
            source,
        }
    })?;
    let spec = reader.spec();
    let channels = spec.channels as usize;
    if channels == 0 {
        return Err(RuntimeError::UnsupportedWav {
            path: path.to_path_buf(),
            detail: "0 channels".into(),
        });
    }
    if spec.sample_rate == 0 {
        return Err(RuntimeError::UnsupportedWav {
            path: path.to_path_buf(),
            detail: "sample rate 0 Hz".into(),
        });
    }
    let interleaved: Vec<f32> = match (spec.sample_format, spec.bits_per_sample) {
        (hound::SampleFormat::Float, 32) => collect(path, reader.samples::<f32>())?,
        (hound::SampleFormat::Int, bits @ (8 | 16 | 24 | 32)) => {
            let scale = 1.0 / (1u64 << (bits - 1)) as f64;
            collect(
                path,
                reader
                    .samples::<i32>()
                    .map(|s| s.map(|v| (v as f64 * scale) as f32)),
            )?
        }
        (format, bits) => {
            return Err(RuntimeError::UnsupportedWav {
                path: path.to_path_buf(),
                detail: format!(
                    "{bits}-bit {format:?} samples; supported: 8/16/24/32-bit integer, 32-bit float"
                ),
            })
        }
    };
    if interleaved.len() < channels {
        return Err(RuntimeError::EmptyWav {
            path: path.to_path_buf(),
        });
    }
    let samples = if channels == 1 {
        interleaved
    } else {
        let inv = 1.0 / channels as f32;
        interleaved
            .chunks_exact(channels)
            .map(|f| f.iter().sum::<f32>() * inv)
            .collect()
    };
    Ok(MonoAudio {
        samples,
        sample_rate_hz: spec.sample_rate,
        source_channels: spec.channels,
    })
}

fn collect(path: &Path, it: impl Iterator<Item = hound::Result<f32>>) -> Result<Vec<f32>> {
    it.collect::<hound::Result<Vec<f32>>>()
        .map_err(|source| RuntimeError::NotWav {
            path: path.to_path_buf(),
            source,
        })
}

/// f32 -> int16 exactly as `sphn.write_wav` / moshi's run_inference.py: `trunc(x * 32767)`
/// after clamping to [-1, 1].
pub fn f32_to_i16(x: f32) -> i16 {
    let x = if x.is_nan() { 0.0 } else { x.clamp(-1.0, 1.0) };
    (x * 32767.0).trunc() as i16
}

/// Writes a mono int16 WAV atomically.
pub fn write_mono_i16(path: &Path, samples: &[f32], sample_rate_hz: u32) -> Result<()> {
    write_atomic(path, 1, sample_rate_hz, |w| {
        for &s in samples {
            w.write_sample(f32_to_i16(s))?;
        }
        Ok(())
    })
}

/// Writes a stereo int16 WAV atomically (`left[i]`, `right[i]` per frame; the shorter channel
/// is padded with silence).
pub fn write_stereo_i16(
    path: &Path,
    left: &[f32],
    right: &[f32],
    sample_rate_hz: u32,
) -> Result<()> {
    let n = left.len().max(right.len());
    write_atomic(path, 2, sample_rate_hz, |w| {
        for i in 0..n {
            w.write_sample(f32_to_i16(left.get(i).copied().unwrap_or(0.0)))?;
            w.write_sample(f32_to_i16(right.get(i).copied().unwrap_or(0.0)))?;
        }
        Ok(())
    })
}

/// The temporary path used while writing `path`: same folder, hidden, unique per process.
fn temp_path_for(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out.wav".into());
    let tmp_name = format!(".{name}.partial-{}", std::process::id());
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join(tmp_name),
        _ => PathBuf::from(tmp_name),
    }
}

fn write_atomic(
    path: &Path,
    channels: u16,
    sample_rate_hz: u32,
    body: impl FnOnce(&mut hound::WavWriter<BufWriter<File>>) -> hound::Result<()>,
) -> Result<()> {
    if path.is_dir() {
        return Err(RuntimeError::Write {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::IsADirectory, "is a directory"),
        });
    }
    let tmp = temp_path_for(path);
    let spec = hound::WavSpec {
        channels,
        sample_rate: sample_rate_hz,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let file = File::create(&tmp).map_err(|source| RuntimeError::Write {
        path: path.to_path_buf(),
        source,
    })?;
    let result = (|| -> hound::Result<()> {
        let mut writer = hound::WavWriter::new(BufWriter::new(file), spec)?;
        body(&mut writer)?;
        writer.finalize()
    })();
    if let Err(source) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(RuntimeError::WavWrite {
            path: path.to_path_buf(),
            source,
        });
    }
    std::fs::rename(&tmp, path).map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        RuntimeError::Write {
            path: path.to_path_buf(),
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asset(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../assets/tiny-a")
            .join(name)
    }

    #[test]
    fn reads_fixture_as_i16_over_32768() {
        let audio = read_mono(&asset("input.wav")).unwrap();
        assert_eq!(audio.sample_rate_hz, 24_000);
        assert_eq!(audio.samples.len(), 84354);
        // every sample is an exact multiple of 1/32768
        assert!(audio.samples.iter().all(|&s| (s * 32768.0).fract() == 0.0));
        assert!(audio.samples.iter().any(|&s| s != 0.0));
    }

    #[test]
    fn round_trips_every_format_and_mixes_channels() {
        let dir = tempfile::tempdir().unwrap();
        let frames = [0.5f32, -0.25, 0.0, 0.75];
        for (format, bits) in [
            (hound::SampleFormat::Int, 8u16),
            (hound::SampleFormat::Int, 16),
            (hound::SampleFormat::Int, 24),
            (hound::SampleFormat::Int, 32),
            (hound::SampleFormat::Float, 32),
        ] {
            let path = dir.path().join(format!("{bits}{format:?}.wav"));
            let spec = hound::WavSpec {
                channels: 2,
                sample_rate: 16_000,
                bits_per_sample: bits,
                sample_format: format,
            };
            let mut w = hound::WavWriter::create(&path, spec).unwrap();
            for &x in &frames {
                // left = x, right = x/2 -> mono = 0.75 x
                for v in [x, x / 2.0] {
                    match format {
                        hound::SampleFormat::Float => w.write_sample(v).unwrap(),
                        hound::SampleFormat::Int => {
                            let q = (v as f64 * (1u64 << (bits - 1)) as f64) as i32;
                            if bits == 8 {
                                w.write_sample(q as i8).unwrap()
                            } else {
                                w.write_sample(q).unwrap()
                            }
                        }
                    }
                }
            }
            w.finalize().unwrap();
            let audio = read_mono(&path).unwrap();
            assert_eq!(audio.source_channels, 2);
            assert_eq!(audio.sample_rate_hz, 16_000);
            assert_eq!(audio.samples.len(), frames.len());
            for (got, x) in audio.samples.iter().zip(frames) {
                let tol = 2.0 / (1u64 << (bits - 1)) as f32;
                assert!(
                    (got - 0.75 * x).abs() <= tol,
                    "{bits}-bit {format:?}: got {got}, want {}",
                    0.75 * x
                );
            }
        }
    }

    #[test]
    fn clear_errors_for_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.wav");
        let e = read_mono(&missing).unwrap_err().to_string();
        assert!(
            e.contains("does not exist") && e.contains("nope.wav"),
            "{e}"
        );
        let not_wav = dir.path().join("text.wav");
        std::fs::write(&not_wav, b"hello, this is not a RIFF file").unwrap();
        let e = read_mono(&not_wav).unwrap_err().to_string();
        assert!(
            e.contains("not a readable WAV") && e.contains("text.wav"),
            "{e}"
        );
        let empty = dir.path().join("empty.wav");
        write_mono_i16(&empty, &[], 24_000).unwrap();
        let e = read_mono(&empty).unwrap_err().to_string();
        assert!(e.contains("no audio samples"), "{e}");
    }

    #[test]
    fn writes_trunc_times_32767_and_leaves_nothing_on_error() {
        assert_eq!(f32_to_i16(1.0), 32767);
        assert_eq!(f32_to_i16(-1.0), -32767);
        assert_eq!(f32_to_i16(2.0), 32767);
        assert_eq!(f32_to_i16(0.99999), 32766);
        assert_eq!(f32_to_i16(-0.00002), 0);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("o.wav");
        write_stereo_i16(&out, &[0.5, 0.25], &[-0.5], 24_000).unwrap();
        let mut r = hound::WavReader::open(&out).unwrap();
        assert_eq!(r.spec().channels, 2);
        let s: Vec<i16> = r.samples::<i16>().map(|s| s.unwrap()).collect();
        assert_eq!(s, vec![16383, -16383, 8191, 0]);
        // unwritable destination: a folder that does not exist
        let bad = dir.path().join("no_such_dir").join("o.wav");
        let e = write_mono_i16(&bad, &[0.1], 24_000)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no_such_dir"), "{e}");
        // destination is a directory: error, and no temp file left behind
        let e = write_mono_i16(dir.path(), &[0.1], 24_000)
            .unwrap_err()
            .to_string();
        assert!(e.contains("directory"), "{e}");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers.len(), 1, "{leftovers:?}");
    }
}
