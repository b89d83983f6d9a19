//! The OpenAI-compatible HTTP API of `hostd serve` (axum on tokio): routes, shared state,
//! request ids, API-key checks, request metrics, `/health`, `/v1/models` and `/metrics`.
//!
//! The caller owns the listener and the shutdown future ([`serve`]), so tests run the real
//! server on a temporary port. The server answers `/health` (503, `loading`) before the model
//! is loaded; [`AppState::set_ready`] switches it to serving. Generation requests go to the
//! engine's scheduler thread; handlers never run the model, and tokenise only through the
//! bounded pool of `admission.rs`.
//!
//! Files: `listener.rs` (accept loop and peer limits), `admission.rs` (body, prompt and
//! tokeniser limits), `admitted.rs` (the checks every generation handler starts with, as one
//! extractor), `openai.rs` (wire types), `params.rs` (validation), `fields.rs` (the
//! policy for fields without a typed slot, thinking switches), `error.rs` (the one
//! error → JSON mapping), `chat.rs` and `completions.rs` (the two OpenAI generation endpoints),
//! `generate.rs` (template → tokens → engine, shared by the chat-style endpoints), `stream.rs`
//! (SSE and collecting engine events), `anthropic/` (the Anthropic Messages API),
//! `responses/` (the OpenAI Responses API and its in-memory store of responses).
//!
//! The API key is accepted as `Authorization: Bearer <key>` or as `x-api-key: <key>`
//! (Anthropic's header) on every `/v1/` route. Errors of the `/v1/messages` routes, the
//! middleware's included, take Anthropic's shape.

pub mod admission;
mod admitted;
pub mod anthropic;
mod chat;
mod completions;
pub mod error;
pub mod fields;
mod generate;
mod json;
pub mod listener;
mod live;
pub mod openai;
pub mod params;
pub mod response_format;
pub mod responses;
mod stream;
#[cfg(test)]
mod test_support;
pub mod tools;
mod web;

use crate::engine::EngineHandle;
use crate::engine::metrics::Metrics;
use crate::tokenizer::Tokenizer;
use admission::{Admission, AdmissionConfig};
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use error::ApiError;
use listener::PeerLimits;
use serde_json::json;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use tracing::Instrument;

/// Settings of the HTTP layer (the engine has its own).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The name clients pass as `model`.
    pub served_model_name: String,
    /// When not empty, `/v1/*` requires one of these keys as `Authorization: Bearer <key>` or
    /// `x-api-key: <key>`. Each key is its own principal: what one stores (Responses API
    /// objects) another cannot read, continue or delete.
    pub api_keys: Vec<String>,
    /// Body, prompt and tokeniser limits.
    pub admission: AdmissionConfig,
    /// Connection limits and timeouts.
    pub peer: PeerLimits,
    /// Completion budget of a chat request that names none (clipped to the context).
    pub default_max_tokens: usize,
    /// Thinking default for chat requests (`--default-thinking`).
    pub enable_thinking: bool,
    /// Origins allowed cross-origin (`--cors-allow-origin`; `*` for any); empty: no CORS.
    pub cors_allow_origins: Vec<String>,
    /// Serve the web page at `/` (`hostd serve --no-web-page` turns it off).
    pub web_page: bool,
}

/// What exists once the model is loaded.
pub struct Ready {
    /// The scheduler's queue.
    pub engine: EngineHandle,
    /// The model's tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// Ids that end a generation (`<|im_end|>`, `<|endoftext|>`, config EOS).
    pub stop_ids: Vec<u32>,
    /// Unix seconds of the load (the model card's `created`).
    pub created: u64,
    /// The vocabulary's longest token in bytes (bounds prompt tokens from prompt bytes).
    pub max_token_bytes: usize,
    /// The model's expert backend, for its readiness in `/health`.
    pub experts: Option<Arc<dyn crate::experts::ExpertBackend>>,
    /// Constrained decoding over this tokenizer (built on the first constrained request).
    pub grammars: Arc<crate::constraint::Grammars>,
    /// The model's routing counts (the live panel's heat map).
    pub heat: Option<Arc<crate::model::heat::RoutingHeat>>,
}

/// State shared by every handler.
pub struct AppState {
    config: ServerConfig,
    metrics: Arc<Metrics>,
    /// Set once when loading ends; a `OnceLock` because it is written once and then only read.
    ready: OnceLock<Arc<Ready>>,
    /// Set instead of `ready` when loading failed.
    failed: OnceLock<String>,
    next_id: AtomicU64,
    /// Distinguishes request ids across restarts.
    id_salt: u64,
    /// Body, prompt and tokeniser limits.
    admission: Admission,
    /// Open HTTP connections (the listener counts them).
    connections: AtomicUsize,
    /// Stored responses of the Responses API (`previous_response_id`, `GET /v1/responses/{id}`).
    responses: responses::store::Store,
    /// Set when the server starts shutting down: open `/v1/live` feeds end, so a page left
    /// open does not hold the graceful shutdown for its whole grace period.
    closing: tokio::sync::watch::Sender<bool>,
}

impl AppState {
    /// State of a server whose model is not loaded yet.
    pub fn new(config: ServerConfig, metrics: Arc<Metrics>) -> Arc<AppState> {
        let id_salt = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let admission = Admission::new(config.admission.clone());
        Arc::new(AppState {
            config,
            metrics,
            ready: OnceLock::new(),
            failed: OnceLock::new(),
            next_id: AtomicU64::new(1),
            id_salt,
            admission,
            connections: AtomicUsize::new(0),
            responses: responses::store::Store::default(),
            closing: tokio::sync::watch::Sender::new(false),
        })
    }

    /// Ends every open `/v1/live` feed (the server is shutting down).
    pub fn close_feeds(&self) {
        self.closing.send_replace(true);
    }

    /// The model name requests must use (`--served-model-name`, else the checkpoint
    /// directory's name).
    pub fn served_model_name(&self) -> &str {
        &self.config.served_model_name
    }

    /// Switches the server to serving (called once, after the model loaded).
    pub fn set_ready(&self, ready: Ready) {
        let _ = self.ready.set(Arc::new(ready));
    }

    /// Records that loading failed; `/health` reports it.
    pub fn set_failed(&self, message: String) {
        let _ = self.failed.set(message);
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    fn ready(&self) -> Result<&Arc<Ready>, ApiError> {
        self.ready.get().ok_or_else(|| match self.failed.get() {
            Some(m) => ApiError::Unavailable(format!("The model failed to load: {m}")),
            None => ApiError::Unavailable("The model is still loading; retry shortly.".to_string()),
        })
    }

    fn new_request_id(&self) -> String {
        let n = self.next_id.fetch_add(1, Relaxed);
        format!("{:08x}{n:08x}", self.id_salt & 0xffff_ffff)
    }
}

/// Who sent a `/v1/*` request: the index of the API key it presented in
/// [`ServerConfig::api_keys`], or `None` when the server has no keys (every caller is the same
/// principal). Set by the request middleware on every request it lets through to `/v1/*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Principal(pub Option<usize>);

/// The request id of one request (from `x-request-id` when the client sent a sane one).
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

tokio::task_local! {
    /// The id of the request whose handler runs on this task (set by the request middleware).
    static REQUEST_ID: String;
}

/// The current request's id, inside a handler (errors name it in their body).
pub(crate) fn current_request_id() -> Option<String> {
    REQUEST_ID.try_with(Clone::clone).ok()
}

/// Seconds since the Unix epoch.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `system_fingerprint` of every response.
pub(crate) fn fingerprint() -> String {
    format!("sluice-hostd-{}", env!("CARGO_PKG_VERSION"))
}

/// All routes with their middleware. CORS, when configured, is the outermost layer, so a
/// preflight is answered before the API-key check (browsers send preflights without it).
pub fn router(state: Arc<AppState>) -> Router {
    let cors = cors_layer(&state.config.cors_allow_origins);
    let router = Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::retrieve).delete(responses::delete),
        )
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model_card))
        .route("/health", get(health))
        .route("/health/live", get(live))
        .route("/metrics", get(metrics))
        .route("/v1/live", get(live::live));
    let router = if state.config.web_page {
        router
            .route("/", get(web::page))
            .route("/favicon.ico", get(web::favicon))
    } else {
        router
    };
    let router = router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(Arc::clone(&state), track))
        .with_state(state);
    match cors {
        Some(layer) => router.layer(layer),
        None => router,
    }
}

/// The CORS layer for `--cors-allow-origin` values: any request header, the methods the API
/// uses, and the response headers a browser client reads (request id, retry hint).
fn cors_layer(origins: &[String]) -> Option<tower_http::cors::CorsLayer> {
    use tower_http::cors::{AllowOrigin, Any, CorsLayer};
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::from(Any)
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    let layer = CorsLayer::new()
        .allow_origin(allow)
        .allow_methods([
            axum::http::Method::GET,
            axum::http::Method::POST,
            axum::http::Method::DELETE,
            axum::http::Method::OPTIONS,
        ])
        .allow_headers(Any)
        .expose_headers([
            header::HeaderName::from_static("x-request-id"),
            header::HeaderName::from_static("request-id"),
            header::RETRY_AFTER,
        ])
        .max_age(std::time::Duration::from_secs(600));
    Some(layer)
}

/// Serves until `shutdown` resolves, then lets in-flight requests finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(Arc::clone(&state));
    listener::serve(listener, state, app, shutdown).await
}

/// An error of the middleware or a fallback, in Anthropic's shape on Anthropic's routes.
fn error_response(path: &str, e: ApiError) -> Response {
    if anthropic::owns(path) {
        anthropic::error::AnthropicError(e).into_response()
    } else {
        e.into_response()
    }
}

/// Request id, INFO span, API-key check and request metrics around every handler.
async fn track(State(app): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let start = Instant::now();
    let path = req.uri().path().to_string();
    let endpoint = Metrics::endpoint_label(&path);
    let id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|s| {
            !s.is_empty()
                && s.len() <= 64
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        })
        .map_or_else(|| app.new_request_id(), str::to_string);
    let span =
        tracing::info_span!("request", request_id = %id, method = %req.method(), path = %path);
    req.extensions_mut().insert(RequestId(id.clone()));
    let principal = if app.config.api_keys.is_empty() || !path.starts_with("/v1/") {
        Some(Principal(None))
    } else {
        matching_key(&req, &app.config.api_keys).map(|i| Principal(Some(i)))
    };
    let authorized = principal.is_some();
    if let Some(p) = principal {
        req.extensions_mut().insert(p);
    }
    // A connection beyond --max-connections may only ask for /health.
    let overflow = req.extensions().get::<listener::Overflow>().is_some()
        && !matches!(path.as_str(), "/health" | "/health/live");
    let mut resp = if overflow {
        let message = format!(
            "The server has {} connections open (--max-connections).",
            app.config.peer.max_connections
        );
        error_response(
            &path,
            ApiError::Busy {
                message,
                retry_after_s: 1,
            },
        )
    } else if authorized {
        REQUEST_ID
            .scope(id.clone(), next.run(req).instrument(span.clone()))
            .await
    } else {
        REQUEST_ID
            .scope(id.clone(), async {
                error_response(&path, ApiError::Unauthorized)
            })
            .await
    };
    let status = resp.status().as_u16();
    app.metrics
        .record_request(endpoint, status, start.elapsed());
    span.in_scope(|| {
        tracing::info!(
            status,
            took_ms = start.elapsed().as_millis() as u64,
            "response"
        );
    });
    if let Ok(v) = HeaderValue::from_str(&id) {
        if anthropic::owns(&path) {
            // Anthropic's clients read the id from `request-id`.
            resp.headers_mut().insert("request-id", v.clone());
        }
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

/// The index of the key the request carries, as a bearer token or in `x-api-key`. Each
/// comparison is constant-time (no early exit on the first differing byte), and every key is
/// compared, so the time taken does not say which key nearly matched.
fn matching_key(req: &Request, keys: &[String]) -> Option<usize> {
    let header = |name| {
        req.headers()
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    let bearer = header(header::AUTHORIZATION).and_then(|v| v.strip_prefix("Bearer "));
    let x_api_key = header(header::HeaderName::from_static("x-api-key"));
    let mut found = None;
    for token in [bearer, x_api_key].into_iter().flatten() {
        for (i, key) in keys.iter().enumerate() {
            let same = subtle::ConstantTimeEq::ct_eq(token.trim().as_bytes(), key.as_bytes());
            if bool::from(same) && found.is_none() {
                found = Some(i);
            }
        }
    }
    found
}

async fn not_found(req: Request) -> Response {
    route_error(&req, |method, path| ApiError::RouteNotFound {
        method,
        path,
    })
}

async fn method_not_allowed(req: Request) -> Response {
    route_error(&req, |method, path| ApiError::MethodNotAllowed {
        method,
        path,
    })
}

/// The error for a request no route takes, from its method and path, in its path's shape.
fn route_error(req: &Request, error: fn(String, String) -> ApiError) -> Response {
    let path = req.uri().path().to_string();
    error_response(&path.clone(), error(req.method().to_string(), path))
}

/// `GET /health`: 200 `ready` with queue counters once the model is loaded, else 503. With
/// the expertd backend, 503 `degraded` (connected, not answering in time) or `unavailable`
/// (gone, restarting) or `failing` (a corrupt expert: requests routed to it fail) while requests
/// would fail, with the reason under `experts`: a readiness
/// probe stops routing to this server until the daemon is back (`/health` itself still answers
/// at once, so a liveness check on it does not restart a healthy hostd). 503 `stopped` if the
/// generation engine's thread has ended (every request would fail).
async fn health(State(app): State<Arc<AppState>>) -> Response {
    let m = &app.metrics;
    match (app.ready.get(), app.failed.get()) {
        (Some(r), _) => {
            let c = r.engine.config();
            let experts = r
                .experts
                .as_ref()
                .and_then(|e| e.health().map(|h| (e.name(), h)));
            let (code, status) = match experts.as_ref().map(|(_, h)| h.readiness) {
                _ if !r.engine.is_running() => (StatusCode::SERVICE_UNAVAILABLE, "stopped"),
                None | Some(crate::expert_client::health::Readiness::Ready) => {
                    (StatusCode::OK, "ready")
                }
                Some(other) => (StatusCode::SERVICE_UNAVAILABLE, other.as_str()),
            };
            let mut body = json!({
                "status": status,
                "model": app.config.served_model_name,
                "api_key_required": !app.config.api_keys.is_empty(),
                "queue_depth": m.queue_depth.get(),
                "max_queue": c.max_queue,
                "active_sequences": m.active_sequences.get(),
                "max_batch": c.max_batch,
                "max_context": c.max_context,
                "connections": app.connections.load(Relaxed),
                "max_connections": app.config.peer.max_connections,
            });
            if let Some((backend, h)) = experts {
                // /health needs no key: the reason says what is wrong in general terms; the
                // detail (the daemon's address, the error) is in hostd's log.
                let reason = h.reason.as_ref().map(|_| public_reason(h.readiness));
                body["experts"] = json!({
                    "backend": backend,
                    "status": h.readiness.as_str(),
                    "reason": reason,
                    "for_s": h.for_s,
                    "restarts": h.restarts,
                });
            }
            (code, axum::Json(body)).into_response()
        }
        (None, Some(msg)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({ "status": "error", "message": msg })),
        )
            .into_response(),
        (None, None) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({ "status": "loading" })),
        )
            .into_response(),
    }
}

/// `GET /health/live`: a liveness probe's answer. 200 while this process serves and its
/// generation engine runs (or the model is still loading) — also while the expert daemon is
/// away or reports a corrupt expert, which a restart of hostd would not fix; 503 only if the
/// engine's thread has ended. `/health` is the readiness answer: 503 whenever requests would
/// fail.
async fn live(State(app): State<Arc<AppState>>) -> Response {
    let stopped = app.ready.get().is_some_and(|r| !r.engine.is_running());
    let (code, status) = if stopped {
        (StatusCode::SERVICE_UNAVAILABLE, "stopped")
    } else {
        (StatusCode::OK, "alive")
    };
    (code, axum::Json(json!({ "status": status }))).into_response()
}

/// What `/health` says about an expert daemon that is not ready.
fn public_reason(readiness: crate::expert_client::health::Readiness) -> &'static str {
    use crate::expert_client::health::Readiness;
    match readiness {
        Readiness::Ready => "expertd is answering",
        Readiness::Degraded => {
            "expertd is connected but not answering within the call deadline (the detail is in hostd's log)"
        }
        Readiness::Failing => {
            "expertd answers, but it reported a corrupt expert and requests routed to it fail (`expertd verify --deep` names it; the detail is in hostd's log)"
        }
        Readiness::Unavailable => {
            "expertd cannot be reached; hostd keeps reconnecting (the detail is in hostd's log)"
        }
    }
}

fn card(app: &AppState, r: &Ready) -> openai::ModelCard {
    openai::ModelCard {
        id: app.config.served_model_name.clone(),
        object: "model",
        created: r.created,
        owned_by: "sluice",
        max_model_len: r.engine.config().max_context,
    }
}

/// `GET /v1/models`.
async fn models(State(app): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let r = app.ready()?;
    Ok(axum::Json(openai::ModelList {
        object: "list",
        data: vec![card(&app, r)],
    })
    .into_response())
}

/// `GET /v1/models/{id}`.
async fn model_card(
    State(app): State<Arc<AppState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    let r = app.ready()?;
    if id != app.config.served_model_name {
        return Err(ApiError::ModelNotFound(id));
    }
    Ok(axum::Json(card(&app, r)).into_response())
}

/// `GET /metrics`: Prometheus text (format 0.0.4).
async fn metrics(State(app): State<Arc<AppState>>) -> Response {
    let body = app.metrics.render();
    (
        [(header::CONTENT_TYPE, crate::engine::metrics::CONTENT_TYPE)],
        body,
    )
        .into_response()
}
