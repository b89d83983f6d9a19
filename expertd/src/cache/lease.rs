//! Lease guards: what [`super::ExpertCache::acquire`] hands out. A [`Lease`] lends one expert's
//! slot (or transient buffer) for the duration of a MoE-layer call; an [`Acquired`] holds one
//! call's leases in key order. Owns the guards' access rules and their release on drop; the
//! decisions behind them are the planner's ([`super::planner`]).
//!
//! # Access rules (why the raw slot pointers are sound)
//!
//! - A miss lease (slot or transient) is the only writer of its buffer: writes need
//!   `&mut Lease` ([`Lease::buffer_mut`]) and stop at [`Lease::mark_filled`]. Until then no
//!   other lease reads the slot: a hit on a slot being filled waits for the fill.
//! - A hit lease reads only after the planner has seen the slot `Filled`, under the planner's
//!   mutex, which orders the filler's writes before the reader's reads. A `Filled` slot is
//!   never written while pinned: a slot is only re-filled after eviction, and only unpinned
//!   slots are evicted.
//! - The pins of a call are released when its last lease drops (the leases share one
//!   `CallHandle`), so no lease ever outlives its pin. `release_session` orphans a call but
//!   leaves its pins alone for this reason.
//!
//! # Concurrent misses of one expert
//!
//! Acquire calls are planned one at a time, so when two calls want the same missing expert the
//! first gets the miss (a slot `Filling`, pinned) and the second a hit on that slot whose
//! bytes are not ready yet. The second call never reads the expert again and never sees a
//! half-written buffer: [`Acquired::wait_ready`] (or [`Lease::bytes`]) blocks on a condition
//! variable until the first call marks the slot filled. If the first call drops the lease
//! without marking it, the waiter gets [`CacheError::FillFailed`] and the slot is freed once
//! both calls end; a retry of the call misses and reads it. A call only ever waits for calls
//! planned before it, and a filler never waits to fill, so waits cannot form a cycle — as long
//! as a thread does not wait on one call while it still owes the reads of a later one.

use super::planner::{CallId, FillState};
use super::sync::{Arc, AtomicU8, Ordering, PoisonError};
use super::{CacheError, ExpertKey, SessionId, Shared, lock};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

/// One call's share of the cache: releases the call's pins when the last of its leases drops.
pub(crate) struct CallHandle {
    pub(crate) shared: Arc<Shared>,
    pub(crate) call: CallId,
    pub(crate) session: SessionId,
}

impl Drop for CallHandle {
    fn drop(&mut self) {
        let mut st = lock(&self.shared.state);
        let abandoned = st.planner.release(self.call);
        let wake = abandoned > 0 && st.waiters > 0;
        let wake_acquires = st.release_waiters > 0;
        drop(st);
        if wake {
            self.shared.filled.notify_all();
        }
        if wake_acquires {
            self.shared.released.notify_all();
        }
    }
}

/// What a lease lends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseKind {
    /// A resident slot whose expert was resident (or being read by an earlier call).
    Hit { slot: u32 },
    /// A resident slot this lease must fill.
    Miss { slot: u32 },
    /// A transient buffer this lease must fill; not cached.
    Transient,
}

/// A hit's readiness, cached in the lease once observed so later reads skip the mutex.
const PENDING: u8 = 0;
const READY: u8 = 1;
const FAILED: u8 = 2;

/// One expert of one call: a pinned, `slot_bytes`-long, 4096-aligned buffer. Dropping the
/// call's last lease releases the call's pins; a miss that was never marked filled is then
/// forgotten, so a failed read never leaves garbage cached.
pub struct Lease {
    call: Arc<CallHandle>,
    key: ExpertKey,
    ptr: NonNull<u8>,
    len: usize,
    kind: LeaseKind,
    buffer_index: u32,
    /// For a miss: this lease marked the buffer filled (changed only through `&mut self`).
    filled: bool,
    /// For a hit: `PENDING`, `READY` or `FAILED`.
    hit_state: AtomicU8,
}

// SAFETY: the pointer targets the cache arena, which the lease keeps alive through
// `call.shared`; the right to touch the buffer comes from the call's pin, which does not
// depend on the thread holding the lease.
unsafe impl Send for Lease {}
// SAFETY: through `&Lease` the buffer is only read (`bytes`), and only when no writer can
// exist: a hit reads after the slot is `Filled` (never written while pinned), a miss's own
// writes need `&mut Lease`. See the module doc.
unsafe impl Sync for Lease {}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.key)
            .field("kind", &self.kind)
            .field("filled", &self.filled)
            .finish()
    }
}

impl Lease {
    pub(crate) fn new(
        call: Arc<CallHandle>,
        key: ExpertKey,
        buffer: (NonNull<u8>, usize, u32),
        kind: LeaseKind,
        ready: bool,
    ) -> Lease {
        let state = if ready { READY } else { PENDING };
        let (ptr, len, buffer_index) = buffer;
        Lease {
            call,
            key,
            ptr,
            len,
            kind,
            buffer_index,
            filled: false,
            hit_state: AtomicU8::new(state),
        }
    }

    /// The expert this lease is for.
    pub fn key(&self) -> ExpertKey {
        self.key
    }

    /// The session whose call holds the lease.
    pub fn session(&self) -> SessionId {
        self.call.session
    }

    /// The call the lease belongs to.
    pub fn call_id(&self) -> CallId {
        self.call.call
    }

    /// The lease's buffer among the cache's buffers: resident slot `i` is `i`, transient
    /// buffer `b` is `n_slots + b` — the index [`super::ExpertCache::buffers`] lists it at (the
    /// registered-buffer index if they are registered with io_uring in that order).
    pub fn buffer_index(&self) -> u32 {
        self.buffer_index
    }

    /// Whether the expert was resident (or being read by an earlier call): no read needed.
    pub fn is_hit(&self) -> bool {
        matches!(self.kind, LeaseKind::Hit { .. })
    }

    /// Whether the lease lends a transient buffer (a miss that will not be cached).
    pub fn is_transient(&self) -> bool {
        self.kind == LeaseKind::Transient
    }

    /// Whether this lease is a miss still waiting for its read and `mark_filled`.
    pub fn needs_fill(&self) -> bool {
        !self.is_hit() && !self.filled
    }

    /// Whether [`Lease::bytes`] would return the expert without waiting: a filled miss, or a
    /// hit whose read has completed (as last observed).
    pub fn is_ready(&self) -> bool {
        match self.kind {
            LeaseKind::Hit { .. } => self.hit_state.load(Ordering::Acquire) == READY,
            LeaseKind::Miss { .. } | LeaseKind::Transient => self.filled,
        }
    }

    /// The whole buffer (`slot_bytes` long, 4096-aligned). For a hit this blocks until the
    /// reading call marks it filled, and is empty if that read was abandoned
    /// ([`Acquired::wait_ready`] reports why). For a miss it is whatever the buffer holds:
    /// the expert after a successful read, stale bytes before.
    pub fn bytes(&self) -> &[u8] {
        if let LeaseKind::Hit { .. } = self.kind
            && self.wait(None).is_err()
        {
            return &[];
        }
        // SAFETY: `ptr..ptr + len` is this lease's slot in the live arena, and no writer
        // exists while `&self` is held (module doc, "Access rules").
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The buffer to read a miss into (`slot_bytes` long, 4096-aligned: fit for `O_DIRECT`).
    ///
    /// # Panics
    ///
    /// If the lease is a hit or was already marked filled: other calls may be reading it.
    pub fn buffer_mut(&mut self) -> &mut [u8] {
        assert!(
            self.needs_fill(),
            "buffer_mut on {:?} lease of {}, which is not an unfilled miss",
            self.kind,
            self.key
        );
        // SAFETY: an unfilled miss is the only lease that may touch its buffer (the slot is
        // `Filling` and pinned by this call, or the transient buffer is held by this lease
        // alone), and `&mut self` excludes every other borrow of this lease.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Declares the miss's buffer holds the verified expert: it becomes a cache entry that
    /// other calls may hit (transient buffers stay private). Call it only after a successful,
    /// checked read; no-op for a hit or a second call.
    pub fn mark_filled(&mut self) {
        if self.filled || self.is_hit() {
            return;
        }
        self.filled = true;
        if let LeaseKind::Miss { slot } = self.kind {
            let shared = &self.call.shared;
            let mut st = lock(&shared.state);
            st.planner.mark_filled(slot);
            let wake = st.waiters > 0;
            drop(st);
            if wake {
                shared.filled.notify_all();
            }
        }
    }

    /// Blocks until a hit's bytes are ready; `Ok` at once for a miss (its read is the
    /// caller's own). [`CacheError::FillFailed`] if the reading call abandoned its read.
    pub fn wait_ready(&self) -> Result<(), CacheError> {
        self.wait(None)
    }

    fn wait(&self, deadline: Option<Instant>) -> Result<(), CacheError> {
        let LeaseKind::Hit { slot } = self.kind else {
            return Ok(());
        };
        match self.hit_state.load(Ordering::Acquire) {
            READY => return Ok(()),
            FAILED => return Err(CacheError::FillFailed { key: self.key }),
            _ => {}
        }
        let shared = &self.call.shared;
        let mut st = lock(&shared.state);
        loop {
            match st.planner.fill_state(slot) {
                FillState::Filled => {
                    self.hit_state.store(READY, Ordering::Release);
                    return Ok(());
                }
                // `Free` cannot happen while this lease pins the slot; treat it as a failure.
                FillState::Failed | FillState::Free => {
                    self.hit_state.store(FAILED, Ordering::Release);
                    return Err(CacheError::FillFailed { key: self.key });
                }
                FillState::Filling => {}
            }
            let timeout = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Err(CacheError::FillTimeout { key: self.key }),
                },
            };
            st.waiters += 1;
            st = match timeout {
                None => shared
                    .filled
                    .wait(st)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(left) => {
                    shared
                        .filled
                        .wait_timeout(st, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
            st.waiters -= 1;
        }
    }
}

/// One call's leases, in the order of the keys passed to `acquire`.
#[derive(Debug)]
pub struct Acquired {
    pub(crate) leases: Vec<Lease>,
    pub(crate) call: CallId,
    pub(crate) hits: u32,
    pub(crate) misses: u32,
    pub(crate) transient: u32,
    pub(crate) evictions: u32,
}

impl Acquired {
    /// The call's number (as in the route trace).
    pub fn call_id(&self) -> CallId {
        self.call
    }

    /// Leases, in key order.
    pub fn leases(&self) -> &[Lease] {
        &self.leases
    }

    /// Leases, in key order, mutably (to fill misses in any order or in parallel).
    pub fn leases_mut(&mut self) -> &mut [Lease] {
        &mut self.leases
    }

    /// The leases that still need a read: misses not yet marked filled, in key order.
    pub fn misses(&mut self) -> impl Iterator<Item = &mut Lease> + '_ {
        self.leases.iter_mut().filter(|l| l.needs_fill())
    }

    /// The leases, taking them out of the call (the pins last until the last one drops).
    pub fn into_leases(self) -> Vec<Lease> {
        self.leases
    }

    /// Experts that were resident when acquired.
    pub fn n_hits(&self) -> u32 {
        self.hits
    }

    /// Experts that needed a read when acquired (transient ones included).
    pub fn n_misses(&self) -> u32 {
        self.misses
    }

    /// Misses served by a transient buffer.
    pub fn n_transient(&self) -> u32 {
        self.transient
    }

    /// Entries the call evicted.
    pub fn n_evictions(&self) -> u32 {
        self.evictions
    }

    /// Blocks until every hit's bytes are ready (reads by earlier calls). Call it after filling
    /// this call's own misses and before computing; the first abandoned read is reported as
    /// [`CacheError::FillFailed`].
    pub fn wait_ready(&self) -> Result<(), CacheError> {
        self.leases.iter().try_for_each(|l| l.wait(None))
    }

    /// Like [`Acquired::wait_ready`], giving up with [`CacheError::FillTimeout`] after
    /// `timeout` in total.
    pub fn wait_ready_timeout(&self, timeout: Duration) -> Result<(), CacheError> {
        let deadline = Instant::now() + timeout;
        self.leases.iter().try_for_each(|l| l.wait(Some(deadline)))
    }
}
