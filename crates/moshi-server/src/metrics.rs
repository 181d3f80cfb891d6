//! What `GET /metrics` shows, in Prometheus' text format (version 0.0.4): counters and gauges
//! are atomics bumped where things happen, histograms fixed arrays of atomic buckets, so that
//! counting a frame never allocates, locks or waits; the text is written only when scraped.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// A Prometheus histogram over fixed bucket bounds (upper bounds, ascending; `+Inf` is added).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// One count per bound, plus the `+Inf` bucket; not cumulative (summed when rendered).
    counts: Box<[AtomicU64]>,
    /// Sum of the observed values in millionths (atomics hold integers).
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
        }
    }

    /// Counts one observation (negative values count as 0).
    pub fn observe(&self, value: f64) {
        let value = value.max(0.0);
        let bucket = self
            .bounds
            .iter()
            .position(|&bound| value <= bound)
            .unwrap_or(self.bounds.len());
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add((value * 1e6).round() as u64, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Sum of the observations so far.
    pub fn sum(&self) -> f64 {
        self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        header(out, name, help, "histogram");
        let mut cumulative = 0;
        for (bound, count) in self.bounds.iter().zip(self.counts.iter()) {
            cumulative += count.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        cumulative += self.counts[self.bounds.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(out, "{name}_sum {}", self.sum());
        let _ = writeln!(out, "{name}_count {cumulative}");
    }
}

/// Seconds a batched step may take, around the 80 ms frame budget.
pub const STEP_SECONDS_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.4, 1.0,
];
/// Input frame complete -> its answer queued for the client.
pub const FRAME_LATENCY_SECONDS_BUCKETS: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.12, 0.16, 0.24, 0.32, 0.5, 1.0, 2.0,
];
/// Sessions in one batched step (`--max-sessions` is at most 64).
pub const BATCH_SIZE_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0];

/// Why a session ended, as the `reason` label of `moshi_rs_sessions_ended_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    ClientClosed,
    ConnectionLost,
    BadInput,
    Idle,
    TooSlow,
    NotReading,
    ModelFailed,
    MaxDuration,
    Shutdown,
    /// The server finished what the session asked (a TTS stream said all its text).
    Completed,
}

impl EndReason {
    pub const ALL: [EndReason; 10] = [
        Self::ClientClosed,
        Self::ConnectionLost,
        Self::BadInput,
        Self::Idle,
        Self::TooSlow,
        Self::NotReading,
        Self::ModelFailed,
        Self::MaxDuration,
        Self::Shutdown,
        Self::Completed,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::ClientClosed => "client_closed",
            Self::ConnectionLost => "connection_lost",
            Self::BadInput => "bad_input",
            Self::Idle => "idle",
            Self::TooSlow => "too_slow",
            Self::NotReading => "not_reading",
            Self::ModelFailed => "model_failed",
            Self::MaxDuration => "max_duration",
            Self::Shutdown => "shutdown",
            Self::Completed => "completed",
        }
    }
}

/// Why a session was not started, as the `reason` label of `moshi_rs_sessions_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefuseReason {
    /// Every slot in use.
    Busy,
    /// The server is draining.
    Draining,
    /// Missing or unknown API key.
    Unauthorized,
    /// A browser page from an origin `--allowed-origin` does not list.
    ForbiddenOrigin,
    /// Settings the server refuses (query string).
    BadRequest,
    /// The compute thread has stopped.
    Unavailable,
}

impl RefuseReason {
    pub const ALL: [RefuseReason; 6] = [
        Self::Busy,
        Self::Draining,
        Self::Unauthorized,
        Self::ForbiddenOrigin,
        Self::BadRequest,
        Self::Unavailable,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::Busy => "busy",
            Self::Draining => "draining",
            Self::Unauthorized => "unauthorized",
            Self::ForbiddenOrigin => "forbidden_origin",
            Self::BadRequest => "bad_request",
            Self::Unavailable => "unavailable",
        }
    }
}

/// What the compute thread measures (see [`crate::batch_engine::BatchEngine`]).
#[derive(Debug)]
pub struct EngineMetrics {
    /// Seconds per batched step.
    pub step_seconds: Histogram,
    /// Sessions per batched step.
    pub batch_size: Histogram,
    /// Input frames waiting for the model, all sessions together, after the last step.
    pub waiting_input_frames: AtomicU64,
    /// Bytes held by the KV caches of the live sessions, after the last step.
    pub kv_cache_bytes: AtomicU64,
}

impl Default for EngineMetrics {
    fn default() -> Self {
        Self {
            step_seconds: Histogram::new(STEP_SECONDS_BUCKETS),
            batch_size: Histogram::new(BATCH_SIZE_BUCKETS),
            waiting_input_frames: AtomicU64::new(0),
            kv_cache_bytes: AtomicU64::new(0),
        }
    }
}

/// The server's counters (one set per server).
#[derive(Debug)]
pub struct Metrics {
    pub sessions_started: AtomicU64,
    sessions_ended: [AtomicU64; EndReason::ALL.len()],
    sessions_refused: [AtomicU64; RefuseReason::ALL.len()],
    pub frames_processed: AtomicU64,
    pub input_frames_dropped: AtomicU64,
    pub output_frames_dropped: AtomicU64,
    /// Connections closed at once because `max_connections` were open.
    pub connections_refused: AtomicU64,
    /// Input frame complete -> its answer queued for the client.
    pub frame_latency_seconds: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            sessions_started: AtomicU64::new(0),
            sessions_ended: Default::default(),
            sessions_refused: Default::default(),
            frames_processed: AtomicU64::new(0),
            input_frames_dropped: AtomicU64::new(0),
            output_frames_dropped: AtomicU64::new(0),
            connections_refused: AtomicU64::new(0),
            frame_latency_seconds: Histogram::new(FRAME_LATENCY_SECONDS_BUCKETS),
        }
    }
}

/// What the exposition reads besides [`Metrics`] (gauges known elsewhere).
#[derive(Debug, Clone)]
pub struct Snapshot<'a> {
    pub version: &'a str,
    /// The model's weights file.
    pub model: &'a str,
    /// `/api/chat` or `/api/asr-streaming`.
    pub endpoint: &'a str,
    pub sessions_active: usize,
    pub sessions_max: usize,
    pub draining: bool,
    pub pending_connections: usize,
    pub engine: Option<&'a EngineMetrics>,
}

impl Metrics {
    pub fn session_ended(&self, reason: EndReason) {
        self.sessions_ended[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn session_refused(&self, reason: RefuseReason) {
        self.sessions_refused[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn sessions_ended(&self, reason: EndReason) -> u64 {
        self.sessions_ended[reason as usize].load(Ordering::Relaxed)
    }

    pub fn sessions_refused(&self, reason: RefuseReason) -> u64 {
        self.sessions_refused[reason as usize].load(Ordering::Relaxed)
    }

    /// The exposition text.
    pub fn render(&self, s: &Snapshot<'_>) -> String {
        let mut out = String::with_capacity(8 * 1024);
        header(
            &mut out,
            "moshi_rs_info",
            "The server and its model (value 1).",
            "gauge",
        );
        let _ = writeln!(
            out,
            "moshi_rs_info{{version=\"{}\",model=\"{}\",endpoint=\"{}\"}} 1",
            label_value(s.version),
            label_value(s.model),
            label_value(s.endpoint)
        );
        gauge(
            &mut out,
            "moshi_rs_sessions_active",
            "Sessions open now.",
            s.sessions_active as u64,
        );
        gauge(
            &mut out,
            "moshi_rs_sessions_max",
            "Sessions at once at most (--max-sessions).",
            s.sessions_max as u64,
        );
        gauge(
            &mut out,
            "moshi_rs_draining",
            "1 while the server drains (takes no new session).",
            u64::from(s.draining),
        );
        counter(
            &mut out,
            "moshi_rs_sessions_started_total",
            "Sessions started.",
            load(&self.sessions_started),
        );
        header(
            &mut out,
            "moshi_rs_sessions_ended_total",
            "Sessions ended, by why.",
            "counter",
        );
        for reason in EndReason::ALL {
            let _ = writeln!(
                out,
                "moshi_rs_sessions_ended_total{{reason=\"{}\"}} {}",
                reason.label(),
                self.sessions_ended(reason)
            );
        }
        header(
            &mut out,
            "moshi_rs_sessions_refused_total",
            "Session requests refused, by why.",
            "counter",
        );
        for reason in RefuseReason::ALL {
            let _ = writeln!(
                out,
                "moshi_rs_sessions_refused_total{{reason=\"{}\"}} {}",
                reason.label(),
                self.sessions_refused(reason)
            );
        }
        counter(
            &mut out,
            "moshi_rs_connections_refused_total",
            "Connections closed at once: the connection limit was reached.",
            load(&self.connections_refused),
        );
        gauge(
            &mut out,
            "moshi_rs_pending_connections",
            "Connections not (yet) upgraded to a websocket.",
            s.pending_connections as u64,
        );
        counter(
            &mut out,
            "moshi_rs_frames_processed_total",
            "80 ms frames the model processed, all sessions.",
            load(&self.frames_processed),
        );
        counter(
            &mut out,
            "moshi_rs_input_frames_dropped_total",
            "Input frames dropped because compute fell behind real time.",
            load(&self.input_frames_dropped),
        );
        counter(
            &mut out,
            "moshi_rs_output_frames_dropped_total",
            "Output frames not sent because the client was not reading.",
            load(&self.output_frames_dropped),
        );
        self.frame_latency_seconds.render(
            &mut out,
            "moshi_rs_frame_latency_seconds",
            "Input frame complete to its answer queued for the client.",
        );
        if let Some(engine) = s.engine {
            engine.step_seconds.render(
                &mut out,
                "moshi_rs_step_duration_seconds",
                "Time of one batched model step.",
            );
            engine.batch_size.render(
                &mut out,
                "moshi_rs_batch_size",
                "Sessions in one batched model step.",
            );
            gauge(
                &mut out,
                "moshi_rs_input_queue_frames",
                "Input frames waiting for the model, all sessions.",
                load(&engine.waiting_input_frames),
            );
            gauge(
                &mut out,
                "moshi_rs_kv_cache_bytes",
                "Bytes held by the KV caches of the live sessions.",
                load(&engine.kv_cache_bytes),
            );
        }
        out
    }
}

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn gauge(out: &mut String, name: &str, help: &str, value: u64) {
    header(out, name, help, "gauge");
    let _ = writeln!(out, "{name} {value}");
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    header(out, name, help, "counter");
    let _ = writeln!(out, "{name} {value}");
}

/// A label value escaped as the text format requires (backslash, quote, newline).
fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The value of the sample `name` (with its labels, as written: `name{reason="idle"}`) in an
/// exposition text; for tests and scripts that scrape.
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_is_cumulative_with_sum_and_count() {
        let h = Histogram::new(&[0.1, 1.0]);
        for v in [0.05, 0.1, 0.5, 3.0] {
            h.observe(v);
        }
        let mut out = String::new();
        h.render(&mut out, "x_seconds", "help");
        assert_eq!(
            sample(&out, "x_seconds_bucket{le=\"0.1\"}"),
            Some(2.0),
            "{out}"
        );
        assert_eq!(
            sample(&out, "x_seconds_bucket{le=\"1\"}"),
            Some(3.0),
            "{out}"
        );
        assert_eq!(
            sample(&out, "x_seconds_bucket{le=\"+Inf\"}"),
            Some(4.0),
            "{out}"
        );
        assert_eq!(sample(&out, "x_seconds_count"), Some(4.0), "{out}");
        assert!(
            (sample(&out, "x_seconds_sum").unwrap() - 3.65).abs() < 1e-9,
            "{out}"
        );
        assert!(out.contains("# TYPE x_seconds histogram"), "{out}");
    }

    #[test]
    fn the_text_names_every_reason_and_escapes_labels() {
        let m = Metrics::default();
        m.session_ended(EndReason::Idle);
        m.session_refused(RefuseReason::Busy);
        m.session_refused(RefuseReason::Busy);
        let engine = EngineMetrics::default();
        let text = m.render(&Snapshot {
            version: "0.1",
            model: "a\"b\\c",
            endpoint: "/api/chat",
            sessions_active: 1,
            sessions_max: 2,
            draining: false,
            pending_connections: 0,
            engine: Some(&engine),
        });
        assert_eq!(
            sample(&text, "moshi_rs_sessions_ended_total{reason=\"idle\"}"),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, "moshi_rs_sessions_refused_total{reason=\"busy\"}"),
            Some(2.0)
        );
        assert_eq!(sample(&text, "moshi_rs_sessions_active"), Some(1.0));
        assert!(text.contains(r#"model="a\"b\\c""#), "{text}");
        for reason in EndReason::ALL {
            assert!(text.contains(&format!("reason=\"{}\"", reason.label())));
        }
        // Every sample belongs to a family declared with HELP and TYPE.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| {
                    name.strip_suffix(s)
                        .filter(|f| text.contains(&format!("# TYPE {f} histogram")))
                })
                .unwrap_or(name);
            assert!(text.contains(&format!("# TYPE {family} ")), "{line}");
        }
    }
}
