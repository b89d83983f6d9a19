//! The one place where errors become OpenAI's error JSON
//! (`{"error": {"message", "type", "param", "code"}}`) and an HTTP status.
//!
//! Every handler returns [`ApiError`]; the `From` impls below map the library errors it can
//! meet (sampling ranges, chat template, queue, body limits, JSON syntax), so the status and
//! the `type`/`code` strings are decided here and nowhere else.

use crate::chat_template::ChatTemplateError;
use crate::engine::{Failure, SubmitError};
use crate::sampling::SamplingError;
use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// A request that cannot be served, as the client will see it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed or asks for something unsupported (400).
    #[error("{message}")]
    InvalidRequest {
        /// What is wrong, as a sentence.
        message: String,
        /// The offending field (`messages[1].role`), when one is to blame.
        param: Option<String>,
        /// A stable machine-readable code.
        code: &'static str,
    },
    /// The prompt (plus the requested completion) does not fit the context (400).
    #[error(
        "This model's maximum context length is {max_context} tokens. However, you requested {requested} tokens ({prompt_tokens} in the prompt, {completion_tokens} for the completion). Please reduce the length of the prompt or the completion."
    )]
    ContextLength {
        /// The server's context limit.
        max_context: usize,
        /// Prompt + completion tokens asked for.
        requested: usize,
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Completion tokens asked for (or the minimum of 1).
        completion_tokens: usize,
        /// The field holding the prompt (`messages` or `prompt`).
        param: &'static str,
    },
    /// `model` names a model this server does not serve (404).
    #[error("The model `{0}` does not exist or you do not have access to it.")]
    ModelNotFound(String),
    /// A stored object (a response of the Responses API) does not exist, or no longer (404).
    #[error("{message}")]
    NotFound {
        /// What was not found, naming its id.
        message: String,
        /// A stable machine-readable code.
        code: &'static str,
    },
    /// No route for this path (404).
    #[error("Unknown request URL: {method} {path}.")]
    RouteNotFound {
        /// HTTP method.
        method: String,
        /// Request path.
        path: String,
    },
    /// The path exists but not for this method (405).
    #[error("Method {method} is not allowed for {path}.")]
    MethodNotAllowed {
        /// HTTP method.
        method: String,
        /// Request path.
        path: String,
    },
    /// Missing or wrong API key (401).
    #[error(
        "Incorrect or missing API key. Send it as `Authorization: Bearer <key>` or `x-api-key: <key>`."
    )]
    Unauthorized,
    /// The body exceeds the server's limit (413).
    #[error("Request body too large: the limit is {limit_bytes} bytes.")]
    BodyTooLarge {
        /// The limit.
        limit_bytes: usize,
    },
    /// The queue is full (429, with `Retry-After`).
    #[error(
        "The server is at capacity ({max_queue} requests queued). Retry after {retry_after_s} s."
    )]
    QueueFull {
        /// The queue limit.
        max_queue: usize,
        /// Suggested wait in seconds.
        retry_after_s: u64,
    },
    /// The queued prompts hold too many tokens (429, with `Retry-After`).
    #[error(
        "The server is at capacity ({queued_tokens} prompt tokens queued; this request's {prompt_tokens} would pass the limit of {max_queued_tokens}). Retry after {retry_after_s} s."
    )]
    QueuedTokensFull {
        /// Prompt tokens already queued.
        queued_tokens: u64,
        /// This request's prompt tokens.
        prompt_tokens: u64,
        /// The limit.
        max_queued_tokens: usize,
        /// Suggested wait in seconds.
        retry_after_s: u64,
    },
    /// The model is still loading, or the engine stopped (503).
    #[error("{0}")]
    Unavailable(String),
    /// A bounded server resource (tokeniser pool, connection slots) is taken (503, with
    /// `Retry-After`).
    #[error("{message} Retry after {retry_after_s} s.")]
    Busy {
        /// What is busy, as a sentence.
        message: String,
        /// Suggested wait in seconds.
        retry_after_s: u64,
    },
    /// The client did not send the request body in time (408).
    #[error("The request body was not received within {limit_s} s.")]
    BodyTimeout {
        /// The limit (`--body-timeout`).
        limit_s: u64,
    },
    /// The model failed while generating (500). The detail goes to the server log only; the
    /// client gets a generic message with the request id (see [`ApiError::body`]).
    #[error("Generation failed: {0}")]
    Internal(String),
    /// The expert daemon is unreachable or did not answer in time (503, with `Retry-After`):
    /// the same request may succeed when retried.
    #[error("The expert backend is unavailable; retry after {retry_after_s} s. {message}")]
    ExpertsUnavailable {
        /// What failed, naming the daemon.
        message: String,
        /// Suggested wait in seconds.
        retry_after_s: u64,
    },
}

impl ApiError {
    /// A 400 naming the field at fault.
    pub fn invalid(message: impl Into<String>, param: impl Into<String>) -> ApiError {
        ApiError::InvalidRequest {
            message: message.into(),
            param: Some(param.into()),
            code: "invalid_value",
        }
    }

    /// A 400 for a recognised OpenAI feature this server does not implement.
    pub fn unsupported(what: impl Into<String>, param: impl Into<String>) -> ApiError {
        ApiError::InvalidRequest {
            message: what.into(),
            param: Some(param.into()),
            code: "unsupported_parameter",
        }
    }

    /// A 400 for a required field that is absent.
    pub fn missing(param: &str) -> ApiError {
        ApiError::InvalidRequest {
            message: format!("Missing required parameter: '{param}'."),
            param: Some(param.to_string()),
            code: "missing_required_parameter",
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidRequest { .. } | ApiError::ContextLength { .. } => {
                StatusCode::BAD_REQUEST
            }
            ApiError::ModelNotFound(_)
            | ApiError::RouteNotFound { .. }
            | ApiError::NotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::QueueFull { .. } | ApiError::QueuedTokensFull { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            ApiError::Unavailable(_)
            | ApiError::Busy { .. }
            | ApiError::ExpertsUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The server is at capacity (full queue or queued-token budget, busy tokeniser pool or
    /// connection cap): retryable, and the one case other APIs map apart (Anthropic's 529).
    pub fn at_capacity(&self) -> bool {
        matches!(
            self,
            ApiError::QueueFull { .. } | ApiError::QueuedTokensFull { .. } | ApiError::Busy { .. }
        )
    }

    /// OpenAI's `type` string.
    pub fn error_type(&self) -> &'static str {
        match self {
            ApiError::Unauthorized => "authentication_error",
            ApiError::QueueFull { .. } | ApiError::QueuedTokensFull { .. } => "rate_limit_error",
            ApiError::Unavailable(_)
            | ApiError::Busy { .. }
            | ApiError::Internal(_)
            | ApiError::ExpertsUnavailable { .. } => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The stable `code` string (also usable as a metric label).
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::InvalidRequest { code, .. } => code,
            ApiError::ContextLength { .. } => "context_length_exceeded",
            ApiError::ModelNotFound(_) => "model_not_found",
            ApiError::NotFound { code, .. } => code,
            ApiError::RouteNotFound { .. } => "unknown_url",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::Unauthorized => "invalid_api_key",
            ApiError::BodyTooLarge { .. } => "request_too_large",
            ApiError::QueueFull { .. } | ApiError::QueuedTokensFull { .. } => "queue_full",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Busy { .. } => "server_busy",
            ApiError::BodyTimeout { .. } => "request_timeout",
            ApiError::Internal(_) => "internal_error",
            ApiError::ExpertsUnavailable { .. } => "experts_unavailable",
        }
    }

    fn param(&self) -> Option<&str> {
        match self {
            ApiError::InvalidRequest { param, .. } => param.as_deref(),
            ApiError::ContextLength { param, .. } => Some(param),
            ApiError::ModelNotFound(_) => Some("model"),
            _ => None,
        }
    }

    /// The JSON body, also sent as an SSE event when a stream fails midway. The request id
    /// is the current request's (a task-local set by the request middleware).
    pub fn body(&self) -> serde_json::Value {
        self.body_for(super::current_request_id().as_deref())
    }

    /// The JSON body for the request `request_id`. A 500 says only that the server failed and
    /// names the request id: its detail (socket paths, file offsets) is for the server log,
    /// which records it under the same id ([`ApiError::log_internal`]).
    pub fn body_for(&self, request_id: Option<&str>) -> serde_json::Value {
        let message = self.client_message(request_id);
        json!({ "error": { "message": message, "type": self.error_type(), "param": self.param(), "code": self.code() } })
    }

    /// The message the client sees: a 500's says only that the server failed and names the
    /// request id, and an unavailable expert backend's only that, with the wait (the daemon's
    /// address and the cause are for the log); every other error's is its sentence.
    pub fn client_message(&self, request_id: Option<&str>) -> String {
        match self {
            ApiError::Internal(_) => format!(
                "The server had an error while processing your request (request id {}); its log has the details.",
                request_id.unwrap_or("unknown")
            ),
            ApiError::ExpertsUnavailable { retry_after_s, .. } => format!(
                "The expert backend is unavailable; retry after {retry_after_s} s (request id {}; the server's log names the cause).",
                request_id.unwrap_or("unknown")
            ),
            _ => self.to_string(),
        }
    }

    /// The `Retry-After` seconds of the errors a retry may cure (full queue, busy pool,
    /// unavailable expert backend).
    pub fn retry_after_s(&self) -> Option<u64> {
        match self {
            ApiError::QueueFull { retry_after_s, .. }
            | ApiError::QueuedTokensFull { retry_after_s, .. }
            | ApiError::Busy { retry_after_s, .. }
            | ApiError::ExpertsUnavailable { retry_after_s, .. } => Some(*retry_after_s),
            _ => None,
        }
    }

    /// Writes the detail a client does not see to the log (in the current span, which carries
    /// the request id): a 500's, and an unavailable expert backend's.
    pub fn log_internal(&self) {
        match self {
            ApiError::Internal(detail) => tracing::error!(detail = %detail, "internal error"),
            ApiError::ExpertsUnavailable { message, .. } => {
                tracing::warn!(detail = %message, "expert backend unavailable");
            }
            _ => {}
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.log_internal();
        let mut resp = (self.status(), Json(self.body())).into_response();
        if let Some(retry_after_s) = self.retry_after_s() {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_s));
        }
        if matches!(self, ApiError::Unauthorized) {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

impl From<SamplingError> for ApiError {
    fn from(e: SamplingError) -> Self {
        ApiError::invalid(e.to_string(), e.param)
    }
}

impl From<ChatTemplateError> for ApiError {
    fn from(e: ChatTemplateError) -> Self {
        let param = match e {
            ChatTemplateError::SystemNotFirst { index } => format!("messages[{index}].role"),
            _ => "messages".to_string(),
        };
        ApiError::invalid(e.to_string(), param)
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::QueueFull { max_queue } => ApiError::QueueFull {
                max_queue,
                retry_after_s: 1,
            },
            SubmitError::QueuedTokensFull {
                queued_tokens,
                prompt_tokens,
                max_queued_tokens,
            } => ApiError::QueuedTokensFull {
                queued_tokens,
                prompt_tokens,
                max_queued_tokens,
                retry_after_s: 1,
            },
            SubmitError::Stopped => ApiError::Unavailable(e.to_string()),
        }
    }
}

impl From<Failure> for ApiError {
    fn from(f: Failure) -> Self {
        match f.retry_after_s {
            Some(retry_after_s) => ApiError::ExpertsUnavailable {
                message: f.message,
                retry_after_s,
            },
            None => ApiError::Internal(f.message),
        }
    }
}

impl ApiError {
    /// Maps a failure to read the body; `limit_bytes` is the server's body limit.
    pub fn body_rejection(e: BytesRejection, limit_bytes: usize) -> ApiError {
        // axum reports a body over `DefaultBodyLimit` as 413; anything else is a broken body.
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::BodyTooLarge { limit_bytes }
        } else {
            ApiError::InvalidRequest {
                message: format!("Could not read the request body: {e}"),
                param: None,
                code: "invalid_body",
            }
        }
    }
}

impl From<serde_json::Error> for ApiError {
    fn from(e: serde_json::Error) -> Self {
        let msg = e.to_string();
        // serde names an unknown field as "unknown field `x`, expected …".
        let param = msg
            .strip_prefix("unknown field `")
            .and_then(|r| r.split('`').next())
            .map(str::to_string);
        let (message, code) = match (&param, e.classify()) {
            (Some(p), _) => (
                format!("Unrecognized request argument supplied: {p}"),
                "unsupported_parameter",
            ),
            (None, serde_json::error::Category::Data) => {
                (format!("Invalid request: {msg}"), "invalid_value")
            }
            _ => (
                format!("We could not parse the JSON body of your request: {msg}"),
                "invalid_json",
            ),
        };
        ApiError::InvalidRequest {
            message,
            param,
            code,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(e: ApiError, status: u16, ty: &str, code: &str) {
        assert_eq!(
            (e.status().as_u16(), e.error_type(), e.code()),
            (status, ty, code),
            "{e:?}"
        );
        let body = e.body();
        for key in ["message", "type", "param", "code"] {
            assert!(body["error"].get(key).is_some(), "{body}");
        }
    }

    #[test]
    fn statuses_and_codes() {
        check(
            ApiError::missing("messages"),
            400,
            "invalid_request_error",
            "missing_required_parameter",
        );
        check(
            ApiError::ModelNotFound("x".into()),
            404,
            "invalid_request_error",
            "model_not_found",
        );
        check(
            ApiError::QueueFull {
                max_queue: 1,
                retry_after_s: 1,
            },
            429,
            "rate_limit_error",
            "queue_full",
        );
        let e = ApiError::QueuedTokensFull {
            queued_tokens: 9,
            prompt_tokens: 2,
            max_queued_tokens: 10,
            retry_after_s: 1,
        };
        check(e, 429, "rate_limit_error", "queue_full");
        check(
            ApiError::BodyTooLarge { limit_bytes: 1 },
            413,
            "invalid_request_error",
            "request_too_large",
        );
        check(
            ApiError::Unauthorized,
            401,
            "authentication_error",
            "invalid_api_key",
        );
        let down = ApiError::from(Failure {
            message: "decode step failed: expertd gone".into(),
            retry_after_s: Some(2),
        });
        check(down.clone(), 503, "server_error", "experts_unavailable");
        assert_eq!(
            down.into_response()
                .headers()
                .get(header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()),
            Some("2")
        );
        check(
            ApiError::from(Failure {
                message: "bug".into(),
                retry_after_s: None,
            }),
            500,
            "server_error",
            "internal_error",
        );
        let e = crate::http::test_support::context_length_error();
        check(e, 400, "invalid_request_error", "context_length_exceeded");
        check(
            ApiError::Busy {
                message: "x".into(),
                retry_after_s: 1,
            },
            503,
            "server_error",
            "server_busy",
        );
        check(
            ApiError::BodyTimeout { limit_s: 1 },
            408,
            "invalid_request_error",
            "request_timeout",
        );
    }

    #[test]
    fn internal_errors_hide_their_detail() {
        let e = ApiError::Internal("reading /run/sluice/expertd.sock at offset 123456".into());
        let msg = e.body_for(Some("abc123"))["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            msg.contains("abc123") && !msg.contains("expertd.sock") && !msg.contains("123456"),
            "{msg}"
        );
    }

    #[test]
    fn json_errors_name_unknown_fields() {
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct R {
            a: Option<u32>,
        }
        let e: ApiError = serde_json::from_str::<R>(r#"{"b": 1}"#).unwrap_err().into();
        assert_eq!(e.code(), "unsupported_parameter");
        assert_eq!(e.body()["error"]["param"], "b");
        let e: ApiError = serde_json::from_str::<R>("{").unwrap_err().into();
        assert_eq!(e.code(), "invalid_json");
        let e: ApiError = serde_json::from_str::<R>(r#"{"a": "x"}"#)
            .unwrap_err()
            .into();
        assert_eq!(e.code(), "invalid_value");
    }
}
