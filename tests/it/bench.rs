//! `hostd bench` smoke test on the tiny fixture: two interleaved runs of one config, a drift
//! check, and every phase field present (a benchmark's plumbing, not its numbers).

use tests::{hostd, model_dir, workspace_bin};

#[test]
fn bench_runs_fresh_processes_and_reports_phases() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("bench.json");
    let model = model_dir("tiny");
    let args = [
        "bench",
        "--model",
        model.to_str().expect("utf-8"),
        "--runs",
        "2",
        "--prompt-tokens",
        "8",
        "--new-tokens",
        "4",
        "--bandwidth-bytes",
        "67108864",
        "--odirect-bytes",
        "1048576",
        "--json",
        out.to_str().expect("utf-8"),
    ];
    let o = hostd(&args);
    assert!(o.status.success(), "hostd bench failed: {}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).expect("json written")).expect("valid JSON");
    // The report names the code that ran by the binary's hash, not only by the checkout's HEAD.
    let sum = std::process::Command::new("sha256sum").arg(workspace_bin("hostd")).output().expect("sha256sum");
    let sum = String::from_utf8_lossy(&sum.stdout);
    assert_eq!(r["binary"]["sha256"].as_str(), sum.split_whitespace().next(), "{}", r["binary"]);
    let c = &r["configs"][0];
    assert_eq!(c["name"], "default");
    let runs = c["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2);
    for run in runs.iter().chain([&r["drift_check"]["run"]]) {
        assert!(run["decode_tokens_per_s"].as_f64().expect("decode tok/s") > 0.0, "{run}");
        assert!(run["ttft_s"].as_f64().expect("ttft") > 0.0);
        let phases = &run["decode_phases_ms_per_token"];
        for k in ["attention", "deltanet", "router", "shared_expert", "routed_expert_compute", "expert_io_wait", "ipc", "lm_head", "sampling", "other", "wall"] {
            assert!(phases[k].is_number(), "phase {k} missing: {phases}");
        }
        assert!(run["hostd_vm_hwm_bytes"].as_u64().expect("rss") > 0);
    }
    assert!(r["drift_check"]["decode_deviation_from_first_config_median"].is_number());
    assert_eq!(c["summary"]["decode_tokens_per_s"]["n"], 2);
}
