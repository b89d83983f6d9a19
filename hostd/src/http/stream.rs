//! Engine events to HTTP: a server-sent-event stream or, when not streaming, the events folded
//! into one result. OpenAI's framing is `data: {json}` per chunk, then `data: [DONE]`, with
//! keep-alive comments while the prompt prefills; other APIs (Anthropic's named events) pass
//! their own [`Framing`] to [`sse_framed`].
//!
//! The SSE body owns the request's event receivers (one per choice when `n > 1`): when the
//! client disconnects, hyper drops the body, the receivers close, and the scheduler cancels the
//! sequences on its next step. A choice that fails ends the whole reply (the other choices'
//! receivers are dropped, so they are cancelled too).

use super::error::ApiError;
use crate::engine::{Delta, Event, FinishReason, Usage};
use axum::response::sse::Sse;
pub(super) use axum::response::sse::{Event as SseEvent, KeepAlive};
use axum::response::{IntoResponse, Response};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::task::Poll;
use tokio::sync::mpsc::UnboundedReceiver;

/// The event receivers of a request's choices, read as one stream of `(choice, event)`.
pub(super) struct Choices {
    /// `None` once the choice delivered its terminal event.
    rxs: Vec<Option<UnboundedReceiver<Event>>>,
    /// Where the next poll starts, so a busy choice cannot starve the others.
    next: usize,
}

impl Choices {
    /// The receivers of choices 0, 1, ….
    pub(super) fn new(rxs: Vec<UnboundedReceiver<Event>>) -> Choices {
        Choices {
            rxs: rxs.into_iter().map(Some).collect(),
            next: 0,
        }
    }

    /// The next event of any choice; `(i, None)` when choice `i`'s channel closed without a
    /// terminal event; `None` when every choice has ended.
    pub(super) async fn recv(&mut self) -> Option<(usize, Option<Event>)> {
        std::future::poll_fn(|cx| {
            let n = self.rxs.len();
            let mut open = false;
            for k in 0..n {
                let i = (self.next + k) % n;
                let Some(rx) = self.rxs[i].as_mut() else {
                    continue;
                };
                open = true;
                if let Poll::Ready(ev) = rx.poll_recv(cx) {
                    self.next = (i + 1) % n;
                    if ev
                        .as_ref()
                        .is_none_or(|e| matches!(e, Event::Done { .. } | Event::Failed(_)))
                    {
                        self.rxs[i] = None;
                    }
                    return Poll::Ready(Some((i, ev)));
                }
            }
            if open {
                Poll::Pending
            } else {
                Poll::Ready(None)
            }
        })
        .await
    }
}

/// Token counts of a reply with several choices: the prompt (and its cached part) once, as
/// choice 0 saw it, and the completion tokens of all choices together.
pub(super) fn total_usage(usages: &[Usage]) -> Usage {
    let first = usages.first().copied().unwrap_or(Usage {
        prompt_tokens: 0,
        completion_tokens: 0,
        cached_tokens: 0,
    });
    Usage {
        completion_tokens: usages.iter().map(|u| u.completion_tokens).sum(),
        ..first
    }
}

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

/// Waits for the generation to end and folds its deltas (the single-choice form, for endpoints
/// without `n`: the Anthropic messages endpoint).
pub(super) async fn collect(rx: UnboundedReceiver<Event>) -> Result<Collected, ApiError> {
    let mut all = collect_choices(Choices::new(vec![rx])).await?;
    all.pop().ok_or_else(stopped)
}

fn stopped() -> ApiError {
    ApiError::Internal("the generation engine stopped before the reply was complete".to_string())
}

/// Waits for every choice to end and folds each one's deltas; the first failure fails all.
pub(super) async fn collect_choices(mut choices: Choices) -> Result<Vec<Collected>, ApiError> {
    let n = choices.rxs.len();
    let mut deltas: Vec<Delta> = (0..n).map(|_| Delta::default()).collect();
    let mut done: Vec<Option<(FinishReason, Usage)>> = vec![None; n];
    while let Some((i, ev)) = choices.recv().await {
        match ev {
            Some(Event::Delta(d)) => {
                deltas[i].reasoning.push_str(&d.reasoning);
                deltas[i].content.push_str(&d.content);
                deltas[i].logprobs.extend(d.logprobs);
            }
            Some(Event::Done { reason, usage }) => done[i] = Some((reason, usage)),
            Some(Event::Failed(f)) => return Err(ApiError::from(f)),
            None => return Err(stopped()),
        }
    }
    deltas
        .into_iter()
        .zip(done)
        .map(|(delta, d)| {
            d.map(|(reason, usage)| Collected {
                delta,
                reason,
                usage,
            })
            .ok_or_else(stopped)
        })
        .collect()
}

/// Turns a failure (and the request id) into the frames the client gets.
pub(super) type FailureFrames = Box<dyn Fn(&ApiError, Option<&str>) -> Vec<SseEvent> + Send>;

/// How a stream frames what is not an engine delta: the payloads sent for a failure, those
/// sent after every choice has ended, and the keep-alive sent while nothing else is.
pub(super) struct Framing {
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
    pub(super) fn openai() -> Framing {
        Framing {
            failure: Box::new(|e, request_id| {
                vec![
                    SseEvent::default().data(e.body_for(request_id).to_string()),
                    SseEvent::default().data("[DONE]"),
                ]
            }),
            done: vec![SseEvent::default().data("[DONE]")],
            keep_alive: KeepAlive::default(),
        }
    }
}

struct StreamState<F> {
    rx: Choices,
    queue: VecDeque<SseEvent>,
    done: bool,
    format: F,
    framing: Framing,
    request_id: Option<String>,
    span: tracing::Span,
}

impl<F> StreamState<F> {
    /// Queues the failure's frames and ends the stream; the other choices' receivers close
    /// with it, so they are cancelled.
    fn fail(&mut self, e: ApiError) {
        self.span.in_scope(|| e.log_internal());
        let frames = (self.framing.failure)(&e, self.request_id.as_deref());
        self.queue.extend(frames);
        self.done = true;
        self.rx = Choices::new(Vec::new());
    }
}

/// An OpenAI SSE response: `first` payloads, then `format(event)` for each engine event (a list
/// of JSON payloads), then `[DONE]` after the terminal event. A failure mid-stream is sent as an
/// OpenAI error object, which the official clients raise as an exception. The single-choice
/// form, for endpoints without `n`.
#[allow(
    dead_code,
    reason = "the single-choice form for endpoints without `n`; the chat and completion handlers use `sse_choices`"
)]
pub(super) fn sse<F>(rx: UnboundedReceiver<Event>, first: Vec<String>, mut format: F) -> Response
where
    F: FnMut(Event) -> Vec<String> + Send + 'static,
{
    sse_choices(Choices::new(vec![rx]), first, move |_, ev| format(ev))
}

/// [`sse`] for several choices: `format(choice, event)`; `[DONE]` once every choice has ended
/// (after the last one's `Done`), or right after the first failure.
pub(super) fn sse_choices<F>(rx: Choices, first: Vec<String>, mut format: F) -> Response
where
    F: FnMut(usize, Event) -> Vec<String> + Send + 'static,
{
    let data = |payloads: Vec<String>| {
        payloads
            .into_iter()
            .map(|p| SseEvent::default().data(p))
            .collect::<Vec<_>>()
    };
    let first = data(first);
    sse_framed(
        rx,
        first,
        move |i, ev| data(format(i, ev)),
        Framing::openai(),
    )
}

/// An SSE response of any framing: `first` frames, then `format(choice, event)` for each engine
/// event but a failure, which becomes `framing.failure`'s frames (and ends the reply);
/// `framing.done` follows once every choice has ended. The body owns the event receivers, so a
/// client that goes away cancels the generation.
pub(super) fn sse_framed<F>(
    rx: Choices,
    first: Vec<SseEvent>,
    format: F,
    framing: Framing,
) -> Response
where
    F: FnMut(usize, Event) -> Vec<SseEvent> + Send + 'static,
{
    // The body is polled outside the handler's task-local and span: keep both for failures.
    let request_id = super::current_request_id();
    let span = tracing::Span::current();
    let keep_alive = framing.keep_alive.clone();
    let st = StreamState {
        rx,
        queue: first.into(),
        done: false,
        format,
        framing,
        request_id,
        span,
    };
    let stream = futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(frame) = st.queue.pop_front() {
                return Some((Ok::<_, Infallible>(frame), st));
            }
            if st.done {
                return None;
            }
            match st.rx.recv().await {
                Some((_, Some(Event::Failed(f)))) => st.fail(ApiError::from(f)),
                Some((i, Some(ev))) => {
                    let frames = (st.format)(i, ev);
                    st.queue.extend(frames);
                }
                Some((_, None)) => st.fail(stopped()),
                None => {
                    let done = st.framing.done.clone();
                    st.queue.extend(done);
                    st.done = true;
                }
            }
        }
    });
    Sse::new(stream).keep_alive(keep_alive).into_response()
}

/// Serialises a response object; these types always serialise.
pub(super) fn to_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|e| {
        ApiError::Internal(format!("serialising a chunk: {e}"))
            .body()
            .to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The events of a generation that failed with `detail`, and the sender, which the test
    /// keeps alive: the channel stays open, so only the `Failed` event can end the reply (a
    /// closed channel would end it too, as "the engine stopped").
    fn failed(
        detail: &str,
    ) -> (
        tokio::sync::mpsc::UnboundedSender<Event>,
        UnboundedReceiver<Event>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let _ = tx.send(Event::Failed(crate::engine::Failure {
            message: detail.to_string(),
            retry_after_s: None,
        }));
        (tx, rx)
    }

    /// A generation that fails midway: the client's error event names the request id and
    /// none of the failure's detail (socket paths, offsets), in a stream and in a whole reply.
    #[tokio::test]
    async fn failures_reach_the_client_without_their_detail() {
        let detail = "expertd call failed: /run/user/0/sluice/expertd.sock at offset 123456789";
        let (_tx, rx) = failed(detail);
        let resp = crate::http::REQUEST_ID
            .scope("req-42".to_string(), async {
                sse(rx, Vec::new(), |_| Vec::new())
            })
            .await;
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .expect("body");
        let text = String::from_utf8_lossy(&body);
        assert!(
            text.contains("req-42") && text.contains("internal_error") && text.contains("[DONE]"),
            "{text}"
        );
        assert!(
            !text.contains("expertd.sock") && !text.contains("123456789"),
            "{text}"
        );

        let (_tx, rx) = failed(detail);
        let resp = crate::http::REQUEST_ID
            .scope("req-43".to_string(), async {
                collect(rx)
                    .await
                    .map(|_| ())
                    .map_err(IntoResponse::into_response)
            })
            .await
            .expect_err("the generation failed");
        assert_eq!(resp.status().as_u16(), 500);
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .expect("body");
        let text = String::from_utf8_lossy(&body);
        assert!(
            text.contains("req-43")
                && !text.contains("expertd.sock")
                && !text.contains("123456789"),
            "{text}"
        );
    }
}
