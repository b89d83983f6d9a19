//! `hostd serve` under hostile or careless peers (issue 14): large prompts are refused before
//! any tokenisation with RSS barely moving and `/health` answering throughout; half-open and
//! idle connections are closed by the header timeout while the server keeps serving; a slow
//! body gets 408; connections beyond the cap may only ask `/health`; a non-streaming client that
//! hangs up (or half-closes) mid-generation cancels its generation at once. The real binary on the `tiny` fixture, over raw sockets; every wait bounded.

use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tests::{Killed, model_dir};

/// A running `hostd serve`, killed on drop.
struct Server {
    child: Killed,
    addr: SocketAddr,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        let dir = model_dir("tiny");
        let (child, addr) = crate::serve::spawn_serve(&dir, "tiny", extra);
        let server = Server {
            child: Killed(child),
            addr,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while server.try_get("/health").map(|r| r.0) != Some(200) {
            assert!(Instant::now() < deadline, "not ready within 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(10)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(60)))
            .expect("read timeout");
        s
    }

    /// Sends `head` (without the blank line) and `body`, half-closes when asked, reads the reply.
    fn exchange(
        &self,
        head: &str,
        body: &[u8],
        half_close: bool,
    ) -> (u16, Value, Vec<(String, String)>) {
        let mut s = self.connect();
        let _ = s.write_all(format!("{head}\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes());
        // A refused body may stop being read; the reply still has to arrive.
        let _ = s.write_all(body);
        if half_close {
            s.shutdown(Shutdown::Write).expect("half-close");
        }
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        parse(&raw).unwrap_or_else(|| {
            panic!(
                "no response to {head:?}: {:?}",
                String::from_utf8_lossy(&raw)
            )
        })
    }

    fn try_get(&self, path: &str) -> Option<Response> {
        let mut s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .ok()?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).ok()?;
        parse(&raw)
    }

    fn post(&self, path: &str, body: &[u8]) -> (u16, Value, Vec<(String, String)>) {
        let head = format!(
            "POST {path} HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}",
            body.len()
        );
        self.exchange(&head, body, false)
    }

    fn health(&self) -> Value {
        let (status, body, _) = self.try_get("/health").expect("/health answers");
        assert_eq!(status, 200, "{body}");
        body
    }

    fn rss_bytes(&self) -> u64 {
        shared::procfs::vm_rss_bytes(Some(self.child.id())).expect("VmRSS")
    }
}

/// Status, JSON body (or null) and headers of a response.
type Response = (u16, Value, Vec<(String, String)>);

/// Status, JSON body (or null) and headers of a `Connection: close` response.
fn parse(raw: &[u8]) -> Option<Response> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.lines();
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Some((
        status,
        serde_json::from_slice(&raw[split + 4..]).unwrap_or(Value::Null),
        headers,
    ))
}

/// `GET /health` on a kept-alive connection; reads exactly one response (by Content-Length).
fn keep_alive_health(c: &mut TcpStream) -> Value {
    c.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("monitor request");
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        assert_eq!(
            c.read(&mut byte).expect("monitor head"),
            1,
            "monitor connection closed: {:?}",
            String::from_utf8_lossy(&raw)
        );
        raw.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&raw).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no content-length: {head}"));
    let mut body = vec![0u8; len];
    c.read_exact(&mut body).expect("monitor body");
    serde_json::from_slice(&body).expect("health JSON")
}

fn chat_body(content: &str, max_tokens: usize) -> Vec<u8> {
    json!({ "model": "tiny", "messages": [{ "role": "user", "content": content }], "max_tokens": max_tokens, "temperature": 0 })
        .to_string()
        .into_bytes()
}

/// Polls /health every 20 ms until `stop`; returns the slowest answer and the largest RSS seen.
fn watch(s: &Server, stop: &AtomicBool) -> (Duration, u64) {
    let (mut slowest, mut rss) = (Duration::ZERO, 0);
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        let r = s.try_get("/health");
        slowest = slowest.max(t.elapsed());
        assert_eq!(
            r.map(|r| r.0),
            Some(200),
            "/health must answer during the burst"
        );
        rss = rss.max(s.rss_bytes());
        std::thread::sleep(Duration::from_millis(20));
    }
    (slowest, rss)
}

#[test]
fn large_prompts_are_refused_before_tokenising() {
    let s = Server::start(&[]);
    let before = s.rss_bytes();
    // Eight 4 MB messages at once: over the default body cap (2 MiB), refused from
    // Content-Length without being buffered or tokenised.
    let big = Arc::new(chat_body(&"x".repeat(4_000_000), 1));
    let stop = AtomicBool::new(false);
    let (statuses, (slowest, peak)) = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| watch(&s, &stop));
        let senders: Vec<_> = (0..8)
            .map(|_| {
                let big = Arc::clone(&big);
                let s = &s;
                scope.spawn(move || {
                    let t = Instant::now();
                    let (status, body, _) = s.post("/v1/chat/completions", &big);
                    (status, body["error"]["code"].clone(), t.elapsed())
                })
            })
            .collect();
        let statuses: Vec<_> = senders
            .into_iter()
            .map(|h| h.join().expect("sender"))
            .collect();
        stop.store(true, Ordering::Relaxed);
        (statuses, watcher.join().expect("watcher"))
    });
    for (status, code, took) in &statuses {
        assert_eq!(
            (*status, code.as_str()),
            (413, Some("request_too_large")),
            "{statuses:?}"
        );
        assert!(*took < Duration::from_secs(10), "a refusal took {took:?}");
    }
    let grew = peak.saturating_sub(before);
    assert!(
        grew < 200 << 20,
        "RSS grew by {} MiB during the burst",
        grew >> 20
    );
    assert!(
        slowest < Duration::from_secs(2),
        "/health took {slowest:?} during the burst"
    );

    // Under the body cap but over the prompt cap: 400 naming the message, before tokenising.
    let (status, body, _) = s.post(
        "/v1/chat/completions",
        &chat_body(&"y".repeat(1_500_000), 1),
    );
    assert_eq!(
        (
            status,
            body["error"]["code"].as_str(),
            body["error"]["param"].as_str()
        ),
        (400, Some("prompt_too_large"), Some("messages[0].content")),
        "{body}"
    );
    let prompt =
        json!({ "model": "tiny", "prompt": "z".repeat(1_500_000), "max_tokens": 1 }).to_string();
    let (status, body, _) = s.post("/v1/completions", prompt.as_bytes());
    assert_eq!(
        (status, body["error"]["param"].as_str()),
        (400, Some("prompt")),
        "{body}"
    );
    // A prompt that cannot fit a 64-token context is refused from its length alone.
    drop(s);
    let s = Server::start(&["--max-context", "64"]);
    let (status, body, _) = s.post(
        "/v1/chat/completions",
        &chat_body(&"word ".repeat(20_000), 1),
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("context_length_exceeded")),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("at least")),
        "{body}"
    );
    // And the server still generates.
    let (status, body, _) = s.post("/v1/chat/completions", &chat_body("hi", 2));
    assert_eq!(status, 200, "{body}");
}

#[test]
fn half_open_and_idle_connections_are_closed_while_the_server_serves() {
    // The timeout must outlast opening the 500 connections, or the first ones are closed before
    // the count below is read (on a loaded 2-core machine opening them took over 2 s).
    let s = Server::start(&["--header-timeout", "8"]);
    let opened = Instant::now();
    let mut half_open: Vec<TcpStream> = (0..500)
        .map(|_| {
            let mut c = s.connect();
            c.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
                .expect("partial head");
            c
        })
        .collect();
    // An idle keep-alive connection, after one complete exchange.
    let mut idle = s.connect();
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("request");
    let mut buf = [0u8; 4096];
    assert!(idle.read(&mut buf).expect("response") > 0);

    // Meanwhile the server answers and generates.
    assert!(
        opened.elapsed() < Duration::from_secs(8),
        "opening took {:?}: longer than the timeout",
        opened.elapsed()
    );
    assert!(
        s.health()["connections"].as_u64().is_some_and(|n| n >= 500),
        "{}",
        s.health()
    );
    let (status, body, _) = s.post("/v1/chat/completions", &chat_body("hello", 3));
    assert_eq!(status, 200, "{body}");

    // Each is closed by the server (EOF or reset) within the timeout plus a generous margin.
    half_open.push(idle);
    for c in &mut half_open {
        c.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("read timeout");
        let mut rest = Vec::new();
        match c.read_to_end(&mut rest) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!(
                "a half-open connection stayed open ({e}) {:?} after opening",
                opened.elapsed()
            ),
        }
    }
    let took = opened.elapsed();
    assert!(
        took < Duration::from_secs(30),
        "closing 501 connections took {took:?}"
    );
    // They are gone from the server's count too.
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.health()["connections"].as_u64() != Some(1) {
        assert!(Instant::now() < deadline, "{}", s.health());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn slow_bodies_time_out_and_a_client_that_hangs_up_cancels_its_generation() {
    let s = Server::start(&["--body-timeout", "1"]);
    let t = Instant::now();
    let (status, body, _) = s.exchange(
        "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 100",
        b"{\"model\"",
        false,
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (408, Some("request_timeout")),
        "{body}"
    );
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());

    // A non-streaming request whose generation would run for a long time (EOS ignored, a
    // large budget); the client hangs up (full close, then a half-close) once it runs.
    for shutdown in [Shutdown::Both, Shutdown::Write] {
        let chat = json!({ "model": "tiny", "messages": [{ "role": "user", "content": "hi" }],
            "max_tokens": 100_000, "ignore_eos": true, "temperature": 0 })
        .to_string();
        let mut c = s.connect();
        c.write_all(
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{chat}",
                chat.len()
            )
            .as_bytes(),
        )
        .expect("request");
        let active = |s: &Server| s.health()["active_sequences"].as_u64();
        let deadline = Instant::now() + Duration::from_secs(10);
        while active(&s) != Some(1) {
            assert!(Instant::now() < deadline, "{}", s.health());
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            active(&s),
            Some(1),
            "the generation ended early: {}",
            s.health()
        );
        let hung_up = Instant::now();
        c.shutdown(shutdown).expect("hang up");
        if shutdown == Shutdown::Both {
            drop(c);
        }
        while active(&s) != Some(0) {
            assert!(
                hung_up.elapsed() < Duration::from_secs(3),
                "{shutdown:?}: the generation still runs {:?} after its client hung up: {}",
                hung_up.elapsed(),
                s.health()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "{shutdown:?}: generation cancelled {:.0} ms after the client hung up",
            hung_up.elapsed().as_secs_f64() * 1e3
        );
    }
    // The server keeps serving.
    let (status, body, _) = s.post("/v1/chat/completions", &chat_body("hi", 2));
    assert_eq!(
        (status, body["object"].as_str()),
        (200, Some("chat.completion")),
        "{body}"
    );
}

#[test]
fn connections_beyond_the_cap_may_only_ask_for_health() {
    let s = Server::start(&["--max-connections", "8", "--header-timeout", "60"]);
    // A keep-alive monitor holds one slot; once it alone is counted, the connections of
    // `Server::start` have given their slots back, so the 7 held below fill the other 7.
    let mut monitor = s.connect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while keep_alive_health(&mut monitor)["connections"].as_u64() != Some(1) {
        assert!(
            Instant::now() < deadline,
            "{}",
            keep_alive_health(&mut monitor)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let held: Vec<TcpStream> = (0..7)
        .map(|_| {
            let mut c = s.connect();
            c.write_all(b"GET /hea").expect("partial head");
            c
        })
        .collect();
    while keep_alive_health(&mut monitor)["connections"].as_u64() < Some(8) {
        assert!(
            Instant::now() < deadline,
            "{}",
            keep_alive_health(&mut monitor)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let t = Instant::now();
    let h = s.health();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "/health took {:?} at the cap",
        t.elapsed()
    );
    assert_eq!(h["max_connections"], 8, "{h}");
    let (status, body, headers) = s.post("/v1/chat/completions", &chat_body("hi", 2));
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("server_busy")),
        "{body}"
    );
    assert!(
        headers.iter().any(|(k, v)| k == "retry-after" && v == "1"),
        "{headers:?}"
    );
    drop(held);
    drop(monitor);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body, _) = s.post("/v1/chat/completions", &chat_body("hi", 2));
        if status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after the held connections closed: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_header_timeout_spares_bodies_and_long_replies() {
    let s = Server::start(&["--header-timeout", "0.5"]);
    // A body dribbled over ~1.6 s: the header timeout stops at the end of the head.
    let body = chat_body("hi", 2);
    let mut c = s.connect();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes()).expect("head");
    for piece in body.chunks(body.len().div_ceil(4)) {
        std::thread::sleep(Duration::from_millis(400));
        c.write_all(piece)
            .expect("a body piece: the connection must stay open");
    }
    let mut raw = Vec::new();
    let _ = c.read_to_end(&mut raw);
    let (status, reply, _) = parse(&raw).expect("a response");
    assert_eq!(status, 200, "{reply}");
    // A reply that takes longer than the header timeout to generate is not cut off.
    let long = json!({ "model": "tiny", "messages": [{ "role": "user", "content": "hi" }], "max_tokens": 1500, "ignore_eos": true });
    let (status, reply, _) = s.post("/v1/chat/completions", long.to_string().as_bytes());
    assert_eq!(
        (status, reply["usage"]["completion_tokens"].as_u64()),
        (200, Some(1500)),
        "{reply}"
    );
}
