//! The expert boundary: the MoE block computes the route and hands `(layer, rows, expert ids,
//! weights)` to an [`ExpertBackend`]; the backend returns the weighted sum of the chosen
//! experts' outputs per row.
//!
//! Backends: [`bf16::Bf16Experts`] computes straight from the checkpoint's BF16 bytes (the
//! reference); [`int8::Int8Experts`] runs the W8A8 kernels on the INT8 container. The expertd
//! client implements the same trait.

pub mod bf16;
pub mod int8;
pub mod view;

use crate::profile::Profiler;
use shared::ids::{ExpertId, LayerId};

/// One MoE layer's routed-expert work for a batch of rows.
#[derive(Debug, Clone, Copy)]
pub struct MoeCall<'a> {
    /// Layer.
    pub layer: LayerId,
    /// Rows (tokens) in this call.
    pub n_rows: usize,
    /// Experts per row.
    pub top_k: usize,
    /// Activations, `n_rows × hidden`, row-major.
    pub x: &'a [f32],
    /// Chosen experts, `n_rows × top_k`, row-major.
    pub ids: &'a [u32],
    /// Routing weights, `n_rows × top_k`, aligned with `ids`.
    pub weights: &'a [f32],
}

/// Why an expert call failed, naming the layer and expert where one is involved.
#[derive(Debug, thiserror::Error)]
pub enum ExpertError {
    /// The call itself is malformed (lengths, ids, weights).
    #[error("invalid expert call for layer {layer}: {reason}")]
    InvalidCall {
        /// Layer of the call.
        layer: LayerId,
        /// What is wrong.
        reason: String,
    },
    /// A remote backend (expertd) could not compute the call: unreachable, refused or failed.
    #[error("layer {layer}: {backend} expert backend: {reason}")]
    Backend {
        /// The backend's name.
        backend: &'static str,
        /// Layer of the call.
        layer: LayerId,
        /// What failed, naming the daemon's address.
        reason: String,
    },
    /// A remote backend is (for now) unreachable or did not answer in time; the same request
    /// may succeed when retried after `retry_after_s` (HTTP 503 with `Retry-After`).
    #[error("layer {layer}: {backend} expert backend unavailable: {reason}")]
    Unavailable {
        /// The backend's name.
        backend: &'static str,
        /// Layer of the call.
        layer: LayerId,
        /// What failed, naming the daemon's address.
        reason: String,
        /// Suggested wait before retrying, in seconds.
        retry_after_s: u64,
    },
    /// An expert's weights could not be read.
    #[error("layer {layer} expert {expert}: {reason}")]
    Expert {
        /// Layer.
        layer: LayerId,
        /// Expert.
        expert: ExpertId,
        /// What failed.
        reason: String,
    },
}

/// What a daemon's speculative reads cost and bought, cumulative (its `Stats.prefetch`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpeculativeCounters {
    /// Bytes read speculatively.
    pub bytes_read: u64,
    /// Bytes of those that a demand call then hit.
    pub useful_bytes: u64,
    /// Predicted experts dropped unread because their layer's call had already started.
    pub stale: u64,
}

impl SpeculativeCounters {
    /// `self − earlier`, saturating (a restarted daemon starts from zero).
    pub fn since(&self, earlier: &SpeculativeCounters) -> SpeculativeCounters {
        SpeculativeCounters {
            bytes_read: self.bytes_read.saturating_sub(earlier.bytes_read),
            useful_bytes: self.useful_bytes.saturating_sub(earlier.useful_bytes),
            stale: self.stale.saturating_sub(earlier.stale),
        }
    }

    /// Adds another daemon's counters.
    pub fn plus(&self, o: &SpeculativeCounters) -> SpeculativeCounters {
        SpeculativeCounters {
            bytes_read: self.bytes_read + o.bytes_read,
            useful_bytes: self.useful_bytes + o.useful_bytes,
            stale: self.stale + o.stale,
        }
    }
}

/// Computes routed experts. Implementations must sum each row's `top_k` weighted expert
/// outputs in the order the call lists them, so results do not depend on caching or batching.
pub trait ExpertBackend: Send + Sync {
    /// Short name for logs and reports (`bf16`, `int8`, `expertd`).
    fn name(&self) -> &'static str;
    /// Writes `out[r] = Σ_k weights[r,k] · expert_{ids[r,k]}(x[r])` for every row. When
    /// `profiler` is given, records the call's own figures into it (`experts.*` ops and
    /// counters: daemon queue, IO wait and compute, cache hits); it never changes a result.
    fn moe_layer_profiled(
        &self,
        call: &MoeCall<'_>,
        out: &mut [f32],
        profiler: Option<&Profiler>,
    ) -> Result<(), ExpertError>;
    /// [`moe_layer_profiled`](Self::moe_layer_profiled) without a profiler.
    fn moe_layer(&self, call: &MoeCall<'_>, out: &mut [f32]) -> Result<(), ExpertError> {
        self.moe_layer_profiled(call, out, None)
    }
    /// [`moe_layer_profiled`](Self::moe_layer_profiled), running `during` exactly once on
    /// the calling thread, also when the call fails. A backend whose experts are computed
    /// elsewhere (expertd's call ring) runs it while the call is in flight, so the caller's
    /// own independent work (the shared expert) overlaps the daemon's; in process it runs
    /// after the call. `during` must not touch `out`; nothing it does changes the result.
    fn moe_layer_overlapped(
        &self,
        call: &MoeCall<'_>,
        out: &mut [f32],
        profiler: Option<&Profiler>,
        during: &mut dyn FnMut(),
    ) -> Result<(), ExpertError> {
        let r = self.moe_layer_profiled(call, out, profiler);
        during();
        r
    }
    /// What determines this backend's results, for the identity of saved sequence states:
    /// `bf16` (the checkpoint's experts), or the container's fingerprint. `None`
    /// when it cannot say (a daemon not connected).
    fn results_identity(&self) -> Option<String>;
    /// Weight bytes this backend streams per expert it computes (for profiling), if known.
    fn expert_bytes(&self) -> Option<usize> {
        None
    }
    /// How calls reach a remote backend (`ring`, `rpc+shm`, `rpc-inline`); `None` in process.
    fn transport(&self) -> Option<String> {
        None
    }
    /// Whether the backend takes [`prefetch`](Self::prefetch) hints (the model then predicts
    /// the next layer's experts; it costs a router projection per layer).
    fn wants_prefetch(&self) -> bool {
        false
    }
    /// A hint: `layer` will probably call `experts` (most probable first) next. Never changes a result; a backend
    /// may ignore it. `profiler`, when given, counts the hints sent.
    fn prefetch(&self, _layer: LayerId, _experts: &[u32], _profiler: Option<&Profiler>) {}
    /// Cumulative speculative-read counters of the backend's daemon(s).
    fn speculative_counters(&self) -> Option<SpeculativeCounters> {
        None
    }
    /// The reader of a remote backend's daemon as its handshake reported it, e.g.
    /// `io=io_uring o_direct=true` (`None`: in process, or not connected).
    fn io_backend(&self) -> Option<String> {
        None
    }
    /// Process id of the private expertd this backend started and owns, while it runs.
    fn private_daemon_pid(&self) -> Option<u32> {
        None
    }
    /// Readiness of a remote backend (`None`: in process, always ready).
    fn health(&self) -> Option<crate::expert_client::health::HealthReport> {
        None
    }
    /// A remote backend's cache for the live panel: this process's per-layer hits and misses
    /// and its daemon(s)' `Stats` (`None`: in process, no cache). Blocks on the daemon.
    fn cache_view(&self) -> Option<view::CacheView> {
        None
    }
}

/// Combines per-expert outputs (`(cells, cells.len() × d outputs)` per expert) into the call's
/// result with the one implementation every backend shares ([`shared::moe_combine`]): each
/// row's weighted outputs summed in slot order.
pub fn combine_in_call_order(
    call: &MoeCall<'_>,
    d: usize,
    results: Vec<(Vec<usize>, Vec<f32>)>,
    out: &mut [f32],
) {
    let mut slots = vec![0.0f32; call.n_rows * call.top_k * d];
    for (cells, y) in results {
        shared::moe_combine::scatter(&mut slots, d, &cells, &y);
    }
    shared::moe_combine::sum_in_call_order(&slots, call.weights, call.n_rows, call.top_k, d, out);
}

/// Checks a call's shape and contents against the model's dimensions.
pub fn validate_call(
    call: &MoeCall<'_>,
    n_layers: usize,
    n_experts: usize,
    hidden: usize,
    out_len: usize,
) -> Result<(), ExpertError> {
    let bad = |reason: String| {
        Err(ExpertError::InvalidCall {
            layer: call.layer,
            reason,
        })
    };
    if call.layer.index() >= n_layers {
        return bad(format!("layer out of range (model has {n_layers})"));
    }
    shared::moe_exec::validate_routing(call.n_rows, call.top_k, call.ids, call.weights, n_experts)
        .map_err(|reason| ExpertError::InvalidCall {
            layer: call.layer,
            reason,
        })?;
    if call.x.len() != call.n_rows * hidden || out_len != call.n_rows * hidden {
        return bad(format!(
            "activations ({}) and output ({out_len}) must hold rows × hidden = {} × {hidden}",
            call.x.len(),
            call.n_rows
        ));
    }
    Ok(())
}
