//! The steps every chat-style endpoint (OpenAI chat completions, Anthropic messages) shares
//! between a validated conversation and the engine: render the chat template, check the
//! prompt's size, tokenise in the bounded pool (with the prefix-cache checkpoint), fit the
//! completion budget to the context, and submit to the scheduler. The OpenAI handler shares the
//! first steps ([`tokenize_chat`]) and submits its `n` choices itself (one grammar state and one
//! seed per choice); the Anthropic handler submits one sequence with [`submit_chat`].
//!
//! The prompt's checkpoint for the prefix cache is the end of `<|im_start|>assistant\n`: a
//! follow-up turn's prompt repeats everything up to there (the template drops earlier turns'
//! reasoning, so it diverges right after).

use super::admission;
use super::error::ApiError;
use super::{AppState, Ready, params, response_format};
use crate::chat_template::{self, ChatMessage, ChatOptions};
use crate::constraint::{ConstraintSpec, StartOptions};
use crate::engine::{Event, GenRequest};
use crate::sampling::SamplingParams;
use crate::tokenizer::Tokenizer;
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedReceiver;

/// A rendered and tokenised chat prompt.
#[derive(Debug)]
pub struct ChatPrompt {
    /// The prompt's ids.
    pub ids: Vec<u32>,
    /// Where the prefix cache should keep a state (see the module doc).
    pub checkpoint: Option<usize>,
}

/// Renders `messages` (with the tool definitions `tools`, as the client sent them), checks the prompt against the byte cap and the context (a 400 naming
/// `messages`), and tokenises it in the bounded pool. `with_checkpoint`: also find the
/// prefix-cache checkpoint (generation needs it; counting tokens does not).
pub async fn tokenize_chat(
    app: &AppState,
    ready: &Ready,
    messages: Vec<ChatMessage>,
    tools: Vec<Value>,
    opts: ChatOptions,
    with_checkpoint: bool,
) -> Result<ChatPrompt, ApiError> {
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
            let checkpoint = if with_checkpoint {
                checkpoint(&tokenizer, &messages, &tools, &opts, &ids)
            } else {
                None
            };
            Ok::<_, crate::tokenizer::TokenizerError>(ChatPrompt { ids, checkpoint })
        })
        .await?
        .map_err(|e| ApiError::Internal(e.to_string()))
}

/// Token count of the prompt up to and including `<|im_start|>assistant\n`, when the prompt's
/// tokens really start with that prefix's tokens (tokenisation is checked, not assumed).
fn checkpoint(
    tokenizer: &Tokenizer,
    messages: &[ChatMessage],
    tools: &[Value],
    opts: &ChatOptions,
    prompt: &[u32],
) -> Option<usize> {
    let no_gen = ChatOptions {
        add_generation_prompt: false,
        ..*opts
    };
    let mut text = chat_template::render_with_tools(messages, tools, &no_gen).ok()?;
    text.push_str("<|im_start|>assistant\n");
    let prefix = tokenizer.encode(&text).ok()?;
    (prefix.len() < prompt.len() && prompt.starts_with(&prefix)).then_some(prefix.len())
}

/// One chat generation to start.
pub struct ChatGeneration {
    /// The request's id (logs, metrics, response ids).
    pub request_id: String,
    /// When the HTTP request arrived.
    pub received: Instant,
    /// The tokenised prompt.
    pub prompt: ChatPrompt,
    /// Validated sampling settings.
    pub sampling: SamplingParams,
    /// The requested completion budget; `None` takes the server default clipped to the context.
    pub max_tokens: Option<usize>,
    /// Validated stop strings.
    pub stop: Vec<String>,
    /// Keep generating past the end-of-turn token.
    pub ignore_eos: bool,
    /// The generation prompt opened a `<think>` block.
    pub thinking: bool,
    /// A grammar the answer must follow (forced tool calls), compiled once the budget is known;
    /// its errors name `constraint_param`.
    pub constraint: Option<ConstraintSpec>,
    /// The field a constraint error names.
    pub constraint_param: &'static str,
}

/// Fits the budget to the context, compiles the constraint (in the bounded pool) and submits;
/// returns the event receiver (dropping it cancels the generation) and the prompt's token count.
pub async fn submit_chat(
    app: &AppState,
    ready: &Ready,
    g: ChatGeneration,
) -> Result<(UnboundedReceiver<Event>, usize), ApiError> {
    let max_context = ready.engine.config().max_context;
    let prompt_tokens = g.prompt.ids.len();
    let max_tokens = params::budget(
        prompt_tokens,
        g.max_tokens,
        app.config.default_max_tokens,
        max_context,
        "messages",
    )?;
    let constraint = match g.constraint {
        None => None,
        Some(spec) => {
            let start = StartOptions::new(g.thinking, max_tokens);
            Some(
                response_format::compile(app, &ready.grammars, spec, start, g.constraint_param)
                    .await?,
            )
        }
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let request = GenRequest {
        request_id: g.request_id,
        span: tracing::Span::current(),
        prompt: g.prompt.ids,
        checkpoint: g.prompt.checkpoint,
        cache_final_state: false,
        sampling: g.sampling,
        max_tokens,
        stop: g.stop,
        stop_ids: if g.ignore_eos {
            Vec::new()
        } else {
            ready.stop_ids.clone()
        },
        split_reasoning: true,
        reasoning: g.thinking,
        skip_special_tokens: true,
        constraint,
        received: g.received,
        events: tx,
    };
    ready.engine.submit(request)?;
    Ok((rx, prompt_tokens))
}
