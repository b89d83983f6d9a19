//! The grammar of forced tool calls (`tool_choice` required or a named function) in Qwen3.6's
//! XML call form:
//!
//! ```text
//! <tool_call>
//! <function=NAME>
//! <parameter=KEY>
//! VALUE
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! `<tool_call>` and `</tool_call>` are single special tokens. Parameters come in the order of
//! the tool's `properties`; required ones must appear, optional ones may. A parameter whose schema
//! names no type but `string` ([`is_raw_string`]) has raw text as its value (no quotes,
//! never containing `</parameter>`, never starting with a line break; `enum`, `const`,
//! `minLength`, `maxLength` and `pattern` are enforced); any other parameter's value is JSON conforming to its schema (with the
//! tool's `$defs` / `definitions` in scope). With parallel calls allowed, one or more calls
//! follow each other separated by `\n`.

use super::{ConstraintError, ConstraintSpec, json_rule};
use serde_json::{Map, Value};
use std::fmt::Write as _;

/// One tool the model may call.
#[derive(Debug, Clone, Copy)]
pub struct ToolSpec<'a> {
    /// The function's name.
    pub name: &'a str,
    /// Its `parameters` JSON schema (an object schema), or `None` for no parameters.
    pub parameters: Option<&'a Value>,
}

/// Which calls are forced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolChoice<'a> {
    /// At least one call, to any of the tools (`tool_choice: "required"`).
    Required,
    /// A call to this function.
    Named(&'a str),
}

/// Whether a parameter with this schema is written as raw text rather than as JSON: the
/// tool-call parser's rule (`crate::tool_calls::is_raw_text`: no type but `string`, counting
/// `anyOf`/`oneOf` members), shared so a forced call parses back to what the grammar wrote.
pub fn is_raw_string(schema: &Value) -> bool {
    crate::tool_calls::is_raw_text(schema)
}

/// The constraint that makes the answer one call (or, with `parallel`, one or more calls) in
/// Qwen3.6's XML form, to a tool `choice` allows.
pub fn tool_call_constraint(
    tools: &[ToolSpec<'_>],
    choice: ToolChoice<'_>,
    parallel: bool,
) -> Result<ConstraintSpec, ConstraintError> {
    let chosen: Vec<&ToolSpec<'_>> = match choice {
        ToolChoice::Required => tools.iter().collect(),
        ToolChoice::Named(name) => tools.iter().filter(|t| t.name == name).collect(),
    };
    if chosen.is_empty() {
        let message = match choice {
            ToolChoice::Named(name) => format!("no tool named {name:?} is defined"),
            ToolChoice::Required => "tool_choice \"required\" needs at least one tool".to_string(),
        };
        return Err(ConstraintError::Grammar { message });
    }
    let mut g = String::new();
    g.push_str("start: LEAD? calls\nLEAD: /\\n{1,2}/\n");
    g.push_str(if parallel {
        "calls: call (\"\\n\" call)*\n"
    } else {
        "calls: call\n"
    });
    let alts: Vec<String> = (0..chosen.len()).map(|i| format!("fn_{i}")).collect();
    writeln!(
        g,
        "call: <tool_call> \"\\n\" ({}) </tool_call>",
        alts.join(" | ")
    )
    .ok();
    for (i, tool) in chosen.iter().enumerate() {
        function_rules(&mut g, i, tool)?;
    }
    Ok(ConstraintSpec::Lark(g))
}

/// Rules `fn_I` (the whole `<function=…>` block) and its parameters.
fn function_rules(g: &mut String, i: usize, tool: &ToolSpec<'_>) -> Result<(), ConstraintError> {
    let bad = |message: String| ConstraintError::Tool {
        tool: tool.name.to_string(),
        message,
    };
    check_name(tool.name).map_err(|m| bad(format!("the name {m}")))?;
    let empty = Map::new();
    let (props, required, defs) = match tool.parameters {
        None | Some(Value::Null) => (&empty, Vec::new(), Map::new()),
        Some(Value::Object(schema)) => {
            if let Some(t) = schema.get("type")
                && t != "object"
            {
                return Err(bad(format!(
                    "parameters must be an object schema (type is {t})"
                )));
            }
            for key in ["anyOf", "oneOf", "allOf", "$ref", "patternProperties"] {
                if schema.contains_key(key) {
                    return Err(bad(format!(
                        "parameters with `{key}` at the top level are not supported"
                    )));
                }
            }
            let props = match schema.get("properties") {
                None => &empty,
                Some(Value::Object(p)) => p,
                Some(_) => return Err(bad("parameters.properties must be an object".into())),
            };
            let required: Vec<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if let Some(missing) = required.iter().find(|k| !props.contains_key(**k)) {
                return Err(bad(format!(
                    "required parameter {missing:?} is not in properties"
                )));
            }
            let mut defs = Map::new();
            for key in ["$defs", "definitions"] {
                if let Some(d) = schema.get(key) {
                    defs.insert(key.to_string(), d.clone());
                }
            }
            (
                props,
                required.into_iter().map(str::to_string).collect(),
                defs,
            )
        }
        Some(_) => return Err(bad("parameters must be a JSON object".into())),
    };
    let mut parts = vec![lit(&format!("<function={}>\n", tool.name))];
    for (j, (key, schema)) in props.iter().enumerate() {
        check_name(key).map_err(|m| bad(format!("parameter name {m}")))?;
        let rule = format!("p_{i}_{j}");
        parts.push(if required.iter().any(|r| r == key) {
            rule.clone()
        } else {
            format!("{rule}?")
        });
        let head = lit(&format!("<parameter={key}>\n"));
        if is_raw_string(schema) {
            let value =
                raw_string_value(schema).map_err(|m| bad(format!("parameter {key:?}: {m}")))?;
            // One terminal for value and closing tag: lexing is greedy, so a separate closing
            // terminal could never be told apart from text that merely starts like it.
            writeln!(g, "{rule}: {head} S_{i}_{j}\nS_{i}_{j}: {value}").ok();
        } else {
            let mut s = schema.clone();
            if let Value::Object(m) = &mut s {
                for (k, v) in &defs {
                    m.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
            let json = json_rule(&s, true).map_err(|e| bad(format!("parameter {key:?}: {e}")))?;
            writeln!(g, "{rule}: {head} v_{i}_{j} {}", lit("\n</parameter>\n")).ok();
            writeln!(g, "v_{i}_{j}: {json}").ok();
        }
    }
    parts.push(lit("</function>\n"));
    writeln!(g, "fn_{i}: {}", parts.join(" ")).ok();
    Ok(())
}

/// Names and keys are written inside `<function=…>` / `<parameter=…>`: they must be non-empty
/// and free of `<`, `>` and line breaks, or the call could not be read back.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("is empty".into());
    }
    if name.contains(['<', '>', '\n', '\r']) {
        return Err(format!("{name:?} contains '<', '>' or a line break"));
    }
    Ok(())
}

/// A Lark string literal for `s`.
fn lit(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// The value and its closing `\n</parameter>\n` of a raw string parameter, as one terminal: the
/// text may not contain `</parameter>` (so the terminal ends exactly at the first one).
fn raw_string_value(schema: &Value) -> Result<String, String> {
    let end = lit("\n</parameter>\n");
    let literal_alts = |values: &[Value]| -> Result<String, String> {
        let alts: Result<Vec<String>, String> = values
            .iter()
            .map(|v| match v.as_str() {
                Some(s) if !s.contains("</parameter>") => Ok(lit(s)),
                Some(_) => Err("an enum value contains </parameter>".to_string()),
                None => Err(format!("enum value {v} is not a string")),
            })
            .collect();
        let alts = alts?;
        if alts.is_empty() {
            return Err("enum is empty".into());
        }
        Ok(format!("({}) {end}", alts.join(" | ")))
    };
    if let Some(c) = schema.get("const") {
        return literal_alts(std::slice::from_ref(c));
    }
    if let Some(e) = schema.get("enum") {
        return literal_alts(
            e.as_array()
                .map(Vec::as_slice)
                .ok_or("enum must be an array")?,
        );
    }
    let pattern = match schema.get("pattern") {
        None => String::new(),
        Some(Value::String(p)) => format!(" & /{}/", pattern_regex(p)),
        Some(_) => return Err("`pattern` must be a string".into()),
    };
    let min = schema.get("minLength").and_then(Value::as_u64).unwrap_or(0);
    let max = schema.get("maxLength").and_then(Value::as_u64);
    // Text (valid UTF-8: the complement alone would also admit invalid bytes) of the allowed
    // length, matching the pattern, that does not contain the closing tag and does not start
    // with a line break (the parser removes only the template's own; a model's extra one
    // would stay in the value).
    let max = max.map_or(String::new(), |m| m.to_string());
    let body = format!(
        r"(/(?s:.{{{min},{max}}})/{pattern} & ~/(?s:.*)<\/parameter>(?s:.*)/ & ~/\n(?s:.*)/)"
    );
    Ok(format!("{body} {end}"))
}

/// A JSON-schema `pattern` (a search, anchored only by its own `^`/`$`) as the body of a Lark
/// regex terminal that must match the whole value.
fn pattern_regex(pattern: &str) -> String {
    let (start, rest) = match pattern.strip_prefix('^') {
        Some(r) => ("", r),
        None => ("(?s:.*)", pattern),
    };
    // A trailing `$` anchors unless it is escaped (an odd number of backslashes before it).
    let escapes = rest
        .strip_suffix('$')
        .map(|r| r.chars().rev().take_while(|&c| c == '\\').count());
    let (body, end) = match escapes {
        Some(n) if n % 2 == 0 => (&rest[..rest.len() - 1], ""),
        _ => (rest, "(?s:.*)"),
    };
    // `/` ends the terminal: escape the unescaped ones.
    let mut escaped = String::with_capacity(body.len());
    let mut backslash = false;
    for c in body.chars() {
        if c == '/' && !backslash {
            escaped.push('\\');
        }
        backslash = c == '\\' && !backslash;
        escaped.push(c);
    }
    format!("{start}(?:{escaped}){end}")
}

#[cfg(test)]
mod tests {
    use super::super::tests::{conforms, grammar_set, walk};
    use super::super::{Commit, ConstraintSpec, StartOptions};
    use super::*;
    use serde_json::json;

    fn tools() -> Vec<(&'static str, Value)> {
        vec![
            (
                "get_weather",
                json!({"type": "object", "properties": {
                    "city": {"type": "string", "description": "any text"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7}
                }, "required": ["city", "days"]}),
            ),
            (
                "search",
                json!({"type": "object", "properties": {
                    "query": {"type": "string", "maxLength": 20},
                    "filters": {"$ref": "#/$defs/Filters"},
                    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 3},
                    "mode": {"enum": ["fast", "slow"]}
                }, "required": ["query", "filters", "mode"], "$defs": {"Filters": {"type": "object", "properties": {"lang": {"type": "string", "enum": ["en", "fr"]}}, "required": ["lang"], "additionalProperties": false}}}),
            ),
            ("ping", json!({"type": "object", "properties": {}})),
        ]
    }

    /// A parsed call: the function's name and its typed arguments.
    type Call = (String, Map<String, Value>);

    /// Reads calls back with the production parser (`crate::tool_calls`), which types values by
    /// the tools' schemas: a forced call must parse back whole, with no text around it.
    fn parse_calls(text: &str, tools: &[(&str, Value)]) -> Result<Vec<Call>, String> {
        let specs = tools
            .iter()
            .map(|(n, p)| crate::tool_calls::ToolSpec {
                name: n.to_string(),
                parameters: Some(p.clone()),
            })
            .collect();
        let mut parser = crate::tool_calls::ToolCallParser::new(specs, None);
        let mut events = parser.feed(text);
        events.extend(parser.finish());
        let (content, calls) = crate::tool_calls::fold(events);
        if !content.trim().is_empty() {
            return Err(format!("text outside the calls: {content:?}"));
        }
        calls
            .into_iter()
            .map(|(name, arguments)| match serde_json::from_str(&arguments) {
                Ok(Value::Object(args)) => Ok((name, args)),
                _ => Err(format!(
                    "arguments of {name} are not a JSON object: {arguments}"
                )),
            })
            .collect()
    }

    /// One random walk of seed `seed` through the forced-call grammar `spec` (thinking off),
    /// which must end; returns its text and the calls it parses back to.
    fn forced_walk(
        spec: &ConstraintSpec,
        defs: &[(&str, Value)],
        seed: u64,
        closers: &[&str],
    ) -> (String, Vec<Call>) {
        let (g, tok) = grammar_set();
        let mut c = g
            .compile(
                spec,
                StartOptions {
                    reasoning: false,
                    reasoning_budget: 0,
                },
            )
            .expect("compile");
        let (ids, ended) = walk(&mut c, seed, closers, 40);
        let text = tok.decode(&ids).unwrap();
        assert!(ended, "seed {seed}: did not end: {text:?}");
        let calls = parse_calls(&text, defs).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{text}"));
        (text, calls)
    }

    fn check(choice: ToolChoice<'_>, parallel: bool, seeds: std::ops::Range<u64>) {
        let defs = tools();
        let specs: Vec<ToolSpec<'_>> = defs
            .iter()
            .map(|(n, p)| ToolSpec {
                name: n,
                parameters: Some(p),
            })
            .collect();
        let spec = tool_call_constraint(&specs, choice, parallel).expect("grammar");
        let closers = [
            "<|im_end|>",
            "\n</parameter>\n",
            "</function>\n",
            "</tool_call>",
            "\"",
            "}",
            "]",
            "1",
            ",",
        ];
        let mut counts = std::collections::HashMap::new();
        for seed in seeds {
            let (text, calls) = forced_walk(&spec, &defs, seed, &closers);
            assert!(
                parallel || calls.len() == 1,
                "seed {seed}: {} calls without parallel calls",
                calls.len()
            );
            for (name, args) in calls {
                if let ToolChoice::Named(n) = choice {
                    assert_eq!(name, n);
                }
                let schema = &defs.iter().find(|(n, _)| *n == name).unwrap().1;
                let mut expanded = schema.clone();
                if name == "search" {
                    expanded["properties"]["filters"] = schema["$defs"]["Filters"].clone();
                }
                expanded["additionalProperties"] = json!(false);
                conforms(&Value::Object(args), &expanded)
                    .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{text}"));
                *counts.entry(name).or_insert(0) += 1;
            }
        }
        if choice == ToolChoice::Required {
            assert!(
                counts.len() >= 2,
                "random walks should reach several tools: {counts:?}"
            );
        }
    }

    #[test]
    fn required_calls_parse_and_validate() {
        check(ToolChoice::Required, false, 0..16);
    }

    #[test]
    fn named_parallel_calls_parse_and_validate() {
        check(ToolChoice::Named("search"), true, 100..112);
    }

    #[test]
    fn call_tags_are_special_tokens_and_text_cannot_fake_them() {
        let defs = tools();
        let specs: Vec<ToolSpec<'_>> = defs
            .iter()
            .map(|(n, p)| ToolSpec {
                name: n,
                parameters: Some(p),
            })
            .collect();
        let spec = tool_call_constraint(&specs, ToolChoice::Named("ping"), false).unwrap();
        let (g, tok) = grammar_set();
        let mut c = g
            .compile(
                &spec,
                StartOptions {
                    reasoning: false,
                    reasoning_budget: 0,
                },
            )
            .unwrap();
        let a = c.allowed().unwrap();
        let open = tok.token_id("<tool_call>").unwrap();
        assert!(a.contains(open));
        assert!(
            !a.contains(tok.encode("<").unwrap()[0]),
            "the call must open with the special token"
        );
        c.commit(open).unwrap();
        for id in tok.encode("\n<function=ping>\n</function>\n").unwrap() {
            assert!(c.allowed().unwrap().contains(id));
            assert_eq!(c.commit(id).unwrap(), Commit::Continue);
        }
        assert_eq!(
            c.commit(tok.token_id("</tool_call>").unwrap()).unwrap(),
            Commit::Complete
        );
    }

    /// Issue 39 (a), (c), (e): string parameters with a `pattern`, nullable strings
    /// (`["string", "null"]`, `anyOf`) and plain ones reach the caller as the grammar wrote
    /// them: the pattern holds over the whole value, a nullable string comes back without
    /// quotes, and no raw value starts with a line break.
    #[test]
    fn patterns_and_nullable_strings_parse_back_as_written() {
        let defs = vec![(
            "f",
            json!({"type": "object", "properties": {
                "code": {"type": "string", "pattern": "^[a-z]{3}-[0-9]{2}$"},
                "note": {"type": "string", "pattern": "ab", "maxLength": 12},
                "path": {"type": "string", "pattern": "^/tmp/[a-z]+$", "maxLength": 12},
                "opt": {"type": ["string", "null"], "maxLength": 8},
                "opt2": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]},
                "text": {"type": "string", "maxLength": 8}
            }, "required": ["code", "note", "path", "opt", "opt2", "text"]}),
        )];
        let specs = [ToolSpec {
            name: "f",
            parameters: Some(&defs[0].1),
        }];
        let spec = tool_call_constraint(&specs, ToolChoice::Required, false).expect("grammar");
        let closers = [
            "\n</parameter>\n",
            "</function>\n",
            "</tool_call>",
            "\"",
            "b",
        ];
        let mut strings = 0;
        for seed in 0..12 {
            let (_, calls) = forced_walk(&spec, &defs, seed, &closers);
            let args = &calls[0].1;
            let s = |k: &str| {
                args[k]
                    .as_str()
                    .unwrap_or_else(|| panic!("seed {seed}: {k} = {}", args[k]))
            };
            let code = s("code").as_bytes();
            assert!(
                code.len() == 6
                    && code[..3].iter().all(u8::is_ascii_lowercase)
                    && code[3] == b'-'
                    && code[4..].iter().all(u8::is_ascii_digit),
                "seed {seed}: code {:?}",
                s("code")
            );
            assert!(
                s("note").contains("ab") && s("note").chars().count() <= 12,
                "seed {seed}: note {:?}",
                s("note")
            );
            let path = s("path");
            assert!(
                path.len() > 5
                    && path.starts_with("/tmp/")
                    && path[5..].bytes().all(|b| b.is_ascii_lowercase()),
                "seed {seed}: path {path:?}"
            );
            for k in ["opt", "opt2"] {
                if let Some(v) = args[k].as_str() {
                    assert!(
                        !v.starts_with('"'),
                        "seed {seed}: {k} came back quoted: {v:?}"
                    );
                    strings += 1;
                } else {
                    assert!(args[k].is_null(), "seed {seed}: {k} = {}", args[k]);
                }
            }
            for k in ["code", "note", "path", "text"] {
                assert!(
                    !s(k).starts_with('\n'),
                    "seed {seed}: {k} starts with a line break"
                );
            }
        }
        assert!(
            strings > 0,
            "the walks should write some nullable strings as strings"
        );
    }

    /// Found with Claude Code (issue 39 item 4): its TaskCreate tool has an object parameter
    /// with `propertyNames`, which the grammar cannot enforce; a forced call must still be
    /// written (the keyword is ignored), not refuse the whole request.
    #[test]
    fn keywords_the_grammar_cannot_enforce_do_not_refuse_a_tool() {
        let p = json!({"type": "object", "properties": {
            "metadata": {"type": "object", "propertyNames": {"type": "string"}, "additionalProperties": {}},
            "when": {"type": "string", "format": "no-such-format"},
            "n": {"type": "integer", "format": "int64"}
        }});
        let spec = tool_call_constraint(
            &[ToolSpec {
                name: "TaskCreate",
                parameters: Some(&p),
            }],
            ToolChoice::Required,
            false,
        )
        .expect("grammar");
        let (g, _) = grammar_set();
        g.compile(
            &spec,
            StartOptions {
                reasoning: false,
                reasoning_budget: 0,
            },
        )
        .expect("compiles");
    }

    #[test]
    fn bad_tools_are_refused_by_name() {
        let p = json!({"type": "object", "properties": {"a": {"type": "string", "pattern": 5}}});
        let e = tool_call_constraint(
            &[ToolSpec {
                name: "f",
                parameters: Some(&p),
            }],
            ToolChoice::Required,
            false,
        )
        .unwrap_err();
        assert!(
            matches!(&e, ConstraintError::Tool { tool, .. } if tool == "f"),
            "{e}"
        );
        let e = tool_call_constraint(
            &[ToolSpec {
                name: "f",
                parameters: None,
            }],
            ToolChoice::Named("g"),
            false,
        )
        .unwrap_err();
        assert!(e.to_string().contains("\"g\""), "{e}");
        let e = tool_call_constraint(
            &[ToolSpec {
                name: "a>b",
                parameters: None,
            }],
            ToolChoice::Required,
            false,
        )
        .unwrap_err();
        assert!(matches!(e, ConstraintError::Tool { .. }));
        assert!(matches!(
            tool_call_constraint(
                &[ToolSpec {
                    name: "f",
                    parameters: None
                }],
                ToolChoice::Required,
                false
            ),
            Ok(ConstraintSpec::Lark(_))
        ));
    }
}
