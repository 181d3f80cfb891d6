//! The operator's routes, whatever the modules: `GET /metrics`, `/api/health`, `/api/ready`,
//! `/api/capacity`, `/api/modules_info` and `POST /api/drain`. Readiness and capacity are per
//! module as well as for the whole server.

use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

use crate::app::{unavailable, AppState, ClientAddr, PeerAddr, API_KEY_HEADER};
use crate::module::Module;

/// The operator's routes.
pub fn routes(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/api/health", get(health))
        .route("/api/ready", get(ready))
        .route("/api/capacity", get(capacity))
        .route("/api/modules_info", get(modules_info))
        .route("/api/drain", post(drain))
        .with_state(state)
}

/// `GET /metrics`: Prometheus' text format.
async fn metrics(State(app): State<Arc<AppState>>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        app.metrics_text(),
    )
        .into_response()
}

/// `GET /api/health`: the process answers (liveness).
async fn health() -> &'static str {
    "ok\n"
}

/// `GET /api/ready`: 200 while the server is not draining and a module has a free session
/// slot, else 503 (readiness: a load balancer sends new sessions elsewhere). With
/// `?module=PATH`, that module's slots only (a balancer with one backend per protocol).
async fn ready(uri: Uri, State(app): State<Arc<AppState>>) -> Response {
    let wanted = match query_module(&app, &uri) {
        Ok(wanted) => wanted,
        Err(answer) => return *answer,
    };
    let modules: Vec<&Arc<Module>> = app
        .modules()
        .iter()
        .filter(|m| wanted.as_ref().is_none_or(|w| m.path == *w))
        .collect();
    let slots = modules
        .iter()
        .map(|m| {
            let (used, total) = m.slots();
            format!("{}: {used} of {total} session(s) in use", m.path)
        })
        .collect::<Vec<_>>()
        .join("; ");
    if app.draining() {
        unavailable("draining")
    } else if modules.iter().any(|m| m.has_free_slot()) {
        format!("ready: {slots}\n").into_response()
    } else {
        unavailable(&format!("full: {slots}"))
    }
}

/// The `module` query parameter of a probe: `None` when absent, else a module's path; an
/// unknown path is answered 404 naming the paths served.
fn query_module(app: &AppState, uri: &Uri) -> Result<Option<String>, Box<Response>> {
    let params: Vec<(String, String)> = axum::extract::Query::try_from_uri(uri)
        .map(|q: axum::extract::Query<Vec<(String, String)>>| q.0)
        .unwrap_or_default();
    let Some((_, path)) = params.into_iter().find(|(name, _)| name == "module") else {
        return Ok(None);
    };
    if app.modules().iter().any(|m| m.path == path) {
        return Ok(Some(path));
    }
    let served: Vec<&str> = app.modules().iter().map(|m| m.path.as_str()).collect();
    Err(Box::new(
        (
            StatusCode::NOT_FOUND,
            format!(
                "no module at {}: this server serves {}\n",
                path.escape_debug(),
                served.join(", ")
            ),
        )
            .into_response(),
    ))
}

/// `GET /api/capacity`: `used`, `total`, `free` over every module, `draining`, `ready` (as
/// `/api/ready`), and the same per module.
async fn capacity(State(app): State<Arc<AppState>>) -> Response {
    let draining = app.draining();
    let (used, total) = app.modules().iter().fold((0, 0), |(u, t), m| {
        let (used, total) = m.slots();
        (u + used, t + total)
    });
    let ready = !draining && app.modules().iter().any(|m| m.has_free_slot());
    let modules: Vec<Value> = app.modules().iter().map(|m| m.capacity(draining)).collect();
    json_response(&json!({
        "used": used,
        "total": total,
        "free": total.saturating_sub(used),
        "draining": draining,
        "ready": ready,
        "modules": modules,
    }))
}

/// `GET /api/modules_info`: moshi-server's shape (a list of string maps, one per module).
async fn modules_info(State(app): State<Arc<AppState>>) -> Response {
    let modules: Vec<Value> = app.modules().iter().map(|m| m.info()).collect();
    json_response(&Value::Array(modules))
}

/// `value` as an `application/json` answer.
fn json_response(value: &Value) -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

/// `POST /api/drain`: starts a drain as SIGTERM does. With API keys it needs one; without,
/// only a client on this machine may.
async fn drain(
    uri: Uri,
    headers: HeaderMap,
    State(app): State<Arc<AppState>>,
    Extension(PeerAddr(peer)): Extension<PeerAddr>,
) -> Response {
    let client = ClientAddr::of_request(peer, &headers, app.trust_forwarded());
    let allowed = if app.has_api_keys() {
        app.authorized(&headers, &uri)
    } else {
        client.ip.is_loopback()
    };
    if !allowed {
        tracing::warn!(peer = %client, "POST /api/drain refused");
        let why = if app.has_api_keys() {
            format!("missing or unknown API key: send it in the {API_KEY_HEADER} header or the auth_id query parameter\n")
        } else {
            "without API keys, only a client on this machine may drain the server\n".into()
        };
        return (StatusCode::FORBIDDEN, why).into_response();
    }
    app.start_drain(&format!("POST /api/drain from {client}"));
    (
        StatusCode::ACCEPTED,
        format!("draining: {} session(s) live\n", app.running_sessions()),
    )
        .into_response()
}
