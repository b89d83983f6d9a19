//! [`Planner`]: the expert cache's pure decision core. It knows which expert sits in which slot,
//! which slots are pinned by which calls, and the policy order of the rest, and decides for
//! each acquire call what is a hit, which slot each miss is read into, which entry is evicted
//! and when a transient buffer must serve — without touching a single buffer. The live cache
//! ([`super::ExpertCache`]) runs it under a mutex next to the arena; `expertd replay` runs it
//! alone over a route trace. Because it is deterministic (no clocks, no randomness, no
//! iteration over hash maps where order could matter), the same sequence of operations gives
//! the same decisions and counters in both.
//!
//! The decision-relevant operations are [`Planner::acquire`], [`Planner::release`] and
//! [`Planner::release_session`]; each appends one event to the journal when journaling is on.
//! [`Planner::mark_filled`] only records that a read completed; the release event lists the
//! reads that did not, which is all a replay needs.

/// An invariant of the planner's bookkeeping, checked in debug builds and in this crate's unit
/// tests (which run on the release profile, where `debug_assert!` would be compiled out).
macro_rules! invariant {
    ($($arg:tt)*) => {
        if cfg!(any(debug_assertions, test)) {
            assert!($($arg)*);
        }
    };
}

use super::policy::{EvictKey, Policy};
use super::stats::{CacheStats, Counters, SessionStats};
use super::{CacheConfig, CacheError, ExpertKey, SessionId};
use crate::trace::{AcquireEvent, ReleaseEvent, ReleaseSessionEvent, TraceEvent};
use shared::ids::{ExpertId, LayerId};
use std::collections::{BTreeSet, HashMap};

/// A successful acquire call's number: successful calls are numbered from 0 in the order the
/// planner accepted them (the route trace's `call`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallId(pub u64);

/// Where one key of a call is served from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The expert is resident in `slot`; `ready` is false while another call's read into it is
    /// still in flight.
    Hit {
        /// Resident slot index.
        slot: u32,
        /// Whether the slot's read had completed when the call was planned.
        ready: bool,
    },
    /// The expert must be read into resident `slot`; `evicted` is the entry the slot held.
    Miss {
        /// Resident slot index.
        slot: u32,
        /// The victim evicted to free the slot, if it was not free already.
        evicted: Option<ExpertKey>,
    },
    /// The expert must be read into transient buffer `buffer` and is not cached.
    Transient {
        /// Index into the transient pool.
        buffer: u32,
    },
}

impl Placement {
    /// Whether the expert was resident.
    pub fn is_hit(self) -> bool {
        matches!(self, Placement::Hit { .. })
    }
}

/// The planner's answer to one acquire call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The call's number.
    pub call: CallId,
    /// One placement per key, in key order.
    pub placements: Vec<Placement>,
    /// Keys that were resident.
    pub hits: u32,
    /// Keys that need a read (slot misses and transient ones).
    pub misses: u32,
    /// Misses served by a transient buffer.
    pub transient: u32,
    /// Entries evicted for this call.
    pub evictions: u32,
}

/// The state of a resident slot's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FillState {
    /// Holds nothing.
    Free,
    /// A call's read into the slot is in flight; the slot is pinned by that call.
    Filling,
    /// The read completed; the bytes are the expert's.
    Filled,
    /// The read was abandoned while other calls held leases on the slot; those calls see a
    /// failed fill, and the slot becomes free when their pins drop.
    Failed,
}

struct Slot {
    key: Option<ExpertKey>,
    fill: FillState,
    pins: u32,
    count: u64,
    last_use: u64,
    /// The slot's key in `evictable`, present exactly when it is `Filled` and unpinned.
    evict_key: Option<EvictKey>,
}

struct CallRecord {
    session: SessionId,
    layer: LayerId,
    experts: Vec<ExpertId>,
    placements: Vec<Placement>,
    /// The session was closed by `release_session` while the call was live.
    orphaned: bool,
}

#[derive(Default)]
struct SessionState {
    stats: SessionStats,
    calls: BTreeSet<CallId>,
    last_layer: Option<LayerId>,
    inferred_step: u64,
}

#[derive(Default)]
struct LayerState {
    /// Successful calls for this layer (the `lfu-aging` halving clock).
    calls: u64,
    /// Resident slots holding this layer's experts (`Filling` or `Filled`).
    slots: BTreeSet<u32>,
}

/// The expert cache's decision core; see the module doc.
pub struct Planner {
    policy: Policy,
    budget_bytes: u64,
    slot_bytes: u64,
    n_transient: u32,
    slots: Vec<Slot>,
    /// Free resident slots, used as a stack (lowest index first at the start).
    free: Vec<u32>,
    /// Unpinned `Filled` slots in victim order (smallest first) [invariant 2].
    evictable: BTreeSet<EvictKey>,
    /// Which slot holds which expert (`Filling` or `Filled` only) [invariant 6].
    index: HashMap<ExpertKey, u32>,
    layers: HashMap<LayerId, LayerState>,
    transient_free: Vec<u32>,
    calls: HashMap<CallId, CallRecord>,
    sessions: HashMap<SessionId, SessionState>,
    /// Cumulative counters of closed sessions [invariant 8].
    closed: SessionStats,
    counters: Counters,
    next_call: u64,
    /// Global use clock: advances once per key of every successful call.
    tick: u64,
    journal: Option<Vec<TraceEvent>>,
    started: bool,
    /// Sessions must be opened before their calls ([`Planner::open_session`]).
    explicit_sessions: bool,
}

/// Keys of one call: all of one layer, distinct, at least one. Returns the layer.
fn validate(keys: &[ExpertKey]) -> Result<LayerId, CacheError> {
    let first = keys.first().ok_or(CacheError::EmptyCall)?;
    for (i, k) in keys.iter().enumerate() {
        if k.layer != first.layer {
            return Err(CacheError::MixedLayers {
                first: first.layer,
                other: k.layer,
            });
        }
        // A MoE call names top-k experts (8 for Qwen3.6): the quadratic scan is cheaper than
        // hashing and allocates nothing.
        if keys[..i].contains(k) {
            return Err(CacheError::DuplicateKey { key: *k });
        }
    }
    Ok(first.layer)
}

impl Planner {
    /// A planner for `budget_bytes / slot_bytes` resident slots and `transient_slots`
    /// transient buffers; everything free.
    pub fn new(config: &CacheConfig, slot_bytes: u64) -> Planner {
        let n_slots = config
            .budget_bytes
            .checked_div(slot_bytes)
            .unwrap_or(0)
            .min(u64::from(u32::MAX)) as u32;
        let slots = (0..n_slots)
            .map(|_| Slot {
                key: None,
                fill: FillState::Free,
                pins: 0,
                count: 0,
                last_use: 0,
                evict_key: None,
            })
            .collect();
        Planner {
            policy: config.policy,
            budget_bytes: config.budget_bytes,
            slot_bytes,
            n_transient: config.transient_slots,
            slots,
            free: (0..n_slots).rev().collect(),
            evictable: BTreeSet::new(),
            index: HashMap::new(),
            layers: HashMap::new(),
            transient_free: (0..config.transient_slots).rev().collect(),
            calls: HashMap::new(),
            sessions: HashMap::new(),
            closed: SessionStats::default(),
            counters: Counters::default(),
            next_call: 0,
            tick: 0,
            journal: None,
            started: false,
            explicit_sessions: false,
        }
    }

    /// Resident slots.
    pub fn n_slots(&self) -> u32 {
        self.slots.len() as u32
    }

    /// The policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Whether any operation has been processed (a trace must start before the first).
    pub fn has_started(&self) -> bool {
        self.started
    }

    /// Turns the journal on or off (off drops what it held).
    pub fn set_journal(&mut self, on: bool) {
        self.journal = if on {
            Some(self.journal.take().unwrap_or_default())
        } else {
            None
        };
    }

    /// Moves the journaled events into `into` (which must be empty) in O(1): the two vectors
    /// are swapped, so the journal keeps `into`'s allocation.
    pub fn take_journal(&mut self, into: &mut Vec<TraceEvent>) {
        invariant!(into.is_empty());
        if let Some(j) = &mut self.journal {
            std::mem::swap(j, into);
        }
    }

    /// Events journaled and not yet taken.
    pub fn journal_len(&self) -> usize {
        self.journal.as_ref().map_or(0, Vec::len)
    }

    fn record(&mut self, ev: impl FnOnce() -> TraceEvent) {
        if let Some(j) = &mut self.journal {
            j.push(ev());
        }
    }

    /// Plans one MoE-layer call of `session`: all keys of one layer, distinct. `step` is the
    /// session's step (token) for the route trace; `None` infers it: a session's step starts
    /// at 0 and advances whenever a call's layer is not above the session's previous call's.
    ///
    /// Hits are pinned first; then each miss, in key order, takes a free slot, else the
    /// policy's victim among unpinned read entries, else a transient buffer. If the misses
    /// cannot all be placed the call is refused with [`CacheError::Exhausted`] and nothing
    /// changes but the `exhausted` counter.
    pub fn acquire(
        &mut self,
        session: SessionId,
        step: Option<u64>,
        keys: &[ExpertKey],
    ) -> Result<Plan, CacheError> {
        let layer = validate(keys)?;
        if self.explicit_sessions && !self.sessions.contains_key(&session) {
            return Err(CacheError::UnknownSession { session: session.0 });
        }
        self.started = true;
        let sess = self.sessions.entry(session).or_default();
        let inferred = match sess.last_layer {
            Some(prev) if layer <= prev => sess.inferred_step + 1,
            _ => sess.inferred_step,
        };
        sess.inferred_step = inferred;
        sess.last_layer = Some(layer);
        let step = step.unwrap_or(inferred);

        // Feasibility first, so that a refused call changes nothing.
        let n = keys.len();
        let (mut hits, mut hits_evictable) = (0usize, 0usize);
        for k in keys {
            if let Some(&s) = self.index.get(k) {
                hits += 1;
                hits_evictable += usize::from(self.slots[s as usize].evict_key.is_some());
            }
        }
        let misses = n - hits;
        let slot_capacity = self.free.len() + self.evictable.len() - hits_evictable;
        let transient = misses.saturating_sub(slot_capacity);
        if transient > self.transient_free.len() {
            self.counters.totals.exhausted += 1;
            self.record(|| {
                TraceEvent::Acquire(AcquireEvent {
                    session: session.0,
                    step,
                    layer,
                    experts: keys.iter().map(|k| k.expert).collect(),
                    hits: 0,
                    misses: 0,
                    call: None,
                    transient: 0,
                    evictions: 0,
                    exhausted: true,
                })
            });
            return Err(CacheError::Exhausted {
                layer,
                misses: misses as u32,
                slots_available: slot_capacity as u32,
                transient_free: self.transient_free.len() as u32,
                n_slots: self.n_slots(),
                transient_slots: self.n_transient,
            });
        }

        // The layer's aging clock: the halving-period-th call halves before it counts.
        let ls = self.layers.entry(layer).or_default();
        if self.policy.halves_before_call(ls.calls) {
            for &s in &ls.slots {
                let slot = &mut self.slots[s as usize];
                slot.count >>= 1;
                if let Some(old) = slot.evict_key {
                    self.evictable.remove(&old);
                    let new = self.policy.evict_key(slot.count, slot.last_use, s);
                    self.evictable.insert(new);
                    slot.evict_key = Some(new);
                }
            }
        }
        ls.calls += 1;

        let call = CallId(self.next_call);
        self.next_call += 1;
        let base_tick = self.tick;
        self.tick += n as u64;
        let mut placements = Vec::with_capacity(n);
        // Pin every hit before choosing any victim, so no hit of this call is evicted by it.
        for (i, k) in keys.iter().enumerate() {
            placements.push(match self.index.get(k) {
                Some(&s) => {
                    self.pin(s);
                    let slot = &mut self.slots[s as usize];
                    slot.last_use = base_tick + i as u64;
                    slot.count = slot.count.saturating_add(1);
                    Placement::Hit {
                        slot: s,
                        ready: slot.fill == FillState::Filled,
                    }
                }
                // Placeholder, replaced in the loop below.
                None => Placement::Transient { buffer: u32::MAX },
            });
        }
        let mut evictions = 0u32;
        for (i, k) in keys.iter().enumerate() {
            if placements[i].is_hit() {
                continue;
            }
            placements[i] = if let Some(s) = self.free.pop() {
                self.install(s, *k, base_tick + i as u64);
                Placement::Miss {
                    slot: s,
                    evicted: None,
                }
            } else if let Some(victim) = self.evictable.pop_first() {
                let s = victim.2;
                let slot = &mut self.slots[s as usize];
                slot.evict_key = None;
                let old = slot.key.take();
                if let Some(old) = old {
                    self.index.remove(&old);
                    if let Some(l) = self.layers.get_mut(&old.layer) {
                        l.slots.remove(&s);
                    }
                }
                evictions += 1;
                self.install(s, *k, base_tick + i as u64);
                Placement::Miss {
                    slot: s,
                    evicted: old,
                }
            } else {
                // The feasibility check reserved enough transient buffers.
                let buffer = self.transient_free.pop().unwrap_or(u32::MAX);
                invariant!(buffer != u32::MAX, "transient pool checked before placing");
                Placement::Transient { buffer }
            };
        }

        let (hits, misses, transient) = (hits as u32, misses as u32, transient as u32);
        let c = &mut self.counters;
        c.totals.calls += 1;
        c.totals.keys += n as u64;
        c.totals.hits += u64::from(hits);
        c.totals.misses += u64::from(misses);
        c.totals.evictions += u64::from(evictions);
        c.totals.transient_uses += u64::from(transient);
        c.transient_in_use += u64::from(transient);
        c.leases_held += n as u64;
        let sess = self.sessions.entry(session).or_default();
        sess.stats.calls += 1;
        sess.stats.keys += n as u64;
        sess.stats.hits += u64::from(hits);
        sess.stats.misses += u64::from(misses);
        sess.stats.bytes_read += u64::from(misses) * self.slot_bytes;
        sess.stats.leases_held += n as u64;
        sess.calls.insert(call);
        let experts: Vec<ExpertId> = keys.iter().map(|k| k.expert).collect();
        self.record(|| {
            TraceEvent::Acquire(AcquireEvent {
                session: session.0,
                step,
                layer,
                experts: experts.clone(),
                hits,
                misses,
                call: Some(call.0),
                transient,
                evictions,
                exhausted: false,
            })
        });
        self.calls.insert(
            call,
            CallRecord {
                session,
                layer,
                experts,
                placements: placements.clone(),
                orphaned: false,
            },
        );
        Ok(Plan {
            call,
            placements,
            hits,
            misses,
            transient,
            evictions,
        })
    }

    /// Puts `key` into free slot `s` as a pinned read in flight.
    fn install(&mut self, s: u32, key: ExpertKey, tick: u64) {
        let slot = &mut self.slots[s as usize];
        invariant!(slot.key.is_none() && slot.pins == 0 && slot.evict_key.is_none());
        *slot = Slot {
            key: Some(key),
            fill: FillState::Filling,
            pins: 1,
            count: 1,
            last_use: tick,
            evict_key: None,
        };
        self.counters.slots_leased += 1;
        self.index.insert(key, s);
        self.layers.entry(key.layer).or_default().slots.insert(s);
    }

    fn pin(&mut self, s: u32) {
        let slot = &mut self.slots[s as usize];
        if slot.pins == 0 {
            if let Some(k) = slot.evict_key.take() {
                self.evictable.remove(&k);
            }
            self.counters.slots_leased += 1;
        }
        slot.pins += 1;
    }

    fn unpin(&mut self, s: u32) {
        let slot = &mut self.slots[s as usize];
        invariant!(slot.pins > 0, "unpinning slot {s} with no pins");
        slot.pins = slot.pins.saturating_sub(1);
        if slot.pins > 0 {
            return;
        }
        self.counters.slots_leased -= 1;
        match slot.fill {
            FillState::Filled => {
                let k = self.policy.evict_key(slot.count, slot.last_use, s);
                slot.evict_key = Some(k);
                self.evictable.insert(k);
            }
            FillState::Failed => {
                *slot = Slot {
                    key: None,
                    fill: FillState::Free,
                    pins: 0,
                    count: 0,
                    last_use: 0,
                    evict_key: None,
                };
                self.free.push(s);
            }
            // A read in flight is pinned by its call, whose release turns it into `Failed`
            // before unpinning; `Free` slots have no pins.
            FillState::Filling | FillState::Free => {
                invariant!(false, "slot {s} unpinned while {:?}", slot.fill);
            }
        }
    }

    /// Records that the read into resident slot `s` completed. Returns whether the slot was
    /// being filled (false for a repeated call).
    pub fn mark_filled(&mut self, s: u32) -> bool {
        match self.slots.get_mut(s as usize) {
            Some(slot) if slot.fill == FillState::Filling => {
                slot.fill = FillState::Filled;
                true
            }
            _ => false,
        }
    }

    /// The state of resident slot `s`'s bytes.
    pub fn fill_state(&self, s: u32) -> FillState {
        self.slots
            .get(s as usize)
            .map_or(FillState::Free, |slot| slot.fill)
    }

    /// Ends `call`: every read of its misses that was not marked filled is abandoned (the
    /// slot leaves the index and is freed, or marked `Failed` while other calls still pin
    /// it), then every pin and transient buffer of the call is released. Returns how many
    /// reads were abandoned; 0 also for an unknown call.
    pub fn release(&mut self, call: CallId) -> u32 {
        let Some(rec) = self.calls.remove(&call) else {
            invariant!(false, "release of unknown call {call:?}");
            return 0;
        };
        let mut unfilled = Vec::new();
        for (p, &expert) in rec.placements.iter().zip(&rec.experts) {
            if let Placement::Miss { slot: s, .. } = *p {
                let slot = &mut self.slots[s as usize];
                if slot.fill == FillState::Filling {
                    slot.fill = FillState::Failed;
                    if let Some(key) = slot.key.take() {
                        self.index.remove(&key);
                        if let Some(l) = self.layers.get_mut(&key.layer) {
                            l.slots.remove(&s);
                        }
                    }
                    self.counters.totals.fill_failures += 1;
                    unfilled.push(expert);
                }
            }
        }
        for p in &rec.placements {
            match *p {
                Placement::Hit { slot, .. } | Placement::Miss { slot, .. } => self.unpin(slot),
                Placement::Transient { buffer } => {
                    self.transient_free.push(buffer);
                    self.counters.transient_in_use -= 1;
                }
            }
        }
        let n = rec.placements.len() as u64;
        self.counters.leases_held -= n;
        if rec.orphaned {
            self.counters.leases_orphaned -= n;
        } else if let Some(sess) = self.sessions.get_mut(&rec.session) {
            sess.stats.leases_held -= n;
            sess.calls.remove(&call);
        }
        let n_unfilled = unfilled.len() as u32;
        self.record(|| {
            TraceEvent::Release(ReleaseEvent {
                session: rec.session.0,
                layer: rec.layer,
                call: call.0,
                unfilled,
            })
        });
        n_unfilled
    }

    /// Requires sessions to be opened before their calls (see
    /// `ExpertCache::require_open_sessions`).
    pub fn require_open_sessions(&mut self) {
        self.explicit_sessions = true;
    }

    /// Opens `session` (idempotent).
    pub fn open_session(&mut self, session: SessionId) {
        self.sessions.entry(session).or_default();
    }

    /// Closes `session`: its cumulative counters move to the closed totals and the leases of
    /// its live calls become orphaned (still pinned until their calls are released). Returns
    /// the session's final counters (`leases_held` = the leases orphaned), or `None` if the
    /// session had no entry.
    pub fn release_session(&mut self, session: SessionId) -> Option<SessionStats> {
        self.started = true;
        let closed = self.sessions.remove(&session);
        let mut orphaned = 0u64;
        if let Some(st) = &closed {
            for c in &st.calls {
                if let Some(rec) = self.calls.get_mut(c) {
                    rec.orphaned = true;
                    orphaned += rec.placements.len() as u64;
                }
            }
            self.counters.leases_orphaned += orphaned;
            self.closed.add_totals(&st.stats);
        }
        self.record(|| {
            TraceEvent::ReleaseSession(ReleaseSessionEvent {
                session: session.0,
                orphaned,
            })
        });
        closed.map(|st| SessionStats {
            leases_held: orphaned,
            ..st.stats
        })
    }

    /// The call's placements and experts, while it is live.
    pub fn call_placements(&self, call: CallId) -> Option<(&[Placement], &[ExpertId])> {
        self.calls
            .get(&call)
            .map(|r| (r.placements.as_slice(), r.experts.as_slice()))
    }

    /// A snapshot of the global counters.
    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        let slots_used = (self.slots.len() - self.free.len()) as u64;
        CacheStats {
            budget_bytes: self.budget_bytes,
            slot_bytes: self.slot_bytes,
            n_slots: self.slots.len() as u64,
            transient_slots: u64::from(self.n_transient),
            totals: c.totals,
            bytes_read: c.totals.misses * self.slot_bytes,
            slots_used,
            slots_leased: c.slots_leased,
            resident_bytes: slots_used * self.slot_bytes,
            leases_held: c.leases_held,
            leases_orphaned: c.leases_orphaned,
            transient_in_use: c.transient_in_use,
            sessions_open: self.sessions.len() as u64,
        }
    }

    /// One open session's counters.
    pub fn session_stats(&self, session: SessionId) -> Option<SessionStats> {
        self.sessions.get(&session).map(|s| s.stats)
    }

    /// Every open session's counters, by session id.
    pub fn sessions(&self) -> Vec<(SessionId, SessionStats)> {
        let mut v: Vec<_> = self.sessions.iter().map(|(id, s)| (*id, s.stats)).collect();
        v.sort_by_key(|(id, _)| *id);
        v
    }

    /// The expert resident slot `s` holds, if any (for tests and debugging).
    pub fn slot_key(&self, s: u32) -> Option<ExpertKey> {
        self.slots.get(s as usize).and_then(|slot| slot.key)
    }

    /// Whether `key` is resident (read or being read).
    pub fn contains(&self, key: ExpertKey) -> bool {
        self.index.contains_key(&key)
    }

    /// Checks every invariant of [`super::stats`] from scratch; the first violation found is
    /// returned as a sentence. Linear in slots and live calls: for tests.
    pub fn check_invariants(&self) -> Result<(), String> {
        super::invariants::check(self)
    }
}

/// Read access for `super::invariants`, which lives in its own file to keep this one short.
pub(super) struct View<'a> {
    /// The planner being checked.
    pub planner: &'a Planner,
}

impl View<'_> {
    /// The byte budget.
    pub(super) fn budget_bytes(&self) -> u64 {
        self.planner.budget_bytes
    }
    /// Bytes of one slot.
    pub(super) fn slot_bytes(&self) -> u64 {
        self.planner.slot_bytes
    }
    /// Transient buffers.
    pub(super) fn n_transient(&self) -> u32 {
        self.planner.n_transient
    }
    /// Per slot: (key, fill, pins, count, last_use, evict_key).
    pub(super) fn slots(
        &self,
    ) -> impl Iterator<
        Item = (
            Option<ExpertKey>,
            FillState,
            u32,
            u64,
            u64,
            Option<EvictKey>,
        ),
    > + '_ {
        self.planner
            .slots
            .iter()
            .map(|s| (s.key, s.fill, s.pins, s.count, s.last_use, s.evict_key))
    }
    /// The free-slot stack.
    pub(super) fn free(&self) -> &[u32] {
        &self.planner.free
    }
    /// The eviction order.
    pub(super) fn evictable(&self) -> &BTreeSet<EvictKey> {
        &self.planner.evictable
    }
    /// The key index.
    pub(super) fn index(&self) -> &HashMap<ExpertKey, u32> {
        &self.planner.index
    }
    /// Per layer: the slots holding its experts.
    pub(super) fn layer_slots(&self) -> impl Iterator<Item = (LayerId, &BTreeSet<u32>)> + '_ {
        self.planner.layers.iter().map(|(l, s)| (*l, &s.slots))
    }
    /// The free transient buffers.
    pub(super) fn transient_free(&self) -> &[u32] {
        &self.planner.transient_free
    }
    /// Per live call: (id, session, orphaned, placements).
    pub(super) fn calls(
        &self,
    ) -> impl Iterator<Item = (CallId, SessionId, bool, &[Placement])> + '_ {
        self.planner
            .calls
            .iter()
            .map(|(id, r)| (*id, r.session, r.orphaned, r.placements.as_slice()))
    }
    /// Per open session: (id, stats, live call ids).
    pub(super) fn sessions(
        &self,
    ) -> impl Iterator<Item = (SessionId, &SessionStats, &BTreeSet<CallId>)> + '_ {
        self.planner
            .sessions
            .iter()
            .map(|(id, s)| (*id, &s.stats, &s.calls))
    }
    /// Cumulative counters of closed sessions.
    pub(super) fn closed(&self) -> &SessionStats {
        &self.planner.closed
    }
    /// The global counters.
    pub(super) fn counters(&self) -> &Counters {
        &self.planner.counters
    }
}
