//! Optional per-op timing of the forward pass for `hostd profile`: wall time, calls and weight
//! bytes streamed per named op. Disabled by default; when disabled a scope costs one relaxed
//! atomic load.
//!
//! Ops nest (a layer scope contains its projections), so op times are not additive across
//! nesting levels; the report groups them by prefix.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Accumulated figures of one op.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OpStat {
    /// Times the op ran.
    pub calls: u64,
    /// Wall time inside the op, nanoseconds.
    pub ns: u64,
    /// Weight bytes the op read (0 for ops that stream no weights).
    pub bytes: u64,
}

static ENABLED: AtomicBool = AtomicBool::new(false);
// A mutex is fine: scopes are entered from the calling thread a few hundred times per token,
// never from inside rayon workers.
static STATS: Mutex<BTreeMap<&'static str, OpStat>> = Mutex::new(BTreeMap::new());

/// Turns recording on or off for the whole process.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Returns and clears everything recorded so far.
pub fn take() -> BTreeMap<&'static str, OpStat> {
    std::mem::take(&mut *STATS.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Records the time until the guard drops under `op`, plus `bytes` of weights streamed.
#[must_use = "the scope ends when the guard is dropped"]
pub fn scope(op: &'static str, bytes: usize) -> Option<Guard> {
    ENABLED.load(Ordering::Relaxed).then(|| Guard { op, bytes: bytes as u64, start: Instant::now() })
}

/// Live scope; records on drop.
pub struct Guard {
    op: &'static str,
    bytes: u64,
    start: Instant,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let ns = self.start.elapsed().as_nanos() as u64;
        let mut stats = STATS.lock().unwrap_or_else(|p| p.into_inner());
        let s = stats.entry(self.op).or_default();
        s.calls += 1;
        s.ns += ns;
        s.bytes += self.bytes;
    }
}
