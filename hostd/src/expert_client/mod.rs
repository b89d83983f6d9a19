//! hostd's client of expertd, as an [`ExpertBackend`]: [`ExpertdClient`] connects to a
//! daemon (`unix:///PATH` with activations in a shared memfd, or `https://HOST:PORT` — or
//! plain `http://` — with inline activations and a bearer token), checks the handshake (protocol version, container
//! identity, fingerprint, dimensions — refusing with both values named), and sends one
//! `MoeLayer` call per MoE layer.
//!
//! Failure policy: a call in flight when the daemon goes away fails with a clear error (the
//! model poisons that sequence; hostd itself stays up); the next call reconnects with
//! exponential backoff and a new session. A call that finds its session unknown (the daemon
//! restarted between calls) never ran, so it is retried once on a fresh session.
//!
//! Deadlines: every call — reconnection, pre-handshake and handshake included — ends within
//! `call_timeout` (`--expertd-call-timeout`). A call that runs out of time is abandoned
//! together with its session: its shared-memory slot is quarantined (the daemon may still
//! write it) and the next call opens a new session with a fresh segment. Failures that
//! retrying may fix (unreachable, restarting, too slow) become `ExpertError::Unavailable`.
//! Readiness is kept in [`health::ExpertHealth`]: calls report to it, and a probe task sends
//! one `Stats` RPC per `health_interval` on its own connection, so `/health` turns
//! `degraded`/`unavailable` while the daemon does not answer and `ready` when it is back,
//! with or without traffic.
//!
//! The gRPC stack runs on a small private tokio runtime; callers are plain threads (the model's
//! forward pass), so `moe_layer` blocks on a channel, never on a runtime it might be inside.
//! Status codes become [`ExpertClientError`] in `error` only. Experts sharded over several
//! daemons by layer are [`shards::ShardedExperts`], one `ExpertdClient` per daemon.

mod call;
pub mod error;
pub mod health;
pub mod private;
mod session;
pub mod shards;
pub mod shm;
pub mod transport;

pub use error::ExpertClientError;
pub use private::{PrivateDaemon, PrivateOptions};
pub use shards::{ShardSpec, ShardedExperts};
pub use transport::{CaCertificate, Endpoint};

use crate::experts::{ExpertBackend, ExpertError, MoeCall, validate_call};
use crate::profile::Profiler;
use proto::v1 as pb;
use session::Session;
use shared::container::ModelIdentity;
use shared::ids::LayerId;
use shared::ring::{self, Submission};
use shared::shm_layout::SlotLayout;
use shm::ClientSegment;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// Calls that may use shared memory at once (more travel inline).
pub const DEFAULT_SHM_SLOTS: usize = 2;
/// Rows one shared-memory slot holds (bigger calls travel inline).
pub const DEFAULT_SHM_MAX_ROWS: usize = 1024;
/// Experts per row a ring entry has room for by default (Qwen3.6 routes top-8).
pub const DEFAULT_RING_TOP_K: usize = 8;
/// How long a ring call polls for its completion before sleeping on the futex, by default
/// (`--expertd-ring-spin-us`): longer than a decode call computes, so that the model thread
/// rarely sleeps. The poll yields the core every few hundred spins, so a daemon sharing the
/// cores still gets them; a futex sleep costs a wake-up (60–100 µs on a virtual machine).
pub const DEFAULT_RING_SPIN: Duration = Duration::from_millis(3);
/// Longest futex sleep between checks that the daemon is still there.
pub const RING_SLICE: Duration = Duration::from_millis(20);

/// How long a first connection waits for a daemon that is still starting.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default deadline of one expert call. The slowest legitimate call measured is a cold
/// streaming call of a 1024-row prefill block (every expert of the layer read from disk,
/// ~0.1–1 s on the 35B model); 30 s is far beyond it (so a slow disk or a loaded machine is
/// not mistaken for a dead daemon) yet bounds how long a stopped daemon can hold the
/// scheduler and every request in its batch.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Default interval of the health probe (one `Stats` RPC).
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(1);
/// Longest a health probe waits for its answer (less when the call deadline is shorter).
pub const MAX_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How to reach and check the daemon.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// The daemon's address.
    pub endpoint: Endpoint,
    /// The bearer token (TCP).
    pub token: Option<String>,
    /// Name for the daemon's logs and stats.
    pub client_name: String,
    /// The model's identity; the daemon's container must match it.
    pub model_identity: Option<ModelIdentity>,
    /// The container fingerprint the daemon must serve, and where that expectation came from.
    pub expected_fingerprint: Option<(u64, String)>,
    /// MoE layers of the model.
    pub n_layers: usize,
    /// Routed experts per layer.
    pub n_experts: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Offer a shared-memory segment on a unix socket.
    pub shm: bool,
    /// Shared-memory slots (calls in flight with shared memory).
    pub shm_slots: usize,
    /// Rows per shared-memory slot.
    pub shm_max_rows: usize,
    /// Offer a MoE-call ring in the segment (protocol version 3): calls then skip gRPC.
    pub ring: bool,
    /// Experts per row the ring entries are sized for (calls with more cells use gRPC).
    pub ring_top_k: usize,
    /// When to send the model's next-layer predictions to the daemon as prefetch hints (ring
    /// only).
    pub prefetch: Prefetch,
    /// How long the first connection waits (with backoff) for a daemon that is not up yet:
    /// no socket file, refused, or a full backlog.
    pub connect_timeout: Duration,
    /// How long to keep retrying a reconnection (with backoff) before a call fails.
    pub reconnect_timeout: Duration,
    /// Deadline of one call, reconnection included (see the module doc).
    pub call_timeout: Duration,
    /// Interval of the health probe (`None`: no probe; calls still report).
    pub health_interval: Option<Duration>,
    /// How long a ring call polls for its completion (yielding the core) before it sleeps.
    pub ring_spin: Duration,
}

impl ClientOptions {
    /// Options with defaults for a model of these dimensions.
    pub fn new(
        endpoint: Endpoint,
        n_layers: usize,
        n_experts: usize,
        hidden: usize,
    ) -> ClientOptions {
        ClientOptions {
            endpoint,
            token: None,
            client_name: "hostd".to_string(),
            model_identity: None,
            expected_fingerprint: None,
            n_layers,
            n_experts,
            hidden,
            shm: true,
            shm_slots: DEFAULT_SHM_SLOTS,
            shm_max_rows: DEFAULT_SHM_MAX_ROWS,
            ring: true,
            ring_top_k: DEFAULT_RING_TOP_K,
            prefetch: Prefetch::Off,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            reconnect_timeout: Duration::from_secs(10),
            call_timeout: DEFAULT_CALL_TIMEOUT,
            health_interval: Some(DEFAULT_HEALTH_INTERVAL),
            ring_spin: DEFAULT_RING_SPIN,
        }
    }
}

/// What the daemon said about itself in the last handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonInfo {
    /// The session id.
    pub session_id: u64,
    /// The container fingerprint.
    pub fingerprint: u64,
    /// The daemon's kernel ISA.
    pub kernel_isa: String,
    /// The daemon's reader.
    pub io_backend: String,
    /// Whether activations travel in shared memory.
    pub shared_memory: bool,
    /// Entries of the call ring the daemon serves for this session (0: calls use `MoeLayer`).
    pub ring_entries: u32,
    /// Whether the daemon's cache budget is below the container's expert bytes (it streams).
    pub streams_experts: bool,
}

/// When the client sends prefetch hints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Prefetch {
    /// Never.
    Off,
    /// Whenever the session has a call ring.
    On,
    /// When the session has a call ring and the daemon streams: its cache budget (handshake
    /// `limits.cache_budget_bytes`) is below the container's expert bytes. With every expert
    /// resident a hint can only be a hit, so none is sent. The CLI's default.
    #[default]
    Auto,
}

impl std::str::FromStr for Prefetch {
    type Err = String;
    fn from_str(s: &str) -> Result<Prefetch, String> {
        match s {
            "off" | "false" | "0" => Ok(Prefetch::Off),
            "on" | "true" | "1" => Ok(Prefetch::On),
            "auto" => Ok(Prefetch::Auto),
            _ => Err(format!("{s:?}: expected auto, on or off")),
        }
    }
}

/// The expertd backend.
pub struct ExpertdClient {
    opts: ClientOptions,
    endpoint: String,
    runtime: tokio::runtime::Runtime,
    /// The layout of each session's segment (`None`: activations travel inline).
    segment_layout: Option<SlotLayout>,
    /// The live session. A std mutex: held only to clone or replace the `Arc`, never during a
    /// call or a connection attempt.
    session: Mutex<Option<Arc<Session>>>,
    next_request: AtomicU64,
    step: AtomicU64,
    last_layer: AtomicUsize,
    expert_bytes: OnceLock<usize>,
    /// The experts last predicted for each layer (prefetch), to measure the prediction's
    /// recall when that layer's call comes. A std mutex: held for a swap only.
    predicted: Mutex<Vec<Vec<u32>>>,
    /// A prefetch hint waiting to ride with the next ring call (layer, experts).
    pending_hint: Mutex<Option<(LayerId, Vec<u32>)>>,
    /// Readiness, shared with the probe task, the private daemon's supervisor and `/health`.
    health: Arc<health::ExpertHealth>,
    /// This client's hits and misses per layer, as its calls' answers report them.
    layer_counters: crate::experts::view::LayerCounters,
    /// Declared last: dropped after the connection, so the child sees its client leave first.
    daemon: Option<PrivateDaemon>,
}

impl std::fmt::Debug for ExpertdClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpertdClient")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl ExpertdClient {
    /// Connects to the daemon (retrying within `connect_timeout`) and checks the handshake.
    /// `daemon` is a private child to keep alive as long as the client.
    pub fn connect(
        opts: ClientOptions,
        daemon: Option<PrivateDaemon>,
    ) -> Result<ExpertdClient, ExpertClientError> {
        let endpoint = opts.endpoint.to_string();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("hostd-expertd")
            .enable_all()
            .build()
            .map_err(|e| ExpertClientError::Connect {
                endpoint: endpoint.clone(),
                reason: format!("starting the client runtime: {e}"),
            })?;
        let segment_layout = match (&opts.endpoint, opts.shm) {
            (Endpoint::Unix(_), true) => {
                let shm_err = |e| ExpertClientError::Shm(std::io::Error::other(e));
                let layout = SlotLayout::new(opts.shm_slots, opts.shm_max_rows, opts.hidden)
                    .map_err(shm_err)?;
                Some(if opts.ring {
                    layout
                        .with_ring(opts.shm_max_rows * opts.ring_top_k.max(1))
                        .map_err(shm_err)?
                } else {
                    layout
                })
            }
            _ => None,
        };
        let n_layers_for_predictions = opts.n_layers;
        let client = ExpertdClient {
            opts,
            endpoint,
            runtime,
            segment_layout,
            session: Mutex::new(None),
            next_request: AtomicU64::new(1),
            step: AtomicU64::new(0),
            last_layer: AtomicUsize::new(usize::MAX),
            expert_bytes: OnceLock::new(),
            predicted: Mutex::new(vec![Vec::new(); n_layers_for_predictions]),
            layer_counters: crate::experts::view::LayerCounters::new(n_layers_for_predictions),
            pending_hint: Mutex::new(None),
            health: daemon.as_ref().map_or_else(
                || Arc::new(health::ExpertHealth::new()),
                PrivateDaemon::health,
            ),
            daemon,
        };
        let s = client.session()?;
        tracing::info!(
            endpoint = %client.endpoint,
            session = s.info.session_id,
            fingerprint = format_args!("{:#018x}", s.info.fingerprint),
            isa = %s.info.kernel_isa,
            io = %s.info.io_backend,
            shared_memory = s.info.shared_memory,
            ring_entries = s.info.ring_entries,
            "connected to expertd"
        );
        if let Some(every) = client.opts.health_interval {
            let probe = health::Probe {
                endpoint: client.opts.endpoint.clone(),
                token: client.opts.token.clone(),
                every,
                timeout: client.opts.call_timeout.min(MAX_PROBE_TIMEOUT),
                health: Arc::clone(&client.health),
            };
            client.runtime.spawn(probe.run());
        }
        Ok(client)
    }

    /// The shared readiness record.
    pub fn health_record(&self) -> Arc<health::ExpertHealth> {
        Arc::clone(&self.health)
    }

    /// The daemon's address.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// What the current session's handshake reported, if connected.
    pub fn daemon_info(&self) -> Option<DaemonInfo> {
        self.session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|s| s.info.clone())
    }

    /// Runs `f` on the client runtime and waits for it from this (non-runtime) thread.
    fn block_on<F, T>(&self, f: F) -> Option<T>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.runtime.spawn(async move {
            let _ = tx.send(f.await);
        });
        rx.recv().ok()
    }

    /// The error of a call that ran past `deadline` (which was `call_timeout` after it began).
    fn late(&self, _deadline: Instant) -> ExpertClientError {
        ExpertClientError::DeadlineExceeded {
            endpoint: self.endpoint.clone(),
            what: "the call",
            deadline_s: tenths(self.opts.call_timeout),
        }
    }

    fn lost(&self, message: &str) -> ExpertClientError {
        ExpertClientError::ConnectionLost {
            endpoint: self.endpoint.clone(),
            message: message.to_string(),
        }
    }
}

impl ExpertdClient {
    /// Sends a hint in the ring's last entry (a hint whose cells do not fit beside its call):
    /// the entry is reused once the worker has taken the last one; a hint that finds it busy
    /// is dropped.
    fn send_hint_entry(&self, s: &Session, layer: LayerId, experts: &[u32]) {
        let Some(ring) = s
            .segment
            .as_deref()
            .and_then(ClientSegment::ring)
            .filter(|r| s.info.ring_entries == r.layout().entries)
        else {
            return;
        };
        let entry = ring.entry(ring.layout().entries - 1);
        match entry.state().load(Ordering::Acquire) {
            ring::STATE_FREE | ring::STATE_DONE | ring::STATE_FAILED => {}
            _ => return,
        }
        let step = self.step.load(Ordering::Relaxed);
        let sub = Submission {
            op: ring::OP_PREFETCH,
            seq: 0,
            layer,
            n_rows: 1,
            top_k: experts.len() as u32,
            step,
            input_offset: 0,
            output_offset: 0,
        };
        entry.submit(&sub, experts, &vec![0.0f32; experts.len()]);
        ring.ring_doorbell();
    }

    /// Whether hints go to session `s`: it has a ring, and prefetch is on, or auto and the
    /// daemon streams.
    fn hints_on(&self, s: &Session) -> bool {
        s.info.ring_entries > 0
            && match self.opts.prefetch {
                Prefetch::Off => false,
                Prefetch::On => true,
                Prefetch::Auto => s.info.streams_experts,
            }
    }

    /// Reports a failed call to the readiness record when it says something about the daemon.
    fn note_failure(&self, e: &ExpertClientError) {
        match e {
            ExpertClientError::DeadlineExceeded { .. } => self.health.degraded(e.to_string()),
            // EAGAIN on connect: the listener's backlog is full, nobody accepts — a daemon that
            // is there but not running (stopped, hung).
            ExpertClientError::NotUp { last, .. } if last.contains("(os error 11)") => {
                self.health.degraded(e.to_string());
            }
            e if e.is_unavailable() => self.health.unavailable(e.to_string()),
            // A corrupt expert: requests routed to it fail until the container is repaired.
            ExpertClientError::Status {
                code: tonic::Code::DataLoss,
                ..
            } => self.health.data_loss(e.to_string()),
            _ => {}
        }
    }
}

/// Seconds to 0.1 s, for messages.
fn tenths(d: Duration) -> f64 {
    (d.as_secs_f64() * 10.0).round() / 10.0
}

impl ExpertBackend for ExpertdClient {
    fn name(&self) -> &'static str {
        "expertd"
    }

    fn results_identity(&self) -> Option<String> {
        self.daemon_info()
            .map(|i| format!("container {:#018x}", i.fingerprint))
    }

    fn expert_bytes(&self) -> Option<usize> {
        self.expert_bytes.get().copied()
    }

    fn wants_prefetch(&self) -> bool {
        // Asked once per layer per token: look at the live session, clone nothing.
        self.session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|s| self.hints_on(s))
    }

    fn prefetch(&self, layer: LayerId, experts: &[u32], profiler: Option<&Profiler>) {
        // Only on the live session: a hint never waits for a reconnection.
        let Some(s) = self
            .session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .filter(|s| self.hints_on(s))
        else {
            return;
        };
        if let Some(p) = self
            .predicted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(layer.index())
        {
            p.clear();
            p.extend_from_slice(experts);
            p.sort_unstable(); // for the recall's binary search
        }
        let Some(ring) = s.segment.as_deref().and_then(ClientSegment::ring) else {
            return;
        };
        let n = experts.len().min(ring.layout().cells as usize);
        if n == 0 {
            return;
        }
        // It rides with the next ring call (the current layer's), so the daemon reads it
        // right behind that call's own misses; a hint not yet sent is replaced.
        *self
            .pending_hint
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some((layer, experts[..n].to_vec()));
        if let Some(p) = profiler {
            p.count("prefetch.hints", 1);
        }
    }

    fn speculative_counters(&self) -> Option<crate::experts::SpeculativeCounters> {
        let s = self
            .session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()?;
        let mut client = s.link.client.clone();
        let stats = self
            .block_on(async move { client.stats(pb::StatsRequest {}).await.ok() })??
            .into_inner();
        stats.prefetch.map(|p| crate::experts::SpeculativeCounters {
            bytes_read: p.bytes_read,
            useful_bytes: p.useful_bytes,
            stale: p.stale,
        })
    }

    fn health(&self) -> Option<health::HealthReport> {
        Some(self.health.report())
    }

    fn cache_view(&self) -> Option<crate::experts::view::CacheView> {
        let (layer_hits, layer_misses) = self.layer_counters.snapshot();
        let session = self
            .session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        // A daemon that is down or slow leaves the per-layer counts without its own view.
        let daemon = session.and_then(|s| {
            let own = s.info.session_id;
            let mut client = s.link.client.clone();
            let stats = self.block_on(async move {
                tokio::time::timeout(Duration::from_secs(2), client.stats(pb::StatsRequest {}))
                    .await
                    .ok()?
                    .ok()
            })??;
            Some(crate::experts::view::DaemonView::from_stats(
                &self.endpoint,
                own,
                stats.into_inner(),
            ))
        });
        Some(crate::experts::view::CacheView {
            layer_hits,
            layer_misses,
            daemons: daemon.into_iter().collect(),
        })
    }

    fn transport(&self) -> Option<String> {
        let info = self.daemon_info()?;
        Some(
            if info.ring_entries > 0 {
                "ring"
            } else if info.shared_memory {
                "rpc+shm"
            } else {
                "rpc-inline"
            }
            .to_string(),
        )
    }

    fn io_backend(&self) -> Option<String> {
        self.daemon_info().map(|i| i.io_backend)
    }

    fn private_daemon_pid(&self) -> Option<u32> {
        self.daemon.as_ref().and_then(PrivateDaemon::pid)
    }

    fn moe_layer_profiled(
        &self,
        call: &MoeCall<'_>,
        out: &mut [f32],
        profiler: Option<&Profiler>,
    ) -> Result<(), ExpertError> {
        self.moe_layer_overlapped(call, out, profiler, &mut || {})
    }

    #[tracing::instrument(level = "debug", skip_all, fields(layer_idx = call.layer.get(), n_tokens = call.n_rows))]
    fn moe_layer_overlapped(
        &self,
        call: &MoeCall<'_>,
        out: &mut [f32],
        profiler: Option<&Profiler>,
        during: &mut dyn FnMut(),
    ) -> Result<(), ExpertError> {
        // `during` runs once: inside the ring call after the doorbell, or after the call on
        // the RPC paths, on a failure, or when the call is refused here. `inside_ns` is its
        // time when it ran inside the timed call (the ring), else 0.
        let inside_ns = std::cell::Cell::new(0u64);
        let mut pending = Some(during);
        let mut once = || {
            if let Some(f) = pending.take() {
                let t = Instant::now();
                f();
                inside_ns.set(t.elapsed().as_nanos() as u64);
            }
        };
        if let Err(e) = validate_call(
            call,
            self.opts.n_layers,
            self.opts.n_experts,
            self.opts.hidden,
            out.len(),
        ) {
            once();
            return Err(e);
        }
        if let Some(p) = profiler.filter(|_| self.wants_prefetch()) {
            self.count_recall(call, p);
        }
        let t = Instant::now();
        let result = self.call(call, out, &mut once);
        let wall = t.elapsed().as_nanos() as u64;
        let overlapped_ns = inside_ns.get();
        // Not run inside the call (an RPC path, a failure): run now, outside the timed window.
        once();
        let cost = result.map_err(|e| e.into_expert_error(call.layer))?;
        self.layer_counters.add(
            call.layer.index(),
            u64::from(cost.hits),
            u64::from(cost.misses),
        );
        if let Some(p) = profiler {
            // The call's client wall time, split into the daemon's reported queue, IO wait and
            // compute; the rest (encode, transport both ways, decode, a retry) is IPC. With
            // `during` overlapping the daemon's work on the ring, the model thread waited only
            // for what outlasted the longer of the two: ipc = wall − max(daemon, during), the
            // IPC the overlap did not hide.
            let server = cost.queue_ns + cost.io_wait_ns + cost.compute_ns;
            p.add("experts.queue", cost.queue_ns, 0);
            p.add("experts.io_wait", cost.io_wait_ns, 0);
            p.add("experts.compute", cost.compute_ns, 0);
            p.add(
                "experts.ipc",
                wall.saturating_sub(server.max(overlapped_ns)),
                0,
            );
            p.count("experts.hits", u64::from(cost.hits));
            p.count("experts.misses", u64::from(cost.misses));
            p.count("experts.bytes_read", cost.bytes_read);
            p.count("experts.prefetched_hits", u64::from(cost.prefetched_hits));
        }
        Ok(())
    }
}
