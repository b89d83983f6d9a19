//! The steps every chat-style endpoint (OpenAI chat completions, Anthropic messages) shares
//! between a validated conversation and the engine: render the chat template, check the
//! prompt's size, tokenise in the bounded pool, fit the
//! completion budget to the context, and submit to the scheduler ([`submit_chat`]: the OpenAI
//! handler's `n` choices, the Anthropic and Responses handlers' one). [`submit_choices`] is the
//! last step, also used by legacy completions: one grammar state and one seed per choice. What
//! every handler settles about its output travels as one [`Generation`].
//!
//! Where the prefix cache keeps states is the engine's business (`engine::marks`, from the
//! prompt's tokens alone).

use super::admission;
use super::error::ApiError;
use super::{AppState, Ready, params, response_format};
use crate::chat_template::{self, ChatMessage, ChatOptions};
use crate::constraint::{ConstraintSpec, StartOptions};
use crate::engine::{Event, GenRequest};
use crate::sampling::SamplingParams;
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedReceiver;

/// A rendered and tokenised chat prompt.
#[derive(Debug)]
pub(super) struct ChatPrompt {
    /// The prompt's ids.
    pub ids: Vec<u32>,
}

/// A conversation to render: its messages, the tool definitions as the client sent them, and
/// the template's switches.
pub(super) struct ChatInput {
    /// The messages.
    pub messages: Vec<ChatMessage>,
    /// The tool definitions.
    pub tools: Vec<Value>,
    /// The template's switches.
    pub opts: ChatOptions,
}

/// Renders `input`, checks the prompt against the byte cap and the context (a 400 naming
/// `messages`), and tokenises it in the bounded pool.
pub(super) async fn tokenize_chat(
    app: &AppState,
    ready: &Ready,
    input: ChatInput,
) -> Result<ChatPrompt, ApiError> {
    let ChatInput {
        messages,
        tools,
        opts,
    } = input;
    let text = chat_template::render_with_tools(&messages, &tools, &opts)?;
    app.admission.check_prompt_bytes(&text, "messages")?;
    admission::check_fits(
        text.len(),
        ready.max_token_bytes,
        ready.engine.config().max_context,
        "messages",
    )?;
    let tokenizer = Arc::clone(&ready.tokenizer);
    app.admission
        .tokenize(text.len(), move || {
            let ids = tokenizer.encode(&text)?;
            Ok::<_, crate::tokenizer::TokenizerError>(ChatPrompt { ids })
        })
        .await?
        .map_err(|e| ApiError::Internal(e.to_string()))
}

/// What a handler settled about its generation, whatever its API; the prompt and the budget
/// travel beside it.
pub(super) struct Generation {
    /// The request's id (logs, metrics, response ids); choice `i > 0` runs as `{request_id}-{i}`.
    pub request_id: String,
    /// When the HTTP request arrived.
    pub received: Instant,
    /// Validated sampling settings; choice `i` gets [`params::choice_seed`] of the seed.
    pub sampling: SamplingParams,
    /// Validated stop strings.
    pub stop: Vec<String>,
    /// Keep generating past the end-of-turn token.
    pub ignore_eos: bool,
    /// The generation prompt opened a `<think>` block.
    pub thinking: bool,
    /// Drop special tokens from the text.
    pub skip_special_tokens: bool,
    /// A grammar the output must follow (response formats, forced tool calls), compiled once
    /// the budget is known; its errors name `constraint_param`.
    pub constraint: Option<ConstraintSpec>,
    /// The field a constraint error names.
    pub constraint_param: &'static str,
}

/// Renders and tokenises `input` ([`tokenize_chat`]), fits the budget to
/// the context (a 400 naming `messages`; `max_tokens: None` takes the server default clipped to
/// the context) and submits `choices` sequences with [`submit_choices`], splitting reasoning
/// from the answer; returns one event receiver per choice (dropping one cancels its
/// generation) and the prompt's token count.
pub(super) async fn submit_chat(
    app: &AppState,
    ready: &Ready,
    input: ChatInput,
    max_tokens: Option<usize>,
    choices: usize,
    generation: Generation,
) -> Result<(Vec<UnboundedReceiver<Event>>, usize), ApiError> {
    let prompt = tokenize_chat(app, ready, input).await?;
    let prompt_tokens = prompt.ids.len();
    let max_tokens = params::budget(
        prompt_tokens,
        max_tokens,
        app.config.default_max_tokens,
        ready.engine.config().max_context,
        "messages",
    )?;
    let submission = Submission {
        prompt: prompt.ids,
        cache_final_state: false,
        max_tokens,
        split_reasoning: true,
        generation,
    };
    let rxs = submit_choices(app, ready, submission, choices).await?;
    Ok((rxs, prompt_tokens))
}

/// One generation request as the engine takes it, its budget already fitted to the context;
/// [`submit_choices`] submits it once per choice.
pub(super) struct Submission {
    /// The prompt's ids.
    pub prompt: Vec<u32>,
    /// Keep the final state (prompt + output) in the prefix cache.
    pub cache_final_state: bool,
    /// The fitted completion budget.
    pub max_tokens: usize,
    /// Split the output into reasoning and answer.
    pub split_reasoning: bool,
    /// What the handler settled.
    pub generation: Generation,
}

/// Compiles the grammar once per choice (in the bounded pool; each choice follows it from its
/// own state), then submits one sequence per choice with its own seed. Returns the event
/// receivers in choice order; if a later choice is refused (queue full), dropping the earlier
/// receivers cancels those.
pub(super) async fn submit_choices(
    app: &AppState,
    ready: &Ready,
    s: Submission,
    n: usize,
) -> Result<Vec<UnboundedReceiver<Event>>, ApiError> {
    let g = &s.generation;
    let mut constraints = Vec::with_capacity(n);
    for _ in 0..n {
        constraints.push(match &g.constraint {
            None => None,
            Some(spec) => {
                let start = StartOptions::new(g.thinking, s.max_tokens);
                Some(
                    response_format::compile(
                        app,
                        &ready.grammars,
                        spec.clone(),
                        start,
                        g.constraint_param,
                    )
                    .await?,
                )
            }
        });
    }
    let mut rxs = Vec::with_capacity(n);
    for (i, constraint) in constraints.into_iter().enumerate() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut sampling = g.sampling.clone();
        sampling.seed = params::choice_seed(sampling.seed, i);
        ready.engine.submit(GenRequest {
            request_id: if i == 0 {
                g.request_id.clone()
            } else {
                format!("{}-{i}", g.request_id)
            },
            span: tracing::Span::current(),
            prompt: s.prompt.clone(),
            cache_final_state: s.cache_final_state,
            sampling,
            max_tokens: s.max_tokens,
            stop: g.stop.clone(),
            stop_ids: if g.ignore_eos {
                Vec::new()
            } else {
                ready.stop_ids.clone()
            },
            split_reasoning: s.split_reasoning,
            reasoning: g.thinking,
            skip_special_tokens: g.skip_special_tokens,
            constraint,
            received: g.received,
            events: tx,
        })?;
        rxs.push(rx);
    }
    Ok(rxs)
}
