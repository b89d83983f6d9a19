//! Engine events to Anthropic replies: one `message` object, or the stream of named events
//! `message_start`, `ping`, then per content block `content_block_start`,
//! `content_block_delta` (`thinking_delta`, `text_delta`, `input_json_delta`) and
//! `content_block_stop`, then `message_delta` (stop reason, usage) and `message_stop`; a failure
//! mid-stream is an `error` event. Keep-alives are `ping` events.
//!
//! A block exists when its text does: a thinking block (index 0) when the model reasoned, a
//! text block when it answered, and one `tool_use` block per tool call, in both shapes, so a
//! streamed reply folds into the same message as the whole one (`usage` of `message_start`
//! counts the whole prompt as input; the `message_delta` overwrites it with the split into
//! prefilled and cache-read tokens).
//!
//! With tools (and `tool_choice` not `none`) the answer text goes through the tool-call parser
//! (`crate::tool_calls`): a call's block starts (`content_block_start` with `id`, `name` and an
//! empty `input`) when the parser has read its function name, and its arguments stream as
//! `input_json_delta` fragments (`partial_json`) whose concatenation is the `input` object.
//! A reply that called a tool and ended by itself stops with `stop_reason: "tool_use"`.

use super::error::AnthropicError;
use super::tools::tool_use_id;
use super::wire::{ContentBlock, Message, Usage};
use crate::engine::{Event, FinishReason};
use crate::http::error::ApiError;
use crate::http::stream::{self, Collected, Framing, KeepAlive, SseEvent};
use crate::http::tools::ToolRequest;
use crate::tool_calls::{ToolCallParser, ToolEvent};
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
    /// The request's tools: the answer is parsed for calls unless there are none or
    /// `tool_choice` is `none`.
    pub tools: ToolRequest,
}

/// Which kind of block is open in a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Thinking,
    Text,
    ToolUse,
}

fn frame(event: &'static str, data: Value) -> SseEvent {
    SseEvent::default().event(event).data(data.to_string())
}

/// A parsed call's arguments as the `input` object (the parser always closes them as JSON).
fn input(name: &str, arguments: &str) -> Result<Value, ApiError> {
    serde_json::from_str(arguments).map_err(|e| {
        ApiError::Internal(format!(
            "the tool-call parser produced arguments for '{name}' that are not JSON ({e}): {arguments}"
        ))
    })
}

impl Reply {
    /// `stop_reason` and `stop_sequence` of a finished generation that made `calls` tool calls.
    fn stop_reason(&self, reason: FinishReason, calls: usize) -> (&'static str, Option<String>) {
        match reason {
            FinishReason::Stop if calls > 0 => ("tool_use", None),
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
    pub fn whole(&self, c: Collected) -> Result<Message, ApiError> {
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
        let (text, calls) = self.tools.split_calls(c.delta.content);
        if !text.is_empty() {
            content.push(ContentBlock::Text { text });
        }
        let stop = self.stop_reason(c.reason, calls.len());
        for (name, arguments) in calls {
            let input = input(&name, &arguments)?;
            content.push(ContentBlock::ToolUse {
                id: tool_use_id(),
                name,
                input,
            });
        }
        Ok(self.message(content, Some(stop), Usage::from_engine(c.usage)))
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
        let mut w = Writer {
            blocks: Blocks::default(),
            parser: self.tools.parser(),
            calls: 0,
        };
        let format = move |_choice: usize, ev: Event| {
            let mut out = Vec::new();
            match ev {
                Event::Delta(d) => {
                    if !d.reasoning.is_empty() {
                        w.blocks.open(Kind::Thinking, &mut out);
                        if self.display_thinking {
                            out.push(w.blocks.delta(
                                json!({ "type": "thinking_delta", "thinking": d.reasoning }),
                            ));
                        }
                    }
                    if !d.content.is_empty() {
                        w.content(&d.content, &mut out);
                    }
                }
                Event::Done { reason, usage } => {
                    w.finish(&mut out);
                    w.blocks.close(&mut out);
                    let (stop_reason, stop_sequence) = self.stop_reason(reason, w.calls);
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
                }
                // Failures are framed by `framing()`.
                Event::Failed(_) => {}
            }
            out
        };
        stream::sse_framed(stream::Choices::new(vec![rx]), first, format, framing())
    }
}

/// The answer side of a stream: its blocks, and the tool-call parser when calls are parsed.
struct Writer {
    blocks: Blocks,
    parser: Option<ToolCallParser>,
    /// Tool calls started so far.
    calls: usize,
}

impl Writer {
    /// Answer text: text deltas, or (with tools) what the parser made of it.
    fn content(&mut self, text: &str, out: &mut Vec<SseEvent>) {
        match self.parser.as_mut() {
            None => self.text(text.to_string(), out),
            Some(p) => {
                let events = p.feed(text);
                self.tool_events(events, out);
            }
        }
    }

    /// The answer ended: what the parser still held.
    fn finish(&mut self, out: &mut Vec<SseEvent>) {
        if let Some(p) = self.parser.as_mut() {
            let events = p.finish();
            self.tool_events(events, out);
        }
    }

    fn text(&mut self, text: String, out: &mut Vec<SseEvent>) {
        if text.is_empty() {
            return;
        }
        self.blocks.open(Kind::Text, out);
        out.push(
            self.blocks
                .delta(json!({ "type": "text_delta", "text": text })),
        );
    }

    fn tool_events(&mut self, events: Vec<ToolEvent>, out: &mut Vec<SseEvent>) {
        for e in events {
            match e {
                ToolEvent::Content(t) => self.text(t, out),
                ToolEvent::CallStart { name, .. } => {
                    self.calls += 1;
                    let block = json!({ "type": "tool_use", "id": tool_use_id(), "name": name, "input": {} });
                    self.blocks.open_new(Kind::ToolUse, block, out);
                }
                ToolEvent::Arguments { fragment, .. } => out.push(
                    self.blocks
                        .delta(json!({ "type": "input_json_delta", "partial_json": fragment })),
                ),
            }
        }
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
    /// Makes a block of `kind` (thinking or text) the open one, unless one is open already.
    fn open(&mut self, kind: Kind, out: &mut Vec<SseEvent>) {
        if self.open.is_some_and(|(_, k)| k == kind) {
            return;
        }
        let block = match kind {
            Kind::Thinking => json!({ "type": "thinking", "thinking": "", "signature": "" }),
            Kind::Text | Kind::ToolUse => json!({ "type": "text", "text": "" }),
        };
        self.open_new(kind, block, out);
    }

    /// Closes the open block and starts `block` (of `kind`) as the next one.
    fn open_new(&mut self, kind: Kind, block: Value, out: &mut Vec<SseEvent>) {
        self.close(out);
        let index = self.next;
        self.next += 1;
        self.open = Some((index, kind));
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
    use crate::http::test_support::{delta, sse_events};

    fn reply(display_thinking: bool) -> Reply {
        let tools = super::super::tools::tool_request(None, None).expect("no tools");
        Reply {
            id: "msg_1".into(),
            model: "m".into(),
            stop: vec!["END".into()],
            display_thinking,
            tools,
        }
    }

    fn tool_reply() -> Reply {
        let tools = json!([{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}]);
        let tools = super::super::tools::tool_request(Some(&tools), None).expect("valid tools");
        Reply {
            tools,
            ..reply(true)
        }
    }

    /// The (event name, data) pairs of a streamed reply.
    async fn events(r: Reply, evs: Vec<Event>) -> Vec<(String, Value)> {
        sse_events(evs, |rx| r.stream(rx, 7)).await
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
        let m = serde_json::to_value(reply(true).whole(c).expect("whole")).expect("json");
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
        let m = serde_json::to_value(reply(true).whole(c).expect("whole")).expect("json");
        assert_eq!(
            (m["content"].clone(), m["stop_reason"].clone()),
            (json!([]), json!("end_turn"))
        );
    }

    /// A call split at awkward places streams as a tool_use block whose `partial_json`
    /// fragments concatenate to the same `input` the whole reply carries.
    #[tokio::test]
    async fn tool_calls_stream_as_tool_use_blocks_with_input_json_deltas() {
        let answer = [
            "Let me check.\n<tool_",
            "call>\n<function=get_weather>\n<parameter=ci",
            "ty>\nParis\n</parameter>\n<parameter=days>\n3\n</para",
            "meter>\n</function>\n</tool_call>",
        ];
        let usage = EngineUsage {
            prompt_tokens: 7,
            completion_tokens: 20,
            cached_tokens: 0,
        };
        let mut evs: Vec<Event> = answer.iter().map(|a| delta("", a)).collect();
        evs.push(Event::Done {
            reason: FinishReason::Stop,
            usage,
        });
        let got = events(tool_reply(), evs).await;
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            &names[..5],
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_stop"
            ]
        );
        assert_eq!(got[3].1["delta"]["text"], "Let me check.");
        let start = &got[5].1;
        assert_eq!(
            (start["type"].as_str(), start["index"].as_u64()),
            (Some("content_block_start"), Some(1))
        );
        let block = &start["content_block"];
        assert_eq!(
            (
                block["type"].as_str(),
                block["name"].as_str(),
                block["input"].clone()
            ),
            (Some("tool_use"), Some("get_weather"), json!({}))
        );
        assert!(
            block["id"]
                .as_str()
                .is_some_and(|id| id.starts_with("toolu_"))
        );
        let partial: String = got
            .iter()
            .filter(|(_, d)| d["delta"]["type"] == "input_json_delta")
            .map(|(_, d)| {
                assert_eq!(d["index"], 1);
                d["delta"]["partial_json"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        let streamed: Value =
            serde_json::from_str(&partial).expect("partial_json concatenates to JSON");
        assert_eq!(streamed, json!({"city": "Paris", "days": 3}));
        let n = got.len();
        assert_eq!(
            (got[n - 3].0.as_str(), got[n - 3].1["index"].as_u64()),
            ("content_block_stop", Some(1))
        );
        assert_eq!(got[n - 2].1["delta"]["stop_reason"], "tool_use");
        let c = Collected {
            delta: Delta {
                reasoning: String::new(),
                content: answer.concat(),
                logprobs: Vec::new(),
            },
            reason: FinishReason::Stop,
            usage,
        };
        let whole = serde_json::to_value(tool_reply().whole(c).expect("whole")).expect("json");
        assert_eq!(
            whole["content"][0],
            json!({"type": "text", "text": "Let me check."})
        );
        assert_eq!(
            (
                whole["content"][1]["type"].clone(),
                whole["content"][1]["input"].clone()
            ),
            (json!("tool_use"), streamed)
        );
        assert_eq!(whole["stop_reason"], "tool_use");
        // Cut off by the budget inside the call: the input stays an object, the reason max_tokens.
        let c = Collected {
            delta: Delta {
                reasoning: String::new(),
                content: answer[..3].concat(),
                logprobs: Vec::new(),
            },
            reason: FinishReason::Length,
            usage,
        };
        let cut = serde_json::to_value(tool_reply().whole(c).expect("whole")).expect("json");
        assert_eq!(
            (
                cut["content"][1]["input"]["city"].clone(),
                cut["stop_reason"].clone()
            ),
            (json!("Paris"), json!("max_tokens"))
        );
        assert!(cut["content"][1]["input"].is_object());
    }
}
