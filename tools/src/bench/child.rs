//! One benchmark run: a fresh `hostd profile` process of one configuration, and the record the
//! report keeps of it — the child's own figures, its wall time, the load before it, and for a
//! `--cold` run the evidence that it was cold ([`cold_verdict`]).

use super::config::Config;
use super::{BenchArgs, BenchError};
use crate::probe::storage;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The largest `*.safetensors` file of the model (the storage probe for configs without a container).
fn largest_shard(model: &Path) -> Result<PathBuf, BenchError> {
    let io = |e| BenchError::Io {
        what: format!("reading {}", model.display()),
        source: e,
    };
    std::fs::read_dir(model)
        .map_err(io)?
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .max_by_key(|e| e.metadata().map_or(0, |m| m.len()))
        .map(|e| e.path())
        .ok_or_else(|| BenchError::Usage(format!("no safetensors file in {}", model.display())))
}

/// The file a config's storage probe reads: its container, else the model's largest shard.
pub(super) fn probe_file(args: &BenchArgs, c: &Config) -> Result<PathBuf, BenchError> {
    match &c.container {
        Some(dir) => Ok(dir.join(shared::container::CONTAINER_FILE)),
        None => largest_shard(&args.model),
    }
}

/// Spawns one child run, writing its report to `out`, and returns its record.
pub(super) fn one_run(
    args: &BenchArgs,
    c: &Config,
    label: &str,
    out: &Path,
) -> Result<Value, BenchError> {
    if args.cold
        && c.flags
            .iter()
            .any(|f| f == "--expertd" || f.starts_with("--expertd="))
    {
        return Err(BenchError::Usage(format!(
            "config {}: --cold needs a private expertd per run; a running daemon (--expertd URI) keeps its cache across the page-cache drop",
            c.name
        )));
    }
    let loadavg_before = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.trim().to_string());
    let drop = args.cold.then(storage::drop_caches);
    // A cold run's own storage probe, after the drop and just before the child starts (O_DIRECT:
    // it leaves the page cache as the drop left it).
    let disk_probe = match args.cold && args.odirect_bytes > 0 {
        true => storage::read_bandwidth(
            &probe_file(args, c)?,
            args.odirect_bytes,
            args.odirect_readers,
        ),
        false => Value::Null,
    };
    let mut cmd = Command::new(&c.exe);
    cmd.arg("profile")
        .arg("--model")
        .arg(&args.model)
        .args([
            "--prompt-tokens",
            &args.prompt_tokens.to_string(),
            "--decode-steps",
            &args.new_tokens.to_string(),
        ])
        .args(["--bandwidth-bytes", "0", "--out"])
        .arg(out);
    if let Some(chunk) = args.prefill_chunk {
        cmd.args(["--prefill-chunk", &chunk.to_string()]);
    }
    if let Some(t) = args.threads.filter(|_| {
        !c.flags
            .iter()
            .any(|f| f == "--threads" || f.starts_with("--threads="))
    }) {
        cmd.args(["--threads", &t.to_string()]);
    }
    if args.cold {
        cmd.arg("--no-warmup");
    }
    cmd.envs(c.env.iter().map(|(k, v)| (k, v)))
        .args(&c.flags)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let t = Instant::now();
    let status = cmd.status().map_err(|e| BenchError::Io {
        what: format!("starting {}", c.exe.display()),
        source: e,
    })?;
    let child_wall_s = t.elapsed().as_secs_f64();
    if !status.success() {
        return Err(BenchError::Child {
            config: c.name.clone(),
            round: label.to_string(),
            flags: c.flags.join(" "),
            status,
        });
    }
    let bytes = std::fs::read(out).map_err(|e| BenchError::Io {
        what: format!("reading {}", out.display()),
        source: e,
    })?;
    let p: Value = serde_json::from_slice(&bytes).map_err(|e| BenchError::Report {
        path: out.to_path_buf(),
        source: e,
    })?;
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
            json!({"requested": true, "drop_caches": d.as_ref().map_or_else(Clone::clone, |()| "ok".into()), "cold_proven": proven, "reason": reason})
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
        return (
            false,
            format!(
                "page cache not dropped ({err}): dense weights, and experts unless read with O_DIRECT, may have been cached"
            ),
        );
    }
    if e.hostd_reads.is_none() && e.expertd_reads.is_none() {
        return (
            false,
            "/proc/PID/io read_bytes unreadable: no evidence of physical reads".into(),
        );
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
                    format!(
                        "expertd's physical decode reads ({phys:?} bytes) do not cover its cache's miss reads ({logical:?} bytes): some misses were served from memory"
                    ),
                );
            }
        }
    }
    (
        true,
        format!(
            "page cache dropped before the run; {total} bytes read from storage (hostd {:?}, expertd {:?})",
            e.hostd_reads, e.expertd_reads
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evidence(
        hostd: Option<u64>,
        expertd: Option<u64>,
        decode: Option<(u64, u64)>,
    ) -> ColdEvidence {
        ColdEvidence {
            hostd_reads: hostd,
            expertd_reads: expertd,
            expertd_decode_reads: decode.map(|d| d.0),
            expertd_decode_logical_reads: decode.map(|d| d.1),
            has_expertd: expertd.is_some(),
        }
    }

    #[test]
    fn cold_is_claimed_only_with_evidence() {
        let ok = Ok(());
        assert!(
            cold_verdict(&ok, &evidence(Some(10), None, None)).0,
            "dropped, and reads counted"
        );
        assert!(
            !cold_verdict(&Err("EACCES".into()), &evidence(Some(10), None, None)).0,
            "drop failed"
        );
        assert!(
            !cold_verdict(&ok, &evidence(None, None, None)).0,
            "no counters"
        );
        assert!(
            !cold_verdict(&ok, &evidence(Some(0), None, None)).0,
            "nothing read"
        );
        assert!(
            cold_verdict(&ok, &evidence(Some(1), Some(100), Some((100, 100)))).0,
            "every miss a physical read"
        );
        assert!(
            !cold_verdict(&ok, &evidence(Some(1), Some(100), Some((50, 100)))).0,
            "some misses from memory"
        );
        assert!(
            !cold_verdict(&ok, &evidence(Some(1), Some(100), Some((0, 0)))).0,
            "no misses at all"
        );
    }
}
