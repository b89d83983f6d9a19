//! An acquire that finds every slot leased waits for a release and is woken by it (no
//! polling), and gives up at its deadline with the cache's `Exhausted` error.

use super::*;
use std::time::{Duration, Instant};

const SLOT: usize = 4096;

fn key(expert: u32) -> ExpertKey {
    ExpertKey::new(LayerId::new(0), ExpertId::new(expert))
}

#[test]
fn a_waiting_acquire_is_woken_by_the_release_and_gives_up_at_its_deadline() {
    let cache = ExpertCache::new(
        CacheConfig {
            budget_bytes: SLOT as u64,
            policy: Policy::Lru,
            transient_slots: 0,
        },
        SLOT,
    )
    .expect("cache");
    let mut held = cache
        .acquire(SessionId(1), &[key(1)])
        .expect("the one slot");
    for l in held.leases_mut() {
        l.mark_filled();
    }
    // While the slot is leased: refused at the deadline, not before.
    let t = Instant::now();
    let err = cache
        .acquire_within(SessionId(2), 0, &[key(2)], t + Duration::from_millis(150))
        .err();
    assert!(matches!(err, Some(CacheError::Exhausted { .. })), "{err:?}");
    assert!(
        t.elapsed() >= Duration::from_millis(150),
        "{:?}",
        t.elapsed()
    );

    // Released while another thread waits (deadline far away): it gets the slot right after.
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let t = Instant::now();
            let got = cache.acquire_within(SessionId(2), 0, &[key(2)], t + Duration::from_secs(20));
            (got.map(|a| a.n_misses()), Instant::now())
        });
        std::thread::sleep(Duration::from_millis(200));
        let released = Instant::now();
        drop(held);
        let (got, served) = waiter.join().expect("waiter");
        assert_eq!(got.ok(), Some(1), "the waiter leases the freed slot");
        // Not served before the release (measured on one clock: the waiter's own start may lag
        // the sleep's on a loaded machine) …
        assert!(
            served >= released,
            "served {:?} before the release",
            released - served
        );
        // … and woken by it, far before its 20 s deadline (2 s: room for a loaded machine).
        assert!(
            served - released < Duration::from_secs(2),
            "woken {:?} after the release",
            served - released
        );
    });
}
