//! What the server shows at `/`: a Kyutai-style `dist/` folder (`--static DIR`, or Kyutai's
//! own UI fetched as the official servers do: `dist.tgz` from the Hugging Face repo
//! `kyutai/moshi-artifacts`), the project's own page (built into the binary), or nothing
//! (`--static none`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use moshi_loader::hub::{HubRepo, HubSettings};

/// The Hugging Face repo and file of Kyutai's built web UI.
pub const KYUTAI_UI_REPO: &str = "kyutai/moshi-artifacts";
pub const KYUTAI_UI_FILE: &str = "dist.tgz";

/// Largest `dist.tgz` unpacked (Kyutai's is about 2 MB).
const MAX_UNPACKED_BYTES: u64 = 256 * 1024 * 1024;

/// The page(s) served at `/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebUi {
    /// A folder with `index.html` (a Kyutai-style `dist/`).
    Dir(PathBuf),
    /// The project's own page, built into the binary.
    BuiltIn,
    /// API only.
    None,
}

impl WebUi {
    /// A `--static DIR` folder, checked.
    pub fn dir(path: &Path) -> Result<Self, String> {
        if !path.join("index.html").is_file() {
            return Err(format!(
                "--static {}: expected a folder with an index.html (a built web UI such as Kyutai's client/dist)",
                path.display()
            ));
        }
        Ok(Self::Dir(path.to_path_buf()))
    }

    pub fn describe(&self) -> String {
        match self {
            Self::Dir(d) => format!("web UI from {}", d.display()),
            Self::BuiltIn => "the built-in web page".into(),
            Self::None => "no web UI (API only)".into(),
        }
    }
}

/// Kyutai's web UI as the official servers get it: `dist.tgz` from the Hub (or its cache),
/// unpacked once next to the cached file. Gives up after `timeout` (offline machines).
pub fn fetch_kyutai_ui(timeout: Duration) -> Result<PathBuf, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("kyutai-ui-fetch".into())
        .spawn(move || {
            let _ = tx.send(fetch_and_unpack());
        })
        .map_err(|e| format!("cannot start the download: {e}"))?;
    rx.recv_timeout(timeout).unwrap_or_else(|_| {
        Err(format!(
            "no answer from the Hugging Face Hub within {} s",
            timeout.as_secs()
        ))
    })
}

fn fetch_and_unpack() -> Result<PathBuf, String> {
    let mut settings = HubSettings::from_env();
    settings.progress = false;
    let repo = HubRepo::new(KYUTAI_UI_REPO, &settings);
    let tgz = if settings.offline {
        let cached = repo
            .cached_snapshot()
            .map_err(|e| e.to_string())?
            .join(KYUTAI_UI_FILE);
        if !cached.is_file() {
            return Err(format!(
                "HF_HUB_OFFLINE is set and {} is not in the cached snapshot",
                KYUTAI_UI_FILE
            ));
        }
        cached
    } else {
        repo.download(KYUTAI_UI_FILE).map_err(|e| e.to_string())?
    };
    let parent = tgz
        .parent()
        .ok_or_else(|| format!("{}: no parent folder", tgz.display()))?;
    let dist = parent.join("dist");
    if dist.join("index.html").is_file() {
        return Ok(dist);
    }
    unpack_dist(&tgz, parent)?;
    if !dist.join("index.html").is_file() {
        return Err(format!("{}: no dist/index.html inside", tgz.display()));
    }
    Ok(dist)
}

/// Unpacks a `.tgz` into a fresh folder inside `into`, then moves its `dist/` into place, so
/// an interrupted unpack never leaves a half-written `dist/`.
fn unpack_dist(tgz: &Path, into: &Path) -> Result<(), String> {
    let staging = tempfile::tempdir_in(into)
        .map_err(|e| format!("{}: cannot create a folder: {e}", into.display()))?;
    let file = std::fs::File::open(tgz).map_err(|e| format!("{}: {e}", tgz.display()))?;
    let limited = flate2::read::GzDecoder::new(file).take(MAX_UNPACKED_BYTES);
    let mut archive = tar::Archive::new(limited);
    // `unpack` refuses entries that would land outside the folder (absolute paths, `..`).
    archive
        .unpack(staging.path())
        .map_err(|e| format!("{}: cannot unpack: {e}", tgz.display()))?;
    std::fs::rename(staging.path().join("dist"), into.join("dist"))
        .map_err(|e| format!("{}: no dist/ folder inside ({e})", tgz.display()))?;
    Ok(())
}

/// The built-in page's files.
const PAGE_FILES: [(&str, &str, &str); 3] = [
    (
        "/",
        "text/html; charset=utf-8",
        include_str!("../web/index.html"),
    ),
    (
        "/moshi-rs.js",
        "text/javascript; charset=utf-8",
        include_str!("../web/moshi-rs.js"),
    ),
    (
        "/moshi-rs-worklets.js",
        "text/javascript; charset=utf-8",
        include_str!("../web/moshi-rs-worklets.js"),
    ),
];

/// Routes serving `ui` (everything but `/api/chat`).
pub fn routes<S: Clone + Send + Sync + 'static>(ui: &WebUi) -> Router<S> {
    match ui {
        WebUi::Dir(dir) => Router::new().fallback_service(tower_http::services::ServeDir::new(dir)),
        WebUi::BuiltIn => {
            let mut router = Router::new();
            for (path, content_type, body) in PAGE_FILES {
                router = router.route(
                    path,
                    get(move || async move {
                        (
                            [
                                (header::CONTENT_TYPE, content_type),
                                (header::CACHE_CONTROL, "no-cache"),
                            ],
                            body,
                        )
                    }),
                );
            }
            router.fallback(not_found)
        }
        WebUi::None => Router::new().fallback(api_only),
    }
}

async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "not found\n").into_response()
}

async fn api_only() -> Response {
    (
        StatusCode::NOT_FOUND,
        "this server runs without a web UI (--static none): connect a Moshi client to /api/chat\n",
    )
        .into_response()
}
