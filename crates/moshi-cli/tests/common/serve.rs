//! Helpers shared by the `moshi-rs serve` tests: start the server binary on a free port and
//! stop it, read WAV files, compare signals.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use moshi_test_support::{repo_root as root, tiny_a_dir as tiny_model};

/// `moshi-rs serve` running on a free port of 127.0.0.1.
pub struct Server {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// Everything the server printed on stderr so far.
    pub log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `moshi-rs serve --port 0 <args>` and waits for the URL it prints.
    pub fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_moshi-rs"))
            .arg("--log")
            .arg("moshi_server=info")
            .arg("serve")
            .args(["--port", "0"])
            .args(args)
            .env("HF_HUB_OFFLINE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start moshi-rs serve");
        let log = Arc::new(Mutex::new(String::new()));
        let mut stderr = child.stderr.take().unwrap();
        let log_writer = log.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                log_writer
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("moshi-rs serve: open ") {
                    let _ = tx.send(url.trim().to_string());
                }
            }
        });
        let url = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "moshi-rs serve printed no URL within 120 s:\n{}",
                    log.lock().unwrap()
                );
            }
        };
        let addr = url
            .trim_start_matches("http://")
            .trim_start_matches("https://")
            .trim_end_matches('/')
            .to_string();
        Server { child, addr, log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn ws_url(&self, query: &str) -> String {
        format!("ws://{}/api/chat{query}", self.addr)
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits until the log contains `needle` (or panics after `timeout`).
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) {
        let t0 = Instant::now();
        while !self.log().contains(needle) {
            assert!(
                t0.elapsed() < timeout,
                "the server log has no {needle:?} after {timeout:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends `signal` (`TERM`, `KILL`, ...) to the server.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits up to `timeout` for the server to exit; its status, or None if it still runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let t0 = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if t0.elapsed() >= timeout {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Ctrl-C, then waits for the exit; returns whether it exited by itself and successfully.
    pub fn stop(mut self) -> bool {
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        false
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// 24 kHz mono samples of a WAV file (any format moshi-rs reads).
pub fn read_wav(path: &Path) -> Vec<f32> {
    let audio = moshi_runtime::wav::read_mono(path).unwrap();
    assert_eq!(audio.sample_rate_hz, 24_000, "{}", path.display());
    audio.samples
}

pub use moshi_test_support::ncc;

/// (lag, ncc) of the best alignment of `later` against `earlier` (`later[i + lag] ~
/// earlier[i]`) for lags in `0..=max_lag`.
pub fn align(earlier: &[f32], later: &[f32], max_lag: usize) -> (usize, f64) {
    (0..=max_lag.min(later.len()))
        .map(|lag| (lag, ncc(earlier, &later[lag..])))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap()
}

/// Files in `dir` whose name ends with `suffix`.
pub fn files_ending(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    v.sort();
    v
}
