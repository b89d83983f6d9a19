//! `POST /v1/chat/completions`: read the body under its limits, validate, render the chat
//! template, check the prompt's size, tokenise in the bounded pool, check the context, submit
//! to the engine, then answer as one `chat.completion` or as a stream of
//! `chat.completion.chunk`s. The steps shared with the Anthropic endpoint (template, tokens,
//! budget, submission) are in `generate.rs`.
//!
//! Thinking follows the request's `chat_template_kwargs.enable_thinking`, else the server's
//! `--default-thinking` (on unless set off); the reply carries the reasoning in
//! `reasoning_content` and the answer in `content`.

use super::error::ApiError;
use super::openai::{
    ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, ChatDelta, ChatLogprobs,
    ChatMessageOut, LogprobContent, Usage,
};
use super::generate::{self, ChatGeneration};
use super::params;
use super::stream::{self, to_json};
use super::{AppState, RequestId, fingerprint, unix_now};
use crate::chat_template::ChatOptions;
use crate::engine::{Event, LogprobEntry};
use axum::Extension;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use std::time::Instant;

/// The handler.
pub async fn chat_completions(
    State(app): State<Arc<AppState>>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let received = Instant::now();
    let ready = app.ready()?;
    let body = app.admission.read_body(&headers, body).await?;
    let req: ChatCompletionRequest = serde_json::from_slice(&body)?;
    drop(body);
    params::check_model(req.model.as_deref(), &app.config.served_model_name)?;
    params::reject_unsupported_chat(&req)?;
    params::check_n(req.n)?;
    let messages = params::chat_messages(req.messages.as_deref().ok_or_else(|| ApiError::missing("messages"))?)?;
    for (i, m) in messages.iter().enumerate() {
        app.admission.check_prompt_bytes(&m.content, &format!("messages[{i}].content"))?;
        if let Some(r) = &m.reasoning_content {
            app.admission.check_prompt_bytes(r, &format!("messages[{i}].reasoning_content"))?;
        }
    }
    let logprobs = req.logprobs.unwrap_or(false);
    let sampling = params::sampling_params(&req.sampling(), logprobs, req.top_logprobs)?;
    let stop = params::stop_strings(req.stop.as_ref())?;
    let requested = match req.max_completion_tokens {
        Some(_) => params::max_tokens(req.max_completion_tokens, "max_completion_tokens")?,
        None => params::max_tokens(req.max_tokens, "max_tokens")?,
    };
    let kwargs = req.chat_template_kwargs.clone().unwrap_or_default();
    let thinking = kwargs.enable_thinking.unwrap_or(app.config.enable_thinking);
    let opts = ChatOptions { add_generation_prompt: true, enable_thinking: thinking, preserve_thinking: kwargs.preserve_thinking.unwrap_or(false) };
    let prompt = generate::tokenize_chat(&app, ready, messages, opts, true).await?;
    let generation = ChatGeneration {
        request_id: request_id.clone(),
        received,
        prompt,
        sampling,
        max_tokens: requested,
        stop,
        ignore_eos: req.ignore_eos == Some(true),
        thinking,
    };
    let (rx, _) = generate::submit_chat(&app, ready, generation)?;
    let reply = Reply { id: format!("chatcmpl-{request_id}"), created: unix_now(), model: app.config.served_model_name.clone(), logprobs };
    if req.stream == Some(true) {
        let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
        Ok(reply.stream(rx, include_usage))
    } else {
        let c = stream::collect(rx).await?;
        Ok(axum::Json(reply.whole(c, thinking)).into_response())
    }
}

/// What every chunk and the whole reply share.
struct Reply {
    id: String,
    created: u64,
    model: String,
    logprobs: bool,
}

fn chat_logprobs(entries: &[LogprobEntry]) -> ChatLogprobs {
    ChatLogprobs { content: entries.iter().map(LogprobContent::from).collect(), refusal: None }
}

impl Reply {
    fn whole(&self, c: stream::Collected, thinking: bool) -> ChatCompletion {
        let reasoning = (thinking || !c.delta.reasoning.is_empty()).then(|| c.delta.reasoning.clone());
        ChatCompletion {
            id: self.id.clone(),
            object: "chat.completion",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: fingerprint(),
            choices: vec![ChatChoice {
                index: 0,
                message: ChatMessageOut { role: "assistant", content: Some(c.delta.content), reasoning_content: reasoning, refusal: None },
                logprobs: self.logprobs.then(|| chat_logprobs(&c.delta.logprobs)),
                finish_reason: c.reason.as_str(),
            }],
            usage: Usage::from(c.usage),
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

    fn stream(self, rx: tokio::sync::mpsc::UnboundedReceiver<Event>, include_usage: bool) -> Response {
        let first = self.chunk(
            vec![ChatChunkChoice {
                index: 0,
                delta: ChatDelta { role: Some("assistant"), content: Some(String::new()), reasoning_content: None },
                logprobs: None,
                finish_reason: None,
            }],
            None,
        );
        stream::sse(rx, vec![first], move |ev| match ev {
            Event::Delta(d) => {
                let delta = ChatDelta {
                    role: None,
                    content: (!d.content.is_empty()).then_some(d.content),
                    reasoning_content: (!d.reasoning.is_empty()).then_some(d.reasoning),
                };
                let logprobs = (self.logprobs && !d.logprobs.is_empty()).then(|| chat_logprobs(&d.logprobs));
                if delta.content.is_none() && delta.reasoning_content.is_none() && logprobs.is_none() {
                    return Vec::new();
                }
                vec![self.chunk(vec![ChatChunkChoice { index: 0, delta, logprobs, finish_reason: None }], None)]
            }
            Event::Done { reason, usage } => {
                let mut out = vec![self.chunk(
                    vec![ChatChunkChoice { index: 0, delta: ChatDelta::default(), logprobs: None, finish_reason: Some(reason.as_str()) }],
                    None,
                )];
                if include_usage {
                    out.push(self.chunk(Vec::new(), Some(usage.into())));
                }
                out
            }
            Event::Failed(_) => Vec::new(),
        })
    }
}
