//! `GET /v1/live`: the web page's live panel as server-sent events. One `data:` JSON object per
//! interval (default 1 s, `?interval_ms=200..10000`) with what changed since the previous one:
//! tokens generated and their rate, mean time to first token, running and queued requests,
//! both processes' RSS, which experts each layer routed to, each layer's cache misses, the
//! daemon's cache and sessions, and disk reads per second and per token. Nothing is computed on
//! the generation path: the scheduler only bumps counters it bumps anyway (and one relaxed add
//! per routed expert); this handler reads them once per interval, so a closed page costs
//! nothing and an open one a snapshot per interval (docs/web.md has the measured cost).

use super::{AppState, Ready};
use crate::experts::view::{CacheView, DaemonView};
use axum::extract::{Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde::Serialize;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `?interval_ms=`.
#[derive(Debug, serde::Deserialize)]
pub(super) struct LiveQuery {
    interval_ms: Option<u64>,
}

/// One event.
#[derive(Debug, Serialize)]
struct Frame {
    interval_s: f64,
    model: String,
    tokens: Tokens,
    ttft: Ttft,
    requests: Requests,
    rss_bytes: Rss,
    experts: Experts,
    daemon: Option<Daemon>,
    disk: Disk,
}

#[derive(Debug, Serialize)]
struct Tokens {
    generated_total: u64,
    prompt_total: u64,
    generated_per_s: f64,
}

#[derive(Debug, Serialize)]
struct Ttft {
    /// Mean over the requests whose first token came in this interval.
    mean_s: Option<f64>,
    count_total: u64,
}

#[derive(Debug, Serialize)]
struct Requests {
    running: u64,
    queued: u64,
}

#[derive(Debug, Serialize)]
struct Rss {
    hostd: Option<u64>,
    /// The daemons' sum (each reports its own in `Stats`).
    expertd: Option<u64>,
}

#[derive(Debug, Serialize)]
struct Experts {
    backend: &'static str,
    layers: usize,
    experts: usize,
    /// Layer-major `layers × experts` routings in this interval.
    routed: Vec<u64>,
    /// Per layer, this process's cache hits and misses in this interval (`None`: no cache).
    layer_hits: Option<Vec<u64>>,
    layer_misses: Option<Vec<u64>>,
}

/// The daemons' caches, summed, and their sessions (cumulative since each started).
#[derive(Debug, Serialize)]
struct Daemon {
    budget_bytes: u64,
    resident_bytes: u64,
    hits: u64,
    misses: u64,
    bytes_read: u64,
    sessions: Vec<crate::experts::view::SessionView>,
}

#[derive(Debug, Serialize)]
struct Disk {
    /// The daemons' container reads (all their clients') when there is a daemon, else this
    /// process's physical reads (`/proc/self/io` `read_bytes`: in-process experts read through
    /// the page cache).
    read_bytes_per_s: f64,
    /// The reads for this process (its own daemon session's, else its physical reads) over the
    /// tokens it generated in the interval (`None`: none generated).
    read_bytes_per_token: Option<f64>,
}

/// Cumulative counters at one instant.
struct Sample {
    at: Instant,
    generated: u64,
    prompt: u64,
    ttft: (u64, u64),
    routed: Vec<u64>,
    cache: Option<CacheView>,
    read_bytes: u64,
}

fn daemons_of(s: &Sample) -> &[DaemonView] {
    s.cache.as_ref().map_or(&[][..], |c| c.daemons.as_slice())
}

/// Bytes read between two samples: per daemon (by endpoint) when there are daemons, only
/// those in both samples (a daemon that missed a `Stats` call is skipped rather than showing
/// its whole counter as one interval's reads); else this process's physical reads. `pick`
/// chooses the daemon counter (all sessions' reads or this client's own).
fn reads_between(before: &Sample, now: &Sample, pick: fn(&DaemonView) -> Option<u64>) -> u64 {
    let (b, n) = (daemons_of(before), daemons_of(now));
    if n.is_empty() && b.is_empty() {
        return now.read_bytes.saturating_sub(before.read_bytes);
    }
    n.iter()
        .filter_map(|d| {
            let prev = b.iter().find(|p| p.endpoint == d.endpoint)?;
            Some(pick(d)?.saturating_sub(pick(prev)?))
        })
        .sum()
}

fn sample(app: &AppState, ready: &Ready) -> Sample {
    let m = app.metrics();
    let cache = ready.experts.as_ref().and_then(|e| e.cache_view());
    let read_bytes = shared::procfs::read_bytes(None).unwrap_or(0);
    Sample {
        at: Instant::now(),
        generated: m.generation_tokens.get(),
        prompt: m.prompt_tokens.get(),
        ttft: m.ttft.totals(),
        routed: ready.heat.as_ref().map_or_else(Vec::new, |h| h.snapshot()),
        cache,
        read_bytes,
    }
}

fn delta(now: &[u64], before: &[u64]) -> Vec<u64> {
    now.iter()
        .enumerate()
        .map(|(i, v)| v.saturating_sub(before.get(i).copied().unwrap_or(0)))
        .collect()
}

fn frame(app: &AppState, ready: &Ready, before: &Sample, now: &Sample) -> Frame {
    let secs = now.at.duration_since(before.at).as_secs_f64().max(1e-3);
    let generated = now.generated.saturating_sub(before.generated);
    let ttft_n = now.ttft.0.saturating_sub(before.ttft.0);
    let ttft_ns = now.ttft.1.saturating_sub(before.ttft.1);
    let read = reads_between(before, now, |d| Some(d.bytes_read));
    let own_read = reads_between(before, now, |d| d.own_bytes_read);
    let m = app.metrics();
    let (layers, experts) = ready
        .heat
        .as_ref()
        .map_or((0, 0), |h| (h.n_layers(), h.n_experts()));
    let cache_delta = |pick: fn(&CacheView) -> &Vec<u64>| {
        now.cache.as_ref().map(|c| {
            delta(
                pick(c),
                before
                    .cache
                    .as_ref()
                    .map_or(&[][..], |b| pick(b).as_slice()),
            )
        })
    };
    let daemons = now
        .cache
        .as_ref()
        .map(|c| &c.daemons)
        .filter(|d| !d.is_empty());
    Frame {
        interval_s: secs,
        model: app.served_model_name().to_string(),
        tokens: Tokens {
            generated_total: now.generated,
            prompt_total: now.prompt,
            generated_per_s: generated as f64 / secs,
        },
        ttft: Ttft {
            mean_s: (ttft_n > 0).then(|| ttft_ns as f64 / 1e9 / ttft_n as f64),
            count_total: now.ttft.0,
        },
        requests: Requests {
            running: m.active_sequences.get(),
            queued: m.queue_depth.get(),
        },
        rss_bytes: Rss {
            hostd: shared::procfs::vm_rss_bytes(None),
            expertd: daemons.and_then(|d| d.iter().map(|x| x.rss_bytes).sum()),
        },
        experts: Experts {
            backend: ready.experts.as_ref().map_or("unknown", |e| e.name()),
            layers,
            experts,
            routed: delta(&now.routed, &before.routed),
            layer_hits: cache_delta(|c| &c.layer_hits),
            layer_misses: cache_delta(|c| &c.layer_misses),
        },
        daemon: daemons.map(|d| Daemon {
            budget_bytes: d.iter().map(|x| x.budget_bytes).sum(),
            resident_bytes: d.iter().map(|x| x.resident_bytes).sum(),
            hits: d.iter().map(|x| x.hits).sum(),
            misses: d.iter().map(|x| x.misses).sum(),
            bytes_read: d.iter().map(|x| x.bytes_read).sum(),
            sessions: d.iter().flat_map(|x| x.sessions.clone()).collect(),
        }),
        disk: Disk {
            read_bytes_per_s: read as f64 / secs,
            read_bytes_per_token: (generated > 0).then(|| own_read as f64 / generated as f64),
        },
    }
}

/// `GET /v1/live`.
pub(super) async fn live(
    State(app): State<Arc<AppState>>,
    Query(q): Query<LiveQuery>,
) -> Result<Response, super::error::ApiError> {
    let ready = Arc::clone(app.ready()?);
    let every = Duration::from_millis(q.interval_ms.unwrap_or(1000).clamp(200, 10_000));
    // The daemon's Stats call blocks: every sample runs off the async threads.
    let take = |app: Arc<AppState>, ready: Arc<Ready>| async move {
        tokio::task::spawn_blocking(move || sample(&app, &ready))
            .await
            .ok()
    };
    let first = take(Arc::clone(&app), Arc::clone(&ready))
        .await
        .ok_or_else(|| super::error::ApiError::Internal("the live sampler failed".into()))?;
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    let closing = app.closing.subscribe();
    let events = stream::unfold(
        (first, ticker, app, ready, closing),
        move |(before, mut ticker, app, ready, mut closing)| async move {
            if *closing.borrow() {
                return None;
            }
            tokio::select! {
                _ = ticker.tick() => {}
                // Shutting down (or the sender is gone): the feed ends.
                _ = closing.changed() => return None,
            }
            let mut now = take(Arc::clone(&app), Arc::clone(&ready)).await?;
            let f = frame(&app, &ready, &before, &now);
            // The histogram's count and sum are read one after the other; while no first
            // token was counted, keep the old pair, so a sum that ran ahead of its count is
            // taken with that count in a later frame instead of dropped.
            if now.ttft.0 == before.ttft.0 {
                now.ttft = before.ttft;
            }
            let data = serde_json::to_string(&f).unwrap_or_else(|_| "{}".into());
            Some((
                Ok::<_, Infallible>(Event::default().data(data)),
                (now, ticker, app, ready, closing),
            ))
        },
    );
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}
