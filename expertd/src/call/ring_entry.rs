//! One call-ring entry decoded into a call. Every value the client wrote is copied out of shared
//! memory once (the submission's words by `Entry::claim`, the cells here), then checked in the
//! pipeline's order: the shape against the call limits, the routing, a carried prefetch hint,
//! then where the activations live in the segment. A pure function of the entry, the segment's
//! bounds and the limits: the ring worker and the `shm_ring` fuzz target call this same code.

use super::{CallLimits, Validated};
use crate::moe_call::CallSpec;
use crate::rpc::RpcError;
use crate::shm::SegmentBounds;
use shared::ids::LayerId;
use shared::ring::{self, Entry, Submission};
use shared::shm_layout::ShmSlice;
use std::ops::Range;

/// What a decoded entry asks for; the routing it names lies in the caller's `ids` and
/// `weights` buffers, which the entry's cells were copied into.
#[derive(Debug, Clone)]
pub enum RingCall<'a> {
    /// `OP_MOE`: a validated call, and the prefetch hint riding after its cells, if any.
    Moe {
        /// The call (its spec names the session and the cells).
        call: Validated<'a>,
        /// The carried hint's layer and experts.
        hint: Option<(LayerId, &'a [u32])>,
        /// The activations' bytes in the segment.
        input: Range<usize>,
        /// Where the output goes in the segment.
        output: Range<usize>,
    },
    /// `OP_ECHO`: copy `n_rows` rows from `input` to `output` (a transport check, not a call).
    Echo {
        /// Rows.
        n_rows: usize,
        /// The source bytes.
        input: Range<usize>,
        /// The destination bytes.
        output: Range<usize>,
    },
    /// `OP_PREFETCH`: a hint (one row) for `layer`.
    Prefetch {
        /// The hinted layer.
        layer: LayerId,
        /// The hinted experts.
        experts: &'a [u32],
    },
}

/// Decodes and checks the claimed submission `sub` of `entry` (a ring of `capacity` cells per
/// entry, in a segment with `bounds`), a call of `session`, copying its cells into `ids` and
/// `weights`. In order: the cells against the entry's capacity, the copy, the call's shape and
/// routing ([`CallLimits::validate`]), a carried hint, the activation slices. A failure is the
/// status the call fails with; nothing was queued or allocated past the ring's capacity.
#[expect(
    clippy::too_many_arguments,
    reason = "the entry, its claimed words, the ring, the segment, the limits, the session and the two cell buffers are all inputs of one pure function"
)]
pub fn decode<'a>(
    entry: &Entry<'_>,
    sub: &Submission,
    capacity: usize,
    bounds: &SegmentBounds,
    limits: &CallLimits,
    session: u64,
    ids: &'a mut Vec<u32>,
    weights: &'a mut Vec<f32>,
) -> Result<RingCall<'a>, RpcError> {
    let (n_rows, top_k) = (sub.n_rows as usize, sub.top_k as usize);
    match sub.op {
        ring::OP_PREFETCH => {
            if sub.n_rows != 1 || top_k > capacity {
                return Err(RpcError::BadRequest(format!(
                    "prefetch hint: rows {n_rows} (must be 1), experts {top_k} (at most {capacity} cells)"
                )));
            }
            entry.read_cells(top_k, ids, weights);
            ring::check_hint(sub.layer, ids, limits.n_layers, limits.n_experts)
                .map_err(|e| RpcError::BadRequest(format!("prefetch hint: {e}")))?;
            Ok(RingCall::Prefetch {
                layer: sub.layer,
                experts: ids,
            })
        }
        ring::OP_ECHO => {
            limits.check_rows(sub.layer, n_rows)?;
            let (input, output) = slices(sub, n_rows, bounds, limits)?;
            Ok(RingCall::Echo {
                n_rows,
                input,
                output,
            })
        }
        ring::OP_MOE => {
            let cells = n_rows.checked_mul(top_k).filter(|&c| c <= capacity).ok_or_else(|| {
                RpcError::BadRequest(format!(
                    "n_tokens × top_k = {n_rows} × {top_k} exceeds the ring entry's {capacity} cells"
                ))
            })?;
            // A prefetch hint may ride after the call's cells (`Entry::submit_with_hint`).
            let (hint_layer, hint_n) = entry.hint();
            let total = cells.checked_add(hint_n as usize).filter(|&c| c <= capacity).ok_or_else(|| {
                RpcError::BadRequest(format!(
                    "the call's {cells} cells and its prefetch hint's {hint_n} exceed the ring entry's {capacity} cells"
                ))
            })?;
            entry.read_cells(total, ids, weights);
            let (ids, weights): (&'a [u32], &'a [f32]) = (ids, weights);
            let call = limits.validate(CallSpec {
                session,
                step: sub.step,
                layer: sub.layer,
                n_rows,
                top_k,
                ids: &ids[..cells],
                weights: &weights[..cells],
            })?;
            let hint = if hint_n > 0 {
                let experts = &ids[cells..];
                ring::check_hint(hint_layer, experts, limits.n_layers, limits.n_experts)
                    .map_err(|e| RpcError::BadRequest(format!("the call's prefetch hint: {e}")))?;
                Some((hint_layer, experts))
            } else {
                None
            };
            let (input, output) = slices(sub, n_rows, bounds, limits)?;
            Ok(RingCall::Moe {
                call,
                hint,
                input,
                output,
            })
        }
        op => Err(RpcError::BadRequest(format!(
            "unknown ring op {op} (expected {} = moe, {} = echo or {} = prefetch)",
            ring::OP_MOE,
            ring::OP_ECHO,
            ring::OP_PREFETCH
        ))),
    }
}

/// The input and output byte ranges of a call of `n_rows` rows (already checked against the
/// row limit, so the byte count cannot overflow).
fn slices(
    sub: &Submission,
    n_rows: usize,
    bounds: &SegmentBounds,
    limits: &CallLimits,
) -> Result<(Range<usize>, Range<usize>), RpcError> {
    let length_bytes = (n_rows * limits.hidden) as u64 * 4;
    let range = |offset_bytes| {
        bounds.range(&ShmSlice {
            segment_id: bounds.id,
            offset_bytes,
            length_bytes,
        })
    };
    Ok((range(sub.input_offset)?, range(sub.output_offset)?))
}
