//! The benchmarks' storage-read snapshots of hostd and its private expertd, over the /proc
//! readers of `shared::procfs` (re-exported here for `profile`).

use serde_json::{Value, json};
pub use shared::procfs::{read_bytes, vm_hwm_bytes};

/// A snapshot of `read_bytes` for hostd (this process) and, when there is one, its expertd.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reads {
    /// This process.
    pub hostd: Option<u64>,
    /// The private expertd.
    pub expertd: Option<u64>,
    /// Whether there is a private expertd (so `expertd: None` means unreadable, not absent).
    pub daemon: bool,
}

impl Reads {
    /// Reads both counters now.
    pub fn now(daemon: Option<u32>) -> Reads {
        Reads { hostd: read_bytes(None), expertd: daemon.and_then(|p| read_bytes(Some(p))), daemon: daemon.is_some() }
    }

    /// Bytes read by each process between `self` and `later`, as JSON (null where unreadable).
    pub fn delta_json(&self, later: &Reads) -> Value {
        let d = |a: Option<u64>, b: Option<u64>| a.zip(b).map(|(a, b)| b.saturating_sub(a));
        let (h, e) = (d(self.hostd, later.hostd), d(self.expertd, later.expertd));
        // With a daemon whose counter could not be read the total is unknown, not hostd's alone.
        let total = if self.daemon && e.is_none() { None } else { h.map(|h| h + e.unwrap_or(0)) };
        json!({"hostd": h, "expertd": e, "total": total})
    }
}
