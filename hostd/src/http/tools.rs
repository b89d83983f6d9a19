//! The tool-calling fields of a chat request: `tools` (function tools only, validated),
//! `tool_choice`, `parallel_tool_calls`, and the `tool_calls` of assistant history messages.
//!
//! [`tool_request`] returns the validated tools — the list of (name, parameters schema) — and
//! the parsed [`ToolChoice`]; `required` and a named function are forced by constrained
//! decoding ([`forced_constraint`]).
//!
//! Decisions (docs/tool-calling.md): with `tool_choice: "none"` the tools are still rendered
//! into the prompt (as vLLM does by default) but the reply is not parsed for calls;
//! `parallel_tool_calls: false` keeps only the first call of a reply.

use super::error::ApiError;
use super::openai::ChatCompletionRequest;
use crate::chat_template::ToolCall;
use crate::constraint::{self, ConstraintSpec};
use crate::tool_calls::{ToolCallParser, ToolSpec};
use serde_json::{Map, Value};
use std::hash::{BuildHasher, Hasher};

/// Longest accepted function name (OpenAI allows 64; MCP-style names can be longer).
const MAX_NAME_LEN: usize = 128;

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Never call a tool (the default without tools).
    None,
    /// The model decides (the default with tools).
    Auto,
    /// The model must call at least one tool.
    Required,
    /// The model must call this function.
    Function(String),
}

/// The validated tool fields of one request.
#[derive(Debug, Clone)]
pub struct ToolRequest {
    /// The tool definitions as the client sent them (rendered with `tojson`, key order kept).
    pub definitions: Vec<Value>,
    /// Name and `parameters` schema of each tool, in order.
    pub specs: Vec<ToolSpec>,
    /// What the model may or must do.
    pub choice: ToolChoice,
    /// `parallel_tool_calls` (default true).
    pub parallel: bool,
}

impl ToolRequest {
    /// The parser for the reply, when calls are to be parsed (tools given, choice not `none`).
    pub fn parser(&self) -> Option<ToolCallParser> {
        (!self.specs.is_empty() && self.choice != ToolChoice::None)
            .then(|| ToolCallParser::new(self.specs.clone(), (!self.parallel).then_some(1)))
    }

    /// A whole reply's content as its text and its calls (name, arguments) when calls are
    /// parsed ([`ToolRequest::parser`]); else the content as it is and no calls.
    pub fn split_calls(&self, content: String) -> (String, Vec<(String, String)>) {
        match self.parser() {
            Some(mut parser) => {
                let mut events = parser.feed(&content);
                events.extend(parser.finish());
                crate::tool_calls::fold(events)
            }
            None => (content, Vec::new()),
        }
    }
}

/// Validates `tools`, `tool_choice` and `parallel_tool_calls` (forced choices included).
pub fn tool_request(req: &ChatCompletionRequest) -> Result<ToolRequest, ApiError> {
    let (definitions, specs) = match &req.tools {
        None | Some(Value::Null) => (Vec::new(), Vec::new()),
        Some(Value::Array(list)) => {
            let specs = list
                .iter()
                .enumerate()
                .map(|(i, t)| tool_spec(i, t))
                .collect::<Result<Vec<_>, _>>()?;
            for (i, s) in specs.iter().enumerate() {
                if specs[..i].iter().any(|o| o.name == s.name) {
                    return Err(ApiError::invalid(
                        format!("Duplicate tool name '{}'.", s.name),
                        format!("tools[{i}].function.name"),
                    ));
                }
            }
            (list.clone(), specs)
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "tools must be an array of tool definitions.",
                "tools",
            ));
        }
    };
    let choice = tool_choice(req.tool_choice.as_ref(), &specs, &CHAT_CHOICE)?;
    let parallel = match &req.parallel_tool_calls {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ApiError::invalid(
                "parallel_tool_calls must be a boolean.",
                "parallel_tool_calls",
            ));
        }
    };
    Ok(ToolRequest {
        definitions,
        specs,
        choice,
        parallel,
    })
}

/// The grammar that forces calls for `tool_choice` `required` or a named function (`None` for
/// `none`/`auto`): the Qwen3.6 XML call form with each argument valid against its schema
/// (`crate::constraint::tool_call_constraint`); several calls when `parallel_tool_calls`.
pub fn forced_constraint(req: &ToolRequest) -> Result<Option<ConstraintSpec>, ApiError> {
    let choice = match &req.choice {
        ToolChoice::None | ToolChoice::Auto => return Ok(None),
        ToolChoice::Required => constraint::ToolChoice::Required,
        ToolChoice::Function(name) => constraint::ToolChoice::Named(name),
    };
    let specs: Vec<constraint::ToolSpec<'_>> = req
        .specs
        .iter()
        .map(|s| constraint::ToolSpec {
            name: &s.name,
            parameters: s.parameters.as_ref(),
        })
        .collect();
    constraint::tool_call_constraint(&specs, choice, req.parallel)
        .map(Some)
        .map_err(|e| super::response_format::api_error(e, "tools"))
}

/// The grammar a reply follows and the field its errors name: a forced tool call's
/// ([`forced_constraint`], `tool_choice`), else the request's own output format `format`
/// (`format_param`: `response_format`, `text.format`). With both, the forced call wins: a
/// forced turn's reply is the call and has no text for the format to shape; the format
/// applies to the turns after it, where the client's tool_choice is no longer forced. That is
/// how OpenAI takes the combination, and what the OpenAI Agents SDK sends for an agent with an
/// `output_type` and `tool_choice="required"`.
pub fn output_constraint(
    req: &ToolRequest,
    format: Option<ConstraintSpec>,
    format_param: &'static str,
) -> Result<(Option<ConstraintSpec>, &'static str), ApiError> {
    match forced_constraint(req)? {
        Some(forced) => Ok((Some(forced), "tool_choice")),
        None => Ok((format, format_param)),
    }
}

/// The tool list of the Anthropic and Responses bodies (absent or null: none), or a 400
/// naming `tools`.
pub fn tool_list(tools: Option<&Value>) -> Result<&[Value], ApiError> {
    match tools {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(list)) => Ok(list.as_slice()),
        Some(_) => Err(ApiError::invalid("tools must be a list of tools.", "tools")),
    }
}

fn tool_spec(i: usize, tool: &Value) -> Result<ToolSpec, ApiError> {
    let at = |f: &str| format!("tools[{i}]{f}");
    let obj = tool
        .as_object()
        .ok_or_else(|| ApiError::invalid("A tool must be an object.", at("")))?;
    match obj.get("type") {
        Some(Value::String(t)) if t == "function" => {}
        Some(Value::String(t)) => {
            return Err(ApiError::unsupported(
                format!("Tool type '{t}' is not supported: only \"function\" tools."),
                at(".type"),
            ));
        }
        None => return Err(ApiError::missing(&at(".type"))),
        Some(_) => {
            return Err(ApiError::invalid(
                "A tool's type must be a string.",
                at(".type"),
            ));
        }
    }
    if let Some(key) = obj
        .keys()
        .find(|k| !matches!(k.as_str(), "type" | "function"))
    {
        return Err(ApiError::invalid(
            format!("Unrecognized tool field: {key}"),
            at(&format!(".{key}")),
        ));
    }
    let f = match obj.get("function") {
        Some(Value::Object(f)) => f,
        None => return Err(ApiError::missing(&at(".function"))),
        Some(_) => {
            return Err(ApiError::invalid(
                "function must be an object.",
                at(".function"),
            ));
        }
    };
    for (key, v) in f {
        let ok = match key.as_str() {
            "name" => true,
            "description" => v.is_string() || v.is_null(),
            "parameters" => v.is_object() || v.is_null(),
            "strict" => v.is_boolean() || v.is_null(),
            _ => {
                return Err(ApiError::invalid(
                    format!("Unrecognized function field: {key}"),
                    at(&format!(".function.{key}")),
                ));
            }
        };
        if !ok {
            let want = match key.as_str() {
                "parameters" => "a JSON schema object",
                "strict" => "a boolean",
                _ => "a string",
            };
            return Err(ApiError::invalid(
                format!("function.{key} must be {want}."),
                at(&format!(".function.{key}")),
            ));
        }
    }
    let name = match f.get("name") {
        Some(Value::String(n)) => n.clone(),
        None => return Err(ApiError::missing(&at(".function.name"))),
        Some(_) => {
            return Err(ApiError::invalid(
                "function.name must be a string.",
                at(".function.name"),
            ));
        }
    };
    check_name(&name, &at(".function.name"))?;
    if let Some(p) = f.get("parameters") {
        check_schema_types(p, &at(".function.parameters"))?;
    }
    Ok(ToolSpec {
        name,
        parameters: f.get("parameters").filter(|p| p.is_object()).cloned(),
    })
}

/// JSON Schema's type names.
const SCHEMA_TYPES: [&str; 7] = [
    "string", "number", "integer", "boolean", "object", "array", "null",
];

/// Checks every `type` in a tool's parameter schema (at `param`) names a JSON Schema type, so a
/// malformed schema (`"type": "strin"`) gets the same 400 under `tool_choice: "auto"` as when
/// the call is forced and its grammar is built from the schema. Walks the schema positions only
/// (a property *named* `type` is not a type).
pub fn check_schema_types(schema: &Value, param: &str) -> Result<(), ApiError> {
    let Value::Object(obj) = schema else {
        return Ok(());
    };
    let ok = match obj.get("type") {
        None => true,
        Some(Value::String(t)) => SCHEMA_TYPES.contains(&t.as_str()),
        Some(Value::Array(ts)) => ts
            .iter()
            .all(|t| t.as_str().is_some_and(|t| SCHEMA_TYPES.contains(&t))),
        Some(_) => false,
    };
    if !ok {
        return Err(ApiError::invalid(
            format!(
                "Invalid schema: type {} is not one of {}.",
                obj["type"],
                SCHEMA_TYPES.join(", ")
            ),
            format!("{param}.type"),
        ));
    }
    for key in ["properties", "patternProperties", "$defs", "definitions"] {
        if let Some(Value::Object(m)) = obj.get(key) {
            for (k, sub) in m {
                check_schema_types(sub, &format!("{param}.{key}.{k}"))?;
            }
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems", "items"] {
        match obj.get(key) {
            Some(Value::Array(list)) => {
                for (i, sub) in list.iter().enumerate() {
                    check_schema_types(sub, &format!("{param}.{key}[{i}]"))?;
                }
            }
            Some(sub) => check_schema_types(sub, &format!("{param}.{key}"))?,
            None => {}
        }
    }
    for key in [
        "additionalProperties",
        "not",
        "if",
        "then",
        "else",
        "contains",
    ] {
        if let Some(sub) = obj.get(key) {
            check_schema_types(sub, &format!("{param}.{key}"))?;
        }
    }
    Ok(())
}

/// Names go into the prompt as `<function=NAME>`: 1–128 of `A-Z a-z 0-9 _ - . :`.
pub fn check_name(name: &str, param: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(
            format!(
                "Invalid function name {name:?}: use 1 to {MAX_NAME_LEN} of the characters a-z, A-Z, 0-9, _, -, . and :."
            ),
            param,
        ))
    }
}

/// Where an API's `tool_choice` differs in shape and wording (chat puts the name at
/// `function.name`, Responses at `name`); the reading itself is [`tool_choice`]'s, shared.
pub struct ChoiceShape {
    /// The accepted strings, as the invalid-string error lists them.
    pub expected: &'static str,
    /// Reads the function name of `{type: "function", …}` (its errors name the field).
    pub name: fn(&Map<String, Value>) -> Result<&str, ApiError>,
    /// The field a name that is not in `tools` is reported on.
    pub name_param: &'static str,
    /// Appended to the unsupported-type error.
    pub other_types: &'static str,
}

/// Chat Completions: `{type: "function", function: {name}}`.
const CHAT_CHOICE: ChoiceShape = ChoiceShape {
    expected: "\"none\", \"auto\", \"required\" or a function",
    name: |o| {
        o.get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::missing("tool_choice.function.name"))
    },
    name_param: "tool_choice",
    other_types: "",
};

/// `tool_choice`: `none`, `auto`, `required` or a named function in `shape`'s form; absent is
/// `auto` with tools and `none` without; `required` and a function need tools.
pub fn tool_choice(
    v: Option<&Value>,
    specs: &[ToolSpec],
    shape: &ChoiceShape,
) -> Result<ToolChoice, ApiError> {
    let choice = match v {
        None | Some(Value::Null) => {
            return Ok(if specs.is_empty() {
                ToolChoice::None
            } else {
                ToolChoice::Auto
            });
        }
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(
                    format!(
                        "Invalid tool_choice '{other}': expected {}.",
                        shape.expected
                    ),
                    "tool_choice",
                ));
            }
        },
        Some(Value::Object(o)) => match o.get("type").and_then(Value::as_str) {
            Some("function") => {
                let name = (shape.name)(o)?;
                if !specs.iter().any(|s| s.name == name) {
                    return Err(ApiError::invalid(
                        format!("tool_choice names function '{name}', which is not in tools."),
                        shape.name_param,
                    ));
                }
                ToolChoice::Function(name.to_string())
            }
            Some(other) => {
                return Err(ApiError::unsupported(
                    format!(
                        "tool_choice type '{other}' is not supported{}.",
                        shape.other_types
                    ),
                    "tool_choice.type",
                ));
            }
            None => return Err(ApiError::missing("tool_choice.type")),
        },
        Some(_) => {
            return Err(ApiError::invalid(
                "tool_choice must be a string or an object.",
                "tool_choice",
            ));
        }
    };
    if specs.is_empty() && matches!(choice, ToolChoice::Required | ToolChoice::Function(_)) {
        return Err(ApiError::invalid(
            "tool_choice requires tools.",
            "tool_choice",
        ));
    }
    Ok(choice)
}

/// The `tool_calls` of assistant history message `i`: `[{id, type: "function", function:
/// {name, arguments}}]`, arguments a JSON object or a string holding one (OpenAI's wire form).
pub fn history_tool_calls(i: usize, v: &Value) -> Result<Vec<ToolCall>, ApiError> {
    let list = match v {
        Value::Null => return Ok(Vec::new()),
        Value::Array(list) => list,
        _ => {
            return Err(ApiError::invalid(
                "tool_calls must be an array.",
                format!("messages[{i}].tool_calls"),
            ));
        }
    };
    let mut out = Vec::with_capacity(list.len());
    for (j, call) in list.iter().enumerate() {
        let at = |f: &str| format!("messages[{i}].tool_calls[{j}]{f}");
        let obj = call
            .as_object()
            .ok_or_else(|| ApiError::invalid("A tool call must be an object.", at("")))?;
        if let Some(t) = obj.get("type").filter(|t| !t.is_null())
            && t.as_str() != Some("function")
        {
            return Err(ApiError::unsupported(
                "Only tool calls of type \"function\" are supported.",
                at(".type"),
            ));
        }
        if obj
            .get("id")
            .is_some_and(|id| !id.is_string() && !id.is_null())
        {
            return Err(ApiError::invalid(
                "A tool call's id must be a string.",
                at(".id"),
            ));
        }
        let f = obj
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| ApiError::missing(&at(".function")))?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::missing(&at(".function.name")))?;
        check_name(name, &at(".function.name"))?;
        let arguments = match f.get("arguments") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                Ok(Value::Object(m)) => m,
                _ => {
                    return Err(ApiError::invalid(
                        format!(
                            "messages[{i}].tool_calls[{j}].function.arguments must be a JSON object (or a string holding one)."
                        ),
                        at(".function.arguments"),
                    ));
                }
            },
            Some(_) => {
                return Err(ApiError::invalid(
                    format!(
                        "messages[{i}].tool_calls[{j}].function.arguments must be a JSON object (or a string holding one)."
                    ),
                    at(".function.arguments"),
                ));
            }
        };
        out.push(ToolCall::new(name, arguments));
    }
    Ok(out)
}

/// A fresh tool-call id: `call_` and 24 random alphanumerics.
pub fn call_id() -> String {
    random_id("call_")
}

/// `prefix` and 24 random alphanumerics (tool-call ids of both APIs).
pub fn random_id(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::from(prefix);
    let mut bits = 0u64;
    for i in 0..24 {
        if i % 8 == 0 {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_usize(i);
            bits = h.finish();
        }
        out.push(ALPHABET[(bits % ALPHABET.len() as u64) as usize] as char);
        bits /= ALPHABET.len() as u64;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn req(extra: Value) -> ChatCompletionRequest {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(body).expect("request parses")
    }

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}})
    }

    fn param_of(e: ApiError) -> (u16, String) {
        (
            e.status().as_u16(),
            e.body()["error"]["param"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        )
    }

    /// Issue 39 (e): a schema with a misspelt type is refused under `auto` too, naming where;
    /// a property named `type` is not a type; and a forced choice with a response format is
    /// taken, the forced call winning (issue 39 (b)).
    #[test]
    fn malformed_schemas_are_refused_whatever_the_choice_and_forced_calls_take_a_format() {
        let tool = |props: Value| json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": props}}});
        for choice in ["auto", "none", "required"] {
            let bad = req(
                json!({"tools": [tool(json!({"a": {"type": "strin"}}))], "tool_choice": choice}),
            );
            assert_eq!(
                param_of(tool_request(&bad).unwrap_err()),
                (
                    400,
                    "tools[0].function.parameters.properties.a.type".to_string()
                ),
                "{choice}"
            );
        }
        let nested = req(
            json!({"tools": [tool(json!({"a": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": ["null", "int"]}]}}}))]}),
        );
        assert_eq!(
            param_of(tool_request(&nested).unwrap_err()).1,
            "tools[0].function.parameters.properties.a.items.anyOf[1].type"
        );
        let named_type = req(
            json!({"tools": [tool(json!({"type": {"type": "string"}, "n": {"type": ["integer", "null"]}}))]}),
        );
        assert!(tool_request(&named_type).is_ok());
        let forced = tool_request(&req(
            json!({"tools": [weather()], "tool_choice": "required"}),
        ))
        .unwrap();
        let format = Some(ConstraintSpec::Lark("start: \"x\"".into()));
        let (spec, param) = output_constraint(&forced, format.clone(), "response_format").unwrap();
        assert_eq!(param, "tool_choice");
        assert!(
            spec.is_some() && spec != format,
            "the forced call's grammar, not the format"
        );
        let auto = tool_request(&req(json!({"tools": [weather()]}))).unwrap();
        assert_eq!(
            output_constraint(&auto, format.clone(), "response_format").unwrap(),
            (format, "response_format")
        );
    }

    #[test]
    fn tools_and_choices_parse() {
        let t = tool_request(&req(json!({"tools": [weather()]}))).unwrap();
        assert_eq!(t.choice, ToolChoice::Auto);
        assert_eq!(t.specs[0].name, "get_weather");
        assert!(t.parallel && t.parser().is_some());
        let t = tool_request(&req(json!({"tools": [weather()], "tool_choice": "none"}))).unwrap();
        assert!(t.parser().is_none() && t.definitions.len() == 1);
        let t = tool_request(&req(
            json!({"tools": [weather()], "tool_choice": "required", "parallel_tool_calls": false}),
        ))
        .unwrap();
        assert_eq!(t.choice, ToolChoice::Required);
        assert!(!t.parallel);
        let t = tool_request(&req(json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})))
            .unwrap();
        assert_eq!(t.choice, ToolChoice::Function("get_weather".into()));
        assert!(matches!(
            forced_constraint(&t),
            Ok(Some(ConstraintSpec::Lark(_)))
        ));
        let auto = tool_request(&req(json!({"tools": [weather()]}))).unwrap();
        assert!(matches!(forced_constraint(&auto), Ok(None)));
        assert_eq!(
            tool_request(&req(json!({}))).unwrap().choice,
            ToolChoice::None
        );
    }

    #[test]
    fn bad_tools_name_the_field() {
        let cases = [
            (json!({"tools": {"a": 1}}), "tools"),
            (json!({"tools": [{"type": "web_search"}]}), "tools[0].type"),
            (
                json!({"tools": [{"function": {"name": "x"}}]}),
                "tools[0].type",
            ),
            (
                json!({"tools": [{"type": "function"}]}),
                "tools[0].function",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}),
                "tools[0].function.name",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "x", "parameters": []}}]}),
                "tools[0].function.parameters",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "x", "colour": 1}}]}),
                "tools[0].function.colour",
            ),
            (
                json!({"tools": [weather(), weather()]}),
                "tools[1].function.name",
            ),
            (
                json!({"tools": [weather()], "tool_choice": "sometimes"}),
                "tool_choice",
            ),
            (
                json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
                "tool_choice",
            ),
            (json!({"tool_choice": "required"}), "tool_choice"),
            (
                json!({"tools": [weather()], "parallel_tool_calls": "yes"}),
                "parallel_tool_calls",
            ),
        ];
        for (extra, param) in cases {
            let e = tool_request(&req(extra.clone())).expect_err(&extra.to_string());
            assert_eq!(param_of(e), (400, param.to_string()), "{extra}");
        }
    }

    #[test]
    fn history_calls_accept_string_and_object_arguments() {
        let calls = history_tool_calls(
            1,
            &json!([
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": \"x\"}"}},
                {"type": "function", "function": {"name": "g", "arguments": {"z": [true]}}}
            ]),
        )
        .unwrap();
        assert_eq!(calls[0].name, "f");
        assert_eq!(
            Value::Object(calls[0].arguments.clone().unwrap()).to_string(),
            r#"{"b":1,"a":"x"}"#,
            "order kept"
        );
        assert_eq!(calls[1].arguments.as_ref().unwrap()["z"], json!([true]));
        assert!(history_tool_calls(0, &json!([])).unwrap().is_empty());
        let e = history_tool_calls(3, &json!([{"function": {"name": "f", "arguments": "[1]"}}]))
            .unwrap_err();
        assert_eq!(
            param_of(e.clone()),
            (400, "messages[3].tool_calls[0].function.arguments".into())
        );
        assert!(
            e.body()["error"]["message"]
                .as_str()
                .unwrap()
                .contains("messages[3]")
        );
        let e = history_tool_calls(
            0,
            &json!([{"function": {"name": "f", "arguments": "{oops"}}]),
        )
        .unwrap_err();
        assert_eq!(
            param_of(e),
            (400, "messages[0].tool_calls[0].function.arguments".into())
        );
    }

    #[test]
    fn call_ids_look_like_openais() {
        let a = call_id();
        let b = call_id();
        assert_eq!(a.len(), 29);
        assert!(a.starts_with("call_") && a[5..].chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, b);
    }
}
