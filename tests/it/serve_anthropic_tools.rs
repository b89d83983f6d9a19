//! Anthropic tool use through `hostd serve` on the tiny fixture (random weights): `tool_choice`
//! `any` and `tool` force calls by constrained decoding, so even noise weights return valid
//! `tool_use` blocks whose `input` follows the tool's (bounded) `input_schema`; the streamed
//! reply (`tool_use` block starts, `input_json_delta` fragments) folds into the same blocks; the
//! assistant's content and a `tool_result` go back as history; tools are counted by
//! `count_tokens`.

use crate::serve::Server;
use crate::serve_anthropic::{check_anthropic_error, create, events, fold, post, user};
use crate::serve_responses::check_weather_args;
use serde_json::{Value, json};

fn tools() -> Value {
    json!([
        { "name": "get_weather", "description": "Weather of a city.", "input_schema": { "type": "object",
            "properties": { "city": { "type": "string", "maxLength": 12 }, "days": { "type": "integer", "minimum": 1, "maximum": 7 } },
            "required": ["city", "days"] } },
        { "name": "get_time", "input_schema": { "type": "object",
            "properties": { "zone": { "type": "string", "enum": ["UTC", "CET"] } }, "required": ["zone"] } }
    ])
}

/// Checks a reply's `tool_use` blocks against the tools' schemas; returns them.
fn tool_uses(m: &Value, forced: Option<&str>) -> Vec<Value> {
    let blocks: Vec<Value> = m["content"]
        .as_array()
        .expect("content")
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .cloned()
        .collect();
    assert_eq!(
        blocks.len(),
        1,
        "disable_parallel_tool_use: exactly one call: {m}"
    );
    for b in &blocks {
        let id = b["id"].as_str().expect("id");
        assert!(id.starts_with("toolu_") && id.len() > 6, "{b}");
        let input = &b["input"];
        assert!(input.is_object(), "{b}");
        let name = b["name"].as_str().expect("name");
        if let Some(f) = forced {
            assert_eq!(name, f, "{m}");
        }
        match name {
            "get_weather" => check_weather_args(input),
            "get_time" => assert!(input["zone"] == "UTC" || input["zone"] == "CET", "{input}"),
            other => panic!("unexpected tool {other}: {m}"),
        }
    }
    blocks
}

/// The reply without the (random) tool_use ids.
fn without_ids(m: &Value) -> Value {
    let mut content = m["content"].clone();
    for b in content.as_array_mut().expect("content") {
        if let Some(o) = b.as_object_mut() {
            o.remove("id");
        }
    }
    content
}

#[test]
fn forced_tool_use_is_valid_streams_alike_and_round_trips() {
    let s = Server::start("tiny", &[]);
    let any = json!({ "type": "any", "disable_parallel_tool_use": true });
    let named = json!({ "type": "tool", "name": "get_time", "disable_parallel_tool_use": true });
    for (choice, thinking, forced) in [
        (any.clone(), json!({ "type": "disabled" }), None),
        (any, json!({ "type": "enabled", "budget_tokens": 64 }), None),
        (
            named.clone(),
            json!({ "type": "disabled" }),
            Some("get_time"),
        ),
        (named, json!({ "type": "adaptive" }), Some("get_time")),
    ] {
        let body = json!({ "model": s.name, "max_tokens": 300, "messages": user("Weather in Oslo?"), "tools": tools(),
            "tool_choice": choice, "thinking": thinking, "temperature": 0 });
        let whole = create(&s, body.clone());
        assert_eq!(whole["stop_reason"], "tool_use", "{whole}");
        let calls = tool_uses(&whole, forced);

        // The stream folds into the same blocks (greedy decoding: same tokens).
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let r = post(&s, "/v1/messages", &streamed);
        assert_eq!(r.status, 200, "{}", r.text());
        let evs = events(&r.text());
        assert!(
            evs.iter()
                .any(|(_, d)| d["delta"]["type"] == "input_json_delta"),
            "arguments stream as input_json_delta"
        );
        let folded = fold(&evs);
        assert_eq!(folded["stop_reason"], "tool_use", "{folded}");
        tool_uses(&folded, forced);
        assert_eq!(without_ids(&folded), without_ids(&whole));

        // Round trip: the assistant's content as it came back, then a tool_result for its call.
        let mut messages = user("Weather in Oslo?");
        let list = messages.as_array_mut().expect("messages");
        list.push(json!({ "role": "assistant", "content": whole["content"] }));
        list.push(json!({ "role": "user", "content": [
            { "type": "tool_result", "tool_use_id": calls[0]["id"], "content": [{ "type": "text", "text": "sunny, 20 C" }] },
            { "type": "text", "text": "And tomorrow?" }
        ] }));
        let next = create(
            &s,
            json!({ "model": s.name, "max_tokens": 8, "messages": messages, "tools": tools(), "thinking": { "type": "disabled" } }),
        );
        assert!(
            ["end_turn", "max_tokens", "tool_use"]
                .contains(&next["stop_reason"].as_str().unwrap_or("")),
            "{next}"
        );
        // An error result is accepted too.
        let last = messages
            .as_array_mut()
            .and_then(|l| l.last_mut())
            .expect("last");
        last["content"][0]["is_error"] = json!(true);
        create(
            &s,
            json!({ "model": s.name, "max_tokens": 2, "messages": messages, "tools": tools() }),
        );
    }

    // The tools are part of the prompt: count_tokens counts them, as create prefills them.
    let count = |body: Value| {
        let r = post(&s, "/v1/messages/count_tokens", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["input_tokens"].as_u64().expect("input_tokens")
    };
    let plain =
        json!({ "model": s.name, "messages": user("Hi"), "thinking": { "type": "disabled" } });
    let mut with_tools = plain.clone();
    with_tools["tools"] = tools();
    let counted = count(with_tools.clone());
    assert!(
        counted > count(plain) + 20,
        "the tool definitions are rendered into the prompt"
    );
    with_tools["max_tokens"] = json!(1);
    let m = create(&s, with_tools);
    let input = m["usage"]["input_tokens"].as_u64().unwrap_or(0)
        + m["usage"]["cache_read_input_tokens"].as_u64().unwrap_or(0);
    assert_eq!(counted, input);
}

#[test]
fn tool_errors_name_their_field() {
    let s = Server::start("tiny", &[]);
    let ok = json!({ "model": s.name, "max_tokens": 4, "messages": user("x"), "tools": tools() });
    let with = |key: &str, v: Value| {
        let mut b = ok.clone();
        b[key] = v;
        b
    };
    let bad_call = json!({ "role": "assistant", "content": [{ "type": "tool_use", "id": "toolu_1", "name": "get_time", "input": "UTC" }] });
    let result = json!({ "role": "user", "content": [{ "type": "tool_result", "tool_use_id": "toolu_1", "content": "12:00" }] });
    let call = json!({ "role": "assistant", "content": [{ "type": "tool_use", "id": "toolu_1", "name": "get_time", "input": { "zone": "UTC" } }] });
    let wrong_id = json!({ "role": "user", "content": [{ "type": "tool_result", "tool_use_id": "toolu_2", "content": "12:00" }] });
    let user_text = json!({ "role": "user", "content": "t?" });
    for (key, value, named) in [
        (
            "tool_choice",
            json!({ "type": "tool", "name": "nope" }),
            "nope",
        ),
        ("tools", json!([{ "name": "f" }]), "tools[0].input_schema"),
        (
            "messages",
            json!([user_text, bad_call, result]),
            "messages[1].content[0].input",
        ),
        ("messages", json!([user_text, call, wrong_id]), "toolu_2"),
    ] {
        let message = check_anthropic_error(
            &post(&s, "/v1/messages", &with(key, value)),
            400,
            "invalid_request_error",
        );
        assert!(message.contains(named), "{key}: {message}");
    }
    // A valid history without a user text after the results is a prompt like any other.
    create(&s, with("messages", json!([user_text, call, result])));
}
