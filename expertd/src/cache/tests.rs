//! Tests of the expert cache without IO: budget and lease invariants under random operation
//! sequences, the victim choices of each policy on small hand-checked cases, the transient
//! fallback, failed fills, session release, concurrent misses of one expert, and exact replay
//! of the journaled route trace. Fills write a pattern derived from the key, so a hit that
//! sees another expert's bytes (a slot reused under a pin) or a half-written buffer fails.

use super::*;
use crate::replay::{ReplayConfig, replay};
use crate::trace::Trace;
use shared::splitmix::SplitMix64;
use std::sync::Barrier;
use std::thread;

const SLOT: usize = 4096;

fn key(layer: u32, expert: u32) -> ExpertKey {
    ExpertKey::new(LayerId::new(layer), ExpertId::new(expert))
}

fn lru_config(slots: u64, transient: u32) -> CacheConfig {
    CacheConfig {
        budget_bytes: slots * SLOT as u64,
        policy: Policy::Lru,
        transient_slots: transient,
    }
}

fn cache(config: CacheConfig) -> ExpertCache {
    ExpertCache::new(config, SLOT).expect("cache")
}

/// The byte an expert's blob holds at `i` in these tests.
fn pattern(k: ExpertKey, i: usize) -> u8 {
    (k.layer.get().wrapping_mul(31) ^ k.expert.get().wrapping_mul(7) ^ (i as u32 / 512)) as u8
}

fn fill(lease: &mut Lease) {
    let k = lease.key();
    for (i, b) in lease.buffer_mut().iter_mut().enumerate() {
        *b = pattern(k, i);
    }
    lease.mark_filled();
}

fn assert_holds_expert(lease: &Lease) {
    let bytes = lease.bytes();
    assert_eq!(bytes.len(), SLOT, "{lease:?}");
    assert_eq!(
        bytes.as_ptr() as usize % SLOT_ALIGN,
        0,
        "lease buffer is not 4096-aligned"
    );
    let k = lease.key();
    let bad = bytes
        .iter()
        .enumerate()
        .position(|(i, &b)| b != pattern(k, i));
    assert_eq!(
        bad, None,
        "{lease:?} holds bytes of another expert or a torn read"
    );
}

/// Acquires, fills every miss, checks every hit's bytes, and returns the call.
fn acquire_filled(c: &ExpertCache, session: u64, keys: &[ExpertKey]) -> Acquired {
    let mut acq = c.acquire(SessionId(session), keys).expect("acquire");
    for l in acq.misses() {
        fill(l);
    }
    acq.wait_ready().expect("ready");
    for l in acq.leases() {
        assert_holds_expert(l);
    }
    acq
}

fn evicted(acq: &Acquired) -> u32 {
    acq.n_evictions()
}

// ---- victim choice, hand-checked -------------------------------------------------------------

/// Runs one call per entry of `calls` on a planner of `slots` slots (each call filled and
/// released at once) and checks the entry each call evicted.
fn check_victims(
    policy: Policy,
    slots: u64,
    calls: &[&[ExpertKey]],
    expected: &[Option<ExpertKey>],
) {
    let config = CacheConfig {
        budget_bytes: slots * SLOT as u64,
        policy,
        transient_slots: 0,
    };
    let mut p = Planner::new(&config, SLOT as u64);
    let mut got = Vec::new();
    for keys in calls {
        let plan = p.acquire(SessionId(1), None, keys).expect("acquire");
        let mut victim = None;
        for pl in &plan.placements {
            if let Placement::Miss { slot, evicted } = *pl {
                p.mark_filled(slot);
                victim = victim.or(evicted);
            }
        }
        p.release(plan.call);
        p.check_invariants().expect("invariants");
        got.push(victim);
    }
    assert_eq!(got, expected, "{policy}");
}

const A: ExpertKey = ExpertKey {
    layer: LayerId::new(0),
    expert: ExpertId::new(0),
};
const B: ExpertKey = ExpertKey {
    layer: LayerId::new(0),
    expert: ExpertId::new(1),
};
const C: ExpertKey = ExpertKey {
    layer: LayerId::new(0),
    expert: ExpertId::new(2),
};
const D: ExpertKey = ExpertKey {
    layer: LayerId::new(0),
    expert: ExpertId::new(3),
};
const X: ExpertKey = ExpertKey {
    layer: LayerId::new(1),
    expert: ExpertId::new(0),
};

#[test]
fn lru_evicts_least_recently_used() {
    check_victims(
        Policy::Lru,
        3,
        &[&[A], &[B], &[C], &[A], &[D]],
        &[None, None, None, None, Some(B)],
    );
}

#[test]
fn lru_is_global_across_layers() {
    // X (layer 1) was used before B and C (layer 0): it goes first, whatever its layer.
    check_victims(
        Policy::Lru,
        3,
        &[&[X], &[B], &[C], &[D]],
        &[None, None, None, Some(X)],
    );
}

#[test]
fn lfu_evicts_lowest_count_then_least_recent() {
    // Counts a=2, b=1, c=1: b and c tie and b is older. LRU evicts a (last used at call 2).
    let calls: &[&[ExpertKey]] = &[&[A], &[A], &[B], &[C], &[D]];
    check_victims(
        Policy::LfuAging {
            halving_period: 1000,
        },
        3,
        calls,
        &[None, None, None, None, Some(B)],
    );
    check_victims(Policy::Lru, 3, calls, &[None, None, None, None, Some(A)]);
}

#[test]
fn lfu_halving_ages_counts() {
    // Period 2: calls 2 and 4 of layer 0 halve first. a: 1, (0)+1, 2, then halved to 1 at
    // call 4 where b enters with 1; at call 5 a and b tie at 1 and a is older: a goes. Without
    // aging a has 3 and b goes.
    let calls: &[&[ExpertKey]] = &[&[A], &[A], &[A], &[B], &[C]];
    check_victims(
        Policy::LfuAging { halving_period: 2 },
        2,
        calls,
        &[None, None, None, None, Some(A)],
    );
    check_victims(
        Policy::LfuAging {
            halving_period: 1000,
        },
        2,
        calls,
        &[None, None, None, None, Some(B)],
    );
}

#[test]
fn lfu_halving_touches_only_its_layer() {
    // Layer 1's x reaches 2 over its own three calls. Layer 0's a reaches 2, then its fourth
    // call halves a to 1 and brings b: the victim is a (1) not x (2). Were halving global, x
    // would have been halved by layer 0's calls too and gone first.
    let calls: &[&[ExpertKey]] = &[&[X], &[X], &[X], &[A], &[A], &[A], &[B]];
    check_victims(
        Policy::LfuAging { halving_period: 2 },
        2,
        calls,
        &[None, None, None, None, None, None, Some(A)],
    );
}

#[test]
fn a_call_never_evicts_its_own_hits() {
    // Two slots holding a and b; the call {a, c} must evict b although a is older.
    check_victims(
        Policy::Lru,
        2,
        &[&[A], &[B], &[A, C]],
        &[None, None, Some(B)],
    );
}

// ---- leases, transient fallback, failures, sessions ------------------------------------------

#[test]
fn leased_entry_is_never_a_victim() {
    let c = cache(lru_config(2, 0));
    let held = acquire_filled(&c, 1, &[A]);
    drop(acquire_filled(&c, 1, &[B]));
    // A is least recently used but leased: C must take B's slot.
    let third = acquire_filled(&c, 2, &[C]);
    assert_eq!(evicted(&third), 1);
    assert!(c.contains(A) && c.contains(C) && !c.contains(B));
    assert_holds_expert(&held.leases()[0]);
    c.debug_invariants().expect("invariants");
}

#[test]
fn transient_fallback_then_exhausted() {
    let c = cache(lru_config(2, 1));
    let held = acquire_filled(&c, 1, &[A, B]);
    let mut t = c.acquire(SessionId(2), &[C]).expect("transient");
    assert_eq!((t.n_hits(), t.n_misses(), t.n_transient()), (0, 1, 1));
    assert!(t.leases()[0].is_transient());
    fill(&mut t.leases_mut()[0]);
    assert_holds_expert(&t.leases()[0]);
    let before = c.stats();
    assert!(before.resident_bytes <= before.budget_bytes);
    let err = c.acquire(SessionId(3), &[D]).expect_err("pool empty");
    assert_eq!(
        err,
        CacheError::Exhausted {
            layer: LayerId::new(0),
            misses: 1,
            slots_available: 0,
            transient_free: 0,
            n_slots: 2,
            transient_slots: 1
        }
    );
    assert_eq!(err.error_type(), "exhausted");
    let after = c.stats();
    assert_eq!(
        after,
        CacheStats {
            totals: PlanTotals {
                exhausted: before.totals.exhausted + 1,
                ..before.totals
            },
            sessions_open: after.sessions_open,
            ..before
        }
    );
    // A hit on a leased slot still works while the cache is exhausted.
    drop(acquire_filled(&c, 3, &[A]));
    drop((held, t));
    // The transient read was not cached: C misses again, now into a slot.
    let again = acquire_filled(&c, 2, &[C]);
    assert_eq!((again.n_misses(), again.n_transient()), (1, 0));
    c.debug_invariants().expect("invariants");
}

#[test]
fn failed_fill_leaves_nothing_cached() {
    let c = cache(lru_config(4, 0));
    let mut acq = c.acquire(SessionId(1), &[A, B]).expect("acquire");
    fill(&mut acq.leases_mut()[0]);
    // B's read "fails": its lease is dropped unfilled.
    drop(acq);
    assert!(c.contains(A) && !c.contains(B));
    let s = c.stats();
    assert_eq!(
        (
            s.totals.fill_failures,
            s.slots_used,
            s.leases_held,
            s.slots_leased
        ),
        (1, 1, 0, 0)
    );
    let again = acquire_filled(&c, 1, &[A, B]);
    assert_eq!((again.n_hits(), again.n_misses()), (1, 1));
    c.debug_invariants().expect("invariants");
}

#[test]
fn release_session_frees_all() {
    let c = cache(lru_config(4, 2));
    let one = acquire_filled(&c, 1, &[A, B]);
    let two = acquire_filled(&c, 1, &[X]);
    let other = acquire_filled(&c, 2, &[C]);
    let closed = c.release_session(SessionId(1)).expect("session 1 was open");
    assert_eq!((closed.calls, closed.keys, closed.leases_held), (2, 3, 3));
    assert_eq!(c.session_stats(SessionId(1)), None);
    let s = c.stats();
    assert_eq!(
        (s.leases_held, s.leases_orphaned, s.sessions_open),
        (4, 3, 1)
    );
    c.debug_invariants().expect("invariants");
    // The orphaned guards still read their experts, and free their slots when dropped.
    assert_holds_expert(&one.leases()[1]);
    drop((one, two));
    let s = c.stats();
    assert_eq!(
        (s.leases_held, s.leases_orphaned, s.slots_leased),
        (1, 0, 1)
    );
    assert_eq!(
        c.session_stats(SessionId(2)).map(|s| s.leases_held),
        Some(1)
    );
    drop(other);
    assert_eq!(c.release_session(SessionId(9)), None);
    c.debug_invariants().expect("invariants");
}

#[test]
fn per_session_counters_sum_to_global() {
    let c = cache(lru_config(3, 1));
    for (session, keys) in [
        (1, vec![A, B]),
        (2, vec![B, C]),
        (1, vec![D]),
        (3, vec![X]),
        (2, vec![A]),
    ] {
        drop(acquire_filled(&c, session, &keys));
    }
    let g = c.stats();
    let mut sum = SessionStats::default();
    for (_, s) in c.sessions() {
        sum.add_totals(&s);
    }
    assert_eq!(
        (sum.calls, sum.keys, sum.hits, sum.misses, sum.bytes_read),
        (
            g.totals.calls,
            g.totals.keys,
            g.totals.hits,
            g.totals.misses,
            g.bytes_read
        )
    );
    assert_eq!(g.bytes_read, g.totals.misses * SLOT as u64);
    c.debug_invariants().expect("invariants");
}

#[test]
fn bad_calls_and_configs_are_refused() {
    assert_eq!(
        ExpertCache::new(lru_config(1, 0), 1000).err(),
        Some(CacheError::SlotBytes { slot_bytes: 1000 })
    );
    let c = cache(lru_config(2, 0));
    assert_eq!(
        c.acquire(SessionId(1), &[]).err(),
        Some(CacheError::EmptyCall)
    );
    assert_eq!(
        c.acquire(SessionId(1), &[A, X]).err(),
        Some(CacheError::MixedLayers {
            first: A.layer,
            other: X.layer
        })
    );
    assert_eq!(
        c.acquire(SessionId(1), &[A, B, A]).err(),
        Some(CacheError::DuplicateKey { key: A })
    );
    assert_eq!(c.stats().totals.calls, 0);
    // A budget below one slot caches nothing; a transient-free cache then refuses every call.
    let tiny = ExpertCache::new(
        CacheConfig {
            budget_bytes: 100,
            policy: Policy::Lru,
            transient_slots: 0,
        },
        SLOT,
    )
    .expect("cache");
    assert!(matches!(
        tiny.acquire(SessionId(1), &[A]),
        Err(CacheError::Exhausted { n_slots: 0, .. })
    ));
}

// ---- random operation sequences ---------------------------------------------------------------

/// Random single-threaded operations on a small cache: calls held across later calls, misses
/// filled or abandoned, sessions closed. After every operation the invariants hold, the budget
/// is respected and every held lease still holds its own expert.
fn check_random_ops(seed: u64, policy: Policy) {
    let mut rng = SplitMix64::new(seed);
    let config = CacheConfig {
        budget_bytes: 12 * SLOT as u64 + 100,
        policy,
        transient_slots: 3,
    };
    let c = cache(config);
    let mut held: Vec<Acquired> = Vec::new();
    for _ in 0..1500 {
        match rng.below(10) {
            0..=5 => {
                let layer = rng.below(3) as u32;
                let n = 1 + rng.below(4);
                let mut keys = Vec::new();
                while keys.len() < n {
                    let k = key(layer, rng.below(10) as u32);
                    if !keys.contains(&k) {
                        keys.push(k);
                    }
                }
                match c.acquire(SessionId(rng.below(4) as u64), &keys) {
                    Ok(mut acq) => {
                        let fail = rng.below(8) == 0;
                        for l in acq.misses() {
                            if !fail {
                                fill(l);
                            }
                        }
                        if fail {
                            drop(acq);
                        } else {
                            // Hits read by calls still held are ready: every call fills at once.
                            acq.wait_ready().expect("ready");
                            held.push(acq);
                        }
                    }
                    Err(CacheError::Exhausted { .. }) => {}
                    Err(e) => panic!("unexpected {e}"),
                }
            }
            6..=8 if !held.is_empty() => {
                let i = rng.below(held.len());
                drop(held.swap_remove(i));
            }
            _ => {
                c.release_session(SessionId(rng.below(4) as u64));
            }
        }
        c.debug_invariants()
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let s = c.stats();
        assert!(s.resident_bytes <= s.budget_bytes, "seed {seed}: {s:?}");
        for acq in &held {
            for l in acq.leases() {
                assert_holds_expert(l);
                if !l.is_transient() {
                    assert!(
                        c.contains(l.key()),
                        "seed {seed}: leased {} was evicted",
                        l.key()
                    );
                }
            }
        }
    }
    drop(held);
    let s = c.stats();
    assert_eq!(
        (s.leases_held, s.slots_leased, s.transient_in_use),
        (0, 0, 0)
    );
}

#[test]
fn random_ops_lru() {
    for seed in 0..4 {
        check_random_ops(seed, Policy::Lru);
    }
}

#[test]
fn random_ops_lfu_aging() {
    for seed in 10..14 {
        check_random_ops(seed, Policy::LfuAging { halving_period: 3 });
    }
}

// ---- concurrency ------------------------------------------------------------------------------

/// `n_threads` threads want the same missing expert at once: the first planned reads it
/// (slowly, in pieces), the others wait and must see only the complete bytes. With
/// `fail_first`, the reader abandons its read and the waiters get `FillFailed`.
fn check_concurrent_miss(n_threads: usize, fail_first: bool) {
    const BIG: usize = 16 * SLOT;
    let c = ExpertCache::new(
        CacheConfig {
            budget_bytes: 4 * BIG as u64,
            policy: Policy::Lru,
            transient_slots: 0,
        },
        BIG,
    )
    .expect("cache");
    let k = key(2, 5);
    let first = c.acquire(SessionId(0), &[k]).expect("first");
    assert_eq!(first.n_misses(), 1);
    let start = Barrier::new(n_threads + 1);
    thread::scope(|s| {
        let waiters: Vec<_> = (1..=n_threads as u64)
            .map(|t| {
                let (c, start) = (&c, &start);
                s.spawn(move || {
                    let acq = c.acquire(SessionId(t), &[k]).expect("second");
                    start.wait();
                    assert_eq!(
                        (acq.n_hits(), acq.n_misses()),
                        (1, 0),
                        "a concurrent miss must not read twice"
                    );
                    match acq.wait_ready() {
                        Ok(()) => {
                            let bytes = acq.leases()[0].bytes();
                            assert!(
                                bytes.iter().enumerate().all(|(i, &b)| b == pattern(k, i)),
                                "torn or foreign bytes"
                            );
                            true
                        }
                        Err(e) => {
                            assert_eq!(e, CacheError::FillFailed { key: k });
                            assert!(acq.leases()[0].bytes().is_empty());
                            false
                        }
                    }
                })
            })
            .collect();
        start.wait();
        let mut first = first;
        let lease = &mut first.leases_mut()[0];
        if !fail_first {
            let buf = lease.buffer_mut();
            for (j, chunk) in buf.chunks_mut(SLOT).enumerate() {
                for (i, b) in chunk.iter_mut().enumerate() {
                    *b = pattern(k, j * SLOT + i);
                }
                thread::yield_now();
            }
            lease.mark_filled();
        }
        drop(first);
        for w in waiters {
            assert_eq!(w.join().expect("waiter"), !fail_first);
        }
    });
    let s = c.stats();
    assert_eq!(
        (s.totals.misses, s.totals.hits, s.totals.fill_failures),
        (1, n_threads as u64, u64::from(fail_first))
    );
    assert_eq!(c.contains(k), !fail_first);
    c.debug_invariants().expect("invariants");
}

#[test]
fn concurrent_miss_is_read_once() {
    for _ in 0..20 {
        check_concurrent_miss(6, false);
    }
}

#[test]
fn concurrent_miss_whose_read_fails() {
    for _ in 0..10 {
        check_concurrent_miss(4, true);
    }
}

// ---- route trace and exact replay -------------------------------------------------------------

/// A `Write` into shared memory, to read back what the trace writer wrote.
#[derive(Clone, Default)]
pub(super) struct SharedBuf(pub(super) Arc<Mutex<Vec<u8>>>);

impl std::io::Write for SharedBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        lock(&self.0).extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn concurrent_calls_replay_exactly() {
    for policy in [Policy::Lru, Policy::LfuAging { halving_period: 4 }] {
        let config = CacheConfig {
            budget_bytes: 10 * SLOT as u64,
            policy,
            transient_slots: 2,
        };
        let c = cache(config);
        let buf = SharedBuf::default();
        c.start_trace(TraceWriter::new(Box::new(buf.clone())))
            .expect("trace");
        thread::scope(|s| {
            for t in 0..4u64 {
                let c = &c;
                s.spawn(move || {
                    let mut rng = SplitMix64::new(100 + t);
                    let mut held: Vec<Acquired> = Vec::new();
                    for step in 0..60u64 {
                        for layer in 0..3u32 {
                            let mut keys: Vec<ExpertKey> = Vec::new();
                            while keys.len() < 3 {
                                let k = key(layer, rng.below(8) as u32);
                                if !keys.contains(&k) {
                                    keys.push(k);
                                }
                            }
                            if let Ok(mut acq) = c.acquire_at(SessionId(t), step, &keys) {
                                let fail = rng.below(10) == 0;
                                for l in acq.misses() {
                                    if !fail {
                                        fill(l);
                                    }
                                }
                                if !fail && acq.wait_ready().is_ok() && rng.below(3) == 0 {
                                    held.push(acq);
                                }
                            }
                            if held.len() > 2 {
                                held.remove(0);
                            }
                            c.flush_trace().expect("flush");
                        }
                    }
                    drop(held);
                    if t == 3 {
                        c.release_session(SessionId(t));
                    }
                });
            }
        });
        c.finish_trace().expect("finish");
        let stats = c.stats();
        let text = lock(&buf.0).clone();
        let trace = Trace::read(&text[..]).expect("parse trace");
        let again = c.start_trace(TraceWriter::new(Box::new(std::io::sink())));
        assert!(matches!(again, Err(TraceError::CacheStarted)));
        let r = replay(&trace, &ReplayConfig::recorded(&trace.header)).expect("replay");
        let check = r.check.clone().expect("recorded configuration is checked");
        assert!(check.matches, "{policy}: {check:?}");
        assert_eq!(r.totals, stats.totals, "{policy}");
        assert_eq!(r.tokens, 4 * 60);
    }
}

#[test]
fn refused_calls_replay_exactly_and_as_what_if() {
    let c = cache(lru_config(2, 0));
    let buf = SharedBuf::default();
    c.start_trace(TraceWriter::new(Box::new(buf.clone())))
        .expect("trace");
    let held = acquire_filled(&c, 1, &[A, B]);
    assert!(matches!(
        c.acquire(SessionId(2), &[C]),
        Err(CacheError::Exhausted { .. })
    ));
    drop(held);
    drop(acquire_filled(&c, 2, &[C]));
    c.release_session(SessionId(1));
    c.finish_trace().expect("finish");
    let trace = Trace::read(&lock(&buf.0)[..]).expect("parse");
    let recorded = ReplayConfig::recorded(&trace.header);
    let r = replay(&trace, &recorded).expect("replay");
    assert!(
        r.check
            .as_ref()
            .is_some_and(|c| c.matches && c.events_compared == 4),
        "{r:?}"
    );
    assert_eq!(
        (
            r.totals.calls,
            r.totals.exhausted,
            r.totals.misses,
            r.totals.evictions
        ),
        (2, 1, 3, 1)
    );
    // With room for three, the refused call is served (and released at once), C then hits.
    let what_if = replay(
        &trace,
        &ReplayConfig {
            budget_bytes: 3 * SLOT as u64,
            ..recorded
        },
    )
    .expect("replay");
    let t = what_if.totals;
    assert_eq!(
        (t.calls, t.exhausted, t.hits, t.misses, what_if.check),
        (3, 0, 1, 3, None)
    );
}

/// Parses `text` as a trace and checks the error message (or success).
fn check_trace_text(text: &str, expected: Result<usize, &str>) {
    let got = Trace::read(text.as_bytes())
        .map(|t| t.events.len())
        .map_err(|e| e.to_string());
    match (got, expected) {
        (Ok(n), Ok(want)) => assert_eq!(n, want),
        (Err(msg), Err(want)) => assert!(msg.contains(want), "{msg:?} does not contain {want:?}"),
        (got, want) => panic!("got {got:?}, want {want:?}"),
    }
}

const HEADER: &str = r#"{"ev":"header","format":"sluice-route-trace","version":1,"policy":"lru","budget_bytes":8192,"slot_bytes":4096,"slots":2,"transient_slots":0}"#;

#[test]
fn trace_text_is_validated() {
    let acquire = r#"{"ev":"acquire","session":1,"step":0,"layer":0,"experts":[1],"hits":0,"misses":1,"call":0,"future_field":7}"#;
    check_trace_text(&format!("{HEADER}\n{acquire}\n\n"), Ok(1));
    check_trace_text(
        "",
        Err("does not start with a header line (found an empty file)"),
    );
    check_trace_text(acquire, Err("found an acquire event"));
    check_trace_text(
        &format!("{HEADER}\n{HEADER}"),
        Err("line 2: a second header"),
    );
    check_trace_text(
        &HEADER.replace("\"version\":1", "\"version\":2"),
        Err("version 2 is not"),
    );
    check_trace_text(
        &format!("{HEADER}\n{{\"ev\":\"acquire\"}}"),
        Err("route trace line 2: missing field"),
    );
    check_trace_text(
        &format!("{HEADER}\n{{\"ev\":\"evict\"}}"),
        Err("route trace line 2: unknown variant"),
    );
}

#[test]
fn leases_can_cross_threads_and_index_the_buffer_list() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ExpertCache>();
    assert_send_sync::<Lease>();
    assert_send_sync::<Acquired>();
    let c = cache(lru_config(2, 1));
    let buffers = c.buffers();
    assert_eq!(buffers.len(), 3);
    assert!(
        buffers
            .iter()
            .all(|(p, len)| (p.as_ptr() as usize).is_multiple_of(SLOT_ALIGN) && *len == SLOT)
    );
    assert_eq!(c.arena_bytes(), 3 * SLOT as u64);
    let held = acquire_filled(&c, 1, &[A, B]);
    let t = acquire_filled(&c, 1, &[C]);
    for l in held.leases().iter().chain(t.leases()) {
        assert_eq!(
            buffers[l.buffer_index() as usize].0.as_ptr().cast_const(),
            l.bytes().as_ptr(),
            "{l:?}"
        );
    }
    assert_eq!(
        t.leases()[0].buffer_index(),
        2,
        "the transient pool follows the resident slots"
    );
}
