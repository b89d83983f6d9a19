//! `response_format` on `/v1/chat/completions` and `/v1/completions`: `text` (free text),
//! `json_object` (any JSON object) and `json_schema` (JSON conforming to the schema, with or
//! without `strict`: both are enforced by constrained decoding), turned into a compiled
//! per-sequence [`SequenceConstraint`]. An invalid schema, or one using a JSON-schema feature
//! the grammar engine does not support, is a 400 with `param: "response_format"` and the
//! engine's reason.

use super::AppState;
use super::error::ApiError;
use crate::constraint::{
    ConstraintError, ConstraintSpec, Grammars, SequenceConstraint, StartOptions,
};
use serde_json::Value;
use std::sync::Arc;

const PARAM: &str = "response_format";

/// Keys accepted inside `response_format.json_schema`.
const JSON_SCHEMA_KEYS: &[&str] = &["name", "schema", "strict", "description"];

/// The constraint `response_format` asks for; `None` for free text (absent, null or `text`).
pub fn constraint_spec(v: Option<&Value>) -> Result<Option<ConstraintSpec>, ApiError> {
    let obj = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(o)) => o,
        Some(_) => {
            return Err(ApiError::invalid(
                "response_format must be an object.",
                PARAM,
            ));
        }
    };
    let kind = match obj.get("type") {
        None => return Err(ApiError::missing("response_format.type")),
        Some(Value::String(s)) => s.as_str(),
        Some(_) => {
            return Err(ApiError::invalid(
                "response_format.type must be a string.",
                "response_format.type",
            ));
        }
    };
    let allowed: &[&str] = if kind == "json_schema" {
        &["type", "json_schema"]
    } else {
        &["type"]
    };
    if let Some(k) = obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(ApiError::invalid(
            format!("Unrecognized field in response_format of type {kind}: {k}"),
            format!("response_format.{k}"),
        ));
    }
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(ConstraintSpec::JsonObject)),
        "json_schema" => {
            let js = match obj.get("json_schema") {
                None | Some(Value::Null) => {
                    return Err(ApiError::missing("response_format.json_schema"));
                }
                Some(Value::Object(js)) => js,
                Some(_) => {
                    return Err(ApiError::invalid(
                        "response_format.json_schema must be an object.",
                        "response_format.json_schema",
                    ));
                }
            };
            if let Some(k) = js.keys().find(|k| !JSON_SCHEMA_KEYS.contains(&k.as_str())) {
                return Err(ApiError::invalid(
                    format!("Unrecognized field in response_format.json_schema: {k}"),
                    format!("response_format.json_schema.{k}"),
                ));
            }
            for (key, ok) in [
                ("name", Value::is_string as fn(&Value) -> bool),
                ("description", Value::is_string),
                ("strict", Value::is_boolean),
            ] {
                if js.get(key).is_some_and(|v| !v.is_null() && !ok(v)) {
                    let what = if key == "strict" {
                        "a boolean"
                    } else {
                        "a string"
                    };
                    return Err(ApiError::invalid(
                        format!("response_format.json_schema.{key} must be {what}."),
                        format!("response_format.json_schema.{key}"),
                    ));
                }
            }
            match js.get("schema") {
                None | Some(Value::Null) => {
                    Err(ApiError::missing("response_format.json_schema.schema"))
                }
                Some(s @ Value::Object(_)) => Ok(Some(ConstraintSpec::JsonSchema(s.clone()))),
                Some(_) => Err(ApiError::invalid(
                    "response_format.json_schema.schema must be a JSON schema object.",
                    "response_format.json_schema.schema",
                )),
            }
        }
        other => Err(ApiError::invalid(
            format!(
                "Unsupported response_format type '{other}': expected text, json_object or json_schema."
            ),
            "response_format.type",
        )),
    }
}

/// A constraint error as the API reports it: the request's fault (400 naming `param`) or ours.
pub fn api_error(e: ConstraintError, param: &str) -> ApiError {
    match e {
        ConstraintError::Grammar { .. } | ConstraintError::Tool { .. } => {
            ApiError::invalid(format!("Invalid {param}: {e}"), param)
        }
        ConstraintError::Vocabulary { .. } | ConstraintError::Matcher { .. } => {
            ApiError::Internal(e.to_string())
        }
    }
}

/// Compiles `spec` in the bounded tokeniser pool (compiling a schema, and building the
/// grammar engine on first use, is CPU work that must not block the async runtime).
pub async fn compile(
    app: &AppState,
    grammars: &Arc<Grammars>,
    spec: ConstraintSpec,
    start: StartOptions,
    param: &'static str,
) -> Result<Box<SequenceConstraint>, ApiError> {
    let size = match &spec {
        ConstraintSpec::JsonObject => 16,
        ConstraintSpec::JsonSchema(s) => s.to_string().len(),
        ConstraintSpec::Lark(g) => g.len(),
    };
    let grammars = Arc::clone(grammars);
    app.admission
        .tokenize(size, move || grammars.compile(&spec, start))
        .await?
        .map(Box::new)
        .map_err(|e| api_error(e, param))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn param(v: Value) -> Option<String> {
        constraint_spec(Some(&v)).expect_err("should fail").body()["error"]["param"]
            .as_str()
            .map(str::to_string)
    }

    #[test]
    fn kinds() {
        assert_eq!(constraint_spec(None).unwrap(), None);
        assert_eq!(
            constraint_spec(Some(&json!({"type": "text"}))).unwrap(),
            None
        );
        assert_eq!(
            constraint_spec(Some(&json!({"type": "json_object"}))).unwrap(),
            Some(ConstraintSpec::JsonObject)
        );
        let s = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let rf = json!({"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": s}});
        assert_eq!(
            constraint_spec(Some(&rf)).unwrap(),
            Some(ConstraintSpec::JsonSchema(s))
        );
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(param(json!("json")), Some("response_format".into()));
        assert_eq!(param(json!({})), Some("response_format.type".into()));
        assert_eq!(
            param(json!({"type": "yaml"})),
            Some("response_format.type".into())
        );
        assert_eq!(
            param(json!({"type": "json_schema"})),
            Some("response_format.json_schema".into())
        );
        assert_eq!(
            param(json!({"type": "json_schema", "json_schema": {"name": "x"}})),
            Some("response_format.json_schema.schema".into())
        );
        assert_eq!(
            param(json!({"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}})),
            Some("response_format.json_schema.strict".into())
        );
        assert_eq!(
            param(json!({"type": "json_schema", "json_schema": {"schema": {}, "colour": 1}})),
            Some("response_format.json_schema.colour".into())
        );
        assert_eq!(
            param(json!({"type": "json_object", "schema": {}})),
            Some("response_format.schema".into())
        );
    }
}
