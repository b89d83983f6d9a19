//! Speculative expert reads: a client that predicts the next layer's experts (by applying that
//! layer's router to the current hidden state) sends them as a hint; one prefetch thread per
//! daemon reads the predicted experts that are not resident into the cache, so the demand call
//! that follows finds them resident or already being read.
//!
//! Rules (each from measured prior art: uncapped speculation halved throughput elsewhere):
//! demand reads go first — before each speculative read the thread waits while any call's
//! demand reads are in flight; speculation is capped per session in bytes by a bucket that only
//! the session's own demand calls refill (one layer's share of the per-token cap per call, never
//! above the cap), so hints alone — whatever step numbers they carry — cannot read more than one
//! token's worth and evict other sessions' experts; a speculative
//! read never takes a transient buffer and never a leased slot (the cache's own rules: leased
//! slots are never victims), and evicts only the policy's victim; a hint that finds the queue
//! full is dropped, never waited for; what is left of a hint once the hinted layer's own call
//! has started is dropped unread (`stale`): that call reads its misses itself. Predictions are
//! read in the order the client sent them (most probable first). Hints change only what is
//! resident, never a result.
//!
//! Counters say what speculation cost and bought: bytes read speculatively and bytes of those
//! that a demand call later hit (`useful`); the difference is wasted.

use crate::cache::{ExpertKey, SessionId};
use crate::io::ReadRequest;
use crate::moe_call::CallExecutor;
use shared::ids::{ExpertId, LayerId};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

/// The cache session speculative leases are held under.
pub const PREFETCH_SESSION: SessionId = SessionId(u64::MAX);
/// Hints queued at most; more are dropped.
const QUEUE: usize = 4;
/// Speculative reads submitted together (each batch waits for demand reads to finish first).
const BATCH: usize = 4;
/// Longest a speculative read waits for demand reads to finish before it is skipped.
const DEMAND_WAIT_LIMIT: Duration = Duration::from_millis(50);
/// Most keys remembered as "read speculatively, not used yet" (older ones count as wasted).
const MAX_TRACKED: usize = 8192;

/// One hint: experts of `layer` the client expects to call next.
#[derive(Debug, Clone)]
pub struct Hint {
    /// The client's session.
    pub session: u64,
    /// The client's step (token) counter.
    pub step: u64,
    /// Layer.
    pub layer: LayerId,
    /// Predicted experts, most probable first, as the ring carried them (validated against the
    /// container by the caller).
    pub experts: Vec<u32>,
}

/// Cumulative prefetch counters (relaxed atomics).
#[derive(Debug, Default)]
pub struct PrefetchCounters {
    /// Hints accepted into the queue.
    pub hints: AtomicU64,
    /// Hints dropped because the queue was full.
    pub dropped_hints: AtomicU64,
    /// Predicted experts already resident (nothing to read).
    pub already_resident: AtomicU64,
    /// Speculative reads completed.
    pub reads: AtomicU64,
    /// Bytes read speculatively.
    pub bytes_read: AtomicU64,
    /// Bytes of speculatively read experts that a demand call then hit.
    pub useful_bytes: AtomicU64,
    /// Predictions skipped by the per-step cap.
    pub capped: AtomicU64,
    /// Predictions skipped because no slot could take them without a transient buffer, or
    /// demand reads kept the disk busy past the wait limit.
    pub skipped: AtomicU64,
    /// Predictions dropped unread because the hinted layer's demand call had already started.
    pub stale: AtomicU64,
}

/// The prefetch queue, its thread's state and its counters; owned by the call executor.
pub struct Prefetcher {
    tx: SyncSender<Hint>,
    /// Experts read speculatively and not yet hit by a demand call.
    speculative: Mutex<HashSet<ExpertKey>>,
    /// Counters.
    pub counters: PrefetchCounters,
    /// Speculative bytes one session may have in hand: one token's worth.
    cap_bytes_per_step: u64,
    /// What one demand call of a session adds to its bucket: the cap over the layers.
    refill_per_call: u64,
    /// Per session, the speculative bytes it may still read (absent: none).
    buckets: Mutex<HashMap<u64, u64>>,
}

impl Prefetcher {
    /// Starts the prefetch thread for `executor`, capped at `cap_bytes_per_step` speculative
    /// bytes per client step. The thread ends when the executor is dropped.
    pub fn start(
        executor: &Arc<CallExecutor>,
        cap_bytes_per_step: u64,
    ) -> std::io::Result<Arc<Prefetcher>> {
        let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
        let header = executor.header();
        let refill_per_call = (cap_bytes_per_step / header.layout.dims.n_layers.max(1) as u64)
            .max(header.layout.blob.stride as u64);
        let p = Arc::new(Prefetcher {
            tx,
            speculative: Mutex::new(HashSet::new()),
            counters: PrefetchCounters::default(),
            cap_bytes_per_step,
            refill_per_call,
            buckets: Mutex::new(HashMap::new()),
        });
        let (weak_executor, weak_p) = (Arc::downgrade(executor), Arc::downgrade(&p));
        std::thread::Builder::new()
            .name("expertd-prefetch".into())
            .spawn(move || run(rx, weak_executor, weak_p))?;
        Ok(p)
    }

    /// Queues a hint; drops it (counted) when the queue is full.
    pub fn hint(&self, h: Hint) {
        match self.tx.try_send(h) {
            Ok(()) => self.counters.hints.fetch_add(1, Ordering::Relaxed),
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counters.dropped_hints.fetch_add(1, Ordering::Relaxed)
            }
        };
    }

    /// A demand call of `session` completed: its speculative bucket gains one layer's share of
    /// the per-token cap (never above the cap). A session starts with an empty bucket, so its
    /// speculation never runs ahead of the calls it has made.
    pub fn note_demand_call(&self, session: u64) {
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        if buckets.len() >= 4096 && !buckets.contains_key(&session) {
            // Closed sessions' buckets: forgetting them empties them, the safe direction (a live
            // session refills in one token of calls).
            buckets.clear();
        }
        let b = buckets.entry(session).or_insert(0);
        *b = (*b + self.refill_per_call).min(self.cap_bytes_per_step);
    }

    /// Bytes `session` may still read speculatively.
    fn available(&self, session: u64) -> u64 {
        self.buckets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&session)
            .copied()
            .unwrap_or(0)
    }

    /// Takes `bytes` read speculatively for `session` out of its bucket.
    fn spend(&self, session: u64, bytes: u64) {
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(b) = buckets.get_mut(&session) {
            *b = b.saturating_sub(bytes);
        }
    }

    /// Whether any hint was queued yet (until one is, no call needs its start recorded).
    pub fn has_hints(&self) -> bool {
        self.counters.hints.load(Ordering::Relaxed) > 0
    }

    /// A demand call hit `key`: if it was read speculatively, its bytes were useful. Returns
    /// whether it was.
    pub fn note_hit(&self, key: ExpertKey, stride: u64) -> bool {
        let mut set = self
            .speculative
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if set.is_empty() || !set.remove(&key) {
            return false;
        }
        self.counters
            .useful_bytes
            .fetch_add(stride, Ordering::Relaxed);
        true
    }

    /// A demand call missed `key`: a speculative copy of it (if one was read) was evicted
    /// unused, so a later hit on the demand-read copy is not the speculation's doing.
    pub fn note_demand_miss(&self, key: ExpertKey) {
        let mut set = self
            .speculative
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !set.is_empty() {
            set.remove(&key);
        }
    }

    fn remember(&self, key: ExpertKey) {
        let mut set = self
            .speculative
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if set.len() >= MAX_TRACKED {
            set.clear();
        }
        set.insert(key);
    }

    fn forget(&self, key: ExpertKey) {
        self.speculative
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&key);
    }
}

fn run(rx: Receiver<Hint>, executor: Weak<CallExecutor>, p: Weak<Prefetcher>) {
    while let Ok(hint) = rx.recv() {
        let (Some(executor), Some(p)) = (executor.upgrade(), p.upgrade()) else {
            return;
        };
        // What the session may read now: its bucket, refilled only by its demand calls.
        let available = p.available(hint.session);
        let stride = executor.header().layout.blob.stride as u64;
        let c = &p.counters;
        let mut wanted = Vec::with_capacity(hint.experts.len());
        for &e in &hint.experts {
            let key = ExpertKey::new(hint.layer, ExpertId::new(e));
            if executor.cache().contains(key) {
                c.already_resident.fetch_add(1, Ordering::Relaxed);
            } else if stride * (wanted.len() as u64 + 1) > available {
                c.capped.fetch_add(1, Ordering::Relaxed);
            } else if !wanted.contains(&key) {
                wanted.push(key);
            }
        }
        for batch in wanted.chunks(BATCH) {
            // Demand first: wait while any call reads.
            let t = Instant::now();
            while executor.demand_reads_in_flight() > 0 && t.elapsed() < DEMAND_WAIT_LIMIT {
                std::thread::sleep(Duration::from_micros(100));
            }
            // Too late: the hinted layer's call has begun and reads its own misses; what is
            // left of the prediction is either being read by it or not wanted.
            if executor.demand_started(hint.session, hint.step, hint.layer) {
                c.stale.fetch_add(batch.len() as u64, Ordering::Relaxed);
                continue;
            }
            if executor.demand_reads_in_flight() > 0 {
                c.skipped.fetch_add(batch.len() as u64, Ordering::Relaxed);
                continue;
            }
            // Remembered before the read: a demand call that hits a slot while it is still
            // being read (the common case: the read overlaps the layer's dense compute) counts.
            for &key in batch {
                p.remember(key);
            }
            let read = read_batch(&executor, batch, hint.step);
            for (&key, outcome) in batch.iter().zip(&read) {
                match outcome {
                    Some(true) => {
                        p.spend(hint.session, stride);
                        c.reads.fetch_add(1, Ordering::Relaxed);
                        c.bytes_read.fetch_add(stride, Ordering::Relaxed);
                    }
                    Some(false) => p.forget(key),
                    None => {
                        p.forget(key);
                        c.skipped.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }
}

/// Leases `keys` (one layer, distinct) under the prefetch session and reads the misses into
/// their slots, all submitted together. Per key: `Some(true)` read; `Some(false)` resident
/// meanwhile (nothing read); `None` skipped — only a transient buffer or nothing was free,
/// or the read failed.
fn read_batch(executor: &CallExecutor, keys: &[ExpertKey], step: u64) -> Vec<Option<bool>> {
    // Opened per batch and released after it (the cache requires open sessions).
    executor.cache().open_session(PREFETCH_SESSION);
    let Ok(mut acquired) = executor.cache().acquire_at(PREFETCH_SESSION, step, keys) else {
        executor.cache().release_session(PREFETCH_SESSION);
        return vec![None; keys.len()];
    };
    let mut outcome: Vec<Option<bool>> = acquired
        .leases()
        .iter()
        .map(|l| (!l.needs_fill()).then_some(false))
        .collect();
    let mut mine: Vec<(usize, &mut crate::cache::Lease)> = acquired
        .leases_mut()
        .iter_mut()
        .enumerate()
        .filter(|(_, l)| l.needs_fill() && !l.is_transient())
        .collect();
    let mut reqs: Vec<ReadRequest<'_>> = mine
        .iter_mut()
        .map(|(_, lease)| {
            let key = lease.key();
            ReadRequest {
                layer: key.layer,
                expert: key.expert,
                dst: lease.buffer_mut(),
            }
        })
        .collect();
    let results = executor.source().read_blobs(&mut reqs);
    drop(reqs);
    for ((i, lease), r) in mine.into_iter().zip(results) {
        if r.is_ok() {
            lease.mark_filled();
            outcome[i] = Some(true);
        }
    }
    // Dropping the leases leaves filled slots resident (unpinned); unfilled ones are abandoned.
    drop(acquired);
    // And the prefetch session closes between batches: it holds nothing, and an open session
    // in the stats would read as a client that never left (its counters go to the closed totals).
    executor.cache().release_session(PREFETCH_SESSION);
    outcome
}
