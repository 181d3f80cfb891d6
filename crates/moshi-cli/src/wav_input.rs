//! WAV input for the CLI: 16/24/32-bit integer or 32-bit float PCM, any channel count (mixed to
//! mono by averaging), returned as f32 in [-1, 1). Only 24 kHz input is accepted until the
//! moshi-runtime resampler lands.

use std::path::Path;

use anyhow::{bail, Context, Result};

/// Mono samples and the file's sample rate.
pub struct WavAudio {
    pub samples: Vec<f32>,
    pub sample_rate: u32,
}

/// Reads any supported WAV file and mixes it to mono.
pub fn read_wav_mono(path: &Path) -> Result<WavAudio> {
    let reader = hound::WavReader::open(path).with_context(|| format!("{}: not a readable WAV file", path.display()))?;
    let spec = reader.spec();
    let channels = spec.channels as usize;
    if channels == 0 {
        bail!("{}: WAV header declares 0 channels", path.display());
    }
    let interleaved: Vec<f32> = match (spec.sample_format, spec.bits_per_sample) {
        (hound::SampleFormat::Int, 16) => collect(path, reader.into_samples::<i16>(), |s| s as f32 / 32768.0)?,
        (hound::SampleFormat::Int, 24) => collect(path, reader.into_samples::<i32>(), |s| s as f32 / 8_388_608.0)?,
        (hound::SampleFormat::Int, 32) => collect(path, reader.into_samples::<i32>(), |s| (s as f64 / 2_147_483_648.0) as f32)?,
        (hound::SampleFormat::Float, 32) => collect(path, reader.into_samples::<f32>(), |s| s)?,
        (format, bits) => bail!(
            "{}: unsupported WAV sample format: {bits}-bit {}; supported: 16/24/32-bit integer PCM or 32-bit float",
            path.display(),
            match format {
                hound::SampleFormat::Int => "integer",
                hound::SampleFormat::Float => "float",
            }
        ),
    };
    if interleaved.is_empty() {
        bail!("{}: the WAV file holds no samples", path.display());
    }
    let samples = if channels == 1 {
        interleaved
    } else {
        interleaved.chunks_exact(channels).map(|frame| frame.iter().sum::<f32>() / channels as f32).collect()
    };
    Ok(WavAudio { samples, sample_rate: spec.sample_rate })
}

/// Reads a WAV file that must already be at `sample_rate`.
pub fn read_wav_mono_at(path: &Path, sample_rate: u32) -> Result<Vec<f32>> {
    let audio = read_wav_mono(path)?;
    if audio.sample_rate != sample_rate {
        bail!(
            "{}: sample rate is {} Hz, Mimi needs {sample_rate} Hz (resampling lands with moshi-runtime; convert the file first, e.g. `sox in.wav -r {sample_rate} out.wav`)",
            path.display(),
            audio.sample_rate
        );
    }
    Ok(audio.samples)
}

fn collect<S, R: std::io::Read>(path: &Path, samples: hound::WavIntoSamples<R, S>, convert: impl Fn(S) -> f32) -> Result<Vec<f32>>
where
    S: hound::Sample,
{
    samples
        .map(|s| s.map(&convert))
        .collect::<std::result::Result<Vec<f32>, _>>()
        .with_context(|| format!("{}: corrupt WAV sample data", path.display()))
}

/// Writes mono f32 samples as 16-bit PCM: `trunc(x * 32767)` clamped (like `sphn.write_wav`).
pub fn write_wav_i16(path: &Path, samples: &[f32], sample_rate: u32) -> Result<()> {
    let spec = hound::WavSpec { channels: 1, sample_rate, bits_per_sample: 16, sample_format: hound::SampleFormat::Int };
    let mut writer = hound::WavWriter::create(path, spec).with_context(|| format!("{}: cannot create WAV file", path.display()))?;
    for &x in samples {
        let v = (x * 32767.0).clamp(-32768.0, 32767.0) as i16;
        writer.write_sample(v).with_context(|| format!("{}: write failed", path.display()))?;
    }
    writer.finalize().with_context(|| format!("{}: write failed", path.display()))
}
