//! `moshi-rs serve`: the websocket server of Kyutai's protocol (`/api/chat`) with a web UI at
//! `/`, or for a speech-to-text model moshi-server's `/api/asr-streaming`. This file only reads
//! the flags, loads the model once and starts moshi-server, whose batched engine runs every
//! session over those weights; SIGTERM (or `POST /api/drain`) drains, Ctrl-C closes the
//! sessions at once (each with a goodbye).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use moshi_runtime::engine::DropPolicy;
use moshi_runtime::pipeline::MoshiPipeline;
use moshi_server::api_keys::ApiKeys;
use moshi_server::asr_session::AsrModel;
use moshi_server::batch_engine::BatchEngine;
use moshi_server::tls::TlsFiles;
use moshi_server::{Endpoint, Limits, ServerConfig, WebUi};

use super::model_args::{ModelArgs, SamplingArgs, LIVE_DEFAULTS};

/// Most sessions `--max-sessions` accepts (each holds its own KV caches: up to 1.5 GB for the
/// 7B at a full window with bf16 caches).
const MAX_SESSIONS_LIMIT: usize = 64;

/// Input frames a session's queue holds at most, whatever the model's pace (2 s of audio): a
/// client's burst beyond that is dropped and counted.
const MAX_QUEUED_INPUT_FRAMES: usize = 25;

/// Frames a transcription stream's queue holds at most: the socket is no longer read from 8
/// waiting, and one message brings at most a few seconds.
const MAX_QUEUED_ASR_FRAMES: usize = 128;

/// The variable holding API keys when `--api-key-file` is not given.
const API_KEYS_VAR: &str = "MOSHI_RS_API_KEYS";

/// How long to wait for Kyutai's web UI from the Hugging Face Hub before serving our own page.
const KYUTAI_UI_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Address to listen on: 127.0.0.1 (this machine only) unless told otherwise; 0.0.0.0 for
    /// every interface (then use --tls-cert/--tls-key: browsers open the microphone only on
    /// localhost or https).
    #[arg(long, default_value = "127.0.0.1", value_parser = super::flag_values::host)]
    pub host: IpAddr,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8998)]
    pub port: u16,
    /// Web UI at `/`: a built UI folder (e.g. Kyutai's client `dist/`), or `none` (API only).
    /// Default: Kyutai's UI from the Hugging Face Hub (kyutai/moshi-artifacts, dist.tgz), and
    /// the built-in page when that cannot be had (offline).
    #[arg(long = "static", value_name = "DIR|none")]
    pub static_ui: Option<String>,
    /// Conversations at once; one more gets a "server busy" error. They share the weights and
    /// run in batched steps (one weight pass per frame for all of them); each holds its own
    /// state (KV caches, Mimi's streams).
    #[arg(long, default_value_t = 1)]
    pub max_sessions: usize,
    /// TLS certificate chain (PEM), for https/wss.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Latency the input backlog may add, in 80 ms frames beyond the one being processed: input
    /// waits while the model, at its recent pace, gets through it within (N + 1) * 80 ms; beyond
    /// that (compute slower than real time) the oldest frames are dropped and counted.
    #[arg(long, default_value_t = 2, value_parser = super::flag_values::backlog_frames)]
    pub max_backlog_frames: usize,
    /// Close a session after this many seconds without audio from its client.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    pub idle_timeout_s: f64,
    /// API keys, one a line (`#` comments): a client must send one in the `kyutai-api-key`
    /// header or the `auth_id` query parameter (HTTP 401 otherwise). Without it, the keys of
    /// the variable MOSHI_RS_API_KEYS (comma-separated), else none: every client is let in.
    #[arg(long, value_name = "FILE")]
    pub api_key_file: Option<PathBuf>,
    /// Record every session into this folder: the input the model processed, the audio sent
    /// (decoded) and the tokens (see docs/serve.md).
    #[arg(long, value_name = "DIR")]
    pub record: Option<PathBuf>,
    /// On SIGTERM (or `POST /api/drain`): take no new session, report not ready, and let the
    /// live ones go on for up to this long before ending them with a goodbye. A second SIGTERM
    /// (or Ctrl-C) ends them at once.
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0)]
    pub drain_timeout_s: f64,
    /// End a session (with a message saying why) once it is this long; none by default.
    #[arg(long, value_name = "SECONDS")]
    pub max_session_s: Option<f64>,
    /// Behind a reverse proxy or load balancer: take the client's address from the last
    /// `X-Forwarded-For` entry (else `X-Real-IP`) for logs and `/api/drain`'s loopback check.
    /// Only with a proxy that sets them: a client could write its own otherwise.
    #[arg(long)]
    pub trust_forwarded: bool,
    /// A web origin (`https://host[:port]`, as browsers send it in `Origin`) whose pages may
    /// open a session; repeat it for several. Without it, any page may. Requests without an
    /// `Origin` (programs, not browsers) are not concerned.
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    pub allowed_origins: Vec<String>,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=MAX_SESSIONS_LIMIT).contains(&args.max_sessions),
        "--max-sessions {}: expected 1..={MAX_SESSIONS_LIMIT}",
        args.max_sessions
    );
    anyhow::ensure!(
        args.idle_timeout_s.is_finite() && (1.0..=86_400.0).contains(&args.idle_timeout_s),
        "--idle-timeout-s {}: expected 1..=86400 seconds",
        args.idle_timeout_s
    );
    anyhow::ensure!(
        args.drain_timeout_s.is_finite() && (0.0..=86_400.0).contains(&args.drain_timeout_s),
        "--drain-timeout-s {}: expected 0..=86400 seconds",
        args.drain_timeout_s
    );
    if let Some(max) = args.max_session_s {
        anyhow::ensure!(
            max.is_finite() && (1.0..=604_800.0).contains(&max),
            "--max-session-s {max}: expected 1..=604800 seconds (a week)"
        );
    }
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
        }),
        _ => None,
    };
    if let Some(t) = &tls {
        // Checked before the model loads: a typo should not cost a minute.
        t.acceptor()?;
    }
    if let Some(dir) = &args.record {
        moshi_server::check_writable_dir(dir, "--record")?;
    }
    // Checked before the model loads, like the other files.
    let static_ui = match args.static_ui.as_deref() {
        Some("none") => Some(WebUi::None),
        Some(dir) => Some(WebUi::dir(std::path::Path::new(dir)).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let api_keys = api_keys(args.api_key_file.as_deref())?;
    for origin in &args.allowed_origins {
        check_origin(origin)?;
    }

    let load_started = Instant::now();
    let mut loaded = args
        .model
        .load_model(&args.sampling, LIVE_DEFAULTS, args.max_sessions)?;
    // A model that speaks is served at /api/chat with a web UI; a speech-to-text model at
    // moshi-server's /api/asr-streaming, for programs.
    let endpoint = if loaded.model.conventions().generates_audio {
        Endpoint::Chat
    } else {
        anyhow::ensure!(
            args.record.is_none(),
            "--record: {} is a speech-to-text model; recordings are made of /api/chat sessions",
            loaded.resolved.lm_weights_path.display()
        );
        anyhow::ensure!(
            matches!(static_ui, None | Some(WebUi::None)),
            "--static: {} is a speech-to-text model, served at /api/asr-streaming without a web UI",
            loaded.resolved.lm_weights_path.display()
        );
        // Greedy, as Kyutai's STT scripts (`temp=0`) and moshi-server (`temperature = 0`).
        let given = args.sampling.given();
        anyhow::ensure!(
            given.is_empty(),
            "{}: a speech-to-text model is served greedy (moshi-server's temperature 0); leave out the sampling flags",
            given.join(", ")
        );
        loaded.settings.sampling.greedy = true;
        Endpoint::AsrStreaming(AsrModel::new(loaded.model.clone()))
    };
    let web_ui = match (&endpoint, static_ui) {
        (Endpoint::AsrStreaming(_), _) => WebUi::None,
        (Endpoint::Chat, Some(ui)) => ui,
        (Endpoint::Chat, None) => kyutai_ui_or_built_in(),
    };
    // The flags' settings over the config's `lm_gen_config`: each session's starting point.
    let sampling = loaded.settings.sampling.clone();
    MoshiPipeline::new(loaded.model.clone(), &loaded.settings)?
        .warm_up()
        .context("warm-up frame")?;
    let pipeline_cfg_coef = loaded.model.cfg_coef(&loaded.settings);
    let model = &loaded.resolved;
    eprintln!(
        "model: {} ({:?}), ready in {:.1} s",
        model.lm_weights_path.display(),
        model.layout,
        load_started.elapsed().as_secs_f64(),
    );
    // A conversation drops what it cannot process in time; a transcription takes its audio at
    // the model's pace instead (the socket is not read while frames wait: see asr_session).
    let (policy, queue_capacity_frames) = match &endpoint {
        Endpoint::Chat => (
            DropPolicy::RealTime {
                max_backlog_frames: args.max_backlog_frames,
            },
            MAX_QUEUED_INPUT_FRAMES.max(args.max_backlog_frames + 1),
        ),
        Endpoint::AsrStreaming(_) => (DropPolicy::Lossless, MAX_QUEUED_ASR_FRAMES),
    };
    let engine = BatchEngine::new(
        loaded.model.clone(),
        loaded.settings.clone(),
        args.max_sessions,
        policy,
        queue_capacity_frames,
    )
    .context("starting the compute thread")?;

    let mut config = ServerConfig::new(SocketAddr::new(args.host, args.port));
    config.web_ui = web_ui.clone();
    config.tls = tls;
    config.record_dir = args.record.clone();
    config.default_sampling = sampling.clone();
    config.limits = Limits {
        idle_timeout: Duration::from_secs_f64(args.idle_timeout_s),
        max_session: args.max_session_s.map(Duration::from_secs_f64),
        ..Limits::default()
    };
    config.trust_forwarded = args.trust_forwarded;
    config.allowed_origins = args.allowed_origins.clone();
    config.lm_model_file = model.lm_weights_path.display().to_string();
    config.endpoint = endpoint.clone();
    config.api_keys = api_keys.clone();
    config.model_description = serde_json::json!({
        "weights": model.lm_weights_path.display().to_string(),
        "layout": format!("{:?}", model.layout),
        "mimi": model.mimi_weights_path.display().to_string(),
        "quantize": args.model.quantize.map(|q| q.name()),
        "dequantize": args.model.dequantize,
        "kv_cache": args.model.kv_cache_or(LIVE_DEFAULTS).to_string(),
        "activations": args.model.activations_or(LIVE_DEFAULTS).to_string(),
        "mimi_weights": args.model.mimi_weights.to_string(),
        "greedy": sampling.greedy,
        "cfg_coef": pipeline_cfg_coef,
    });

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("moshi-serve-io")
        .enable_all()
        .build()
        .context("starting tokio")?;
    runtime.block_on(async move {
        let mut signals = StopSignals::new()?;
        let server = moshi_server::start(config, std::sync::Arc::new(engine)).await?;
        startup_lines(&args, &endpoint, &web_ui, api_keys.as_ref(), &server);
        // The line to open (also read by scripts and tests); a closed or full stdout (`| head
        // -1` once the line is read) must not stop the server.
        let _ = super::stdout::print(&format!("moshi-rs serve: open {}\n", server.url()));
        let cause = tokio::select! {
            signal = signals.next() => signal?,
            () = server.drain_started() => "POST /api/drain",
        };
        if cause != "Ctrl-C" {
            drain(
                &server,
                cause,
                Duration::from_secs_f64(args.drain_timeout_s),
                &mut signals,
            )
            .await?;
        }
        eprintln!("{cause}: closing {} session(s)", server.running_sessions());
        server.shutdown(SHUTDOWN_GRACE).await;
        anyhow::Ok(())
    })
}

/// Time the sessions get to say goodbye when the server stops.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// What an operator needs at start: what is served, at most how many, who may connect, how to
/// probe and stop it (the address is on stdout's `open` line).
fn startup_lines(
    args: &ServeArgs,
    endpoint: &Endpoint,
    web_ui: &WebUi,
    api_keys: Option<&ApiKeys>,
    server: &moshi_server::RunningServer,
) {
    let what = match endpoint {
        Endpoint::Chat => format!("/api/chat (Kyutai's protocol) and {}", web_ui.describe()),
        Endpoint::AsrStreaming(_) => {
            "/api/asr-streaming (speech to text, moshi-server's protocol)".to_string()
        }
    };
    let interfaces = if args.host.is_unspecified() {
        "every interface".to_string()
    } else {
        args.host.to_string()
    };
    eprintln!(
        "serving {what} on {interfaces}, port {}; up to {} session(s) at once",
        server.local_addr().port(),
        args.max_sessions
    );
    match api_keys {
        Some(keys) => eprintln!(
            "API keys on: {} key(s); clients send one in the kyutai-api-key header or ?auth_id=",
            keys.len()
        ),
        None if !args.host.is_loopback() => eprintln!(
            "API keys off: anyone who can reach this address may connect (--api-key-file or {API_KEYS_VAR} sets keys)"
        ),
        None => eprintln!("API keys off (this machine only)"),
    }
    eprintln!(
        "probes: /api/health /api/ready /api/capacity, metrics: /metrics; SIGTERM drains (up to {} s), Ctrl-C stops",
        args.drain_timeout_s
    );
}

/// A drain: no new session, then the live ones until they end, `timeout` passes, or another
/// stop signal comes.
async fn drain(
    server: &moshi_server::RunningServer,
    cause: &str,
    timeout: Duration,
    signals: &mut StopSignals,
) -> anyhow::Result<()> {
    server.start_drain(cause);
    let live = server.running_sessions();
    eprintln!(
        "{cause}: draining: no new sessions; {live} live session(s) may go on for up to {} s (SIGTERM or Ctrl-C again: stop now)",
        timeout.as_secs_f64()
    );
    let deadline = tokio::time::Instant::now() + timeout;
    // After `POST /api/drain` (Kubernetes' preStop), the SIGTERM that follows continues the
    // drain; the next one ends it.
    let mut sigterms_to_stop = if cause == "SIGTERM" { 1 } else { 2 };
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        tokio::select! {
            all_ended = server.sessions_ended(left) => {
                if all_ended {
                    eprintln!("drained: every session ended");
                } else {
                    eprintln!("drain timeout: ending {} session(s)", server.running_sessions());
                }
                return Ok(());
            }
            signal = signals.next() => {
                let signal = signal?;
                if signal == "SIGTERM" && sigterms_to_stop > 1 {
                    sigterms_to_stop -= 1;
                    eprintln!("SIGTERM: already draining (another SIGTERM stops now)");
                    continue;
                }
                eprintln!("{signal}: ending the drain now");
                return Ok(());
            }
        }
    }
}

/// The keys of `--api-key-file`, else of `MOSHI_RS_API_KEYS` (comma-separated), else none.
fn api_keys(file: Option<&std::path::Path>) -> anyhow::Result<Option<ApiKeys>> {
    if let Some(path) = file {
        return Ok(Some(ApiKeys::from_file(path).context("--api-key-file")?));
    }
    match std::env::var(API_KEYS_VAR) {
        Ok(list) => Ok(Some(ApiKeys::from_keys(
            list.split(',').map(str::trim).filter(|k| !k.is_empty()),
            API_KEYS_VAR,
        )?)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            anyhow::bail!("{API_KEYS_VAR}: not valid UTF-8")
        }
    }
}

/// An origin as browsers send it: `http(s)://host[:port]`, nothing after the host.
fn check_origin(origin: &str) -> anyhow::Result<()> {
    let host = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"));
    let ok = host.is_some_and(|h| {
        !h.is_empty()
            && h.bytes()
                .all(|b| b.is_ascii_graphic() && b != b'/' && b != b'?' && b != b'#')
    });
    anyhow::ensure!(
        ok,
        "--allowed-origin {}: expected an origin as browsers send it, http(s)://host[:port] (no path, no trailing slash)",
        origin.escape_debug()
    );
    Ok(())
}

/// Kyutai's web UI from the Hub, else (offline) the built-in page, said in one line.
fn kyutai_ui_or_built_in() -> WebUi {
    match moshi_server::web_ui::fetch_kyutai_ui(KYUTAI_UI_TIMEOUT) {
        Ok(dir) => WebUi::Dir(dir),
        Err(e) => {
            eprintln!(
                "Kyutai's web UI ({} {}) is not available ({}); serving the built-in page",
                moshi_server::web_ui::KYUTAI_UI_REPO,
                moshi_server::web_ui::KYUTAI_UI_FILE,
                one_line(&e)
            );
            WebUi::BuiltIn
        }
    }
}

/// The first line of `text`, at most 160 characters (the Hub's errors run over several).
fn one_line(text: &str) -> String {
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    match line.char_indices().nth(160) {
        Some((cut, _)) => format!("{}...", &line[..cut]),
        None => line.to_string(),
    }
}

/// Ctrl-C (SIGINT) and, on Unix, SIGTERM, each time they come.
struct StopSignals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn new() -> anyhow::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Self {
                term: signal(SignalKind::terminate()).context("listening for SIGTERM")?,
                int: signal(SignalKind::interrupt()).context("listening for Ctrl-C")?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    /// Waits for the next one; returns its name.
    async fn next(&mut self) -> anyhow::Result<&'static str> {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.int.recv() => Ok("Ctrl-C"),
                _ = self.term.recv() => Ok("SIGTERM"),
            }
        }
        #[cfg(not(unix))]
        {
            tokio::signal::ctrl_c()
                .await
                .context("waiting for Ctrl-C")?;
            Ok("Ctrl-C")
        }
    }
}
