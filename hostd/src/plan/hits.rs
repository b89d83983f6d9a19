//! The hit-rate model of `hostd plan`: what share of a decode token's experts a streaming cache
//! of a given budget holds.
//!
//! Two routings, because the answer depends on the model more than on the cache:
//! - **no locality**: every token picks `top_k` distinct experts per layer uniformly at random,
//!   which is what random-weight checkpoints do (`../shared/docs/prior-art.md` §7). The rate is
//!   measured, not assumed: a route trace of such a workload (a prompt prefilled in chunks, a
//!   warm-up, then the measured decode steps) is replayed by `expertd replay`, the daemon's own
//!   cache planner under its default policy (LRU), with the format's slot size and each budget.
//!   With one cache shared by all layers and visited layer by layer, LRU keeps almost nothing
//!   across tokens once the budget is below one token's experts times the reuse distance, so
//!   this rate sits far below the cached share.
//! - **trained routing**: a published LRU hit-rate curve of a trained model (Qwen3-30B-A3B,
//!   kekzl/imp #1374, cold sweep; prior-art §7), interpolated linearly in the cached share. Not
//!   measured here: no trained checkpoint fits this project's machines.

use serde::Serialize;
use shared::splitmix::SplitMix64;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// A decode hit rate and where it came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HitRate {
    /// `no-locality` or `trained`.
    pub routing: &'static str,
    /// Hits ÷ experts named, over decode steps only.
    pub decode_hit_rate: f64,
    /// How the rate was obtained, in words.
    pub how: String,
}

/// The published trained-routing curve: `(cached share, LRU hit rate)`, with the ends added.
pub const TRAINED_CURVE: [(f64, f64); 6] = [
    (0.0, 0.0),
    (0.06, 0.366),
    (0.19, 0.741),
    (0.38, 0.894),
    (0.63, 0.962),
    (1.0, 1.0),
];

/// The trained-routing hit rate at `share` (clamped to 0..=1), linear between the curve's points.
pub fn trained_hit_rate(share: f64) -> f64 {
    let s = share.clamp(0.0, 1.0);
    for w in TRAINED_CURVE.windows(2) {
        let ((x0, y0), (x1, y1)) = (w[0], w[1]);
        if s <= x1 {
            return y0 + (y1 - y0) * (s - x0) / (x1 - x0);
        }
    }
    1.0
}

/// The workload replayed for the no-locality rate.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Decoder layers.
    pub layers: usize,
    /// Routed experts per layer.
    pub experts: usize,
    /// Experts per token per layer.
    pub top_k: usize,
    /// Prompt tokens prefilled before decoding.
    pub prompt_tokens: usize,
    /// Prompt rows per prefill call (hostd's default prefill chunk).
    pub prefill_chunk: usize,
    /// Decode steps before the measured ones (the cache settles).
    pub warmup_steps: usize,
    /// Decode steps measured.
    pub decode_steps: usize,
    /// Seed of the routes.
    pub seed: u64,
}

impl Workload {
    /// The workload for a model: a 512-token prompt, 16 warm-up and 64 measured steps.
    pub fn for_model(layers: usize, experts: usize, top_k: usize) -> Workload {
        Workload {
            layers,
            experts,
            top_k,
            prompt_tokens: 512,
            prefill_chunk: crate::engine::DEFAULT_PREFILL_CHUNK,
            warmup_steps: 16,
            decode_steps: 64,
            seed: 1,
        }
    }
}

/// Writes the route trace of `w` to `out`: the prompt's chunks, then `warmup_steps` decode steps,
/// then (when `measured`) the `decode_steps` measured ones. The same seed gives the same routes,
/// so the trace without the measured steps is a prefix of the one with them.
pub fn write_trace(out: &mut impl Write, w: &Workload, measured: bool) -> std::io::Result<()> {
    // The header's budget and slots are placeholders: every replay passes its own.
    writeln!(
        out,
        r#"{{"ev":"header","format":"sluice-route-trace","version":1,"policy":"lru","budget_bytes":4096,"slot_bytes":4096,"slots":1,"transient_slots":{}}}"#,
        w.experts.min(32) as u64 * super::EXPERTD_LANES
    )?;
    let mut rng = SplitMix64::new(w.seed);
    let mut pick = |n: usize, k: usize| -> Vec<usize> {
        // k distinct of n: a partial Fisher–Yates.
        let mut all: Vec<usize> = (0..n).collect();
        for i in 0..k.min(n) {
            let j = i + (rng.next_u64() % (n - i) as u64) as usize;
            all.swap(i, j);
        }
        all.truncate(k.min(n));
        all
    };
    let mut call = 0u64;
    let mut emit = |out: &mut dyn Write, step: usize, layer: usize, experts: &[usize]| {
        let list: Vec<String> = experts.iter().map(usize::to_string).collect();
        writeln!(
            out,
            r#"{{"ev":"acquire","session":1,"step":{step},"layer":{layer},"experts":[{}],"hits":0,"misses":0,"call":{call}}}"#,
            list.join(",")
        )?;
        writeln!(
            out,
            r#"{{"ev":"release","session":1,"layer":{layer},"call":{call}}}"#
        )?;
        call += 1;
        std::io::Result::Ok(())
    };
    let chunk = w.prefill_chunk.max(1);
    let mut step = 0;
    for start in (0..w.prompt_tokens).step_by(chunk) {
        let rows = chunk.min(w.prompt_tokens - start);
        for layer in 0..w.layers {
            let mut used = vec![false; w.experts];
            for _ in 0..rows {
                for e in pick(w.experts, w.top_k) {
                    used[e] = true;
                }
            }
            let union: Vec<usize> = (0..w.experts).filter(|&e| used[e]).collect();
            emit(out, step, layer, &union)?;
        }
        step += 1;
    }
    let steps = w.warmup_steps + if measured { w.decode_steps } else { 0 };
    for _ in 0..steps {
        for layer in 0..w.layers {
            let mut experts = pick(w.experts, w.top_k);
            experts.sort_unstable();
            emit(out, step, layer, &experts)?;
        }
        step += 1;
    }
    Ok(())
}

/// Replays the no-locality workload with `expertd replay` (the binary at `expertd`) for each
/// budget at `slot_bytes`; returns each budget's decode hit rate, or why it could not.
pub fn no_locality(
    expertd: &Path,
    w: &Workload,
    slot_bytes: u64,
    budgets: &[u64],
) -> Result<Vec<f64>, String> {
    let dir = tempfile::Builder::new()
        .prefix("sluice-plan-")
        .tempdir()
        .map_err(|e| format!("a temporary directory for the route traces: {e}"))?;
    let mut misses = Vec::new();
    for measured in [false, true] {
        let path = dir.path().join(format!("routes-{measured}.jsonl"));
        let mut file = std::io::BufWriter::new(
            std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?,
        );
        write_trace(&mut file, w, measured)
            .and_then(|()| file.flush())
            .map_err(|e| format!("{}: {e}", path.display()))?;
        misses.push(replay_misses(expertd, &path, slot_bytes, budgets)?);
    }
    let keys = (w.decode_steps * w.layers * w.top_k.min(w.experts)) as f64;
    Ok(misses[1]
        .iter()
        .zip(&misses[0])
        .map(|(all, prefix)| 1.0 - all.saturating_sub(*prefix) as f64 / keys)
        .collect())
}

/// `expertd replay TRACE --policy lru --slot-bytes S --cache-bytes B,… --json`: misses per budget.
fn replay_misses(
    expertd: &Path,
    trace: &Path,
    slot_bytes: u64,
    budgets: &[u64],
) -> Result<Vec<u64>, String> {
    let list: Vec<String> = budgets.iter().map(u64::to_string).collect();
    let out = Command::new(expertd)
        .arg("replay")
        .arg(trace)
        .args(["--policy", "lru", "--json", "--slot-bytes"])
        .arg(slot_bytes.to_string())
        .arg("--cache-bytes")
        .arg(list.join(","))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {} replay: {e}", expertd.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} replay failed ({}): {}",
            expertd.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("{} replay printed no JSON: {e}", expertd.display()))?;
    let results = doc["results"]
        .as_array()
        .ok_or("replay JSON without results")?;
    if results.len() != budgets.len() {
        return Err(format!(
            "replay gave {} results for {} budgets",
            results.len(),
            budgets.len()
        ));
    }
    results
        .iter()
        .map(|r| {
            r["misses"]
                .as_u64()
                .ok_or_else(|| "replay result without misses".to_string())
        })
        .collect()
}
