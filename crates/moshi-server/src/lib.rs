//! moshi-server: `moshi-rs serve`, a real-time server speaking Kyutai's websocket protocol at
//! `/api/chat` (so Kyutai's web UI and Python client work unmodified), with Ogg/Opus audio both
//! ways, one conversation per connection through the same streaming pipeline as `chat` and
//! `file`, and a web UI at `/` (a Kyutai-style `dist/`, Kyutai's own UI from the Hub, or the
//! project's page built into the binary); or, for a speech-to-text model, Kyutai moshi-server's
//! `/api/asr-streaming` (MessagePack messages, one transcription stream per connection).
//!
//! Layers: [`protocol`] / [`asr_protocol`] (the two protocols' messages), [`ogg_opus`] (the
//! audio streams), [`query`] (session settings), [`session_engine`] (the seam to the model:
//! open a session, push frames, get answers) with [`batch_engine`] behind it (the sessions with a
//! frame waiting in one batched step), `session` / [`asr_session`] (one connection of each
//! protocol) over `connection` (what both share: ends, outbox, pace, pings), [`api_keys`],
//! [`metrics`], [`module`] (one model at one path, with its own engine: a server hosts several,
//! as moshi-server's modules), [`app`] (routes, accept loop, TLS, drain), `operator` (probes,
//! capacity, metrics), [`web_ui`]; [`client`] speaks the chat protocol from Rust.

pub mod api_keys;
pub mod app;
pub mod asr_protocol;
pub mod asr_session;
pub mod batch_engine;
pub mod client;
mod connection;
pub mod metrics;
pub mod module;
pub mod ogg_opus;
mod operator;
pub mod protocol;
pub mod query;
pub mod recorder;
mod session;
pub mod session_engine;
pub mod tls;
pub mod tts_engine;
pub mod tts_protocol;
pub mod tts_session;
pub mod web_ui;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub use app::{start, Limits, RunningServer, ServerConfig};
pub use module::{Endpoint, Module};
pub use web_ui::WebUi;

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The cause is in the message and not chained as a source, so that `{:#}` says it once.
    #[error("cannot listen on {addr}: {cause}")]
    Bind {
        addr: SocketAddr,
        cause: std::io::Error,
    },
    #[error("{flag} {path}: {detail}")]
    Tls {
        flag: &'static str,
        path: PathBuf,
        detail: String,
    },
    /// A module that cannot be served (`path` empty: none given).
    #[error("module {path}: {detail}")]
    Module { path: String, detail: String },
    #[error("{flag} {path}: {detail}")]
    Folder {
        flag: &'static str,
        path: PathBuf,
        detail: String,
    },
}

/// Fails early when `dir` is not a writable folder.
pub fn check_writable_dir(dir: &Path, flag: &'static str) -> Result<(), ServerError> {
    let bad = |detail: String| ServerError::Folder {
        flag,
        path: dir.to_path_buf(),
        detail,
    };
    if dir.exists() && !dir.is_dir() {
        // `--record talk.wav` (as `chat` takes it): say what the flag wants.
        return Err(bad(
            "is a file, not a folder: each session's recording is written as files in this folder"
                .into(),
        ));
    }
    if !dir.is_dir() {
        return Err(bad("no such folder".into()));
    }
    tempfile::tempfile_in(dir)
        .map(drop)
        .map_err(|e| bad(format!("not writable: {e}")))
}

#[cfg(test)]
mod bind_error_tests {
    /// `moshi-rs serve` prints errors with their causes (`{:#}`): a bind error said
    /// "Address already in use" twice when its cause was both in the message and chained.
    #[test]
    fn a_bind_error_says_its_cause_once() {
        let e = super::ServerError::Bind {
            addr: "127.0.0.1:8998".parse().unwrap(),
            cause: std::io::Error::from(std::io::ErrorKind::AddrInUse),
        };
        assert!(std::error::Error::source(&e).is_none());
        let text = e.to_string();
        assert!(text.contains("127.0.0.1:8998"), "{text}");
        assert_eq!(text.to_lowercase().matches("in use").count(), 1, "{text}");
    }
}
