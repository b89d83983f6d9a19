//! The web page and its live feed over HTTP (the browser test, tests/web, drives the page
//! itself): `/` serves the compiled-in page with a hash-pinned content security policy and is
//! gone with `--no-web-page`; `/v1/live` needs the API key like every `/v1/` route, its frames
//! count exactly the routings of the tokens a request computed, and with expertd its per-layer
//! hits and misses, disk reads and the daemon's memory add up to what the daemon reports.

use crate::serve::Server;
use serde_json::{Value, json};
use std::io::BufRead;
use std::time::Instant;

/// One request's frames: the frame before it, the frames that cover it (until the token
/// counter has taken it in, plus one), its usage and its wall time in seconds.
struct Covered {
    before: Value,
    after: Vec<Value>,
    prompt: u64,
    completion: u64,
    wall_s: f64,
}

fn around_one_request(s: &Server, key: Option<&str>, eos: [u32; 2], max_tokens: u64) -> Covered {
    let auth = key.map(|k| format!("Bearer {k}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
    let stream = s
        .send("GET", "/v1/live?interval_ms=200", &headers, None)
        .expect("GET /v1/live");
    assert_eq!(stream.status(), 200);
    let mut reader = std::io::BufReader::new(stream.into_body().into_reader());
    let mut line = String::new();
    let mut next = || loop {
        line.clear();
        assert!(
            reader.read_line(&mut line).expect("read") > 0,
            "live stream ended"
        );
        if let Some(d) = line.strip_prefix("data: ") {
            return serde_json::from_str::<Value>(d.trim()).expect("frame JSON");
        }
    };
    let before = next();
    let bias: serde_json::Map<String, Value> =
        eos.iter().map(|id| (id.to_string(), json!(-100))).collect();
    let body = json!({
        "model": s.name,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "logit_bias": bias,
    });
    let t = Instant::now();
    let r = s.request(
        "POST",
        "/v1/chat/completions",
        &headers,
        Some(&body.to_string()),
    );
    let wall_s = t.elapsed().as_secs_f64();
    assert_eq!(r.status, 200, "{}", r.text());
    let usage = r.json()["usage"].clone();
    let (prompt, completion) = (
        usage["prompt_tokens"].as_u64().expect("prompt"),
        usage["completion_tokens"].as_u64().expect("completion"),
    );
    assert_eq!(completion, max_tokens);
    let target = before["tokens"]["generated_total"].as_u64().expect("total") + completion;
    let mut after = vec![next()];
    while after.last().expect("frame")["tokens"]["generated_total"].as_u64() < Some(target) {
        after.push(next());
    }
    after.push(next());
    Covered {
        before,
        after,
        prompt,
        completion,
        wall_s,
    }
}

fn sum_array(frames: &[Value], path: &[&str]) -> u64 {
    frames
        .iter()
        .map(|f| {
            let mut v = f;
            for p in path {
                v = &v[*p];
            }
            v.as_array()
                .unwrap_or_else(|| panic!("{}", path.join(".")))
                .iter()
                .map(|x| x.as_u64().expect("count"))
                .sum::<u64>()
        })
        .sum()
}

fn tiny_config() -> Value {
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(tests::model_dir("tiny").join("config.json")).expect("config"),
    )
    .expect("json");
    config.get("text_config").cloned().unwrap_or(config)
}

/// The tiny fixture's stop ids (`<|endoftext|>`, `<|im_end|>`), biased away.
const TINY_EOS: [u32; 2] = [400, 402];

#[test]
fn the_page_is_served_with_a_pinned_policy_and_can_be_turned_off() {
    let s = Server::start("tiny", &[]);
    let r = s.request("GET", "/", &[], None);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    let csp = r
        .header("content-security-policy")
        .expect("CSP")
        .to_string();
    let directives: Vec<&str> = csp.split("; ").collect();
    assert_eq!(directives[0], "default-src 'none'", "{csp}");
    assert!(directives[1].starts_with("script-src 'sha256-"), "{csp}");
    assert!(directives[2].starts_with("style-src 'sha256-"), "{csp}");
    assert_eq!(
        &directives[3..],
        [
            "connect-src 'self'",
            "img-src data:",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'"
        ],
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

    let c = around_one_request(&s, Some("live-key"), TINY_EOS, 12);
    let cfg = tiny_config();
    let layers = cfg["num_hidden_layers"].as_u64().expect("layers");
    let top_k = cfg["num_experts_per_tok"].as_u64().expect("top_k");
    assert_eq!(c.before["experts"]["layers"].as_u64(), Some(layers));
    assert_eq!(c.before["experts"]["experts"], cfg["num_experts"]);
    assert_eq!(c.before["experts"]["backend"], "bf16");
    assert!(c.before["daemon"].is_null() && c.before["experts"]["layer_misses"].is_null());
    assert!(c.before["rss_bytes"]["hostd"].as_u64().expect("rss") > 0);
    assert!(c.before["rss_bytes"]["expertd"].is_null());
    // Every prompt token and every generated token but the last (never fed back) is routed
    // once per layer.
    let rows = c.prompt + c.completion - 1;
    assert_eq!(
        sum_array(&c.after, &["experts", "routed"]),
        rows * layers * top_k
    );
    let generated: u64 = c
        .after
        .iter()
        .map(|f| {
            let rate = f["tokens"]["generated_per_s"].as_f64().expect("rate");
            (rate * f["interval_s"].as_f64().expect("s")).round() as u64
        })
        .sum();
    assert_eq!(generated, c.completion);
    let ttft: Vec<f64> = c
        .after
        .iter()
        .filter_map(|f| f["ttft"]["mean_s"].as_f64())
        .collect();
    assert_eq!(ttft.len(), 1, "one request, one first token: {ttft:?}");
    assert!(
        ttft[0] > 0.0 && ttft[0] < c.wall_s,
        "TTFT {ttft:?} s of a {} s request",
        c.wall_s
    );
}

#[test]
fn with_expertd_the_per_layer_counts_and_reads_add_up_to_the_daemons() {
    let dir = tempfile::tempdir().expect("tempdir");
    let container = dir.path().join("experts");
    let s = Server::start(
        "tiny",
        &[
            "--experts",
            "expertd",
            "--container",
            container.to_str().expect("path"),
        ],
    );
    let c = around_one_request(&s, None, TINY_EOS, 12);
    let last = c.after.last().expect("frame");
    assert_eq!(last["experts"]["backend"], "expertd");
    let daemon = &last["daemon"];
    assert!(daemon.is_object(), "{last}");
    let layers = tiny_config()["num_hidden_layers"].as_u64().expect("layers") as usize;
    assert_eq!(
        last["experts"]["layer_misses"].as_array().map(Vec::len),
        Some(layers)
    );
    // The daemon started cold with this one client: its lookups are this client's.
    let before_lookups = c.before["daemon"]["hits"].as_u64().expect("hits")
        + c.before["daemon"]["misses"].as_u64().expect("misses");
    let lookups = daemon["hits"].as_u64().expect("hits") + daemon["misses"].as_u64().expect("m");
    let hits = sum_array(&c.after, &["experts", "layer_hits"]);
    let misses = sum_array(&c.after, &["experts", "layer_misses"]);
    assert!(misses > 0, "a cold daemon reads: {last}");
    assert_eq!(hits + misses, lookups - before_lookups, "{last}");
    let read: f64 = c
        .after
        .iter()
        .map(|f| {
            f["disk"]["read_bytes_per_s"].as_f64().expect("rate")
                * f["interval_s"].as_f64().expect("s")
        })
        .sum();
    let daemon_read = daemon["bytes_read"].as_u64().expect("read")
        - c.before["daemon"]["bytes_read"].as_u64().expect("read");
    assert!(daemon_read > 0);
    assert!(
        (read - daemon_read as f64).abs() < 1.0,
        "{read} vs {daemon_read}"
    );
    assert!(last["rss_bytes"]["expertd"].as_u64().expect("daemon RSS") > 1 << 20);
    let sessions = daemon["sessions"].as_array().expect("sessions");
    assert_eq!(sessions.len(), 1, "{daemon}");
    assert_eq!(sessions[0]["client_name"], "hostd serve");
}
