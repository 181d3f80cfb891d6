//! WAV input/output. Reads any PCM WAV (8/16/24/32-bit integer or 32/64-bit float, plain or
//! `WAVE_FORMAT_EXTENSIBLE`, any channel count, a rate from [`MIN_SAMPLE_RATE_HZ`] to
//! [`MAX_SAMPLE_RATE_HZ`]; its chunks read as the RIFF specification says, [`crate::riff`]) as
//! mono f32 (channels averaged), whole or chunk by chunk ([`MonoReader`]: memory flat whatever
//! the length). Writes int16 (or 32-bit float) mono or stereo WAVs as they are produced, of a length known up
//! front or not ([`WavWriter`]), through `moshi_loader::output_file`: nothing half-written on
//! error, devices and pipes written in place.
//!
//! Integer samples are scaled by 1/2^(bits-1) (i16 / 32768, as symphonia/sphn read them); output
//! samples are `trunc(clamp(x, -1, 1) * 32767)`, as `sphn.write_wav` writes them.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use moshi_loader::input_file::{check_input_file, InputKind};
use moshi_loader::output_file::{FinishedOutput, OutputFile};

use crate::riff::{read_wave_header, HeaderError, SampleEncoding, WaveHeader};
use crate::{Result, RuntimeError};

/// The lowest input sample rate accepted: telephone speech. Lower rates carry no usable
/// speech, and resampling a few samples at 1 Hz would make minutes of 24 kHz audio.
pub const MIN_SAMPLE_RATE_HZ: u32 = 8_000;
/// The highest input sample rate accepted.
pub const MAX_SAMPLE_RATE_HZ: u32 = 384_000;

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

/// What a [`MonoReader`] reads from: a file, or any byte stream.
type Source = BufReader<Box<dyn Read + Send>>;

/// A WAV file opened for reading as mono f32, a chunk at a time. Its RIFF chunks are read as
/// the specification says ([`crate::riff`]).
pub struct MonoReader {
    path: PathBuf,
    source: Source,
    header: WaveHeader,
    /// Sample frames of the `data` chunk not read yet.
    frames_left: u64,
    /// Raw bytes of the current chunk.
    bytes: Vec<u8>,
    /// Interleaved samples of the current chunk.
    interleaved: Vec<f32>,
    /// Interleaved samples read before the current chunk (for the index in errors).
    interleaved_read: u64,
}

impl MonoReader {
    /// Opens `path` and checks its header. Errors name the file: missing, not a WAV, an
    /// unsupported sample format, no channels, a sample rate out of range.
    pub fn open(path: &Path) -> Result<Self> {
        if !path.exists() && std::fs::symlink_metadata(path).is_err() {
            return Err(RuntimeError::MissingFile {
                path: path.to_path_buf(),
            });
        }
        check_input_file(path, InputKind::Readable)?;
        let io_error = |cause| RuntimeError::Io {
            path: path.to_path_buf(),
            cause,
        };
        let file = File::open(path).map_err(io_error)?;
        let metadata = file.metadata().map_err(io_error)?;
        // A regular file's length tells a streaming writer's placeholder size from a cut file.
        let len = metadata.is_file().then_some(metadata.len());
        Self::start(Box::new(file), len, path)
    }

    /// Reads a WAV from any byte stream; `path` names it in errors.
    pub fn from_reader(source: impl Read + Send + 'static, path: &Path) -> Result<Self> {
        Self::start(Box::new(source), None, path)
    }

    fn start(source: Box<dyn Read + Send>, len: Option<u64>, path: &Path) -> Result<Self> {
        let mut source = BufReader::new(source);
        let header = read_wave_header(&mut source, len).map_err(|e| match e {
            HeaderError::Malformed(detail) => RuntimeError::NotWav {
                path: path.to_path_buf(),
                detail,
            },
            HeaderError::Unsupported(detail) => RuntimeError::UnsupportedWav {
                path: path.to_path_buf(),
                detail,
            },
            HeaderError::Io(cause) => RuntimeError::Io {
                path: path.to_path_buf(),
                cause,
            },
        })?;
        if !(MIN_SAMPLE_RATE_HZ..=MAX_SAMPLE_RATE_HZ).contains(&header.sample_rate_hz) {
            return Err(RuntimeError::UnsupportedWav {
                path: path.to_path_buf(),
                detail: format!(
                    "sample rate {} Hz; supported: {MIN_SAMPLE_RATE_HZ} to {MAX_SAMPLE_RATE_HZ} Hz",
                    header.sample_rate_hz
                ),
            });
        }
        Ok(Self {
            path: path.to_path_buf(),
            source,
            frames_left: header.frames(),
            header,
            bytes: Vec::new(),
            interleaved: Vec::new(),
            interleaved_read: 0,
        })
    }

    pub fn sample_rate_hz(&self) -> u32 {
        self.header.sample_rate_hz
    }

    pub fn source_channels(&self) -> u16 {
        self.header.channels
    }

    /// Mono samples the header announces (a truncated file delivers fewer: an error when read).
    pub fn len_samples(&self) -> u64 {
        self.header.frames()
    }

    /// Appends up to `max_samples` mono samples to `out`; returns how many (0 at the end).
    pub fn read_chunk(&mut self, max_samples: usize, out: &mut Vec<f32>) -> Result<usize> {
        let frames = (max_samples as u64).min(self.frames_left) as usize;
        let channels = self.header.channels as usize;
        self.bytes.resize(frames * self.header.frame_bytes(), 0);
        let got =
            read_full(&mut self.source, &mut self.bytes).map_err(|cause| RuntimeError::Io {
                path: self.path.clone(),
                cause,
            })?;
        if got < self.bytes.len() {
            return Err(RuntimeError::TruncatedWav {
                path: self.path.clone(),
                announced_samples: self.header.frames(),
            });
        }
        self.frames_left -= frames as u64;
        self.decode()?;
        if channels == 1 {
            out.extend_from_slice(&self.interleaved);
        } else {
            let inv = 1.0 / channels as f32;
            out.extend(
                self.interleaved
                    .chunks_exact(channels)
                    .map(|f| f.iter().sum::<f32>() * inv),
            );
        }
        Ok(frames)
    }

    /// `self.bytes` as f32 samples in `self.interleaved`: integers scaled by 1/2^(bits-1) of
    /// their container (8-bit ones are unsigned), floats as they are, refusing NaN and infinities.
    fn decode(&mut self) -> Result<()> {
        self.interleaved.clear();
        let width = self.header.encoding.bytes();
        for b in self.bytes.chunks_exact(width) {
            let value = match self.header.encoding {
                SampleEncoding::Int { bytes: 1 } => (f64::from(b[0]) - 128.0) / 128.0,
                SampleEncoding::Int { bytes } => {
                    // Little-endian, sign-extended from the container's top byte.
                    let mut v = [0u8; 4];
                    v[4 - bytes..].copy_from_slice(b);
                    f64::from(i32::from_le_bytes(v)) / f64::from(1u32 << 31)
                }
                SampleEncoding::Float { bytes: 4 } => {
                    f64::from(f32::from_le_bytes(b.try_into().expect("4 bytes")))
                }
                SampleEncoding::Float { .. } => f64::from_le_bytes(b.try_into().expect("8 bytes")),
            };
            let sample = value as f32;
            if !sample.is_finite() {
                let index = self.interleaved_read + self.interleaved.len() as u64;
                let channels = u64::from(self.header.channels);
                return Err(RuntimeError::NonFiniteSample {
                    path: self.path.clone(),
                    sample_index: index / channels,
                    channel: (index % channels) as usize,
                    value: sample,
                });
            }
            self.interleaved.push(sample);
        }
        self.interleaved_read += self.interleaved.len() as u64;
        Ok(())
    }
}

/// Reads until `buf` is full or the stream ends; returns how many bytes were read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Reads `path` as mono f32. Errors name the file: missing, not a WAV, unsupported sample
/// format or rate, no samples.
pub fn read_mono(path: &Path) -> Result<MonoAudio> {
    let mut reader = MonoReader::open(path)?;
    let mut samples = Vec::new();
    while reader.read_chunk(1 << 16, &mut samples)? > 0 {}
    if samples.is_empty() {
        return Err(RuntimeError::EmptyWav {
            path: path.to_path_buf(),
        });
    }
    Ok(MonoAudio {
        samples,
        sample_rate_hz: reader.sample_rate_hz(),
        source_channels: reader.source_channels(),
    })
}

/// f32 -> int16 exactly as `sphn.write_wav` / moshi's run_inference.py: `trunc(x * 32767)`
/// after clamping to [-1, 1].
pub fn f32_to_i16(x: f32) -> i16 {
    let x = if x.is_nan() { 0.0 } else { x.clamp(-1.0, 1.0) };
    (x * 32767.0).trunc() as i16
}

/// Size of the header [`WavWriter`] writes.
const HEADER_BYTES: u64 = 44;

/// How a [`WavWriter`] stores its samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WavEncoding {
    /// 16-bit PCM, `trunc(clamp(x, -1, 1) * 32767)` (as `sphn.write_wav`).
    I16,
    /// 32-bit IEEE float, the samples exactly as they are (read back bit for bit).
    F32,
}

impl WavEncoding {
    fn bytes_per_sample(self) -> u16 {
        match self {
            WavEncoding::I16 => 2,
            WavEncoding::F32 => 4,
        }
    }

    /// The `fmt ` chunk's format tag: PCM or IEEE float.
    fn format_tag(self) -> u16 {
        match self {
            WavEncoding::I16 => 1,
            WavEncoding::F32 => 3,
        }
    }

    fn push_sample(self, x: f32, bytes: &mut Vec<u8>) {
        match self {
            WavEncoding::I16 => bytes.extend_from_slice(&f32_to_i16(x).to_le_bytes()),
            WavEncoding::F32 => bytes.extend_from_slice(&x.to_le_bytes()),
        }
    }
}

/// A WAV header for `data_bytes` bytes of samples.
fn wav_header(
    encoding: WavEncoding,
    channels: u16,
    sample_rate_hz: u32,
    data_bytes: u32,
) -> Vec<u8> {
    let block_align = channels * encoding.bytes_per_sample();
    let mut header = Vec::with_capacity(HEADER_BYTES as usize);
    header.extend_from_slice(b"RIFF");
    header.extend_from_slice(&(36 + data_bytes).to_le_bytes());
    header.extend_from_slice(b"WAVEfmt ");
    header.extend_from_slice(&16u32.to_le_bytes());
    header.extend_from_slice(&encoding.format_tag().to_le_bytes());
    header.extend_from_slice(&channels.to_le_bytes());
    header.extend_from_slice(&sample_rate_hz.to_le_bytes());
    header.extend_from_slice(&(sample_rate_hz * block_align as u32).to_le_bytes());
    header.extend_from_slice(&block_align.to_le_bytes());
    header.extend_from_slice(&(encoding.bytes_per_sample() * 8).to_le_bytes());
    header.extend_from_slice(b"data");
    header.extend_from_slice(&data_bytes.to_le_bytes());
    header
}

/// The most frames of `channels` channels a WAV holds (its sizes are 32-bit).
fn max_wav_frames(encoding: WavEncoding, channels: u16) -> u64 {
    (u64::from(u32::MAX) - 36) / (u64::from(channels) * u64::from(encoding.bytes_per_sample()))
}

/// A WAV output written as it is produced (16-bit PCM, or 32-bit float with
/// [`WavWriter::create_open_ended_f32`]): the header first, then the samples.
/// Its length is either known up front ([`WavWriter::create`]: [`WavWriter::finish`] checks
/// that exactly the announced frames were written) or not ([`WavWriter::create_open_ended`]:
/// `finish` writes the length into the header). Either way the output is committed by `finish`
/// only, so an error or an interruption leaves no half-written file.
pub struct WavWriter {
    out: OutputFile,
    encoding: WavEncoding,
    channels: u16,
    /// Frames the header announces; `None`: open-ended.
    expected_frames: Option<u64>,
    written_frames: u64,
    bytes: Vec<u8>,
}

impl WavWriter {
    /// Starts `path`: `frames` frames of `channels` channels at `sample_rate_hz`.
    pub fn create(path: &Path, channels: u16, sample_rate_hz: u32, frames: u64) -> Result<Self> {
        if frames > max_wav_frames(WavEncoding::I16, channels) {
            return Err(RuntimeError::WavTooLong {
                path: path.to_path_buf(),
                frames,
                channels,
            });
        }
        Self::start(
            path,
            WavEncoding::I16,
            channels,
            sample_rate_hz,
            Some(frames),
        )
    }

    /// Starts `path` for as many frames as come, up to what a WAV holds (see [`Self::fits`]).
    /// A regular file gets its length at [`Self::finish`]; a pipe or device, which cannot be
    /// rewritten, announces the longest WAV, as streaming writers do for an unknown length.
    pub fn create_open_ended(path: &Path, channels: u16, sample_rate_hz: u32) -> Result<Self> {
        Self::start(path, WavEncoding::I16, channels, sample_rate_hz, None)
    }

    /// [`Self::create_open_ended`] with 32-bit float samples: what is written reads back bit
    /// for bit (a recording of exactly what a model was fed).
    pub fn create_open_ended_f32(path: &Path, channels: u16, sample_rate_hz: u32) -> Result<Self> {
        Self::start(path, WavEncoding::F32, channels, sample_rate_hz, None)
    }

    fn start(
        path: &Path,
        encoding: WavEncoding,
        channels: u16,
        sample_rate_hz: u32,
        expected_frames: Option<u64>,
    ) -> Result<Self> {
        let frames = expected_frames.unwrap_or(max_wav_frames(encoding, channels));
        let data_bytes = (frames * Self::frame_bytes(encoding, channels)) as u32;
        let mut out = OutputFile::create(path)?;
        out.write_bytes(&wav_header(encoding, channels, sample_rate_hz, data_bytes))?;
        Ok(Self {
            out,
            encoding,
            channels,
            expected_frames,
            written_frames: 0,
            bytes: Vec::new(),
        })
    }

    /// Whether `frames` more frames fit: in the announced length, or in a WAV when open-ended.
    pub fn fits(&self, frames: u64) -> bool {
        let limit = self
            .expected_frames
            .unwrap_or(max_wav_frames(self.encoding, self.channels));
        self.written_frames + frames <= limit
    }

    /// Frames written so far.
    pub fn written_frames(&self) -> u64 {
        self.written_frames
    }

    /// Bytes of one frame (a sample of every channel).
    fn frame_bytes(encoding: WavEncoding, channels: u16) -> u64 {
        u64::from(channels) * u64::from(encoding.bytes_per_sample())
    }

    fn push(&mut self, frames: u64) -> Result<()> {
        if !self.fits(frames) {
            let path = self.out.path().to_path_buf();
            let written = self.written_frames + frames;
            return Err(match self.expected_frames {
                Some(announced) => RuntimeError::WavLength {
                    path,
                    written,
                    announced,
                },
                None => RuntimeError::WavTooLong {
                    path,
                    frames: written,
                    channels: self.channels,
                },
            });
        }
        self.out.write_bytes(&self.bytes)?;
        self.written_frames += frames;
        Ok(())
    }

    /// Appends mono samples (a mono output).
    pub fn write_mono(&mut self, samples: &[f32]) -> Result<()> {
        debug_assert_eq!(self.channels, 1);
        self.bytes.clear();
        for &s in samples {
            self.encoding.push_sample(s, &mut self.bytes);
        }
        self.push(samples.len() as u64)
    }

    /// Appends stereo frames (`left[i]`, `right[i]`; the shorter channel padded with silence).
    pub fn write_stereo(&mut self, left: &[f32], right: &[f32]) -> Result<()> {
        debug_assert_eq!(self.channels, 2);
        let n = left.len().max(right.len());
        self.bytes.clear();
        for i in 0..n {
            for s in [left.get(i), right.get(i)] {
                self.encoding
                    .push_sample(s.copied().unwrap_or(0.0), &mut self.bytes);
            }
        }
        self.push(n as u64)
    }

    /// Checks the length (announced) or writes it into the header (open-ended), and commits
    /// the output.
    pub fn finish(self) -> Result<()> {
        Ok(self.complete()?.commit()?)
    }

    /// [`Self::finish`] without putting the output in place: for a run with several outputs,
    /// committed together by `moshi_loader::output_file::commit_all`.
    pub fn complete(mut self) -> Result<FinishedOutput> {
        match self.expected_frames {
            Some(announced) if self.written_frames != announced => {
                return Err(RuntimeError::WavLength {
                    path: self.out.path().to_path_buf(),
                    written: self.written_frames,
                    announced,
                });
            }
            Some(_) => {}
            None if self.out.is_direct() => {}
            None => {
                let data_bytes =
                    (self.written_frames * Self::frame_bytes(self.encoding, self.channels)) as u32;
                self.out.seek_to(4)?;
                self.out.write_bytes(&(36 + data_bytes).to_le_bytes())?;
                self.out.seek_to(HEADER_BYTES - 4)?;
                self.out.write_bytes(&data_bytes.to_le_bytes())?;
            }
        }
        Ok(self.out.finish()?)
    }
}

/// Writes a mono int16 WAV (see [`WavWriter`]).
pub fn write_mono_i16(path: &Path, samples: &[f32], sample_rate_hz: u32) -> Result<()> {
    let mut w = WavWriter::create(path, 1, sample_rate_hz, samples.len() as u64)?;
    w.write_mono(samples)?;
    w.finish()
}

/// Writes a stereo int16 WAV (`left[i]`, `right[i]` per frame; the shorter channel is padded
/// with silence).
pub fn write_stereo_i16(
    path: &Path,
    left: &[f32],
    right: &[f32],
    sample_rate_hz: u32,
) -> Result<()> {
    let frames = left.len().max(right.len()) as u64;
    let mut w = WavWriter::create(path, 2, sample_rate_hz, frames)?;
    w.write_stereo(left, right)?;
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use moshi_test_support::tiny_a;

    #[test]
    fn reads_fixture_as_i16_over_32768() {
        let audio = read_mono(&tiny_a("input.wav")).unwrap();
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

    /// A float WAV holding NaN or an infinity is refused, naming the file, the sample and its
    /// channel (codec and file used to turn it into meaningless codes).
    #[test]
    fn non_finite_float_samples_are_refused_with_their_index() {
        let dir = tempfile::tempdir().unwrap();
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let path = dir.path().join("bad.wav");
            let spec = hound::WavSpec {
                channels: 2,
                sample_rate: 24_000,
                bits_per_sample: 32,
                sample_format: hound::SampleFormat::Float,
            };
            let mut w = hound::WavWriter::create(&path, spec).unwrap();
            for i in 0..2000 {
                w.write_sample(if i == 1501 { bad } else { 0.25f32 })
                    .unwrap();
            }
            w.finalize().unwrap();
            // Read in chunks smaller than the file: the index counts across chunks.
            let mut r = MonoReader::open(&path).unwrap();
            let mut out = Vec::new();
            let e = loop {
                match r.read_chunk(100, &mut out) {
                    Ok(0) => panic!("{bad} was accepted"),
                    Ok(_) => {}
                    Err(e) => break e.to_string(),
                }
            };
            assert!(
                e.contains(&path.display().to_string())
                    && e.contains("sample 750 (channel 1)")
                    && e.contains(&bad.to_string())
                    && e.contains("expected a finite number"),
                "{e}"
            );
        }
    }

    /// A file cut inside its samples is reported as truncated against the header's length,
    /// not with hound's "Failed to read enough bytes.".
    #[test]
    fn a_file_cut_inside_its_samples_is_truncated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cut.wav");
        write_mono_i16(&path, &[0.25; 1000], 24_000).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        for cut in [1001, 1000] {
            std::fs::write(&path, &bytes[..bytes.len() - cut]).unwrap();
            let e = read_mono(&path).unwrap_err().to_string();
            assert!(
                e.contains("cut.wav")
                    && e.contains("ends before the 1000 samples its header announces"),
                "cut {cut}: {e}"
            );
        }
    }

    /// A 16-bit mono WAV at 16 kHz of `samples`, its chunks as given around `fmt ` and `data`
    /// (`before`, `after`: id and body; odd bodies padded as RIFF requires).
    fn riff_wav(
        samples: &[i16],
        before: &[(&[u8; 4], &[u8])],
        after: &[(&[u8; 4], &[u8])],
    ) -> Vec<u8> {
        let chunk = |id: &[u8; 4], body: &[u8]| {
            let mut c = id.to_vec();
            c.extend_from_slice(&(body.len() as u32).to_le_bytes());
            c.extend_from_slice(body);
            if body.len() % 2 == 1 {
                c.push(0);
            }
            c
        };
        let mut fmt = Vec::new();
        for v in [1u16, 1] {
            fmt.extend_from_slice(&v.to_le_bytes());
        }
        fmt.extend_from_slice(&16_000u32.to_le_bytes());
        fmt.extend_from_slice(&32_000u32.to_le_bytes());
        fmt.extend_from_slice(&2u16.to_le_bytes());
        fmt.extend_from_slice(&16u16.to_le_bytes());
        let data: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
        let mut body = b"WAVE".to_vec();
        for (id, b) in before {
            body.extend(chunk(id, b));
        }
        body.extend(chunk(b"fmt ", &fmt));
        body.extend(chunk(b"data", &data));
        for (id, b) in after {
            body.extend(chunk(id, b));
        }
        let mut file = b"RIFF".to_vec();
        file.extend_from_slice(&(body.len() as u32).to_le_bytes());
        file.extend(body);
        file
    }

    /// Issue #41, the RIFF class: a chunk of odd size is followed by a pad byte its size does
    /// not count. A `LIST`/`INFO` chunk of odd size before `fmt ` or `data` (as editors write
    /// titles) made the reader look for the next chunk one byte early and refuse the file (or
    /// read garbage); unknown chunks anywhere and a `LIST` after the data read the same samples.
    #[test]
    fn odd_sized_and_unknown_chunks_are_skipped_with_their_pad_byte() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chunks.wav");
        let samples = [1000i16, -2000, 3000, -4000, 5000];
        let want: Vec<f32> = samples.iter().map(|&s| s as f32 / 32768.0).collect();
        // 19 bytes: odd (the title's own pad byte left out, as some writers do).
        let info: &[u8] = b"INFOINAM\x07\0\0\0a title";
        for (before, after) in [
            (vec![(b"LIST", info)], vec![]),
            (
                vec![(b"JUNK", &b"x"[..]), (b"LIST", info)],
                vec![(b"LIST", info)],
            ),
            (vec![(b"bext", &[0u8; 3][..])], vec![(b"id3 ", &b"abc"[..])]),
        ] {
            std::fs::write(&path, riff_wav(&samples, &before, &after)).unwrap();
            let audio = read_mono(&path).unwrap_or_else(|e| panic!("{before:?}: {e}"));
            assert_eq!(audio.samples, want, "{before:?} / {after:?}");
            assert_eq!(audio.sample_rate_hz, 16_000);
        }
    }

    /// The RIFF class: `data` before `fmt ` is invalid and says so; a chunk past the end of the
    /// file is named; a wrong RIFF size (streaming writers put 0 or the largest size there)
    /// does not change what is read; a `data` size that is the largest a WAV holds (moshi-rs or
    /// ffmpeg writing to a pipe) reads to the end of the file.
    #[test]
    fn chunk_order_sizes_past_the_end_and_riff_size_mismatches() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("order.wav");
        let samples = [1000i16, -2000, 3000];
        let good = riff_wav(&samples, &[], &[]);
        // data (at offset 36) moved before fmt (at offset 12).
        let mut swapped = good[..12].to_vec();
        swapped.extend_from_slice(&good[36..]);
        swapped.extend_from_slice(&good[12..36]);
        std::fs::write(&path, &swapped).unwrap();
        let e = read_mono(&path).unwrap_err().to_string();
        assert!(
            e.contains("order.wav")
                && e.contains("`data` chunk at offset 12 comes before the `fmt ` chunk"),
            "{e}"
        );
        let mut past_end = riff_wav(&samples, &[(b"LIST", &[0u8; 4][..])], &[]);
        past_end[16..20].copy_from_slice(&100_000u32.to_le_bytes());
        std::fs::write(&path, &past_end).unwrap();
        let e = read_mono(&path).unwrap_err().to_string();
        assert!(
            e.contains(
                "chunk `LIST` at offset 12 announces 100000 bytes, past the end of the file"
            ),
            "{e}"
        );
        let want = read_mono_bytes(&path, &good);
        for riff_size in [0u32, 4, u32::MAX] {
            let mut wrong = good.clone();
            wrong[4..8].copy_from_slice(&riff_size.to_le_bytes());
            assert_eq!(
                read_mono_bytes(&path, &wrong),
                want,
                "RIFF size {riff_size}"
            );
        }
        let out = dir.path().join("streamed.wav");
        // What a pipe receives from an open-ended `WavWriter` (`start`): the largest sizes,
        // then the samples.
        let mut streamed = wav_header(
            WavEncoding::I16,
            1,
            16_000,
            (max_wav_frames(WavEncoding::I16, 1) * 2) as u32,
        );
        for s in samples {
            streamed.extend_from_slice(&s.to_le_bytes());
        }
        std::fs::write(&out, &streamed).unwrap();
        assert_eq!(read_mono(&out).unwrap().samples, want);
    }

    fn read_mono_bytes(path: &Path, bytes: &[u8]) -> Vec<f32> {
        std::fs::write(path, bytes).unwrap();
        read_mono(path).unwrap().samples
    }

    #[test]
    fn low_and_high_rates_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        for rate in [1u32, 7_999, 400_000] {
            let path = dir.path().join(format!("{rate}.wav"));
            let spec = hound::WavSpec {
                channels: 1,
                sample_rate: rate,
                bits_per_sample: 16,
                sample_format: hound::SampleFormat::Int,
            };
            let mut w = hound::WavWriter::create(&path, spec).unwrap();
            for _ in 0..100 {
                w.write_sample(1000i16).unwrap();
            }
            w.finalize().unwrap();
            let e = read_mono(&path).unwrap_err().to_string();
            assert!(
                e.contains(&format!("sample rate {rate} Hz")) && e.contains("8000 to 384000 Hz"),
                "{e}"
            );
        }
    }

    #[test]
    fn reads_in_chunks_what_it_reads_whole() {
        let whole = read_mono(&tiny_a("input.wav")).unwrap().samples;
        let mut r = MonoReader::open(&tiny_a("input.wav")).unwrap();
        assert_eq!(r.len_samples(), whole.len() as u64);
        let mut chunked = Vec::new();
        while r.read_chunk(1000, &mut chunked).unwrap() > 0 {}
        assert_eq!(chunked, whole);
    }

    /// A float WAV reads back bit for bit (what a live model was fed, replayed offline), in
    /// a header hound and the readers of other tools take (IEEE float, 32 bits).
    #[test]
    fn float_wavs_read_back_bit_for_bit() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("fed.wav");
        let samples: Vec<f32> = (0..5000)
            .map(|i| ((i as f32) * 0.37).sin() * 1.25 + f32::EPSILON * i as f32)
            .collect();
        let mut w = WavWriter::create_open_ended_f32(&out, 1, 24_000).unwrap();
        w.write_mono(&samples[..1234]).unwrap();
        w.write_mono(&samples[1234..]).unwrap();
        w.finish().unwrap();
        let spec = hound::WavReader::open(&out).unwrap().spec();
        assert_eq!(
            (spec.sample_format, spec.bits_per_sample, spec.channels),
            (hound::SampleFormat::Float, 32, 1)
        );
        let back = read_mono(&out).unwrap();
        assert_eq!(back.sample_rate_hz, 24_000);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back.samples), bits(&samples));
        assert_eq!(
            std::fs::metadata(&out).unwrap().len(),
            HEADER_BYTES + 4 * samples.len() as u64
        );
    }

    #[test]
    fn announced_lengths_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("o.wav");
        let mut w = WavWriter::create(&out, 1, 24_000, 3).unwrap();
        w.write_mono(&[0.1, 0.2]).unwrap();
        assert!(w.write_mono(&[0.3, 0.4]).is_err());
        let e = w.finish().unwrap_err().to_string();
        assert!(
            e.contains("2 frames written") && e.contains("announced 3"),
            "{e}"
        );
        assert!(!out.exists());
        let e = WavWriter::create(&out, 2, 24_000, 1 << 31)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("too long for a WAV"), "{e}");
        // Our header reads back with hound, as every reader.
        write_mono_i16(&out, &[0.5, -0.5], 16_000).unwrap();
        let r = hound::WavReader::open(&out).unwrap();
        assert_eq!(r.spec().sample_rate, 16_000);
        assert_eq!(r.duration(), 2);
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
