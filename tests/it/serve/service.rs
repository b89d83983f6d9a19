//! hostd serve as a service: cancellation on disconnect, the queue limit, API keys, prefix reuse
//! across turns, the thinking default, and the Prometheus metrics.

use super::*;

#[test]
fn disconnect_cancels_and_frees_state() {
    let s = Server::start("tiny", &[]);
    let stream = open_long_stream(&s, 5);
    assert_eq!(s.metric("hostd_active_sequences"), 1.0);
    assert!(s.metric("hostd_active_state_bytes") > 0.0);
    drop(stream);
    wait_for(
        "the cancelled sequence to leave",
        Duration::from_secs(20),
        || {
            s.metric("hostd_active_sequences") == 0.0
                && s.metric("hostd_sequences_cancelled_total") == 1.0
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

#[test]
fn full_queue_answers_429_with_retry_after() {
    let s = Server::start("tiny", &["--max-batch", "1", "--max-queue", "1"]);
    let running = open_long_stream(&s, 2);
    // The second request waits in the queue (its SSE head arrives once it is queued).
    let body =
        json!({ "model": s.name, "messages": user("wait"), "max_tokens": 4, "stream": true });
    let queued = s
        .send("POST", "/v1/chat/completions", &[], Some(&body.to_string()))
        .expect("send");
    assert_eq!(queued.status(), 200);
    wait_for("one queued request", Duration::from_secs(10), || {
        s.metric("hostd_queue_depth") == 1.0
    });
    let r = s.post(
        "/v1/chat/completions",
        &json!({ "model": s.name, "messages": user("x"), "max_tokens": 1 }),
    );
    check_error(&r, 429, "queue_full");
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(s.metric("hostd_queue_rejected_total"), 1.0);
    drop(running);
    drop(queued);
}

#[test]
fn api_key_is_required_when_configured_and_for_public_binds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, "s3cret\n").expect("write key");
    let s = Server::start(
        "tiny",
        &["--api-key-file", key_file.to_str().expect("path")],
    );
    check_error(
        &s.request("GET", "/v1/models", &[], None),
        401,
        "invalid_api_key",
    );
    check_error(
        &s.request(
            "GET",
            "/v1/models",
            &[("Authorization", "Bearer wrong")],
            None,
        ),
        401,
        "invalid_api_key",
    );
    assert_eq!(
        s.request(
            "GET",
            "/v1/models",
            &[("Authorization", "Bearer s3cret")],
            None
        )
        .status,
        200
    );
    assert_eq!(s.request("GET", "/health", &[], None).status, 200);
    // A non-loopback bind without a key is refused before anything is bound.
    let out = Command::new(workspace_bin("hostd"))
        .args([
            "serve",
            "--model",
            model_dir("tiny").to_str().expect("path"),
            "--host",
            "0.0.0.0",
            "--port",
            "0",
        ])
        .output()
        .expect("hostd serve");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("requires an API key"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Time to the first generated text of a streaming chat request.
fn stream_ttft(s: &Server, messages: &Value, max_tokens: usize) -> (Duration, Value) {
    let body = json!({ "model": s.name, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": true,
                       "stream_options": { "include_usage": true }, "ignore_eos": true });
    let start = Instant::now();
    let stream = s
        .send("POST", "/v1/chat/completions", &[], Some(&body.to_string()))
        .expect("send");
    let mut reader = BufReader::new(stream.into_body().into_reader());
    let (mut ttft, mut usage, mut line) = (None, Value::Null, String::new());
    let deadline = start + IO_TIMEOUT;
    while Instant::now() < deadline {
        line.clear();
        if reader.read_line(&mut line).expect("read") == 0 {
            break;
        }
        let Some(data) = line.trim_end().strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let c: Value = serde_json::from_str(data).expect("chunk");
        let d = &c["choices"][0]["delta"];
        if ttft.is_none()
            && (d["reasoning_content"].is_string()
                || d["content"].as_str().is_some_and(|t| !t.is_empty()))
        {
            ttft = Some(start.elapsed());
        }
        if c["usage"].is_object() {
            usage = c["usage"].clone();
        }
    }
    (ttft.expect("some text arrived"), usage)
}

#[test]
fn second_turn_reuses_the_first_turns_state() {
    let s = Server::start("small", &[]);
    let first = json!([{ "role": "system", "content": "You are terse." }, { "role": "user", "content": "Tell me a story about a lighthouse. ".repeat(20) }]);
    let reply = s.chat(json!({ "model": s.name, "messages": first, "max_tokens": 8, "temperature": 0, "ignore_eos": true }));
    assert_eq!(reply["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let msg = &reply["choices"][0]["message"];
    let mut second = first.as_array().expect("messages").clone();
    second.push(json!({ "role": "assistant", "content": msg["content"], "reasoning_content": msg["reasoning_content"] }));
    second.push(json!({ "role": "user", "content": "And then?" }));
    let (ttft, usage) = stream_ttft(&s, &Value::Array(second.clone()), 4);
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    let prompt = usage["prompt_tokens"].as_u64().unwrap_or(0);
    assert!(
        cached > 0 && cached < prompt,
        "second turn: {cached} of {prompt} prompt tokens cached"
    );
    assert!(
        s.metric("hostd_state_cache_hits_total") >= 1.0
            && s.metric("hostd_state_cache_bytes") > 0.0
    );

    let cold = Server::start("small", &["--state-cache-bytes", "0"]);
    let (cold_ttft, cold_usage) = stream_ttft(&cold, &Value::Array(second), 4);
    assert_eq!(cold_usage["prompt_tokens_details"]["cached_tokens"], 0);
    eprintln!(
        "second-turn TTFT on small ({prompt} prompt tokens): {ttft:?} with reuse ({cached} cached), {cold_ttft:?} without"
    );
}

#[test]
fn default_thinking_off_answers_at_once_and_a_request_can_still_think() {
    let s = Server::start("tiny", &["--default-thinking", "off"]);
    let body = json!({ "model": s.name, "messages": user("Hello"), "max_tokens": 4, "temperature": 0, "ignore_eos": true });
    let plain = s.chat(body.clone());
    assert!(
        plain["choices"][0]["message"]
            .get("reasoning_content")
            .is_none(),
        "{plain}"
    );
    let mut think = body;
    think["chat_template_kwargs"] = json!({ "enable_thinking": true });
    let thought = s.chat(think);
    assert!(
        thought["choices"][0]["message"]["reasoning_content"].is_string(),
        "{thought}"
    );
    // Thinking off renders an empty think block into the prompt: more prompt tokens.
    let tokens = |r: &Value| {
        r["usage"]["prompt_tokens"]
            .as_u64()
            .unwrap_or_else(|| panic!("no usage: {r}"))
    };
    assert!(tokens(&plain) > tokens(&thought));
}

/// The families `GET /metrics` serves, as prometheus_client's parser names them (counters
/// without `_total`), with their types.
const METRIC_FAMILIES: &[(&str, &str)] = &[
    ("hostd_requests", "counter"),
    ("hostd_request_duration_seconds", "histogram"),
    ("hostd_time_to_first_token_seconds", "histogram"),
    ("hostd_time_per_output_token_seconds", "histogram"),
    ("hostd_e2e_request_seconds", "histogram"),
    ("hostd_prompt_tokens", "counter"),
    ("hostd_cached_prompt_tokens", "counter"),
    ("hostd_generation_tokens", "counter"),
    ("hostd_queue_depth", "gauge"),
    ("hostd_queued_prompt_tokens", "gauge"),
    ("hostd_queue_rejected", "counter"),
    ("hostd_active_sequences", "gauge"),
    ("hostd_active_state_bytes", "gauge"),
    ("hostd_sequences_cancelled", "counter"),
    ("hostd_sequences_finished", "counter"),
    ("hostd_sequences_failed", "counter"),
    ("hostd_engine_panics", "counter"),
    ("hostd_decode_steps", "counter"),
    ("hostd_decode_rows", "counter"),
    ("hostd_prefill_chunks", "counter"),
    ("hostd_mixed_steps", "counter"),
    ("hostd_state_cache_bytes", "gauge"),
    ("hostd_state_cache_entries", "gauge"),
    ("hostd_state_cache_blocks", "gauge"),
    ("hostd_state_cache_hits", "counter"),
    ("hostd_state_cache_misses", "counter"),
    ("hostd_state_cache_evictions", "counter"),
    ("hostd_state_disk_saved", "counter"),
    ("hostd_state_disk_loaded", "counter"),
    ("hostd_state_disk_refused", "counter"),
    ("hostd_state_disk_skipped", "counter"),
    ("hostd_state_disk_evicted", "counter"),
    ("hostd_state_disk_bytes", "gauge"),
    ("hostd_model_loaded", "gauge"),
];

/// The latency histograms' `le` bounds, `+Inf` last.
const LATENCY_LE: &[&str] = &[
    "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5",
    "10", "30", "60", "120", "300", "+Inf",
];

/// `/metrics` is Prometheus text (format 0.0.4) that prometheus_client's parser reads, with
/// exactly the documented families and types; every histogram series has the fixed bounds,
/// cumulative, and a `_count` equal to its `+Inf` bucket; one chat and one 404 are counted.
#[test]
fn metrics_parse_as_prometheus_text_with_every_family_and_type() {
    let s = Server::start("tiny", &[]);
    let reply = s.chat(json!({ "model": s.name, "messages": user("Hello"), "max_tokens": 2, "temperature": 0, "ignore_eos": true }));
    check_error(
        &s.request("GET", "/v1/nothing", &[], None),
        404,
        "unknown_url",
    );
    let r = s.request("GET", "/metrics", &[], None);
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let families = tests::parse_prometheus_text(&r.text());

    let got: Vec<(&str, &str)> = families
        .iter()
        .map(|f| {
            (
                f["name"].as_str().expect("name"),
                f["type"].as_str().expect("type"),
            )
        })
        .collect();
    assert_eq!(got, METRIC_FAMILIES, "families and types");
    let samples = |family: &str| -> Vec<(String, serde_json::Map<String, Value>, f64)> {
        let f = families
            .iter()
            .find(|f| f["name"] == family)
            .unwrap_or_else(|| panic!("{family} missing"));
        let all = f["samples"].as_array().expect("samples");
        all.iter()
            .map(|s| {
                (
                    s[0].as_str().expect("sample name").to_string(),
                    s[1].as_object().expect("labels").clone(),
                    s[2].as_f64().expect("value"),
                )
            })
            .collect()
    };
    let value = |family: &str, sample: &str, labels: &[(&str, &str)]| -> f64 {
        let hits: Vec<f64> = samples(family)
            .into_iter()
            .filter(|(n, l, _)| {
                n == sample
                    && l.len() == labels.len()
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).and_then(Value::as_str) == Some(*v))
            })
            .map(|(_, _, v)| v)
            .collect();
        assert_eq!(hits.len(), 1, "{sample}{labels:?}: {hits:?}");
        hits[0]
    };

    for family in METRIC_FAMILIES
        .iter()
        .filter(|(_, t)| *t == "histogram")
        .map(|(f, _)| *f)
    {
        // Series by endpoint (the one label besides `le`): bounds in order, cumulative, +Inf = _count.
        let mut series: std::collections::BTreeMap<Option<String>, Vec<(String, f64)>> =
            Default::default();
        for (name, labels, v) in samples(family) {
            if name == format!("{family}_bucket") {
                let le = labels
                    .get("le")
                    .and_then(Value::as_str)
                    .expect("le")
                    .to_string();
                let endpoint = labels
                    .get("endpoint")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                assert_eq!(
                    labels.len(),
                    1 + usize::from(endpoint.is_some()),
                    "{family}: {labels:?}"
                );
                series.entry(endpoint).or_default().push((le, v));
            }
        }
        let expect_series = if family == "hostd_request_duration_seconds" {
            10
        } else {
            1
        };
        assert_eq!(series.len(), expect_series, "{family}: {series:?}");
        for (endpoint, buckets) in &series {
            let les: Vec<&str> = buckets.iter().map(|(le, _)| le.as_str()).collect();
            assert_eq!(les, LATENCY_LE, "{family} {endpoint:?}");
            assert!(
                buckets.windows(2).all(|w| w[0].1 <= w[1].1),
                "{family} {endpoint:?}: not cumulative: {buckets:?}"
            );
            let labels: Vec<(&str, &str)> =
                endpoint.iter().map(|e| ("endpoint", e.as_str())).collect();
            assert_eq!(
                value(family, &format!("{family}_count"), &labels),
                buckets[buckets.len() - 1].1,
                "{family} {endpoint:?}"
            );
            assert!(value(family, &format!("{family}_sum"), &labels) >= 0.0);
        }
    }

    let chat = [("endpoint", "/v1/chat/completions"), ("status", "200")];
    assert_eq!(value("hostd_requests", "hostd_requests_total", &chat), 1.0);
    assert_eq!(
        value(
            "hostd_requests",
            "hostd_requests_total",
            &[("endpoint", "other"), ("status", "404")]
        ),
        1.0
    );
    assert_eq!(
        value(
            "hostd_request_duration_seconds",
            "hostd_request_duration_seconds_count",
            &[("endpoint", "/v1/chat/completions")]
        ),
        1.0
    );
    assert_eq!(
        value(
            "hostd_time_to_first_token_seconds",
            "hostd_time_to_first_token_seconds_count",
            &[]
        ),
        1.0
    );
    assert_eq!(
        value(
            "hostd_e2e_request_seconds",
            "hostd_e2e_request_seconds_count",
            &[]
        ),
        1.0
    );
    assert_eq!(
        value(
            "hostd_sequences_finished",
            "hostd_sequences_finished_total",
            &[]
        ),
        1.0
    );
    let completion_tokens = reply["usage"]["completion_tokens"].as_f64().expect("usage");
    assert_eq!(
        value(
            "hostd_generation_tokens",
            "hostd_generation_tokens_total",
            &[]
        ),
        completion_tokens
    );
    assert_eq!(value("hostd_model_loaded", "hostd_model_loaded", &[]), 1.0);
    assert_eq!(value("hostd_queue_depth", "hostd_queue_depth", &[]), 0.0);
}
