//! `hostd inspect` against the oracle's independently computed checkpoint facts, and the real
//! Qwen3.6-35B-A3B config without weights.

use tests::{hostd, model_dir, presets, reference, workspace_root};

fn inspect_json(args: &[&str]) -> serde_json::Value {
    let out = hostd(args);
    assert!(
        out.status.success(),
        "hostd {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("inspect --json prints JSON")
}

#[test]
fn inspect_matches_oracle_facts_on_every_fixture() {
    for preset in presets() {
        let dir = model_dir(&preset);
        let got = inspect_json(&["inspect", "--json", dir.to_str().expect("utf-8 path")]);
        let facts = &reference(&preset)["checkpoint_facts"];
        for key in [
            "num_layers",
            "layer_types",
            "num_experts",
            "experts_per_token",
            "hidden_size",
            "vocab_size",
            "expert_bytes_bf16",
            "routed_expert_bytes_bf16",
            "dense_bytes_bf16",
            "text_tensor_count",
        ] {
            assert_eq!(got[key], facts[key], "{preset}: {key}");
        }
        let shards: Vec<&str> = got["shards"]
            .as_array()
            .expect("shards")
            .iter()
            .map(|s| s["file"].as_str().expect("file"))
            .collect();
        let want: Vec<&str> = facts["shards"]
            .as_array()
            .expect("facts shards")
            .iter()
            .map(|s| s.as_str().expect("str"))
            .collect();
        assert_eq!(shards, want, "{preset}: shard list");
        // The oracle writes bf16 with F32 A_log / norm, exactly the release layout, so the
        // on-disk bytes equal the config arithmetic.
        assert_eq!(
            got["dense_bytes_on_disk"], facts["dense_bytes_bf16"],
            "{preset}: dense bytes on disk"
        );
        assert_eq!(
            got["routed_expert_bytes_on_disk"], facts["routed_expert_bytes_bf16"],
            "{preset}: routed bytes on disk"
        );
        assert!(
            got["expert_layouts"]
                .as_array()
                .expect("layouts")
                .iter()
                .all(|l| l == "fused"),
            "{preset}"
        );
        assert!(
            got["unexpected_tensors"]
                .as_array()
                .expect("list")
                .is_empty(),
            "{preset}: {}",
            got["unexpected_tensors"]
        );
        let skipped = &got["skipped_tensors"];
        assert!(
            skipped["mtp"].as_u64().unwrap_or(0) > 0 && skipped["vision"].as_u64().unwrap_or(0) > 0,
            "{preset}: {skipped}"
        );
    }
}

#[test]
fn real_config_reports_6_mib_experts_and_60_gib_routed() {
    let cfg = workspace_root().join("tests/fixtures/configs/qwen3.6-35b-a3b.config.json");
    let got = inspect_json(&[
        "inspect",
        "--config-only",
        "--json",
        cfg.to_str().expect("utf-8 path"),
    ]);
    assert_eq!(got["num_layers"], 40);
    assert_eq!(got["num_experts"], 256);
    assert_eq!(got["experts_per_token"], 8);
    assert_eq!(got["expert_bytes_bf16"], 6u64 << 20);
    assert_eq!(got["routed_expert_bytes_bf16"], 60u64 << 30);
    assert_eq!(got["dense_bytes_bf16"], 4_896_721_536u64);
    assert_eq!(got["kv_bytes_per_token"], 20_480);
    assert_eq!(
        got["linear_state_bytes_per_sequence"],
        62_914_560u64 + 1_474_560
    );
    let types = got["layer_types"].as_array().expect("layer_types");
    assert_eq!(types.iter().filter(|t| *t == "full_attention").count(), 10);
    assert_eq!(types[3], "full_attention");
    assert_eq!(types[0], "linear_attention");
}

#[test]
fn human_report_names_the_key_figures() {
    let dir = model_dir("tiny");
    let out = hostd(&["inspect", dir.to_str().expect("utf-8 path")]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("utf-8");
    for needle in [
        "layers",
        "routed experts",
        "decode/token",
        "KV/token",
        "state/sequence",
        "shard",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}
