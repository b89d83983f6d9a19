//! The daemon's side of the MoE-call ring (`shared::ring`): one worker thread per session whose
//! connection passed a segment with a ring. The worker takes calls straight out of shared
//! memory and runs them through the same call executor, session bound, fair queue and status mapping
//! as the `MoeLayer` RPC — no tokio, no HTTP/2, no protobuf, no hand-off before the compute
//! pool. The RPC stays for everything else (handshake, stats, health, TCP, old clients).
//!
//! Every value the client wrote is copied out of shared memory before it is checked, so a
//! client that keeps writing cannot change a call after validation. A malformed entry fails
//! that call with a status (code and text in the entry); it never stops the worker. The worker
//! ends when its session closes (the connection went away, or `CloseSession`), marking the
//! ring `daemon_gone` and failing whatever was still submitted, so the client stops waiting.

use super::service::ServiceState;
use super::status::RpcError;
use crate::moe_call::CallSpec;
use crate::session::Session;
use crate::shm::Segment;
use shared::call_cost::CallCost;
use shared::ids::LayerId;
use shared::ring::{self, Entry, RingView, Submission};
use shared::shm_layout::ShmSlice;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

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

/// Starts the worker for `session` on `segment`'s ring.
pub fn spawn(
    state: Arc<ServiceState>,
    session: Arc<Session>,
    segment: Arc<Segment>,
    ring: RingView,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name(format!("expertd-ring-{}", session.id))
        .spawn(move || {
            let worker = Worker {
                state,
                session,
                segment,
                ring,
                ids: Vec::new(),
                weights: Vec::new(),
                x: Vec::new(),
                out: Vec::new(),
            };
            worker.serve();
        })?;
    Ok(())
}

struct Worker {
    state: Arc<ServiceState>,
    session: Arc<Session>,
    /// Keeps the mapping the ring lives in alive for as long as the worker runs.
    segment: Arc<Segment>,
    ring: RingView,
    ids: Vec<u32>,
    weights: Vec<f32>,
    x: Vec<f32>,
    out: Vec<f32>,
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
                if self.state.config.pool_awake {
                    let executor = Arc::clone(&self.state.executor);
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
        let executor = Arc::clone(&self.state.executor);
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
            let arrived = ring::spin_until(self.state.config.ring_spin, || {
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
        // Counted while it runs, so a draining daemon waits for it before exiting.
        self.state.ring_calls.fetch_add(1, Ordering::AcqRel);
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.call(&entry, &sub)))
                .unwrap_or_else(|_| {
                    Err(RpcError::Internal(
                        "the call panicked in the daemon (a bug; see its log)".into(),
                    ))
                });
        self.state.ring_calls.fetch_sub(1, Ordering::AcqRel);
        self.trim();
        // Echoes and hints are not MoE calls: only those count in the session's figures.
        let counted = sub.op == ring::OP_MOE;
        match result {
            Ok(c) => {
                if counted {
                    self.session.record(Ok(&c));
                    self.session
                        .counters
                        .ring_calls
                        .fetch_add(1, Ordering::Relaxed);
                }
                entry.complete(sub.seq, &c);
            }
            Err(e) => {
                if counted {
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
        let keep_values = KEEP_ROWS * self.state.executor.hidden();
        let keep_cells = KEEP_ROWS * crate::call_memory::BUDGETED_TOP_K * 2;
        if self.x.capacity() > keep_values {
            self.x = Vec::new();
        }
        if self.out.capacity() > keep_values {
            self.out = Vec::new();
        }
        if self.ids.capacity() > keep_cells {
            self.ids = Vec::new();
        }
        if self.weights.capacity() > keep_cells {
            self.weights = Vec::new();
        }
    }

    /// A prefetch hint: `top_k` predicted experts of `layer` (one row). Validated like a call's
    /// routing, queued for the speculative reader (dropped when its queue is full, and a no-op
    /// when the daemon runs none), and completed at once.
    fn hint(&mut self, entry: &Entry<'_>, sub: &Submission) -> Result<(), RpcError> {
        let executor = &self.state.executor;
        let dims = executor.header().layout.dims;
        let n = sub.top_k as usize;
        if sub.n_rows != 1 || n > self.ring.layout().cells as usize {
            return Err(RpcError::BadRequest(format!(
                "prefetch hint: rows {} (must be 1), experts {n} (at most {} cells)",
                sub.n_rows,
                self.ring.layout().cells
            )));
        }
        entry.read_cells(n, &mut self.ids, &mut self.weights);
        ring::check_hint(sub.layer, &self.ids, dims.n_layers, dims.n_experts)
            .map_err(|e| RpcError::BadRequest(format!("prefetch hint: {e}")))?;
        if let Some(p) = executor.prefetcher() {
            p.hint(crate::prefetch::Hint {
                session: self.session.id,
                step: sub.step,
                layer: sub.layer,
                experts: self.ids.clone(),
            });
        }
        Ok(())
    }

    /// The prefetch hint a MoE call carries in its cells after `cells` (already copied into
    /// `self.ids`), checked like a hint entry: a layer and experts in range. `None` when it
    /// carries none.
    fn carried_hint(
        &self,
        sub: &Submission,
        layer: LayerId,
        cells: usize,
    ) -> Result<Option<crate::prefetch::Hint>, RpcError> {
        let experts = &self.ids[cells..];
        if experts.is_empty() {
            return Ok(None);
        }
        let dims = self.state.executor.header().layout.dims;
        ring::check_hint(layer, experts, dims.n_layers, dims.n_experts)
            .map_err(|e| RpcError::BadRequest(format!("the call's prefetch hint: {e}")))?;
        Ok(Some(crate::prefetch::Hint {
            session: self.session.id,
            step: sub.step,
            layer,
            experts: experts.to_vec(),
        }))
    }

    /// A byte range of this connection's segment for `n_values` f32 at `offset`.
    fn range(&self, offset: u64, n_values: usize) -> Result<std::ops::Range<usize>, RpcError> {
        let slice = ShmSlice {
            segment_id: self.segment.id(),
            offset_bytes: offset,
            length_bytes: n_values as u64 * 4,
        };
        Ok(self.segment.range(&slice)?)
    }

    fn call(&mut self, entry: &Entry<'_>, sub: &Submission) -> Result<CallCost, RpcError> {
        // PERF-CRITICAL: one MoE layer call per entry.
        let st = Arc::clone(&self.state);
        if st.draining.load(Ordering::Acquire) {
            return Err(RpcError::ShuttingDown);
        }
        let executor = &st.executor;
        if sub.op == ring::OP_PREFETCH {
            return self.hint(entry, sub).map(|()| CallCost::default());
        }
        let (n_rows, top_k, d) = (sub.n_rows as usize, sub.top_k as usize, executor.hidden());
        if sub.op == ring::OP_MOE {
            executor.check_shape(sub.layer, n_rows, top_k)?;
        } else {
            executor.check_rows(sub.layer, n_rows)?;
        }
        let n_values = n_rows * d;
        let input = self.range(sub.input_offset, n_values)?;
        let output = self.range(sub.output_offset, n_values)?;
        match sub.op {
            ring::OP_ECHO => {
                self.x.resize(n_values, 0.0);
                self.segment.read_f32s(input, &mut self.x);
                self.segment.write_f32s(output, &self.x);
                Ok(CallCost::default())
            }
            ring::OP_MOE => {
                let capacity = self.ring.layout().cells as usize;
                let cells = n_rows.checked_mul(top_k).filter(|&c| c <= capacity).ok_or_else(|| {
                    RpcError::BadRequest(format!("n_tokens × top_k = {n_rows} × {top_k} exceeds the ring entry's {capacity} cells"))
                })?;
                // A prefetch hint may ride after the call's cells (`Entry::submit_with_hint`).
                let (hint_layer, hint_n) = entry.hint();
                let total = cells.checked_add(hint_n as usize).filter(|&c| c <= capacity).ok_or_else(|| {
                    RpcError::BadRequest(format!("the call's {cells} cells and its prefetch hint's {hint_n} exceed the ring entry's {capacity} cells"))
                })?;
                entry.read_cells(total, &mut self.ids, &mut self.weights);
                let hint = self.carried_hint(sub, hint_layer, cells)?;
                let spec = CallSpec {
                    session: self.session.id,
                    step: sub.step,
                    layer: sub.layer,
                    n_rows,
                    top_k,
                    ids: &self.ids[..cells],
                    weights: &self.weights[..cells],
                };
                executor.validate(&spec)?;
                let limit = st.config.max_queued_calls_per_session;
                let _in_flight = self.session.try_enter(limit).ok_or(RpcError::SessionBusy {
                    session: self.session.id,
                    limit,
                })?;
                let t_queue = Instant::now();
                let _permit = st.queue.acquire_blocking(self.session.id);
                let queue_ns = t_queue.elapsed().as_nanos() as u64;
                // The session may have closed while this call queued: its leases would then
                // outlive it in the cache.
                if self.session.is_closed() {
                    return Err(RpcError::UnknownSession {
                        session: self.session.id,
                    });
                }
                // The call's buffers grow only now, holding a lane: a call waiting in the queue
                // holds its cells, not its activations (the budget counts lanes × one call).
                self.x.resize(n_values, 0.0);
                self.out.resize(n_values, 0.0);
                self.segment.read_f32s(input, &mut self.x);
                let cost = executor.run_hinted(&spec, &self.x, &mut self.out, hint)?;
                self.segment.write_f32s(output, &self.out);
                // The route trace (when recording) is written here, after the call.
                let _ = executor.cache().flush_trace();
                Ok(cost.with_queue_ns(queue_ns))
            }
            op => Err(RpcError::BadRequest(format!(
                "unknown ring op {op} (expected {} = moe, {} = echo or {} = prefetch)",
                ring::OP_MOE,
                ring::OP_ECHO,
                ring::OP_PREFETCH
            ))),
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
