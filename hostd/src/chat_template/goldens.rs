//! The golden conversations of tests/oracle/tool_goldens.json (rendered by transformers'
//! `apply_chat_template` over the official template, see tests/oracle/make_tool_goldens.py),
//! each rendered by [`render_with_tools`] and compared byte for byte.

use super::*;
use serde_json::Value;

const GOLDENS: &str = include_str!("../../../tests/oracle/tool_goldens.json");

/// The template's view of one message dict: `tool_call.function` unwrapped, arguments as given.
fn message(m: &Value) -> ChatMessage {
    let role: Role = m["role"]
        .as_str()
        .expect("role")
        .parse()
        .expect("known role");
    let content = m["content"].as_str().unwrap_or_default();
    let mut out = ChatMessage::new(role, content);
    out.reasoning_content = m["reasoning_content"].as_str().map(str::to_string);
    for call in m["tool_calls"].as_array().into_iter().flatten() {
        let f = call.get("function").unwrap_or(call);
        out.tool_calls.push(ToolCall {
            name: f["name"].as_str().expect("name").to_string(),
            arguments: f
                .get("arguments")
                .map(|a| a.as_object().expect("arguments object").clone()),
        });
    }
    out
}

#[test]
fn renders_every_golden_conversation_byte_for_byte() {
    let goldens: Value = serde_json::from_str(GOLDENS).expect("goldens parse");
    let cases = goldens["cases"].as_array().expect("cases");
    assert!(cases.len() >= 10, "too few golden cases: {}", cases.len());
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let messages: Vec<ChatMessage> = case["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(message)
            .collect();
        let tools = case["tools"].as_array().expect("tools");
        let kw = &case["kwargs"];
        let opts = ChatOptions {
            add_generation_prompt: kw["add_generation_prompt"].as_bool().unwrap_or(false),
            enable_thinking: kw["enable_thinking"].as_bool().unwrap_or(true),
            preserve_thinking: kw["preserve_thinking"].as_bool().unwrap_or(false),
        };
        let got =
            render_with_tools(&messages, tools, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = case["rendered"].as_str().expect("rendered");
        assert_eq!(got, want, "golden case {name} differs");
    }
}
