//! Tests of the plan's arithmetic: dense sizes against the op scopes' measured count, the
//! prediction's limits, where memory puts each format, the trained curve and the route trace.

use super::hits::{self, Workload};
use super::*;

fn real_config() -> TextConfig {
    let json = include_str!("../../../tests/fixtures/configs/qwen3.6-35b-a3b.config.json");
    shared::config::parse_config(json)
        .expect("real config")
        .text
}

#[test]
fn int8_dense_bytes_match_what_the_op_scopes_count() {
    // The 40-layer benchmark checkpoint: the real shapes with 32 experts per layer.
    let mut cfg = real_config();
    cfg.num_experts = 32;
    let (resident, per_token) = dense_bytes(&cfg, DenseFormat::Int8);
    // `hostd profile` on it counts 2,950.0 MB per decode token, of which 40 · 8 INT8 experts
    // are 1,010.6 MB: 1,939.4 MB dense (`docs/results/headline40-intel.md`). Within 1%.
    let mb = per_token as f64 / 1e6;
    assert!((mb / 1_939.4 - 1.0).abs() < 0.01, "dense per token {mb} MB");
    // The embedding table (1.02 GB BF16) stays as stored and is resident but not read per token.
    assert!(resident > per_token + 1_000_000_000);
    // --dense gguf holds its k-quant projections in fewer bytes than INT8: counted as INT8 (an
    // upper bound), never at BF16 size (which would shrink a private expertd's cache).
    assert_eq!(dense_bytes(&cfg, DenseFormat::Gguf), (resident, per_token));
    let (bf16_resident, _) = dense_bytes(&cfg, DenseFormat::Bf16);
    assert_eq!(
        bf16_resident,
        ModelSizes::from_config(&cfg).dense_bytes_bf16
    );
}

#[test]
fn the_real_shape_has_the_expert_sizes_the_readme_states() {
    let facts = ModelFacts::from_config(&real_config()).expect("facts");
    let slot = |name: &str| {
        facts
            .formats
            .iter()
            .find(|f| f.format == name)
            .unwrap()
            .slot_bytes
    };
    // 3.03 MiB (INT8), 1.69 MiB (q4k), 1.95 MiB (q4k-q6k), 4 KiB-aligned.
    for (name, mib) in [("int8", 3.03), ("q4k", 1.69), ("q4k-q6k", 1.95)] {
        let got = slot(name) as f64 / f64::from(1 << 20);
        assert!((got - mib).abs() < 0.01, "{name}: {got} MiB");
        assert_eq!(slot(name) % 4096, 0);
    }
    let int8 = &facts.formats[0];
    assert_eq!(int8.expert_bytes_per_token, 40 * 8 * int8.slot_bytes);
}

#[test]
fn resident_speed_is_the_dram_roofline_and_streaming_is_bounded_by_the_disk() {
    let rates = Rates {
        dram_bps: 30e9,
        disk_bps: Some((1e9, 2e9, 4e9)),
    };
    let r = predict(3_000_000_000, 0.0, rates).expect("resident needs no disk figure");
    assert!((r.point - DRAM_EFFICIENCY.1 * 10.0).abs() < 1e-9);
    assert!(r.low < r.point && r.point < r.high);
    assert_eq!(r.disk_s, 0.0);
    // 1 GB of misses at 2 GB/s (1–4 GB/s over the samples): the point is disk-bound with half
    // the compute overlapped, the range runs from the slowest sample without overlap to the
    // fastest with full overlap.
    let s = predict(3_000_000_000, 1e9, rates).expect("disk measured");
    let t_c = 3.0 / (DRAM_EFFICIENCY.1 * 30.0);
    assert!((s.point - 1.0 / (0.5 + 0.5 * t_c)).abs() < 1e-9, "{s:?}");
    assert!((s.high - 4.0).abs() < 1e-9, "{s:?}");
    assert!(s.low < s.point && s.point < s.high);
    assert!((s.low - 1.0 / (1.0 + 3.0 / (DRAM_EFFICIENCY.0 * 30.0))).abs() < 1e-9);
    let unmeasured = Rates {
        disk_bps: None,
        ..rates
    };
    assert!(predict(3_000_000_000, 1e9, unmeasured).is_none());
    assert!(predict(3_000_000_000, 0.0, unmeasured).is_some());
}

#[test]
fn memory_decides_resident_streaming_or_nothing() {
    const GIB: u64 = 1 << 30;
    let (host, container, daemon) = (3 * GIB, 4 * GIB, 300 << 20);
    assert_eq!(
        fit(8 * GIB, host, container, daemon),
        ("resident", container)
    );
    assert_eq!(fit(8 * GIB - 1, host, container, daemon).0, "streaming");
    let (mode, cache) = fit(6 * GIB, host, container, daemon);
    assert_eq!(mode, "streaming");
    assert_eq!(cache, 6 * GIB - host - daemon - HEADROOM_BYTES);
    // Less than the dense weights and a minimal cache: nothing.
    assert_eq!(fit(2 * GIB, host, container, daemon), ("does-not-fit", 0));
    let edge = host + daemon + HEADROOM_BYTES + MIN_CACHE_BYTES;
    assert_eq!(fit(edge, host, container, daemon).0, "streaming");
    assert_eq!(fit(edge - 1, host, container, daemon).0, "does-not-fit");
    // expertd's own estimate: 96 MiB and two lanes of min(experts, 32) transient slots.
    assert_eq!(expertd_overhead(256, 1 << 20), (96 + 64) << 20);
    assert_eq!(expertd_overhead(8, 1 << 20), (96 + 16) << 20);
}

#[test]
fn hostd_memory_leaves_out_the_mapped_embedding_table() {
    let mut cfg = real_config();
    cfg.num_experts = 32;
    let facts = ModelFacts::from_config(&cfg).expect("facts");
    // hostd's peak RSS through a private expertd at 40 layers, 128 + 32 tokens: 3.108 GiB
    // (`docs/results/plan40/streaming.json`); the plan's figure for that context within 5%.
    let planned = facts.host_bytes(160) as f64 / (1u64 << 30) as f64;
    assert!(
        (planned / 3.108 - 1.0).abs() < 0.05,
        "planned {planned} GiB"
    );
    assert_eq!(facts.embedding_bytes, 248_320 * 2048 * 2);
    // A private daemon's default budget leaves hostd the same, per dense format: INT8 about
    // 1.8 GiB of projections less than BF16's mapped 3.6 GiB (both without the embedding).
    let int8 = host_weight_bytes(&cfg, DenseFormat::Int8);
    let bf16 = host_weight_bytes(&cfg, DenseFormat::Bf16);
    assert_eq!(int8, facts.dense_resident_bytes + HOST_RUNTIME_BYTES);
    let sizes = ModelSizes::from_config(&cfg);
    assert_eq!(
        bf16,
        sizes.dense_bytes_bf16 - sizes.embedding_bytes_bf16 + HOST_RUNTIME_BYTES
    );
    assert!(bf16 > int8 + (1_700 << 20), "{bf16} vs {int8}");
}

#[test]
fn the_trained_curve_passes_through_its_points_and_rises() {
    for (x, y) in hits::TRAINED_CURVE {
        assert!((hits::trained_hit_rate(x) - y).abs() < 1e-12);
    }
    let mut last = -1.0;
    for i in 0..=100 {
        let h = hits::trained_hit_rate(f64::from(i) / 100.0);
        assert!(h >= last);
        last = h;
    }
    assert_eq!(hits::trained_hit_rate(2.0), 1.0);
    assert!((hits::trained_hit_rate(0.03) - 0.183).abs() < 1e-9);
}

#[test]
fn the_warm_up_trace_is_a_prefix_of_the_measured_one() {
    let w = Workload {
        layers: 3,
        experts: 16,
        top_k: 4,
        prompt_tokens: 40,
        prefill_chunk: 16,
        warmup_steps: 2,
        decode_steps: 5,
        seed: 7,
    };
    let (mut short, mut long) = (Vec::new(), Vec::new());
    hits::write_trace(&mut short, &w, false).unwrap();
    hits::write_trace(&mut long, &w, true).unwrap();
    assert!(long.starts_with(&short) && long.len() > short.len());
    let text = String::from_utf8(long).unwrap();
    let acquires: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| v["ev"] == "acquire")
        .collect();
    // 3 prompt chunks and 7 decode steps, each one call per layer.
    assert_eq!(acquires.len(), (3 + 7) * 3);
    for a in &acquires[9..] {
        let e: Vec<u64> = a["experts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        assert_eq!(e.len(), 4);
        assert!(e.windows(2).all(|p| p[0] < p[1]) && e[3] < 16, "{e:?}");
    }
}

#[test]
fn the_most_exact_resident_format_wins_else_the_fastest_streaming_one() {
    let p = |format: &'static str, mode: &'static str, point: f64| FormatPlan {
        format,
        mode,
        cache_bytes: 1,
        cache_share: 1.0,
        hit_rates: Vec::new(),
        decode_tok_s: vec![Some(TokPerSec {
            low: point,
            point,
            high: point,
            compute_s: 0.0,
            disk_s: 0.0,
        })],
        disk_bytes_per_token: vec![0.0],
    };
    let all = [
        p("int8", "streaming", 2.0),
        p("q4k", "resident", 9.0),
        p("q4k-q6k", "resident", 8.0),
    ];
    assert_eq!(recommend(&all).unwrap().format, "q4k-q6k");
    let streaming = [
        p("int8", "streaming", 2.0),
        p("q4k", "streaming", 3.0),
        p("q4k-q6k", "streaming", 2.5),
    ];
    assert_eq!(recommend(&streaming).unwrap().format, "q4k");
    let none = [p("int8", "does-not-fit", 0.0)];
    assert!(recommend(&none).is_none());
    // The pessimistic point decides, not the first one.
    let mut a = p("int8", "streaming", 5.0);
    a.decode_tok_s
        .push(a.decode_tok_s[0].map(|t| TokPerSec { point: 1.0, ..t }));
    let b = p("q4k", "streaming", 2.0);
    assert_eq!(recommend(&[a, b]).unwrap().format, "q4k");
    // Without a disk figure: the fewest bytes read per token.
    let mut c = p("int8", "streaming", 0.0);
    c.decode_tok_s = vec![None];
    c.disk_bytes_per_token = vec![9e8];
    let mut d = p("q4k", "streaming", 0.0);
    d.decode_tok_s = vec![None];
    d.disk_bytes_per_token = vec![5e8];
    let mut e = p("q4k-q6k", "streaming", 0.0);
    e.decode_tok_s = vec![None];
    e.disk_bytes_per_token = vec![6e8];
    assert_eq!(recommend(&[c, d, e]).unwrap().format, "q4k");
}
