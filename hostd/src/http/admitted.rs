//! The steps every generation handler (chat, legacy completions, Responses, Anthropic messages
//! and token counts) takes before its own work, as one axum extractor, [`Admitted`]: the
//! arrival time is noted, the model must be loaded (else 503), the body is read under the
//! admission limits (413, 408) and parsed (400), and it must name the served model (404).
//!
//! Each request type says how it is parsed and in which shape its errors go out
//! ([`RequestBody`]): the OpenAI bodies through the field policy's parser, whose errors name
//! the field (`fields::parse_body`); the Anthropic bodies with serde's own errors, in
//! Anthropic's shape.

use super::anthropic::error::AnthropicError;
use super::anthropic::wire::{CountTokensRequest, MessagesRequest};
use super::error::ApiError;
use super::openai::{ChatCompletionRequest, CompletionRequest};
use super::responses::wire::CreateRequest;
use super::{AppState, Principal, Ready, RequestId, fields, params};
use axum::extract::{FromRequest, Request};
use axum::response::IntoResponse;
use std::sync::Arc;
use std::time::Instant;

/// A request body a generation handler takes.
pub trait RequestBody: Sized {
    /// The handler's error: its shape is the API's.
    type Error: From<ApiError> + IntoResponse;
    /// Parses the body.
    fn parse(body: &[u8]) -> Result<Self, ApiError>;
    /// The `model` the body names.
    fn model(&self) -> Option<&str>;
}

macro_rules! request_bodies {
    ($error:ty, $parse:expr => $($t:ty),*) => {
        $(impl RequestBody for $t {
            type Error = $error;
            fn parse(body: &[u8]) -> Result<Self, ApiError> {
                $parse(body)
            }
            fn model(&self) -> Option<&str> {
                self.model.as_deref()
            }
        })*
    };
}

request_bodies!(ApiError, fields::parse_body => ChatCompletionRequest, CompletionRequest, CreateRequest);
request_bodies!(AnthropicError, |b| Ok(serde_json::from_slice(b)?) => MessagesRequest, CountTokensRequest);

/// A generation request past the common checks (module doc), with what its handler needs.
pub struct Admitted<T> {
    /// The server's state.
    pub app: Arc<AppState>,
    /// The loaded model's tokenizer, engine and limits.
    pub ready: Arc<Ready>,
    /// The request's id (logs, metrics, response ids).
    pub request_id: String,
    /// When the request arrived (before its body was read).
    pub received: Instant,
    /// Who sent it (the API key it presented).
    pub principal: Principal,
    /// The parsed body.
    pub req: T,
}

impl<T: RequestBody + Send> FromRequest<Arc<AppState>> for Admitted<T> {
    type Rejection = T::Error;

    async fn from_request(request: Request, app: &Arc<AppState>) -> Result<Self, T::Error> {
        let received = Instant::now();
        let ready = Arc::clone(app.ready()?);
        let (parts, body) = request.into_parts();
        // `track` gives every request an id before any handler runs (every route is behind it).
        let request_id = parts
            .extensions
            .get::<RequestId>()
            .map(|RequestId(id)| id.clone());
        debug_assert!(
            request_id.is_some(),
            "a route outside the `track` middleware"
        );
        let request_id = request_id.unwrap_or_default();
        let principal = parts.extensions.get::<Principal>().copied();
        debug_assert!(
            principal.is_some(),
            "a /v1/ route outside the `track` middleware"
        );
        // Without the middleware there is no key to scope by: the keyless principal.
        let principal = principal.unwrap_or(Principal(None));
        let req = T::parse(&app.admission.read_body(&parts.headers, body).await?)?;
        params::check_model(req.model(), &app.config.served_model_name)?;
        Ok(Admitted {
            app: Arc::clone(app),
            ready,
            request_id,
            received,
            principal,
            req,
        })
    }
}
