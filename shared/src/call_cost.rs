//! [`CallCost`]: what one routed-expert call cost the daemon that ran it. One type for every
//! place the figures travel: expertd's call executor measures them, its session counters add
//! them up, the call ring (`crate::ring`) and the `MoeLayer` response (`proto::convert`) carry
//! them to hostd, whose expert client hands them to the profiler.

/// What one call cost; also what a successful call adds to its session's counters. Each
/// transport copies the fields verbatim.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallCost {
    /// Nanoseconds the call waited for a compute lane: set by the daemon's RPC layer, which
    /// queues the call ([`CallCost::with_queue_ns`]); 0 as the executor returns it.
    pub queue_ns: u64,
    /// Nanoseconds the call could not compute because of IO: leasing its experts (waiting for
    /// free slots included) plus the wait for reads (its own, or another call's read of a
    /// shared expert) left after the resident experts were computed — reads that completed
    /// while hits were computing cost nothing here.
    pub io_wait_ns: u64,
    /// Nanoseconds computing (the rest of each wave's wall time; the final weighted sum is
    /// not timed).
    pub compute_ns: u64,
    /// Distinct experts found in the cache.
    pub hits: u32,
    /// Distinct experts read.
    pub misses: u32,
    /// Bytes read from the container.
    pub bytes_read: u64,
    /// Of the hits, experts a speculative read had brought in.
    pub prefetched_hits: u32,
}

impl CallCost {
    /// The same cost with the time the call queued for a lane.
    pub fn with_queue_ns(self, queue_ns: u64) -> CallCost {
        CallCost { queue_ns, ..self }
    }
}
