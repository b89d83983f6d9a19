//! Faults on the hostd → expertd path (issue 14, part B), with the real binaries on `tiny`:
//! a stopped daemon fails in-flight and new requests with 503 + Retry-After within the call
//! deadline, `/health` turns non-200 and back, and generation resumes with the same greedy
//! text; a killed private daemon is reaped and restarted within seconds, the next request
//! succeeds, and hostd's exit leaves no child and no directory; a call abandoned mid-compute
//! never lets its slot's late output reach a later call; a container whose blobs are corrupt
//! turns `/health` to 503 `failing` while requests fail, and it stays so while the daemon's
//! probes succeed.

use crate::expertd::{Daemon, HIDDEN_TINY, activations, container_bytes};
use crate::serve::{Lines, Server, check_error, open_long_stream, user};
use hostd::expert_client::{ClientOptions, Endpoint, ExpertdClient};
use hostd::experts::{ExpertBackend, ExpertError, MoeCall};
use serde_json::{Value, json};
use shared::ids::LayerId;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};
use tests::{wait_for, work_with_container};

/// A prepared `tiny` container in a fresh directory.
fn tiny_container() -> (tempfile::TempDir, PathBuf) {
    let (work, container) = work_with_container("tiny");
    (work, container)
}

/// A greedy chat request and its reply's message (reasoning and content).
fn greedy(s: &Server, prompt: &str) -> Value {
    let reply = s.chat(
        json!({ "model": s.name, "messages": user(prompt), "max_tokens": 16, "temperature": 0 }),
    );
    reply["choices"][0]["message"].clone()
}

fn health(s: &Server) -> (u16, Value) {
    let r = s.request("GET", "/health", &[], None);
    (r.status, r.json())
}

#[test]
fn a_corrupt_container_turns_health_to_failing_while_requests_fail() {
    let (_work, container) = tiny_container();
    // Every expert of layer 0 corrupt: every request routes through one of them.
    let n_experts = shared::container::ContainerFile::open(&container)
        .expect("container")
        .header()
        .layout
        .dims
        .n_experts;
    tests::corrupt_blobs(&container, &(0..n_experts).collect::<Vec<_>>(), 100);
    let daemon = Daemon::unix(&container, container_bytes(&container), &[]);
    let s = Server::start(
        "tiny",
        &[
            "--experts",
            "expertd",
            "--expertd",
            &daemon.uri(),
            "--container",
            container.to_str().expect("utf-8"),
            "--expertd-health-interval",
            "0.2",
        ],
    );
    assert_eq!(health(&s).0, 200, "ready before any request");
    let r = s.post(
        "/v1/chat/completions",
        &json!({ "model": s.name, "messages": user("hi"), "max_tokens": 4, "temperature": 0 }),
    );
    assert!(
        r.status >= 500,
        "a request through corrupt experts: {}",
        r.status
    );
    // The daemon's probes succeed meanwhile (every 0.2 s); /health still says what requests get.
    std::thread::sleep(Duration::from_secs(1));
    let (code, h) = health(&s);
    assert_eq!(
        (code, h["status"].as_str(), h["experts"]["status"].as_str()),
        (503, Some("failing"), Some("failing")),
        "{h}"
    );
    let reason = h["experts"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("corrupt"), "{h}");
    assert!(!reason.contains(".sock"), "{h}");
}

/// How an open SSE stream went on after a fault.
#[derive(Debug)]
enum Outcome {
    /// It carried this error object.
    Failed(Value),
    /// It ended without an error.
    Ended,
    /// It was still delivering tokens `limit` later (the fault fell between two expert calls
    /// and the next call reconnected: nothing was lost).
    Continued,
}

/// Reads an open SSE stream until it fails, ends, or has kept delivering for `limit`. A stream
/// that stalls for `limit` fails the test. A thread reads the lines, so that a stalled read is
/// noticed; it closes the stream at the first line after this returns.
fn stream_outcome(stream: Lines, limit: Duration) -> Outcome {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in stream.lines() {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let start = Instant::now();
    loop {
        let line = match rx.recv_timeout(limit) {
            Ok(Ok(line)) => line,
            Err(mpsc::RecvTimeoutError::Disconnected) => return Outcome::Ended,
            Ok(Err(e)) => panic!("the stream broke: neither failed nor delivered ({e})"),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("the stream stalled for {limit:?}: neither failed nor delivered")
            }
        };
        if let Some(data) = line.trim().strip_prefix("data: ")
            && let Ok(v) = serde_json::from_str::<Value>(data)
            && v.get("error").is_some()
        {
            return Outcome::Failed(v["error"].clone());
        }
        if start.elapsed() > limit {
            return Outcome::Continued;
        }
    }
}

#[test]
fn a_stopped_daemon_fails_requests_with_503_within_the_deadline_and_generation_resumes() {
    let (_work, container) = tiny_container();
    let daemon = Daemon::unix(&container, container_bytes(&container), &[]);
    let deadline_s = 2.0;
    let s = Server::start(
        "tiny",
        &[
            "--experts",
            "expertd",
            "--expertd",
            &daemon.uri(),
            "--container",
            container.to_str().expect("utf-8"),
            "--expertd-call-timeout",
            "2",
            "--expertd-health-interval",
            "0.5",
        ],
    );
    let before = greedy(&s, "hi");
    let (code, h) = health(&s);
    assert_eq!((code, h["status"].as_str()), (200, Some("ready")), "{h}");
    assert_eq!(h["experts"]["status"], "ready", "{h}");

    // A stream in flight when the daemon stops.
    let stream = open_long_stream(&s, 3);
    daemon.signal("STOP");
    let stopped = Instant::now();
    let outcome = stream_outcome(stream, Duration::from_secs(15));
    let in_flight_s = stopped.elapsed().as_secs_f64();
    let Outcome::Failed(err) = outcome else {
        panic!("a stream cannot go on while its daemon is stopped: {outcome:?}")
    };
    assert_eq!(err["code"], "experts_unavailable", "{err}");
    assert!(
        in_flight_s < deadline_s + 3.0,
        "the in-flight stream failed after {in_flight_s:.2} s, deadline {deadline_s} s"
    );

    // A new request while stopped: 503 with Retry-After, bounded by the deadline.
    let t = Instant::now();
    let r = s.post(
        "/v1/chat/completions",
        &json!({ "model": s.name, "messages": user("hi"), "max_tokens": 4 }),
    );
    let new_s = t.elapsed().as_secs_f64();
    check_error(&r, 503, "experts_unavailable");
    assert_eq!(r.header("retry-after"), Some("2"));
    assert!(
        new_s < deadline_s + 3.0,
        "a new request took {new_s:.2} s to fail"
    );
    let message = r.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // The client learns that the backend is down and when to retry, not where the daemon's
    // socket is (issue 37): that detail is in hostd's log under the request id.
    assert!(
        message.contains("retry after 2 s") && message.contains("request id"),
        "{message}"
    );
    assert!(
        !message.contains("unix://") && !message.contains(".sock"),
        "the message shows the daemon's socket: {message}"
    );

    // /health is not 200 while stopped, with the reason.
    let mut seen = Value::Null;
    wait_for(
        "/health to report the stopped daemon",
        Duration::from_secs(10),
        || {
            let (code, h) = health(&s);
            seen = h;
            code == 503
        },
    );
    assert!(
        matches!(seen["status"].as_str(), Some("degraded" | "unavailable")),
        "{seen}"
    );
    assert!(
        seen["experts"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("expertd")),
        "{seen}"
    );
    // /health needs no key: it never shows the daemon's address.
    let reason = seen["experts"]["reason"].as_str().unwrap_or_default();
    assert!(
        !reason.contains("unix://") && !reason.contains(".sock"),
        "/health shows the daemon's socket: {reason}"
    );
    println!(
        "stopped: in-flight stream failed after {in_flight_s:.2} s, a new request after {new_s:.2} s; /health {seen}"
    );

    // Resume after a 5 s stop: /health ready again, same greedy text.
    std::thread::sleep(Duration::from_secs(5).saturating_sub(stopped.elapsed()));
    daemon.signal("CONT");
    let resumed = Instant::now();
    wait_for(
        "/health to be ready after SIGCONT",
        Duration::from_secs(10),
        || health(&s).0 == 200,
    );
    println!(
        "ready {:.2} s after SIGCONT",
        resumed.elapsed().as_secs_f64()
    );
    assert_eq!(
        greedy(&s, "hi"),
        before,
        "the same greedy reply after the fault"
    );
}

/// Pids of `pid`'s children.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out: Vec<u32> = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The private expertd child of hostd `pid` and its socket directory.
fn private_daemon(pid: u32) -> Option<(u32, PathBuf)> {
    children(pid).into_iter().find_map(|c| {
        let cmdline = std::fs::read(format!("/proc/{c}/cmdline")).ok()?;
        let args: Vec<String> = cmdline
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let socket = args
            .iter()
            .position(|a| a == "--socket")
            .and_then(|i| args.get(i + 1))?;
        Some((c, Path::new(socket).parent()?.to_path_buf()))
    })
}

/// Whether `pid` is gone (reaped): no /proc entry at all, not even a zombie.
fn reaped(pid: u32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn a_killed_private_daemon_is_reaped_and_restarted_and_hostd_leaves_nothing_behind() {
    let (_work, container) = tiny_container();
    let s = Server::start(
        "tiny",
        &[
            "--experts",
            "expertd",
            "--container",
            container.to_str().expect("utf-8"),
            "--expertd-call-timeout",
            "10",
        ],
    );
    let hostd = s.child.id();
    let before = greedy(&s, "hi");
    let (first, dir) = private_daemon(hostd).expect("hostd runs a private expertd");
    assert!(dir.join("expertd.sock").exists(), "{}", dir.display());

    // kill -9 with a stream in flight: the child is reaped and replaced on the same socket.
    // The stream fails at once with a retryable error if a call was in flight, or goes on
    // (the next call reconnects to the new child) if the kill fell between two calls.
    let stream = open_long_stream(&s, 3);
    assert!(
        std::process::Command::new("kill")
            .args(["-KILL", &first.to_string()])
            .status()
            .expect("kill")
            .success()
    );
    let killed = Instant::now();
    // Watch for the new child from the moment of the kill, apart from reading the stream (which
    // may wait its whole window when the stream simply goes on).
    let watch_dir = dir.clone();
    let watcher = std::thread::spawn(move || {
        while killed.elapsed() < Duration::from_secs(10) {
            if let Some((pid, d)) = private_daemon(hostd)
                && pid != first
                && d == watch_dir
                && d.join("expertd.sock").exists()
            {
                return Some((pid, killed.elapsed().as_secs_f64()));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    });
    let outcome = stream_outcome(stream, Duration::from_secs(5));
    let in_flight_s = killed.elapsed().as_secs_f64();
    match &outcome {
        Outcome::Failed(err) => {
            assert_eq!(err["code"], "experts_unavailable", "{err}");
            assert!(
                in_flight_s < 3.0,
                "the in-flight stream failed only after {in_flight_s:.2} s"
            );
        }
        Outcome::Continued => {}
        Outcome::Ended => panic!("a 200000-token stream ended without an error"),
    }
    let (second, restart_s) = watcher
        .join()
        .expect("watcher")
        .expect("a restarted private expertd within 10 s");
    assert!(
        reaped(first),
        "the killed daemon {first} is still in /proc (a zombie)"
    );
    assert!(restart_s < 5.0, "restarted after {restart_s:.2} s");
    println!(
        "kill -9: in-flight stream {outcome:?} after {in_flight_s:.2} s; restarted (socket back) after {restart_s:.2} s"
    );

    let t = Instant::now();
    assert_eq!(
        greedy(&s, "hi"),
        before,
        "the next request succeeds with the same reply"
    );
    println!(
        "first request after the restart: {:.2} s",
        t.elapsed().as_secs_f64()
    );
    // The supervisor counts the restart once the new child's socket is up, which the request
    // above may beat by a poll interval: wait (bounded) for /health to report it.
    let mut last = Value::Null;
    wait_for(
        "/health to report ready with one restart",
        Duration::from_secs(5),
        || {
            let (code, h) = health(&s);
            let done =
                code == 200 && h["experts"]["restarts"] == 1 && h["experts"]["status"] == "ready";
            last = h;
            done
        },
    );
    assert_eq!(last["experts"]["restarts"], 1, "{last}");

    // A graceful exit stops the child and removes the directory.
    let mut s = s;
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &hostd.to_string()])
            .status()
            .expect("kill")
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.child.try_wait().expect("try_wait").is_none() {
        assert!(
            Instant::now() < deadline,
            "hostd did not exit within 30 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    wait_for(
        "the private daemon to exit",
        Duration::from_secs(10),
        || !Path::new(&format!("/proc/{second}")).exists(),
    );
    assert!(!dir.exists(), "{} left behind", dir.display());
}

/// A call of `rows` rows of `x` on `tiny`'s layer 1, every row routed to all 8 experts (the
/// most compute a call of this size can ask for).
fn big_call(client: &ExpertdClient, x: &[f32], rows: usize) -> Result<Vec<f32>, ExpertError> {
    let ids: Vec<u32> = (0..rows)
        .flat_map(|r| (0..8u32).map(move |k| (k + r as u32) % 8))
        .collect();
    let weights: Vec<f32> = (0..rows)
        .flat_map(|_| (0..8).map(|k| (k as f32 + 1.0) / 36.0))
        .collect();
    let call = MoeCall {
        layer: LayerId::new(1),
        n_rows: rows,
        top_k: 8,
        x,
        ids: &ids,
        weights: &weights,
    };
    let mut out = vec![0.0f32; rows * HIDDEN_TINY];
    client.moe_layer(&call, &mut out).map(|()| out)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_call_abandoned_mid_compute_never_lends_its_slot_to_a_later_call() {
    let (_work, container) = tiny_container();
    let daemon = Daemon::unix(&container, container_bytes(&container), &[]);
    let socket = daemon.socket.clone().expect("socket");
    const ROWS: usize = 1024;
    let xa = activations(ROWS, HIDDEN_TINY);
    let xb: Vec<f32> = xa.iter().map(|v| 1.5 - v).collect();
    for ring in [true, false] {
        let mut opts = ClientOptions::new(Endpoint::Unix(socket.clone()), 4, 8, HIDDEN_TINY);
        opts.ring = ring;
        opts.call_timeout = Duration::from_millis(300);
        opts.health_interval = None;
        let client = Arc::new(ExpertdClient::connect(opts, None).expect("connect"));
        let want_a = bits(&big_call(&client, &xa, ROWS).expect("call A"));
        let want_b = bits(&big_call(&client, &xb, ROWS).expect("call B"));
        assert_ne!(want_a, want_b);
        let mut abandoned = 0;
        // Stop the daemon at several points of call A: before it is sent (None: surely
        // abandoned), and at offsets after it was sent, where it is likely computing. A call
        // that misses the deadline is abandoned; the daemon then resumes and finishes it,
        // writing A's output into A's slot.
        let offsets = [
            None,
            None,
            Some(0u64),
            Some(0),
            Some(200),
            Some(500),
            Some(1000),
            Some(2000),
        ];
        for offset_us in offsets {
            let (tx, rx) = mpsc::channel();
            let c = Arc::clone(&client);
            let x = xa.clone();
            if offset_us.is_none() {
                daemon.signal("STOP");
            }
            std::thread::spawn(move || {
                let _ = tx.send(big_call(&c, &x, ROWS));
            });
            if let Some(us) = offset_us {
                std::thread::sleep(Duration::from_micros(us));
                daemon.signal("STOP");
            }
            let a = rx.recv_timeout(Duration::from_secs(10));
            daemon.signal("CONT");
            match a.expect("call A ends within its deadline while the daemon is stopped") {
                Ok(out) => assert_eq!(bits(&out), want_a, "ring={ring}: call A's output"),
                Err(e) => {
                    assert!(
                        matches!(e, ExpertError::Unavailable { .. }),
                        "ring={ring}: {e}"
                    );
                    assert!(e.to_string().contains("did not answer"), "{e}");
                    abandoned += 1;
                }
            }
            // The next calls get their own outputs, never the abandoned call's late one.
            for (x, want, what) in [
                (&xb, &want_b, "B"),
                (&xa, &want_a, "A again"),
                (&xb, &want_b, "B again"),
            ] {
                let got = big_call(&client, x, ROWS).unwrap_or_else(|e| {
                    panic!(
                        "ring={ring}, stop at {offset_us:?} µs: call {what} after the fault: {e}"
                    )
                });
                assert!(
                    bits(&got) == *want,
                    "ring={ring}, stop at {offset_us:?} µs: call {what} read another call's output"
                );
            }
        }
        assert!(
            abandoned >= 2,
            "ring={ring}: only {abandoned} calls were abandoned; the test did not exercise the fault"
        );
        println!(
            "ring={ring}: {abandoned} of {} calls abandoned; every later call read its own output",
            offsets.len()
        );
    }
}
