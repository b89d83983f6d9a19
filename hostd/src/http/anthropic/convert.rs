//! Anthropic request fields to the server's chat inputs: `system` and `messages` to template
//! messages, `thinking` to the thinking switch, and the refusal of what this server does not
//! do (structured output, server-side features). Every error names its field's path
//! (`messages[2].content[0].type`). Tool definitions and `tool_choice` are in `tools.rs`.
//!
//! Mapping:
//! - `system` (a string or text blocks, joined by newlines) becomes the system turn.
//! - Text blocks of one message are joined by newlines; consecutive messages of one role are
//!   merged into one turn, as Anthropic documents.
//! - `thinking` blocks of an assistant turn become its `reasoning_content` (the template keeps
//!   the reasoning of turns after the last user message only); their `signature` is ignored, as
//!   are `redacted_thinking` blocks (nothing here can read them).
//! - An assistant turn's `tool_use` blocks become its tool calls (name and `input` object; the
//!   `id` must be unique), rendered after its text as the template renders OpenAI `tool_calls`.
//! - A user turn's `tool_result` blocks become tool messages (the template's
//!   `<tool_response>`), in block order with the turn's text; the content is a string or text
//!   blocks joined by newlines; `is_error: true` prefixes it with `Error: `. `tool_use_id` must
//!   name a `tool_use` block of an earlier assistant turn.
//! - A final assistant message (prefill) is refused: the Qwen template closes every assistant
//!   turn, so the reply could not continue it.
//! - `thinking.type` `enabled` and `adaptive` turn thinking on, `disabled` off; absent, the
//!   server's `--default-thinking` decides. `budget_tokens` must be a positive integer but is not
//!   a separate limit: reasoning and answer share `max_tokens`. `display: "omitted"` returns
//!   thinking blocks with empty text.

use crate::chat_template::{ChatMessage, Role, ToolCall};
use crate::http::error::ApiError;
use crate::http::json::{new_id, object, only_keys, string, text_blocks};
use crate::http::tools::check_name;
use serde_json::Value;

/// The thinking switch of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thinking {
    /// The generation prompt opens a `<think>` block.
    pub enabled: bool,
    /// Thinking blocks carry the reasoning text (false: `display: "omitted"`).
    pub display: bool,
}

/// Checks one piece of prompt text against the byte cap (`param` names it).
pub type CheckBytes<'a> = &'a dyn Fn(&str, &str) -> Result<(), ApiError>;

fn present(v: Option<&Value>) -> bool {
    v.is_some_and(|v| !v.is_null())
}

/// The `thinking` field; `default` is the server's thinking switch.
pub fn thinking(v: Option<&Value>, default: bool) -> Result<Thinking, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(Thinking {
            enabled: default,
            display: true,
        });
    };
    let obj = object(v, "thinking")?;
    only_keys(obj, &["type", "budget_tokens", "display"], "thinking")?;
    let display = match obj.get("display") {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) if s == "summarized" => true,
        Some(Value::String(s)) if s == "omitted" => false,
        Some(other) => {
            return Err(ApiError::invalid(
                format!("thinking.display must be \"summarized\" or \"omitted\" (got {other})."),
                "thinking.display",
            ));
        }
    };
    let enabled = match string(obj, "type", "thinking")? {
        "enabled" => {
            match obj.get("budget_tokens") {
                Some(b) if b.as_u64().is_some_and(|n| n >= 1) => {}
                None | Some(Value::Null) => {
                    return Err(ApiError::missing("thinking.budget_tokens"));
                }
                Some(b) => {
                    return Err(ApiError::invalid(
                        format!("thinking.budget_tokens must be a positive integer (got {b})."),
                        "thinking.budget_tokens",
                    ));
                }
            }
            true
        }
        "adaptive" => true,
        "disabled" => false,
        other => {
            return Err(ApiError::invalid(
                format!("Invalid thinking.type '{other}': expected enabled, adaptive or disabled."),
                "thinking.type",
            ));
        }
    };
    Ok(Thinking { enabled, display })
}

/// `output_config`: `effort` is accepted and ignored (thinking is a switch here, not a
/// level); `format` (structured output) is refused.
pub fn output_config(v: Option<&Value>) -> Result<(), ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(());
    };
    let obj = object(v, "output_config")?;
    only_keys(obj, &["effort", "format"], "output_config")?;
    if present(obj.get("format")) {
        return Err(ApiError::unsupported(
            "Structured output (output_config.format) is not supported by this server.",
            "output_config.format",
        ));
    }
    Ok(())
}

/// Refuses server-side features: each `(value, field, what)` that is set is a 400 naming `field`.
pub fn refuse_set(fields: &[(Option<&Value>, &str, &str)]) -> Result<(), ApiError> {
    match fields.iter().find(|(v, _, _)| present(*v)) {
        Some((_, field, what)) => Err(ApiError::unsupported(
            format!("{what} are not supported by this server."),
            *field,
        )),
        None => Ok(()),
    }
}

/// The text of `system`: a string, or text blocks joined by newlines.
pub fn system(v: Option<&Value>, check: CheckBytes<'_>) -> Result<Option<String>, ApiError> {
    let text = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => {
            let texts = text_blocks(blocks, "system", "system")?;
            if texts.is_empty() {
                return Ok(None);
            }
            texts.join("\n")
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "system must be a string or a list of text blocks.",
                "system",
            ));
        }
    };
    check(&text, "system")?;
    Ok(Some(text))
}

/// One turn of the conversation: a message's text, reasoning and tool calls, or one tool
/// result (role [`Role::Tool`], never merged with its neighbours).
struct Turn {
    role: Role,
    texts: Vec<String>,
    reasoning: Vec<String>,
    calls: Vec<ToolCall>,
}

impl Turn {
    fn new(role: Role) -> Turn {
        Turn {
            role,
            texts: Vec::new(),
            reasoning: Vec::new(),
            calls: Vec::new(),
        }
    }
}

/// `messages` to template messages (with the system turn first, when given).
pub fn messages(
    system: Option<String>,
    messages: &[Value],
    check: CheckBytes<'_>,
) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages must contain at least one message.",
            "messages",
        ));
    }
    let mut turns: Vec<Turn> = Vec::with_capacity(messages.len());
    let mut tool_use_ids: Vec<String> = Vec::new();
    // A `system` message inside `messages` (Claude Code sends reminders that way) joins the
    // system prompt, in order: the chat template takes one system turn, at the start.
    let mut system = system;
    for (i, m) in messages.iter().enumerate() {
        if m.get("role").and_then(Value::as_str) == Some("system") {
            let text = inline_system(i, m, check)?;
            system = Some(match system {
                Some(s) if !s.is_empty() => format!("{s}\n\n{text}"),
                _ => text,
            });
            continue;
        }
        for turn in message(i, m, check, &mut tool_use_ids)? {
            match turns.last_mut() {
                Some(last) if last.role == turn.role && turn.role != Role::Tool => {
                    last.texts.extend(turn.texts);
                    last.reasoning.extend(turn.reasoning);
                    last.calls.extend(turn.calls);
                }
                _ => turns.push(turn),
            }
        }
    }
    if turns.last().is_some_and(|t| t.role == Role::Assistant) {
        let last = messages.len() - 1;
        return Err(ApiError::unsupported(
            "The last message must be a user message: continuing a partial assistant message (prefill) is not supported by this server.",
            format!("messages[{last}].role"),
        ));
    }
    let mut out = Vec::with_capacity(turns.len() + 1);
    if let Some(s) = system {
        out.push(ChatMessage::system(s));
    }
    for t in turns {
        let mut m = ChatMessage::new(t.role, t.texts.join("\n")).with_tool_calls(t.calls);
        if t.role == Role::Assistant && !t.reasoning.is_empty() {
            m.reasoning_content = Some(t.reasoning.join("\n"));
        }
        out.push(m);
    }
    Ok(out)
}

/// The text of a `system` message inside `messages`: a string or text blocks.
fn inline_system(i: usize, m: &Value, check: CheckBytes<'_>) -> Result<String, ApiError> {
    let at = format!("messages[{i}]");
    let obj = object(m, &at)?;
    only_keys(obj, &["role", "content"], &at)?;
    match obj.get("content") {
        Some(Value::String(s)) => {
            check(s, &format!("{at}.content"))?;
            Ok(s.clone())
        }
        Some(Value::Array(blocks)) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for (j, b) in blocks.iter().enumerate() {
                let bat = format!("{at}.content[{j}]");
                let bo = object(b, &bat)?;
                if string(bo, "type", &bat)? != "text" {
                    return Err(ApiError::unsupported(
                        "A system message may hold only text blocks.",
                        format!("{bat}.type"),
                    ));
                }
                only_keys(bo, &["type", "text", "cache_control", "citations"], &bat)?;
                let t = string(bo, "text", &bat)?;
                check(t, &format!("{bat}.text"))?;
                texts.push(t.to_string());
            }
            Ok(texts.join("\n"))
        }
        None | Some(Value::Null) => Err(ApiError::missing(&format!("{at}.content"))),
        Some(_) => Err(ApiError::invalid(
            "content must be a string or an array of text blocks.",
            format!("{at}.content"),
        )),
    }
}

/// One message as turns: an assistant message is one turn; a user message is its text and its
/// tool results, in block order.
fn message(
    i: usize,
    m: &Value,
    check: CheckBytes<'_>,
    tool_use_ids: &mut Vec<String>,
) -> Result<Vec<Turn>, ApiError> {
    let at = format!("messages[{i}]");
    let obj = object(m, &at)?;
    only_keys(obj, &["role", "content"], &at)?;
    let role = match string(obj, "role", &at)? {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "system" => {
            return Err(ApiError::invalid(
                "Invalid role 'system' in messages: use the top-level `system` field.",
                format!("{at}.role"),
            ));
        }
        other => {
            return Err(ApiError::invalid(
                format!("Invalid role '{other}': expected user or assistant."),
                format!("{at}.role"),
            ));
        }
    };
    let mut turns = Vec::new();
    match obj.get("content") {
        None | Some(Value::Null) => return Err(ApiError::missing(&format!("{at}.content"))),
        Some(Value::String(s)) => {
            check(s, &format!("{at}.content"))?;
            text_turn(role, &mut turns).texts.push(s.clone());
        }
        Some(Value::Array(blocks)) => {
            for (j, b) in blocks.iter().enumerate() {
                block(
                    role,
                    &mut turns,
                    &format!("{at}.content[{j}]"),
                    b,
                    check,
                    tool_use_ids,
                )?;
            }
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "content must be a string or a list of content blocks.",
                format!("{at}.content"),
            ));
        }
    }
    if turns.is_empty() {
        // No blocks (or only redacted thinking): an empty turn, as the message was.
        turns.push(Turn::new(role));
    }
    Ok(turns)
}

/// The turn that takes `role`'s text: the last one when it is of that role, else a new one.
fn text_turn(role: Role, turns: &mut Vec<Turn>) -> &mut Turn {
    if turns.last().is_none_or(|t| t.role != role) {
        turns.push(Turn::new(role));
    }
    let last = turns.len() - 1;
    &mut turns[last]
}

fn block(
    role: Role,
    turns: &mut Vec<Turn>,
    at: &str,
    b: &Value,
    check: CheckBytes<'_>,
    tool_use_ids: &mut Vec<String>,
) -> Result<(), ApiError> {
    let obj = object(b, at)?;
    let kind = string(obj, "type", at)?;
    let only_in = |want: Role, what: &str| {
        if role == want {
            Ok(())
        } else {
            Err(ApiError::invalid(
                format!(
                    "{what} blocks may only appear in {} messages.",
                    want.as_str()
                ),
                format!("{at}.type"),
            ))
        }
    };
    match kind {
        "text" => {
            only_keys(obj, &["type", "text", "cache_control", "citations"], at)?;
            let text = string(obj, "text", at)?;
            check(text, &format!("{at}.text"))?;
            text_turn(role, turns).texts.push(text.to_string());
        }
        "thinking" => {
            only_in(Role::Assistant, "thinking")?;
            only_keys(obj, &["type", "thinking", "signature", "cache_control"], at)?;
            let text = string(obj, "thinking", at)?;
            check(text, &format!("{at}.thinking"))?;
            text_turn(role, turns).reasoning.push(text.to_string());
        }
        "redacted_thinking" => {
            only_in(Role::Assistant, "redacted_thinking")?;
        }
        "tool_use" => {
            only_in(Role::Assistant, "tool_use")?;
            only_keys(
                obj,
                &["type", "id", "name", "input", "cache_control", "caller"],
                at,
            )?;
            let id = new_id(obj, "id", at, tool_use_ids)?;
            let name = string(obj, "name", at)?;
            check_name(name, &format!("{at}.name"))?;
            let input = match obj.get("input") {
                Some(Value::Object(m)) => m.clone(),
                None | Some(Value::Null) => return Err(ApiError::missing(&format!("{at}.input"))),
                Some(_) => {
                    return Err(ApiError::invalid(
                        format!("{at}.input must be an object."),
                        format!("{at}.input"),
                    ));
                }
            };
            check(
                &Value::Object(input.clone()).to_string(),
                &format!("{at}.input"),
            )?;
            tool_use_ids.push(id.to_string());
            text_turn(role, turns)
                .calls
                .push(ToolCall::new(name, input));
        }
        "tool_result" => {
            only_in(Role::User, "tool_result")?;
            only_keys(
                obj,
                &[
                    "type",
                    "tool_use_id",
                    "content",
                    "is_error",
                    "cache_control",
                ],
                at,
            )?;
            let id = string(obj, "tool_use_id", at)?;
            if !tool_use_ids.iter().any(|seen| seen == id) {
                return Err(ApiError::invalid(
                    format!(
                        "{at}.tool_use_id '{id}' does not name a tool_use block of an earlier assistant message."
                    ),
                    format!("{at}.tool_use_id"),
                ));
            }
            let is_error = match obj.get("is_error") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(ApiError::invalid(
                        format!("{at}.is_error must be a boolean."),
                        format!("{at}.is_error"),
                    ));
                }
            };
            let content = tool_result_content(obj.get("content"), at, check)?;
            let content = match (is_error, content.is_empty()) {
                (false, _) => content,
                (true, true) => "Error".to_string(),
                (true, false) => format!("Error: {content}"),
            };
            let mut turn = Turn::new(Role::Tool);
            turn.texts.push(content);
            turns.push(turn);
        }
        "server_tool_use"
        | "web_search_tool_result"
        | "web_fetch_tool_result"
        | "code_execution_tool_result"
        | "mcp_tool_use"
        | "mcp_tool_result" => {
            return Err(ApiError::unsupported(
                format!(
                    "Server-side tools are not supported by this server: '{kind}' blocks are refused."
                ),
                format!("{at}.type"),
            ));
        }
        other => {
            return Err(ApiError::unsupported(
                format!(
                    "Unsupported content block type '{other}': only text, thinking, tool_use and tool_result blocks are supported."
                ),
                format!("{at}.type"),
            ));
        }
    }
    Ok(())
}

/// A `tool_result`'s `content`: absent, a string, or text blocks (joined by newlines).
fn tool_result_content(
    v: Option<&Value>,
    at: &str,
    check: CheckBytes<'_>,
) -> Result<String, ApiError> {
    let text = match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => {
            text_blocks(blocks, &format!("{at}.content"), "tool_result content")?.join("\n")
        }
        Some(_) => {
            return Err(ApiError::invalid(
                format!("{at}.content must be a string or a list of text blocks."),
                format!("{at}.content"),
            ));
        }
    };
    check(&text, &format!("{at}.content"))?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::test_support::{no_cap, param_of};
    use serde_json::json;

    fn convert(system_v: Value, msgs: Value) -> Result<Vec<ChatMessage>, String> {
        let sys = system(Some(&system_v), &no_cap).map_err(param_of)?;
        messages(sys, msgs.as_array().map_or(&[][..], Vec::as_slice), &no_cap).map_err(param_of)
    }

    #[test]
    fn blocks_merge_into_turns() {
        let got = convert(
            json!([{"type": "text", "text": "be brief"}, {"type": "text", "text": "and kind", "cache_control": {"type": "ephemeral"}}]),
            json!([
                {"role": "user", "content": "hi"},
                {"role": "user", "content": [{"type": "text", "text": "there"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "xx"},
                    {"type": "text", "text": "hello"}
                ]},
                {"role": "user", "content": "again"}
            ]),
        )
        .expect("valid");
        assert_eq!(
            got,
            vec![
                ChatMessage::system("be brief\nand kind"),
                ChatMessage::user("hi\nthere"),
                ChatMessage::assistant_with_reasoning("hello", "hmm"),
                ChatMessage::user("again"),
            ]
        );
        assert_eq!(
            convert(Value::Null, json!([{"role": "user", "content": "x"}])),
            Ok(vec![ChatMessage::user("x")])
        );
    }

    #[test]
    fn errors_name_the_path() {
        let bad = |msgs: Value| convert(Value::Null, msgs).expect_err("should fail");
        assert_eq!(bad(json!([])), "messages");
        // A system message inside `messages` joins the system prompt; only text blocks.
        assert_eq!(
            bad(json!([{"role": "system", "content": [{"type": "image"}]}])),
            "messages[0].content[0].type"
        );
        assert_eq!(bad(json!([{"role": "user"}])), "messages[0].content");
        assert_eq!(
            bad(json!([{"role": "user", "content": "x", "name": "y"}])),
            "messages[0].name"
        );
        assert_eq!(
            bad(json!([{"role": "user", "content": [{"type": "image", "source": {}}]}])),
            "messages[0].content[0].type"
        );
        let tool = json!([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "1"}]}]);
        assert_eq!(bad(tool), "messages[0].content[0].tool_use_id");
        let call = |id: &str, input: Value| json!({"role": "assistant", "content": [{"type": "tool_use", "id": id, "name": "f", "input": input}]});
        let result = |content: Value| json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": content}]});
        assert_eq!(
            bad(
                json!([{"role": "user", "content": "q"}, call("t1", json!([1])), result(json!("x"))])
            ),
            "messages[1].content[0].input"
        );
        assert_eq!(
            bad(json!([{"role": "user", "content": "q"}, call("", json!({})), result(json!("x"))])),
            "messages[1].content[0].id"
        );
        assert_eq!(
            bad(
                json!([{"role": "user", "content": "q"}, call("t1", json!({})), result(json!([{"type": "image"}]))])
            ),
            "messages[2].content[0].content[0].type"
        );
        assert_eq!(
            bad(json!([{"role": "user", "content": "q"}, call("t1", json!({})), result(json!(5))])),
            "messages[2].content[0].content"
        );
        assert_eq!(
            bad(
                json!([{"role": "user", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]}])
            ),
            "messages[0].content[0].type"
        );
        assert_eq!(
            bad(json!([{"role": "user", "content": [{"type": "server_tool_use"}]}])),
            "messages[0].content[0].type"
        );
        assert_eq!(
            bad(json!([{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}])),
            "messages[0].content[0].type"
        );
        assert_eq!(
            bad(json!([{"role": "user", "content": [{"type": "text"}]}])),
            "messages[0].content[0].text"
        );
        assert_eq!(
            bad(
                json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": "The answer is ("}])
            ),
            "messages[1].role"
        );
        assert_eq!(
            convert(
                json!([{"type": "image"}]),
                json!([{"role": "user", "content": "x"}])
            ),
            Err("system[0].type".to_string())
        );
    }

    #[test]
    fn byte_cap_names_the_block() {
        let cap = |text: &str, param: &str| {
            if text.len() > 3 {
                Err(ApiError::invalid("too long", param))
            } else {
                Ok(())
            }
        };
        let msgs = json!([{"role": "user", "content": [{"type": "text", "text": "ok"}, {"type": "text", "text": "long!"}]}]);
        let e = messages(None, msgs.as_array().map_or(&[][..], Vec::as_slice), &cap)
            .expect_err("over the cap");
        assert_eq!(param_of(e), "messages[0].content[1].text");
    }

    #[test]
    fn thinking_switch() {
        let t = |v: Value| thinking(Some(&v), true).map_err(param_of);
        assert_eq!(
            thinking(None, false),
            Ok(Thinking {
                enabled: false,
                display: true
            })
        );
        assert_eq!(
            t(json!({"type": "enabled", "budget_tokens": 2048})),
            Ok(Thinking {
                enabled: true,
                display: true
            })
        );
        assert_eq!(
            t(json!({"type": "adaptive", "display": "omitted"})),
            Ok(Thinking {
                enabled: true,
                display: false
            })
        );
        assert_eq!(
            t(json!({"type": "disabled"})),
            Ok(Thinking {
                enabled: false,
                display: true
            })
        );
        assert_eq!(
            t(json!({"type": "enabled"})),
            Err("thinking.budget_tokens".into())
        );
        assert_eq!(
            t(json!({"type": "enabled", "budget_tokens": 0})),
            Err("thinking.budget_tokens".into())
        );
        assert_eq!(t(json!({"type": "sometimes"})), Err("thinking.type".into()));
        assert_eq!(
            t(json!({"type": "adaptive", "depth": 3})),
            Err("thinking.depth".into())
        );
    }

    #[test]
    fn tool_use_and_results_become_calls_and_tool_messages() {
        let input = json!({"city": "Paris", "days": 2});
        let got = convert(
            Value::Null,
            json!([
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "look it up", "signature": ""},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": input},
                    {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}, {"type": "text", "text": "20C"}]},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "no clock", "is_error": true},
                    {"type": "text", "text": "thanks"}
                ]}
            ]),
        )
        .expect("valid");
        let calls = vec![
            ToolCall::new(
                "get_weather",
                input.as_object().cloned().unwrap_or_default(),
            ),
            ToolCall::new("get_time", serde_json::Map::new()),
        ];
        assert_eq!(
            got,
            vec![
                ChatMessage::user("weather?"),
                ChatMessage::assistant_with_reasoning("Checking.", "look it up")
                    .with_tool_calls(calls),
                ChatMessage::tool("sunny\n20C"),
                ChatMessage::tool("Error: no clock"),
                ChatMessage::user("thanks"),
            ]
        );
    }

    #[test]
    fn server_features_are_refused_by_name() {
        assert!(output_config(Some(&json!({"effort": "high"}))).is_ok());
        assert_eq!(
            output_config(Some(&json!({"format": {"type": "json_schema"}}))).map_err(param_of),
            Err("output_config.format".into())
        );
        let container = json!("c1");
        let got = refuse_set(&[
            (None, "mcp_servers", "MCP servers"),
            (Some(&container), "container", "Containers"),
        ]);
        assert_eq!(got.map_err(param_of), Err("container".into()));
    }
}
