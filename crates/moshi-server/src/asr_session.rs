//! One websocket connection of `/api/asr-streaming` = one transcription stream, as Kyutai's
//! `moshi-server` serves it: open an engine session (or answer "no free channels" and close),
//! send `Ready`, then until the end: the client's audio -> 1920-sample frames -> the engine, and
//! per processed frame a `Step` (voice activity), the `Word` / `EndWord` events its text token
//! completes, and each `Marker` once the audio sent before it plus the model's delay has been
//! processed.
//!
//! Audio may come faster than real time (Kyutai's scripts' `--rtf`): it is taken at the pace
//! the model processes it. While a few frames wait for the model, or the client does not read
//! what it is sent, the socket is not read (TCP's back-pressure on the client) and the idle and
//! pace rules are paused. A bad client ends only its own stream, with an `Error` saying why.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{Message, WebSocket};
use futures_util::stream::SplitStream;
use futures_util::StreamExt;
use moshi_model::word_events::{WordEvent, WordEvents};
use moshi_runtime::pipeline::MoshiModel;
use moshi_runtime::{FRAME_SAMPLES, SAMPLE_RATE_HZ};

use crate::app::{AppState, ClientAddr};
use crate::asr_protocol::{AsrClientMessage, AsrServerMessage};
use crate::connection::{close_code, incoming, AudioPace, Incoming, Liveness, Outbox, SessionEnd};
use crate::metrics::RefuseReason;
use crate::module::Module;
use crate::ogg_opus::{OggOpusReader, PreSkip};
use crate::session_engine::{
    EngineSession, OpenError, ProcessedFrame, SessionEvent, SessionSettings,
};

/// Frames waiting for the model before the socket is no longer read.
const MAX_WAITING_FRAMES: usize = 8;

/// Messages the outbox must have room for before the socket is read again (a frame makes at
/// most a `Step`, a `Word`, an `EndWord` and its markers).
const OUTBOX_HEADROOM: usize = 48;

/// Markers waiting for their audio at most.
const MAX_PENDING_MARKERS: usize = 1024;

/// What moshi-server answers when every slot is taken (clients may look for it).
pub const NO_FREE_CHANNELS: &str = "no free channels";

/// The speech-to-text model behind `/api/asr-streaming`: what each stream needs to turn text
/// tokens into word events and to know when a marker's audio is transcribed.
#[derive(Clone)]
pub struct AsrModel {
    model: Arc<MoshiModel>,
    words: WordEvents,
    /// Frames after the last audio before its text is out (`ceil(audio_delay_seconds x 12.5)`).
    delay_frames: u64,
}

impl AsrModel {
    pub fn new(model: Arc<MoshiModel>) -> Self {
        let frame_rate = SAMPLE_RATE_HZ as f64 / FRAME_SAMPLES as f64;
        let cfg = model.lm_config();
        let delay_frames = (cfg.stt().delay_s() * frame_rate).ceil() as u64;
        Self {
            words: WordEvents::new(cfg, frame_rate),
            model,
            delay_frames,
        }
    }
}

impl std::fmt::Debug for AsrModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsrModel")
            .field("delay_frames", &self.delay_frames)
            .finish_non_exhaustive()
    }
}

struct AsrStream {
    id: u64,
    peer: ClientAddr,
    app: Arc<AppState>,
    module: Arc<Module>,
    asr: AsrModel,
    engine: EngineSession,
    outbox: Outbox,
    ogg: OggOpusReader,
    /// Audio received and not yet a whole frame.
    pcm_in: Vec<f32>,
    words: WordEvents,
    frames_pushed: u64,
    frames_processed: u64,
    /// Input frames the engine dropped (its queue's hard bound), as last reported.
    input_frames_dropped: u64,
    /// `(frames processed when it is due, id)`, in order of arrival (so of due frame).
    markers: VecDeque<(u64, i64)>,
    started: Instant,
    last_audio: Instant,
    pace: AudioPace,
    /// The pace rule's window starts here (reset while the socket is not read).
    pace_since: Instant,
    liveness: Liveness,
    messages_ignored: u64,
}

/// Runs one `/api/asr-streaming` connection to its end.
pub async fn run(
    socket: WebSocket,
    app: Arc<AppState>,
    module: Arc<Module>,
    asr: AsrModel,
    peer: ClientAddr,
) {
    let _running = app.session_started();
    let id = app.next_session_id();
    let (sink, stream) = socket.split();
    let outbox = Outbox::spawn(sink, app.limits.outbox_messages.max(2 * OUTBOX_HEADROOM));
    let settings = SessionSettings {
        sampling: module.default_sampling.clone(),
    };
    let opened = if app.draining() {
        Err((
            RefuseReason::Draining,
            format!(
                "{NO_FREE_CHANNELS}: the server is draining (shutting down), try another server"
            ),
        ))
    } else {
        module.engine.open(settings).map_err(|e| match &e {
            OpenError::Busy { .. } => (RefuseReason::Busy, format!("{NO_FREE_CHANNELS}: {e}")),
            OpenError::Unavailable(_) => (RefuseReason::Unavailable, e.to_string()),
        })
    };
    let engine = match opened {
        Ok(e) => e,
        Err((reason, message)) => {
            module.metrics.session_refused(reason);
            tracing::warn!(session = id, %peer, "asr stream refused: {message}");
            let error = AsrServerMessage::Error { message }.to_bytes();
            outbox
                .close(Some(error), close_code::TRY_AGAIN_LATER, NO_FREE_CHANNELS)
                .await;
            return;
        }
    };
    module
        .metrics
        .sessions_started
        .fetch_add(1, Ordering::Relaxed);
    let now = Instant::now();
    let mut s = AsrStream {
        id,
        peer,
        words: asr.words.clone(),
        asr,
        app: app.clone(),
        module: module.clone(),
        engine,
        outbox,
        ogg: OggOpusReader::new(PreSkip::Discard),
        pcm_in: Vec::with_capacity(2 * FRAME_SAMPLES),
        frames_pushed: 0,
        frames_processed: 0,
        input_frames_dropped: 0,
        markers: VecDeque::new(),
        started: now,
        last_audio: now,
        pace: AudioPace::new(&app.limits, now),
        pace_since: now,
        liveness: Liveness::new(now),
        messages_ignored: 0,
    };
    tracing::info!(
        session = id,
        %peer,
        module = module.path,
        active = module.engine.active_sessions(),
        max = module.engine.max_sessions(),
        "asr stream started"
    );
    s.send(&AsrServerMessage::Ready);
    let end = s.transcribe(stream).await;
    s.finish(end).await;
}

impl AsrStream {
    fn send(&mut self, message: &AsrServerMessage) {
        self.outbox.push(message.to_bytes());
    }

    /// Whether the socket may be read now (see the module docs).
    fn reading(&self) -> bool {
        self.engine.input.waiting_frames() < MAX_WAITING_FRAMES
            && self.outbox.has_room(OUTBOX_HEADROOM)
    }

    async fn transcribe(&mut self, mut stream: SplitStream<WebSocket>) -> SessionEnd {
        let limits = self.app.limits.clone();
        let mut shutdown = self.app.shutdown_signal();
        let mut check = tokio::time::interval(Duration::from_millis(200));
        let max_length = crate::session::max_session_end(self.started, &limits);
        tokio::pin!(max_length);
        loop {
            let reading = self.reading();
            if !reading {
                // The server holds the client back: its silence is ours.
                let now = Instant::now();
                self.last_audio = now;
                self.pace_since = now;
            }
            let idle_deadline = self.last_audio + limits.idle_timeout;
            tokio::select! {
                message = stream.next(), if reading => {
                    if let Err(end) = self.client_message(message) {
                        return end;
                    }
                }
                event = self.engine.events.recv() => match event {
                    Some(SessionEvent::Frame(frame)) => {
                        if let Err(e) = self.frame(frame) {
                            return SessionEnd::Engine(e);
                        }
                    }
                    Some(SessionEvent::InputDropped { total_frames }) => {
                        let new = total_frames.saturating_sub(self.input_frames_dropped);
                        self.input_frames_dropped = total_frames;
                        self.module.metrics.input_frames_dropped.fetch_add(new, Ordering::Relaxed);
                        tracing::warn!(session = self.id, total_frames, "asr input frames dropped");
                    }
                    Some(SessionEvent::Failed(e)) => return SessionEnd::Engine(e),
                    None => return SessionEnd::Engine("the model thread stopped".into()),
                },
                _ = tokio::time::sleep_until(idle_deadline.into()), if reading => {
                    return SessionEnd::Idle(limits.idle_timeout);
                }
                _ = shutdown.changed() => return SessionEnd::Shutdown,
                end = &mut max_length => return end,
                _ = check.tick() => {}
            }
            if let Err(end) = self.check_liveness() {
                return end;
            }
        }
    }

    /// The rules every tick: a client too slow, not reading, or gone.
    fn check_liveness(&mut self) -> Result<(), SessionEnd> {
        let limits = &self.app.limits;
        self.pace
            .check_not_too_slow(self.pace_since.elapsed(), Instant::now())
            .map_err(SessionEnd::TooSlow)?;
        self.liveness
            .check(&mut self.outbox, limits.not_reading_timeout)?;
        Ok(())
    }

    fn client_message(
        &mut self,
        message: Option<Result<Message, axum::Error>>,
    ) -> Result<(), SessionEnd> {
        let max = self.app.limits.max_message_bytes;
        let bytes = match incoming(message, max, &mut self.liveness)? {
            Incoming::Binary(b) => b,
            Incoming::Control => return Ok(()),
            // moshi-server ignores text frames too.
            Incoming::Text(_) => {
                self.messages_ignored += 1;
                return Ok(());
            }
        };
        match AsrClientMessage::from_bytes(&bytes)
            .map_err(|e| SessionEnd::BadInput(e.to_string()))?
        {
            AsrClientMessage::Audio { pcm } => self.audio(&pcm),
            AsrClientMessage::OggOpus { data } => self.ogg_opus(&data.0),
            AsrClientMessage::Marker { id } => self.marker(id),
            // The stream is set up when the connection opens; moshi-server's Init is its own
            // slot reset.
            AsrClientMessage::Init => {
                self.messages_ignored += 1;
                Ok(())
            }
        }
    }

    fn ogg_opus(&mut self, data: &[u8]) -> Result<(), SessionEnd> {
        let mut pcm = Vec::new();
        self.ogg
            .push(
                data,
                &mut pcm,
                self.app.limits.max_audio_per_message_samples,
            )
            .map_err(|e| SessionEnd::BadInput(format!("OggOpus: {e}")))?;
        self.audio(&pcm)
    }

    fn audio(&mut self, pcm: &[f32]) -> Result<(), SessionEnd> {
        if pcm.is_empty() {
            return Ok(());
        }
        let now = Instant::now();
        self.last_audio = now;
        // Only the lower bound of the pace applies: faster than real time is taken at the
        // model's pace (the socket is not read while frames wait).
        let _ = self
            .pace
            .received(pcm.len() as f64 / SAMPLE_RATE_HZ as f64, now);
        self.pcm_in.extend_from_slice(pcm);
        let whole = self.pcm_in.len() / FRAME_SAMPLES * FRAME_SAMPLES;
        for frame in self.pcm_in[..whole].chunks_exact(FRAME_SAMPLES) {
            self.engine.input.push(frame.to_vec());
            self.frames_pushed += 1;
        }
        self.pcm_in.drain(..whole);
        Ok(())
    }

    /// A marker comes back once the frames received so far and the delay's are processed.
    fn marker(&mut self, id: i64) -> Result<(), SessionEnd> {
        if self.markers.len() >= MAX_PENDING_MARKERS {
            return Err(SessionEnd::BadInput(format!(
                "{MAX_PENDING_MARKERS} markers already wait for their audio: send audio after a marker"
            )));
        }
        let due = self.frames_pushed + self.asr.delay_frames;
        self.markers.push_back((due, id));
        Ok(())
    }

    /// A processed frame's messages, in moshi-server's order: `Step`, words, markers.
    fn frame(&mut self, frame: ProcessedFrame) -> Result<(), String> {
        self.frames_processed += 1;
        let metrics = &self.module.metrics;
        metrics.frames_processed.fetch_add(1, Ordering::Relaxed);
        metrics
            .frame_latency_seconds
            .observe(frame.input_complete_at.elapsed().as_secs_f64());
        let tokens = frame
            .tokens
            .ok_or("a speech-to-text step returned no tokens")?;
        let prs: Vec<f32> = tokens
            .extra_heads
            .iter()
            .filter_map(|head| head.first().copied())
            .collect();
        if !prs.is_empty() {
            let waiting = self.engine.input.waiting_frames() * FRAME_SAMPLES;
            self.send(&AsrServerMessage::Step {
                step_idx: self.frames_processed,
                prs,
                buffered_pcm: (waiting + self.pcm_in.len()) as u64,
            });
        }
        let events = self
            .words
            .push(tokens.text, self.asr.model.tokenizer())
            .map_err(|e| e.to_string())?;
        for event in events {
            let message = match event {
                WordEvent::Word { text, start_s } => AsrServerMessage::Word {
                    text,
                    start_time: start_s,
                },
                WordEvent::EndWord { stop_s } => AsrServerMessage::EndWord { stop_time: stop_s },
            };
            self.send(&message);
        }
        while let Some(&(due, id)) = self.markers.front() {
            if due > self.frames_processed {
                break;
            }
            self.markers.pop_front();
            self.send(&AsrServerMessage::Marker { id });
        }
        Ok(())
    }

    async fn finish(self, end: SessionEnd) {
        self.module.metrics.session_ended(end.metric_reason());
        // Free the model slot first: the next stream can start while this one closes.
        drop(self.engine);
        let line = format!(
            "asr stream ended: {}; {:.1} s, {} frames received, {} processed, {} messages not sent, {} ignored",
            end.describe(),
            self.started.elapsed().as_secs_f64(),
            self.frames_pushed,
            self.frames_processed,
            self.outbox.dropped_messages,
            self.messages_ignored,
        );
        match end {
            SessionEnd::ClientClosed | SessionEnd::Shutdown => {
                tracing::info!(session = self.id, peer = %self.peer, "{line}")
            }
            _ => tracing::warn!(session = self.id, peer = %self.peer, "{line}"),
        }
        let message = end.client_message();
        let reason = message.clone().unwrap_or_else(|| end.describe());
        let last = message.map(|message| AsrServerMessage::Error { message }.to_bytes());
        self.outbox.close(last, end.close_code(), &reason).await;
    }
}
