//! The byte-budgeted expert cache with leases. **This module does no IO.** It decides which
//! experts are resident, which slot a miss is read into, which entry is evicted and which
//! slots are pinned, and it owns the memory the experts live in; the reads themselves are done
//! by a driver (the server, through `crate::io::ExpertSource`) straight into the buffers that
//! the leases lend out. (The route-trace journal is kept in memory; the trace file is written
//! only when the server calls [`ExpertCache::flush_trace`], outside the cache's lock.)
//!
//! - [`planner`]: the pure decision core ([`Planner`]), shared with `expertd replay` so a
//!   replayed trace reproduces the daemon's counters exactly.
//! - [`policy`]: `lru` and `lfu-aging`, and the exact victim order.
//! - [`lease`]: the RAII guards ([`Lease`], [`Acquired`]) and their access rules.
//! - `arena`: one up-front, 4096-aligned reservation for every slot and the transient pool;
//!   its pages are committed only as experts are read into them.
//! - [`stats`]: the counters and the numbered budget and lease invariants.
//!
//! # Flow of one MoE-layer call
//!
//! ```text
//! let mut acq = cache.acquire(session, &keys)?;          // plan: hits pinned, misses placed
//! for lease in acq.misses() { read into lease.buffer_mut(); verify; lease.mark_filled(); }
//! acq.wait_ready()?;                                      // hits being read by earlier calls
//! compute over lease.bytes() for every lease;
//! drop(acq);                                              // pins released; unfilled misses forgotten
//! ```
//!
//! The budget buys `budget_bytes / slot_bytes` resident slots. When every evictable slot is
//! leased, a miss is served from a bounded pool of `transient_slots` extra buffers (read, used,
//! not cached); when that pool is empty too, the call is refused with
//! [`CacheError::Exhausted`] and changes nothing. Total memory is therefore at most
//! `(n_slots + transient_slots) × slot_bytes`, of which at most `budget_bytes` caches; it is
//! reserved at construction and committed as buffers are first written.

mod arena;
mod invariants;
pub mod lease;
#[cfg(all(test, sluice_loom))]
mod loom_model;
pub mod planner;
pub mod policy;
pub mod stats;
mod sync;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_sessions;
#[cfg(test)]
mod tests_trace;
#[cfg(test)]
mod tests_waits;

pub use arena::SLOT_ALIGN;
pub use lease::{Acquired, Lease};
pub use planner::{CallId, FillState, Placement, Plan, Planner};
pub use policy::{DEFAULT_HALVING_PERIOD, Policy, PolicyKind};
pub use stats::{CacheStats, PlanTotals, SessionStats};

use crate::trace::{TraceError, TraceHeader, TraceWriter};
use arena::Arena;
use lease::{CallHandle, LeaseKind};
use serde::{Deserialize, Serialize};
use shared::ids::{ExpertId, LayerId};
use sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, TryLockError};

/// Most route-trace events the journal holds between two [`ExpertCache::flush_trace`]s (the
/// daemon's writer thread flushes every 50 ms). An acquire never writes the trace itself: when
/// the writer falls this far behind (a stalled file), the journal is dropped and counted, and
/// [`ExpertCache::finish_trace`] reports the trace incomplete, so neither a call nor the memory
/// waits on the trace.
pub const MAX_JOURNAL_EVENTS: usize = 1 << 16;

/// One routed expert of one MoE layer: the cache's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ExpertKey {
    /// MoE layer.
    pub layer: LayerId,
    /// Expert within the layer.
    pub expert: ExpertId,
}

impl ExpertKey {
    /// The key of `expert` in `layer`.
    pub fn new(layer: LayerId, expert: ExpertId) -> ExpertKey {
        ExpertKey { layer, expert }
    }
}

impl std::fmt::Display for ExpertKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "layer {} expert {}", self.layer, self.expert)
    }
}

/// A client of the cache (one hostd connection): the unit of lease ownership and accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SessionId(pub u64);

/// How the cache is sized and which policy it evicts by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// Bytes of resident experts: `budget_bytes / slot_bytes` slots, never more.
    pub budget_bytes: u64,
    /// The eviction policy.
    pub policy: Policy,
    /// Extra buffers for misses when every evictable slot is leased (outside the budget).
    pub transient_slots: u32,
}

/// Why the cache refused a call or could not be built. No variant allocates, so the refusal
/// paths do not either.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    /// The slot size is not a positive multiple of [`SLOT_ALIGN`].
    #[error("cache slot size {slot_bytes} bytes is not a positive multiple of {SLOT_ALIGN}")]
    SlotBytes {
        /// The size given (the container's blob stride).
        slot_bytes: usize,
    },
    /// The arena could not be allocated.
    #[error("could not allocate the cache arena of {bytes} bytes")]
    ArenaAlloc {
        /// Bytes requested (`u64::MAX` when the size overflowed).
        bytes: u64,
    },
    /// A call named no expert.
    #[error("an expert call must name at least one expert")]
    EmptyCall,
    /// A call named experts of two layers.
    #[error("one expert call may name one layer only, got layers {first} and {other}")]
    MixedLayers {
        /// The first key's layer.
        first: LayerId,
        /// Another key's layer.
        other: LayerId,
    },
    /// A call named an expert twice.
    #[error("{key} named twice in one call")]
    DuplicateKey {
        /// The repeated key.
        key: ExpertKey,
    },
    /// A call of a session the cache does not hold open (never opened, or already released):
    /// refused once [`ExpertCache::require_open_sessions`] is on, so a call that outlives its
    /// session cannot bring the session back.
    #[error("session {session} is not open in the cache (closed, or never opened)")]
    UnknownSession {
        /// The session id.
        session: u64,
    },
    /// Every slot is leased and the transient pool cannot serve the remaining misses.
    #[error(
        "cache exhausted: layer {layer} call has {misses} misses, {slots_available} of {n_slots} slots can take one, and {transient_free} of {transient_slots} transient buffers are free"
    )]
    Exhausted {
        /// The call's layer.
        layer: LayerId,
        /// Misses of the call.
        misses: u32,
        /// Slots free or evictable (not leased) at the time.
        slots_available: u32,
        /// Transient buffers free at the time.
        transient_free: u32,
        /// Resident slots.
        n_slots: u32,
        /// Transient buffers.
        transient_slots: u32,
    },
    /// The earlier call reading this expert dropped its lease without completing the read.
    #[error("{key} was being read by another call, whose read failed")]
    FillFailed {
        /// The expert.
        key: ExpertKey,
    },
    /// Waiting for another call's read of this expert timed out.
    #[error("timed out waiting for another call's read of {key}")]
    FillTimeout {
        /// The expert.
        key: ExpertKey,
    },
}

impl CacheError {
    /// A stable name for metric labels.
    pub fn error_type(&self) -> &'static str {
        match self {
            CacheError::SlotBytes { .. } => "slot_bytes",
            CacheError::ArenaAlloc { .. } => "arena_alloc",
            CacheError::EmptyCall => "empty_call",
            CacheError::MixedLayers { .. } => "mixed_layers",
            CacheError::DuplicateKey { .. } => "duplicate_key",
            CacheError::UnknownSession { .. } => "unknown_session",
            CacheError::Exhausted { .. } => "exhausted",
            CacheError::FillFailed { .. } => "fill_failed",
            CacheError::FillTimeout { .. } => "fill_timeout",
        }
    }
}

/// What the planner's mutex guards.
pub(crate) struct State {
    pub(crate) planner: Planner,
    /// Threads blocked on `Shared::filled`; lets fills skip the wake-up when nobody waits.
    pub(crate) waiters: u32,
    /// Threads blocked on `Shared::released` (an acquire waiting for leases to be released).
    pub(crate) release_waiters: u32,
    /// Route-trace events dropped because the journal reached [`MAX_JOURNAL_EVENTS`].
    pub(crate) trace_dropped: u64,
}

/// The cache's shared state; leases keep it (and so the arena) alive.
pub(crate) struct Shared {
    /// A `std` mutex, not an async one: every critical section is a few map and tree updates —
    /// it never awaits, never does IO and never waits for a read (waiters sleep on `filled`,
    /// which releases it) — so async callers can take it directly without stalling a runtime
    /// thread for long.
    pub(crate) state: Mutex<State>,
    /// Signalled when a read into a slot completes or is abandoned while someone waits.
    pub(crate) filled: Condvar,
    /// Signalled when a call's leases are released while an acquire waits for room.
    pub(crate) released: Condvar,
    arena: Arena,
    config: CacheConfig,
    /// The route trace, while tracing. Lock order: `trace` before `state`, never the reverse.
    trace: Mutex<Option<TraceWriter>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Every call has been released by now (each lease held an `Arc` of this): write what
        // the journal holds. Errors cannot be reported from here; `finish_trace` reports them.
        let trace = self.trace.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(w) = trace.as_mut() {
            let planner = &mut self
                .state
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .planner;
            let _ = drain_journal(planner, w);
            let _ = w.flush();
        }
    }
}

/// Locks `m`, recovering the guard if a panicking thread poisoned it: the planner's methods do
/// not panic in release builds, and the guards' `Drop` must not panic either.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Moves the planner's journal into the writer.
fn drain_journal(planner: &mut Planner, w: &mut TraceWriter) -> Result<(), TraceError> {
    w.check_ok()?;
    let mut events = std::mem::take(&mut w.spare);
    planner.take_journal(&mut events);
    let result = w.write_events(&events);
    events.clear();
    w.spare = events;
    Ok(result?)
}

/// The expert cache: a cheap, cloneable handle (an `Arc`) shared by every server task.
#[derive(Clone)]
pub struct ExpertCache {
    shared: Arc<Shared>,
}

impl ExpertCache {
    /// A cache of `config.budget_bytes / slot_bytes` slots plus `config.transient_slots`
    /// transient buffers, all reserved now (committed as they are first written). `slot_bytes`
    /// is the container's blob stride.
    pub fn new(config: CacheConfig, slot_bytes: usize) -> Result<ExpertCache, CacheError> {
        if slot_bytes == 0 || !slot_bytes.is_multiple_of(SLOT_ALIGN) {
            return Err(CacheError::SlotBytes { slot_bytes });
        }
        let planner = Planner::new(&config, slot_bytes as u64);
        let arena = Arena::new(slot_bytes, planner.n_slots(), config.transient_slots)?;
        let state = Mutex::new(State {
            planner,
            waiters: 0,
            release_waiters: 0,
            trace_dropped: 0,
        });
        Ok(ExpertCache {
            shared: Arc::new(Shared {
                state,
                filled: Condvar::new(),
                released: Condvar::new(),
                arena,
                config,
                trace: Mutex::new(None),
            }),
        })
    }

    /// Leases `keys` (one MoE-layer call: one layer, distinct experts) for `session`; see
    /// [`ExpertCache::acquire_at`]. The route trace's `step` is inferred: it advances whenever
    /// a call's layer is not above the session's previous call's.
    pub fn acquire(&self, session: SessionId, keys: &[ExpertKey]) -> Result<Acquired, CacheError> {
        self.acquire_inner(session, None, keys)
    }

    /// Leases `keys` (one MoE-layer call: one layer, distinct experts) for `session` at
    /// `step` (recorded in the route trace). Returns one lease per key, in order; the misses
    /// need a read and `mark_filled`. Never blocks except on the planner's mutex; hits that an
    /// earlier call is still reading are waited for by [`Acquired::wait_ready`].
    pub fn acquire_at(
        &self,
        session: SessionId,
        step: u64,
        keys: &[ExpertKey],
    ) -> Result<Acquired, CacheError> {
        self.acquire_inner(session, Some(step), keys)
    }

    /// [`acquire_at`](Self::acquire_at), but while every slot and transient buffer the call
    /// needs is leased by other calls ([`CacheError::Exhausted`]) it waits until `deadline` for
    /// leases to be released, woken by each release (no polling); a refusal changes nothing but
    /// the `exhausted` counter (once per attempt).
    pub fn acquire_within(
        &self,
        session: SessionId,
        step: u64,
        keys: &[ExpertKey],
        deadline: std::time::Instant,
    ) -> Result<Acquired, CacheError> {
        self.acquire_waiting(session, Some(step), keys, Some(deadline))
    }

    fn acquire_inner(
        &self,
        session: SessionId,
        step: Option<u64>,
        keys: &[ExpertKey],
    ) -> Result<Acquired, CacheError> {
        self.acquire_waiting(session, step, keys, None)
    }

    // PERF-CRITICAL: once per MoE layer per step. The one global lock is held only for the
    // planner's map and tree updates (O(k log n) for k keys); no IO, no logging; a wait for
    // released leases sleeps on `released`, which releases the lock.
    fn acquire_waiting(
        &self,
        session: SessionId,
        step: Option<u64>,
        keys: &[ExpertKey],
        deadline: Option<std::time::Instant>,
    ) -> Result<Acquired, CacheError> {
        // Journal events dropped below (freed after the lock is released).
        let mut dropped = Vec::new();
        let plan = {
            let mut st = lock(&self.shared.state);
            let mut plan = st.planner.acquire(session, step, keys);
            while let (Err(CacheError::Exhausted { .. }), Some(deadline)) = (&plan, deadline) {
                let now = std::time::Instant::now();
                if now >= deadline {
                    break;
                }
                st.release_waiters += 1;
                st = self
                    .shared
                    .released
                    .wait_timeout(st, deadline - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
                st.release_waiters -= 1;
                plan = st.planner.acquire(session, step, keys);
            }
            if st.planner.journal_len() >= MAX_JOURNAL_EVENTS {
                // The writer fell behind: drop, count, never wait for it (no IO here).
                st.planner.take_journal(&mut dropped);
                st.trace_dropped += dropped.len() as u64;
            }
            plan
        };
        drop(dropped);
        let plan = plan?;
        let handle = Arc::new(CallHandle {
            shared: Arc::clone(&self.shared),
            call: plan.call,
            session,
        });
        let arena = &self.shared.arena;
        let n_slots = arena.n_slots();
        let leases = keys
            .iter()
            .zip(&plan.placements)
            .map(|(&key, p)| {
                let (ptr, index, kind, ready) = match *p {
                    Placement::Hit { slot, ready } => {
                        (arena.slot_ptr(slot), slot, LeaseKind::Hit { slot }, ready)
                    }
                    Placement::Miss { slot, .. } => {
                        (arena.slot_ptr(slot), slot, LeaseKind::Miss { slot }, false)
                    }
                    Placement::Transient { buffer } => (
                        arena.transient_ptr(buffer),
                        n_slots + buffer,
                        LeaseKind::Transient,
                        false,
                    ),
                };
                Lease::new(
                    Arc::clone(&handle),
                    key,
                    (ptr, arena.slot_bytes(), index),
                    kind,
                    ready,
                )
            })
            .collect();
        Ok(Acquired {
            leases,
            call: plan.call,
            hits: plan.hits,
            misses: plan.misses,
            transient: plan.transient,
            evictions: plan.evictions,
        })
    }

    /// From now on, calls are leased only for sessions opened with
    /// [`open_session`](Self::open_session) and not yet released; any other session's acquire
    /// fails with [`CacheError::UnknownSession`] and changes nothing. The daemon turns this on,
    /// so that a call queued when its session closed can never re-create the session's entry
    /// (which nobody would release). Tests and the trace replay leave sessions implicit.
    pub fn require_open_sessions(&self) {
        lock(&self.shared.state).planner.require_open_sessions();
    }

    /// Opens `session` (idempotent): its calls may lease from now until it is released.
    pub fn open_session(&self, session: SessionId) {
        lock(&self.shared.state).planner.open_session(session);
    }

    /// Closes `session` (the client disappeared): it holds no leases afterwards and its
    /// counters join the closed totals. Leases of its calls that are still alive are orphaned:
    /// they keep their slots pinned until their guards drop, because a guard may still be
    /// lending out its bytes — the server should drop the session's in-flight calls too.
    /// Returns the session's final counters (`leases_held` = leases orphaned), or `None` if
    /// the session was unknown.
    pub fn release_session(&self, session: SessionId) -> Option<SessionStats> {
        lock(&self.shared.state).planner.release_session(session)
    }

    /// A snapshot of the global counters.
    pub fn stats(&self) -> CacheStats {
        lock(&self.shared.state).planner.stats()
    }

    /// One open session's counters.
    pub fn session_stats(&self, session: SessionId) -> Option<SessionStats> {
        lock(&self.shared.state).planner.session_stats(session)
    }

    /// Every open session's counters, by session id.
    pub fn sessions(&self) -> Vec<(SessionId, SessionStats)> {
        lock(&self.shared.state).planner.sessions()
    }

    /// Whether `key` is resident (read, or being read).
    pub fn contains(&self, key: ExpertKey) -> bool {
        lock(&self.shared.state).planner.contains(key)
    }

    /// The configuration the cache was built with.
    pub fn config(&self) -> CacheConfig {
        self.shared.config
    }

    /// Bytes of one slot.
    pub fn slot_bytes(&self) -> usize {
        self.shared.arena.slot_bytes()
    }

    /// Bytes allocated for slots and transient buffers together.
    pub fn arena_bytes(&self) -> u64 {
        self.shared.arena.total_bytes()
    }

    /// Every buffer of the arena as `(start, len)`: the resident slots in order, then the
    /// transient pool; [`Lease::buffer_index`] indexes this list. For registering the buffers
    /// with io_uring once at startup; the pointers stay valid while any handle or lease of this
    /// cache lives, and writing through them outside a miss lease breaks the lease rules.
    pub fn buffers(&self) -> Vec<(std::ptr::NonNull<u8>, usize)> {
        let a = &self.shared.arena;
        let resident = (0..a.n_slots()).map(|s| a.slot_ptr(s));
        let transient = (0..a.n_transient()).map(|b| a.transient_ptr(b));
        resident
            .chain(transient)
            .map(|p| (p, a.slot_bytes()))
            .collect()
    }

    /// Whether the arena got the `MADV_HUGEPAGE` advice (for the startup log).
    pub fn huge_pages(&self) -> bool {
        self.shared.arena.huge_pages()
    }

    /// Checks every invariant of [`stats`] from scratch; for tests (linear in the cache size).
    pub fn debug_invariants(&self) -> Result<(), String> {
        lock(&self.shared.state).planner.check_invariants()
    }

    /// Starts recording the route trace into `writer`: writes the header now and journals
    /// every later acquire, release and session release. Refused once the cache has processed
    /// any call (a replay starts from an empty cache) or while a trace is being recorded.
    pub fn start_trace(&self, mut writer: TraceWriter) -> Result<(), TraceError> {
        let mut trace = lock(&self.shared.trace);
        let header = {
            let mut st = lock(&self.shared.state);
            if trace.is_some() || st.planner.has_started() {
                return Err(TraceError::CacheStarted);
            }
            st.planner.set_journal(true);
            TraceHeader::new(
                &self.shared.config,
                self.slot_bytes() as u64,
                u64::from(st.planner.n_slots()),
            )
        };
        if let Err(e) = writer.write_header(&header) {
            lock(&self.shared.state).planner.set_journal(false);
            return Err(e.into());
        }
        *trace = Some(writer);
        Ok(())
    }

    /// Writes the events journaled so far to the trace (buffered). Cheap when nothing is
    /// pending; returns at once if another thread is writing. Call it off the call path (the
    /// daemon's writer thread, `crate::trace_flusher`); the journal holds at most
    /// [`MAX_JOURNAL_EVENTS`] between two calls. An earlier write failure is reported again.
    pub fn flush_trace(&self) -> Result<(), TraceError> {
        let mut trace = match self.shared.trace.try_lock() {
            Ok(t) => t,
            Err(TryLockError::WouldBlock) => return Ok(()),
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
        };
        let Some(w) = trace.as_mut() else {
            return Ok(());
        };
        let mut events = std::mem::take(&mut w.spare);
        lock(&self.shared.state).planner.take_journal(&mut events);
        let result = w
            .check_ok()
            .and_then(|()| w.write_events(&events).map_err(TraceError::from));
        events.clear();
        w.spare = events;
        result
    }

    /// Writes every journaled event, flushes the file and stops tracing. Events of calls
    /// released later are not recorded, so call it when the server is idle (at shutdown).
    pub fn finish_trace(&self) -> Result<(), TraceError> {
        let mut trace = lock(&self.shared.trace);
        let Some(mut w) = trace.take() else {
            return Ok(());
        };
        let mut st = lock(&self.shared.state);
        let mut events = Vec::new();
        st.planner.take_journal(&mut events);
        st.planner.set_journal(false);
        let dropped = std::mem::take(&mut st.trace_dropped);
        drop(st);
        w.check_ok()?;
        w.write_events(&events)?;
        w.flush()?;
        if dropped > 0 {
            return Err(TraceError::Dropped { events: dropped });
        }
        Ok(())
    }
}
