//! The server's counters, gauges and histograms, and their Prometheus text rendering
//! (`GET /metrics`). Every metric name starts with `hostd_`.
//!
//! Lock-free on the generation path: the scheduler thread updates atomics only. Per-endpoint
//! request counts take a mutex once per HTTP request (not per token), which the handlers pay.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Latency bucket bounds in seconds, shared by the latency histograms.
const LATENCY_BUCKETS_S: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
];

/// A fixed-bucket histogram of durations (sum kept in nanoseconds).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Non-cumulative counts per bucket, plus one for `+Inf`.
    counts: Vec<AtomicU64>,
    sum_ns: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }

    /// Records one duration.
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = self
            .bounds
            .iter()
            .position(|b| s <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Relaxed);
        self.sum_ns
            .fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Relaxed)).sum()
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut acc = 0;
        for (i, b) in self.bounds.iter().enumerate() {
            acc += self.counts[i].load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {acc}");
        }
        acc += self.counts[self.bounds.len()].load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {acc}");
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(
            out,
            "{name}_sum{braces} {}",
            self.sum_ns.load(Relaxed) as f64 / 1e9
        );
        let _ = writeln!(out, "{name}_count{braces} {acc}");
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

/// Everything `/metrics` reports.
#[derive(Debug)]
pub struct Metrics {
    /// `(endpoint, status) → count`; a mutex because the label set is open-ended (statuses).
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    /// Per [`ENDPOINTS`] entry: time to the response head (whole body when not streaming).
    request_duration: Vec<Histogram>,
    /// Arrival to the last token of a generation (streaming or not).
    pub e2e: Histogram,
    /// Arrival (queue wait included) to the first generated token.
    pub ttft: Histogram,
    /// Time between consecutive tokens of one sequence.
    pub per_token: Histogram,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens served from the prefix cache.
    pub cached_prompt_tokens: AtomicU64,
    /// Tokens generated.
    pub generation_tokens: AtomicU64,
    /// Requests waiting for the scheduler.
    pub queue_depth: AtomicU64,
    /// Prompt tokens of the requests waiting for the scheduler.
    pub queued_tokens: AtomicU64,
    /// Requests refused because the queue was full (in requests or in tokens).
    pub queue_rejected: AtomicU64,
    /// Sequences being prefilled or decoded.
    pub active_sequences: AtomicU64,
    /// Bytes of state held by the active sequences.
    pub active_state_bytes: AtomicU64,
    /// Sequences stopped because their client went away (queued or running).
    pub cancelled: AtomicU64,
    /// Generations that finished (stop or length).
    pub finished: AtomicU64,
    /// Generations that failed inside the model.
    pub failed: AtomicU64,
    /// Batched decode steps run.
    pub decode_steps: AtomicU64,
    /// Sequences summed over decode steps (mean batch = this / `decode_steps`).
    pub decode_rows: AtomicU64,
    /// Prefill forward calls run.
    pub prefill_chunks: AtomicU64,
    /// Prefix-cache bytes held.
    pub cache_bytes: AtomicU64,
    /// Prefix-cache entries held.
    pub cache_entries: AtomicU64,
    /// Prefix-cache lookups that found a prefix.
    pub cache_hits: AtomicU64,
    /// Prefix-cache lookups that found none.
    pub cache_misses: AtomicU64,
    /// Prefix-cache entries evicted.
    pub cache_evictions: AtomicU64,
    /// 1 once the model is loaded and the scheduler runs.
    pub model_loaded: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// All zero.
    pub fn new() -> Metrics {
        let h = || Histogram::new(LATENCY_BUCKETS_S);
        Metrics {
            requests: Mutex::new(BTreeMap::new()),
            request_duration: ENDPOINTS.iter().map(|_| h()).collect(),
            e2e: h(),
            ttft: h(),
            per_token: h(),
            prompt_tokens: AtomicU64::new(0),
            cached_prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            queue_depth: AtomicU64::new(0),
            queued_tokens: AtomicU64::new(0),
            queue_rejected: AtomicU64::new(0),
            active_sequences: AtomicU64::new(0),
            active_state_bytes: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            decode_steps: AtomicU64::new(0),
            decode_rows: AtomicU64::new(0),
            prefill_chunks: AtomicU64::new(0),
            cache_bytes: AtomicU64::new(0),
            cache_entries: AtomicU64::new(0),
            cache_hits: AtomicU64::new(0),
            cache_misses: AtomicU64::new(0),
            cache_evictions: AtomicU64::new(0),
            model_loaded: AtomicU64::new(0),
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
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((endpoint, status)).or_insert(0) += 1;
        }
        let i = ENDPOINTS
            .iter()
            .position(|e| *e == endpoint)
            .unwrap_or(ENDPOINTS.len() - 1);
        self.request_duration[i].observe(took);
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8192);
        let head = |out: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        head(
            &mut out,
            "hostd_requests_total",
            "counter",
            "HTTP requests by endpoint and status code.",
        );
        if let Ok(m) = self.requests.lock() {
            for ((endpoint, status), n) in m.iter() {
                let _ = writeln!(
                    out,
                    "hostd_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}"
                );
            }
        }
        head(
            &mut out,
            "hostd_request_duration_seconds",
            "histogram",
            "Time to the response head (whole body when not streaming).",
        );
        for (e, h) in ENDPOINTS.iter().zip(&self.request_duration) {
            h.render(
                &mut out,
                "hostd_request_duration_seconds",
                &format!("endpoint=\"{e}\""),
            );
        }
        let hists = [
            (
                "hostd_time_to_first_token_seconds",
                "Arrival (queue wait included) to the first generated token.",
                &self.ttft,
            ),
            (
                "hostd_time_per_output_token_seconds",
                "Time between consecutive generated tokens of one sequence.",
                &self.per_token,
            ),
            (
                "hostd_e2e_request_seconds",
                "Arrival to the end of a generation.",
                &self.e2e,
            ),
        ];
        for (name, help, h) in hists {
            head(&mut out, name, "histogram", help);
            h.render(&mut out, name, "");
        }
        let scalars: [(&str, &str, &str, &AtomicU64); 20] = [
            (
                "hostd_prompt_tokens_total",
                "counter",
                "Prompt tokens of admitted requests.",
                &self.prompt_tokens,
            ),
            (
                "hostd_cached_prompt_tokens_total",
                "counter",
                "Prompt tokens served from the prefix cache.",
                &self.cached_prompt_tokens,
            ),
            (
                "hostd_generation_tokens_total",
                "counter",
                "Tokens generated.",
                &self.generation_tokens,
            ),
            (
                "hostd_queue_depth",
                "gauge",
                "Requests waiting for the scheduler.",
                &self.queue_depth,
            ),
            (
                "hostd_queued_prompt_tokens",
                "gauge",
                "Prompt tokens of the requests waiting for the scheduler.",
                &self.queued_tokens,
            ),
            (
                "hostd_queue_rejected_total",
                "counter",
                "Requests refused with 429 because the queue was full (requests or tokens).",
                &self.queue_rejected,
            ),
            (
                "hostd_active_sequences",
                "gauge",
                "Sequences being prefilled or decoded.",
                &self.active_sequences,
            ),
            (
                "hostd_active_state_bytes",
                "gauge",
                "KV and DeltaNet state bytes held by active sequences.",
                &self.active_state_bytes,
            ),
            (
                "hostd_sequences_cancelled_total",
                "counter",
                "Sequences stopped because the client disconnected.",
                &self.cancelled,
            ),
            (
                "hostd_sequences_finished_total",
                "counter",
                "Generations that ended by stop or length.",
                &self.finished,
            ),
            (
                "hostd_sequences_failed_total",
                "counter",
                "Generations that failed in the model.",
                &self.failed,
            ),
            (
                "hostd_decode_steps_total",
                "counter",
                "Batched decode forward passes.",
                &self.decode_steps,
            ),
            (
                "hostd_decode_rows_total",
                "counter",
                "Sequences summed over decode passes.",
                &self.decode_rows,
            ),
            (
                "hostd_prefill_chunks_total",
                "counter",
                "Prefill forward calls.",
                &self.prefill_chunks,
            ),
            (
                "hostd_state_cache_bytes",
                "gauge",
                "Bytes of conversation states held by the prefix cache.",
                &self.cache_bytes,
            ),
            (
                "hostd_state_cache_entries",
                "gauge",
                "Conversation states held by the prefix cache.",
                &self.cache_entries,
            ),
            (
                "hostd_state_cache_hits_total",
                "counter",
                "Prefix-cache lookups that reused a state.",
                &self.cache_hits,
            ),
            (
                "hostd_state_cache_misses_total",
                "counter",
                "Prefix-cache lookups that found no usable state.",
                &self.cache_misses,
            ),
            (
                "hostd_state_cache_evictions_total",
                "counter",
                "Prefix-cache entries evicted to stay in budget.",
                &self.cache_evictions,
            ),
            (
                "hostd_model_loaded",
                "gauge",
                "1 once the model is loaded and serving.",
                &self.model_loaded,
            ),
        ];
        for (name, kind, help, v) in scalars {
            head(&mut out, name, kind, help);
            let _ = writeln!(out, "{name} {}", v.load(Relaxed));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::new();
        m.ttft.observe(Duration::from_millis(3));
        m.ttft.observe(Duration::from_secs(1000));
        let text = m.render();
        assert!(
            text.contains("hostd_time_to_first_token_seconds_bucket{le=\"0.005\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("hostd_time_to_first_token_seconds_bucket{le=\"300\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("hostd_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("hostd_time_to_first_token_seconds_count 2"),
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
        assert!(
            text.contains("hostd_requests_total{endpoint=\"/v1/models\",status=\"200\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("hostd_requests_total{endpoint=\"other\",status=\"404\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("hostd_request_duration_seconds_count{endpoint=\"/v1/models\"} 2"),
            "{text}"
        );
        assert!(
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .all(|l| l.starts_with("hostd_"))
        );
    }
}
