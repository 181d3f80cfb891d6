//! moshi-server: `moshi-rs serve`, a real-time server speaking Kyutai's websocket protocol at
//! `/api/chat` (so Kyutai's web UI and Python client work unmodified), with Ogg/Opus audio both
//! ways, one conversation per connection through the same streaming pipeline as `chat` and
//! `file`, and a web UI at `/` (a Kyutai-style `dist/`, Kyutai's own UI from the Hub, or the
//! project's page built into the binary).
//!
//! Layers: [`protocol`] (message kinds), [`ogg_opus`] (the audio streams), [`query`] (session
//! settings), [`session_engine`] (the seam to the model: open a session, push frames, get
//! answers) with [`batch_engine`] behind it (the sessions with a frame waiting in one batched
//! step), `session` (one connection), [`app`] (routes, accept loop, TLS, shutdown),
//! [`web_ui`]; [`client`] speaks the protocol from Rust.

pub mod app;
pub mod batch_engine;
pub mod client;
pub mod ogg_opus;
pub mod protocol;
pub mod query;
pub mod recorder;
mod session;
pub mod session_engine;
pub mod tls;
pub mod web_ui;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub use app::{start, Limits, RunningServer, ServerConfig};
pub use web_ui::WebUi;

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("{flag} {path}: {detail}")]
    Tls {
        flag: &'static str,
        path: PathBuf,
        detail: String,
    },
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
