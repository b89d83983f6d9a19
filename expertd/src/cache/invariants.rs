//! The from-scratch check of the cache invariants numbered in [`super::stats`]: recomputes
//! every counter and structure relation from the planner's raw state and names the first one
//! that disagrees. Used by tests through `ExpertCache::debug_invariants` and
//! `Planner::check_invariants`; owns no state.

use super::planner::{FillState, Placement, Planner, View};
use std::collections::HashMap;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

/// Checks invariants 1–8 of [`super::stats`].
pub(super) fn check(planner: &Planner) -> Result<(), String> {
    let v = View { planner };
    let c = *v.counters();
    let slots: Vec<_> = v.slots().collect();
    let n_slots = slots.len() as u64;

    // 1. Budget.
    ensure!(
        n_slots * v.slot_bytes() <= v.budget_bytes(),
        "(1) {n_slots} slots × {} bytes exceed the budget of {} bytes",
        v.slot_bytes(),
        v.budget_bytes()
    );

    // Pins implied by the live calls, per slot, and transient buffers in use.
    let mut pins_by_calls = vec![0u32; slots.len()];
    let mut transient_used = vec![false; v.n_transient() as usize];
    let (mut leases, mut orphaned_leases) = (0u64, 0u64);
    for (id, session, orphaned, placements) in v.calls() {
        leases += placements.len() as u64;
        if orphaned {
            orphaned_leases += placements.len() as u64;
        } else {
            let owner = v.sessions().find(|(s, _, _)| *s == session);
            ensure!(
                owner.is_some_and(|(_, _, calls)| calls.contains(&id)),
                "(3) live call {id:?} is not listed by its open session {session:?}"
            );
        }
        for p in placements {
            match *p {
                Placement::Hit { slot, .. } | Placement::Miss { slot, .. } => {
                    ensure!(
                        (slot as usize) < slots.len(),
                        "call {id:?} names slot {slot} of {n_slots}"
                    );
                    pins_by_calls[slot as usize] += 1;
                }
                Placement::Transient { buffer } => {
                    let b = buffer as usize;
                    ensure!(
                        b < transient_used.len() && !transient_used[b],
                        "(7) transient buffer {buffer} is out of range or held twice"
                    );
                    transient_used[b] = true;
                }
            }
        }
    }

    // 5. Slot partition, 2. pinned slots are not evictable, 6. index agreement.
    let mut is_free = vec![false; slots.len()];
    for &s in v.free() {
        ensure!(
            (s as usize) < slots.len() && !is_free[s as usize],
            "(5) free list holds slot {s} twice or out of range"
        );
        is_free[s as usize] = true;
    }
    let (mut leased, mut evictable, mut indexed) = (0u64, 0usize, 0usize);
    for (s, &(key, fill, pins, count, last_use, evict_key)) in slots.iter().enumerate() {
        let s32 = s as u32;
        ensure!(
            pins == pins_by_calls[s],
            "(3) slot {s} has {pins} pins but {} live leases",
            pins_by_calls[s]
        );
        if is_free[s] {
            ensure!(
                key.is_none() && fill == FillState::Free && pins == 0 && evict_key.is_none(),
                "(5) free slot {s} is {fill:?} with {pins} pins"
            );
            continue;
        }
        ensure!(
            fill != FillState::Free,
            "(5) slot {s} is Free but not on the free list"
        );
        leased += u64::from(pins > 0);
        match (pins, fill) {
            (0, FillState::Filled) => {
                let want = planner.policy().evict_key(count, last_use, s32);
                ensure!(
                    evict_key == Some(want) && v.evictable().contains(&want),
                    "(2) unpinned filled slot {s} is not in the eviction order under its key"
                );
                evictable += 1;
            }
            (0, other) => return Err(format!("(5) unpinned slot {s} is {other:?}")),
            (_, _) => ensure!(
                evict_key.is_none(),
                "(2) pinned slot {s} has an eviction key"
            ),
        }
        match fill {
            FillState::Filling | FillState::Filled => {
                let Some(k) = key else {
                    return Err(format!("(6) slot {s} is {fill:?} without a key"));
                };
                ensure!(
                    v.index().get(&k) == Some(&s32),
                    "(6) slot {s} holds {k} but the index says {:?}",
                    v.index().get(&k)
                );
                indexed += 1;
            }
            FillState::Failed => ensure!(
                key.is_none_or(|k| v.index().get(&k) != Some(&s32)),
                "(6) failed slot {s} is still indexed"
            ),
            FillState::Free => {}
        }
    }
    ensure!(
        v.evictable().len() == evictable,
        "(2) eviction order holds {} keys, {evictable} slots are evictable",
        v.evictable().len()
    );
    ensure!(
        v.index().len() == indexed,
        "(6) index holds {} keys, {indexed} slots are filled or filling",
        v.index().len()
    );
    let layer_total: usize = v.layer_slots().map(|(_, s)| s.len()).sum();
    ensure!(
        layer_total == indexed,
        "(6) per-layer sets hold {layer_total} slots, the index {indexed}"
    );
    for (layer, set) in v.layer_slots() {
        for &s in set {
            let key = slots.get(s as usize).and_then(|x| x.0);
            ensure!(
                key.is_some_and(|k| k.layer == layer),
                "(6) layer {layer}'s set lists slot {s} holding {key:?}"
            );
        }
    }
    ensure!(
        leased == c.slots_leased,
        "(5) {leased} slots are pinned, the counter says {}",
        c.slots_leased
    );

    // 3. and 4. Lease accounting.
    ensure!(
        leases == c.leases_held,
        "(3) live calls hold {leases} leases, the counter says {}",
        c.leases_held
    );
    ensure!(
        orphaned_leases == c.leases_orphaned,
        "(4) orphaned calls hold {orphaned_leases} leases, the counter says {}",
        c.leases_orphaned
    );
    let session_leases: u64 = v.sessions().map(|(_, s, _)| s.leases_held).sum();
    ensure!(
        session_leases + c.leases_orphaned == c.leases_held,
        "(3) sessions hold {session_leases} + {} orphaned ≠ {} leases",
        c.leases_orphaned,
        c.leases_held
    );
    let calls_by_id: HashMap<_, _> = v
        .calls()
        .map(|(id, s, o, p)| (id, (s, o, p.len())))
        .collect();
    for (session, stats, calls) in v.sessions() {
        let mut n = 0u64;
        for id in calls {
            let Some(&(owner, orphaned, len)) = calls_by_id.get(id) else {
                return Err(format!("(3) session {session:?} lists dead call {id:?}"));
            };
            ensure!(
                owner == session && !orphaned,
                "(4) session {session:?} lists call {id:?} of {owner:?} (orphaned: {orphaned})"
            );
            n += len as u64;
        }
        ensure!(
            n == stats.leases_held,
            "(3) session {session:?} holds {} leases by its counter, {n} by its calls",
            stats.leases_held
        );
        ensure!(
            stats.bytes_read == stats.misses * v.slot_bytes(),
            "(8) session {session:?} read {} bytes for {} misses",
            stats.bytes_read,
            stats.misses
        );
        ensure!(
            stats.keys == stats.hits + stats.misses,
            "(8) session {session:?}: keys ≠ hits + misses"
        );
    }

    // 7. Transient pool.
    let in_use = transient_used.iter().filter(|&&u| u).count() as u64;
    ensure!(
        in_use == c.transient_in_use,
        "(7) {in_use} transient buffers are leased, the counter says {}",
        c.transient_in_use
    );
    ensure!(
        in_use + v.transient_free().len() as u64 == u64::from(v.n_transient()),
        "(7) {in_use} used + {} free ≠ {} transient buffers",
        v.transient_free().len(),
        v.n_transient()
    );
    for &b in v.transient_free() {
        ensure!(
            (b as usize) < transient_used.len() && !transient_used[b as usize],
            "(7) transient buffer {b} is both free and leased"
        );
    }

    // 8. Sums over sessions.
    let mut total = *v.closed();
    for (_, s, _) in v.sessions() {
        total.add_totals(s);
    }
    let t = &c.totals;
    ensure!(
        t.keys == t.hits + t.misses,
        "(8) keys {} ≠ hits {} + misses {}",
        t.keys,
        t.hits,
        t.misses
    );
    ensure!(
        (
            total.calls,
            total.keys,
            total.hits,
            total.misses,
            total.bytes_read
        ) == (t.calls, t.keys, t.hits, t.misses, t.misses * v.slot_bytes()),
        "(8) sessions sum to {total:?}, the global counters are {c:?}"
    );
    Ok(())
}
