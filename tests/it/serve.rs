//! `hostd serve` end to end: the real binary on a free loopback port against fixture models,
//! driven over HTTP by `ureq` (issue: an OpenAI-compatible server).
//!
//! Covers status codes and OpenAI's error shape, greedy equality with `hostd run`, four
//! concurrent greedy requests equal to their solo runs (with batching observed in /metrics),
//! client-disconnect cancellation, the 429 queue limit, API keys, prefix reuse on a second
//! turn, and `/metrics` read by prometheus_client's parser. Every wait is bounded in time;
//! every server is killed when its guard drops. The client here (`Server`, `Response`, `Stream`)
//! serves every `serve_*` module; `serve_limits.rs` alone writes raw bytes (half-open, slow and
//! malformed requests are what it tests).

use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tests::{Killed, model_dir, wait_for, workspace_bin};

mod service;

/// The longest wait for a response head or body (a prefill of thousands of tokens included).
const IO_TIMEOUT: Duration = Duration::from_secs(300);

/// A running `hostd serve`, killed on drop.
pub(crate) struct Server {
    pub(crate) child: Killed,
    addr: SocketAddr,
    pub(crate) name: String,
    agent: ureq::Agent,
}

/// A response whose body is still being read (a stream), as `Server::send` returns it;
/// dropping it closes the connection.
pub(crate) type Stream = ureq::http::Response<ureq::Body>;

/// Spawns `hostd serve --model DIR --port 0 --served-model-name NAME EXTRA…` (stdout piped,
/// stderr discarded) and returns it with the address its first stdout line names (≤ 60 s).
/// Each test module wraps the child in its own `Server` with the requests it needs.
pub(crate) fn spawn_serve(
    dir: &std::path::Path,
    name: &str,
    extra: &[&str],
) -> (Child, SocketAddr) {
    let mut child = Command::new(workspace_bin("hostd"))
        .args([
            "serve",
            "--model",
            dir.to_str().expect("utf-8 path"),
            "--port",
            "0",
            "--served-model-name",
            name,
        ])
        .args(extra)
        .env("SLUICE_THREADS", "2")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn hostd serve");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("hostd serve printed its address");
    let addr = line
        .trim()
        .rsplit("http://")
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    (child, addr)
}

impl Server {
    /// Starts the server on `preset` (served as `sluice-{preset}`) with extra flags and waits
    /// (≤ 60 s) for /health = 200.
    pub(crate) fn start(preset: &str, extra: &[&str]) -> Server {
        Server::start_as(preset, &format!("sluice-{preset}"), extra)
    }

    /// [`Server::start`], serving the model as `name`.
    pub(crate) fn start_as(preset: &str, name: &str, extra: &[&str]) -> Server {
        let (child, addr) = spawn_serve(&model_dir(preset), name, extra);
        // A connection per request, as the tests count connections and close streams by
        // dropping them; 4xx and 5xx are responses to look at, not errors.
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_idle_connections(0)
            .timeout_connect(Some(Duration::from_secs(10)))
            .timeout_recv_response(Some(IO_TIMEOUT))
            .timeout_recv_body(Some(IO_TIMEOUT))
            .build()
            .new_agent();
        let server = Server {
            child: Killed(child),
            addr,
            name: name.to_string(),
            agent,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = server.try_request("GET", "/health", &[], None)
                && r.status == 200
            {
                return server;
            }
            assert!(
                Instant::now() < deadline,
                "server on {preset} not ready within 60 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub(crate) fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Response {
        self.try_request(method, path, headers, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    pub(crate) fn try_request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Result<Response, ureq::Error> {
        Response::read(self.send(method, path, headers, body)?)
    }

    /// Sends a request (a JSON body, when given) and returns the response once its head has
    /// arrived, its body still to read (streams, disconnects).
    pub(crate) fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Result<Stream, ureq::Error> {
        let mut req = ureq::http::Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr));
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        match body {
            Some(body) => self.agent.run(req.body(body.to_string())?),
            None => self.agent.run(req.body(())?),
        }
    }

    pub(crate) fn post(&self, path: &str, body: &Value) -> Response {
        self.request("POST", path, &[], Some(&body.to_string()))
    }

    pub(crate) fn chat(&self, body: Value) -> Value {
        let r = self.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    }

    /// One metric's value from /metrics.
    pub(crate) fn metric(&self, name: &str) -> f64 {
        let text = self.request("GET", "/metrics", &[], None).text();
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name)
                    .and_then(|r| r.strip_prefix(' '))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or_else(|| panic!("metric {name} missing"))
    }
}

/// A whole response.
pub(crate) struct Response {
    pub(crate) status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    /// Reads the rest of an open response.
    pub(crate) fn read(stream: Stream) -> Result<Response, ureq::Error> {
        let status = stream.status().as_u16();
        let headers = stream
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let body = stream
            .into_body()
            .with_config()
            .limit(u64::MAX)
            .read_to_vec()?;
        Ok(Response {
            status,
            headers,
            body,
        })
    }
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "status {}: body is not JSON ({e}): {}",
                self.status,
                self.text()
            )
        })
    }
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    /// The `data:` payloads of an SSE body.
    pub(crate) fn sse_data(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }
}

/// The lines of an open response's body, as they arrive; dropping it closes the connection.
pub(crate) type Lines = BufReader<ureq::BodyReader<'static>>;

/// Sends a streaming request to `path` and reads until `n` lines starting with `prefix` (an SSE
/// field: `data: `, `event: `) arrived; returns the rest of the stream, still open.
pub(crate) fn open_stream(s: &Server, path: &str, body: &Value, prefix: &str, n: usize) -> Lines {
    let stream = s
        .send("POST", path, &[], Some(&body.to_string()))
        .expect("send");
    assert_eq!(stream.status(), 200);
    let mut reader = BufReader::new(stream.into_body().into_reader());
    let (mut seen, mut line) = (0, String::new());
    while seen < n {
        line.clear();
        let got = reader.read_line(&mut line).expect("read stream");
        assert!(got > 0, "stream ended early");
        if line.starts_with(prefix) {
            seen += 1;
        }
    }
    reader
}

/// Asserts OpenAI's error shape and the status; returns `error.param`.
pub(crate) fn check_error(r: &Response, status: u16, code: &str) -> Value {
    assert_eq!(r.status, status, "{}", r.text());
    let e = &r.json()["error"];
    for key in ["message", "type", "param", "code"] {
        assert!(e.get(key).is_some(), "error.{key} missing: {e}");
    }
    assert_eq!(e["code"], code, "{e}");
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()));
    e["param"].clone()
}

pub(crate) fn user(text: &str) -> Value {
    json!([{ "role": "user", "content": text }])
}

/// The generated tokens' bytes, from the logprobs entries (one per generated token).
fn token_bytes(reply: &Value) -> Vec<Vec<u8>> {
    reply["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("logprobs.content")
        .iter()
        .map(|e| {
            e["bytes"]
                .as_array()
                .expect("bytes")
                .iter()
                .map(|b| b.as_u64().expect("byte") as u8)
                .collect()
        })
        .collect()
}

#[test]
fn health_models_and_error_shapes() {
    let s = Server::start("tiny", &["--max-body-bytes", "4096", "--max-context", "64"]);
    let h = s.request("GET", "/health", &[], None);
    assert_eq!(h.json()["status"], "ready");
    assert!(h.header("x-request-id").is_some_and(|v| !v.is_empty()));
    let m = s.request("GET", "/v1/models", &[], None).json();
    assert_eq!(
        (
            m["object"].clone(),
            m["data"][0]["id"].clone(),
            m["data"][0]["object"].clone()
        ),
        (json!("list"), json!(s.name), json!("model"))
    );
    let ok = |extra: Value| {
        let mut b = json!({ "model": s.name, "messages": user("hi"), "max_tokens": 2 });
        b.as_object_mut()
            .expect("object")
            .extend(extra.as_object().expect("object").clone());
        b
    };
    let chat = |b: &Value| s.post("/v1/chat/completions", b);

    let r = s.request("POST", "/v1/chat/completions", &[], Some("{\"model\": "));
    check_error(&r, 400, "invalid_json");
    check_error(
        &chat(&ok(json!({ "model": "gpt-4" }))),
        404,
        "model_not_found",
    );
    assert_eq!(
        check_error(
            &chat(&json!({ "model": s.name })),
            400,
            "missing_required_parameter"
        ),
        "messages"
    );
    let function_role = ok(json!({ "messages": [{ "role": "function", "content": "x" }] }));
    assert_eq!(
        check_error(&chat(&function_role), 400, "unsupported_parameter"),
        "messages[0].role"
    );
    // A tool result alone has no user query for the template to answer.
    let tool_only =
        ok(json!({ "messages": [{ "role": "tool", "content": "x", "tool_call_id": "c" }] }));
    assert_eq!(
        check_error(&chat(&tool_only), 400, "invalid_value"),
        "messages"
    );
    let image = ok(
        json!({ "messages": [{ "role": "user", "content": [{ "type": "image_url", "image_url": { "url": "http://x" } }] }] }),
    );
    assert_eq!(
        check_error(&chat(&image), 400, "unsupported_parameter"),
        "messages[0].content[0].type"
    );
    assert_eq!(
        check_error(&chat(&ok(json!({ "n": 9 }))), 400, "invalid_value"),
        "n"
    );
    assert_eq!(
        check_error(
            &chat(&ok(json!({ "temperature": 2.5 }))),
            400,
            "invalid_value"
        ),
        "temperature"
    );
    assert_eq!(
        check_error(&chat(&ok(json!({ "top_p": 0 }))), 400, "invalid_value"),
        "top_p"
    );
    assert_eq!(
        check_error(
            &chat(&ok(json!({ "stop": ["a", "b", "c", "d", "e"] }))),
            400,
            "invalid_value"
        ),
        "stop"
    );
    assert_eq!(
        check_error(&chat(&ok(json!({ "max_tokens": 0 }))), 400, "invalid_value"),
        "max_tokens"
    );
    assert_eq!(
        check_error(
            &chat(&ok(json!({ "tools": [{ "type": "function" }] }))),
            400,
            "missing_required_parameter"
        ),
        "tools[0].function"
    );
    assert_eq!(
        check_error(
            &chat(&ok(json!({ "tools": [{ "type": "web_search" }] }))),
            400,
            "unsupported_parameter"
        ),
        "tools[0].type"
    );
    // Unknown fields are accepted (field policy: `docs/api.md`); known-unsupported ones are not.
    assert_eq!(chat(&ok(json!({ "frobnicate": true }))).status, 200);
    assert_eq!(
        check_error(
            &chat(&ok(json!({ "use_beam_search": true }))),
            400,
            "unsupported_parameter"
        ),
        "use_beam_search"
    );
    // The context is 64 tokens here: a long prompt, or a budget past the end, is refused.
    let long = "word ".repeat(200);
    check_error(
        &chat(&ok(json!({ "messages": user(&long) }))),
        400,
        "context_length_exceeded",
    );
    check_error(
        &chat(&ok(json!({ "max_tokens": 60 }))),
        400,
        "context_length_exceeded",
    );
    let big = ok(json!({ "messages": user(&"x".repeat(8000)) }));
    check_error(&chat(&big), 413, "request_too_large");
    check_error(
        &s.request("GET", "/v1/nothing", &[], None),
        404,
        "unknown_url",
    );
    check_error(
        &s.request("GET", "/v1/chat/completions", &[], None),
        405,
        "method_not_allowed",
    );
    let long_completion = json!({ "model": s.name, "prompt": long, "max_tokens": 1 });
    assert_eq!(
        check_error(
            &s.post("/v1/completions", &long_completion),
            400,
            "context_length_exceeded"
        ),
        "prompt"
    );
    check_error(
        &s.post("/v1/completions", &json!({ "model": s.name })),
        400,
        "missing_required_parameter",
    );
    check_error(
        &s.post(
            "/v1/completions",
            &json!({ "model": s.name, "prompt": "a", "echo": true }),
        ),
        400,
        "unsupported_parameter",
    );

    // A valid request after all of that still works, and /metrics counted the statuses.
    let reply = s.chat(ok(json!({ "temperature": 0 })));
    assert_eq!(reply["object"], "chat.completion");
    assert_eq!(reply["choices"][0]["finish_reason"], "length");
    assert_eq!(reply["usage"]["completion_tokens"], 2);
    let metrics = s.request("GET", "/metrics", &[], None).text();
    assert!(
        metrics.contains("hostd_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"}"),
        "{metrics}"
    );
    assert!(
        metrics
            .contains("hostd_requests_total{endpoint=\"/v1/chat/completions\",status=\"413\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .all(|l| l.starts_with("hostd_"))
    );
}

#[test]
fn chat_and_completion_shapes_streaming_and_not() {
    let s = Server::start("tiny", &[]);
    let body = json!({ "model": s.name, "messages": user("Hello"), "max_tokens": 6, "temperature": 0, "ignore_eos": true });
    let whole = s.chat(body.clone());
    let msg = &whole["choices"][0]["message"];
    assert_eq!(msg["role"], "assistant");
    assert!(
        msg["reasoning_content"].is_string() && msg["content"].is_string(),
        "{whole}"
    );
    assert_eq!(
        whole["usage"]["total_tokens"],
        whole["usage"]["prompt_tokens"].as_u64().unwrap_or(0) + 6
    );

    let mut sb = body.clone();
    sb["stream"] = json!(true);
    sb["stream_options"] = json!({ "include_usage": true });
    let r = s.post("/v1/chat/completions", &sb);
    assert_eq!(r.status, 200);
    assert!(
        r.header("content-type")
            .is_some_and(|c| c.starts_with("text/event-stream"))
    );
    let data = r.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).expect("chunk JSON"))
        .collect();
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk" && c["id"] == chunks[0]["id"])
    );
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let (mut reasoning, mut content) = (String::new(), String::new());
    for c in &chunks {
        if let Some(d) = c["choices"].get(0).map(|ch| &ch["delta"]) {
            reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
            content.push_str(d["content"].as_str().unwrap_or(""));
        }
    }
    assert_eq!(
        (reasoning.as_str(), content.as_str()),
        (
            msg["reasoning_content"].as_str().unwrap_or(""),
            msg["content"].as_str().unwrap_or("")
        )
    );
    let fin = &chunks[chunks.len() - 2];
    assert_eq!(fin["choices"][0]["finish_reason"], "length");
    let usage = &chunks[chunks.len() - 1];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 6);

    // Thinking off: no reasoning_content, and the prompt differs (an empty think block).
    let mut off = body.clone();
    off["chat_template_kwargs"] = json!({ "enable_thinking": false });
    let reply = s.chat(off);
    assert!(
        reply["choices"][0]["message"]
            .get("reasoning_content")
            .is_none(),
        "{reply}"
    );
    assert!(reply["usage"]["prompt_tokens"].as_u64() > whole["usage"]["prompt_tokens"].as_u64());

    let c = s.post("/v1/completions", &json!({ "model": s.name, "prompt": "The cat", "max_tokens": 5, "temperature": 0, "ignore_eos": true }));
    let c = c.json();
    assert_eq!(c["object"], "text_completion");
    assert!(c["choices"][0]["text"].is_string());
    assert_eq!(c["usage"]["completion_tokens"], 5);
}

/// Greedy ids of `hostd run --json` for one prompt.
fn run_ids(preset: &str, prompt: &str, n: usize) -> Vec<u64> {
    let out = Command::new(workspace_bin("hostd"))
        .args([
            "run",
            "--model",
            model_dir(preset).to_str().expect("path"),
            "--prompt",
            prompt,
            "--max-new-tokens",
            &n.to_string(),
            "--json",
        ])
        .env("SLUICE_THREADS", "2")
        .output()
        .expect("hostd run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("run --json");
    v["generated_ids"]
        .as_array()
        .expect("generated_ids")
        .iter()
        .map(|x| x.as_u64().expect("id"))
        .collect()
}

#[test]
fn greedy_reply_equals_hostd_run() {
    // Without the prefix cache, prefill blocks are exactly `hostd run`'s, so ids must match.
    for preset in ["tiny", "small"] {
        let s = Server::start(preset, &["--state-cache-bytes", "0"]);
        let tok =
            hostd::tokenizer::Tokenizer::from_model_dir(model_dir(preset)).expect("tokenizer");
        for prompt in ["hi", "Write a haiku about rivers."] {
            let ids = run_ids(preset, prompt, 24);
            let reply = s.chat(json!({ "model": s.name, "messages": user(prompt), "max_tokens": 24, "temperature": 0, "logprobs": true }));
            let expect: Vec<Vec<u8>> = ids
                .iter()
                .map(|&id| tok.token_bytes(id as u32).expect("known id").to_vec())
                .collect();
            assert_eq!(
                token_bytes(&reply),
                expect,
                "{preset} {prompt:?}: server and hostd run disagree"
            );
            // Usage also counts an end-of-turn token that ended the reply (not in `ids`).
            let stop = usize::from(reply["choices"][0]["finish_reason"] == "stop");
            assert_eq!(reply["usage"]["completion_tokens"], ids.len() + stop);
        }
    }
}

#[test]
fn four_concurrent_greedy_requests_equal_solo() {
    let s = Server::start("small", &["--max-batch", "4"]);
    let prompts = [
        "Tell me about the sea.",
        "What is 2+2?",
        "Name a colour.",
        "Why is the sky blue? Explain at length.",
    ];
    let body = |p: &str| json!({ "model": s.name, "messages": user(p), "max_tokens": 24, "temperature": 0, "ignore_eos": true, "logprobs": true });
    let solo: Vec<Vec<Vec<u8>>> = prompts
        .iter()
        .map(|p| token_bytes(&s.chat(body(p))))
        .collect();
    let (steps0, rows0) = (
        s.metric("hostd_decode_steps_total"),
        s.metric("hostd_decode_rows_total"),
    );
    let together: Vec<Vec<Vec<u8>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| scope.spawn(|| token_bytes(&s.chat(body(p)))))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("request thread"))
            .collect()
    });
    for (i, (a, b)) in solo.iter().zip(&together).enumerate() {
        assert_eq!(
            a, b,
            "request {i}: concurrent output differs from its solo run"
        );
        assert_eq!(a.len(), 24);
    }
    let (steps, rows) = (
        s.metric("hostd_decode_steps_total") - steps0,
        s.metric("hostd_decode_rows_total") - rows0,
    );
    assert!(
        rows > steps,
        "no decode step carried more than one sequence ({rows} rows in {steps} steps)"
    );
}

/// Opens a streaming chat request that would run for a long time and reads until `n` data
/// lines arrived; returns the open stream.
pub(crate) fn open_long_stream(s: &Server, n: usize) -> Lines {
    let body = json!({ "model": s.name, "messages": user("go"), "max_tokens": 200_000, "ignore_eos": true, "stream": true, "temperature": 0 });
    open_stream(s, "/v1/chat/completions", &body, "data: ", n)
}
