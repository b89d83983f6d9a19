//! The server's counters, gauges and histograms (`GET /metrics`), registered in one
//! `prometheus-client` [`Registry`] and written by its Prometheus text encoder (format 0.0.4,
//! [`CONTENT_TYPE`]). Every metric name starts with `hostd_`; counters are registered without
//! `_total`, which the encoder appends.
//!
//! Lock-free on the generation path: the scheduler thread updates atomics only (the crate's
//! `Counter` and `Gauge`, and [`Histogram`] here, because the crate's own histogram takes a
//! mutex per observation). Per-endpoint request counts are a `Family`, whose label lookup
//! takes a lock once per HTTP request (not per token), which the handlers pay.

use prometheus_client::encoding::prometheus_text;
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Metric, Registry};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// The `Content-Type` of `GET /metrics`: Prometheus text, version 0.0.4.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// A `u64` gauge on an atomic.
pub type Gauge = gauge::Gauge<u64, AtomicU64>;

/// Latency bucket bounds in seconds, shared by the latency histograms.
const LATENCY_BUCKETS_S: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
];

/// Buckets of a [`Histogram`]: one per bound, plus `+Inf`.
const BUCKETS: usize = LATENCY_BUCKETS_S.len() + 1;

/// A fixed-bucket histogram of durations ([`LATENCY_BUCKETS_S`]) on atomics; clones share
/// the counts (one is registered, the other observes).
#[derive(Debug, Clone)]
pub struct Histogram(Arc<HistogramCounts>);

#[derive(Debug)]
struct HistogramCounts {
    /// Non-cumulative counts per bucket.
    counts: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
}

impl Histogram {
    fn new() -> Histogram {
        Histogram(Arc::new(HistogramCounts {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }))
    }

    /// Observations so far and the sum of their durations in nanoseconds.
    pub fn totals(&self) -> (u64, u64) {
        let count = self.0.counts.iter().map(|c| c.load(Relaxed)).sum();
        (count, self.0.sum_ns.load(Relaxed))
    }

    /// Records one duration.
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = LATENCY_BUCKETS_S
            .iter()
            .position(|b| s <= *b)
            .unwrap_or(LATENCY_BUCKETS_S.len());
        self.0.counts[i].fetch_add(1, Relaxed);
        self.0
            .sum_ns
            .fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Relaxed);
    }
}

impl TypedMetric for Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> std::fmt::Result {
        // One load per bucket; the count is their sum, so it always equals the `+Inf` bucket.
        let bounds = LATENCY_BUCKETS_S.iter().copied().chain([f64::INFINITY]);
        let buckets: Vec<(f64, u64)> = bounds
            .zip(&self.0.counts)
            .map(|(b, c)| (b, c.load(Relaxed)))
            .collect();
        let count: u64 = buckets.iter().map(|(_, n)| n).sum();
        let sum_s = self.0.sum_ns.load(Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum_s, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// HTTP endpoints with their own request-duration histogram; anything else is `other`.
pub const ENDPOINTS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/v1/responses/{id}",
    "/v1/models",
    "/health",
    "/metrics",
    "other",
];

/// Labels of `hostd_requests_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    endpoint: &'static str,
    status: u16,
}

/// Labels of `hostd_request_duration_seconds`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabel {
    endpoint: &'static str,
}

/// One [`Histogram`] per [`ENDPOINTS`] entry, indexed without a lock and written in that
/// order, every endpoint always present.
#[derive(Debug, Clone)]
struct PerEndpoint(Arc<[Histogram]>);

impl TypedMetric for PerEndpoint {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for PerEndpoint {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> std::fmt::Result {
        for (endpoint, h) in ENDPOINTS.iter().copied().zip(self.0.iter()) {
            let labels = EndpointLabel { endpoint };
            h.encode(encoder.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// Registers a clone of `metric` (the encoder reads it) and returns the metric (the code
/// updates it). `help` has no final period: the encoder appends one.
fn add<M: Metric + Clone>(r: &mut Registry, name: &str, help: &str, metric: M) -> M {
    r.register(name, help, metric.clone());
    metric
}

/// Everything `/metrics` reports.
#[derive(Debug)]
pub struct Metrics {
    /// What [`Metrics::render`] encodes: clones of the fields below.
    registry: Registry,
    /// `(endpoint, status) → count`; a family because the label set is open-ended (statuses).
    requests: Family<RequestLabels, Counter>,
    /// Per [`ENDPOINTS`] entry: time to the response head (whole body when not streaming).
    request_duration: PerEndpoint,
    /// Arrival (queue wait included) to the first generated token.
    pub ttft: Histogram,
    /// Time between consecutive tokens of one sequence.
    pub per_token: Histogram,
    /// Arrival to the last token of a generation (streaming or not).
    pub e2e: Histogram,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: Counter,
    /// Prompt tokens served from the prefix cache.
    pub cached_prompt_tokens: Counter,
    /// Tokens generated.
    pub generation_tokens: Counter,
    /// Requests waiting for the scheduler.
    pub queue_depth: Gauge,
    /// Prompt tokens of the requests waiting for the scheduler.
    pub queued_tokens: Gauge,
    /// Requests refused because the queue was full (in requests or in tokens).
    pub queue_rejected: Counter,
    /// Sequences being prefilled or decoded.
    pub active_sequences: Gauge,
    /// Bytes of state held by the active sequences.
    pub active_state_bytes: Gauge,
    /// Sequences stopped because their client went away (queued or running).
    pub cancelled: Counter,
    /// Generations that finished (stop or length).
    pub finished: Counter,
    /// Generations that failed inside the model.
    pub failed: Counter,
    /// Scheduler iterations that panicked (their sequences failed, the engine went on).
    pub engine_panics: Counter,
    /// Batched decode steps run.
    pub decode_steps: Counter,
    /// Sequences summed over decode steps (mean batch = this / `decode_steps`).
    pub decode_rows: Counter,
    /// Prefill forward calls run.
    pub prefill_chunks: Counter,
    /// Forward passes that carried prefill blocks and decode rows together.
    pub mixed_steps: Counter,
    /// Prefix-cache bytes held.
    pub cache_bytes: Gauge,
    /// Prefix-cache checkpoints held.
    pub cache_entries: Gauge,
    /// Shared key/value blocks the prefix cache holds.
    pub cache_blocks: Gauge,
    /// Prefix-cache lookups that found a prefix (the cache's own count, stored).
    pub cache_hits: Counter,
    /// Prefix-cache lookups that found none (the cache's own count, stored).
    pub cache_misses: Counter,
    /// Prefix-cache entries evicted (the cache's own count, stored).
    pub cache_evictions: Counter,
    /// Sequence states written to the state directory (shared with the store's writer).
    pub disk_saved: Counter,
    /// Sequence states resumed from the state directory.
    pub disk_loaded: Counter,
    /// State files refused (corrupt, truncated, another identity or layout).
    pub disk_refused: Counter,
    /// Saves skipped (the writer busy, or a state over the directory's cap).
    pub disk_skipped: Counter,
    /// State files deleted to stay within the directory's cap.
    pub disk_evicted: Counter,
    /// Bytes of state files in the directory.
    pub disk_bytes: Gauge,
    /// 1 once the model is loaded and the scheduler runs.
    pub model_loaded: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// The state directory's counters, shared with it (`prefix_store`).
    pub fn store_stats(&self) -> crate::prefix_store::StoreStats {
        crate::prefix_store::StoreStats {
            saved: self.disk_saved.clone(),
            loaded: self.disk_loaded.clone(),
            refused: self.disk_refused.clone(),
            skipped: self.disk_skipped.clone(),
            evicted: self.disk_evicted.clone(),
            disk_bytes: self.disk_bytes.clone(),
        }
    }

    /// All zero, registered in the order `/metrics` lists them.
    pub fn new() -> Metrics {
        let mut r = Registry::default();
        let c = Counter::default;
        let g = Gauge::default;
        let per_endpoint = PerEndpoint(ENDPOINTS.iter().map(|_| Histogram::new()).collect());
        Metrics {
            requests: add(
                &mut r,
                "hostd_requests",
                "HTTP requests by endpoint and status code",
                Family::default(),
            ),
            request_duration: add(
                &mut r,
                "hostd_request_duration_seconds",
                "Time to the response head (whole body when not streaming)",
                per_endpoint,
            ),
            ttft: add(
                &mut r,
                "hostd_time_to_first_token_seconds",
                "Arrival (queue wait included) to the first generated token",
                Histogram::new(),
            ),
            per_token: add(
                &mut r,
                "hostd_time_per_output_token_seconds",
                "Time between consecutive generated tokens of one sequence",
                Histogram::new(),
            ),
            e2e: add(
                &mut r,
                "hostd_e2e_request_seconds",
                "Arrival to the end of a generation",
                Histogram::new(),
            ),
            prompt_tokens: add(
                &mut r,
                "hostd_prompt_tokens",
                "Prompt tokens of admitted requests",
                c(),
            ),
            cached_prompt_tokens: add(
                &mut r,
                "hostd_cached_prompt_tokens",
                "Prompt tokens served from the prefix cache",
                c(),
            ),
            generation_tokens: add(&mut r, "hostd_generation_tokens", "Tokens generated", c()),
            queue_depth: add(
                &mut r,
                "hostd_queue_depth",
                "Requests waiting for the scheduler",
                g(),
            ),
            queued_tokens: add(
                &mut r,
                "hostd_queued_prompt_tokens",
                "Prompt tokens of the requests waiting for the scheduler",
                g(),
            ),
            queue_rejected: add(
                &mut r,
                "hostd_queue_rejected",
                "Requests refused with 429 because the queue was full (requests or tokens)",
                c(),
            ),
            active_sequences: add(
                &mut r,
                "hostd_active_sequences",
                "Sequences being prefilled or decoded",
                g(),
            ),
            active_state_bytes: add(
                &mut r,
                "hostd_active_state_bytes",
                "KV and DeltaNet state bytes held by active sequences",
                g(),
            ),
            cancelled: add(
                &mut r,
                "hostd_sequences_cancelled",
                "Sequences stopped because the client disconnected",
                c(),
            ),
            finished: add(
                &mut r,
                "hostd_sequences_finished",
                "Generations that ended by stop or length",
                c(),
            ),
            failed: add(
                &mut r,
                "hostd_sequences_failed",
                "Generations that failed in the model",
                c(),
            ),
            engine_panics: add(
                &mut r,
                "hostd_engine_panics",
                "Scheduler iterations that panicked; their sequences failed and the engine went on",
                c(),
            ),
            decode_steps: add(
                &mut r,
                "hostd_decode_steps",
                "Batched decode forward passes",
                c(),
            ),
            decode_rows: add(
                &mut r,
                "hostd_decode_rows",
                "Sequences summed over decode passes",
                c(),
            ),
            prefill_chunks: add(&mut r, "hostd_prefill_chunks", "Prefill blocks run", c()),
            mixed_steps: add(
                &mut r,
                "hostd_mixed_steps",
                "Forward passes that carried prefill blocks and decode rows together",
                c(),
            ),
            cache_bytes: add(
                &mut r,
                "hostd_state_cache_bytes",
                "Bytes held by the prefix cache (shared key/value blocks and checkpoints)",
                g(),
            ),
            cache_entries: add(
                &mut r,
                "hostd_state_cache_entries",
                "Checkpointed sequence states held by the prefix cache",
                g(),
            ),
            cache_blocks: add(
                &mut r,
                "hostd_state_cache_blocks",
                "Key/value blocks of 256 positions the prefix cache's checkpoints share",
                g(),
            ),
            cache_hits: add(
                &mut r,
                "hostd_state_cache_hits",
                "Prefix-cache lookups that reused a state",
                c(),
            ),
            cache_misses: add(
                &mut r,
                "hostd_state_cache_misses",
                "Prefix-cache lookups that found no usable state",
                c(),
            ),
            cache_evictions: add(
                &mut r,
                "hostd_state_cache_evictions",
                "Prefix-cache entries evicted to stay in budget",
                c(),
            ),
            disk_saved: add(
                &mut r,
                "hostd_state_disk_saved",
                "Sequence states written to --prefix-cache-dir",
                c(),
            ),
            disk_loaded: add(
                &mut r,
                "hostd_state_disk_loaded",
                "Sequence states resumed from --prefix-cache-dir",
                c(),
            ),
            disk_refused: add(
                &mut r,
                "hostd_state_disk_refused",
                "State files refused: corrupt, truncated, or saved under another model identity",
                c(),
            ),
            disk_skipped: add(
                &mut r,
                "hostd_state_disk_skipped",
                "State saves skipped because the writer was busy or the state exceeded the cap",
                c(),
            ),
            disk_evicted: add(
                &mut r,
                "hostd_state_disk_evicted",
                "State files deleted to stay within --prefix-cache-disk-bytes",
                c(),
            ),
            disk_bytes: add(
                &mut r,
                "hostd_state_disk_bytes",
                "Bytes of state files in --prefix-cache-dir",
                g(),
            ),
            model_loaded: add(
                &mut r,
                "hostd_model_loaded",
                "1 once the model is loaded and serving",
                g(),
            ),
            registry: r,
        }
    }

    /// Maps a matched route to its [`ENDPOINTS`] label.
    pub fn endpoint_label(path: &str) -> &'static str {
        ENDPOINTS.iter().find(|e| **e == path).copied().unwrap_or(
            if path.starts_with("/v1/models") {
                "/v1/models"
            } else if path.starts_with("/v1/responses/") {
                "/v1/responses/{id}"
            } else {
                "other"
            },
        )
    }

    /// Records one HTTP request's status and duration.
    pub fn record_request(&self, endpoint: &'static str, status: u16, took: Duration) {
        self.requests
            .get_or_create(&RequestLabels { endpoint, status })
            .inc();
        let i = ENDPOINTS
            .iter()
            .position(|e| *e == endpoint)
            .unwrap_or(ENDPOINTS.len() - 1);
        self.request_duration.0[i].observe(took);
    }

    /// The Prometheus text exposition (format 0.0.4, [`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(16384);
        // Writing into a String cannot fail.
        let _ = prometheus_text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Asserts that every line of `want` is in `text`.
    fn assert_lines(text: &str, want: &[&str]) {
        for line in want {
            assert!(text.contains(line), "{line:?} missing from\n{text}");
        }
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::new();
        m.ttft.observe(Duration::from_millis(3));
        m.ttft.observe(Duration::from_secs(1000));
        let text = m.render();
        assert_lines(
            &text,
            &[
                "hostd_time_to_first_token_seconds_bucket{le=\"0.005\"} 1",
                "hostd_time_to_first_token_seconds_bucket{le=\"300\"} 1",
                "hostd_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2",
                "hostd_time_to_first_token_seconds_count 2",
                "hostd_time_to_first_token_seconds_sum 1000.003",
            ],
        );
        assert_eq!(
            text.matches("hostd_time_to_first_token_seconds_bucket{le=\"+Inf\"}")
                .count(),
            1,
            "{text}"
        );
    }

    #[test]
    fn request_counts_by_endpoint_and_status() {
        let m = Metrics::new();
        m.record_request("/v1/models", 200, Duration::from_millis(1));
        m.record_request("/v1/models", 200, Duration::from_millis(1));
        m.record_request(
            Metrics::endpoint_label("/nope"),
            404,
            Duration::from_millis(1),
        );
        let text = m.render();
        assert_lines(
            &text,
            &[
                "hostd_requests_total{endpoint=\"/v1/models\",status=\"200\"} 2",
                "hostd_requests_total{endpoint=\"other\",status=\"404\"} 1",
                "hostd_request_duration_seconds_count{endpoint=\"/v1/models\"} 2",
                "hostd_request_duration_seconds_count{endpoint=\"/v1/responses/{id}\"} 0",
            ],
        );
        assert!(
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .all(|l| l.starts_with("hostd_"))
        );
    }

    #[test]
    fn names_help_and_types_are_those_of_the_text_format() {
        let m = Metrics::new();
        m.record_request("/health", 200, Duration::from_millis(1));
        m.generation_tokens.inc_by(5);
        m.queue_depth.set(2);
        let text = m.render();
        assert_lines(
            &text,
            &[
                "# HELP hostd_generation_tokens_total Tokens generated.\n# TYPE hostd_generation_tokens_total counter\nhostd_generation_tokens_total 5\n",
                "# HELP hostd_queue_depth Requests waiting for the scheduler.\n# TYPE hostd_queue_depth gauge\nhostd_queue_depth 2\n",
                "# TYPE hostd_e2e_request_seconds histogram\n",
                "# TYPE hostd_request_duration_seconds histogram\n",
            ],
        );
        // One HELP and one TYPE per family (34); no OpenMetrics `# EOF`.
        assert_eq!(text.matches("# HELP ").count(), 34, "{text}");
        assert_eq!(text.matches("# TYPE ").count(), 34, "{text}");
        assert!(!text.contains("# EOF"), "{text}");
    }
}
