//! The route-trace journal when nobody writes it: capped, and the trace reported incomplete.

use super::tests::SharedBuf;
use super::*;
use crate::trace::{TraceError, TraceWriter};

const SLOT: usize = 4096;

#[test]
fn a_journal_nobody_writes_is_capped_and_the_trace_reported_incomplete() {
    // No writer thread flushes: past `MAX_JOURNAL_EVENTS` the journal is dropped (an acquire
    // never writes the file itself), and finishing the trace says how many events were lost.
    let c = ExpertCache::new(
        CacheConfig {
            budget_bytes: 2 * SLOT as u64,
            policy: Policy::Lru,
            transient_slots: 0,
        },
        SLOT,
    )
    .expect("cache");
    let buf = SharedBuf::default();
    c.start_trace(TraceWriter::new(Box::new(buf.clone())))
        .expect("trace");
    let key = ExpertKey::new(LayerId::new(0), ExpertId::new(1));
    for _ in 0..MAX_JOURNAL_EVENTS / 2 + 10 {
        let mut acq = c.acquire(SessionId(1), &[key]).expect("acquire");
        for l in acq.misses() {
            l.mark_filled();
        }
    }
    assert!(
        lock(&c.shared.state).planner.journal_len() < MAX_JOURNAL_EVENTS,
        "the journal grew past its cap"
    );
    match c.finish_trace() {
        Err(TraceError::Dropped { events }) => {
            // Dropped once, when an acquire found the journal at the cap (its own event in).
            let cap = MAX_JOURNAL_EVENTS as u64;
            assert!((cap..=cap + 2).contains(&events), "dropped {events}");
        }
        other => panic!("a trace that lost events finished as {other:?}"),
    }
    // What was written is still well-formed lines.
    let text = String::from_utf8(lock(&buf.0).clone()).expect("utf-8");
    assert!(
        text.lines().all(|l| l.starts_with("{\"ev\":")),
        "garbled trace"
    );
}
