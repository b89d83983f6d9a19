//! expertd's resident memory under four concurrent hosts: the real `expertd serve` on the
//! `small` fixture's container with a small cache budget, four `hostd eval` clients at once
//! (two with shared-memory activations, two inline), `/proc/<pid>/status` VmRSS sampled every
//! 20 ms while they run. The peak must stay within
//!
//!   budget + transient pool + idle RSS + 64 MiB
//!
//! where the budget is `--cache-bytes` (a quarter of the container, so it evicts), the transient
//! pool is the daemon's default `transient_slots × blob stride` (read back from its start-up
//! log), and idle RSS is the
//! daemon's own VmRSS measured after start-up and before any client (the binary, runtime,
//! threads, container index). The 64 MiB is the allowance for per-connection and per-call
//! state (four sessions, their shared-memory segments mapped into the daemon, gRPC buffers,
//! allocator slack); a leak per call or per session would exceed it. Bounded: the clients are
//! killed and the test fails after 120 s.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tests::{model_dir, prepare_container, reference, workspace_bin};

const MIB: u64 = 1 << 20;
const ALLOWANCE: u64 = 64 * MIB;
const CLIENTS: usize = 4;
const DEADLINE: Duration = Duration::from_secs(120);

/// VmRSS of `pid` in bytes, `None` once the process is gone.
fn vm_rss(pid: u32) -> Option<u64> {
    shared::procfs::vm_rss_bytes(Some(pid))
}

/// The log without ANSI colour sequences (`ESC [ … m`).
fn strip_ansi(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `key=VALUE` from the daemon's start-up log line.
fn log_field(log: &str, key: &str) -> u64 {
    let log = &strip_ansi(log);
    let needle = format!("{key}=");
    let at = log.find(&needle).unwrap_or_else(|| panic!("{key} not in the expertd log: {log}"));
    log[at + needle.len()..].chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap_or_else(|e| panic!("{key}: {e}: {log}"))
}

/// The `small` oracle prompts (ids only), `repeat` times over.
fn prompts_file(dir: &Path, repeat: usize) -> PathBuf {
    let r = reference("small");
    let mut items = Vec::new();
    for i in 0..repeat {
        for (j, p) in r["prompts"].as_array().expect("prompts").iter().enumerate() {
            items.push(format!("{{\"name\":\"p{j}-{i}\",\"input_ids\":{}}}", p["input_ids"]));
        }
    }
    let path = dir.join("prompts.json");
    std::fs::write(&path, format!("{{\"prompts\":[{}]}}", items.join(","))).expect("write prompts");
    path
}

struct Killed(Vec<Child>);

impl Drop for Killed {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn expertd_rss_with_four_concurrent_hosts_stays_within_budget_transients_and_idle_plus_64_mib() {
    let work = tempfile::tempdir().expect("tempdir");
    let container = work.path().join("container");
    prepare_container(&model_dir("small"), &container);
    let container_bytes = std::fs::metadata(container.join("experts.sluice")).expect("container").len();

    // Start the daemon with a budget of a quarter of the container (so it evicts).
    let socket = work.path().join("expertd.sock");
    let log_path = work.path().join("expertd.log");
    let budget = container_bytes / 4;
    let daemon = Command::new(workspace_bin("expertd"))
        .arg("serve")
        .arg("--container")
        .arg(&container)
        .arg("--cache-bytes")
        .arg(budget.to_string())
        .arg("--socket")
        .arg(&socket)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).expect("log"))
        .spawn()
        .expect("spawn expertd");
    let pid = daemon.id();
    let mut guard = Killed(vec![daemon]);
    let start = Instant::now();
    let log = loop {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if log.contains("expertd serving") && std::os::unix::net::UnixStream::connect(&socket).is_ok() {
            break log;
        }
        assert!(guard.0[0].try_wait().expect("try_wait").is_none(), "expertd exited: {log}");
        assert!(start.elapsed() < Duration::from_secs(30), "expertd not ready: {log}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let stride = log_field(&log, "blob_bytes");
    // The default pool (min(experts per layer, 32) per compute lane): a smaller one refuses
    // concurrent prefill calls with RESOURCE_EXHAUSTED at this budget.
    let transient_slots = log_field(&log, "transient_slots");
    assert_eq!(log_field(&log, "budget_bytes"), budget, "{log}");

    // Idle RSS: the largest of ten samples over 200 ms, before any client.
    let mut idle = 0;
    for _ in 0..10 {
        idle = idle.max(vm_rss(pid).expect("daemon alive"));
        std::thread::sleep(Duration::from_millis(20));
    }
    let transient = transient_slots * stride;
    let bound = budget + transient + idle + ALLOWANCE;

    // Four hosts at once, long enough to be sampled many times.
    let prompts = prompts_file(work.path(), 6);
    let uri = format!("unix://{}", socket.display());
    for i in 0..CLIENTS {
        let mut cmd = Command::new(workspace_bin("hostd"));
        cmd.arg("eval")
            .arg("--model")
            .arg(model_dir("small"))
            .arg("--prompts")
            .arg(&prompts)
            .arg("--new-tokens")
            .arg("8")
            .arg("--threads")
            .arg("1")
            .arg("--out")
            .arg(work.path().join(format!("out-{i}.json")))
            .arg("--expertd")
            .arg(&uri);
        if i % 2 == 1 {
            cmd.arg("--expertd-no-shm");
        }
        guard.0.push(cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn hostd"));
    }
    let t0 = Instant::now();
    let (mut peak, mut samples) = (idle, 0u32);
    let mut done = [false; CLIENTS];
    while done.iter().any(|d| !d) {
        assert!(t0.elapsed() < DEADLINE, "clients still running after {DEADLINE:?}");
        peak = peak.max(vm_rss(pid).expect("expertd died while serving"));
        samples += 1;
        for (i, d) in done.iter_mut().enumerate() {
            if !*d && let Some(status) = guard.0[1 + i].try_wait().expect("try_wait") {
                let mut err = String::new();
                if let Some(mut e) = guard.0[1 + i].stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                assert!(status.success(), "hostd eval {i} failed: {err}");
                *d = true;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let elapsed = t0.elapsed();
    eprintln!(
        "expertd RSS: idle {:.1} MiB, peak {:.1} MiB over {samples} samples in {:.2} s; bound {:.1} MiB = budget {:.3} MiB + transient {} × {stride} B + idle + 64 MiB",
        idle as f64 / MIB as f64,
        peak as f64 / MIB as f64,
        elapsed.as_secs_f64(),
        bound as f64 / MIB as f64,
        budget as f64 / MIB as f64,
        transient_slots,
    );
    assert!(samples >= 10, "only {samples} RSS samples: the clients ran {elapsed:?}, too short to measure");
    assert!(peak <= bound, "expertd peak RSS {peak} B > bound {bound} B (idle {idle}, budget {budget}, transient {transient})");
}
