//! Engine events to Responses replies: one response object, or the stream of typed events the
//! openai SDK's `client.responses.stream(...)` accumulates: `response.created`,
//! `response.in_progress`, then per output item `response.output_item.added`, its content
//! events and `response.output_item.done`, then `response.completed` (or `response.incomplete`
//! when `max_output_tokens` cut it short). Every event carries `sequence_number` (0, 1, …) and is
//! sent as `event: TYPE` / `data: {json}`; no `[DONE]` follows. A failure mid-stream is an
//! `error` event followed by `response.failed`.
//!
//! Items: a `reasoning` item (its text as one `reasoning_text` part: `content_part.added`,
//! `reasoning_text.delta`…, `reasoning_text.done`, `content_part.done`) when the model reasoned
//! and the request did not exclude it; a `message` item (one `output_text` part:
//! `content_part.added`, `output_text.delta`…, `output_text.done`, `content_part.done`) when it
//! answered; a `function_call` item per tool call (`function_call_arguments.delta`… and
//! `.done`). The same writer builds both shapes, so a stream folds into the whole response.

use super::input::Conversation;
use super::store::Stored;
use super::wire::{IncompleteDetails, OutputItem, Part, ResponseObject, ResponseUsage};
use crate::engine::{Event, FinishReason};
use crate::http::AppState;
use crate::http::stream::{self, Collected, Framing, KeepAlive, SseEvent};
use crate::http::tools::{ToolRequest, call_id, random_id};
use crate::tokenizer::Tokenizer;
use crate::tool_calls::{ToolCallParser, ToolEvent};
use axum::response::Response;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use tokio::sync::mpsc::UnboundedReceiver;

/// Where a finished response is kept (`store` true).
pub struct Save {
    /// The server (its store).
    pub app: Arc<AppState>,
    /// The conversation the response answered (without `instructions`).
    pub conversation: Conversation,
    /// The principal (API key) the response belongs to.
    pub owner: crate::http::Principal,
}

impl Save {
    /// Stores `r` with its conversation extended by `r`'s output.
    fn save(self, r: &ResponseObject) {
        let mut conversation = self.conversation;
        if !r.output.is_empty() {
            let output = serde_json::to_value(&r.output).unwrap_or(Value::Null);
            let no_cap = |_: &str, _: &str| Ok::<(), crate::http::error::ApiError>(());
            if let Err(e) = conversation.extend(&output, &no_cap) {
                tracing::error!(error = %e, "the response's own output did not read back as input; not stored");
                return;
            }
        }
        let response = serde_json::to_value(r).unwrap_or(Value::Null);
        let stored = Stored {
            response,
            conversation: conversation.messages,
            call_ids: conversation.call_ids,
        };
        if !self.app.responses.insert(r.id.clone(), self.owner, stored) {
            tracing::error!(id = %r.id, "a response id was already stored; not stored again");
        }
    }
}

/// What the reply's shapes share.
pub struct Reply {
    /// The response object as it starts (`in_progress`, no output, no usage).
    pub base: ResponseObject,
    /// Reasoning items are returned (false: `reasoning.exclude`).
    pub show_reasoning: bool,
    /// The request's tools: the answer is parsed for calls unless there are none or
    /// `tool_choice` is `none`.
    pub tools: ToolRequest,
    /// Counts the reasoning's tokens.
    pub tokenizer: Arc<Tokenizer>,
    /// Set when the response is to be stored.
    pub save: Option<Save>,
}

/// Which kind of item is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Reasoning,
    Message,
    Call,
}

/// Builds the output items from the engine's deltas, and the events that describe them.
struct Writer {
    seq: Arc<AtomicU64>,
    items: Vec<OutputItem>,
    open: Option<Kind>,
    parser: Option<ToolCallParser>,
    show_reasoning: bool,
    /// All reasoning text, shown or not (for the token count).
    reasoning: String,
}

impl Writer {
    fn emit(&self, out: &mut Vec<Value>, mut v: Value) {
        v["sequence_number"] = json!(self.seq.fetch_add(1, Relaxed));
        out.push(v);
    }

    /// The open item's index and id.
    fn at(&self) -> (usize, String) {
        let i = self.items.len().saturating_sub(1);
        (
            i,
            self.items
                .get(i)
                .map_or_else(String::new, |it| it.id().to_string()),
        )
    }

    fn open(&mut self, kind: Kind, item: OutputItem, out: &mut Vec<Value>) {
        self.close("completed", out);
        self.items.push(item);
        self.open = Some(kind);
        let (i, id) = self.at();
        let added = &self.items[i];
        self.emit(
            out,
            json!({ "type": "response.output_item.added", "output_index": i, "item": added }),
        );
        let part = match kind {
            Kind::Reasoning => Part::ReasoningText {
                text: String::new(),
            },
            Kind::Message => Part::output_text(String::new()),
            Kind::Call => return,
        };
        self.emit(out, json!({ "type": "response.content_part.added", "item_id": id, "output_index": i, "content_index": 0, "part": part }));
        // The part exists from now on: the final item carries it.
        if let Some(OutputItem::Reasoning { content, .. } | OutputItem::Message { content, .. }) =
            self.items.last_mut()
        {
            content.push(part);
        }
    }

    /// Appends `text` to the open item's part.
    fn push_text(&mut self, text: &str) {
        if let Some(OutputItem::Reasoning { content, .. } | OutputItem::Message { content, .. }) =
            self.items.last_mut()
            && let Some(p) = content.first_mut()
        {
            p.text_mut().push_str(text);
        }
    }

    fn reasoning(&mut self, text: &str, out: &mut Vec<Value>) {
        self.reasoning.push_str(text);
        if !self.show_reasoning || text.is_empty() {
            return;
        }
        if self.open != Some(Kind::Reasoning) {
            let item = OutputItem::Reasoning {
                id: random_id("rs_"),
                summary: Vec::new(),
                content: Vec::new(),
                encrypted_content: None,
                status: "in_progress",
            };
            self.open(Kind::Reasoning, item, out);
        }
        self.push_text(text);
        let (i, id) = self.at();
        self.emit(out, json!({ "type": "response.reasoning_text.delta", "item_id": id, "output_index": i, "content_index": 0, "delta": text }));
    }

    fn text(&mut self, text: &str, out: &mut Vec<Value>) {
        if text.is_empty() {
            return;
        }
        if self.open != Some(Kind::Message) {
            let item = OutputItem::Message {
                id: random_id("msg_"),
                role: "assistant",
                content: Vec::new(),
                status: "in_progress",
            };
            self.open(Kind::Message, item, out);
        }
        self.push_text(text);
        let (i, id) = self.at();
        self.emit(
            out,
            json!({ "type": "response.output_text.delta", "item_id": id, "output_index": i, "content_index": 0, "delta": text, "logprobs": [] }),
        );
    }

    /// Answer text: output text, or (with tools) what the parser made of it.
    fn content(&mut self, text: &str, out: &mut Vec<Value>) {
        let events = match self.parser.as_mut() {
            None => return self.text(text, out),
            Some(p) => p.feed(text),
        };
        self.tool_events(events, out);
    }

    fn tool_events(&mut self, events: Vec<ToolEvent>, out: &mut Vec<Value>) {
        for e in events {
            match e {
                ToolEvent::Content(t) => self.text(&t, out),
                ToolEvent::CallStart { name, .. } => {
                    let item = OutputItem::FunctionCall {
                        id: random_id("fc_"),
                        call_id: call_id(),
                        name,
                        arguments: String::new(),
                        status: "in_progress",
                    };
                    self.open(Kind::Call, item, out);
                }
                ToolEvent::Arguments { fragment, .. } => {
                    if let Some(OutputItem::FunctionCall { arguments, .. }) = self.items.last_mut()
                    {
                        arguments.push_str(&fragment);
                    }
                    let (i, id) = self.at();
                    self.emit(out, json!({ "type": "response.function_call_arguments.delta", "item_id": id, "output_index": i, "delta": fragment }));
                }
            }
        }
    }

    /// Closes the open item with `status`: its part's `.done` events, then `output_item.done`.
    fn close(&mut self, status: &'static str, out: &mut Vec<Value>) {
        let Some(kind) = self.open.take() else {
            return;
        };
        let (i, id) = self.at();
        if let Some(item) = self.items.last_mut() {
            item.set_status(status);
        }
        match (kind, &self.items[i]) {
            (Kind::Reasoning, OutputItem::Reasoning { content, .. })
            | (Kind::Message, OutputItem::Message { content, .. }) => {
                let part = content
                    .first()
                    .cloned()
                    .unwrap_or_else(|| Part::output_text(String::new()));
                let text = match &part {
                    Part::OutputText { text, .. } | Part::ReasoningText { text } => text.clone(),
                };
                let done = if kind == Kind::Reasoning {
                    json!({ "type": "response.reasoning_text.done", "item_id": id, "output_index": i, "content_index": 0, "text": text })
                } else {
                    json!({ "type": "response.output_text.done", "item_id": id, "output_index": i, "content_index": 0, "text": text, "logprobs": [] })
                };
                self.emit(out, done);
                self.emit(out, json!({ "type": "response.content_part.done", "item_id": id, "output_index": i, "content_index": 0, "part": part }));
            }
            (
                _,
                OutputItem::FunctionCall {
                    arguments, name, ..
                },
            ) => {
                let done = json!({ "type": "response.function_call_arguments.done", "item_id": id, "output_index": i, "name": name, "arguments": arguments });
                self.emit(out, done);
            }
            _ => {}
        }
        let item = json!(self.items[i]);
        self.emit(
            out,
            json!({ "type": "response.output_item.done", "output_index": i, "item": item }),
        );
    }

    /// The generation ended: what the parser still held, then the open item closes.
    fn finish(&mut self, reason: FinishReason, out: &mut Vec<Value>) {
        if let Some(p) = self.parser.as_mut() {
            let events = p.finish();
            self.tool_events(events, out);
        }
        let status = if reason == FinishReason::Length {
            "incomplete"
        } else {
            "completed"
        };
        self.close(status, out);
    }
}

impl Reply {
    fn writer(&self, seq: Arc<AtomicU64>) -> Writer {
        Writer {
            seq,
            items: Vec::new(),
            open: None,
            parser: self.tools.parser(),
            show_reasoning: self.show_reasoning,
            reasoning: String::new(),
        }
    }

    /// The finished response object.
    fn finished(
        &self,
        w: Writer,
        reason: FinishReason,
        usage: crate::engine::Usage,
    ) -> ResponseObject {
        let reasoning_tokens = if w.reasoning.is_empty() {
            0
        } else {
            self.tokenizer
                .encode(&w.reasoning)
                .map_or(0, |ids| ids.len())
        };
        let incomplete = reason == FinishReason::Length;
        ResponseObject {
            status: if incomplete {
                "incomplete"
            } else {
                "completed"
            },
            incomplete_details: incomplete.then_some(IncompleteDetails {
                reason: "max_output_tokens",
            }),
            output: w.items,
            usage: Some(ResponseUsage::new(usage, reasoning_tokens)),
            ..self.base.clone()
        }
    }

    /// The whole response (stored when asked).
    pub fn whole(mut self, c: Collected) -> ResponseObject {
        let mut w = self.writer(Arc::new(AtomicU64::new(0)));
        let mut sink = Vec::new();
        w.reasoning(&c.delta.reasoning, &mut sink);
        w.content(&c.delta.content, &mut sink);
        w.finish(c.reason, &mut sink);
        let r = self.finished(w, c.reason, c.usage);
        if let Some(save) = self.save.take() {
            save.save(&r);
        }
        r
    }

    /// The response as a stream of events (stored at its end when asked).
    pub fn stream(mut self, rx: UnboundedReceiver<Event>) -> Response {
        let seq = Arc::new(AtomicU64::new(0));
        let w = self.writer(Arc::clone(&seq));
        let mut first = Vec::new();
        for kind in ["response.created", "response.in_progress"] {
            w.emit(&mut first, json!({ "type": kind, "response": self.base }));
        }
        let framing = framing(Arc::clone(&seq), self.base.clone());
        let mut w = Some(w);
        let format = move |_choice: usize, ev: Event| {
            let mut out = Vec::new();
            match ev {
                Event::Delta(d) => {
                    if let Some(w) = w.as_mut() {
                        if !d.reasoning.is_empty() {
                            w.reasoning(&d.reasoning, &mut out);
                        }
                        if !d.content.is_empty() {
                            w.content(&d.content, &mut out);
                        }
                    }
                }
                Event::Done { reason, usage } => {
                    if let Some(mut wr) = w.take() {
                        wr.finish(reason, &mut out);
                        let seq = Arc::clone(&wr.seq);
                        let r = self.finished(wr, reason, usage);
                        let kind = if r.status == "incomplete" {
                            "response.incomplete"
                        } else {
                            "response.completed"
                        };
                        out.push(json!({ "type": kind, "response": r, "sequence_number": seq.fetch_add(1, Relaxed) }));
                        if let Some(save) = self.save.take() {
                            save.save(&r);
                        }
                    }
                }
                // Failures are framed by `framing()`.
                Event::Failed(_) => {}
            }
            out.into_iter().map(frame).collect()
        };
        stream::sse_framed(
            stream::Choices::new(vec![rx]),
            first.into_iter().map(frame).collect(),
            format,
            framing,
        )
    }
}

/// An event as an SSE frame named by its `type`.
fn frame(v: Value) -> SseEvent {
    let name = v["type"].as_str().unwrap_or("message").to_string();
    SseEvent::default().event(name).data(v.to_string())
}

/// The Responses framing: on failure an `error` event and `response.failed` (its `error` names
/// the request id, not the failure's detail), nothing after a normal end, comment keep-alives.
fn framing(seq: Arc<AtomicU64>, base: ResponseObject) -> Framing {
    Framing {
        failure: Box::new(move |e, request_id| {
            let body = e.body_for(request_id);
            let err = &body["error"];
            let error = json!({ "type": "error", "code": err["code"], "message": err["message"], "param": err["param"], "sequence_number": seq.fetch_add(1, Relaxed) });
            let failed = ResponseObject {
                status: "failed",
                error: Some(json!({ "code": "server_error", "message": err["message"] })),
                ..base.clone()
            };
            let failed = json!({ "type": "response.failed", "response": failed, "sequence_number": seq.fetch_add(1, Relaxed) });
            vec![frame(error), frame(failed)]
        }),
        done: Vec::new(),
        keep_alive: KeepAlive::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Delta, Usage};
    use crate::http::responses::input;
    use crate::http::test_support::{delta, sse_events};

    fn reply(tools: Value) -> Reply {
        let tokenizer = Tokenizer::from_model_dir(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models/tiny"),
        )
        .expect("fixture tokenizer");
        let base = ResponseObject {
            id: "resp_1".into(),
            object: "response",
            created_at: 1,
            status: "in_progress",
            background: false,
            error: None,
            incomplete_details: None,
            instructions: None,
            max_output_tokens: None,
            model: "m".into(),
            output: Vec::new(),
            parallel_tool_calls: true,
            previous_response_id: None,
            reasoning: json!({"effort": null, "summary": null}),
            store: false,
            temperature: None,
            text: json!({"format": {"type": "text"}}),
            tool_choice: json!("auto"),
            tools: Vec::new(),
            top_p: None,
            truncation: "disabled",
            usage: None,
            metadata: json!({}),
        };
        Reply {
            base,
            show_reasoning: true,
            tools: input::tool_request(Some(&tools), None, None).expect("tools"),
            tokenizer: Arc::new(tokenizer),
            save: None,
        }
    }

    fn weather() -> Value {
        json!([{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}])
    }

    /// The (event name, data) pairs of a streamed reply.
    async fn events(r: Reply, evs: Vec<Event>) -> Vec<(String, Value)> {
        sse_events(evs, |rx| r.stream(rx)).await
    }

    fn without_ids(items: &Value) -> Value {
        let mut items = items.clone();
        for it in items.as_array_mut().expect("items") {
            let o = it.as_object_mut().expect("item");
            o.remove("id");
            o.remove("call_id");
        }
        items
    }

    /// Reasoning, text and a call split at awkward places: items open and close in order, every
    /// event is numbered, and the terminal response is the whole response.
    #[tokio::test]
    async fn stream_items_follow_the_sdk_lifecycle_and_equal_the_whole_response() {
        let answer = [
            "Let me check.\n<tool_",
            "call>\n<function=get_weather>\n<parameter=ci",
            "ty>\nOslo\n</parameter>\n<parameter=days>\n2\n</para",
            "meter>\n</function>\n</tool_call>",
        ];
        let usage = Usage {
            prompt_tokens: 7,
            completion_tokens: 30,
            cached_tokens: 2,
        };
        let mut evs = vec![delta("hm", ""), delta(" ok", "")];
        evs.extend(answer.iter().map(|a| delta("", a)));
        evs.push(Event::Done {
            reason: FinishReason::Stop,
            usage,
        });
        let got = events(reply(weather()), evs).await;
        // Runs of deltas count once: how many the parser makes is its own business.
        let mut names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        names.dedup();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ],
            "{names:?}"
        );
        for (k, (name, data)) in got.iter().enumerate() {
            assert_eq!(
                (data["type"].as_str(), data["sequence_number"].as_u64()),
                (Some(name.as_str()), Some(k as u64))
            );
        }
        let last = &got[got.len() - 1].1["response"];
        assert_eq!(last["status"], "completed");
        let args: String = got
            .iter()
            .filter(|(n, _)| n == "response.function_call_arguments.delta")
            .map(|(_, d)| d["delta"].as_str().unwrap_or_default().to_string())
            .collect();
        let call = &last["output"][2];
        assert_eq!(
            (call["type"].as_str(), call["name"].as_str()),
            (Some("function_call"), Some("get_weather"))
        );
        assert_eq!(call["arguments"].as_str(), Some(args.as_str()));
        assert_eq!(
            serde_json::from_str::<Value>(&args).expect("JSON"),
            json!({"city": "Oslo", "days": 2})
        );
        assert_eq!(last["output"][0]["content"][0]["text"], "hm ok");
        assert_eq!(last["output"][1]["content"][0]["text"], "Let me check.");

        let c = Collected {
            delta: Delta {
                reasoning: "hm ok".into(),
                content: answer.concat(),
                logprobs: Vec::new(),
            },
            reason: FinishReason::Stop,
            usage,
        };
        let whole = serde_json::to_value(reply(weather()).whole(c)).expect("json");
        assert_eq!(without_ids(&whole["output"]), without_ids(&last["output"]));
        assert_eq!(whole["usage"], last["usage"]);
        assert_eq!(whole["usage"]["input_tokens_details"]["cached_tokens"], 2);
        assert!(
            whole["usage"]["output_tokens_details"]["reasoning_tokens"]
                .as_u64()
                .is_some_and(|n| n >= 1)
        );
    }

    #[tokio::test]
    async fn a_cut_reply_is_incomplete_and_a_failure_is_an_error_then_response_failed() {
        let usage = Usage {
            prompt_tokens: 3,
            completion_tokens: 2,
            cached_tokens: 0,
        };
        let got = events(
            reply(json!([])),
            vec![
                delta("", "Hi"),
                Event::Done {
                    reason: FinishReason::Length,
                    usage,
                },
            ],
        )
        .await;
        let (name, last) = &got[got.len() - 1];
        assert_eq!(name, "response.incomplete");
        assert_eq!(
            last["response"]["incomplete_details"],
            json!({"reason": "max_output_tokens"})
        );
        assert_eq!(last["response"]["output"][0]["status"], "incomplete");

        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let _ = tx.send(delta("", "Hi"));
        let _ = tx.send(Event::Failed(crate::engine::Failure {
            message: "boom at /x.sock".into(),
            retry_after_s: None,
        }));
        let body = axum::body::to_bytes(reply(json!([])).stream(rx).into_body(), 1 << 20)
            .await
            .expect("body");
        let text = String::from_utf8_lossy(&body);
        assert!(!text.contains("x.sock"), "{text}");
        assert!(
            text.contains("event: error")
                && text.contains("event: response.failed")
                && !text.contains("response.completed"),
            "{text}"
        );
    }
}
