//! Unit tests of the field policy: parse errors naming their field, the ignored / refused /
//! unknown split, the thinking switches, and `docs/api.md` listing every rule.

use super::*;
use crate::http::openai::{ChatCompletionRequest, CompletionRequest};
use serde_json::json;

fn err_of<T: DeserializeOwned + std::fmt::Debug>(body: Value) -> (String, Option<String>) {
    let e = parse_body::<T>(body.to_string().as_bytes()).expect_err("should fail");
    let b = e.body();
    (
        b["error"]["code"].as_str().unwrap_or("").to_string(),
        b["error"]["param"].as_str().map(str::to_string),
    )
}

#[test]
fn type_errors_and_nested_unknown_keys_name_their_field() {
    let chat = |extra: Value| {
        let mut b = json!({"model": "m", "messages": []});
        b.as_object_mut()
            .expect("object")
            .extend(extra.as_object().expect("object").clone());
        err_of::<ChatCompletionRequest>(b)
    };
    assert_eq!(
        chat(json!({"temperature": "hot"})),
        ("invalid_value".into(), Some("temperature".into()))
    );
    assert_eq!(
        chat(json!({"max_tokens": 1.5})),
        ("invalid_value".into(), Some("max_tokens".into()))
    );
    assert_eq!(
        chat(json!({"stream_options": {"include_usage": "yes"}})),
        (
            "invalid_value".into(),
            Some("stream_options.include_usage".into())
        )
    );
    assert_eq!(
        chat(json!({"chat_template_kwargs": {"enable_thinking": 1}})),
        (
            "invalid_value".into(),
            Some("chat_template_kwargs.enable_thinking".into())
        )
    );
    assert_eq!(
        chat(json!({"chat_template_kwargs": {"colour": true}})),
        (
            "unsupported_parameter".into(),
            Some("chat_template_kwargs.colour".into())
        )
    );
    assert_eq!(
        chat(json!({"stream_options": {"continuous_usage_stats": true}})),
        (
            "unsupported_parameter".into(),
            Some("stream_options.continuous_usage_stats".into())
        )
    );
    assert_eq!(
        err_of::<CompletionRequest>(json!({"model": "m", "suffix": 3})),
        ("invalid_value".into(), Some("suffix".into()))
    );
    let e = parse_body::<ChatCompletionRequest>(b"{\"model\": ").expect_err("truncated");
    assert_eq!(e.code(), "invalid_json");
    let e = parse_body::<ChatCompletionRequest>(b"{\"model\": \"m\"} x").expect_err("trailing");
    assert_eq!(e.code(), "invalid_json");
}

#[test]
fn known_harmless_and_unknown_fields_pass_and_refused_ones_name_themselves() {
    let body = json!({"model": "m", "messages": [], "store": true, "metadata": {"a": "b"}, "prompt_cache_key": "k",
        "safety_identifier": "u", "verbosity": "low", "service_tier": "auto", "prediction": {"type": "content", "content": "x"},
        "stream_options": {"include_obfuscation": false}, "frobnicate": 1, "use_beam_search": false, "audio": null});
    let r: ChatCompletionRequest = parse_body(body.to_string().as_bytes()).expect("parses");
    assert!(r.extra.contains_key("frobnicate") && r.extra.contains_key("store"));
    check_extra(&r.extra, &[REFUSED, REFUSED_CHAT], &[IGNORED], "").expect("accepted");
    for (field, value) in [
        ("use_beam_search", json!(true)),
        ("audio", json!({"voice": "alloy", "format": "mp3"})),
        ("web_search_options", json!({})),
        ("min_tokens", json!(4)),
        ("guided_json", json!({"type": "object"})),
        ("cache_salt", json!("s")),
        ("add_generation_prompt", json!(false)),
    ] {
        let extra: Map<String, Value> = [(field.to_string(), value)].into_iter().collect();
        let e = check_extra(&extra, &[REFUSED, REFUSED_CHAT], &[IGNORED], "").expect_err(field);
        assert_eq!(e.body()["error"]["param"], field);
        assert_eq!(e.code(), "unsupported_parameter");
    }
}

#[test]
fn thinking_switches_map_and_must_agree() {
    let t = |f: ThinkingFields<'_>| {
        thinking(&f, true).map_err(|e| {
            e.body()["error"]["param"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
    };
    let on = Thinking {
        enabled: true,
        shown: true,
    };
    let off = Thinking {
        enabled: false,
        shown: true,
    };
    assert_eq!(t(ThinkingFields::default()), Ok(on));
    assert_eq!(thinking(&ThinkingFields::default(), false).ok(), Some(off));
    assert_eq!(
        t(ThinkingFields {
            reasoning_effort: Some("none"),
            ..Default::default()
        }),
        Ok(off)
    );
    assert_eq!(
        t(ThinkingFields {
            reasoning_effort: Some("minimal"),
            ..Default::default()
        }),
        Ok(off)
    );
    assert_eq!(
        t(ThinkingFields {
            reasoning_effort: Some("high"),
            ..Default::default()
        }),
        Ok(on)
    );
    assert_eq!(
        t(ThinkingFields {
            reasoning_effort: Some("max"),
            ..Default::default()
        }),
        Err("reasoning_effort".into())
    );
    assert_eq!(
        t(ThinkingFields {
            enable_thinking: Some(false),
            ..Default::default()
        }),
        Ok(off)
    );
    assert_eq!(
        t(ThinkingFields {
            include_reasoning: Some(false),
            ..Default::default()
        }),
        Ok(Thinking {
            enabled: true,
            shown: false
        })
    );
    let conflict = ThinkingFields {
        template_kwarg: Some(true),
        reasoning_effort: Some("none"),
        ..Default::default()
    };
    assert_eq!(t(conflict), Err("reasoning_effort".into()));
    let agree = ThinkingFields {
        template_kwarg: Some(false),
        enable_thinking: Some(false),
        reasoning_effort: Some("none"),
        ..Default::default()
    };
    assert_eq!(t(agree), Ok(off));
    let r = json!({"effort": "low", "exclude": true});
    assert_eq!(
        t(ThinkingFields {
            reasoning: Some(&r),
            ..Default::default()
        }),
        Ok(Thinking {
            enabled: true,
            shown: false
        })
    );
    let r = json!({"enabled": false});
    assert_eq!(
        t(ThinkingFields {
            reasoning: Some(&r),
            ..Default::default()
        }),
        Ok(off)
    );
    let r = json!({"max_tokens": 100});
    assert_eq!(
        t(ThinkingFields {
            reasoning: Some(&r),
            ..Default::default()
        }),
        Err("reasoning.max_tokens".into())
    );
}

/// `docs/api.md` names every rule of the tables above, so the page cannot fall behind them.
#[test]
fn the_api_page_lists_every_rule() {
    let page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/api.md"),
    )
    .expect("docs/api.md");
    for rule in [
        IGNORED,
        REFUSED,
        REFUSED_CHAT,
        IGNORED_MESSAGE,
        REFUSED_MESSAGE,
    ]
    .iter()
    .flat_map(|l| l.iter())
    {
        assert!(
            page.contains(&format!("`{}`", rule.name)),
            "docs/api.md does not mention `{}`",
            rule.name
        );
    }
}
