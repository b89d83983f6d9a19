//! The text form of `hostd plan`'s report: the machine, what hostd needs, one row per expert
//! format, the recommendation with its commands, and what stands in the way.

use super::plan_machine::{Cpu, Disk, Memory};
use crate::plan::{DRAM_EFFICIENCY, FormatPlan, ModelFacts, TokPerSec};
use shared::sizes::human_bytes;
use std::fmt::Write;
use std::path::Path;

/// Everything the report shows.
pub struct Report<'a> {
    pub model: &'a Path,
    pub config_only: bool,
    pub facts: &'a ModelFacts,
    pub memory: &'a Memory,
    pub usable: u64,
    pub memory_flag: bool,
    pub cpu: &'a Cpu,
    pub dram_gbps: f64,
    pub probe_bytes: u64,
    pub disk: &'a Result<Disk, String>,
    pub host: u64,
    pub context: u64,
    pub plans: &'a [FormatPlan],
    pub replay_error: Option<&'a str>,
    pub chosen: Option<&'a FormatPlan>,
    pub commands: Option<&'a [String]>,
    pub problems: &'a [String],
}

fn tok(t: Option<&TokPerSec>) -> String {
    t.map_or_else(
        || "not predicted (disk not measured)".into(),
        |t| format!("{:.2} ({:.2}–{:.2})", t.point, t.low, t.high),
    )
}

/// Writes the report.
pub fn write(out: &mut String, r: &Report<'_>) {
    let f = r.facts;
    let _ = writeln!(
        out,
        "plan for {} ({} layers, {} experts per layer, top-{}){}",
        r.model.display(),
        f.layers,
        f.experts,
        f.top_k,
        if r.config_only {
            ", from config.json alone"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "machine: {}, {} threads, kernels {} (INT8 experts: {})",
        r.cpu.model.as_deref().unwrap_or("unknown CPU"),
        r.cpu.threads,
        r.cpu.isa,
        r.cpu.int8_isa
    );
    let m = r.memory;
    let cgroup = match (m.cgroup_limit, m.cgroup_room) {
        (Some(l), Some(room)) => {
            format!(
                "cgroup limit {} ({} of it free)",
                human_bytes(l),
                human_bytes(room)
            )
        }
        _ => "no cgroup memory limit".into(),
    };
    let _ = writeln!(
        out,
        "  memory: {} total, {} available, {cgroup}; planning with {}{}",
        human_bytes(m.total),
        human_bytes(m.available),
        human_bytes(r.usable),
        if r.memory_flag { " (--memory)" } else { "" }
    );
    let disk = match r.disk {
        Ok(d) => {
            let (lo, hi) = d.range_bps();
            format!(
                "disk read {:.2} GB/s ({:.2}–{:.2}; {}, {} samples of {} from {})",
                d.gbps,
                lo / 1e9,
                hi / 1e9,
                d.mode,
                d.samples_gbps.len(),
                human_bytes(d.bytes),
                d.file.display()
            )
        }
        Err(e) => format!("disk not measured: {e}"),
    };
    let _ = writeln!(
        out,
        "  DRAM read {:.1} GB/s ({} buffer, {} threads); {disk}",
        r.dram_gbps,
        human_bytes(r.probe_bytes),
        r.cpu.threads,
    );
    let _ = writeln!(
        out,
        "  hostd needs {}: dense weights (INT8) {}, KV for {} tokens {}, DeltaNet state {}, runtime {} (the {} embedding table {})",
        human_bytes(r.host),
        human_bytes(f.dense_resident_bytes),
        r.context,
        human_bytes(f.kv_bytes_per_token * r.context),
        human_bytes(f.linear_state_bytes),
        human_bytes(crate::plan::HOST_RUNTIME_BYTES),
        human_bytes(f.embedding_bytes),
        if f.embedding_mapped {
            "stays mapped from the checkpoint"
        } else {
            "is held in memory, converted from the GGUF, and counted"
        }
    );
    let _ = writeln!(
        out,
        "  per decode token: dense weights {:.0} MB, experts MB/tok below; tok/s: point (range), DRAM efficiency {:.2} ({:.2}–{:.2})",
        f.dense_bytes_per_token as f64 / 1e6,
        DRAM_EFFICIENCY.1,
        DRAM_EFFICIENCY.0,
        DRAM_EFFICIENCY.2
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<8} {:>5} {:>10} {:>10}  {:<12} {:<18} decode tok/s",
        "format", "bits", "container", "MB/tok", "mode", "cache"
    );
    for (p, ff) in r.plans.iter().zip(&f.formats) {
        let cache = if p.mode == "does-not-fit" {
            "-".to_string()
        } else {
            format!(
                "{} ({:.0}%)",
                human_bytes(p.cache_bytes),
                100.0 * p.cache_share
            )
        };
        let speeds: Vec<String> = if p.mode == "does-not-fit" {
            vec!["-".into()]
        } else if p.mode == "resident" {
            vec![tok(p.decode_tok_s.first().and_then(Option::as_ref))]
        } else {
            p.hit_rates
                .iter()
                .zip(&p.decode_tok_s)
                .zip(&p.disk_bytes_per_token)
                .map(|((h, t), d)| {
                    format!(
                        "{}: hit {:.0}%, {:.0} MB/token from disk, {}",
                        h.routing,
                        100.0 * h.decode_hit_rate,
                        d / 1e6,
                        tok(t.as_ref())
                    )
                })
                .collect()
        };
        let _ = writeln!(
            out,
            "{:<8} {:>5.2} {:>10} {:>10.0}  {:<12} {:<18} {}",
            p.format,
            ff.bits_per_weight,
            human_bytes(ff.container_bytes),
            ff.expert_bytes_per_token as f64 / 1e6,
            p.mode,
            cache,
            speeds.join(&format!("\n{:70}", ""))
        );
    }
    if let Some(e) = r.replay_error {
        let _ = writeln!(out, "  (no-locality hit rates unavailable: {e})");
    }
    let _ = writeln!(
        out,
        "  no-locality: routes without temporal locality, as random-weight checkpoints route (measured by replaying them through expertd's cache planner); trained: a published curve for a trained model's routing (not measured here)"
    );
    let _ = writeln!(out);
    match (r.chosen, r.commands) {
        (Some(p), Some(cmds)) => {
            let why = if p.mode == "resident" {
                "every expert stays in memory; the most exact format that does"
            } else {
                "no format fits resident; the fastest streaming one"
            };
            let _ = writeln!(out, "recommended: {} experts, {} ({why})", p.format, p.mode);
            for (i, c) in cmds.iter().enumerate() {
                let _ = writeln!(out, "  {}. {c}", i + 1);
            }
        }
        _ => {
            let _ = writeln!(out, "recommended: nothing runs here");
        }
    }
    for p in r.problems {
        let _ = writeln!(out, "problem: {p}");
    }
}
