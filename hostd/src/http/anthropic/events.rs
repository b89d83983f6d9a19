//! Engine events to Anthropic replies: one `message` object, or the stream of named events
//! `message_start`, `ping`, then per content block `content_block_start`,
//! `content_block_delta` (`thinking_delta`, `text_delta`) and `content_block_stop`, then
//! `message_delta` (stop reason, usage) and `message_stop`; a failure mid-stream is an `error`
//! event. Keep-alives are `ping` events.
//!
//! A block exists when its text does: a thinking block (index 0) when the model reasoned, then
//! a text block when it answered, in both shapes, so a streamed reply folds into the same
//! message as the whole one (`usage` of `message_start` counts the whole prompt as input; the
//! `message_delta` overwrites it with the split into prefilled and cache-read tokens).

use super::error::AnthropicError;
use super::wire::{ContentBlock, Message, Usage};
use crate::engine::{Event, FinishReason};
use crate::http::stream::{self, Collected, Framing, KeepAlive, SseEvent};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

/// What the reply's shapes share.
pub struct Reply {
    /// `msg_…`.
    pub id: String,
    /// Served model name.
    pub model: String,
    /// The request's stop sequences (a [`FinishReason::StopString`] indexes them).
    pub stop: Vec<String>,
    /// Thinking blocks carry their text (false: `display: "omitted"`).
    pub display_thinking: bool,
}

/// Which kind of block is open in a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Thinking,
    Text,
}

fn frame(event: &'static str, data: Value) -> SseEvent {
    SseEvent::default().event(event).data(data.to_string())
}

impl Reply {
    /// `stop_reason` and `stop_sequence` of a finished generation.
    fn stop_reason(&self, reason: FinishReason) -> (&'static str, Option<String>) {
        match reason {
            FinishReason::Stop => ("end_turn", None),
            FinishReason::StopString(i) => ("stop_sequence", self.stop.get(i).cloned()),
            FinishReason::Length => ("max_tokens", None),
        }
    }

    fn message(
        &self,
        content: Vec<ContentBlock>,
        stop: Option<(&'static str, Option<String>)>,
        usage: Usage,
    ) -> Message {
        let (stop_reason, stop_sequence) = stop.map_or((None, None), |(r, s)| (Some(r), s));
        Message {
            id: self.id.clone(),
            kind: "message",
            role: "assistant",
            model: self.model.clone(),
            content,
            stop_reason,
            stop_sequence,
            usage,
        }
    }

    /// The whole reply.
    pub fn whole(&self, c: Collected) -> Message {
        let mut content = Vec::with_capacity(2);
        if !c.delta.reasoning.is_empty() {
            let thinking = if self.display_thinking {
                c.delta.reasoning
            } else {
                String::new()
            };
            content.push(ContentBlock::Thinking {
                thinking,
                signature: String::new(),
            });
        }
        if !c.delta.content.is_empty() {
            content.push(ContentBlock::Text {
                text: c.delta.content,
            });
        }
        self.message(
            content,
            Some(self.stop_reason(c.reason)),
            Usage::from_engine(c.usage),
        )
    }

    /// The reply as Anthropic's event stream; `prompt_tokens` is the input count that
    /// `message_start` reports.
    pub fn stream(self, rx: UnboundedReceiver<Event>, prompt_tokens: usize) -> Response {
        let start_usage = Usage {
            input_tokens: prompt_tokens,
            output_tokens: 0,
            cache_creation_input_tokens: None,
            cache_read_input_tokens: None,
        };
        let start = self.message(Vec::new(), None, start_usage);
        let first = vec![
            frame(
                "message_start",
                json!({ "type": "message_start", "message": start }),
            ),
            frame("ping", json!({ "type": "ping" })),
        ];
        let mut blocks = Blocks::default();
        let format =
            move |_choice: usize, ev: Event| match ev {
                Event::Delta(d) => {
                    let mut out = Vec::new();
                    if !d.reasoning.is_empty() {
                        blocks.open(Kind::Thinking, &mut out);
                        if self.display_thinking {
                            out.push(blocks.delta(
                                json!({ "type": "thinking_delta", "thinking": d.reasoning }),
                            ));
                        }
                    }
                    if !d.content.is_empty() {
                        blocks.open(Kind::Text, &mut out);
                        out.push(blocks.delta(json!({ "type": "text_delta", "text": d.content })));
                    }
                    out
                }
                Event::Done { reason, usage } => {
                    let mut out = Vec::new();
                    blocks.close(&mut out);
                    let (stop_reason, stop_sequence) = self.stop_reason(reason);
                    let usage = Usage::from_engine(usage);
                    out.push(frame(
                        "message_delta",
                        json!({
                            "type": "message_delta",
                            "delta": { "stop_reason": stop_reason, "stop_sequence": stop_sequence },
                            "usage": usage,
                        }),
                    ));
                    out.push(frame("message_stop", json!({ "type": "message_stop" })));
                    out
                }
                // Failures are framed by `framing()`.
                Event::Failed(_) => Vec::new(),
            };
        stream::sse_framed(stream::Choices::new(vec![rx]), first, format, framing())
    }
}

/// Anthropic's framing: an `error` event on failure (no `message_stop` after it), nothing after
/// the end (the formatter sent `message_stop`), `ping` events as keep-alives.
fn framing() -> Framing {
    Framing {
        failure: Box::new(|e, request_id| {
            vec![frame(
                "error",
                AnthropicError(e.clone()).body_for(request_id),
            )]
        }),
        done: Vec::new(),
        keep_alive: KeepAlive::new().event(
            SseEvent::default()
                .event("ping")
                .data(json!({ "type": "ping" }).to_string()),
        ),
    }
}

/// The content blocks of a stream: which one is open, and the next index.
#[derive(Debug, Default)]
struct Blocks {
    open: Option<(usize, Kind)>,
    next: usize,
}

impl Blocks {
    /// Makes a block of `kind` the open one (closing another kind first).
    fn open(&mut self, kind: Kind, out: &mut Vec<SseEvent>) {
        if self.open.is_some_and(|(_, k)| k == kind) {
            return;
        }
        self.close(out);
        let index = self.next;
        self.next += 1;
        self.open = Some((index, kind));
        let block = match kind {
            Kind::Thinking => json!({ "type": "thinking", "thinking": "", "signature": "" }),
            Kind::Text => json!({ "type": "text", "text": "" }),
        };
        out.push(frame(
            "content_block_start",
            json!({ "type": "content_block_start", "index": index, "content_block": block }),
        ));
    }

    /// A delta of the open block (one is always open when this is called).
    fn delta(&self, delta: Value) -> SseEvent {
        let index = self.open.map_or(0, |(i, _)| i);
        frame(
            "content_block_delta",
            json!({ "type": "content_block_delta", "index": index, "delta": delta }),
        )
    }

    fn close(&mut self, out: &mut Vec<SseEvent>) {
        if let Some((index, _)) = self.open.take() {
            out.push(frame(
                "content_block_stop",
                json!({ "type": "content_block_stop", "index": index }),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Delta, Usage as EngineUsage};

    fn reply(display_thinking: bool) -> Reply {
        Reply {
            id: "msg_1".into(),
            model: "m".into(),
            stop: vec!["END".into()],
            display_thinking,
        }
    }

    fn delta(reasoning: &str, content: &str) -> Event {
        Event::Delta(Delta {
            reasoning: reasoning.into(),
            content: content.into(),
            logprobs: Vec::new(),
        })
    }

    /// The (event name, data) pairs of a streamed reply.
    async fn events(r: Reply, evs: Vec<Event>) -> Vec<(String, Value)> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        for e in evs {
            let _ = tx.send(e);
        }
        drop(tx);
        let body = axum::body::to_bytes(r.stream(rx, 7).into_body(), 1 << 20)
            .await
            .expect("body");
        let text = String::from_utf8_lossy(&body).into_owned();
        let mut out = Vec::new();
        for chunk in text.split("\n\n").filter(|c| !c.trim().is_empty()) {
            let name = chunk
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap_or_default()
                .to_string();
            let data = chunk
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap_or_default();
            out.push((name, serde_json::from_str(data).expect("json data")));
        }
        out
    }

    #[tokio::test]
    async fn stream_events_come_in_anthropics_order() {
        let usage = EngineUsage {
            prompt_tokens: 7,
            completion_tokens: 5,
            cached_tokens: 3,
        };
        let evs = vec![
            delta("let me", ""),
            delta(" think", "Hi"),
            delta("", " there"),
            Event::Done {
                reason: FinishReason::StopString(0),
                usage,
            },
        ];
        let got = events(reply(true), evs).await;
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        for (name, data) in &got {
            assert_eq!(data["type"], name.as_str());
        }
        assert_eq!(got[0].1["message"]["usage"]["input_tokens"], 7);
        assert!(got[0].1["message"]["stop_reason"].is_null());
        assert_eq!(got[2].1["content_block"]["type"], "thinking");
        assert_eq!(
            (
                got[4].1["index"].clone(),
                got[4].1["delta"]["thinking"].clone()
            ),
            (json!(0), json!(" think"))
        );
        assert_eq!(got[6].1["content_block"]["type"], "text");
        assert_eq!(
            (got[8].1["index"].clone(), got[8].1["delta"]["text"].clone()),
            (json!(1), json!(" there"))
        );
        let md = &got[10].1;
        assert_eq!(
            (
                md["delta"]["stop_reason"].clone(),
                md["delta"]["stop_sequence"].clone()
            ),
            (json!("stop_sequence"), json!("END"))
        );
        assert_eq!(
            (
                md["usage"]["input_tokens"].clone(),
                md["usage"]["cache_read_input_tokens"].clone()
            ),
            (json!(4), json!(3))
        );
        assert_eq!(md["usage"]["output_tokens"], 5);
    }

    #[tokio::test]
    async fn omitted_thinking_opens_the_block_without_text_and_failures_are_error_events() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let _ = tx.send(delta("secret", ""));
        let _ = tx.send(Event::Failed(crate::engine::Failure {
            message: "boom at /x.sock".into(),
            retry_after_s: None,
        }));
        let body = axum::body::to_bytes(reply(false).stream(rx, 1).into_body(), 1 << 20)
            .await
            .expect("body");
        let text = String::from_utf8_lossy(&body);
        assert!(
            !text.contains("secret") && !text.contains("x.sock"),
            "{text}"
        );
        assert!(
            text.contains("event: content_block_start") && !text.contains("thinking_delta"),
            "{text}"
        );
        assert!(
            text.contains("event: error")
                && text.contains("api_error")
                && !text.contains("message_stop"),
            "{text}"
        );
    }

    #[test]
    fn whole_message_shape() {
        let usage = EngineUsage {
            prompt_tokens: 9,
            completion_tokens: 4,
            cached_tokens: 0,
        };
        let c = Collected {
            delta: Delta {
                reasoning: "r".into(),
                content: "a".into(),
                logprobs: Vec::new(),
            },
            reason: FinishReason::Length,
            usage,
        };
        let m = serde_json::to_value(reply(true).whole(c)).expect("json");
        assert_eq!(
            m,
            json!({
                "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                "content": [{"type": "thinking", "thinking": "r", "signature": ""}, {"type": "text", "text": "a"}],
                "stop_reason": "max_tokens", "stop_sequence": null,
                "usage": {"input_tokens": 9, "output_tokens": 4, "cache_creation_input_tokens": null, "cache_read_input_tokens": 0}
            })
        );
        let c = Collected {
            delta: Delta::default(),
            reason: FinishReason::Stop,
            usage,
        };
        let m = serde_json::to_value(reply(true).whole(c)).expect("json");
        assert_eq!(
            (m["content"].clone(), m["stop_reason"].clone()),
            (json!([]), json!("end_turn"))
        );
    }
}
