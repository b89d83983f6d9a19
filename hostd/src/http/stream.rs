//! Engine events to HTTP: a server-sent-event stream (`data: {json}` per chunk, then
//! `data: [DONE]`, keep-alive comments while the prompt prefills) or, when not streaming, the
//! events folded into one result.
//!
//! The SSE body owns the request's event receiver: when the client disconnects, hyper drops
//! the body, the receiver closes, and the scheduler cancels the sequence on its next step.

use super::error::ApiError;
use crate::engine::{Delta, Event, FinishReason, Usage};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use std::collections::VecDeque;
use std::convert::Infallible;
use tokio::sync::mpsc::UnboundedReceiver;

/// A whole generation, folded from its events.
#[derive(Debug)]
pub struct Collected {
    /// All released output.
    pub delta: Delta,
    /// Why it ended.
    pub reason: FinishReason,
    /// Token counts.
    pub usage: Usage,
}

/// Waits for the generation to end and folds its deltas.
pub async fn collect(mut rx: UnboundedReceiver<Event>) -> Result<Collected, ApiError> {
    let mut delta = Delta::default();
    loop {
        match rx.recv().await {
            Some(Event::Delta(d)) => {
                delta.reasoning.push_str(&d.reasoning);
                delta.content.push_str(&d.content);
                delta.logprobs.extend(d.logprobs);
            }
            Some(Event::Done { reason, usage }) => return Ok(Collected { delta, reason, usage }),
            Some(Event::Failed(f)) => return Err(ApiError::from(f)),
            None => return Err(ApiError::Internal("the generation engine stopped before the reply was complete".to_string())),
        }
    }
}

struct StreamState<F, G> {
    rx: UnboundedReceiver<Event>,
    queue: VecDeque<String>,
    done: bool,
    format: F,
    /// An error as the payload the client gets (its detail logged).
    failure: G,
}

/// An SSE response: `first` payloads, then `format(event)` for each engine event (a list of
/// JSON payloads), then `[DONE]` after the terminal event. A failure mid-stream is sent as an
/// OpenAI error object, which the official clients raise as an exception.
pub fn sse<F>(rx: UnboundedReceiver<Event>, first: Vec<String>, format: F) -> Response
where
    F: FnMut(Event) -> Vec<String> + Send + 'static,
{
    // The body is polled outside the handler's task-local and span: keep both for failures.
    let request_id = super::current_request_id();
    let span = tracing::Span::current();
    let failure = move |e: ApiError| {
        span.in_scope(|| e.log_internal());
        e.body_for(request_id.as_deref()).to_string()
    };
    let st = StreamState { rx, queue: first.into(), done: false, format, failure };
    let stream = futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(data) = st.queue.pop_front() {
                return Some((Ok::<_, Infallible>(SseEvent::default().data(data)), st));
            }
            if st.done {
                return None;
            }
            match st.rx.recv().await {
                Some(ev) => {
                    let terminal = matches!(ev, Event::Done { .. } | Event::Failed(_));
                    if let Event::Failed(f) = &ev {
                        let payload = (st.failure)(ApiError::from(f.clone()));
                        st.queue.push_back(payload);
                    } else {
                        let payloads = (st.format)(ev);
                        st.queue.extend(payloads);
                    }
                    if terminal {
                        st.queue.push_back("[DONE]".to_string());
                        st.done = true;
                    }
                }
                None => {
                    let e = ApiError::Internal("the generation engine stopped before the reply was complete".to_string());
                    let payload = (st.failure)(e);
                    st.queue.push_back(payload);
                    st.queue.push_back("[DONE]".to_string());
                    st.done = true;
                }
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

/// Serialises a response object; these types always serialise.
pub fn to_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|e| ApiError::Internal(format!("serialising a chunk: {e}")).body().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A generation that fails midway: the client's error event names the request id and
    /// none of the failure's detail (socket paths, offsets), in a stream and in a whole reply.
    #[tokio::test]
    async fn failures_reach_the_client_without_their_detail() {
        let detail = "expertd call failed: /run/user/0/sluice/expertd.sock at offset 123456789";
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let _ = tx.send(Event::Failed(crate::engine::Failure { message: detail.to_string(), retry_after_s: None }));
        let resp = crate::http::REQUEST_ID.scope("req-42".to_string(), async { sse(rx, Vec::new(), |_| Vec::new()) }).await;
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20).await.expect("body");
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains("req-42") && text.contains("internal_error") && text.contains("[DONE]"), "{text}");
        assert!(!text.contains("expertd.sock") && !text.contains("123456789"), "{text}");

        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let _ = tx.send(Event::Failed(crate::engine::Failure { message: detail.to_string(), retry_after_s: None }));
        let resp = crate::http::REQUEST_ID
            .scope("req-43".to_string(), async { collect(rx).await.map(|_| ()).map_err(IntoResponse::into_response) })
            .await
            .expect_err("the generation failed");
        assert_eq!(resp.status().as_u16(), 500);
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20).await.expect("body");
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains("req-43") && !text.contains("expertd.sock") && !text.contains("123456789"), "{text}");
    }
}
