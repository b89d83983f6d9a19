//! `hostd plan MODEL`: sizes this machine for a checkpoint before anything is prepared or
//! loaded. Reads the checkpoint's configuration and shard headers, measures memory, the CPU,
//! DRAM and the disk (a few seconds), and prints for every expert format whether it runs
//! resident or streaming, the cache budget, the expected decode tok/s and the commands to run.
//! The arithmetic is `crate::plan`; this module owns the flags, the measurements' progress and
//! the report.

use super::plan_machine::{self as machine, Cpu, Disk, Memory, Target};
use crate::plan::hits::{self, HitRate, Workload};
use crate::plan::{self, FormatPlan, ModelFacts, Rates};
use anyhow::Context;
use serde_json::json;
use shared::checkpoint::Checkpoint;
use shared::sizes::human_bytes;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Flags of `hostd plan`.
#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// Model directory (config.json, the safetensors index and shards); with `--config-only`, a
    /// directory or the config.json file itself.
    pub model: PathBuf,
    /// Read only config.json: plan for a model before downloading its weights. The disk is then
    /// probed with a scratch file written in the container's directory.
    #[arg(long)]
    pub config_only: bool,
    /// The expert container's directory: an existing one (its disk is probed, its format marked
    /// as prepared) or where `expertd prepare` should write one. Default: `MODEL-FORMAT` beside
    /// the model.
    #[arg(long)]
    pub container: Option<PathBuf>,
    /// Context length to reserve KV cache for, in tokens.
    #[arg(long, default_value_t = 8192)]
    pub context: u64,
    /// Plan for this much usable memory instead of what this machine has free (e.g. `24GiB`).
    #[arg(long, value_parser = shared::byte_size::parse_bytes)]
    pub memory: Option<u64>,
    /// Bytes each bandwidth probe reads (DRAM buffer, O_DIRECT reads).
    #[arg(long, value_parser = shared::byte_size::parse_bytes, default_value = "1GiB")]
    pub probe_bytes: u64,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
}

/// One measurement's spinner on stderr (hidden when stderr is not a terminal).
fn step<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let bar = indicatif::ProgressBar::new_spinner().with_message(what.to_string());
    bar.enable_steady_tick(Duration::from_millis(120));
    let out = f();
    bar.finish_and_clear();
    out
}

/// The container directory of `format` when `--container` does not name one.
fn default_container(model: &Path, format: &str) -> PathBuf {
    // `X.gguf` gives `X-FORMAT` beside it.
    let name = if shared::gguf::is_gguf_path(model) {
        model.file_stem()
    } else {
        model.file_name()
    };
    let name = name.map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
    model.with_file_name(format!("{name}-{format}"))
}

/// Runs `hostd plan`.
pub fn run(args: &PlanArgs) -> anyhow::Result<()> {
    let gguf = shared::gguf::is_gguf_path(&args.model);
    let config = if gguf {
        // The dense tensors and experts are checked as `hostd run` checks them.
        crate::model::weights::MappedCheckpoint::open(&args.model)
            .with_context(|| format!("{} is not a GGUF hostd can run", args.model.display()))?
            .config()
            .clone()
    } else if args.config_only {
        if args.model.is_file() {
            let text = std::fs::read_to_string(&args.model)
                .with_context(|| format!("reading {}", args.model.display()))?;
            shared::config::parse_config(&text)
                .with_context(|| format!("{}", args.model.display()))?
        } else {
            shared::checkpoint::read_config(&args.model)?
        }
    } else {
        Checkpoint::open(&args.model)
            .with_context(|| {
                format!(
                    "{} is not a checkpoint hostd can run (a Qwen3.6 MoE model directory with config.json, model.safetensors.index.json and its shards; --config-only plans from config.json alone)",
                    args.model.display()
                )
            })?
            .config
    };
    // A config.json file stands for its directory in the commands and the default container.
    let model_dir = if args.model.is_file() && !gguf {
        // `config.json` alone has the parent "": the current directory.
        match args.model.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        }
    } else {
        args.model.clone()
    };
    let cfg = &config.text;
    let mut facts = ModelFacts::from_config(cfg).context("the model's expert dimensions")?;
    if gguf {
        facts.hold_embedding();
    }
    let existing = match &args.container {
        Some(dir) if dir.join(shared::container::CONTAINER_FILE).is_file() => {
            let path = dir.join(shared::container::CONTAINER_FILE);
            let file = std::fs::File::open(&path).with_context(|| format!("{}", path.display()))?;
            let (header, _) = shared::container::read_header(&file, &path)
                .with_context(|| format!("reading the container header of {}", path.display()))?;
            Some((dir.clone(), header.layout.dims.format.name()))
        }
        _ => None,
    };
    let container_dir = |format: &str| -> PathBuf {
        match (&existing, &args.container) {
            (Some((dir, f)), _) if *f == format => dir.clone(),
            (None, Some(dir)) => dir.clone(),
            _ => default_container(&model_dir, format),
        }
    };

    let measured = Memory::measure().map_err(anyhow::Error::msg)?;
    let usable = args.memory.unwrap_or(measured.usable);
    // The DRAM probe allocates its buffer: never more than a quarter of what is free here.
    let probe_bytes = args.probe_bytes.min(measured.usable / 4);
    let cpu = Cpu::detect();
    // The probe reports its fastest step; the best of three probes steadies it further (the
    // same figure moved by 10% within minutes on this project's VM).
    let dram_gbps = step("measuring DRAM read bandwidth", || {
        (0..3)
            .map(|_| {
                shared::kernels::bandwidth::measure_read_bandwidth_gbps(
                    probe_bytes as usize,
                    cpu.threads,
                )
            })
            .fold(0.0, f64::max)
    });
    // The disk the experts will be read from: the container's, else the model's when the
    // container will be written to the same filesystem (or the disk is all we have).
    let new_dir = container_dir(facts.formats[0].format);
    let probe_file = existing
        .as_ref()
        .map(|(dir, _)| dir.join(shared::container::CONTAINER_FILE))
        .or_else(|| {
            (if gguf {
                Some(args.model.clone())
            } else {
                machine::largest_shard(&model_dir)
            })
            .filter(|shard| machine::same_filesystem(shard, &new_dir) != Some(false))
        });
    let disk: Result<Disk, String> =
        step(
            "measuring the disk's O_DIRECT read bandwidth",
            || match &probe_file {
                Some(file) => machine::disk_bandwidth(file, args.probe_bytes),
                None => machine::scratch_disk_bandwidth(
                    &new_dir,
                    args.probe_bytes.min(machine::SCRATCH_PROBE_BYTES),
                ),
            },
        );
    let rates = Rates {
        dram_bps: dram_gbps * 1e9,
        disk_bps: disk.as_ref().ok().map(|d| {
            let (lo, hi) = d.range_bps();
            (lo, d.gbps * 1e9, hi)
        }),
    };

    let host = facts.host_bytes(args.context);
    let fits: Vec<_> = facts
        .formats
        .iter()
        .map(|f| {
            let daemon = plan::expertd_overhead(facts.experts, f.slot_bytes);
            plan::fit(usable, host, f.container_bytes, daemon)
        })
        .collect();
    // The no-locality hit rates: one replay per streaming format, by the daemon's planner.
    let workload = Workload::for_model(facts.layers, facts.experts, facts.top_k);
    let expertd = crate::expert_client::private::PrivateDaemon::binary();
    let mut replay_error = None;
    let mut plans: Vec<FormatPlan> = Vec::new();
    step(
        "replaying routes through the expert cache's planner",
        || {
            for (f, &(mode, cache)) in facts.formats.iter().zip(&fits) {
                let share = (cache as f64 / f.container_bytes.max(1) as f64).min(1.0);
                let mut rates_of = Vec::new();
                if mode == "streaming" {
                    match &expertd {
                    Ok(bin) => match hits::no_locality(bin, &workload, f.slot_bytes, &[cache]) {
                        Ok(h) => rates_of.push(HitRate {
                            routing: "no-locality",
                            decode_hit_rate: h[0],
                            how: format!(
                                "expertd replay (LRU) of {} decode steps after a {}-token prompt, routes uniform at random",
                                workload.decode_steps, workload.prompt_tokens
                            ),
                        }),
                        Err(e) => replay_error = Some(e),
                    },
                    Err(e) => replay_error = Some(e.to_string()),
                }
                }
                rates_of.push(if mode == "resident" {
                    HitRate {
                        routing: "resident",
                        decode_hit_rate: 1.0,
                        how: "every expert in memory".into(),
                    }
                } else {
                    HitRate {
                        routing: "trained",
                        decode_hit_rate: hits::trained_hit_rate(share),
                        how: "published LRU curve of a trained model (Qwen3-30B-A3B, kekzl/imp #1374), at the cached share".into(),
                    }
                });
                plans.push(plan::plan_format(&facts, f, (mode, cache), rates_of, rates));
            }
        },
    );

    let chosen = plan::recommend(&plans);
    let args = &PlanArgs {
        model: model_dir.clone(),
        container: args.container.clone(),
        ..*args
    };
    let target = chosen.map(|p| Target::check(&container_dir(p.format)));
    let mut problems = Vec::new();
    if chosen.is_none() {
        let below_dense = if usable < facts.dense_resident_bytes {
            format!(
                " (less than the INT8 dense weights alone, {})",
                human_bytes(facts.dense_resident_bytes)
            )
        } else {
            String::new()
        };
        problems.push(format!(
            "nothing fits in {}{below_dense}: hostd alone needs {} (INT8 dense weights {}, KV for {} tokens, DeltaNet state, runtime) plus {} headroom and a cache of at least {}{}",
            human_bytes(usable),
            human_bytes(host),
            human_bytes(facts.dense_resident_bytes),
            args.context,
            human_bytes(plan::HEADROOM_BYTES),
            human_bytes(plan::MIN_CACHE_BYTES),
            match measured.cgroup_limit {
                Some(l) if args.memory.is_none() => format!(
                    "; this process's cgroup allows {} in all: raise its memory limit (MemoryMax=, --memory of docker) or use a bigger machine",
                    human_bytes(l)
                ),
                _ => "; use a machine with more memory".into(),
            }
        ));
    }
    if let (Some(p), Some(t)) = (chosen, &target)
        && !t.exists
    {
        let need = facts
            .formats
            .iter()
            .find(|f| f.format == p.format)
            .map_or(0, |f| f.container_bytes);
        if let Some(why) = &t.unwritable {
            problems.push(format!(
                "the {} container cannot be written to {}: {why}; pass --container DIR on a writable disk with {} free",
                p.format,
                t.dir.display(),
                human_bytes(need)
            ));
        } else if let Some(free) = t.free_bytes.filter(|&free| free < need) {
            problems.push(format!(
                "the {} container needs {} but {} has {} free; pass --container DIR on a disk with room",
                p.format,
                human_bytes(need),
                t.dir.display(),
                human_bytes(free)
            ));
        }
    }

    let commands =
        chosen.map(|p| commands(args, &cpu, p, &container_dir(p.format), target.as_ref()));
    if args.json {
        let doc = json!({
            "model": args.model,
            "config_only": args.config_only,
            "facts": facts,
            "machine": {
                "memory": measured,
                "usable_bytes": usable,
                "usable_from": if args.memory.is_some() { "--memory" } else { "measured" },
                "cpu": cpu,
                "dram_gbps": dram_gbps,
                "dram_probe_bytes": probe_bytes,
                "disk": disk.as_ref().ok(),
                "disk_error": disk.as_ref().err(),
            },
            "host_bytes": host,
            "host_runtime_bytes": plan::HOST_RUNTIME_BYTES,
            "expertd_overhead_bytes": facts
                .formats
                .iter()
                .map(|f| (f.format, plan::expertd_overhead(facts.experts, f.slot_bytes)))
                .collect::<std::collections::BTreeMap<_, _>>(),
            "context_tokens": args.context,
            "efficiency": { "low": plan::DRAM_EFFICIENCY.0, "point": plan::DRAM_EFFICIENCY.1, "high": plan::DRAM_EFFICIENCY.2 },
            "formats": plans,
            "no_locality_error": replay_error,
            "recommended": chosen.map(|p| p.format),
            "container": target,
            "commands": commands,
            "problems": problems,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        let mut out = String::new();
        super::plan_report::write(
            &mut out,
            &super::plan_report::Report {
                model: &args.model,
                config_only: args.config_only,
                facts: &facts,
                memory: &measured,
                usable,
                memory_flag: args.memory.is_some(),
                cpu: &cpu,
                dram_gbps,
                probe_bytes,
                disk: &disk,
                host,
                context: args.context,
                plans: &plans,
                replay_error: replay_error.as_deref(),
                chosen,
                commands: commands.as_deref(),
                problems: &problems,
            },
        );
        print!("{out}");
    }
    if problems.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("{}", problems.join("; "))
    }
}

/// The commands to prepare, run and check the chosen configuration.
fn commands(
    args: &PlanArgs,
    cpu: &Cpu,
    p: &FormatPlan,
    dir: &Path,
    target: Option<&Target>,
) -> Vec<String> {
    let model = args.model.display();
    let dir_s = dir.display();
    let mut out = Vec::new();
    if !target.is_some_and(|t| t.exists) {
        let format = if p.format == "int8" {
            String::new()
        } else {
            format!(" --format {}", p.format)
        };
        out.push(format!("expertd prepare {model} --out {dir_s}{format}"));
    }
    let experts = if p.mode == "resident" {
        format!("--experts int8 --container {dir_s}")
    } else {
        format!(
            "--experts expertd --container {dir_s} --expertd-cache-bytes {}",
            p.cache_bytes
        )
    };
    let flags = format!("--dense int8 {experts} --threads {}", cpu.threads);
    out.push(format!("hostd serve --model {model} {flags}"));
    let cold = if p.mode == "resident" { "" } else { " --cold" };
    out.push(format!(
        "hostd bench --model {model} --threads {}{cold} --config \"{}: --dense int8 {experts}\"",
        cpu.threads, p.format
    ));
    out
}
