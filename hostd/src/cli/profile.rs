//! `hostd profile`: per-op and per-layer prefill and decode time on a checkpoint, with the
//! weight bytes each op streams and the GB/s it achieves, beside the machine's DRAM read
//! bandwidth measured in the same run. A benchmark, not a test: run it on a `realdim`
//! checkpoint and keep the JSON in `docs/results/`.
//!
//! Also the child of `hostd bench` (one process per run): it reports time to first token,
//! prefill and decode speed, decode time split into phases, and the process's (and its private
//! expertd's) peak memory and physical reads.

use super::load::load_model;
use crate::experts::SpeculativeCounters;
use crate::load::LoadOptions;
use crate::model::{Logits, Model, SequenceState};
use crate::profile::{self, OpStat, Profiler};
use anyhow::Context;
use serde_json::{Value, json};
use sluice_tools::machine::{cpu_model, git_commit};
use sluice_tools::probe::process::{self as procfs, DeviceBusy, Reads};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

/// Ops that are dense-weight GEMVs/GEMMs (their bytes are weights read from memory).
const DENSE_PROJECTIONS: &[&str] = &[
    "attention.qkv_proj",
    "attention.o_proj",
    "deltanet.in_proj",
    "deltanet.out_proj",
    "moe.router",
    "moe.shared_expert",
    "lm_head",
];

/// Flags of `hostd profile`.
#[derive(clap::Args, Debug)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub load: LoadOptions,
    /// Prompt length for the prefill measurement (synthetic ids).
    #[arg(long, default_value_t = 512)]
    pub prompt_tokens: usize,
    /// Prompt rows per prefill forward call (the prompt is fed in blocks of this size, state
    /// carried across them, as `hostd run` and `serve` do).
    #[arg(long, default_value_t = crate::engine::DEFAULT_PREFILL_CHUNK)]
    pub prefill_chunk: usize,
    /// Decode steps measured after the prefill.
    #[arg(long, default_value_t = 32)]
    pub decode_steps: usize,
    /// Bytes of the buffer the DRAM bandwidth probe streams (0: no probe).
    #[arg(long, default_value_t = 1 << 30, value_parser = shared::byte_size::parse_bytes_usize)]
    pub bandwidth_bytes: usize,
    /// Skip the warm-up pass (a cold run: weights and experts are read during the measurement).
    #[arg(long)]
    pub no_warmup: bool,
    /// Write the JSON report here (also printed as a table).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// What each decode phase includes (`decode_phases_ms_per_token` in the report).
const PHASE_NOTES: &[(&str, &str)] = &[
    (
        "attention",
        "every attention.* op scope: q/k/v projections, the attention core (rope, scores, softmax, values), o_proj",
    ),
    (
        "deltanet",
        "every deltanet.* op scope: in_proj, conv + norms + gates, recurrence, gated norm, out_proj",
    ),
    ("router", "moe.router: the router GEMV, softmax and top-k"),
    (
        "shared_expert",
        "moe.shared_expert: the shared expert's GEMVs, SiLU, sigmoid gate and its add into the MoE output; on expertd's call ring it runs on the model thread while the daemon computes the routed experts, so this is its wall time sharing the cores with the daemon (longer than alone), and the routed phases below hold only what the daemon's call outlasted it",
    ),
    (
        "routed_expert_compute",
        "moe.routed_experts minus expert_io_wait, expert_queue and ipc: the expert kernels plus grouping and the weighted combine (bf16: all of moe.routed_experts; int8: its share of the parallel expert section plus combine; expertd: the daemon's compute_ns plus the client's call validation, minus the shared expert's time on the ring, where the two overlap; moe.routed_experts itself excludes the shared expert's time)",
    ),
    (
        "expert_io_wait",
        "experts.io_wait: int8 in-process: the wall of the parallel expert section shared out by the workers' thread time in getting blobs (the first-use checksum of a mapped blob) vs kernels — page faults on the mapping land in compute; expertd: the daemon's io_wait_ns (acquiring cache slots and reading missed experts); bf16: 0",
    ),
    (
        "expert_queue",
        "experts.queue: expertd's queue_ns (waiting for a compute lane); 0 otherwise",
    ),
    (
        "ipc",
        "experts.ipc: expertd only: the client's wall time of each MoeLayer call minus the longer of the daemon's queue + io_wait + compute and the shared expert overlapping it on the ring (encoding, transport both ways, the daemon's untimed glue, decoding)",
    ),
    (
        "lm_head",
        "lm_head: the final RMS norm and the vocabulary projection",
    ),
    ("sampling", "sampling: argmax over the logits"),
    (
        "other",
        "decode wall time minus all of the above: embedding lookup, layer RMS norms, residual adds, activation copies, anything not in an op scope",
    ),
];

/// Feeds `prompt` in blocks of `chunk` rows and returns the last position's logits.
fn prefill(
    model: &Model,
    state: &mut SequenceState,
    prompt: &[u32],
    chunk: usize,
) -> anyhow::Result<Vec<f32>> {
    let mut logits = Vec::new();
    for block in prompt.chunks(chunk.max(1)) {
        logits = model.forward(state, block, Logits::Last, None)?;
    }
    Ok(logits)
}

/// Runs `hostd profile`.
pub fn run(args: &ProfileArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.prompt_tokens >= 2 && args.decode_steps >= 1,
        "need --prompt-tokens ≥ 2 and --decode-steps ≥ 1"
    );
    anyhow::ensure!(
        args.prefill_chunk >= 1,
        "--prefill-chunk must be at least 1"
    );
    let t_load = Instant::now();
    let mut model = load_model(&args.load)?;
    let load_s = t_load.elapsed().as_secs_f64();
    let threads = rayon::current_num_threads();
    let experts = model.experts_backend();
    let daemon = experts.private_daemon_pid();
    let io_backend = experts.io_backend();
    drop(experts);
    let bandwidth = (args.bandwidth_bytes > 0).then(|| {
        shared::kernels::bandwidth::measure_read_bandwidth_gbps(args.bandwidth_bytes, threads)
    });

    let vocab = model.config().vocab_size as u64;
    // Deterministic pseudo-random prompt ids (no tokenizer needed).
    let prompt: Vec<u32> = (0..args.prompt_tokens as u64)
        .map(|i| ((i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 17) % vocab.min(1000)) as u32)
        .collect();

    if !args.no_warmup {
        // Warm-up: the exact pass the measurement makes (the same prompt, then the same greedy
        // steps), so every dense page and every expert the measurement touches has been read
        // once (page cache, expertd's cache, first-use checksums): a resident, warm measurement.
        let mut warm = model.new_state();
        let mut id = sample(
            &model,
            &prefill(&model, &mut warm, &prompt, args.prefill_chunk)?,
        );
        for _ in 0..args.decode_steps {
            id = step(&model, &mut warm, id)?;
        }
    }

    let reads_start = Reads::now(daemon);
    model.set_profiler(Some(Profiler::new()));
    let prof = model.profiler().expect("just set");
    let mut state = model.new_state();
    let t = Instant::now();
    let logits = prefill(&model, &mut state, &prompt, args.prefill_chunk)?;
    let prefill_s = t.elapsed().as_secs_f64();
    let mut id = sample(&model, &logits);
    let ttft_s = t.elapsed().as_secs_f64();
    let prefill_ops = prof.take();
    let prefill_counts = prof.take_counts();
    let reads_mid = Reads::now(daemon);
    // The device the experts are read from (the container's; else the model's).
    let busy_path = args.load.container.as_ref().map_or_else(
        || args.load.model.clone(),
        |d| d.join(shared::container::CONTAINER_FILE),
    );
    let busy_mid = DeviceBusy::of(&busy_path);
    let spec_start = model.speculative_counters();

    let t = Instant::now();
    for _ in 0..args.decode_steps {
        id = step(&model, &mut state, id)?;
    }
    let decode_s = t.elapsed().as_secs_f64();
    let decode_ops = prof.take();
    let decode_counts = prof.take_counts();
    model.set_profiler(None);
    let reads_end = Reads::now(daemon);
    let busy_end = DeviceBusy::of(&busy_path);
    let spec_end = model.speculative_counters();
    let m = args.decode_steps as f64;

    let decode_reads = reads_mid.delta_json(&reads_end);
    let weight_bytes: u64 = DENSE_PROJECTIONS
        .iter()
        .chain(&["moe.routed_experts"])
        .filter_map(|op| decode_ops.get(op))
        .map(|s| s.bytes)
        .sum();
    let expertd = daemon.map(|pid| {
        json!({
            "pid": pid,
            "io_backend": io_backend,
            "vm_hwm_bytes": procfs::vm_hwm_bytes(Some(pid)),
            "read_bytes_total": procfs::read_bytes(Some(pid)),
        })
    });
    let cache = (model.experts_name() == "expertd").then(
        || json!({"prefill": cache_json(&prefill_counts), "decode": cache_json(&decode_counts)}),
    );
    let spec = spec_start.zip(spec_end).map(|(a, b)| b.since(&a));
    let prefetch = prefetch_json(&decode_counts, spec, m);
    let report = json!({
        "what": if args.no_warmup {
            "per-op forward-pass time; NO warm-up pass: weights and experts are read (from the page cache or storage) during the measurement"
        } else {
            "per-op forward-pass time; weights resident and warm: a warm-up pass made the same prefill and decode steps first"
        },
        "model_dir": args.load.model.display().to_string(),
        "experts": model.experts_name(),
        "expert_transport": model.experts_transport(),
        "dense": model.dense_format().name(),
        "kernel_isa": model.isa().name(),
        "threads": threads,
        "cpu": cpu_model(),
        "commit": git_commit(),
        "warmup": !args.no_warmup,
        "dram_read_bandwidth_gbps": bandwidth,
        "notes": [
            "ops: wall time inside each op scope; layer totals are reported separately under `layers` and contain the ops",
            "weight_bytes_total / achieved_gbps: weight bytes the op read (each matrix once per call) divided by its time; in decode this is the op's memory bandwidth, in prefill (one GEMM over the whole block) it is not a bandwidth but weight throughput",
            "moe.router and moe.shared_expert include their small element-wise work (softmax, top-k; SiLU, gate) besides the GEMVs",
            "moe.routed_experts bytes: distinct experts per call x the backend's bytes per expert",
            "experts.* ops are recorded inside moe.routed_experts (see decode_phase_notes); *_thread_sum are summed over worker threads, not wall time",
            "ttft_s: wall time of the prefill forward passes over the whole prompt (blocks of prefill_chunk rows) plus the argmax choosing the first generated token",
            "prefill_tokens_per_s: prompt tokens / prefill forward-pass wall time (argmax excluded)",
            "decode_tokens_per_s: decode steps / decode wall time; one step = one single-token forward pass + argmax over its logits",
            "weight_bytes_per_decode_token: weight bytes of the dense projections (incl. lm_head) and the routed experts read per decode step, as the op scopes count them",
            "disk_reads: physical storage reads (/proc/PID/io read_bytes) of hostd and its private expertd, between the marks named; decode_device: the block device holding the container (else the model), over the decode steps: busy_ms = the kernel's io_ticks delta (time with at least one request in flight, iostat's %util), busy_fraction = busy_ms / decode wall time, read_bytes = its sectors read; device-wide, so other processes' I/O counts too",
            "expert_cache: the expertd daemon's hits, misses (distinct experts per call) and bytes read, summed from its per-call responses",
            "prefetch (expertd with prefetch hints: the default for a streaming daemon, or --expertd-prefetch on): recall = distinct experts of a call that the prediction for its layer named / distinct experts of the call; speculative_bytes_read and useful_bytes (bytes of speculatively read experts a demand call then hit) are the daemon's Stats.prefetch deltas over decode (reads of the last hints may land after the end mark); wasted = speculative - useful (read, not hit yet); hints = predictions made (each rides with the next ring call; one not yet sent when the next prediction comes is replaced); stale_predictions = predicted experts the daemon dropped unread because their layer's call had started (Stats.prefetch.stale delta); moe.prefetch_router (the prediction's router projection) is in the decode phase `other`",
            "expert_calls: calls_per_token = MoE-layer expert calls per decode step (one per MoE layer; 40 at full depth); ipc_us_per_call = experts.ipc / calls (expertd only: client wall time of a call minus the longer of the daemon's queue + io_wait + compute and the shared expert that overlaps it on the ring)",
        ],
        "ttft_s": ttft_s,
        "load_s": load_s,
        "prefill_tokens_per_s": args.prompt_tokens as f64 / prefill_s,
        "prefill_chunk": args.prefill_chunk,
        "decode_tokens_per_s": m / decode_s,
        "decode_phases_ms_per_token": decode_phases(&decode_ops, args.decode_steps, decode_s),
        "expert_calls": expert_calls(&decode_ops, args.decode_steps),
        "decode_phase_notes": PHASE_NOTES.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "weight_bytes_per_decode_token": weight_bytes as f64 / m,
        "disk_reads": {
            "prefill": reads_start.delta_json(&reads_mid),
            "decode": decode_reads,
            "decode_bytes_per_token": decode_reads["total"].as_f64().map(|b| b / m),
            "decode_device": busy_mid.zip(busy_end).map(|(a, b)| a.delta_json(&b, decode_s)),
        },
        "process": {
            "hostd": {"vm_hwm_bytes": procfs::vm_hwm_bytes(None), "read_bytes_total": procfs::read_bytes(None)},
            "expertd": expertd,
        },
        "expert_cache": cache,
        "prefetch": prefetch,
        "prefill": phase(&prefill_ops, args.prompt_tokens, prefill_s, bandwidth),
        "decode": phase(&decode_ops, args.decode_steps, decode_s, bandwidth),
    });
    if let Some(out) = &args.out {
        std::fs::write(out, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", out.display()))?;
    }
    print_table(&report);
    Ok(())
}

/// Greedy sampling under the `sampling` scope of the model's profiler.
fn sample(model: &Model, logits: &[f32]) -> u32 {
    let _scope = profile::scope(model.profiler(), "sampling", 0);
    crate::sampling::argmax(logits)
}

/// One decode step: feed `id`, return the next greedy id.
fn step(model: &Model, state: &mut SequenceState, id: u32) -> anyhow::Result<u32> {
    let logits = model.forward(state, &[id], Logits::Last, None)?;
    Ok(sample(model, &logits))
}

/// The decode phase's prefetch figures (`None` when the client sent no hints): the
/// prediction's recall, and what the speculative reads cost — the daemon's own counters
/// (`Stats.prefetch`) between the start and the end of decode.
fn prefetch_json(
    counts: &BTreeMap<&'static str, u64>,
    speculative: Option<SpeculativeCounters>,
    tokens: f64,
) -> Option<Value> {
    let get = |k: &str| counts.get(k).copied().unwrap_or(0);
    if get("prefetch.hints") == 0 {
        return None;
    }
    let (actual, used) = (
        get("prefetch.actual_experts"),
        get("prefetch.predicted_and_used"),
    );
    Some(json!({
        "hints": get("prefetch.hints"),
        "stale_predictions": speculative.map(|s| s.stale),
        "recall": (actual > 0).then(|| used as f64 / actual as f64),
        "predicted_experts_per_token": get("prefetch.predicted_experts") as f64 / tokens,
        "demand_hits_on_prefetched": get("experts.prefetched_hits"),
        "speculative_bytes_read": speculative.map(|s| s.bytes_read),
        "useful_bytes": speculative.map(|s| s.useful_bytes),
        "wasted_bytes": speculative.map(|s| s.bytes_read.saturating_sub(s.useful_bytes)),
        "wasted_bytes_per_token": speculative.map(|s| s.bytes_read.saturating_sub(s.useful_bytes) as f64 / tokens),
    }))
}

fn cache_json(counts: &BTreeMap<&'static str, u64>) -> Value {
    let get = |k: &str| counts.get(k).copied().unwrap_or(0);
    let (hits, misses) = (get("experts.hits"), get("experts.misses"));
    json!({
        "hits": hits,
        "misses": misses,
        "bytes_read": get("experts.bytes_read"),
        "hit_rate": (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64),
    })
}

/// The decode phase's expert calls: how many per token, and (expertd) the IPC per call.
fn expert_calls(ops: &BTreeMap<&'static str, OpStat>, tokens: usize) -> Value {
    let calls = ops.get("moe.routed_experts").map_or(0, |s| s.calls);
    let ipc = ops.get("experts.ipc");
    json!({
        "calls_per_token": calls as f64 / tokens.max(1) as f64,
        "ipc_us_per_call": ipc.filter(|_| calls > 0).map(|s| s.ns as f64 / 1e3 / calls as f64),
    })
}

/// Decode wall time per token split into the phases of [`PHASE_NOTES`], in ms.
fn decode_phases(ops: &BTreeMap<&'static str, OpStat>, tokens: usize, secs: f64) -> Value {
    let ns = |op: &str| ops.get(op).map_or(0, |s| s.ns);
    let prefixed = |p: &str| {
        ops.iter()
            .filter(|(k, _)| k.starts_with(p))
            .map(|(_, s)| s.ns)
            .sum::<u64>()
    };
    let (io, queue, ipc) = (
        ns("experts.io_wait"),
        ns("experts.queue"),
        ns("experts.ipc"),
    );
    let phases: [(&str, u64); 10] = [
        ("attention", prefixed("attention.")),
        ("deltanet", prefixed("deltanet.")),
        ("router", ns("moe.router")),
        ("shared_expert", ns("moe.shared_expert")),
        (
            "routed_expert_compute",
            ns("moe.routed_experts").saturating_sub(io + queue + ipc),
        ),
        ("expert_io_wait", io),
        ("expert_queue", queue),
        ("ipc", ipc),
        ("lm_head", ns("lm_head")),
        ("sampling", ns("sampling")),
    ];
    let per_token = |ns: f64| ns / 1e6 / tokens as f64;
    let wall_ns = secs * 1e9;
    let sum: u64 = phases.iter().map(|p| p.1).sum();
    let mut out: serde_json::Map<String, Value> = phases
        .iter()
        .map(|(k, v)| (k.to_string(), json!(per_token(*v as f64))))
        .collect();
    out.insert("other".into(), json!(per_token(wall_ns - sum as f64)));
    out.insert("wall".into(), json!(per_token(wall_ns)));
    Value::Object(out)
}

fn phase(
    ops: &BTreeMap<&'static str, OpStat>,
    tokens: usize,
    secs: f64,
    bandwidth: Option<f64>,
) -> Value {
    let mut table = serde_json::Map::new();
    let mut layers = serde_json::Map::new();
    for (name, s) in ops {
        // Whole-layer scopes contain the op scopes; report them apart so nothing is summed twice.
        if let Some(kind) = name.strip_prefix("layer.") {
            layers.insert(
                kind.to_string(),
                json!({"calls": s.calls, "ms_total": s.ns as f64 / 1e6, "ms_per_token": s.ns as f64 / 1e6 / tokens as f64}),
            );
            continue;
        }
        let gbps = if s.bytes > 0 {
            s.bytes as f64 / s.ns as f64
        } else {
            0.0
        };
        table.insert(
            name.to_string(),
            json!({
                "calls": s.calls,
                "ms_total": s.ns as f64 / 1e6,
                "ms_per_token": s.ns as f64 / 1e6 / tokens as f64,
                "weight_bytes_total": s.bytes,
                "achieved_gbps": gbps,
            }),
        );
    }
    let (bytes, ns) = DENSE_PROJECTIONS
        .iter()
        .filter_map(|op| ops.get(op))
        .fold((0u64, 0u64), |(b, n), s| (b + s.bytes, n + s.ns));
    let dense_gbps = if ns > 0 {
        bytes as f64 / ns as f64
    } else {
        0.0
    };
    json!({
        "tokens": tokens,
        "wall_s": secs,
        "tokens_per_s": tokens as f64 / secs,
        "ops": table,
        "layers": layers,
        "dense_projections": {
            "ops": DENSE_PROJECTIONS,
            "weight_bytes": bytes,
            "ms": ns as f64 / 1e6,
            "achieved_gbps": dense_gbps,
            "fraction_of_dram_bandwidth": bandwidth.map(|b| dense_gbps / b),
        },
    })
}

fn print_table(r: &Value) {
    println!(
        "isa {} | threads {} | DRAM read bandwidth {:.1} GB/s | experts {}",
        r["kernel_isa"].as_str().unwrap_or("?"),
        r["threads"],
        r["dram_read_bandwidth_gbps"].as_f64().unwrap_or(0.0),
        r["experts"].as_str().unwrap_or("?")
    );
    println!(
        "TTFT {:.3} s | prefill {:.2} tok/s | decode {:.2} tok/s | decode disk reads {:.0} B/token",
        r["ttft_s"].as_f64().unwrap_or(0.0),
        r["prefill_tokens_per_s"].as_f64().unwrap_or(0.0),
        r["decode_tokens_per_s"].as_f64().unwrap_or(0.0),
        r["disk_reads"]["decode_bytes_per_token"]
            .as_f64()
            .unwrap_or(0.0)
    );
    let phases = r["decode_phases_ms_per_token"]
        .as_object()
        .into_iter()
        .flatten();
    println!(
        "decode phases (ms/token): {}",
        phases
            .map(|(k, v)| format!("{k} {:.3}", v.as_f64().unwrap_or(0.0)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for phase in ["prefill", "decode"] {
        let p = &r[phase];
        println!(
            "\n{phase}: {} tokens in {:.3} s = {:.2} tokens/s",
            p["tokens"],
            p["wall_s"].as_f64().unwrap_or(0.0),
            p["tokens_per_s"].as_f64().unwrap_or(0.0)
        );
        println!(
            "  {:<26} {:>10} {:>12} {:>9}",
            "op", "ms/token", "MB/token", "GB/s"
        );
        for (name, s) in p["layers"].as_object().into_iter().flatten() {
            println!(
                "  {:<26} {:>10.3}   (whole layer, contains the ops below)",
                format!("layer.{name}"),
                s["ms_per_token"].as_f64().unwrap_or(0.0)
            );
        }
        for (name, s) in p["ops"].as_object().into_iter().flatten() {
            let tokens = p["tokens"].as_f64().unwrap_or(1.0);
            println!(
                "  {:<26} {:>10.3} {:>12.2} {:>9.1}",
                name,
                s["ms_per_token"].as_f64().unwrap_or(0.0),
                s["weight_bytes_total"].as_f64().unwrap_or(0.0) / tokens / 1e6,
                s["achieved_gbps"].as_f64().unwrap_or(0.0)
            );
        }
        let d = &p["dense_projections"];
        println!(
            "  dense projections: {:.1} GB/s = {:.0}% of DRAM read bandwidth (0: not probed)",
            d["achieved_gbps"].as_f64().unwrap_or(0.0),
            100.0 * d["fraction_of_dram_bandwidth"].as_f64().unwrap_or(0.0)
        );
    }
}
