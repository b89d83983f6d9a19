//! `POST /v1/completions` (legacy text completions): the prompt is raw text or token ids, no
//! chat template and no reasoning split; `max_tokens` defaults to 16 as in OpenAI's API, and
//! `logprobs` takes the legacy integer form (0–5 alternatives per token).
//!
//! The final state (prompt + output) goes to the prefix cache, so a client that appends to the
//! text it got back only prefills what it added.
//!
//! Fill-in-the-middle: with a non-empty `suffix`, the text prompt becomes
//! `<|fim_prefix|>{prompt}<|fim_suffix|>{suffix}<|fim_middle|>` (the layout Qwen2.5-Coder and
//! Qwen3-Coder document; that Qwen3.6 was trained on it is not confirmed) and the completion is
//! the middle. `n > 1` runs one sequence per choice, each with its own seed.

use super::admission;
use super::admitted::Admitted;
use super::error::ApiError;
use super::generate::{self, Generation, Submission};
use super::openai::{Completion, CompletionChoice, CompletionLogprobs, CompletionRequest, Usage};
use super::params::{self, PromptInput};
use super::response_format;
use super::stream::{self, to_json};
use super::{fingerprint, unix_now};
use crate::engine::{Event, LogprobEntry, Usage as EngineUsage};
use crate::tokenizer::Tokenizer;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// OpenAI's default `max_tokens` for text completions.
const DEFAULT_MAX_TOKENS: usize = 16;
/// Most alternatives of the legacy `logprobs` field.
const MAX_LEGACY_LOGPROBS: i64 = 5;

/// The handler.
pub(super) async fn completions(
    Admitted {
        app,
        ready,
        request_id,
        received,
        req,
        ..
    }: Admitted<CompletionRequest>,
) -> Result<Response, ApiError> {
    params::reject_unsupported_completion(&req)?;
    let n = params::check_n(req.n)?;
    let constraint = response_format::constraint_spec(req.response_format.as_ref())?;
    let top = match req.logprobs {
        None => None,
        Some(n) if (0..=MAX_LEGACY_LOGPROBS).contains(&n) => Some(n),
        Some(n) => {
            return Err(ApiError::invalid(
                format!("logprobs must be between 0 and 5 (got {n})."),
                "logprobs",
            ));
        }
    };
    let mut sampling = params::sampling_params(&req.sampling(), top.is_some(), top)?;
    sampling.logit_bias = params::logit_bias(req.logit_bias.as_ref(), &ready.tokenizer)?;
    let suffix = req.suffix.as_deref().filter(|s| !s.is_empty());
    let stop = params::stop_strings(req.stop.as_ref())?;
    let requested = params::max_tokens(req.max_tokens, "max_tokens")?;
    let max_context = ready.engine.config().max_context;
    let prompt = match params::completion_prompt(req.prompt.as_ref(), &ready.tokenizer)? {
        PromptInput::Ids(_) if suffix.is_some() => {
            return Err(ApiError::unsupported(
                "suffix (fill-in-the-middle) needs a text prompt, not token ids.",
                "suffix",
            ));
        }
        PromptInput::Ids(ids) => ids,
        PromptInput::Text(text) => {
            let text = match suffix {
                Some(suffix) => {
                    app.admission.check_prompt_bytes(suffix, "suffix")?;
                    fim_prompt(&ready.tokenizer, &text, suffix)?
                }
                None => text,
            };
            app.admission.check_prompt_bytes(&text, "prompt")?;
            admission::check_fits(text.len(), ready.max_token_bytes, max_context, "prompt")?;
            let tokenizer = Arc::clone(&ready.tokenizer);
            let ids = app
                .admission
                .tokenize(text.len(), move || tokenizer.encode(&text))
                .await?
                .map_err(|e| ApiError::Internal(e.to_string()))?;
            if ids.is_empty() {
                return Err(ApiError::invalid(
                    "The prompt is empty: nothing to generate from.",
                    "prompt",
                ));
            }
            ids
        }
    };
    let max_tokens = params::budget(
        prompt.len(),
        requested,
        DEFAULT_MAX_TOKENS,
        max_context,
        "prompt",
    )?;
    let submission = Submission {
        prompt,
        cache_final_state: true,
        max_tokens,
        split_reasoning: false,
        generation: Generation {
            request_id: request_id.clone(),
            received,
            sampling,
            stop,
            ignore_eos: req.ignore_eos == Some(true),
            thinking: false,
            skip_special_tokens: req.skip_special_tokens.unwrap_or(true),
            constraint,
            constraint_param: "response_format",
        },
    };
    let rxs = generate::submit_choices(&app, &ready, submission, n).await?;
    let reply = Reply {
        id: format!("cmpl-{request_id}"),
        created: unix_now(),
        model: app.config.served_model_name.clone(),
        logprobs: top.is_some(),
    };
    let choices = stream::Choices::new(rxs);
    if req.stream == Some(true) {
        let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
        let mut offsets = vec![0; n];
        let mut usages: Vec<Option<EngineUsage>> = vec![None; n];
        Ok(stream::sse_choices(
            choices,
            Vec::new(),
            move |index, ev| match ev {
                Event::Delta(d) => {
                    let lp = reply
                        .logprobs
                        .then(|| legacy_logprobs(&d.logprobs, &mut offsets[index]));
                    if d.content.is_empty() && lp.as_ref().is_none_or(|l| l.tokens.is_empty()) {
                        return Vec::new();
                    }
                    vec![reply.chunk(index, d.content, lp, None, None)]
                }
                Event::Done { reason, usage } => {
                    let mut out =
                        vec![reply.chunk(index, String::new(), None, Some(reason.as_str()), None)];
                    usages[index] = Some(usage);
                    if include_usage && usages.iter().all(Option::is_some) {
                        let all: Vec<EngineUsage> = usages.iter().flatten().copied().collect();
                        out.push(reply.usage_chunk(stream::total_usage(&all).into()));
                    }
                    out
                }
                Event::Failed(_) => Vec::new(),
            },
        ))
    } else {
        let all = stream::collect_choices(choices).await?;
        let usage = stream::total_usage(&all.iter().map(|c| c.usage).collect::<Vec<_>>());
        let choices = all
            .into_iter()
            .enumerate()
            .map(|(index, c)| {
                let lp = reply
                    .logprobs
                    .then(|| legacy_logprobs(&c.delta.logprobs, &mut 0));
                CompletionChoice {
                    text: c.delta.content,
                    index,
                    logprobs: lp,
                    finish_reason: Some(c.reason.as_str()),
                }
            })
            .collect();
        let whole = reply.envelope(choices, Some(Usage::from(usage)));
        Ok(axum::Json(whole).into_response())
    }
}

/// The fill-in-the-middle prompt, when the vocabulary has the three FIM tokens.
fn fim_prompt(tokenizer: &Tokenizer, prefix: &str, suffix: &str) -> Result<String, ApiError> {
    const FIM: [&str; 3] = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"];
    if let Some(missing) = FIM.iter().find(|t| tokenizer.token_id(t).is_none()) {
        return Err(ApiError::unsupported(
            format!(
                "suffix (fill-in-the-middle) needs the token {missing}, which this model's vocabulary lacks."
            ),
            "suffix",
        ));
    }
    Ok(format!("{}{prefix}{}{suffix}{}", FIM[0], FIM[1], FIM[2]))
}

struct Reply {
    id: String,
    created: u64,
    model: String,
    logprobs: bool,
}

impl Reply {
    fn envelope(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> Completion {
        Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: fingerprint(),
            choices,
            usage,
        }
    }

    fn chunk(
        &self,
        index: usize,
        text: String,
        logprobs: Option<CompletionLogprobs>,
        finish: Option<&'static str>,
        usage: Option<Usage>,
    ) -> String {
        to_json(&self.envelope(
            vec![CompletionChoice {
                text,
                index,
                logprobs,
                finish_reason: finish,
            }],
            usage,
        ))
    }

    fn usage_chunk(&self, usage: Usage) -> String {
        to_json(&self.envelope(Vec::new(), Some(usage)))
    }
}

/// The legacy shape; `offset` carries the character offset across chunks.
fn legacy_logprobs(entries: &[LogprobEntry], offset: &mut usize) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    for e in entries {
        out.tokens.push(e.token.token.clone());
        out.token_logprobs.push(e.token.logprob);
        out.top_logprobs.push(
            e.top
                .iter()
                .map(|t| (t.token.clone(), serde_json::json!(t.logprob)))
                .collect(),
        );
        out.text_offset.push(*offset);
        *offset += e.token.token.chars().count();
    }
    out
}
