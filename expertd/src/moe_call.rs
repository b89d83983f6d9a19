//! One `MoeLayer` call, end to end inside the daemon: validate the call against the container,
//! lease its experts from the cache, read the misses (all submitted together) through the
//! `ExpertSource`, mark them filled, view each blob as the int8 kernel's matrices, run the
//! experts in parallel on the compute pool, and sum each row's weighted outputs in the order
//! the call lists them.
//!
//! The arithmetic is exactly `hostd`'s in-process INT8 backend (`hostd/src/experts/int8.rs`):
//! each expert runs `expert_forward` over the rows routed to it (rows in cell order), and
//! `out[r] = Σ_k w[r,k] · y[r,k]` is accumulated from zero in call order, so hostd with expertd
//! and hostd alone produce bit-identical logits. Transport, sessions, queueing and status codes
//! are the caller's (`crate::rpc`).
//!
//! [`CallExecutor`] owns what every call needs (the expert reader, the cache, the compute pool
//! and the kernel ISA) and runs calls on it; `shared::moe_exec::MoeExec` is the arithmetic of
//! one call inside it. (hostd's `engine/` is something else: the serving scheduler.)

use crate::cache::{CacheError, ExpertCache, ExpertKey, SessionId};
use crate::io::{ExpertSource, IoError, ReadRequest};
use crate::prefetch::{Hint, Prefetcher};
use shared::call_cost::CallCost;
use shared::container::{BlobAt, BlobLayout, ContainerError, ExpertBlob, Header};
use shared::ids::{ExpertId, LayerId};
use shared::kernels::int8::Int8Isa;
use shared::moe_exec::{ExpertMatrices, MoeExec};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// Why a call failed inside the call executor. `Invalid` names the field; the others name the layer
/// and expert where one is involved.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The call is malformed (lengths, ids, weights, rows).
    #[error("invalid call for layer {layer}: {reason}")]
    Invalid {
        /// Layer of the call.
        layer: LayerId,
        /// What is wrong.
        reason: String,
    },
    /// The cache refused the call (every slot and transient buffer leased) or another call's
    /// read of a shared expert failed.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// Reading an expert failed (checksum mismatch, short read, device error).
    #[error(transparent)]
    Io(#[from] IoError),
    /// The call's buffers would exceed what the daemon allows one call (`crate::call_memory`).
    #[error(
        "call for layer {layer} refused: n_tokens {n_rows} × top_k {top_k} needs about {needed} B of buffers in the daemon, which allows one call {allowed} B (its --max-rows-per-call at top_k 8); send fewer rows per call"
    )]
    TooLarge {
        /// Layer of the call.
        layer: LayerId,
        /// Rows.
        n_rows: usize,
        /// Experts per row.
        top_k: usize,
        /// The call's bound.
        needed: u64,
        /// The most one call may take.
        allowed: u64,
    },
    /// A verified blob could not be viewed as matrices (an internal inconsistency).
    #[error("layer {layer} expert {expert}: blob part {part} is misaligned in the cache buffer")]
    Misaligned {
        /// Layer.
        layer: LayerId,
        /// Expert.
        expert: ExpertId,
        /// The part that could not be viewed.
        part: &'static str,
    },
}

/// The routing part of one call, already decoded from the wire.
#[derive(Debug, Clone, Copy)]
pub struct CallSpec<'a> {
    /// The session (for leases and the route trace).
    pub session: u64,
    /// The client's step counter (for the route trace).
    pub step: u64,
    /// Layer.
    pub layer: LayerId,
    /// Rows.
    pub n_rows: usize,
    /// Experts per row.
    pub top_k: usize,
    /// `n_rows × top_k` expert ids, row-major.
    pub ids: &'a [u32],
    /// `n_rows × top_k` weights aligned with `ids`.
    pub weights: &'a [f32],
}

/// The daemon's call executor: what every MoE call needs (the container's source, the cache and
/// its leases, the compute pool and the kernels) and the per-call path over them.
pub struct CallExecutor {
    cache: ExpertCache,
    source: Box<dyn ExpertSource>,
    isa: Int8Isa,
    header: Header,
    pool: rayon::ThreadPool,
    /// What a call may be and hold (checked before its buffers exist).
    limits: crate::call::CallLimits,
    /// Most experts one wave of a call leases at once: half of what the cache can ever lend
    /// (resident slots + transient buffers), so a call whose experts exceed the cache (a long
    /// prefill under a small budget) runs in waves instead of failing, and concurrent calls
    /// leave each other room.
    wave_experts: usize,
    /// Waves reading demand misses now (speculative reads wait while this is non-zero).
    demand_reads: AtomicU32,
    /// Per session, the (step, layer) of its latest call to start (speculative reads for a
    /// layer whose call has started are dropped).
    demand_progress: std::sync::Mutex<std::collections::HashMap<u64, (u64, LayerId)>>,
    /// The speculative reader, when the daemon runs one.
    prefetcher: OnceLock<Arc<Prefetcher>>,
    /// Compute a wave's resident experts while its misses are read (off: read, then compute,
    /// as before the call ring; for A/B measurements).
    overlap: bool,
    /// Held by the one caller of [`CallExecutor::with_pool_awake`] whose burst keeps `pool` awake.
    awake: std::sync::Mutex<()>,
    /// Calls running now off the compute pool (gRPC calls, ring calls of a session that does not
    /// hold the kept-awake pool): while any runs, no burst keeps the pool, so that pool thread 0
    /// is not held polling one session's ring while another session's call waits for it.
    off_pool_calls: AtomicU32,
    /// Calls started off the compute pool since the executor started (with `off_pool_calls`, a
    /// burst sees every call that started while it held the pool, however short).
    off_pool_started: AtomicU64,
}

/// How long a wave waits for leases held by other calls before giving up with the cache's
/// `Exhausted` error. Waves never hold leases while waiting, so waiting cannot deadlock.
const WAVE_WAIT_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

impl CallExecutor {
    /// An executor over `source` with `cache`, computing with `isa` on `threads` threads (0: one
    /// per core), accepting calls of up to `max_rows` rows.
    pub fn new(
        cache: ExpertCache,
        source: Box<dyn ExpertSource>,
        isa: Int8Isa,
        threads: usize,
        max_rows: usize,
    ) -> std::io::Result<CallExecutor> {
        let header = *source.container().header();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("expertd-compute-{i}"))
            .build()
            .map_err(std::io::Error::other)?;
        let st = cache.stats();
        let wave_experts = (((st.n_slots + st.transient_slots) / 2).max(1)) as usize;
        let dims = header.layout.dims;
        let limits = crate::call::CallLimits {
            n_layers: dims.n_layers,
            n_experts: dims.n_experts,
            hidden: dims.hidden,
            max_rows,
            memory: crate::call_memory::CallMemory::new(
                dims.hidden,
                dims.inner,
                pool.current_num_threads(),
                max_rows,
                dims.n_experts,
            ),
        };
        Ok(CallExecutor {
            cache,
            source,
            isa,
            header,
            pool,
            limits,
            wave_experts,
            demand_reads: AtomicU32::new(0),
            demand_progress: Default::default(),
            prefetcher: OnceLock::new(),
            overlap: true,
            awake: std::sync::Mutex::new(()),
            off_pool_calls: AtomicU32::new(0),
            off_pool_started: Default::default(),
        })
    }

    /// Leases one wave's experts, waiting (bounded by [`WAVE_WAIT_LIMIT`], woken by each
    /// release of leases) while other calls hold every slot and transient buffer; a refused
    /// acquire changes nothing in the cache.
    fn acquire_wave(
        &self,
        spec: &CallSpec<'_>,
        keys: &[ExpertKey],
    ) -> Result<crate::cache::Acquired, CallError> {
        self.cache
            .acquire_within(
                SessionId(spec.session),
                spec.step,
                keys,
                Instant::now() + WAVE_WAIT_LIMIT,
            )
            .map_err(CallError::from)
    }

    /// Runs `f` (a ring worker's burst of calls) with the compute pool's threads kept awake,
    /// yielding their cores between checks for work ([`shared::keep_awake`]), so that each call
    /// of the burst starts its parallel compute without waking sleeping threads. `f` runs on a
    /// pool thread and should end as soon as [`contended_since`](Self::contended_since) says
    /// another call ran beside it. One burst at a time: while another holds the pool, or while
    /// another call runs off the pool, `f` runs here as is (its calls count as off-pool calls).
    pub fn with_pool_awake<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        if self.contended() {
            return f();
        }
        let _held = match self.awake.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return f(),
        };
        shared::keep_awake::run_on(&self.pool, shared::keep_awake::Awake::Yield, f)
    }

    /// Whether a call runs off the compute pool now (another session's, or a gRPC call).
    pub fn contended(&self) -> bool {
        self.off_pool_calls.load(Ordering::Acquire) > 0
    }

    /// A mark for [`contended_since`](Self::contended_since): the off-pool calls started so far.
    pub fn off_pool_mark(&self) -> u64 {
        self.off_pool_started.load(Ordering::Acquire)
    }

    /// Whether a call runs off the pool now or has started since `mark` was taken: a burst
    /// holding the kept-awake pool ends when this turns true.
    pub fn contended_since(&self, mark: u64) -> bool {
        self.contended() || self.off_pool_mark() != mark
    }

    /// Turns the hits-while-reading overlap on (default) or off.
    pub fn with_overlap(mut self, on: bool) -> CallExecutor {
        self.overlap = on;
        self
    }

    /// Attaches the speculative reader (once).
    pub fn set_prefetcher(&self, p: Arc<Prefetcher>) {
        let _ = self.prefetcher.set(p);
    }

    /// The speculative reader, if any.
    pub fn prefetcher(&self) -> Option<&Arc<Prefetcher>> {
        self.prefetcher.get()
    }

    /// Waves reading demand misses at this moment.
    pub fn demand_reads_in_flight(&self) -> u32 {
        self.demand_reads.load(Ordering::Acquire)
    }

    /// Whether `session`'s call for `layer` at `step` (or a later one) has started.
    pub fn demand_started(&self, session: u64, step: u64, layer: LayerId) -> bool {
        self.demand_progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&session)
            .is_some_and(|&p| p >= (step, layer))
    }

    /// Records that `spec`'s call starts (only once a speculative reader holds hints that
    /// may ask: a daemon no client sends hints to takes no lock here).
    fn note_demand_start(&self, spec: &CallSpec<'_>) {
        if !self.prefetcher.get().is_some_and(|p| p.has_hints()) {
            return;
        }
        let mut progress = self
            .demand_progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if progress.len() > 4096 {
            progress.clear();
        }
        progress.insert(spec.session, (spec.step, spec.layer));
    }

    /// The expert reader.
    pub fn source(&self) -> &dyn ExpertSource {
        self.source.as_ref()
    }

    /// The container header (dimensions, identity, fingerprint).
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The cache.
    pub fn cache(&self) -> &ExpertCache {
        &self.cache
    }

    /// The kernel ISA.
    pub fn isa(&self) -> Int8Isa {
        self.isa
    }

    /// The reader's name (`io_uring`, `pread`, …).
    pub fn source_name(&self) -> &'static str {
        self.source.name()
    }

    /// The largest `n_rows` a call may have.
    pub fn max_rows(&self) -> usize {
        self.limits.max_rows
    }

    /// What one call may make the daemon hold.
    pub fn call_memory(&self) -> &crate::call_memory::CallMemory {
        &self.limits.memory
    }

    /// What a call may be (rows, layer, routing, memory), checked before it queues.
    pub fn limits(&self) -> &crate::call::CallLimits {
        &self.limits
    }

    /// Elements per activation row.
    pub fn hidden(&self) -> usize {
        self.limits.hidden
    }

    /// Runs one validated call: `out[r] = Σ_k weights[r,k] · expert_{ids[r,k]}(x[r])`.
    /// `x` and `out` hold `n_rows × hidden` values; a non-finite value in `x` fails the call
    /// (`Invalid`, naming the row) before any lease is taken, and so does a non-finite output
    /// (finite activations too large for the arithmetic) after the compute. Blocks (reads and
    /// compute); run it off the async runtime. Every lease is released when this returns, on
    /// success or failure.
    pub fn run(
        &self,
        spec: &CallSpec<'_>,
        x: &[f32],
        out: &mut [f32],
    ) -> Result<CallCost, CallError> {
        self.run_hinted(spec, x, out, None)
    }

    /// [`run`](Self::run) with a prefetch hint for a later call: queued for the speculative
    /// reader (when the daemon runs one) as soon as this call's own reads are under way —
    /// counted in `demand_reads` first, so the speculative reads queue behind them — or at the
    /// end when the call reads nothing. Never changes the result.
    pub fn run_hinted(
        &self,
        spec: &CallSpec<'_>,
        x: &[f32],
        out: &mut [f32],
        hint: Option<Hint>,
    ) -> Result<CallCost, CallError> {
        let mut hint = hint.filter(|_| self.prefetcher.get().is_some());
        // Counted from before its first parallel job, so that a burst polling on pool thread 0
        // sees it and gives the thread back.
        let _off_pool = (self.pool.current_thread_index().is_none())
            .then(|| OffPoolCall::new(&self.off_pool_calls, &self.off_pool_started));
        self.note_demand_start(spec);
        let r = self.run_inner(spec, x, out, &mut hint);
        if r.is_ok()
            && let Some(p) = self.prefetcher.get()
        {
            // Speculation is earned by completed calls (the hint bucket, `crate::prefetch`).
            p.note_demand_call(spec.session);
        }
        self.send_hint(&mut hint);
        r
    }

    /// Queues `hint` (once) for the speculative reader.
    fn send_hint(&self, hint: &mut Option<Hint>) {
        if let (Some(h), Some(p)) = (hint.take(), self.prefetcher.get()) {
            p.hint(h);
        }
    }

    fn run_inner(
        &self,
        spec: &CallSpec<'_>,
        x: &[f32],
        out: &mut [f32],
        hint: &mut Option<Hint>,
    ) -> Result<CallCost, CallError> {
        // PERF-CRITICAL: the per-call path; no logging, no global locks beyond the cache's
        // short planner section, no allocation proportional to anything but the call.
        assert_eq!(x.len(), spec.n_rows * self.hidden());
        assert_eq!(out.len(), spec.n_rows * self.hidden());
        // The activations' boundary, for the RPC and the call ring alike: a NaN or an infinity
        // would quantise its whole row into finite garbage. One vectorised pass over `x`.
        if let Some((row, column, value)) = shared::moe_exec::first_non_finite(x, self.hidden()) {
            return Err(CallError::Invalid {
                layer: spec.layer,
                reason: format!(
                    "activation row {row} is not finite ({value} at column {column}); NaN and infinite activations are refused"
                ),
            });
        }
        // Experts in ascending id order (as the in-process backend does; the order does not
        // change any result, only which expert runs where).
        let mut exec = MoeExec::new(
            x,
            spec.ids,
            spec.weights,
            spec.n_rows,
            spec.top_k,
            self.hidden(),
            self.header.layout.dims.n_experts,
        );
        let n_groups = exec.groups().len();
        let mut cost = CallCost::default();
        let mut start = 0;
        while start < n_groups {
            let wave: Vec<usize> = (start..(start + self.wave_experts).min(n_groups)).collect();
            start += wave.len();
            let keys: Vec<ExpertKey> = wave
                .iter()
                .map(|&g| ExpertKey::new(spec.layer, exec.groups()[g].0))
                .collect();
            // A hit on an expert whose read by another caller (another call, or a speculative
            // read) failed is read again by this call: once, on a fresh lease.
            let w = match self.run_wave(spec, &mut exec, &wave, &keys, hint) {
                Err(CallError::Cache(CacheError::FillFailed { .. })) => {
                    self.run_wave(spec, &mut exec, &wave, &keys, hint)?
                }
                other => other?,
            };
            cost.io_wait_ns += w.io_wait_ns;
            cost.compute_ns += w.compute_ns;
            cost.hits += w.hits;
            cost.misses += w.misses;
            cost.prefetched_hits += w.prefetched_hits;
        }
        // Each row's weighted outputs summed in call order: independent of waves and cache state.
        exec.finish(out);
        // Finite activations can still overflow the experts' arithmetic (3e38 in every column:
        // the dequantised products pass f32::MAX). Such an output is refused, never returned as
        // a result: one more vectorised pass, over `out`.
        if let Some((row, column, value)) = shared::moe_exec::first_non_finite(out, self.hidden()) {
            return Err(CallError::Invalid {
                layer: spec.layer,
                reason: format!(
                    "the output of row {row} is not finite ({value} at column {column}): its activations are finite but too large for the experts' arithmetic"
                ),
            });
        }
        cost.bytes_read = u64::from(cost.misses) * self.header.layout.blob.stride as u64;
        Ok(cost)
    }

    /// One wave: lease its experts; compute the ones already resident on the pool while this
    /// thread reads the misses (all submitted together); wait for any expert another caller
    /// is reading; compute the rest. Reads and waits happen on the calling thread, never on
    /// the compute pool, so a pool thread cannot block on another call's read. Adds to
    /// its cost: IO wait = leasing + the part of the reads not hidden behind the hits' compute +
    /// waiting for other callers' reads; compute = the rest of the wave's time.
    fn run_wave(
        &self,
        spec: &CallSpec<'_>,
        exec: &mut MoeExec<'_>,
        wave: &[usize],
        keys: &[ExpertKey],
        hint: &mut Option<Hint>,
    ) -> Result<CallCost, CallError> {
        let mut cost = CallCost::default();
        let layout = self.header.layout.blob;
        let isa = self.isa;
        let t_acquire = Instant::now();
        let mut acquired = self.acquire_wave(spec, keys)?;
        cost.io_wait_ns += t_acquire.elapsed().as_nanos() as u64;
        cost.hits += acquired.n_hits();
        cost.misses += acquired.n_misses();
        if let Some(p) = self.prefetcher.get() {
            let stride = self.header.layout.blob.stride as u64;
            for l in acquired.leases() {
                if !l.is_hit() {
                    p.note_demand_miss(l.key());
                } else if p.note_hit(l.key(), stride) {
                    cost.prefetched_hits += 1;
                }
            }
        }
        let t_wave = Instant::now();
        let ready_now: Vec<usize> = acquired
            .leases()
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_ready())
            .map(|(i, _)| wave[i])
            .collect();
        let rest: Vec<usize> = wave
            .iter()
            .copied()
            .filter(|g| !ready_now.contains(g))
            .collect();
        let mut read_wait_ns = 0u64;
        if acquired.n_misses() > 0 && !self.overlap {
            // As before the call ring: read everything, then compute.
            let t = Instant::now();
            self.read_misses(acquired.misses().collect(), hint)?;
            read_wait_ns += t.elapsed().as_nanos() as u64;
        } else if acquired.n_misses() > 0 {
            let mut mine: Vec<&mut crate::cache::Lease> = Vec::new();
            let mut ready: Vec<(usize, &crate::cache::Lease)> = Vec::with_capacity(ready_now.len());
            for (lease, &g) in acquired.leases_mut().iter_mut().zip(wave) {
                if lease.needs_fill() {
                    mine.push(lease);
                } else if lease.is_ready() {
                    ready.push((g, &*lease));
                }
            }
            let exec_ref = &mut *exec;
            let mut hit_result: Result<(), CallError> = Ok(());
            let mut hits_done: Option<Instant> = None;
            let read_result = self.pool.in_place_scope(|scope| {
                if !ready_now.is_empty() {
                    scope.spawn(|_| {
                        hit_result = exec_ref.compute(isa, &ready_now, |g, _| {
                            let (_, lease) = ready
                                .iter()
                                .find(|(rg, _)| *rg == g)
                                .expect("ready_now lists the ready leases");
                            view_lease(lease, &layout)
                        });
                        hits_done = Some(Instant::now());
                    });
                }
                // This (calling) thread reads meanwhile.
                let r = self.read_misses(mine, hint);
                (r, Instant::now())
            });
            let (read_result, read_done) = read_result;
            read_result?;
            hit_result?;
            // The reads cost the wave only as far as they outlasted the hits' compute.
            read_wait_ns += hits_done.map_or_else(
                || read_done.duration_since(t_wave).as_nanos() as u64,
                |h| read_done.saturating_duration_since(h).as_nanos() as u64,
            );
        }
        let t_wait = Instant::now();
        acquired.wait_ready()?;
        read_wait_ns += t_wait.elapsed().as_nanos() as u64;
        // After an overlapped read the hits are done; otherwise nothing is computed yet.
        let to_compute: &[usize] = if acquired.n_misses() > 0 && self.overlap {
            &rest
        } else {
            wave
        };
        let leases = acquired.leases();
        // A wave is a run of consecutive groups, so group `g` is lease `g - wave[0]`.
        self.pool.install(|| {
            exec.compute(isa, to_compute, |g, _| {
                view_lease(&leases[g - wave[0]], &layout)
            })
        })?;
        cost.io_wait_ns += read_wait_ns;
        cost.compute_ns += (t_wave.elapsed().as_nanos() as u64).saturating_sub(read_wait_ns);
        Ok(cost)
    }

    /// Reads a wave's misses (all submitted together) and marks each filled; the first error
    /// fails the wave. Counted in `demand_reads` while it runs; a pending `hint` is queued
    /// once that count is up, so its speculative reads wait for these.
    fn read_misses(
        &self,
        mut mine: Vec<&mut crate::cache::Lease>,
        hint: &mut Option<Hint>,
    ) -> Result<(), CallError> {
        // Counted until this returns, even by unwinding (speculative reads wait while it is
        // non-zero).
        let _reading = DemandReading::new(&self.demand_reads);
        self.send_hint(hint);
        let mut reqs: Vec<ReadRequest<'_>> = mine
            .iter_mut()
            .map(|lease| {
                let key = lease.key();
                ReadRequest {
                    layer: key.layer,
                    expert: key.expert,
                    dst: lease.buffer_mut(),
                }
            })
            .collect();
        let results = self.source.read_blobs(&mut reqs);
        drop(reqs);
        let mut first_error = None;
        for (lease, result) in mine.into_iter().zip(results) {
            match result {
                Ok(()) => lease.mark_filled(),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), |e| Err(CallError::Io(e)))
    }
}

/// One wave's demand reads in progress, counted in `CallExecutor::demand_reads` while it lives.
struct DemandReading<'a>(&'a AtomicU32);

impl<'a> DemandReading<'a> {
    fn new(n: &'a AtomicU32) -> DemandReading<'a> {
        n.fetch_add(1, Ordering::AcqRel);
        DemandReading(n)
    }
}

impl Drop for DemandReading<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Counts one call running off the compute pool (see `CallExecutor::off_pool_calls`) until dropped.
struct OffPoolCall<'a>(&'a AtomicU32);

impl<'a> OffPoolCall<'a> {
    fn new(n: &'a AtomicU32, started: &AtomicU64) -> OffPoolCall<'a> {
        n.fetch_add(1, Ordering::AcqRel);
        started.fetch_add(1, Ordering::AcqRel);
        OffPoolCall(n)
    }
}

impl Drop for OffPoolCall<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A ready lease's blob as the kernel's two matrices, without hashing it again: the blob was
/// checked when it was read into the cache, and cache buffers are written only by that read.
fn view_lease<'a>(
    lease: &'a crate::cache::Lease,
    layout: &BlobLayout,
) -> Result<ExpertMatrices<'a>, CallError> {
    let key = lease.key();
    // The offset is the file's, which the cache buffer does not know; errors here name only the part.
    let at = BlobAt {
        layer: key.layer,
        expert: key.expert,
        offset: 0,
    };
    match ExpertBlob::view_verified(lease.bytes(), layout, at) {
        Ok(blob) => Ok(blob),
        Err(e) => {
            let part = if let ContainerError::Misaligned { part, .. } = e {
                part
            } else {
                "blob length"
            };
            Err(CallError::Misaligned {
                layer: key.layer,
                expert: key.expert,
                part,
            })
        }
    }
}
