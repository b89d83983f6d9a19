//! The one call pipeline. Every MoE call — a `MoeLayer` RPC or a call-ring entry — passes the
//! same stages in the same order:
//!
//! 1. **draining**: a daemon shutting down refuses it ([`CallPipeline::check_open`]);
//! 2. **validate**: shape, then routing, against the container ([`CallLimits::validate`]), before
//!    anything of the call's size exists; it gives the [`Validated`] call that admission takes;
//! 3. **session bound**: at most `--max-queued-calls` of one session queued or running, and the
//!    decoded request it holds (an RPC's; a ring call holds none) within the daemon's cap on
//!    bytes waiting for a lane (`--max-queued-bytes`, counted until the call gets its lane);
//! 4. **fair lane**: the session's turn at a compute lane (`crate::session::FairQueue`);
//! 5. **session still open**: a session closed while its call queued is refused, so its leases
//!    never outlive it (the cache refuses a closed session again before every wave);
//! 6. **copy in**, **execute**, **copy out** through the transport's [`CallIo`];
//! 7. **trace**: the cache journals the call's route-trace events in memory (when recording);
//!    `crate::trace_flusher`'s thread writes them to the file, never a call's thread.
//!
//! Types enforce the order: only a [`Validated`] call (2) can be admitted, [`CallPipeline::admit`]
//! (1, 3) gives an [`Admitted`] call, only that can wait for a lane (4: [`Admitted::lane`] on the
//! async runtime, [`Admitted::lane_blocking`] on a ring worker), and only a [`Laned`] call can run
//! (5–6: [`Laned::run`]). The transports are
//! adapters for where the bytes live: `crate::rpc::service` decodes a protobuf request,
//! [`ring_worker`] a ring entry ([`ring_entry::decode`], which the fuzz target calls too).

pub mod limits;
pub mod queued;
pub mod ring_entry;
pub mod ring_worker;

pub use limits::{CallLimits, Validated};
pub use queued::Held;
pub use ring_worker::RingConfig;

use crate::moe_call::{CallExecutor, CallSpec};
use crate::prefetch::Hint;
use crate::rpc::RpcError;
use crate::session::{FairQueue, InFlight, LanePermit, Session};
use crate::shm::Segment;
use shared::call_cost::CallCost;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Instant;

/// The daemon's call pipeline: the executor, the fair queue in front of its lanes, and the
/// flags and counts every call passes.
pub struct CallPipeline {
    executor: Arc<CallExecutor>,
    queue: Arc<FairQueue>,
    draining: AtomicBool,
    max_queued_calls_per_session: u32,
    /// Calls admitted and not yet finished, on either transport.
    running: AtomicU32,
    /// Bytes of requests arriving or decoded and waiting for a lane.
    queued: Arc<queued::QueuedBytes>,
}

impl CallPipeline {
    /// A pipeline over `executor` with `lanes` compute lanes, admitting at most
    /// `max_queued_calls_per_session` calls of one session at once and at most
    /// `max_queued_bytes` of decoded requests waiting for a lane.
    pub fn new(
        executor: Arc<CallExecutor>,
        lanes: usize,
        max_queued_calls_per_session: u32,
        max_queued_bytes: u64,
    ) -> CallPipeline {
        CallPipeline {
            executor,
            queue: FairQueue::new(lanes),
            draining: AtomicBool::new(false),
            max_queued_calls_per_session,
            running: AtomicU32::new(0),
            queued: queued::QueuedBytes::new(max_queued_bytes),
        }
    }

    /// Bytes of requests arriving or decoded and waiting for a lane now.
    pub fn queued_bytes(&self) -> u64 {
        self.queued.level()
    }

    /// Requests refused so far because of the cap on queued bytes or a peer's share of it.
    pub fn queue_full_refusals(&self) -> u64 {
        self.queued.refusals()
    }

    /// Counts `bytes` of a request from `peer` against the cap on queued bytes until the
    /// guard drops (a request arriving, from its length prefix, or a decoded one waiting for a
    /// lane).
    pub fn reserve(&self, bytes: u64, peer: crate::session::PeerKey) -> Result<Held, RpcError> {
        self.queued.reserve(bytes, peer)
    }

    /// The call executor.
    pub fn executor(&self) -> &Arc<CallExecutor> {
        &self.executor
    }

    /// The per-session bound on calls queued or running.
    pub fn max_queued_calls_per_session(&self) -> u32 {
        self.max_queued_calls_per_session
    }

    /// Shutdown began: every later call and handshake is refused.
    pub fn start_draining(&self) {
        // SeqCst with `running` (here and in `Running::new`): the drain stores the flag then
        // reads the count, a call adds to the count then reads the flag; with acquire/release
        // alone both could read the old value and the drain would miss the call.
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether shutdown began.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Stage 1: refuses everything once the daemon drains.
    pub fn check_open(&self) -> Result<(), RpcError> {
        if self.is_draining() {
            return Err(RpcError::ShuttingDown);
        }
        Ok(())
    }

    /// Calls admitted and not yet finished, and ring entries being served (a draining daemon
    /// waits for them).
    pub fn running(&self) -> u32 {
        self.running.load(Ordering::SeqCst)
    }

    /// Counts a ring entry in [`running`](Self::running) from its claim until its result is
    /// published (echoes and hints too), so that a drain waits for it.
    pub fn track(self: &Arc<Self>) -> Running {
        Running::new(self)
    }

    /// Stages 1 and 3 for `call` (validated: stage 2), a call of `session` whose decoded request
    /// holds `held_bytes` while it waits: draining, the session's bound, the queue's byte cap.
    /// `arrival` is what the request was counted as while it arrived (`crate::rpc::intake`;
    /// none on the ring): the call keeps `held_bytes` of it, topped up if it holds more.
    pub fn admit(
        self: &Arc<Self>,
        session: &Arc<Session>,
        call: &Validated<'_>,
        held_bytes: u64,
        arrival: Held,
    ) -> Result<Admitted, RpcError> {
        // Counted before the draining check: a drain that sets the flag and then sees no call
        // running cannot miss one that passed the check.
        let running = Running::new(self);
        self.check_open()?;
        let limit = self.max_queued_calls_per_session;
        let in_flight = session.try_enter(limit).ok_or(RpcError::SessionBusy {
            session: session.id,
            limit,
        })?;
        let mut held = arrival;
        if held_bytes > held.bytes() {
            held.absorb(self.reserve(held_bytes - held.bytes(), session.peer_key)?);
        } else {
            held.shrink_to(held_bytes);
        }
        let spec = call.spec();
        Ok(Admitted {
            _held: held,
            shape: (spec.layer, spec.n_rows, spec.top_k, spec.ids.len()),
            running,
            session: Arc::clone(session),
            in_flight,
            since: Instant::now(),
        })
    }
}

/// Counts a call in [`CallPipeline::running`] until dropped.
pub struct Running(Arc<CallPipeline>);

impl Running {
    fn new(pipeline: &Arc<CallPipeline>) -> Running {
        pipeline.running.fetch_add(1, Ordering::SeqCst);
        Running(Arc::clone(pipeline))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What [`Laned::run`] checks its call against: layer, rows, experts per row, cells.
type Shape = (shared::ids::LayerId, usize, usize, usize);

/// A call that passed stages 1–3 and holds a place in its session's bound.
pub struct Admitted {
    /// The decoded request's bytes, counted until the call gets its lane.
    _held: Held,
    shape: Shape,
    running: Running,
    session: Arc<Session>,
    in_flight: InFlight,
    since: Instant,
}

impl Admitted {
    /// Stage 4 on the async runtime: waits for the session's turn at a lane.
    pub async fn lane(self) -> Laned {
        let permit = self.running.0.queue.acquire(self.session.id).await;
        self.laned(permit)
    }

    /// Stage 4 on a plain thread (a ring worker): blocks for the session's turn at a lane.
    pub fn lane_blocking(self) -> Laned {
        let permit = self.running.0.queue.acquire_blocking(self.session.id);
        self.laned(permit)
    }

    fn laned(self, permit: LanePermit) -> Laned {
        Laned {
            shape: self.shape,
            queue_ns: self.since.elapsed().as_nanos() as u64,
            _permit: permit,
            _in_flight: self.in_flight,
            session: self.session,
            running: self.running,
        }
    }
}

/// A call that holds a compute lane.
pub struct Laned {
    shape: Shape,
    queue_ns: u64,
    _permit: LanePermit,
    _in_flight: InFlight,
    session: Arc<Session>,
    running: Running,
}

impl Laned {
    /// Stages 5–6 for `spec`, the call that was validated and admitted (its shape is checked
    /// against the admitted one): refuses the call if its session closed while it queued, then
    /// copies the activations in through `io`, runs the call (with `hint` for the speculative
    /// reader) and copies the output out. The call's f32 buffers grow only here,
    /// holding a lane: a queued call holds its routing, not its activations (the memory budget
    /// counts lanes × one call). Releases the lane and the session's place when it returns.
    pub fn run(
        self,
        spec: &CallSpec<'_>,
        io: &mut dyn CallIo,
        buffers: &mut CallBuffers,
        hint: Option<Hint>,
    ) -> Result<CallCost, RpcError> {
        // PERF-CRITICAL: once per MoE call, either transport.
        if (spec.layer, spec.n_rows, spec.top_k, spec.ids.len()) != self.shape
            || spec.weights.len() != spec.ids.len()
        {
            return Err(RpcError::Internal(
                "the call run is not the call admitted (a bug)".into(),
            ));
        }
        if self.session.is_closed() {
            return Err(RpcError::UnknownSession {
                session: self.session.id,
            });
        }
        let executor = &self.running.0.executor;
        let n_values = spec.n_rows * executor.hidden();
        buffers.x.resize(n_values, 0.0);
        buffers.out.resize(n_values, 0.0);
        io.read_input(&mut buffers.x)?;
        let cost = executor.run_hinted(spec, &buffers.x, &mut buffers.out, hint)?;
        io.write_output(&buffers.out)?;
        Ok(cost.with_queue_ns(self.queue_ns))
    }
}

/// Where one call's activations come from and its output goes: the transport's part of the
/// pipeline.
pub trait CallIo {
    /// Fills `x` (`n_rows × hidden` values) with the call's activations.
    fn read_input(&mut self, x: &mut [f32]) -> Result<(), RpcError>;
    /// Delivers the call's output (`n_rows × hidden` values).
    fn write_output(&mut self, out: &[f32]) -> Result<(), RpcError>;
}

/// Activations and output both in the connection's shared-memory segment (byte ranges checked
/// against its bounds).
pub struct SegmentIo<'a> {
    /// The segment.
    pub segment: &'a Segment,
    /// The activations' bytes.
    pub input: Range<usize>,
    /// The output's bytes.
    pub output: Range<usize>,
}

impl CallIo for SegmentIo<'_> {
    fn read_input(&mut self, x: &mut [f32]) -> Result<(), RpcError> {
        self.segment.read_f32s(self.input.clone(), x);
        Ok(())
    }

    fn write_output(&mut self, out: &[f32]) -> Result<(), RpcError> {
        self.segment.write_f32s(self.output.clone(), out);
        Ok(())
    }
}

/// A call's f32 activation and output buffers; a ring worker keeps one between calls.
#[derive(Default)]
pub struct CallBuffers {
    x: Vec<f32>,
    out: Vec<f32>,
}

impl CallBuffers {
    /// Frees the buffers if they grew past `keep_values` values each (after a prefill block):
    /// an idle session holds a decode step's worth, not its largest call's buffers.
    pub fn trim(&mut self, keep_values: usize) {
        if self.x.capacity() > keep_values {
            self.x = Vec::new();
        }
        if self.out.capacity() > keep_values {
            self.out = Vec::new();
        }
    }

    /// The activation buffer, sized to `n_values` (an echo's copy).
    pub fn input(&mut self, n_values: usize) -> &mut Vec<f32> {
        self.x.resize(n_values, 0.0);
        &mut self.x
    }
}
