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
// Plain event counters (cache hits, misses, bytes read), recorded only while enabled.
static COUNTS: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());

/// Turns recording on or off for the whole process.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether recording is on (callers that time work themselves check this first).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Returns and clears everything recorded so far.
pub fn take() -> BTreeMap<&'static str, OpStat> {
    std::mem::take(&mut *STATS.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Returns and clears the counters recorded so far.
pub fn take_counts() -> BTreeMap<&'static str, u64> {
    std::mem::take(&mut *COUNTS.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Records one call of `op` that took `ns` nanoseconds, measured elsewhere (a daemon's
/// reported time, a share of a parallel section), with `bytes` of weights. No-op when disabled.
pub fn add(op: &'static str, ns: u64, bytes: u64) {
    if !enabled() {
        return;
    }
    let mut stats = STATS.lock().unwrap_or_else(|p| p.into_inner());
    let s = stats.entry(op).or_default();
    s.calls += 1;
    s.ns += ns;
    s.bytes += bytes;
}

/// Adds `n` to the counter `name`. No-op when disabled.
pub fn count(name: &'static str, n: u64) {
    if !enabled() {
        return;
    }
    *COUNTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(name)
        .or_default() += n;
}

/// Records the time until the guard drops under `op`, plus `bytes` of weights streamed.
#[must_use = "the scope ends when the guard is dropped"]
pub fn scope(op: &'static str, bytes: usize) -> Option<Guard> {
    ENABLED.load(Ordering::Relaxed).then(|| Guard {
        op,
        bytes: bytes as u64,
        start: Instant::now(),
    })
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
