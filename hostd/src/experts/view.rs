//! What the live panel (`GET /v1/live`) shows of a remote backend's expert cache: this
//! process's own per-layer hits and misses, and each daemon's view of its cache and of every
//! session it serves (its `Stats` call).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A remote backend's cache as the live panel shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheView {
    /// Expert lookups of this process's calls that the daemon found resident, per MoE layer.
    pub layer_hits: Vec<u64>,
    /// Lookups of this process's calls that the daemon had to read, per MoE layer.
    pub layer_misses: Vec<u64>,
    /// Each daemon that answered its `Stats` call (one, or one per shard).
    pub daemons: Vec<DaemonView>,
}

/// One daemon's cache and sessions, cumulative since it started.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct DaemonView {
    /// The daemon's address.
    pub endpoint: String,
    /// Its cache budget.
    pub budget_bytes: u64,
    /// Bytes of resident experts now.
    pub resident_bytes: u64,
    /// Lookups, all sessions, that found the expert resident.
    pub hits: u64,
    /// Lookups, all sessions, that read it.
    pub misses: u64,
    /// Bytes read from the container, all sessions (speculative reads included).
    pub bytes_read: u64,
    /// The daemon's resident set size (`None`: it did not say).
    pub rss_bytes: Option<u64>,
    /// Bytes read for this client's own session (`None`: the session was not in the list).
    pub own_bytes_read: Option<u64>,
    /// Every open session.
    pub sessions: Vec<SessionView>,
}

/// One open session of a daemon.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SessionView {
    /// The name its client gave.
    pub client_name: String,
    /// `uid U gid G pid P` or `ADDRESS:PORT`.
    pub peer: String,
    /// Calls completed.
    pub calls: u64,
    /// Lookups that hit.
    pub hits: u64,
    /// Lookups that missed.
    pub misses: u64,
    /// Bytes read for it.
    pub bytes_read: u64,
}

/// Per-layer hit and miss counters of one client's calls (relaxed atomics: a call adds two).
#[derive(Debug)]
pub struct LayerCounters {
    hits: Vec<AtomicU64>,
    misses: Vec<AtomicU64>,
}

impl LayerCounters {
    /// Counters for `n_layers` layers, all zero.
    pub fn new(n_layers: usize) -> LayerCounters {
        LayerCounters {
            hits: (0..n_layers).map(|_| AtomicU64::new(0)).collect(),
            misses: (0..n_layers).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Adds one call's counts to `layer` (ignored past the last layer).
    pub fn add(&self, layer: usize, hits: u64, misses: u64) {
        if let (Some(h), Some(m)) = (self.hits.get(layer), self.misses.get(layer)) {
            h.fetch_add(hits, Relaxed);
            m.fetch_add(misses, Relaxed);
        }
    }

    /// The counts now, as `(hits, misses)` per layer.
    pub fn snapshot(&self) -> (Vec<u64>, Vec<u64>) {
        let load = |v: &[AtomicU64]| v.iter().map(|a| a.load(Relaxed)).collect();
        (load(&self.hits), load(&self.misses))
    }
}

impl CacheView {
    /// Two shards' views as one: per-layer counts summed, daemons listed together.
    pub fn merge(mut self, other: CacheView) -> CacheView {
        let add = |a: &mut Vec<u64>, b: Vec<u64>| {
            if a.len() < b.len() {
                a.resize(b.len(), 0);
            }
            for (x, y) in a.iter_mut().zip(b) {
                *x += y;
            }
        };
        add(&mut self.layer_hits, other.layer_hits);
        add(&mut self.layer_misses, other.layer_misses);
        self.daemons.extend(other.daemons);
        self
    }
}

impl DaemonView {
    /// A daemon's `Stats` answer as seen by the client whose session is `own_session`.
    pub fn from_stats(endpoint: &str, own_session: u64, s: proto::v1::StatsResponse) -> DaemonView {
        let c = s.cache.unwrap_or_default();
        let own_bytes_read = s
            .sessions
            .iter()
            .find(|x| x.session_id == own_session)
            .map(|x| x.bytes_read);
        DaemonView {
            own_bytes_read,
            endpoint: endpoint.to_string(),
            budget_bytes: c.budget_bytes,
            resident_bytes: c.resident_bytes,
            hits: c.hits,
            misses: c.misses,
            bytes_read: c.bytes_read,
            rss_bytes: (s.rss_bytes > 0).then_some(s.rss_bytes),
            sessions: s
                .sessions
                .into_iter()
                .map(|x| SessionView {
                    client_name: x.client_name,
                    peer: x.peer,
                    calls: x.calls,
                    hits: x.hits,
                    misses: x.misses,
                    bytes_read: x.bytes_read,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_counters_add_per_layer_and_shards_merge() {
        let c = LayerCounters::new(3);
        c.add(0, 5, 1);
        c.add(2, 2, 3);
        c.add(2, 1, 0);
        c.add(9, 100, 100);
        assert_eq!(c.snapshot(), (vec![5, 0, 3], vec![1, 0, 3]));
        let a = CacheView {
            layer_hits: vec![1, 2],
            layer_misses: vec![0, 1],
            daemons: vec![DaemonView::default()],
        };
        let b = CacheView {
            layer_hits: vec![10, 20],
            layer_misses: vec![3, 0],
            daemons: vec![DaemonView::default()],
        };
        let m = a.merge(b);
        assert_eq!((m.layer_hits, m.layer_misses), (vec![11, 22], vec![3, 1]));
        assert_eq!(m.daemons.len(), 2);
    }
}
