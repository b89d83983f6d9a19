//! The MoE-call ring: a submission/completion area inside a client's shared-memory segment
//! (`crate::shm_layout`) that carries one call per entry between hostd's model thread and an
//! expertd worker with no RPC, no async runtime and no thread hand-off. Entry `i` pairs with
//! activation slot `i`; its input and output regions are named by offset in the entry.
//!
//! ```text
//! ring (at the segment header's ring_offset, 64-aligned)
//! +0    control (64 B): doorbell u32 | daemon_waiting u32 | daemon_gone u32
//! +64   entry 0: control + cost (128 B) | error text (256 B) | ids (cells u32) | weights (cells f32)
//!       entry 1: …
//! ```
//!
//! Protocol (one entry): the client writes the call's fields, stores `state = SUBMITTED`
//! (release), bumps `doorbell` and wakes it with a futex if `daemon_waiting`. The worker claims
//! the entry (`SUBMITTED → RUNNING`, acquire), copies every field out of shared memory *before*
//! validating it (the client may keep writing), computes, writes the output and the cost, stores
//! `DONE` or `FAILED` (release) and wakes the entry's `state` word if `client_waiting`. Both
//! sides spin briefly before sleeping on the futex. The client frees the entry (`FREE`) after
//! reading the result. Scalars are accessed as atomics (a misbehaving peer can race them, never
//! cause undefined behaviour); arrays are copied.
//!
//! An `OP_MOE` entry may carry a prefetch hint for a later layer in the cells after the call's
//! own (`hint_layer`, `hint_n` in the header; [`Entry::submit_with_hint`]); a worker that
//! predates those fields ignores them, a client that predates them leaves them zero.
//!
//! This module owns the byte layout and the wait/wake primitives, not the mapping: the segment
//! owners (`hostd/src/expert_client/shm.rs`, `expertd/src/shm.rs`) construct [`RingView`]s.

use crate::call_cost::CallCost;
use crate::ids::LayerId;
use crate::shm_layout::{SEGMENT_HEADER_BYTES, SLICE_ALIGN, ShmLayoutError};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The entry is the client's.
pub const STATE_FREE: u32 = 0;
/// The client submitted the entry; the worker has not claimed it yet.
pub const STATE_SUBMITTED: u32 = 1;
/// The worker is running the entry.
pub const STATE_RUNNING: u32 = 2;
/// The worker finished; the output and cost are written.
pub const STATE_DONE: u32 = 3;
/// The worker refused or failed the call; `status` and the error text say why.
pub const STATE_FAILED: u32 = 4;

/// Compute one MoE layer (the `MoeLayer` RPC's meaning).
pub const OP_MOE: u32 = 1;
/// Copy the input rows to the output unchanged: the transport alone, for round-trip benchmarks.
pub const OP_ECHO: u32 = 2;
/// A hint: `layer`'s experts `ids[..top_k]` will probably be called next; read the ones not
/// resident (speculatively, capped, demand reads first). Completes at once; the client does
/// not wait for it. Only on the ring's last entry, which no activation slot uses.
pub const OP_PREFETCH: u32 = 3;

/// Bytes of the ring's control block.
pub const CONTROL_BYTES: u64 = 64;
/// Bytes of an entry's control and cost fields.
pub const ENTRY_HEADER_BYTES: u64 = 128;
/// Bytes of an entry's error text.
pub const ERROR_BYTES: u64 = 256;
/// Most entries a ring may have.
pub const MAX_ENTRIES: u32 = 64;
/// Most cells (`n_rows × top_k`) an entry may carry.
pub const MAX_CELLS: u32 = 1 << 20;

// Entry field offsets.
const F_STATE: u64 = 0;
const F_OP: u64 = 4;
const F_SEQ: u64 = 8;
const F_DONE_SEQ: u64 = 12;
const F_LAYER: u64 = 16;
const F_N_ROWS: u64 = 20;
const F_TOP_K: u64 = 24;
const F_STATUS: u64 = 28;
const F_STEP: u64 = 32;
const F_INPUT: u64 = 40;
const F_OUTPUT: u64 = 48;
const F_CLIENT_WAITING: u64 = 56;
const F_ERROR_LEN: u64 = 60;
const F_QUEUE_NS: u64 = 64;
const F_IO_WAIT_NS: u64 = 72;
const F_COMPUTE_NS: u64 = 80;
const F_BYTES_READ: u64 = 88;
const F_HITS: u64 = 96;
const F_MISSES: u64 = 100;
const F_PREFETCHED_HITS: u64 = 104;
const F_HINT_LAYER: u64 = 108;
const F_HINT_N: u64 = 112;

/// Where a ring sits in a segment and how big its entries are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingLayout {
    /// Offset of the control block from the segment start (a multiple of [`SLICE_ALIGN`]).
    pub offset: u64,
    /// Entries (at most [`MAX_ENTRIES`]).
    pub entries: u32,
    /// Cells one entry carries (`n_rows × top_k` of its largest call).
    pub cells: u32,
}

fn round64(n: u64) -> u64 {
    n.div_ceil(SLICE_ALIGN) * SLICE_ALIGN
}

impl RingLayout {
    /// Bytes of one entry.
    pub fn entry_bytes(&self) -> u64 {
        ENTRY_HEADER_BYTES + ERROR_BYTES + 2 * round64(u64::from(self.cells) * 4)
    }

    /// Bytes of the whole ring.
    pub fn bytes(&self) -> u64 {
        CONTROL_BYTES + u64::from(self.entries) * self.entry_bytes()
    }

    /// Offset of entry `i` relative to the ring.
    fn entry(&self, i: u32) -> u64 {
        CONTROL_BYTES + u64::from(i) * self.entry_bytes()
    }

    /// Checks the layout against a segment of `segment_bytes`: aligned, after the header,
    /// entry and cell counts in range, and wholly inside the segment (checked arithmetic).
    pub fn check(&self, segment_bytes: u64) -> Result<(), ShmLayoutError> {
        let field = |field, found: u64, expected: u64| {
            Err(ShmLayoutError::HeaderField {
                field,
                found,
                expected,
            })
        };
        if !self.offset.is_multiple_of(SLICE_ALIGN) || self.offset < SEGMENT_HEADER_BYTES as u64 {
            return field("ring_offset", self.offset, SEGMENT_HEADER_BYTES as u64);
        }
        if self.entries == 0 || self.entries > MAX_ENTRIES {
            return field(
                "ring_entries",
                u64::from(self.entries),
                u64::from(MAX_ENTRIES),
            );
        }
        if self.cells == 0 || self.cells > MAX_CELLS {
            return field("ring_cells", u64::from(self.cells), u64::from(MAX_CELLS));
        }
        // Bounded above, so no overflow: ≤ 64 × (384 + 2 × 4 MiB) plus the offset, checked.
        match self.offset.checked_add(self.bytes()) {
            Some(end) if end <= segment_bytes => Ok(()),
            _ => Err(ShmLayoutError::SliceBounds {
                offset_bytes: self.offset,
                length_bytes: self.bytes(),
                segment_bytes,
            }),
        }
    }
}

/// A ring inside a mapped segment. Copyable: it is an address and a layout; the segment owner
/// keeps the mapping alive for as long as any view exists.
#[derive(Debug, Clone, Copy)]
pub struct RingView {
    base: *mut u8,
    layout: RingLayout,
}

// SAFETY: a view only computes addresses inside a shared mapping and accesses them through
// atomics or bounded copies; the mapping's owner keeps it alive (see `RingView::new`).
unsafe impl Send for RingView {}
// SAFETY: as above.
unsafe impl Sync for RingView {}

impl RingView {
    /// A view of the ring described by `layout` in the segment mapped at `segment`.
    ///
    /// # Safety
    ///
    /// `segment` must be the start of a mapping of at least `layout.offset + layout.bytes()`
    /// bytes (use [`RingLayout::check`]) that stays mapped while the view or any copy of it is
    /// used, and must be aligned to at least 64 bytes (a page-aligned mapping is).
    pub unsafe fn new(segment: *mut u8, layout: RingLayout) -> RingView {
        RingView {
            base: segment,
            layout,
        }
    }

    /// The layout.
    pub fn layout(&self) -> &RingLayout {
        &self.layout
    }

    fn ptr(&self, ring_offset: u64) -> *mut u8 {
        assert!(ring_offset < self.layout.bytes());
        // SAFETY: `ring_offset` lies inside the ring (callers pass field offsets of a valid
        // entry or the control block), which lies inside the mapping (`new`'s contract).
        unsafe { self.base.add((self.layout.offset + ring_offset) as usize) }
    }

    #[expect(clippy::cast_ptr_alignment, reason = "4-aligned: see the SAFETY note")]
    fn u32_at(&self, ring_offset: u64) -> &AtomicU32 {
        // SAFETY: inside the mapping (see `ptr`), 4-aligned (field offsets are multiples of 4
        // from 64-aligned starts), and only ever accessed atomically by this code.
        unsafe { &*(self.ptr(ring_offset) as *const AtomicU32) }
    }

    #[expect(clippy::cast_ptr_alignment, reason = "8-aligned: see the SAFETY note")]
    fn u64_at(&self, ring_offset: u64) -> &AtomicU64 {
        // SAFETY: as `u32_at`; u64 fields sit at multiples of 8.
        unsafe { &*(self.ptr(ring_offset) as *const AtomicU64) }
    }

    /// The doorbell: bumped by the client after each submission (the worker's futex word).
    pub fn doorbell(&self) -> &AtomicU32 {
        self.u32_at(0)
    }

    /// Set by the worker while it sleeps on the doorbell.
    pub fn daemon_waiting(&self) -> &AtomicU32 {
        self.u32_at(4)
    }

    /// Set by the worker when it stops serving the ring (session closed, daemon draining).
    pub fn daemon_gone(&self) -> &AtomicU32 {
        self.u32_at(8)
    }

    /// Entry `i` (< `entries`).
    pub fn entry(&self, i: u32) -> Entry<'_> {
        assert!(
            i < self.layout.entries,
            "ring entry {i} of {}",
            self.layout.entries
        );
        Entry {
            ring: self,
            at: self.layout.entry(i),
        }
    }

    /// Marks every entry free and clears the control block (the client, before first use).
    pub fn reset(&self) {
        for w in [self.doorbell(), self.daemon_waiting(), self.daemon_gone()] {
            w.store(0, Ordering::SeqCst);
        }
        for i in 0..self.layout.entries {
            let e = self.entry(i);
            e.client_waiting().store(0, Ordering::Relaxed);
            e.state().store(STATE_FREE, Ordering::SeqCst);
        }
    }

    /// Client side: rings the doorbell after a submission, waking the worker if it sleeps.
    pub fn ring_doorbell(&self) {
        self.doorbell().fetch_add(1, Ordering::SeqCst);
        if self.daemon_waiting().load(Ordering::SeqCst) != 0 {
            futex_wake(self.doorbell());
        }
    }
}

/// The scalar fields of a submitted call, as the worker copied them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Submission {
    /// [`OP_MOE`] or [`OP_ECHO`] (anything else is refused).
    pub op: u32,
    /// The client's sequence number, echoed in `done_seq`.
    pub seq: u32,
    /// Layer.
    pub layer: LayerId,
    /// Rows.
    pub n_rows: u32,
    /// Experts per row.
    pub top_k: u32,
    /// The client's step counter (route traces).
    pub step: u64,
    /// Offset of the input rows in the segment.
    pub input_offset: u64,
    /// Offset of the output rows in the segment.
    pub output_offset: u64,
}

/// Checks a prefetch hint, carried by an `OP_MOE` entry (`Entry::hint`, the cells after the
/// call's) or sent alone in an `OP_PREFETCH` entry: a layer below `n_layers`, 1..=`n_experts` experts,
/// each below `n_experts`. The message names what is wrong; the caller says which hint it was.
pub fn check_hint(
    layer: LayerId,
    experts: &[u32],
    n_layers: usize,
    n_experts: usize,
) -> Result<(), String> {
    if layer.index() >= n_layers || experts.is_empty() || experts.len() > n_experts {
        return Err(format!(
            "layer {layer} (of {n_layers}), {} experts (1..={n_experts})",
            experts.len()
        ));
    }
    if let Some(e) = experts.iter().find(|&&e| e as usize >= n_experts) {
        return Err(format!(
            "expert {e} out of range (layer has {n_experts} experts)"
        ));
    }
    Ok(())
}

/// One entry of a ring.
#[derive(Clone, Copy)]
pub struct Entry<'a> {
    ring: &'a RingView,
    at: u64,
}

impl Entry<'_> {
    fn u32(&self, f: u64) -> &AtomicU32 {
        self.ring.u32_at(self.at + f)
    }
    fn u64(&self, f: u64) -> &AtomicU64 {
        self.ring.u64_at(self.at + f)
    }

    /// The entry's state word (also its futex word).
    pub fn state(&self) -> &AtomicU32 {
        self.u32(F_STATE)
    }

    /// Set by the client while it sleeps on `state`.
    pub fn client_waiting(&self) -> &AtomicU32 {
        self.u32(F_CLIENT_WAITING)
    }

    fn cells_ptr(&self, second: bool) -> *mut u8 {
        let arr = round64(u64::from(self.ring.layout.cells) * 4);
        self.ring
            .ptr(self.at + ENTRY_HEADER_BYTES + ERROR_BYTES + if second { arr } else { 0 })
    }

    /// Client: writes a call into a free entry and submits it (then ring the doorbell).
    /// `ids` and `weights` must have the same length, at most the ring's `cells`.
    pub fn submit(&self, s: &Submission, ids: &[u32], weights: &[f32]) {
        self.submit_with_hint(s, ids, weights, LayerId::new(0), &[]);
    }

    /// [`submit`](Self::submit) for an `OP_MOE` call that also carries a prefetch hint:
    /// experts of `hint_layer` predicted for a later call, written in the cells after the
    /// call's own (`ids.len() + hint.len()` must fit the ring's `cells`; their weights are 0).
    /// The worker queues them for the speculative reader once the call's own reads are under
    /// way, so the hint's reads follow the demand reads on the disk with no gap. A worker that
    /// predates the hint fields reads only the call's cells and ignores the rest.
    pub fn submit_with_hint(
        &self,
        s: &Submission,
        ids: &[u32],
        weights: &[f32],
        hint_layer: LayerId,
        hint: &[u32],
    ) {
        let cells = self.ring.layout.cells as usize;
        assert!(
            ids.len() == weights.len() && ids.len() + hint.len() <= cells,
            "ring entry cells"
        );
        let r = Ordering::Relaxed;
        self.u32(F_OP).store(s.op, r);
        self.u32(F_SEQ).store(s.seq, r);
        self.u32(F_LAYER).store(s.layer.get(), r);
        self.u32(F_N_ROWS).store(s.n_rows, r);
        self.u32(F_TOP_K).store(s.top_k, r);
        self.u64(F_STEP).store(s.step, r);
        self.u64(F_INPUT).store(s.input_offset, r);
        self.u64(F_OUTPUT).store(s.output_offset, r);
        self.u32(F_HINT_LAYER).store(hint_layer.get(), r);
        self.u32(F_HINT_N).store(hint.len() as u32, r);
        // SAFETY: the call's and the hint's cells together fit the entry's cell areas
        // (asserted), which lie inside the ring; the sources hold the lengths copied.
        // The copies are atomic stores (`crate::shm_copy`): the daemon maps the same bytes.
        unsafe {
            let (id_cells, weight_cells) = (self.cells_ptr(false), self.cells_ptr(true));
            crate::shm_copy::store_to_shared(id_cells, bytemuck::cast_slice(ids));
            crate::shm_copy::store_to_shared(
                id_cells.add(ids.len() * 4),
                bytemuck::cast_slice(hint),
            );
            crate::shm_copy::store_to_shared(weight_cells, bytemuck::cast_slice(weights));
            crate::shm_copy::zero_shared(weight_cells.add(weights.len() * 4), hint.len() * 4);
        }
        self.state().store(STATE_SUBMITTED, Ordering::SeqCst);
    }

    /// Worker: claims a submitted entry. `None` if it is not submitted (or another claimed it).
    pub fn claim(&self) -> Option<Submission> {
        self.state()
            .compare_exchange(
                STATE_SUBMITTED,
                STATE_RUNNING,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .ok()?;
        let r = Ordering::Relaxed;
        Some(Submission {
            op: self.u32(F_OP).load(r),
            seq: self.u32(F_SEQ).load(r),
            layer: LayerId::new(self.u32(F_LAYER).load(r)),
            n_rows: self.u32(F_N_ROWS).load(r),
            top_k: self.u32(F_TOP_K).load(r),
            step: self.u64(F_STEP).load(r),
            input_offset: self.u64(F_INPUT).load(r),
            output_offset: self.u64(F_OUTPUT).load(r),
        })
    }

    /// Worker: the hint a claimed `OP_MOE` entry carries after its cells, as (layer, experts);
    /// `(_, 0)` when none. Copied once; the caller validates both against the call and the
    /// ring before use.
    pub fn hint(&self) -> (LayerId, u32) {
        (
            LayerId::new(self.u32(F_HINT_LAYER).load(Ordering::Relaxed)),
            self.u32(F_HINT_N).load(Ordering::Relaxed),
        )
    }

    /// Worker: copies the first `n` ids and weights out (`n` ≤ the ring's `cells`, which the
    /// caller checks against the claimed counts first).
    pub fn read_cells(&self, n: usize, ids: &mut Vec<u32>, weights: &mut Vec<f32>) {
        assert!(n <= self.ring.layout.cells as usize, "ring entry cells");
        ids.resize(n, 0);
        weights.resize(n, 0.0);
        // SAFETY: `n` cells fit both areas (asserted) and the destinations hold `n` elements.
        // The client may write the cells meanwhile: the loads are atomic (`crate::shm_copy`).
        unsafe {
            crate::shm_copy::load_from_shared(
                self.cells_ptr(false),
                bytemuck::cast_slice_mut(ids.as_mut_slice()),
            );
            crate::shm_copy::load_from_shared(
                self.cells_ptr(true),
                bytemuck::cast_slice_mut(weights.as_mut_slice()),
            );
        }
    }

    /// Worker: publishes a successful call and wakes the client if it sleeps.
    pub fn complete(&self, seq: u32, c: &CallCost) {
        let r = Ordering::Relaxed;
        self.u64(F_QUEUE_NS).store(c.queue_ns, r);
        self.u64(F_IO_WAIT_NS).store(c.io_wait_ns, r);
        self.u64(F_COMPUTE_NS).store(c.compute_ns, r);
        self.u64(F_BYTES_READ).store(c.bytes_read, r);
        self.u32(F_HITS).store(c.hits, r);
        self.u32(F_MISSES).store(c.misses, r);
        self.u32(F_PREFETCHED_HITS).store(c.prefetched_hits, r);
        self.finish(seq, STATE_DONE);
    }

    /// Worker: publishes a failed call with a status code and message, and wakes the client.
    pub fn fail(&self, seq: u32, code: u32, message: &str) {
        let mut n = message.len().min(ERROR_BYTES as usize);
        while !message.is_char_boundary(n) {
            n -= 1;
        }
        // SAFETY: `n` ≤ ERROR_BYTES bytes, the size of the entry's error area.
        unsafe {
            crate::shm_copy::store_bytes_to_shared(
                self.ring.ptr(self.at + ENTRY_HEADER_BYTES),
                &message.as_bytes()[..n],
            );
        };
        self.u32(F_ERROR_LEN).store(n as u32, Ordering::Relaxed);
        self.u32(F_STATUS).store(code, Ordering::Relaxed);
        self.finish(seq, STATE_FAILED);
    }

    fn finish(&self, seq: u32, state: u32) {
        self.u32(F_DONE_SEQ).store(seq, Ordering::Relaxed);
        self.state().store(state, Ordering::SeqCst);
        if self.client_waiting().load(Ordering::SeqCst) != 0 {
            futex_wake(self.state());
        }
    }

    /// Client: the finished call's sequence number, cost, and failure (code, message) if any.
    pub fn result(&self) -> (u32, CallCost, Option<(u32, String)>) {
        let r = Ordering::Relaxed;
        let c = CallCost {
            queue_ns: self.u64(F_QUEUE_NS).load(r),
            io_wait_ns: self.u64(F_IO_WAIT_NS).load(r),
            compute_ns: self.u64(F_COMPUTE_NS).load(r),
            bytes_read: self.u64(F_BYTES_READ).load(r),
            hits: self.u32(F_HITS).load(r),
            misses: self.u32(F_MISSES).load(r),
            prefetched_hits: self.u32(F_PREFETCHED_HITS).load(r),
        };
        let failure = (self.state().load(Ordering::Acquire) == STATE_FAILED).then(|| {
            let n = (self.u32(F_ERROR_LEN).load(r) as usize).min(ERROR_BYTES as usize);
            let mut buf = vec![0u8; n];
            // SAFETY: `n` ≤ ERROR_BYTES, the size of the entry's error area.
            unsafe {
                crate::shm_copy::load_bytes_from_shared(
                    self.ring.ptr(self.at + ENTRY_HEADER_BYTES),
                    &mut buf,
                );
            };
            (
                self.u32(F_STATUS).load(r),
                String::from_utf8_lossy(&buf).into_owned(),
            )
        });
        (self.u32(F_DONE_SEQ).load(r), c, failure)
    }

    /// Client: waits until the worker finished the entry (`DONE` or `FAILED`): spins for
    /// `spin`, then sleeps on the futex in slices of `slice`, calling `alive` between slices;
    /// gives up (returns `false`) when `alive` says the peer is gone.
    pub fn wait_finished(
        &self,
        spin: Duration,
        slice: Duration,
        mut alive: impl FnMut() -> bool,
    ) -> bool {
        let finished = |s: u32| s == STATE_DONE || s == STATE_FAILED;
        if spin_until(spin, || finished(self.state().load(Ordering::Acquire))) {
            return true;
        }
        loop {
            self.client_waiting().store(1, Ordering::SeqCst);
            let s = self.state().load(Ordering::SeqCst);
            if finished(s) {
                self.client_waiting().store(0, Ordering::Relaxed);
                return true;
            }
            futex_wait(self.state(), s, Some(slice));
            self.client_waiting().store(0, Ordering::Relaxed);
            if finished(self.state().load(Ordering::Acquire)) {
                return true;
            }
            if !alive() {
                return false;
            }
        }
    }
}

/// Spins (with a yield every few iterations, so two processes sharing a core both progress)
/// until `done()` or `budget` has passed. Returns whether `done()` became true.
pub fn spin_until(budget: Duration, mut done: impl FnMut() -> bool) -> bool {
    if done() {
        return true;
    }
    let start = Instant::now();
    let mut i = 0u32;
    loop {
        for _ in 0..32 {
            std::hint::spin_loop();
        }
        if done() {
            return true;
        }
        i += 1;
        if i.is_multiple_of(8) {
            if start.elapsed() >= budget {
                return false;
            }
            std::thread::yield_now();
        }
    }
}

/// Sleeps while `*word == expected`, at most `timeout`. Shared (not process-private) futex:
/// the word lives in a mapping both processes share. Spurious returns are allowed.
#[cfg(target_os = "linux")]
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    use rustix::thread::futex;
    // Durations too long for a timespec (none here) sleep without a timeout.
    let ts = timeout.and_then(|t| futex::Timespec::try_from(t).ok());
    // Errors (EAGAIN: the value changed; ETIMEDOUT; EINTR) all mean "look again", which every
    // caller does.
    let _ = futex::wait(word, futex::Flags::empty(), expected, ts.as_ref());
}

/// Wakes every sleeper on `word`.
#[cfg(target_os = "linux")]
pub fn futex_wake(word: &AtomicU32) {
    use rustix::thread::futex;
    let _ = futex::wake(word, futex::Flags::empty(), i32::MAX as u32);
}

/// Portable fallback: a short sleep (no futex outside Linux).
#[cfg(not(target_os = "linux"))]
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    if word.load(Ordering::SeqCst) == expected {
        std::thread::sleep(
            timeout
                .unwrap_or(Duration::from_millis(1))
                .min(Duration::from_micros(200)),
        );
    }
}

/// Portable fallback: nothing to wake (sleepers poll).
#[cfg(not(target_os = "linux"))]
pub fn futex_wake(_word: &AtomicU32) {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reset ring of `entries` entries of `cells` cells at offset 64 of a zeroed buffer,
    /// returned beside the view: keep it alive as long as the view.
    fn fresh_ring(entries: u32, cells: u32) -> (Vec<u64>, RingView) {
        let layout = RingLayout {
            offset: 64,
            entries,
            cells,
        };
        let mut buf = vec![0u64; ((64 + layout.bytes()) / 8) as usize];
        layout.check((buf.len() * 8) as u64).expect("layout fits");
        // SAFETY: the buffer is 8-aligned and is returned with the view, so each test keeps it
        // alive as long as the view (moving the Vec does not move its heap allocation); the
        // tests only use fields, which need 4/8 alignment (64 is required for real segments
        // only).
        let ring = unsafe { RingView::new(buf.as_mut_ptr().cast::<u8>(), layout) };
        ring.reset();
        (buf, ring)
    }

    #[test]
    fn layouts_are_checked() {
        let l = RingLayout {
            offset: 128,
            entries: 2,
            cells: 8,
        };
        assert_eq!(l.entry_bytes(), 128 + 256 + 64 + 64);
        assert!(l.check(128 + l.bytes()).is_ok());
        assert!(l.check(128 + l.bytes() - 1).is_err());
        assert!(RingLayout { offset: 100, ..l }.check(1 << 20).is_err());
        assert!(RingLayout { offset: 0, ..l }.check(1 << 20).is_err());
        assert!(RingLayout { entries: 0, ..l }.check(1 << 20).is_err());
        assert!(
            RingLayout {
                entries: MAX_ENTRIES + 1,
                ..l
            }
            .check(1 << 30)
            .is_err()
        );
        assert!(RingLayout { cells: 0, ..l }.check(1 << 20).is_err());
        assert!(
            RingLayout {
                offset: u64::MAX - 63,
                ..l
            }
            .check(u64::MAX)
            .is_err()
        );
    }

    #[test]
    fn a_call_round_trips_between_two_threads() {
        let (_buf, ring) = fresh_ring(2, 4);
        let worker = std::thread::scope(|s| {
            let h = s.spawn(|| {
                // The worker: wait for the doorbell, claim entry 1, answer.
                loop {
                    if let Some(sub) = ring.entry(1).claim() {
                        let (mut ids, mut w) = (Vec::new(), Vec::new());
                        ring.entry(1).read_cells(
                            (sub.n_rows * sub.top_k) as usize,
                            &mut ids,
                            &mut w,
                        );
                        assert_eq!(ids, [3, 1]);
                        assert_eq!(w, [0.5, 0.25]);
                        ring.entry(1).complete(
                            sub.seq,
                            &CallCost {
                                hits: 2,
                                ..CallCost::default()
                            },
                        );
                        return sub;
                    }
                    let d = ring.doorbell().load(Ordering::SeqCst);
                    futex_wait(ring.doorbell(), d, Some(Duration::from_millis(5)));
                }
            });
            let sub = Submission {
                op: OP_MOE,
                seq: 9,
                layer: LayerId::new(3),
                n_rows: 1,
                top_k: 2,
                step: 5,
                input_offset: 64,
                output_offset: 128,
            };
            ring.entry(1).submit(&sub, &[3, 1], &[0.5, 0.25]);
            ring.ring_doorbell();
            assert!(ring.entry(1).wait_finished(
                Duration::from_micros(10),
                Duration::from_millis(5),
                || true
            ));
            let (seq, cost, failure) = ring.entry(1).result();
            assert_eq!((seq, cost.hits, failure), (9, 2, None));
            h.join().expect("worker")
        });
        assert_eq!(worker.layer, LayerId::new(3));
        assert_eq!(worker.step, 5);
        // A failure carries its code and text, cut at a character boundary.
        let e = ring.entry(0);
        e.submit(
            &Submission {
                op: OP_ECHO,
                seq: 1,
                layer: LayerId::new(0),
                n_rows: 1,
                top_k: 1,
                step: 0,
                input_offset: 64,
                output_offset: 64,
            },
            &[0],
            &[1.0],
        );
        assert!(e.claim().is_some());
        assert!(e.claim().is_none(), "an entry is claimed once");
        e.fail(1, 3, &"é".repeat(200));
        let (_, _, failure) = e.result();
        let (code, text) = failure.expect("failed");
        assert_eq!(code, 3);
        assert_eq!(text.len(), 256);
    }

    #[test]
    fn a_hint_rides_after_the_calls_cells_and_a_plain_submit_clears_it() {
        let (_buf, ring) = fresh_ring(1, 5);
        let e = ring.entry(0);
        let sub = Submission {
            op: OP_MOE,
            seq: 1,
            layer: LayerId::new(2),
            n_rows: 1,
            top_k: 2,
            step: 0,
            input_offset: 64,
            output_offset: 128,
        };
        e.submit_with_hint(&sub, &[7, 4], &[0.75, 0.25], LayerId::new(3), &[1, 6, 0]);
        assert!(e.claim().is_some());
        assert_eq!(e.hint(), (LayerId::new(3), 3));
        let (mut ids, mut w) = (Vec::new(), Vec::new());
        e.read_cells(5, &mut ids, &mut w);
        assert_eq!(ids, [7, 4, 1, 6, 0]);
        assert_eq!(w, [0.75, 0.25, 0.0, 0.0, 0.0]);
        e.state().store(STATE_FREE, Ordering::SeqCst);
        e.submit(&sub, &[7, 4], &[0.75, 0.25]);
        assert_eq!(
            e.hint().1,
            0,
            "a call without a hint must not inherit the last one's"
        );
        let full = std::panic::catch_unwind(|| {
            e.submit_with_hint(&sub, &[7, 4], &[0.75, 0.25], LayerId::new(3), &[1, 6, 0, 5]);
        });
        assert!(
            full.is_err(),
            "the call's and the hint's cells must fit the entry"
        );
    }

    #[test]
    fn a_dead_peer_ends_the_wait() {
        let (_buf, ring) = fresh_ring(1, 1);
        let mut asked = 0;
        let finished =
            ring.entry(0)
                .wait_finished(Duration::ZERO, Duration::from_millis(1), || {
                    asked += 1;
                    asked < 3
                });
        assert!(!finished);
        assert_eq!(asked, 3);
    }
}
