//! The OpenAI Responses API: `POST /v1/responses` (whole or streamed), `GET /v1/responses/{id}`
//! and `DELETE /v1/responses/{id}`, so the openai SDK's `client.responses` and Responses-speaking
//! agents can use `hostd serve`.
//!
//! The handler goes through the same admission (body limits, prompt caps, tokeniser pool), chat
//! template, queue limits and metrics as the chat route (`generate.rs`); tools share the chat
//! route's machinery (rendering, the tool-call parser, the forced-call grammar), and
//! `text.format` the constrained decoding of `response_format`. `reasoning.effort` maps onto
//! thinking on/off as `http::fields::thinking` does for chat. Errors are OpenAI-shaped.
//!
//! Responses are kept in memory (`store.rs`, bounded in age, count and bytes) unless
//! `store: false`; `previous_response_id` continues a stored response's conversation (its
//! input and output, not its `instructions`).
//!
//! Files: `wire.rs` (request and response types, the refused fields), `input.rs` (input items,
//! tools, `text.format`), `events.rs` (the response object and the event stream), `store.rs`.

pub mod events;
pub mod input;
pub mod store;
pub mod wire;

use super::admitted::Admitted;
use super::error::ApiError;
use super::fields::{self, ThinkingFields};
use super::generate::{self, ChatInput, Generation};
use super::{AppState, Principal, params, unix_now};
use crate::chat_template::ChatOptions;
use axum::Extension;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use events::{Reply, Save};
use input::Conversation;
use serde_json::{Value, json};
use std::sync::Arc;
use wire::{CreateRequest, ResponseObject};

/// The reasoning object as the request gave it (`effort`, `summary`), echoed in the response.
fn reasoning_echo(v: Option<&Value>) -> Value {
    let get = |k: &str| v.and_then(|r| r.get(k)).cloned().unwrap_or(Value::Null);
    json!({ "effort": get("effort"), "summary": get("summary") })
}

/// Errors of the shared chat steps name `messages`; here the conversation is `input`.
fn rename_messages(e: ApiError) -> ApiError {
    match e {
        ApiError::InvalidRequest {
            message,
            param: Some(p),
            code,
        } if p == "messages" || p.starts_with("messages[") => ApiError::InvalidRequest {
            message,
            param: Some("input".to_string()),
            code,
        },
        ApiError::ContextLength {
            max_context,
            requested,
            prompt_tokens,
            completion_tokens,
            ..
        } => ApiError::ContextLength {
            max_context,
            requested,
            prompt_tokens,
            completion_tokens,
            param: "input",
        },
        other => other,
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::NotFound {
        message: format!("Response with id '{id}' not found."),
        code: "response_not_found",
    }
}

/// `POST /v1/responses`.
pub async fn create(
    Admitted {
        app,
        ready,
        request_id,
        received,
        principal,
        req,
    }: Admitted<CreateRequest>,
) -> Result<Response, ApiError> {
    fields::check_extra(
        &req.extra,
        &[wire::REFUSED, fields::REFUSED],
        &[fields::IGNORED],
        "",
    )?;
    let max_tokens = params::max_tokens(req.max_output_tokens, "max_output_tokens")?;
    let tools = input::tool_request(
        req.tools.as_ref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
    )?;
    let format = input::text_format(req.text.as_ref())?;
    let (constraint, constraint_param) =
        crate::http::tools::output_constraint(&tools, format, "text.format")?;
    // `generate_summary` is the deprecated name of `summary`, which changes nothing here.
    let reasoning = req.reasoning.clone().map(|mut r| {
        if let Some(o) = r.as_object_mut() {
            o.remove("generate_summary");
        }
        r
    });
    let thinking = fields::thinking(
        &ThinkingFields {
            reasoning: reasoning.as_ref(),
            ..ThinkingFields::default()
        },
        app.config.enable_thinking,
    )?;
    let sampling = params::sampling_params(&req.sampling(), false, None)?;

    let mut conversation = match req.previous_response_id.as_deref() {
        None => Conversation::default(),
        Some(id) => {
            let prev =
                app.responses
                    .get(id, principal)
                    .ok_or_else(|| ApiError::InvalidRequest {
                        message: format!("Previous response with id '{id}' not found."),
                        param: Some("previous_response_id".to_string()),
                        code: "previous_response_not_found",
                    })?;
            Conversation {
                messages: prev.conversation,
                call_ids: prev.call_ids,
            }
        }
    };
    let check = |text: &str, param: &str| app.admission.check_prompt_bytes(text, param);
    if let Some(i) = &req.instructions {
        check(i, "instructions")?;
    }
    conversation.extend(
        req.input
            .as_ref()
            .ok_or_else(|| ApiError::missing("input"))?,
        &check,
    )?;
    let messages = input::assemble(req.instructions.as_deref(), &conversation.messages)?;
    let input = ChatInput {
        messages,
        tools: tools.definitions.clone(),
        opts: ChatOptions {
            enable_thinking: thinking.enabled,
            ..ChatOptions::default()
        },
    };
    let generation = Generation {
        request_id: request_id.clone(),
        received,
        sampling,
        stop: Vec::new(),
        ignore_eos: req.ignore_eos == Some(true),
        thinking: thinking.enabled,
        skip_special_tokens: true,
        constraint,
        constraint_param,
    };
    let (mut rxs, _prompt_tokens) =
        generate::submit_chat(&app, &ready, input, max_tokens, 1, generation)
            .await
            .map_err(rename_messages)?;
    let rx = rxs.remove(0);

    let store = req.store.unwrap_or(true);
    let base = ResponseObject {
        id: store::new_response_id(),
        object: "response",
        created_at: unix_now(),
        status: "in_progress",
        background: false,
        error: None,
        incomplete_details: None,
        instructions: req.instructions.clone(),
        max_output_tokens: req.max_output_tokens,
        model: app.config.served_model_name.clone(),
        output: Vec::new(),
        parallel_tool_calls: tools.parallel,
        previous_response_id: req.previous_response_id.clone(),
        reasoning: reasoning_echo(req.reasoning.as_ref()),
        store,
        temperature: req.temperature,
        text: json!({ "format": req.text.as_ref().and_then(|t| t.get("format")).filter(|f| !f.is_null()).cloned().unwrap_or(json!({"type": "text"})) }),
        tool_choice: req
            .tool_choice
            .clone()
            .filter(|c| !c.is_null())
            .unwrap_or(json!("auto")),
        tools: req
            .tools
            .as_ref()
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
        top_p: req.top_p,
        truncation: "disabled",
        usage: None,
        metadata: req
            .metadata
            .clone()
            .filter(|m| !m.is_null())
            .unwrap_or(json!({})),
    };
    let reply = Reply {
        base,
        show_reasoning: thinking.shown,
        tools,
        tokenizer: Arc::clone(&ready.tokenizer),
        save: store.then(|| Save {
            app: Arc::clone(&app),
            conversation,
            owner: principal,
        }),
    };
    if req.stream == Some(true) {
        Ok(reply.stream(rx))
    } else {
        let c = super::stream::collect(rx).await?;
        Ok(axum::Json(reply.whole(c)).into_response())
    }
}

/// `GET /v1/responses/{id}`: a stored response.
pub async fn retrieve(
    State(app): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let stored = app
        .responses
        .get(&id, principal)
        .ok_or_else(|| not_found(&id))?;
    Ok(axum::Json(stored.response).into_response())
}

/// `DELETE /v1/responses/{id}`: forgets a stored response.
pub async fn delete(
    State(app): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    if !app.responses.delete(&id, principal) {
        return Err(not_found(&id));
    }
    Ok(
        axum::Json(json!({ "id": id, "object": "response.deleted", "deleted": true }))
            .into_response(),
    )
}
