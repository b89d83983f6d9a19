//! `hostd profile`: per-op and per-layer prefill and decode time on a checkpoint, with the
//! weight bytes each op streams and the GB/s it achieves, beside the machine's DRAM read
//! bandwidth measured in the same run. A benchmark, not a test: run it on a `realdim`
//! checkpoint and keep the JSON in `docs/results/`.

use super::load::{LoadArgs, load_model};
use crate::model::profile::{self, OpStat};
use crate::model::Logits;
use anyhow::Context;
use serde_json::{Value, json};
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
    pub load: LoadArgs,
    /// Prompt length for the prefill measurement (synthetic ids, one block).
    #[arg(long, default_value_t = 512)]
    pub prompt_tokens: usize,
    /// Decode steps measured after the prefill.
    #[arg(long, default_value_t = 32)]
    pub decode_steps: usize,
    /// Bytes of the buffer the DRAM bandwidth probe streams.
    #[arg(long, default_value_t = 1 << 30)]
    pub bandwidth_bytes: usize,
    /// Write the JSON report here (also printed as a table).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Runs `hostd profile`.
pub fn run(args: &ProfileArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.prompt_tokens >= 2 && args.decode_steps >= 1, "need --prompt-tokens ≥ 2 and --decode-steps ≥ 1");
    let model = load_model(&args.load)?;
    let threads = rayon::current_num_threads();
    let bandwidth = shared::kernels::bandwidth::measure_read_bandwidth_gbps(args.bandwidth_bytes, threads);

    let vocab = model.config().vocab_size as u64;
    // Deterministic pseudo-random prompt ids (no tokenizer needed).
    let prompt: Vec<u32> = (0..args.prompt_tokens as u64)
        .map(|i| ((i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 17) % vocab.min(1000)) as u32)
        .collect();

    // Warm-up: fault in every dense page and every expert the prompt touches.
    let mut warm = model.new_state();
    model.forward(&mut warm, &prompt[..prompt.len().min(64)], Logits::Last, None)?;
    model.forward(&mut warm, &prompt[..1], Logits::Last, None)?;

    profile::set_enabled(true);
    profile::take();
    let mut state = model.new_state();
    let t = Instant::now();
    let mut logits = model.forward(&mut state, &prompt, Logits::Last, None)?;
    let prefill_s = t.elapsed().as_secs_f64();
    let prefill_ops = profile::take();

    let t = Instant::now();
    for _ in 0..args.decode_steps {
        let id = crate::cli::eval::argmax(&logits);
        logits = model.forward(&mut state, &[id], Logits::Last, None)?;
    }
    let decode_s = t.elapsed().as_secs_f64();
    let decode_ops = profile::take();
    profile::set_enabled(false);

    let report = json!({
        "what": "per-op forward-pass time; weights resident and warm (page cache, after a warm-up pass)",
        "model_dir": args.load.model.display().to_string(),
        "experts": model.experts_name(),
        "kernel_isa": model.isa().name(),
        "threads": threads,
        "cpu": cpu_model(),
        "commit": git_commit(),
        "dram_read_bandwidth_gbps": bandwidth,
        "notes": [
            "ops: wall time inside each op scope; layer totals are reported separately under `layers` and contain the ops",
            "weight_bytes_total / achieved_gbps: weight bytes the op read (each matrix once per call) divided by its time; in decode this is the op's memory bandwidth, in prefill (one GEMM over the whole block) it is not a bandwidth but weight throughput",
            "moe.router and moe.shared_expert include their small element-wise work (softmax, top-k; SiLU, gate) besides the GEMVs",
            "moe.routed_experts bytes: distinct experts per call x the backend's bytes per expert",
        ],
        "prefill": phase(&prefill_ops, args.prompt_tokens, prefill_s, bandwidth),
        "decode": phase(&decode_ops, args.decode_steps, decode_s, bandwidth),
    });
    print_table(&report);
    if let Some(out) = &args.out {
        std::fs::write(out, serde_json::to_string_pretty(&report)?).with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}

fn phase(ops: &BTreeMap<&'static str, OpStat>, tokens: usize, secs: f64, bandwidth: f64) -> Value {
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
        let gbps = if s.bytes > 0 { s.bytes as f64 / s.ns as f64 } else { 0.0 };
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
    let dense_gbps = if ns > 0 { bytes as f64 / ns as f64 } else { 0.0 };
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
            "fraction_of_dram_bandwidth": dense_gbps / bandwidth,
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
    for phase in ["prefill", "decode"] {
        let p = &r[phase];
        println!(
            "\n{phase}: {} tokens in {:.3} s = {:.2} tokens/s",
            p["tokens"],
            p["wall_s"].as_f64().unwrap_or(0.0),
            p["tokens_per_s"].as_f64().unwrap_or(0.0)
        );
        println!("  {:<26} {:>10} {:>12} {:>9}", "op", "ms/token", "MB/token", "GB/s");
        for (name, s) in p["layers"].as_object().into_iter().flatten() {
            println!("  {:<26} {:>10.3}   (whole layer, contains the ops below)", format!("layer.{name}"), s["ms_per_token"].as_f64().unwrap_or(0.0));
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
            "  dense projections: {:.1} GB/s = {:.0}% of DRAM read bandwidth",
            d["achieved_gbps"].as_f64().unwrap_or(0.0),
            100.0 * d["fraction_of_dram_bandwidth"].as_f64().unwrap_or(0.0)
        );
    }
}

/// The CPU model name from /proc/cpuinfo.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).map(|s| s.trim().to_string()))
        .unwrap_or_else(|| "unknown".into())
}

/// The git commit of the working tree, when run inside the repository.
pub fn git_commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}
