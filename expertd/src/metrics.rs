//! The daemon's counters in the Prometheus/OpenMetrics text format, through the
//! `prometheus-client` crate: per open session and per peer (unix uid, or TCP address) calls,
//! failed calls, bytes read, hits, misses, leases held and the bytes those leases pin; the
//! daemon's totals (the sums over peers, closed sessions included); and the cache's own
//! occupancy and counters. [`render`] works on a `Stats` snapshot, so the opt-in HTTP endpoint
//! (`expertd serve --metrics-listen`) and `expertd stats` print the same text; [`serve`] is
//! that endpoint, on a TCP address or a unix socket path. Each metric is declared once, as one
//! row (name, kind, help, value) of a table.

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

/// A counter (cumulative, written with the `_total` suffix) or a gauge (a level now).
#[derive(Debug, Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
}

/// One metric of a labelled family: name, kind, help, and its value for one row of the
/// snapshot (a session or a peer) given the cache's slot bytes.
type Metric<T> = (&'static str, Kind, &'static str, fn(&T, u64) -> u64);

/// Per open session, labelled `session`, `client`, `peer`.
const SESSION_METRICS: &[Metric<pb::SessionStats>] = &[
    (
        "expertd_session_calls",
        Kind::Counter,
        "MoE calls completed by an open session",
        |x, _| x.calls,
    ),
    (
        "expertd_session_failed_calls",
        Kind::Counter,
        "MoE calls of an open session that failed",
        |x, _| x.failed_calls,
    ),
    (
        "expertd_session_hits",
        Kind::Counter,
        "Experts an open session found resident",
        |x, _| x.hits,
    ),
    (
        "expertd_session_misses",
        Kind::Counter,
        "Experts an open session had read from the container",
        |x, _| x.misses,
    ),
    (
        "expertd_session_read_bytes",
        Kind::Counter,
        "Bytes read from the container for an open session",
        |x, _| x.bytes_read,
    ),
    (
        "expertd_session_leases_held",
        Kind::Gauge,
        "Cache leases an open session holds now",
        |x, _| x.leases_held,
    ),
    (
        "expertd_session_leased_bytes",
        Kind::Gauge,
        "Resident cache bytes an open session's leases pin now (leases x slot bytes)",
        |x, slot| x.leases_held * slot,
    ),
    (
        "expertd_session_in_flight_calls",
        Kind::Gauge,
        "Calls of an open session queued or running now",
        |x, _| u64::from(x.in_flight_calls),
    ),
];

/// Per peer, over every session it opened, labelled `peer`.
const PEER_METRICS: &[Metric<pb::PeerStats>] = &[
    (
        "expertd_peer_sessions",
        Kind::Counter,
        "Sessions a peer (uid:U or tcp:ADDRESS) opened since start",
        |p, _| p.sessions_opened,
    ),
    (
        "expertd_peer_sessions_open",
        Kind::Gauge,
        "Sessions a peer holds open now",
        |p, _| u64::from(p.sessions_open),
    ),
    (
        "expertd_peer_calls",
        Kind::Counter,
        "MoE calls completed for a peer, closed sessions included",
        |p, _| p.calls,
    ),
    (
        "expertd_peer_failed_calls",
        Kind::Counter,
        "MoE calls of a peer that failed, closed sessions included",
        |p, _| p.failed_calls,
    ),
    (
        "expertd_peer_hits",
        Kind::Counter,
        "Experts a peer's calls found resident, closed sessions included",
        |p, _| p.hits,
    ),
    (
        "expertd_peer_misses",
        Kind::Counter,
        "Experts a peer's calls had read, closed sessions included",
        |p, _| p.misses,
    ),
    (
        "expertd_peer_read_bytes",
        Kind::Counter,
        "Bytes read from the container for a peer, closed sessions included",
        |p, _| p.bytes_read,
    ),
    (
        "expertd_peer_leases_held",
        Kind::Gauge,
        "Cache leases a peer's open sessions hold now",
        |p, _| p.leases_held,
    ),
    (
        "expertd_peer_leased_bytes",
        Kind::Gauge,
        "Resident cache bytes a peer's leases pin now",
        |p, slot| p.leases_held * slot,
    ),
];

/// A registry built for one snapshot: each family registered once by name, its values set once.
struct Snapshot {
    registry: Registry,
}

impl Snapshot {
    /// Registers the family `name` and sets its value for each `(labels, value)`.
    fn family(
        &mut self,
        name: &str,
        kind: Kind,
        help: &str,
        values: impl IntoIterator<Item = (Labels, u64)>,
    ) {
        match kind {
            Kind::Counter => {
                let f = Family::<Labels, Counter<u64>>::default();
                self.registry.register(name, help, f.clone());
                values.into_iter().for_each(|(l, v)| {
                    f.get_or_create(&l).inc_by(v);
                });
            }
            Kind::Gauge => {
                let f = Family::<Labels, Gauge<u64, AtomicU64>>::default();
                self.registry.register(name, help, f.clone());
                values.into_iter().for_each(|(l, v)| {
                    f.get_or_create(&l).set(v);
                });
            }
        }
    }

    /// Registers every metric of `metrics`, one labelled series per row.
    fn rows<T>(
        &mut self,
        metrics: &[Metric<T>],
        rows: &[T],
        labels: impl Fn(&T) -> Labels,
        slot_bytes: u64,
    ) {
        let labelled: Vec<(Labels, &T)> = rows.iter().map(|r| (labels(r), r)).collect();
        for &(name, kind, help, value) in metrics {
            self.family(
                name,
                kind,
                help,
                labelled
                    .iter()
                    .map(|(l, r)| (l.clone(), value(*r, slot_bytes))),
            );
        }
    }
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

/// Renders `stats` as OpenMetrics text (ending in `# EOF`). Counters carry the `_total` suffix.
pub fn render(stats: &pb::StatsResponse) -> String {
    let mut s = Snapshot {
        registry: Registry::default(),
    };
    let cache = stats.cache.unwrap_or_default();
    let session_labels = |x: &pb::SessionStats| {
        labels(&[
            ("session", &x.session_id.to_string()),
            ("client", &x.client_name),
            ("peer", &x.peer_key),
        ])
    };
    s.rows(
        SESSION_METRICS,
        &stats.sessions,
        session_labels,
        cache.slot_bytes,
    );
    s.rows(
        PEER_METRICS,
        &stats.peers,
        |p| labels(&[("peer", &p.peer_key)]),
        cache.slot_bytes,
    );

    // The daemon's totals (sums over the peers, closed sessions included), the cache itself
    // (speculative prefetch reads included) and the process: one unlabelled series each.
    let sum = |f: fn(&pb::PeerStats) -> u64| stats.peers.iter().map(f).sum::<u64>();
    let mut totals = vec![
        (
            "expertd_sessions",
            Kind::Counter,
            "Sessions opened since start, by every peer",
            sum(|p| p.sessions_opened),
        ),
        (
            "expertd_sessions_open",
            Kind::Gauge,
            "Sessions open now",
            stats.sessions.len() as u64,
        ),
        (
            "expertd_calls",
            Kind::Counter,
            "MoE calls completed since start, by every peer",
            sum(|p| p.calls),
        ),
        (
            "expertd_failed_calls",
            Kind::Counter,
            "MoE calls that failed since start",
            sum(|p| p.failed_calls),
        ),
        (
            "expertd_hits",
            Kind::Counter,
            "Experts clients' calls found resident since start",
            sum(|p| p.hits),
        ),
        (
            "expertd_misses",
            Kind::Counter,
            "Experts clients' calls had read since start",
            sum(|p| p.misses),
        ),
        (
            "expertd_read_bytes",
            Kind::Counter,
            "Bytes read from the container for clients' calls since start",
            sum(|p| p.bytes_read),
        ),
        (
            "expertd_cache_budget_bytes",
            Kind::Gauge,
            "The cache's byte budget for resident experts",
            cache.budget_bytes,
        ),
        (
            "expertd_cache_resident_bytes",
            Kind::Gauge,
            "Bytes of resident experts now",
            cache.resident_bytes,
        ),
        (
            "expertd_cache_resident_experts",
            Kind::Gauge,
            "Experts resident now",
            cache.resident_experts,
        ),
        (
            "expertd_cache_slot_bytes",
            Kind::Gauge,
            "Bytes of one cache slot (the blob stride)",
            cache.slot_bytes,
        ),
        (
            "expertd_cache_leases_held",
            Kind::Gauge,
            "Leases held now, across all sessions",
            cache.leases_held,
        ),
        (
            "expertd_cache_hits",
            Kind::Counter,
            "Cache lookups that found the expert resident (prefetch included)",
            cache.hits,
        ),
        (
            "expertd_cache_misses",
            Kind::Counter,
            "Cache lookups that read the expert (prefetch included)",
            cache.misses,
        ),
        (
            "expertd_cache_evictions",
            Kind::Counter,
            "Experts evicted to make room",
            cache.evictions,
        ),
        (
            "expertd_cache_read_bytes",
            Kind::Counter,
            "Bytes read from the container (prefetch included)",
            cache.bytes_read,
        ),
        (
            "expertd_open_connections",
            Kind::Gauge,
            "Connections open now",
            u64::from(stats.open_connections),
        ),
        (
            "expertd_draining",
            Kind::Gauge,
            "1 while the daemon drains for shutdown",
            u64::from(stats.draining),
        ),
        (
            "expertd_queued_request_bytes",
            Kind::Gauge,
            "Bytes of decoded MoeLayer requests waiting for a compute lane (--max-queued-bytes caps it)",
            stats.queued_request_bytes,
        ),
        (
            "expertd_queue_full_refusals",
            Kind::Counter,
            "MoeLayer calls refused because the queue's byte cap was reached",
            stats.queue_full_refusals,
        ),
        (
            "expertd_uptime_seconds",
            Kind::Gauge,
            "Seconds since the daemon started serving",
            stats.uptime_ns / 1_000_000_000,
        ),
    ];
    if let Some(p) = &stats.prefetch {
        totals.push((
            "expertd_prefetch_read_bytes",
            Kind::Counter,
            "Bytes read speculatively on prefetch hints",
            p.bytes_read,
        ));
        totals.push((
            "expertd_prefetch_useful_bytes",
            Kind::Counter,
            "Speculatively read bytes a demand call then hit",
            p.useful_bytes,
        ));
    }
    for (name, kind, help, value) in totals {
        s.family(name, kind, help, [(Labels::new(), value)]);
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
        s.parse().map(MetricsListen::Tcp).map_err(|e| {
            format!("{s:?} is neither HOST:PORT ({e}) nor a unix socket path (containing '/')")
        })
    }
}

/// Binds the endpoint now (so a bind error stops start-up) and returns the task serving
/// `GET /metrics` from `state` until the runtime ends. A unix socket gets mode 0660 and replaces
/// a stale file; its path is removed by the caller on exit.
pub async fn serve(
    at: &MetricsListen,
    state: Arc<crate::rpc::ServiceState>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    use axum::http::header;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let state = Arc::clone(&state);
            async move {
                (
                    [(header::CONTENT_TYPE, CONTENT_TYPE)],
                    render(&state.stats()),
                )
            }
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
            cache: Some(pb::CacheStats {
                slot_bytes: 100,
                hits: 9,
                ..Default::default()
            }),
            sessions: vec![pb::SessionStats {
                session_id: 7,
                client_name: "a\"b".into(),
                peer_key: "uid:0".into(),
                calls: 3,
                leases_held: 2,
                ..Default::default()
            }],
            peers: vec![
                pb::PeerStats {
                    peer_key: "uid:0".into(),
                    calls: 3,
                    sessions_opened: 1,
                    ..Default::default()
                },
                pb::PeerStats {
                    peer_key: "uid:65534".into(),
                    calls: 4,
                    sessions_opened: 2,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let text = render(&stats);
        assert!(
            text.contains(
                "expertd_session_calls_total{session=\"7\",client=\"a\\\"b\",peer=\"uid:0\"} 3"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "expertd_session_leased_bytes{session=\"7\",client=\"a\\\"b\",peer=\"uid:0\"} 200"
            ),
            "{text}"
        );
        assert!(
            text.contains("expertd_peer_calls_total{peer=\"uid:65534\"} 4"),
            "{text}"
        );
        assert!(text.contains("expertd_calls_total 7"), "{text}");
        assert!(text.contains("expertd_sessions_total 3"), "{text}");
        assert!(text.trim_end().ends_with("# EOF"), "{text}");
    }
}
