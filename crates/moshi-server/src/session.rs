//! One websocket connection = one conversation: open an engine session (or answer "busy"),
//! send the handshake and the metadata, then until the end: client Ogg/Opus -> 1920-sample
//! frames -> the engine, and the engine's frames -> Ogg/Opus + text -> the client. Every way a
//! session can end (the client closes or vanishes, bad input, silence, a client that does not
//! read, the model failing, the server stopping) ends only this session, with a log line and,
//! while the socket is open, a kind-5 message saying why.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use moshi_runtime::{FRAME_MS, FRAME_SAMPLES};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::app::AppState;
use crate::ogg_opus::{OggOpusReader, OggOpusWriter, OpusPacketing, PreSkip};
use crate::protocol::{self, ClientMessage};
use crate::query::SessionRequest;
use crate::recorder::RecorderThread;
use crate::session_engine::{EngineSession, ProcessedFrame, SessionEvent};

/// Websocket close codes (RFC 6455 section 7.4.1).
mod close_code {
    pub const NORMAL: u16 = 1000;
    pub const GOING_AWAY: u16 = 1001;
    pub const INVALID_PAYLOAD: u16 = 1007;
    pub const POLICY: u16 = 1008;
    pub const TOO_BIG: u16 = 1009;
    pub const INTERNAL: u16 = 1011;
    pub const TRY_AGAIN_LATER: u16 = 1013;
}

/// How long the last messages (an error, the close frame) may take to leave.
const CLOSING_GRACE: Duration = Duration::from_secs(2);

/// Frames waiting for `--record`'s thread (20 s of audio) before further ones are left out of
/// the recording.
const RECORD_QUEUE_FRAMES: usize = 250;

/// Metadata updates (dropped-frame counts) at most this often.
const METADATA_EVERY: Duration = Duration::from_secs(1);

/// A websocket ping this often: a client that reads answers it (browsers and websocket
/// libraries do so by themselves); one that does not is found out whatever the kernel buffers.
const PING_EVERY: Duration = Duration::from_secs(1);

/// Why a session ended.
#[derive(Debug)]
enum SessionEnd {
    /// The client closed the websocket.
    ClientClosed,
    /// The connection failed or vanished.
    ConnectionLost(String),
    TooLarge(String),
    /// The client broke the protocol (empty message, text frame, bad Ogg/Opus, too much audio).
    BadInput(String),
    /// A text or close frame that is not UTF-8 (RFC 6455 section 8.1: close code 1007).
    NotUtf8(String),
    Idle(Duration),
    /// The client sent less than `min_audio_speed` x real time over the window.
    TooSlow(String),
    NotReading(Duration),
    Engine(String),
    Shutdown,
}

impl SessionEnd {
    /// The kind-5 sentence for the client, if it should get one.
    fn client_message(&self) -> Option<String> {
        match self {
            Self::ClientClosed | Self::ConnectionLost(_) | Self::NotReading(_) => None,
            Self::TooLarge(m) | Self::BadInput(m) | Self::TooSlow(m) | Self::NotUtf8(m) => {
                Some(format!("{m}; closing the session"))
            }
            Self::Idle(d) => Some(format!(
                "no audio from the client for {} s; closing the session",
                d.as_secs()
            )),
            Self::Engine(e) => Some(format!("the model failed: {e}; closing the session")),
            Self::Shutdown => Some("the server is shutting down".into()),
        }
    }

    fn close_code(&self) -> u16 {
        match self {
            Self::ClientClosed | Self::ConnectionLost(_) | Self::Idle(_) => close_code::NORMAL,
            Self::TooLarge(_) => close_code::TOO_BIG,
            Self::NotUtf8(_) => close_code::INVALID_PAYLOAD,
            Self::BadInput(_) | Self::TooSlow(_) | Self::NotReading(_) => close_code::POLICY,
            Self::Engine(_) => close_code::INTERNAL,
            Self::Shutdown => close_code::GOING_AWAY,
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::ClientClosed => "the client closed the connection".into(),
            Self::ConnectionLost(e) => format!("the connection was lost: {e}"),
            Self::TooLarge(m) | Self::BadInput(m) | Self::NotUtf8(m) => format!("bad input: {m}"),
            Self::TooSlow(m) => format!("audio too slow: {m}"),
            Self::Idle(d) => format!("no audio for {} s", d.as_secs()),
            Self::NotReading(d) => format!(
                "the client read nothing for {} s (no answer to a ping, or its queue full)",
                d.as_secs()
            ),
            Self::Engine(e) => format!("the model failed: {e}"),
            Self::Shutdown => "server shutdown".into(),
        }
    }
}

/// The sending half of the websocket on its own task behind a bounded queue: a client that does
/// not read fills the queue; then messages are dropped (and counted), never buffered without
/// bound, and the receiving side is never held up.
struct Outbox {
    tx: mpsc::Sender<Message>,
    task: JoinHandle<()>,
    /// Since when the queue has been full (a client not reading).
    full_since: Option<Instant>,
    dropped_messages: u64,
}

impl Outbox {
    fn spawn(mut sink: SplitSink<WebSocket, Message>, capacity: usize) -> Self {
        let (tx, mut rx) = mpsc::channel::<Message>(capacity.max(2));
        let task = tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                let is_close = matches!(m, Message::Close(_));
                if sink.send(m).await.is_err() || is_close {
                    // Once the client's close has been read, the websocket refuses every further
                    // message, a second close frame included, but still owes its automatic
                    // reply: flush it, then close. (On a dead connection these fail at once; on
                    // a client that does not read, the session's close aborts the task.)
                    let _ = sink.flush().await;
                    let _ = sink.close().await;
                    break;
                }
            }
        });
        Self {
            tx,
            task,
            full_since: None,
            dropped_messages: 0,
        }
    }

    /// Room for `n` more messages.
    fn has_room(&self, n: usize) -> bool {
        self.tx.capacity() >= n
    }

    /// Queues a protocol message; drops it (counted) if the queue is full. Returns whether it
    /// was queued.
    fn push(&mut self, bytes: Vec<u8>) -> bool {
        self.push_message(Message::Binary(bytes.into()))
    }

    fn push_message(&mut self, message: Message) -> bool {
        match self.tx.try_send(message) {
            Ok(()) => {
                self.full_since = None;
                true
            }
            Err(_) => {
                self.note_full();
                false
            }
        }
    }

    fn note_full(&mut self) {
        self.dropped_messages += 1;
        self.full_since.get_or_insert_with(Instant::now);
    }

    /// How long the client has not been reading (the queue full), if it is not.
    fn stalled_for(&self) -> Option<Duration> {
        self.full_since.map(|t| t.elapsed())
    }

    /// Sends `last` (if any) and a close frame, waits up to [`CLOSING_GRACE`] for them to leave,
    /// then stops the task (a client that does not read cannot hold the session).
    async fn close(self, last: Option<Vec<u8>>, code: u16, reason: &str) {
        let deadline = tokio::time::Instant::now() + CLOSING_GRACE;
        if let Some(bytes) = last {
            let _ = tokio::time::timeout_at(deadline, self.tx.send(Message::Binary(bytes.into())))
                .await;
        }
        let frame = CloseFrame {
            code,
            reason: truncate_utf8(reason, 120).into(),
        };
        let _ = tokio::time::timeout_at(deadline, self.tx.send(Message::Close(Some(frame)))).await;
        drop(self.tx);
        let mut task = self.task;
        if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
            task.abort();
        }
    }
}

/// At most `max` bytes of `s`, cut at a character boundary (close reasons are limited to 123).
fn truncate_utf8(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// The pace of a client's audio: a token bucket bounds it from above (sustained
/// `max_audio_speed` x real time, bursts of `max_audio_burst`), a sliding window from below
/// (`min_audio_speed` x real time over `min_audio_window`).
#[derive(Debug)]
struct AudioPace {
    max_speed: f64,
    burst_s: f64,
    /// Seconds of audio the client may still send at once.
    tokens_s: f64,
    refilled: Instant,
    min_speed: f64,
    window: Duration,
    /// Audio received in the window: (start of a bin of [`AudioPace::BIN`], seconds received).
    recent: std::collections::VecDeque<(Instant, f64)>,
}

impl AudioPace {
    /// Arrivals closer than this share one bin (bounds the window's memory).
    const BIN: Duration = Duration::from_millis(100);

    fn new(limits: &crate::app::Limits, now: Instant) -> Self {
        let burst_s = limits.max_audio_burst.as_secs_f64();
        Self {
            max_speed: limits.max_audio_speed,
            burst_s,
            tokens_s: burst_s,
            refilled: now,
            min_speed: limits.min_audio_speed,
            window: limits.min_audio_window,
            recent: std::collections::VecDeque::new(),
        }
    }

    /// Counts `received_s` seconds of audio arriving at `now`; an error sentence when the
    /// client is beyond the sustained pace plus the burst.
    fn received(&mut self, received_s: f64, now: Instant) -> Result<(), String> {
        let elapsed_s = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        self.tokens_s = (self.tokens_s + elapsed_s * self.max_speed).min(self.burst_s);
        match self.recent.back_mut() {
            Some((bin, seconds)) if now.saturating_duration_since(*bin) < Self::BIN => {
                *seconds += received_s
            }
            _ => self.recent.push_back((now, received_s)),
        }
        self.tokens_s -= received_s;
        if self.tokens_s < 0.0 {
            return Err(format!(
                "audio faster than real time: a client sends audio at the pace it is spoken (at most {}x sustained, bursts of {} s)",
                self.max_speed, self.burst_s
            ));
        }
        Ok(())
    }

    /// An error sentence when, `age` into the session (at `now`), the last window held less
    /// than `min_speed` x real time of audio.
    fn check_not_too_slow(&mut self, age: Duration, now: Instant) -> Result<(), String> {
        while self
            .recent
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) > self.window)
        {
            self.recent.pop_front();
        }
        if age < self.window || self.window.is_zero() {
            return Ok(());
        }
        // Folded from +0.0: an empty f64 `sum()` is -0.0, which would print as "-0.0 s".
        let received_s = self.recent.iter().fold(0.0, |total, (_, s)| total + s);
        let window_s = self.window.as_secs_f64();
        if received_s < self.min_speed * window_s {
            return Err(format!(
                "{received_s:.1} s of audio in the last {window_s:.0} s: a client sends audio at the pace it is spoken (at least {}x real time)",
                self.min_speed
            ));
        }
        Ok(())
    }
}

/// Counters of one session.
#[derive(Debug, Default)]
struct SessionStats {
    frames_processed: u64,
    /// Input frames dropped because compute fell behind real time (counted apart, as `chat`
    /// does: the model did not hear them, the client heard nothing wrong).
    input_frames_dropped: u64,
    /// Output frames not sent because the client was not reading: each one a skip in what the
    /// client plays.
    output_frames_dropped: u64,
    /// Output frames queued more than one frame period (80 ms) after their input frame was
    /// complete: a client whose jitter buffer is shorter than that ran dry before them.
    late_output_frames: u64,
    compute_ms_total: f64,
    /// Input frame complete -> its answer queued for the client (queue wait + compute + encode).
    response_ms_total: f64,
    response_ms_max: f64,
    audio_in_samples: u64,
    /// Client messages of kinds a session does not use, or the protocol does not define.
    messages_discarded: u64,
}

impl SessionStats {
    /// Discontinuities in the audio the client was sent (as `chat`'s `audible_glitch_events`
    /// counts those of its speaker): frames the server did not send.
    fn audible_glitch_events(&self) -> u64 {
        self.output_frames_dropped
    }

    fn mean(total: f64, count: u64) -> f64 {
        if count > 0 {
            total / count as f64
        } else {
            0.0
        }
    }

    /// The counters as the metadata's `moshi_rs_stats` (and `--record`'s `-stats.json`).
    fn to_json(&self, messages_not_sent: u64) -> Value {
        let s = self;
        json!({
            "frames_processed": s.frames_processed,
            "input_frames_dropped": s.input_frames_dropped,
            "output_frames_dropped": s.output_frames_dropped,
            "audible_glitch_events": s.audible_glitch_events(),
            "late_output_frames": s.late_output_frames,
            "messages_not_sent": messages_not_sent,
            "messages_discarded": s.messages_discarded,
            "compute_ms_per_frame": SessionStats::mean(s.compute_ms_total, s.frames_processed),
            "response_ms_mean": SessionStats::mean(s.response_ms_total, s.frames_processed),
            "response_ms_max": s.response_ms_max,
        })
    }
}

struct Session {
    id: u64,
    peer: SocketAddr,
    app: Arc<AppState>,
    engine: EngineSession,
    reader: OggOpusReader,
    writer: OggOpusWriter,
    pcm_in: Vec<f32>,
    outbox: Outbox,
    recorder: Option<RecorderThread>,
    stats: SessionStats,
    metadata: Map<String, Value>,
    metadata_dirty: bool,
    last_metadata: Instant,
    stats_every: Option<Duration>,
    started: Instant,
    last_audio: Instant,
    pace: AudioPace,
    /// When the ping now unanswered was queued.
    ping_sent: Option<Instant>,
    last_pong: Instant,
}

/// Runs one connection to its end.
pub async fn run(
    socket: WebSocket,
    app: Arc<AppState>,
    request: Result<SessionRequest, String>,
    peer: SocketAddr,
) {
    let _running = app.session_started();
    let id = app.next_session_id();
    let (sink, stream) = socket.split();
    let outbox = Outbox::spawn(sink, app.limits.outbox_messages);
    let request = match request {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(session = id, %peer, "refused: {e}");
            outbox
                .close(Some(protocol::error(&e)), close_code::POLICY, &e)
                .await;
            return;
        }
    };
    let engine = match app.engine.open(request.settings.clone()) {
        Ok(e) => e,
        Err(e) => {
            let sentence = e.to_string();
            tracing::warn!(session = id, %peer, "refused: {sentence}");
            outbox
                .close(
                    Some(protocol::error(&sentence)),
                    close_code::TRY_AGAIN_LATER,
                    &sentence,
                )
                .await;
            return;
        }
    };
    let writer = match OggOpusWriter::new(id as u32, OpusPacketing::SERVER) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(session = id, "cannot start the Opus encoder: {e}");
            outbox
                .close(
                    Some(protocol::error("the server cannot encode audio")),
                    close_code::INTERNAL,
                    "internal error",
                )
                .await;
            return;
        }
    };
    let recorder = match &app.record_dir {
        Some(dir) => match RecorderThread::spawn(dir, &app.run_tag, id, RECORD_QUEUE_FRAMES) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::error!(
                    session = id,
                    "--record: cannot start its thread: {e}; this session is not recorded"
                );
                None
            }
        },
        None => None,
    };
    let now = Instant::now();
    let mut session = Session {
        id,
        peer,
        metadata: app.metadata(&request, id),
        app: app.clone(),
        engine,
        // Frames end on the client's packet boundaries: see PreSkip::Keep.
        reader: OggOpusReader::new(PreSkip::Keep),
        writer,
        pcm_in: Vec::with_capacity(4 * FRAME_SAMPLES),
        outbox,
        recorder,
        stats: SessionStats::default(),
        metadata_dirty: false,
        last_metadata: now,
        stats_every: request.stats_every_s.map(Duration::from_secs_f64),
        started: now,
        last_audio: now,
        pace: AudioPace::new(&app.limits, now),
        ping_sent: None,
        last_pong: now,
    };
    tracing::info!(
        session = id,
        %peer,
        active = app.engine.active_sessions(),
        max = app.engine.max_sessions(),
        ignored = ?request.ignored,
        "session started"
    );
    session.outbox.push(protocol::handshake());
    session
        .outbox
        .push(protocol::metadata(&Value::Object(session.metadata.clone())));
    let end = session.converse(stream).await;
    session.finish(end).await;
}

impl Session {
    async fn converse(&mut self, mut stream: SplitStream<WebSocket>) -> SessionEnd {
        let limits = self.app.limits.clone();
        let mut shutdown = self.app.shutdown_signal();
        let mut check = tokio::time::interval(Duration::from_millis(200));
        loop {
            let idle_deadline = self.last_audio + limits.idle_timeout;
            tokio::select! {
                message = stream.next() => {
                    if let Err(end) = self.client_message(message) {
                        return end;
                    }
                }
                event = self.engine.events.recv() => match event {
                    Some(SessionEvent::Frame(frame)) => self.frame(frame),
                    Some(SessionEvent::InputDropped { total_frames }) => {
                        self.stats.input_frames_dropped = total_frames;
                        self.metadata_dirty = true;
                        tracing::debug!(session = self.id, total_frames, "input frames dropped: compute is behind real time");
                    }
                    Some(SessionEvent::Failed(e)) => return SessionEnd::Engine(e),
                    None => return SessionEnd::Engine("the model thread stopped".into()),
                },
                _ = tokio::time::sleep_until(idle_deadline.into()) => {
                    return SessionEnd::Idle(limits.idle_timeout);
                }
                _ = shutdown.changed() => return SessionEnd::Shutdown,
                _ = check.tick() => {}
            }
            if let Err(e) = self
                .pace
                .check_not_too_slow(self.started.elapsed(), Instant::now())
            {
                return SessionEnd::TooSlow(e);
            }
            if let Some(stalled) = self.outbox.stalled_for() {
                if stalled >= limits.not_reading_timeout {
                    return SessionEnd::NotReading(limits.not_reading_timeout);
                }
            }
            match self.ping_sent {
                Some(sent) if sent.elapsed() >= limits.not_reading_timeout => {
                    return SessionEnd::NotReading(limits.not_reading_timeout);
                }
                Some(_) => {}
                None if self.last_pong.elapsed() >= PING_EVERY => {
                    let payload = axum::body::Bytes::from_static(b"moshi-rs");
                    if self.outbox.push_message(Message::Ping(payload)) {
                        self.ping_sent = Some(Instant::now());
                    }
                }
                None => {}
            }
            if self.outbox.task.is_finished() {
                return SessionEnd::ConnectionLost("the client stopped receiving".into());
            }
            self.maybe_send_metadata();
        }
    }

    fn client_message(
        &mut self,
        message: Option<Result<Message, axum::Error>>,
    ) -> Result<(), SessionEnd> {
        let bytes = match message {
            None => return Err(SessionEnd::ConnectionLost("the connection closed".into())),
            Some(Err(e)) => return Err(transport_error(e, self.app.limits.max_message_bytes)),
            Some(Ok(Message::Binary(b))) => b,
            Some(Ok(Message::Close(_))) => return Err(SessionEnd::ClientClosed),
            Some(Ok(Message::Pong(_))) => {
                self.ping_sent = None;
                self.last_pong = Instant::now();
                return Ok(());
            }
            Some(Ok(Message::Ping(_))) => return Ok(()),
            Some(Ok(Message::Text(_))) => {
                return Err(SessionEnd::BadInput(
                    "text websocket messages are not part of the protocol: send binary messages whose first byte is the kind (1 = audio)".into(),
                ))
            }
        };
        match protocol::parse_client_message(&bytes) {
            Ok(ClientMessage::Audio(ogg)) => self.audio(ogg),
            Ok(ClientMessage::Unused(kind)) => {
                self.stats.messages_discarded += 1;
                tracing::debug!(session = self.id, kind = kind.name(), "message discarded");
                Ok(())
            }
            Ok(ClientMessage::UnknownKind(kind)) => {
                self.stats.messages_discarded += 1;
                tracing::debug!(session = self.id, kind, "message of unknown kind discarded");
                Ok(())
            }
            Err(e) => Err(SessionEnd::BadInput(e.to_string())),
        }
    }

    fn audio(&mut self, ogg: &[u8]) -> Result<(), SessionEnd> {
        let limits = &self.app.limits;
        let before = self.pcm_in.len();
        self.reader
            .push(ogg, &mut self.pcm_in, limits.max_audio_per_message_samples)
            .map_err(|e| SessionEnd::BadInput(format!("audio: {e}")))?;
        let new_samples = (self.pcm_in.len() - before) as u64;
        self.stats.audio_in_samples += new_samples;
        if new_samples > 0 {
            let now = Instant::now();
            self.last_audio = now;
            let received_s = new_samples as f64 / moshi_runtime::SAMPLE_RATE_HZ as f64;
            // Faster than real time beyond a burst: a client flooding the server with audio.
            self.pace
                .received(received_s, now)
                .map_err(SessionEnd::BadInput)?;
        }
        let whole = self.pcm_in.len() / FRAME_SAMPLES * FRAME_SAMPLES;
        for frame in self.pcm_in[..whole].chunks_exact(FRAME_SAMPLES) {
            self.engine.input.push(frame.to_vec());
        }
        self.pcm_in.drain(..whole);
        Ok(())
    }

    fn frame(&mut self, frame: ProcessedFrame) {
        let index = self.stats.frames_processed;
        self.stats.frames_processed += 1;
        self.stats.compute_ms_total += frame.compute_ms;
        // Encode only what can be sent: the Ogg stream stays continuous when a frame is dropped.
        let pages = if self.outbox.has_room(1) {
            match self.writer.push(&frame.pcm) {
                Ok(pages) => Some(pages),
                Err(e) => {
                    tracing::error!(session = self.id, "Opus encoder: {e}");
                    None
                }
            }
        } else {
            self.outbox.note_full();
            None
        };
        let response_ms = frame.input_complete_at.elapsed().as_secs_f64() * 1e3;
        self.stats.response_ms_total += response_ms;
        self.stats.response_ms_max = self.stats.response_ms_max.max(response_ms);
        if response_ms > FRAME_MS {
            self.stats.late_output_frames += 1;
        }
        match &pages {
            Some(p) if !p.is_empty() => {
                self.outbox.push(protocol::audio(p));
            }
            Some(_) => {}
            None => {
                self.stats.output_frames_dropped += 1;
                self.metadata_dirty = true;
            }
        }
        if let Some(text) = &frame.text {
            tracing::debug!(session = self.id, text = %text, "text");
            self.outbox.push(protocol::text(text));
        }
        if let Some(rec) = &mut self.recorder {
            if !rec.frame(index, frame, pages) {
                // The thread logged why.
                self.recorder = None;
            }
        }
    }

    fn maybe_send_metadata(&mut self) {
        let since = self.last_metadata.elapsed();
        let periodic = self.stats_every.is_some_and(|every| since >= every);
        if !(periodic || self.metadata_dirty && since >= METADATA_EVERY) {
            return;
        }
        let lost_audio = self.metadata_dirty;
        self.metadata_dirty = false;
        self.last_metadata = Instant::now();
        let counters = self.stats.to_json(self.outbox.dropped_messages);
        self.metadata.insert("moshi_rs_stats".into(), counters);
        if !self
            .outbox
            .push(protocol::metadata(&Value::Object(self.metadata.clone())))
        {
            self.metadata_dirty = lost_audio;
        }
        if lost_audio {
            tracing::info!(
                session = self.id,
                input_frames_dropped = self.stats.input_frames_dropped,
                output_frames_dropped = self.stats.output_frames_dropped,
                "the session is losing audio: compute behind real time, or a client not reading"
            );
        }
    }

    async fn finish(mut self, end: SessionEnd) {
        self.stats.input_frames_dropped = self
            .stats
            .input_frames_dropped
            .max(self.engine.input.dropped_frames());
        // Free the model slot first: the next conversation can start while this one closes.
        drop(self.engine);
        if let Some(rec) = self.recorder.take() {
            let mut stats = self.stats.to_json(self.outbox.dropped_messages);
            stats["end"] = Value::String(end.describe());
            stats["duration_s"] = json!(self.started.elapsed().as_secs_f64());
            if rec.frames_dropped() > 0 {
                tracing::warn!(
                    session = self.id,
                    frames = rec.frames_dropped(),
                    "--record: frames left out of the recording (the disk was behind)"
                );
            }
            rec.finish(stats).await;
        }
        let s = &self.stats;
        let line = format!(
            "session ended: {}; {:.1} s, {} frames processed, {} input frames dropped, {} output frames dropped \
             (glitches the client hears: {}), {} messages not sent, {} answers later than 80 ms, \
             response {:.1} ms mean / {:.1} ms max, {:.1} ms compute per frame",
            end.describe(),
            self.started.elapsed().as_secs_f64(),
            s.frames_processed,
            s.input_frames_dropped,
            s.output_frames_dropped,
            s.audible_glitch_events(),
            self.outbox.dropped_messages,
            s.late_output_frames,
            SessionStats::mean(s.response_ms_total, s.frames_processed),
            s.response_ms_max,
            SessionStats::mean(s.compute_ms_total, s.frames_processed),
        );
        match end {
            SessionEnd::ClientClosed | SessionEnd::Shutdown => {
                tracing::info!(session = self.id, peer = %self.peer, "{line}")
            }
            _ => tracing::warn!(session = self.id, peer = %self.peer, "{line}"),
        }
        let message = end.client_message();
        let reason = message.clone().unwrap_or_else(|| end.describe());
        self.outbox
            .close(
                message.map(|m| protocol::error(&m)),
                end.close_code(),
                &reason,
            )
            .await;
    }
}

/// A read error as a session end; an oversized message gets its own sentence.
fn transport_error(e: axum::Error, max_message_bytes: usize) -> SessionEnd {
    use tungstenite::error::{CapacityError, ProtocolError};
    match e.into_inner().downcast::<tungstenite::Error>() {
        Ok(err) => match *err {
            tungstenite::Error::Capacity(CapacityError::MessageTooLong { size, .. }) => {
                SessionEnd::TooLarge(format!(
                    "message of {size} bytes: at most {max_message_bytes} accepted"
                ))
            }
            tungstenite::Error::Capacity(c) => SessionEnd::TooLarge(c.to_string()),
            tungstenite::Error::Protocol(ProtocolError::ResetWithoutClosingHandshake) => {
                SessionEnd::ConnectionLost("the client vanished without closing".into())
            }
            tungstenite::Error::Protocol(p) => SessionEnd::BadInput(format!("websocket: {p}")),
            // Before, this fell through to "the connection was lost" with close code 1000.
            tungstenite::Error::Utf8(e) => SessionEnd::NotUtf8(format!(
                "a websocket text or close frame that is not valid UTF-8 ({e})"
            )),
            other => SessionEnd::ConnectionLost(other.to_string()),
        },
        Err(other) => SessionEnd::ConnectionLost(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue #41 item 18: a window without audio says "0.0 s of audio", never "-0.0 s".
    #[test]
    fn a_window_without_audio_is_zero_seconds_not_minus_zero() {
        let limits = crate::app::Limits::default();
        let start = Instant::now();
        let mut pace = AudioPace::new(&limits, start);
        let age = limits.min_audio_window + Duration::from_secs(1);
        let e = pace.check_not_too_slow(age, start + age).unwrap_err();
        assert!(e.starts_with("0.0 s of audio"), "{e}");
    }
}
