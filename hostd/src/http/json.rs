//! Reading request bodies walked by hand as JSON (the Anthropic messages and the Responses
//! input conversions): an object, a string field, only known keys, a required `type`. Every
//! error names the field by its path (`messages[0].content[1].type`).

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
