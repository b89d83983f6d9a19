//! A parameter value's JSON type from its tool's schema: the model writes every value as text
//! between `<parameter=…>` tags, and the schema says whether that text is a string or JSON.
//!
//! Rules (docs/tool-calling.md): the types are the property's `type` (a name or a list) plus the
//! `type`s of its `anyOf`/`oneOf` members. No non-string type (or no schema for the key) → the raw
//! text as a string. Otherwise the text, trimmed, is parsed as JSON and kept when its kind is one of
//! the types (`integer` needs an integral number); `True`/`False` (any case) count as booleans and
//! `None` as null, as the template writes Python values that way. Anything else falls back to the
//! raw string.

use serde_json::Value;

/// The typed value of parameter `key` of a tool whose `parameters` schema is `schema`.
pub fn typed_value(raw: &str, schema: Option<&Value>, key: &str) -> Value {
    let types = property_types(
        schema
            .and_then(|s| s.get("properties"))
            .and_then(|p| p.get(key)),
    );
    if types.iter().all(|t| *t == "string") {
        return Value::String(raw.to_string());
    }
    let text = raw.trim();
    let parsed = match text.to_ascii_lowercase().as_str() {
        "true" => Some(Value::Bool(true)),
        "false" => Some(Value::Bool(false)),
        "none" => Some(Value::Null),
        _ => serde_json::from_str::<Value>(text).ok(),
    };
    match parsed {
        Some(v) if types.iter().any(|t| kind_matches(&v, t)) => v,
        _ => Value::String(raw.to_string()),
    }
}

fn kind_matches(v: &Value, ty: &str) -> bool {
    match ty {
        "integer" => v.as_i64().is_some() || v.as_u64().is_some(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        "null" => v.is_null(),
        _ => false,
    }
}

/// The type names a property schema allows (empty when it names none).
fn property_types(prop: Option<&Value>) -> Vec<&str> {
    fn add<'a>(out: &mut Vec<&'a str>, t: Option<&'a Value>) {
        match t {
            Some(Value::String(s)) => out.push(s.as_str()),
            Some(Value::Array(list)) => out.extend(list.iter().filter_map(Value::as_str)),
            _ => {}
        }
    }
    let Some(prop) = prop else { return Vec::new() };
    let mut out = Vec::new();
    add(&mut out, prop.get("type"));
    for combo in ["anyOf", "oneOf"] {
        for member in prop
            .get(combo)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            add(&mut out, member.get("type"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {
            "s": {"type": "string"},
            "i": {"type": "integer"},
            "n": {"type": "number"},
            "b": {"type": "boolean"},
            "o": {"type": "object"},
            "a": {"type": "array"},
            "z": {"type": "null"},
            "sn": {"type": ["string", "null"]},
            "any": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
            "untyped": {"description": "no type"}
        }})
    }

    #[test]
    fn values_follow_the_schema() {
        let s = schema();
        let t = |raw: &str, key: &str| typed_value(raw, Some(&s), key);
        assert_eq!(t(" 42 ", "s"), json!(" 42 "));
        assert_eq!(t("42", "i"), json!(42));
        assert_eq!(t("4.5", "i"), json!("4.5"), "not integral: raw string");
        assert_eq!(t("4.5", "n"), json!(4.5));
        assert_eq!(t("-3", "n"), json!(-3));
        assert_eq!(t("true", "b"), json!(true));
        assert_eq!(t("False", "b"), json!(false));
        assert_eq!(t("yes", "b"), json!("yes"));
        assert_eq!(t("{\"k\": [1, 2]}", "o"), json!({"k": [1, 2]}));
        assert_eq!(t("{bad", "o"), json!("{bad"));
        assert_eq!(t("[1, \"x\"]", "a"), json!([1, "x"]));
        assert_eq!(t("null", "z"), json!(null));
        assert_eq!(t("None", "z"), json!(null));
        assert_eq!(t("null", "sn"), json!(null));
        assert_eq!(t("hello", "sn"), json!("hello"));
        assert_eq!(t("7", "any"), json!(7));
        assert_eq!(t("seven", "any"), json!("seven"));
        assert_eq!(t("7", "untyped"), json!("7"));
        assert_eq!(t("7", "not_in_schema"), json!("7"));
        assert_eq!(typed_value("7", None, "i"), json!("7"));
    }
}
