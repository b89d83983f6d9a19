//! The cache's counters — global and per session — and the budget and lease invariants they
//! enforce. Owns the counter types and their snapshots ([`CacheStats`], [`SessionStats`]); the
//! planner ([`super::planner`]) updates them and checks the invariants in
//! `Planner::check_invariants`.
//!
//! # Invariants
//!
//! The numbers refer to the fields of `Counters` and to the planner's structures; every one
//! holds whenever the planner's mutex is free, and `ExpertCache::debug_invariants` checks all
//! of them.
//!
//! 1. **Budget.** `resident_bytes = slots_used × slot_bytes ≤ n_slots × slot_bytes ≤
//!    budget_bytes`: `n_slots` is `budget_bytes / slot_bytes`, fixed at construction, and a
//!    miss only ever takes a free slot or the slot of the victim it evicts. Transient buffers
//!    are a separate, bounded pool (`transient_slots × slot_bytes`) and never hold a cached
//!    entry.
//! 2. **Pinned slots are never victims.** The eviction order holds exactly the slots whose
//!    read completed (`Filled`) and whose pin count is 0; victims are taken only from it. A slot
//!    with a read in flight is pinned by the call reading it.
//! 3. **Lease accounting.** `leases_held = Σ open sessions' leases_held + leases_orphaned =
//!    Σ live calls' lease counts`, and every resident slot's pin count equals the number of
//!    live leases placed on it.
//! 4. **Closed sessions hold nothing.** After `release_session(s)`, `s` has no session entry
//!    and holds 0 leases; its live calls count as orphaned until their guards drop (their
//!    slots stay pinned until then, because a guard may still be lending out its bytes).
//! 5. **Slot partition.** Every resident slot is exactly one of: free, evictable (`Filled`,
//!    unpinned), or pinned (`Filling`, `Filled` or `Failed` with pins > 0); `slots_used =
//!    n_slots − free` and `slots_leased` counts the pinned ones.
//! 6. **Index agreement.** The key index maps `k → s` exactly when slot `s` holds `k` and is
//!    `Filling` or `Filled`; a `Failed` slot (its read was abandoned while other calls waited
//!    on it) is in no index and becomes free when its last pin drops.
//! 7. **Transient pool.** `transient_in_use + free transient buffers = transient_slots`, and
//!    each buffer in use belongs to exactly one live lease.
//! 8. **Sums.** `keys = hits + misses`, `bytes_read = misses × slot_bytes`, and for `calls`,
//!    `keys`, `hits`, `misses`, `bytes_read`: global = Σ open sessions + Σ closed sessions.

use serde::{Deserialize, Serialize};

/// One session's counters, as [`crate::cache::ExpertCache::session_stats`] reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionStats {
    /// Successful acquire calls (one per MoE layer call).
    pub calls: u64,
    /// Experts named by those calls.
    pub keys: u64,
    /// Experts that were resident (or being read by another call) when acquired.
    pub hits: u64,
    /// Experts that needed a read (into a cache slot or a transient buffer).
    pub misses: u64,
    /// `misses × slot_bytes`: bytes the reads of those misses bring in.
    pub bytes_read: u64,
    /// Leases this session holds now.
    pub leases_held: u64,
}

impl SessionStats {
    /// Adds `other`'s cumulative counters (not `leases_held`) into `self`.
    pub(crate) fn add_totals(&mut self, other: &SessionStats) {
        self.calls += other.calls;
        self.keys += other.keys;
        self.hits += other.hits;
        self.misses += other.misses;
        self.bytes_read += other.bytes_read;
    }
}

/// The planner's cumulative decisions [8]: part of its global `Counters`, reported in
/// [`CacheStats`] and by `expertd replay` in [`ReplayResult`](crate::replay::ReplayResult)
/// (flattened in both: each field stays one key of the JSON).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanTotals {
    /// Successful acquire calls [8].
    pub calls: u64,
    /// Experts named by successful calls [8].
    pub keys: u64,
    /// Experts resident (or being read by another call) when acquired [8].
    pub hits: u64,
    /// Experts that needed a read (into a cache slot or a transient buffer) [8].
    pub misses: u64,
    /// Entries evicted to make room for a miss [2].
    pub evictions: u64,
    /// Misses served by a transient buffer because every evictable slot was leased [7].
    pub transient_uses: u64,
    /// Calls refused with `CacheError::Exhausted` (every slot leased and the transient pool
    /// empty); they changed nothing else.
    pub exhausted: u64,
    /// Reads abandoned: a miss lease dropped without `mark_filled` (the slot was freed again) [6].
    pub fill_failures: u64,
}

impl PlanTotals {
    /// `hits / keys`, or 0 before the first call.
    pub fn hit_rate(&self) -> f64 {
        if self.keys == 0 {
            0.0
        } else {
            self.hits as f64 / self.keys as f64
        }
    }
}

/// The global counters the planner maintains; see the module doc for the invariants they
/// enforce (numbers in brackets).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    /// The cumulative decisions.
    pub totals: PlanTotals,
    /// Leases held by live calls [3].
    pub leases_held: u64,
    /// Leases of calls whose session was closed by `release_session` [3][4].
    pub leases_orphaned: u64,
    /// Transient buffers held by live leases [7].
    pub transient_in_use: u64,
    /// Resident slots pinned by at least one live lease [5].
    pub slots_leased: u64,
}

/// A snapshot of the cache's global counters and occupancy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheStats {
    /// The configured byte budget for resident experts.
    pub budget_bytes: u64,
    /// Bytes of one slot (the container's blob stride).
    pub slot_bytes: u64,
    /// Resident slots: `budget_bytes / slot_bytes`.
    pub n_slots: u64,
    /// Size of the transient pool, in buffers of `slot_bytes`.
    pub transient_slots: u64,
    /// The planner's cumulative decisions.
    #[serde(flatten)]
    pub totals: PlanTotals,
    /// `misses × slot_bytes`.
    pub bytes_read: u64,
    /// Resident slots holding an entry (read, being read, or abandoned but still pinned).
    pub slots_used: u64,
    /// Resident slots pinned by a live lease.
    pub slots_leased: u64,
    /// `slots_used × slot_bytes`; never above `budget_bytes`.
    pub resident_bytes: u64,
    /// Leases held by live calls, orphaned ones included.
    pub leases_held: u64,
    /// Leases of calls whose session was closed by `release_session`.
    pub leases_orphaned: u64,
    /// Transient buffers in use.
    pub transient_in_use: u64,
    /// Sessions with an entry (opened, or seen by an acquire, and not closed).
    pub sessions_open: u64,
}
