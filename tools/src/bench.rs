//! The `hostd bench` harness: end-to-end benchmark of one or more configurations, each run a
//! fresh `hostd profile` process, interleaved across configurations (run 1 of each, then run 2
//! of each, …) with the first configuration repeated once more at the end as a drift check.
//! Beside the runs it measures the rooflines (DRAM read bandwidth at start and end; `O_DIRECT`
//! storage read bandwidth of each container, [`crate::probe`]) and reports every run's figures,
//! their median/min/max per configuration, and the fraction of each roofline a run achieves.
//!
//! With `--cold` the page cache is dropped before every run and the child skips its warm-up; a
//! run is labelled `cold_proven` only with evidence (`child::cold_verdict`).
//!
//! hostd's `cli/bench.rs` is the command line over [`run`]; this crate knows hostd only as an
//! executable with a `profile` subcommand and the JSON that subcommand writes.

mod child;
mod config;
mod report;

pub use config::Order;
pub use report::print_table;

use crate::machine;
use crate::probe::storage;
use config::{Config, schedule};
use serde_json::{Value, json};
use std::path::PathBuf;

/// What went wrong in a benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Flags that do not describe a benchmark.
    #[error("{0}")]
    Usage(String),
    /// A file or process the bench needs.
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// A run's `hostd profile` failed (its error went to stderr, inherited).
    #[error(
        "config {config} run {round}: `hostd profile {flags}` failed ({status}); its error is above"
    )]
    Child {
        config: String,
        round: String,
        flags: String,
        status: std::process::ExitStatus,
    },
    /// A run's report is not the JSON `hostd profile` writes.
    #[error("parsing {}: {source}", path.display())]
    Report {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// Flags of `hostd bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Model directory (every run).
    #[arg(long, env = "SLUICE_MODEL")]
    pub model: PathBuf,
    /// A configuration, `NAME: FLAGS`: `hostd profile` flags passed verbatim to its runs (split
    /// on whitespace), e.g. `int8: --experts int8 --container DIR`. Repeatable. Without any, one
    /// configuration `default` from --experts/--container/--expertd/--expertd-cache-bytes.
    /// Leading `NAME=VALUE` words set that config's environment (`isa2: SLUICE_KERNEL_ISA=avx2
    /// --experts int8 …`).
    #[arg(long = "config", value_name = "NAME: FLAGS")]
    pub configs: Vec<String>,
    /// `NAME=PATH`: run config NAME's children with this hostd executable instead of the
    /// bench's own (an A/B of two builds in one interleaved run). Repeatable.
    #[arg(long = "exe", value_name = "NAME=PATH")]
    pub exes: Vec<String>,
    /// Expert backend of the `default` configuration (bf16, int8, expertd).
    #[arg(long)]
    pub experts: Option<String>,
    /// Container directory of the `default` configuration.
    #[arg(long)]
    pub container: Option<PathBuf>,
    /// Running expertd of the `default` configuration.
    #[arg(long = "expertd")]
    pub expertd_uri: Option<String>,
    /// Private expertd cache budget of the `default` configuration.
    #[arg(long, value_parser = shared::byte_size::parse_bytes)]
    pub expertd_cache_bytes: Option<u64>,
    /// Compute threads of every run (unless its config sets --threads); also the DRAM probe's.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Prompt length (synthetic ids).
    #[arg(long, default_value_t = 512)]
    pub prompt_tokens: usize,
    /// Prompt rows per prefill forward call in every run (default: `hostd profile`'s own).
    #[arg(long)]
    pub prefill_chunk: Option<usize>,
    /// Decode steps measured per run.
    #[arg(long, default_value_t = 32)]
    pub new_tokens: usize,
    /// Runs per configuration (plus one drift-check run of the first).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Order of the configs within a round: `alternate` (default) runs odd rounds in the order
    /// given and even rounds reversed (ABBA), so that a config does not always run first in its
    /// round; `forward` runs every round in the order given.
    #[arg(long, value_enum, default_value_t = Order::Alternate)]
    pub order: Order,
    /// Drop the page cache before every run and skip the warm-up (cold start); see the docs.
    #[arg(long)]
    pub cold: bool,
    /// Write the JSON report here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Buffer bytes of the DRAM read bandwidth probe.
    #[arg(long, default_value_t = 1 << 30, value_parser = shared::byte_size::parse_bytes_usize)]
    pub bandwidth_bytes: usize,
    /// Bytes the O_DIRECT probe reads from each container (0: no storage probe).
    #[arg(long, default_value_t = 2 << 30, value_parser = shared::byte_size::parse_bytes)]
    pub odirect_bytes: u64,
    /// Parallel readers of the O_DIRECT probe.
    #[arg(long, default_value_t = 8)]
    pub odirect_readers: usize,
}

/// Runs the benchmark: every config's runs as children of `own_exe` (unless `--exe` names
/// another), the probes, and the report, which it writes to `--json` and returns.
pub fn run(args: &BenchArgs, own_exe: PathBuf) -> Result<Value, BenchError> {
    if args.runs == 0 || args.new_tokens == 0 || args.prompt_tokens < 2 {
        return Err(BenchError::Usage(
            "need --runs ≥ 1, --new-tokens ≥ 1, --prompt-tokens ≥ 2".into(),
        ));
    }
    if args.prefill_chunk == Some(0) {
        return Err(BenchError::Usage(
            "--prefill-chunk must be at least 1".into(),
        ));
    }
    let configs = config::configs(args, own_exe)?;
    let tmp = tempfile::Builder::new()
        .prefix("sluice-bench-")
        .tempdir()
        .map_err(|e| BenchError::Io {
            what: "creating a temporary directory".into(),
            source: e,
        })?;
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let threads = args.threads.unwrap_or(cores);

    eprintln!("bench: DRAM read bandwidth probe (start)");
    let dram_start = storage::dram(args.bandwidth_bytes, threads, "start");
    // Storage probe per distinct container; configs without one use the model's largest shard.
    let mut disk_probes: Vec<(PathBuf, Value)> = Vec::new();
    if args.odirect_bytes > 0 {
        for c in &configs {
            let file = child::probe_file(args, c)?;
            if !disk_probes.iter().any(|(f, _)| *f == file) {
                eprintln!("bench: storage read bandwidth probe of {}", file.display());
                let v = storage::read_bandwidth(&file, args.odirect_bytes, args.odirect_readers);
                disk_probes.push((file, v));
            }
        }
    }

    // Interleaved schedule, then the drift check.
    let schedule = schedule(configs.len(), args.runs, args.order);
    let mut runs: Vec<Vec<Value>> = vec![Vec::new(); configs.len()];
    let mut drift = Value::Null;
    for (i, (ci, label)) in schedule.iter().enumerate() {
        let c = &configs[*ci];
        eprintln!(
            "bench: run {}/{}: {} (round {label})",
            i + 1,
            schedule.len(),
            c.name
        );
        let out = tmp.path().join(format!("run-{i}.json"));
        let record = child::one_run(args, c, label, &out)?;
        if label == "drift" {
            drift = record;
        } else {
            runs[*ci].push(record);
        }
    }

    eprintln!("bench: DRAM read bandwidth probe (end)");
    let dram_end = storage::dram(args.bandwidth_bytes, threads, "end");
    let dram_gbps = dram_start["gbps"]
        .as_f64()
        .unwrap_or(0.0)
        .max(dram_end["gbps"].as_f64().unwrap_or(0.0));
    // The storage roofline: for cold runs, the median of the probes run right before each cold
    // run of any config on the same file (the disk of a shared VM drifts within minutes, so
    // one probe at the start says little about a run 20 minutes later); else the start probe.
    let cold_probes: Vec<(PathBuf, Vec<f64>)> = disk_probes
        .iter()
        .map(|(file, _)| {
            let mut v: Vec<f64> = runs
                .iter()
                .flatten()
                .chain(std::iter::once(&drift))
                .filter(|r| r["disk_probe"]["file"].as_str() == Some(&file.display().to_string()))
                .filter_map(|r| r["disk_probe"]["gbps"].as_f64())
                .collect();
            v.sort_by(f64::total_cmp);
            (file.clone(), v)
        })
        .collect();
    let disk_gbps = |c: &Config| -> Option<f64> {
        let file = child::probe_file(args, c).ok()?;
        let probes = cold_probes
            .iter()
            .find(|(f, _)| *f == file)
            .map_or(&[][..], |(_, p)| p.as_slice());
        if !probes.is_empty() {
            return Some(probes[probes.len() / 2]);
        }
        disk_probes
            .iter()
            .find(|(f, _)| *f == file)
            .and_then(|(_, v)| v["gbps"].as_f64())
    };
    for (c, rs) in configs.iter().zip(runs.iter_mut()) {
        for r in rs.iter_mut() {
            report::add_fractions(r, dram_gbps, disk_gbps(c));
        }
    }
    report::add_fractions(&mut drift, dram_gbps, disk_gbps(&configs[0]));

    let phases = report::phase_notes(runs.iter().flatten());
    let per_config: Vec<Value> = configs
        .iter()
        .zip(&runs)
        .map(|(c, rs)| {
            json!({
                "name": c.name,
                "env": c.env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
                "flags": c.flags,
                "binary": machine::file_identity(&c.exe),
                "summary": report::summarize(rs, &phases),
                "runs": rs,
            })
        })
        .collect();
    let first_median = per_config[0]["summary"]["decode_tokens_per_s"]["median"].as_f64();
    let first_ttft = per_config[0]["summary"]["ttft_s"]["median"].as_f64();
    let dev = |v: Option<f64>, m: Option<f64>| v.zip(m).map(|(v, m)| (v - m) / m);
    let drift_check = json!({
        "config": configs[0].name,
        "decode_tokens_per_s": drift["decode_tokens_per_s"],
        "decode_deviation_from_first_config_median": dev(drift["decode_tokens_per_s"].as_f64(), first_median),
        "ttft_s": drift["ttft_s"],
        "ttft_deviation_from_first_config_median": dev(drift["ttft_s"].as_f64(), first_ttft),
        "run": drift,
    });
    let report = json!({
        "what": "hostd bench: end-to-end prefill and decode of each configuration, one fresh `hostd profile` process per run",
        "date": machine::date_utc(),
        "commit": machine::git_commit(),
        "commit_of": std::env::current_dir().map_or_else(|_| "?".into(), |d| d.display().to_string()),
        "binary": std::env::current_exe().map_or_else(|_| json!({"path": "?", "sha256": null}), |p| machine::file_identity(&p)),
        "cpu": machine::cpu_model(),
        "cores": cores,
        "threads": args.threads,
        "machine_ram_bytes": machine::mem_total_bytes(),
        "model_dir": args.model.display().to_string(),
        "prompt_tokens": args.prompt_tokens,
        "prefill_chunk": args.prefill_chunk.map_or_else(|| runs[0][0]["profile"]["prefill_chunk"].clone(), |c| json!(c)),
        "new_tokens": args.new_tokens,
        "runs_per_config": args.runs,
        "cold": args.cold,
        "order": clap::ValueEnum::to_possible_value(&args.order).map(|v| v.get_name().to_string()),
        "schedule": schedule.iter().map(|(c, r)| format!("{}#{r}", configs[*c].name)).collect::<Vec<_>>(),
        "bandwidth": {
            "dram": [dram_start, dram_end],
            "dram_gbps_used": dram_gbps,
            "storage": disk_probes.iter().map(|(_, v)| v.clone()).collect::<Vec<_>>(),
            "storage_before_cold_runs": cold_probes
                .iter()
                .map(|(f, p)| json!({"file": f.display().to_string(), "gbps": p, "median_gbps": p.get(p.len() / 2)}))
                .collect::<Vec<_>>(),
        },
        "notes": report::notes(),
        "decode_phase_notes": phases,
        "configs": per_config,
        "drift_check": drift_check,
    });
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).expect("a JSON value serialises");
        std::fs::write(path, text).map_err(|e| BenchError::Io {
            what: format!("writing {}", path.display()),
            source: e,
        })?;
    }
    Ok(report)
}
