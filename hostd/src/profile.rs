//! Optional per-op timing of the forward pass for `hostd profile`: wall time, calls and weight
//! bytes streamed per named op, plus plain event counters (cache hits, prefetch hints).
//!
//! A [`Profiler`] is an object owned by the run that wants the figures (the model holds one
//! while `hostd profile` measures, see `Model::set_profiler`) and is handed down to whatever
//! records into it, the expert backends included, as an `Option<&Profiler>`. There is no
//! process-wide state: when profiling is off the hot path holds `None` and a scope costs one
//! branch on it. Owns only the record; it knows nothing of the model or the expert client.
//!
//! Ops nest (a layer scope contains its projections), so op times are not additive across
//! nesting levels; the report groups them by prefix.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
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

/// The op times and counters of one profiled run.
#[derive(Debug, Default)]
pub struct Profiler {
    // Std mutexes: scopes are entered from the thread that runs the forward pass, a few
    // hundred times per token, never from inside rayon workers, so they are not contended.
    ops: Mutex<BTreeMap<&'static str, OpStat>>,
    counts: Mutex<BTreeMap<&'static str, u64>>,
}

impl Profiler {
    /// An empty record.
    pub fn new() -> Profiler {
        Profiler::default()
    }

    /// Returns and clears the op figures recorded so far.
    pub fn take(&self) -> BTreeMap<&'static str, OpStat> {
        std::mem::take(&mut *self.ops.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Returns and clears the counters recorded so far.
    pub fn take_counts(&self) -> BTreeMap<&'static str, u64> {
        std::mem::take(&mut *self.counts.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Records one call of `op` that took `ns` nanoseconds, measured elsewhere (a daemon's
    /// reported time, a share of a parallel section), with `bytes` of weights.
    pub fn add(&self, op: &'static str, ns: u64, bytes: u64) {
        let mut ops = self.ops.lock().unwrap_or_else(PoisonError::into_inner);
        let s = ops.entry(op).or_default();
        s.calls += 1;
        s.ns += ns;
        s.bytes += bytes;
    }

    /// Adds `n` to the counter `name`.
    pub fn count(&self, name: &'static str, n: u64) {
        *self
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(name)
            .or_default() += n;
    }

    /// Records the time until the guard drops under `op`, plus `bytes` of weights streamed.
    #[must_use = "the scope ends when the guard is dropped"]
    pub fn scope(&self, op: &'static str, bytes: usize) -> Scope<'_> {
        Scope {
            profiler: self,
            op,
            bytes: bytes as u64,
            start: Instant::now(),
        }
    }
}

/// [`Profiler::scope`] when profiling (`profiler` is `Some`); `None` otherwise, at the cost of
/// one branch.
#[must_use = "the scope ends when the guard is dropped"]
#[inline]
pub fn scope<'p>(
    profiler: Option<&'p Profiler>,
    op: &'static str,
    bytes: usize,
) -> Option<Scope<'p>> {
    profiler.map(|p| p.scope(op, bytes))
}

/// A live op scope; records into its profiler on drop.
pub struct Scope<'p> {
    profiler: &'p Profiler,
    op: &'static str,
    bytes: u64,
    start: Instant,
}

impl Drop for Scope<'_> {
    fn drop(&mut self) {
        let ns = self.start.elapsed().as_nanos() as u64;
        self.profiler.add(self.op, ns, self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::{OpStat, Profiler, scope};

    #[test]
    fn scopes_adds_and_counts_accumulate_per_name_and_take_clears() {
        let p = Profiler::new();
        drop(p.scope("a", 10));
        drop(scope(Some(&p), "a", 5));
        p.add("b", 7, 0);
        p.count("hits", 2);
        p.count("hits", 3);
        let ops = p.take();
        assert_eq!((ops["a"].calls, ops["a"].bytes), (2, 15));
        assert_eq!(
            ops["b"],
            OpStat {
                calls: 1,
                ns: 7,
                bytes: 0
            }
        );
        assert_eq!(p.take_counts()["hits"], 5);
        assert!(p.take().is_empty() && p.take_counts().is_empty());
    }

    #[test]
    fn without_a_profiler_a_scope_is_nothing() {
        assert!(scope(None, "a", 1).is_none());
    }
}
