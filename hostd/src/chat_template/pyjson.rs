//! Python's text forms of JSON values, as the chat template produces them under transformers:
//! `tojson` (transformers overrides Jinja's filter with `json.dumps(x, ensure_ascii=False)`:
//! separators `", "` and `": "`, keys in the given order, non-ASCII kept, floats in Python's
//! `repr`) and `|string` (Python `str()`: `True`, `False`, `None`, ints, float `repr`).
//!
//! Known gap [I]: an integer too large for 64 bits reaches us as a float (serde_json without
//! arbitrary precision), so it prints as `1e+20` where Python would print every digit.

use serde_json::{Number, Value};
use std::fmt::Write;

/// `json.dumps(value, ensure_ascii=False)`.
pub fn tojson(value: &Value) -> String {
    let mut out = String::new();
    write_json(&mut out, value);
    out
}

/// Python `str(value)` of a parsed JSON value: strings raw, `True`/`False`/`None`, numbers as
/// Python prints them; arrays and objects (which the template never passes here) as `tojson`.
pub(super) fn py_str(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Bool(true) => "True".to_string(),
        Value::Bool(false) => "False".to_string(),
        Value::Null => "None".to_string(),
        Value::Number(n) => number(n),
        Value::Array(_) | Value::Object(_) => tojson(value),
    }
}

fn write_json(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&number(n)),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_json(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_string(out, k);
                out.push_str(": ");
                write_json(out, v);
            }
            out.push('}');
        }
    }
}

/// Python's `encode_basestring`: `"` and `\` escaped, `\n \r \t \b \f` by name, other
/// characters below U+0020 as `\u00XX` (lower-case hex); everything else as is.
fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn number(n: &Number) -> String {
    if let Some(i) = n.as_i64() {
        i.to_string()
    } else if let Some(u) = n.as_u64() {
        u.to_string()
    } else {
        py_float_repr(n.as_f64().unwrap_or(f64::NAN))
    }
}

/// Python's `repr(float)`: the shortest digits that round-trip, in fixed notation when the
/// decimal exponent is in −4…15 (with `.0` for whole numbers), else `d.ddde±XX`.
pub(super) fn py_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".to_string();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    // Rust's `{:e}` prints the shortest round-trip digits: `-1.25e-7`, `1e16`, `0e0`.
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if x.is_sign_negative() { "-" } else { "" };
    let body = if !(-4..16).contains(&exp) {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{first}{frac}e{esign}{:02}", exp.abs())
    } else {
        // The decimal point sits after `exp + 1` digits.
        let point = exp + 1;
        let n = digits.len() as i32;
        if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if point >= n {
            format!("{digits}{}.0", "0".repeat((point - n) as usize))
        } else {
            let (a, b) = digits.split_at(point as usize);
            format!("{a}.{b}")
        }
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn floats_print_as_python_repr() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456789012345.6, "123456789012345.6"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1.2345e20, "1.2345e+20"),
            (2.71, "2.71"),
            (1e100, "1e+100"),
        ];
        for (x, want) in cases {
            assert_eq!(py_float_repr(x), want, "{x}");
        }
    }

    #[test]
    fn tojson_matches_json_dumps() {
        let v = json!({"b": 1, "a": [true, null, 2.0, "x\"y\\z\n\u{1}é"], "c": {}, "d": []});
        assert_eq!(
            tojson(&v),
            r#"{"b": 1, "a": [true, null, 2.0, "x\"y\\z\n\u0001é"], "c": {}, "d": []}"#
        );
    }

    #[test]
    fn py_str_of_scalars() {
        assert_eq!(py_str(&json!(true)), "True");
        assert_eq!(py_str(&json!(false)), "False");
        assert_eq!(py_str(&json!(null)), "None");
        assert_eq!(py_str(&json!(-7)), "-7");
        assert_eq!(
            py_str(&json!(18446744073709551615u64)),
            "18446744073709551615"
        );
        assert_eq!(py_str(&json!(2.50)), "2.5");
        assert_eq!(py_str(&json!("raw \"text\"")), "raw \"text\"");
    }
}
