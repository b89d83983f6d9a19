//! `hostd bench`: end-to-end benchmark of one or more configurations, each run a fresh
//! `hostd profile` process (this binary), interleaved across configurations (run 1 of each,
//! then run 2 of each, …) with the first configuration repeated once more at the end as a drift
//! check. Beside the runs it measures the rooflines (DRAM read bandwidth at start and end;
//! `O_DIRECT` storage read bandwidth of each container) and reports every run's figures, their
//! median/min/max per configuration, and the fraction of each roofline a run achieves.
//!
//! With `--cold` the page cache is dropped before every run and the child skips its warm-up; a
//! run is labelled `cold_proven` only with evidence (see [`cold_verdict`]).

mod roofline;

use super::profile::{PHASE_NOTES, cpu_model, git_commit};
use anyhow::{Context, bail};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

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
    #[arg(long)]
    pub expertd_cache_bytes: Option<u64>,
    /// Compute threads of every run (unless its config sets --threads); also the DRAM probe's.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Prompt length (synthetic ids).
    #[arg(long, default_value_t = 512)]
    pub prompt_tokens: usize,
    /// Prompt rows per prefill forward call in every run.
    #[arg(long, default_value_t = crate::engine::DEFAULT_PREFILL_CHUNK)]
    pub prefill_chunk: usize,
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
    #[arg(long, default_value_t = 1 << 30)]
    pub bandwidth_bytes: usize,
    /// Bytes the O_DIRECT probe reads from each container (0: no storage probe).
    #[arg(long, default_value_t = 2 << 30)]
    pub odirect_bytes: u64,
    /// Parallel readers of the O_DIRECT probe.
    #[arg(long, default_value_t = 8)]
    pub odirect_readers: usize,
}

/// Order of the configs within each round of `hostd bench`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Every round in the order the configs were given.
    Forward,
    /// Odd rounds in the given order, even rounds reversed.
    Alternate,
}

/// The interleaved schedule, `(config index, round label)`: `runs` rounds of every config in
/// `order`, then the drift check (config 0 once more).
fn schedule(n_configs: usize, runs: usize, order: Order) -> Vec<(usize, String)> {
    let mut s: Vec<(usize, String)> = (1..=runs)
        .flat_map(|r| {
            let reversed = order == Order::Alternate && r % 2 == 0;
            (0..n_configs).map(move |c| (if reversed { n_configs - 1 - c } else { c }, r.to_string()))
        })
        .collect();
    s.push((0, "drift".to_string()));
    s
}

/// One configuration under test.
#[derive(Debug, Clone)]
struct Config {
    name: String,
    /// `NAME=VALUE` words before the flags: the environment of this config's runs.
    env: Vec<(String, String)>,
    flags: Vec<String>,
    /// `--container DIR` among the flags.
    container: Option<PathBuf>,
}

/// Flags the bench itself sets on every child.
const MANAGED: &[&str] = &["--model", "--out", "--prompt-tokens", "--prefill-chunk", "--decode-steps", "--bandwidth-bytes", "--no-warmup"];

fn parse_config(spec: &str) -> anyhow::Result<Config> {
    let (name, flags) = spec.split_once(':').with_context(|| format!("--config {spec:?}: expected `NAME: FLAGS`"))?;
    let name = name.trim();
    anyhow::ensure!(!name.is_empty(), "--config {spec:?}: empty name");
    let mut words = flags.split_whitespace().peekable();
    let mut env = Vec::new();
    while let Some((k, v)) = words.peek().and_then(|w| env_word(w)) {
        env.push((k, v));
        words.next();
    }
    let flags: Vec<String> = words.map(str::to_string).collect();
    if let Some(f) = flags.iter().find(|f| MANAGED.iter().any(|m| f.as_str() == *m || f.starts_with(&format!("{m}=")))) {
        bail!("--config {name}: {f} is set by hostd bench itself");
    }
    let container = flags.iter().enumerate().find_map(|(i, f)| match f.strip_prefix("--container") {
        Some("") => flags.get(i + 1).map(PathBuf::from),
        Some(rest) => rest.strip_prefix('=').map(PathBuf::from),
        None => None,
    });
    Ok(Config { name: name.to_string(), env, flags, container })
}

/// `NAME=VALUE` with an upper-case environment name (`SLUICE_KERNEL_ISA=avx2`), else `None`.
fn env_word(w: &str) -> Option<(String, String)> {
    let (k, v) = w.split_once('=')?;
    let mut chars = k.chars();
    let first = chars.next()?;
    let ok = (first.is_ascii_uppercase() || first == '_') && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    ok.then(|| (k.to_string(), v.to_string()))
}

fn configs(args: &BenchArgs) -> anyhow::Result<Vec<Config>> {
    let has_default_flags =
        args.experts.is_some() || args.container.is_some() || args.expertd_uri.is_some() || args.expertd_cache_bytes.is_some();
    if !args.configs.is_empty() {
        anyhow::ensure!(!has_default_flags, "--experts/--container/--expertd/--expertd-cache-bytes describe the default configuration; with --config put them inside each config");
        let configs = args.configs.iter().map(|c| parse_config(c)).collect::<anyhow::Result<Vec<_>>>()?;
        for (i, c) in configs.iter().enumerate() {
            anyhow::ensure!(!configs[..i].iter().any(|o| o.name == c.name), "--config name {:?} given twice", c.name);
        }
        return Ok(configs);
    }
    let mut flags = Vec::new();
    let mut push = |k: &str, v: Option<String>| {
        if let Some(v) = v {
            flags.extend([k.to_string(), v]);
        }
    };
    push("--experts", args.experts.clone());
    push("--container", args.container.as_ref().map(|p| p.display().to_string()));
    push("--expertd", args.expertd_uri.clone());
    push("--expertd-cache-bytes", args.expertd_cache_bytes.map(|b| b.to_string()));
    Ok(vec![parse_config(&format!("default: {}", flags.join(" ")))?])
}

/// Runs `hostd bench`.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.runs >= 1 && args.new_tokens >= 1 && args.prompt_tokens >= 2, "need --runs ≥ 1, --new-tokens ≥ 1, --prompt-tokens ≥ 2");
    anyhow::ensure!(args.prefill_chunk >= 1, "--prefill-chunk must be at least 1");
    let configs = configs(args)?;
    let exe = std::env::current_exe().context("locating this executable")?;
    let tmp = tempfile::Builder::new().prefix("sluice-bench-").tempdir()?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = args.threads.unwrap_or(cores);

    eprintln!("bench: DRAM read bandwidth probe (start)");
    let dram_start = roofline::dram(args.bandwidth_bytes, threads, "start");
    // Storage probe per distinct container; configs without one use the model's largest shard.
    let mut disk_probes: Vec<(PathBuf, Value)> = Vec::new();
    if args.odirect_bytes > 0 {
        for c in &configs {
            let file = probe_file(args, c)?;
            if !disk_probes.iter().any(|(f, _)| *f == file) {
                eprintln!("bench: storage read bandwidth probe of {}", file.display());
                let v = roofline::read_bandwidth(&file, args.odirect_bytes, args.odirect_readers);
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
        eprintln!("bench: run {}/{}: {} (round {label})", i + 1, schedule.len(), c.name);
        let out = tmp.path().join(format!("run-{i}.json"));
        let record = one_run(args, &exe, c, label, &out)?;
        if label == "drift" {
            drift = record;
        } else {
            runs[*ci].push(record);
        }
    }

    eprintln!("bench: DRAM read bandwidth probe (end)");
    let dram_end = roofline::dram(args.bandwidth_bytes, threads, "end");
    let dram_gbps = dram_start["gbps"].as_f64().unwrap_or(0.0).max(dram_end["gbps"].as_f64().unwrap_or(0.0));
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
        let file = probe_file(args, c).ok()?;
        let probes = cold_probes.iter().find(|(f, _)| *f == file).map_or(&[][..], |(_, p)| p.as_slice());
        if !probes.is_empty() {
            return Some(probes[probes.len() / 2]);
        }
        disk_probes.iter().find(|(f, _)| *f == file).and_then(|(_, v)| v["gbps"].as_f64())
    };
    for (c, rs) in configs.iter().zip(runs.iter_mut()) {
        for r in rs.iter_mut() {
            add_fractions(r, dram_gbps, disk_gbps(c));
        }
    }
    add_fractions(&mut drift, dram_gbps, disk_gbps(&configs[0]));

    let per_config: Vec<Value> = configs
        .iter()
        .zip(&runs)
        .map(|(c, rs)| json!({"name": c.name, "env": c.env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(), "flags": c.flags, "summary": summarize(rs), "runs": rs}))
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
        "date": date_utc(),
        "commit": git_commit(),
        "commit_of": std::env::current_dir().map_or_else(|_| "?".into(), |d| d.display().to_string()),
        "binary": binary_identity(),
        "cpu": cpu_model(),
        "cores": cores,
        "threads": args.threads,
        "machine_ram_bytes": mem_total_bytes(),
        "model_dir": args.model.display().to_string(),
        "prompt_tokens": args.prompt_tokens,
        "prefill_chunk": args.prefill_chunk,
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
        "notes": notes(),
        "decode_phase_notes": PHASE_NOTES.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "configs": per_config,
        "drift_check": drift_check,
    });
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?).with_context(|| format!("writing {}", path.display()))?;
    }
    print_table(&report);
    Ok(())
}

/// The path and sha256 of the hostd binary running this bench (the runs are children of the same
/// executable): what identifies the code measured, whatever the checkout's HEAD says.
fn binary_identity() -> serde_json::Value {
    use sha2::{Digest, Sha256};
    let exe = std::env::current_exe();
    let sha = exe.as_ref().ok().and_then(|p| std::fs::read(p).ok()).map(|b| {
        Sha256::digest(&b).iter().map(|x| format!("{x:02x}")).collect::<String>()
    });
    json!({
        "path": exe.map_or_else(|_| "?".into(), |p| p.display().to_string()),
        "sha256": sha,
    })
}

fn notes() -> Vec<&'static str> {
    vec![
        "commit: `git rev-parse HEAD` in commit_of (the working directory) when the report was written; the binary may have been built from another commit (a checkout that moved on, a copied binary): binary.sha256 identifies the code that ran",
        "every run is a fresh `hostd profile` process (model load, optional warm-up, prefill, decode); runs are interleaved across configs (order: `forward` runs every round in the given order; `alternate` reverses even rounds); the first config runs once more at the end (drift_check)",
        "ttft_s: in the child, wall time of the prefill forward pass over the whole prompt (blocks of prefill_chunk rows, synthetic ids) plus the argmax that picks the first token; excludes process start and model load",
        "prefill_tokens_per_s: prompt tokens / prefill forward-pass wall time (argmax excluded)",
        "decode_tokens_per_s: new tokens / decode wall time, one step = one single-token forward pass + argmax",
        "decode_phases_ms_per_token: decode wall time per token split by op scopes; see decode_phase_notes; `other` = wall - sum of the others",
        "child_wall_s: the parent's wall time from spawning the child to its exit (load, warm-up, measurement, teardown)",
        "weight_bytes_per_decode_token: dense projections (incl. lm_head) + routed-expert bytes per decode step as the op scopes count them (each matrix once per call)",
        "disk_bytes_per_decode_token: physical storage reads (/proc/PID/io read_bytes) of hostd + its private expertd across the decode phase, / new tokens",
        "hostd_vm_hwm_bytes / expertd_vm_hwm_bytes: peak RSS (VmHWM) of the child and of its private expertd, read at the end of the decode",
        "hit_rate: the expertd cache's hits / (hits + misses) over the decode, from its per-call responses (distinct experts per call); null without expertd",
        "dram_fraction: weight_bytes_per_decode_token x decode_tokens_per_s / the larger DRAM probe (bandwidth.dram_gbps_used)",
        "disk_busy_fraction: the share of the decode's wall time during which the block device holding the container (else the model) had at least one request in flight (io_ticks; device-wide, every process's I/O counts)",
        "disk_fraction: disk_bytes_per_decode_token x decode_tokens_per_s / the storage roofline of the config's container (else the model's largest shard): with --cold, the median of the O_DIRECT probes run right before each cold run on that file (disk_probe in each run), else the probe at the start; null when the decode read nothing from storage",
        "cold_proven: true only when the page-cache drop before the run succeeded, physical reads were counted (hostd or expertd read_bytes > 0), and, with a private expertd, its physical reads during the decode steps cover every byte its cache read for misses",
        "summary: median/min/max over the config's runs (drift run excluded); nulls skipped",
    ]
}

/// The largest `*.safetensors` file of the model (the storage probe for configs without a container).
fn largest_shard(model: &Path) -> anyhow::Result<PathBuf> {
    std::fs::read_dir(model)
        .with_context(|| format!("reading {}", model.display()))?
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .max_by_key(|e| e.metadata().map_or(0, |m| m.len()))
        .map(|e| e.path())
        .with_context(|| format!("no safetensors file in {}", model.display()))
}

/// The file a config's storage probe reads: its container, else the model's largest shard.
fn probe_file(args: &BenchArgs, c: &Config) -> anyhow::Result<PathBuf> {
    match &c.container {
        Some(dir) => Ok(dir.join(shared::container::CONTAINER_FILE)),
        None => largest_shard(&args.model),
    }
}

/// Spawns one child run and returns its record.
fn one_run(args: &BenchArgs, exe: &Path, c: &Config, label: &str, out: &Path) -> anyhow::Result<Value> {
    if args.cold && c.flags.iter().any(|f| f == "--expertd" || f.starts_with("--expertd=")) {
        bail!("config {}: --cold needs a private expertd per run; a running daemon (--expertd URI) keeps its cache across the page-cache drop", c.name);
    }
    let loadavg_before = std::fs::read_to_string("/proc/loadavg").ok().map(|s| s.trim().to_string());
    let drop = args.cold.then(roofline::drop_caches);
    // A cold run's own storage probe, after the drop and just before the child starts (O_DIRECT:
    // it leaves the page cache as the drop left it).
    let disk_probe = match args.cold && args.odirect_bytes > 0 {
        true => roofline::read_bandwidth(&probe_file(args, c)?, args.odirect_bytes, args.odirect_readers),
        false => Value::Null,
    };
    let mut cmd = Command::new(exe);
    cmd.arg("profile")
        .arg("--model")
        .arg(&args.model)
        .args(["--prompt-tokens", &args.prompt_tokens.to_string(), "--decode-steps", &args.new_tokens.to_string()])
        .args(["--prefill-chunk", &args.prefill_chunk.to_string()])
        .args(["--bandwidth-bytes", "0", "--out"])
        .arg(out);
    if let Some(t) = args.threads.filter(|_| !c.flags.iter().any(|f| f == "--threads" || f.starts_with("--threads="))) {
        cmd.args(["--threads", &t.to_string()]);
    }
    if args.cold {
        cmd.arg("--no-warmup");
    }
    cmd.envs(c.env.iter().map(|(k, v)| (k, v))).args(&c.flags).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::inherit());
    let t = Instant::now();
    let status = cmd.status().with_context(|| format!("starting {}", exe.display()))?;
    let child_wall_s = t.elapsed().as_secs_f64();
    if !status.success() {
        bail!("config {} run {label}: `hostd profile {}` failed ({status}); its error is above", c.name, c.flags.join(" "));
    }
    let p: Value = serde_json::from_slice(&std::fs::read(out).with_context(|| format!("reading {}", out.display()))?)
        .with_context(|| format!("parsing {}", out.display()))?;
    let hostd_reads = p["process"]["hostd"]["read_bytes_total"].as_u64();
    let expertd = &p["process"]["expertd"];
    let cache = &p["expert_cache"]["decode"];
    let cold = match &drop {
        None => json!({"requested": false}),
        Some(d) => {
            let evidence = ColdEvidence {
                hostd_reads,
                expertd_reads: expertd["read_bytes_total"].as_u64(),
                expertd_decode_reads: p["disk_reads"]["decode"]["expertd"].as_u64(),
                expertd_decode_logical_reads: cache["bytes_read"].as_u64(),
                has_expertd: expertd["pid"].as_u64().is_some(),
            };
            let (proven, reason) = cold_verdict(d, &evidence);
            json!({"requested": true, "drop_caches": d.as_ref().map_or_else(|e| e.clone(), |()| "ok".into()), "cold_proven": proven, "reason": reason})
        }
    };
    Ok(json!({
        "config": c.name,
        "round": label,
        "child_wall_s": child_wall_s,
        "loadavg_before": loadavg_before,
        "load_s": p["load_s"],
        "cold": cold,
        "disk_probe": disk_probe,
        "experts": p["experts"],
        "threads": p["threads"],
        "ttft_s": p["ttft_s"],
        "prefill_tokens_per_s": p["prefill_tokens_per_s"],
        "decode_tokens_per_s": p["decode_tokens_per_s"],
        "decode_phases_ms_per_token": p["decode_phases_ms_per_token"],
        "expert_calls_per_token": p["expert_calls"]["calls_per_token"],
        "ipc_us_per_expert_call": p["expert_calls"]["ipc_us_per_call"],
        "expert_transport": p["expert_transport"],
        "prefetch_recall": p["prefetch"]["recall"],
        "prefetch_wasted_bytes_per_token": p["prefetch"]["wasted_bytes_per_token"],
        "prefetch": p["prefetch"],
        "weight_bytes_per_decode_token": p["weight_bytes_per_decode_token"],
        "disk_bytes_per_decode_token": p["disk_reads"]["decode_bytes_per_token"],
        "disk_busy_fraction": p["disk_reads"]["decode_device"]["busy_fraction"],
        "disk_reads": p["disk_reads"],
        "hostd_vm_hwm_bytes": p["process"]["hostd"]["vm_hwm_bytes"],
        "hostd_read_bytes_total": hostd_reads,
        "expertd_vm_hwm_bytes": expertd["vm_hwm_bytes"],
        "expertd_read_bytes_total": expertd["read_bytes_total"],
        "expertd_io_backend": expertd["io_backend"],
        "expert_cache_decode": cache,
        "hit_rate": cache["hit_rate"],
        "profile": p,
    }))
}

/// What a run's /proc counters say about where its bytes came from.
struct ColdEvidence {
    hostd_reads: Option<u64>,
    expertd_reads: Option<u64>,
    /// Physical reads of the private expertd during the measured decode steps.
    expertd_decode_reads: Option<u64>,
    /// Bytes the expertd cache says it read for misses during those steps.
    expertd_decode_logical_reads: Option<u64>,
    has_expertd: bool,
}

/// Whether a `--cold` run is proven cold, and why (never claimed without evidence): the page
/// cache was dropped before the run, storage reads were counted, and — with a private expertd —
/// every byte its cache read for misses during decode was a physical read (O_DIRECT).
/// "Cold" is cold inside this machine: on a VM the host may still cache the virtual disk.
fn cold_verdict(drop: &Result<(), String>, e: &ColdEvidence) -> (bool, String) {
    let total = e.hostd_reads.unwrap_or(0) + e.expertd_reads.unwrap_or(0);
    if let Err(err) = drop {
        return (false, format!("page cache not dropped ({err}): dense weights, and experts unless read with O_DIRECT, may have been cached"));
    }
    if e.hostd_reads.is_none() && e.expertd_reads.is_none() {
        return (false, "/proc/PID/io read_bytes unreadable: no evidence of physical reads".into());
    }
    if total == 0 {
        return (false, "no physical reads counted (hostd and expertd read_bytes are 0): everything came from memory".into());
    }
    if e.has_expertd {
        match (e.expertd_decode_reads, e.expertd_decode_logical_reads) {
            (Some(phys), Some(logical)) if logical > 0 && phys >= logical => {}
            (phys, logical) => {
                return (
                    false,
                    format!("expertd's physical decode reads ({phys:?} bytes) do not cover its cache's miss reads ({logical:?} bytes): some misses were served from memory"),
                );
            }
        }
    }
    (true, format!("page cache dropped before the run; {total} bytes read from storage (hostd {:?}, expertd {:?})", e.hostd_reads, e.expertd_reads))
}

/// Adds `dram_fraction` and `disk_fraction` to a run record.
fn add_fractions(r: &mut Value, dram_gbps: f64, disk_gbps: Option<f64>) {
    if r.is_null() {
        return;
    }
    let tps = r["decode_tokens_per_s"].as_f64().unwrap_or(0.0);
    let weights = r["weight_bytes_per_decode_token"].as_f64().unwrap_or(0.0);
    let dram = (dram_gbps > 0.0).then(|| weights * tps / (dram_gbps * 1e9));
    let disk = r["disk_bytes_per_decode_token"].as_f64().filter(|b| *b > 0.0).zip(disk_gbps).map(|(b, g)| b * tps / (g * 1e9));
    r["dram_fraction"] = json!(dram);
    r["disk_fraction"] = json!(disk);
}

/// Summary metrics: name → where in a run record.
fn metrics() -> Vec<(String, String)> {
    let mut m: Vec<(String, String)> = [
        "ttft_s",
        "prefill_tokens_per_s",
        "decode_tokens_per_s",
        "hostd_vm_hwm_bytes",
        "expertd_vm_hwm_bytes",
        "disk_bytes_per_decode_token",
        "weight_bytes_per_decode_token",
        "hit_rate",
        "dram_fraction",
        "disk_fraction",
        "disk_busy_fraction",
        "child_wall_s",
        "expert_calls_per_token",
        "ipc_us_per_expert_call",
        "prefetch_recall",
        "prefetch_wasted_bytes_per_token",
    ]
    .iter()
    .map(|k| (k.to_string(), format!("/{k}")))
    .collect();
    for (k, _) in PHASE_NOTES.iter().chain(&[("wall", "")]) {
        m.push((format!("phase_ms_per_token.{k}"), format!("/decode_phases_ms_per_token/{k}")));
    }
    m
}

fn summarize(runs: &[Value]) -> Value {
    let mut out = serde_json::Map::new();
    for (name, ptr) in metrics() {
        let mut v: Vec<f64> = runs.iter().filter_map(|r| r.pointer(&ptr).and_then(Value::as_f64)).collect();
        v.sort_by(f64::total_cmp);
        let s = if v.is_empty() {
            Value::Null
        } else {
            let median = if v.len() % 2 == 1 { v[v.len() / 2] } else { (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0 };
            json!({"median": median, "min": v[0], "max": v[v.len() - 1], "n": v.len()})
        };
        out.insert(name, s);
    }
    let cold: Vec<&Value> = runs.iter().filter_map(|r| r["cold"]["cold_proven"].as_bool().map(|_| &r["cold"]["cold_proven"])).collect();
    if !cold.is_empty() {
        out.insert("cold_proven_runs".into(), json!(cold.iter().filter(|v| v.as_bool() == Some(true)).count()));
    }
    Value::Object(out)
}

fn date_utc() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

fn mem_total_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = s.lines().find_map(|l| l.strip_prefix("MemTotal:"))?.split_whitespace().next()?.parse().ok()?;
    Some(kib * 1024)
}

fn print_table(r: &Value) {
    let f = |v: &Value| v.as_f64();
    println!("{} | commit {} | {} | {} cores, threads {}", r["date"].as_str().unwrap_or("?"), r["commit"].as_str().unwrap_or("?"), r["cpu"].as_str().unwrap_or("?"), r["cores"], r["threads"]);
    let dram: Vec<String> = r["bandwidth"]["dram"].as_array().into_iter().flatten().map(|d| format!("{} {:.1}", d["when"].as_str().unwrap_or("?"), f(&d["gbps"]).unwrap_or(0.0))).collect();
    println!("DRAM read GB/s: {}", dram.join(", "));
    for s in r["bandwidth"]["storage"].as_array().into_iter().flatten() {
        println!("storage read GB/s: {} ({}) {}", f(&s["gbps"]).map_or("n/a".into(), |g| format!("{g:.2}")), s["mode"].as_str().unwrap_or("?"), s["file"].as_str().unwrap_or("?"));
    }
    println!("prompt {} tokens, {} new tokens, {} runs/config, cold {}", r["prompt_tokens"], r["new_tokens"], r["runs_per_config"], r["cold"]);
    let cell = |s: &Value, scale: f64, prec: usize| match (f(&s["median"]), f(&s["min"]), f(&s["max"])) {
        (Some(m), Some(lo), Some(hi)) => format!("{:.p$} [{:.p$}-{:.p$}]", m * scale, lo * scale, hi * scale, p = prec),
        _ => "-".into(),
    };
    let rows: [(&str, &str, f64, usize); 10] = [
        ("TTFT s", "ttft_s", 1.0, 3),
        ("prefill tok/s", "prefill_tokens_per_s", 1.0, 1),
        ("decode tok/s", "decode_tokens_per_s", 1.0, 2),
        ("hostd RSS GiB", "hostd_vm_hwm_bytes", 1.0 / (1u64 << 30) as f64, 2),
        ("expertd RSS GiB", "expertd_vm_hwm_bytes", 1.0 / (1u64 << 30) as f64, 2),
        ("disk MB/token", "disk_bytes_per_decode_token", 1e-6, 2),
        ("weights MB/token", "weight_bytes_per_decode_token", 1e-6, 1),
        ("hit rate", "hit_rate", 1.0, 3),
        ("DRAM fraction", "dram_fraction", 1.0, 3),
        ("disk fraction", "disk_fraction", 1.0, 3),
    ];
    for c in r["configs"].as_array().into_iter().flatten() {
        let s = &c["summary"];
        println!("\n== {} ({}) — median [min-max]", c["name"].as_str().unwrap_or("?"), c["flags"].as_array().into_iter().flatten().filter_map(Value::as_str).collect::<Vec<_>>().join(" "));
        for (label, key, scale, prec) in rows {
            println!("  {label:<18} {}", cell(&s[key], scale, prec));
        }
        println!("  decode phases, ms/token (median [min-max]):");
        for (k, _) in PHASE_NOTES.iter().chain(&[("wall", "")]) {
            println!("    {k:<22} {}", cell(&s[format!("phase_ms_per_token.{k}")], 1.0, 3));
        }
        if let Some(n) = s["cold_proven_runs"].as_u64() {
            println!("  cold proven in {n} of {} runs", c["runs"].as_array().map_or(0, Vec::len));
            for run in c["runs"].as_array().into_iter().flatten() {
                println!("    run {}: {}", run["round"].as_str().unwrap_or("?"), run["cold"]["reason"].as_str().unwrap_or("?"));
            }
        }
    }
    let d = &r["drift_check"];
    println!(
        "\ndrift check ({} again at the end): decode {:.2} tok/s ({:+.1}% vs its median), TTFT {:.3} s ({:+.1}%)",
        d["config"].as_str().unwrap_or("?"),
        f(&d["decode_tokens_per_s"]).unwrap_or(0.0),
        100.0 * f(&d["decode_deviation_from_first_config_median"]).unwrap_or(0.0),
        f(&d["ttft_s"]).unwrap_or(0.0),
        100.0 * f(&d["ttft_deviation_from_first_config_median"]).unwrap_or(0.0)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_upper_case_assignments_are_the_config_environment() {
        let c = parse_config("isa2: SLUICE_KERNEL_ISA=avx2 _X1=a=b --experts int8 --container /c FOO=bar").expect("parses");
        assert_eq!(c.name, "isa2");
        assert_eq!(c.env, vec![("SLUICE_KERNEL_ISA".to_string(), "avx2".to_string()), ("_X1".to_string(), "a=b".to_string())]);
        // Only leading words: a later `FOO=bar` is a flag.
        assert_eq!(c.flags, ["--experts", "int8", "--container", "/c", "FOO=bar"]);
        assert_eq!(c.container, Some(PathBuf::from("/c")));
    }

    #[test]
    fn flags_and_lower_case_words_are_not_environment() {
        for w in ["--expertd-daemon-arg=--ring-spin-us=5", "foo=bar", "Foo=bar", "=x", "1A=x", "SLUICE"] {
            assert_eq!(env_word(w), None, "{w}");
        }
        assert_eq!(env_word("A="), Some(("A".to_string(), String::new())));
        let c = parse_config("x: --keep-awake off").expect("parses");
        assert!(c.env.is_empty());
    }

    #[test]
    fn alternate_order_reverses_even_rounds_and_drift_repeats_the_first_config() {
        let names = |s: Vec<(usize, String)>| s.into_iter().map(|(c, r)| format!("{c}#{r}")).collect::<Vec<_>>();
        assert_eq!(names(schedule(2, 3, Order::Alternate)), ["0#1", "1#1", "1#2", "0#2", "0#3", "1#3", "0#drift"]);
        assert_eq!(names(schedule(3, 2, Order::Alternate)), ["0#1", "1#1", "2#1", "2#2", "1#2", "0#2", "0#drift"]);
        assert_eq!(names(schedule(2, 2, Order::Forward)), ["0#1", "1#1", "0#2", "1#2", "0#drift"]);
    }
}
