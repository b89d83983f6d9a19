//! expertd start-up, with the real `expertd serve` binary: the socket file appears only once the
//! daemon can serve (start-up is held open with a route trace on a FIFO nobody reads yet); a
//! client that connects first waits for the daemon and a client with no daemon gives up after
//! its bounded wait with a message saying so, while an error waiting cannot fix fails at once;
//! a budget above what the container holds is clamped to it, and a big arena is not committed
//! at start (VmRSS well below it).

use super::expertd::{container_bytes, raw_unix, rt};
use expertd::server::{Prepared, ServeConfig};
use hostd::expert_client::{ClientOptions, Endpoint, ExpertdClient};
use hostd::experts::{ExpertBackend, MoeCall};
use proto::v1::{self as pb};
use shared::container::ContainerFile;
use shared::ids::LayerId;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tests::{Spawned, model_dir, prepare_container, work_with_container, workspace_bin};

const MIB: u64 = 1 << 20;
/// `tiny`'s hidden size and experts per layer.
const HIDDEN_TINY: usize = 64;

/// Spawns `expertd serve` on `socket` (killed when dropped).
fn serve(container: &Path, socket: &Path, cache_bytes: u64, extra: &[&str]) -> Spawned {
    let mut cmd = Command::new(workspace_bin("expertd"));
    cmd.arg("serve")
        .arg("--container")
        .arg(container)
        .arg("--socket")
        .arg(socket)
        .arg("--cache-bytes")
        .arg(cache_bytes.to_string())
        .args(extra);
    Spawned::spawn_logged(&mut cmd)
}

fn tiny_container(dir: &Path) -> PathBuf {
    let container = dir.join("container");
    prepare_container(&model_dir("tiny"), &container);
    container
}

/// A client for `tiny` at `socket` that waits `connect_timeout` for the first connection.
fn connect_tiny(
    socket: &Path,
    connect_timeout: Duration,
) -> Result<ExpertdClient, hostd::expert_client::ExpertClientError> {
    let mut opts = ClientOptions::new(Endpoint::Unix(socket.to_path_buf()), 4, 8, HIDDEN_TINY);
    opts.connect_timeout = connect_timeout;
    // Longer than any wait below: the first connection must use `connect_timeout`.
    opts.reconnect_timeout = Duration::from_secs(120);
    opts.client_name = "start-up test".into();
    ExpertdClient::connect(opts, None)
}

fn tiny_call(client: &ExpertdClient) {
    let x: Vec<f32> = (0..2 * HIDDEN_TINY)
        .map(|i| ((i as f32) * 0.37).sin())
        .collect();
    let call = MoeCall {
        layer: LayerId::new(1),
        n_rows: 2,
        top_k: 2,
        x: &x,
        ids: &[4, 5, 6, 7],
        weights: &[0.6, 0.4, 0.3, 0.7],
    };
    let mut out = vec![0.0f32; 2 * HIDDEN_TINY];
    client
        .moe_layer(&call, &mut out)
        .expect("a call on the new session");
    assert!(out.iter().all(|v| v.is_finite()) && out.iter().any(|&v| v != 0.0));
}

/// The daemon's `Stats`, answered within 2 s.
fn stats(socket: &Path) -> pb::StatsResponse {
    rt().block_on(async {
        let call = async { raw_unix(socket).await.stats(pb::StatsRequest {}).await };
        tokio::time::timeout(Duration::from_secs(2), call)
            .await
            .expect("stats answered at once")
            .expect("stats")
            .into_inner()
    })
}

/// VmRSS of `pid` in bytes.
fn vm_rss(pid: u32) -> u64 {
    shared::procfs::vm_rss_bytes(Some(pid)).expect("VmRSS of /proc/PID/status")
}

#[test]
fn the_socket_appears_only_once_the_daemon_can_serve_and_an_early_client_waits() {
    let work = tempfile::tempdir().expect("tempdir");
    let container = tiny_container(work.path());
    let run = work.path().join("run");
    std::fs::create_dir(&run).expect("mkdir");
    let fifo = work.path().join("trace.fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo")
            .success()
    );
    let socket = run.join("expertd.sock");
    // Opening the route trace (a FIFO with no reader yet) holds the daemon inside its start-up.
    let mut daemon = serve(
        &container,
        &socket,
        container_bytes(&container),
        &["--route-trace", fifo.to_str().expect("utf-8")],
    );
    std::thread::scope(|s| {
        let early = s.spawn(|| connect_tiny(&socket, Duration::from_secs(60)));
        std::thread::sleep(Duration::from_millis(800));
        daemon.assert_running();
        let entries: Vec<_> = std::fs::read_dir(&run)
            .expect("read dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert!(
            entries.is_empty(),
            "nothing may be bound while the daemon cannot serve: {entries:?}"
        );
        assert!(
            !daemon.log_text().contains("expertd serving"),
            "{}",
            daemon.log_text()
        );

        // Let start-up finish: from the moment the socket file exists, it is served at once.
        let reader = s.spawn(|| {
            let mut trace = String::new();
            std::fs::File::open(&fifo)
                .expect("open fifo")
                .read_to_string(&mut trace)
                .expect("read trace");
            trace
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        while !socket.exists() {
            daemon.assert_running();
            assert!(
                Instant::now() < deadline,
                "no socket: {}",
                daemon.log_text()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let st = stats(&socket);
        assert!(st.cache.is_some(), "{st:?}");
        assert!(
            daemon.log_text().contains("expertd serving"),
            "the ready line is logged: {}",
            daemon.log_text()
        );
        let leftovers: Vec<_> = std::fs::read_dir(&run)
            .expect("read dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(
            leftovers,
            vec![std::ffi::OsString::from("expertd.sock")],
            "only the socket, no temporary name"
        );
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&socket).expect("socket").permissions(),
        );
        assert_eq!(
            mode & 0o777,
            0o660,
            "the socket has its mode when it appears"
        );

        // The client that connected before the daemon was up got its session.
        let client = early
            .join()
            .expect("join")
            .expect("the early client connects once the daemon is up");
        tiny_call(&client);
        drop(client);
        let log = daemon.log_text();
        assert_eq!(
            log.matches("expertd serving").count(),
            1,
            "one ready line: {log}"
        );
        daemon.stop();
        let trace = reader.join().expect("join");
        assert!(
            trace.lines().count() >= 2,
            "the route trace was recorded: {trace}"
        );
    });
}

#[test]
fn a_first_connect_waits_for_a_daemon_started_a_second_later() {
    let work = tempfile::tempdir().expect("tempdir");
    let container = tiny_container(work.path());
    let socket = work.path().join("expertd.sock");
    std::thread::scope(|s| {
        let client = s.spawn(|| connect_tiny(&socket, Duration::from_secs(60)));
        std::thread::sleep(Duration::from_secs(1));
        assert!(!client.is_finished(), "the client waits instead of failing");
        let daemon = serve(&container, &socket, container_bytes(&container), &[]);
        let client = client
            .join()
            .expect("join")
            .unwrap_or_else(|e| panic!("connect: {e}\n{}", daemon.log_text()));
        tiny_call(&client);
        drop(client);
        daemon.stop();
    });
}

#[test]
fn without_a_daemon_the_first_connect_gives_up_after_its_wait_and_says_so() {
    let work = tempfile::tempdir().expect("tempdir");
    let socket = work.path().join("expertd.sock");
    let t = Instant::now();
    let err = connect_tiny(&socket, Duration::from_millis(1500)).expect_err("no daemon");
    let waited = t.elapsed();
    let msg = err.to_string();
    assert!(
        waited >= Duration::from_millis(1500) && waited < Duration::from_secs(10),
        "gave up after {waited:?}: {msg}"
    );
    let want = format!(
        "expertd at unix://{} did not come up within 1.5 s; last error: ",
        socket.display()
    );
    assert!(msg.starts_with(&want), "{msg}");
    assert!(
        msg.contains("No such file or directory"),
        "names the last error: {msg}"
    );

    // A failure that waiting cannot fix is reported at once: a path through a regular file.
    let file = work.path().join("file");
    std::fs::write(&file, "x").expect("write");
    let t = Instant::now();
    let err = connect_tiny(&file.join("expertd.sock"), Duration::from_secs(60))
        .expect_err("not a directory");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "failed after {:?}: {err}",
        t.elapsed()
    );
    assert!(err.to_string().contains("Not a directory"), "{err}");
}

#[test]
fn a_budget_above_the_container_is_clamped_and_a_big_arena_is_not_committed_at_start() {
    let (work, container) = work_with_container("small");
    let header = *ContainerFile::open(&container).expect("container").header();
    let stride = header.layout.blob.stride as u64;
    let n_blobs = header.layout.dims.n_blobs() as u64;
    let holds = n_blobs * stride;
    let budget = 4 * container_bytes(&container);
    assert!(budget > holds);

    // In process: the cache holds one slot per expert, and its configuration says so.
    let prepared = Prepared::new(ServeConfig::new(container.clone(), budget)).expect("prepare");
    let cache = prepared.executor().cache();
    assert_eq!(
        cache.config().budget_bytes,
        holds,
        "the budget is clamped to the container's experts"
    );
    assert_eq!(cache.stats().n_slots, n_blobs);
    assert_eq!(cache.stats().budget_bytes, holds);
    drop(prepared);

    // The daemon: a transient pool of 1 GiB of address space on top, nothing of it committed.
    let transient = (1024 * MIB).div_ceil(stride);
    let socket = work.path().join("expertd.sock");
    let mut daemon = serve(
        &container,
        &socket,
        budget,
        &["--transient-slots", &transient.to_string()],
    );
    daemon.wait_ready(Duration::from_secs(30), |log| {
        log.contains("expertd serving") && std::os::unix::net::UnixStream::connect(&socket).is_ok()
    });
    let arena = (n_blobs + transient) * stride;
    let log = daemon.log_text();
    assert!(log.contains("budget clamped"), "the clamp is logged: {log}");
    let cache = stats(&socket).cache.expect("cache stats");
    assert_eq!(
        cache.budget_bytes, holds,
        "Stats reports the clamped budget"
    );
    // Right after start and a moment later: far below the arena (a committed arena would be
    // all of it resident).
    for pause in [Duration::ZERO, Duration::from_secs(2)] {
        std::thread::sleep(pause);
        let rss = vm_rss(daemon.id());
        assert!(
            rss < 160 * MIB && rss < arena / 4,
            "VmRSS {} MiB with a {} MiB arena: {log}",
            rss / MIB,
            arena / MIB
        );
    }
    daemon.stop();
}
