//! `hostd serve` structured output end to end on the tiny model (random weights):
//! `response_format` json_schema on chat (thinking off and on, streaming and not) and
//! json_object on completions must return JSON that parses and conforms, ending with
//! finish_reason `stop`; schema errors are 400s naming `response_format`. Also the mask cost
//! on the real 248k vocabulary (printed; the numbers in docs/structured-output.md come from it).

use super::serve::{Server, check_error, user};
use hostd::constraint::{Commit, ConstraintSpec, Grammars, StartOptions};
use hostd::tokenizer::Tokenizer;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bounded everywhere (string length, integer range, enum), so a random model finishes.
fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 10},
            "count": {"type": "integer", "minimum": 0, "maximum": 99},
            "kind": {"type": "string", "enum": ["cat", "dog"]},
            "ok": {"type": "boolean"}
        },
        "required": ["name", "count", "kind", "ok"],
        "additionalProperties": false
    })
}

fn check_conforms(text: &str) {
    let v: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"));
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {text}"));
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["count", "kind", "name", "ok"], "{text}");
    assert!(
        o["name"].as_str().is_some_and(|s| s.chars().count() <= 10),
        "{text}"
    );
    assert!(o["count"].as_u64().is_some_and(|n| n <= 99), "{text}");
    assert!(o["kind"] == "cat" || o["kind"] == "dog", "{text}");
    assert!(o["ok"].is_boolean(), "{text}");
}

fn request(s: &Server, thinking: bool, seed: u64) -> Value {
    json!({
        "model": s.name, "messages": user("A pet, as JSON."), "max_tokens": 600, "temperature": 1, "seed": seed,
        "chat_template_kwargs": {"enable_thinking": thinking},
        "response_format": {"type": "json_schema", "json_schema": {"name": "pet", "strict": true, "schema": schema()}}
    })
}

#[test]
fn json_schema_replies_conform_with_random_weights() {
    let s = Server::start("tiny", &[]);
    for (thinking, seed) in [(false, 1), (false, 2), (false, 3), (true, 4), (true, 5)] {
        let r = s.chat(request(&s, thinking, seed));
        let choice = &r["choices"][0];
        assert_eq!(
            choice["finish_reason"], "stop",
            "thinking {thinking} seed {seed}: {r}"
        );
        check_conforms(choice["message"]["content"].as_str().expect("content"));
        if thinking {
            assert!(choice["message"]["reasoning_content"].is_string(), "{r}");
        }
    }

    // Streaming: the concatenated content conforms, and equals the whole reply for the same seed.
    let mut body = request(&s, false, 9);
    let whole = s.chat(body.clone());
    body["stream"] = json!(true);
    let r = s.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let data = r.sse_data();
    let mut content = String::new();
    let mut finish = Value::Null;
    for d in &data[..data.len() - 1] {
        let c: Value = serde_json::from_str(d).expect("chunk");
        if let Some(ch) = c["choices"].get(0) {
            content.push_str(ch["delta"]["content"].as_str().unwrap_or(""));
            if !ch["finish_reason"].is_null() {
                finish = ch["finish_reason"].clone();
            }
        }
    }
    assert_eq!(finish, "stop");
    check_conforms(&content);
    assert_eq!(
        content,
        whole["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
    );

    // Legacy completions: json_object from the first token.
    let r = s.post(
        "/v1/completions",
        &json!({"model": s.name, "prompt": "{", "max_tokens": 300, "temperature": 0.7, "seed": 3, "response_format": {"type": "json_object"}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let c = r.json();
    let text = c["choices"][0]["text"]
        .as_str()
        .expect("text")
        .trim_start_matches('\n');
    assert!(text.starts_with('{'), "{c}");
    if c["choices"][0]["finish_reason"] == "stop" {
        assert!(
            serde_json::from_str::<Value>(text).is_ok_and(|v| v.is_object()),
            "{c}"
        );
    }

    // Unconstrained requests still work next to constrained ones.
    let plain = s.chat(json!({"model": s.name, "messages": user("hi"), "max_tokens": 5, "temperature": 0, "ignore_eos": true}));
    assert_eq!(plain["usage"]["completion_tokens"], 5);
}

#[test]
fn bad_response_formats_are_400s_naming_the_field() {
    let s = Server::start("tiny", &[]);
    let bad = |rf: Value| {
        s.post("/v1/chat/completions", &json!({"model": s.name, "messages": user("x"), "max_tokens": 4, "response_format": rf}))
    };
    let missing_ref = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/Nope"}}, "required": ["a"]}}});
    assert_eq!(
        check_error(&bad(missing_ref), 400, "invalid_value"),
        "response_format"
    );
    assert_eq!(
        check_error(&bad(json!({"type": "yaml"})), 400, "invalid_value"),
        "response_format.type"
    );
    assert_eq!(
        check_error(
            &bad(json!({"type": "json_schema", "json_schema": {"name": "x"}})),
            400,
            "missing_required_parameter"
        ),
        "response_format.json_schema.schema"
    );
    // A text format is free text, as before.
    let r = s.post("/v1/chat/completions", &json!({"model": s.name, "messages": user("x"), "max_tokens": 3, "response_format": {"type": "text"}}));
    assert_eq!(r.status, 200, "{}", r.text());
}

/// Builds the grammar engine over the real Qwen3.6 vocabulary and measures the mask per token
/// of a JSON-schema answer (random allowed tokens, closing with `"`/`}` when possible).
#[test]
fn mask_cost_on_the_real_vocabulary() {
    let path = super::tokenizer::real_tokenizer_json();
    let tok = Arc::new(Tokenizer::from_file(&path).expect("real tokenizer"));
    let eos = vec![tok.im_end_id().unwrap(), tok.endoftext_id().unwrap()];
    let grammars = Grammars::new(Arc::clone(&tok), eos);
    let t0 = Instant::now();
    let mut c = grammars
        .compile(
            &ConstraintSpec::JsonSchema(schema()),
            StartOptions::new(false, 1000),
        )
        .expect("compile");
    let first = t0.elapsed();
    let vocab = tok.vocab_size();
    let logits = vec![0.0f32; 248_320];
    let closers: Vec<Vec<u32>> = ["\"", "}", "1", "true", "\"cat\""]
        .iter()
        .map(|s| tok.encode(s).unwrap())
        .collect();
    let (mut masks, mut spent, mut worst) = (0u32, Duration::ZERO, Duration::ZERO);
    let mut ids = Vec::new();
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    'walk: for step in 0..400 {
        let t = Instant::now();
        let masked = c.mask_logits(&logits, vocab).expect("mask");
        let dt = t.elapsed();
        (masks, spent, worst) = (masks + 1, spent + dt, worst.max(dt));
        let allowed: Vec<u32> = (0..vocab as u32)
            .filter(|&i| masked[i as usize].is_finite())
            .collect();
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let mut pick = allowed[(rng % allowed.len() as u64) as usize];
        if (step % 3 == 0 || step > 100)
            && let Some(t) = closers.iter().find(|t| c.accepted_prefix(t) == t.len())
        {
            pick = t[0];
        }
        match c.commit(pick).expect("commit") {
            Commit::Continue => ids.push(pick),
            Commit::End => break 'walk,
            Commit::Complete => {
                ids.push(pick);
                break 'walk;
            }
        }
        if c.is_accepting() {
            break;
        }
    }
    let text = tok.decode(&ids).unwrap();
    check_conforms(text.trim_start_matches('\n'));
    let mean = spent / masks.max(1);
    println!(
        "mask cost, {vocab}-token vocabulary: engine build + first compile {first:?}; {masks} masks, mean {mean:?}, worst {worst:?} per token (answer {text:?})"
    );
    // Generous bound: far above what was measured, low enough to catch a pathological regression.
    assert!(mean < Duration::from_millis(50), "mean mask time {mean:?}");
}

/// `tool_choice` `required` or naming a function: constrained decoding writes the call, so even
/// random weights return `tool_calls` whose arguments follow each schema (bounded here so the
/// call ends within `max_tokens`), with finish_reason `tool_calls`, thinking off and on. One call
/// per reply (`parallel_tool_calls: false`): with parallel calls allowed, the grammar lets the
/// model decide how many, and random weights may keep calling until `max_tokens`.
#[test]
fn forced_tool_calls_are_valid_with_random_weights() {
    let s = Server::start("tiny", &[]);
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"]}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}}}
    ]);
    let named = json!({"type": "function", "function": {"name": "get_time"}});
    // The last two also carry a response format: the forced call is written (issue 39 (b);
    // it was a 400, which broke the Agents SDK's `output_type` with `tool_choice="required"`).
    let format = json!({"type": "json_schema", "json_schema": {"name": "a", "schema": schema()}});
    for (choice, thinking, seed, response_format) in [
        (json!("required"), false, 1, Value::Null),
        (json!("required"), true, 2, Value::Null),
        (named.clone(), false, 3, Value::Null),
        (named.clone(), true, 4, Value::Null),
        (json!("required"), false, 5, format.clone()),
        (named, false, 6, json!({"type": "json_object"})),
    ] {
        let r = s.chat(json!({
            "model": s.name, "messages": user("Weather in Oslo?"), "tools": tools, "tool_choice": choice,
            "parallel_tool_calls": false, "max_tokens": 400, "temperature": 1, "seed": seed, "chat_template_kwargs": {"enable_thinking": thinking},
            "response_format": response_format
        }));
        let c = &r["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{r}");
        let calls = c["message"]["tool_calls"].as_array().expect("tool_calls");
        assert!(!calls.is_empty(), "{r}");
        for call in calls {
            let name = call["function"]["name"].as_str().expect("name");
            let args: Value =
                serde_json::from_str(call["function"]["arguments"].as_str().expect("arguments"))
                    .expect("JSON arguments");
            match name {
                "get_weather" => {
                    assert!(choice == "required", "{r}");
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
                "get_time" => assert!(args["zone"] == "UTC" || args["zone"] == "CET", "{args}"),
                other => panic!("unexpected function {other}: {r}"),
            }
        }
    }
}
