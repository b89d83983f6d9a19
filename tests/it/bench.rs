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
    assert!(
        o.status.success(),
        "hostd bench failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out).expect("json written")).expect("valid JSON");
    // The report names the code that ran by the binary's hash, not only by the checkout's HEAD.
    let sum = std::process::Command::new("sha256sum")
        .arg(workspace_bin("hostd"))
        .output()
        .expect("sha256sum");
    let sum = String::from_utf8_lossy(&sum.stdout);
    assert_eq!(
        r["binary"]["sha256"].as_str(),
        sum.split_whitespace().next(),
        "{}",
        r["binary"]
    );
    let c = &r["configs"][0];
    assert_eq!(c["name"], "default");
    let runs = c["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2);
    for run in runs.iter().chain([&r["drift_check"]["run"]]) {
        assert!(
            run["decode_tokens_per_s"].as_f64().expect("decode tok/s") > 0.0,
            "{run}"
        );
        assert!(run["ttft_s"].as_f64().expect("ttft") > 0.0);
        let phases = &run["decode_phases_ms_per_token"];
        for k in [
            "attention",
            "deltanet",
            "router",
            "shared_expert",
            "routed_expert_compute",
            "expert_io_wait",
            "ipc",
            "lm_head",
            "sampling",
            "other",
            "wall",
        ] {
            assert!(phases[k].is_number(), "phase {k} missing: {phases}");
        }
        assert!(run["hostd_vm_hwm_bytes"].as_u64().expect("rss") > 0);
    }
    assert!(r["drift_check"]["decode_deviation_from_first_config_median"].is_number());
    assert_eq!(c["summary"]["decode_tokens_per_s"]["n"], 2);
    // The phases summarised are the ones the children reported.
    assert_eq!(
        c["summary"]["phase_ms_per_token.attention"]["n"], 2,
        "{}",
        c["summary"]
    );
    assert!(
        r["decode_phase_notes"]["attention"].is_string(),
        "{}",
        r["decode_phase_notes"]
    );
}

/// `--exe NAME=PATH` runs one config's children with another build (an A/B of two builds in one
/// interleaved run), and each config's report names the binary that ran it.
#[test]
fn bench_runs_a_config_with_the_executable_it_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("bench.json");
    // Another build: a copy with one byte appended, so its hash differs from the bench's own.
    let other = dir.path().join("hostd-other");
    let mut bytes = std::fs::read(workspace_bin("hostd")).expect("read hostd");
    bytes.push(0);
    std::fs::write(&other, bytes).expect("write copy");
    std::fs::set_permissions(&other, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let model = model_dir("tiny");
    let exe = format!("b={}", other.display());
    let args = [
        "bench",
        "--model",
        model.to_str().expect("utf-8"),
        "--runs",
        "1",
        "--prompt-tokens",
        "8",
        "--new-tokens",
        "2",
        "--bandwidth-bytes",
        "67108864",
        "--odirect-bytes",
        "0",
        "--config",
        "a: --experts bf16",
        "--config",
        "b: --experts bf16",
        "--exe",
        &exe,
        "--json",
        out.to_str().expect("utf-8"),
    ];
    let o = hostd(&args);
    assert!(
        o.status.success(),
        "hostd bench failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out).expect("json written")).expect("valid JSON");
    let (a, b) = (&r["configs"][0], &r["configs"][1]);
    assert_eq!(
        a["binary"]["path"].as_str(),
        workspace_bin("hostd").to_str()
    );
    assert_eq!(b["binary"]["path"].as_str(), other.to_str());
    assert_eq!(
        a["binary"]["sha256"], r["binary"]["sha256"],
        "a ran the bench's own build"
    );
    assert_ne!(a["binary"]["sha256"], b["binary"]["sha256"]);
    assert!(b["runs"][0]["decode_tokens_per_s"].as_f64().expect("b ran") > 0.0);
    let bad = hostd(&[
        "bench",
        "--model",
        model.to_str().expect("utf-8"),
        "--config",
        "a: --experts bf16",
        "--exe",
        "c=/x",
    ]);
    assert!(
        !bad.status.success()
            && String::from_utf8_lossy(&bad.stderr).contains("no config named \"c\""),
        "{bad:?}"
    );
}
