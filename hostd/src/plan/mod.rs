//! `hostd plan`'s arithmetic: from a model's sizes and a measured machine, whether each expert
//! format fits resident or must stream, the cache budget to give it, and the decode tok/s that the
//! DRAM and disk rooflines and the hit-rate model predict.
//!
//! The model of one decode token (every byte figure from the configuration and the container
//! layout, every rate measured on this machine by `hostd plan` (`cli/plan_machine.rs`)):
//! - compute time `t_c = (dense + experts) bytes per token ÷ (e · DRAM GB/s)`, where `e` is the
//!   share of the DRAM probe a decode step achieves: [`DRAM_EFFICIENCY`], measured by `hostd bench`
//!   at 40 layers (`docs/results/headline40-intel.md`, `kquant-experts.md`);
//! - disk time `t_d = (1 − hit rate) · expert bytes per token ÷ O_DIRECT GB/s` (the median of
//!   the probe's samples), zero when resident;
//! - tok/s `= 1 ÷ (max(t_c, t_d) + ½ · min(t_c, t_d))`: half of the shorter phase overlaps the
//!   longer (prefetch hints, hits computed while misses are read); the range runs from no overlap
//!   with the lowest `e` and the slowest disk sample to full overlap with the highest `e` and the
//!   fastest sample.
//!
//! The hit rate comes from [`hits`]: the daemon's own cache planner replayed over routes without
//! locality (what random-weight checkpoints do), and a published curve for trained routing.

pub mod hits;

use crate::model::linear::DenseFormat;
use serde::Serialize;
use shared::config::TextConfig;
use shared::container::{ContainerLayout, ExpertDims, ExpertFormat};
use shared::sizes::ModelSizes;
use shared::tensor_spec::{self, PREFIX_RELEASE};

/// The share of the DRAM probe one decode token's weight reads achieve, `(low, point, high)`.
/// Measured at 40 layers on the project's VM, INT8 dense: 0.78–0.89 over the headline runs,
/// 0.62–0.80 over the k-quant A/B in a slow hour (`docs/results/kquant-experts.md`).
pub const DRAM_EFFICIENCY: (f64, f64, f64) = (0.65, 0.80, 0.90);
/// What hostd holds beside its INT8 projections: tokenizer, activations, scratch, the mapped
/// embedding rows it touched, allocator slack. Measured: hostd's RSS less its INT8 projections
/// at 40 layers with a private expertd (`headline40-intel.md`: 3.08 GiB − 1.79 GiB).
pub const HOST_RUNTIME_BYTES: u64 = 1_300 << 20;
/// Room left free for the rest of the machine (the private daemon's default, too).
pub const HEADROOM_BYTES: u64 = crate::expert_client::private::DEFAULT_HEADROOM_BYTES;
/// expertd's fixed runtime, as its own overhead estimate counts it (`expertd::memlimit`'s
/// `BASE_OVERHEAD_BYTES`); [`expertd_overhead`] adds its transient buffers.
pub const EXPERTD_BASE_BYTES: u64 = 96 << 20;
/// The private daemon's compute lanes (expertd's default), each with `min(experts, 32)`
/// transient buffers (its `--transient-slots` default).
pub const EXPERTD_LANES: u64 = 2;
/// The smallest cache worth running with: below this, use a bigger machine or a smaller format.
pub const MIN_CACHE_BYTES: u64 = 256 << 20;

/// What the plan needs to know about the model, from its configuration.
#[derive(Debug, Clone, Serialize)]
pub struct ModelFacts {
    /// Decoder layers.
    pub layers: usize,
    /// Routed experts per layer.
    pub experts: usize,
    /// Experts each token routes to in every layer.
    pub top_k: usize,
    /// Dense weights hostd holds in its own memory with `--dense int8`: the INT8 projections
    /// and the small tensors as stored. The embedding table stays mapped from the checkpoint
    /// and only the rows a prompt touches become resident, so it is not counted.
    pub dense_resident_bytes: u64,
    /// The embedding table (BF16), mapped from the checkpoint.
    pub embedding_bytes: u64,
    /// Whether the embedding table stays mapped from the checkpoint (a safetensors directory);
    /// `false` when it is held in memory (converted from a GGUF) and counted in
    /// `dense_resident_bytes` ([`ModelFacts::hold_embedding`]).
    pub embedding_mapped: bool,
    /// Dense weight bytes one decode token reads with `--dense int8` (all but the embedding
    /// table, plus one embedding row).
    pub dense_bytes_per_token: u64,
    /// KV cache bytes per token of context (sluice stores K and V in f32).
    pub kv_bytes_per_token: u64,
    /// DeltaNet state of one sequence (f32).
    pub linear_state_bytes: u64,
    /// Each expert format's container.
    pub formats: Vec<FormatFacts>,
}

/// One expert format's container, by the layout `expertd prepare --format` would write.
#[derive(Debug, Clone, Serialize)]
pub struct FormatFacts {
    /// `int8`, `q4k`, `q4k-q6k`.
    pub format: &'static str,
    /// Bits per weight on average (storage, scales included).
    pub bits_per_weight: f64,
    /// One expert's blob, aligned: what a cache slot and a miss read cost.
    pub slot_bytes: u64,
    /// The whole `experts.sluice` file.
    pub container_bytes: u64,
    /// Expert bytes one decode token reads: `layers · top_k · slot_bytes`.
    pub expert_bytes_per_token: u64,
}

impl ModelFacts {
    /// Everything from the configuration; `Err` names a dimension no container can hold.
    pub fn from_config(cfg: &TextConfig) -> Result<ModelFacts, shared::container::ContainerError> {
        let sizes = ModelSizes::from_config(cfg);
        let (_, per_token) = dense_bytes(cfg, DenseFormat::Int8);
        let embedding = sizes.embedding_bytes_bf16;
        let dims = ExpertDims::from_config(cfg)?;
        let params = 3 * cfg.hidden_size as u64 * cfg.moe_intermediate_size as u64;
        let mut formats = Vec::new();
        for format in ExpertFormat::ALL {
            let layout = ContainerLayout::new(dims.with_format(format))?;
            let slot = layout.blob.stride as u64;
            formats.push(FormatFacts {
                format: format.name(),
                bits_per_weight: slot as f64 * 8.0 / params as f64,
                slot_bytes: slot,
                container_bytes: layout.file_bytes,
                expert_bytes_per_token: cfg.num_layers as u64 * cfg.experts_per_token as u64 * slot,
            });
        }
        Ok(ModelFacts {
            layers: cfg.num_layers,
            experts: cfg.num_experts,
            top_k: cfg.experts_per_token,
            dense_resident_bytes: host_weight_bytes(cfg, DenseFormat::Int8) - HOST_RUNTIME_BYTES,
            embedding_bytes: embedding,
            embedding_mapped: true,
            dense_bytes_per_token: per_token,
            kv_bytes_per_token: sizes.runtime_kv_bytes_per_token,
            linear_state_bytes: sizes.runtime_linear_state_bytes_per_sequence,
            formats,
        })
    }

    /// The embedding table is held in hostd's memory (a GGUF's, dequantized to BF16), not
    /// mapped: it counts in the dense weights.
    pub fn hold_embedding(&mut self) {
        if self.embedding_mapped {
            self.embedding_mapped = false;
            self.dense_resident_bytes += self.embedding_bytes;
        }
    }

    /// hostd's memory for one sequence of `context` tokens: dense weights (without the mapped
    /// embedding table), KV and DeltaNet state, and [`HOST_RUNTIME_BYTES`].
    pub fn host_bytes(&self, context: u64) -> u64 {
        self.dense_resident_bytes
            + self.kv_bytes_per_token * context
            + self.linear_state_bytes
            + HOST_RUNTIME_BYTES
    }
}

/// `(resident, per decode token)` bytes of the dense weights in `format`. INT8 quantises the
/// projections `hostd` runs through `Linear` (per output row: one byte per weight and an f32
/// scale per row); the embedding table, norms, convolution, the router, the shared-expert gate
/// and DeltaNet's `a`/`b` projections stay as stored (`model/linear.rs`). `gguf` is counted as
/// INT8: its k-quant projections are smaller (4.5 or 6.6 bits), so this is an upper bound.
pub fn dense_bytes(cfg: &TextConfig, format: DenseFormat) -> (u64, u64) {
    let mut resident = 0u64;
    let mut embedding = 0u64;
    for t in tensor_spec::dense_tensors(cfg, PREFIX_RELEASE) {
        let bytes = if format != DenseFormat::Bf16 && is_int8_projection(&t.name, &t.shape) {
            t.numel() + 4 * t.shape[0] as u64
        } else {
            t.canonical_bytes()
        };
        if t.name.ends_with("embed_tokens.weight") {
            embedding = bytes;
        }
        resident += bytes;
    }
    let row = cfg.hidden_size as u64 * shared::sizes::BF16_BYTES;
    (resident, resident - embedding + row)
}

/// What hostd holds before any KV cache: its dense weights in `format` without the embedding
/// table (which stays mapped from the checkpoint; a prompt makes only its rows resident) and
/// [`HOST_RUNTIME_BYTES`]. With BF16 the weights are the mapped checkpoint pages, every one of
/// which a decode step reads. The plan's hostd figure and a private daemon's default cache
/// budget both leave hostd this much.
pub fn host_weight_bytes(cfg: &TextConfig, format: DenseFormat) -> u64 {
    let (resident, _) = dense_bytes(cfg, format);
    resident - ModelSizes::from_config(cfg).embedding_bytes_bf16 + HOST_RUNTIME_BYTES
}

/// Whether `--dense int8` stores this dense tensor in INT8.
fn is_int8_projection(name: &str, shape: &[usize]) -> bool {
    const KEPT: [&str; 5] = [
        "embed_tokens.weight",
        "mlp.gate.weight",
        "shared_expert_gate.weight",
        "in_proj_a.weight",
        "in_proj_b.weight",
    ];
    shape.len() == 2 && !KEPT.iter().any(|k| name.ends_with(k))
}

/// Rates measured on this machine, in bytes per second.
#[derive(Debug, Clone, Copy)]
pub struct Rates {
    /// DRAM read bandwidth (the probe).
    pub dram_bps: f64,
    /// O_DIRECT read bandwidth of the container's disk, `(slowest, median, fastest)` of its
    /// samples, if it could be measured (a file shorter than one probe read cannot be).
    pub disk_bps: Option<(f64, f64, f64)>,
}

/// A decode tok/s prediction: the point and the range it may land in.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TokPerSec {
    /// The range's low end: no overlap of reads and compute, the lowest DRAM efficiency.
    pub low: f64,
    /// The point estimate.
    pub point: f64,
    /// The range's high end: reads and compute fully overlapped, the highest efficiency.
    pub high: f64,
    /// Seconds of compute per token at the point's efficiency (weights from DRAM).
    pub compute_s: f64,
    /// Seconds per token waiting on the disk for misses (0 when resident).
    pub disk_s: f64,
}

/// Predicts decode tok/s for `token_bytes` of weights per token of which `miss_bytes` come from
/// the disk; see the module doc. `None` when there are misses and the disk was not measured.
pub fn predict(token_bytes: u64, miss_bytes: f64, rates: Rates) -> Option<TokPerSec> {
    let (lo_e, mid_e, hi_e) = DRAM_EFFICIENCY;
    let t_c = |e: f64| token_bytes as f64 / (e * rates.dram_bps);
    let t_d = |pick: fn((f64, f64, f64)) -> f64| -> Option<f64> {
        if miss_bytes > 0.0 {
            Some(miss_bytes / pick(rates.disk_bps?))
        } else {
            Some(0.0)
        }
    };
    let (slow, mid_d, fast) = (t_d(|r| r.0)?, t_d(|r| r.1)?, t_d(|r| r.2)?);
    let mid = t_c(mid_e);
    let point = 1.0 / (mid.max(mid_d) + 0.5 * mid.min(mid_d));
    Some(TokPerSec {
        low: 1.0 / (t_c(lo_e) + slow),
        point,
        high: 1.0 / t_c(hi_e).max(fast),
        compute_s: mid,
        disk_s: mid_d,
    })
}

/// How a format would run here.
#[derive(Debug, Clone, Serialize)]
pub struct FormatPlan {
    /// The format's name.
    pub format: &'static str,
    /// `resident` (every expert in memory), `streaming` (a cache, misses read from disk) or
    /// `does-not-fit` (not even the dense weights and a minimal cache fit; no speeds then).
    pub mode: &'static str,
    /// The expert cache budget to give: the container when resident.
    pub cache_bytes: u64,
    /// `cache_bytes / container_bytes`, at most 1.
    pub cache_share: f64,
    /// Decode hit rates of the streaming cache (1 when resident), one per routing model.
    pub hit_rates: Vec<hits::HitRate>,
    /// Decode tok/s, one per entry of `hit_rates` (`None`: streaming, and the disk unmeasured).
    pub decode_tok_s: Vec<Option<TokPerSec>>,
    /// Disk bytes read per decode token, one per entry of `hit_rates`.
    pub disk_bytes_per_token: Vec<f64>,
}

/// What a private expertd holds beside its cache, by its own estimate: its runtime and its
/// transient buffers (`min(experts, 32)` per lane, [`EXPERTD_LANES`] lanes, one slot each).
pub fn expertd_overhead(experts: usize, slot_bytes: u64) -> u64 {
    EXPERTD_BASE_BYTES + EXPERTD_LANES * experts.min(32) as u64 * slot_bytes
}

/// Where memory stands for one format: `(mode, cache budget)`. Resident when the container, the
/// host and [`HEADROOM_BYTES`] fit in `available`; else streaming with what is left after the
/// host, expertd's overhead and the headroom, when that is at least [`MIN_CACHE_BYTES`].
pub fn fit(
    available: u64,
    host_bytes: u64,
    container_bytes: u64,
    expertd_overhead: u64,
) -> (&'static str, u64) {
    if host_bytes + container_bytes + HEADROOM_BYTES <= available {
        return ("resident", container_bytes);
    }
    let spare = available
        .saturating_sub(host_bytes)
        .saturating_sub(expertd_overhead)
        .saturating_sub(HEADROOM_BYTES);
    if spare >= MIN_CACHE_BYTES {
        ("streaming", spare.min(container_bytes))
    } else {
        ("does-not-fit", 0)
    }
}

/// The plan of one format, given its fit and its hit rates (from [`hits`]).
pub fn plan_format(
    facts: &ModelFacts,
    f: &FormatFacts,
    (mode, cache_bytes): (&'static str, u64),
    hit_rates: Vec<hits::HitRate>,
    rates: Rates,
) -> FormatPlan {
    let token_bytes = facts.dense_bytes_per_token + f.expert_bytes_per_token;
    let (decode, disk): (Vec<Option<TokPerSec>>, Vec<f64>) = hit_rates
        .iter()
        .filter(|_| mode != "does-not-fit")
        .map(|h| {
            let miss = if mode == "resident" {
                0.0
            } else {
                (1.0 - h.decode_hit_rate) * f.expert_bytes_per_token as f64
            };
            (predict(token_bytes, miss, rates), miss)
        })
        .unzip();
    FormatPlan {
        format: f.format,
        mode,
        cache_bytes,
        cache_share: (cache_bytes as f64 / f.container_bytes.max(1) as f64).min(1.0),
        hit_rates,
        decode_tok_s: decode,
        disk_bytes_per_token: disk,
    }
}

/// The format to recommend: the most exact one that runs resident (`int8`, then `q4k-q6k`, then
/// `q4k`), else the fastest streaming one by its most pessimistic prediction (the lowest point
/// over the hit-rate models); when a streaming format has no prediction (the disk unmeasured),
/// the one that reads the fewest bytes per token at its lowest hit rate.
pub fn recommend(plans: &[FormatPlan]) -> Option<&FormatPlan> {
    let by_quality = ["int8", "q4k-q6k", "q4k"];
    for name in by_quality {
        if let Some(p) = plans
            .iter()
            .find(|p| p.format == name && p.mode == "resident")
        {
            return Some(p);
        }
    }
    let streaming = || plans.iter().filter(|p| p.mode == "streaming");
    let pessimistic = |p: &FormatPlan| {
        p.decode_tok_s
            .iter()
            .map(|t| t.map(|t| t.point))
            .collect::<Option<Vec<f64>>>()
            .and_then(|v| v.into_iter().reduce(f64::min))
    };
    if streaming().all(|p| pessimistic(p).is_some()) {
        streaming().max_by(|a, b| {
            pessimistic(a)
                .unwrap_or(0.0)
                .total_cmp(&pessimistic(b).unwrap_or(0.0))
        })
    } else {
        streaming().min_by(|a, b| {
            let most = |p: &FormatPlan| p.disk_bytes_per_token.iter().copied().fold(0.0, f64::max);
            most(a).total_cmp(&most(b))
        })
    }
}

#[cfg(test)]
mod tests;
