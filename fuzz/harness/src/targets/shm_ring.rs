//! The MoE-call ring as the daemon reads it (`shared::ring`, driven like
//! `expertd/src/rpc/ring.rs`'s worker): a segment whose header announces a ring, with every
//! byte after the header taken from the input, so that entries hold arbitrary states, counts,
//! offsets, ids and weights. For each entry the target claims it and applies the worker's
//! checks in the worker's order (row count, input and output slices, cells and a carried
//! prefetch hint's cells against the entry's capacity, the carried hint, then routing;
//! prefetch hints: layer, one row, expert count), then
//! publishes a completion or a failure and reads it back as the client would.
//!
//! Contract: no panic and no access outside the segment whatever the entries hold; a call
//! that passes the checks names only in-segment slices and valid experts; a published result
//! reads back as written (a failure message cut to the error area on a character boundary).

use crate::bytes::{Aligned, Input};
use crate::{Outcome, class};
use shared::call_cost::CallCost;
use shared::moe_exec::validate_routing;
use shared::ring::{self, ERROR_BYTES, RingLayout, RingView};
use shared::shm_layout::{SEGMENT_HEADER_BYTES, SLICE_ALIGN, SegmentHeader, ShmSlice};
use std::sync::atomic::Ordering;

/// The daemon's view of the container and its limits, picked by the input.
struct Dims {
    n_layers: u32,
    n_experts: usize,
    hidden: usize,
    max_rows: usize,
}

/// Builds the segment (structured header unless the mode asks for raw bytes), parses it as
/// `Segment::from_fd` does, then serves every entry once.
pub fn run(data: &[u8]) -> Outcome {
    let mut input = Input::new(data);
    let mode = input.u8();
    let dims = Dims {
        n_layers: input.small(4) as u32,
        n_experts: input.small(16),
        hidden: input.small(8),
        max_rows: input.small(8),
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
        let checked = serve(&view, &entry, &sub, &dims, len);
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

/// The worker's checks for one claimed call; `Err` names the first that failed.
fn serve(
    view: &RingView,
    entry: &ring::Entry<'_>,
    sub: &ring::Submission,
    dims: &Dims,
    len: u64,
) -> Result<(), String> {
    let capacity = view.layout().cells as usize;
    let (mut ids, mut weights) = (Vec::new(), Vec::new());
    if sub.op == ring::OP_PREFETCH {
        let n = sub.top_k as usize;
        if sub.layer.get() >= dims.n_layers
            || sub.n_rows != 1
            || n == 0
            || n > dims.n_experts.min(capacity)
        {
            return Err("hint-shape".into());
        }
        entry.read_cells(n, &mut ids, &mut weights);
        assert_eq!(ids.len(), n);
        if ids.iter().any(|&e| e as usize >= dims.n_experts) {
            return Err("hint-expert".into());
        }
        return Ok(());
    }
    let (n_rows, top_k) = (sub.n_rows as usize, sub.top_k as usize);
    if n_rows == 0 || n_rows > dims.max_rows {
        return Err("rows".into());
    }
    let n_bytes = (n_rows * dims.hidden) as u64 * 4;
    for offset in [sub.input_offset, sub.output_offset] {
        let slice = ShmSlice {
            segment_id: 1,
            offset_bytes: offset,
            length_bytes: n_bytes,
        };
        let r = slice.range_in(len).map_err(|e| class("slice", &e))?;
        assert!(
            r.end as u64 <= len && r.len() as u64 == n_bytes,
            "slice {r:?} for {n_bytes} bytes in {len}"
        );
    }
    match sub.op {
        ring::OP_ECHO => Ok(()),
        ring::OP_MOE => {
            let cells = n_rows
                .checked_mul(top_k)
                .filter(|&c| c <= capacity)
                .ok_or("cells")?;
            let (hint_layer, hint_n) = entry.hint();
            let total = cells
                .checked_add(hint_n as usize)
                .filter(|&c| c <= capacity)
                .ok_or("hint-cells")?;
            entry.read_cells(total, &mut ids, &mut weights);
            if hint_n > 0 {
                ring::check_hint(
                    hint_layer,
                    &ids[cells..],
                    dims.n_layers as usize,
                    dims.n_experts,
                )
                .map_err(|_| "carried-hint".to_string())?;
                assert!(
                    hint_layer.get() < dims.n_layers
                        && ids[cells..].iter().all(|&e| (e as usize) < dims.n_experts)
                );
            }
            let (ids, weights) = (&ids[..cells], &weights[..cells]);
            if sub.layer.get() >= dims.n_layers {
                return Err("layer".into());
            }
            validate_routing(n_rows, top_k, ids, weights, dims.n_experts)
                .map_err(|_| "routing".to_string())?;
            assert!(
                ids.iter().all(|&e| (e as usize) < dims.n_experts)
                    && weights.iter().all(|w| w.is_finite())
            );
            Ok(())
        }
        _ => Err("op".into()),
    }
}
