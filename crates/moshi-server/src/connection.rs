//! What every websocket connection of the server shares, whatever its protocol: why a session
//! ended (and the close code and sentence for it), the bounded outbox on its own task, the pace
//! of a client's audio, and read errors turned into session ends.

use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures_util::stream::SplitSink;
use futures_util::SinkExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::metrics::EndReason;

/// Websocket close codes (RFC 6455 section 7.4.1).
pub(crate) mod close_code {
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

/// A websocket ping this often: a client that reads answers it (browsers and websocket
/// libraries do so by themselves); one that does not is found out whatever the kernel buffers.
pub(crate) const PING_EVERY: Duration = Duration::from_secs(1);

/// Why a session ended.
#[derive(Debug)]
pub(crate) enum SessionEnd {
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
    /// The session reached `--max-session-s`.
    MaxDuration(Duration),
    Shutdown,
    /// The server finished what the session asked (a TTS stream said all its text).
    Completed,
}

impl SessionEnd {
    /// The kind-5 sentence for the client, if it should get one.
    pub(crate) fn client_message(&self) -> Option<String> {
        match self {
            Self::ClientClosed
            | Self::ConnectionLost(_)
            | Self::NotReading(_)
            | Self::Completed => None,
            Self::TooLarge(m) | Self::BadInput(m) | Self::TooSlow(m) | Self::NotUtf8(m) => {
                Some(format!("{m}; closing the session"))
            }
            Self::Idle(d) => Some(format!(
                "no audio from the client for {} s; closing the session",
                d.as_secs()
            )),
            Self::Engine(e) => Some(format!("the model failed: {e}; closing the session")),
            Self::MaxDuration(d) => Some(format!(
                "the session reached this server's longest ({} s); closing the session",
                d.as_secs_f64()
            )),
            Self::Shutdown => Some("the server is shutting down".into()),
        }
    }

    /// The `reason` label of `moshi_rs_sessions_ended_total`.
    pub(crate) fn metric_reason(&self) -> EndReason {
        match self {
            Self::ClientClosed => EndReason::ClientClosed,
            Self::ConnectionLost(_) => EndReason::ConnectionLost,
            Self::TooLarge(_) | Self::BadInput(_) | Self::NotUtf8(_) => EndReason::BadInput,
            Self::Idle(_) => EndReason::Idle,
            Self::TooSlow(_) => EndReason::TooSlow,
            Self::NotReading(_) => EndReason::NotReading,
            Self::Engine(_) => EndReason::ModelFailed,
            Self::MaxDuration(_) => EndReason::MaxDuration,
            Self::Shutdown => EndReason::Shutdown,
            Self::Completed => EndReason::Completed,
        }
    }

    pub(crate) fn close_code(&self) -> u16 {
        match self {
            Self::ClientClosed
            | Self::ConnectionLost(_)
            | Self::Idle(_)
            | Self::MaxDuration(_)
            | Self::Completed => close_code::NORMAL,
            Self::TooLarge(_) => close_code::TOO_BIG,
            Self::NotUtf8(_) => close_code::INVALID_PAYLOAD,
            Self::BadInput(_) | Self::TooSlow(_) | Self::NotReading(_) => close_code::POLICY,
            Self::Engine(_) => close_code::INTERNAL,
            Self::Shutdown => close_code::GOING_AWAY,
        }
    }

    pub(crate) fn describe(&self) -> String {
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
            Self::MaxDuration(d) => format!("--max-session-s {} reached", d.as_secs_f64()),
            Self::Shutdown => "server shutdown".into(),
            Self::Completed => "everything was said".into(),
        }
    }
}

/// The sending half of the websocket on its own task behind a bounded queue: a client that does
/// not read fills the queue; then messages are dropped (and counted), never buffered without
/// bound, and the receiving side is never held up.
pub(crate) struct Outbox {
    tx: mpsc::Sender<Message>,
    pub(crate) task: JoinHandle<()>,
    /// Since when the queue has been full (a client not reading).
    full_since: Option<Instant>,
    pub(crate) dropped_messages: u64,
}

impl Outbox {
    pub(crate) fn spawn(mut sink: SplitSink<WebSocket, Message>, capacity: usize) -> Self {
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
    pub(crate) fn has_room(&self, n: usize) -> bool {
        self.tx.capacity() >= n
    }

    /// Queues a protocol message; drops it (counted) if the queue is full. Returns whether it
    /// was queued.
    pub(crate) fn push(&mut self, bytes: Vec<u8>) -> bool {
        self.push_message(Message::Binary(bytes.into()))
    }

    pub(crate) fn push_message(&mut self, message: Message) -> bool {
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

    pub(crate) fn note_full(&mut self) {
        self.dropped_messages += 1;
        self.full_since.get_or_insert_with(Instant::now);
    }

    /// How long the client has not been reading (the queue full), if it is not.
    pub(crate) fn stalled_for(&self) -> Option<Duration> {
        self.full_since.map(|t| t.elapsed())
    }

    /// Sends `last` (if any) and a close frame, waits up to [`CLOSING_GRACE`] for them to leave,
    /// then stops the task (a client that does not read cannot hold the session).
    pub(crate) async fn close(self, last: Option<Vec<u8>>, code: u16, reason: &str) {
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
pub(crate) struct AudioPace {
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

    pub(crate) fn new(limits: &crate::app::Limits, now: Instant) -> Self {
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
    pub(crate) fn received(&mut self, received_s: f64, now: Instant) -> Result<(), String> {
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
    pub(crate) fn check_not_too_slow(&mut self, age: Duration, now: Instant) -> Result<(), String> {
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

/// Whether the client still reads: a websocket ping every [`PING_EVERY`] (browsers and
/// websocket libraries answer by themselves), and the outbox's state.
#[derive(Debug)]
pub(crate) struct Liveness {
    /// When the ping now unanswered was queued.
    ping_sent: Option<Instant>,
    last_pong: Instant,
}

impl Liveness {
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            ping_sent: None,
            last_pong: now,
        }
    }

    /// The client answered.
    pub(crate) fn pong(&mut self) {
        self.ping_sent = None;
        self.last_pong = Instant::now();
    }

    /// The session's end when the client has not read for `not_reading_timeout` (its outbox
    /// full, or a ping unanswered) or has stopped receiving; else sends the next ping when due.
    pub(crate) fn check(
        &mut self,
        outbox: &mut Outbox,
        not_reading_timeout: Duration,
    ) -> Result<(), SessionEnd> {
        if outbox
            .stalled_for()
            .is_some_and(|d| d >= not_reading_timeout)
        {
            return Err(SessionEnd::NotReading(not_reading_timeout));
        }
        match self.ping_sent {
            Some(sent) if sent.elapsed() >= not_reading_timeout => {
                return Err(SessionEnd::NotReading(not_reading_timeout));
            }
            Some(_) => {}
            None if self.last_pong.elapsed() >= PING_EVERY => {
                let payload = axum::body::Bytes::from_static(b"moshi-rs");
                if outbox.push_message(Message::Ping(payload)) {
                    self.ping_sent = Some(Instant::now());
                }
            }
            None => {}
        }
        if outbox.task.is_finished() {
            return Err(SessionEnd::ConnectionLost(
                "the client stopped receiving".into(),
            ));
        }
        Ok(())
    }
}

/// A client's websocket message, as a protocol sees it.
pub(crate) enum Incoming {
    Binary(axum::body::Bytes),
    /// A text message (its text).
    Text(String),
    /// A ping or a pong (recorded in the [`Liveness`]): nothing for the protocol.
    Control,
}

/// Reads what the websocket gave: the end of the session, or a message for the protocol.
pub(crate) fn incoming(
    message: Option<Result<Message, axum::Error>>,
    max_message_bytes: usize,
    liveness: &mut Liveness,
) -> Result<Incoming, SessionEnd> {
    match message {
        None => Err(SessionEnd::ConnectionLost("the connection closed".into())),
        Some(Err(e)) => Err(transport_error(e, max_message_bytes)),
        Some(Ok(Message::Binary(b))) => Ok(Incoming::Binary(b)),
        Some(Ok(Message::Close(_))) => Err(SessionEnd::ClientClosed),
        Some(Ok(Message::Pong(_))) => {
            liveness.pong();
            Ok(Incoming::Control)
        }
        Some(Ok(Message::Ping(_))) => Ok(Incoming::Control),
        Some(Ok(Message::Text(t))) => Ok(Incoming::Text(t.to_string())),
    }
}

/// A read error as a session end; an oversized message gets its own sentence.
pub(crate) fn transport_error(e: axum::Error, max_message_bytes: usize) -> SessionEnd {
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
