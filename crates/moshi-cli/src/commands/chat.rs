//! `moshi-rs chat`: a live, full-duplex conversation with Moshi on local audio devices.
//!
//! The device callbacks (cpal) only move samples through lock-free rings; the engine thread runs
//! the Moshi pipeline on every 80 ms frame; tokio drives the rest: Ctrl-C, the `--duration-s`
//! timer and the console (Moshi's words live, a status line with the real-time factor, latency
//! and underruns). `--record` writes the conversation as it goes (stereo WAV: user left, Moshi
//! right; its own thread behind a bounded queue, completed at the end). On stop: a summary and
//! `--stats-json`; a second Ctrl-C exits at once. A lost device (a typed
//! `DeviceLost` from the runtime's watch) is reopened; its old streams are
//! dropped on their own thread, waited for a bounded time only. When the model is slower than
//! real time, input frames are dropped deliberately (latency stays bounded) and the summary says
//! so with the measured factor.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use moshi_loader::output_file::{names_stdout, write_output};
use moshi_runtime::backend::cpal::CpalBackend;
use moshi_runtime::backend::{
    start_session_with_mic, AudioBackend, MicProcessing, RingSizes, Session,
};
use moshi_runtime::echo_cancel::EchoStats;
use moshi_runtime::engine::{EngineEvent, EngineReport, FrameRecorder};
use moshi_runtime::metrics::{FrameRecord, LatencyStats, Percentiles, ProfileWriter, RunSummary};
use moshi_runtime::recorder::{ConversationWav, RawMicWav};
use moshi_runtime::ring::{AudioCounters, CounterSnapshot};
use moshi_runtime::SAMPLE_RATE_HZ;

use super::echo_args::EchoArgs;
use super::live::{
    device_samples_ms, frames_ms, run_until_stop, watch_stop_signals, DeviceErrorReports, Devices,
    LiveInputArgs, Watch,
};
use super::model_args::{ModelArgs, SamplingArgs, LIVE_DEFAULTS};
use super::outputs::{check_outputs, given};
use super::signals::{remove_partials_on, Signals};
use super::stdout::Words;

#[derive(clap::Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub live: LiveInputArgs,
    #[command(flatten)]
    pub echo: EchoArgs,
    /// Output device (substring of its name); default: the system default.
    #[arg(long, value_name = "NAME")]
    pub output_device: Option<String>,
    /// Silence queued ahead of Moshi's first frame so compute-time jitter never underruns the
    /// speaker (adds this much latency). Default: three quarters of the device buffer (three
    /// callback periods): the engine then survives as long a stall as the host's buffer does.
    #[arg(
        long,
        value_name = "MS",
        allow_negative_numbers = true,
        value_parser = super::flag_values::jitter_ms
    )]
    pub jitter_ms: Option<f64>,
    /// Save the conversation as a stereo WAV: you on the left, Moshi on the right (24 kHz).
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// Save the microphone as captured, before echo cancellation (mono WAV, 24 kHz; the frames
    /// of `--record`'s left channel, which is what Moshi heard).
    #[arg(long, value_name = "FILE")]
    pub record_raw_mic: Option<PathBuf>,
    /// Write per-frame timings as JSON Lines.
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// Write the end-of-session statistics as JSON.
    #[arg(long, value_name = "FILE")]
    pub stats_json: Option<PathBuf>,
}

impl ChatArgs {
    /// The jitter margin in force (`--jitter-ms`, else three quarters of the device buffer).
    fn jitter_margin_ms(&self) -> f64 {
        self.jitter_ms
            .unwrap_or(f64::from(self.live.buffer_ms) * 0.75)
    }

    /// The input and output devices, with rings whose speaker side holds the whole jitter
    /// margin (`--jitter-ms` up to 10 s).
    fn devices(&self) -> Devices {
        Devices {
            options: self.live.with_output(self.output_device.clone()),
            rings: RingSizes::for_output_queue(self.jitter_margin_ms(), self.live.buffer_ms),
        }
    }
}

/// Estimated latency the runtime adds to the model's own frame + compute time, per frame:
/// capture device latency + input waiting behind the frame + output queued ahead of it
/// (including the jitter margin) + playback device latency; the input and output waits include
/// the resamplers' pending input and group delay when the device is not at 24 kHz.
fn added_latency_ms(r: &FrameRecord, c: &CounterSnapshot) -> f64 {
    c.input_device_latency_us as f64 / 1e3
        + r.mic_backlog_ms
        + r.speaker_queue_ms
        + c.output_device_latency_us as f64 / 1e3
}

/// `--profile`: records written as frames come; a write error stops the writing (not the
/// conversation) and is reported at the end.
struct Profile {
    writer: Option<ProfileWriter>,
    error: Option<moshi_runtime::RuntimeError>,
}

impl Profile {
    fn write(&mut self, record: &FrameRecord) {
        if let Some(w) = self.writer.as_mut() {
            if let Err(e) = w.write(record) {
                self.error = Some(e);
                self.writer = None;
            }
        }
    }

    fn finish(self, summary: &RunSummary) -> anyhow::Result<()> {
        if let Some(e) = self.error {
            return Err(anyhow::Error::new(e).context("--profile"));
        }
        if let Some(w) = self.writer {
            w.finish(summary).context("--profile")?;
        }
        Ok(())
    }
}

/// Frames the status line's real-time factor averages.
const RECENT_FRAMES: usize = 25;

struct Console {
    tty: bool,
    line: String,
    last_status: Instant,
    device_errors: DeviceErrorReports,
    latest: Option<FrameRecord>,
    latencies_ms: LatencyStats,
    /// Compute time of the latest frames (for the real-time factor on the status line).
    recent_total_ms: std::collections::VecDeque<f64>,
    /// The words on stdout when stderr is not a terminal (a stdout error never stops the
    /// conversation).
    words: Words,
}

impl Console {
    fn new() -> Self {
        let long_ago = Instant::now() - Duration::from_secs(3600);
        Self {
            tty: std::io::stderr().is_terminal(),
            line: String::new(),
            last_status: long_ago,
            device_errors: DeviceErrorReports::default(),
            words: Words::default(),
            latest: None,
            latencies_ms: LatencyStats::default(),
            recent_total_ms: std::collections::VecDeque::with_capacity(RECENT_FRAMES),
        }
    }

    fn words(&mut self, text: &str) {
        if self.tty {
            // The model's words, shown escaped as on stdout (`Words::print`).
            self.line
                .push_str(&moshi_loader::escape::escape_controls(text));
            if self.line.chars().count() > 70 {
                eprint_raw!("\r\x1b[2K{}\n", self.line.trim_start());
                self.line.clear();
            }
        } else {
            self.words.print(text);
        }
    }

    fn status(&mut self, counters: &AudioCounters, rtf: f64, force: bool) {
        let c = counters.snapshot();
        self.device_errors.report(c.device_errors, self.tty);
        let every = if self.tty {
            Duration::from_millis(250)
        } else {
            Duration::from_secs(2)
        };
        if !force && self.last_status.elapsed() < every {
            return;
        }
        self.last_status = Instant::now();
        let latency = self
            .latest
            .as_ref()
            .map_or(0.0, |r| added_latency_ms(r, &c));
        let echo = self
            .latest
            .as_ref()
            .and_then(|r| r.echo.as_deref())
            .map_or(String::new(), |e| format!(" | {}", echo_status(e)));
        let status = format!(
            "[RTF {rtf:.2} | added latency {latency:.0} ms | glitches {} (underruns {}) | dropped frames {} | device errors {}{echo}]",
            c.audible_glitch_events(),
            c.underrun_events,
            c.engine_frames_dropped,
            c.device_errors
        );
        if self.tty {
            eprint_raw!("\r\x1b[2K{status} {}", self.line.trim_start());
        } else {
            eprintln!("{status}");
        }
    }

    fn frame(&mut self, record: FrameRecord, counters: &AudioCounters) {
        self.latencies_ms
            .push(added_latency_ms(&record, &counters.snapshot()));
        if self.recent_total_ms.len() == RECENT_FRAMES {
            self.recent_total_ms.pop_front();
        }
        self.recent_total_ms.push_back(record.total_ms);
        self.latest = Some(record);
    }

    /// Real-time factor of the latest frames.
    fn recent_rtf(&self) -> f64 {
        self.recent_total_ms.iter().sum::<f64>()
            / self.recent_total_ms.len().max(1) as f64
            / moshi_runtime::FRAME_MS
    }
}

/// The echo canceller on the status line: its ERLE estimate and whether it has converged.
fn echo_status(e: &EchoStats) -> String {
    let erle = e.erle_db.map_or("-".into(), |d| format!("{d:.0} dB"));
    let state = if e.converged {
        "converged"
    } else {
        "converging"
    };
    format!("echo ERLE {erle} {state}")
}

/// Statistics written by `--stats-json` and printed as the summary.
#[derive(serde::Serialize)]
struct ChatStats {
    frames_processed: u64,
    frames_dropped: u64,
    real_time_factor: f64,
    counters: CounterSnapshot,
    /// Underrun events after the first 2 s of playback (steady state).
    steady_state_underrun_events: u64,
    /// Every discontinuity a listener hears (see `CounterSnapshot::audible_glitch_events`):
    /// ring underruns and overruns, output trimmed to bound latency or dropped on a full
    /// speaker ring, and samples the device streams lost, inserted or discarded below the
    /// callbacks.
    audible_glitch_events: u64,
    /// Output dropped because the speaker ring was full (device samples, all channels).
    speaker_overflow_samples: u64,
    /// Output skipped to bring latency back after playback fell behind (24 kHz samples).
    latency_trimmed_samples: u64,
    added_latency_ms: Percentiles,
    callback_allocations: Option<u64>,
    wall_s: f64,
    backend: String,
    /// The echo canceller at the end (`null`: echo cancellation off).
    echo_cancel: Option<EchoStats>,
}

pub fn run(args: ChatArgs) -> anyhow::Result<()> {
    // Ctrl-C stops the conversation and completes the outputs (below); SIGTERM and SIGHUP end
    // the process with no partial file left.
    remove_partials_on(Signals::TermAndHup)?;
    let outputs = given(&[
        ("--record", args.record.as_deref()),
        ("--record-raw-mic", args.record_raw_mic.as_deref()),
        ("--profile", args.profile.as_deref()),
        ("--stats-json", args.stats_json.as_deref()),
    ]);
    // Before the model loads: what cannot be written fails at once. Against the model's files
    // once they are known (below).
    check_outputs(&outputs, &[])?;
    args.live.check()?;
    let model = args.model.resolve()?;
    check_outputs(&outputs, &model.input_paths())?;
    let (model, mut pipeline) = args
        .model
        .load_resolved_model(model, &args.sampling, LIVE_DEFAULTS, 1)?
        .into_pipeline()?;
    pipeline.warm_up().context("warm-up frame")?;
    eprintln!(
        "model: {} ({:?})",
        model.lm_weights_path.display(),
        model.layout
    );
    let devices = args.devices();
    let mut backend = devices.open()?;
    eprintln!("audio: {}", backend.describe());
    let (echo_cancel, echo_why) = args.echo.resolve(backend.output_device_name().as_deref())?;
    eprintln!(
        "echo cancellation: {} ({echo_why})",
        if echo_cancel.is_some() { "on" } else { "off" }
    );
    let jitter_ms = args.jitter_margin_ms();
    // Written by its own thread as the conversation goes: memory stays flat however long.
    let recording = args
        .record
        .as_deref()
        .map(|p| ConversationWav::spawn(p, ConversationWav::QUEUE_FRAMES).map(|r| (p, r)))
        .transpose()
        .context("--record")?;
    let raw_mic = args
        .record_raw_mic
        .as_deref()
        .map(|p| RawMicWav::spawn(p, RawMicWav::QUEUE_FRAMES).map(|r| (p, r)))
        .transpose()
        .context("--record-raw-mic")?;
    let session = start_session_with_mic(
        &mut backend,
        Box::new(pipeline),
        args.live.drop_policy(),
        jitter_ms,
        recording
            .as_ref()
            .map(|(_, r)| Box::new(r.queue()) as Box<dyn FrameRecorder>),
        devices.rings,
        MicProcessing {
            echo_cancel,
            raw_recorder: raw_mic
                .as_ref()
                .map(|(_, r)| Box::new(r.queue()) as Box<dyn FrameRecorder>),
        },
    )?;
    eprintln!(
        "listening{} (Ctrl-C to stop)",
        args.live
            .duration_s
            .map_or(String::new(), |d| format!(" for {d} s"))
    );

    let stop = watch_stop_signals(false)?;
    let mut console = Console::new();
    if outputs.iter().any(|(_, p)| names_stdout(p)) {
        // `--record /dev/stdout`: stdout gets the recording's bytes only.
        console.words = Words::quiet();
    }
    let started = Instant::now();
    let mut steady_underruns_base: Option<u64> = None;
    let mut profile = Profile {
        writer: args
            .profile
            .as_deref()
            .map(ProfileWriter::create)
            .transpose()
            .context("--profile")?,
        error: None,
    };
    let watch = Watch {
        session: &session,
        devices: &devices,
        duration_s: args.live.duration_s,
        stop: &stop,
        started,
    };
    let stop_reason = run_until_stop(&watch, &mut backend, |session| {
        tick(
            session,
            &mut console,
            started,
            &mut steady_underruns_base,
            &mut profile,
        );
        Ok(())
    });

    let stopped = backend.stop();
    session.engine.request_stop();
    let counters = session.counters.clone();
    let report = session.engine.join();
    if console.tty {
        eprint_raw!("\r\x1b[2K{}\n", console.line.trim_start());
    } else {
        console.words.print("\n");
    }
    if let Err(e) = stopped {
        eprintln!("warning: {e}");
    }
    let report = report.context("the engine stopped with an error")?;
    eprintln!("stopped: {}", stop_reason?);
    let profiled = profile.finish(&report.metrics.summary());
    let summarized = finish(
        &args,
        &counters,
        &report,
        &console,
        started,
        steady_underruns_base,
        &backend,
    );
    // Whatever became of the other outputs, the recordings are completed.
    let recorded = recording.map_or(Ok(()), |(path, r)| {
        super::live::finish_wav_recording("--record", path, r, |s| {
            format!("{s:.1} s, you left, Moshi right")
        })
    });
    let raw_recorded = raw_mic.map_or(Ok(()), |(path, r)| {
        super::live::finish_wav_recording("--record-raw-mic", path, r, |s| {
            format!("{s:.1} s, the microphone before echo cancellation")
        })
    });
    profiled
        .and(summarized)
        .and(recorded)
        .and(raw_recorded)
        .and(std::mem::take(&mut console.words).finish())
}

/// Every 20 ms of the conversation: Moshi's words and the frames' records from the engine, the
/// steady-state underrun base, the status line.
fn tick(
    session: &Session,
    console: &mut Console,
    started: Instant,
    steady_base: &mut Option<u64>,
    profile: &mut Profile,
) {
    while let Ok(event) = session.engine.events().try_recv() {
        match event {
            EngineEvent::Frame { record, text, .. } => {
                if let Some(t) = text {
                    console.words(&t);
                }
                profile.write(&record);
                console.frame(record, &session.counters);
            }
            EngineEvent::Dropped { .. } => {}
        }
    }
    // Steady state: underruns counted from 2 s after playback started.
    if steady_base.is_none()
        && session.counters.playback_started.load(Ordering::Relaxed)
        && started.elapsed() > Duration::from_secs(2)
    {
        *steady_base = Some(session.counters.underrun_events.load(Ordering::Relaxed));
    }
    let rtf = console.recent_rtf();
    console.status(&session.counters, rtf, false);
}

fn finish(
    args: &ChatArgs,
    counters: &AudioCounters,
    report: &EngineReport,
    console: &Console,
    started: Instant,
    steady_base: Option<u64>,
    backend: &CpalBackend,
) -> anyhow::Result<()> {
    let c = counters.snapshot();
    let input_rate_hz = backend.input_format().sample_rate_hz;
    let output_format = backend.output_format();
    let output_rate_hz = output_format.sample_rate_hz;
    let summary = report.metrics.summary();
    let stats = ChatStats {
        frames_processed: report.frames_processed,
        frames_dropped: report.frames_dropped,
        real_time_factor: summary.real_time_factor,
        counters: c,
        steady_state_underrun_events: steady_base.map_or(0, |b| c.underrun_events - b),
        audible_glitch_events: c.audible_glitch_events(),
        speaker_overflow_samples: report.speaker_overflow_samples,
        latency_trimmed_samples: report.latency_trimmed_samples,
        added_latency_ms: console.latencies_ms.percentiles(),
        callback_allocations: moshi_runtime::alloc_check::ENABLED
            .then(moshi_runtime::alloc_check::callback_allocations),
        wall_s: started.elapsed().as_secs_f64(),
        backend: backend.describe(),
        echo_cancel: report.echo,
    };
    eprint!("{}", summary.to_table());
    eprintln!(
        "frames: {} processed, {} dropped; underruns: {} ({} in steady state, {:.0} ms of silence); startup silence {:.0} ms; \
         overruns: {} samples; device errors: {}; output trimmed to bound latency: {:.0} ms; \
         output dropped on a full speaker ring: {} times ({:.0} ms)",
        stats.frames_processed,
        stats.frames_dropped,
        c.underrun_events,
        stats.steady_state_underrun_events,
        device_samples_ms(c.underrun_samples, output_format),
        device_samples_ms(c.startup_silence_samples, output_format),
        c.overrun_samples,
        c.device_errors,
        report.latency_trimmed_samples as f64 * 1e3 / SAMPLE_RATE_HZ as f64,
        c.engine_speaker_overflow_events,
        device_samples_ms(report.speaker_overflow_samples, output_format),
    );
    eprintln!(
        "glitches a listener hears: {} (device streams, below the callbacks: input lost {} ({:.0} ms), \
         input inserted {}, output gaps {} ({:.0} ms of silence), output discarded {} ({:.0} ms))",
        stats.audible_glitch_events,
        c.input_lost_events,
        frames_ms(c.input_lost_frames, input_rate_hz),
        c.input_inserted_events,
        c.output_gap_events,
        frames_ms(c.output_gap_frames, output_rate_hz),
        c.output_discarded_events,
        frames_ms(c.output_discarded_frames, output_rate_hz),
    );
    let l = stats.added_latency_ms;
    eprintln!(
        "added latency (device in + input wait + output queue incl. {:.0} ms jitter margin + device out): p50 {:.1} ms, p95 {:.1} ms, max {:.1} ms",
        args.jitter_margin_ms(),
        l.p50,
        l.p95,
        l.max
    );
    if let Some(e) = &stats.echo_cancel {
        eprintln!(
            "echo cancellation: {}; {} after {}; AEC delay {} ms on a reference {:.0} ms behind the speaker queue; \
             {} realignments; last frame {:.2} ms",
            echo_status(e),
            if e.converged_after_frames.is_some() { "first converged" } else { "not converged" },
            e.converged_after_frames
                .map_or("-".into(), |f| format!("{:.1} s", f as f64 * moshi_runtime::FRAME_MS / 1e3)),
            e.aec_delay_ms.map_or("-".into(), |d| d.to_string()),
            e.reference_delay_ms,
            e.realignments,
            e.frame_cost_ms
        );
    }
    if let Some(n) = stats.callback_allocations {
        eprintln!("allocations inside audio callbacks: {n}");
    }
    if summary.real_time_factor > 1.0 || report.frames_dropped > 0 {
        eprintln!(
            "warning: the model is too slow for real time on this machine: real-time factor {:.2} (compute per 80 ms frame / 80 ms); \
             {} input frames were dropped to keep latency bounded",
            summary.real_time_factor, report.frames_dropped
        );
    }
    if let Some(p) = &args.stats_json {
        write_output(p, serde_json::to_string_pretty(&stats)?.as_bytes())
            .context("--stats-json")?;
    }
    Ok(())
}
