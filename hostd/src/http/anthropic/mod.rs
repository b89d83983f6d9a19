//! The Anthropic Messages API: `POST /v1/messages` (whole or streamed) and
//! `POST /v1/messages/count_tokens`, so the official anthropic SDK and Anthropic-speaking agents
//! can use `hostd serve` as their base URL.
//!
//! The handlers go through the same admission (body limits, prompt caps, tokeniser pool),
//! chat template, queue limits and metrics as the OpenAI routes (`generate.rs`); only the wire
//! shapes differ. Errors on these routes are Anthropic-shaped (`error.rs`). Tool use shares the
//! OpenAI route's machinery: the definitions render through the chat template's tools section,
//! replies are parsed into `tool_use` blocks by the tool-call parser, and `tool_choice` `any` or
//! `tool` is forced by constrained decoding (the tool-call grammar).
//!
//! Files: `wire.rs` (request and reply types), `convert.rs` (messages and other fields to chat
//! inputs), `tools.rs` (tools and `tool_choice`), `events.rs` (replies and the event stream),
//! `error.rs` (the error shape).

pub mod convert;
pub mod error;
pub mod events;
pub mod tools;
pub mod wire;

use super::admitted::Admitted;
use super::generate::{self, ChatInput, Generation};
use super::openai::SamplingFields;
use super::{AppState, params};
use crate::chat_template::{ChatMessage, ChatOptions};
use crate::http::error::ApiError;
use crate::http::tools::ToolRequest;
use axum::response::{IntoResponse, Response};
use convert::Thinking;
use error::AnthropicError;
use events::Reply;
use wire::{Conversation, CountTokensRequest, MessagesRequest, TokenCount};

/// Whether `path` belongs to the Anthropic routes (their errors take Anthropic's shape).
pub fn owns(path: &str) -> bool {
    path == "/v1/messages" || path.starts_with("/v1/messages/")
}

/// A checked conversation: template messages, the thinking switch and the tools.
struct Checked {
    messages: Vec<ChatMessage>,
    thinking: Thinking,
    tools: ToolRequest,
}

/// Checks the conversation and converts it to template messages, the thinking switch and the
/// tool request.
fn conversation(app: &AppState, c: Conversation<'_>) -> Result<Checked, ApiError> {
    let tools = tools::tool_request(c.tools, c.tool_choice)?;
    convert::output_config(c.output_config)?;
    convert::refuse_set(&[(c.mcp_servers, "mcp_servers", "MCP servers")])?;
    // Server-side context editing (clearing old tool results or thinking when the context grows)
    // is an optimisation of the prompt, not a change of what is asked: it is ignored, and the
    // whole conversation is used. Claude Code sends it on every request.
    if c.context_management.is_some_and(|v| !v.is_null()) {
        tracing::debug!("context_management ignored: the whole conversation is used");
    }
    let thinking = convert::thinking(c.thinking, app.config.enable_thinking)?;
    let check = |text: &str, param: &str| app.admission.check_prompt_bytes(text, param);
    let system = convert::system(c.system, &check)?;
    let messages = convert::messages(
        system,
        c.messages.ok_or_else(|| ApiError::missing("messages"))?,
        &check,
    )?;
    Ok(Checked {
        messages,
        thinking,
        tools,
    })
}

fn options(thinking: Thinking) -> ChatOptions {
    ChatOptions {
        enable_thinking: thinking.enabled,
        ..ChatOptions::default()
    }
}

/// `POST /v1/messages`.
pub async fn messages(
    Admitted {
        app,
        ready,
        request_id,
        received,
        req,
        ..
    }: Admitted<MessagesRequest>,
) -> Result<Response, AnthropicError> {
    let max_tokens = params::max_tokens(
        Some(
            req.max_tokens
                .ok_or_else(|| ApiError::missing("max_tokens"))?,
        ),
        "max_tokens",
    )?;
    convert::refuse_set(&[(req.container.as_ref(), "container", "Containers")])?;
    let Checked {
        messages,
        thinking,
        tools,
    } = conversation(&app, req.conversation())?;
    let constraint = crate::http::tools::forced_constraint(&tools)?;
    let fields = SamplingFields {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        ..SamplingFields::default()
    };
    let sampling = params::sampling_params(&fields, false, None)?;
    let stop = params::stop_list(
        req.stop_sequences.clone().unwrap_or_default(),
        "stop_sequences",
    )?;
    let input = ChatInput {
        messages,
        tools: tools.definitions.clone(),
        opts: options(thinking),
    };
    let generation = Generation {
        request_id: request_id.clone(),
        received,
        sampling,
        stop: stop.clone(),
        ignore_eos: req.ignore_eos == Some(true),
        thinking: thinking.enabled,
        skip_special_tokens: true,
        constraint,
        constraint_param: "tool_choice",
    };
    let (mut rxs, prompt_tokens) =
        generate::submit_chat(&app, &ready, input, max_tokens, 1, generation).await?;
    let rx = rxs.remove(0);
    let reply = Reply {
        id: format!("msg_{request_id}"),
        model: app.config.served_model_name.clone(),
        stop,
        display_thinking: thinking.display,
        tools,
    };
    if req.stream == Some(true) {
        Ok(reply.stream(rx, prompt_tokens))
    } else {
        let c = super::stream::collect(rx).await?;
        Ok(axum::Json(reply.whole(c)?).into_response())
    }
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens as `/v1/messages` would render them
/// (system, tools, messages, thinking switch, generation prompt), without generating.
pub async fn count_tokens(
    Admitted {
        app, ready, req, ..
    }: Admitted<CountTokensRequest>,
) -> Result<Response, AnthropicError> {
    let Checked {
        messages,
        thinking,
        tools,
    } = conversation(&app, req.conversation())?;
    let input = ChatInput {
        messages,
        tools: tools.definitions,
        opts: options(thinking),
    };
    let prompt = generate::tokenize_chat(&app, &ready, input).await?;
    Ok(axum::Json(TokenCount {
        input_tokens: prompt.ids.len(),
    })
    .into_response())
}
