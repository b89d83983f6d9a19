//! `hostd serve`'s field policy and the smaller OpenAI features of issue 13, end to end on the
//! tiny fixture: unknown and known-harmless fields accepted, known-unsupported ones refused with
//! their `param`, type errors naming the field, the thinking switches, an agent loop's
//! `model_dump()` history, `n` choices, `logit_bias`, special tokens skipped, the end-of-turn
//! token counted in usage, fill-in-the-middle and CORS.

use crate::serve::{Server, check_error, user};
use serde_json::{Value, json};
use tests::model_dir;

fn token_id(text: &str) -> u32 {
    let tok = hostd::tokenizer::Tokenizer::from_model_dir(model_dir("tiny")).expect("tokenizer");
    tok.token_id(text)
        .unwrap_or_else(|| panic!("{text} in the tiny vocabulary"))
}

fn with(base: &Value, extra: Value) -> Value {
    let mut b = base.clone();
    b.as_object_mut()
        .expect("object")
        .extend(extra.as_object().expect("object").clone());
    b
}

fn content(reply: &Value, i: usize) -> String {
    reply["choices"][i]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("content of choice {i}: {reply}"))
        .to_string()
}

#[test]
fn field_policy_errors_and_thinking_switches() {
    let s = Server::start("tiny", &[]);
    let base =
        json!({ "model": s.name, "messages": user("hi"), "max_tokens": 3, "temperature": 0 });
    let chat = |b: &Value| s.post("/v1/chat/completions", b);

    // Unknown fields and the known-harmless ones newer clients send are accepted.
    let harmless = json!({ "frobnicate": true, "store": false, "metadata": {"k": "v"}, "user": "u", "prompt_cache_key": "pk",
        "safety_identifier": "sid", "verbosity": "low", "service_tier": "auto", "prediction": {"type": "content", "content": "x"},
        "stream_options": {"include_obfuscation": false}, "modalities": ["text"], "use_beam_search": false });
    assert_eq!(chat(&with(&base, harmless)).status, 200);
    // Fields whose meaning would silently change are refused, naming themselves.
    assert_eq!(
        check_error(
            &chat(&with(&base, json!({ "use_beam_search": true }))),
            400,
            "unsupported_parameter"
        ),
        "use_beam_search"
    );
    assert_eq!(
        check_error(
            &chat(&with(&base, json!({ "audio": {"voice": "alloy"} }))),
            400,
            "unsupported_parameter"
        ),
        "audio"
    );
    assert_eq!(
        check_error(
            &chat(&with(&base, json!({ "cache_salt": "x" }))),
            400,
            "unsupported_parameter"
        ),
        "cache_salt"
    );
    // Type errors name the field (they used to say `param: null`), nested keys with their path.
    assert_eq!(
        check_error(
            &chat(&with(&base, json!({ "temperature": "hot" }))),
            400,
            "invalid_value"
        ),
        "temperature"
    );
    assert_eq!(
        check_error(
            &chat(&with(&base, json!({ "n": "two" }))),
            400,
            "invalid_value"
        ),
        "n"
    );
    let kw = with(&base, json!({ "chat_template_kwargs": { "colour": true } }));
    assert_eq!(
        check_error(&chat(&kw), 400, "unsupported_parameter"),
        "chat_template_kwargs.colour"
    );
    let so = with(
        &base,
        json!({ "stream": true, "stream_options": { "include_usage": "yes" } }),
    );
    assert_eq!(
        check_error(&chat(&so), 400, "invalid_value"),
        "stream_options.include_usage"
    );

    // Thinking switches: reasoning_effort none / enable_thinking false render the same prompt
    // as chat_template_kwargs; include_reasoning false hides the reasoning of a thinking reply.
    let tokens = |b: &Value| {
        s.chat(b.clone())["usage"]["prompt_tokens"]
            .as_u64()
            .expect("prompt_tokens")
    };
    let off = tokens(&with(
        &base,
        json!({ "chat_template_kwargs": { "enable_thinking": false } }),
    ));
    let on = tokens(&base);
    assert_ne!(off, on);
    assert_eq!(
        tokens(&with(&base, json!({ "reasoning_effort": "none" }))),
        off
    );
    assert_eq!(
        tokens(&with(&base, json!({ "reasoning_effort": "minimal" }))),
        off
    );
    assert_eq!(
        tokens(&with(&base, json!({ "enable_thinking": false }))),
        off
    );
    assert_eq!(
        tokens(&with(&base, json!({ "reasoning_effort": "high" }))),
        on
    );
    let hidden = s.chat(with(&base, json!({ "include_reasoning": false })));
    assert!(
        hidden["choices"][0]["message"]
            .get("reasoning_content")
            .is_none(),
        "{hidden}"
    );
    assert_eq!(hidden["usage"]["prompt_tokens"].as_u64(), Some(on));
    assert!(s.chat(base.clone())["choices"][0]["message"]["reasoning_content"].is_string());
    let clash = with(
        &base,
        json!({ "chat_template_kwargs": { "enable_thinking": true }, "reasoning_effort": "none" }),
    );
    assert_eq!(
        check_error(&chat(&clash), 400, "invalid_value"),
        "reasoning_effort"
    );
    assert_eq!(
        check_error(
            &chat(&with(&base, json!({ "reasoning_effort": "max" }))),
            400,
            "invalid_value"
        ),
        "reasoning_effort"
    );

    // An agent loop appends `message.model_dump()` to the history: every field it carries is
    // accepted, and `reasoning` renders exactly as `reasoning_content`.
    let dumped = |reasoning_key: &str| {
        let mut m = json!({ "role": "assistant", "content": "ok", "refusal": null, "annotations": [], "audio": null,
            "function_call": null, "tool_calls": null });
        m[reasoning_key] = json!("because");
        json!([{ "role": "user", "content": "hi" }, m, { "role": "user", "content": "and?" }])
    };
    let a = s.chat(with(&base, json!({ "messages": dumped("reasoning_content"), "chat_template_kwargs": { "preserve_thinking": true } })));
    let b = s.chat(with(&base, json!({ "messages": dumped("reasoning"), "chat_template_kwargs": { "preserve_thinking": true } })));
    assert_eq!(a["usage"]["prompt_tokens"], b["usage"]["prompt_tokens"]);
    assert_eq!(content(&a, 0), content(&b, 0));
    let audio = with(
        &base,
        json!({ "messages": [{ "role": "assistant", "content": "x", "audio": { "id": "a1" } }, { "role": "user", "content": "y" }] }),
    );
    assert_eq!(
        check_error(&chat(&audio), 400, "unsupported_parameter"),
        "messages[0].audio"
    );
}

#[test]
fn n_choices_logit_bias_special_tokens_usage_and_fim() {
    let s = Server::start("tiny", &["--max-batch", "4"]);
    let im_end = token_id("<|im_end|>");
    let vision_end = token_id("<|vision_end|>");
    let off = json!({ "enable_thinking": false });
    let base = json!({ "model": s.name, "messages": user("hi"), "max_tokens": 3, "temperature": 0, "chat_template_kwargs": off });

    // A reply that ends at once (the end-of-turn token forced) used one token.
    let now = s.chat(with(
        &base,
        json!({ "logit_bias": { im_end.to_string(): 100 } }),
    ));
    assert_eq!(
        (
            content(&now, 0).as_str(),
            now["choices"][0]["finish_reason"].clone()
        ),
        ("", json!("stop")),
        "{now}"
    );
    assert_eq!(now["usage"]["completion_tokens"], 1, "{now}");

    // Special tokens are skipped in content unless skip_special_tokens is false.
    let forced = with(
        &base,
        json!({ "logit_bias": { vision_end.to_string(): 100 }, "ignore_eos": true }),
    );
    let skipped = s.chat(forced.clone());
    assert_eq!(
        (
            content(&skipped, 0),
            skipped["usage"]["completion_tokens"].clone()
        ),
        (String::new(), json!(3)),
        "{skipped}"
    );
    let kept = s.chat(with(&forced, json!({ "skip_special_tokens": false })));
    assert_eq!(content(&kept, 0), "<|vision_end|>".repeat(3));

    // logit_bias −100 bans the greedy reply's first token; a bad id names itself.
    let plain = s.chat(with(&base, json!({ "logprobs": true, "ignore_eos": true })));
    let first = plain["choices"][0]["logprobs"]["content"][0]["bytes"].clone();
    let tok = hostd::tokenizer::Tokenizer::from_model_dir(model_dir("tiny")).expect("tokenizer");
    let first_id = (0..tok.vocab_size() as u32)
        .find(|&id| tok.token_bytes(id).map(|b| json!(b)) == Some(first.clone()))
        .expect("first token's id");
    let banned = s.chat(with(&base, json!({ "logprobs": true, "ignore_eos": true, "logit_bias": { first_id.to_string(): -100 } })));
    assert_ne!(
        banned["choices"][0]["logprobs"]["content"][0]["bytes"], first,
        "{banned}"
    );
    let bad = with(&base, json!({ "logit_bias": { "99999999": 5 } }));
    assert_eq!(
        check_error(&s.post("/v1/chat/completions", &bad), 400, "invalid_value"),
        "logit_bias.99999999"
    );

    // n: independent seeded choices, deterministic, choice 0 = the n = 1 reply; greedy
    // choices are identical; usage sums the completions.
    let sampled = json!({ "model": s.name, "messages": user("Tell me a story"), "max_tokens": 8, "temperature": 1.0, "seed": 11,
        "ignore_eos": true, "chat_template_kwargs": off });
    let three = s.chat(with(&sampled, json!({ "n": 3 })));
    let texts: Vec<String> = (0..3).map(|i| content(&three, i)).collect();
    assert_eq!(
        (0..3)
            .map(|i| three["choices"][i]["index"].clone())
            .collect::<Vec<_>>(),
        [json!(0), json!(1), json!(2)]
    );
    assert_eq!(three["usage"]["completion_tokens"], 24);
    assert!(
        texts[0] != texts[1] || texts[1] != texts[2],
        "seeded choices all equal: {texts:?}"
    );
    assert_eq!(content(&s.chat(sampled.clone()), 0), texts[0]);
    let again = s.chat(with(&sampled, json!({ "n": 3 })));
    assert_eq!(
        (0..3).map(|i| content(&again, i)).collect::<Vec<_>>(),
        texts
    );
    let greedy = s.chat(with(&base, json!({ "n": 2, "ignore_eos": true })));
    assert_eq!(content(&greedy, 0), content(&greedy, 1));
    assert_eq!(
        check_error(
            &s.post("/v1/chat/completions", &with(&base, json!({ "n": 9 }))),
            400,
            "invalid_value"
        ),
        "n"
    );

    // Streaming n = 3: every chunk names its choice; per choice the text equals the whole
    // reply's; one finish chunk per choice, then one usage chunk with the sum.
    let r = s.post(
        "/v1/chat/completions",
        &with(
            &sampled,
            json!({ "n": 3, "stream": true, "stream_options": { "include_usage": true } }),
        ),
    );
    let data = r.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).expect("chunk"))
        .collect();
    let mut streamed = vec![String::new(); 3];
    let mut finishes = 0;
    for c in &chunks[..chunks.len() - 1] {
        let ch = &c["choices"][0];
        let i = ch["index"].as_u64().expect("index") as usize;
        streamed[i].push_str(ch["delta"]["content"].as_str().unwrap_or(""));
        finishes += usize::from(ch["finish_reason"].is_string());
    }
    assert_eq!((streamed, finishes), (texts, 3));
    let usage = &chunks[chunks.len() - 1];
    assert_eq!(
        (
            usage["choices"].clone(),
            usage["usage"]["completion_tokens"].clone()
        ),
        (json!([]), json!(24))
    );

    // Completions: n and fill-in-the-middle (the same as writing the FIM tokens by hand).
    let c = s.post("/v1/completions", &json!({ "model": s.name, "prompt": "The cat", "max_tokens": 4, "n": 2, "temperature": 0, "ignore_eos": true })).json();
    assert_eq!(
        (
            c["choices"][1]["index"].clone(),
            c["usage"]["completion_tokens"].clone()
        ),
        (json!(1), json!(8))
    );
    let fim = |b: Value| {
        s.post(
            "/v1/completions",
            &with(
                &json!({ "model": s.name, "max_tokens": 6, "temperature": 0, "ignore_eos": true }),
                b,
            ),
        )
        .json()
    };
    let a = fim(json!({ "prompt": "def add(a, b):\n    ", "suffix": "\n    return c\n" }));
    let b = fim(
        json!({ "prompt": "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n    return c\n<|fim_middle|>" }),
    );
    assert_eq!(
        (a["choices"][0]["text"].clone(), a["usage"].clone()),
        (b["choices"][0]["text"].clone(), b["usage"].clone())
    );
    let plain = fim(json!({ "prompt": "def add(a, b):\n    " }));
    assert!(a["usage"]["prompt_tokens"].as_u64() > plain["usage"]["prompt_tokens"].as_u64());
    let ids = s.post(
        "/v1/completions",
        &json!({ "model": s.name, "prompt": [1, 2, 3], "suffix": "x" }),
    );
    assert_eq!(check_error(&ids, 400, "unsupported_parameter"), "suffix");
}

#[test]
fn cors_preflight_only_for_configured_origins() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, "k3y").expect("key file");
    let s = Server::start(
        "tiny",
        &[
            "--cors-allow-origin",
            "https://app.example",
            "--api-key-file",
            key_file.to_str().expect("path"),
        ],
    );
    let preflight = |origin: &str| {
        s.request(
            "OPTIONS",
            "/v1/chat/completions",
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", "POST"),
                (
                    "Access-Control-Request-Headers",
                    "authorization, content-type",
                ),
            ],
            None,
        )
    };
    // The preflight is answered without the API key (browsers send none) for the allowed origin.
    let ok = preflight("https://app.example");
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(
        ok.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert!(
        ok.header("access-control-allow-methods")
            .is_some_and(|m| m.contains("POST"))
    );
    assert!(
        preflight("https://evil.example")
            .header("access-control-allow-origin")
            .is_none()
    );
    let body = json!({ "model": s.name, "messages": user("hi"), "max_tokens": 1 }).to_string();
    let r = s.request(
        "POST",
        "/v1/chat/completions",
        &[
            ("Origin", "https://app.example"),
            ("Authorization", "Bearer k3y"),
        ],
        Some(&body),
    );
    assert_eq!(
        (r.status, r.header("access-control-allow-origin")),
        (200, Some("https://app.example"))
    );
    drop(s);

    // Without --cors-allow-origin: no CORS headers, and OPTIONS is not a method of the API.
    let plain = Server::start("tiny", &[]);
    let r = plain.request(
        "OPTIONS",
        "/v1/chat/completions",
        &[
            ("Origin", "https://app.example"),
            ("Access-Control-Request-Method", "POST"),
        ],
        None,
    );
    assert_eq!(r.status, 405);
    assert!(r.header("access-control-allow-origin").is_none());
}
