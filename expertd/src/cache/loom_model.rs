//! A loom model check of the lease fill/wait state machine (`lease.rs`, the planner's fill
//! states, the `filled` and `released` condition variables): every interleaving of a filler, a
//! call that hits the slot being filled, and an acquire waiting for room, with the cache's real
//! code over loom's mutex, condvar and atomics (`sync.rs`). loom reports a lost wake-up as a
//! deadlock and a wrong interleaving as a failed assertion. Run by `scripts/loom` (built with
//! `--cfg sluice_loom`; loom's timed waits never time out, so every wait must be woken).

use super::*;
use loom::thread;

const SLOT: usize = 4096;

fn key(expert: u32) -> ExpertKey {
    ExpertKey::new(LayerId::new(0), ExpertId::new(expert))
}

fn one_slot() -> ExpertCache {
    ExpertCache::new(
        CacheConfig {
            budget_bytes: SLOT as u64,
            policy: Policy::Lru,
            transient_slots: 0,
        },
        SLOT,
    )
    .expect("cache")
}

/// A second call hits the slot a first call is filling: whichever order the fill, the
/// filler's release and the second call's acquire and wait take, the second call reads the
/// filled bytes, never before the fill.
#[test]
fn a_hit_on_a_slot_being_filled_waits_for_the_fill() {
    loom::model(|| {
        let cache = one_slot();
        let mut first = cache.acquire(SessionId(1), &[key(1)]).expect("first");
        assert_eq!(first.n_misses(), 1);
        let other = cache.clone();
        let second = thread::spawn(move || {
            let got = other.acquire(SessionId(2), &[key(1)]).expect("second");
            assert_eq!(
                got.n_hits(),
                1,
                "the second call never reads the expert again"
            );
            got.wait_ready().map(|()| got.leases()[0].bytes()[7])
        });
        let lease = &mut first.leases_mut()[0];
        lease.buffer_mut()[7] = 42;
        lease.mark_filled();
        drop(first);
        assert_eq!(second.join().expect("second").ok(), Some(42));
    });
}

/// The filler drops its lease without marking it filled (a failed read): a call waiting on
/// the slot is woken with `FillFailed` (one that comes after the drop misses), and once both calls end the slot holds nothing (the next call
/// misses and reads the expert).
#[test]
fn an_abandoned_fill_wakes_the_waiter_with_a_failure_and_caches_nothing() {
    loom::model(|| {
        let cache = one_slot();
        let first = cache.acquire(SessionId(1), &[key(1)]).expect("first");
        let other = cache.clone();
        let second = thread::spawn(move || {
            let got = other.acquire(SessionId(2), &[key(1)]).expect("second");
            (got.n_hits(), got.wait_ready())
        });
        drop(first);
        // Acquired before the drop: a hit on the slot being filled, woken with the failure.
        // After it: the slot was freed, so a miss of its own (no wait).
        match second.join().expect("second") {
            (1, waited) => assert!(
                matches!(waited, Err(CacheError::FillFailed { .. })),
                "{waited:?}"
            ),
            (hits, waited) => assert_eq!((hits, waited.ok()), (0, Some(()))),
        }
        let again = cache.acquire(SessionId(3), &[key(1)]).expect("third");
        assert_eq!((again.n_hits(), again.n_misses()), (0, 1));
    });
}

/// An acquire that finds the only slot leased waits on `released` and is woken by the
/// release, whatever the order (loom's timed wait never times out: a missed notification
/// would be a deadlock).
#[test]
fn a_waiting_acquire_is_woken_by_every_release_order() {
    loom::model(|| {
        let cache = one_slot();
        let mut held = cache.acquire(SessionId(1), &[key(1)]).expect("held");
        held.leases_mut()[0].mark_filled();
        let other = cache.clone();
        let waiter = thread::spawn(move || {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3600);
            other
                .acquire_within(SessionId(2), 0, &[key(2)], deadline)
                .map(|a| a.n_misses())
        });
        drop(held);
        assert_eq!(waiter.join().expect("waiter").ok(), Some(1));
        assert_eq!(cache.stats().leases_held, 0);
    });
}
