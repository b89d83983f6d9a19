//! Anthropic tool definitions and `tool_choice` to the server's [`ToolRequest`], the one the
//! OpenAI route builds, so both APIs share the rest: the definitions are rendered as OpenAI
//! function tools (`{"type": "function", "function": {name, description, parameters}}`,
//! `parameters` being the tool's `input_schema`) by `chat_template::render_with_tools`, replies
//! are parsed by `crate::tool_calls::ToolCallParser`, and the forced choices are compiled by
//! `http::tools::forced_constraint` (`crate::constraint::tool_call_constraint`).
//!
//! Mapping of `tool_choice`: `auto` → the model decides (the default with tools), `any` → at
//! least one call to any tool (OpenAI's `required`), `tool` → a call to the named tool, `none` →
//! the tools are still rendered (as on the OpenAI route) but the reply is not parsed for calls.
//! `disable_parallel_tool_use: true` allows one call (the grammar and the parser both stop at
//! one); without it several calls may follow each other. Only custom tools (absent `type` or
//! `"custom"`) are accepted: server tools (web search, bash, text editor, …) are refused naming
//! `tools[i].type`.

use crate::http::error::ApiError;
use crate::http::json::{object, only_keys, string};
use crate::http::tools::{ToolChoice, ToolRequest, check_name};
use crate::tool_calls::ToolSpec;
use serde_json::{Map, Value, json};

/// Validates `tools` and `tool_choice`.
pub fn tool_request(
    tools: Option<&Value>,
    tool_choice: Option<&Value>,
) -> Result<ToolRequest, ApiError> {
    let list = crate::http::tools::tool_list(tools)?;
    let mut definitions = Vec::with_capacity(list.len());
    let mut specs: Vec<ToolSpec> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let (definition, spec) = tool(i, t)?;
        if specs.iter().any(|s| s.name == spec.name) {
            return Err(ApiError::invalid(
                format!("Duplicate tool name '{}'.", spec.name),
                format!("tools[{i}].name"),
            ));
        }
        definitions.push(definition);
        specs.push(spec);
    }
    let (choice, parallel) = choice(tool_choice, &specs)?;
    Ok(ToolRequest {
        definitions,
        specs,
        choice,
        parallel,
    })
}

/// One custom tool: its definition as an OpenAI function tool, and its parser spec.
fn tool(i: usize, t: &Value) -> Result<(Value, ToolSpec), ApiError> {
    let at = format!("tools[{i}]");
    let obj = object(t, &at)?;
    match obj.get("type") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "custom" => {}
        Some(Value::String(s)) => {
            return Err(ApiError::unsupported(
                format!(
                    "Tool type '{s}' is not supported: only custom tools (name, description, input_schema)."
                ),
                format!("{at}.type"),
            ));
        }
        Some(_) => {
            return Err(ApiError::invalid(
                format!("{at}.type must be a string."),
                format!("{at}.type"),
            ));
        }
    }
    only_keys(
        obj,
        &[
            "type",
            "name",
            "description",
            "input_schema",
            "cache_control",
            "strict",
        ],
        &at,
    )?;
    let name = string(obj, "name", &at)?;
    check_name(name, &format!("{at}.name"))?;
    let description = match obj.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            return Err(ApiError::invalid(
                format!("{at}.description must be a string."),
                format!("{at}.description"),
            ));
        }
    };
    if obj
        .get("strict")
        .is_some_and(|s| !s.is_boolean() && !s.is_null())
    {
        return Err(ApiError::invalid(
            format!("{at}.strict must be a boolean."),
            format!("{at}.strict"),
        ));
    }
    let schema = match obj.get("input_schema") {
        None | Some(Value::Null) => return Err(ApiError::missing(&format!("{at}.input_schema"))),
        Some(Value::Object(s)) => s,
        Some(_) => {
            return Err(ApiError::invalid(
                format!("{at}.input_schema must be a JSON schema object."),
                format!("{at}.input_schema"),
            ));
        }
    };
    if let Some(kind) = schema.get("type")
        && kind.as_str() != Some("object")
    {
        return Err(ApiError::invalid(
            format!("{at}.input_schema.type must be \"object\" (a tool's input is an object)."),
            format!("{at}.input_schema.type"),
        ));
    }
    crate::http::tools::check_schema_types(
        &Value::Object(schema.clone()),
        &format!("{at}.input_schema"),
    )?;
    let mut function = Map::new();
    function.insert("name".into(), json!(name));
    if let Some(d) = description {
        function.insert("description".into(), json!(d));
    }
    function.insert("parameters".into(), Value::Object(schema.clone()));
    let definition = json!({ "type": "function", "function": function });
    let spec = ToolSpec {
        name: name.to_string(),
        parameters: Some(Value::Object(schema.clone())),
    };
    Ok((definition, spec))
}

/// `tool_choice` → (choice, parallel calls allowed).
fn choice(v: Option<&Value>, specs: &[ToolSpec]) -> Result<(ToolChoice, bool), ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        let choice = if specs.is_empty() {
            ToolChoice::None
        } else {
            ToolChoice::Auto
        };
        return Ok((choice, true));
    };
    let obj = object(v, "tool_choice")?;
    let kind = string(obj, "type", "tool_choice")?;
    let allowed: &[&str] = match kind {
        "none" => &["type"],
        "auto" | "any" => &["type", "disable_parallel_tool_use"],
        "tool" => &["type", "name", "disable_parallel_tool_use"],
        other => {
            return Err(ApiError::invalid(
                format!("Invalid tool_choice.type '{other}': expected auto, any, tool or none."),
                "tool_choice.type",
            ));
        }
    };
    only_keys(obj, allowed, "tool_choice")?;
    let parallel = match obj.get("disable_parallel_tool_use") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => !b,
        Some(_) => {
            return Err(ApiError::invalid(
                "tool_choice.disable_parallel_tool_use must be a boolean.",
                "tool_choice.disable_parallel_tool_use",
            ));
        }
    };
    let choice = match kind {
        "none" => ToolChoice::None,
        "auto" => ToolChoice::Auto,
        "any" => ToolChoice::Required,
        _ => {
            let name = string(obj, "name", "tool_choice")?;
            if !specs.iter().any(|s| s.name == name) {
                return Err(ApiError::invalid(
                    format!("tool_choice names tool '{name}', which is not in tools."),
                    "tool_choice.name",
                ));
            }
            ToolChoice::Function(name.to_string())
        }
    };
    if specs.is_empty() && matches!(choice, ToolChoice::Required | ToolChoice::Function(_)) {
        return Err(ApiError::invalid(
            format!("tool_choice type '{kind}' requires tools."),
            "tool_choice",
        ));
    }
    Ok((choice, parallel))
}

/// A fresh `tool_use` block id: `toolu_` and 24 random alphanumerics.
pub fn tool_use_id() -> String {
    crate::http::tools::random_id("toolu_")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::tools::forced_constraint;

    fn param_of(e: ApiError) -> String {
        e.body()["error"]["param"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    fn weather() -> Value {
        json!({"name": "get_weather", "description": "Weather of a city.", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}})
    }

    #[test]
    fn tools_render_as_function_tools() {
        let t = tool_request(Some(&json!([weather()])), None).expect("valid");
        assert_eq!(
            t.definitions,
            vec![
                json!({"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.", "parameters": weather()["input_schema"]}})
            ]
        );
        assert_eq!(t.specs[0].name, "get_weather");
        assert_eq!((t.choice.clone(), t.parallel), (ToolChoice::Auto, true));
        assert!(t.parser().is_some());
        assert!(matches!(forced_constraint(&t), Ok(None)));
        let none = tool_request(None, None).expect("no tools");
        assert_eq!(none.choice, ToolChoice::None);
        assert!(none.parser().is_none());
    }

    #[test]
    fn choices_map_to_openai_ones() {
        let tools = json!([weather(), {"name": "noop", "input_schema": {"type": "object"}}]);
        let c = |choice: Value| {
            let t = tool_request(Some(&tools), Some(&choice)).expect("valid");
            (t.choice, t.parallel)
        };
        assert_eq!(c(json!({"type": "auto"})), (ToolChoice::Auto, true));
        assert_eq!(
            c(json!({"type": "any", "disable_parallel_tool_use": true})),
            (ToolChoice::Required, false)
        );
        assert_eq!(
            c(json!({"type": "tool", "name": "noop"})),
            (ToolChoice::Function("noop".into()), true)
        );
        assert_eq!(c(json!({"type": "none"})), (ToolChoice::None, true));
        let forced = tool_request(Some(&tools), Some(&json!({"type": "any"}))).expect("valid");
        assert!(matches!(forced_constraint(&forced), Ok(Some(_))));
        assert!(tool_request(None, Some(&json!({"type": "auto"}))).is_ok());
        assert!(tool_request(Some(&json!([])), Some(&json!({"type": "none"}))).is_ok());
    }

    #[test]
    fn errors_name_the_field() {
        let bad = |tools: Value, choice: Value| {
            param_of(
                tool_request(Some(&tools), Some(&choice)).expect_err(&format!("{tools} {choice}")),
            )
        };
        let ok = json!([weather()]);
        let cases = [
            (json!({"a": 1}), Value::Null, "tools"),
            (
                json!([{"type": "web_search_20250305", "name": "web_search"}]),
                Value::Null,
                "tools[0].type",
            ),
            (json!([{"name": "f"}]), Value::Null, "tools[0].input_schema"),
            (
                json!([{"name": "f", "input_schema": []}]),
                Value::Null,
                "tools[0].input_schema",
            ),
            (
                json!([{"name": "f", "input_schema": {"type": "array"}}]),
                Value::Null,
                "tools[0].input_schema.type",
            ),
            (
                json!([{"name": "a b", "input_schema": {}}]),
                Value::Null,
                "tools[0].name",
            ),
            (json!([{"input_schema": {}}]), Value::Null, "tools[0].name"),
            (
                json!([{"name": "f", "input_schema": {}, "colour": 1}]),
                Value::Null,
                "tools[0].colour",
            ),
            (json!([weather(), weather()]), Value::Null, "tools[1].name"),
            (ok.clone(), json!("any"), "tool_choice"),
            (ok.clone(), json!({"type": "sometimes"}), "tool_choice.type"),
            (ok.clone(), json!({"type": "tool"}), "tool_choice.name"),
            (
                ok.clone(),
                json!({"type": "tool", "name": "nope"}),
                "tool_choice.name",
            ),
            (
                ok.clone(),
                json!({"type": "none", "disable_parallel_tool_use": true}),
                "tool_choice.disable_parallel_tool_use",
            ),
            (
                ok.clone(),
                json!({"type": "any", "disable_parallel_tool_use": "yes"}),
                "tool_choice.disable_parallel_tool_use",
            ),
            (json!([]), json!({"type": "any"}), "tool_choice"),
        ];
        for (tools, choice, param) in cases {
            assert_eq!(
                bad(tools.clone(), choice.clone()),
                param,
                "{tools} {choice}"
            );
        }
    }

    #[test]
    fn tool_use_ids_look_like_anthropics() {
        let (a, b) = (tool_use_id(), tool_use_id());
        assert!(a.starts_with("toolu_") && a.len() == 30, "{a}");
        assert!(a[6..].chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, b);
    }
}
