//! The daemon's serving loop, in two steps so that nothing listens before the daemon can
//! serve: [`Prepared::new`] opens the container and builds the cache (its budget clamped to
//! what the container holds) and the call executor, and logs what it will serve; [`Prepared::serve`]
//! then serves `expertd.v1.ExpertService` plus `grpc.health.v1` on a listener the caller bound
//! *afterwards*, until the caller's shutdown future resolves; then it refuses new calls, lets
//! in-flight ones finish, and returns. [`run`] is both steps for a listener bound already
//! (mini-redis style: tests run the real server on a temporary socket).
//!
//! Owns connection acceptance: unix peers' credentials and allow lists, the shared-memory
//! pre-handshake (`crate::shm`), TCP only with a bearer token (gRPC health included) and, unless
//! `insecure_tcp` says otherwise, TLS (rustls through tonic, the certificate and key the caller
//! gave), and each connection's lifetime —
//! when a connection's IO is dropped (client exited, was killed, hung up) its sessions close and
//! their leases are released. The RPCs themselves are `crate::rpc`.

use crate::cache::{CacheConfig, ExpertCache, Policy};
use crate::io::{IoKind, open_source};
use crate::moe_call::CallExecutor;
use crate::rpc::auth::Auth;
use crate::rpc::{ConnInfo, ExpertdService, Peer, ServiceConfig, ServiceState};
use crate::shm::PrefixedStream;
use crate::trace::TraceWriter;
use proto::v1::expert_service_server::ExpertServiceServer;
use shared::kernels::int8::Int8Isa;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio::sync::{mpsc, watch};
use tonic::transport::server::Connected;

/// Default bound on one session's calls queued or running.
pub const DEFAULT_MAX_QUEUED_CALLS: u32 = 8;
/// Default cap on sessions one connection holds open (a hostd opens one).
pub const DEFAULT_MAX_SESSIONS_PER_CONNECTION: u32 = 64;
/// Default cap on sessions one peer (unix uid, or TCP address) holds open over all its
/// connections.
pub const DEFAULT_MAX_SESSIONS_PER_UID: u32 = 256;
/// Default cap on connections one peer (unix uid, or TCP address) holds open at once.
pub const DEFAULT_MAX_CONNECTIONS_PER_UID: u32 = 64;
/// Default largest `n_tokens` of one call.
pub const DEFAULT_MAX_ROWS: u32 = 8192;
/// Default compute lanes (calls computing at once; each uses the whole thread pool).
pub const DEFAULT_COMPUTE_LANES: usize = 2;
/// The largest `grpc.health.v1` request decoded (a service name): health requests are not
/// counted against `--max-queued-bytes` (any unix peer may send them), so their size is capped.
pub const MAX_HEALTH_MESSAGE_BYTES: usize = 1024;
/// Default time a request's body may take to arrive (`crate::rpc::intake`): the largest
/// admissible request is tens of MiB, seconds even on a slow network.
pub const DEFAULT_REQUEST_ARRIVAL_LIMIT: Duration = Duration::from_secs(30);
pub use proto::MAX_MESSAGE_BYTES;

mod accept;
use accept::{Conn, accept_loop};
/// HTTP/2 keepalive: a silent TCP peer is pinged this often …
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// … and its connection (and sessions) dropped when a ping goes unanswered this long.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// HTTP/2 streams (requests in progress) one connection may have open: a session's queued calls
/// ([`DEFAULT_MAX_QUEUED_CALLS`]) for a few sessions, plus stats and health. What their bodies
/// hold while they arrive counts against `--max-queued-bytes` (`crate::rpc::intake`).
pub const MAX_STREAMS_PER_CONNECTION: u32 = 32;
/// A TCP client that has not finished its TLS handshake within this is dropped.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything [`run`] needs, validated by [`ServeConfig::validate`].
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Directory holding `experts.sluice`.
    pub container_dir: PathBuf,
    /// The cache's byte budget for resident experts.
    pub cache_bytes: u64,
    /// Eviction policy.
    pub policy: Policy,
    /// Transient buffers (`None`: min(experts per layer, 32) per compute lane).
    pub transient_slots: Option<u32>,
    /// How experts are read.
    pub io: IoKind,
    /// Write the route trace here.
    pub route_trace: Option<PathBuf>,
    /// Unix peers allowed by uid (empty with `allow_gids` empty: any peer the socket mode admits).
    pub allow_uids: Vec<u32>,
    /// Unix peers allowed by primary gid.
    pub allow_gids: Vec<u32>,
    /// The bearer token TCP clients must present (required for TCP).
    pub auth_token: Option<String>,
    /// The TCP listener's certificate chain and key (PEM); TCP without it needs `insecure_tcp`.
    pub tls: Option<TlsIdentity>,
    /// Serve plain (unencrypted) TCP: only when asked for explicitly (`--insecure`).
    pub insecure_tcp: bool,
    /// Bound on one session's calls queued or running.
    pub max_queued_calls_per_session: u32,
    /// Cap on sessions one connection holds open.
    pub max_sessions_per_connection: u32,
    /// Cap on sessions one peer (unix uid, or TCP address) holds open.
    pub max_sessions_per_uid: u32,
    /// Cap on connections one peer (unix uid, or TCP address) holds open.
    pub max_connections_per_uid: u32,
    /// Largest shared-memory segment mapped for one connection (`None`: derived from the
    /// container's hidden size, [`crate::shm::SegmentPolicy::derived`]).
    pub max_segment_bytes: Option<u64>,
    /// Most bytes of requests arriving or decoded and waiting for a lane (default:
    /// `CallMemory::default_queued_bytes`).
    pub max_queued_bytes: Option<u64>,
    /// How long a request's body may take to arrive before it is refused.
    pub request_arrival_limit: Duration,
    /// Largest `n_tokens` of one call.
    pub max_rows_per_call: u32,
    /// Calls computing at once.
    pub compute_lanes: usize,
    /// Compute threads (0: one per core).
    pub threads: usize,
    /// Speculative (prefetch) bytes allowed per client session and step; 0: 8 × layers × blob
    /// size (one token's top-8 worth), shared across the layers.
    pub prefetch_cap_bytes: u64,
    /// No speculative reads at all (prefetch hints are accepted and ignored).
    pub no_prefetch: bool,
    /// Compute a call's resident experts while its misses are read (off: as before the ring).
    pub overlap: bool,
    /// How long a call ring's worker polls for the next call (yielding its core to any other
    /// runnable thread) before it sleeps on the doorbell.
    pub ring_spin: Duration,
    /// Keep the compute pool's threads awake (yielding their cores between checks for work)
    /// through a ring worker's burst of calls, instead of letting them sleep between calls.
    pub pool_awake: bool,
}

impl ServeConfig {
    /// A configuration with defaults for everything but the container and the budget.
    pub fn new(container_dir: PathBuf, cache_bytes: u64) -> ServeConfig {
        ServeConfig {
            container_dir,
            cache_bytes,
            policy: Policy::Lru,
            transient_slots: None,
            io: IoKind::Uring,
            route_trace: None,
            allow_uids: Vec::new(),
            allow_gids: Vec::new(),
            auth_token: None,
            tls: None,
            insecure_tcp: false,
            max_queued_calls_per_session: DEFAULT_MAX_QUEUED_CALLS,
            max_sessions_per_connection: DEFAULT_MAX_SESSIONS_PER_CONNECTION,
            max_sessions_per_uid: DEFAULT_MAX_SESSIONS_PER_UID,
            max_connections_per_uid: DEFAULT_MAX_CONNECTIONS_PER_UID,
            max_segment_bytes: None,
            max_queued_bytes: None,
            request_arrival_limit: DEFAULT_REQUEST_ARRIVAL_LIMIT,
            max_rows_per_call: DEFAULT_MAX_ROWS,
            compute_lanes: DEFAULT_COMPUTE_LANES,
            threads: 0,
            prefetch_cap_bytes: 0,
            no_prefetch: false,
            overlap: true,
            ring_spin: crate::call::ring_worker::DEFAULT_WORKER_SPIN,
            pool_awake: true,
        }
    }

    /// Checks the values that do not need the container.
    pub fn validate(&self) -> Result<(), ServeError> {
        let bad = |what: String| Err(ServeError::Config(what));
        if self.max_queued_calls_per_session == 0 {
            return bad("--max-queued-calls must be at least 1".into());
        }
        if self.max_sessions_per_connection == 0 {
            return bad("--max-sessions-per-connection must be at least 1".into());
        }
        if self.max_sessions_per_uid == 0 {
            return bad("--max-sessions-per-uid must be at least 1".into());
        }
        if self.max_connections_per_uid == 0 {
            return bad("--max-connections-per-uid must be at least 1".into());
        }
        if self.max_rows_per_call == 0 {
            return bad("--max-rows-per-call must be at least 1".into());
        }
        if self.compute_lanes == 0 {
            return bad("--compute-lanes must be at least 1".into());
        }
        if self.request_arrival_limit.is_zero() {
            return bad("--request-arrival-timeout-secs must be at least 1".into());
        }
        if self.auth_token.as_ref().is_some_and(String::is_empty) {
            return bad("the auth token file is empty".into());
        }
        if let Some(tls) = &self.tls {
            if self.insecure_tcp {
                return bad("--insecure (plain TCP) conflicts with --tls-cert/--tls-key".into());
            }
            // The same parse serving does, so a bad certificate or key stops the daemon before
            // it listens.
            tonic::transport::Server::builder()
                .tls_config(tls.server_config())
                .map_err(|e| tls.error(&e))?;
        }
        Ok(())
    }

    /// Refuses a listener this configuration cannot serve safely: TCP needs the bearer token,
    /// and TLS unless plain TCP was asked for; TLS settings on a unix socket are a mistake.
    pub fn check_listener(&self, listener: &Listener) -> Result<(), ServeError> {
        match listener {
            Listener::Tcp(_) if self.auth_token.is_none() => Err(ServeError::TcpWithoutToken),
            Listener::Tcp(_) if self.tls.is_none() && !self.insecure_tcp => Err(ServeError::TcpWithoutTls),
            Listener::Unix(_) if self.tls.is_some() => {
                Err(ServeError::Config("--tls-cert/--tls-key apply to --listen (TCP); a unix socket is protected by its mode and peer credentials".into()))
            }
            _ => Ok(()),
        }
    }
}

/// The TCP listener's certificate chain and private key, PEM.
#[derive(Clone)]
pub struct TlsIdentity {
    /// The certificate chain, leaf first.
    pub cert_pem: Vec<u8>,
    /// The private key.
    pub key_pem: Vec<u8>,
    /// Where they came from, for messages (`--tls-cert FILE, --tls-key FILE`).
    pub source: String,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("TlsIdentity")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl TlsIdentity {
    /// Reads both PEM files.
    pub fn read(cert: &Path, key: &Path) -> Result<TlsIdentity, ServeError> {
        let read = |p: &Path| {
            std::fs::read(p).map_err(|source| ServeError::Io {
                what: format!("reading {}", p.display()),
                source,
            })
        };
        Ok(TlsIdentity {
            cert_pem: read(cert)?,
            key_pem: read(key)?,
            source: format!("--tls-cert {}, --tls-key {}", cert.display(), key.display()),
        })
    }

    /// `e` (tonic's own text is only "transport error") with its sources, naming the files.
    fn error(&self, e: &dyn std::error::Error) -> ServeError {
        let mut text = format!("{}: {e}", self.source);
        let mut source = e.source();
        while let Some(s) = source {
            text.push_str(&format!(": {s}"));
            source = s.source();
        }
        ServeError::Tls(text)
    }

    fn server_config(&self) -> tonic::transport::ServerTlsConfig {
        tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(
                &self.cert_pem,
                &self.key_pem,
            ))
            .timeout(TLS_HANDSHAKE_TIMEOUT)
    }
}

/// Why the daemon could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A configuration value is unusable.
    #[error("{0}")]
    Config(String),
    /// TCP was asked for without a token.
    #[error("--listen (TCP) needs --auth-token-file: TCP clients must present a bearer token")]
    TcpWithoutToken,
    /// TCP was asked for without TLS and without `--insecure`.
    #[error(
        "--listen (TCP) needs --tls-cert and --tls-key (or --insecure for plain TCP on a network you trust): the bearer token and activations would cross the network in clear text"
    )]
    TcpWithoutTls,
    /// The TLS certificate or key is unusable.
    #[error("TLS: {0}")]
    Tls(String),
    /// The container is missing, unreadable or corrupt.
    #[error("container {dir}: {source}")]
    Container {
        /// The container directory.
        dir: String,
        /// Why.
        source: shared::container::ContainerError,
    },
    /// The cache could not be built.
    #[error("expert cache: {0}")]
    Cache(#[from] crate::cache::CacheError),
    /// The route trace could not be started or finished.
    #[error("route trace: {0}")]
    Trace(String),
    /// Binding or accepting failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// What [`run`] listens on. The caller binds it (and removes a unix socket file afterwards).
pub enum Listener {
    /// A unix socket (shared memory offered, peer credentials checked).
    Unix(UnixListener),
    /// A TCP socket (inline activations, bearer token required).
    Tcp(TcpListener),
}

/// Longest a draining daemon waits for calls still running on call-ring workers.
const RING_DRAIN_LIMIT: Duration = Duration::from_secs(30);

/// Binds a unix socket at `path` with permissions `mode` (0660 by default in the CLI). A stale
/// socket file nobody listens on is replaced; a live one is an error, as is any other file.
///
/// The file appears at `path` atomically, already listening and with its final mode: the socket
/// is bound under a temporary name in the same directory and renamed into place (when that
/// name would be too long for a socket address, it is bound at `path` directly). Call it once
/// the daemon can serve ([`Prepared::new`] done), so that a client that sees the file can
/// connect at once.
pub fn bind_unix(path: &Path, mode: u32) -> Result<UnixListener, ServeError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let io = |what: String| move |source| ServeError::Io { what, source };
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(ServeError::Config(format!(
                "{} exists and is not a socket; refusing to replace it",
                path.display()
            )));
        }
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => {
                return Err(ServeError::Config(format!(
                    "another process is listening on {}",
                    path.display()
                )));
            }
            Err(_) => std::fs::remove_file(path)
                .map_err(io(format!("removing stale socket {}", path.display())))?,
        }
    }
    let name = path
        .file_name()
        .ok_or_else(|| ServeError::Config(format!("{} names no socket file", path.display())))?;
    let tmp = path.with_file_name(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    let (listener, bound_at) = match std::os::unix::net::UnixListener::bind(&tmp) {
        Ok(l) => (l, tmp.as_path()),
        // The longer temporary name does not fit a socket address: bind in place.
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => (
            std::os::unix::net::UnixListener::bind(path)
                .map_err(io(format!("binding {}", path.display())))?,
            path,
        ),
        Err(e) => return Err(io(format!("binding {}", tmp.display()))(e)),
    };
    let placed = std::fs::set_permissions(bound_at, std::fs::Permissions::from_mode(mode))
        .map_err(io(format!("chmod {:o} {}", mode, bound_at.display())))
        .and_then(|()| {
            if bound_at == path {
                Ok(())
            } else {
                std::fs::rename(bound_at, path).map_err(io(format!(
                    "renaming {} to {}",
                    bound_at.display(),
                    path.display()
                )))
            }
        });
    if let Err(e) = placed {
        let _ = std::fs::remove_file(bound_at);
        return Err(e);
    }
    listener
        .set_nonblocking(true)
        .map_err(io("set_nonblocking".into()))?;
    UnixListener::from_std(listener).map_err(io("registering the socket with tokio".into()))
}

/// A daemon that can serve: the container is open, the cache and the call executor are
/// built, and nothing listens yet. See the module doc.
pub struct Prepared {
    config: ServeConfig,
    executor: Arc<CallExecutor>,
    state: Arc<ServiceState>,
    banner: Banner,
    /// Writes the route trace while one is recorded.
    trace_flusher: Option<crate::trace_flusher::TraceFlusher>,
}

/// What the ready line says.
struct Banner {
    dir: String,
    header: shared::container::Header,
    isa: Int8Isa,
    io: String,
    io_kind: IoKind,
    o_direct: bool,
    budget_bytes: u64,
    slots: u64,
    transient_slots: u32,
    lanes: usize,
}

impl Prepared {
    /// Opens the container, builds the cache and the call executor, and starts the route trace. A
    /// budget above what the container holds is clamped to it (one slot per expert), and the
    /// clamp is logged.
    pub fn new(config: ServeConfig) -> Result<Prepared, ServeError> {
        config.validate()?;
        let dir = config.container_dir.display().to_string();
        let (source, info) = open_source(&config.container_dir, config.io).map_err(|source| {
            ServeError::Container {
                dir: dir.clone(),
                source,
            }
        })?;
        let header = *source.container().header();
        let dims = header.layout.dims;
        let stride = header.layout.blob.stride as u64;
        let lanes = config.compute_lanes;
        let transient_slots = config
            .transient_slots
            .unwrap_or((dims.n_experts.min(32) * lanes) as u32);
        let budget_bytes = clamp_budget(config.cache_bytes, dims.n_blobs() as u64, stride);
        if budget_bytes < config.cache_bytes {
            tracing::info!(
                requested_bytes = config.cache_bytes,
                container_expert_bytes = budget_bytes,
                experts = dims.n_blobs(),
                "--cache-bytes exceeds what the container holds ({} layers × {} experts × {} bytes): budget clamped to one slot per expert",
                dims.n_layers,
                dims.n_experts,
                stride
            );
        }
        if budget_bytes < stride {
            return Err(ServeError::Config(format!(
                "--cache-bytes {} holds no expert: one expert blob is {stride} bytes (the container holds {} of them, {} bytes); give at least {stride}, or the container's size to keep every expert resident",
                config.cache_bytes,
                dims.n_blobs(),
                dims.n_blobs() as u64 * stride
            )));
        }
        let cache_config = CacheConfig {
            budget_bytes,
            policy: config.policy,
            transient_slots,
        };
        let cache = ExpertCache::new(cache_config, header.layout.blob.stride)?;
        // Sessions are opened in the cache at handshake; a call of a closed one is refused.
        cache.require_open_sessions();
        if let Some(path) = &config.route_trace {
            let writer = TraceWriter::create(path)
                .map_err(|e| ServeError::Trace(format!("{}: {e}", path.display())))?;
            cache
                .start_trace(writer)
                .map_err(|e| ServeError::Trace(format!("{}: {e}", path.display())))?;
        }
        let selection = Int8Isa::selection();
        if let Some(warning) = selection.warning() {
            tracing::warn!("{warning}");
        }
        let isa = selection.active;
        let slots = cache.stats().n_slots;
        let executor = CallExecutor::new(
            cache,
            source,
            isa,
            config.threads,
            config.max_rows_per_call as usize,
        )
        .map_err(|source| ServeError::Io {
            what: "starting the compute pool".into(),
            source,
        })?
        .with_overlap(config.overlap);
        let executor = Arc::new(executor);
        if !config.no_prefetch {
            let cap = if config.prefetch_cap_bytes > 0 {
                config.prefetch_cap_bytes
            } else {
                8 * header.layout.dims.n_layers as u64 * stride
            };
            let p = crate::prefetch::Prefetcher::start(&executor, cap).map_err(|source| {
                ServeError::Io {
                    what: "starting the prefetch thread".into(),
                    source,
                }
            })?;
            executor.set_prefetcher(p);
        }
        if let Some(reason) = &info.fallback_reason {
            tracing::warn!("{reason}");
        }
        let io = info.to_string();
        let banner = Banner {
            dir,
            header,
            isa,
            io,
            io_kind: info.kind,
            o_direct: info.o_direct,
            budget_bytes,
            slots,
            transient_slots,
            lanes,
        };
        let service_config = ServiceConfig {
            max_queued_calls_per_session: config.max_queued_calls_per_session,
            session_caps: crate::session::SessionCaps {
                per_connection: config.max_sessions_per_connection,
                per_peer: config.max_sessions_per_uid,
            },
            max_message_bytes: executor.call_memory().max_message_bytes() as u64,
            container_path: config
                .container_dir
                .join(shared::container::CONTAINER_FILE)
                .display()
                .to_string(),
            io_backend: banner.io.clone(),
            ring: crate::call::RingConfig {
                spin: config.ring_spin,
                pool_awake: config.pool_awake,
            },
            segment: config.max_segment_bytes.map_or_else(
                || crate::shm::SegmentPolicy::derived(header.layout.dims.hidden),
                |max_bytes| crate::shm::SegmentPolicy { max_bytes },
            ),
            max_connections_per_peer: config.max_connections_per_uid,
            max_queued_bytes: config.max_queued_bytes.unwrap_or_else(|| {
                executor
                    .call_memory()
                    .default_queued_bytes(config.compute_lanes)
            }),
            request_arrival_limit: config.request_arrival_limit,
        };
        let largest_arriving = service_config
            .max_message_bytes
            .saturating_mul(1 + proto::codec::DECODED_PER_WIRE_BYTE);
        if service_config.max_queued_bytes < largest_arriving {
            tracing::warn!(
                max_queued_bytes = service_config.max_queued_bytes,
                largest_arriving,
                "--max-queued-bytes is below what the largest admissible MoeLayer request is counted as while it arrives (its wire bytes and what they may decode to): RPC calls that large are refused whatever the queue holds"
            );
        }
        let auth = Auth::new(
            config.auth_token.clone(),
            config.allow_uids.clone(),
            config.allow_gids.clone(),
        );
        let state = Arc::new(ServiceState::new(
            Arc::clone(&executor),
            lanes,
            service_config,
            auth,
        ));
        // The trace's file IO runs on a thread of its own, never on a call's path.
        let trace_flusher = match &config.route_trace {
            Some(_) => Some(
                crate::trace_flusher::TraceFlusher::start(executor.cache().clone()).map_err(
                    |source| ServeError::Io {
                        what: "starting the route trace's writer thread".into(),
                        source,
                    },
                )?,
            ),
            None => None,
        };
        Ok(Prepared {
            config,
            executor,
            state,
            banner,
            trace_flusher,
        })
    }

    /// The call executor (its cache's configuration and counters, for checks before serving).
    pub fn executor(&self) -> &Arc<CallExecutor> {
        &self.executor
    }

    /// The service state (sessions and counters; the metrics endpoint reads it).
    pub fn state(&self) -> &Arc<ServiceState> {
        &self.state
    }

    /// Logs the one ready line (`expertd serving`, with what is served), then serves on
    /// `listener` until `shutdown` resolves, then drains: new handshakes and calls get
    /// UNAVAILABLE, HTTP/2 GOAWAY tells clients to stop, and in-flight calls finish before this
    /// returns.
    pub async fn serve(
        self,
        listener: Listener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let Prepared {
            config,
            executor,
            state,
            banner: b,
            trace_flusher,
        } = self;
        let tcp = matches!(listener, Listener::Tcp(_));
        config.check_listener(&listener)?;
        let dims = b.header.layout.dims;
        let container_bytes = dims.n_blobs() as u64 * b.header.layout.blob.stride as u64;
        tracing::info!(
            container = %b.dir,
            fingerprint = format_args!("{:#018x}", b.header.fingerprint()),
            n_layers = dims.n_layers,
            n_experts = dims.n_experts,
            hidden = dims.hidden,
            expert_format = %dims.format,
            "expertd serving"
        );
        tracing::info!(
            cache = %shared::sizes::cache_budget_summary(b.budget_bytes, container_bytes),
            budget_bytes = b.budget_bytes,
            container_bytes,
            slots = b.slots,
            transient_slots = b.transient_slots,
            blob_bytes = b.header.layout.blob.stride,
            "expert cache"
        );
        tracing::info!(
            isa = b.isa.name(),
            io = %b.io_kind,
            o_direct = b.o_direct,
            lanes = b.lanes,
            transport = match (tcp, config.tls.is_some()) {
                (false, _) => "unix",
                (true, true) => "tcp+tls",
                (true, false) => "tcp (plain, --insecure)",
            },
            "compute and IO"
        );
        tracing::debug!(identity = %b.header.identity, reader = %b.io, "container and reader details");
        let (health, health_service) = tonic_health::server::health_reporter();
        let health_service = health_service.max_decoding_message_size(MAX_HEALTH_MESSAGE_BYTES);
        health
            .set_serving::<ExpertServiceServer<ExpertdService>>()
            .await;
        // Health answers to the same rules as the service on TCP (the bearer token); on a unix
        // socket it stays open to any peer the socket admits. Both are checked in
        // `rpc::intake`, which every request passes before its body is read.
        // A request larger than the largest admissible call is refused from its length prefix,
        // before its body is buffered or decoded.
        let service = ExpertServiceServer::new(ExpertdService::new(Arc::clone(&state)))
            .max_decoding_message_size(state.config.max_message_bytes as usize)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);

        let (stop_tx, stop_rx) = watch::channel(false);
        let (conn_tx, conn_rx) = mpsc::channel::<std::io::Result<Conn>>(64);
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&state), conn_tx, stop_rx));
        let incoming = futures_util::stream::unfold(conn_rx, |mut rx| async move {
            rx.recv().await.map(|c| (c, rx))
        });
        let drain_state = Arc::clone(&state);
        let signal = async move {
            shutdown.await;
            drain_state.pipeline.start_draining();
            let _ = stop_tx.send(true);
            health
                .set_not_serving::<ExpertServiceServer<ExpertdService>>()
                .await;
            tracing::info!("shutdown requested: refusing new calls, finishing in-flight ones");
        };
        let mut builder = tonic::transport::Server::builder();
        if let (true, Some(tls)) = (tcp, &config.tls) {
            builder = builder
                .tls_config(tls.server_config())
                .map_err(|e| tls.error(&e))?;
        }
        let served = builder
            .layer(crate::rpc::intake::IntakeLayer::new(Arc::clone(&state)))
            .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
            .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
            .add_service(health_service)
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, signal)
            .await;
        accept.abort();
        let _ = accept.await;
        // Calls on call-ring workers are not HTTP/2 streams: wait for every admitted call (bounded).
        let deadline = std::time::Instant::now() + RING_DRAIN_LIMIT;
        while state.pipeline.running() > 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if let Some(f) = trace_flusher {
            f.stop();
        }
        let trace = executor.cache().finish_trace();
        served?;
        trace.map_err(|e| ServeError::Trace(e.to_string()))?;
        tracing::info!("expertd stopped");
        Ok(())
    }
}

/// The resident budget actually used: `requested`, but never more than `n_blobs` slots of
/// `stride` bytes (the whole container resident); a budget is a cap, not an allocation.
pub fn clamp_budget(requested: u64, n_blobs: u64, stride: u64) -> u64 {
    requested.min(n_blobs.saturating_mul(stride))
}

/// [`Prepared::new`] then [`Prepared::serve`], for a listener the caller bound already (a
/// client may then connect before the daemon can serve and wait in the backlog meanwhile;
/// `expertd serve` prepares first and binds afterwards).
pub async fn run(
    config: ServeConfig,
    listener: Listener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    config.check_listener(&listener)?;
    Prepared::new(config)?.serve(listener, shutdown).await
}
