//! The native forward pass against the transformers fp32 reference on every oracle fixture:
//! logits at every prompt position and greedy step within 1e-3, greedy ids identical, router
//! choices identical — with the prompt prefilled in one block and fed in pieces.

use hostd::eval::{PromptEval, eval_prompt};
use hostd::load::{ExpertsKind, LoadOptions, load_model};
use hostd::model::Model;
use hostd::model::moe::Routes;
use serde_json::Value;
use tests::{max_abs_diff, model_dir, presets, read_logits, reference, reference_dir};

/// Stated tolerance of the fp32 parity check (absolute, on logits).
const LOGIT_TOL: f32 = 1e-3;
/// Stated tolerance on the renormalised routing weights (absolute).
const ROUTE_WEIGHT_TOL: f32 = 1e-4;

fn load(preset: &str) -> Model {
    let args = LoadOptions {
        model: model_dir(preset),
        experts: ExpertsKind::Bf16,
        container: None,
        threads: None,
        keep_awake: Default::default(),
        expertd: Default::default(),
        dense: Default::default(),
        host_extra_bytes: 0,
        weights_digest: false,
    };
    load_model(&args, "test").expect("fixture model loads")
}

fn route_ids(r: &Routes) -> Vec<Vec<u32>> {
    r.ids.chunks(r.top_k).map(<[u32]>::to_vec).collect()
}

fn ref_route_ids(layer: &Value) -> Vec<Vec<u32>> {
    serde_json::from_value(layer["ids"].clone()).expect("router ids")
}

/// Compares one prompt's evaluation with the reference; returns the max logit difference.
fn check_prompt(preset: &str, p: &Value, got: &PromptEval) -> f32 {
    let name = p["name"].as_str().expect("name");
    let ref_prompt = read_logits(&reference_dir(), &p["prompt_logits_file"]);
    let ref_greedy = read_logits(&reference_dir(), &p["greedy_logits_file"]);
    let want_ids: Vec<u32> = serde_json::from_value(p["greedy_ids"].clone()).expect("greedy ids");
    assert_eq!(got.greedy_ids, want_ids, "{preset}/{name}: greedy ids");
    let d_prompt = max_abs_diff(&got.prompt_logits, &ref_prompt);
    let d_greedy = max_abs_diff(&got.greedy_logits, &ref_greedy);
    assert!(
        d_prompt <= LOGIT_TOL,
        "{preset}/{name}: prompt logits differ by {d_prompt}"
    );
    assert!(
        d_greedy <= LOGIT_TOL,
        "{preset}/{name}: greedy logits differ by {d_greedy}"
    );
    for (which, ours, theirs) in [
        ("router", &got.prompt_routes, &p["router"]),
        ("greedy_router", &got.greedy_routes, &p["greedy_router"]),
    ] {
        let theirs = theirs.as_array().expect("per-layer list");
        assert_eq!(
            ours.len(),
            theirs.len(),
            "{preset}/{name}: {which} layer count"
        );
        for (layer, (o, t)) in ours.iter().zip(theirs).enumerate() {
            assert_eq!(
                route_ids(o),
                ref_route_ids(t),
                "{preset}/{name}: {which} layer {layer}"
            );
            let want: Vec<Vec<f32>> =
                serde_json::from_value(t["weights"].clone()).expect("router weights");
            let want: Vec<f32> = want.concat();
            let d = max_abs_diff(&o.weights, &want);
            assert!(
                d <= ROUTE_WEIGHT_TOL,
                "{preset}/{name}: {which} layer {layer} routing weights differ by {d}"
            );
        }
    }
    d_prompt.max(d_greedy)
}

#[test]
fn f32_parity_on_every_fixture_one_block_prefill() {
    let mut worst = 0.0f32;
    for preset in presets() {
        let model = load(&preset);
        let reference = reference(&preset);
        let prompts = reference["prompts"].as_array().expect("prompts");
        assert!(
            prompts
                .iter()
                .any(|p| p["input_ids"].as_array().expect("ids").len() > 64),
            "{preset}: a prompt longer than a DeltaNet chunk"
        );
        for p in prompts {
            let ids: Vec<u32> = serde_json::from_value(p["input_ids"].clone()).expect("ids");
            let n = p["greedy_ids"].as_array().expect("greedy").len();
            let got = eval_prompt(&model, &ids, n, usize::MAX).expect("eval");
            worst = worst.max(check_prompt(&preset, p, &got));
        }
    }
    println!(
        "max |Δlogit| vs transformers fp32 over all fixtures: {worst:.3e} (tolerance {LOGIT_TOL})"
    );
}

#[test]
fn f32_parity_holds_when_the_prompt_is_fed_in_pieces() {
    for preset in presets() {
        let model = load(&preset);
        let reference = reference(&preset);
        for p in reference["prompts"].as_array().expect("prompts") {
            let ids: Vec<u32> = serde_json::from_value(p["input_ids"].clone()).expect("ids");
            let n = p["greedy_ids"].as_array().expect("greedy").len();
            let whole = eval_prompt(&model, &ids, n, usize::MAX).expect("eval");
            // 1 = token by token (the decode path for every prompt token); 7 and 50 cross
            // block and DeltaNet-chunk boundaries at odd places.
            for chunk in [1, 7, 50] {
                let pieces = eval_prompt(&model, &ids, n, chunk).expect("eval in pieces");
                check_prompt(&preset, p, &pieces);
                assert_eq!(
                    pieces.greedy_ids, whole.greedy_ids,
                    "{preset}: chunk {chunk}"
                );
                let d = max_abs_diff(&pieces.greedy_logits, &whole.greedy_logits);
                assert!(
                    d <= 1e-4,
                    "{preset}: decode after chunk-{chunk} prefill differs from one-block prefill by {d}"
                );
            }
        }
    }
}

#[test]
fn bad_inputs_are_clear_errors() {
    let model = load("tiny");
    let vocab = model.config().vocab_size as u32;
    let err = eval_prompt(&model, &[], 1, 8)
        .err()
        .expect("empty prompt is rejected");
    assert!(err.to_string().contains("empty prompt"), "{err:#}");
    let err = eval_prompt(&model, &[1, vocab], 1, 8)
        .err()
        .expect("out-of-vocab id is rejected");
    assert!(
        format!("{err:#}").contains(&format!("token id {vocab}")),
        "{err:#}"
    );

    // A copy whose context is 16 tokens: a 20-token prompt is refused.
    let dir = tests::copy_model(&model_dir("tiny"));
    let cfg_path = dir.path().join("config.json");
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).expect("config")).expect("json");
    cfg["text_config"]["max_position_embeddings"] = 16.into();
    std::fs::write(&cfg_path, cfg.to_string()).expect("write config");
    let small = load_model(
        &LoadOptions {
            model: dir.path().to_path_buf(),
            experts: ExpertsKind::Bf16,
            container: None,
            threads: None,
            keep_awake: Default::default(),
            expertd: Default::default(),
            dense: Default::default(),
            host_extra_bytes: 0,
            weights_digest: false,
        },
        "test",
    )
    .expect("loads");
    let err = eval_prompt(&small, &[1; 20], 1, 8)
        .err()
        .expect("too-long prompt is rejected");
    assert!(
        format!("{err:#}").contains("exceeds the model's context of 16"),
        "{err:#}"
    );
}

#[test]
fn run_cli_reports_errors_without_panicking() {
    let dir = tests::copy_model(&model_dir("tiny"));
    std::fs::remove_file(dir.path().join("config.json")).expect("remove config");
    let out = tests::hostd(&[
        "run",
        "--model",
        dir.path().to_str().expect("utf-8"),
        "--prompt",
        "hi",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("config.json") && !stderr.contains("panicked"),
        "{stderr}"
    );

    let out = tests::hostd(&[
        "run",
        "--model",
        model_dir("tiny").to_str().expect("utf-8"),
        "--prompt",
        "hi",
        "--max-new-tokens",
        "4",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(v["new_tokens"].as_u64().expect("count") <= 4);
    assert!(v["ttft_s"].as_f64().expect("ttft") > 0.0);
    assert!(v["peak_rss_bytes"].as_u64().expect("rss") > 0);
    assert_eq!(v["dense"], "bf16");

    // The INT8 dense mode through the CLI, and a value it does not know.
    let out = tests::hostd(&[
        "run",
        "--model",
        model_dir("tiny").to_str().expect("utf-8"),
        "--prompt",
        "hi",
        "--max-new-tokens",
        "4",
        "--json",
        "--dense",
        "int8",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["dense"], "int8");
    let out = tests::hostd(&[
        "run",
        "--model",
        model_dir("tiny").to_str().expect("utf-8"),
        "--prompt",
        "hi",
        "--dense",
        "int4",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--dense"));
}

#[test]
fn eval_cli_writes_the_reference_schema() {
    let out_dir = tempfile::tempdir().expect("tempdir");
    let out = out_dir.path().join("tiny.json");
    let prompts = reference_dir().join("tiny.json");
    let status = tests::hostd(&[
        "eval",
        "--model",
        model_dir("tiny").to_str().expect("utf-8"),
        "--prompts",
        prompts.to_str().expect("utf-8"),
        "--new-tokens",
        "16",
        "--dtype",
        "f32",
        "--out",
        out.to_str().expect("utf-8"),
    ]);
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let got: Value =
        serde_json::from_str(&std::fs::read_to_string(&out).expect("output")).expect("json");
    assert_eq!(got["dtype"], "float32");
    assert!(
        got["implementation"]
            .as_str()
            .expect("implementation")
            .starts_with("sluice ")
    );
    let reference = reference("tiny");
    for (g, r) in got["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .zip(reference["prompts"].as_array().expect("prompts"))
    {
        assert_eq!(g["name"], r["name"]);
        assert_eq!(g["input_ids"], r["input_ids"]);
        assert_eq!(g["greedy_ids"], r["greedy_ids"]);
        assert_eq!(
            g["prompt_logits_file"]["shape"],
            r["prompt_logits_file"]["shape"]
        );
        let ours = read_logits(out_dir.path(), &g["prompt_logits_file"]);
        let theirs = read_logits(&reference_dir(), &r["prompt_logits_file"]);
        assert!(max_abs_diff(&ours, &theirs) <= LOGIT_TOL);
        for (gl, rl) in g["router"]
            .as_array()
            .expect("router")
            .iter()
            .zip(r["router"].as_array().expect("router"))
        {
            assert_eq!(gl["ids"], rl["ids"]);
        }
    }
}

#[test]
fn generation_stops_on_stop_ids_and_token_limit() {
    use hostd::generate::{GenerateOptions, StopReason, generate_greedy};
    let model = load("tiny");
    let reference = reference("tiny");
    let p = &reference["prompts"][1];
    let ids: Vec<u32> = serde_json::from_value(p["input_ids"].clone()).expect("ids");
    let greedy: Vec<u32> = serde_json::from_value(p["greedy_ids"].clone()).expect("greedy");
    let opts = |stop_ids: Vec<u32>, max_new_tokens| GenerateOptions {
        max_new_tokens,
        stop_ids,
        prefill_chunk: 8,
        sample_vocab: model.config().vocab_size,
        allowed: None,
    };
    let (out, stats) =
        generate_greedy(&model, &ids, &opts(vec![], 16), |_| true).expect("generate");
    assert_eq!(
        out, greedy,
        "greedy generation equals the reference continuation"
    );
    assert_eq!(
        (stats.stop, stats.new_tokens, stats.decode_steps),
        (StopReason::Length, 16, 15)
    );
    // Stop on the reference's 4th token: three tokens come out, the stop id is not emitted.
    let (out, stats) =
        generate_greedy(&model, &ids, &opts(vec![greedy[3]], 16), |_| true).expect("generate");
    let first = greedy
        .iter()
        .position(|&t| t == greedy[3])
        .expect("present");
    assert_eq!(out, greedy[..first]);
    assert_eq!(stats.stop, StopReason::Stop(greedy[3]));
    // The callback can cancel.
    let (out, stats) =
        generate_greedy(&model, &ids, &opts(vec![], 16), |_| false).expect("generate");
    assert_eq!((out.len(), stats.stop), (1, StopReason::Cancelled));
}

/// The long-prompt case (`tests/fixtures/reference/tiny_long.json`, made by
/// `tests/oracle/make_long_reference.py`): a 2200-token prompt through the tiny fixture, prefilled
/// in blocks of the engine's default size and in one block, against transformers fp32 at positions
/// on both sides of the tiled attention's segment boundaries and at the last position.
#[test]
fn f32_parity_on_a_2200_token_prompt() {
    let path = reference_dir().join("tiny_long.json");
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("tiny_long.json"))
            .expect("json");
    let ids: Vec<u32> = serde_json::from_value(reference["input_ids"].clone()).expect("ids");
    assert!(
        ids.len() >= 2048,
        "the long prompt has only {} tokens",
        ids.len()
    );
    let model = load("tiny");
    let vocab = model.config().vocab_size;
    for chunk in [hostd::engine::DEFAULT_PREFILL_CHUNK, usize::MAX] {
        let got = eval_prompt(&model, &ids, 1, chunk).expect("eval");
        let mut worst = 0.0f32;
        for row in reference["positions"].as_array().expect("positions") {
            let pos = row["position"].as_u64().expect("position") as usize;
            let want: Vec<f32> = serde_json::from_value(row["logits"].clone()).expect("logits");
            let have = &got.prompt_logits[pos * vocab..(pos + 1) * vocab];
            let d = max_abs_diff(have, &want);
            worst = worst.max(d);
            assert!(
                d <= LOGIT_TOL,
                "chunk {chunk}: logits at position {pos} differ from transformers by {d}"
            );
            let top: u32 = serde_json::from_value(row["top_ids"][0].clone()).expect("top id");
            let mine =
                have.iter()
                    .enumerate()
                    .fold(0, |b, (i, v)| if *v > have[b] { i } else { b }) as u32;
            assert_eq!(mine, top, "chunk {chunk}: argmax at position {pos}");
        }
        let how = if chunk == usize::MAX {
            "one block".to_string()
        } else {
            format!("blocks of {chunk}")
        };
        println!(
            "2200-token prompt, {how}: max |Δlogit| vs transformers fp32 {worst:.3e} (tolerance {LOGIT_TOL})"
        );
    }
}
