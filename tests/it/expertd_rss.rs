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

use super::expertd::{container_bytes, prompts_file};
use std::process::Command;
use std::time::{Duration, Instant};
use tests::{Spawned, model_dir, work_with_container, workspace_bin};

const MIB: u64 = 1 << 20;
const ALLOWANCE: u64 = 64 * MIB;
const CLIENTS: usize = 4;
const DEADLINE: Duration = Duration::from_secs(120);

/// VmRSS of `pid` in bytes, `None` once the process is gone.
fn vm_rss(pid: u32) -> Option<u64> {
    shared::procfs::vm_rss_bytes(Some(pid))
}

/// `key=VALUE` from the daemon's start-up log line (plain text: the daemon colours its log only
/// on a terminal, `tests/it/first_hour.rs` checks).
fn log_field(log: &str, key: &str) -> u64 {
    let needle = format!("{key}=");
    let at = log
        .find(&needle)
        .unwrap_or_else(|| panic!("{key} not in the expertd log: {log}"));
    log[at + needle.len()..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or_else(|e| panic!("{key}: {e}: {log}"))
}

#[test]
fn expertd_rss_with_four_concurrent_hosts_stays_within_budget_transients_and_idle_plus_64_mib() {
    let (work, container) = work_with_container("small");
    let container_bytes = container_bytes(&container);

    // Start the daemon with a budget of a quarter of the container (so it evicts).
    let socket = work.path().join("expertd.sock");
    let log_path = work.path().join("expertd.log");
    let budget = container_bytes / 4;
    let mut daemon = Spawned::spawn(
        Command::new(workspace_bin("expertd"))
            .arg("serve")
            .arg("--container")
            .arg(&container)
            .arg("--cache-bytes")
            .arg(budget.to_string())
            .arg("--socket")
            .arg(&socket)
            .env("RUST_LOG", "info"),
        &log_path,
    );
    daemon.wait_ready(Duration::from_secs(30), |log| {
        log.contains("expertd serving") && std::os::unix::net::UnixStream::connect(&socket).is_ok()
    });
    let pid = daemon.id();
    let log = daemon.log_text();
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
    let prompts = prompts_file("small", work.path(), 6);
    let uri = format!("unix://{}", socket.display());
    let mut clients = Vec::with_capacity(CLIENTS);
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
        clients.push(Spawned::spawn_logged(&mut cmd));
    }
    let t0 = Instant::now();
    let (mut peak, mut samples) = (idle, 0u32);
    let mut done = [false; CLIENTS];
    while done.iter().any(|d| !d) {
        assert!(
            t0.elapsed() < DEADLINE,
            "clients still running after {DEADLINE:?}"
        );
        peak = peak.max(vm_rss(pid).expect("expertd died while serving"));
        samples += 1;
        for (i, d) in done.iter_mut().enumerate() {
            if !*d && let Some(status) = clients[i].try_wait() {
                assert!(
                    status.success(),
                    "hostd eval {i} failed: {}",
                    clients[i].log_text()
                );
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
    assert!(
        samples >= 10,
        "only {samples} RSS samples: the clients ran {elapsed:?}, too short to measure"
    );
    assert!(
        peak <= bound,
        "expertd peak RSS {peak} B > bound {bound} B (idle {idle}, budget {budget}, transient {transient})"
    );
}
