//! The daemon's side of the MoE-call ring (`shared::ring`): one worker thread per session whose
//! connection passed a segment with a ring. The worker takes calls straight out of shared
//! memory, decodes each entry ([`super::ring_entry::decode`]) and runs it through the same call
//! pipeline as the `MoeLayer` RPC (`super`) — no tokio, no HTTP/2, no protobuf, no hand-off
//! before the compute pool. The RPC stays for everything else (handshake, stats, health, TCP,
//! old clients).
//!
//! Every value the client wrote is copied out of shared memory before it is checked, so a
//! client that keeps writing cannot change a call after validation. A malformed entry fails
//! that call with a status (code and text in the entry); it never stops the worker. The worker
//! ends when its session closes (the connection went away, or `CloseSession`), marking the
//! ring `daemon_gone` and failing whatever was still submitted, so the client stops waiting.

use super::ring_entry::{self, RingCall};
use super::{CallBuffers, CallPipeline, SegmentIo};
use crate::rpc::RpcError;
use crate::session::Session;
use crate::shm::Segment;
use shared::call_cost::CallCost;
use shared::ring::{self, Entry, RingView, Submission};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How long the worker polls for the next submission before sleeping on the doorbell, by
/// default (`expertd serve --ring-spin-us`): longer than the gap between two MoE calls of a
/// decode step (the dense work of one layer, ~3 ms at the real shape on 2 cores), so that a
/// decoding client never pays the worker's wake-up. The poll yields the core every few hundred
/// spins, so the client's threads still get it.
pub const DEFAULT_WORKER_SPIN: Duration = Duration::from_millis(5);
/// Rows of call buffers a ring worker keeps between calls (a decode step's rows for a few
/// sequences); buffers grown past it by a larger call are freed after that call.
const KEEP_ROWS: usize = 64;
/// Longest sleep between checks that the session is still open.
const WORKER_SLICE: Duration = Duration::from_millis(100);

/// How ring workers wait for work.
#[derive(Debug, Clone, Copy)]
pub struct RingConfig {
    /// How long a worker polls for the next call before sleeping (`--ring-spin-us`).
    pub spin: Duration,
    /// Whether a worker keeps the compute pool awake (yielding) through a burst of calls.
    pub pool_awake: bool,
}

/// Starts the worker for `session` on `segment`'s ring.
pub fn spawn(
    pipeline: Arc<CallPipeline>,
    config: RingConfig,
    session: Arc<Session>,
    segment: Arc<Segment>,
    ring: RingView,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name(format!("expertd-ring-{}", session.id))
        .spawn(move || {
            let worker = Worker {
                pipeline,
                config,
                session,
                segment,
                ring,
                ids: Vec::new(),
                weights: Vec::new(),
                buffers: CallBuffers::default(),
            };
            worker.serve();
        })?;
    Ok(())
}

struct Worker {
    pipeline: Arc<CallPipeline>,
    config: RingConfig,
    session: Arc<Session>,
    /// Keeps the mapping the ring lives in alive for as long as the worker runs.
    segment: Arc<Segment>,
    ring: RingView,
    ids: Vec<u32>,
    weights: Vec<f32>,
    buffers: CallBuffers,
}

impl Worker {
    fn any_submitted(&self) -> bool {
        (0..self.ring.layout().entries)
            .any(|i| self.ring.entry(i).state().load(Ordering::Acquire) == ring::STATE_SUBMITTED)
    }

    /// The next submitted entry, round-robin from `next` (so one busy entry cannot starve
    /// another).
    fn claim_next(&self, next: &mut u32) -> Option<(u32, Submission)> {
        let entries = self.ring.layout().entries;
        let claimed = (0..entries)
            .map(|j| (*next + j) % entries)
            .find_map(|i| self.ring.entry(i).claim().map(|s| (i, s)));
        if let Some((i, _)) = claimed {
            *next = (i + 1) % entries;
        }
        claimed
    }

    fn serve(mut self) {
        let entries = self.ring.layout().entries;
        let mut next = 0;
        tracing::debug!(session = self.session.id, entries, "call ring serving");
        // However the loop ends (even by a panic), the client must stop waiting.
        let _gone = Gone(self.ring);
        while !self.session.is_closed() {
            if let Some((i, sub)) = self.claim_next(&mut next) {
                if self.config.pool_awake {
                    let executor = Arc::clone(self.pipeline.executor());
                    executor.with_pool_awake(|| self.burst(i, sub, &mut next));
                } else {
                    self.burst(i, sub, &mut next);
                }
                continue;
            }
            let d = self.ring.doorbell().load(Ordering::SeqCst);
            self.ring.daemon_waiting().store(1, Ordering::SeqCst);
            if !self.any_submitted() && !self.session.is_closed() {
                ring::futex_wait(self.ring.doorbell(), d, Some(WORKER_SLICE));
            }
            self.ring.daemon_waiting().store(0, Ordering::SeqCst);
        }
        for i in 0..entries {
            if let Some(sub) = self.ring.entry(i).claim() {
                fail(
                    &self.ring.entry(i),
                    sub.seq,
                    RpcError::UnknownSession {
                        session: self.session.id,
                    },
                );
            }
        }
        tracing::debug!(
            session = self.session.id,
            "call ring stopped: session closed"
        );
    }

    /// Runs the call in entry `i`, then every call that arrives within the poll window after
    /// the last one (`--ring-spin-us`; a decode step's calls come a few ms apart), and returns
    /// when the window passes without one or the session closes. On the kept-awake pool it
    /// also returns as soon as another call runs or has run off the pool since the burst began
    /// (another session's, or a gRPC call), handing pool thread 0 back: the poll itself never
    /// takes other pool work, so no other session's call waits behind this session's next one.
    fn burst(&mut self, i: u32, sub: Submission, next: &mut u32) {
        let executor = Arc::clone(self.pipeline.executor());
        let on_pool = rayon::current_thread_index().is_some();
        let mark = executor.off_pool_mark();
        let give_back = || on_pool && executor.contended_since(mark);
        if on_pool {
            self.session
                .counters
                .ring_bursts
                .fetch_add(1, Ordering::Relaxed);
        }
        self.run(i, sub);
        while !self.session.is_closed() && !give_back() {
            if let Some((i, sub)) = self.claim_next(next) {
                self.run(i, sub);
                continue;
            }
            let arrived = ring::spin_until(self.config.spin, || {
                self.any_submitted() || self.session.is_closed() || give_back()
            });
            if !arrived {
                return;
            }
        }
    }

    fn run(&mut self, i: u32, sub: Submission) {
        let ring = self.ring;
        let entry = ring.entry(i);
        let moe = sub.op == ring::OP_MOE;
        // Counted from the claim until the result is published: a drain waits for it.
        let _running = self.pipeline.track();
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.call(&entry, &sub)))
                .unwrap_or_else(|_| {
                    Err(RpcError::Internal(
                        "the call panicked in the daemon (a bug; see its log)".into(),
                    ))
                });
        self.trim();
        // Echoes and hints are not MoE calls: only those count in the session's figures.
        match result {
            Ok(c) => {
                if moe {
                    self.session.record(Ok(&c));
                    self.session
                        .counters
                        .ring_calls
                        .fetch_add(1, Ordering::Relaxed);
                }
                entry.complete(sub.seq, &c);
            }
            Err(e) => {
                if moe {
                    self.session.record(Err(()));
                }
                tracing::debug!(session = self.session.id, error = %crate::logsafe::text(&e.to_string()), error_type = e.error_type(), "ring call failed");
                fail(&entry, sub.seq, e);
            }
        }
    }

    /// Frees the call buffers after a large call (a prefill block), keeping a decode step's
    /// worth: an idle session holds kilobytes, not its largest call's buffers.
    fn trim(&mut self) {
        self.buffers
            .trim(KEEP_ROWS * self.pipeline.executor().hidden());
        let keep_cells = KEEP_ROWS * crate::call_memory::BUDGETED_TOP_K * 2;
        if self.ids.capacity() > keep_cells {
            self.ids = Vec::new();
        }
        if self.weights.capacity() > keep_cells {
            self.weights = Vec::new();
        }
    }

    /// Decodes the entry and runs it through the pipeline.
    fn call(&mut self, entry: &Entry<'_>, sub: &Submission) -> Result<CallCost, RpcError> {
        // PERF-CRITICAL: one MoE layer call per entry.
        let pipeline = Arc::clone(&self.pipeline);
        pipeline.check_open()?;
        let executor = pipeline.executor();
        let capacity = self.ring.layout().cells as usize;
        let call = ring_entry::decode(
            entry,
            sub,
            capacity,
            &self.segment.bounds(),
            executor.limits(),
            self.session.id,
            &mut self.ids,
            &mut self.weights,
        )?;
        match call {
            RingCall::Prefetch { layer, experts } => {
                if let Some(p) = executor.prefetcher() {
                    p.hint(crate::prefetch::Hint {
                        session: self.session.id,
                        step: sub.step,
                        layer,
                        experts: experts.to_vec(),
                    });
                }
                Ok(CallCost::default())
            }
            RingCall::Echo {
                n_rows,
                input,
                output,
            } => {
                let x = self.buffers.input(n_rows * executor.hidden());
                self.segment.read_f32s(input, x);
                self.segment.write_f32s(output, x);
                Ok(CallCost::default())
            }
            RingCall::Moe {
                call,
                hint,
                input,
                output,
            } => {
                let hint = hint.map(|(layer, experts)| crate::prefetch::Hint {
                    session: self.session.id,
                    step: sub.step,
                    layer,
                    experts: experts.to_vec(),
                });
                let mut io = SegmentIo {
                    segment: &self.segment,
                    input,
                    output,
                };
                pipeline
                    .admit(&self.session, &call, 0, super::Held::default())?
                    .lane_blocking()
                    .run(call.spec(), &mut io, &mut self.buffers, hint)
            }
        }
    }
}

/// Marks the ring's daemon side gone and wakes every entry, when the worker ends.
struct Gone(RingView);

impl Drop for Gone {
    fn drop(&mut self) {
        self.0.daemon_gone().store(1, Ordering::SeqCst);
        for i in 0..self.0.layout().entries {
            // A client sleeping on any entry wakes, sees `daemon_gone` and stops waiting.
            ring::futex_wake(self.0.entry(i).state());
        }
    }
}

/// Publishes `e` as the entry's failure, with the status code the RPC would have returned.
fn fail(entry: &Entry<'_>, seq: u32, e: RpcError) {
    let status: tonic::Status = e.into();
    entry.fail(seq, status.code() as u32, status.message());
}
