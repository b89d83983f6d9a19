//! What `hostd bench` makes of its runs: the roofline fractions of each run, the per-config
//! summaries (median/min/max), the notes that say what every field includes, and the table it
//! prints.

use serde_json::{Map, Value, json};

/// What each field of the report includes.
pub(super) fn notes() -> Vec<&'static str> {
    vec![
        "commit: `git rev-parse HEAD` in commit_of (the working directory) when the report was written; the binary may have been built from another commit (a checkout that moved on, a copied binary): binary.sha256 (and each config's binary.sha256) identifies the code that ran",
        "every run is a fresh `hostd profile` process (model load, optional warm-up, prefill, decode) of its config's binary (the bench's own unless --exe NAME=PATH named another); runs are interleaved across configs (order: `forward` runs every round in the given order; `alternate` reverses even rounds); the first config runs once more at the end (drift_check)",
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

/// The decode phases the children reported (`decode_phase_notes` of each `hostd profile`
/// report, in the order first seen): what the summaries and the table split decode time into.
pub(super) fn phase_notes<'a>(runs: impl IntoIterator<Item = &'a Value>) -> Map<String, Value> {
    let mut notes = Map::new();
    for r in runs {
        for (k, v) in r["profile"]["decode_phase_notes"]
            .as_object()
            .into_iter()
            .flatten()
        {
            notes.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    notes
}

/// Adds `dram_fraction` and `disk_fraction` to a run record.
pub(super) fn add_fractions(r: &mut Value, dram_gbps: f64, disk_gbps: Option<f64>) {
    if r.is_null() {
        return;
    }
    let tps = r["decode_tokens_per_s"].as_f64().unwrap_or(0.0);
    let weights = r["weight_bytes_per_decode_token"].as_f64().unwrap_or(0.0);
    let dram = (dram_gbps > 0.0).then(|| weights * tps / (dram_gbps * 1e9));
    let disk = r["disk_bytes_per_decode_token"]
        .as_f64()
        .filter(|b| *b > 0.0)
        .zip(disk_gbps)
        .map(|(b, g)| b * tps / (g * 1e9));
    r["dram_fraction"] = json!(dram);
    r["disk_fraction"] = json!(disk);
}

/// Summary metrics: name → where in a run record.
fn metrics(phases: &Map<String, Value>) -> Vec<(String, String)> {
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
    for k in phases.keys().map(String::as_str).chain(["wall"]) {
        m.push((
            format!("phase_ms_per_token.{k}"),
            format!("/decode_phases_ms_per_token/{k}"),
        ));
    }
    m
}

/// Median, min, max and count of each metric over `runs` (nulls skipped).
pub(super) fn summarize(runs: &[Value], phases: &Map<String, Value>) -> Value {
    let mut out = Map::new();
    for (name, ptr) in metrics(phases) {
        let mut v: Vec<f64> = runs
            .iter()
            .filter_map(|r| r.pointer(&ptr).and_then(Value::as_f64))
            .collect();
        v.sort_by(f64::total_cmp);
        let s = if v.is_empty() {
            Value::Null
        } else {
            let median = if v.len() % 2 == 1 {
                v[v.len() / 2]
            } else {
                (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
            };
            json!({"median": median, "min": v[0], "max": v[v.len() - 1], "n": v.len()})
        };
        out.insert(name, s);
    }
    let cold: Vec<&Value> = runs
        .iter()
        .filter_map(|r| {
            r["cold"]["cold_proven"]
                .as_bool()
                .map(|_| &r["cold"]["cold_proven"])
        })
        .collect();
    if !cold.is_empty() {
        out.insert(
            "cold_proven_runs".into(),
            json!(cold.iter().filter(|v| v.as_bool() == Some(true)).count()),
        );
    }
    Value::Object(out)
}

/// Prints the report as a table: machine and rooflines, then each config's medians.
pub fn print_table(r: &Value) {
    let f = |v: &Value| v.as_f64();
    println!(
        "{} | commit {} | {} | {} cores, threads {}",
        r["date"].as_str().unwrap_or("?"),
        r["commit"].as_str().unwrap_or("?"),
        r["cpu"].as_str().unwrap_or("?"),
        r["cores"],
        r["threads"]
    );
    let dram: Vec<String> = r["bandwidth"]["dram"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| {
            format!(
                "{} {:.1}",
                d["when"].as_str().unwrap_or("?"),
                f(&d["gbps"]).unwrap_or(0.0)
            )
        })
        .collect();
    println!("DRAM read GB/s: {}", dram.join(", "));
    for s in r["bandwidth"]["storage"].as_array().into_iter().flatten() {
        println!(
            "storage read GB/s: {} ({}) {}",
            f(&s["gbps"]).map_or("n/a".into(), |g| format!("{g:.2}")),
            s["mode"].as_str().unwrap_or("?"),
            s["file"].as_str().unwrap_or("?")
        );
    }
    println!(
        "prompt {} tokens, {} new tokens, {} runs/config, cold {}",
        r["prompt_tokens"], r["new_tokens"], r["runs_per_config"], r["cold"]
    );
    let cell =
        |s: &Value, scale: f64, prec: usize| match (f(&s["median"]), f(&s["min"]), f(&s["max"])) {
            (Some(m), Some(lo), Some(hi)) => format!(
                "{:.p$} [{:.p$}-{:.p$}]",
                m * scale,
                lo * scale,
                hi * scale,
                p = prec
            ),
            _ => "-".into(),
        };
    let rows: [(&str, &str, f64, usize); 10] = [
        ("TTFT s", "ttft_s", 1.0, 3),
        ("prefill tok/s", "prefill_tokens_per_s", 1.0, 1),
        ("decode tok/s", "decode_tokens_per_s", 1.0, 2),
        (
            "hostd RSS GiB",
            "hostd_vm_hwm_bytes",
            1.0 / (1u64 << 30) as f64,
            2,
        ),
        (
            "expertd RSS GiB",
            "expertd_vm_hwm_bytes",
            1.0 / (1u64 << 30) as f64,
            2,
        ),
        ("disk MB/token", "disk_bytes_per_decode_token", 1e-6, 2),
        ("weights MB/token", "weight_bytes_per_decode_token", 1e-6, 1),
        ("hit rate", "hit_rate", 1.0, 3),
        ("DRAM fraction", "dram_fraction", 1.0, 3),
        ("disk fraction", "disk_fraction", 1.0, 3),
    ];
    let phases: Vec<&str> = r["decode_phase_notes"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, _)| k.as_str())
        .chain(["wall"])
        .collect();
    for c in r["configs"].as_array().into_iter().flatten() {
        let s = &c["summary"];
        let flags = c["flags"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" ");
        println!(
            "\n== {} ({flags}) — median [min-max]",
            c["name"].as_str().unwrap_or("?")
        );
        for (label, key, scale, prec) in rows {
            println!("  {label:<18} {}", cell(&s[key], scale, prec));
        }
        println!("  decode phases, ms/token (median [min-max]):");
        for k in &phases {
            println!(
                "    {k:<22} {}",
                cell(&s[format!("phase_ms_per_token.{k}")], 1.0, 3)
            );
        }
        if let Some(n) = s["cold_proven_runs"].as_u64() {
            println!(
                "  cold proven in {n} of {} runs",
                c["runs"].as_array().map_or(0, Vec::len)
            );
            for run in c["runs"].as_array().into_iter().flatten() {
                println!(
                    "    run {}: {}",
                    run["round"].as_str().unwrap_or("?"),
                    run["cold"]["reason"].as_str().unwrap_or("?")
                );
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
    fn summaries_take_the_phases_the_children_reported() {
        let run = |tps: f64, attn: f64| {
            json!({"decode_tokens_per_s": tps, "decode_phases_ms_per_token": {"attention": attn, "wall": 10.0},
                   "profile": {"decode_phase_notes": {"attention": "attention core"}}})
        };
        let runs = [run(1.0, 3.0), run(3.0, 5.0), run(2.0, 4.0)];
        let phases = phase_notes(&runs);
        assert_eq!(phases.keys().collect::<Vec<_>>(), ["attention"]);
        let s = summarize(&runs, &phases);
        assert_eq!(
            s["decode_tokens_per_s"],
            json!({"median": 2.0, "min": 1.0, "max": 3.0, "n": 3})
        );
        assert_eq!(s["phase_ms_per_token.attention"]["median"], json!(4.0));
        assert_eq!(s["phase_ms_per_token.wall"]["n"], json!(3));
        assert!(s["ttft_s"].is_null(), "no run reported it");
    }

    #[test]
    fn fractions_divide_by_the_rooflines() {
        let mut r = json!({"decode_tokens_per_s": 10.0, "weight_bytes_per_decode_token": 1e9, "disk_bytes_per_decode_token": 1e8});
        add_fractions(&mut r, 20.0, Some(2.0));
        assert_eq!(
            (r["dram_fraction"].as_f64(), r["disk_fraction"].as_f64()),
            (Some(0.5), Some(0.5))
        );
        add_fractions(&mut r, 0.0, None);
        assert!(r["dram_fraction"].is_null() && r["disk_fraction"].is_null());
    }
}
