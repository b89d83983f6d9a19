//! Engine events to HTTP: a server-sent-event stream or, when not streaming, the events folded
//! into one result. OpenAI's framing is `data: {json}` per chunk, then `data: [DONE]`, with
//! keep-alive comments while the prompt prefills; other APIs (Anthropic's named events) pass
//! their own [`Framing`] to [`sse_framed`].
//!
//! The SSE body owns the request's event receiver: when the client disconnects, hyper drops
//! the body, the receiver closes, and the scheduler cancels the sequence on its next step.

use super::error::ApiError;
use crate::engine::{Delta, Event, FinishReason, Usage};
pub use axum::response::sse::{Event as SseEvent, KeepAlive};
use axum::response::sse::Sse;
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

/// Turns a failure (and the request id) into the frames the client gets.
pub type FailureFrames = Box<dyn Fn(&ApiError, Option<&str>) -> Vec<SseEvent> + Send>;

/// How a stream frames what is not an engine delta: the payloads sent for a failure, those
/// sent after the terminal event, and the keep-alive sent while nothing else is.
pub struct Framing {
    /// The frames a failure becomes (the error already logged).
    pub failure: FailureFrames,
    /// Frames after a normal end (OpenAI's `[DONE]`).
    pub done: Vec<SseEvent>,
    /// What is sent while the prompt prefills or the model is slow.
    pub keep_alive: KeepAlive,
}

impl Framing {
    /// OpenAI's framing: data-only frames, the error object as data, `[DONE]` after the end
    /// (a failure included), comment keep-alives.
    pub fn openai() -> Framing {
        Framing {
            failure: Box::new(|e, request_id| {
                vec![SseEvent::default().data(e.body_for(request_id).to_string()), SseEvent::default().data("[DONE]")]
            }),
            done: vec![SseEvent::default().data("[DONE]")],
            keep_alive: KeepAlive::default(),
        }
    }
}

struct StreamState<F> {
    rx: UnboundedReceiver<Event>,
    queue: VecDeque<SseEvent>,
    done: bool,
    format: F,
    framing: Framing,
    request_id: Option<String>,
    span: tracing::Span,
}

impl<F> StreamState<F> {
    fn fail(&mut self, e: ApiError) {
        self.span.in_scope(|| e.log_internal());
        let frames = (self.framing.failure)(&e, self.request_id.as_deref());
        self.queue.extend(frames);
        self.done = true;
    }
}

/// An OpenAI SSE response: `first` payloads, then `format(event)` for each engine event (a list
/// of JSON payloads), then `[DONE]` after the terminal event. A failure mid-stream is sent as an
/// OpenAI error object, which the official clients raise as an exception.
pub fn sse<F>(rx: UnboundedReceiver<Event>, first: Vec<String>, mut format: F) -> Response
where
    F: FnMut(Event) -> Vec<String> + Send + 'static,
{
    let data = |payloads: Vec<String>| payloads.into_iter().map(|p| SseEvent::default().data(p)).collect::<Vec<_>>();
    let first = data(first);
    sse_framed(rx, first, move |ev| data(format(ev)), Framing::openai())
}

/// An SSE response of any framing: `first` frames, then `format(event)` for each engine event
/// but a failure, which becomes `framing.failure`'s frames; `framing.done` follows a normal end.
/// The body owns the event receiver, so a client that goes away cancels the generation.
pub fn sse_framed<F>(rx: UnboundedReceiver<Event>, first: Vec<SseEvent>, format: F, framing: Framing) -> Response
where
    F: FnMut(Event) -> Vec<SseEvent> + Send + 'static,
{
    // The body is polled outside the handler's task-local and span: keep both for failures.
    let request_id = super::current_request_id();
    let span = tracing::Span::current();
    let keep_alive = framing.keep_alive.clone();
    let st = StreamState { rx, queue: first.into(), done: false, format, framing, request_id, span };
    let stream = futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(frame) = st.queue.pop_front() {
                return Some((Ok::<_, Infallible>(frame), st));
            }
            if st.done {
                return None;
            }
            match st.rx.recv().await {
                Some(Event::Failed(f)) => st.fail(ApiError::from(f)),
                Some(ev) => {
                    let terminal = matches!(ev, Event::Done { .. });
                    let frames = (st.format)(ev);
                    st.queue.extend(frames);
                    if terminal {
                        let done = st.framing.done.clone();
                        st.queue.extend(done);
                        st.done = true;
                    }
                }
                None => st.fail(ApiError::Internal("the generation engine stopped before the reply was complete".to_string())),
            }
        }
    });
    Sse::new(stream).keep_alive(keep_alive).into_response()
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
