//! The echo canceller on a simulated room, driven as the engine drives it: Moshi's voice (the
//! tiny-a fixture's speech) pushed to the speaker ahead of the microphone by a loop delay, its
//! echo (-6 dB, 40 ms or 120 ms acoustic path) in the microphone with the user's speech (the
//! tiny-hibiki fixture's). Moshi-only windows: the echo at least 25 dB down (ERLE) after at most
//! 2 s; user-only windows: the user's speech comes through (ncc >= 0.9); double talk: the user
//! is clearer after cancellation than before. The loop delay the engine measures jitters by a
//! few ms and jumps once (a device gap): the reference must follow.

use moshi_runtime::echo_cancel::{EchoCancelConfig, EchoCanceller};
use moshi_runtime::wav::read_mono;
use moshi_runtime::{FRAME_SAMPLES, SAMPLE_RATE_HZ};
use moshi_test_support::{fixture, ncc, XorShift64};

const RATE: usize = SAMPLE_RATE_HZ as usize;
/// Seconds: Moshi alone, then the user alone, then both.
const MOSHI_ONLY: (f64, f64) = (0.0, 6.0);
const USER_ONLY: (f64, f64) = (6.0, 9.5);
const DOUBLE_TALK: (f64, f64) = (9.5, 13.0);
const ECHO_GAIN: f32 = 0.5; // -6 dB

fn looped(x: &[f32], n: usize) -> Vec<f32> {
    (0..n).map(|i| x[i % x.len()]).collect()
}

fn in_span(t_s: f64, span: (f64, f64)) -> bool {
    t_s >= span.0 && t_s < span.1
}

/// The speaker runs this far behind the engine's output after a device gap at [`GAP_AT_S`]
/// (silence inserted: everything after plays later).
const GAP_AT_S: f64 = 4.0;
/// Output queued ahead of the microphone in the engine (the loop delay without the gap).
const LOOP_MS: f64 = 150.0;

struct Room {
    /// Moshi's output, by sample index of the output stream.
    speaker: Vec<f32>,
    /// The user's speech at the microphone.
    user: Vec<f32>,
    /// The microphone: the user plus the speaker's echo.
    mic: Vec<f32>,
}

fn room(acoustic_ms: usize, gap_ms: f64) -> Room {
    let n = (DOUBLE_TALK.1 * RATE as f64) as usize;
    let moshi = looped(
        &read_mono(&fixture("tiny-a", "input.wav")).unwrap().samples,
        n,
    );
    let user_voice = looped(
        &read_mono(&fixture("tiny-hibiki", "input.wav"))
            .unwrap()
            .samples,
        n,
    );
    let t = |i: usize| i as f64 / RATE as f64;
    let speaker: Vec<f32> = (0..n)
        .map(|i| {
            if in_span(t(i), USER_ONLY) {
                0.0
            } else {
                moshi[i]
            }
        })
        .collect();
    let user: Vec<f32> = (0..n)
        .map(|i| {
            if in_span(t(i), MOSHI_ONLY) {
                0.0
            } else {
                user_voice[i]
            }
        })
        .collect();
    let gap = (gap_ms * RATE as f64 / 1e3) as usize;
    let gap_at = (GAP_AT_S * RATE as f64) as usize;
    // What the speaker plays at each instant: the output, `gap` later from the gap on.
    let played: Vec<f32> = (0..n)
        .map(|i| match i {
            i if i < gap_at => speaker[i],
            i if i < gap_at + gap => 0.0,
            i => speaker[i - gap],
        })
        .collect();
    let delay = acoustic_ms * RATE / 1000;
    let mic = (0..n)
        .map(|i| {
            user[i]
                + if i >= delay {
                    ECHO_GAIN * played[i - delay]
                } else {
                    0.0
                }
        })
        .collect();
    Room { speaker, user, mic }
}

/// Runs the canceller over the room as the engine would: the output pushed [`LOOP_MS`] ahead of
/// the microphone, the loop delay measured with `jitter_ms` of noise, and `gap_ms` longer from
/// the gap on (the speaker queue holds what the device did not play). Returns the cleaned
/// microphone, the canceller's convergence frame and its realignments.
fn cancel(room: &Room, jitter_ms: f64, gap_ms: f64) -> (Vec<f32>, Option<u64>, u64) {
    let mut aec = EchoCanceller::new(EchoCancelConfig::default()).unwrap();
    let mut rng = XorShift64::new(7);
    let mut pushed = 0usize;
    let mut out = Vec::with_capacity(room.mic.len());
    for (k, frame) in room.mic.chunks_exact(FRAME_SAMPLES).enumerate() {
        let end_s = ((k + 1) * FRAME_SAMPLES) as f64 / RATE as f64;
        let loop_ms = LOOP_MS + if end_s > GAP_AT_S { gap_ms } else { 0.0 };
        let ahead = (k + 1) * FRAME_SAMPLES + (LOOP_MS * RATE as f64 / 1e3) as usize;
        let until = ahead.min(room.speaker.len());
        if until > pushed {
            aec.played(&room.speaker[pushed..until]);
            pushed = until;
        }
        let measured_ms = loop_ms + jitter_ms * (2.0 * rng.uniform_f64() - 1.0);
        let mut f = frame.to_vec();
        aec.process(&mut f, measured_ms * RATE as f64 / 1e3)
            .unwrap();
        out.extend_from_slice(&f);
    }
    let stats = aec.stats();
    eprintln!("resampler delay {:.2} ms", aec.added_delay_ms());
    (out, stats.converged_after_frames, stats.realignments)
}

fn energy(x: &[f32]) -> f64 {
    x.iter().map(|&v| f64::from(v) * f64::from(v)).sum()
}

/// Best ncc of `got` against `want` over lags 0..=100 ms (the canceller delays its output by
/// 19 ms: resamplers and AEC3's blocks).
fn ncc_lagged(want: &[f32], got: &[f32]) -> f64 {
    (0..=RATE / 10)
        .map(|lag| ncc(&want[..want.len() - lag], &got[lag..]))
        .fold(f64::MIN, f64::max)
}

/// 0.5 s windows of `span` (from `skip_s` in).
fn windows(span: (f64, f64), skip_s: f64) -> impl Iterator<Item = std::ops::Range<usize>> {
    let w = RATE / 2;
    let (a, b) = (
        ((span.0 + skip_s) * RATE as f64) as usize,
        (span.1 * RATE as f64) as usize,
    );
    (a..b.saturating_sub(w)).step_by(w).map(move |s| s..s + w)
}

fn check(acoustic_ms: usize, gap_ms: f64) {
    let room = room(acoustic_ms, gap_ms);
    let (out, converged_after, realignments) = cancel(&room, 4.0, gap_ms);
    let converged = converged_after.expect("the canceller converged");
    eprintln!("{acoustic_ms} ms: AEC3's ERLE estimate reached 10 dB after {converged} frames");
    for w in windows((0.0, 13.0), 0.0) {
        let erle =
            10.0 * (energy(&room.mic[w.clone()]) / energy(&out[w.clone()]).max(1e-20)).log10();
        let c = ncc_lagged(&room.user[w.clone()], &out[w.clone()]);
        eprintln!(
            "  {:5.1} s: mic/out {erle:6.1} dB, ncc with user {c:.3}",
            w.start as f64 / RATE as f64
        );
    }
    if gap_ms != 0.0 {
        assert_eq!(
            realignments, 1,
            "the reference follows the loop delay's step once"
        );
    }
    // Moshi only, after 2 s: ERLE >= 25 dB in every window with echo (the first half second
    // after the step is for the reference to move and the canceller to settle).
    for w in windows(MOSHI_ONLY, 2.0) {
        let near_step = (4 * RATE..(4 * RATE + RATE / 2 + RATE / 2)).contains(&w.start);
        if near_step && gap_ms != 0.0 {
            continue;
        }
        let erle = 10.0 * (energy(&room.mic[w.clone()]) / energy(&out[w.clone()])).log10();
        assert!(
            erle >= 25.0,
            "{acoustic_ms} ms: ERLE {erle:.1} dB in window at {} s",
            w.start / RATE
        );
    }
    // User only, from 0.5 s in (the echo's tail has passed).
    for w in windows(USER_ONLY, 0.5) {
        if energy(&room.user[w.clone()]) < 1e-3 * w.len() as f64 * 1e-2 {
            continue;
        }
        let c = ncc_lagged(&room.user[w.clone()], &out[w.clone()]);
        assert!(
            c >= 0.9,
            "{acoustic_ms} ms: user-only ncc {c:.3} in window at {} s",
            w.start / RATE
        );
    }
    // Double talk: AEC3's suppressor takes some of the user with the echo, but the user stays
    // (ncc with the echo's -6 dB under the user was 0.86-0.87 before cancellation).
    let dt = ((DOUBLE_TALK.0 * RATE as f64) as usize)..out.len();
    let before = ncc(&room.user[dt.clone()], &room.mic[dt.clone()]);
    let after = ncc_lagged(&room.user[dt.clone()], &out[dt]);
    eprintln!(
        "{acoustic_ms} ms: double talk ncc with the user {before:.3} before, {after:.3} after"
    );
    assert!(after >= 0.7, "double talk: ncc with the user {after:.3}");
}

#[test]
fn cancels_a_40_ms_echo_and_lets_the_user_through() {
    check(40, 0.0);
}

#[test]
fn cancels_a_120_ms_echo_and_follows_a_loop_delay_step() {
    check(120, 60.0);
}
