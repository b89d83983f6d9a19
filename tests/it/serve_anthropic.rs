//! `hostd serve`'s Anthropic Messages API end to end (`/v1/messages`, `/v1/messages/count_tokens`)
//! on the tiny fixture: reply and usage shapes, the streamed event order and its equality with the
//! whole reply, stop sequences, Anthropic-shaped errors, `x-api-key` auth, 529 when the queue is
//! full, the endpoint's metrics label, and client-disconnect cancellation of a stream. Tool use is
//! in `serve_anthropic_tools.rs`.

use crate::serve::{Lines, Server, check_error, open_stream};
use serde_json::{Value, json};
use std::time::Duration;
use tests::wait_for;

pub(crate) fn user(text: &str) -> Value {
    json!([{ "role": "user", "content": text }])
}

/// Asserts Anthropic's error shape and status; returns `error.type`.
pub(crate) fn check_anthropic_error(
    r: &crate::serve::Response,
    status: u16,
    error_type: &str,
) -> String {
    assert_eq!(r.status, status, "{}", r.text());
    let body = r.json();
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], error_type, "{body}");
    let message = body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!message.is_empty(), "{body}");
    assert!(body["request_id"].is_string(), "{body}");
    message
}

pub(crate) fn post(s: &Server, path: &str, body: &Value) -> crate::serve::Response {
    s.request(
        "POST",
        path,
        &[("anthropic-version", "2023-06-01")],
        Some(&body.to_string()),
    )
}

pub(crate) fn create(s: &Server, body: Value) -> Value {
    let r = post(s, "/v1/messages", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.header("request-id").is_some(),
        "Anthropic's clients read the request id from `request-id`"
    );
    r.json()
}

/// The (event name, data) pairs of an SSE body.
pub(crate) fn events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter(|chunk| chunk.lines().any(|l| l.starts_with("data: ")))
        .map(|chunk| {
            let name = chunk
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .expect("every event is named")
                .to_string();
            let data = chunk
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .expect("data");
            (
                name,
                serde_json::from_str(data)
                    .unwrap_or_else(|e| panic!("event data is not JSON ({e}): {data}")),
            )
        })
        .collect()
}

/// Folds a stream's events into the message they describe, checking their order on the way:
/// `message_start`, `ping`, blocks that each open, take deltas of their own type and close
/// before the next opens, then `message_delta` and `message_stop`. A `tool_use` block's
/// `partial_json` fragments are concatenated and parsed as its `input` when it closes (as the
/// anthropic SDK's accumulator does).
pub(crate) fn fold(evs: &[(String, Value)]) -> Value {
    let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[..2], ["message_start", "ping"], "{names:?}");
    assert_eq!(
        names[names.len() - 2..],
        ["message_delta", "message_stop"],
        "{names:?}"
    );
    for (name, data) in evs {
        assert_eq!(
            data["type"],
            name.as_str(),
            "the data's type names the event"
        );
    }
    let mut message = evs[0].1["message"].clone();
    assert!(
        message["stop_reason"].is_null() && message["content"] == json!([]),
        "{message}"
    );
    let mut open: Option<usize> = None;
    let mut partial_json = String::new();
    for (name, data) in &evs[2..evs.len() - 2] {
        let index = data["index"].as_u64().expect("index") as usize;
        match name.as_str() {
            "content_block_start" => {
                assert!(
                    open.is_none(),
                    "a block opened before the previous one closed"
                );
                assert_eq!(index, message["content"].as_array().map_or(0, Vec::len));
                message["content"]
                    .as_array_mut()
                    .expect("content")
                    .push(data["content_block"].clone());
                open = Some(index);
            }
            "content_block_delta" => {
                assert_eq!(open, Some(index));
                let block = &mut message["content"][index];
                match (block["type"].as_str(), data["delta"]["type"].as_str()) {
                    (Some("thinking"), Some("thinking_delta")) => {
                        block["thinking"] = json!(format!(
                            "{}{}",
                            block["thinking"].as_str().unwrap_or(""),
                            data["delta"]["thinking"].as_str().unwrap_or("")
                        ));
                    }
                    (Some("text"), Some("text_delta")) => {
                        block["text"] = json!(format!(
                            "{}{}",
                            block["text"].as_str().unwrap_or(""),
                            data["delta"]["text"].as_str().unwrap_or("")
                        ));
                    }
                    (Some("tool_use"), Some("input_json_delta")) => {
                        partial_json.push_str(
                            data["delta"]["partial_json"]
                                .as_str()
                                .expect("partial_json"),
                        );
                    }
                    other => panic!("delta {other:?} in the wrong block"),
                }
            }
            "content_block_stop" => {
                assert_eq!(open.take(), Some(index));
                let block = &mut message["content"][index];
                if block["type"] == "tool_use" {
                    assert_eq!(
                        block["input"],
                        json!({}),
                        "a tool_use block starts with an empty input"
                    );
                    let input: Value = serde_json::from_str(&std::mem::take(&mut partial_json))
                        .unwrap_or_else(|e| {
                            panic!("the partial_json fragments are not one JSON value ({e})")
                        });
                    block["input"] = input;
                }
            }
            other => panic!("unexpected event {other}"),
        }
    }
    assert!(open.is_none(), "a block was left open");
    let delta = &evs[evs.len() - 2].1;
    message["stop_reason"] = delta["delta"]["stop_reason"].clone();
    message["stop_sequence"] = delta["delta"]["stop_sequence"].clone();
    for (k, v) in delta["usage"].as_object().expect("usage") {
        if !v.is_null() {
            message["usage"][k] = v.clone();
        }
    }
    message
}

fn input_total(m: &Value) -> u64 {
    m["usage"]["input_tokens"].as_u64().expect("input_tokens")
        + m["usage"]["cache_read_input_tokens"].as_u64().unwrap_or(0)
}

#[test]
fn messages_shapes_stream_stop_sequences_and_count_tokens() {
    let s = Server::start("tiny", &[]);
    let base = json!({ "model": s.name, "max_tokens": 16, "messages": user("Say something."), "temperature": 0, "ignore_eos": true });

    // Thinking on (the server's default): one thinking block with an empty signature.
    let whole = create(&s, base.clone());
    assert!(
        whole["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("msg_")),
        "{whole}"
    );
    assert_eq!(
        (
            whole["type"].clone(),
            whole["role"].clone(),
            whole["model"].clone()
        ),
        (json!("message"), json!("assistant"), json!(s.name))
    );
    assert_eq!(
        (whole["stop_reason"].clone(), whole["stop_sequence"].clone()),
        (json!("max_tokens"), Value::Null)
    );
    assert_eq!(whole["content"][0]["type"], "thinking", "{whole}");
    assert_eq!(whole["content"][0]["signature"], "");
    assert_eq!(whole["usage"]["output_tokens"], 16);
    // Anthropic's field order (serde_json keeps insertion order since the field-policy branch).
    let keys: Vec<&String> = whole["usage"].as_object().expect("usage").keys().collect();
    assert_eq!(
        keys,
        [
            "input_tokens",
            "output_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens"
        ]
    );

    // The stream folds into the same message, for both thinking switches.
    for thinking in [Value::Null, json!({ "type": "disabled" })] {
        let mut body = base.clone();
        if !thinking.is_null() {
            body["thinking"] = thinking.clone();
        }
        let whole = create(&s, body.clone());
        body["stream"] = json!(true);
        let r = post(&s, "/v1/messages", &body);
        assert_eq!(r.status, 200);
        assert!(
            r.header("content-type")
                .is_some_and(|c| c.starts_with("text/event-stream"))
        );
        let folded = fold(&events(&r.text()));
        assert_eq!(folded["content"], whole["content"], "thinking {thinking}");
        assert_eq!(
            (
                folded["stop_reason"].clone(),
                folded["usage"]["output_tokens"].clone()
            ),
            (json!("max_tokens"), json!(16))
        );
        assert_eq!(input_total(&folded), input_total(&whole));
        if !thinking.is_null() {
            let kinds: Vec<&str> = whole["content"]
                .as_array()
                .expect("content")
                .iter()
                .filter_map(|b| b["type"].as_str())
                .collect();
            assert_eq!(kinds, ["text"], "thinking off: text only");
        }
    }

    // count_tokens renders what create prefills or reads from the cache, system and switch included.
    let count = |body: Value| {
        let r = post(&s, "/v1/messages/count_tokens", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["input_tokens"].as_u64().expect("input_tokens")
    };
    let system = json!([{ "type": "text", "text": "You are terse." }]);
    let msg = create(
        &s,
        json!({ "model": s.name, "max_tokens": 2, "system": system, "messages": user("Hi"), "thinking": { "type": "disabled" } }),
    );
    let counted = count(
        json!({ "model": s.name, "system": system, "messages": user("Hi"), "thinking": { "type": "disabled" } }),
    );
    assert_eq!(counted, input_total(&msg));
    assert!(
        counted
            > count(
                json!({ "model": s.name, "messages": user("Hi"), "thinking": { "type": "disabled" } })
            )
    );

    // A stop sequence taken from the greedy reply ends it there and is named.
    let plain = json!({ "model": s.name, "max_tokens": 24, "messages": user("Say something."), "temperature": 0, "thinking": { "type": "disabled" } });
    let full = create(&s, plain.clone())["content"][0]["text"]
        .as_str()
        .expect("text")
        .to_string();
    let chars: Vec<char> = full.chars().collect();
    let stop: String = (2..chars.len().saturating_sub(1))
        .map(|i| chars[i..i + 2].iter().collect::<String>())
        .find(|p: &String| p.trim() == p && !p.contains('\u{fffd}'))
        .expect("a two-character piece");
    let mut with_stop = plain;
    with_stop["stop_sequences"] = json!(["never-generated-zzz", stop]);
    let stopped = create(&s, with_stop.clone());
    assert_eq!(
        (
            stopped["stop_reason"].clone(),
            stopped["stop_sequence"].clone()
        ),
        (json!("stop_sequence"), json!(stop))
    );
    assert_eq!(
        stopped["content"][0]["text"].as_str(),
        Some(&full[..full.find(&stop).expect("stop in text")])
    );
    with_stop["stream"] = json!(true);
    let folded = fold(&events(&post(&s, "/v1/messages", &with_stop).text()));
    assert_eq!(
        (
            folded["stop_reason"].clone(),
            folded["stop_sequence"].clone()
        ),
        (json!("stop_sequence"), json!(stop))
    );

    let metrics = s.request("GET", "/metrics", &[], None).text();
    assert!(
        metrics.contains("hostd_requests_total{endpoint=\"/v1/messages\",status=\"200\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "hostd_requests_total{endpoint=\"/v1/messages/count_tokens\",status=\"200\"}"
        ),
        "{metrics}"
    );
}

#[test]
fn errors_on_anthropic_routes_are_anthropic_shaped() {
    let s = Server::start("tiny", &[]);
    let ok = json!({ "model": s.name, "max_tokens": 4, "messages": user("x") });
    let with = |key: &str, v: Value| {
        let mut b = ok.clone();
        b[key] = v;
        b
    };
    let msg = |body: Value, status, ty| {
        check_anthropic_error(&post(&s, "/v1/messages", &body), status, ty)
    };
    assert!(
        msg(
            json!({ "model": s.name, "messages": user("x") }),
            400,
            "invalid_request_error"
        )
        .contains("max_tokens")
    );
    msg(with("model", json!("claude-nope")), 404, "not_found_error");
    // 400s that name what they refuse.
    for (key, value, named) in [
        ("max_tokens", json!(0), "max_tokens"),
        ("frequency_penalty", json!(1), "frequency_penalty"),
        (
            "tools",
            json!([{ "type": "web_search_20250305", "name": "web_search" }]),
            "web_search_20250305",
        ),
        (
            "messages",
            json!([{ "role": "user", "content": [{ "type": "tool_result", "tool_use_id": "t1", "content": "20 C" }] }]),
            "tool_use_id",
        ),
        ("tool_choice", json!({ "type": "any" }), "requires tools"),
        (
            "messages",
            json!([{ "role": "user", "content": "q" }, { "role": "assistant", "content": "The answer is (" }]),
            "prefill",
        ),
        ("thinking", json!({ "type": "always" }), "thinking.type"),
        (
            "stop_sequences",
            json!(["a", "b", "c", "d", "e"]),
            "stop sequences",
        ),
        (
            "output_config",
            json!({ "format": { "type": "json_schema", "schema": {} } }),
            "output_config.format",
        ),
    ] {
        let message = msg(with(key, value), 400, "invalid_request_error");
        assert!(message.contains(named), "{key}: {message}");
    }
    check_anthropic_error(
        &s.request("POST", "/v1/messages", &[], Some("{not json")),
        400,
        "invalid_request_error",
    );
    let long = "word ".repeat(300_000);
    check_anthropic_error(
        &post(&s, "/v1/messages", &with("messages", user(&long))),
        400,
        "invalid_request_error",
    );
    let count = post(
        &s,
        "/v1/messages/count_tokens",
        &json!({ "model": s.name, "max_tokens": 4, "messages": user("x") }),
    );
    assert!(check_anthropic_error(&count, 400, "invalid_request_error").contains("max_tokens"));
    check_anthropic_error(
        &s.request("GET", "/v1/messages", &[], None),
        405,
        "invalid_request_error",
    );
    check_anthropic_error(
        &s.request("POST", "/v1/messages/batches", &[], Some("{}")),
        404,
        "not_found_error",
    );
    // Accepted and ignored: metadata, cache markers, effort, the version header.
    let mut extras = with("metadata", json!({ "user_id": "u1" }));
    extras["cache_control"] = json!({ "type": "ephemeral" });
    extras["output_config"] = json!({ "effort": "low" });
    extras["tool_choice"] = json!({ "type": "auto" });
    extras["tools"] = json!([]);
    create(&s, extras);
    // The OpenAI routes keep OpenAI's shape.
    check_error(
        &s.post("/v1/chat/completions", &json!({ "model": s.name })),
        400,
        "missing_required_parameter",
    );
}

#[test]
fn x_api_key_is_accepted_where_a_key_is_required() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, "s3cret\n").expect("write key");
    let s = Server::start(
        "tiny",
        &["--api-key-file", key_file.to_str().expect("path")],
    );
    let body = json!({ "model": s.name, "max_tokens": 2, "messages": user("x") }).to_string();
    let messages =
        |headers: &[(&str, &str)]| s.request("POST", "/v1/messages", headers, Some(&body));
    let r = messages(&[]);
    check_anthropic_error(&r, 401, "authentication_error");
    assert!(r.header("request-id").is_some());
    check_anthropic_error(
        &messages(&[("x-api-key", "wrong")]),
        401,
        "authentication_error",
    );
    check_anthropic_error(
        &messages(&[("x-api-key", "s3cret-and-more")]),
        401,
        "authentication_error",
    );
    assert_eq!(
        messages(&[("x-api-key", "s3cret"), ("anthropic-version", "2023-06-01")]).status,
        200
    );
    assert_eq!(messages(&[("Authorization", "Bearer s3cret")]).status, 200);
    let count = s.request(
        "POST",
        "/v1/messages/count_tokens",
        &[],
        Some(&json!({ "model": s.name, "messages": user("x") }).to_string()),
    );
    check_anthropic_error(&count, 401, "authentication_error");
    // x-api-key opens the OpenAI routes too; their errors stay OpenAI-shaped.
    assert_eq!(
        s.request("GET", "/v1/models", &[("x-api-key", "s3cret")], None)
            .status,
        200
    );
    check_error(
        &s.request("GET", "/v1/models", &[("x-api-key", "nope")], None),
        401,
        "invalid_api_key",
    );
}

/// Opens a streaming `/v1/messages` request that would run for a long time and reads until
/// `n` events arrived; returns the open stream.
fn open_long_stream(s: &Server, n: usize) -> Lines {
    let body = json!({ "model": s.name, "messages": user("go"), "max_tokens": 200_000, "ignore_eos": true, "stream": true, "temperature": 0 });
    open_stream(s, "/v1/messages", &body, "event: ", n)
}

#[test]
fn disconnect_cancels_and_a_full_queue_is_overloaded() {
    let s = Server::start("tiny", &["--max-batch", "1", "--max-queue", "1"]);
    let running = open_long_stream(&s, 6);
    assert_eq!(s.metric("hostd_active_sequences"), 1.0);
    // The second request waits in the queue (its SSE head arrives once it is queued).
    let body =
        json!({ "model": s.name, "messages": user("wait"), "max_tokens": 4, "stream": true });
    let queued = s
        .send("POST", "/v1/messages", &[], Some(&body.to_string()))
        .expect("send");
    assert_eq!(queued.status(), 200);
    wait_for("one queued request", Duration::from_secs(10), || {
        s.metric("hostd_queue_depth") == 1.0
    });
    let r = post(
        &s,
        "/v1/messages",
        &json!({ "model": s.name, "messages": user("x"), "max_tokens": 1 }),
    );
    check_anthropic_error(&r, 529, "overloaded_error");
    assert_eq!(r.header("retry-after"), Some("1"));
    drop(queued);
    drop(running);
    // Both sequences must have left before the token count is read: the queued one may be
    // admitted (and step once or twice before its closed stream is noticed, or even finish its
    // 4 tokens) after the running one left, so "nothing active and nothing queued" alone, read
    // metric by metric, can be seen between the two.
    wait_for(
        "the cancelled sequences to leave",
        Duration::from_secs(20),
        || {
            let (cancelled, finished) = (
                s.metric("hostd_sequences_cancelled_total"),
                s.metric("hostd_sequences_finished_total"),
            );
            cancelled >= 1.0
                && cancelled + finished >= 2.0
                && s.metric("hostd_active_sequences") == 0.0
                && s.metric("hostd_queue_depth") == 0.0
        },
    );
    assert_eq!(s.metric("hostd_active_state_bytes"), 0.0);
    let generated = s.metric("hostd_generation_tokens_total");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        s.metric("hostd_generation_tokens_total"),
        generated,
        "tokens are still being generated"
    );
}

/// Two things Claude Code sends on every request (found by running it against this server):
/// `context_management` is accepted and ignored (no server-side context editing: the whole
/// conversation is used), and a `system` message inside `messages` joins the system prompt, so
/// the prompt equals one with that text appended to `system`.
#[test]
fn claude_code_request_fields_are_accepted() {
    let s = Server::start("tiny", &[]);
    let count = |body: Value| {
        let r = post(&s, "/v1/messages/count_tokens", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["input_tokens"].as_u64().expect("input_tokens")
    };
    let inline = json!({ "model": s.name, "system": "Be brief.", "messages": [
        { "role": "user", "content": "hi" },
        { "role": "system", "content": [{ "type": "text", "text": "Tools: none." }] }
    ]});
    let joined =
        json!({ "model": s.name, "system": "Be brief.\n\nTools: none.", "messages": user("hi") });
    assert_eq!(count(inline.clone()), count(joined));
    let mut body = inline;
    body["max_tokens"] = json!(4);
    body["context_management"] =
        json!({ "edits": [{ "type": "clear_thinking_20251015", "keep": "all" }] });
    let reply = create(&s, body);
    assert_eq!(reply["type"], "message", "{reply}");
}
