//! The daemon's counters in the Prometheus/OpenMetrics text format, through the
//! `prometheus-client` crate: per open session and per peer (unix uid, or TCP address) calls,
//! failed calls, bytes read, hits, misses, leases held and the bytes those leases pin; the
//! daemon's totals (the sums over peers, closed sessions included); and the cache's own
//! occupancy and counters. [`render`] works on a `Stats` snapshot, so the opt-in HTTP endpoint
//! (`expertd serve --metrics-listen`) and `expertd stats` print the same text; [`serve`] is
//! that endpoint, on a TCP address or a unix socket path.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use proto::v1 as pb;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// The endpoint's content type (what `prometheus-client` writes).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type Labels = Vec<(String, String)>;
type CounterFamily = Family<Labels, Counter<u64>>;
type GaugeFamily = Family<Labels, Gauge<u64, AtomicU64>>;

/// A registry built for one snapshot: families registered by name, values set once.
struct Snapshot {
    registry: Registry,
}

impl Snapshot {
    fn counter(&mut self, name: &str, help: &str) -> CounterFamily {
        let f = CounterFamily::default();
        self.registry.register(name, help, f.clone());
        f
    }

    fn gauge(&mut self, name: &str, help: &str) -> GaugeFamily {
        let f = GaugeFamily::default();
        self.registry.register(name, help, f.clone());
        f
    }
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect()
}

/// Renders `stats` as OpenMetrics text (ending in `# EOF`). Counters carry the `_total` suffix.
pub fn render(stats: &pb::StatsResponse) -> String {
    let mut s = Snapshot { registry: Registry::default() };
    let cache = stats.cache.unwrap_or_default();

    // Per open session.
    let s_calls = s.counter("expertd_session_calls", "MoE calls completed by an open session");
    let s_failed = s.counter("expertd_session_failed_calls", "MoE calls of an open session that failed");
    let s_hits = s.counter("expertd_session_hits", "Experts an open session found resident");
    let s_misses = s.counter("expertd_session_misses", "Experts an open session had read from the container");
    let s_bytes = s.counter("expertd_session_read_bytes", "Bytes read from the container for an open session");
    let s_leases = s.gauge("expertd_session_leases_held", "Cache leases an open session holds now");
    let s_leased = s.gauge("expertd_session_leased_bytes", "Resident cache bytes an open session's leases pin now (leases x slot bytes)");
    let s_inflight = s.gauge("expertd_session_in_flight_calls", "Calls of an open session queued or running now");
    for x in &stats.sessions {
        let id = x.session_id.to_string();
        let l = labels(&[("session", &id), ("client", &x.client_name), ("peer", &x.peer_key)]);
        s_calls.get_or_create(&l).inc_by(x.calls);
        s_failed.get_or_create(&l).inc_by(x.failed_calls);
        s_hits.get_or_create(&l).inc_by(x.hits);
        s_misses.get_or_create(&l).inc_by(x.misses);
        s_bytes.get_or_create(&l).inc_by(x.bytes_read);
        s_leases.get_or_create(&l).set(x.leases_held);
        s_leased.get_or_create(&l).set(x.leases_held * cache.slot_bytes);
        s_inflight.get_or_create(&l).set(u64::from(x.in_flight_calls));
    }

    // Per peer, over every session it opened; and the daemon's totals as their sums.
    let p_sessions = s.counter("expertd_peer_sessions", "Sessions a peer (uid:U or tcp:ADDRESS) opened since start");
    let p_open = s.gauge("expertd_peer_sessions_open", "Sessions a peer holds open now");
    let p_calls = s.counter("expertd_peer_calls", "MoE calls completed for a peer, closed sessions included");
    let p_failed = s.counter("expertd_peer_failed_calls", "MoE calls of a peer that failed, closed sessions included");
    let p_hits = s.counter("expertd_peer_hits", "Experts a peer's calls found resident, closed sessions included");
    let p_misses = s.counter("expertd_peer_misses", "Experts a peer's calls had read, closed sessions included");
    let p_bytes = s.counter("expertd_peer_read_bytes", "Bytes read from the container for a peer, closed sessions included");
    let p_leases = s.gauge("expertd_peer_leases_held", "Cache leases a peer's open sessions hold now");
    let p_leased = s.gauge("expertd_peer_leased_bytes", "Resident cache bytes a peer's leases pin now");
    let mut totals = pb::PeerStats::default();
    for p in &stats.peers {
        let l = labels(&[("peer", &p.peer_key)]);
        p_sessions.get_or_create(&l).inc_by(p.sessions_opened);
        p_open.get_or_create(&l).set(u64::from(p.sessions_open));
        p_calls.get_or_create(&l).inc_by(p.calls);
        p_failed.get_or_create(&l).inc_by(p.failed_calls);
        p_hits.get_or_create(&l).inc_by(p.hits);
        p_misses.get_or_create(&l).inc_by(p.misses);
        p_bytes.get_or_create(&l).inc_by(p.bytes_read);
        p_leases.get_or_create(&l).set(p.leases_held);
        p_leased.get_or_create(&l).set(p.leases_held * cache.slot_bytes);
        totals.sessions_opened += p.sessions_opened;
        totals.calls += p.calls;
        totals.failed_calls += p.failed_calls;
        totals.hits += p.hits;
        totals.misses += p.misses;
        totals.bytes_read += p.bytes_read;
    }
    let none = Labels::new();
    s.counter("expertd_sessions", "Sessions opened since start, by every peer").get_or_create(&none).inc_by(totals.sessions_opened);
    s.gauge("expertd_sessions_open", "Sessions open now").get_or_create(&none).set(stats.sessions.len() as u64);
    s.counter("expertd_calls", "MoE calls completed since start, by every peer").get_or_create(&none).inc_by(totals.calls);
    s.counter("expertd_failed_calls", "MoE calls that failed since start").get_or_create(&none).inc_by(totals.failed_calls);
    s.counter("expertd_hits", "Experts clients' calls found resident since start").get_or_create(&none).inc_by(totals.hits);
    s.counter("expertd_misses", "Experts clients' calls had read since start").get_or_create(&none).inc_by(totals.misses);
    s.counter("expertd_read_bytes", "Bytes read from the container for clients' calls since start").get_or_create(&none).inc_by(totals.bytes_read);

    // The cache itself (speculative prefetch reads included) and the process.
    s.gauge("expertd_cache_budget_bytes", "The cache's byte budget for resident experts").get_or_create(&none).set(cache.budget_bytes);
    s.gauge("expertd_cache_resident_bytes", "Bytes of resident experts now").get_or_create(&none).set(cache.resident_bytes);
    s.gauge("expertd_cache_resident_experts", "Experts resident now").get_or_create(&none).set(cache.resident_experts);
    s.gauge("expertd_cache_slot_bytes", "Bytes of one cache slot (the blob stride)").get_or_create(&none).set(cache.slot_bytes);
    s.gauge("expertd_cache_leases_held", "Leases held now, across all sessions").get_or_create(&none).set(cache.leases_held);
    s.counter("expertd_cache_hits", "Cache lookups that found the expert resident (prefetch included)").get_or_create(&none).inc_by(cache.hits);
    s.counter("expertd_cache_misses", "Cache lookups that read the expert (prefetch included)").get_or_create(&none).inc_by(cache.misses);
    s.counter("expertd_cache_evictions", "Experts evicted to make room").get_or_create(&none).inc_by(cache.evictions);
    s.counter("expertd_cache_read_bytes", "Bytes read from the container (prefetch included)").get_or_create(&none).inc_by(cache.bytes_read);
    s.gauge("expertd_open_connections", "Connections open now").get_or_create(&none).set(u64::from(stats.open_connections));
    s.gauge("expertd_draining", "1 while the daemon drains for shutdown").get_or_create(&none).set(u64::from(stats.draining));
    s.gauge("expertd_uptime_seconds", "Seconds since the daemon started serving").get_or_create(&none).set(stats.uptime_ns / 1_000_000_000);
    if let Some(p) = &stats.prefetch {
        s.counter("expertd_prefetch_read_bytes", "Bytes read speculatively on prefetch hints").get_or_create(&none).inc_by(p.bytes_read);
        s.counter("expertd_prefetch_useful_bytes", "Speculatively read bytes a demand call then hit").get_or_create(&none).inc_by(p.useful_bytes);
    }
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut text, &s.registry);
    text
}

/// Where the metrics endpoint listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsListen {
    /// A TCP address (e.g. `127.0.0.1:9464`).
    Tcp(std::net::SocketAddr),
    /// A unix socket path (a value with a `/`).
    Unix(std::path::PathBuf),
}

impl std::str::FromStr for MetricsListen {
    type Err = String;

    fn from_str(s: &str) -> Result<MetricsListen, String> {
        if s.contains('/') {
            return Ok(MetricsListen::Unix(s.into()));
        }
        s.parse().map(MetricsListen::Tcp).map_err(|e| format!("{s:?} is neither HOST:PORT ({e}) nor a unix socket path (containing '/')"))
    }
}

/// Binds the endpoint now (so a bind error stops start-up) and returns the task serving
/// `GET /metrics` from `state` until the runtime ends. A unix socket gets mode 0660 and replaces
/// a stale file; its path is removed by the caller on exit.
pub async fn serve(at: &MetricsListen, state: Arc<crate::rpc::ServiceState>) -> std::io::Result<tokio::task::JoinHandle<()>> {
    use axum::http::header;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let state = Arc::clone(&state);
            async move { ([(header::CONTENT_TYPE, CONTENT_TYPE)], render(&state.stats())) }
        }),
    );
    match at {
        MetricsListen::Tcp(addr) => {
            let l = tokio::net::TcpListener::bind(addr).await?;
            tracing::info!(addr = %l.local_addr()?, "metrics on http://{}/metrics", l.local_addr()?);
            Ok(tokio::spawn(async move {
                if let Err(e) = axum::serve(l, app).await {
                    tracing::warn!(error = %e, "metrics endpoint stopped");
                }
            }))
        }
        MetricsListen::Unix(path) => {
            use std::os::unix::fs::PermissionsExt;
            if std::os::unix::net::UnixStream::connect(path).is_err() {
                let _ = std::fs::remove_file(path);
            }
            let l = tokio::net::UnixListener::bind(path)?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
            tracing::info!(socket = %path.display(), "metrics on a unix socket (GET /metrics)");
            Ok(tokio::spawn(async move {
                if let Err(e) = axum::serve(l, app).await {
                    tracing::warn!(error = %e, "metrics endpoint stopped");
                }
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_and_peers_are_labelled_and_totals_sum_the_peers() {
        let stats = pb::StatsResponse {
            cache: Some(pb::CacheStats { slot_bytes: 100, hits: 9, ..Default::default() }),
            sessions: vec![pb::SessionStats { session_id: 7, client_name: "a\"b".into(), peer_key: "uid:0".into(), calls: 3, leases_held: 2, ..Default::default() }],
            peers: vec![
                pb::PeerStats { peer_key: "uid:0".into(), calls: 3, sessions_opened: 1, ..Default::default() },
                pb::PeerStats { peer_key: "uid:65534".into(), calls: 4, sessions_opened: 2, ..Default::default() },
            ],
            ..Default::default()
        };
        let text = render(&stats);
        assert!(text.contains("expertd_session_calls_total{session=\"7\",client=\"a\\\"b\",peer=\"uid:0\"} 3"), "{text}");
        assert!(text.contains("expertd_session_leased_bytes{session=\"7\",client=\"a\\\"b\",peer=\"uid:0\"} 200"), "{text}");
        assert!(text.contains("expertd_peer_calls_total{peer=\"uid:65534\"} 4"), "{text}");
        assert!(text.contains("expertd_calls_total 7"), "{text}");
        assert!(text.contains("expertd_sessions_total 3"), "{text}");
        assert!(text.trim_end().ends_with("# EOF"), "{text}");
    }
}
