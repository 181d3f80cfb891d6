//! Plays audio as it is generated (`speak --play`): 24 kHz mono pieces of any length,
//! resampled to the output device's rate and copied to each of its channels, queued in the
//! speaker ring the device's callback drains. Playback starts once `prefill_ms` is queued (or
//! the audio ends), so that a generator a little slower than real time at first does not
//! stutter; an underrun after that is counted (the callback plays silence), never hidden.
//! Pushing waits while the ring is full: the generator runs at most a ring ahead of the device.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::AudioBackend;
use crate::engine::StreamFormat;
use crate::resample::FileResampler;
use crate::ring::{sample_ring, AudioCounters, SampleProducer};
use crate::{Result, RuntimeError, SAMPLE_RATE_HZ};

/// How much audio the speaker ring holds beyond the prefill.
const RING_EXTRA_MS: f64 = 2000.0;
/// Silence queued after the end: more than any device callback takes at once.
const END_PAD_MS: f64 = 1100.0;
/// How long a full ring may stay full before the device counts as stalled.
const STALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a waiting push looks at the ring again.
const WAIT_STEP: Duration = Duration::from_millis(5);

/// What was played.
#[derive(Clone, Debug, PartialEq)]
pub struct PlaybackSummary {
    /// Audio played, seconds.
    pub played_s: f64,
    /// Times the ring ran dry after playback had started (silence inserted).
    pub underrun_events: u64,
    /// Silence inserted by those underruns, seconds.
    pub underrun_s: f64,
    /// The samples played, where the backend keeps them (a virtual device); empty for a real
    /// device.
    pub samples: Vec<f32>,
}

/// A running output device fed from a generator.
pub struct Player {
    backend: Box<dyn AudioBackend>,
    speaker: SampleProducer,
    ring_capacity: usize,
    counters: Arc<AudioCounters>,
    format: StreamFormat,
    resampler: FileResampler,
    /// Device samples (interleaved) resampled and not yet in the ring.
    resampled: Vec<f32>,
    /// The resampler's mono output of one piece (kept: no allocation per frame).
    mono: Vec<f32>,
    /// Device samples to queue before the first reaches the ring.
    prefill_samples: usize,
    started: bool,
    /// Device samples of audio queued (the end's silence not counted).
    queued_samples: usize,
}

impl Player {
    /// Starts `backend` (its output side; a capture side gets a ring nobody reads) with
    /// playback held until `prefill_ms` of audio is queued.
    pub fn start(mut backend: Box<dyn AudioBackend>, prefill_ms: f64) -> Result<Self> {
        let format = backend.output_format();
        let per_ms = f64::from(format.sample_rate_hz) * f64::from(format.channels) / 1e3;
        let prefill_samples = (prefill_ms.max(0.0) * per_ms).round() as usize;
        let ring_capacity = prefill_samples + (RING_EXTRA_MS.max(END_PAD_MS) * per_ms) as usize;
        let (speaker, speaker_end) = sample_ring(ring_capacity);
        let (mic, _unread) = sample_ring(1);
        let counters = Arc::new(AudioCounters::default());
        backend.start(mic, speaker_end, counters.clone())?;
        Ok(Self {
            backend,
            speaker,
            ring_capacity,
            counters,
            format,
            resampler: FileResampler::new(SAMPLE_RATE_HZ, format.sample_rate_hz)?,
            resampled: Vec::new(),
            mono: Vec::new(),
            prefill_samples,
            started: false,
            queued_samples: 0,
        })
    }

    /// The device, as the backend describes it.
    pub fn describe(&self) -> String {
        self.backend.describe()
    }

    /// Queues `pcm` (24 kHz mono) for playback, waiting while the ring is full.
    pub fn play(&mut self, pcm: &[f32]) -> Result<()> {
        let mut mono = std::mem::take(&mut self.mono);
        mono.clear();
        self.resampler.push(pcm, &mut mono)?;
        let queued = self.queue(&mono);
        self.mono = mono;
        queued
    }

    /// Plays what is queued to its end, stops the device and says what was played.
    pub fn finish(mut self) -> Result<PlaybackSummary> {
        let mut mono = Vec::new();
        self.resampler.finish(&mut mono)?;
        self.queue(&mono)?;
        self.started = true;
        self.drain_resampled()?;
        // Silence after the end, so that the callback taking the last samples fills the rest
        // of its buffer from it instead of counting an underrun.
        let per_ms = f64::from(self.format.sample_rate_hz) * f64::from(self.format.channels) / 1e3;
        let pad = (END_PAD_MS * per_ms) as usize;
        self.resampled.resize(pad, 0.0);
        self.drain_resampled()?;
        self.wait_until(|p| p.ring_capacity - p.speaker.slots() <= pad)?;
        let c = self.counters.snapshot();
        // The device's own buffer still holds the last callback's samples.
        let latency_us = self
            .counters
            .output_device_latency_us
            .load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_micros(latency_us.min(1_000_000)) + WAIT_STEP * 4);
        let samples = self.backend.stop()?;
        Ok(PlaybackSummary {
            played_s: self.queued_samples as f64 / (per_ms * 1e3),
            underrun_events: c.underrun_events,
            underrun_s: c.underrun_samples as f64 / (per_ms * 1e3),
            samples,
        })
    }

    /// Spreads mono device-rate samples over the device's channels and queues them.
    fn queue(&mut self, mono: &[f32]) -> Result<()> {
        let channels = usize::from(self.format.channels.max(1));
        self.resampled
            .extend(mono.iter().flat_map(|&s| std::iter::repeat_n(s, channels)));
        self.queued_samples += mono.len() * channels;
        self.started |= self.resampled.len() >= self.prefill_samples;
        if self.started {
            self.drain_resampled()?;
        }
        Ok(())
    }

    /// Moves the resampled samples into the ring, waiting for room.
    fn drain_resampled(&mut self) -> Result<()> {
        let mut offset = 0;
        while offset < self.resampled.len() {
            let (pushed, _) = self.speaker.push_partial_slice(&self.resampled[offset..]);
            offset += pushed.len();
            if offset < self.resampled.len() {
                self.wait_until(|p| p.speaker.slots() > 0)?;
            }
        }
        self.resampled.clear();
        Ok(())
    }

    /// Sleeps until `ready`, failing on a lost or stalled device.
    fn wait_until(&self, ready: impl Fn(&Self) -> bool) -> Result<()> {
        let since = Instant::now();
        let played_before = self.counters.played_samples.load(Ordering::Relaxed);
        while !ready(self) {
            if self.counters.device_lost.load(Ordering::Relaxed) {
                return Err(RuntimeError::Device(
                    "the output device was lost during playback".into(),
                ));
            }
            let played = self.counters.played_samples.load(Ordering::Relaxed);
            if played == played_before && since.elapsed() > STALL_TIMEOUT {
                return Err(RuntimeError::Device(format!(
                    "the output device played nothing for {} s",
                    STALL_TIMEOUT.as_secs()
                )));
            }
            std::thread::sleep(WAIT_STEP);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::null::{NullBackend, NullClock, NullConfig};

    fn tone(len: usize) -> Vec<f32> {
        (0..len).map(|i| (i as f32 * 0.05).sin() * 0.5).collect()
    }

    fn null_output(format: StreamFormat) -> NullBackend {
        let config = NullConfig {
            output_format: format,
            tail_ms: 60_000.0,
            ..NullConfig::moshi(NullClock::Paced { speed: 8.0 })
        };
        NullBackend::new(config, Vec::new()).unwrap()
    }

    /// The device plays exactly what was generated, in order, after its start-up silence;
    /// pieces of any length, none lost at the end.
    #[test]
    fn the_device_plays_every_sample_pushed() {
        let backend = Box::new(null_output(StreamFormat::MOSHI));
        let mut player = Player::start(backend, 160.0).unwrap();
        let audio = tone(24_000);
        for piece in audio.chunks(1920).chain([&audio[..0]]) {
            player.play(piece).unwrap();
        }
        let summary = player.finish().unwrap();
        assert_eq!(summary.underrun_events, 0, "{}", summary.underrun_s);
        assert!(
            (summary.played_s - 1.0).abs() < 1e-9,
            "{}",
            summary.played_s
        );
    }

    /// On a 48 kHz stereo device: the audio resampled, on both channels, every sample in
    /// order after the start-up silence.
    #[test]
    fn played_samples_are_the_pushed_ones_on_every_channel() {
        let stereo_48k = StreamFormat {
            sample_rate_hz: 48_000,
            channels: 2,
        };
        let audio = tone(12_000);
        let mut player = Player::start(Box::new(null_output(stereo_48k)), 0.0).unwrap();
        for piece in audio.chunks(700) {
            player.play(piece).unwrap();
        }
        let summary = player.finish().unwrap();
        let mut mono = Vec::new();
        let mut resampler = FileResampler::new(SAMPLE_RATE_HZ, 48_000).unwrap();
        resampler.push(&audio, &mut mono).unwrap();
        resampler.finish(&mut mono).unwrap();
        let stereo: Vec<f32> = mono.iter().flat_map(|&s| [s, s]).collect();
        let played = &summary.samples;
        let start = played.iter().position(|&s| s != 0.0).unwrap() / 2 * 2;
        let first = stereo.iter().position(|&s| s != 0.0).unwrap() / 2 * 2;
        assert_eq!(
            &played[start..start + stereo.len() - first],
            &stereo[first..]
        );
        assert!(played[start + stereo.len() - first..]
            .iter()
            .all(|&s| s == 0.0));
        let want_s = stereo.len() as f64 / 96_000.0;
        assert!(
            (summary.played_s - want_s).abs() < 1e-9,
            "{}",
            summary.played_s
        );
    }

    /// A generator slower than the device: the gap is counted, not hidden.
    #[test]
    fn a_late_frame_is_counted_as_an_underrun() {
        let mut player = Player::start(Box::new(null_output(StreamFormat::MOSHI)), 0.0).unwrap();
        player.play(&tone(1920)).unwrap();
        // 80 ms of audio on a device 8x faster than real time: played within 10 ms.
        std::thread::sleep(Duration::from_millis(100));
        player.play(&tone(1920)).unwrap();
        let summary = player.finish().unwrap();
        assert!(summary.underrun_events >= 1, "{}", summary.underrun_events);
        assert!(summary.underrun_s > 0.0);
    }
}
