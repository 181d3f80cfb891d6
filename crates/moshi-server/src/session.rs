//! One websocket connection = one conversation: open an engine session (or answer "busy"),
//! send the handshake and the metadata, then until the end: client Ogg/Opus -> 1920-sample
//! frames -> the engine, and the engine's frames -> Ogg/Opus + text -> the client. Every way a
//! session can end (the client closes or vanishes, bad input, silence, a client that does not
//! read, the model failing, the server stopping) ends only this session, with a log line and,
//! while the socket is open, a kind-5 message saying why.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{Message, WebSocket};
use futures_util::stream::SplitStream;
use futures_util::StreamExt;
use moshi_runtime::{FRAME_MS, FRAME_SAMPLES};
use serde_json::{json, Map, Value};

use crate::app::{AppState, ClientAddr};
use crate::connection::{close_code, incoming, AudioPace, Incoming, Liveness, Outbox, SessionEnd};
use crate::metrics::RefuseReason;
use crate::module::Module;
use crate::ogg_opus::{OggOpusReader, OggOpusWriter, OpusPacketing, PreSkip};
use crate::protocol::{self, ClientMessage};
use crate::query::SessionRequest;
use crate::recorder::RecorderThread;
use crate::session_engine::{EngineSession, ProcessedFrame, SessionEvent};

/// Frames waiting for `--record`'s thread (20 s of audio) before further ones are left out of
/// the recording.
const RECORD_QUEUE_FRAMES: usize = 250;

/// Metadata updates (dropped-frame counts) at most this often.
const METADATA_EVERY: Duration = Duration::from_secs(1);

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
    peer: ClientAddr,
    app: Arc<AppState>,
    module: Arc<Module>,
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
    liveness: Liveness,
}

/// Runs one connection to its end: `opened` is the session's settings and its engine slot
/// (taken before the upgrade), or why its query string was refused.
pub async fn run(
    socket: WebSocket,
    app: Arc<AppState>,
    module: Arc<Module>,
    opened: Result<(SessionRequest, EngineSession), String>,
    peer: ClientAddr,
) {
    let _running = app.session_started();
    let id = app.next_session_id();
    let (sink, stream) = socket.split();
    let outbox = Outbox::spawn(sink, app.limits.outbox_messages);
    let (request, engine) = match opened {
        Ok(r) => r,
        Err(e) => {
            module.metrics.session_refused(RefuseReason::BadRequest);
            tracing::warn!(session = id, %peer, "refused: {e}");
            outbox
                .close(Some(protocol::error(&e)), close_code::POLICY, &e)
                .await;
            return;
        }
    };
    module
        .metrics
        .sessions_started
        .fetch_add(1, Ordering::Relaxed);
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
        metadata: module.metadata(&request, id),
        app: app.clone(),
        module: module.clone(),
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
        liveness: Liveness::new(now),
    };
    tracing::info!(
        session = id,
        %peer,
        module = module.path,
        active = module.engine.active_sessions(),
        max = module.engine.max_sessions(),
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
        let max_length = max_session_end(self.started, &limits);
        tokio::pin!(max_length);
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
                        let new = total_frames.saturating_sub(self.stats.input_frames_dropped);
                        self.module.metrics.input_frames_dropped.fetch_add(new, Ordering::Relaxed);
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
                end = &mut max_length => return end,
                _ = check.tick() => {}
            }
            if let Err(e) = self
                .pace
                .check_not_too_slow(self.started.elapsed(), Instant::now())
            {
                return SessionEnd::TooSlow(e);
            }
            if let Err(end) = self
                .liveness
                .check(&mut self.outbox, limits.not_reading_timeout)
            {
                return end;
            }
            self.maybe_send_metadata();
        }
    }

    fn client_message(
        &mut self,
        message: Option<Result<Message, axum::Error>>,
    ) -> Result<(), SessionEnd> {
        let max = self.app.limits.max_message_bytes;
        let bytes = match incoming(message, max, &mut self.liveness)? {
            Incoming::Binary(b) => b,
            Incoming::Control => return Ok(()),
            Incoming::Text(_) => {
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
        let metrics = &self.module.metrics;
        metrics.frames_processed.fetch_add(1, Ordering::Relaxed);
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
        let response_s = frame.input_complete_at.elapsed().as_secs_f64();
        metrics.frame_latency_seconds.observe(response_s);
        let response_ms = response_s * 1e3;
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
                metrics
                    .output_frames_dropped
                    .fetch_add(1, Ordering::Relaxed);
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
        let dropped = self.engine.input.dropped_frames();
        let unreported = dropped.saturating_sub(self.stats.input_frames_dropped);
        self.module
            .metrics
            .input_frames_dropped
            .fetch_add(unreported, Ordering::Relaxed);
        self.module.metrics.session_ended(end.metric_reason());
        self.stats.input_frames_dropped = self.stats.input_frames_dropped.max(dropped);
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

/// Resolves to [`SessionEnd::MaxDuration`] once the session is `--max-session-s` old (never
/// without that limit).
pub(crate) async fn max_session_end(started: Instant, limits: &crate::app::Limits) -> SessionEnd {
    match limits.max_session {
        Some(max) => {
            tokio::time::sleep_until((started + max).into()).await;
            SessionEnd::MaxDuration(max)
        }
        None => std::future::pending().await,
    }
}
