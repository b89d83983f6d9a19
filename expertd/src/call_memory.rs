//! What one MoE call makes the daemon hold, as a function of its shape: the bound that admission
//! checks before any buffer of the call's size exists, that the memory budget counts per compute
//! lane (`crate::memlimit`), and that caps the gRPC message size. A call the bound does not
//! admit is refused (RESOURCE_EXHAUSTED), never run: a client cannot make the daemon grow past
//! what it derived its cache budget against, whatever `n_tokens × top_k` it sends.
//!
//! The bound counts, at a call's peak (`n` rows, `k` experts per row, hidden size `d`,
//! intermediate size `f`, `T` compute threads):
//! - activations in and out, in both wire and f32 form (the inline RPC's request bytes, the f32
//!   input, the f32 output, the response bytes): `16·n·d` bytes;
//! - routing and per-cell outputs: ids, weights and the per-expert cell lists (16 B per cell) and
//!   one output row per cell (`4·d` B per cell, `shared::moe_exec`'s slots): `n·k·(4d + 16)`;
//! - per compute thread at work, one expert's gathered rows and outputs (`8·d` B per row; an
//!   expert gets at most one cell per row) and its kernel scratch (quantised rows, gate/up, the
//!   activation and its quantised form: under `d + 13·f + 64` B per row), for at most
//!   `min(T, k)` full-size experts at once (a row's `k` cells go to `k` experts, so only `k`
//!   experts can have `n` cells): `min(T, k)·n·(9d + 13f + 64)`;
//! - 64 KiB of small things.

use crate::moe_call::CallError;
use shared::ids::LayerId;

/// Experts per row the budget is sized for (the model's top-8): a lane's share is the bound of a
/// call of `--max-rows-per-call` rows at this `top_k`. A call with more experts per row is
/// admitted when its own bound fits that share (it has fewer rows).
pub const BUDGETED_TOP_K: usize = 8;

/// Bytes of small per-call state counted on top of the shape's terms.
const FIXED_BYTES: u64 = 64 << 10;

/// The call-memory bound for one daemon's dimensions and compute pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallMemory {
    hidden: u64,
    inner: u64,
    threads: u64,
    max_rows: u64,
    max_call_bytes: u64,
}

impl CallMemory {
    /// The bound for activations of `hidden` values, experts of intermediate size `inner`,
    /// `threads` compute threads (0: one per core), calls of at most `max_rows` rows, and
    /// layers of `n_experts` experts.
    pub fn new(
        hidden: usize,
        inner: usize,
        threads: usize,
        max_rows: usize,
        n_experts: usize,
    ) -> CallMemory {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
        } else {
            threads
        };
        let mut m = CallMemory {
            hidden: hidden as u64,
            inner: inner as u64,
            threads: threads as u64,
            max_rows: max_rows as u64,
            max_call_bytes: 0,
        };
        m.max_call_bytes = m.bytes(max_rows, BUDGETED_TOP_K.min(n_experts.max(1)));
        m
    }

    /// The bound for a call of `n_rows` rows with `top_k` experts each (saturating: a shape too
    /// large for `u64` is `u64::MAX`).
    pub fn bytes(&self, n_rows: usize, top_k: usize) -> u64 {
        let (n, k, d, f, t) = (
            n_rows as u64,
            top_k as u64,
            self.hidden,
            self.inner,
            self.threads,
        );
        let io = n.saturating_mul(d).saturating_mul(16);
        let cells = n
            .saturating_mul(k)
            .saturating_mul(d.saturating_mul(4).saturating_add(16));
        let per_thread = n.saturating_mul(
            d.saturating_mul(9)
                .saturating_add(f.saturating_mul(13))
                .saturating_add(64),
        );
        io.saturating_add(cells)
            .saturating_add(per_thread.saturating_mul(t.min(k.max(1))))
            .saturating_add(FIXED_BYTES)
    }

    /// The most one call may take: the bound of a call of `--max-rows-per-call` rows at
    /// [`BUDGETED_TOP_K`] (one compute lane's share of the budget).
    pub fn max_call_bytes(&self) -> u64 {
        self.max_call_bytes
    }

    /// Compute threads counted per call.
    pub fn threads(&self) -> usize {
        self.threads as usize
    }

    /// The most routing cells (`n_tokens × top_k`) any admitted call can carry.
    pub fn max_cells(&self) -> u64 {
        self.max_call_bytes / self.hidden.saturating_mul(4).saturating_add(16)
    }

    /// The largest `MoeLayer` request an admitted call can need: inline activations at
    /// `--max-rows-per-call` rows plus [`max_cells`](Self::max_cells) ids and weights (at most 5
    /// and 4 bytes each on the wire) and 64 KiB of framing and small fields. The gRPC server
    /// refuses a larger message from its length prefix, before decoding it.
    pub fn max_message_bytes(&self) -> usize {
        let bytes = self
            .max_rows
            .saturating_mul(self.hidden)
            .saturating_mul(4)
            .saturating_add(self.max_cells().saturating_mul(9))
            .saturating_add(FIXED_BYTES);
        usize::try_from(bytes)
            .unwrap_or(usize::MAX)
            .min(proto::MAX_MESSAGE_BYTES)
    }

    /// The default cap on bytes of requests arriving or decoded and waiting for a lane, over
    /// every connection (`--max-queued-bytes`): one of the largest requests per compute lane,
    /// so that every lane can have its next call decoded and waiting while one runs, plus one
    /// more arriving (counted as its wire bytes and what they may decode to,
    /// `crate::rpc::intake`). Many more small calls fit; calls on the shared-memory ring hold
    /// none.
    pub fn default_queued_bytes(&self, lanes: usize) -> u64 {
        let arriving = 1 + proto::codec::DECODED_PER_WIRE_BYTE;
        (self.max_message_bytes() as u64).saturating_mul(lanes.max(1) as u64 + arriving)
    }

    /// Refuses a call whose bound exceeds [`max_call_bytes`](Self::max_call_bytes), before any
    /// buffer of its size exists.
    pub fn check(&self, layer: LayerId, n_rows: usize, top_k: usize) -> Result<(), CallError> {
        let needed = self.bytes(n_rows, top_k);
        if needed > self.max_call_bytes {
            return Err(CallError::TooLarge {
                layer,
                n_rows,
                top_k,
                needed,
                allowed: self.max_call_bytes,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_admits_the_budgeted_shape_and_refuses_more_cells() {
        let m = CallMemory::new(2048, 512, 2, 8192, 256);
        assert_eq!(m.max_call_bytes(), m.bytes(8192, 8));
        let layer = LayerId::new(3);
        m.check(layer, 8192, 8).expect("the budgeted shape");
        m.check(layer, 1, 256).expect("one row with every expert");
        m.check(layer, 2048, 32).expect("fewer rows, more experts");
        match m.check(layer, 8192, 32) {
            Err(CallError::TooLarge {
                needed, allowed, ..
            }) => assert!(needed > allowed),
            other => panic!("8192 × 32 must be refused: {other:?}"),
        }
        // The real shape's lane share: ~1.2 GB at 8192 rows (dominated by one output row per
        // cell and two threads' expert buffers).
        assert!(
            (1_000_000_000..1_500_000_000).contains(&m.max_call_bytes()),
            "{}",
            m.max_call_bytes()
        );
        // Threads past top-k add nothing: only k experts can hold every row at once.
        let many = CallMemory::new(2048, 512, 64, 8192, 256);
        assert_eq!(
            many.max_call_bytes(),
            CallMemory::new(2048, 512, 8, 8192, 256).max_call_bytes()
        );
        assert!(
            many.max_call_bytes() < 3_000_000_000,
            "{}",
            many.max_call_bytes()
        );
        // The message cap: 64 MiB of inline activations plus the cells, under the protocol cap.
        assert!(m.max_message_bytes() > 8192 * 2048 * 4);
        assert!(
            m.max_message_bytes() < 80 << 20,
            "{}",
            m.max_message_bytes()
        );
        // A shape past u64 saturates instead of wrapping to a small number.
        assert_eq!(m.bytes(usize::MAX, usize::MAX), u64::MAX);
    }

    #[test]
    fn few_experts_per_layer_budget_at_that_top_k() {
        let m = CallMemory::new(64, 32, 1, 16, 4);
        assert_eq!(m.max_call_bytes(), m.bytes(16, 4));
    }
}
