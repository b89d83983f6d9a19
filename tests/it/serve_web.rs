//! The web page and its live feed over HTTP (the browser test, tests/web, drives the page
//! itself): `/` serves the compiled-in page with a strict content security policy and is gone
//! with `--no-web-page`; `/v1/live` needs the API key like every `/v1/` route, and its frames
//! count exactly the routings of the tokens a request computed.

use crate::serve::Server;
use serde_json::{Value, json};
use std::io::BufRead;

/// Reads `n` `data:` frames of a `/v1/live` stream.
fn frames(s: &Server, key: Option<&str>, n: usize) -> Vec<Value> {
    let auth = key.map(|k| format!("Bearer {k}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
    let stream = s
        .send("GET", "/v1/live?interval_ms=200", &headers, None)
        .expect("GET /v1/live");
    assert_eq!(stream.status(), 200);
    let mut reader = std::io::BufReader::new(stream.into_body().into_reader());
    let mut out = Vec::new();
    let mut line = String::new();
    while out.len() < n {
        line.clear();
        assert!(
            reader.read_line(&mut line).expect("read") > 0,
            "live stream ended"
        );
        if let Some(data) = line.strip_prefix("data: ") {
            out.push(serde_json::from_str(data.trim()).expect("frame JSON"));
        }
    }
    out
}

#[test]
fn the_page_is_served_with_a_strict_policy_and_can_be_turned_off() {
    let s = Server::start("tiny", &[]);
    let r = s.request("GET", "/", &[], None);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    let csp = r
        .header("content-security-policy")
        .expect("CSP")
        .to_string();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"),
        "{csp}"
    );
    let page = r.text();
    assert!(page.contains("/v1/live") && page.contains("/v1/chat/completions"));
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "the page fetches nothing from elsewhere"
    );
    assert_eq!(
        s.request("GET", "/health", &[], None).json()["api_key_required"],
        false
    );
    drop(s);

    let s = Server::start("tiny", &["--no-web-page"]);
    assert_eq!(s.request("GET", "/", &[], None).status, 404);
    // The feed stays (other dashboards may read it); only its head is read here.
    let feed = s
        .send("GET", "/v1/live?interval_ms=200", &[], None)
        .expect("live");
    assert_eq!(feed.status(), 200);
}

#[test]
fn live_frames_need_the_key_and_count_each_computed_token_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key_file = dir.path().join("keys");
    std::fs::write(&key_file, "live-key\n").expect("write keys");
    let s = Server::start(
        "tiny",
        &["--api-key-file", key_file.to_str().expect("path")],
    );
    assert_eq!(
        s.request("GET", "/health", &[], None).json()["api_key_required"],
        true
    );
    assert_eq!(s.request("GET", "/v1/live", &[], None).status, 401);
    // Only the page is public.
    assert_eq!(s.request("GET", "/", &[], None).status, 200);

    let first = frames(&s, Some("live-key"), 1).remove(0);
    let (layers, experts) = (
        first["experts"]["layers"].as_u64().expect("layers"),
        first["experts"]["experts"].as_u64().expect("experts"),
    );
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(tests::model_dir("tiny").join("config.json")).expect("config"),
    )
    .expect("json");
    let text = config.get("text_config").unwrap_or(&config);
    assert_eq!(layers, text["num_hidden_layers"].as_u64().expect("layers"));
    assert_eq!(experts, text["num_experts"].as_u64().expect("experts"));
    let top_k = text["num_experts_per_tok"].as_u64().expect("top_k");
    assert_eq!(first["experts"]["backend"], "bf16");
    assert!(first["daemon"].is_null() && first["experts"]["layer_misses"].is_null());
    assert!(first["rss_bytes"]["hostd"].as_u64().expect("rss") > 0);

    // Routed counts of the frames that cover one request: every prompt token and every
    // generated token but the last (which is never fed back) is routed once per layer.
    let auth = "Bearer live-key";
    let routed_total = |f: &[Value]| -> u64 {
        f.iter()
            .map(|x| {
                x["experts"]["routed"]
                    .as_array()
                    .expect("routed")
                    .iter()
                    .map(|v| v.as_u64().expect("count"))
                    .sum::<u64>()
            })
            .sum()
    };
    let stream = s
        .send(
            "GET",
            "/v1/live?interval_ms=200",
            &[("Authorization", auth)],
            None,
        )
        .expect("live");
    let mut reader = std::io::BufReader::new(stream.into_body().into_reader());
    let mut line = String::new();
    let mut next = || loop {
        line.clear();
        assert!(reader.read_line(&mut line).expect("read") > 0);
        if let Some(d) = line.strip_prefix("data: ") {
            return serde_json::from_str::<Value>(d.trim()).expect("json");
        }
    };
    let before = next();
    let body = json!({
        "model": s.name,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 12,
        "temperature": 0,
        "logit_bias": {"400": -100, "402": -100},
    });
    let r = s.request(
        "POST",
        "/v1/chat/completions",
        &[("Authorization", auth)],
        Some(&body.to_string()),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let usage = r.json()["usage"].clone();
    let (prompt, completion) = (
        usage["prompt_tokens"].as_u64().expect("prompt"),
        usage["completion_tokens"].as_u64().expect("completion"),
    );
    assert_eq!(completion, 12);
    let mut after = vec![next(), next()];
    while after.last().expect("frame")["tokens"]["generated_total"].as_u64()
        < Some(before["tokens"]["generated_total"].as_u64().expect("total") + completion)
    {
        after.push(next());
    }
    after.push(next());
    let rows = prompt + completion - 1;
    assert_eq!(routed_total(&after), rows * layers * top_k, "{after:?}");
    let generated: u64 = after
        .iter()
        .map(|f| {
            (f["tokens"]["generated_per_s"].as_f64().expect("rate")
                * f["interval_s"].as_f64().expect("s"))
            .round() as u64
        })
        .sum();
    assert_eq!(generated, completion);
    assert!(after.iter().any(|f| f["ttft"]["mean_s"].as_f64().is_some()));
}
