//! A parameter value's JSON type from its tool's schema: the model writes every value as text
//! between `<parameter=…>` tags, and the schema says whether that text is a string or JSON.
//!
//! Rules (docs/tool-calling.md): the types are the property's `type` (a name or a list) plus the
//! `type`s of its `anyOf`/`oneOf` members. Only `string` types, or no type but string
//! `enum`/`const` values ([`is_raw_text`]), or no schema for the key → the raw text as a string.
//! Otherwise the text, trimmed, is parsed as JSON and kept when its kind is one of the types (any
//! kind when the schema names no type; `integer` needs an integral number); `True`/`False` (any case) count as booleans and
//! `None` as null, as the template writes Python values that way. A JSON string counts as a
//! `string` (a nullable string written as JSON, as forced calls do). Anything else falls back to the
//! raw string.

use serde_json::Value;

/// The typed value of parameter `key` of a tool whose `parameters` schema is `schema`.
pub fn typed_value(raw: &str, schema: Option<&Value>, key: &str) -> Value {
    let prop = schema
        .and_then(|s| s.get("properties"))
        .and_then(|p| p.get(key));
    // No schema for the key: the template writes strings raw, so the text is a string.
    if prop.is_none_or(is_raw_text) {
        return Value::String(raw.to_string());
    }
    let types = property_types(prop);
    let text = raw.trim();
    let parsed = match text.to_ascii_lowercase().as_str() {
        "true" => Some(Value::Bool(true)),
        "false" => Some(Value::Bool(false)),
        "none" => Some(Value::Null),
        _ => serde_json::from_str::<Value>(text).ok(),
    };
    match parsed {
        // A schema that names no type takes any JSON value.
        Some(v) if types.is_empty() || types.iter().any(|t| kind_matches(&v, t)) => v,
        _ => Value::String(raw.to_string()),
    }
}

/// [`typed_value`] of a value whose text may be cut short (the reply ended inside it): the
/// typed value when the text is a whole value of the parameter's type (or the parameter is raw
/// text, where any prefix is a string), `None` when it is not, so the caller drops it rather
/// than report half-written JSON as a string.
pub(super) fn typed_value_if_complete(
    raw: &str,
    schema: Option<&Value>,
    key: &str,
) -> Option<Value> {
    let prop = schema
        .and_then(|s| s.get("properties"))
        .and_then(|p| p.get(key));
    if prop.is_none_or(is_raw_text) {
        return Some(Value::String(raw.to_string()));
    }
    let v = typed_value(raw, schema, key);
    let parsed = serde_json::from_str::<Value>(raw.trim()).is_ok();
    // A string that did not parse is the raw text: whole only where the schema allows a
    // string written raw, and not when it opened a JSON string it never closed.
    let whole = !v.is_string()
        || parsed
        || (property_types(prop).contains(&"string") && !raw.trim_start().starts_with('"'));
    whole.then_some(v)
}

fn kind_matches(v: &Value, ty: &str) -> bool {
    match ty {
        "integer" => v.as_i64().is_some() || v.as_u64().is_some(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        "null" => v.is_null(),
        // A JSON string where the schema also allows others (`["string", "null"]`): how a
        // forced call writes it (`"text"`), and how a model may quote it.
        "string" => v.is_string(),
        _ => false,
    }
}

/// Whether a parameter with this property schema is written as raw text rather than JSON: every
/// type it names (`type`, and the `type`s of `anyOf`/`oneOf` members) is `string`; or it names
/// none and its `enum`/`const` values are all strings. A schema that says nothing of its type
/// (`{}`, a `$ref`, `allOf`) is read as JSON when the text parses. Forced calls
/// (`crate::constraint::tool_call_constraint`) follow the same rule, so a constrained call
/// parses back to the value the grammar wrote.
pub fn is_raw_text(prop: &Value) -> bool {
    let types = property_types(Some(prop));
    if !types.is_empty() {
        return types.iter().all(|t| *t == "string");
    }
    let values: Vec<&Value> = match (
        prop.get("enum").and_then(Value::as_array),
        prop.get("const"),
    ) {
        (Some(list), _) => list.iter().collect(),
        (None, Some(c)) => vec![c],
        (None, None) => return false,
    };
    !values.is_empty() && values.iter().all(|v| v.is_string())
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
            "osn": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "any": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
            "untyped": {"description": "no type"},
            "choice": {"enum": ["1", "b"]}
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
        // Written as JSON (a forced call does): the string, not its quotes.
        assert_eq!(t("\"lace ycriq\"", "sn"), json!("lace ycriq"));
        assert_eq!(t("\"x\"", "osn"), json!("x"));
        assert_eq!(t("\"7\"", "any"), json!("7"));
        assert_eq!(t("7", "any"), json!(7));
        assert_eq!(t("seven", "any"), json!("seven"));
        // No type named: any JSON value (as the grammar of a forced call writes it), else raw.
        assert_eq!(t("7", "untyped"), json!(7));
        assert_eq!(t("seven", "untyped"), json!("seven"));
        // No type but string enum values: raw text, like a string.
        assert_eq!(t("1", "choice"), json!("1"));
        assert!(
            is_raw_text(&json!({"enum": ["a"]}))
                && !is_raw_text(&json!({"enum": [1]}))
                && !is_raw_text(&json!({"$ref": "#/x"}))
        );
        assert_eq!(t("7", "not_in_schema"), json!("7"));
        // Cut short (issue 39 (d)): half-written JSON is not a value; raw text still is.
        let cut = |raw: &str, key: &str| typed_value_if_complete(raw, Some(&s), key);
        assert_eq!(cut("[1, \"x", "a"), None);
        assert_eq!(cut("{\"k\": ", "o"), None);
        assert_eq!(cut("[1]", "a"), Some(json!([1])));
        assert_eq!(cut("\"lace yc", "sn"), None);
        assert_eq!(cut("lace yc", "sn"), Some(json!("lace yc")));
        assert_eq!(cut("\"done\"", "sn"), Some(json!("done")));
        assert_eq!(cut("any text", "s"), Some(json!("any text")));
        assert_eq!(cut("4", "i"), Some(json!(4)));
        assert_eq!(cut("[tr", "untyped"), None);
        assert_eq!(typed_value("7", None, "i"), json!("7"));
    }
}
