//! `hostd serve`'s OpenAI Responses API end to end (`/v1/responses`, `GET`/`DELETE
//! /v1/responses/{id}`) on the tiny fixture (random weights): the response object's shape, the
//! streamed event order (sequence numbers, item and part lifecycles) and its equality with the
//! whole response, `store` and the in-memory store, `previous_response_id` equal to sending the
//! history as input items, a forced function call and its `function_call_output` round trip,
//! and errors that name their field.

use crate::serve::{Server, check_error};
use crate::serve_anthropic::events;
use serde_json::{Value, json};

fn create(s: &Server, body: &Value) -> Value {
    let r = s.post("/v1/responses", body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// Folds a stream's events into the response they describe, checking the order on the way:
/// `response.created`, `response.in_progress`, items that each open, take their own deltas and
/// close before the next opens, then the terminal event; `sequence_number` counts from 0.
/// Returns (the terminal event's response, the folded output).
fn fold(evs: &[(String, Value)]) -> (Value, Vec<Value>) {
    let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names[..2],
        ["response.created", "response.in_progress"],
        "{names:?}"
    );
    let terminal = names[names.len() - 1];
    assert!(
        ["response.completed", "response.incomplete"].contains(&terminal),
        "{names:?}"
    );
    for (k, (name, data)) in evs.iter().enumerate() {
        assert_eq!(
            data["type"],
            name.as_str(),
            "the data's type names the event"
        );
        assert_eq!(
            data["sequence_number"], k,
            "sequence numbers count from 0: {names:?}"
        );
    }
    let start = &evs[0].1["response"];
    assert_eq!(
        (start["status"].as_str(), start["output"].clone()),
        (Some("in_progress"), json!([])),
        "{start}"
    );
    assert!(start["usage"].is_null());
    let mut output: Vec<Value> = Vec::new();
    let mut open: Option<usize> = None;
    for (name, data) in &evs[2..evs.len() - 1] {
        let i = data["output_index"].as_u64().expect("output_index") as usize;
        if name != "response.output_item.added" {
            assert_eq!(open, Some(i), "{name} for an item that is not open");
            if let Some(id) = data.get("item_id") {
                assert_eq!(id, &output[i]["id"], "{name} names its item");
            }
        }
        let text_of = |item: &mut Value, key: &str| -> String {
            item["content"][0][key]
                .as_str()
                .unwrap_or_default()
                .to_string()
        };
        match name.as_str() {
            "response.output_item.added" => {
                assert!(
                    open.is_none(),
                    "an item opened before the previous one closed"
                );
                assert_eq!(i, output.len());
                assert_eq!(data["item"]["status"], "in_progress");
                output.push(data["item"].clone());
                open = Some(i);
            }
            "response.content_part.added" => {
                assert_eq!(data["content_index"], 0);
                output[i]["content"]
                    .as_array_mut()
                    .expect("content")
                    .push(data["part"].clone());
            }
            "response.reasoning_text.delta" | "response.output_text.delta" => {
                let want = if name.contains("reasoning") {
                    "reasoning"
                } else {
                    "message"
                };
                assert_eq!(output[i]["type"], want, "{name}");
                let text = text_of(&mut output[i], "text") + data["delta"].as_str().expect("delta");
                output[i]["content"][0]["text"] = json!(text);
            }
            "response.reasoning_text.done"
            | "response.output_text.done"
            | "response.content_part.done" => {
                let done = data.get("text").unwrap_or(&data["part"]["text"]);
                assert_eq!(
                    done, &output[i]["content"][0]["text"],
                    "{name} repeats the text"
                );
            }
            "response.function_call_arguments.delta" => {
                assert_eq!(output[i]["type"], "function_call");
                let args = output[i]["arguments"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
                    + data["delta"].as_str().expect("delta");
                output[i]["arguments"] = json!(args);
            }
            "response.function_call_arguments.done" => {
                assert_eq!(data["arguments"], output[i]["arguments"]);
            }
            "response.output_item.done" => {
                let mut item = data["item"].clone();
                let status = item["status"].clone();
                assert!(status == "completed" || status == "incomplete", "{item}");
                item["status"] = json!("in_progress");
                assert_eq!(item, output[i], "the done item is what its events built");
                output[i]["status"] = status;
                open = None;
            }
            other => panic!("unexpected event {other}"),
        }
    }
    assert!(open.is_none(), "an item was left open");
    (evs[evs.len() - 1].1["response"].clone(), output)
}

/// The response without what differs between two runs (ids, times).
fn comparable(r: &Value) -> Value {
    let mut r = r.clone();
    for k in ["id", "created_at"] {
        r.as_object_mut().expect("object").remove(k);
    }
    // The second of two equal prompts may be served from the prefix cache.
    r["usage"]["input_tokens_details"] = Value::Null;
    for item in r["output"].as_array_mut().expect("output") {
        let o = item.as_object_mut().expect("item");
        o.remove("id");
        o.remove("call_id");
    }
    r
}

#[test]
fn responses_shapes_stream_store_and_previous_response_id() {
    let s = Server::start("tiny", &[]);
    let base = json!({ "model": s.name, "input": "Say something.", "max_output_tokens": 12, "temperature": 0,
        "ignore_eos": true, "reasoning": { "effort": "none" }, "instructions": "Be brief." });
    let whole = create(&s, &base);
    let id = whole["id"].as_str().expect("id").to_string();
    assert!(id.starts_with("resp_"), "{whole}");
    assert_eq!(
        (whole["object"].as_str(), whole["status"].as_str()),
        (Some("response"), Some("incomplete")),
        "{whole}"
    );
    assert_eq!(
        whole["incomplete_details"],
        json!({ "reason": "max_output_tokens" })
    );
    assert_eq!(
        (whole["model"].as_str(), whole["instructions"].as_str()),
        (Some(s.name.as_str()), Some("Be brief."))
    );
    assert!(
        whole["created_at"]
            .as_u64()
            .is_some_and(|t| t > 1_600_000_000),
        "{whole}"
    );
    assert_eq!(
        (
            whole["store"].clone(),
            whole["tools"].clone(),
            whole["tool_choice"].clone()
        ),
        (json!(true), json!([]), json!("auto"))
    );
    let usage = &whole["usage"];
    let (input, output) = (
        usage["input_tokens"].as_u64().expect("input"),
        usage["output_tokens"].as_u64().expect("output"),
    );
    assert_eq!(
        (output, usage["total_tokens"].as_u64()),
        (12, Some(input + 12)),
        "{usage}"
    );
    assert_eq!(
        usage["output_tokens_details"]["reasoning_tokens"], 0,
        "thinking off: no reasoning"
    );
    assert!(usage["input_tokens_details"]["cached_tokens"].is_u64());
    // Thinking off: one message item, cut short.
    let items = whole["output"].as_array().expect("output");
    assert_eq!(items.len(), 1, "{whole}");
    let m = &items[0];
    assert_eq!(
        (m["type"].as_str(), m["role"].as_str(), m["status"].as_str()),
        (Some("message"), Some("assistant"), Some("incomplete"))
    );
    assert!(m["id"].as_str().is_some_and(|i| i.starts_with("msg_")));
    let part = &m["content"][0];
    assert_eq!(
        (part["type"].as_str(), part["annotations"].clone()),
        (Some("output_text"), json!([]))
    );
    assert!(part["text"].as_str().is_some_and(|t| !t.is_empty()), "{m}");

    // The stream folds into the same response (greedy: same tokens); it ends in response.incomplete.
    let mut streamed = base.clone();
    streamed["stream"] = json!(true);
    let r = s.post("/v1/responses", &streamed);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        !r.text().contains("[DONE]"),
        "the Responses stream has no [DONE]"
    );
    let evs = events(&r.text());
    assert_eq!(
        evs.last().map(|(n, _)| n.as_str()),
        Some("response.incomplete")
    );
    let (last, folded) = fold(&evs);
    assert_eq!(
        last["output"],
        json!(folded),
        "the terminal response carries the folded items"
    );
    assert_eq!(comparable(&last), comparable(&whole));

    // Stored: GET returns the whole response; store false is not kept; DELETE forgets.
    let got = s.request("GET", &format!("/v1/responses/{id}"), &[], None);
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(got.json(), whole);
    let streamed_id = last["id"].as_str().expect("id");
    assert_eq!(
        s.request("GET", &format!("/v1/responses/{streamed_id}"), &[], None)
            .json(),
        last,
        "a stream is stored at its end"
    );
    let mut unstored = base.clone();
    unstored["store"] = json!(false);
    let u = create(&s, &unstored);
    assert_eq!(u["store"], false);
    let gone = s.request(
        "GET",
        &format!("/v1/responses/{}", u["id"].as_str().expect("id")),
        &[],
        None,
    );
    assert_eq!(check_error(&gone, 404, "response_not_found"), Value::Null);
    let del = s.request("DELETE", &format!("/v1/responses/{streamed_id}"), &[], None);
    assert_eq!(del.status, 200, "{}", del.text());
    assert_eq!(
        del.json(),
        json!({ "id": streamed_id, "object": "response.deleted", "deleted": true })
    );
    check_error(
        &s.request("GET", &format!("/v1/responses/{streamed_id}"), &[], None),
        404,
        "response_not_found",
    );

    // previous_response_id continues the conversation: the same prompt (and, greedy, the same
    // reply) as sending the earlier input and output as items. Instructions are not carried over.
    let follow = json!({ "model": s.name, "previous_response_id": id, "input": "And again.", "max_output_tokens": 6,
        "temperature": 0, "ignore_eos": true, "reasoning": { "effort": "none" }, "instructions": "Be brief." });
    let next = create(&s, &follow);
    assert_eq!(next["previous_response_id"], id.as_str());
    let mut explicit = follow.clone();
    explicit
        .as_object_mut()
        .expect("body")
        .remove("previous_response_id");
    let mut items = vec![json!({ "role": "user", "content": "Say something." })];
    items.extend(whole["output"].as_array().expect("output").iter().cloned());
    items.push(
        json!({ "role": "user", "content": [{ "type": "input_text", "text": "And again." }] }),
    );
    explicit["input"] = json!(items);
    let same = create(&s, &explicit);
    assert_eq!(
        next["usage"]["input_tokens"], same["usage"]["input_tokens"],
        "{next} {same}"
    );
    assert!(
        next["usage"]["input_tokens"].as_u64() > Some(input),
        "the history is in the prompt"
    );
    assert_eq!(next["output"][0]["content"], same["output"][0]["content"]);
    let unknown = json!({ "model": s.name, "previous_response_id": "resp_nope", "input": "x" });
    assert_eq!(
        check_error(
            &s.post("/v1/responses", &unknown),
            400,
            "previous_response_not_found"
        ),
        "previous_response_id"
    );

    // Thinking on: a reasoning item first, its text counted in reasoning_tokens.
    let mut thinking = base.clone();
    thinking["reasoning"] = json!({ "effort": "high" });
    thinking["max_output_tokens"] = json!(8);
    let t = create(&s, &thinking);
    let first = &t["output"][0];
    assert_eq!(
        (first["type"].as_str(), first["summary"].clone()),
        (Some("reasoning"), json!([])),
        "{t}"
    );
    assert_eq!(first["content"][0]["type"], "reasoning_text");
    assert!(
        t["usage"]["output_tokens_details"]["reasoning_tokens"]
            .as_u64()
            .is_some_and(|n| n >= 1),
        "{t}"
    );
    check_streamed_alike(&s, &thinking, "response.reasoning_text.delta", &t);
}

/// `body` streamed: its events include `delta`, and folded they give `whole`.
fn check_streamed_alike(s: &Server, body: &Value, delta: &str, whole: &Value) {
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let evs = events(&s.post("/v1/responses", &streamed).text());
    assert!(evs.iter().any(|(n, _)| n == delta), "no {delta} event");
    let (last, _) = fold(&evs);
    assert_eq!(comparable(&last), comparable(whole));
}

fn weather_tool() -> Value {
    json!([{ "type": "function", "name": "get_weather", "description": "Weather of a city.", "strict": true,
        "parameters": { "type": "object", "properties": { "city": { "type": "string", "maxLength": 12 },
            "days": { "type": "integer", "minimum": 1, "maximum": 7 } }, "required": ["city", "days"], "additionalProperties": false } }])
}

fn check_call(item: &Value) -> Value {
    assert_eq!(
        (
            item["type"].as_str(),
            item["name"].as_str(),
            item["status"].as_str()
        ),
        (
            Some("function_call"),
            Some("get_weather"),
            Some("completed")
        ),
        "{item}"
    );
    assert!(
        item["id"].as_str().is_some_and(|i| i.starts_with("fc_")),
        "{item}"
    );
    assert!(
        item["call_id"]
            .as_str()
            .is_some_and(|i| i.starts_with("call_")),
        "{item}"
    );
    let args: Value = serde_json::from_str(item["arguments"].as_str().expect("arguments"))
        .expect("arguments are JSON");
    check_weather_args(&args);
    args
}

/// `get_weather`'s arguments keep to its schema: a city of at most 12 characters, 1 to 7 days.
pub(crate) fn check_weather_args(args: &Value) {
    assert!(
        args["city"]
            .as_str()
            .is_some_and(|c| c.chars().count() <= 12),
        "{args}"
    );
    assert!(
        args["days"].as_u64().is_some_and(|d| (1..=7).contains(&d)),
        "{args}"
    );
}

#[test]
fn forced_function_call_streams_alike_and_round_trips() {
    let s = Server::start("tiny", &[]);
    let body = json!({ "model": s.name, "input": "Weather in Oslo?", "tools": weather_tool(), "max_output_tokens": 200,
        "tool_choice": { "type": "function", "name": "get_weather" }, "parallel_tool_calls": false,
        "reasoning": { "effort": "none" }, "temperature": 0 });
    let whole = create(&s, &body);
    assert_eq!(whole["status"], "completed", "{whole}");
    let calls: Vec<&Value> = whole["output"]
        .as_array()
        .expect("output")
        .iter()
        .filter(|i| i["type"] == "function_call")
        .collect();
    assert_eq!(calls.len(), 1, "{whole}");
    check_call(calls[0]);
    assert_eq!(
        whole["tools"],
        weather_tool(),
        "tools are echoed in the Responses shape"
    );

    check_streamed_alike(&s, &body, "response.function_call_arguments.delta", &whole);

    // The call's output goes back by previous_response_id, naming its call_id.
    let call_id = calls[0]["call_id"].as_str().expect("call_id");
    let answer = json!({ "model": s.name, "previous_response_id": whole["id"], "tools": weather_tool(), "max_output_tokens": 4,
        "input": [{ "type": "function_call_output", "call_id": call_id, "output": "sunny, 20 C" }], "reasoning": { "effort": "none" } });
    let next = create(&s, &answer);
    assert!(
        next["usage"]["input_tokens"].as_u64() > whole["usage"]["input_tokens"].as_u64(),
        "{next}"
    );
    // … or with the items sent back by hand; a call_id nobody made is refused.
    let mut items = vec![json!({ "role": "user", "content": "Weather in Oslo?" })];
    items.extend(whole["output"].as_array().expect("output").iter().cloned());
    items.push(
        json!({ "type": "function_call_output", "call_id": call_id, "output": "sunny, 20 C" }),
    );
    let by_hand = json!({ "model": s.name, "tools": weather_tool(), "max_output_tokens": 4, "reasoning": { "effort": "none" }, "input": items });
    let same = create(&s, &by_hand);
    assert_eq!(same["usage"]["input_tokens"], next["usage"]["input_tokens"]);
    let mut wrong = answer.clone();
    wrong["input"][0]["call_id"] = json!("call_nobody");
    assert_eq!(
        check_error(&s.post("/v1/responses", &wrong), 400, "invalid_value"),
        "input[0].call_id"
    );
}

#[test]
fn responses_errors_name_their_field() {
    let s = Server::start("tiny", &[]);
    let ok = json!({ "model": s.name, "input": "x", "max_output_tokens": 2 });
    let with = |key: &str, v: Value| {
        let mut b = ok.clone();
        b[key] = v;
        b
    };
    let param = |body: Value, code: &str| check_error(&s.post("/v1/responses", &body), 400, code);
    let mut missing = ok.clone();
    missing.as_object_mut().expect("body").remove("input");
    assert_eq!(param(missing, "missing_required_parameter"), "input");
    assert_eq!(
        param(
            with(
                "input",
                json!([{ "type": "input_image", "image_url": "x" }])
            ),
            "unsupported_parameter"
        ),
        "input[0].type"
    );
    assert_eq!(
        param(
            with(
                "input",
                json!([{ "role": "user", "content": [{ "type": "input_file", "file_id": "f" }] }])
            ),
            "unsupported_parameter"
        ),
        "input[0].content[0].type"
    );
    assert_eq!(
        param(
            with("input", json!([{ "role": "assistant", "content": "hi" }])),
            "invalid_value"
        ),
        "input"
    );
    assert_eq!(
        param(
            with("tools", json!([{ "type": "web_search" }])),
            "unsupported_parameter"
        ),
        "tools[0].type"
    );
    assert_eq!(
        param(with("tool_choice", json!("required")), "invalid_value"),
        "tool_choice"
    );
    assert_eq!(
        param(
            with(
                "text",
                json!({ "format": { "type": "json_schema", "name": "x" } })
            ),
            "missing_required_parameter"
        ),
        "text.format.schema"
    );
    assert_eq!(
        param(
            with("reasoning", json!({ "effort": "huge" })),
            "invalid_value"
        ),
        "reasoning.effort"
    );
    assert_eq!(
        param(with("background", json!(true)), "unsupported_parameter"),
        "background"
    );
    assert_eq!(
        param(with("max_output_tokens", json!(0)), "invalid_value"),
        "max_output_tokens"
    );
    assert_eq!(
        param(with("temperature", json!("hot")), "invalid_value"),
        "temperature"
    );
    // Accepted and ignored: bookkeeping fields, encrypted reasoning asked for, a summary setting.
    let fine = json!({ "model": s.name, "input": "x", "max_output_tokens": 2, "user": "u1", "include": ["reasoning.encrypted_content"],
        "reasoning": { "effort": "low", "summary": "auto" }, "text": { "verbosity": "low" }, "truncation": "disabled" });
    create(&s, &fine);
    check_error(
        &s.request("GET", "/v1/responses/resp_nope", &[], None),
        404,
        "response_not_found",
    );
}
