//! The MoE-call ring as the daemon reads it (`shared::ring`): a segment whose header announces
//! a ring, with every byte after the header taken from the input, so that entries hold
//! arbitrary states, counts, offsets, ids and weights. For each entry the target claims it and
//! decodes it with the ring worker's own decoder (`expertd::call::ring_entry::decode`, the
//! same function `expertd/src/call/ring_worker.rs` calls, so the target follows any change to
//! the checks), then publishes a completion or a failure and reads it back as the client would.
//!
//! Contract, stated here independently of the decoder: no panic and no access outside the
//! segment whatever the entries hold; a call that decodes names only slices inside the
//! segment's data area (past the header, before the ring) of exactly its rows' bytes, only
//! experts of the layer, finite weights, a layer in range and a row count within the limit,
//! at most the entry's cells; a published result reads back as written (a failure message cut
//! to the error area on a character boundary).

use crate::bytes::{Aligned, Input};
use crate::{Outcome, class};
use expertd::call::CallLimits;
use expertd::call::ring_entry::{self, RingCall};
use expertd::call_memory::CallMemory;
use expertd::shm::SegmentBounds;
use shared::call_cost::CallCost;
use shared::ring::{self, ERROR_BYTES, RingLayout, RingView};
use shared::shm_layout::{SEGMENT_HEADER_BYTES, SLICE_ALIGN, SegmentHeader};
use std::ops::Range;
use std::sync::atomic::Ordering;

/// Builds the segment (structured header unless the mode asks for raw bytes), parses it as
/// `Segment::from_fd` does, then serves every entry once.
pub fn run(data: &[u8]) -> Outcome {
    let mut input = Input::new(data);
    let mode = input.u8();
    let (n_layers, n_experts, hidden, max_rows) = (
        input.small(4),
        input.small(16),
        input.small(8),
        input.small(8),
    );
    let limits = CallLimits {
        n_layers,
        n_experts,
        hidden,
        max_rows,
        memory: CallMemory::new(hidden, 2 * hidden, 1, max_rows, n_experts),
    };
    let message_len = input.u8() as usize * 2;
    let layout = RingLayout {
        offset: SEGMENT_HEADER_BYTES as u64 + SLICE_ALIGN * u64::from(input.u8() % 4),
        entries: input.small(4) as u32,
        cells: input.small(32) as u32,
    };
    let rest = input.rest();
    let (mut seg, len) = if mode & 1 == 0 {
        // A well-formed header announcing `layout`; the input fills everything after it.
        let len = layout.offset + layout.bytes() + SLICE_ALIGN * u64::from(mode >> 5);
        let header = SegmentHeader {
            ring: Some(layout),
            ..SegmentHeader::new(len)
        };
        let mut seg = Aligned::new(&[], len as usize);
        seg.bytes_mut()[..SEGMENT_HEADER_BYTES].copy_from_slice(&header.encode());
        let body = &mut seg.bytes_mut()[SEGMENT_HEADER_BYTES..];
        let n = body.len().min(rest.len());
        body[..n].copy_from_slice(&rest[..n]);
        (seg, len)
    } else {
        // Raw bytes: the header too comes from the input (capped at 64 KiB).
        let len = rest.len().min(1 << 16);
        (Aligned::new(rest, len), len as u64)
    };
    let parsed = match SegmentHeader::parse(seg.bytes(), len) {
        Ok(h) => h,
        Err(e) => return class("header", &e),
    };
    let Some(layout) = parsed.ring else {
        return "ok:no-ring".into();
    };
    // Force the entries the mode selects to SUBMITTED so that most inputs reach the checks.
    let message: String =
        String::from_utf8_lossy(&rest[..rest.len().min(message_len)]).into_owned();
    // SAFETY: `seg` is 64-byte aligned, `len` bytes long, and `SegmentHeader::parse` checked
    // (via `RingLayout::check`) that the ring lies inside those `len` bytes; `seg` outlives
    // `view`, which is dropped at the end of this function.
    let view = unsafe { RingView::new(seg.as_mut_ptr(), layout) };
    let mut outcomes = Vec::new();
    for i in 0..layout.entries {
        let entry = view.entry(i);
        if mode & 2 != 0 {
            entry
                .state()
                .store(ring::STATE_SUBMITTED, Ordering::Relaxed);
        }
        let before = entry.state().load(Ordering::Relaxed);
        let Some(sub) = entry.claim() else {
            assert_ne!(
                before,
                ring::STATE_SUBMITTED,
                "a submitted entry could not be claimed"
            );
            assert_eq!(
                entry.state().load(Ordering::Relaxed),
                before,
                "a failed claim changed the state"
            );
            continue;
        };
        assert!(entry.claim().is_none(), "an entry was claimed twice");
        let checked = serve(&view, &entry, &sub, &limits, len);
        match &checked {
            Ok(()) => {
                let c = CallCost {
                    queue_ns: 1,
                    io_wait_ns: 2,
                    compute_ns: 3,
                    bytes_read: 4,
                    hits: 5,
                    misses: 6,
                    prefetched_hits: 7,
                };
                entry.complete(sub.seq, &c);
                let (seq, got, failure) = entry.result();
                assert_eq!(
                    (seq, got, failure),
                    (sub.seq, c, None),
                    "a completion does not read back"
                );
            }
            Err(_) => {
                entry.fail(sub.seq, 3, &message);
                let (seq, _, failure) = entry.result();
                let (code, text) = failure.expect("a failed entry reads back as failed");
                assert_eq!((seq, code), (sub.seq, 3));
                assert!(
                    text.len() <= ERROR_BYTES as usize && message.starts_with(&text),
                    "failure message garbled"
                );
                assert!(
                    message.len() > ERROR_BYTES as usize || text == message,
                    "short failure message cut"
                );
            }
        }
        outcomes.push(match checked {
            Ok(()) => format!("ok:{}", sub.op.min(4)),
            Err(e) => e,
        });
    }
    outcomes.sort();
    outcomes.dedup();
    outcomes.join("|")
}

/// Decodes one claimed entry as the worker does and checks what it accepted against the
/// contract; `Err` names the refusal's class.
fn serve(
    view: &RingView,
    entry: &ring::Entry<'_>,
    sub: &ring::Submission,
    limits: &CallLimits,
    len: u64,
) -> Result<(), String> {
    let layout = view.layout();
    let capacity = layout.cells as usize;
    let bounds = SegmentBounds {
        id: 1,
        len,
        data_end: layout.offset,
    };
    let (mut ids, mut weights) = (Vec::new(), Vec::new());
    let call = ring_entry::decode(
        entry,
        sub,
        capacity,
        &bounds,
        limits,
        7,
        &mut ids,
        &mut weights,
    )
    .map_err(|e| class("refused", &e))?;
    let experts_ok = |experts: &[u32]| {
        !experts.is_empty() && experts.iter().all(|&e| (e as usize) < limits.n_experts)
    };
    let slice_ok = |r: &Range<usize>, n_rows: usize| {
        r.start >= SEGMENT_HEADER_BYTES
            && (r.start as u64).is_multiple_of(SLICE_ALIGN)
            && r.end as u64 <= layout.offset
            && r.len() == n_rows * limits.hidden * 4
    };
    match call {
        RingCall::Prefetch { layer, experts } => {
            assert_eq!(sub.op, ring::OP_PREFETCH);
            assert!(
                (layer.get() as usize) < limits.n_layers
                    && sub.n_rows == 1
                    && experts.len() <= capacity.min(limits.n_experts)
                    && experts_ok(experts),
                "accepted hint: layer {layer}, {experts:?}"
            );
        }
        RingCall::Echo {
            n_rows,
            input,
            output,
        } => {
            assert_eq!(sub.op, ring::OP_ECHO);
            assert!((1..=limits.max_rows).contains(&n_rows) && n_rows == sub.n_rows as usize);
            assert!(
                slice_ok(&input, n_rows) && slice_ok(&output, n_rows),
                "echo {input:?} {output:?} in {len}"
            );
        }
        RingCall::Moe {
            call,
            hint,
            input,
            output,
        } => {
            assert_eq!(sub.op, ring::OP_MOE);
            let spec = call.spec();
            let n = spec.n_rows;
            assert!((1..=limits.max_rows).contains(&n) && n == sub.n_rows as usize);
            assert!((spec.layer.get() as usize) < limits.n_layers && spec.layer == sub.layer);
            assert_eq!(spec.ids.len(), n * spec.top_k);
            assert!(spec.ids.len() + hint.map_or(0, |(_, e)| e.len()) <= capacity);
            assert!(
                experts_ok(spec.ids) && spec.weights.iter().all(|w| w.is_finite()),
                "accepted routing {:?} {:?}",
                spec.ids,
                spec.weights
            );
            if let Some((layer, experts)) = hint {
                assert!((layer.get() as usize) < limits.n_layers && experts_ok(experts));
            }
            assert!(
                slice_ok(&input, n) && slice_ok(&output, n),
                "call {input:?} {output:?} in {len}"
            );
        }
    }
    Ok(())
}
