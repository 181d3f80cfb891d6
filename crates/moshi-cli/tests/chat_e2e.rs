//! `moshi-rs chat` end to end on virtual audio devices: runs scripts/e2e-chat.sh (a private
//! PulseAudio daemon with a virtual mic and speaker; see scripts/virtual-audio.sh), which plays
//! the fixture's input.wav into the mic, runs chat with the tiny model (tiny-a; and tiny-hibiki
//! with guidance: live translation), records the speaker and checks it against what the engine
//! produced: every window at one lag (no sample inserted or lost on the way), no steady-state
//! underruns, no dropped frames, no allocation in the audio callbacks.
//!
//! `E2E_RUNS` conversations (default 3), one after the other, none retried: a run may glitch on a
//! busy machine only if the engine counted every glitch (exit 3 of the script), and at most a
//! third of the runs may; any silent glitch or other failure fails the test. The summary line
//! gives the runs with a glitch. Skipped (with the reason printed) only when PulseAudio is not
//! installed and `CI` is not set (with `CI` set, a missing tool fails the test);
//! `scripts/setup.sh --audio-e2e` installs it (scripts/test.sh does).
//!
//! Laptop speakers (scripts/e2e-chat-echo.sh, on tiny-a with a broadband voice): the virtual
//! room mixes the speaker back into the microphone (-6 dB; 40 ms, then 120 ms) under the user's
//! injected speech; with `--echo-cancel on` the echo must be at least 25 dB down in Moshi-only
//! windows from 2 s on and the user's speech must come through (double talk: ncc >= 0.7); with
//! `--echo-cancel off` the same check must find the echo.

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

use moshi_test_support::{repo_root, tools_present, write_tiny_a_with_broadband_voice};

#[test]
fn chat_on_virtual_devices_plays_what_the_engine_produced() {
    run_e2e("tiny-a", "");
}

#[test]
fn live_translation_on_virtual_devices_plays_what_the_engine_produced() {
    run_e2e("tiny-hibiki", "--cfg-coef 3");
}

/// Whether every tool is installed (else SKIPPED, or a failure where `CI` is set).
fn audio_tools_present(test: &str, tools: &[&str]) -> bool {
    tools_present(test, tools, "bash scripts/setup.sh --audio-e2e")
}

/// One real-time session at a time: two at once on two cores would starve each other.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// scripts/e2e-chat.sh with the fixture `assets/<fixture>` and extra chat options.
fn run_e2e(fixture: &str, chat_args: &str) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !audio_tools_present(
        "chat_on_virtual_devices",
        &["pulseaudio", "parecord", "paplay", "pactl", "sox"],
    ) {
        return;
    }
    let runs: usize = std::env::var("E2E_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let root = repo_root();
    let (mut clean, mut glitched, mut failed) = (0, Vec::new(), Vec::new());
    for run in 1..=runs {
        let out_dir = tempfile::tempdir().unwrap();
        let o = Command::new("bash")
            .arg(root.join("scripts/e2e-chat.sh"))
            .env("MOSHI_RS", env!("CARGO_BIN_EXE_moshi-rs"))
            .env("E2E_OUT", out_dir.path())
            .env("E2E_MODEL", root.join("assets").join(fixture))
            .env("E2E_CHAT_ARGS", chat_args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&o.stdout);
        eprintln!(
            "--- {fixture} run {run}/{runs} (exit {:?})\n{stdout}{}",
            o.status.code(),
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .filter(|l| !l.starts_with("ALSA lib") && !l.starts_with("[RTF"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        match o.status.code() {
            Some(0) => {
                assert!(
                    stdout.contains("e2e chat: OK")
                        && stdout.contains("\"lag_jumps\": 0")
                        && stdout.contains("added_latency_ms"),
                    "{stdout}"
                );
                clean += 1;
            }
            Some(3) => glitched.push(run),
            code => failed.push((run, code)),
        }
    }
    eprintln!(
        "chat e2e ({fixture}): {runs} runs, {clean} clean, {} with a glitch the engine counted {glitched:?}, {} failed {failed:?}",
        glitched.len(),
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "{fixture}: runs failed (a silent glitch or another failure): {failed:?}"
    );
    assert!(
        glitched.len() * 3 <= runs,
        "{fixture}: {} of {runs} runs glitched (counted): more than a third",
        glitched.len()
    );
}

/// scripts/e2e-chat-device-lost.sh: the sound server is killed mid-conversation; chat must
/// report the lost device and stop within a bounded time, at the end of `--duration-s` and on
/// Ctrl-C (never hang dropping the lost device's streams).
#[test]
fn chat_stops_in_bounded_time_after_its_sound_server_is_killed() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !audio_tools_present(
        "chat_stops_in_bounded_time_after_its_sound_server_is_killed",
        &["pulseaudio", "pactl"],
    ) {
        return;
    }
    let root = repo_root();
    for mode in ["duration", "ctrl-c"] {
        let out_dir = tempfile::tempdir().unwrap();
        let o = Command::new("bash")
            .arg(root.join("scripts/e2e-chat-device-lost.sh"))
            .env("MOSHI_RS", env!("CARGO_BIN_EXE_moshi-rs"))
            .env("E2E_OUT", out_dir.path())
            .env("MODE", mode)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && stdout.contains("e2e chat device lost"),
            "{mode}: exit {:?}\n{stdout}{}",
            o.status.code(),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// What the user's speech keeps under Moshi's cancelled echo (ncc with the injected speech over
/// all the user's windows): the tiny model never stops talking, so every user window is double
/// talk, where AEC3's suppressor takes some of the user with the echo; the bound is the
/// double-talk one of moshi-runtime's tests/echo_cancel.rs (on speech, over its double talk).
const DOUBLE_TALK_MIN_NCC: f64 = 0.7;

/// Conversations per room with `--echo-cancel on` at most: a run that fails after a glitch the
/// engine counted is run again, one without a counted glitch fails the test.
const ECHO_ATTEMPTS: usize = 3;

/// scripts/e2e-chat-echo.sh with `DELAY_MS` and `MODE`, chat on the model folder `model`: its
/// verdict (one JSON object).
fn run_echo_e2e(model: &Path, delay_ms: u32, mode: &str) -> serde_json::Value {
    let out_dir = tempfile::tempdir().unwrap();
    let o = Command::new("bash")
        .arg(repo_root().join("scripts/e2e-chat-echo.sh"))
        .arg(delay_ms.to_string())
        .arg(mode)
        .env("MOSHI_RS", env!("CARGO_BIN_EXE_moshi-rs"))
        .env("E2E_OUT", out_dir.path())
        .env("E2E_MODEL", model)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&o.stderr)
        .lines()
        .filter(|l| !l.starts_with("ALSA lib"))
        .collect::<Vec<_>>()
        .join("\n");
    eprintln!(
        "--- echo {delay_ms} ms, --echo-cancel {mode} (exit {:?})\n{stdout}{stderr}",
        o.status.code()
    );
    assert!(
        o.status.success(),
        "{delay_ms} ms, --echo-cancel {mode}: exit {:?}\n{stdout}{stderr}",
        o.status.code()
    );
    serde_json::from_str(stdout.trim()).unwrap()
}

/// What is wrong with a run of `--echo-cancel on` in the `delay_ms` room, if anything: where
/// AEC3 found the echo (the room's delay plus the reference's lead, within 15 ms), the echo left
/// in Moshi-only windows (every one >= 25 dB down from 2 s on), the user's speech under it.
fn echo_cancel_failure(delay_ms: u32, v: &serde_json::Value) -> Option<String> {
    let lead_ms = moshi_runtime::echo_cancel::REFERENCE_LEAD_MS;
    let expected_ms = lead_ms + f64::from(delay_ms);
    let found_ms = v["aec_delay_ms"].as_f64();
    let erle_db_min = v["erle_db_min"].as_f64().unwrap();
    let ncc_all = v["user_ncc_all"].as_f64().unwrap();
    if found_ms.is_none_or(|ms| (ms - expected_ms).abs() > 15.0) {
        Some(format!(
            "AEC3 found the echo at {found_ms:?} ms after the reference, expected {expected_ms} ms"
        ))
    } else if erle_db_min < 25.0 {
        Some(format!(
            "a Moshi-only window from 2 s on has the echo only {erle_db_min} dB down"
        ))
    } else if ncc_all < DOUBLE_TALK_MIN_NCC {
        Some(format!(
            "the user came through at ncc {ncc_all}, expected >= {DOUBLE_TALK_MIN_NCC}"
        ))
    } else {
        None
    }
}

/// On tiny-a with a broadband voice (its random Mimi decoder's tones taken out: tiny-a's own
/// voice is a buzz of narrow-band tones, on which AEC3 by design does not adapt; see
/// `write_tiny_a_with_broadband_voice`), in both rooms: with `--echo-cancel on`, AEC3 finds the
/// echo at the room's delay plus the reference's lead, the echo is at least 25 dB down in every
/// Moshi-only window from 2 s on, and the user's speech comes through (double talk: the tiny
/// model never stops talking; ncc >= [`DOUBLE_TALK_MIN_NCC`]); with `--echo-cancel off` the echo
/// is all there. A failed run with a glitch the engine counted is run again ([`ECHO_ATTEMPTS`]).
#[test]
fn chat_on_laptop_speakers_cancels_the_echo_and_lets_the_user_through() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !audio_tools_present(
        "chat_on_laptop_speakers_cancels_the_echo",
        &["pulseaudio", "paplay", "pactl"],
    ) {
        return;
    }
    let model = tempfile::tempdir().unwrap();
    write_tiny_a_with_broadband_voice(model.path());
    for delay_ms in [40, 120] {
        for attempt in 1..=ECHO_ATTEMPTS {
            let v = run_echo_e2e(model.path(), delay_ms, "on");
            let Some(failure) = echo_cancel_failure(delay_ms, &v) else {
                assert_eq!(v["cancelled"], true, "the script's verdict: {v}");
                break;
            };
            // A glitch the engine counted (a gap in the speaker's playback) moves the echo
            // against the reference and the canceller adapts again: such a run may be retried.
            let glitched = v["audible_glitch_events"] != 0;
            assert!(
                glitched && attempt < ECHO_ATTEMPTS,
                "{delay_ms} ms room, run {attempt} of at most {ECHO_ATTEMPTS}: {failure} (glitches the engine counted: {}): {v}",
                v["audible_glitch_events"]
            );
            eprintln!("{delay_ms} ms room: {failure} after a counted glitch, once more");
        }
        let v = run_echo_e2e(model.path(), delay_ms, "off");
        assert!(
            v["erle_db_median"].as_f64().unwrap().abs() < 1.0,
            "{delay_ms} ms room: without cancellation the echo is all there: {v}"
        );
        assert_eq!(v["cancelled"], false, "{v}");
    }
}
