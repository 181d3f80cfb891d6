//! Sample-rate conversion with rubato, to and from Moshi's 24 kHz.
//!
//! * [`resample_to`]: a whole signal (files). Synchronous FFT resampler (`FftFixedIn`, input
//!   chunks of [`FILE_CHUNK_IN`] samples), as sphn (what moshi's run_inference.py reads WAVs with)
//!   does: the output is every produced chunk, the last input chunk zero-padded, no delay trimmed.
//!   This reproduces `ref/input_16k_resampled.npy` (see the test for the SNR reached).
//! * [`StreamResampler`]: a chunked, preallocated resampler for the engine thread (device rate
//!   <-> 24 kHz). Push any number of samples, pop what is ready; no allocation after
//!   construction. Same rate: a plain copy.

use rubato::{FftFixedIn, Resampler};

use crate::{Result, RuntimeError};

/// Input chunk (samples) of the whole-file resampler: the chunk size sphn uses.
pub const FILE_CHUNK_IN: usize = 1024;

fn resample_error(from_hz: u32, to_hz: u32, e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Resample {
        from_hz,
        to_hz,
        detail: e.to_string(),
    }
}

/// Resamples a whole mono signal from `from_hz` to `to_hz`. Same rate: returns a copy.
///
/// Output length = ceil(len / FILE_CHUNK_IN) whole output chunks (sphn's convention: the tail
/// of the last zero-padded chunk is kept, the resampler delay is not trimmed): see
/// [`resampled_len`].
pub fn resample_to(samples: &[f32], from_hz: u32, to_hz: u32) -> Result<Vec<f32>> {
    let mut resampler = FileResampler::new(from_hz, to_hz)?;
    let mut out = Vec::with_capacity(resampled_len(samples.len(), from_hz, to_hz));
    resampler.push(samples, &mut out)?;
    resampler.finish(&mut out)?;
    Ok(out)
}

/// Length of [`resample_to`]'s output for `len` input samples, without resampling: whole
/// zero-padded input chunks of [`FILE_CHUNK_IN`], each FFT block of the resampler giving its
/// fixed output block (rubato's `FftFixedIn` arithmetic; checked against `resample_to` by the
/// tests).
pub fn resampled_len(len: usize, from_hz: u32, to_hz: u32) -> usize {
    if from_hz == to_hz || from_hz == 0 || to_hz == 0 {
        return len;
    }
    let (from, to) = (from_hz as usize, to_hz as usize);
    let gcd = gcd(from, to);
    let min_chunk_in = from / gcd;
    let fft_chunks = FILE_CHUNK_IN.div_ceil(min_chunk_in);
    let (fft_in, fft_out) = (fft_chunks * from / gcd, fft_chunks * to / gcd);
    let input = len.div_ceil(FILE_CHUNK_IN) * FILE_CHUNK_IN;
    input / fft_in * fft_out
}

fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The whole-file resampler fed a piece at a time: the same output as [`resample_to`] on the
/// concatenated input, produced as the input arrives (chunks of [`FILE_CHUNK_IN`]).
pub struct FileResampler {
    inner: Option<FftFixedIn<f32>>,
    from_hz: u32,
    to_hz: u32,
    chunk: Vec<Vec<f32>>,
    filled: usize,
    chunk_out: Vec<Vec<f32>>,
}

impl FileResampler {
    pub fn new(from_hz: u32, to_hz: u32) -> Result<Self> {
        let inner = if from_hz == to_hz {
            None
        } else {
            Some(
                FftFixedIn::<f32>::new(from_hz as usize, to_hz as usize, FILE_CHUNK_IN, 1, 1)
                    .map_err(|e| resample_error(from_hz, to_hz, e))?,
            )
        };
        let chunk_out = inner
            .as_ref()
            .map_or_else(Vec::new, |r| r.output_buffer_allocate(true));
        Ok(Self {
            inner,
            from_hz,
            to_hz,
            chunk: vec![vec![0f32; FILE_CHUNK_IN]],
            filled: 0,
            chunk_out,
        })
    }

    /// Feeds `input`; appends the output of every completed chunk to `out`.
    pub fn push(&mut self, mut input: &[f32], out: &mut Vec<f32>) -> Result<()> {
        if self.inner.is_none() {
            out.extend_from_slice(input);
            return Ok(());
        }
        while !input.is_empty() {
            let take = (FILE_CHUNK_IN - self.filled).min(input.len());
            self.chunk[0][self.filled..self.filled + take].copy_from_slice(&input[..take]);
            self.filled += take;
            input = &input[take..];
            if self.filled == FILE_CHUNK_IN {
                self.process(out)?;
            }
        }
        Ok(())
    }

    /// Ends the input: a partial last chunk is zero-padded and resampled.
    pub fn finish(&mut self, out: &mut Vec<f32>) -> Result<()> {
        if self.inner.is_some() && self.filled > 0 {
            self.chunk[0][self.filled..].fill(0.0);
            self.process(out)?;
        }
        Ok(())
    }

    fn process(&mut self, out: &mut Vec<f32>) -> Result<()> {
        let (from_hz, to_hz) = (self.from_hz, self.to_hz);
        let resampler = self.inner.as_mut().expect("only called when resampling");
        let (_, produced) = resampler
            .process_into_buffer(&self.chunk, &mut self.chunk_out, None)
            .map_err(|e| resample_error(from_hz, to_hz, e))?;
        out.extend_from_slice(&self.chunk_out[0][..produced]);
        self.filled = 0;
        Ok(())
    }
}

/// A streaming mono resampler with fixed internal buffers, usable on the engine thread.
pub struct StreamResampler {
    inner: Option<FftFixedIn<f32>>,
    chunk_in: usize,
    pending_in: Vec<f32>,
    in_buf: Vec<Vec<f32>>,
    out_buf: Vec<Vec<f32>>,
    ready: Vec<f32>,
    ready_start: usize,
    /// Output samples per input sample (`to_hz / from_hz`).
    out_per_in: f64,
}

impl StreamResampler {
    /// A resampler from `from_hz` to `to_hz` taking input in chunks of `chunk_in` samples
    /// (pushes of any size are buffered). `max_pending_samples` bounds the output that may wait
    /// to be popped (buffers are sized for it, so no allocation happens later).
    pub fn new(
        from_hz: u32,
        to_hz: u32,
        chunk_in: usize,
        max_pending_samples: usize,
    ) -> Result<Self> {
        let chunk_in = chunk_in.max(1);
        let inner = if from_hz == to_hz {
            None
        } else {
            Some(
                FftFixedIn::<f32>::new(from_hz as usize, to_hz as usize, chunk_in, 1, 1)
                    .map_err(|e| resample_error(from_hz, to_hz, e))?,
            )
        };
        let out_max = inner.as_ref().map_or(chunk_in, |r| r.output_frames_max());
        Ok(Self {
            chunk_in,
            pending_in: Vec::with_capacity(2 * chunk_in),
            in_buf: vec![vec![0.0; chunk_in]],
            out_buf: inner.as_ref().map_or_else(
                || vec![vec![0.0; chunk_in]],
                |r| r.output_buffer_allocate(true),
            ),
            ready: Vec::with_capacity(max_pending_samples + 2 * out_max + chunk_in),
            ready_start: 0,
            out_per_in: f64::from(to_hz) / f64::from(from_hz.max(1)),
            inner,
        })
    }

    /// Samples ready to pop.
    pub fn available(&self) -> usize {
        self.ready.len() - self.ready_start
    }

    /// How long a sample pushed now waits inside the resampler before it can be popped, in
    /// output samples: the input pending until its chunk is complete, plus the FFT resampler's
    /// group delay (rubato's `output_delay`, about 5 ms at 44.1/48 kHz). Same rate: 0.
    pub fn delay_out_samples(&self) -> f64 {
        self.inner.as_ref().map_or(0.0, |r| {
            self.pending_in.len() as f64 * self.out_per_in + r.output_delay() as f64
        })
    }

    /// Feeds input samples. Output becomes available per completed input chunk.
    pub fn push(&mut self, mut input: &[f32]) -> Result<()> {
        if self.inner.is_none() {
            self.compact();
            self.ready.extend_from_slice(input);
            return Ok(());
        }
        while !input.is_empty() {
            let take = (self.chunk_in - self.pending_in.len()).min(input.len());
            self.pending_in.extend_from_slice(&input[..take]);
            input = &input[take..];
            if self.pending_in.len() == self.chunk_in {
                self.in_buf[0].copy_from_slice(&self.pending_in);
                self.pending_in.clear();
                let resampler = self.inner.as_mut().expect("checked above");
                let (_, produced) = resampler
                    .process_into_buffer(&self.in_buf, &mut self.out_buf, None)
                    .map_err(|e| RuntimeError::Resample {
                        from_hz: 0,
                        to_hz: 0,
                        detail: e.to_string(),
                    })?;
                self.compact();
                self.ready.extend_from_slice(&self.out_buf[0][..produced]);
            }
        }
        Ok(())
    }

    /// Moves up to `out.len()` ready samples into `out`; returns how many.
    pub fn pop_into(&mut self, out: &mut [f32]) -> usize {
        let n = out.len().min(self.available());
        out[..n].copy_from_slice(&self.ready[self.ready_start..self.ready_start + n]);
        self.ready_start += n;
        n
    }

    /// Drops everything buffered (after a deliberate frame drop).
    pub fn clear(&mut self) {
        self.ready.clear();
        self.ready_start = 0;
    }

    fn compact(&mut self) {
        if self.ready_start > 0 {
            self.ready.copy_within(self.ready_start.., 0);
            self.ready.truncate(self.ready.len() - self.ready_start);
            self.ready_start = 0;
        }
    }
}

/// Signal-to-noise ratio of `got` against `reference` in dB (over the common length).
pub fn snr_db(reference: &[f32], got: &[f32]) -> f64 {
    let n = reference.len().min(got.len());
    let (mut sig, mut err) = (0f64, 0f64);
    for i in 0..n {
        sig += (reference[i] as f64).powi(2);
        err += (reference[i] as f64 - got[i] as f64).powi(2);
    }
    10.0 * (sig / err.max(1e-30)).log10()
}

#[cfg(test)]
mod tests {
    use super::*;
    use moshi_test_support::tiny_a;

    /// Floor for the SNR against sphn's output. Measured: 327.9 dB (identical up to f32
    /// rounding: sphn uses the same FftFixedIn with 1024-sample chunks). A different rubato
    /// resampler (sinc, other chunking or trimmed delay) lands far below this floor.
    const MIN_SNR_DB_VS_SPHN: f64 = 120.0;

    /// `resampled_len` predicts `resample_to`'s output length for every rate and length.
    #[test]
    fn resampled_len_is_exact() {
        for from in [
            8_000u32, 11_025, 16_000, 22_050, 24_000, 32_000, 44_100, 48_000, 96_000,
        ] {
            for len in [1usize, 100, 1023, 1024, 1025, 5000, 48_001] {
                let signal: Vec<f32> = (0..len).map(|i| (i as f32 * 0.01).sin()).collect();
                let got = resample_to(&signal, from, 24_000).unwrap().len();
                assert_eq!(
                    resampled_len(len, from, 24_000),
                    got,
                    "{from} Hz, {len} samples"
                );
            }
        }
    }

    #[test]
    fn input_16k_matches_sphn_reference() {
        let audio = crate::wav::read_mono(&tiny_a("input_16k.wav")).unwrap();
        let reference = moshi_loader::npy::read_f32(tiny_a("ref/input_16k_resampled.npy")).unwrap();
        let ours = resample_to(&audio.samples, 16_000, 24_000).unwrap();
        let snr = snr_db(&reference.data, &ours);
        eprintln!(
            "16k->24k: ours {} samples, reference {} samples, SNR {snr:.2} dB",
            ours.len(),
            reference.data.len()
        );
        assert_eq!(ours.len(), reference.data.len());
        assert!(
            snr >= MIN_SNR_DB_VS_SPHN,
            "SNR {snr:.2} dB < {MIN_SNR_DB_VS_SPHN} dB"
        );
    }
}

#[cfg(test)]
mod stream_tests {
    use super::*;
    use crate::SAMPLE_RATE_HZ;

    /// The streaming resampler, fed in odd-sized pushes, produces exactly what the whole-signal
    /// resampler produces (same FFT resampler, same chunking).
    fn stream_tail_bound(from: u32, to: u32, chunk: usize) -> usize {
        2 * (chunk * to as usize).div_ceil(from as usize) + 2 * to as usize / 100
    }

    #[test]
    fn stream_equals_batch_for_odd_pushes() {
        let signal: Vec<f32> = (0..10_000)
            .map(|i| ((i as f32) * 0.01).sin() * 0.5)
            .collect();
        for (from, to, chunk) in [
            (48_000u32, 24_000u32, 1024usize),
            (16_000, 24_000, 1024),
            (44_100, 24_000, 1024),
        ] {
            let batch = resample_to(&signal, from, to).unwrap();
            let mut stream = StreamResampler::new(from, to, chunk, 8192).unwrap();
            let got = stream_in_steps(&mut stream, &signal, &[1, 2, 3, 500, 1023, 1024, 1025], 777);
            // The stream holds back the incomplete last chunk that the batch zero-pads.
            let max_tail = stream_tail_bound(from, to, chunk);
            assert!(
                got.len() <= batch.len() && got.len() + max_tail >= batch.len(),
                "{from}->{to}: {} vs {}",
                got.len(),
                batch.len()
            );
            assert_eq!(&got[..], &batch[..got.len()], "{from}->{to}");
        }
        let mut same = StreamResampler::new(24_000, 24_000, 480, 4096).unwrap();
        same.push(&signal[..100]).unwrap();
        let mut out = vec![0f32; 100];
        assert_eq!(same.pop_into(&mut out), 100);
        assert_eq!(&out[..], &signal[..100]);
    }

    /// `signal` pushed through `stream` in pieces of `steps` (cycled), everything available
    /// popped after each push in pieces of at most `pop_len`.
    fn stream_in_steps(
        stream: &mut StreamResampler,
        signal: &[f32],
        steps: &[usize],
        pop_len: usize,
    ) -> Vec<f32> {
        let mut got = Vec::new();
        let mut buf = vec![0f32; pop_len];
        let mut i = 0;
        for step in steps.iter().cycle() {
            if i >= signal.len() {
                break;
            }
            let end = (i + step).min(signal.len());
            stream.push(&signal[i..end]).unwrap();
            i = end;
            loop {
                let n = stream.pop_into(&mut buf);
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
        }
        got
    }

    /// Every whole `chunk` of `signal` through one `FftFixedIn` in a single pass (the partial
    /// last chunk is left out, as the stream holds it back).
    fn batch_at_chunk(signal: &[f32], from: u32, to: u32, chunk: usize) -> Vec<f32> {
        let mut r = FftFixedIn::<f32>::new(from as usize, to as usize, chunk, 1, 1).unwrap();
        let mut out = Vec::new();
        for piece in signal.chunks_exact(chunk) {
            out.extend_from_slice(&r.process(&[piece], None).unwrap()[0]);
        }
        out
    }

    #[test]
    fn stream_equals_batch_at_the_engine_chunk_sizes() {
        let signal: Vec<f32> = (0..48_000)
            .map(|i| ((i as f32) * 0.013).sin() * 0.5)
            .collect();
        // The engine's resamplers: device rate -> 24 kHz in 10 ms chunks (rate / 100), and
        // 24 kHz -> device rate in chunks of OUT_RESAMPLER_CHUNK (240).
        let input_side = [48_000u32, 44_100, 16_000, 32_000]
            .map(|from| (from, SAMPLE_RATE_HZ, from as usize / 100));
        let output_side = [48_000u32, 44_100, 16_000].map(|to| (SAMPLE_RATE_HZ, to, 240usize));
        for (from, to, chunk) in input_side.into_iter().chain(output_side) {
            let batch = batch_at_chunk(&signal, from, to, chunk);
            let mut stream = StreamResampler::new(from, to, chunk, 16_384).unwrap();
            // Device callback sizes and whole 80 ms frames.
            let got = stream_in_steps(
                &mut stream,
                &signal,
                &[441, 960, 1920, 1, 240, 480, 7],
                1000,
            );
            assert_eq!(got.len(), batch.len(), "{from}->{to} chunk {chunk}");
            assert_eq!(got, batch, "{from}->{to} chunk {chunk}");
        }
    }

    #[test]
    fn delay_counts_pending_input_and_the_group_delay() {
        let mut same = StreamResampler::new(24_000, 24_000, 240, 4096).unwrap();
        same.push(&[0.0; 100]).unwrap();
        assert_eq!(same.delay_out_samples(), 0.0);
        // 24 kHz -> 48 kHz in chunks of 240: 100 pending inputs are 200 output samples.
        let mut up = StreamResampler::new(24_000, 48_000, 240, 4096).unwrap();
        let group_delay = FftFixedIn::<f32>::new(24_000, 48_000, 240, 1, 1)
            .unwrap()
            .output_delay() as f64;
        assert!(group_delay > 0.0);
        assert_eq!(up.delay_out_samples(), group_delay);
        up.push(&[0.0; 100]).unwrap();
        assert_eq!(up.delay_out_samples(), 200.0 + group_delay);
        up.push(&[0.0; 140]).unwrap();
        assert_eq!(
            up.delay_out_samples(),
            group_delay,
            "a whole chunk is processed"
        );
    }
}
