//! `hostd synth`: synthetic checkpoints validate, are deterministic, inspect and run; the
//! realdim preset's plan has the release's per-layer shapes (checked without writing weights).

use shared::checkpoint::Checkpoint;
use shared::config::LayerType;
use shared::tensor_spec::{self, ExpertLayout, PREFIX_RELEASE};
use sluice_tools::synth::{self, Preset, SHARD_CAP_BYTES};
use std::collections::BTreeMap;
use std::path::Path;
use tests::{hostd, workspace_root};

/// Runs `hostd synth ARGS… --out DIR` and asserts success.
fn synth(args: &[&str], out: &Path) {
    let mut all = vec!["synth"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--out", out.to_str().expect("utf-8 path")]);
    let o = hostd(&all);
    assert!(
        o.status.success(),
        "hostd {all:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Every file of a flat directory, name → bytes.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| {
            let e = e.expect("entry");
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).expect("read file"),
            )
        })
        .collect()
}

#[test]
fn tiny_validates_with_fused_experts_split_across_shards() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("tiny");
    synth(&["--preset", "tiny"], &dir);
    let ckpt = Checkpoint::open(&dir).expect("synthetic checkpoint validates");
    let cfg = &ckpt.config.text;
    assert_eq!(ckpt.prefix, PREFIX_RELEASE);
    assert!(ckpt.shards.len() >= 2);
    assert!(ckpt.unexpected.is_empty(), "{:?}", ckpt.unexpected);
    assert!(
        ckpt.expert_layouts
            .iter()
            .all(|l| *l == ExpertLayout::Fused)
    );
    for layer in 0..cfg.num_layers {
        let gu = ckpt
            .tensor(&tensor_spec::fused_gate_up_name(PREFIX_RELEASE, layer))
            .expect("gate_up");
        let down = ckpt
            .tensor(&tensor_spec::fused_down_name(PREFIX_RELEASE, layer))
            .expect("down");
        assert_ne!(
            gu.shard, down.shard,
            "layer {layer}: gate_up and down in different shards"
        );
    }
    let a_log = ckpt
        .tensor(&format!("{PREFIX_RELEASE}layers.0.linear_attn.A_log"))
        .expect("A_log");
    assert_eq!(a_log.loc.dtype, safetensors::Dtype::F32);
    let norm = ckpt
        .tensor(&format!("{PREFIX_RELEASE}layers.0.linear_attn.norm.weight"))
        .expect("norm");
    assert_eq!(norm.loc.dtype, safetensors::Dtype::F32);
    let q = ckpt
        .tensor(&format!("{PREFIX_RELEASE}layers.3.self_attn.q_proj.weight"))
        .expect("q_proj");
    assert_eq!(q.loc.dtype, safetensors::Dtype::BF16);
    assert_eq!(cfg.layer_types[3], LayerType::FullAttention);
    // The side files name the renumbered specials (1000 ranks → <|endoftext|> 1000, <|im_end|> 1002).
    assert_eq!(cfg.eos_token_ids, vec![1000]);
    let generation: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("generation_config.json")).expect("read"))
            .expect("json");
    assert_eq!(generation["eos_token_id"], serde_json::json!([1002, 1000]));
    let tok_cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("tokenizer_config.json")).expect("read"))
            .expect("json");
    assert_eq!(
        tok_cfg["added_tokens_decoder"]["1002"]["content"],
        "<|im_end|>"
    );
    let tok = hostd::tokenizer::Tokenizer::from_model_dir(&dir).expect("tokenizer loads");
    assert_eq!(tok.im_end_id().expect("im_end"), 1002);
    // Every stored value is exactly representable in bf16 (also the F32 tensors).
    let shard = tests::read_shard(&ckpt.shards[a_log.shard].path);
    for name in [
        format!("{PREFIX_RELEASE}layers.0.linear_attn.A_log"),
        format!("{PREFIX_RELEASE}layers.0.linear_attn.norm.weight"),
    ] {
        for c in shard[&name].data.chunks_exact(4) {
            let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            assert!(
                v.is_finite() && half::bf16::from_f32(v).to_f32() == v,
                "{name}: {v}"
            );
        }
    }
}

#[test]
fn same_seed_is_byte_identical_and_seeds_differ() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (a, b, c) = (
        tmp.path().join("a"),
        tmp.path().join("b"),
        tmp.path().join("c"),
    );
    synth(&["--preset", "tiny", "--seed", "7"], &a);
    synth(&["--preset", "tiny", "--seed", "7"], &b);
    synth(&["--preset", "tiny", "--seed", "8"], &c);
    let (fa, fb, fc) = (files(&a), files(&b), files(&c));
    assert_eq!(fa, fb, "same preset and seed give identical files");
    assert_eq!(fa.keys().collect::<Vec<_>>(), fc.keys().collect::<Vec<_>>());
    for (name, bytes) in &fa {
        if name.ends_with(".safetensors") {
            assert_ne!(bytes, &fc[name], "{name}: another seed gives other weights");
        } else {
            assert_eq!(
                bytes, &fc[name],
                "{name}: only the weights depend on the seed"
            );
        }
    }
}

#[test]
fn existing_output_needs_force_and_bad_flags_fail() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("m");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::write(dir.join("keep.txt"), "x").expect("write");
    let out = dir.to_str().expect("utf-8");
    let o = hostd(&["synth", "--preset", "tiny", "--out", out]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--force"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        dir.join("keep.txt").exists(),
        "refused runs leave the directory alone"
    );
    synth(&["--preset", "tiny", "--force"], &dir);
    assert!(!dir.join("keep.txt").exists() && dir.join("config.json").exists());
    let leftovers: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("read")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "no temporary directory is left behind"
    );

    let o = hostd(&[
        "synth",
        "--preset",
        "tiny",
        "--layers",
        "3",
        "--out",
        tmp.path().join("x").to_str().expect("utf-8"),
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("full-attention"));
    let asset = workspace_root().join("tools/assets/qwen36-ranks-1000.tokenizer.json");
    let o = hostd(&[
        "synth",
        "--preset",
        "tiny",
        "--tokenizer",
        asset.to_str().expect("utf-8"),
        "--out",
        tmp.path().join("y").to_str().expect("utf-8"),
    ]);
    assert!(
        !o.status.success(),
        "--tokenizer is for the real vocabulary only"
    );
    assert!(!tmp.path().join("y").exists() && !tmp.path().join("x").exists());
}

#[test]
fn inspect_reports_the_preset_dimensions() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("small");
    synth(&["--preset", "small", "--layers", "4"], &dir);
    let o = hostd(&["inspect", "--json", dir.to_str().expect("utf-8")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let d = Preset::Small.dims();
    assert_eq!(r["num_layers"], 4);
    assert_eq!(r["n_full_attention_layers"], 1);
    assert_eq!(r["hidden_size"], d.hidden);
    assert_eq!(r["vocab_size"], d.vocab_size);
    assert_eq!(r["num_experts"], d.experts);
    assert_eq!(r["experts_per_token"], d.top_k);
    assert_eq!(r["moe_intermediate_size"], d.moe_inter);
    assert_eq!(r["attention"]["n_q_heads"], d.n_q_heads);
    assert_eq!(r["attention"]["head_dim"], d.head_dim);
    assert_eq!(r["linear_attention"]["n_v_heads"], d.lin_v_heads);
    assert_eq!(
        r["dense_bytes_on_disk"], r["dense_bytes_bf16"],
        "release dtypes: disk bytes equal the arithmetic"
    );
    assert_eq!(
        r["routed_expert_bytes_on_disk"],
        r["routed_expert_bytes_bf16"]
    );
    assert!(
        r["expert_layouts"]
            .as_array()
            .expect("layouts")
            .iter()
            .all(|l| l == "fused")
    );
    assert!(r["unexpected_tensors"].as_array().expect("list").is_empty());
}

#[test]
fn run_generates_on_a_synthetic_model() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("tiny");
    synth(&["--preset", "tiny", "--seed", "3"], &dir);
    let o = hostd(&[
        "run",
        "--model",
        dir.to_str().expect("utf-8"),
        "--prompt",
        "hi",
        "--max-new-tokens",
        "8",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let n = r["new_tokens"].as_u64().expect("new_tokens");
    assert!((1..=8).contains(&n), "{r}");
    assert_eq!(r["generated_ids"].as_array().expect("ids").len() as u64, n);
    for key in ["ttft_s", "prefill_tokens_per_s"] {
        let v = r[key].as_f64().unwrap_or(f64::NAN);
        assert!(v.is_finite() && v > 0.0, "{key} = {v}");
    }
    assert!(
        r["decode_tokens_per_s"].is_null()
            || r["decode_tokens_per_s"]
                .as_f64()
                .is_some_and(f64::is_finite)
    );
}

#[test]
fn realdim_plan_has_the_release_per_layer_shapes() {
    let p = synth::plan(Preset::Realdim, Some(4), None).expect("realdim plan");
    let real_text = std::fs::read_to_string(
        workspace_root().join("tests/fixtures/configs/qwen3.6-35b-a3b.config.json"),
    )
    .expect("real config");
    let real = shared::config::parse_config(&real_text)
        .expect("real config parses")
        .text;
    let cfg = &p.config;
    assert_eq!(cfg.num_layers, 4);
    assert_eq!(cfg.layer_types, real.layer_types[..4].to_vec());
    // Everything but the layer count equals the release.
    assert_eq!(
        shared::config::TextConfig {
            num_layers: 40,
            layer_types: real.layer_types.clone(),
            ..cfg.clone()
        },
        real
    );
    // Every tensor of layers 0..4, the embeddings, final norm and lm_head: the release's shape and dtype.
    let mut want: BTreeMap<String, (Vec<usize>, safetensors::Dtype)> = BTreeMap::new();
    for t in tensor_spec::dense_tensors(&real, PREFIX_RELEASE) {
        let layer = t
            .name
            .strip_prefix("model.language_model.layers.")
            .and_then(|r| r.split('.').next()?.parse::<usize>().ok());
        if layer.is_none_or(|l| l < 4) {
            want.insert(t.name, (t.shape, t.canonical));
        }
    }
    for l in 0..4 {
        for t in tensor_spec::expert_tensors(&real, PREFIX_RELEASE, l, ExpertLayout::Fused) {
            want.insert(t.name, (t.shape, t.canonical));
        }
    }
    let got: BTreeMap<String, (Vec<usize>, safetensors::Dtype)> = p
        .shards
        .iter()
        .flat_map(|s| &s.tensors)
        .map(|t| (t.name.clone(), (t.shape.clone(), t.dtype)))
        .collect();
    assert_eq!(got, want);
    assert_eq!(
        got.len(),
        3 * 18 + 15 + 3,
        "3 DeltaNet layers × 18 + 1 attention layer × 15 + 3 globals"
    );
    let gate_up = &got[&tensor_spec::fused_gate_up_name(PREFIX_RELEASE, 0)].0;
    assert_eq!(gate_up, &vec![256, 1024, 2048]);
    // Shards: capped, the fused pair of every layer split, sizes add up to the arithmetic.
    for s in &p.shards {
        assert!(s.data_bytes() <= SHARD_CAP_BYTES);
    }
    for l in 0..4 {
        assert_ne!(
            p.shard_of(&tensor_spec::fused_gate_up_name(PREFIX_RELEASE, l)),
            p.shard_of(&tensor_spec::fused_down_name(PREFIX_RELEASE, l))
        );
    }
    let sizes = shared::sizes::ModelSizes::from_config(cfg);
    assert_eq!(
        p.total_data_bytes(),
        sizes.dense_bytes_bf16 + sizes.routed_expert_bytes_bf16
    );
    assert_eq!(
        p.config_json["text_config"]["max_position_embeddings"],
        262_144
    );
    assert_eq!(p.config_json["text_config"]["eos_token_id"], 248_044);
}

#[test]
fn experts_flag_sets_the_expert_count_deterministically_and_prints_the_sizes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let args = [
        "--preset",
        "small",
        "--layers",
        "4",
        "--experts",
        "8",
        "--seed",
        "5",
    ];
    let out = |dir: &Path| {
        let mut all = vec!["synth"];
        all.extend_from_slice(&args);
        all.extend_from_slice(&["--out", dir.to_str().expect("utf-8")]);
        let o = hostd(&all);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let log = out(&a);
    out(&b);
    assert_eq!(
        files(&a),
        files(&b),
        "same preset, layers, experts and seed give identical files"
    );
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(a.join("config.json")).expect("read")).expect("json");
    assert_eq!(config["text_config"]["num_experts"], 8);
    assert_eq!(
        config["text_config"]["num_experts_per_tok"],
        Preset::Small.dims().top_k,
        "top-k stays the preset's"
    );
    let o = hostd(&["inspect", "--json", a.to_str().expect("utf-8")]);
    assert!(
        o.status.success(),
        "inspect accepts it: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(
        (r["num_experts"].as_u64(), r["experts_per_token"].as_u64()),
        (Some(8), Some(4))
    );
    assert_eq!(
        r["routed_expert_bytes_on_disk"],
        r["routed_expert_bytes_bf16"]
    );

    // The printed sizes are what is written and what `expertd prepare` makes of it.
    let plan = synth::plan(Preset::Small, Some(4), Some(8)).expect("plan");
    let shard_bytes: u64 = Checkpoint::open(&a)
        .expect("validates")
        .shards
        .iter()
        .map(|s| s.file_len)
        .sum();
    assert_eq!(shard_bytes, plan.total_file_bytes());
    assert!(
        log.contains(&format!("{shard_bytes} bytes")),
        "checkpoint size printed: {log}"
    );
    let container = tmp.path().join("container");
    tests::prepare_container(&a, &container);
    let container_len = std::fs::metadata(container.join(shared::container::CONTAINER_FILE))
        .expect("container")
        .len();
    assert_eq!(
        container_len,
        plan.int8_container_bytes().expect("container size")
    );
    assert!(
        log.contains(&format!("{container_len} bytes (expertd prepare)")),
        "container size printed: {log}"
    );

    // --dry-run prints the same sizes and writes nothing.
    let dry = tmp.path().join("dry");
    let o = hostd(&[
        "synth",
        "--preset",
        "realdim",
        "--layers",
        "40",
        "--experts",
        "32",
        "--dry-run",
        "--out",
        dry.to_str().expect("utf-8"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let big = synth::plan(Preset::Realdim, Some(40), Some(32)).expect("plan");
    let dry_log = String::from_utf8_lossy(&o.stderr);
    assert!(
        dry_log.contains(&format!("{} bytes", big.total_file_bytes())),
        "{dry_log}"
    );
    assert!(
        dry_log.contains(&format!(
            "{} bytes (expertd prepare)",
            big.int8_container_bytes().expect("size")
        )),
        "{dry_log}"
    );
    assert!(!dry.exists(), "--dry-run writes nothing");

    // Fewer experts than the preset's top-k: refused with a message naming both.
    let bad = tmp.path().join("bad");
    let o = hostd(&[
        "synth",
        "--preset",
        "realdim",
        "--experts",
        "4",
        "--out",
        bad.to_str().expect("utf-8"),
    ]);
    assert!(!o.status.success());
    let msg = String::from_utf8_lossy(&o.stderr);
    assert!(
        msg.contains("--experts 4") && msg.contains("top 8"),
        "{msg}"
    );
    assert!(!bad.exists());
}
