//! Responses request fields to the server's chat inputs: `input` items to template messages,
//! `instructions` to the system turn, function tools and `tool_choice` to the shared
//! [`ToolRequest`], and `text.format` to a constraint. Every error names its field's path
//! (`input[2].content[0].type`).
//!
//! Mapping of `input`:
//! - A string is one user message.
//! - `message` items (with or without `type`): `user`, `assistant`, `system` and `developer`
//!   roles; `content` a string or `input_text` / `output_text` / `refusal` parts (joined without
//!   a separator: they are pieces of one message). Images, files and audio are refused.
//!   `system` and `developer` messages become the system turn, merged after `instructions`; they
//!   must come before every other item.
//! - `reasoning` items (their `content` text, else their `summary` text) become the reasoning of
//!   the assistant turn they start; `encrypted_content` cannot be read here and is ignored.
//! - Consecutive `reasoning`, assistant `message` and `function_call` items form one assistant
//!   turn; a `function_call`'s `arguments` must be a JSON object's text.
//! - `function_call_output` items become tool messages (the template's `<tool_response>`);
//!   their `call_id` must name a `function_call` earlier in the conversation (this request's
//!   input or the `previous_response_id` chain).
//! - `item_reference` and the items of built-in tools are refused.
//!
//! Fields an item may carry that mean nothing here (`id`, `status`, `annotations`, `phase`, …,
//! as `response.output` items echoed back carry them) are ignored.

use crate::chat_template::{ChatMessage, Role, ToolCall};
use crate::constraint::ConstraintSpec;
use crate::http::error::ApiError;
use crate::http::json::{new_id, object, optional_types, require_type, string};
use crate::http::tools::{self, ChoiceShape, ToolRequest, check_name};
use crate::tool_calls::ToolSpec;
use serde_json::{Map, Value, json};

/// Checks one piece of prompt text against the byte cap (`param` names it).
pub type CheckBytes<'a> = &'a dyn Fn(&str, &str) -> Result<(), ApiError>;

/// A conversation: template messages (no `instructions`) and the call ids made in it.
#[derive(Debug, Clone, Default)]
pub struct Conversation {
    /// The turns, in order.
    pub messages: Vec<ChatMessage>,
    /// `call_id` of every function call, in order.
    pub call_ids: Vec<String>,
}

impl Conversation {
    /// The open assistant turn, or a new one.
    fn assistant(&mut self, fresh: bool) -> &mut ChatMessage {
        let open = self
            .messages
            .last()
            .is_some_and(|m| m.role == Role::Assistant);
        if !open || fresh {
            self.messages.push(ChatMessage::assistant(""));
        }
        let last = self.messages.len() - 1;
        &mut self.messages[last]
    }

    /// Appends `items` (the request's `input`).
    pub fn extend(&mut self, input: &Value, check: CheckBytes<'_>) -> Result<(), ApiError> {
        match input {
            Value::String(s) => {
                check(s, "input")?;
                self.messages.push(ChatMessage::user(s.clone()));
            }
            Value::Array(items) => {
                if items.is_empty() {
                    return Err(ApiError::invalid(
                        "input must contain at least one item.",
                        "input",
                    ));
                }
                for (i, item) in items.iter().enumerate() {
                    self.item(&format!("input[{i}]"), item, check)?;
                }
            }
            _ => {
                return Err(ApiError::invalid(
                    "input must be a string or a list of input items.",
                    "input",
                ));
            }
        }
        Ok(())
    }

    fn item(&mut self, at: &str, item: &Value, check: CheckBytes<'_>) -> Result<(), ApiError> {
        let obj = object(item, at)?;
        let kind = match obj.get("type") {
            None | Some(Value::Null) => "message",
            Some(Value::String(s)) => s.as_str(),
            Some(_) => {
                return Err(ApiError::invalid(
                    format!("{at}.type must be a string."),
                    format!("{at}.type"),
                ));
            }
        };
        match kind {
            "message" => self.message(at, obj, check),
            "reasoning" => {
                let text = reasoning_text(at, obj)?;
                check(&text, &format!("{at}.content"))?;
                let open = self.messages.last().filter(|m| m.role == Role::Assistant);
                let fresh = open.is_some_and(|m| !m.content.is_empty() || !m.tool_calls.is_empty());
                let turn = self.assistant(fresh);
                let r = turn.reasoning_content.get_or_insert_default();
                if !r.is_empty() && !text.is_empty() {
                    r.push('\n');
                }
                r.push_str(&text);
                Ok(())
            }
            "function_call" => {
                let call_id = new_id(obj, "call_id", at, &self.call_ids)?;
                let name = string(obj, "name", at)?;
                check_name(name, &format!("{at}.name"))?;
                let arguments = string(obj, "arguments", at)?;
                check(arguments, &format!("{at}.arguments"))?;
                let Ok(Value::Object(arguments)) = serde_json::from_str::<Value>(arguments) else {
                    return Err(ApiError::invalid(
                        format!("{at}.arguments must be the text of a JSON object."),
                        format!("{at}.arguments"),
                    ));
                };
                self.call_ids.push(call_id.to_string());
                self.assistant(false)
                    .tool_calls
                    .push(ToolCall::new(name, arguments));
                Ok(())
            }
            "function_call_output" => {
                let call_id = string(obj, "call_id", at)?;
                if !self.call_ids.iter().any(|c| c == call_id) {
                    return Err(ApiError::invalid(
                        format!(
                            "No function call found for the function_call_output with call_id '{call_id}'."
                        ),
                        format!("{at}.call_id"),
                    ));
                }
                let output = match obj.get("output") {
                    None | Some(Value::Null) => {
                        return Err(ApiError::missing(&format!("{at}.output")));
                    }
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => {
                        parts_text(&format!("{at}.output"), parts, &["input_text"])?
                    }
                    Some(_) => {
                        return Err(ApiError::invalid(
                            format!("{at}.output must be a string or a list of input_text parts."),
                            format!("{at}.output"),
                        ));
                    }
                };
                check(&output, &format!("{at}.output"))?;
                self.messages.push(ChatMessage::tool(output));
                Ok(())
            }
            "item_reference" => Err(ApiError::unsupported(
                "item_reference items are not supported: send the item itself, or continue with previous_response_id.",
                format!("{at}.type"),
            )),
            other => Err(ApiError::unsupported(
                format!(
                    "Unsupported input item type '{other}': only message, reasoning, function_call and function_call_output items."
                ),
                format!("{at}.type"),
            )),
        }
    }

    fn message(
        &mut self,
        at: &str,
        obj: &Map<String, Value>,
        check: CheckBytes<'_>,
    ) -> Result<(), ApiError> {
        let role = match string(obj, "role", at)? {
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "system" | "developer" => Role::System,
            other => {
                return Err(ApiError::invalid(
                    format!(
                        "Invalid role '{other}': expected user, assistant, system or developer."
                    ),
                    format!("{at}.role"),
                ));
            }
        };
        let text = match obj.get("content") {
            None | Some(Value::Null) => return Err(ApiError::missing(&format!("{at}.content"))),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => parts_text(
                &format!("{at}.content"),
                parts,
                &["input_text", "output_text", "refusal"],
            )?,
            Some(_) => {
                return Err(ApiError::invalid(
                    format!("{at}.content must be a string or a list of content parts."),
                    format!("{at}.content"),
                ));
            }
        };
        check(&text, &format!("{at}.content"))?;
        match role {
            Role::System if self.messages.iter().any(|m| m.role != Role::System) => {
                Err(ApiError::invalid(
                    "system and developer messages must come before every other input item (the model's template has one system turn, at the start).",
                    format!("{at}.role"),
                ))
            }
            Role::Assistant => {
                let turn = self.assistant(false);
                if !turn.tool_calls.is_empty() {
                    // Text after a call: a turn of its own, as the model would write it.
                    self.messages.push(ChatMessage::assistant(text));
                } else {
                    turn.content.push_str(&text);
                }
                Ok(())
            }
            _ => {
                self.messages.push(ChatMessage::new(role, text));
                Ok(())
            }
        }
    }
}

/// The text of a reasoning item: its `content` parts, else its `summary` parts.
fn reasoning_text(at: &str, obj: &Map<String, Value>) -> Result<String, ApiError> {
    for (key, kind) in [("content", "reasoning_text"), ("summary", "summary_text")] {
        match obj.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::Array(parts)) if parts.is_empty() => {}
            Some(Value::Array(parts)) => return parts_text(&format!("{at}.{key}"), parts, &[kind]),
            Some(_) => {
                return Err(ApiError::invalid(
                    format!("{at}.{key} must be a list of {kind} parts."),
                    format!("{at}.{key}"),
                ));
            }
        }
    }
    Ok(String::new())
}

/// Joins the text of content parts of the `allowed` types.
fn parts_text(at: &str, parts: &[Value], allowed: &[&str]) -> Result<String, ApiError> {
    let mut text = String::new();
    for (j, p) in parts.iter().enumerate() {
        let pat = format!("{at}[{j}]");
        let obj = object(p, &pat)?;
        let kind = string(obj, "type", &pat)?;
        if !allowed.contains(&kind) {
            return Err(ApiError::unsupported(
                format!(
                    "Unsupported content part type '{kind}' here: expected {}.",
                    allowed.join(" or ")
                ),
                format!("{pat}.type"),
            ));
        }
        let key = if kind == "refusal" { "refusal" } else { "text" };
        text.push_str(string(obj, key, &pat)?);
    }
    Ok(text)
}

/// The messages to render: the system turn (`instructions`, then the conversation's leading
/// system and developer messages, joined by blank lines), then the rest of the conversation.
pub fn assemble(
    instructions: Option<&str>,
    conversation: &[ChatMessage],
) -> Result<Vec<ChatMessage>, ApiError> {
    let lead = conversation
        .iter()
        .take_while(|m| m.role == Role::System)
        .count();
    let system: Vec<&str> = instructions
        .into_iter()
        .chain(conversation[..lead].iter().map(|m| m.content.as_str()))
        .collect();
    let rest = &conversation[lead..];
    if !rest.iter().any(|m| m.role == Role::User) {
        return Err(ApiError::invalid(
            "input must contain at least one user message.",
            "input",
        ));
    }
    let mut out = Vec::with_capacity(rest.len() + 1);
    if !system.is_empty() {
        out.push(ChatMessage::system(system.join("\n\n")));
    }
    out.extend(rest.iter().cloned());
    Ok(out)
}

/// `tools` (function tools in the Responses shape), `tool_choice` and `parallel_tool_calls`.
/// The definitions render as chat function tools (`{type: "function", function: {name,
/// description, parameters}}`), so the chat template and the forced-call grammar serve both APIs.
pub fn tool_request(
    tools: Option<&Value>,
    choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<ToolRequest, ApiError> {
    let list = tools::tool_list(tools)?;
    let mut definitions = Vec::with_capacity(list.len());
    let mut specs: Vec<ToolSpec> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        let obj = object(t, &at)?;
        require_type(obj, &at, "function", |other| {
            format!("Tool type '{other}' is not supported: only function tools.")
        })?;
        let name = string(obj, "name", &at)?;
        check_name(name, &format!("{at}.name"))?;
        if specs.iter().any(|s| s.name == name) {
            return Err(ApiError::invalid(
                format!("Duplicate tool name '{name}'."),
                format!("{at}.name"),
            ));
        }
        optional_types(
            obj,
            &at,
            &[
                ("description", Value::is_string, "a string"),
                ("parameters", Value::is_object, "a JSON schema object"),
                ("strict", Value::is_boolean, "a boolean"),
            ],
        )?;
        let parameters = obj.get("parameters").filter(|p| p.is_object()).cloned();
        if let Some(p) = &parameters {
            tools::check_schema_types(p, &format!("{at}.parameters"))?;
        }
        let mut function = Map::new();
        function.insert("name".into(), json!(name));
        if let Some(d) = obj.get("description").filter(|d| d.is_string()) {
            function.insert("description".into(), d.clone());
        }
        if let Some(p) = &parameters {
            function.insert("parameters".into(), p.clone());
        }
        definitions.push(json!({ "type": "function", "function": function }));
        specs.push(ToolSpec {
            name: name.to_string(),
            parameters,
        });
    }
    let choice = tools::tool_choice(choice, &specs, &CHOICE)?;
    Ok(ToolRequest {
        definitions,
        specs,
        choice,
        parallel: parallel.unwrap_or(true),
    })
}

/// Responses: `{type: "function", name}`.
const CHOICE: ChoiceShape = ChoiceShape {
    expected: "none, auto, required or a function",
    name: |o| string(o, "name", "tool_choice"),
    name_param: "tool_choice.name",
    other_types: ": only function",
};

/// `text`: `format` `text` (free), `json_object` or `json_schema` (`{name, schema, strict,
/// description}` at the top level of `format`, as the Responses API has it); `verbosity` is a
/// length hint and ignored.
pub fn text_format(v: Option<&Value>) -> Result<Option<ConstraintSpec>, ApiError> {
    let obj = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(v) => object(v, "text")?,
    };
    if let Some(k) = obj
        .keys()
        .find(|k| !matches!(k.as_str(), "format" | "verbosity"))
    {
        return Err(ApiError::invalid(
            format!("Unrecognized field: text.{k}"),
            format!("text.{k}"),
        ));
    }
    let format = match obj.get("format") {
        None | Some(Value::Null) => return Ok(None),
        Some(f) => object(f, "text.format")?,
    };
    let kind = string(format, "type", "text.format")?;
    let allowed: &[&str] = match kind {
        "text" | "json_object" => &["type"],
        "json_schema" => &["type", "name", "schema", "strict", "description"],
        other => {
            return Err(ApiError::invalid(
                format!(
                    "Unsupported text.format type '{other}': expected text, json_object or json_schema."
                ),
                "text.format.type",
            ));
        }
    };
    if let Some(k) = format.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(ApiError::invalid(
            format!("Unrecognized field in text.format of type {kind}: {k}"),
            format!("text.format.{k}"),
        ));
    }
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(ConstraintSpec::JsonObject)),
        _ => {
            optional_types(
                format,
                "text.format",
                &[
                    ("name", Value::is_string, "a string"),
                    ("description", Value::is_string, "a string"),
                    ("strict", Value::is_boolean, "a boolean"),
                ],
            )?;
            match format.get("schema") {
                None | Some(Value::Null) => Err(ApiError::missing("text.format.schema")),
                Some(s @ Value::Object(_)) => Ok(Some(ConstraintSpec::JsonSchema(s.clone()))),
                Some(_) => Err(ApiError::invalid(
                    "text.format.schema must be a JSON schema object.",
                    "text.format.schema",
                )),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::test_support::{no_cap, param_of};
    use crate::http::tools::ToolChoice;

    fn convert(input: Value) -> Result<Conversation, String> {
        let mut c = Conversation::default();
        c.extend(&input, &no_cap).map_err(param_of)?;
        Ok(c)
    }

    #[test]
    fn echoed_output_items_become_one_assistant_turn_and_tool_messages() {
        let c = convert(json!([
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "input_text", "text": "weather "}, {"type": "input_text", "text": "in Paris?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "look it up"}], "encrypted_content": null},
            {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}", "status": "completed"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}
        ]))
        .expect("valid");
        let mut args = Map::new();
        args.insert("city".into(), json!("Paris"));
        assert_eq!(
            c.messages,
            vec![
                ChatMessage::system("be brief"),
                ChatMessage::user("weather in Paris?"),
                ChatMessage::assistant_with_reasoning("Checking.", "look it up")
                    .with_tool_calls(vec![ToolCall::new("get_weather", args)]),
                ChatMessage::tool("sunny"),
            ]
        );
        assert_eq!(c.call_ids, vec!["call_1".to_string()]);
        let all = assemble(Some("You are terse."), &c.messages).expect("has a user message");
        assert_eq!(all[0], ChatMessage::system("You are terse.\n\nbe brief"));
        assert_eq!(all.len(), 4);
        assert_eq!(
            assemble(None, &[ChatMessage::user("x")]).expect("ok"),
            vec![ChatMessage::user("x")]
        );
    }

    #[test]
    fn errors_name_the_path() {
        let bad = |v: Value| convert(v).expect_err("should fail");
        assert_eq!(bad(json!(5)), "input");
        assert_eq!(bad(json!([])), "input");
        assert_eq!(
            bad(json!([{"role": "tool", "content": "x"}])),
            "input[0].role"
        );
        assert_eq!(bad(json!([{"role": "user"}])), "input[0].content");
        assert_eq!(
            bad(json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])),
            "input[0].content[0].type"
        );
        assert_eq!(
            bad(json!([{"type": "function_call_output", "call_id": "nope", "output": "x"}])),
            "input[0].call_id"
        );
        assert_eq!(
            bad(
                json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}])
            ),
            "input[0].arguments"
        );
        assert_eq!(
            bad(
                json!([{"type": "function_call", "call_id": "c", "name": "a b", "arguments": "{}"}])
            ),
            "input[0].name"
        );
        assert_eq!(
            bad(json!([{"type": "item_reference", "id": "msg_1"}])),
            "input[0].type"
        );
        assert_eq!(
            bad(json!([{"type": "web_search_call", "id": "ws"}])),
            "input[0].type"
        );
        assert_eq!(
            bad(json!([{"role": "user", "content": "q"}, {"role": "system", "content": "late"}])),
            "input[1].role"
        );
        let only_assistant =
            convert(json!([{"role": "assistant", "content": "hi"}])).expect("converts");
        assert_eq!(
            assemble(None, &only_assistant.messages).map_err(param_of),
            Err("input".to_string())
        );
    }

    #[test]
    fn tools_in_the_responses_shape() {
        let tools = json!([{"type": "function", "name": "get_weather", "description": "Weather.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": true}]);
        let t = tool_request(Some(&tools), None, None).expect("valid");
        assert_eq!(
            t.definitions,
            vec![
                json!({"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": tools[0]["parameters"]}})
            ]
        );
        assert_eq!((t.choice.clone(), t.parallel), (ToolChoice::Auto, true));
        let named = tool_request(
            Some(&tools),
            Some(&json!({"type": "function", "name": "get_weather"})),
            Some(false),
        )
        .expect("valid");
        assert_eq!(
            (named.choice, named.parallel),
            (ToolChoice::Function("get_weather".into()), false)
        );
        let bad = |tools: Value, choice: Value| {
            param_of(tool_request(Some(&tools), Some(&choice), None).expect_err("should fail"))
        };
        assert_eq!(
            bad(json!([{"type": "web_search"}]), Value::Null),
            "tools[0].type"
        );
        assert_eq!(
            bad(json!([{"type": "function"}]), Value::Null),
            "tools[0].name"
        );
        assert_eq!(
            bad(
                json!([{"type": "function", "name": "f", "parameters": []}]),
                Value::Null
            ),
            "tools[0].parameters"
        );
        assert_eq!(
            bad(tools.clone(), json!({"type": "function", "name": "nope"})),
            "tool_choice.name"
        );
        assert_eq!(
            bad(tools.clone(), json!({"type": "allowed_tools"})),
            "tool_choice.type"
        );
        assert_eq!(bad(json!([]), json!("required")), "tool_choice");
    }

    #[test]
    fn text_formats() {
        assert_eq!(text_format(None).expect("ok"), None);
        assert_eq!(
            text_format(Some(
                &json!({"format": {"type": "text"}, "verbosity": "low"})
            ))
            .expect("ok"),
            None
        );
        assert_eq!(
            text_format(Some(&json!({"format": {"type": "json_object"}}))).expect("ok"),
            Some(ConstraintSpec::JsonObject)
        );
        let s = json!({"type": "object"});
        assert_eq!(
            text_format(Some(&json!({"format": {"type": "json_schema", "name": "x", "strict": true, "schema": s}}))).expect("ok"),
            Some(ConstraintSpec::JsonSchema(s))
        );
        let bad = |v: Value| param_of(text_format(Some(&v)).expect_err("should fail"));
        assert_eq!(bad(json!({"format": {"type": "yaml"}})), "text.format.type");
        assert_eq!(
            bad(json!({"format": {"type": "json_schema", "name": "x"}})),
            "text.format.schema"
        );
        assert_eq!(
            bad(json!({"format": {"type": "json_schema", "schema": {}, "json_schema": {}}})),
            "text.format.json_schema"
        );
        assert_eq!(bad(json!({"colour": 1})), "text.colour");
    }
}
