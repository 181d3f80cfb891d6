//! What `chat` and `transcribe --mic` share to run a model live on the audio devices through the
//! real-time engine (moshi-runtime's cpal backend, rings and engine thread): the microphone's
//! flags, the signals that stop a session (Ctrl-C; SIGTERM too for `transcribe --mic`), and the
//! loop that watches a running session: the caller's work every 20 ms tick (the engine's
//! events, the console), `--duration-s`, a lost device reopened (same options; the engine and
//! the model keep their state) until it comes back, the duration ends or a stop signal.

use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use moshi_runtime::backend::cpal::{CpalBackend, CpalOptions, DEFAULT_BUFFER_MS};
use moshi_runtime::backend::device_watch::{DeviceLost, DeviceWatch};
use moshi_runtime::backend::{reconnect_session, AudioBackend, RingSizes, Session};
use moshi_runtime::engine::{DropPolicy, StreamFormat};
use moshi_runtime::recorder::{RecordWriter, RecorderThread, RecordingSummary};

/// Input frames allowed to wait behind the one being processed, by default.
pub const DEFAULT_MAX_BACKLOG_FRAMES: usize = 2;

/// The microphone side of a live session: `chat`'s flags, which `transcribe --mic` takes too.
#[derive(clap::Args, Debug, Clone)]
pub struct LiveInputArgs {
    /// Input device (substring of its name, see `moshi-rs devices`); default: the system default.
    #[arg(long, value_name = "NAME")]
    pub input_device: Option<String>,
    /// Device buffer, milliseconds: what the audio host queues on each side, in 4 callback
    /// periods. Smaller adds less latency, but on a busy machine the host runs dry while the
    /// callback thread waits for a core, and the listener hears a click.
    #[arg(long, default_value_t = DEFAULT_BUFFER_MS)]
    pub buffer_ms: u32,
    /// Input frames allowed to wait behind the one being processed before the oldest is dropped.
    #[arg(
        long,
        default_value_t = DEFAULT_MAX_BACKLOG_FRAMES,
        value_parser = super::flag_values::backlog_frames
    )]
    pub max_backlog_frames: usize,
    /// Stop after this many seconds (default: until Ctrl-C).
    #[arg(
        long,
        value_name = "SECONDS",
        allow_negative_numbers = true,
        value_parser = super::flag_values::duration_s
    )]
    pub duration_s: Option<f64>,
}

impl LiveInputArgs {
    /// The flags set to something other than their default (to refuse them where nothing
    /// listens).
    pub fn given(&self) -> Vec<&'static str> {
        [
            ("--input-device", self.input_device.is_some()),
            ("--buffer-ms", self.buffer_ms != DEFAULT_BUFFER_MS),
            (
                "--max-backlog-frames",
                self.max_backlog_frames != DEFAULT_MAX_BACKLOG_FRAMES,
            ),
            ("--duration-s", self.duration_s.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, set)| set.then_some(flag))
        .collect()
    }

    /// Fails on a `--buffer-ms` out of 1..=1000.
    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.buffer_ms >= 1 && self.buffer_ms <= 1000,
            "--buffer-ms {}: expected 1..=1000",
            self.buffer_ms
        );
        Ok(())
    }

    /// Real time: the oldest input frames are dropped (and counted) when the model falls behind.
    pub fn drop_policy(&self) -> DropPolicy {
        DropPolicy::RealTime {
            max_backlog_frames: self.max_backlog_frames,
        }
    }

    /// The devices of a session that plays its output: this input and `output_device` (`None`:
    /// the default output).
    pub fn with_output(&self, output_device: Option<String>) -> CpalOptions {
        CpalOptions {
            input_device: self.input_device.clone(),
            output_device,
            buffer_ms: self.buffer_ms,
            playback: true,
            capture: true,
        }
    }

    /// The devices of a session that only listens: this input, no output device opened.
    pub fn capture_only(&self) -> CpalOptions {
        CpalOptions {
            playback: false,
            ..self.with_output(None)
        }
    }
}

/// The devices of a live session and the rings between them and the engine.
pub struct Devices {
    pub options: CpalOptions,
    pub rings: RingSizes,
}

impl Devices {
    /// Opens the devices (nothing is started yet).
    pub fn open(&self) -> anyhow::Result<CpalBackend> {
        Ok(CpalBackend::open(&self.options)?)
    }
}

/// A signal that stops a live session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopSignal {
    CtrlC,
    Sigterm,
}

impl StopSignal {
    fn code(self) -> u8 {
        match self {
            StopSignal::CtrlC => 1,
            StopSignal::Sigterm => 2,
        }
    }

    fn of_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(StopSignal::CtrlC),
            2 => Some(StopSignal::Sigterm),
            _ => None,
        }
    }
}

impl std::fmt::Display for StopSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StopSignal::CtrlC => "Ctrl-C",
            StopSignal::Sigterm => "SIGTERM",
        })
    }
}

/// The first stop signal received, set by [`watch_stop_signals`]'s thread.
#[derive(Clone, Default)]
pub struct StopRequest(Arc<AtomicU8>);

impl StopRequest {
    pub fn get(&self) -> Option<StopSignal> {
        StopSignal::of_code(self.0.load(Ordering::Acquire))
    }

    fn set(&self, signal: StopSignal) {
        // The first signal stays the reason.
        let _ = self
            .0
            .compare_exchange(0, signal.code(), Ordering::AcqRel, Ordering::Acquire);
    }
}

/// Exit status after a second stop signal (128 + SIGINT, what a shell reports for an interrupt).
const SECOND_SIGNAL_EXIT_STATUS: i32 = 130;

/// Watches Ctrl-C (and SIGTERM with `sigterm`, on Unix) on its own thread for the whole session
/// (once tokio listens, these no longer end the process by themselves): the first one sets the
/// returned request (the session stops and completes its outputs), a second one exits the
/// process at once, whatever the main thread is waiting for, removing the temporary files of
/// the outputs not yet complete.
pub fn watch_stop_signals(sigterm: bool) -> anyhow::Result<StopRequest> {
    let request = StopRequest::default();
    let flag = request.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting tokio for Ctrl-C")?;
    // Registered here, before returning: a SIGTERM from now on is caught.
    let mut term = if sigterm {
        let _entered = runtime.enter();
        Some(listen_for_sigterm()?)
    } else {
        None
    };
    std::thread::Builder::new()
        .name("moshi-stop-signals".into())
        .spawn(move || {
            runtime.block_on(async {
                let Some(first) = next_stop_signal(&mut term).await else {
                    return;
                };
                flag.set(first);
                if let Some(second) = next_stop_signal(&mut term).await {
                    eprintln!("\nsecond stop ({second}): exiting now");
                    // The outputs not yet complete are given up: no hidden partial is left.
                    moshi_loader::output_file::remove_partials_for_exit();
                    std::process::exit(SECOND_SIGNAL_EXIT_STATUS);
                }
            })
        })
        .context("starting the stop-signal thread")?;
    Ok(request)
}

#[cfg(unix)]
type TermSignal = tokio::signal::unix::Signal;
/// No SIGTERM to listen for.
#[cfg(not(unix))]
type TermSignal = std::convert::Infallible;

#[cfg(unix)]
fn listen_for_sigterm() -> anyhow::Result<TermSignal> {
    use tokio::signal::unix::{signal, SignalKind};
    signal(SignalKind::terminate()).context("listening for SIGTERM")
}

#[cfg(not(unix))]
fn listen_for_sigterm() -> anyhow::Result<TermSignal> {
    anyhow::bail!("SIGTERM is a Unix signal")
}

/// The next Ctrl-C, or SIGTERM when `term` listens for it; `None` if listening failed.
async fn next_stop_signal(term: &mut Option<TermSignal>) -> Option<StopSignal> {
    #[cfg(unix)]
    let term_recv = async {
        match term.as_mut() {
            Some(t) => t.recv().await,
            None => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term_recv = async {
        let _ = term;
        std::future::pending::<Option<()>>().await
    };
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.ok().map(|()| StopSignal::CtrlC),
        r = term_recv => r.map(|()| StopSignal::Sigterm),
    }
}

/// Why a live session (or one device's part of it) stopped.
#[derive(Debug)]
pub enum Stop {
    Signal(StopSignal),
    Duration(f64),
    EngineStopped,
    /// The devices are reopened and the session goes on.
    DeviceLost(DeviceLost),
    /// A stop signal or the duration came while the device was gone.
    WhileDeviceGone,
    ReopenFailed(String),
    /// The caller's work on a tick failed (an output could not be written).
    Failed(anyhow::Error),
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::Signal(s) => write!(f, "{s}"),
            Stop::Duration(d) => write!(f, "--duration-s {d} reached"),
            Stop::EngineStopped => write!(f, "the engine stopped"),
            Stop::DeviceLost(lost) => write!(f, "audio device lost: {lost}"),
            Stop::WhileDeviceGone => write!(f, "stopped while the audio device was gone"),
            Stop::ReopenFailed(e) => write!(f, "the audio device could not be reopened: {e}"),
            Stop::Failed(e) => write!(f, "{e:#}"),
        }
    }
}

/// What [`run_until_stop`] watches.
pub struct Watch<'a> {
    pub session: &'a Session,
    pub devices: &'a Devices,
    pub duration_s: Option<f64>,
    pub stop: &'a StopRequest,
    pub started: Instant,
}

impl Watch<'_> {
    fn duration_over(&self) -> Option<f64> {
        self.duration_s
            .filter(|&d| self.started.elapsed().as_secs_f64() >= d)
    }
}

/// Runs `on_tick` every 20 ms until a stop signal, the duration, the engine ending or an error
/// of `on_tick`; a lost device is reopened in `backend`'s place (see the module docs). Returns
/// why it stopped.
pub fn run_until_stop(
    watch: &Watch<'_>,
    backend: &mut CpalBackend,
    mut on_tick: impl FnMut(&Session) -> anyhow::Result<()>,
) -> anyhow::Result<Stop> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting tokio")?;
    Ok(loop {
        let reason = runtime.block_on(drive(watch, &mut on_tick));
        let Stop::DeviceLost(lost) = reason else {
            break reason;
        };
        // Its streams are dropped on their own thread: a lost device's host thread may never
        // end, and `stop` waits for it a bounded time only.
        eprintln!("\raudio device lost ({lost}); reopening...");
        if let Err(e) = backend.stop() {
            eprintln!("warning: {e}");
        }
        match runtime.block_on(reopen(watch)) {
            Ok(Some(b)) => {
                *backend = b;
                eprintln!("audio: reopened: {}", backend.describe());
            }
            Ok(None) => break Stop::WhileDeviceGone,
            Err(e) => break Stop::ReopenFailed(format!("{e:#}")),
        }
    })
}

/// Retries opening the devices every 500 ms. `None`: a stop signal or the duration ended first.
async fn reopen(watch: &Watch<'_>) -> anyhow::Result<Option<CpalBackend>> {
    loop {
        for _ in 0..25 {
            if watch.stop.get().is_some() {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if watch.duration_over().is_some() {
            return Ok(None);
        }
        if let Ok(mut backend) = watch.devices.open() {
            if reconnect_session(watch.session, &mut backend, watch.devices.rings).is_ok() {
                return Ok(Some(backend));
            }
            let _ = backend.stop();
        }
    }
}

/// Runs until a stop signal, the duration, a lost device or the engine ending.
async fn drive(
    watch: &Watch<'_>,
    on_tick: &mut impl FnMut(&Session) -> anyhow::Result<()>,
) -> Stop {
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let stall_limit = DeviceWatch::DEFAULT_STALL_LIMIT;
    let mut devices = if watch.devices.options.playback {
        DeviceWatch::new(stall_limit)
    } else {
        DeviceWatch::capture_only(stall_limit)
    };
    loop {
        tick.tick().await;
        if let Some(signal) = watch.stop.get() {
            return Stop::Signal(signal);
        }
        if let Err(e) = on_tick(watch.session) {
            return Stop::Failed(e);
        }
        if let Some(lost) = devices.check(&watch.session.counters) {
            return Stop::DeviceLost(lost);
        }
        if watch.session.engine.is_finished() {
            return Stop::EngineStopped;
        }
        if let Some(d) = watch.duration_over() {
            return Stop::Duration(d);
        }
    }
}

/// Milliseconds of `frames` device frames (one sample per channel) at `rate_hz`.
pub fn frames_ms(frames: u64, rate_hz: u32) -> f64 {
    frames as f64 * 1e3 / f64::from(rate_hz.max(1))
}

/// Milliseconds of `samples` interleaved device samples (all channels) in `format`.
pub fn device_samples_ms(samples: u64, format: StreamFormat) -> f64 {
    frames_ms(
        samples / u64::from(format.channels.max(1)),
        format.sample_rate_hz,
    )
}

/// Device errors are counted in the audio callbacks and reported from the console, at most
/// every 5 s (ALSA can report thousands per xrun).
pub struct DeviceErrorReports {
    reported: u64,
    last_report: Instant,
}

impl Default for DeviceErrorReports {
    fn default() -> Self {
        Self {
            reported: 0,
            last_report: Instant::now() - Duration::from_secs(3600),
        }
    }
}

impl DeviceErrorReports {
    /// Reports the errors counted since the last report, if it is time; `tty`: the status
    /// line on stderr is cleared first.
    pub fn report(&mut self, device_errors: u64, tty: bool) {
        if device_errors <= self.reported || self.last_report.elapsed() < Duration::from_secs(5) {
            return;
        }
        let new = device_errors - self.reported;
        self.reported = device_errors;
        self.last_report = Instant::now();
        if tty {
            eprint_raw!("\r\x1b[2K");
        }
        eprintln!("audio device: {new} errors reported by the host since the last report (counted, the stream keeps going)");
    }
}

/// Completes a WAV recording (`flag`: `--record`, `--record-input`) once the engine has ended
/// (its end of the queue is gone, so the writer can finish): says where it is and what it holds
/// (`holds`, from its seconds), and what it left out.
pub(super) fn finish_wav_recording<W>(
    flag: &str,
    path: &Path,
    recording: RecorderThread<W>,
    holds: impl FnOnce(f64) -> String,
) -> anyhow::Result<()>
where
    W: RecordWriter<End = (), Done = RecordingSummary>,
    W::Error: std::error::Error + Send + Sync + 'static,
{
    let finished = recording.finish(()).context(flag.to_string())?;
    let seconds = finished.done.samples as f64 / moshi_runtime::SAMPLE_RATE_HZ as f64;
    eprintln!("recorded {} ({})", path.display(), holds(seconds));
    let left_out = finished.frames_dropped + finished.done.frames_beyond_limit;
    if left_out > 0 {
        eprintln!(
            "warning: {flag}: {left_out} frames left out of the recording ({} while the disk was behind, {} past a WAV's 4 GiB)",
            finished.frames_dropped, finished.done.frames_beyond_limit
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use moshi_runtime::SAMPLE_RATE_HZ;

    #[test]
    fn device_samples_count_all_channels_at_the_device_rate() {
        let stereo_48k = StreamFormat {
            sample_rate_hz: 48_000,
            channels: 2,
        };
        // 96 000 interleaved stereo samples at 48 kHz: 48 000 frames, one second.
        assert_eq!(device_samples_ms(96_000, stereo_48k), 1000.0);
        let mono_24k = StreamFormat {
            sample_rate_hz: SAMPLE_RATE_HZ,
            channels: 1,
        };
        assert_eq!(device_samples_ms(2_400, mono_24k), 100.0);
        assert_eq!(frames_ms(441, 44_100), 10.0);
    }

    #[test]
    fn the_first_stop_signal_is_the_reason() {
        let stop = StopRequest::default();
        assert_eq!(stop.get(), None);
        stop.set(StopSignal::Sigterm);
        stop.set(StopSignal::CtrlC);
        assert_eq!(stop.get(), Some(StopSignal::Sigterm));
        assert_eq!(Stop::Signal(StopSignal::Sigterm).to_string(), "SIGTERM");
    }

    #[test]
    fn capture_only_opens_no_output_device() {
        let args = LiveInputArgs {
            input_device: Some("mic".into()),
            buffer_ms: 40,
            max_backlog_frames: 2,
            duration_s: None,
        };
        let capture = args.capture_only();
        assert!(!capture.playback && capture.output_device.is_none());
        let both = args.with_output(Some("speaker".into()));
        assert!(both.playback);
        assert_eq!(both.output_device.as_deref(), Some("speaker"));
        assert_eq!(both.input_device.as_deref(), Some("mic"));
    }
}
