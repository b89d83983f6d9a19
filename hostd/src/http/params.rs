//! Validation of request bodies and their conversion to engine inputs: messages to
//! [`ChatMessage`]s, sampling fields to [`SamplingParams`], stop strings, token budgets, and the
//! refusal of OpenAI features this server does not implement. Every failure is an [`ApiError`]
//! naming the field.

use super::error::ApiError;
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

/// Only one choice per request.
pub fn check_n(n: Option<i64>) -> Result<(), ApiError> {
    match n {
        None | Some(1) => Ok(()),
        Some(n) if n < 1 => Err(ApiError::invalid(format!("n must be at least 1 (got {n})."), "n")),
        Some(n) => Err(ApiError::unsupported(format!("n = {n} is not supported: this server returns exactly one choice."), "n")),
    }
}

/// Converts the shared sampling fields, with OpenAI's defaults, and checks their ranges.
pub fn sampling_params(f: &SamplingFields, logprobs: bool, top_logprobs: Option<i64>) -> Result<SamplingParams, ApiError> {
    let top_k = match f.top_k {
        None | Some(-1) => 0,
        Some(k) if k >= 0 => usize::try_from(k).unwrap_or(usize::MAX),
        Some(k) => return Err(ApiError::invalid(format!("top_k must be -1 (off) or ≥ 0 (got {k})."), "top_k")),
    };
    let top_logprobs = match top_logprobs {
        None => 0,
        Some(n) if (0..=MAX_TOP_LOGPROBS as i64).contains(&n) => n as usize,
        Some(n) => return Err(ApiError::invalid(format!("top_logprobs must be between 0 and 20 (got {n})."), "top_logprobs")),
    };
    let d = SamplingParams::default();
    let p = SamplingParams {
        temperature: f.temperature.map_or(d.temperature, |v| v as f32),
        top_p: f.top_p.map_or(d.top_p, |v| v as f32),
        top_k,
        min_p: f.min_p.map_or(d.min_p, |v| v as f32),
        presence_penalty: f.presence_penalty.map_or(d.presence_penalty, |v| v as f32),
        frequency_penalty: f.frequency_penalty.map_or(d.frequency_penalty, |v| v as f32),
        repetition_penalty: f.repetition_penalty.map_or(d.repetition_penalty, |v| v as f32),
        // Negative seeds are accepted (OpenAI's field is a signed integer); the bits seed the RNG.
        seed: f.seed.map(|s| s as u64),
        logprobs,
        top_logprobs,
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
        return Err(ApiError::invalid(format!("At most {MAX_STOP_STRINGS} stop sequences are allowed (got {}).", list.len()), param));
    }
    if list.iter().any(String::is_empty) {
        return Err(ApiError::invalid("Stop sequences must not be empty.", param));
    }
    if list.iter().any(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::invalid(format!("Stop sequences are limited to {MAX_STOP_BYTES} bytes."), param));
    }
    Ok(list)
}

/// A requested token budget: absent, or ≥ 1.
pub fn max_tokens(v: Option<i64>, param: &str) -> Result<Option<usize>, ApiError> {
    match v {
        None => Ok(None),
        Some(n) if n >= 1 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
        Some(n) => Err(ApiError::invalid(format!("{param} must be at least 1 (got {n})."), param)),
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

fn present(v: &Option<Value>) -> bool {
    v.as_ref().is_some_and(|v| !v.is_null())
}

/// Refuses the chat options this server does not implement, naming each.
pub fn reject_unsupported_chat(r: &ChatCompletionRequest) -> Result<(), ApiError> {
    let tools_given = r.tools.as_ref().is_some_and(|t| !t.is_null() && t.as_array().is_none_or(|a| !a.is_empty()));
    if tools_given {
        return Err(ApiError::unsupported("Tool calling is not supported by this server.", "tools"));
    }
    if let Some(tc) = &r.tool_choice
        && !(tc.is_null() || tc == "none" || tc == "auto")
    {
        return Err(ApiError::unsupported("tool_choice is not supported (no tools).", "tool_choice"));
    }
    if r.parallel_tool_calls.as_ref().is_some_and(|v| v.as_bool() == Some(true)) {
        return Err(ApiError::unsupported("parallel_tool_calls is not supported (no tools).", "parallel_tool_calls"));
    }
    if let Some(rf) = &r.response_format
        && !(rf.is_null() || rf.get("type").and_then(Value::as_str) == Some("text"))
    {
        return Err(ApiError::unsupported("Only response_format {\"type\": \"text\"} is supported.", "response_format"));
    }
    if r.logit_bias.as_ref().is_some_and(|v| v.as_object().is_none_or(|m| !m.is_empty()) && !v.is_null()) {
        return Err(ApiError::unsupported("logit_bias is not supported.", "logit_bias"));
    }
    if let Some(m) = &r.modalities
        && !(m.is_null() || *m == serde_json::json!(["text"]))
    {
        return Err(ApiError::unsupported("Only the text modality is supported.", "modalities"));
    }
    let plain = [
        (&r.functions, "functions", "Function calling is not supported."),
        (&r.function_call, "function_call", "Function calling is not supported."),
        (&r.audio, "audio", "Audio output is not supported."),
        (&r.prediction, "prediction", "Predicted outputs are not supported."),
        (&r.reasoning_effort, "reasoning_effort", "reasoning_effort is not supported; use chat_template_kwargs.enable_thinking."),
        (&r.web_search_options, "web_search_options", "Web search is not supported."),
    ];
    for (v, param, msg) in plain {
        if present(v) {
            return Err(ApiError::unsupported(msg, param));
        }
    }
    Ok(())
}

/// Refuses the legacy completion options this server does not implement.
pub fn reject_unsupported_completion(r: &CompletionRequest) -> Result<(), ApiError> {
    if r.echo == Some(true) {
        return Err(ApiError::unsupported("echo is not supported.", "echo"));
    }
    if r.best_of.is_some_and(|b| b != 1) {
        return Err(ApiError::unsupported("best_of other than 1 is not supported.", "best_of"));
    }
    if r.suffix.as_ref().is_some_and(|s| !s.is_null() && s.as_str() != Some("")) {
        return Err(ApiError::unsupported("suffix (insertion) is not supported.", "suffix"));
    }
    if r.logit_bias.as_ref().is_some_and(|v| !v.is_null() && v.as_object().is_none_or(|m| !m.is_empty())) {
        return Err(ApiError::unsupported("logit_bias is not supported.", "logit_bias"));
    }
    Ok(())
}

/// Message keys that are accepted; tool-related keys are refused, anything else is unknown.
const MESSAGE_KEYS: &[&str] = &["role", "content", "name", "reasoning_content", "refusal"];

/// Converts `messages` (OpenAI shape) to template messages.
pub fn chat_messages(messages: &[Value]) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages must contain at least one message.", "messages"));
    }
    messages.iter().enumerate().map(|(i, m)| chat_message(i, m)).collect()
}

fn chat_message(i: usize, m: &Value) -> Result<ChatMessage, ApiError> {
    let at = |field: &str| format!("messages[{i}].{field}");
    let obj = m.as_object().ok_or_else(|| ApiError::invalid(format!("messages[{i}] must be an object."), format!("messages[{i}]")))?;
    for key in obj.keys() {
        if matches!(key.as_str(), "tool_calls" | "tool_call_id" | "function_call" | "audio") {
            if !obj[key].is_null() {
                return Err(ApiError::unsupported(format!("{key} in messages is not supported (no tool calling)."), at(key)));
            }
        } else if !MESSAGE_KEYS.contains(&key.as_str()) {
            return Err(ApiError::unsupported(format!("Unrecognized message field: {key}"), at(key)));
        }
    }
    let role = match obj.get("role") {
        None => return Err(ApiError::missing(&at("role"))),
        Some(Value::String(r)) => r.as_str(),
        Some(_) => return Err(ApiError::invalid("role must be a string.", at("role"))),
    };
    let role = match role {
        "system" | "developer" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" | "function" => {
            return Err(ApiError::unsupported(format!("Unsupported role '{role}': tool calling is not supported."), at("role")));
        }
        other => {
            return Err(ApiError::invalid(
                format!("Invalid role '{other}': expected one of system, developer, user, assistant."),
                at("role"),
            ));
        }
    };
    let content = match obj.get("content") {
        None | Some(Value::Null) if role == Role::Assistant => String::new(),
        None | Some(Value::Null) => return Err(ApiError::missing(&at("content"))),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => content_parts(i, parts)?,
        Some(_) => return Err(ApiError::invalid("content must be a string or an array of content parts.", at("content"))),
    };
    let reasoning = match obj.get("reasoning_content") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if role == Role::Assistant => Some(s.clone()),
        Some(_) => return Err(ApiError::invalid("reasoning_content must be a string on an assistant message.", at("reasoning_content"))),
    };
    Ok(ChatMessage { role, content, reasoning_content: reasoning })
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
                None => return Err(ApiError::invalid("A text content part needs a string `text`.", format!("{at}.text"))),
            },
            Some(other) => {
                return Err(ApiError::unsupported(
                    format!("Unsupported content part type '{other}': only text parts are supported."),
                    format!("{at}.type"),
                ));
            }
            None => return Err(ApiError::invalid("A content part needs a string `type`.", format!("{at}.type"))),
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
pub fn completion_prompt(prompt: Option<&Value>, tokenizer: &Tokenizer) -> Result<PromptInput, ApiError> {
    let text = |s: &str| {
        if s.is_empty() {
            Err(ApiError::invalid("The prompt is empty: nothing to generate from.", "prompt"))
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
                    .filter(|&id| (id as usize) < tokenizer.vocab_size() && tokenizer.token_bytes(id).is_some())
                    .ok_or_else(|| ApiError::invalid(format!("Invalid token id {v} in prompt."), "prompt"))
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
            _ => return Err(ApiError::unsupported("Only one prompt per request is supported.", "prompt")),
        },
        Some(_) => return Err(ApiError::invalid("prompt must be a string, a list of token ids, or a list with one of either.", "prompt")),
    };
    if tokens.is_empty() {
        return Err(ApiError::invalid("The prompt is empty: nothing to generate from.", "prompt"));
    }
    Ok(PromptInput::Ids(tokens))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn param_of(e: ApiError) -> (u16, Option<String>) {
        (e.status().as_u16(), e.body()["error"]["param"].as_str().map(str::to_string))
    }

    fn check_messages_err(messages: Value, status: u16, param: &str) {
        let v = messages.as_array().cloned().unwrap_or_default();
        let e = chat_messages(&v).expect_err("should fail");
        assert_eq!(param_of(e), (status, Some(param.to_string())), "{messages}");
    }

    #[test]
    fn message_errors_name_the_field() {
        check_messages_err(json!([]), 400, "messages");
        check_messages_err(json!([{"role": "tool", "content": "x"}]), 400, "messages[0].role");
        check_messages_err(json!([{"role": "wizard", "content": "x"}]), 400, "messages[0].role");
        check_messages_err(json!([{"content": "x"}]), 400, "messages[0].role");
        check_messages_err(json!([{"role": "user"}]), 400, "messages[0].content");
        check_messages_err(
            json!([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]}]),
            400,
            "messages[0].content[1].type",
        );
        check_messages_err(json!([{"role": "user", "content": "x", "tool_calls": []}]), 400, "messages[0].tool_calls");
        check_messages_err(json!([{"role": "user", "content": "x", "colour": 1}]), 400, "messages[0].colour");
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
    fn budgets() {
        assert_eq!(budget(10, None, 100, 50, "messages").ok(), Some(40));
        assert_eq!(budget(10, Some(5), 100, 50, "messages").ok(), Some(5));
        assert_eq!(budget(10, Some(41), 100, 50, "messages").map_err(|e| e.code()), Err("context_length_exceeded"));
        assert_eq!(budget(50, None, 100, 50, "messages").map_err(|e| e.code()), Err("context_length_exceeded"));
    }

    #[test]
    fn stops_and_n() {
        assert_eq!(stop_strings(Some(&Stop::One("x".into()))).ok(), Some(vec!["x".to_string()]));
        let five = Stop::Many((0..5).map(|i| i.to_string()).collect());
        assert_eq!(stop_strings(Some(&five)).map_err(param_of), Err((400, Some("stop".into()))));
        assert_eq!(check_n(Some(2)).map_err(param_of), Err((400, Some("n".into()))));
        assert!(check_n(Some(1)).is_ok());
    }

    #[test]
    fn model_checks() {
        assert!(check_model(Some("m"), "m").is_ok());
        assert_eq!(check_model(Some("x"), "m").map_err(|e| e.status().as_u16()), Err(404));
        assert_eq!(check_model(None, "m").map_err(|e| e.status().as_u16()), Err(400));
    }

    #[test]
    fn sampling_ranges_are_400_with_param() {
        let f = SamplingFields { temperature: Some(3.0), ..Default::default() };
        assert_eq!(sampling_params(&f, false, None).map_err(param_of), Err((400, Some("temperature".into()))));
        let f = SamplingFields { top_k: Some(-2), ..Default::default() };
        assert_eq!(sampling_params(&f, false, None).map_err(param_of), Err((400, Some("top_k".into()))));
        assert_eq!(sampling_params(&SamplingFields::default(), false, Some(2)).map_err(param_of), Err((400, Some("top_logprobs".into()))));
    }
}
