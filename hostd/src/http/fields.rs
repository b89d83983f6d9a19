//! The field policy of the OpenAI endpoints: which request fields outside the typed ones are
//! accepted and ignored, which are refused, how the thinking switches of several vendors map
//! onto ours, and how a body's JSON becomes a request with errors that name the field.
//!
//! The rule: a field is ignored only when ignoring it cannot change the meaning of the reply
//! (bookkeeping, caching hints, retention); a field whose meaning this server would silently
//! change is refused with a 400 naming it, unless it holds its neutral value. A field nobody
//! here has heard of is accepted and logged at debug level, so a client upgrade that adds a new
//! field does not break requests (vLLM does the same; OpenAI would refuse it). `docs/api.md`
//! lists the same tables; a test keeps them in step.

use super::error::ApiError;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// Why a field may be ignored, or what it would have asked for.
pub struct Rule {
    /// The field's name.
    pub name: &'static str,
    /// For ignored fields: why ignoring it is harmless. For refused ones: the sentence of the 400.
    pub note: &'static str,
    /// Refused fields: the values that ask for nothing and are therefore accepted.
    pub neutral: fn(&Value) -> bool,
}

fn any(_: &Value) -> bool {
    true
}
fn null(v: &Value) -> bool {
    v.is_null()
}
fn falsy(v: &Value) -> bool {
    v.is_null() || *v == Value::Bool(false)
}
fn truthy_default(v: &Value) -> bool {
    v.is_null() || *v == Value::Bool(true)
}
fn empty(v: &Value) -> bool {
    v.is_null()
        || v.as_array().is_some_and(Vec::is_empty)
        || v.as_object().is_some_and(Map::is_empty)
}
fn one(v: &Value) -> bool {
    v.is_null() || v.as_f64() == Some(1.0)
}
fn zero(v: &Value) -> bool {
    v.is_null() || v.as_f64() == Some(0.0)
}

const fn ignored(name: &'static str, note: &'static str) -> Rule {
    Rule {
        name,
        note,
        neutral: any,
    }
}

/// Top-level fields both generation endpoints accept and ignore.
pub const IGNORED: &[Rule] = &[
    ignored("user", "an end-user id for the provider's abuse monitoring"),
    ignored("safety_identifier", "the newer name of `user`"),
    ignored(
        "metadata",
        "tags for the provider's stored-completion dashboard",
    ),
    ignored(
        "store",
        "whether the provider keeps the completion; nothing is stored here",
    ),
    ignored("service_tier", "a billing/latency tier; there is one tier"),
    ignored(
        "prompt_cache_key",
        "a routing hint for the provider's prompt cache; the prefix cache here works without it",
    ),
    ignored(
        "prompt_cache_retention",
        "how long the provider keeps cached prefixes",
    ),
    ignored(
        "prediction",
        "predicted output only speeds up generation; the reply is the same without it",
    ),
    ignored(
        "verbosity",
        "a length hint of OpenAI's GPT-5 models, not a constraint",
    ),
    ignored(
        "priority",
        "vLLM's scheduling priority; requests here are scheduled fairly",
    ),
    ignored(
        "request_id",
        "vLLM's request id; send `x-request-id` to set ours",
    ),
    ignored(
        "add_special_tokens",
        "vLLM: the Qwen tokenizer adds no BOS/EOS either way",
    ),
    ignored(
        "guided_decoding_backend",
        "vLLM: names a grammar engine; asks for no constraint by itself",
    ),
];

const fn refused(name: &'static str, note: &'static str, neutral: fn(&Value) -> bool) -> Rule {
    Rule {
        name,
        note,
        neutral,
    }
}

/// Top-level fields both generation endpoints refuse unless neutral (vLLM's extensions and
/// newer OpenAI options that would change the reply).
pub const REFUSED: &[Rule] = &[
    refused("use_beam_search", "Beam search is not supported.", falsy),
    refused(
        "length_penalty",
        "length_penalty is not supported (it applies to beam search).",
        one,
    ),
    refused("min_tokens", "min_tokens is not supported.", zero),
    refused(
        "stop_token_ids",
        "stop_token_ids is not supported; use stop strings.",
        empty,
    ),
    refused(
        "include_stop_str_in_output",
        "include_stop_str_in_output is not supported: stop strings are always removed.",
        falsy,
    ),
    refused(
        "allowed_token_ids",
        "allowed_token_ids is not supported.",
        empty,
    ),
    refused(
        "bad_words",
        "bad_words is not supported; use logit_bias.",
        empty,
    ),
    refused("prompt_logprobs", "prompt_logprobs is not supported.", null),
    refused(
        "truncate_prompt_tokens",
        "truncate_prompt_tokens is not supported: a prompt that is too long is refused.",
        null,
    ),
    refused(
        "logits_processors",
        "Custom logits processors are not supported.",
        empty,
    ),
    refused(
        "return_tokens_as_token_ids",
        "return_tokens_as_token_ids is not supported.",
        falsy,
    ),
    refused(
        "return_token_ids",
        "return_token_ids is not supported.",
        falsy,
    ),
    refused(
        "spaces_between_special_tokens",
        "spaces_between_special_tokens is not supported.",
        truthy_default,
    ),
    refused("guided_json", "guided_json is not supported.", null),
    refused("guided_regex", "guided_regex is not supported.", null),
    refused("guided_choice", "guided_choice is not supported.", empty),
    refused("guided_grammar", "guided_grammar is not supported.", null),
    refused("structural_tag", "structural_tag is not supported.", null),
    refused(
        "structured_outputs",
        "structured_outputs is not supported.",
        empty,
    ),
    refused(
        "cache_salt",
        "cache_salt is not supported: the prefix cache is shared by all requests of this server.",
        null,
    ),
    refused(
        "kv_transfer_params",
        "kv_transfer_params is not supported.",
        null,
    ),
    refused("vllm_xargs", "vllm_xargs is not supported.", empty),
];

/// Top-level fields only chat refuses unless neutral.
pub const REFUSED_CHAT: &[Rule] = &[
    refused("audio", "Audio output is not supported.", null),
    refused("web_search_options", "Web search is not supported.", null),
    refused("echo", "echo is not supported.", falsy),
    refused(
        "best_of",
        "best_of is not supported on chat completions.",
        one,
    ),
    refused(
        "add_generation_prompt",
        "add_generation_prompt false is not supported: the reply always starts a new assistant turn.",
        truthy_default,
    ),
    refused(
        "continue_final_message",
        "continue_final_message is not supported.",
        falsy,
    ),
    refused(
        "chat_template",
        "A custom chat_template is not supported: the model's own template is used.",
        null,
    ),
    refused(
        "documents",
        "documents are not supported; put them in the messages.",
        empty,
    ),
    refused(
        "mm_processor_kwargs",
        "Multimodal input is not supported.",
        empty,
    ),
];

/// Message fields accepted and ignored (what `message.model_dump()` of a reply carries, and
/// names the template does not render).
pub const IGNORED_MESSAGE: &[Rule] = &[
    ignored(
        "name",
        "participant names are not part of the Qwen chat template",
    ),
    ignored(
        "annotations",
        "citations attached to an earlier reply (web search); the text is in `content`",
    ),
    ignored(
        "cache_control",
        "a prompt-caching hint (Anthropic style); the prefix cache works without it",
    ),
];

/// Message fields refused unless neutral.
pub const REFUSED_MESSAGE: &[Rule] = &[
    refused("audio", "Audio in messages is not supported.", null),
    refused(
        "function_call",
        "function_call in messages is not supported (legacy function calling).",
        null,
    ),
    refused(
        "prefix",
        "Prefix continuation of the last assistant message is not supported.",
        falsy,
    ),
    refused(
        "partial",
        "Partial continuation of the last assistant message is not supported.",
        falsy,
    ),
];

/// Checks the fields a typed request did not take: ignored ones pass, refused ones must be
/// neutral, unknown ones pass with a debug line. `at` prefixes the param (`messages[2].`).
pub fn check_extra(
    extra: &Map<String, Value>,
    refused_lists: &[&[Rule]],
    ignored_lists: &[&[Rule]],
    at: &str,
) -> Result<(), ApiError> {
    for (key, value) in extra {
        if let Some(rule) = refused_lists
            .iter()
            .flat_map(|l| l.iter())
            .find(|r| r.name == key)
        {
            if !(rule.neutral)(value) {
                return Err(ApiError::unsupported(rule.note, format!("{at}{key}")));
            }
        } else if ignored_lists
            .iter()
            .flat_map(|l| l.iter())
            .any(|r| r.name == key)
        {
            tracing::debug!(field = %format!("{at}{key}"), "known field ignored");
        } else {
            tracing::debug!(field = %format!("{at}{key}"), "unknown field accepted and ignored");
        }
    }
    Ok(())
}

/// Parses a request body, naming the field of a type error or of an unknown nested key
/// (`chat_template_kwargs.foo`, `stream_options.bar`) in the error's `param`.
pub fn parse_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut *de).map_err(path_error)?;
    de.end().map_err(ApiError::from)?;
    Ok(value)
}

fn path_error(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    if !matches!(inner.classify(), serde_json::error::Category::Data) {
        return ApiError::from(inner);
    }
    let msg = inner.to_string();
    let parent = if path == "." || path.is_empty() {
        String::new()
    } else {
        path.clone()
    };
    if let Some(field) = msg
        .strip_prefix("unknown field `")
        .and_then(|r| r.split('`').next())
    {
        // The path is the object holding the unknown key; name the key inside it.
        let param =
            if parent.is_empty() || parent.ends_with(&format!(".{field}")) || parent == field {
                if parent.is_empty() {
                    field.to_string()
                } else {
                    parent
                }
            } else {
                format!("{parent}.{field}")
            };
        return ApiError::unsupported(
            format!("Unrecognized request argument supplied: {param}"),
            param,
        );
    }
    // serde_json appends " at line L column C"; the param already says where.
    let what = msg
        .rsplit_once(" at line ")
        .map_or(msg.as_str(), |(m, _)| m);
    match parent.is_empty() {
        true => ApiError::InvalidRequest {
            message: format!("Invalid request: {what}"),
            param: None,
            code: "invalid_value",
        },
        false => ApiError::invalid(format!("Invalid value for '{parent}': {what}."), parent),
    }
}

/// What the request asks of the reasoning block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thinking {
    /// The template opens a reasoning block (thinking on).
    pub enabled: bool,
    /// The reply carries the reasoning (`reasoning_content`); false hides it, thinking still runs.
    pub shown: bool,
}

/// The thinking switches a chat request can carry.
#[derive(Debug, Clone, Default)]
pub struct ThinkingFields<'a> {
    /// `chat_template_kwargs.enable_thinking` (vLLM / the Qwen template).
    pub template_kwarg: Option<bool>,
    /// Top-level `enable_thinking` (Qwen's DashScope API, SGLang).
    pub enable_thinking: Option<bool>,
    /// `reasoning_effort` (OpenAI).
    pub reasoning_effort: Option<&'a str>,
    /// `include_reasoning` (vLLM, OpenRouter): whether the reply carries the reasoning.
    pub include_reasoning: Option<bool>,
    /// `reasoning` object (OpenRouter): `effort`, `enabled`, `exclude`.
    pub reasoning: Option<&'a Value>,
}

/// `reasoning_effort` to on/off: `none` and `minimal` turn thinking off (minimal is OpenAI's
/// "as little reasoning as possible"; the model has no smaller step than none); `low`,
/// `medium`, `high` and `xhigh` turn it on. The levels above none cannot be told apart: the
/// model has one thinking mode.
fn effort(v: &str, param: &str) -> Result<bool, ApiError> {
    match v {
        "none" | "minimal" => Ok(false),
        "low" | "medium" | "high" | "xhigh" => Ok(true),
        other => Err(ApiError::invalid(
            format!(
                "Invalid {param} '{other}': expected one of none, minimal, low, medium, high, xhigh."
            ),
            param,
        )),
    }
}

/// Merges the thinking switches over the server default; switches that disagree are a 400
/// naming the later one (the order of the fields above).
pub fn thinking(f: &ThinkingFields<'_>, default: bool) -> Result<Thinking, ApiError> {
    let mut chosen: Option<(bool, &str)> = None;
    let mut set = |v: bool, param: &'static str| -> Result<(), ApiError> {
        match chosen {
            Some((prev, by)) if prev != v => Err(ApiError::invalid(
                format!(
                    "{param} asks for thinking {} but {by} asks for it {}.",
                    on_off(v),
                    on_off(prev)
                ),
                param,
            )),
            Some(_) => Ok(()),
            None => {
                chosen = Some((v, param));
                Ok(())
            }
        }
    };
    if let Some(v) = f.template_kwarg {
        set(v, "chat_template_kwargs.enable_thinking")?;
    }
    if let Some(v) = f.enable_thinking {
        set(v, "enable_thinking")?;
    }
    if let Some(e) = f.reasoning_effort {
        set(effort(e, "reasoning_effort")?, "reasoning_effort")?;
    }
    let mut shown = f.include_reasoning.unwrap_or(true);
    match f.reasoning {
        None | Some(Value::Null) => {}
        Some(Value::Object(o)) => {
            for (k, v) in o {
                match (k.as_str(), v) {
                    (_, Value::Null) => {}
                    ("effort", Value::String(e)) => {
                        set(effort(e, "reasoning.effort")?, "reasoning.effort")?;
                    }
                    ("enabled", Value::Bool(b)) => set(*b, "reasoning.enabled")?,
                    ("exclude", Value::Bool(b)) => shown = shown && !b,
                    ("max_tokens", _) => {
                        return Err(ApiError::unsupported(
                            "A reasoning token budget is not supported; use reasoning.effort.",
                            "reasoning.max_tokens",
                        ));
                    }
                    ("summary", _) => {}
                    (k, _) => {
                        return Err(ApiError::invalid(
                            format!("Unsupported or mistyped reasoning option '{k}'."),
                            format!("reasoning.{k}"),
                        ));
                    }
                }
            }
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "reasoning must be an object.",
                "reasoning",
            ));
        }
    }
    Ok(Thinking {
        enabled: chosen.map_or(default, |(v, _)| v),
        shown,
    })
}

fn on_off(v: bool) -> &'static str {
    if v { "on" } else { "off" }
}

#[cfg(test)]
mod tests;
