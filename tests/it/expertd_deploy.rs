//! expertd as a system service, with the real binaries: started by `systemd-socket-activate`
//! on a socket it did not create, it serves a `hostd eval` whose logits equal the in-process
//! INT8 backend's, and it refuses an inherited socket more open than `--socket-mode`;
//! `READY=1` reaches a fake `NOTIFY_SOCKET` only once the daemon can serve (start-up held open
//! on a route-trace FIFO), and `STOPPING=1` on SIGTERM; in a memory cgroup smaller than its
//! budget plus overhead it refuses with the numbers, and with a budget derived from the limit
//! its peak RSS stays under the limit through four concurrent hosts; its Prometheus endpoint
//! and `expertd stats` parse with prometheus_client's parser and per-session counters add up to
//! per-peer counters and the daemon totals (two uids, one session closed).

use super::expertd::{
    activations, blob_stride, eval, handshake_request, prompts_file, raw_session, raw_unix, rt,
};
use proto::v1::{self as pb, moe_layer_request::Input};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tests::{
    Spawned, model_dir, prepare_container, python, wait_for, work_with_container, workspace_bin,
    workspace_root,
};

const MIB: u64 = 1 << 20;

fn tool(name: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    });
    found.unwrap_or_else(|| {
        panic!("{name} not found on PATH: install the `systemd` package (.ci/run installs it)")
    })
}

#[test]
fn socket_activated_expertd_serves_hostd_and_refuses_a_socket_more_open_than_its_mode() {
    let activate = tool("systemd-socket-activate");
    let (work, container) = work_with_container("tiny");
    let c = container.to_str().expect("utf-8");
    let prompts = prompts_file("tiny", work.path(), 1);
    let baseline = eval(
        "tiny",
        &prompts,
        work.path(),
        "int8",
        &["--experts", "int8", "--container", c],
    );

    // systemd-socket-activate binds the socket and starts expertd on the first connection: here
    // hostd's, which waits in the backlog until the daemon serves.
    let socket = work.path().join("activated.sock");
    let log = work.path().join("activated.log");
    let spawn = |socket: &Path, log: &Path| {
        let mut cmd = Command::new(&activate);
        cmd.arg("-l")
            .arg(socket)
            .arg(workspace_bin("expertd"))
            .args(["serve", "--container", c, "--cache-bytes"]);
        cmd.arg((4 * blob_stride(&container)).to_string())
            .arg("--socket")
            .arg(socket);
        Spawned::spawn(&mut cmd, log)
    };
    let daemon = spawn(&socket, &log);
    wait_for(
        "systemd-socket-activate's socket",
        Duration::from_secs(10),
        || socket.exists(),
    );
    let uri = format!("unix://{}", socket.display());
    let through = eval(
        "tiny",
        &prompts,
        work.path(),
        "activated",
        &["--expertd", &uri, "--container", c],
    );
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.contains("listening on the socket systemd passed (socket activation)"),
        "{text}"
    );
    assert_eq!(
        through, baseline,
        "hostd through the socket-activated daemon"
    );
    assert!(
        daemon.stop().success(),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );

    // The same socket made writable by everyone (SocketMode=0666) against --socket-mode 660.
    let open = work.path().join("open.sock");
    let open_log = work.path().join("open.log");
    let mut refused = spawn(&open, &open_log);
    wait_for("the second socket", Duration::from_secs(10), || {
        open.exists()
    });
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let _trigger = std::os::unix::net::UnixStream::connect(&open).expect("connect");
    let status = refused.wait_exit(Duration::from_secs(10));
    let text = std::fs::read_to_string(&open_log).unwrap_or_default();
    assert!(!status.success(), "expertd accepted a 0666 socket: {text}");
    assert!(
        text.contains("has mode 666, which lets more users connect than --socket-mode 660"),
        "{text}"
    );
}

/// Collects the datagrams a fake service manager receives on `NOTIFY_SOCKET`.
fn notifications(sock: &std::os::unix::net::UnixDatagram, into: &mut Vec<String>) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = sock.recv(&mut buf) {
        into.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
}

#[test]
fn ready_is_notified_only_once_the_daemon_can_serve_and_stopping_on_sigterm() {
    let (work, container) = work_with_container("tiny");
    let notify_path = work.path().join("notify.sock");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).expect("bind NOTIFY_SOCKET");
    notify
        .set_read_timeout(Some(Duration::from_millis(50)))
        .expect("timeout");
    // Start-up is held inside Prepared::new while nobody reads the route-trace FIFO.
    let fifo = work.path().join("trace.fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo")
            .success()
    );
    let socket = work.path().join("expertd.sock");
    let log = work.path().join("expertd.log");
    let daemon = Spawned::spawn(
        Command::new(workspace_bin("expertd"))
            .args([
                "serve",
                "--container",
                container.to_str().expect("utf-8"),
                "--socket",
            ])
            .arg(&socket)
            .arg("--cache-bytes")
            .arg((4 * blob_stride(&container)).to_string())
            .arg("--route-trace")
            .arg(&fifo)
            .env("NOTIFY_SOCKET", &notify_path),
        &log,
    );
    let mut got = Vec::new();
    let held = Instant::now();
    while held.elapsed() < Duration::from_millis(700) {
        notifications(&notify, &mut got);
    }
    assert!(
        got.iter().all(|m| !m.contains("READY=1")),
        "READY=1 before the daemon could serve: {got:?}"
    );
    assert!(
        got.iter()
            .any(|m| m.contains("STATUS=opening the container")),
        "no start-up STATUS line: {got:?}"
    );
    assert!(!socket.exists(), "socket bound while start-up is held");

    // Release start-up; the first READY=1 must find a daemon that answers a real call at once.
    let reader = std::thread::spawn(move || {
        let mut sink = String::new();
        let _ = std::io::Read::read_to_string(
            &mut std::fs::File::open(&fifo).expect("open fifo"),
            &mut sink,
        );
    });
    wait_for("READY=1", Duration::from_secs(20), || {
        notifications(&notify, &mut got);
        got.iter().any(|m| m.contains("READY=1"))
    });
    let ready = got
        .iter()
        .find(|m| m.contains("READY=1"))
        .expect("ready")
        .clone();
    assert!(ready.contains("STATUS=serving"), "{ready}");
    rt().block_on(async {
        let (mut c, session) = raw_session(&socket).await;
        let call = pb::MoeLayerRequest {
            session_id: session,
            request_id: 1,
            step: 0,
            layer_idx: 0,
            n_tokens: 1,
            top_k: 2,
            expert_ids: vec![0, 1],
            weights: vec![0.5, 0.5],
            input: Some(Input::InputInlineF32Le(proto::convert::f32s_to_le_bytes(
                &activations(1, super::expertd::HIDDEN_TINY),
            ))),
            output_shm: None,
        };
        c.moe_layer(call).await.expect("a call right after READY=1");
    });
    assert!(
        daemon.stop().success(),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    notifications(&notify, &mut got);
    assert!(
        got.iter().any(|m| m.contains("STOPPING=1")),
        "no STOPPING=1 on SIGTERM: {got:?}"
    );
    let _ = reader.join();
}

/// A memory cgroup under this process's own (v2 `memory.max` or v1 `memory.limit_in_bytes`),
/// removed when dropped; `None` with the reason when cgroups cannot be made here.
pub(crate) struct Cgroup {
    pub(crate) dir: PathBuf,
    v2: bool,
}

impl Cgroup {
    pub(crate) fn make(name: &str, limit: u64) -> Result<Cgroup, String> {
        let own = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("/proc/self/cgroup: {e}"))?;
        let root = Path::new("/sys/fs/cgroup");
        let (dir, v2) = if root.join("cgroup.controllers").is_file() {
            let rel = own
                .lines()
                .find_map(|l| l.strip_prefix("0::"))
                .ok_or("no cgroup v2 line in /proc/self/cgroup")?;
            (root.join(rel.trim_start_matches('/')).join(name), true)
        } else {
            let rel = own
                .lines()
                .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_string()))
                .ok_or("no v1 memory controller in /proc/self/cgroup")?;
            (
                root.join("memory")
                    .join(rel.trim_start_matches('/'))
                    .join(name),
                false,
            )
        };
        std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let cg = Cgroup { dir, v2 };
        let file = if v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        std::fs::write(cg.dir.join(file), limit.to_string())
            .map_err(|e| format!("writing {}: {e}", cg.dir.join(file).display()))?;
        Ok(cg)
    }

    /// A command that runs `program args…` inside this cgroup.
    pub(crate) fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg("echo $$ > \"$1/cgroup.procs\" && shift && exec \"$@\"")
            .arg("sh")
            .arg(&self.dir)
            .arg(program);
        cmd
    }

    /// The cgroup's peak usage (v2 `memory.peak`, v1 `memory.max_usage_in_bytes`), if reported.
    pub(crate) fn peak(&self) -> Option<u64> {
        let f = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        std::fs::read_to_string(self.dir.join(f))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn vm_rss(pid: u32) -> Option<u64> {
    shared::procfs::vm_rss_bytes(Some(pid))
}

#[test]
fn in_a_memory_cgroup_expertd_refuses_a_budget_that_cannot_fit_and_a_derived_one_stays_under_the_limit()
 {
    let (work, container) = work_with_container("small");
    let container_bytes = std::fs::metadata(container.join("experts.sluice"))
        .expect("container")
        .len();
    let small = match Cgroup::make(
        &format!("sluice-test-small-{}", std::process::id()),
        64 * MIB,
    ) {
        Ok(cg) => cg,
        Err(why) => {
            shared::skip::skip(
                "cgroup",
                "the budget-against-limit test",
                &format!(
                    "cannot make a memory cgroup here ({why}; it needs root and a writable cgroup hierarchy)"
                ),
            );
            return;
        }
    };
    // 64 MiB cannot hold the whole container plus the daemon's fixed overhead.
    let out = small
        .command(&workspace_bin("expertd"))
        .args([
            "serve",
            "--container",
            container.to_str().expect("utf-8"),
            "--socket",
        ])
        .arg(work.path().join("refused.sock"))
        .arg("--cache-bytes")
        .arg(container_bytes.to_string())
        .stdin(Stdio::null())
        .output()
        .expect("spawn expertd in the cgroup");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expertd started in a 64 MiB cgroup: {err}"
    );
    assert!(
        err.contains("does not fit the memory limit 67108864 B")
            && err.contains(&small.dir.display().to_string()),
        "{err}"
    );
    assert!(err.contains("the overhead alone exceeds it"), "{err}");
    eprintln!("refusal: {}", err.trim());

    // 256 MiB and no --cache-bytes: a budget derived from the limit; four hosts at once.
    let limit = 256 * MIB;
    let fit = Cgroup::make(&format!("sluice-test-fit-{}", std::process::id()), limit)
        .expect("second cgroup");
    let socket = work.path().join("fit.sock");
    let log = work.path().join("fit.log");
    let mut daemon = Spawned::spawn(
        fit.command(&workspace_bin("expertd"))
            .args([
                "serve",
                "--container",
                container.to_str().expect("utf-8"),
                "--socket",
            ])
            .arg(&socket),
        &log,
    );
    daemon.wait_ready(Duration::from_secs(30), |log| {
        log.contains("expertd serving") && std::os::unix::net::UnixStream::connect(&socket).is_ok()
    });
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.contains("budget derived from the memory limit"),
        "{text}"
    );
    let pid = daemon.id();
    let prompts = prompts_file("small", work.path(), 4);
    let uri = format!("unix://{}", socket.display());
    let mut clients: Vec<Spawned> = (0..4)
        .map(|i| {
            let mut cmd = Command::new(workspace_bin("hostd"));
            cmd.arg("eval")
                .arg("--model")
                .arg(model_dir("small"))
                .arg("--prompts")
                .arg(&prompts)
                .args(["--new-tokens", "8", "--threads", "1", "--out"]);
            cmd.arg(work.path().join(format!("out-{i}.json")))
                .arg("--expertd")
                .arg(&uri);
            if i % 2 == 1 {
                cmd.arg("--expertd-no-shm");
            }
            Spawned::spawn_logged(&mut cmd)
        })
        .collect();
    let (mut peak, mut samples) = (0u64, 0u32);
    let t0 = Instant::now();
    let mut done = [false; 4];
    while done.iter().any(|d| !d) {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "clients still running after 120 s"
        );
        peak = peak.max(vm_rss(pid).expect("expertd died in its cgroup (OOM?)"));
        samples += 1;
        for (i, d) in done.iter_mut().enumerate() {
            if !*d && let Some(status) = clients[i].try_wait() {
                assert!(status.success(), "hostd eval {i} failed");
                *d = true;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let cgroup_peak = fit.peak();
    eprintln!(
        "expertd in a {} MiB cgroup: peak VmRSS {:.1} MiB over {samples} samples, cgroup peak usage {:?} MiB",
        limit / MIB,
        peak as f64 / MIB as f64,
        cgroup_peak.map(|p| p as f64 / MIB as f64)
    );
    assert!(samples >= 5, "only {samples} samples");
    assert!(
        peak < limit,
        "peak RSS {peak} B not under the cgroup limit {limit} B"
    );
    assert!(daemon.try_wait().is_none(), "expertd died during the run");
    assert!(daemon.stop().success());
    drop(clients.drain(..));
}

fn check_metrics(text: &str, dir: &Path, tag: &str, flags: &[&str]) -> serde_json::Value {
    let file = dir.join(format!("{tag}.txt"));
    std::fs::write(&file, text).expect("write metrics");
    let script = workspace_root().join("tests/deploy/check_metrics.py");
    let py = python();
    let out = Command::new(&py)
        .arg(&script)
        .arg(&file)
        .args(flags)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} (scripts/pyenv makes target/venv with prometheus_client): {e}",
                py.display()
            )
        });
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("No module named 'prometheus_client'"),
        "{} lacks prometheus_client: run scripts/pyenv",
        py.display()
    );
    assert!(
        out.status.success(),
        "{tag}: metrics do not add up: {err}\n{text}"
    );
    serde_json::from_slice(&out.stdout).expect("summary json")
}

fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect metrics");
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .expect("request");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("response");
    let (head, body) = resp.split_once("\r\n\r\n").expect("http response");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    body.to_string()
}

#[test]
fn metrics_endpoint_and_expertd_stats_parse_and_per_session_counters_add_up_to_peers_and_totals() {
    let work = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o777))
        .expect("chmod work dir");
    let container = work.path().join("container");
    prepare_container(&model_dir("tiny"), &container);
    let socket = work.path().join("expertd.sock");
    let log = work.path().join("expertd.log");
    let mut daemon = Spawned::spawn(
        Command::new(workspace_bin("expertd"))
            // INFO whatever the test's RUST_LOG: the metrics port is read from the INFO line.
            .env("RUST_LOG", "info")
            .args([
                "serve",
                "--container",
                container.to_str().expect("utf-8"),
                "--socket",
            ])
            .arg(&socket)
            // Port 0: the daemon binds a free port and logs it (no race with parallel tests).
            .args(["--socket-mode", "666", "--no-prefetch", "--metrics-listen"])
            .arg("127.0.0.1:0")
            .arg("--cache-bytes")
            .arg((3 * blob_stride(&container)).to_string()),
        &log,
    );
    let mut port = 0;
    daemon.wait_ready(Duration::from_secs(30), |log| {
        port = tests::logged_addr(log, "metrics on http://").map_or(0, |a| a.port());
        std::os::unix::net::UnixStream::connect(&socket).is_ok()
            && port != 0
            && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });

    // Three sessions over two connections (uid 0), a different number of calls each.
    // The runtime outlives the block: its connections (and so the sessions) stay open.
    let runtime = rt();
    let (conn_a, conn_b, sessions) = runtime.block_on(async {
        let mut a = raw_unix(&socket).await;
        let mut b = raw_unix(&socket).await;
        let mut ids = Vec::new();
        for (client, n_calls) in [(&mut a, 3u32), (&mut b, 5)] {
            let id = client
                .handshake(handshake_request(None))
                .await
                .expect("handshake")
                .into_inner()
                .session_id;
            for k in 0..n_calls {
                let mut call = super::expertd::valid_call(id);
                call.request_id = u64::from(k) + 1;
                call.expert_ids = vec![k % 8, (k + 3) % 8, (k + 5) % 8, (k + 1) % 8];
                client.moe_layer(call).await.expect("call");
            }
            ids.push(id);
        }
        let idle = a
            .handshake(handshake_request(None))
            .await
            .expect("handshake")
            .into_inner()
            .session_id;
        ids.push(idle);
        (a, b, ids)
    });
    let first = check_metrics(
        &scrape(port),
        work.path(),
        "open",
        &["--all-open", "--no-prefetch", "--expect-peers", "uid:0"],
    );
    assert_eq!(first["calls"], 8.0, "{first}");
    assert_eq!(first["open_sessions"], 3, "{first}");
    for id in &sessions {
        assert!(
            scrape(port).contains(&format!("session=\"{id}\"")),
            "session {id} not labelled"
        );
    }

    // A host as uid 65534 runs to the end: its session closes, its uid's counters remain.
    let prompts = prompts_file("tiny", work.path(), 1);
    let uri = format!("unix://{}", socket.display());
    let out = {
        use std::os::unix::process::CommandExt;
        Command::new(workspace_bin("hostd"))
            .arg("eval")
            .arg("--model")
            .arg(model_dir("tiny"))
            .arg("--prompts")
            .arg(&prompts)
            .args(["--new-tokens", "4", "--threads", "1", "--out"])
            .arg(work.path().join("nobody.json"))
            .arg("--expertd")
            .arg(&uri)
            .uid(65534)
            .gid(65534)
            .output()
            .expect("spawn hostd as uid 65534")
    };
    assert!(
        out.status.success(),
        "hostd eval as uid 65534: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The daemon learns of the exit when it reads the closed socket, a moment after the process
    // is gone: wait (bounded) for the session to close before judging the counters.
    let closed = "expertd_peer_sessions_open{peer=\"uid:65534\"} 0";
    let t0 = Instant::now();
    let mut text = scrape(port);
    while !text.contains(closed) && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
        text = scrape(port);
    }
    let second = check_metrics(
        &text,
        work.path(),
        "closed",
        &["--no-prefetch", "--expect-peers", "uid:0,uid:65534"],
    );
    assert!(second["calls"].as_f64().expect("calls") > 8.0, "{second}");
    assert!(
        text.contains("expertd_peer_sessions_open{peer=\"uid:65534\"} 0"),
        "{text}"
    );

    // `expertd stats` prints the same counters over the unix socket.
    let stats = Command::new(workspace_bin("expertd"))
        .arg("stats")
        .arg("--socket")
        .arg(&socket)
        .output()
        .expect("expertd stats");
    assert!(
        stats.status.success(),
        "expertd stats: {}",
        String::from_utf8_lossy(&stats.stderr)
    );
    let from_cli = check_metrics(
        &String::from_utf8_lossy(&stats.stdout),
        work.path(),
        "cli",
        &["--no-prefetch", "--expect-peers", "uid:0,uid:65534"],
    );
    assert_eq!(
        from_cli["calls"], second["calls"],
        "expertd stats and the endpoint disagree"
    );
    drop((conn_a, conn_b));
    drop(runtime);
    assert!(daemon.stop().success());
}
