//! Sessions opened explicitly (the daemon's mode): a call of a session that was never opened,
//! or that was released while the call waited, is refused and changes nothing, so a released
//! session never comes back and `sessions_open` returns to zero (issue 37 (c)).

use super::*;

const SLOT: usize = 4096;

fn key(expert: u32) -> ExpertKey {
    ExpertKey::new(LayerId::new(0), ExpertId::new(expert))
}

#[test]
fn a_call_after_its_session_closed_is_refused_and_does_not_reopen_it() {
    let cache = ExpertCache::new(
        CacheConfig {
            budget_bytes: 4 * SLOT as u64,
            policy: Policy::Lru,
            transient_slots: 1,
        },
        SLOT,
    )
    .expect("cache");
    // Implicit mode (tests, replay): any session id leases, and is created on first use.
    drop(cache.acquire(SessionId(9), &[key(0)]).expect("implicit"));
    assert_eq!(cache.stats().sessions_open, 1);
    cache.release_session(SessionId(9));

    cache.require_open_sessions();
    let before = cache.stats();
    assert_eq!(
        cache.acquire(SessionId(1), &[key(1)]).err(),
        Some(CacheError::UnknownSession { session: 1 }),
        "a session never opened"
    );
    cache.open_session(SessionId(1));
    let mut acq = cache
        .acquire(SessionId(1), &[key(1)])
        .expect("open session");
    for l in acq.leases_mut() {
        l.mark_filled();
    }
    // The connection goes away while a second call of the session is queued: the release
    // orphans the live call's leases; the queued call then reaches the cache and is refused.
    cache.release_session(SessionId(1));
    assert_eq!(
        cache.acquire(SessionId(1), &[key(2)]).err(),
        Some(CacheError::UnknownSession { session: 1 }),
        "a released session"
    );
    drop(acq);
    let after = cache.stats();
    assert_eq!(after.sessions_open, 0, "{after:?}");
    assert_eq!(after.leases_held, 0, "{after:?}");
    // The refusals changed no counter: one call, the opened session's.
    assert_eq!(after.totals.calls, before.totals.calls + 1, "{after:?}");
}
