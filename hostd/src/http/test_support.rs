//! Helpers the HTTP layer's unit tests share: a prompt-size check that accepts everything, the
//! `param` of an error, a context-length error, an engine delta, and the (event name, data)
//! pairs of a streamed reply.

use super::error::ApiError;
use crate::engine::{Delta, Event};
use axum::response::Response;
use serde_json::Value;
use tokio::sync::mpsc::UnboundedReceiver;

/// A prompt-size check with no cap.
pub(super) fn no_cap(_: &str, _: &str) -> Result<(), ApiError> {
    Ok(())
}

/// A prompt of 11 tokens plus 1 asked for, over a context of 10 (`messages`).
pub(super) fn context_length_error() -> ApiError {
    ApiError::ContextLength {
        max_context: 10,
        requested: 12,
        prompt_tokens: 11,
        completion_tokens: 1,
        param: "messages",
    }
}

/// The `param` an error names (empty when none).
pub(super) fn param_of(e: ApiError) -> String {
    e.body()["error"]["param"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// A delta of reasoning and answer text without logprobs.
pub(super) fn delta(reasoning: &str, content: &str) -> Event {
    Event::Delta(Delta {
        reasoning: reasoning.into(),
        content: content.into(),
        logprobs: Vec::new(),
    })
}

/// Feeds `evs` to the reply `stream` builds and returns its SSE events as (event name, data)
/// pairs, skipping frames without data.
pub(super) async fn sse_events(
    evs: Vec<Event>,
    stream: impl FnOnce(UnboundedReceiver<Event>) -> Response,
) -> Vec<(String, Value)> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    for e in evs {
        let _ = tx.send(e);
    }
    drop(tx);
    let body = axum::body::to_bytes(stream(rx).into_body(), 1 << 20)
        .await
        .expect("body");
    let text = String::from_utf8_lossy(&body).into_owned();
    text.split("\n\n")
        .filter(|c| c.lines().any(|l| l.starts_with("data: ")))
        .map(|c| {
            let name = c
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap_or_default()
                .to_string();
            let data = c
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap_or_default();
            (name, serde_json::from_str(data).expect("json data"))
        })
        .collect()
}
