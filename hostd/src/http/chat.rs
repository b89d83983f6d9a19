//! `POST /v1/chat/completions`: read the body under its limits, validate, render the chat
//! template, check the prompt's size, tokenise in the bounded pool, check the context, submit
//! to the engine, then answer as one `chat.completion` or as a stream of
//! `chat.completion.chunk`s.
//!
//! With `tools` (and `tool_choice` not `none`) each choice's content is run through the
//! tool-call parser (`crate::tool_calls`): calls come back as `message.tool_calls`
//! (`finish_reason` `tool_calls`), or streamed as `delta.tool_calls` entries.
//!
//! Thinking follows the request's switches (`chat_template_kwargs.enable_thinking`,
//! `enable_thinking`, `reasoning_effort`, `reasoning`; see `http::fields::thinking`), else the
//! server's `--default-thinking` (on unless set off); the reply carries the reasoning in
//! `reasoning_content` (unless `include_reasoning: false`) and the answer in `content`. With
//! `n > 1` each choice is its own sequence in the scheduler's batch, with its own seed. Rendering
//! and tokenising are shared with the Anthropic endpoint
//! (`generate.rs`), and so is the submission (one sequence per choice, each with its own
//! grammar state).

use super::admitted::Admitted;
use super::error::ApiError;
use super::fields::{self, Thinking, ThinkingFields};
use super::generate::{self, ChatInput, Generation};
use super::openai::{
    ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest,
    ChatDelta, ChatLogprobs, ChatMessageOut, FunctionCallOut, FunctionDelta, LogprobContent,
    ToolCallDelta, ToolCallOut, Usage,
};
use super::params;
use super::response_format;
use super::stream::{self, to_json};
use super::tools::{self, ToolRequest};
use super::{fingerprint, unix_now};
use crate::chat_template::ChatOptions;
use crate::engine::{Event, FinishReason, LogprobEntry, Usage as EngineUsage};
use crate::tool_calls::{ToolCallParser, ToolEvent};
use axum::response::{IntoResponse, Response};

/// The handler.
pub(super) async fn chat_completions(
    Admitted {
        app,
        ready,
        request_id,
        received,
        req,
        ..
    }: Admitted<ChatCompletionRequest>,
) -> Result<Response, ApiError> {
    params::reject_unsupported_chat(&req)?;
    let n = params::check_n(req.n)?;
    let constraint = response_format::constraint_spec(req.response_format.as_ref())?;
    let messages = params::chat_messages(
        req.messages
            .as_deref()
            .ok_or_else(|| ApiError::missing("messages"))?,
    )?;
    let tool_req = tools::tool_request(&req)?;
    let (constraint, constraint_param) =
        tools::output_constraint(&tool_req, constraint, "response_format")?;
    for (i, m) in messages.iter().enumerate() {
        app.admission
            .check_prompt_bytes(&m.content, &format!("messages[{i}].content"))?;
        if let Some(r) = &m.reasoning_content {
            app.admission
                .check_prompt_bytes(r, &format!("messages[{i}].reasoning_content"))?;
        }
    }
    let logprobs = req.logprobs.unwrap_or(false);
    let mut sampling = params::sampling_params(&req.sampling(), logprobs, req.top_logprobs)?;
    sampling.logit_bias = params::logit_bias(req.logit_bias.as_ref(), &ready.tokenizer)?;
    let stop = params::stop_strings(req.stop.as_ref())?;
    let requested = match req.max_completion_tokens {
        Some(_) => params::max_tokens(req.max_completion_tokens, "max_completion_tokens")?,
        None => params::max_tokens(req.max_tokens, "max_tokens")?,
    };
    let kwargs = req.chat_template_kwargs.clone().unwrap_or_default();
    let switches = ThinkingFields {
        template_kwarg: kwargs.enable_thinking,
        enable_thinking: req.enable_thinking,
        reasoning_effort: req.reasoning_effort.as_deref(),
        include_reasoning: req.include_reasoning,
        reasoning: req.reasoning.as_ref(),
    };
    let thinking = fields::thinking(&switches, app.config.enable_thinking)?;
    let opts = ChatOptions {
        add_generation_prompt: true,
        enable_thinking: thinking.enabled,
        preserve_thinking: kwargs.preserve_thinking.unwrap_or(false),
    };
    let input = ChatInput {
        messages,
        tools: tool_req.definitions.clone(),
        opts,
    };
    // One sequence per choice, each with its own seed and grammar state.
    let generation = Generation {
        request_id: request_id.clone(),
        received,
        sampling,
        stop,
        ignore_eos: req.ignore_eos == Some(true),
        thinking: thinking.enabled,
        skip_special_tokens: req.skip_special_tokens.unwrap_or(true),
        constraint,
        constraint_param,
    };
    let (rxs, _prompt_tokens) =
        generate::submit_chat(&app, &ready, input, requested, n, generation).await?;
    let reply = Reply {
        id: format!("chatcmpl-{request_id}"),
        created: unix_now(),
        model: app.config.served_model_name.clone(),
        logprobs,
        thinking,
        tools: tool_req,
    };
    let choices = stream::Choices::new(rxs);
    if req.stream == Some(true) {
        let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
        Ok(reply.stream(choices, n, include_usage))
    } else {
        let all = stream::collect_choices(choices).await?;
        Ok(axum::Json(reply.whole(all)).into_response())
    }
}

/// What every chunk and the whole reply share.
struct Reply {
    id: String,
    created: u64,
    model: String,
    logprobs: bool,
    thinking: Thinking,
    tools: ToolRequest,
}
/// `finish_reason`: `tool_calls` when the reply made calls and ended by itself.
fn finish_reason(reason: FinishReason, calls: usize) -> &'static str {
    if calls > 0 && reason == FinishReason::Stop {
        "tool_calls"
    } else {
        reason.as_str()
    }
}

/// Parser events as a chunk's content and `tool_calls` entries (each call's id made on its start).
fn tool_deltas(events: Vec<ToolEvent>, ids: &mut Vec<String>) -> (String, Vec<ToolCallDelta>) {
    let mut content = String::new();
    let mut calls: Vec<ToolCallDelta> = Vec::new();
    for e in events {
        match e {
            ToolEvent::Content(t) => content.push_str(&t),
            ToolEvent::CallStart { index, name } => {
                ids.push(tools::call_id());
                calls.push(ToolCallDelta {
                    index,
                    id: Some(ids[index].clone()),
                    kind: Some("function"),
                    function: FunctionDelta {
                        name: Some(name),
                        arguments: Some(String::new()),
                    },
                });
            }
            ToolEvent::Arguments { index, fragment } => match calls.last_mut() {
                Some(last) if last.index == index => last
                    .function
                    .arguments
                    .get_or_insert_default()
                    .push_str(&fragment),
                _ => calls.push(ToolCallDelta {
                    index,
                    id: None,
                    kind: None,
                    function: FunctionDelta {
                        name: None,
                        arguments: Some(fragment),
                    },
                }),
            },
        }
    }
    (content, calls)
}

fn chat_logprobs(entries: &[LogprobEntry]) -> ChatLogprobs {
    ChatLogprobs {
        content: entries.iter().map(LogprobContent::from).collect(),
        refusal: None,
    }
}

impl Reply {
    fn whole(&self, all: Vec<stream::Collected>) -> ChatCompletion {
        let usage = stream::total_usage(&all.iter().map(|c| c.usage).collect::<Vec<_>>());
        let choices = all
            .into_iter()
            .enumerate()
            .map(|(index, c)| {
                let shown =
                    self.thinking.shown && (self.thinking.enabled || !c.delta.reasoning.is_empty());
                let reasoning = shown.then(|| c.delta.reasoning.clone());
                let (content, calls) = self.tools.split_calls(c.delta.content);
                let finish_reason = finish_reason(c.reason, calls.len());
                let tool_calls: Vec<ToolCallOut> = calls
                    .into_iter()
                    .map(|(name, arguments)| ToolCallOut {
                        id: tools::call_id(),
                        kind: "function",
                        function: FunctionCallOut { name, arguments },
                    })
                    .collect();
                let content = (tool_calls.is_empty() || !content.is_empty()).then_some(content);
                ChatChoice {
                    index,
                    message: ChatMessageOut {
                        role: "assistant",
                        content,
                        reasoning_content: reasoning,
                        refusal: None,
                        tool_calls: (!tool_calls.is_empty()).then_some(tool_calls),
                    },
                    logprobs: self.logprobs.then(|| chat_logprobs(&c.delta.logprobs)),
                    finish_reason,
                }
            })
            .collect();
        ChatCompletion {
            id: self.id.clone(),
            object: "chat.completion",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: fingerprint(),
            choices,
            usage: Usage::from(usage),
        }
    }

    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<Usage>) -> String {
        to_json(&ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: fingerprint(),
            choices,
            usage,
        })
    }

    /// Chunks of `n` choices, each tagged with its `index` and run through its own tool-call
    /// parser; the usage chunk (when asked for) comes after the last choice's finish chunk and
    /// sums them.
    fn stream(self, choices: stream::Choices, n: usize, include_usage: bool) -> Response {
        let first = (0..n)
            .map(|index| {
                self.chunk(
                    vec![ChatChunkChoice {
                        index,
                        delta: ChatDelta {
                            role: Some("assistant"),
                            content: Some(String::new()),
                            ..ChatDelta::default()
                        },
                        logprobs: None,
                        finish_reason: None,
                    }],
                    None,
                )
            })
            .collect();
        let mut usages: Vec<Option<EngineUsage>> = vec![None; n];
        let mut parsers: Vec<Option<ToolCallParser>> =
            (0..n).map(|_| self.tools.parser()).collect();
        let mut ids: Vec<Vec<String>> = vec![Vec::new(); n];
        stream::sse_choices(choices, first, move |index, ev| match ev {
            Event::Delta(d) => {
                let (content, calls) = match parsers[index].as_mut() {
                    Some(p) => tool_deltas(p.feed(&d.content), &mut ids[index]),
                    None => (d.content, Vec::new()),
                };
                let reasoning = if self.thinking.shown {
                    d.reasoning
                } else {
                    String::new()
                };
                let delta = ChatDelta {
                    role: None,
                    content: (!content.is_empty()).then_some(content),
                    reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
                    tool_calls: (!calls.is_empty()).then_some(calls),
                };
                let logprobs =
                    (self.logprobs && !d.logprobs.is_empty()).then(|| chat_logprobs(&d.logprobs));
                if delta.content.is_none()
                    && delta.reasoning_content.is_none()
                    && delta.tool_calls.is_none()
                    && logprobs.is_none()
                {
                    return Vec::new();
                }
                vec![self.chunk(
                    vec![ChatChunkChoice {
                        index,
                        delta,
                        logprobs,
                        finish_reason: None,
                    }],
                    None,
                )]
            }
            Event::Done { reason, usage } => {
                let mut out = Vec::new();
                let mut calls = 0;
                if let Some(p) = parsers[index].as_mut() {
                    let (content, deltas) = tool_deltas(p.finish(), &mut ids[index]);
                    calls = p.reported_calls();
                    if !content.is_empty() || !deltas.is_empty() {
                        let delta = ChatDelta {
                            content: (!content.is_empty()).then_some(content),
                            tool_calls: (!deltas.is_empty()).then_some(deltas),
                            ..ChatDelta::default()
                        };
                        out.push(self.chunk(
                            vec![ChatChunkChoice {
                                index,
                                delta,
                                logprobs: None,
                                finish_reason: None,
                            }],
                            None,
                        ));
                    }
                }
                out.push(self.chunk(
                    vec![ChatChunkChoice {
                        index,
                        delta: ChatDelta::default(),
                        logprobs: None,
                        finish_reason: Some(finish_reason(reason, calls)),
                    }],
                    None,
                ));
                usages[index] = Some(usage);
                if include_usage && usages.iter().all(Option::is_some) {
                    let all: Vec<EngineUsage> = usages.iter().flatten().copied().collect();
                    out.push(self.chunk(Vec::new(), Some(stream::total_usage(&all).into())));
                }
                out
            }
            Event::Failed(_) => Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Streamed deltas: the first entry of a call carries id, type and name; later entries of the
    /// same call only argument text, so the openai SDK's concatenation rebuilds each field.
    #[test]
    fn tool_deltas_follow_openais_shape() {
        let events = vec![
            ToolEvent::Content("Hi".into()),
            ToolEvent::CallStart {
                index: 0,
                name: "f".into(),
            },
            ToolEvent::Arguments {
                index: 0,
                fragment: "{".into(),
            },
            ToolEvent::Arguments {
                index: 0,
                fragment: "\"a\":1".into(),
            },
        ];
        let mut ids = Vec::new();
        let (content, deltas) = tool_deltas(events, &mut ids);
        assert_eq!(content, "Hi");
        assert_eq!(deltas.len(), 1);
        let v = serde_json::to_value(&deltas[0]).unwrap();
        assert_eq!(v["id"], serde_json::json!(ids[0]));
        assert_eq!(v["type"], "function");
        assert_eq!(
            v["function"],
            serde_json::json!({"name": "f", "arguments": "{\"a\":1"})
        );
        let (_, more) = tool_deltas(
            vec![ToolEvent::Arguments {
                index: 0,
                fragment: "}".into(),
            }],
            &mut ids,
        );
        let v = serde_json::to_value(&more[0]).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"index": 0, "function": {"arguments": "}"}})
        );
        assert_eq!(finish_reason(FinishReason::Stop, 1), "tool_calls");
        assert_eq!(finish_reason(FinishReason::Length, 1), "length");
        assert_eq!(finish_reason(FinishReason::Stop, 0), "stop");
    }
}
