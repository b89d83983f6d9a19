//! `expertd.v1.ExpertService`: checks the caller (`super::auth`) and the session, decodes each
//! request and says where its bytes live (inline or the connection's segment), and hands MoE
//! calls to the one call pipeline (`crate::call`), running the compute stage on a blocking
//! thread; then encodes the result. Errors are [`RpcError`]s, turned into statuses by
//! `super::status` only.
//!
//! Owns the per-daemon [`ServiceState`] (the call pipeline, sessions, limits, access rules) and
//! the per-connection [`ConnInfo`] that the server attaches to every request.

use super::auth::Auth;
use super::status::RpcError;
use crate::call::{CallBuffers, CallIo, CallPipeline, RingConfig};
use crate::logsafe;
use crate::moe_call::{CallExecutor, CallSpec};
use crate::session::{PeerKey, Session, SessionCaps, Sessions, TransportKind};
use crate::shm::Segment;
use proto::convert::{self, f32s_to_le_bytes};
use proto::v1::expert_service_server::ExpertService;
use proto::v1::{self as pb};
use shared::call_cost::CallCost;
use shared::container::ModelIdentity;
use shared::ids::LayerId;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;
use tonic::{Request, Response, Status};
use tracing::Instrument;

/// Longest client name accepted in a handshake, in bytes.
pub const MAX_CLIENT_NAME_BYTES: usize = 128;

/// Who is on the other end of a connection.
#[derive(Debug, Clone)]
pub enum Peer {
    /// A unix-socket peer, from its socket credentials.
    Unix {
        /// User id.
        uid: u32,
        /// Primary group id.
        gid: u32,
        /// Process id, when the kernel reports one.
        pid: Option<i32>,
    },
    /// A TCP peer.
    Tcp(Option<SocketAddr>),
}

impl Peer {
    /// Whom this peer's sessions count against for `--max-sessions-per-uid`.
    pub fn key(&self) -> PeerKey {
        match self {
            Peer::Unix { uid, .. } => PeerKey::Uid(*uid),
            Peer::Tcp(Some(addr)) => PeerKey::Addr(addr.ip()),
            Peer::Tcp(None) => PeerKey::Unknown,
        }
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Unix { uid, gid, pid } => {
                write!(f, "uid {uid} gid {gid}")?;
                if let Some(pid) = pid {
                    write!(f, " pid {pid}")?;
                }
                Ok(())
            }
            Peer::Tcp(Some(addr)) => write!(f, "{addr}"),
            Peer::Tcp(None) => f.write_str("tcp peer"),
        }
    }
}

/// What the server knows about a connection; attached to every request on it.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The connection's id; sessions opened on it are closed with it.
    pub conn_id: u64,
    /// The peer.
    pub peer: Peer,
    /// Whether a unix peer passed the allow lists (always true for TCP; the token decides).
    pub allowed: bool,
    /// The shared-memory segment the client passed in its pre-handshake, if any.
    pub segment: Option<Arc<Segment>>,
}

impl ConnInfo {
    /// The connection facts attached to a request: directly on a plain connection, inside
    /// tonic's TLS wrapper on a TLS one.
    pub fn of(extensions: &tonic::Extensions) -> Option<&ConnInfo> {
        extensions.get::<ConnInfo>().or_else(|| {
            extensions
                .get::<tonic::transport::server::TlsConnectInfo<ConnInfo>>()
                .map(tonic::transport::server::TlsConnectInfo::get_ref)
        })
    }
}

/// Limits and identity facts the service reports and enforces.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Calls one session may have queued or running at once.
    pub max_queued_calls_per_session: u32,
    /// Caps on open sessions per connection and per peer.
    pub session_caps: SessionCaps,
    /// Largest gRPC message, in bytes.
    pub max_message_bytes: u64,
    /// The container file, for messages.
    pub container_path: String,
    /// How experts are read, for the handshake (`SourceInfo`'s rendering).
    pub io_backend: String,
    /// How call rings' workers wait for work.
    pub ring: RingConfig,
    /// What a connection's shared-memory segment may be.
    pub segment: crate::shm::SegmentPolicy,
    /// Connections one peer (unix uid, or TCP address) may hold open at once.
    pub max_connections_per_peer: u32,
    /// Bytes of requests arriving (`super::intake`) or decoded and waiting for a lane, over
    /// every connection.
    pub max_queued_bytes: u64,
    /// How long a request's body may take to arrive.
    pub request_arrival_limit: std::time::Duration,
}

/// The daemon's state shared by every connection and call.
pub struct ServiceState {
    /// The call pipeline every MoE call passes (executor, fair queue, draining flag).
    pub pipeline: Arc<CallPipeline>,
    /// Open sessions.
    pub sessions: Sessions,
    /// Limits and facts.
    pub config: ServiceConfig,
    /// Access rules.
    pub auth: Auth,
    /// Connections open now.
    pub open_connections: AtomicU32,
    /// When serving started.
    pub started: Instant,
    /// The container fingerprint, computed once.
    pub fingerprint: u64,
    /// Handshakes refused so far because a session cap was reached (for log rate limiting).
    pub session_cap_refusals: AtomicU64,
    /// Open connections per peer, for `max_connections_per_peer`.
    connections_by_peer: std::sync::Mutex<std::collections::HashMap<PeerKey, u32>>,
    /// Connections refused so far because their peer held its cap (for log rate limiting).
    pub connection_cap_refusals: AtomicU64,
}

/// One of a peer's open connections, counted against its cap until dropped.
pub struct PeerConnection {
    state: Arc<ServiceState>,
    key: PeerKey,
}

impl Drop for PeerConnection {
    fn drop(&mut self) {
        let mut by_peer = self
            .state
            .connections_by_peer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = by_peer.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                by_peer.remove(&self.key);
            }
        }
    }
}

impl ServiceState {
    /// A state over `executor` with `lanes` compute lanes.
    pub fn new(
        executor: Arc<CallExecutor>,
        lanes: usize,
        config: ServiceConfig,
        auth: Auth,
    ) -> ServiceState {
        let fingerprint = executor.header().fingerprint();
        ServiceState {
            pipeline: Arc::new(CallPipeline::new(
                executor,
                lanes,
                config.max_queued_calls_per_session,
                config.max_queued_bytes,
            )),
            sessions: Sessions::new(),
            config,
            auth,
            open_connections: AtomicU32::new(0),
            started: Instant::now(),
            fingerprint,
            session_cap_refusals: AtomicU64::new(0),
            connections_by_peer: Default::default(),
            connection_cap_refusals: AtomicU64::new(0),
        }
    }

    /// The call executor (cache, source, kernels).
    pub fn executor(&self) -> &Arc<CallExecutor> {
        self.pipeline.executor()
    }

    /// Whether shutdown began (new handshakes and calls are refused).
    pub fn is_draining(&self) -> bool {
        self.pipeline.is_draining()
    }

    /// Counts a new connection of `peer` against its cap, before anything of it is read:
    /// `None` (the connection is to be closed at once) when the peer already holds
    /// `max_connections_per_peer` connections.
    pub fn admit_connection(self: &Arc<Self>, peer: &Peer) -> Option<PeerConnection> {
        let key = peer.key();
        let mut by_peer = self
            .connections_by_peer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = by_peer.entry(key).or_insert(0);
        if *n >= self.config.max_connections_per_peer {
            self.connection_cap_refusals.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *n += 1;
        Some(PeerConnection {
            state: Arc::clone(self),
            key,
        })
    }

    /// Connections `peer` holds open now.
    pub fn peer_connections(&self, peer: &Peer) -> u32 {
        self.connections_by_peer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&peer.key())
            .copied()
            .unwrap_or(0)
    }

    /// A connection opened.
    pub fn connection_opened(&self) {
        self.open_connections.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection closed (its client exited, was killed, or hung up): close its sessions and
    /// release their leases in the cache.
    pub fn connection_closed(&self, conn_id: u64) {
        self.open_connections.fetch_sub(1, Ordering::Relaxed);
        for s in self.sessions.close_connection(conn_id) {
            let orphaned = self
                .executor()
                .cache()
                .release_session(crate::cache::SessionId(s.id))
                .map_or(0, |st| st.leases_held);
            tracing::info!(session = s.id, client_name = %logsafe::name(&s.client_name), peer = %s.peer, orphaned_leases = orphaned, "session closed: connection gone");
        }
    }
}

/// The service handle tonic clones per connection.
#[derive(Clone)]
pub struct ExpertdService {
    state: Arc<ServiceState>,
}

impl ExpertdService {
    /// A service over `state`.
    pub fn new(state: Arc<ServiceState>) -> ExpertdService {
        ExpertdService { state }
    }
}

fn conn_of<T>(req: &Request<T>) -> Result<ConnInfo, RpcError> {
    ConnInfo::of(req.extensions())
        .cloned()
        .ok_or_else(|| RpcError::Internal("request without connection info".into()))
}

/// Where a call's activations come from.
enum Input {
    /// The request's little-endian bytes (converted once the call holds a lane).
    Inline(Vec<u8>),
    Shm(Arc<Segment>, Range<usize>),
}

/// Where a call's output goes.
enum Output {
    Inline,
    Shm(Arc<Segment>, Range<usize>, pb::ShmSlice),
}

/// The RPC's side of the call pipeline: activations inline or in the segment, the output into
/// the response or the segment.
struct RpcIo {
    input: Input,
    output: Output,
    /// The response's output field, once written.
    wire: Option<pb::moe_layer_response::Output>,
}

impl CallIo for RpcIo {
    fn read_input(&mut self, x: &mut [f32]) -> Result<(), RpcError> {
        match std::mem::replace(&mut self.input, Input::Inline(Vec::new())) {
            Input::Inline(bytes) => convert::le_bytes_into_f32s("input_inline_f32_le", &bytes, x)
                .map_err(|e| RpcError::BadRequest(e.to_string())),
            Input::Shm(seg, range) => {
                seg.read_f32s(range, x);
                Ok(())
            }
        }
    }

    fn write_output(&mut self, out: &[f32]) -> Result<(), RpcError> {
        self.wire = Some(match &self.output {
            Output::Inline => {
                pb::moe_layer_response::Output::OutputInlineF32Le(f32s_to_le_bytes(out))
            }
            Output::Shm(seg, range, slice) => {
                seg.write_f32s(range.clone(), out);
                pb::moe_layer_response::Output::OutputShm(*slice)
            }
        });
        Ok(())
    }
}

fn shm_target(
    conn: &ConnInfo,
    field: &'static str,
    slice: &pb::ShmSlice,
    needed: u64,
) -> Result<(Arc<Segment>, Range<usize>), RpcError> {
    let slice =
        convert::shm_slice(field, slice).map_err(|e| RpcError::BadRequest(e.to_string()))?;
    let segment = conn.segment.clone().ok_or(RpcError::NoSegment { field })?;
    let range = segment.range(&slice)?;
    if (range.len() as u64) < needed {
        return Err(RpcError::BufferTooSmall {
            field,
            found_bytes: range.len() as u64,
            needed_bytes: needed,
        });
    }
    let start = range.start;
    Ok((segment, start..start + needed as usize))
}

/// Where a `MoeLayer` call of `n_values` activations reads and writes: the request's inline bytes
/// (exactly `4 · n_values`) or a slice of the connection's segment, and the response or a
/// segment slice.
fn rpc_io(
    conn: &ConnInfo,
    input: Option<pb::moe_layer_request::Input>,
    output_shm: Option<&pb::ShmSlice>,
    n_values: usize,
) -> Result<RpcIo, RpcError> {
    let needed = n_values as u64 * 4;
    let input = match input {
        Some(pb::moe_layer_request::Input::InputInlineF32Le(bytes)) => {
            let field = "input_inline_f32_le";
            if (bytes.len() as u64) < needed {
                return Err(RpcError::BufferTooSmall {
                    field,
                    found_bytes: bytes.len() as u64,
                    needed_bytes: needed,
                });
            }
            if bytes.len() as u64 != needed {
                return Err(RpcError::BadRequest(format!(
                    "{field} holds {} bytes, expected exactly {needed}",
                    bytes.len()
                )));
            }
            Input::Inline(bytes)
        }
        Some(pb::moe_layer_request::Input::InputShm(slice)) => {
            let (seg, range) = shm_target(conn, "input_shm", &slice, needed)?;
            Input::Shm(seg, range)
        }
        None => {
            return Err(RpcError::BadRequest(
                "the request carries no activations (set input_inline_f32_le or input_shm)".into(),
            ));
        }
    };
    let output = match output_shm {
        Some(slice) => {
            let (seg, range) = shm_target(conn, "output_shm", slice, needed)?;
            Output::Shm(seg, range, *slice)
        }
        None => Output::Inline,
    };
    Ok(RpcIo {
        input,
        output,
        wire: None,
    })
}

impl ExpertdService {
    async fn handshake_inner(
        &self,
        conn: &ConnInfo,
        r: pb::HandshakeRequest,
    ) -> Result<pb::HandshakeResponse, RpcError> {
        let st = &self.state;
        st.pipeline.check_open()?;
        let (oldest, current) = (proto::version::OLDEST_SUPPORTED, proto::version::CURRENT);
        if !(oldest..=current).contains(&r.protocol_version) {
            return Err(RpcError::VersionMismatch {
                client: r.protocol_version,
                oldest,
                current,
            });
        }
        if r.client_name.len() > MAX_CLIENT_NAME_BYTES {
            return Err(RpcError::BadRequest(format!(
                "client_name is {} bytes (at most {MAX_CLIENT_NAME_BYTES})",
                r.client_name.len()
            )));
        }
        let header = st.executor().header();
        if let Some(id) = &r.model_identity {
            let ours = ModelIdentity::try_from(id)
                .map_err(|e| RpcError::BadRequest(format!("model_identity.{e}")))?;
            let what = header.identity.differing(&ours);
            if !what.is_empty() {
                return Err(RpcError::IdentityMismatch {
                    container: st.config.container_path.clone(),
                    what: what.join(", "),
                    theirs: header.identity.short_hex(),
                    ours: ours.short_hex(),
                });
            }
        }
        if r.expected_container_fingerprint != 0
            && r.expected_container_fingerprint != st.fingerprint
        {
            return Err(RpcError::FingerprintMismatch {
                expected: r.expected_container_fingerprint,
                served: st.fingerprint,
                container: st.config.container_path.clone(),
            });
        }
        let transport = if conn.segment.is_some() {
            TransportKind::SharedMemory
        } else {
            TransportKind::Inline
        };
        let name = if r.client_name.is_empty() {
            "unnamed".to_string()
        } else {
            r.client_name
        };
        let session = st.sessions.open(
            conn.conn_id,
            conn.peer.key(),
            name,
            conn.peer.to_string(),
            transport,
            st.config.session_caps,
        )?;
        // The session exists in the cache from here until it closes; a call of it that is
        // still queued when it closes is refused there, never re-creating it.
        let cache_session = crate::cache::SessionId(session.id);
        st.executor().cache().open_session(cache_session);
        if session.is_closed() {
            // Closed meanwhile (its connection went away): the close may have released the
            // cache's entry before it was opened here.
            st.executor().cache().release_session(cache_session);
            return Err(RpcError::UnknownSession {
                session: session.id,
            });
        }
        // A version-3 client's segment may carry a call ring: serve it from its own worker.
        let mut ring_entries = 0;
        if r.protocol_version >= proto::version::CALL_RING
            && let Some(segment) = &conn.segment
            && let Some(ring) = segment.take_ring()
        {
            match crate::call::ring_worker::spawn(
                Arc::clone(&st.pipeline),
                st.config.ring,
                Arc::clone(&session),
                Arc::clone(segment),
                ring,
            ) {
                Ok(()) => ring_entries = ring.layout().entries,
                Err(e) => {
                    tracing::warn!(session = session.id, error = %e, "could not start the call-ring worker; MoeLayer RPCs only");
                }
            }
        }
        tracing::info!(session = session.id, client_name = %logsafe::name(&session.client_name), peer = %session.peer, client_pid = r.client_pid, ?transport, ring_entries, "session opened");
        let dims = &header.layout.dims;
        let executor = st.executor();
        Ok(pb::HandshakeResponse {
            protocol_version: current,
            container_fingerprint: st.fingerprint,
            container_identity: Some(pb::ModelIdentity::from(&header.identity)),
            dims: Some(pb::ModelDims {
                n_layers: dims.n_layers as u32,
                n_experts: dims.n_experts as u32,
                hidden_size: dims.hidden as u32,
                expert_inner_size: dims.inner as u32,
                expert_format: dims.format.name().to_string(),
            }),
            kernel_isa: executor.isa().name().to_string(),
            io_backend: st.config.io_backend.clone(),
            limits: Some(pb::Limits {
                max_rows_per_call: executor.max_rows() as u32,
                max_queued_calls_per_session: st.pipeline.max_queued_calls_per_session(),
                cache_budget_bytes: executor.cache().config().budget_bytes,
                max_message_bytes: st.config.max_message_bytes,
            }),
            session_id: session.id,
            transport: match transport {
                TransportKind::Inline => pb::Transport::Inline as i32,
                TransportKind::SharedMemory => pb::Transport::SharedMemory as i32,
            },
            shm_segment_id: conn.segment.as_ref().map_or(0, |s| s.id()),
            shm_segment_bytes: conn.segment.as_ref().map_or(0, |s| s.len_bytes()),
            ring_entries,
        })
    }

    async fn moe_layer_inner(
        &self,
        conn: &ConnInfo,
        session: &Arc<Session>,
        r: pb::MoeLayerRequest,
        arrival: crate::call::Held,
    ) -> Result<(pb::MoeLayerResponse, CallCost), RpcError> {
        let pipeline = &self.state.pipeline;
        pipeline.check_open()?;
        let (n_rows, top_k) = (r.n_tokens as usize, r.top_k as usize);
        let (session_id, step, layer) = (session.id, r.step, LayerId::new(r.layer_idx));
        let call = pipeline.executor().limits().validate(CallSpec {
            session: session_id,
            step,
            layer,
            n_rows,
            top_k,
            ids: &r.expert_ids,
            weights: &r.weights,
        })?;
        // What this decoded request holds while it waits for a lane (counted against the
        // daemon's cap on queued requests; a call on the ring holds none).
        let held = 4 * (r.expert_ids.len() + r.weights.len()) as u64
            + match &r.input {
                Some(pb::moe_layer_request::Input::InputInlineF32Le(b)) => b.len() as u64,
                _ => 0,
            };
        // Where the bytes live is checked before admission, as on the ring (`rpc_io` allocates
        // nothing: it checks the inline length or the slices).
        let n_values = n_rows * pipeline.executor().hidden();
        let mut io = rpc_io(conn, r.input, r.output_shm.as_ref(), n_values)?;
        let admitted = pipeline.admit(session, &call, held, arrival)?;
        let laned = admitted.lane().await;
        let (ids, weights) = (r.expert_ids, r.weights);
        // The blocking job owns the lane and the in-flight slot: if the client goes away and
        // this future is dropped, both are held until the call really ends.
        let job = tokio::task::spawn_blocking(move || {
            let spec = CallSpec {
                session: session_id,
                step,
                layer,
                n_rows,
                top_k,
                ids: &ids,
                weights: &weights,
            };
            let cost = laned.run(&spec, &mut io, &mut CallBuffers::default(), None)?;
            let wire = io
                .wire
                .take()
                .ok_or_else(|| RpcError::Internal("the call wrote no output".into()))?;
            Ok::<_, RpcError>((cost, wire))
        });
        let (cost, wire) = job
            .await
            .map_err(|e| RpcError::Internal(format!("the call's compute task failed: {e}")))??;
        Ok((convert::moe_layer_response(wire, &cost), cost))
    }

    fn stats_inner(&self) -> pb::StatsResponse {
        self.state.stats()
    }
}

/// `$msg { field: $counters.field (a relaxed load), …, $name: $value, … }`: a protobuf stats
/// message from the atomic counters whose names it shares, plus its other fields.
macro_rules! loaded {
    ($($msg:ident)::+, $counters:expr, [$($field:ident),+ $(,)?] $(, $name:ident: $value:expr)* $(,)?) => {
        $($msg)::+ { $($field: $counters.$field.load(Ordering::Relaxed),)+ $($name: $value,)* }
    };
}

impl ServiceState {
    /// The `Stats` RPC's answer: the cache, every open session, every peer's totals (closed
    /// sessions included), the prefetcher. The Prometheus endpoint renders the same snapshot.
    pub fn stats(&self) -> pb::StatsResponse {
        let st = self;
        let cache = st.executor().cache();
        let c = cache.stats();
        let sessions = st
            .sessions
            .list()
            .into_iter()
            .map(|s| {
                let k = &s.counters;
                loaded!(
                    pb::SessionStats,
                    k,
                    [calls, failed_calls, hits, misses, bytes_read, queue_ns, io_wait_ns, compute_ns, ring_calls, ring_bursts],
                    session_id: s.id,
                    client_name: s.client_name.clone(),
                    peer: s.peer.clone(),
                    transport: match s.transport {
                        TransportKind::Inline => pb::Transport::Inline as i32,
                        TransportKind::SharedMemory => pb::Transport::SharedMemory as i32,
                    },
                    in_flight_calls: k.in_flight.load(Ordering::Relaxed),
                    leases_held: cache.session_stats(crate::cache::SessionId(s.id)).map_or(0, |x| x.leases_held),
                    peer_key: s.peer_key.label(),
                )
            })
            .collect::<Vec<pb::SessionStats>>();
        let mut peers: Vec<pb::PeerStats> = st
            .sessions
            .peers()
            .into_iter()
            .map(|(key, t)| {
                let label = key.label();
                let open = sessions.iter().filter(|s| s.peer_key == label);
                let (sessions_open, leases_held) =
                    open.fold((0u32, 0u64), |(n, l), s| (n + 1, l + s.leases_held));
                loaded!(
                    pb::PeerStats,
                    t,
                    [calls, failed_calls, hits, misses, bytes_read],
                    peer_key: label,
                    sessions_opened: t.sessions.load(Ordering::Relaxed),
                    sessions_open: sessions_open,
                    leases_held: leases_held,
                )
            })
            .collect();
        peers.sort_by(|a, b| a.peer_key.cmp(&b.peer_key));
        pb::StatsResponse {
            cache: Some(pb::CacheStats {
                budget_bytes: c.budget_bytes,
                resident_bytes: c.resident_bytes,
                resident_experts: c.slots_used,
                leases_held: c.leases_held,
                hits: c.totals.hits,
                misses: c.totals.misses,
                evictions: c.totals.evictions,
                bytes_read: c.bytes_read,
                sessions_open: c.sessions_open,
                transient_uses: c.totals.transient_uses,
                slot_bytes: c.slot_bytes,
            }),
            sessions,
            open_connections: st.open_connections.load(Ordering::Relaxed),
            draining: st.is_draining(),
            uptime_ns: st.started.elapsed().as_nanos() as u64,
            rss_bytes: shared::procfs::vm_rss_bytes(None).unwrap_or(0),
            queued_request_bytes: st.pipeline.queued_bytes(),
            queue_full_refusals: st.pipeline.queue_full_refusals(),
            prefetch: st.executor().prefetcher().map(|p| {
                loaded!(
                    pb::PrefetchStats,
                    p.counters,
                    [
                        hints,
                        dropped_hints,
                        already_resident,
                        reads,
                        bytes_read,
                        useful_bytes,
                        capped,
                        skipped,
                        stale
                    ]
                )
            }),
            peers,
        }
    }
}

#[tonic::async_trait]
impl ExpertService for ExpertdService {
    async fn handshake(
        &self,
        request: Request<pb::HandshakeRequest>,
    ) -> Result<Response<pb::HandshakeResponse>, Status> {
        let conn = conn_of(&request)?;
        let resp = self.handshake_inner(&conn, request.into_inner()).await.inspect_err(|e| {
            // A client hammering the session caps must not flood the log: those refusals are
            // logged at the 1st, 2nd, 4th, 8th … one (with the running count), the rest at debug.
            let capped = matches!(e, RpcError::TooManySessions(_));
            let n = if capped { self.state.session_cap_refusals.fetch_add(1, Ordering::Relaxed) + 1 } else { 0 };
            if !capped || n.is_power_of_two() {
                tracing::warn!(error = %logsafe::text(&e.to_string()), error_type = e.error_type(), peer = %conn.peer, session_cap_refusals = n, "handshake refused");
            } else {
                tracing::debug!(error = %logsafe::text(&e.to_string()), error_type = e.error_type(), peer = %conn.peer, session_cap_refusals = n, "handshake refused");
            }
        })?;
        Ok(Response::new(resp))
    }

    async fn moe_layer(
        &self,
        request: Request<pb::MoeLayerRequest>,
    ) -> Result<Response<pb::MoeLayerResponse>, Status> {
        let conn = conn_of(&request)?;
        let arrival = request
            .extensions()
            .get::<super::intake::ArrivalHold>()
            .map(super::intake::ArrivalHold::take)
            .unwrap_or_default();
        let r = request.into_inner();
        let session = self.state.sessions.get(r.session_id, conn.conn_id).ok_or(
            RpcError::UnknownSession {
                session: r.session_id,
            },
        )?;
        let span = tracing::debug_span!(
            "moe_layer",
            session = session.id,
            request_id = r.request_id,
            layer_idx = r.layer_idx,
            n_tokens = r.n_tokens
        );
        let result = self
            .moe_layer_inner(&conn, &session, r, arrival)
            .instrument(span)
            .await;
        session.record(result.as_ref().map(|(_, c)| c).map_err(|_| ()));
        match result {
            Ok((resp, _)) => Ok(Response::new(resp)),
            Err(e) => {
                tracing::debug!(error = %logsafe::text(&e.to_string()), error_type = e.error_type(), "moe_layer failed");
                Err(e.into())
            }
        }
    }

    async fn stats(
        &self,
        _request: Request<pb::StatsRequest>,
    ) -> Result<Response<pb::StatsResponse>, Status> {
        // Authorized by `super::intake`, as every request.
        Ok(Response::new(self.stats_inner()))
    }

    async fn close_session(
        &self,
        request: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        let conn = conn_of(&request)?;
        let id = request.into_inner().session_id;
        let s = self
            .state
            .sessions
            .close(id, conn.conn_id)
            .ok_or(RpcError::UnknownSession { session: id })?;
        self.state
            .executor()
            .cache()
            .release_session(crate::cache::SessionId(s.id));
        tracing::info!(session = s.id, client_name = %logsafe::name(&s.client_name), "session closed by its client");
        Ok(Response::new(pb::CloseSessionResponse {}))
    }
}
