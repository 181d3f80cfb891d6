//! `moshi-rs serve`: the websocket server of Kyutai's protocol (`/api/chat`) with a web UI at
//! `/`, or for a speech-to-text model moshi-server's `/api/asr-streaming`; with `--module`,
//! several models in one process, each at its own path with its own batched engine (as
//! moshi-server's modules). This file only reads the flags, loads each model once and starts
//! moshi-server; SIGTERM (or `POST /api/drain`) drains, Ctrl-C closes the sessions at once
//! (each with a goodbye).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use moshi_runtime::engine::DropPolicy;
use moshi_runtime::pipeline::MoshiPipeline;
use moshi_server::api_keys::ApiKeys;
use moshi_server::asr_session::AsrModel;
use moshi_server::batch_engine::BatchEngine;
use moshi_server::tls::TlsFiles;
use moshi_server::{Endpoint, Limits, Module, ServerConfig, WebUi};

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
    /// A model served at a path of its own, as moshi-server's modules: `PATH=MODEL` (PATH under
    /// /api/, e.g. `/api/asr-streaming=kyutai/stt-1b-en_fr`), or `MODEL` (a folder or Hugging
    /// Face repo) at its protocol's path: /api/chat for a model that speaks, /api/asr-streaming
    /// for speech to text. Repeat it to serve several models from one process, each with its
    /// own batched engine and --max-sessions slots. --quantize, --dequantize, --kv-cache and
    /// --mimi-weights apply to each; the sampling flags to the /api/chat modules.
    #[arg(
        long = "module",
        value_name = "[PATH=]MODEL",
        value_parser = ModuleSpec::parse,
        conflicts_with_all = ["model", "weights", "mimi", "tokenizer", "config"]
    )]
    pub modules: Vec<ModuleSpec>,
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
    /// A text-to-speech model's voices: a folder laid out as kyutai/tts-voices, or such a
    /// Hugging Face repo (a query's `voice` is a path in it without the model's suffix).
    /// Default: `voices/` in the model folder, else kyutai/tts-voices.
    #[arg(long, value_name = "DIR|REPO")]
    pub voices: Option<String>,
    /// Audio codebooks a text-to-speech model generates (moshi-server's `n_q`: it deploys 24 of
    /// the release's 32; fewer is faster and coarser). Default: all of them.
    #[arg(long, value_name = "N")]
    pub tts_n_q: Option<usize>,
    /// The voice of a text-to-speech stream whose query names none.
    #[arg(long, value_name = "NAME")]
    pub default_voice: Option<String>,
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

    let mut modules = Vec::new();
    for spec in module_specs(&args) {
        modules.push(load_module(&args, &spec)?);
    }
    let chat = modules.iter().any(|m| matches!(m.endpoint, Endpoint::Chat));
    // Only speech to text: what needs a conversation is refused, naming the model(s).
    let stt = || {
        let files: Vec<&str> = modules.iter().map(|m| m.lm_model_file.as_str()).collect();
        match files.as_slice() {
            [one] => format!("{one} is a speech-to-text model"),
            many => format!("{} are speech-to-text models", many.join(", ")),
        }
    };
    anyhow::ensure!(
        chat || args.record.is_none(),
        "--record: {}; recordings are made of /api/chat sessions",
        stt()
    );
    anyhow::ensure!(
        chat || matches!(static_ui, None | Some(WebUi::None)),
        "--static: {}, served at /api/asr-streaming without a web UI",
        stt()
    );
    // Greedy, as Kyutai's STT scripts (`temp=0`) and moshi-server (`temperature = 0`).
    anyhow::ensure!(
        chat || args.sampling.given().is_empty(),
        "{}: a speech-to-text model is served greedy (moshi-server's temperature 0); leave out the sampling flags",
        args.sampling.given().join(", ")
    );
    let web_ui = match static_ui {
        _ if !chat => WebUi::None,
        Some(ui) => ui,
        None => kyutai_ui_or_built_in(),
    };

    let mut config = ServerConfig::new(SocketAddr::new(args.host, args.port));
    config.web_ui = web_ui.clone();
    config.tls = tls;
    config.record_dir = args.record.clone();
    config.limits = Limits {
        idle_timeout: Duration::from_secs_f64(args.idle_timeout_s),
        max_session: args.max_session_s.map(Duration::from_secs_f64),
        ..Limits::default()
    };
    config.trust_forwarded = args.trust_forwarded;
    config.allowed_origins = args.allowed_origins.clone();
    config.api_keys = api_keys.clone();
    let served: Vec<(String, Endpoint)> = modules
        .iter()
        .map(|m| (m.path.clone(), m.endpoint.clone()))
        .collect();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("moshi-serve-io")
        .enable_all()
        .build()
        .context("starting tokio")?;
    runtime.block_on(async move {
        let mut signals = StopSignals::new()?;
        let server = moshi_server::start(config, modules).await?;
        startup_lines(&args, &served, &web_ui, api_keys.as_ref(), &server);
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

/// `--module [PATH=]MODEL`: a model, and the path to serve it at (default: its protocol's).
#[derive(Debug, Clone)]
pub struct ModuleSpec {
    pub path: Option<String>,
    pub model: String,
}

impl ModuleSpec {
    /// `PATH=MODEL` when the value starts with `/api/` and has an `=`, else `MODEL` alone.
    fn parse(value: &str) -> Result<Self, String> {
        let (path, model) = match value.split_once('=') {
            Some((path, model)) if path.starts_with("/api/") => (Some(path), model),
            // `/etc=MODEL` is a path outside /api/, unless a model folder by that whole name
            // exists (the sweep's find: it was "cannot find `/etc=MODEL`").
            Some((path, model)) if path.starts_with('/') && !Path::new(value).exists() => {
                (Some(path), model)
            }
            _ => (None, value),
        };
        if let Some(problem) = path.and_then(moshi_server::module::path_problem) {
            return Err(format!("path {}: {problem}", path.unwrap_or_default()));
        }
        if model.is_empty() {
            return Err(
                "expected [PATH=]MODEL: a model folder or Hugging Face repo after the =".into(),
            );
        }
        Ok(Self {
            path: path.map(str::to_string),
            model: model.to_string(),
        })
    }
}

/// The models to serve: `--module`s, else `--model` (or the default model) at its path.
fn module_specs(args: &ServeArgs) -> Vec<(Option<String>, ModelArgs)> {
    if args.modules.is_empty() {
        return vec![(None, args.model.clone())];
    }
    args.modules
        .iter()
        .map(|spec| {
            let mut model = args.model.clone();
            model.model = Some(spec.model.clone());
            (spec.path.clone(), model)
        })
        .collect()
}

/// Loads one model and starts its batched engine: a model that speaks is served at
/// /api/chat, a speech-to-text model at moshi-server's /api/asr-streaming (greedy, as
/// moshi-server's temperature 0), unless `path` says where.
fn load_module(
    args: &ServeArgs,
    (path, model_args): &(Option<String>, ModelArgs),
) -> anyhow::Result<Module> {
    let load_started = Instant::now();
    let resolved = model_args.resolve()?;
    if resolved.lm_config.is_text_to_speech() {
        return load_tts_module(args, path.as_deref(), model_args, resolved, load_started);
    }
    let mut loaded = model_args.load_resolved_model(
        resolved,
        &args.sampling,
        LIVE_DEFAULTS,
        args.max_sessions,
    )?;
    let endpoint = if loaded.model.conventions().generates_audio {
        Endpoint::Chat
    } else {
        // Greedy, as Kyutai's STT scripts (`temp=0`) and moshi-server (`temperature = 0`).
        loaded.settings.sampling.greedy = true;
        Endpoint::AsrStreaming(AsrModel::new(loaded.model.clone()))
    };
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
        Endpoint::TtsStreaming(_) => unreachable!("text-to-speech modules load in load_tts_module"),
    };
    let engine = BatchEngine::new(
        loaded.model.clone(),
        loaded.settings.clone(),
        args.max_sessions,
        policy,
        queue_capacity_frames,
    )
    .context("starting the compute thread")?;
    let mut module = Module::new(endpoint, std::sync::Arc::new(engine));
    if let Some(path) = path {
        module.path = path.clone();
    }
    // The flags' settings over the config's `lm_gen_config`: each session's starting point.
    module.default_sampling = loaded.settings.sampling.clone();
    module.lm_model_file = model.lm_weights_path.display().to_string();
    module.model_description = serde_json::json!({
        "weights": model.lm_weights_path.display().to_string(),
        "layout": format!("{:?}", model.layout),
        "mimi": model.mimi_weights_path.display().to_string(),
        "quantize": model_args.quantize.map(|q| q.name()),
        "dequantize": model_args.dequantize,
        "kv_cache": model_args.kv_cache_or(LIVE_DEFAULTS).to_string(),
        "activations": model_args.activations_or(LIVE_DEFAULTS).to_string(),
        "mimi_weights": model_args.mimi_weights.to_string(),
        "greedy": loaded.settings.sampling.greedy,
        "cfg_coef": pipeline_cfg_coef,
    });
    Ok(module)
}

/// A text-to-speech model at moshi-server's /api/tts_streaming (unless `path` says where): its
/// streams on a TTS engine, with Kyutai's TTS defaults (temperature 0.6, cfg 2.0 as the
/// distilled model's condition) unless the flags say otherwise.
fn load_tts_module(
    args: &ServeArgs,
    path: Option<&str>,
    model_args: &ModelArgs,
    resolved: moshi_loader::ResolvedModel,
    load_started: Instant,
) -> anyhow::Result<Module> {
    let model = std::sync::Arc::new(model_args.load_text_to_speech(&resolved, LIVE_DEFAULTS)?);
    super::declare_workload(args.max_sessions);
    let s = &args.sampling;
    let settings = moshi_runtime::pipeline::SessionSettings {
        sampling: moshi_model::generator::SamplingConfig {
            temp_text: s
                .temp_text
                .or(s.temp)
                .unwrap_or(super::speak::TTS_TEMPERATURE),
            temp_audio: s.temp.unwrap_or(super::speak::TTS_TEMPERATURE),
            seed: s.seed,
            greedy: s.greedy,
            ..Default::default()
        },
        kv_precision: model_args.kv_cache_or(LIVE_DEFAULTS),
        cfg_coef: None,
    };
    let cfg_coef = s.cfg_coef.unwrap_or(super::speak::TTS_CFG_COEF);
    let tts_settings = moshi_model::tts::TtsSettings {
        n_q: args.tts_n_q,
        ..Default::default()
    };
    moshi_model::tts::TtsStream::new(&resolved.lm_config, tts_settings).context("--tts-n-q")?;
    let engine = std::sync::Arc::new(
        moshi_server::tts_engine::TtsEngine::new(
            model.clone(),
            settings.clone(),
            tts_settings,
            cfg_coef,
            args.max_sessions,
        )
        .context("starting the compute thread")?,
    );
    let voices = super::speak::voice_source(args.voices.as_deref(), resolved.folder())?;
    let service = moshi_server::tts_session::TtsService::new(
        model.clone(),
        engine.clone(),
        voices.clone(),
        args.default_voice.clone(),
    );
    // Now, not at the first client: a bad --cfg-coef or --default-voice is an error naming it.
    moshi_model::tts::session_conditioning(&resolved.lm_config, cfg_coef, None)
        .with_context(|| format!("--cfg-coef {cfg_coef}"))?;
    if let Some(name) = &args.default_voice {
        service
            .voices_for(Some(name))
            .map_err(anyhow::Error::msg)
            .context("--default-voice")?;
    }
    eprintln!(
        "model: {} ({:?}), voices in the {}, ready in {:.1} s",
        resolved.lm_weights_path.display(),
        resolved.layout,
        voices.describe(),
        load_started.elapsed().as_secs_f64(),
    );
    let endpoint = Endpoint::TtsStreaming(std::sync::Arc::new(service));
    let mut module = Module::new(endpoint, engine);
    if let Some(path) = path {
        module.path = path.to_string();
    }
    module.default_sampling = settings.sampling.clone();
    module.lm_model_file = resolved.lm_weights_path.display().to_string();
    module.model_description = serde_json::json!({
        "weights": resolved.lm_weights_path.display().to_string(),
        "layout": format!("{:?}", resolved.layout),
        "mimi": resolved.mimi_weights_path.display().to_string(),
        "quantize": model_args.quantize.map(|q| q.name()),
        "voices": voices.describe(),
        "activations": model_args.activations_or(LIVE_DEFAULTS).to_string(),
        "cfg_coef": cfg_coef,
        "greedy": settings.sampling.greedy,
    });
    Ok(module)
}

/// Time the sessions get to say goodbye when the server stops.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// What an operator needs at start: what is served, at most how many, who may connect, how to
/// probe and stop it (the address is on stdout's `open` line).
fn startup_lines(
    args: &ServeArgs,
    served: &[(String, Endpoint)],
    web_ui: &WebUi,
    api_keys: Option<&ApiKeys>,
    server: &moshi_server::RunningServer,
) {
    let mut what: Vec<String> = served
        .iter()
        .map(|(path, endpoint)| format!("{path} ({})", endpoint.describe()))
        .collect();
    if served.iter().any(|(_, e)| matches!(e, Endpoint::Chat)) {
        what.push(web_ui.describe());
    }
    let what = what.join(", ");
    let interfaces = if args.host.is_unspecified() {
        "every interface".to_string()
    } else {
        args.host.to_string()
    };
    eprintln!(
        "serving {what} on {interfaces}, port {}; up to {} session(s) at once{}",
        server.local_addr().port(),
        args.max_sessions,
        if served.len() > 1 { " per model" } else { "" }
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
