//! `moshi-rs serve` with a speech-to-text model against the clients third-party code uses,
//! unmodified, on loopback (assets/tiny-stt):
//! - Kyutai's `stt_from_file_rust_server.py` (../shared/clients/dsm): its words and times equal
//!   what the same samples give offline (moshi-server's word rules over `transcribe`'s tokens);
//! - Kyutai's `stt_from_mic_rust_server.py` on a virtual PulseAudio microphone
//!   (scripts/stt-clients/dsm-mic-e2e.sh): it connects, prints the words, and the server saw its
//!   audio;
//! - the LiveKit agents plugin `livekit-plugins-kyutai-lasuite` (its STT stream, driven by
//!   scripts/stt-clients/livekit_stt.py without a LiveKit server): its final transcripts are the
//!   words, with their start times, of the same samples offline.
//!
//! Each test says SKIPPED (and why) when what it needs is missing, and fails instead under `CI`:
//! `bash scripts/setup.sh --audio-e2e --serve-e2e` makes target/stt-clients/venv; Kyutai's
//! scripts are in ../shared.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::asr::{
    dsm_stream, expected_messages, start_server, timed_words, tiny_stt, FRAME, KEY, SECOND,
};
use common::serve::{read_wav, root};
use moshi_test_support::command_exists as have;

const SETUP: &str = "bash scripts/setup.sh --audio-e2e --serve-e2e";

fn venv_python() -> PathBuf {
    root().join("target/stt-clients/venv/bin/python")
}

fn dsm_dir() -> PathBuf {
    root().join("../shared/clients/dsm")
}

/// Whether the test can run; if not, says SKIPPED, or panics under CI.
fn ready(test: &str, needs: &[(&str, bool)]) -> bool {
    let missing: Vec<&str> = needs
        .iter()
        .filter(|(_, ok)| !ok)
        .map(|(n, _)| *n)
        .collect();
    if missing.is_empty() {
        return true;
    }
    let why = format!(
        "SKIPPED {test}: missing {missing:?} (run `{SETUP}`; Kyutai's scripts are in ../shared)"
    );
    assert!(std::env::var_os("CI").is_none(), "{why}");
    eprintln!("{why}");
    false
}

/// Runs `command` to its end or kills it after `limit`; returns (stdout, stderr, success).
fn run_bounded(mut command: Command, limit: Duration) -> (String, String, bool) {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("PYTHONIOENCODING", "utf-8")
        .spawn()
        .expect("start the client");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let output = match rx.recv_timeout(limit) {
        Ok(o) => o.expect("wait for the client"),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            let o = rx.recv().unwrap().unwrap();
            panic!(
                "the client ran longer than {limit:?}:\n{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
    };
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
        output.status.success(),
    )
}

/// The `start - end  word` lines Kyutai's file script prints last (`{start:7.2f} -{end:7.2f}
/// {word}`).
fn printed_words(stdout: &str) -> Vec<(String, String, String)> {
    stdout
        .lines()
        .filter_map(|line| {
            let (start, end, word) = (line.get(..7)?, line.get(9..16)?, line.get(18..)?);
            let number = |s: &str| s.trim().parse::<f64>().ok().map(|_| s.trim().to_string());
            (line.get(7..9)? == " -" && line.get(16..18)? == "  ").then_some((
                word.to_string(),
                number(start)?,
                number(end)?,
            ))
        })
        .collect()
}

#[test]
fn kyutai_file_client_gets_the_words_of_the_audio() {
    let script = dsm_dir().join("stt_from_file_rust_server.py");
    if !ready(
        "kyutai_file_client_gets_the_words_of_the_audio",
        &[
            ("target/stt-clients/venv", venv_python().exists()),
            ("../shared/clients/dsm", script.exists()),
        ],
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &[]);
    let wav = tiny_stt().join("input.wav");
    let mut client = Command::new(venv_python());
    client.arg(&script).arg(&wav).args([
        "--url",
        &format!("ws://{}", server.addr),
        "--api-key",
        KEY,
        "--rtf",
        "20",
    ]);
    let (stdout, stderr, ok) = run_bounded(client, Duration::from_secs(180));
    assert!(ok, "the client failed:\n{stdout}\n{stderr}");

    // The script's stream: what the server must have answered up to the marker.
    let (before, after) = dsm_stream(&read_wav(&wav));
    let marker_steps = before.iter().map(Vec::len).sum::<usize>() / FRAME + 7;
    let mut samples = before.concat();
    samples.extend(after.concat());
    let expected = expected_messages(dir.path(), &samples, marker_steps, Some(0));
    let expected: Vec<(String, String, String)> = timed_words(&expected)
        .into_iter()
        .map(|(w, a, b)| (w, format!("{a:.2}"), format!("{b:.2}")))
        .collect();
    assert!(expected.len() >= 3, "the fixture's speech gives words");
    let printed = printed_words(&stdout);
    assert_eq!(printed, expected, "client output:\n{stdout}");
    drop(server);
}

#[test]
fn kyutai_mic_client_transcribes_a_virtual_microphone() {
    let script = dsm_dir().join("stt_from_mic_rust_server.py");
    let tools = ["pulseaudio", "paplay", "parecord", "pactl"]
        .iter()
        .all(|t| have(t));
    if !ready(
        "kyutai_mic_client_transcribes_a_virtual_microphone",
        &[
            ("target/stt-clients/venv", venv_python().exists()),
            ("../shared/clients/dsm", script.exists()),
            ("pulseaudio, paplay, parecord, pactl", tools),
        ],
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &[]);
    let out = dir.path().join("e2e");
    let mut e2e = Command::new("bash");
    e2e.arg(root().join("scripts/stt-clients/dsm-mic-e2e.sh"))
        .env("URL", format!("ws://{}", server.addr))
        .env("API_KEY", KEY)
        .env("E2E_OUT", &out)
        .env("MIN_WORDS", "3");
    let (stdout, stderr, ok) = run_bounded(e2e, Duration::from_secs(120));
    assert!(ok, "dsm-mic-e2e.sh failed:\n{stdout}\n{stderr}");
    // The server processed the microphone's audio: about the WAV's 4.2 s and the tail.
    server.wait_for_log("asr stream ended", Duration::from_secs(20));
    let log = server.log();
    let processed = frames_processed(&log).expect("the stream's end in the server log");
    assert!(processed >= 50, "{processed} frames processed:\n{log}");
}

/// `N processed` of the server's last "asr stream ended" line.
fn frames_processed(log: &str) -> Option<u64> {
    let line = log.lines().rev().find(|l| l.contains("asr stream ended"))?;
    let before = line.split(" processed").next()?;
    before.rsplit(", ").next()?.trim().parse().ok()
}

#[test]
fn livekit_plugin_gets_the_words_of_the_audio() {
    let driver = root().join("scripts/stt-clients/livekit_stt.py");
    if !ready(
        "livekit_plugin_gets_the_words_of_the_audio",
        &[("target/stt-clients/venv", venv_python().exists())],
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &[]);
    let wav = tiny_stt().join("input.wav");
    let mut client = Command::new(venv_python());
    client.arg(&driver).arg(&wav).args([
        "--url",
        &format!("ws://{}", server.addr),
        "--api-key",
        KEY,
        "--speed",
        "8",
        "--silence-before-s",
        "1",
        "--flush-s",
        "4",
    ]);
    let started = Instant::now();
    let (stdout, stderr, ok) = run_bounded(client, Duration::from_secs(120));
    assert!(ok, "the LiveKit driver failed:\n{stdout}\n{stderr}");
    let got: Vec<(String, f64)> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["type"] == "final_transcript")
        .map(|e| {
            (
                e["text"].as_str().unwrap().to_string(),
                e["start_time"].as_f64().unwrap(),
            )
        })
        .collect();

    // The plugin's stream: 1 s of silence, the WAV, 4 s of silence, in whole frames.
    let mut samples = vec![0.0; SECOND];
    samples.extend(read_wav(&wav));
    samples.extend(vec![0.0; 4 * SECOND]);
    let steps = samples.len() / FRAME;
    let expected: Vec<(String, f64)> =
        timed_words(&expected_messages(dir.path(), &samples, steps, None))
            .into_iter()
            .map(|(w, start, _)| (w, start))
            .collect();
    assert!(expected.len() >= 3, "the fixture's speech gives words");
    assert_eq!(
        got,
        expected,
        "driver output:\n{stdout}\n{stderr}\n(after {:?})",
        started.elapsed()
    );
    // The driver's summary: the plugin got the server's Ready (a server Error fails the run).
    let summary = stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("livekit_stt: done"))
        .unwrap_or_else(|| panic!("no summary from the driver:\n{stderr}"));
    assert!(summary.contains("\"Ready\": 1"), "{summary}");
}
