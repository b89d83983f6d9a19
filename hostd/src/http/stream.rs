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

struct StreamState<F> {
    rx: UnboundedReceiver<Event>,
    queue: VecDeque<String>,
    done: bool,
    format: F,
}

/// An SSE response: `first` payloads, then `format(event)` for each engine event (a list of
/// JSON payloads), then `[DONE]` after the terminal event. A failure mid-stream is sent as an
/// OpenAI error object, which the official clients raise as an exception.
pub fn sse<F>(rx: UnboundedReceiver<Event>, first: Vec<String>, format: F) -> Response
where
    F: FnMut(Event) -> Vec<String> + Send + 'static,
{
    let st = StreamState { rx, queue: first.into(), done: false, format };
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
                        st.queue.push_back(ApiError::from(f.clone()).body().to_string());
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
                    st.queue.push_back(e.body().to_string());
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
