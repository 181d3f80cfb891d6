//! What the server shows at `/`: a Kyutai-style `dist/` folder (`--static DIR`, or Kyutai's
//! own UI fetched as the official servers do: `dist.tgz` from the Hugging Face repo
//! `kyutai/moshi-artifacts`), the project's own page (built into the binary), or nothing
//! (`--static none`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
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
        WebUi::Dir(dir) => {
            let root = Arc::new(std::fs::canonicalize(dir).unwrap_or_else(|_| dir.clone()));
            Router::new()
                .fallback_service(tower_http::services::ServeDir::new(dir))
                .layer(axum::middleware::from_fn_with_state(
                    root,
                    inside_static_root,
                ))
        }
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

/// Lets through to `ServeDir` only the paths that name something inside the static root once
/// every symlink is resolved (a symlink in `--static` pointing outside it is not served), and
/// answers 404 to a path a file system cannot hold (a component over 255 bytes gave a 500).
async fn inside_static_root(
    State(root): State<Arc<PathBuf>>,
    request: Request,
    next: Next,
) -> Response {
    match static_path_allowed(&root, request.uri().path()) {
        true => next.run(request).await,
        false => not_found().await,
    }
}

/// Whether the request path `uri_path` may be served from `root` (canonical).
fn static_path_allowed(root: &Path, uri_path: &str) -> bool {
    let Some(decoded) = percent_decode(uri_path) else {
        return false;
    };
    let mut path = root.to_path_buf();
    for part in decoded.split('/') {
        match part {
            "" | "." => {}
            // ServeDir refuses these too; refusing here keeps the check simple.
            ".." => return false,
            // NAME_MAX on every file system we serve from.
            _ if part.len() > 255 => return false,
            _ => path.push(part),
        }
    }
    // What is not there is ServeDir's 404 (or its index.html fallback) to give.
    let Ok(real) = std::fs::canonicalize(&path) else {
        return true;
    };
    if !real.starts_with(root) {
        return false;
    }
    // A folder is served as its index.html, which may itself be a link.
    if real.is_dir() {
        if let Ok(index) = std::fs::canonicalize(real.join("index.html")) {
            return index.starts_with(root);
        }
    }
    true
}

/// `%XX` decoded, as UTF-8 (None: a bad escape or not UTF-8, which ServeDir refuses too).
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
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
