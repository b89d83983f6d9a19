//! `hostd serve` against hostile HTTP requests (issue 37): a request whose parameters pass
//! validation but once broke the math must neither take the server down nor get a wrong answer,
//! and `/health` must say what the next request would get; one API key must not reach what
//! another stored; a scheduler that keeps panicking makes the process exit 70 for its
//! supervisor instead of living on as a server that answers nothing.

use crate::serve::{Response, Server, check_error, user};
use serde_json::{Value, json};

fn body(s: &Server, temperature: f64) -> Value {
    json!({
        "model": s.name,
        "messages": user("hello there"),
        "max_tokens": 8,
        "temperature": temperature,
        "seed": 1,
    })
}

fn message(s: &Server, temperature: f64) -> Value {
    let r = s.post("/v1/chat/completions", &body(s, temperature));
    assert_eq!(r.status, 200, "temperature {temperature:e}: {}", r.text());
    r.json()["choices"][0]["message"].clone()
}

#[test]
fn a_temperature_whose_inverse_overflows_is_greedy_and_the_server_keeps_serving() {
    let s = Server::start("tiny", &[]);
    let greedy = message(&s, 0.0);
    // 1e-40 and 1e-45 are subnormal as f32 (1/t is infinite), 1.2e-38 is f32's smallest normal,
    // 1e-6 is below the 1e-5 greedy threshold: each used to divide the logits by ~0.
    for t in [1e-40, 1e-45, 1.2e-38, 1e-6] {
        assert_eq!(
            message(&s, t),
            greedy,
            "temperature {t:e} answers as greedy"
        );
    }
    // The server still samples, still answers, and says it is ready.
    let sampled = s.post("/v1/chat/completions", &body(&s, 0.7));
    assert_eq!(sampled.status, 200, "{}", sampled.text());
    let health = s.request("GET", "/health", &[], None);
    assert_eq!(health.status, 200, "{}", health.text());
    assert_eq!(health.json()["status"], "ready");
    assert_eq!(
        s.metric("hostd_engine_panics_total"),
        0.0,
        "nothing panicked on the way"
    );
}

/// A request with `key` as its bearer token.
fn as_key(s: &Server, key: &str, method: &str, path: &str, body: Option<&Value>) -> Response {
    let auth = format!("Bearer {key}");
    let body = body.map(Value::to_string);
    s.request(method, path, &[("Authorization", &auth)], body.as_deref())
}

#[test]
fn stored_responses_are_unguessable_and_belong_to_the_key_that_made_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key_file = dir.path().join("keys");
    std::fs::write(&key_file, "# two tenants\nalpha-key\nbeta-key\n").expect("write keys");
    let s = Server::start(
        "tiny",
        &["--api-key-file", key_file.to_str().expect("path")],
    );
    let create = |key: &str, request_id: &str| {
        let body = json!({ "model": s.name, "input": "hi", "max_output_tokens": 4 });
        let auth = format!("Bearer {key}");
        let r = s.request(
            "POST",
            "/v1/responses",
            &[("Authorization", &auth), ("x-request-id", request_id)],
            Some(&body.to_string()),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["id"].as_str().expect("id").to_string()
    };
    // The client's own request id no longer names the response, so choosing one gains nothing.
    let a = create("alpha-key", "chosen-id");
    let b = create("beta-key", "chosen-id");
    assert_ne!(a, b, "the same x-request-id gives two responses");
    for id in [&a, &b] {
        let hex = id.strip_prefix("resp_").expect("resp_ prefix");
        assert!(
            hex.len() == 32 && hex.bytes().all(|c| c.is_ascii_hexdigit()),
            "{id}"
        );
        assert!(!id.contains("chosen-id"), "{id}");
    }
    let get = |key: &str, id: &str| as_key(&s, key, "GET", &format!("/v1/responses/{id}"), None);
    let delete =
        |key: &str, id: &str| as_key(&s, key, "DELETE", &format!("/v1/responses/{id}"), None);
    // Each key reads its own; the other key, a guessed id and the old derivable form get 404.
    assert_eq!(get("alpha-key", &a).status, 200);
    assert_eq!(get("beta-key", &b).status, 200);
    check_error(&get("beta-key", &a), 404, "response_not_found");
    check_error(&delete("beta-key", &a), 404, "response_not_found");
    check_error(
        &get("alpha-key", "resp_chosen-id"),
        404,
        "response_not_found",
    );
    check_error(
        &get("alpha-key", "resp_00000000000000000000000000000001"),
        404,
        "response_not_found",
    );
    // Nor can the other key continue the conversation.
    let follow = json!({ "model": s.name, "input": "more", "previous_response_id": a, "max_output_tokens": 2 });
    let r = as_key(&s, "beta-key", "POST", "/v1/responses", Some(&follow));
    check_error(&r, 400, "previous_response_not_found");
    // beta's failed delete left alpha's response in place; alpha's own delete works once.
    assert_eq!(get("alpha-key", &a).status, 200);
    assert_eq!(delete("alpha-key", &a).status, 200);
    check_error(&get("alpha-key", &a), 404, "response_not_found");
}

/// A real `hostd serve` whose every generation step panics (the hidden fault-injection flag
/// `--fault-panic-in-step`): while the panic budget lasts (3 within 60 s), each request fails
/// with a 500 and the server goes on; the next panic stops the engine, and the process drains
/// and exits with status 70 (EX_SOFTWARE) for its supervisor, within seconds, never living on
/// with `/health` ready.
#[test]
fn a_scheduler_that_keeps_panicking_makes_hostd_exit_70_for_its_supervisor() {
    let mut s = Server::start("tiny", &["--fault-panic-in-step"]);
    for i in 0..3 {
        let r = s.post("/v1/chat/completions", &body(&s, 0.0));
        check_error(&r, 500, "internal_error");
        let health = s.request("GET", "/health", &[], None);
        assert_eq!(
            health.status, 200,
            "the engine still serves after panic {i}"
        );
    }
    // The fourth panic spends the budget: this request fails too (or finds the server gone).
    let last = body(&s, 0.0).to_string();
    if let Ok(r) = s.try_request("POST", "/v1/chat/completions", &[], Some(&last)) {
        assert!(matches!(r.status, 500 | 503), "{}: {}", r.status, r.text());
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = s.child.0.try_wait().expect("try_wait") {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "hostd still running 20 s after its engine stopped"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(70), "{status:?}");
}
