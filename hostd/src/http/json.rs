//! Reading request bodies walked by hand as JSON (the Anthropic messages and the Responses
//! input conversions): an object, a string field, only known keys, a required `type`, text
//! blocks, a new call id, optional keys' types. Every error names the field by its path
//! (`messages[0].content[1].type`).

use super::error::ApiError;
use serde_json::{Map, Value};

/// `v` as an object, or a 400 naming `at`.
pub(crate) fn object<'a>(v: &'a Value, at: &str) -> Result<&'a Map<String, Value>, ApiError> {
    v.as_object()
        .ok_or_else(|| ApiError::invalid(format!("{at} must be an object."), at))
}

/// Refuses (unsupported, naming it) the first key of `obj` not in `allowed`.
pub(crate) fn only_keys(
    obj: &Map<String, Value>,
    allowed: &[&str],
    at: &str,
) -> Result<(), ApiError> {
    match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(ApiError::unsupported(
            format!("Unrecognized field: {at}.{k}"),
            format!("{at}.{k}"),
        )),
        None => Ok(()),
    }
}

/// `obj[key]` as a string: missing (or null) and not-a-string are 400s naming `{at}.{key}`.
pub(crate) fn string<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<&'a str, ApiError> {
    match obj.get(key) {
        Some(Value::String(s)) => Ok(s),
        None | Some(Value::Null) => Err(ApiError::missing(&format!("{at}.{key}"))),
        Some(_) => Err(ApiError::invalid(
            format!("{at}.{key} must be a string."),
            format!("{at}.{key}"),
        )),
    }
}

/// Requires `obj.type` to be `want`; another value is refused as unsupported, naming
/// `{at}.type`, with `refusal(other)` as the message.
pub(crate) fn require_type(
    obj: &Map<String, Value>,
    at: &str,
    want: &str,
    refusal: impl FnOnce(&str) -> String,
) -> Result<(), ApiError> {
    match string(obj, "type", at)? {
        t if t == want => Ok(()),
        other => Err(ApiError::unsupported(refusal(other), format!("{at}.type"))),
    }
}

/// The texts of a list of text blocks (`{type: "text", text}`, with `cache_control` and
/// `citations` accepted), block `j` named `{at}[{j}]`; another block type is refused as an
/// unsupported `{what} block type`.
pub(crate) fn text_blocks<'a>(
    blocks: &'a [Value],
    at: &str,
    what: &str,
) -> Result<Vec<&'a str>, ApiError> {
    let mut texts = Vec::with_capacity(blocks.len());
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("{at}[{j}]");
        let obj = object(b, &at)?;
        require_type(obj, &at, "text", |other| {
            format!("Unsupported {what} block type '{other}': only text blocks.")
        })?;
        only_keys(obj, &["type", "text", "cache_control", "citations"], &at)?;
        texts.push(string(obj, "text", &at)?);
    }
    Ok(texts)
}

/// `obj[key]` as the id of a new tool call: a non-empty string none of `seen` equals, else a 400
/// naming `{at}.{key}`.
pub(crate) fn new_id<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    at: &str,
    seen: &[String],
) -> Result<&'a str, ApiError> {
    let id = string(obj, key, at)?;
    if id.is_empty() || seen.iter().any(|s| s == id) {
        return Err(ApiError::invalid(
            format!("{at}.{key} must be a non-empty id unique in the conversation (got {id:?})."),
            format!("{at}.{key}"),
        ));
    }
    Ok(id)
}

/// The check of an optional key: its name, the test its value passes, and what that value
/// must be, as a 400 says it (`a string`).
pub(crate) type KeyCheck = (&'static str, fn(&Value) -> bool, &'static str);

/// Checks the optional keys of `obj`: each `(key, ok, want)` must be absent, null, or pass
/// `ok`, else a 400 naming `{at}.{key}` that says it must be `want`.
pub(crate) fn optional_types(
    obj: &Map<String, Value>,
    at: &str,
    keys: &[KeyCheck],
) -> Result<(), ApiError> {
    for &(key, ok, want) in keys {
        if obj.get(key).is_some_and(|v| !v.is_null() && !ok(v)) {
            return Err(ApiError::invalid(
                format!("{at}.{key} must be {want}."),
                format!("{at}.{key}"),
            ));
        }
    }
    Ok(())
}
