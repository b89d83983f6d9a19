//! `expertd replay`: drives the cache's decision core ([`Planner`]) through a route trace, for
//! one or more (policy, budget) pairs, and reports hits, misses, evictions and the bytes read
//! per token. When a pair equals the configuration the trace was recorded under, every acquire
//! and session release is compared with the recorded outcome: the planner is deterministic and
//! the trace lists its operations in the order the daemon processed them, so they must agree
//! exactly. Owns the replay loop and its report; the trace format is [`crate::trace`], the
//! flags and printing are `crate::cli`.
//!
//! Replaying under another configuration is a what-if: a call the daemon refused
//! (`"exhausted":true`) is planned again and, if it now succeeds, released at once (the daemon
//! never served it); a call refused only in the replay is counted in `exhausted` and its later
//! release is ignored; a recorded failed read (`"unfilled"`) is applied to whichever of the
//! call's keys are misses in the replay.
//!
//! A token is one step of one session: the number of distinct `(session, step)` pairs of the
//! trace's acquire events.

use crate::cache::{
    CacheConfig, CacheError, CallId, ExpertKey, Placement, PlanTotals, Planner, Policy, PolicyKind,
    SessionId,
};
use crate::trace::{Trace, TraceEvent, TraceHeader};
use serde::Serialize;
use shared::ids::ExpertId;
use std::collections::{HashMap, HashSet};

/// One configuration to replay a trace under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayConfig {
    /// The eviction policy.
    pub policy: Policy,
    /// The resident-expert byte budget.
    pub budget_bytes: u64,
    /// Bytes of one slot.
    pub slot_bytes: u64,
    /// Transient buffers.
    pub transient_slots: u32,
}

impl ReplayConfig {
    /// The configuration the trace was recorded under.
    pub fn recorded(header: &TraceHeader) -> ReplayConfig {
        ReplayConfig {
            policy: header.policy(),
            budget_bytes: header.budget_bytes,
            slot_bytes: header.slot_bytes,
            transient_slots: header.transient_slots,
        }
    }

    /// Resident slots.
    pub fn slots(&self) -> u64 {
        self.budget_bytes.checked_div(self.slot_bytes).unwrap_or(0)
    }

    /// Whether replaying under `self` must reproduce the recording exactly: same policy and
    /// parameters, slot size, number of slots and transient pool.
    pub fn reproduces(&self, header: &TraceHeader) -> bool {
        self.policy == header.policy()
            && self.slot_bytes == header.slot_bytes
            && self.slots() == header.slots
            && self.transient_slots == header.transient_slots
    }
}

/// The comparison of a replay with the recorded outcomes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RecordingCheck {
    /// Whether every compared event agreed.
    pub matches: bool,
    /// Acquire and session-release events compared.
    pub events_compared: u64,
    /// Events that disagreed.
    pub mismatches: u64,
    /// The first disagreement, as a sentence.
    pub first_mismatch: Option<String>,
    /// Σ `hits` over the recorded acquire events.
    pub recorded_hits: u64,
    /// Σ `misses` over the recorded acquire events.
    pub recorded_misses: u64,
}

/// The outcome of replaying a trace under one configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayResult {
    /// The policy.
    pub policy: PolicyKind,
    /// The `lfu-aging` halving period.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub halving_period: Option<u64>,
    /// The byte budget.
    pub budget_bytes: u64,
    /// Bytes of one slot.
    pub slot_bytes: u64,
    /// Resident slots.
    pub slots: u64,
    /// Transient buffers.
    pub transient_slots: u32,
    /// What the planner decided, counted as the cache counts it.
    #[serde(flatten)]
    pub totals: PlanTotals,
    /// Distinct (session, step) pairs.
    pub tokens: u64,
    /// `misses × slot_bytes`.
    pub bytes_read: u64,
    /// `hits / keys`.
    pub hit_rate: f64,
    /// `misses / tokens`.
    pub misses_per_token: f64,
    /// `bytes_read / tokens`.
    pub bytes_read_per_token: f64,
    /// The comparison with the recording, when the configuration is the recorded one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check: Option<RecordingCheck>,
}

/// Why a trace could not be replayed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// An acquire event names keys no cache would accept (none, or repeated).
    #[error("route trace event {event}: {error}")]
    InvalidEvent {
        /// 0-based index among the events after the header.
        event: usize,
        /// What the planner said.
        error: CacheError,
    },
}

struct Checker {
    check: RecordingCheck,
}

impl Checker {
    fn compare<T: PartialEq + std::fmt::Debug>(
        &mut self,
        event: usize,
        what: &str,
        recorded: T,
        replayed: T,
    ) {
        self.check.events_compared += 1;
        if recorded != replayed {
            self.check.mismatches += 1;
            self.check.matches = false;
            if self.check.first_mismatch.is_none() {
                self.check.first_mismatch = Some(format!(
                    "event {event} ({what}): recorded {recorded:?}, replayed {replayed:?}"
                ));
            }
        }
    }
}

/// Replays `trace` under `config`; see the module doc.
pub fn replay(trace: &Trace, config: &ReplayConfig) -> Result<ReplayResult, ReplayError> {
    let cache_config = CacheConfig {
        budget_bytes: config.budget_bytes,
        policy: config.policy,
        transient_slots: config.transient_slots,
    };
    let mut planner = Planner::new(&cache_config, config.slot_bytes);
    let mut checker = config.reproduces(&trace.header).then_some(Checker {
        check: RecordingCheck {
            matches: true,
            events_compared: 0,
            mismatches: 0,
            first_mismatch: None,
            recorded_hits: 0,
            recorded_misses: 0,
        },
    });
    let mut live: HashMap<u64, CallId> = HashMap::new();
    let mut tokens: HashSet<(u64, u64)> = HashSet::new();
    let mut keys = Vec::new();
    for (i, ev) in trace.events.iter().enumerate() {
        match ev {
            TraceEvent::Acquire(a) => {
                tokens.insert((a.session, a.step));
                keys.clear();
                keys.extend(a.experts.iter().map(|&e| ExpertKey::new(a.layer, e)));
                let outcome = planner.acquire(SessionId(a.session), Some(a.step), &keys);
                if let Some(c) = &mut checker {
                    c.check.recorded_hits += u64::from(a.hits);
                    c.check.recorded_misses += u64::from(a.misses);
                    let recorded = (
                        a.call,
                        a.hits,
                        a.misses,
                        a.transient,
                        a.evictions,
                        a.exhausted,
                    );
                    let replayed = match &outcome {
                        Ok(p) => (
                            Some(p.call.0),
                            p.hits,
                            p.misses,
                            p.transient,
                            p.evictions,
                            false,
                        ),
                        Err(_) => (None, 0, 0, 0, 0, true),
                    };
                    c.compare(
                        i,
                        "acquire (call, hits, misses, transient, evictions, exhausted)",
                        recorded,
                        replayed,
                    );
                }
                match (outcome, a.call) {
                    (Ok(plan), Some(recorded_call)) => {
                        live.insert(recorded_call, plan.call);
                    }
                    (Ok(plan), None) => release(&mut planner, plan.call, &[]),
                    (Err(CacheError::Exhausted { .. }), _) => {}
                    (Err(error), _) => return Err(ReplayError::InvalidEvent { event: i, error }),
                }
            }
            TraceEvent::Release(r) => match live.remove(&r.call) {
                Some(call) => release(&mut planner, call, &r.unfilled),
                None => {
                    if let Some(c) = &mut checker {
                        c.compare(i, "release of a live call", Some(r.call), None);
                    }
                }
            },
            TraceEvent::ReleaseSession(s) => {
                let orphaned = planner
                    .release_session(SessionId(s.session))
                    .map_or(0, |st| st.leases_held);
                if let Some(c) = &mut checker {
                    c.compare(i, "release_session (orphaned leases)", s.orphaned, orphaned);
                }
            }
            // `Trace::read` keeps the header out of the events.
            TraceEvent::Header(_) => {}
        }
    }
    let st = planner.stats();
    let n_tokens = tokens.len() as u64;
    let per_token = |x: u64| {
        if n_tokens == 0 {
            0.0
        } else {
            x as f64 / n_tokens as f64
        }
    };
    Ok(ReplayResult {
        policy: config.policy.kind(),
        halving_period: config.policy.halving_period(),
        budget_bytes: config.budget_bytes,
        slot_bytes: config.slot_bytes,
        slots: st.n_slots,
        transient_slots: config.transient_slots,
        totals: st.totals,
        tokens: n_tokens,
        bytes_read: st.bytes_read,
        hit_rate: st.totals.hit_rate(),
        misses_per_token: per_token(st.totals.misses),
        bytes_read_per_token: per_token(st.bytes_read),
        check: checker.map(|c| c.check),
    })
}

/// Ends `call` as the trace says: every miss whose expert is not in `unfilled` was read.
fn release(planner: &mut Planner, call: CallId, unfilled: &[ExpertId]) {
    let filled: Vec<u32> = planner
        .call_placements(call)
        .map(|(placements, experts)| {
            placements
                .iter()
                .zip(experts)
                .filter_map(|(p, e)| match *p {
                    Placement::Miss { slot, .. } if !unfilled.contains(e) => Some(slot),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    for slot in filled {
        planner.mark_filled(slot);
    }
    planner.release(call);
}

/// The results as a text table, one row per configuration.
pub fn format_table(results: &[ReplayResult]) -> String {
    let mut out = format!(
        "{:<10} {:>8} {:>14} {:>7} {:>8} {:>7} {:>8} {:>10} {:>14} {:>10} {:>9} {:>9}  {}\n",
        "policy",
        "halving",
        "cache_bytes",
        "slots",
        "calls",
        "tokens",
        "hit_rate",
        "misses/tok",
        "MiB_read/tok",
        "evictions",
        "transient",
        "exhausted",
        "recording"
    );
    for r in results {
        let verdict = match &r.check {
            None => "-".to_string(),
            Some(c) if c.matches => format!("exact ({} events)", c.events_compared),
            Some(c) => format!(
                "MISMATCH ({} of {}): {}",
                c.mismatches,
                c.events_compared,
                c.first_mismatch.as_deref().unwrap_or("")
            ),
        };
        out += &format!(
            "{:<10} {:>8} {:>14} {:>7} {:>8} {:>7} {:>7.2}% {:>10.2} {:>14.2} {:>10} {:>9} {:>9}  {}\n",
            r.policy.name(),
            r.halving_period.map_or("-".to_string(), |h| h.to_string()),
            r.budget_bytes,
            r.slots,
            r.totals.calls,
            r.tokens,
            r.hit_rate * 100.0,
            r.misses_per_token,
            r.bytes_read_per_token / f64::from(1u32 << 20),
            r.totals.evictions,
            r.totals.transient_uses,
            r.totals.exhausted,
            verdict
        );
    }
    out
}
