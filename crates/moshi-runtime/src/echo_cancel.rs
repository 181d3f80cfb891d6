//! Acoustic echo cancellation of the microphone on the engine thread (`chat --echo-cancel`):
//! WebRTC's AEC3 through `sonora`, its pure-Rust port (why that one: docs/audio.md).
//!
//! The far-end reference is what the engine pushed to the speaker ring ([`EchoCanceller::played`],
//! the jitter margin's silence included), kept in a [`FarEndHistory`] at 24 kHz. For each input
//! frame the engine passes the loop delay it measures from the device side (speaker ring queue,
//! output resampler, output device latency, input device latency, input waiting behind the
//! frame): the reference sample that was playing when the frame's last sample was captured is
//! `pushed - loop_delay`. The reference is fed [`REFERENCE_LEAD_MS`] earlier than that, so that
//! AEC3's own delay estimator only has to find the acoustic path plus that lead (and the
//! measurement's jitter), never a reference later than its echo. The measured loop delay
//! jitters with the callbacks' phase; the reference stays contiguous and is moved only when the
//! measurement disagrees by more than [`REALIGN_TOLERANCE_MS`] for [`REALIGN_FRAMES`] frames
//! in a row (a device gap, a latency trim, a reconnect).
//!
//! AEC3 runs at [`CANCEL_RATE_HZ`] in 10 ms blocks: the frame and the reference go up from
//! 24 kHz with the runtime's [`StreamResampler`], the cleaned signal comes back down with it.
//! Every push is whole resampler chunks, so one frame in gives one frame out, delayed by the
//! resamplers' fixed group delay ([`EchoCanceller::added_delay_ms`]).

use serde::Serialize;
use sonora::config::{
    AdaptiveDigital, EchoCanceller as Aec3Settings, GainController2, NoiseSuppression,
};
use sonora::{AudioProcessing, Config, StreamConfig};

use crate::resample::StreamResampler;
use crate::{Result, RuntimeError, FRAME_SAMPLES, SAMPLE_RATE_HZ};

/// The rate AEC3 runs at: twice Moshi's 24 kHz (an exact ratio for the resamplers), so the
/// model still hears its whole band (AEC3 cancels 0-8 kHz linearly, above with its suppressor).
pub const CANCEL_RATE_HZ: u32 = 48_000;
/// AEC3's block: 10 ms at [`CANCEL_RATE_HZ`].
const BLOCK_SAMPLES: usize = CANCEL_RATE_HZ as usize / 100;
/// 10 ms at 24 kHz: the resamplers' input chunk (a frame is 8 of them).
const CHUNK_24K: usize = SAMPLE_RATE_HZ as usize / 100;
/// Samples at [`CANCEL_RATE_HZ`] per model frame.
const FRAME_SAMPLES_CANCEL: usize = FRAME_SAMPLES * 2;
/// How much earlier than the measured alignment the reference is fed: the measurement jitters
/// by about a callback period, and AEC3 cannot cancel an echo that comes before its reference.
pub const REFERENCE_LEAD_MS: f64 = 20.0;
/// Disagreement between the measured loop delay and the reference in use beyond which the
/// reference is moved (more than a callback period of the default 40 ms buffer).
pub const REALIGN_TOLERANCE_MS: f64 = 15.0;
/// Frames in a row the disagreement must last before the reference moves.
pub const REALIGN_FRAMES: u32 = 5;
/// The canceller's echo return loss enhancement estimate at or above which it counts as
/// converged.
pub const CONVERGED_ERLE_DB: f64 = 10.0;
/// Reference kept (24 kHz samples): the longest loop delay the canceller can follow, a full
/// speaker ring and mic ring (2 s each by default) and a frame.
pub const HISTORY_SAMPLES: usize = 5 * SAMPLE_RATE_HZ as usize;

/// What runs besides the echo canceller (both off by default: Moshi was trained on raw audio).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EchoCancelConfig {
    /// AEC3's companion noise suppressor (moderate level).
    pub noise_suppression: bool,
    /// AGC2's adaptive digital gain.
    pub gain_control: bool,
}

/// How the canceller is doing, after the latest frame.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct EchoStats {
    /// AEC3's estimate of its echo return loss enhancement (echo power in / out), dB; `None`
    /// before it has one.
    pub erle_db: Option<f64>,
    /// Whether `erle_db` is at least [`CONVERGED_ERLE_DB`].
    pub converged: bool,
    /// Frames processed before it first converged (`None`: not yet).
    pub converged_after_frames: Option<u64>,
    /// AEC3's estimate of the delay between the reference fed and its echo, ms (the acoustic
    /// path plus [`REFERENCE_LEAD_MS`] when the alignment is right).
    pub aec_delay_ms: Option<i32>,
    /// The loop delay the reference is aligned with (device side, measured), ms.
    pub reference_delay_ms: f64,
    /// Times the reference was moved after the loop delay changed.
    pub realignments: u64,
    /// Frames the canceller processed.
    pub frames: u64,
    /// Time the latest frame took (resampling and AEC3), ms.
    pub frame_cost_ms: f64,
}

/// The last [`HISTORY_SAMPLES`] samples sent to the speaker (24 kHz), by absolute index.
pub struct FarEndHistory {
    samples: Vec<f32>,
    /// Samples pushed since the start.
    pushed: u64,
}

impl FarEndHistory {
    pub fn new(capacity_samples: usize) -> Self {
        Self {
            samples: vec![0.0; capacity_samples.max(1)],
            pushed: 0,
        }
    }

    /// Samples pushed since the start (the index the next one gets).
    pub fn pushed(&self) -> u64 {
        self.pushed
    }

    pub fn push(&mut self, pcm: &[f32]) {
        let cap = self.samples.len();
        for &x in pcm {
            self.samples[(self.pushed % cap as u64) as usize] = x;
            self.pushed += 1;
        }
    }

    /// Copies samples `start..start + out.len()` into `out`: zeros for indices before the first
    /// sample, not yet pushed, or older than the capacity.
    pub fn copy_from(&self, start: i64, out: &mut [f32]) {
        let cap = self.samples.len() as i64;
        let oldest = self.pushed as i64 - cap;
        for (i, o) in out.iter_mut().enumerate() {
            let k = start + i as i64;
            *o = if k < 0 || k < oldest || k >= self.pushed as i64 {
                0.0
            } else {
                self.samples[(k % cap) as usize]
            };
        }
    }
}

/// AEC3 on the microphone, the speaker's samples as the reference (see the module docs).
pub struct EchoCanceller {
    apm: AudioProcessing,
    capture_up: StreamResampler,
    render_up: StreamResampler,
    capture_down: StreamResampler,
    history: FarEndHistory,
    /// Absolute index of the next reference sample to feed; `None`: align at the next frame.
    reference_next: Option<i64>,
    /// Frames in a row the measured alignment disagreed with `reference_next`.
    disagreeing_frames: u32,
    reference_24k: Vec<f32>,
    capture_hi: Vec<f32>,
    render_hi: Vec<f32>,
    cleaned_hi: Vec<f32>,
    render_sink: Vec<f32>,
    stats: EchoStats,
}

fn cancel_error(detail: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::EchoCancel {
        detail: detail.to_string(),
    }
}

impl EchoCanceller {
    pub fn new(config: EchoCancelConfig) -> Result<Self> {
        let apm_config = Config {
            // sonora 0.2.0's high-pass filter (which AEC3 enforces by default) scrambles the
            // phase of the whole band (ncc 0.71 with its input; docs/audio.md): off. Moshi's
            // codec takes the low band as it comes, and the reference is not filtered either.
            echo_canceller: Some(Aec3Settings {
                enforce_high_pass_filtering: false,
                ..Aec3Settings::default()
            }),
            noise_suppression: config.noise_suppression.then(NoiseSuppression::default),
            gain_controller2: config.gain_control.then(|| GainController2 {
                adaptive_digital: Some(AdaptiveDigital::default()),
                ..GainController2::default()
            }),
            ..Config::default()
        };
        let stream = StreamConfig::new(CANCEL_RATE_HZ, 1);
        let apm = AudioProcessing::builder()
            .config(apm_config)
            .capture_config(stream)
            .render_config(stream)
            .build();
        let up = || {
            StreamResampler::new(
                SAMPLE_RATE_HZ,
                CANCEL_RATE_HZ,
                CHUNK_24K,
                FRAME_SAMPLES_CANCEL,
            )
        };
        Ok(Self {
            apm,
            capture_up: up()?,
            render_up: up()?,
            capture_down: StreamResampler::new(
                CANCEL_RATE_HZ,
                SAMPLE_RATE_HZ,
                BLOCK_SAMPLES,
                FRAME_SAMPLES,
            )?,
            history: FarEndHistory::new(HISTORY_SAMPLES),
            reference_next: None,
            disagreeing_frames: 0,
            reference_24k: vec![0.0; FRAME_SAMPLES],
            capture_hi: vec![0.0; FRAME_SAMPLES_CANCEL],
            render_hi: vec![0.0; FRAME_SAMPLES_CANCEL],
            cleaned_hi: vec![0.0; FRAME_SAMPLES_CANCEL],
            render_sink: vec![0.0; BLOCK_SAMPLES],
            stats: EchoStats::default(),
        })
    }

    /// Samples sent to the speaker (24 kHz, in order): the reference.
    pub fn played(&mut self, pcm: &[f32]) {
        self.history.push(pcm);
    }

    /// A frame the engine dropped: the reference moves on with the microphone.
    pub fn skip_frame(&mut self) {
        if let Some(next) = &mut self.reference_next {
            *next += FRAME_SAMPLES as i64;
        }
    }

    /// Align afresh at the next frame (a reopened device).
    pub fn realign(&mut self) {
        self.reference_next = None;
        self.disagreeing_frames = 0;
    }

    /// The delay the resamplers add to the cleaned signal, ms (fixed).
    pub fn added_delay_ms(&self) -> f64 {
        (self.capture_up.delay_out_samples() + self.capture_down.delay_out_samples() * 2.0) * 1e3
            / f64::from(CANCEL_RATE_HZ)
    }

    pub fn stats(&self) -> EchoStats {
        self.stats
    }

    /// Removes the echo from one 24 kHz frame in place. `loop_delay_samples`: 24 kHz samples
    /// between the speaker sample pushed last and the one playing when the frame's last sample
    /// was captured (measured by the engine on the device side).
    pub fn process(&mut self, frame: &mut [f32], loop_delay_samples: f64) -> Result<()> {
        if frame.len() != FRAME_SAMPLES {
            return Err(RuntimeError::FrameSize {
                expected: FRAME_SAMPLES,
                got: frame.len(),
            });
        }
        let t0 = std::time::Instant::now();
        let start = self.reference_start(loop_delay_samples);
        self.history.copy_from(start, &mut self.reference_24k);
        self.reference_next = Some(start + FRAME_SAMPLES as i64);
        resample_frame(
            &mut self.render_up,
            &self.reference_24k,
            &mut self.render_hi,
        )?;
        resample_frame(&mut self.capture_up, frame, &mut self.capture_hi)?;
        self.cancel_blocks()?;
        resample_frame(&mut self.capture_down, &self.cleaned_hi, frame)?;
        self.update_stats(loop_delay_samples, t0.elapsed().as_secs_f64() * 1e3);
        Ok(())
    }

    /// First reference sample for this frame: the contiguous continuation, unless the
    /// measurement has disagreed with it for [`REALIGN_FRAMES`] frames (or none is set yet).
    fn reference_start(&mut self, loop_delay_samples: f64) -> i64 {
        let lead = REFERENCE_LEAD_MS * f64::from(SAMPLE_RATE_HZ) / 1e3;
        let measured = self.history.pushed() as i64
            - (loop_delay_samples + lead).round() as i64
            - FRAME_SAMPLES as i64;
        let Some(next) = self.reference_next else {
            return measured;
        };
        let tolerance = (REALIGN_TOLERANCE_MS * f64::from(SAMPLE_RATE_HZ) / 1e3) as i64;
        if (measured - next).abs() <= tolerance {
            self.disagreeing_frames = 0;
            return next;
        }
        self.disagreeing_frames += 1;
        if self.disagreeing_frames < REALIGN_FRAMES {
            return next;
        }
        self.disagreeing_frames = 0;
        self.stats.realignments += 1;
        measured
    }

    /// AEC3 over the frame's 10 ms blocks: each block's reference, then its capture.
    fn cancel_blocks(&mut self) -> Result<()> {
        for ((render, capture), cleaned) in self
            .render_hi
            .chunks_exact(BLOCK_SAMPLES)
            .zip(self.capture_hi.chunks_exact(BLOCK_SAMPLES))
            .zip(self.cleaned_hi.chunks_exact_mut(BLOCK_SAMPLES))
        {
            self.apm
                .process_render_f32(&[render], &mut [&mut self.render_sink[..]])
                .map_err(cancel_error)?;
            self.apm
                .process_capture_f32(&[capture], &mut [cleaned])
                .map_err(cancel_error)?;
        }
        Ok(())
    }

    fn update_stats(&mut self, loop_delay_samples: f64, cost_ms: f64) {
        let s = self.apm.statistics();
        let st = &mut self.stats;
        st.frames += 1;
        st.frame_cost_ms = cost_ms;
        st.erle_db = s.echo_return_loss_enhancement;
        st.aec_delay_ms = s.delay_ms;
        st.converged = st.erle_db.is_some_and(|e| e >= CONVERGED_ERLE_DB);
        if st.converged && st.converged_after_frames.is_none() {
            st.converged_after_frames = Some(st.frames);
        }
        st.reference_delay_ms = loop_delay_samples * 1e3 / f64::from(SAMPLE_RATE_HZ);
    }
}

/// One frame through a resampler between 24 kHz and [`CANCEL_RATE_HZ`]: whole chunks go in,
/// so exactly one frame comes out.
fn resample_frame(r: &mut StreamResampler, frame: &[f32], out: &mut [f32]) -> Result<()> {
    r.push(frame)?;
    let got = r.pop_into(out);
    if got != out.len() {
        return Err(cancel_error(format!(
            "a resampler gave {got} samples for a frame of {}, expected {}",
            frame.len(),
            out.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_history_gives_what_was_pushed_and_zeros_elsewhere() {
        let mut h = FarEndHistory::new(4);
        h.push(&[1.0, 2.0, 3.0]);
        let mut out = [9.0; 5];
        h.copy_from(-1, &mut out);
        assert_eq!(out, [0.0, 1.0, 2.0, 3.0, 0.0]);
        // Six pushed into four: indices 0 and 1 are gone.
        h.push(&[4.0, 5.0, 6.0]);
        h.copy_from(1, &mut out);
        assert_eq!(out, [0.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(h.pushed(), 6);
    }

    #[test]
    fn a_frame_of_the_wrong_length_is_an_error() {
        let mut c = EchoCanceller::new(EchoCancelConfig::default()).unwrap();
        let e = c.process(&mut [0.0; 100], 0.0).unwrap_err();
        assert!(
            matches!(
                e,
                RuntimeError::FrameSize {
                    expected: FRAME_SAMPLES,
                    got: 100
                }
            ),
            "{e}"
        );
    }
}
