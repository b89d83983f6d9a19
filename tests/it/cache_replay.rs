//! The expert cache's route trace end to end: a cache driven in process (overlapping calls of
//! several sessions, abandoned reads, a closed session, refused calls) records a trace through
//! `TraceWriter`; the built `expertd replay` binary must reproduce the cache's counters exactly
//! under the recorded configuration, report what-if rows for other policies and budgets, and
//! fail loudly when the trace disagrees with the replay.

use expertd::cache::{
    Acquired, CacheConfig, CacheStats, ExpertCache, ExpertKey, PlanTotals, Policy, SessionId,
};
use expertd::trace::TraceWriter;
use shared::ids::{ExpertId, LayerId};
use shared::splitmix::SplitMix64;
use std::path::Path;
use std::process::{Command, Output};
use tests::workspace_bin;

const SLOT_BYTES: usize = 4096;

fn expertd(args: &[&str]) -> Output {
    Command::new(workspace_bin("expertd"))
        .args(args)
        .output()
        .expect("spawn expertd")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Drives a cache with tracing into `path` and returns its final counters.
fn record(path: &Path, policy: Policy, slots: u64, seed: u64) -> CacheStats {
    let config = CacheConfig {
        budget_bytes: slots * SLOT_BYTES as u64,
        policy,
        transient_slots: 2,
    };
    let cache = ExpertCache::new(config, SLOT_BYTES).expect("cache");
    cache
        .start_trace(TraceWriter::create(path).expect("create trace"))
        .expect("start trace");
    let mut rng = SplitMix64::new(seed);
    // Calls held across later calls, as overlapping requests of several hosts would hold them.
    let mut held: Vec<Acquired> = Vec::new();
    for step in 0..40u64 {
        for session in 0..3u64 {
            for layer in 0..4u32 {
                let mut keys = Vec::new();
                while keys.len() < 4 {
                    // A skewed routing: low expert ids are hot.
                    let e = rng.below(16).min(rng.below(16)) as u32;
                    let k = ExpertKey::new(LayerId::new(layer), ExpertId::new(e));
                    if !keys.contains(&k) {
                        keys.push(k);
                    }
                }
                let Ok(mut acq) = cache.acquire_at(SessionId(session), step, &keys) else {
                    continue;
                };
                let abandon = rng.below(25) == 0;
                for lease in acq.misses() {
                    if !abandon {
                        let tag = u64::from(lease.key().expert.get()).to_le_bytes();
                        lease.buffer_mut()[..8].copy_from_slice(&tag);
                        lease.mark_filled();
                    }
                }
                if !abandon && acq.wait_ready().is_ok() && rng.below(4) == 0 {
                    held.push(acq);
                }
                if held.len() > 3 {
                    held.remove(rng.below(held.len()));
                }
                cache.flush_trace().expect("flush trace");
            }
        }
        if step == 30 {
            // Host 2 disappears with a call in flight; its id comes back later as a new session.
            cache.release_session(SessionId(2));
        }
    }
    drop(held);
    cache.finish_trace().expect("finish trace");
    cache.debug_invariants().expect("invariants");
    cache.stats()
}

fn replay_json(trace: &Path, extra: &[&str]) -> (Output, serde_json::Value) {
    let mut args = vec!["replay", trace.to_str().expect("utf-8 path"), "--json"];
    args.extend_from_slice(extra);
    let o = expertd(&args);
    let doc = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("replay --json output is not JSON ({e}): {}", text(&o)));
    (o, doc)
}

fn check_exact_replay(policy: Policy, slots: u64, seed: u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("route.jsonl");
    let stats = record(&trace, policy, slots, seed);
    let t = stats.totals;
    assert!(
        t.evictions > 0 && t.hits > 0 && t.fill_failures > 0,
        "workload too tame: {stats:?}"
    );
    let (o, doc) = replay_json(&trace, &[]);
    assert!(
        o.status.success(),
        "replay of the recorded configuration failed: {}",
        text(&o)
    );
    let r = &doc["results"][0];
    let got = |f: &str| r[f].as_u64().unwrap_or_else(|| panic!("field {f} in {r}"));
    // Every decision counter is a key of the result, equal to the cache's.
    let replayed: PlanTotals = serde_json::from_value(r.clone())
        .unwrap_or_else(|e| panic!("{policy}: totals in {r}: {e}"));
    assert_eq!(
        replayed, t,
        "{policy}: replayed totals ≠ the cache's counters"
    );
    assert_eq!(
        got("bytes_read"),
        stats.bytes_read,
        "{policy}: replayed bytes_read ≠ the cache's"
    );
    assert_eq!(r["check"]["matches"], true, "{policy}: {}", r["check"]);
    assert_eq!(
        got("tokens"),
        3 * 40,
        "40 steps of 3 sessions (session 2 reopened under its id after step 30)"
    );
}

#[test]
fn replay_reproduces_lru_counters() {
    check_exact_replay(Policy::Lru, 24, 1);
}

#[test]
fn replay_reproduces_lfu_aging_counters() {
    check_exact_replay(Policy::LfuAging { halving_period: 8 }, 24, 2);
}

#[test]
fn replay_table_over_policies_and_budgets() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("route.jsonl");
    record(&trace, Policy::Lru, 24, 3);
    let budgets = format!("{},{}", 24 * SLOT_BYTES, 48 * SLOT_BYTES);
    let (o, doc) = replay_json(
        &trace,
        &[
            "--policy",
            "lru,lfu-aging",
            "--cache-bytes",
            &budgets,
            "--halving-period",
            "16",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let rows = doc["results"].as_array().expect("results");
    assert_eq!(rows.len(), 4);
    let checked: Vec<bool> = rows.iter().map(|r| r.get("check").is_some()).collect();
    assert_eq!(
        checked,
        [true, false, false, false],
        "only (lru, recorded budget) is the recorded configuration"
    );
    for r in rows {
        let (misses, tokens) = (
            r["misses"].as_f64().expect("misses"),
            r["tokens"].as_f64().expect("tokens"),
        );
        assert!(
            (r["misses_per_token"].as_f64().expect("per token") - misses / tokens).abs() < 1e-9,
            "{r}"
        );
        assert!(
            (r["bytes_read_per_token"].as_f64().expect("bytes per token")
                - misses * SLOT_BYTES as f64 / tokens)
                .abs()
                < 1e-6,
            "{r}"
        );
    }
    let table = expertd(&[
        "replay",
        trace.to_str().expect("utf-8"),
        "--policy",
        "lfu-aging",
        "--cache-bytes",
        &budgets,
    ]);
    assert!(table.status.success(), "{}", text(&table));
    assert_eq!(
        String::from_utf8_lossy(&table.stdout)
            .lines()
            .filter(|l| l.starts_with("lfu-aging"))
            .count(),
        2,
        "{}",
        text(&table)
    );
}

#[test]
fn replay_fails_when_the_trace_disagrees() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("route.jsonl");
    record(&trace, Policy::Lru, 24, 4);
    // Claim one more hit (and one fewer miss) on the first acquire that had a miss.
    let text_in = std::fs::read_to_string(&trace).expect("read trace");
    let mut done = false;
    let tampered: Vec<String> = text_in
        .lines()
        .map(|line| {
            let mut v: serde_json::Value = serde_json::from_str(line).expect("json line");
            if !done && v["ev"] == "acquire" && v["misses"].as_u64().is_some_and(|m| m > 0) {
                v["misses"] = (v["misses"].as_u64().expect("misses") - 1).into();
                v["hits"] = (v["hits"].as_u64().expect("hits") + 1).into();
                done = true;
            }
            v.to_string()
        })
        .collect();
    std::fs::write(&trace, tampered.join("\n") + "\n").expect("write trace");
    let o = expertd(&["replay", trace.to_str().expect("utf-8")]);
    assert!(
        !o.status.success(),
        "a disagreeing trace must fail: {}",
        text(&o)
    );
    assert!(text(&o).contains("MISMATCH (1 of"), "{}", text(&o));
}
