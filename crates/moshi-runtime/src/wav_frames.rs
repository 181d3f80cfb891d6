//! A WAV file of any supported rate as 24 kHz frames, read, resampled and handed out one frame at
//! a time: memory stays flat whatever the file's length. The frames are exactly those of reading
//! the whole file and resampling it with [`crate::resample::resample_to`] (same chunked FFT
//! resampler), and their count is known before the first is read.

use std::path::{Path, PathBuf};

use crate::resample::{resampled_len, FileResampler};
use crate::wav::MonoReader;
use crate::{Result, RuntimeError};

/// Input samples read per step (the whole-file resampler's chunk: output is identical).
const READ_CHUNK_SAMPLES: usize = crate::resample::FILE_CHUNK_IN;

/// What to do with a last partial frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartialFrame {
    /// Drop it (T = len / frame frames).
    Drop,
    /// Zero-pad it into a whole frame.
    Pad,
}

/// The frames of a WAV file at a target rate.
pub struct WavFrames {
    path: PathBuf,
    reader: MonoReader,
    resampler: FileResampler,
    frame_samples: usize,
    total_frames: u64,
    frames_out: u64,
    /// Resampled samples not yet handed out, from `pending_start`.
    pending: Vec<f32>,
    pending_start: usize,
    read_buf: Vec<f32>,
    input_done: bool,
    source_rate_hz: u32,
    source_samples: u64,
}

impl WavFrames {
    /// Opens `path` for frames of `frame_samples` samples at `rate_hz`.
    pub fn open(
        path: &Path,
        rate_hz: u32,
        frame_samples: usize,
        partial: PartialFrame,
    ) -> Result<Self> {
        let reader = MonoReader::open(path)?;
        let source_rate_hz = reader.sample_rate_hz();
        let source_samples = reader.len_samples();
        if source_samples == 0 {
            return Err(RuntimeError::EmptyWav {
                path: path.to_path_buf(),
            });
        }
        let out_len = resampled_len(source_samples as usize, source_rate_hz, rate_hz) as u64;
        let total_frames = match partial {
            PartialFrame::Drop => out_len / frame_samples as u64,
            PartialFrame::Pad => out_len.div_ceil(frame_samples as u64),
        };
        Ok(Self {
            path: path.to_path_buf(),
            reader,
            resampler: FileResampler::new(source_rate_hz, rate_hz)?,
            frame_samples,
            total_frames,
            frames_out: 0,
            pending: Vec::new(),
            pending_start: 0,
            read_buf: Vec::with_capacity(READ_CHUNK_SAMPLES),
            input_done: false,
            source_rate_hz,
            source_samples,
        })
    }

    /// Frames this file gives (known before reading).
    pub fn total_frames(&self) -> u64 {
        self.total_frames
    }

    /// The file's own sample rate.
    pub fn source_rate_hz(&self) -> u32 {
        self.source_rate_hz
    }

    /// Mono samples in the file, at its own rate.
    pub fn source_samples(&self) -> u64 {
        self.source_samples
    }

    /// The next frame, `None` after the last. A file shorter than its header says is an error
    /// naming it.
    pub fn next_frame(&mut self) -> Result<Option<&[f32]>> {
        if self.frames_out == self.total_frames {
            return Ok(None);
        }
        while self.pending.len() - self.pending_start < self.frame_samples && !self.input_done {
            self.read_buf.clear();
            let n = self
                .reader
                .read_chunk(READ_CHUNK_SAMPLES, &mut self.read_buf)?;
            if self.pending_start > 0 {
                self.pending.drain(..self.pending_start);
                self.pending_start = 0;
            }
            if n == 0 {
                self.input_done = true;
                self.resampler.finish(&mut self.pending)?;
            } else {
                self.resampler.push(&self.read_buf, &mut self.pending)?;
            }
        }
        let available = self.pending.len() - self.pending_start;
        if available < self.frame_samples {
            if self.frames_out + 1 == self.total_frames && available > 0 {
                // The zero-padded last frame.
                self.pending
                    .resize(self.pending_start + self.frame_samples, 0.0);
            } else {
                return Err(RuntimeError::TruncatedWav {
                    path: self.path.clone(),
                    announced_samples: self.source_samples,
                });
            }
        }
        let start = self.pending_start;
        self.pending_start += self.frame_samples;
        self.frames_out += 1;
        Ok(Some(&self.pending[start..start + self.frame_samples]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resample::resample_to;

    fn asset(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../assets/tiny-a")
            .join(name)
    }

    /// Streaming == batch: the frames are the whole-file resampled signal, cut into frames.
    #[test]
    fn frames_equal_the_whole_file_resampled() {
        for (name, partial) in [
            ("input.wav", PartialFrame::Drop),
            ("input_16k.wav", PartialFrame::Drop),
            ("input_16k.wav", PartialFrame::Pad),
        ] {
            let audio = crate::wav::read_mono(&asset(name)).unwrap();
            let mut whole = resample_to(&audio.samples, audio.sample_rate_hz, 24_000).unwrap();
            if partial == PartialFrame::Pad {
                whole.resize(whole.len().div_ceil(1920) * 1920, 0.0);
            }
            let mut frames = WavFrames::open(&asset(name), 24_000, 1920, partial).unwrap();
            assert_eq!(frames.total_frames(), (whole.len() / 1920) as u64, "{name}");
            let mut streamed = Vec::new();
            while let Some(f) = frames.next_frame().unwrap() {
                streamed.extend_from_slice(f);
            }
            assert_eq!(streamed, whole[..streamed.len()], "{name}");
            assert_eq!(streamed.len(), whole.len() / 1920 * 1920, "{name}");
        }
    }

    #[test]
    fn a_file_shorter_than_its_header_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = std::fs::read(asset("input.wav")).unwrap();
        let cut = dir.path().join("cut.wav");
        std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
        let mut frames = WavFrames::open(&cut, 24_000, 1920, PartialFrame::Drop).unwrap();
        let err = loop {
            match frames.next_frame() {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("a truncated file gave all its announced frames"),
                Err(e) => break e.to_string(),
            }
        };
        assert!(err.contains("cut.wav"), "{err}");
    }
}
