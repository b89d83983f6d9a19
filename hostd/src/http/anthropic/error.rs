//! Errors of the Anthropic routes in Anthropic's shape:
//! `{"type": "error", "error": {"type", "message"}, "request_id"}` with Anthropic's statuses.
//!
//! The handlers fail with the server's one [`ApiError`] (so every check is shared with the
//! OpenAI routes); this file only decides how such an error looks to an Anthropic client.
//! Statuses follow Anthropic's error reference: 400 `invalid_request_error` (also for the other
//! 4xx it does not list: 405, 408), 401 `authentication_error`, 404 `not_found_error`, 413
//! `request_too_large`, 500 `api_error`, and 529 `overloaded_error` for a server that is at
//! capacity (full queue, busy tokeniser pool, connection cap): Anthropic keeps 429
//! `rate_limit_error` for a client's own rate limits, which this server does not have. A model
//! still loading or an unreachable expert backend is 503 `api_error`. Retryable errors keep
//! their `Retry-After`.

use crate::http::error::ApiError;
use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// HTTP 529, Anthropic's "overloaded".
const OVERLOADED: u16 = 529;

/// An [`ApiError`] answered in Anthropic's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

impl From<serde_json::Error> for AnthropicError {
    fn from(e: serde_json::Error) -> Self {
        AnthropicError(e.into())
    }
}

impl AnthropicError {
    /// The HTTP status: the server's own ([`ApiError::status`]), but 529 at capacity.
    pub fn status(&self) -> StatusCode {
        if self.0.at_capacity() {
            StatusCode::from_u16(OVERLOADED).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
        } else {
            self.0.status()
        }
    }

    /// Anthropic's `error.type`, read off the status: `overloaded_error` at capacity, 401, 404
    /// and 413 their own types, any 5xx `api_error`, any other 4xx `invalid_request_error`.
    pub fn error_type(&self) -> &'static str {
        if self.0.at_capacity() {
            return "overloaded_error";
        }
        match self.0.status() {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            s if s.is_server_error() => "api_error",
            _ => "invalid_request_error",
        }
    }

    /// The JSON body for the request `request_id` (also the data of a stream's `error` event).
    /// A 500 names only the request id; its detail is in the server log.
    pub fn body_for(&self, request_id: Option<&str>) -> Value {
        let message = self.0.client_message(request_id);
        json!({ "type": "error", "error": { "type": self.error_type(), "message": message }, "request_id": request_id })
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        self.0.log_internal();
        let request_id = crate::http::current_request_id();
        let mut resp = (self.status(), Json(self.body_for(request_id.as_deref()))).into_response();
        if let Some(retry_after_s) = self.0.retry_after_s() {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_s));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(e: ApiError, status: u16, ty: &str) {
        let a = AnthropicError(e);
        assert_eq!((a.status().as_u16(), a.error_type()), (status, ty), "{a:?}");
        let body = a.body_for(Some("r1"));
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], ty);
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{body}"
        );
        assert_eq!(body["request_id"], "r1");
    }

    #[test]
    fn statuses_and_types_follow_anthropic() {
        check(
            ApiError::missing("max_tokens"),
            400,
            "invalid_request_error",
        );
        check(ApiError::Unauthorized, 401, "authentication_error");
        check(ApiError::ModelNotFound("x".into()), 404, "not_found_error");
        check(
            ApiError::BodyTooLarge { limit_bytes: 1 },
            413,
            "request_too_large",
        );
        check(
            ApiError::QueueFull {
                max_queue: 1,
                retry_after_s: 1,
            },
            529,
            "overloaded_error",
        );
        check(
            ApiError::Busy {
                message: "pool".into(),
                retry_after_s: 1,
            },
            529,
            "overloaded_error",
        );
        check(ApiError::Unavailable("loading".into()), 503, "api_error");
        check(
            ApiError::BodyTimeout { limit_s: 1 },
            408,
            "invalid_request_error",
        );
        let e = ApiError::QueuedTokensFull {
            queued_tokens: 9,
            prompt_tokens: 2,
            max_queued_tokens: 10,
            retry_after_s: 1,
        };
        check(e, 529, "overloaded_error");
        check(
            ApiError::Internal("socket /x at 123".into()),
            500,
            "api_error",
        );
        let e = crate::http::test_support::context_length_error();
        check(e, 400, "invalid_request_error");
    }

    #[test]
    fn retryable_errors_keep_retry_after_and_500s_hide_their_detail() {
        let resp = AnthropicError(ApiError::QueueFull {
            max_queue: 1,
            retry_after_s: 2,
        })
        .into_response();
        assert_eq!(resp.status().as_u16(), 529);
        assert_eq!(
            resp.headers()
                .get(header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()),
            Some("2")
        );
        let body = AnthropicError(ApiError::Internal("expertd.sock offset 99".into()))
            .body_for(Some("r9"));
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("r9") && !message.contains("expertd.sock"),
            "{body}"
        );
    }
}
