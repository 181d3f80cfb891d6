//! One model served at one websocket path, as moshi-server's modules are: its protocol
//! ([`Endpoint`]), its own batch engine, its defaults, what it reports (metadata, capacity,
//! `/api/modules_info`) and its own counters. A server hosts one or several.

use std::sync::Arc;

use axum::http::Uri;
use moshi_model::generator::SamplingConfig;
use serde_json::{json, Map, Value};

use crate::asr_session::AsrModel;
use crate::metrics::Metrics;
use crate::query::SessionRequest;
use crate::session_engine::SessionEngine;
use crate::tts_session::TtsService;

/// The protocol a module speaks: one variant per kind of model `serve` hosts.
#[derive(Debug, Clone)]
pub enum Endpoint {
    /// Kyutai's full-duplex `/api/chat` (Moshi, Hibiki), with the web UI at `/`.
    Chat,
    /// moshi-server's `/api/asr-streaming` (a speech-to-text model).
    AsrStreaming(AsrModel),
    /// moshi-server's `/api/tts_streaming` (a text-to-speech model).
    TtsStreaming(Arc<TtsService>),
}

impl Endpoint {
    /// Where Kyutai's clients look for it: moshi-server's and Kyutai's web UI's paths.
    pub fn default_path(&self) -> &'static str {
        match self {
            Self::Chat => "/api/chat",
            Self::AsrStreaming(_) => "/api/asr-streaming",
            Self::TtsStreaming(_) => "/api/tts_streaming",
        }
    }

    /// The `type` of `/api/modules_info` (moshi-server's names where it has the module).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::AsrStreaming(_) => "batched_asr",
            Self::TtsStreaming(_) => "tts_py",
        }
    }

    /// The protocol in words, for start-up lines and `/`.
    pub fn describe(&self) -> &'static str {
        match self {
            Self::Chat => "Kyutai's conversation protocol",
            Self::AsrStreaming(_) => "speech to text, moshi-server's protocol",
            Self::TtsStreaming(_) => "text to speech, moshi-server's protocol",
        }
    }
}

/// One model at one path: what it speaks, the engine running its sessions, and what it says.
pub struct Module {
    /// The websocket path (`/api/...`), unique in the server.
    pub path: String,
    pub endpoint: Endpoint,
    /// This module's sessions: one batched step runs all of them.
    pub engine: Arc<dyn SessionEngine>,
    /// The sampling a session starts from (a chat session's query string may change it).
    pub default_sampling: SamplingConfig,
    /// The LM weights file, shown by Kyutai's web UI and in `/api/modules_info`.
    pub lm_model_file: String,
    /// A description of the model for the metadata message.
    pub model_description: Value,
    /// This module's counters (the `module` label of `/metrics`).
    pub metrics: Metrics,
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("path", &self.path)
            .field("endpoint", &self.endpoint.kind())
            .field("lm_model_file", &self.lm_model_file)
            .finish_non_exhaustive()
    }
}

impl Module {
    /// `endpoint` at its default path, Kyutai's default sampling, no description.
    pub fn new(endpoint: Endpoint, engine: Arc<dyn SessionEngine>) -> Self {
        Self {
            path: endpoint.default_path().to_string(),
            endpoint,
            engine,
            default_sampling: SamplingConfig::default(),
            lm_model_file: String::new(),
            model_description: Value::Null,
            metrics: Metrics::default(),
        }
    }

    /// Sessions open now and at most.
    pub fn slots(&self) -> (usize, usize) {
        (self.engine.active_sessions(), self.engine.max_sessions())
    }

    /// Whether a session slot is free (draining aside).
    pub fn has_free_slot(&self) -> bool {
        let (used, total) = self.slots();
        used < total
    }

    /// The session settings for a query string (an error is a sentence for the client).
    pub fn request(&self, uri: &Uri) -> Result<SessionRequest, String> {
        let params: Vec<(String, String)> = axum::extract::Query::try_from_uri(uri)
            .map(|q: axum::extract::Query<Vec<(String, String)>>| q.0)
            .map_err(|e| format!("malformed query string: {e}"))?;
        SessionRequest::from_query(&params, &self.default_sampling)
    }

    /// The metadata message of a chat session: the fields Kyutai's web UI shows (settings,
    /// model file, instance, build), then ours (model, settings in force, query parameters
    /// ignored).
    pub fn metadata(&self, request: &SessionRequest, session_id: u64) -> Map<String, Value> {
        let mut m = request.settings_json();
        m.insert("lm_model_file".into(), json!(self.lm_model_file));
        m.insert("instance_name".into(), json!("moshi-rs"));
        let version = concat!("moshi-rs ", env!("CARGO_PKG_VERSION"));
        m.insert(
            "build_info".into(),
            json!({
                "build_timestamp": "", "build_date": "", "git_branch": "", "git_timestamp": "",
                "git_date": "", "git_hash": "", "git_describe": version, "rustc_host_triple": "",
                "rustc_version": "",
                "cargo_target_triple": format!("{}-{}", std::env::consts::ARCH, std::env::consts::OS),
            }),
        );
        m.insert("server".into(), json!(version));
        m.insert("session".into(), json!(session_id));
        m.insert("max_sessions".into(), json!(self.engine.max_sessions()));
        m.insert("model".into(), self.model_description.clone());
        m.insert("ignored_query_parameters".into(), json!(request.ignored));
        m
    }

    /// Its entry in `/api/modules_info`: moshi-server's shape (string values).
    pub fn info(&self) -> Value {
        let (used, total) = self.slots();
        json!({
            "type": self.endpoint.kind(),
            "path": self.path,
            "lm": self.lm_model_file,
            "used_slots": used.to_string(),
            "total_slots": total.to_string(),
        })
    }

    /// Its entry in `/api/capacity` (numbers), given whether the server drains.
    pub fn capacity(&self, draining: bool) -> Value {
        let (used, total) = self.slots();
        json!({
            "type": self.endpoint.kind(),
            "path": self.path,
            "lm": self.lm_model_file,
            "used": used,
            "total": total,
            "free": total.saturating_sub(used),
            "ready": !draining && used < total,
        })
    }
}

/// Paths a module may not take: the server's own.
const RESERVED_PATHS: &[&str] = &[
    "/",
    "/metrics",
    "/api/health",
    "/api/ready",
    "/api/capacity",
    "/api/modules_info",
    "/api/drain",
];

/// Why `path` cannot be a module's path (`None`: it can): it must be absolute, of plain
/// characters (letters, digits, `/_.-`: no route patterns), not one of the server's own paths,
/// and not a web UI file's (those live outside `/api/`, so a module path starts with `/api/`).
pub fn path_problem(path: &str) -> Option<String> {
    let plain = path
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/_.-".contains(&b));
    if !path.starts_with("/api/") || path.len() == "/api/".len() {
        return Some("expected a path under /api/ (e.g. /api/chat)".into());
    }
    if !plain || path.contains("//") || path.ends_with('/') {
        return Some(
            "expected letters, digits, `_`, `.`, `-` between single slashes, no trailing slash"
                .into(),
        );
    }
    if path.len() > 128 {
        return Some(format!("{} bytes: at most 128", path.len()));
    }
    RESERVED_PATHS
        .contains(&path)
        .then(|| "the server's own path".into())
}

#[cfg(test)]
mod tests {
    use super::path_problem;

    #[test]
    fn module_paths_are_plain_paths_under_api_and_not_the_servers_own() {
        for ok in [
            "/api/chat",
            "/api/asr-streaming",
            "/api/tts_streaming",
            "/api/v2/chat.fr",
        ] {
            assert_eq!(path_problem(ok), None, "{ok}");
        }
        for bad in [
            "",
            "chat",
            "/chat",
            "/api/",
            "/api",
            "/api/:id",
            "/api/*rest",
            "/api/{x}",
            "/api//chat",
            "/api/chat/",
            "/api/ready",
            "/api/drain",
            "/api/chat?x=1",
        ] {
            assert!(path_problem(bad).is_some(), "{bad:?} accepted");
        }
        assert!(path_problem(&format!("/api/{}", "a".repeat(200))).is_some());
    }
}
