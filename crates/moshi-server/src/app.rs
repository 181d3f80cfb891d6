//! The server: binds, accepts connections (plain or TLS) and serves its modules (one model at
//! one websocket path each: see [`crate::module`]) plus the web UI at `/`, and the operator's
//! routes (`operator`); [`RunningServer::start_drain`] stops taking sessions,
//! [`RunningServer::shutdown`] closes every session with a message and stops.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Extension, State, WebSocketUpgrade};
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};

use crate::api_keys::ApiKeys;
use crate::asr_session::{self, AsrModel};
use crate::metrics::{ModuleSnapshot, RefuseReason, Snapshot};
use crate::module::{self, Endpoint, Module};
use crate::operator;
use crate::session;
use crate::session_engine::OpenError;
use crate::tls::TlsFiles;
use crate::tts_session::{self, TtsRequest, TtsService};
use crate::web_ui::{self, WebUi};
use crate::ServerError;

/// Bounds on what one client can make the server do.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest websocket message accepted (a client's audio message is a few hundred bytes).
    pub max_message_bytes: usize,
    /// A session without audio from its client for this long is closed.
    pub idle_timeout: Duration,
    /// A session whose client reads nothing for this long (an unanswered ping, or its
    /// outgoing queue full) is closed.
    pub not_reading_timeout: Duration,
    /// Messages queued for a client before further ones are dropped.
    pub outbox_messages: usize,
    /// Most audio decoded from one message (24 kHz samples).
    pub max_audio_per_message_samples: usize,
    /// Sustained pace audio may arrive at, in multiples of real time (a token bucket refilled
    /// at this pace) ...
    pub max_audio_speed: f64,
    /// ... with bursts of at most this much audio (the bucket's size; it starts full).
    pub max_audio_burst: Duration,
    /// A session whose client sent less than this multiple of real time over the last
    /// `min_audio_window` (once the session is that old) is closed: a client trickling audio
    /// must not hold a session slot.
    pub min_audio_speed: f64,
    pub min_audio_window: Duration,
    /// Time allowed for a TLS handshake.
    pub tls_handshake_timeout: Duration,
    /// Kernel send buffer of each connection (about 2 s of Moshi's audio).
    pub socket_send_buffer_bytes: usize,
    /// A connection must finish its request headers within this long, and an idle keep-alive
    /// connection is closed after this long without a new request (slowloris and idle clients).
    pub header_read_timeout: Duration,
    /// Largest request head (request line + headers) read from a client; hyper's floor is
    /// 8 KiB. Larger: the connection is closed with an error.
    pub max_request_head_bytes: usize,
    /// Connections not (yet) upgraded to a websocket at a time. When they are all held, a new
    /// one takes the place of an idle one (no request in flight): from an address holding more
    /// than `max_pending_per_address`, the oldest of that address's, else the one idle longest
    /// if idle for `pending_eviction_grace`; else it is closed at once. Idle connections cannot
    /// lock new clients out.
    pub max_pending_connections: usize,
    /// An address's share of `max_pending_connections` once they are all held: above it, its
    /// connections are evicted first, whatever their age, and it gets no new one (one address
    /// reconnecting faster than the grace cannot keep the others out). Below the cap it does
    /// not apply, so a burst of clients from one address (a load test, a NAT) is served.
    pub max_pending_per_address: usize,
    /// How long a pending connection is safe from eviction after it was accepted or its last
    /// request ended (a burst of new clients must not evict each other before they speak).
    pub pending_eviction_grace: Duration,
    /// Connections at a time, websocket sessions included; one more is closed at once.
    pub max_connections: usize,
    /// `--max-session-s`: a session is closed (with a message) after this long.
    pub max_session: Option<Duration>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_message_bytes: 256 * 1024,
            idle_timeout: Duration::from_secs(10),
            not_reading_timeout: Duration::from_secs(10),
            outbox_messages: 64,
            max_audio_per_message_samples: 5 * moshi_runtime::SAMPLE_RATE_HZ as usize,
            max_audio_speed: 1.25,
            max_audio_burst: Duration::from_secs(5),
            min_audio_speed: 0.5,
            min_audio_window: Duration::from_secs(10),
            tls_handshake_timeout: Duration::from_secs(10),
            socket_send_buffer_bytes: 64 * 1024,
            header_read_timeout: Duration::from_secs(10),
            max_request_head_bytes: 32 * 1024,
            max_pending_connections: 64,
            max_pending_per_address: 16,
            pending_eviction_grace: Duration::from_secs(1),
            max_connections: 256,
            max_session: None,
        }
    }
}

/// Everything the server needs besides its modules.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to listen on (default 127.0.0.1:8998).
    pub addr: SocketAddr,
    /// The web UI at `/` when a module speaks `/api/chat`.
    pub web_ui: WebUi,
    pub tls: Option<TlsFiles>,
    pub limits: Limits,
    /// `--record DIR`: per-session recordings of the chat modules (see [`crate::recorder`]).
    pub record_dir: Option<PathBuf>,
    /// The keys a client must present (`kyutai-api-key` header, `auth_id` query parameter);
    /// `None`: every client is let in.
    pub api_keys: Option<ApiKeys>,
    /// `--trust-forwarded`: the client's address is the one the nearest proxy puts in
    /// `X-Forwarded-For` (else `X-Real-IP`), in logs and in the loopback check of `/api/drain`.
    pub trust_forwarded: bool,
    /// `--allowed-origin`: the web origins (`https://host[:port]`) whose pages may open a
    /// session; empty: any. A request without an `Origin` (not a browser) is not concerned.
    pub allowed_origins: Vec<String>,
}

impl ServerConfig {
    /// Defaults for `addr` and limits, built-in page, no TLS, no recording.
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            web_ui: WebUi::BuiltIn,
            tls: None,
            limits: Limits::default(),
            record_dir: None,
            api_keys: None,
            trust_forwarded: false,
            allowed_origins: Vec::new(),
        }
    }
}

/// State shared by every connection.
pub struct AppState {
    pub limits: Limits,
    pub record_dir: Option<PathBuf>,
    /// Prefix of recording names (the server's start time), so runs never overwrite each other.
    pub run_tag: String,
    /// What the server serves, each at its own path.
    modules: Vec<Arc<Module>>,
    api_keys: Option<ApiKeys>,
    trust_forwarded: bool,
    allowed_origins: Vec<String>,
    next_session: AtomicU64,
    running_sessions: AtomicUsize,
    sessions_done: Notify,
    shutdown: watch::Receiver<bool>,
    /// True from the start of a drain: no new session, `/api/ready` says 503.
    draining: watch::Sender<bool>,
    /// Connections not (yet) upgraded to a websocket.
    pending: Arc<PendingConnections>,
    /// Connections closed at once because `max_connections` were open.
    connections_refused: AtomicU64,
}

/// Counts a running session; dropping it counts it out.
pub struct RunningSession<'a>(&'a AppState);

impl Drop for RunningSession<'_> {
    fn drop(&mut self) {
        if self.0.running_sessions.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.sessions_done.notify_waiters();
        }
    }
}

impl AppState {
    pub fn next_session_id(&self) -> u64 {
        self.next_session.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn session_started(&self) -> RunningSession<'_> {
        self.running_sessions.fetch_add(1, Ordering::AcqRel);
        RunningSession(self)
    }

    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.clone()
    }

    /// Whether the server is draining (takes no new session).
    pub fn draining(&self) -> bool {
        *self.draining.borrow()
    }

    /// Starts a drain (once; later calls change nothing). Returns whether this call started it.
    pub(crate) fn start_drain(&self, by: &str) -> bool {
        let started = !self.draining.send_replace(true);
        if started {
            tracing::info!(
                sessions = self.running_sessions.load(Ordering::Acquire),
                "draining ({by}): no new sessions; live ones may finish"
            );
        }
        started
    }

    /// The modules, in the order given.
    pub(crate) fn modules(&self) -> &[Arc<Module>] {
        &self.modules
    }

    /// Sessions running now, all modules.
    pub(crate) fn running_sessions(&self) -> usize {
        self.running_sessions.load(Ordering::Acquire)
    }

    pub(crate) fn trust_forwarded(&self) -> bool {
        self.trust_forwarded
    }

    pub(crate) fn has_api_keys(&self) -> bool {
        self.api_keys.is_some()
    }

    /// The `/metrics` text.
    pub(crate) fn metrics_text(&self) -> String {
        Snapshot {
            version: env!("CARGO_PKG_VERSION"),
            draining: self.draining(),
            pending_connections: self.pending.len(),
            connections_refused: self.connections_refused.load(Ordering::Relaxed),
            modules: self
                .modules
                .iter()
                .map(|m| {
                    let (active, max) = m.slots();
                    ModuleSnapshot {
                        path: &m.path,
                        kind: m.endpoint.kind(),
                        model: &m.lm_model_file,
                        sessions_active: active,
                        sessions_max: max,
                        metrics: &m.metrics,
                        engine: m.engine.metrics(),
                    }
                })
                .collect(),
        }
        .render()
    }

    /// Whether a request may open a session: with keys configured, its `kyutai-api-key`
    /// header, else its `auth_id` (or Kyutai's web UI's `worker_auth_id`) query parameter, must
    /// be one of them.
    pub(crate) fn authorized(&self, headers: &HeaderMap, uri: &Uri) -> bool {
        let Some(keys) = &self.api_keys else {
            return true;
        };
        if let Some(key) = headers.get(API_KEY_HEADER) {
            return key.to_str().is_ok_and(|k| keys.allows(k));
        }
        let params: Vec<(String, String)> = axum::extract::Query::try_from_uri(uri)
            .map(|q: axum::extract::Query<Vec<(String, String)>>| q.0)
            .unwrap_or_default();
        params
            .iter()
            .filter(|(name, _)| name == "auth_id" || name == "worker_auth_id")
            .any(|(_, key)| keys.allows(key))
    }

    /// The client of a websocket request that may open a session (its key, its page's origin),
    /// else the answer refusing it before the upgrade (counted in `module`'s metrics).
    fn admit(
        &self,
        module: &Module,
        peer: SocketAddr,
        headers: &HeaderMap,
        uri: &Uri,
    ) -> Result<ClientAddr, Box<Response>> {
        let peer = ClientAddr::of_request(peer, headers, self.trust_forwarded);
        if !self.authorized(headers, uri) {
            module.metrics.session_refused(RefuseReason::Unauthorized);
            return Err(Box::new(unauthorized(peer)));
        }
        if let Some(origin) = self.forbidden_origin(headers) {
            module
                .metrics
                .session_refused(RefuseReason::ForbiddenOrigin);
            return Err(Box::new(forbidden_origin(peer, &origin)));
        }
        Ok(peer)
    }

    /// Why a browser page may not open a session: its `Origin` is not one of
    /// `--allowed-origin`'s (compared without regard to ASCII case). `None`: allowed.
    fn forbidden_origin(&self, headers: &HeaderMap) -> Option<String> {
        if self.allowed_origins.is_empty() {
            return None;
        }
        let origin = headers.get(axum::http::header::ORIGIN)?;
        let origin = String::from_utf8_lossy(origin.as_bytes());
        let allowed = self
            .allowed_origins
            .iter()
            .any(|o| o.eq_ignore_ascii_case(&origin));
        (!allowed).then(|| origin.escape_debug().to_string())
    }
}

/// The address of the connection's other end (set per connection).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerAddr(pub(crate) SocketAddr);

/// The client's address as logs show it: the connection's, or with `--trust-forwarded` the one
/// its proxy reported (no port then).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr {
    pub ip: IpAddr,
    pub port: Option<u16>,
}

impl std::fmt::Display for ClientAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.ip, self.port) {
            (ip, None) => write!(f, "{ip}"),
            (ip, Some(port)) => write!(f, "{}", SocketAddr::new(ip, port)),
        }
    }
}

impl ClientAddr {
    /// The connection's `peer`, or with `trust_forwarded` the address its proxy appended last
    /// to `X-Forwarded-For` (what a client writes there itself comes before), else
    /// `X-Real-IP`; an unreadable header counts as absent.
    pub fn of_request(peer: SocketAddr, headers: &HeaderMap, trust_forwarded: bool) -> Self {
        let direct = Self {
            ip: peer.ip(),
            port: Some(peer.port()),
        };
        if !trust_forwarded {
            return direct;
        }
        let forwarded = headers
            .get_all("x-forwarded-for")
            .iter()
            .next_back()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.rsplit(',').next())
            .or_else(|| headers.get("x-real-ip").and_then(|v| v.to_str().ok()))
            .and_then(|v| parse_forwarded_ip(v.trim()));
        match forwarded {
            Some(ip) => Self { ip, port: None },
            None => direct,
        }
    }
}

/// An address as proxies write it: `1.2.3.4`, `1.2.3.4:5678`, `::1`, `[::1]:5678`.
fn parse_forwarded_ip(v: &str) -> Option<IpAddr> {
    v.parse::<IpAddr>()
        .ok()
        .or_else(|| v.parse::<SocketAddr>().ok().map(|a| a.ip()))
}

/// Seconds a load balancer or client is asked to wait before trying this server again.
pub const RETRY_AFTER_S: u64 = 2;

/// 503 before the upgrade (a load balancer sends the client to another replica).
pub(crate) fn unavailable(why: &str) -> Response {
    use axum::response::IntoResponse;
    (
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        [(axum::http::header::RETRY_AFTER, RETRY_AFTER_S.to_string())],
        format!("{why}\n"),
    )
        .into_response()
}

/// 400 before the upgrade: a query the module cannot serve (the sentence says why).
fn bad_request(why: &str) -> Response {
    use axum::response::IntoResponse;
    (axum::http::StatusCode::BAD_REQUEST, format!("{why}\n")).into_response()
}

/// The header moshi-server reads the key from.
pub const API_KEY_HEADER: &str = "kyutai-api-key";

/// 401 before the upgrade, as moshi-server answers a missing or unknown key.
fn unauthorized(peer: ClientAddr) -> Response {
    use axum::response::IntoResponse;
    tracing::info!(%peer, "refused: missing or unknown API key");
    (
        axum::http::StatusCode::UNAUTHORIZED,
        format!("missing or unknown API key: send it in the {API_KEY_HEADER} header or the auth_id query parameter\n"),
    )
        .into_response()
}

/// 403 before the upgrade: a page from an origin `--allowed-origin` does not list.
fn forbidden_origin(peer: ClientAddr, origin: &str) -> Response {
    use axum::response::IntoResponse;
    tracing::info!(%peer, origin, "refused: origin not allowed");
    (
        axum::http::StatusCode::FORBIDDEN,
        format!("origin {origin} may not open a session here (--allowed-origin)\n"),
    )
        .into_response()
}

/// The state of a module's route: the server's, and the module's.
type ModuleRoute = (Arc<AppState>, Arc<Module>);

async fn chat(
    ws: WebSocketUpgrade,
    uri: Uri,
    headers: HeaderMap,
    State((app, module)): State<ModuleRoute>,
    Extension(PeerAddr(peer)): Extension<PeerAddr>,
) -> Response {
    let peer = match app.admit(&module, peer, &headers, &uri) {
        Ok(peer) => peer,
        Err(refusal) => return *refusal,
    };
    if app.draining() {
        module.metrics.session_refused(RefuseReason::Draining);
        tracing::info!(%peer, "refused: draining");
        return unavailable("the server is draining (shutting down): try another server");
    }
    // The slot is taken before the upgrade: a full server answers 503, which a load balancer
    // retries elsewhere (a bad query string still gets its kind-5 sentence after the upgrade).
    let request = match module.request(&uri) {
        Ok(request) => {
            let settings = request.settings.clone();
            match module.engine.open(settings) {
                Ok(engine) => Ok((request, engine)),
                Err(e) => {
                    let reason = match e {
                        OpenError::Busy { .. } => RefuseReason::Busy,
                        OpenError::Unavailable(_) => RefuseReason::Unavailable,
                    };
                    module.metrics.session_refused(reason);
                    tracing::info!(%peer, "refused: {e}");
                    return unavailable(&e.to_string());
                }
            }
        }
        Err(e) => Err(e),
    };
    let max = app.limits.max_message_bytes;
    ws.max_message_size(max)
        .max_frame_size(max)
        .on_failed_upgrade(move |e| tracing::warn!(%peer, "websocket upgrade failed: {e}"))
        .on_upgrade(move |socket| session::run(socket, app, module, request, peer))
}

async fn asr_streaming(
    ws: WebSocketUpgrade,
    uri: Uri,
    headers: HeaderMap,
    State((app, module, asr)): State<(Arc<AppState>, Arc<Module>, AsrModel)>,
    Extension(PeerAddr(peer)): Extension<PeerAddr>,
) -> Response {
    let peer = match app.admit(&module, peer, &headers, &uri) {
        Ok(peer) => peer,
        Err(refusal) => return *refusal,
    };
    // moshi-server's way, which its clients expect (issue #35): a full (or draining) server
    // upgrades, then says "no free channels" in an `Error` and closes.
    let max = app.limits.max_message_bytes;
    ws.max_message_size(max)
        .max_frame_size(max)
        .on_failed_upgrade(move |e| tracing::warn!(%peer, "websocket upgrade failed: {e}"))
        .on_upgrade(move |socket| asr_session::run(socket, app, module, asr, peer))
}

async fn tts_streaming(
    ws: WebSocketUpgrade,
    uri: Uri,
    headers: HeaderMap,
    State((app, module, service)): State<(Arc<AppState>, Arc<Module>, Arc<TtsService>)>,
    Extension(PeerAddr(peer)): Extension<PeerAddr>,
) -> Response {
    let peer = match app.admit(&module, peer, &headers, &uri) {
        Ok(peer) => peer,
        Err(refusal) => return *refusal,
    };
    let request = match TtsRequest::from_uri(&uri) {
        Ok(r) => r,
        Err(e) => {
            tracing::info!(%peer, "tts query refused: {e}");
            return bad_request(&e);
        }
    };
    // As /api/asr-streaming: a full server upgrades, then says "no free channels".
    let max = app.limits.max_message_bytes;
    ws.max_message_size(max)
        .max_frame_size(max)
        .on_failed_upgrade(move |e| tracing::warn!(%peer, "websocket upgrade failed: {e}"))
        .on_upgrade(move |socket| tts_session::run(socket, app, module, service, request, peer))
}

/// The routes of every module at its path, and `/`: the web UI when a module speaks
/// `/api/chat`, else a line naming what is served.
fn routes(state: &Arc<AppState>, web_ui: &WebUi) -> Router {
    let mut router = Router::new();
    for module in &state.modules {
        let served = (state.clone(), module.clone());
        let handler = match &module.endpoint {
            Endpoint::Chat => get(chat).with_state(served),
            Endpoint::AsrStreaming(asr) => {
                get(asr_streaming).with_state((served.0, served.1, asr.clone()))
            }
            Endpoint::TtsStreaming(tts) => {
                get(tts_streaming).with_state((served.0, served.1, tts.clone()))
            }
        };
        router = router.route(&module.path, handler);
    }
    if state
        .modules
        .iter()
        .any(|m| matches!(m.endpoint, Endpoint::Chat))
    {
        router.merge(web_ui::routes(web_ui))
    } else {
        let index = index_text(&state.modules);
        router.route("/", get(move || async move { index }))
    }
}

/// What `/` says without a web UI (the clients are programs).
fn index_text(modules: &[Arc<Module>]) -> String {
    let mut text = concat!("moshi-rs ", env!("CARGO_PKG_VERSION"), ":\n").to_string();
    for m in modules {
        text += &format!("{}: {} (websocket)\n", m.path, m.endpoint.describe());
    }
    text
}

/// A server accepting connections.
pub struct RunningServer {
    local_addr: SocketAddr,
    tls: bool,
    shutdown: watch::Sender<bool>,
    state: Arc<AppState>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl RunningServer {
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The address to open in a browser.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        let addr = self.local_addr;
        let host = if addr.ip().is_unspecified() {
            "127.0.0.1".to_string()
        } else if addr.is_ipv6() {
            format!("[{}]", addr.ip())
        } else {
            addr.ip().to_string()
        };
        format!("{scheme}://{host}:{}/", addr.port())
    }

    /// Sessions running now.
    pub fn running_sessions(&self) -> usize {
        self.state.running_sessions.load(Ordering::Acquire)
    }

    /// Stops taking new sessions (`/api/chat` answers 503, `/api/asr-streaming` "no free
    /// channels", `/api/ready` 503); live sessions go on. `by` names the cause in the log.
    pub fn start_drain(&self, by: &str) {
        self.state.start_drain(by);
    }

    /// Waits until a drain has started (by [`Self::start_drain`] or `POST /api/drain`).
    pub async fn drain_started(&self) {
        let mut draining = self.state.draining.subscribe();
        let _ = draining.wait_for(|d| *d).await;
    }

    /// Waits up to `timeout` for every session to end; returns whether they all did.
    pub async fn sessions_ended(&self, timeout: Duration) -> bool {
        let state = &self.state;
        let wait = async {
            loop {
                let done = state.sessions_done.notified();
                if state.running_sessions.load(Ordering::Acquire) == 0 {
                    return;
                }
                done.await;
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }

    /// The `/metrics` text.
    pub fn metrics_text(&self) -> String {
        self.state.metrics_text()
    }

    /// Stops accepting, tells every session to close (kind-5 "shutting down") and waits up to
    /// `grace` for them. Returns whether every session closed within `grace` (if not, it logs
    /// how many were still closing).
    pub async fn shutdown(self, grace: Duration) -> bool {
        let _ = self.shutdown.send(true);
        self.accept_task.abort();
        if !self.sessions_ended(grace).await {
            tracing::warn!(
                sessions = self.running_sessions(),
                "sessions still closing after {:.1} s; stopping anyway",
                grace.as_secs_f64()
            );
            return false;
        }
        true
    }
}

/// Binds and starts serving `modules` (at least one, each at its own path) on the current
/// tokio runtime.
pub async fn start(
    config: ServerConfig,
    modules: Vec<Module>,
) -> Result<RunningServer, ServerError> {
    check_modules(&modules)?;
    let tls = match &config.tls {
        Some(files) => Some(files.acceptor()?),
        None => None,
    };
    if let Some(dir) = &config.record_dir {
        crate::check_writable_dir(dir, "--record")?;
    }
    let listener = TcpListener::bind(config.addr)
        .await
        .map_err(|cause| ServerError::Bind {
            addr: config.addr,
            cause,
        })?;
    let local_addr = listener.local_addr().map_err(|cause| ServerError::Bind {
        addr: config.addr,
        cause,
    })?;
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (draining, _) = watch::channel(false);
    let run_tag = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        .to_string();
    let state = Arc::new(AppState {
        limits: config.limits.clone(),
        record_dir: config.record_dir.clone(),
        run_tag,
        modules: modules.into_iter().map(Arc::new).collect(),
        api_keys: config.api_keys.clone(),
        trust_forwarded: config.trust_forwarded,
        allowed_origins: config.allowed_origins.clone(),
        next_session: AtomicU64::new(0),
        running_sessions: AtomicUsize::new(0),
        sessions_done: Notify::new(),
        shutdown: shutdown_rx,
        draining,
        pending: Arc::new(PendingConnections::default()),
        connections_refused: AtomicU64::new(0),
    });
    let router = routes(&state, &config.web_ui).merge(operator::routes(state.clone()));
    let accept_task = tokio::spawn(accept_loop(listener, router, tls, state.clone()));
    Ok(RunningServer {
        local_addr,
        tls: config.tls.is_some(),
        shutdown: shutdown_tx,
        state,
        accept_task,
    })
}

/// At least one module, each at a path of its own that no other route takes.
fn check_modules(modules: &[Module]) -> Result<(), ServerError> {
    let bad = |path: &str, detail: String| ServerError::Module {
        path: path.to_string(),
        detail,
    };
    if modules.is_empty() {
        return Err(bad("", "no module to serve".into()));
    }
    for (i, m) in modules.iter().enumerate() {
        if let Some(problem) = module::path_problem(&m.path) {
            return Err(bad(&m.path, problem));
        }
        if modules[..i].iter().any(|other| other.path == m.path) {
            return Err(bad(
                &m.path,
                "two modules at this path: give one of them another (--module PATH=MODEL)".into(),
            ));
        }
    }
    Ok(())
}

/// How often at most `accept failed` is logged (it repeats as fast as the loop turns while
/// the process is out of file descriptors).
const ACCEPT_WARNING_EVERY: Duration = Duration::from_secs(5);

async fn accept_loop(
    listener: TcpListener,
    router: Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    state: Arc<AppState>,
) {
    let limits = state.limits.clone();
    // Every connection until it is upgraded to a websocket (or ends).
    let pending = state.pending.clone();
    let mut last_accept_warning: Option<tokio::time::Instant> = None;
    let mut accept_failures_not_logged = 0u64;
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of file descriptors and the like: wait instead of spinning, and log once
                // in a while instead of ten times a second.
                if last_accept_warning.is_none_or(|t| t.elapsed() >= ACCEPT_WARNING_EVERY) {
                    tracing::warn!(
                        not_logged_since_last = accept_failures_not_logged,
                        "accept failed: {e}"
                    );
                    last_accept_warning = Some(tokio::time::Instant::now());
                    accept_failures_not_logged = 0;
                } else {
                    accept_failures_not_logged += 1;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let sessions = state.running_sessions.load(Ordering::Acquire);
        let not_upgraded = pending.len();
        if sessions + not_upgraded >= limits.max_connections {
            state.connections_refused.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, sessions, not_upgraded, "connection refused: {} connections at a time at most", limits.max_connections);
            continue;
        }
        let conn = match pending.admit(peer, &limits) {
            Ok(conn) => conn,
            Err(why) => {
                tracing::debug!(%peer, "connection refused: {why}");
                continue;
            }
        };
        // Small messages every 20-80 ms: never wait for more bytes before sending.
        let _ = tcp.set_nodelay(true);
        // A bounded send buffer (instead of the kernel's autotuning up to megabytes): audio for
        // a slow or absent reader backs up into the session's own bounded queue, where it is
        // dropped and counted, instead of seconds of latency piling up in the kernel.
        let _ = socket2::SockRef::from(&tcp).set_send_buffer_size(limits.socket_send_buffer_bytes);
        let service = router.clone().layer(Extension(PeerAddr(peer)));
        let tls = tls.clone();
        let limits = limits.clone();
        tokio::spawn(async move {
            // `conn` leaves the pending set when the connection ends or is upgraded (the
            // websocket session then runs on its own task, counted in `running_sessions`).
            let track = conn.track.clone();
            let serve = async {
                match tls {
                    None => {
                        serve_connection(TokioIo::new(tcp), service, peer, &limits, &track).await
                    }
                    Some(acceptor) => {
                        match tokio::time::timeout(
                            limits.tls_handshake_timeout,
                            acceptor.accept(tcp),
                        )
                        .await
                        {
                            Ok(Ok(stream)) => {
                                serve_connection(
                                    TokioIo::new(stream),
                                    service,
                                    peer,
                                    &limits,
                                    &track,
                                )
                                .await
                            }
                            Ok(Err(e)) => tracing::info!(%peer, "TLS handshake failed: {e}"),
                            Err(_) => tracing::info!(%peer, "TLS handshake timed out"),
                        }
                    }
                }
            };
            tokio::select! {
                () = serve => {}
                () = track.evicted.notified() => {
                    tracing::debug!(%peer, "idle connection closed: a new client needed its place");
                }
            }
            drop(conn);
        });
    }
}

/// Serves HTTP/1 on one connection until it ends or is upgraded to a websocket.
async fn serve_connection<I>(
    io: TokioIo<I>,
    service: Router,
    peer: SocketAddr,
    limits: &Limits,
    track: &Arc<ConnTrack>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    // Marks the connection busy while a request is in flight (it may not be evicted then).
    let track = track.clone();
    let max_head = limits.max_request_head_bytes;
    let service = hyper::service::service_fn(move |req: axum::http::Request<_>| {
        let busy = BusyGuard::new(&track);
        // hyper's `max_buf_size` bounds memory, not the head: its buffer grows in steps past it
        // (a 40,000-byte head got through a 32 KiB limit), so the head is measured here.
        let head = request_head_bytes(&req);
        let call = (head <= max_head).then(|| {
            hyper::service::Service::call(&TowerToHyperService::new(service.clone()), req)
        });
        async move {
            let Some(call) = call else {
                tracing::debug!(%peer, head, "request head too large");
                return Ok(head_too_large(head, max_head));
            };
            let response = call.await;
            drop(busy);
            response
        }
    });
    let result = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_request_head_bytes.max(MIN_REQUEST_HEAD_BYTES))
        .serve_connection(io, service)
        .with_upgrades()
        .await;
    if let Err(e) = result {
        tracing::debug!(%peer, "connection: {e}");
    }
}

/// The size of a request's head as sent, counting one space after each header's colon: the
/// request line, the headers, the blank line.
fn request_head_bytes<B>(req: &axum::http::Request<B>) -> usize {
    let line = req.method().as_str().len() + 1 + req.uri().to_string().len() + 1 + 8 + 2;
    let headers: usize = req
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + 2 + value.len() + 2)
        .sum();
    line + headers + 2
}

/// 431 Request Header Fields Too Large, and the connection closed.
fn head_too_large(head: usize, max: usize) -> Response {
    use axum::response::IntoResponse;
    (
        axum::http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        [(axum::http::header::CONNECTION, "close")],
        format!("request head of {head} bytes: at most {max} bytes\n"),
    )
        .into_response()
}

/// hyper's smallest read buffer (`max_buf_size` panics below it).
const MIN_REQUEST_HEAD_BYTES: usize = 8192;

/// One connection not (yet) upgraded to a websocket.
#[derive(Debug)]
struct ConnTrack {
    ip: std::net::IpAddr,
    /// Requests in flight.
    busy: AtomicUsize,
    /// When it was accepted or its last request ended.
    idle_since: std::sync::Mutex<Instant>,
    /// Notified to close it (a new client needs its place).
    evicted: Notify,
}

/// Counts a request in flight on a connection.
struct BusyGuard(Arc<ConnTrack>);

impl BusyGuard {
    fn new(track: &Arc<ConnTrack>) -> Self {
        track.busy.fetch_add(1, Ordering::AcqRel);
        Self(track.clone())
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        *lock(&self.0.idle_since) = Instant::now();
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A poisoned lock only means a panic elsewhere; the map itself stays consistent.
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The connections not (yet) upgraded to a websocket.
#[derive(Debug, Default)]
struct PendingConnections {
    conns: std::sync::Mutex<std::collections::HashMap<u64, Arc<ConnTrack>>>,
    next_id: AtomicU64,
}

/// A connection's place in [`PendingConnections`]; dropping it gives the place back.
struct PendingPlace {
    set: Arc<PendingConnections>,
    id: u64,
    track: Arc<ConnTrack>,
}

impl Drop for PendingPlace {
    fn drop(&mut self) {
        lock(&self.set.conns).remove(&self.id);
    }
}

impl PendingConnections {
    fn len(&self) -> usize {
        lock(&self.conns).len()
    }

    /// A place for a new connection from `peer`; when `max_pending_connections` are held, an
    /// idle one is evicted for it (see [`Limits::max_pending_connections`]) or it is refused.
    fn admit(self: &Arc<Self>, peer: SocketAddr, limits: &Limits) -> Result<PendingPlace, String> {
        let mut conns = lock(&self.conns);
        let ip = peer.ip();
        if conns.len() >= limits.max_pending_connections {
            let mut per_address = std::collections::HashMap::<std::net::IpAddr, usize>::new();
            for c in conns.values() {
                *per_address.entry(c.ip).or_default() += 1;
            }
            if per_address.get(&ip).copied().unwrap_or(0) >= limits.max_pending_per_address {
                return Err(format!(
                    "{} connections not upgraded to a websocket at a time at most, {} from one address",
                    limits.max_pending_connections, limits.max_pending_per_address
                ));
            }
            let now = Instant::now();
            let idle = |c: &ConnTrack| c.busy.load(Ordering::Acquire) == 0;
            // First the oldest idle connection of an address over its share, whatever its age.
            let over_share = conns
                .iter()
                .filter(|(_, c)| per_address[&c.ip] > limits.max_pending_per_address && idle(c))
                .map(|(id, c)| (*id, *lock(&c.idle_since)))
                .min_by_key(|(_, since)| *since);
            // Else the one idle longest, past the grace.
            let victim = over_share.or_else(|| {
                conns
                    .iter()
                    .filter(|(_, c)| idle(c))
                    .map(|(id, c)| (*id, *lock(&c.idle_since)))
                    .filter(|(_, since)| {
                        now.duration_since(*since) >= limits.pending_eviction_grace
                    })
                    .min_by_key(|(_, since)| *since)
            });
            let Some((id, _)) = victim else {
                return Err(format!(
                    "{} connections not upgraded to a websocket at a time at most, none idle",
                    limits.max_pending_connections
                ));
            };
            if let Some(victim) = conns.remove(&id) {
                victim.evicted.notify_one();
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let track = Arc::new(ConnTrack {
            ip,
            busy: AtomicUsize::new(0),
            idle_since: std::sync::Mutex::new(Instant::now()),
            evicted: Notify::new(),
        });
        conns.insert(id, track.clone());
        Ok(PendingPlace {
            set: self.clone(),
            id,
            track,
        })
    }
}

#[cfg(test)]
mod client_addr_tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(*name, value.parse().unwrap());
        }
        h
    }

    #[test]
    fn forwarded_addresses_are_read_only_when_trusted_and_the_proxys_entry_wins() {
        let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let spoofed = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "203.0.113.5, 198.51.100.7"),
        ]);
        assert_eq!(
            ClientAddr::of_request(peer, &spoofed, false).to_string(),
            "127.0.0.1:40000"
        );
        assert_eq!(
            ClientAddr::of_request(peer, &spoofed, true).to_string(),
            "198.51.100.7"
        );
        let real_ip = headers(&[("x-real-ip", "[2001:db8::1]:443")]);
        assert_eq!(
            ClientAddr::of_request(peer, &real_ip, true).to_string(),
            "2001:db8::1"
        );
        // Unreadable: the connection's address.
        let junk = headers(&[("x-forwarded-for", "not an address")]);
        assert_eq!(
            ClientAddr::of_request(peer, &junk, true).to_string(),
            "127.0.0.1:40000"
        );
    }
}
