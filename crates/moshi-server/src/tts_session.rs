//! One websocket connection of `/api/tts_streaming` = one text-to-speech stream, as Kyutai's
//! `moshi-server` serves it: the voice of the query resolved in the voices folder (an unknown
//! voice is an `Error`), a stream opened on the [`TtsEngine`] (or "no free channels" and
//! close), `Ready` sent; then the client's text, preprocessed as moshi-server does
//! (`tts_preprocess.rs`), goes to the stream word by word, and its audio and words come back in
//! the query's format until the stream has said everything: then the socket closes.
//!
//! A client that does not read stops its stream (the engine only steps a stream whose client has
//! room); a client that sends neither text nor `Eos` for the idle timeout, or more text than the
//! limit, ends its own stream with an `Error` saying why.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::ws::{Message, WebSocket};
use futures_util::stream::SplitStream;
use futures_util::StreamExt;
use moshi_loader::voice::{load_voice, Voice, VoiceSource};
use moshi_model::lm::conditioner::TensorCondition;
use moshi_model::tts::script::{ScriptOptions, ScriptReader, WordEncoder};
use moshi_runtime::pipeline::MoshiModel;
use moshi_runtime::speak::TtsSpeaker;

use crate::app::{AppState, ClientAddr};
use crate::connection::{close_code, incoming, Incoming, Liveness, Outbox, SessionEnd};
use crate::metrics::RefuseReason;
use crate::module::Module;
use crate::ogg_opus::{OggOpusWriter, OpusPacketing};
use crate::session_engine::OpenError;
use crate::tts_engine::{TtsEngine, TtsEvent, TtsStreamHandle};
use crate::tts_protocol::{TtsClientMessage, TtsFormat, TtsServerMessage};

/// What moshi-server answers when every slot is taken.
pub const NO_FREE_CHANNELS: &str = "no free channels";
/// The most text one stream takes, in bytes.
const MAX_TEXT_BYTES: usize = 1 << 20;
/// Voices kept loaded at most (each is small: 125 frames of 512 values in Kyutai's).
const MAX_CACHED_VOICES: usize = 256;
/// Messages the outbox must have room for before an engine event is taken.
const OUTBOX_HEADROOM: usize = 4;

/// A text-to-speech model served at `/api/tts_streaming`: its engine and voices.
pub struct TtsService {
    pub engine: Arc<TtsEngine>,
    model: Arc<MoshiModel>,
    voices: VoiceSource,
    voice_suffix: String,
    default_voice: Option<String>,
    voice_dim: usize,
    /// Each voice's speaker condition, loaded once: streams of one voice share its
    /// cross-attention keys and values.
    cache: Mutex<HashMap<String, Arc<TensorCondition>>>,
}

impl std::fmt::Debug for TtsService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TtsService")
            .field("voices", &self.voices.describe())
            .finish_non_exhaustive()
    }
}

impl TtsService {
    /// The service of `model` (a TTS model) on `engine`, voices looked up in `voices`;
    /// `default_voice` for a query that names none.
    pub fn new(
        model: Arc<MoshiModel>,
        engine: Arc<TtsEngine>,
        voices: VoiceSource,
        default_voice: Option<String>,
    ) -> Self {
        let cfg = model.lm_config();
        let voice_suffix = cfg.voice_suffix();
        let voice_dim = model
            .generator()
            .weights()
            .conditions()
            .cross_conditioners()
            .first()
            .map_or(0, |c| c.dim());
        Self {
            engine,
            model,
            voices,
            voice_suffix,
            default_voice,
            voice_dim,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The speaker condition a stream of voice `name` speaks with (none for a model without
    /// speaker conditioning), loaded once and kept; an error is a sentence for the client.
    pub fn voices_for(&self, name: Option<&str>) -> Result<Option<Arc<TensorCondition>>, String> {
        if self.voice_dim == 0 {
            return Ok(None);
        }
        let Some(name) = name.or(self.default_voice.as_deref()) else {
            return Err(
                "no voice: the query needs `voice` (this server has no default voice)".into(),
            );
        };
        if let Some(v) = self.lock_cache().get(name) {
            return Ok(Some(v.clone()));
        }
        let shown = moshi_loader::escape::escape_controls(name);
        let voice = self
            .voices
            .locate(name, &self.voice_suffix)
            .and_then(|path| load_voice(&path, self.voice_dim))
            .map_err(|e| {
                tracing::warn!("voice {shown:?}: {e}");
                format!("unknown voice {shown:?}")
            })?;
        let speakers = self.speakers(voice, &shown)?;
        let mut cache = self.lock_cache();
        if cache.len() >= MAX_CACHED_VOICES {
            cache.clear();
        }
        if let Some(s) = &speakers {
            cache.insert(name.to_string(), s.clone());
        }
        Ok(speakers)
    }

    /// The speaker condition of a voice a client sent (`Voice {embeddings, shape}`, as
    /// moshi-server's TTS takes it: `shape` [1, dim, frames], channels first), not cached.
    pub fn sent_voice(
        &self,
        embeddings: &[f32],
        shape: &[usize],
    ) -> Result<Option<Arc<TensorCondition>>, String> {
        if self.voice_dim == 0 {
            return Err("this model takes no voice".into());
        }
        let voice = Voice::from_channels_first(
            Path::new("the Voice message"),
            shape,
            embeddings,
            self.voice_dim,
        )
        .map_err(|e| e.to_string())?;
        self.speakers(voice, "sent in the Voice message")
    }

    fn speakers(&self, voice: Voice, shown: &str) -> Result<Option<Arc<TensorCondition>>, String> {
        TtsSpeaker::speakers(&self.model, &[voice]).map_err(|e| format!("voice {shown:?}: {e}"))
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<TensorCondition>>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A query of `/api/tts_streaming`: the voice and the output format.
#[derive(Debug, Clone, PartialEq)]
pub struct TtsRequest {
    pub voice: Option<String>,
    pub format: TtsFormat,
}

impl TtsRequest {
    /// Reads the query of `uri` (`voice`, `format`; `auth_id` and unknown keys are left to
    /// others). Errors are sentences for the client.
    pub fn from_uri(uri: &axum::http::Uri) -> Result<Self, String> {
        let params: Vec<(String, String)> = axum::extract::Query::try_from_uri(uri)
            .map(|q: axum::extract::Query<Vec<(String, String)>>| q.0)
            .map_err(|e| format!("malformed query string: {e}"))?;
        let mut request = Self {
            voice: None,
            format: TtsFormat::default(),
        };
        for (key, value) in params {
            match key.as_str() {
                "voice" => request.voice = Some(value),
                "format" => {
                    request.format = TtsFormat::parse(&value).ok_or_else(|| {
                        format!(
                            "format {:?} is not one of {}",
                            moshi_loader::escape::escape_controls(&value),
                            TtsFormat::NAMES
                        )
                    })?
                }
                _ => {}
            }
        }
        Ok(request)
    }
}

struct TtsConnection<'a> {
    id: u64,
    service: Arc<TtsService>,
    app: Arc<AppState>,
    module: Arc<Module>,
    stream: TtsStreamHandle,
    outbox: Outbox,
    format: TtsFormat,
    opus: Option<OggOpusWriter>,
    reader: ScriptReader<'a>,
    started_text: bool,
    /// Whether any `Text` came (a `Voice` may only come before).
    text_seen: bool,
    text_bytes: usize,
    eos: bool,
    last_text: Instant,
    liveness: Liveness,
    frames_sent: u64,
}

/// Runs one `/api/tts_streaming` connection to its end.
pub async fn run(
    socket: WebSocket,
    app: Arc<AppState>,
    module: Arc<Module>,
    service: Arc<TtsService>,
    request: TtsRequest,
    peer: ClientAddr,
) {
    let _running = app.session_started();
    let id = app.next_session_id();
    let (sink, stream) = socket.split();
    let outbox = Outbox::spawn(sink, app.limits.outbox_messages.max(2 * OUTBOX_HEADROOM));
    // Off the async threads: a voice not yet loaded may be read, or downloaded.
    let opened = {
        let (app, service, request) = (app.clone(), service.clone(), request.clone());
        tokio::task::spawn_blocking(move || open(&app, &service, &request))
            .await
            .unwrap_or_else(|e| Err((None, format!("opening the stream failed: {e}"))))
    };
    let handle = match opened {
        Ok(h) => h,
        Err((reason, message)) => {
            if let Some(reason) = reason {
                module.metrics.session_refused(reason);
            }
            tracing::warn!(session = id, %peer, "tts stream refused: {message}");
            let error = request
                .format
                .has_messages()
                .then(|| TtsServerMessage::Error { message }.to_bytes());
            outbox
                .close(error, close_code::TRY_AGAIN_LATER, NO_FREE_CHANNELS)
                .await;
            return;
        }
    };
    module
        .metrics
        .sessions_started
        .fetch_add(1, Ordering::Relaxed);
    let model = service.model.clone();
    let encode = move |w: &str| {
        model
            .tokenizer()
            .encode(w)
            .map_err(|e| moshi_model::ModelError::BadScript {
                reason: e.to_string(),
            })
    };
    let encode: &WordEncoder = &encode;
    let options = ScriptOptions {
        multi_speaker: service.voice_dim > 0,
        padding_between: 1,
        moshi_server: true,
    };
    let opus = match request.format.is_ogg_opus() {
        true => match OggOpusWriter::new(id as u32, OpusPacketing::SERVER) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::error!(session = id, "opus encoder: {e}");
                outbox
                    .close(None, close_code::INTERNAL, "opus encoder")
                    .await;
                return;
            }
        },
        false => None,
    };
    let now = Instant::now();
    let mut c = TtsConnection {
        id,
        service: service.clone(),
        app: app.clone(),
        module: module.clone(),
        stream: handle,
        outbox,
        format: request.format,
        opus,
        reader: ScriptReader::new(encode, options),
        started_text: false,
        text_seen: false,
        text_bytes: 0,
        eos: false,
        last_text: now,
        liveness: Liveness::new(now),
        frames_sent: 0,
    };
    tracing::info!(session = id, %peer, voice = ?request.voice, format = ?request.format, "tts stream started");
    if c.format.has_messages() {
        c.outbox.push(TtsServerMessage::Ready.to_bytes());
    }
    let end = c.serve(stream).await;
    c.finish(end, peer).await;
}

/// The engine stream for `request`, or why not (the refusal's metric reason, if it counts as
/// one, and the client's sentence).
fn open(
    app: &AppState,
    service: &TtsService,
    request: &TtsRequest,
) -> Result<TtsStreamHandle, (Option<RefuseReason>, String)> {
    if app.draining() {
        return Err((
            Some(RefuseReason::Draining),
            format!(
                "{NO_FREE_CHANNELS}: the server is draining (shutting down), try another server"
            ),
        ));
    }
    let speakers = service
        .voices_for(request.voice.as_deref())
        .map_err(|e| (None, e))?;
    service.engine.open(speakers).map_err(|e| match &e {
        OpenError::Busy { .. } => (Some(RefuseReason::Busy), format!("{NO_FREE_CHANNELS}: {e}")),
        OpenError::Unavailable(_) => (Some(RefuseReason::Unavailable), e.to_string()),
    })
}

impl TtsConnection<'_> {
    async fn serve(&mut self, mut stream: SplitStream<WebSocket>) -> SessionEnd {
        let limits = self.app.limits.clone();
        let mut shutdown = self.app.shutdown_signal();
        let mut check = tokio::time::interval(Duration::from_millis(200));
        loop {
            let room = self.outbox.has_room(OUTBOX_HEADROOM);
            let idle_deadline = self.last_text + limits.idle_timeout;
            tokio::select! {
                message = stream.next(), if !self.eos => {
                    if let Err(end) = self.client_message(message) {
                        return end;
                    }
                }
                event = self.stream.events.recv(), if room => match event {
                    Some(TtsEvent::Done) => return SessionEnd::Completed,
                    Some(event) => {
                        if let Err(end) = self.event(event) {
                            return end;
                        }
                    }
                    None => return SessionEnd::Engine("the model thread stopped".into()),
                },
                _ = tokio::time::sleep_until(idle_deadline.into()), if !self.eos => {
                    return SessionEnd::BadInput(format!(
                        "no text and no Eos from the client for {} s",
                        limits.idle_timeout.as_secs()
                    ));
                }
                _ = shutdown.changed() => return SessionEnd::Shutdown,
                _ = check.tick() => {}
            }
            if let Err(end) = self
                .liveness
                .check(&mut self.outbox, limits.not_reading_timeout)
            {
                return end;
            }
        }
    }

    fn client_message(
        &mut self,
        message: Option<Result<Message, axum::Error>>,
    ) -> Result<(), SessionEnd> {
        let max = self.app.limits.max_message_bytes;
        match incoming(message, max, &mut self.liveness)? {
            Incoming::Control => Ok(()),
            Incoming::Text(text) => self.text(&text),
            Incoming::Binary(bytes) => match TtsClientMessage::from_bytes(&bytes)
                .map_err(|e| SessionEnd::BadInput(e.to_string()))?
            {
                TtsClientMessage::Text { text } => self.text(&text),
                TtsClientMessage::Voice { embeddings, shape } => self.voice(&embeddings, &shape),
                TtsClientMessage::Eos => {
                    self.eos = true;
                    self.stream.end_of_text();
                    Ok(())
                }
            },
        }
    }

    /// A voice sent by the client: the stream speaks with it from its start.
    fn voice(&mut self, embeddings: &[f32], shape: &[usize]) -> Result<(), SessionEnd> {
        if self.text_seen {
            return Err(SessionEnd::BadInput(
                "a Voice message after text: the voice is set before the stream's first Text"
                    .into(),
            ));
        }
        let speakers = self
            .service
            .sent_voice(embeddings, shape)
            .map_err(SessionEnd::BadInput)?;
        self.stream.voice(speakers);
        Ok(())
    }

    fn text(&mut self, text: &str) -> Result<(), SessionEnd> {
        self.text_seen = true;
        self.last_text = Instant::now();
        self.text_bytes += text.len();
        if self.text_bytes > MAX_TEXT_BYTES {
            return Err(SessionEnd::TooLarge(format!(
                "more than {MAX_TEXT_BYTES} bytes of text in one stream"
            )));
        }
        let entries = self
            .reader
            .turn_part(0, text, !self.started_text)
            .map_err(|e| SessionEnd::BadInput(e.to_string()))?;
        self.started_text |= entries.iter().any(|e| !e.tokens.is_empty());
        if !entries.is_empty() {
            self.stream.text(entries);
        }
        Ok(())
    }

    fn event(&mut self, event: TtsEvent) -> Result<(), SessionEnd> {
        match event {
            TtsEvent::Audio(pcm) => {
                self.frames_sent += 1;
                self.module
                    .metrics
                    .frames_processed
                    .fetch_add(1, Ordering::Relaxed);
                let bytes = self.encode_audio(pcm)?;
                if !bytes.is_empty() {
                    self.outbox.push(bytes);
                }
            }
            TtsEvent::Word {
                text,
                start_s,
                stop_s,
            } => {
                if self.format.has_messages() && !text.is_empty() {
                    let m = TtsServerMessage::Text {
                        text,
                        start_s,
                        stop_s,
                    };
                    self.outbox.push(m.to_bytes());
                }
            }
            TtsEvent::Failed(e) => return Err(SessionEnd::Engine(e)),
            TtsEvent::Done => {}
        }
        Ok(())
    }

    fn encode_audio(&mut self, pcm: Vec<f32>) -> Result<Vec<u8>, SessionEnd> {
        Ok(match self.format {
            TtsFormat::PcmMessagePack => TtsServerMessage::Audio { pcm }.to_bytes(),
            TtsFormat::Pcm => pcm.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TtsFormat::OggOpus | TtsFormat::OggOpusMessagePack => {
                let writer = self.opus.as_mut().expect("made for the Ogg/Opus formats");
                let pages = writer
                    .push(&pcm)
                    .map_err(|e| SessionEnd::Engine(format!("opus encoder: {e}")))?;
                match (self.format, pages.is_empty()) {
                    (_, true) => Vec::new(),
                    (TtsFormat::OggOpus, false) => pages,
                    _ => TtsServerMessage::OggOpus {
                        data: crate::asr_protocol::serde_bytes_compat::Bytes(pages),
                    }
                    .to_bytes(),
                }
            }
        })
    }

    async fn finish(self, end: SessionEnd, peer: ClientAddr) {
        self.module.metrics.session_ended(end.metric_reason());
        drop(self.stream);
        let line = format!(
            "tts stream ended: {}; {} frames sent, {} bytes of text, {} messages not sent",
            end.describe(),
            self.frames_sent,
            self.text_bytes,
            self.outbox.dropped_messages,
        );
        tracing::info!(session = self.id, %peer, "{line}");
        let message = end.client_message();
        let last = message
            .filter(|_| self.format.has_messages())
            .map(|message| TtsServerMessage::Error { message }.to_bytes());
        let reason = if matches!(end, SessionEnd::Completed) {
            "done"
        } else {
            "error"
        };
        self.outbox.close(last, end.close_code(), reason).await;
    }
}
