//! expertd end to end: the real `expertd serve` and `hostd eval` binaries on the oracle
//! fixtures. hostd with expertd — over shared memory, inline on the unix socket, over TCP with a
//! token, with a private child daemon, with a budget that forces evictions every step and one
//! that holds everything, with io_uring and with pread — writes logits byte-equal to the
//! in-process INT8 backend's; concurrent clients get what they get alone; a killed hostd's
//! session and leases are gone promptly (EOF, not keepalive); a daemon restart fails the call in
//! flight clearly and the client reconnects; every malformed call gets its own status and the daemon
//! keeps serving; a corrupted blob is DATA_LOSS for that expert. Those last two run the server
//! in this process ([`InProcessDaemon`], configured here by [`whole_container`]); the rest run
//! the `expertd serve` binary ([`Daemon`]).

use expertd::server::ServeConfig;
use hostd::expert_client::{ClientOptions, Endpoint, ExpertdClient};
use hostd::experts::{ExpertBackend, MoeCall};
use proto::v1::expert_service_client::ExpertServiceClient;
use proto::v1::{self as pb, moe_layer_request::Input};
use shared::container::{ContainerFile, ModelIdentity};
use shared::ids::LayerId;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tests::{
    InProcessDaemon, Spawned, model_dir, presets, reference, work_with_container, workspace_bin,
};
use tonic::Code;
use tonic::transport::Channel;

mod faults;

const NEW_TOKENS: &str = "8";

/// A running `expertd serve`, killed (SIGKILL) when dropped unless stopped.
pub(crate) struct Daemon {
    process: Spawned,
    pub(crate) socket: Option<PathBuf>,
    port: Option<u16>,
    /// Serving TLS on the port (`--tls-cert` among the extra flags).
    tls: bool,
    _dir: tempfile::TempDir,
}

impl Daemon {
    pub(crate) fn start(
        container: &Path,
        cache_bytes: u64,
        tcp_token: Option<&Path>,
        extra: &[&str],
    ) -> Daemon {
        Daemon::start_at(container, cache_bytes, tcp_token, extra, None)
    }

    /// `socket_at`: serve on this unix socket path instead of a fresh one. On TCP the daemon
    /// serves TLS when `extra` has `--tls-cert`/`--tls-key`, plain TCP (`--insecure`) otherwise.
    pub(crate) fn start_at(
        container: &Path,
        cache_bytes: u64,
        tcp_token: Option<&Path>,
        extra: &[&str],
        socket_at: Option<&Path>,
    ) -> Daemon {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("expertd.log");
        let mut cmd = Command::new(workspace_bin("expertd"));
        // INFO whatever the test's own RUST_LOG: the TCP port is read from the INFO line.
        cmd.env("RUST_LOG", "info");
        cmd.arg("serve")
            .arg("--container")
            .arg(container)
            .arg("--cache-bytes")
            .arg(cache_bytes.to_string())
            .args(extra);
        let (socket, port) = match tcp_token {
            None => {
                let s =
                    socket_at.map_or_else(|| dir.path().join("expertd.sock"), Path::to_path_buf);
                cmd.arg("--socket").arg(&s);
                (Some(s), None)
            }
            Some(token) => {
                // Port 0: the daemon binds a free port and logs it, so parallel tests cannot
                // race for a port picked here and released before the daemon binds it.
                cmd.arg("--listen")
                    .arg("127.0.0.1:0")
                    .arg("--auth-token-file")
                    .arg(token);
                if !extra.contains(&"--tls-cert") {
                    cmd.arg("--insecure");
                }
                (None, Some(0))
            }
        };
        let mut process = Spawned::spawn(&mut cmd, &log);
        let mut bound = None;
        process.wait_ready(Duration::from_secs(30), |log| match (&socket, port) {
            (Some(s), _) => std::os::unix::net::UnixStream::connect(s).is_ok(),
            (None, Some(_)) => {
                bound = tests::logged_addr(log, "listening on TCP").map(|a| a.port());
                bound.is_some_and(|p| std::net::TcpStream::connect(("127.0.0.1", p)).is_ok())
            }
            (None, None) => unreachable!(),
        });
        let port = port.and(bound);
        Daemon {
            process,
            socket,
            port,
            tls: extra.contains(&"--tls-cert"),
            _dir: dir,
        }
    }

    pub(crate) fn unix(container: &Path, cache_bytes: u64, extra: &[&str]) -> Daemon {
        Daemon::start(container, cache_bytes, None, extra)
    }

    pub(crate) fn log_text(&self) -> String {
        self.process.log_text()
    }

    /// The daemon's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.process.id()
    }

    /// How many of the daemon's mappings are clients' shared-memory segments (memfds).
    pub(crate) fn segment_mappings(&self) -> usize {
        std::fs::read_to_string(format!("/proc/{}/maps", self.pid()))
            .expect("the daemon's maps")
            .lines()
            .filter(|l| l.contains("/memfd:"))
            .count()
    }

    pub(crate) fn uri(&self) -> String {
        match (&self.socket, self.port) {
            (Some(s), _) => format!("unix://{}", s.display()),
            (None, Some(p)) => format!(
                "{}://127.0.0.1:{p}",
                if self.tls { "https" } else { "http" }
            ),
            (None, None) => unreachable!(),
        }
    }

    /// Sends `sig` (for `STOP`, returns once every thread is stopped: [`tests::signal`]).
    pub(crate) fn signal(&self, sig: &str) {
        self.process.signal(sig);
    }

    /// SIGTERM, then the exit status (the daemon drains and exits on its own).
    pub(crate) fn stop(self) -> std::process::ExitStatus {
        self.process.stop()
    }
}

pub(crate) fn blob_stride(container: &Path) -> u64 {
    ContainerFile::open(container)
        .expect("container")
        .header()
        .layout
        .blob
        .stride as u64
}

pub(crate) fn container_bytes(container: &Path) -> u64 {
    std::fs::metadata(container.join(shared::container::CONTAINER_FILE))
        .expect("container file")
        .len()
}

/// A serving configuration whose cache holds every expert of `container` (defaults otherwise),
/// for an [`InProcessDaemon`].
pub(crate) fn whole_container(container: &Path) -> ServeConfig {
    ServeConfig::new(container.to_path_buf(), container_bytes(container))
}

/// Writes the preset's oracle prompts (ids only), `repeat` times over.
pub(crate) fn prompts_file(preset: &str, dir: &Path, repeat: usize) -> PathBuf {
    let r = reference(preset);
    let prompts: Vec<serde_json::Value> = (0..repeat)
        .flat_map(|i| {
            r["prompts"].as_array().expect("prompts").iter().map(move |p| serde_json::json!({"name": format!("{}-{i}", p["name"].as_str().expect("name")), "input_ids": p["input_ids"]}))
        })
        .collect();
    let path = dir.join(format!("{preset}-prompts-{repeat}.json"));
    std::fs::write(&path, serde_json::json!({ "prompts": prompts }).to_string())
        .expect("write prompts");
    path
}

/// What `hostd eval` produced: the logits file's bytes and the greedy ids.
#[derive(PartialEq, Eq)]
pub(crate) struct EvalOut {
    logits: Vec<u8>,
    greedy: Vec<Vec<u32>>,
}

impl std::fmt::Debug for EvalOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "EvalOut({} logit bytes, greedy {:?})",
            self.logits.len(),
            self.greedy
        )
    }
}

fn eval_cmd(preset: &str, prompts: &Path, out: &Path, backend: &[&str]) -> Command {
    let mut cmd = Command::new(workspace_bin("hostd"));
    cmd.arg("eval")
        .arg("--model")
        .arg(model_dir(preset))
        .arg("--prompts")
        .arg(prompts)
        .arg("--new-tokens")
        .arg(NEW_TOKENS)
        .arg("--out")
        .arg(out);
    cmd.args(backend).arg("--threads").arg("1");
    cmd
}

fn read_eval(out: &Path) -> EvalOut {
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out).expect("eval json")).expect("json");
    let greedy = doc["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .map(|p| serde_json::from_value(p["greedy_ids"].clone()).expect("ids"))
        .collect();
    EvalOut {
        logits: std::fs::read(out.with_extension("logits.f32")).expect("logits"),
        greedy,
    }
}

pub(crate) fn eval(
    preset: &str,
    prompts: &Path,
    dir: &Path,
    tag: &str,
    backend: &[&str],
) -> EvalOut {
    let out = dir.join(format!("{tag}.json"));
    let o = eval_cmd(preset, prompts, &out, backend)
        .output()
        .expect("spawn hostd");
    assert!(
        o.status.success(),
        "hostd eval ({tag}) failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    read_eval(&out)
}

pub(crate) fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A shared-memory client as hostd connects one: `seg` passed in the pre-handshake on a new
/// connection to `socket`, then a handshake with `req`. The link (its `segment_id` is 0 when the
/// daemon refused the segment) and the handshake's answer.
pub(crate) async fn ring_client(
    socket: &Path,
    seg: &std::sync::Arc<hostd::expert_client::shm::ClientSegment>,
    req: pb::HandshakeRequest,
) -> (hostd::expert_client::transport::Link, pb::HandshakeResponse) {
    let mut link = hostd::expert_client::transport::connect(
        &Endpoint::Unix(socket.to_path_buf()),
        Some(std::sync::Arc::clone(seg)),
        None,
    )
    .await
    .expect("connect");
    let hs = link
        .client
        .handshake(req)
        .await
        .expect("handshake")
        .into_inner();
    (link, hs)
}

/// The inline output bytes of a `MoeLayer` answer.
pub(crate) fn output(r: pb::MoeLayerResponse) -> Vec<u8> {
    match r.output {
        Some(pb::moe_layer_response::Output::OutputInlineF32Le(b)) => b,
        other => panic!("no inline output: {other:?}"),
    }
}

/// A plain gRPC client (no shared-memory pre-handshake) on the daemon's unix socket.
pub(crate) async fn raw_unix(socket: &Path) -> ExpertServiceClient<Channel> {
    ExpertServiceClient::new(unix_channel(socket).await)
}

/// [`raw_unix`] with a session opened by a plain handshake: the client and the session id.
pub(crate) async fn raw_session(socket: &Path) -> (ExpertServiceClient<Channel>, u64) {
    let mut c = raw_unix(socket).await;
    let sid = c
        .handshake(handshake_request(None))
        .await
        .expect("handshake")
        .into_inner()
        .session_id;
    (c, sid)
}

/// One HTTP/2 connection (no shared-memory pre-handshake) to the daemon's unix socket.
pub(crate) async fn unix_channel(socket: &Path) -> Channel {
    try_unix_channel(socket).await.expect("connect")
}

/// [`unix_channel`], with the error when the connection fails.
pub(crate) async fn try_unix_channel(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let socket = socket.to_path_buf();
    tonic::transport::Endpoint::from_static("http://expertd.test")
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
}

pub(crate) fn handshake_request(identity: Option<&ModelIdentity>) -> pb::HandshakeRequest {
    pb::HandshakeRequest {
        protocol_version: proto::version::CURRENT,
        client_name: "test".into(),
        client_pid: std::process::id(),
        model_identity: identity.map(pb::ModelIdentity::from),
        expected_container_fingerprint: 0,
    }
}

pub(crate) const HIDDEN_TINY: usize = 64;

pub(crate) fn activations(n: usize, d: usize) -> Vec<f32> {
    (0..n * d).map(|i| ((i as f32) * 0.37).sin()).collect()
}

/// A valid call on `tiny`: two rows, top-2.
pub(crate) fn valid_call(session_id: u64) -> pb::MoeLayerRequest {
    pb::MoeLayerRequest {
        session_id,
        request_id: 1,
        step: 0,
        layer_idx: 0,
        n_tokens: 2,
        top_k: 2,
        expert_ids: vec![0, 1, 2, 3],
        weights: vec![0.75, 0.25, 0.5, 0.5],
        input: Some(Input::InputInlineF32Le(proto::convert::f32s_to_le_bytes(
            &activations(2, HIDDEN_TINY),
        ))),
        output_shm: None,
    }
}

pub(crate) fn check_status<T: std::fmt::Debug>(
    what: &str,
    r: Result<T, tonic::Status>,
    code: Code,
    needle: &str,
) {
    let s = r.expect_err(what);
    assert_eq!(s.code(), code, "{what}: {}", s.message());
    assert!(
        s.message().contains(needle),
        "{what}: {:?} does not mention {needle:?}",
        s.message()
    );
}

#[test]
fn hostd_with_expertd_equals_in_process_int8_bit_for_bit_on_every_fixture() {
    for preset in presets() {
        let (work, container) = work_with_container(&preset);
        let prompts = prompts_file(&preset, work.path(), 1);
        let c = container.to_str().expect("utf-8");
        let baseline = eval(
            &preset,
            &prompts,
            work.path(),
            "int8",
            &["--experts", "int8", "--container", c],
        );

        // A budget of two experts evicts on every step; misses beyond it use transient buffers.
        let tiny_budget = Daemon::unix(&container, 2 * blob_stride(&container), &[]);
        let mode = std::fs::metadata(tiny_budget.socket.as_ref().expect("socket"))
            .expect("socket")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o660, "socket mode");
        let shm = eval(
            &preset,
            &prompts,
            work.path(),
            "shm-tiny-budget",
            &["--expertd", &tiny_budget.uri(), "--container", c],
        );
        assert_eq!(shm, baseline, "{preset}: shared memory, tiny budget");
        let inline = eval(
            &preset,
            &prompts,
            work.path(),
            "uds-inline",
            &["--expertd", &tiny_budget.uri(), "--expertd-no-shm"],
        );
        assert_eq!(inline, baseline, "{preset}: inline over the unix socket");
        let stats = rt().block_on(async {
            let mut c = raw_unix(tiny_budget.socket.as_ref().expect("socket")).await;
            c.stats(pb::StatsRequest {})
                .await
                .expect("stats")
                .into_inner()
        });
        let cache = stats.cache.expect("cache stats");
        assert!(
            cache.evictions > 0,
            "{preset}: a two-expert budget must evict: {cache:?}"
        );
        assert_eq!(
            (cache.leases_held, stats.sessions.len()),
            (0, 0),
            "{preset}: both clients are gone"
        );

        // A budget holding everything, over TCP with a token.
        let token = work.path().join("token");
        std::fs::write(&token, "s3cret\n").expect("token");
        let tcp = Daemon::start(
            &container,
            container_bytes(&container),
            Some(&token),
            &["--io", "pread"],
        );
        let t = token.to_str().expect("utf-8");
        let over_tcp = eval(
            &preset,
            &prompts,
            work.path(),
            "tcp-full-budget",
            &[
                "--expertd",
                &tcp.uri(),
                "--expertd-token-file",
                t,
                "--expertd-insecure",
            ],
        );
        assert_eq!(over_tcp, baseline, "{preset}: TCP, full budget, pread");
        assert_eq!(tcp.stop().code(), Some(0), "SIGTERM drains and exits 0");
        assert_eq!(tiny_budget.stop().code(), Some(0));
    }
}

#[test]
fn a_private_daemon_prepares_the_container_and_matches_int8() {
    let work = tempfile::tempdir().expect("tempdir");
    let prompts = prompts_file("tiny", work.path(), 1);
    let container = work.path().join("made-by-hostd");
    let private = eval(
        "tiny",
        &prompts,
        work.path(),
        "private",
        &[
            "--experts",
            "expertd",
            "--container",
            container.to_str().expect("utf-8"),
        ],
    );
    assert!(
        container.join(shared::container::CONTAINER_FILE).exists(),
        "hostd ran expertd prepare"
    );
    let baseline = eval(
        "tiny",
        &prompts,
        work.path(),
        "int8",
        &[
            "--experts",
            "int8",
            "--container",
            container.to_str().expect("utf-8"),
        ],
    );
    assert_eq!(private, baseline);
}

#[test]
fn pread_and_io_uring_give_identical_results() {
    let (work, container) = work_with_container("small");
    let prompts = prompts_file("small", work.path(), 1);
    let budget = 3 * blob_stride(&container);
    let uring = Daemon::unix(&container, budget, &["--io", "uring"]);
    let a = eval(
        "small",
        &prompts,
        work.path(),
        "uring",
        &["--expertd", &uring.uri()],
    );
    let pread = Daemon::unix(
        &container,
        budget,
        &["--io", "pread", "--policy", "lfu-aging"],
    );
    let b = eval(
        "small",
        &prompts,
        work.path(),
        "pread",
        &["--expertd", &pread.uri()],
    );
    assert_eq!(a, b);
}

#[test]
fn two_and_four_concurrent_clients_each_get_what_they_get_alone() {
    let (work, container) = work_with_container("small");
    let c = container.to_str().expect("utf-8");
    let prompts = prompts_file("small", work.path(), 1);
    let alone = eval(
        "small",
        &prompts,
        work.path(),
        "alone",
        &["--experts", "int8", "--container", c],
    );
    let daemon = Daemon::unix(&container, 4 * blob_stride(&container), &[]);
    for n in [2usize, 4] {
        let children: Vec<(PathBuf, Child)> = (0..n)
            .map(|i| {
                let out = work.path().join(format!("together-{n}-{i}.json"));
                // Half the clients carry activations inline, half in shared memory.
                let mut cmd = eval_cmd("small", &prompts, &out, &["--expertd", &daemon.uri()]);
                if i % 2 == 1 {
                    cmd.arg("--expertd-no-shm");
                }
                (
                    out,
                    cmd.stderr(Stdio::piped()).spawn().expect("spawn hostd"),
                )
            })
            .collect();
        for (out, child) in children {
            let o = child.wait_with_output().expect("wait");
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            assert_eq!(read_eval(&out), alone, "{n} clients: {}", out.display());
        }
    }
}

fn client_for(socket: &Path, reconnect: Duration) -> ExpertdClient {
    let mut opts = ClientOptions::new(Endpoint::Unix(socket.to_path_buf()), 4, 8, HIDDEN_TINY);
    opts.reconnect_timeout = reconnect;
    opts.client_name = "restart test".into();
    ExpertdClient::connect(opts, None).expect("connect")
}

pub(crate) fn tiny_call(client: &ExpertdClient) -> Result<Vec<f32>, hostd::experts::ExpertError> {
    let x = activations(3, HIDDEN_TINY);
    let call = MoeCall {
        layer: LayerId::new(1),
        n_rows: 3,
        top_k: 2,
        x: &x,
        ids: &[4, 5, 6, 7, 0, 4],
        weights: &[0.6, 0.4, 0.3, 0.7, 0.5, 0.5],
    };
    let mut out = vec![0.0f32; 3 * HIDDEN_TINY];
    client.moe_layer(&call, &mut out).map(|()| out)
}
