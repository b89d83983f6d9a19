//! Validation of request bodies and their conversion to engine inputs: messages to
//! [`ChatMessage`]s, sampling fields to [`SamplingParams`], stop strings, token budgets, and the
//! refusal of OpenAI features this server does not implement. Every failure is an [`ApiError`]
//! naming the field. The policy for fields without a typed slot is `http::fields`.

use super::error::ApiError;
use super::fields;
use super::openai::{ChatCompletionRequest, CompletionRequest, SamplingFields, Stop};
use crate::chat_template::{ChatMessage, Role};
use crate::sampling::{MAX_STOP_STRINGS, MAX_TOP_LOGPROBS, SamplingParams};
use crate::tokenizer::Tokenizer;
use serde_json::Value;

/// Longest accepted stop string, in bytes.
const MAX_STOP_BYTES: usize = 256;

/// `model` must be present and name the served model.
pub fn check_model(model: Option<&str>, served: &str) -> Result<(), ApiError> {
    match model {
        None => Err(ApiError::missing("model")),
        Some(m) if m == served => Ok(()),
        Some(m) => Err(ApiError::ModelNotFound(m.to_string())),
    }
}

/// Most choices per request (each is its own sequence in the batch).
pub const MAX_N: usize = 8;

/// The number of choices, 1–[`MAX_N`].
pub fn check_n(n: Option<i64>) -> Result<usize, ApiError> {
    match n {
        None => Ok(1),
        Some(n) if (1..=MAX_N as i64).contains(&n) => Ok(n as usize),
        Some(n) => Err(ApiError::invalid(
            format!("n must be between 1 and {MAX_N} (got {n})."),
            "n",
        )),
    }
}

/// The seed of choice `index`: choice 0 keeps the request's seed (so `n = 1` and `n > 1` agree
/// on it), later choices get seeds derived from it deterministically.
pub fn choice_seed(seed: Option<u64>, index: usize) -> Option<u64> {
    let seed = seed?;
    if index == 0 {
        return Some(seed);
    }
    Some(
        crate::sampling::Rng::new(seed ^ (index as u64).wrapping_mul(0xD1B5_4A32_D192_ED03))
            .next_u64(),
    )
}

/// Largest `|bias|` of a `logit_bias` entry (OpenAI's range).
const MAX_LOGIT_BIAS: f64 = 100.0;

/// `logit_bias`: an object of token id (as a string) → bias in −100…100; each id must be in
/// the vocabulary. Returns the entries sorted by id.
pub fn logit_bias(v: Option<&Value>, tokenizer: &Tokenizer) -> Result<Vec<(u32, f32)>, ApiError> {
    let map = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(m)) => m,
        Some(_) => {
            return Err(ApiError::invalid(
                "logit_bias must be an object of token id → bias.",
                "logit_bias",
            ));
        }
    };
    let mut out = Vec::with_capacity(map.len());
    for (key, bias) in map {
        let at = format!("logit_bias.{key}");
        let id = key
            .parse::<u32>()
            .ok()
            .filter(|&id| {
                (id as usize) < tokenizer.vocab_size() && tokenizer.token_bytes(id).is_some()
            })
            .ok_or_else(|| {
                ApiError::invalid(
                    format!("logit_bias key '{key}' is not a token id of this model's vocabulary."),
                    at.clone(),
                )
            })?;
        let b = bias
            .as_f64()
            .filter(|b| (-MAX_LOGIT_BIAS..=MAX_LOGIT_BIAS).contains(b))
            .ok_or_else(|| {
                ApiError::invalid(
                    format!("logit_bias values must be numbers between -100 and 100 (got {bias})."),
                    at,
                )
            })?;
        out.push((id, b as f32));
    }
    out.sort_unstable_by_key(|e| e.0);
    Ok(out)
}

/// Converts the shared sampling fields, with OpenAI's defaults, and checks their ranges.
pub fn sampling_params(
    f: &SamplingFields,
    logprobs: bool,
    top_logprobs: Option<i64>,
) -> Result<SamplingParams, ApiError> {
    let top_k = match f.top_k {
        None | Some(-1) => 0,
        Some(k) if k >= 0 => usize::try_from(k).unwrap_or(usize::MAX),
        Some(k) => {
            return Err(ApiError::invalid(
                format!("top_k must be -1 (off) or ≥ 0 (got {k})."),
                "top_k",
            ));
        }
    };
    let top_logprobs = match top_logprobs {
        None => 0,
        Some(n) if (0..=MAX_TOP_LOGPROBS as i64).contains(&n) => n as usize,
        Some(n) => {
            return Err(ApiError::invalid(
                format!("top_logprobs must be between 0 and 20 (got {n})."),
                "top_logprobs",
            ));
        }
    };
    let d = SamplingParams::default();
    let p = SamplingParams {
        temperature: f.temperature.map_or(d.temperature, |v| v as f32),
        top_p: f.top_p.map_or(d.top_p, |v| v as f32),
        top_k,
        min_p: f.min_p.map_or(d.min_p, |v| v as f32),
        presence_penalty: f.presence_penalty.map_or(d.presence_penalty, |v| v as f32),
        frequency_penalty: f
            .frequency_penalty
            .map_or(d.frequency_penalty, |v| v as f32),
        repetition_penalty: f
            .repetition_penalty
            .map_or(d.repetition_penalty, |v| v as f32),
        // Negative seeds are accepted (OpenAI's field is a signed integer); the bits seed the RNG.
        seed: f.seed.map(|s| s as u64),
        logprobs,
        top_logprobs,
        logit_bias: Vec::new(),
    };
    p.validate()?;
    Ok(p)
}

/// At most four non-empty stop strings.
pub fn stop_strings(stop: Option<&Stop>) -> Result<Vec<String>, ApiError> {
    match stop {
        None => Ok(Vec::new()),
        Some(Stop::One(s)) => stop_list(vec![s.clone()], "stop"),
        Some(Stop::Many(v)) => stop_list(v.clone(), "stop"),
    }
}

/// Checks a list of stop strings (at most four, none empty or overlong); errors name `param`.
pub fn stop_list(list: Vec<String>, param: &str) -> Result<Vec<String>, ApiError> {
    if list.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid(
            format!(
                "At most {MAX_STOP_STRINGS} stop sequences are allowed (got {}).",
                list.len()
            ),
            param,
        ));
    }
    if list.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            "Stop sequences must not be empty.",
            param,
        ));
    }
    if list.iter().any(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::invalid(
            format!("Stop sequences are limited to {MAX_STOP_BYTES} bytes."),
            param,
        ));
    }
    Ok(list)
}

/// A requested token budget: absent, or ≥ 1.
pub fn max_tokens(v: Option<i64>, param: &str) -> Result<Option<usize>, ApiError> {
    match v {
        None => Ok(None),
        Some(n) if n >= 1 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
        Some(n) => Err(ApiError::invalid(
            format!("{param} must be at least 1 (got {n})."),
            param,
        )),
    }
}

/// The completion budget: the request's, or the default clipped to what the context leaves.
/// A prompt that leaves no room, or an explicit budget that does not fit, is a 400 naming
/// `prompt_param` (`messages` or `prompt`).
pub fn budget(
    prompt_tokens: usize,
    requested: Option<usize>,
    default: usize,
    max_context: usize,
    prompt_param: &'static str,
) -> Result<usize, ApiError> {
    let room = max_context.saturating_sub(prompt_tokens);
    let too_long = |completion_tokens: usize| ApiError::ContextLength {
        max_context,
        requested: prompt_tokens.saturating_add(completion_tokens),
        prompt_tokens,
        completion_tokens,
        param: prompt_param,
    };
    if room == 0 {
        return Err(too_long(requested.unwrap_or(1)));
    }
    match requested {
        Some(n) if n > room => Err(too_long(n)),
        Some(n) => Ok(n),
        None => Ok(default.min(room).max(1)),
    }
}

fn present(v: Option<&Value>) -> bool {
    v.is_some_and(|v| !v.is_null())
}

/// Refuses the chat options this server does not implement, naming each (the tool fields are
/// `http::tools`' to check).
pub fn reject_unsupported_chat(r: &ChatCompletionRequest) -> Result<(), ApiError> {
    if let Some(m) = &r.modalities
        && !(m.is_null() || *m == serde_json::json!(["text"]))
    {
        return Err(ApiError::unsupported(
            "Only the text modality is supported.",
            "modalities",
        ));
    }
    let plain = [
        (
            &r.functions,
            "functions",
            "Function calling is not supported.",
        ),
        (
            &r.function_call,
            "function_call",
            "Function calling is not supported.",
        ),
    ];
    for (v, param, msg) in plain {
        if present(v.as_ref()) {
            return Err(ApiError::unsupported(msg, param));
        }
    }
    fields::check_extra(
        &r.extra,
        &[fields::REFUSED, fields::REFUSED_CHAT],
        &[fields::IGNORED],
        "",
    )
}

/// Refuses the legacy completion options this server does not implement.
pub fn reject_unsupported_completion(r: &CompletionRequest) -> Result<(), ApiError> {
    if r.echo == Some(true) {
        return Err(ApiError::unsupported("echo is not supported.", "echo"));
    }
    if r.best_of.is_some_and(|b| b != r.n.unwrap_or(1)) {
        return Err(ApiError::unsupported(
            "best_of other than n is not supported (no candidates are ranked).",
            "best_of",
        ));
    }
    fields::check_extra(&r.extra, &[fields::REFUSED], &[fields::IGNORED], "")
}

/// Message keys read here; the rest go through the field policy (`fields::IGNORED_MESSAGE`,
/// `fields::REFUSED_MESSAGE`, unknown keys accepted). `tool_calls` belongs on assistant
/// messages and `tool_call_id` on tool messages.
const MESSAGE_KEYS: &[&str] = &[
    "role",
    "content",
    "reasoning_content",
    "reasoning",
    "refusal",
    "tool_calls",
    "tool_call_id",
];

/// Converts `messages` (OpenAI shape) to template messages.
pub fn chat_messages(messages: &[Value]) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages must contain at least one message.",
            "messages",
        ));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| chat_message(i, m))
        .collect()
}

fn chat_message(i: usize, m: &Value) -> Result<ChatMessage, ApiError> {
    let at = |field: &str| format!("messages[{i}].{field}");
    let obj = m.as_object().ok_or_else(|| {
        ApiError::invalid(
            format!("messages[{i}] must be an object."),
            format!("messages[{i}]"),
        )
    })?;
    let mut extra = serde_json::Map::new();
    for (key, value) in obj {
        if !MESSAGE_KEYS.contains(&key.as_str()) {
            extra.insert(key.clone(), value.clone());
        }
    }
    fields::check_extra(
        &extra,
        &[fields::REFUSED_MESSAGE],
        &[fields::IGNORED_MESSAGE],
        &format!("messages[{i}]."),
    )?;
    let role = match obj.get("role") {
        None => return Err(ApiError::missing(&at("role"))),
        Some(Value::String(r)) => r.as_str(),
        Some(_) => return Err(ApiError::invalid("role must be a string.", at("role"))),
    };
    let role = match role {
        "system" | "developer" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        "function" => {
            return Err(ApiError::unsupported(
                "The legacy 'function' role is not supported; use 'tool'.",
                at("role"),
            ));
        }
        other => {
            return Err(ApiError::invalid(
                format!(
                    "Invalid role '{other}': expected one of system, developer, user, assistant, tool."
                ),
                at("role"),
            ));
        }
    };
    // A refusal in history (content null, `refusal` set) is what the assistant said.
    let refusal = match obj.get("refusal") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if role == Role::Assistant => Some(s.clone()),
        Some(_) => {
            return Err(ApiError::invalid(
                "refusal must be a string on an assistant message.",
                at("refusal"),
            ));
        }
    };
    let content = match obj.get("content") {
        None | Some(Value::Null) if role == Role::Assistant => refusal.unwrap_or_default(),
        None | Some(Value::Null) => return Err(ApiError::missing(&at("content"))),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => content_parts(i, parts)?,
        Some(_) => {
            return Err(ApiError::invalid(
                "content must be a string or an array of content parts.",
                at("content"),
            ));
        }
    };
    // `reasoning` (OpenRouter, newer vLLM) is another name of `reasoning_content`.
    let mut reasoning = None;
    for key in ["reasoning_content", "reasoning"] {
        let text = match obj.get(key) {
            None | Some(Value::Null) => continue,
            Some(Value::String(s)) if role == Role::Assistant => s,
            Some(_) => {
                return Err(ApiError::invalid(
                    format!("{key} must be a string on an assistant message."),
                    at(key),
                ));
            }
        };
        match &reasoning {
            Some(prev) if prev != text => {
                return Err(ApiError::invalid(
                    "reasoning and reasoning_content differ; send one of them.",
                    at(key),
                ));
            }
            _ => reasoning = Some(text.clone()),
        }
    }
    let tool_calls = match obj.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) if role == Role::Assistant => super::tools::history_tool_calls(i, v)?,
        Some(_) => {
            return Err(ApiError::invalid(
                "tool_calls is only allowed on assistant messages.",
                at("tool_calls"),
            ));
        }
    };
    match obj.get("tool_call_id") {
        None | Some(Value::Null) => {}
        Some(Value::String(_)) if role == Role::Tool => {}
        Some(Value::String(_)) => {
            return Err(ApiError::invalid(
                "tool_call_id is only allowed on tool messages.",
                at("tool_call_id"),
            ));
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "tool_call_id must be a string.",
                at("tool_call_id"),
            ));
        }
    }
    Ok(ChatMessage {
        role,
        content,
        reasoning_content: reasoning,
        tool_calls,
    })
}

/// Text parts are joined with newlines; any other part type is refused.
fn content_parts(i: usize, parts: &[Value]) -> Result<String, ApiError> {
    let mut texts = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        let kind = part.get("type").and_then(Value::as_str);
        match kind {
            Some("text") => match part.get("text").and_then(Value::as_str) {
                Some(t) => texts.push(t),
                None => {
                    return Err(ApiError::invalid(
                        "A text content part needs a string `text`.",
                        format!("{at}.text"),
                    ));
                }
            },
            Some(other) => {
                return Err(ApiError::unsupported(
                    format!(
                        "Unsupported content part type '{other}': only text parts are supported."
                    ),
                    format!("{at}.type"),
                ));
            }
            None => {
                return Err(ApiError::invalid(
                    "A content part needs a string `type`.",
                    format!("{at}.type"),
                ));
            }
        }
    }
    Ok(texts.join("\n"))
}

/// The completions `prompt` before tokenisation: text (tokenised by the caller, in the
/// bounded pool) or validated token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    /// Text to tokenise.
    Text(String),
    /// Token ids, each checked against the vocabulary.
    Ids(Vec<u32>),
}

/// The completions `prompt`: a string, a one-element list of strings, a list of token ids, or a
/// one-element list of id lists. Several prompts in one request are refused (only one choice).
/// An empty prompt is refused here; text that tokenises to nothing is the caller's check.
pub fn completion_prompt(
    prompt: Option<&Value>,
    tokenizer: &Tokenizer,
) -> Result<PromptInput, ApiError> {
    let text = |s: &str| {
        if s.is_empty() {
            Err(ApiError::invalid(
                "The prompt is empty: nothing to generate from.",
                "prompt",
            ))
        } else {
            Ok(PromptInput::Text(s.to_string()))
        }
    };
    let ids = |items: &[Value]| -> Result<Vec<u32>, ApiError> {
        items
            .iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .filter(|&id| {
                        (id as usize) < tokenizer.vocab_size()
                            && tokenizer.token_bytes(id).is_some()
                    })
                    .ok_or_else(|| {
                        ApiError::invalid(format!("Invalid token id {v} in prompt."), "prompt")
                    })
            })
            .collect()
    };
    let tokens = match prompt {
        None | Some(Value::Null) => return Err(ApiError::missing("prompt")),
        Some(Value::String(s)) => return text(s),
        Some(Value::Array(items)) => match items.as_slice() {
            [] => return Err(ApiError::invalid("prompt must not be empty.", "prompt")),
            [Value::String(s)] => return text(s),
            [Value::Array(inner)] => ids(inner)?,
            [first, ..] if first.is_number() => ids(items)?,
            _ => {
                return Err(ApiError::unsupported(
                    "Only one prompt per request is supported.",
                    "prompt",
                ));
            }
        },
        Some(_) => {
            return Err(ApiError::invalid(
                "prompt must be a string, a list of token ids, or a list with one of either.",
                "prompt",
            ));
        }
    };
    if tokens.is_empty() {
        return Err(ApiError::invalid(
            "The prompt is empty: nothing to generate from.",
            "prompt",
        ));
    }
    Ok(PromptInput::Ids(tokens))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn param_of(e: ApiError) -> (u16, Option<String>) {
        (
            e.status().as_u16(),
            e.body()["error"]["param"].as_str().map(str::to_string),
        )
    }

    fn check_messages_err(messages: Value, status: u16, param: &str) {
        let v = messages.as_array().cloned().unwrap_or_default();
        let e = chat_messages(&v).expect_err("should fail");
        assert_eq!(param_of(e), (status, Some(param.to_string())), "{messages}");
    }

    #[test]
    fn message_errors_name_the_field() {
        check_messages_err(json!([]), 400, "messages");
        check_messages_err(
            json!([{"role": "function", "content": "x"}]),
            400,
            "messages[0].role",
        );
        check_messages_err(json!([{"role": "tool"}]), 400, "messages[0].content");
        check_messages_err(
            json!([{"role": "tool", "content": "x", "tool_call_id": 5}]),
            400,
            "messages[0].tool_call_id",
        );
        check_messages_err(
            json!([{"role": "user", "content": "x", "tool_call_id": "c"}]),
            400,
            "messages[0].tool_call_id",
        );
        check_messages_err(
            json!([{"role": "assistant", "content": "x", "tool_calls": {}}]),
            400,
            "messages[0].tool_calls",
        );
        check_messages_err(
            json!([{"role": "assistant", "content": "x", "audio": {"id": "a1"}}]),
            400,
            "messages[0].audio",
        );
        check_messages_err(
            json!([{"role": "wizard", "content": "x"}]),
            400,
            "messages[0].role",
        );
        check_messages_err(json!([{"content": "x"}]), 400, "messages[0].role");
        check_messages_err(json!([{"role": "user"}]), 400, "messages[0].content");
        check_messages_err(
            json!([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]}]),
            400,
            "messages[0].content[1].type",
        );
        check_messages_err(
            json!([{"role": "user", "content": "x", "tool_calls": []}]),
            400,
            "messages[0].tool_calls",
        );
        check_messages_err(
            json!([{"role": "assistant", "content": "x", "function_call": {"name": "f"}}]),
            400,
            "messages[0].function_call",
        );
        check_messages_err(
            json!([{"role": "assistant", "content": "x", "prefix": true}]),
            400,
            "messages[0].prefix",
        );
        check_messages_err(
            json!([{"role": "assistant", "content": "x", "reasoning": "a", "reasoning_content": "b"}]),
            400,
            "messages[0].reasoning",
        );
        check_messages_err(
            json!([{"role": "user", "content": "x", "reasoning": "a"}]),
            400,
            "messages[0].reasoning",
        );
    }

    /// What `message.model_dump()` of an openai SDK reply carries is accepted as history;
    /// `reasoning` counts as `reasoning_content`, a refusal as what the assistant said, and
    /// unknown keys pass.
    #[test]
    fn reply_dumps_are_accepted_as_history() {
        let dump = json!({"role": "assistant", "content": "hi", "refusal": null, "annotations": [], "audio": null,
            "function_call": null, "tool_calls": null, "reasoning": "thought", "colour": 1, "name": "bot"});
        let m = chat_messages(&[json!({"role": "user", "content": "q"}), dump]).expect("accepted");
        assert_eq!(m[1], ChatMessage::assistant_with_reasoning("hi", "thought"));
        let m = chat_messages(&[
            json!({"role": "assistant", "content": null, "refusal": "I can't help with that."}),
        ])
        .expect("accepted");
        assert_eq!(m[0].content, "I can't help with that.");
        check_messages_err(
            json!([{"role": "user", "content": "x", "tool_calls": [{}]}]),
            400,
            "messages[0].tool_calls",
        );
    }

    #[test]
    fn messages_convert() {
        let m = chat_messages(&[
            json!({"role": "developer", "content": "be brief"}),
            json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
            json!({"role": "assistant", "content": null, "reasoning_content": "hmm"}),
        ])
        .expect("valid");
        assert_eq!(m[0], ChatMessage::system("be brief"));
        assert_eq!(m[1], ChatMessage::user("a\nb"));
        assert_eq!(m[2], ChatMessage::assistant_with_reasoning("", "hmm"));
    }

    #[test]
    fn tool_history_converts() {
        // The shape `messages.append(resp.choices[0].message.model_dump())` sends, then a result.
        let m = chat_messages(&[
            json!({"role": "user", "content": "weather?"}),
            json!({"role": "assistant", "content": null, "refusal": null, "annotations": null, "audio": null, "function_call": null,
                   "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]}),
            json!({"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "-3"}]}),
            json!({"role": "assistant", "content": "cold", "tool_calls": []}),
        ])
        .expect("valid");
        let mut args = serde_json::Map::new();
        args.insert("city".into(), json!("Oslo"));
        assert_eq!(
            m[1],
            ChatMessage::assistant("").with_tool_calls(vec![crate::chat_template::ToolCall::new(
                "get_weather",
                args
            )])
        );
        assert_eq!(m[2], ChatMessage::tool("-3"));
        assert_eq!(m[3], ChatMessage::assistant("cold"));
    }

    #[test]
    fn budgets() {
        assert_eq!(budget(10, None, 100, 50, "messages").ok(), Some(40));
        assert_eq!(budget(10, Some(5), 100, 50, "messages").ok(), Some(5));
        assert_eq!(
            budget(10, Some(41), 100, 50, "messages").map_err(|e| e.code()),
            Err("context_length_exceeded")
        );
        assert_eq!(
            budget(50, None, 100, 50, "messages").map_err(|e| e.code()),
            Err("context_length_exceeded")
        );
    }

    #[test]
    fn stops_and_n() {
        assert_eq!(
            stop_strings(Some(&Stop::One("x".into()))).ok(),
            Some(vec!["x".to_string()])
        );
        let five = Stop::Many((0..5).map(|i| i.to_string()).collect());
        assert_eq!(
            stop_strings(Some(&five)).map_err(param_of),
            Err((400, Some("stop".into())))
        );
        assert_eq!(
            check_n(Some(9)).map_err(param_of),
            Err((400, Some("n".into())))
        );
        assert_eq!(
            check_n(Some(0)).map_err(param_of),
            Err((400, Some("n".into())))
        );
        assert_eq!(
            (check_n(None).ok(), check_n(Some(8)).ok()),
            (Some(1), Some(8))
        );
        assert_eq!(choice_seed(Some(7), 0), Some(7));
        assert_ne!(choice_seed(Some(7), 1), choice_seed(Some(7), 2));
        assert_eq!(choice_seed(Some(7), 1), choice_seed(Some(7), 1));
        assert_eq!(choice_seed(None, 3), None);
    }

    #[test]
    fn model_checks() {
        assert!(check_model(Some("m"), "m").is_ok());
        assert_eq!(
            check_model(Some("x"), "m").map_err(|e| e.status().as_u16()),
            Err(404)
        );
        assert_eq!(
            check_model(None, "m").map_err(|e| e.status().as_u16()),
            Err(400)
        );
    }

    #[test]
    fn sampling_ranges_are_400_with_param() {
        let f = SamplingFields {
            temperature: Some(3.0),
            ..Default::default()
        };
        assert_eq!(
            sampling_params(&f, false, None).map_err(param_of),
            Err((400, Some("temperature".into())))
        );
        let f = SamplingFields {
            top_k: Some(-2),
            ..Default::default()
        };
        assert_eq!(
            sampling_params(&f, false, None).map_err(param_of),
            Err((400, Some("top_k".into())))
        );
        assert_eq!(
            sampling_params(&SamplingFields::default(), false, Some(2)).map_err(param_of),
            Err((400, Some("top_logprobs".into())))
        );
    }
}
