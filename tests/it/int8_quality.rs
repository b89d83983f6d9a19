//! Quality gate of the W8A8 expert path against the transformers fp32 reference on every
//! oracle fixture: top-1 agreement of next-token logits at every prompt position and greedy
//! step (teacher-forced on the reference continuation), max and mean |Δlogit|, and how long
//! the INT8 model's own greedy continuation agrees with the reference.

use hostd::eval::eval_prompt;
use hostd::load::{DenseKind, ExpertsKind, LoadOptions, load_model};
use hostd::model::Logits;
use hostd::sampling::argmax;
use serde_json::{Value, json};
use tests::{
    model_dir, prepare_container, prepare_container_as, presets, read_logits, reference,
    reference_dir,
};

/// Required top-1 agreement with the fp32 reference on the trained fixture (the target).
///
/// Only a trained preset (its reference JSON has a `training` entry: `tests/oracle/train_fixture.py`)
/// has next-token distributions shaped like a language model's. The random-weight presets' logits
/// are flat: their top-1 is within 0.1 of the top-2 at 9–12% of positions (5.6% on the trained
/// one), so there the figure mostly counts ties (see `MIN_TOP1_AGREEMENT_RANDOM`).
const MIN_TOP1_AGREEMENT: f64 = 0.98;

/// The floor on the random-weight presets (tiny, small, wide), held just under the measured
/// 95.9% (686/715) so that a regression (a wrong scale, a layout bug: agreement collapses to a few
/// percent) fails. Even weight-only per-row INT8 with f32 activations reaches only 97.5% there
/// (`tests/oracle/int8_sensitivity.py`; docs/results/int8-quality.md).
const MIN_TOP1_AGREEMENT_RANDOM: f64 = 0.955;

/// Floors for `--dense int8` (W8A8 on every large dense projection, opt-in). Per-row W8A8
/// compounds through all layers; on the flat random presets it measured 85.9% (BF16 experts) and
/// 85.5% (INT8 experts); no single matrix dominates (docs/results/int8-quality.md). These floors
/// catch a broken path (a wrong scale or layout collapses agreement to a few percent).
const MIN_TOP1_AGREEMENT_DENSE_RANDOM: f64 = 0.83;
/// The same on the trained fixture (measured 98.5% with BF16 experts, 97.5% with INT8 experts).
const MIN_TOP1_AGREEMENT_DENSE_TRAINED: f64 = 0.96;

/// Agreement counts of one group of presets.
#[derive(Default, Clone, Copy)]
struct Tally {
    agree: usize,
    total: usize,
    /// The largest reference top-1/top-2 logit gap at a position where the tested path picked
    /// another token: how decisive a decision INT8 has overturned.
    worst_flipped_gap: f32,
    /// Σ over positions of KL(reference ‖ tested) of the next-token distributions, in nats.
    kl_sum: f64,
}

impl Tally {
    fn share(&self) -> f64 {
        self.agree as f64 / self.total as f64
    }

    /// Mean KL(reference ‖ tested) per position.
    fn mean_kl(&self) -> f64 {
        self.kl_sum / self.total as f64
    }
}

/// KL(softmax(p) ‖ softmax(q)) in nats, computed in f64.
fn kl(p: &[f32], q: &[f32]) -> f64 {
    let log_softmax = |x: &[f32]| -> Vec<f64> {
        let m = x
            .iter()
            .fold(f64::NEG_INFINITY, |a, &v| a.max(f64::from(v)));
        let z: f64 = x.iter().map(|&v| (f64::from(v) - m).exp()).sum();
        x.iter().map(|&v| f64::from(v) - m - z.ln()).collect()
    };
    let (lp, lq) = (log_softmax(p), log_softmax(q));
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum()
}

/// The reference's top-1 minus top-2 logit.
fn top_gap(x: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in x {
        if v > a {
            (a, b) = (v, a);
        } else if v > b {
            b = v;
        }
    }
    a - b
}

/// Whether a preset is trained (its reference JSON records the training run).
fn is_trained(reference: &Value) -> bool {
    reference.get("training").is_some_and(Value::is_object)
}

/// Measures one configuration against the reference on every fixture and returns the top-1
/// agreement of the random-weight presets and of the trained ones (the per-preset report is printed).
/// `format` is the container's expert format when `experts` is [`ExpertsKind::Int8`] (the
/// in-process container backend).
fn agreement(what: &str, experts: ExpertsKind, dense: DenseKind, format: &str) -> (Tally, Tally) {
    let mut report = Vec::new();
    let (mut random, mut trained) = (Tally::default(), Tally::default());
    for preset in presets() {
        let container = tempfile::tempdir().expect("tempdir");
        if experts == ExpertsKind::Int8 {
            prepare_container_as(&model_dir(&preset), container.path(), format);
        }
        let args = LoadOptions {
            model: model_dir(&preset),
            experts,
            container: (experts == ExpertsKind::Int8).then(|| container.path().to_path_buf()),
            threads: None,
            keep_awake: Default::default(),
            expertd: Default::default(),
            dense,
            host_extra_bytes: 0,
            weights_digest: false,
        };
        let model = load_model(&args, "test").expect("model loads");
        let vocab = model.config().vocab_size;
        let reference = reference(&preset);
        let mut tally = Tally::default();
        let (mut max_diff, mut sum_diff, mut n_diff) = (0f32, 0f64, 0usize);
        let mut greedy_agreement = Vec::new();
        for p in reference["prompts"].as_array().expect("prompts") {
            let ids: Vec<u32> = serde_json::from_value(p["input_ids"].clone()).expect("ids");
            let greedy: Vec<u32> = serde_json::from_value(p["greedy_ids"].clone()).expect("greedy");
            // Teacher forcing: prompt + reference continuation (all but the last token) gives
            // logits for every prompt position and every greedy step.
            let mut seq = ids.clone();
            seq.extend_from_slice(&greedy[..greedy.len() - 1]);
            let mut state = model.new_state();
            let ours = model
                .forward(&mut state, &seq, Logits::All, None)
                .expect("forward");
            let mut theirs = read_logits(&reference_dir(), &p["prompt_logits_file"]);
            theirs.extend_from_slice(
                &read_logits(&reference_dir(), &p["greedy_logits_file"])[vocab..],
            );
            assert_eq!(ours.len(), theirs.len());
            let mut prompt_agree = 0usize;
            for (o, t) in ours.chunks_exact(vocab).zip(theirs.chunks_exact(vocab)) {
                tally.total += 1;
                tally.kl_sum += kl(t, o);
                if argmax(o) == argmax(t) {
                    tally.agree += 1;
                    prompt_agree += 1;
                } else {
                    tally.worst_flipped_gap = tally.worst_flipped_gap.max(top_gap(t));
                }
                for (a, b) in o.iter().zip(t) {
                    let d = (a - b).abs();
                    max_diff = max_diff.max(d);
                    sum_diff += f64::from(d);
                    n_diff += 1;
                }
            }
            let own = eval_prompt(&model, &ids, greedy.len(), usize::MAX).expect("int8 greedy");
            let same = own
                .greedy_ids
                .iter()
                .zip(&greedy)
                .take_while(|(a, b)| a == b)
                .count();
            greedy_agreement.push(json!({
                "prompt": p["name"],
                "top1_agreeing_positions": prompt_agree,
                "positions": seq.len(),
                "agreeing_tokens": same,
                "of": greedy.len(),
            }));
        }
        println!(
            "{what} {preset}: top-1 agreement {}/{} = {:.2}%, mean KL {:.3e} (per prompt {}), largest reference top-1 gap overturned {:.3}, max |Δlogit| {max_diff:.4}, mean |Δlogit| {:.5}, greedy agreement {}",
            tally.agree,
            tally.total,
            100.0 * tally.share(),
            tally.mean_kl(),
            greedy_agreement
                .iter()
                .map(|g| format!("{}/{}", g["top1_agreeing_positions"], g["positions"]))
                .collect::<Vec<_>>()
                .join(" "),
            tally.worst_flipped_gap,
            sum_diff / n_diff as f64,
            greedy_agreement
                .iter()
                .map(|g| format!("{}/{}", g["agreeing_tokens"], g["of"]))
                .collect::<Vec<_>>()
                .join(" ")
        );
        report.push(json!({
            "config": what,
            "preset": preset,
            "trained": is_trained(&reference),
            "positions": tally.total,
            "top1_agreement": tally.share(),
            "mean_kl_reference_to_tested": tally.mean_kl(),
            "largest_overturned_reference_gap": tally.worst_flipped_gap,
            "max_abs_logit_diff": max_diff,
            "mean_abs_logit_diff": sum_diff / n_diff as f64,
            "greedy_agreement": greedy_agreement,
        }));
        let group = if is_trained(&reference) {
            &mut trained
        } else {
            &mut random
        };
        group.agree += tally.agree;
        group.total += tally.total;
        group.kl_sum += tally.kl_sum;
        group.worst_flipped_gap = group.worst_flipped_gap.max(tally.worst_flipped_gap);
    }
    for (name, t) in [
        ("random-weight presets", random),
        ("trained presets", trained),
    ] {
        println!(
            "{what}, {name}: top-1 agreement {}/{} = {:.2}%, mean KL {:.3e}",
            t.agree,
            t.total,
            100.0 * t.share(),
            t.mean_kl()
        );
    }
    println!(
        "{}",
        serde_json::to_string(&Value::Array(report)).expect("json")
    );
    assert!(
        random.total > 0 && trained.total > 0,
        "expected random-weight and trained fixtures"
    );
    (random, trained)
}

/// Measures one configuration and requires its floors on the trained and the random presets.
fn assert_agreement(
    what: &str,
    experts: ExpertsKind,
    dense: DenseKind,
    min_trained: f64,
    min_random: f64,
) {
    let (random, trained) = agreement(what, experts, dense, "int8");
    assert!(
        trained.share() >= min_trained,
        "{what}: top-1 agreement on the trained fixture {:.4} below {min_trained}",
        trained.share()
    );
    assert!(
        random.share() >= min_random,
        "{what}: top-1 agreement on the random presets {:.4} below {min_random}",
        random.share()
    );
}

#[test]
fn int8_experts_agree_with_the_fp32_reference() {
    assert_agreement(
        "int8 experts, bf16 dense",
        ExpertsKind::Int8,
        DenseKind::Bf16,
        MIN_TOP1_AGREEMENT,
        MIN_TOP1_AGREEMENT_RANDOM,
    );
}

#[test]
fn int8_dense_agrees_with_the_fp32_reference() {
    assert_agreement(
        "bf16 experts, int8 dense",
        ExpertsKind::Bf16,
        DenseKind::Int8,
        MIN_TOP1_AGREEMENT_DENSE_TRAINED,
        MIN_TOP1_AGREEMENT_DENSE_RANDOM,
    );
}

#[test]
fn all_int8_agrees_with_the_fp32_reference() {
    assert_agreement(
        "int8 experts, int8 dense",
        ExpertsKind::Int8,
        DenseKind::Int8,
        MIN_TOP1_AGREEMENT_DENSE_TRAINED,
        MIN_TOP1_AGREEMENT_DENSE_RANDOM,
    );
}

/// The 4-bit expert formats against the fp32 reference, measured beside INT8 in one run, with
/// BF16 and with INT8 dense weights (docs/results/kquant-experts.md has the table).
///
/// Issue 36's bar — on the trained fixture, top-1 agreement ≥ 0.95 at every position and mean
/// KL(reference ‖ tested) ≤ 0.01 — is held for `q4k-q6k` with BF16 dense (measured 0.957 and
/// 8.2e-3). The other 4-bit rows do not reach it on this fixture (`q4k`, BF16 dense: 0.921 and
/// 1.46e-2); their floors sit just under the measured figures so that a regression fails. The
/// random-weight presets' flat logits make top-1 mostly a count of ties (see
/// `MIN_TOP1_AGREEMENT`); their floors only catch a broken path (agreement collapses to a few
/// percent).
#[test]
fn kquant_experts_agree_with_the_fp32_reference() {
    // (format, dense, trained top-1 floor, trained mean-KL ceiling, random-presets top-1 floor)
    let table = [
        ("int8", DenseKind::Bf16, 0.98, 1e-3, 0.955),
        ("int8", DenseKind::Int8, 0.96, 3e-3, 0.83),
        ("q4k", DenseKind::Bf16, 0.91, 0.016, 0.62),
        ("q4k", DenseKind::Int8, 0.90, 0.018, 0.58),
        ("q4k-q6k", DenseKind::Bf16, 0.95, 0.01, 0.65),
        ("q4k-q6k", DenseKind::Int8, 0.92, 0.011, 0.64),
    ];
    let mut rows = Vec::new();
    for (format, dense, min_top1, max_kl, min_random) in table {
        let what = format!("{format} experts, {dense:?} dense");
        let (random, trained) = agreement(&what, ExpertsKind::Int8, dense, format);
        rows.push((what, random, trained, min_top1, max_kl, min_random));
    }
    for (what, random, trained, ..) in &rows {
        println!(
            "SUMMARY {what}: trained top-1 {:.4} mean KL {:.3e}; random presets top-1 {:.4} mean KL {:.3e}",
            trained.share(),
            trained.mean_kl(),
            random.share(),
            random.mean_kl()
        );
    }
    // The 4-bit rows measured the 4-bit path: their error is well above INT8's with the same
    // dense weights (rows 0 and 1 are INT8 with BF16 and INT8 dense).
    for (i, (what, _, trained, ..)) in rows.iter().enumerate().skip(2) {
        let int8 = &rows[i % 2].2;
        assert!(
            trained.mean_kl() > 3.0 * int8.mean_kl(),
            "{what}: mean KL {:.3e} is not above INT8's {:.3e}: was the 4-bit container used?",
            trained.mean_kl(),
            int8.mean_kl()
        );
    }
    for (what, random, trained, min_top1, max_kl, min_random) in &rows {
        assert!(
            trained.share() >= *min_top1 && trained.mean_kl() <= *max_kl,
            "{what}: trained top-1 {:.4} (floor {min_top1}), mean KL {:.3e} (ceiling {max_kl})",
            trained.share(),
            trained.mean_kl()
        );
        assert!(
            random.share() >= *min_random,
            "{what}: random presets top-1 {:.4} (floor {min_random})",
            random.share()
        );
    }
}

#[test]
fn a_corrupt_blob_fails_the_forward_pass_naming_layer_and_expert() {
    let container = tempfile::tempdir().expect("tempdir");
    prepare_container(&model_dir("tiny"), container.path());
    let args = LoadOptions {
        model: model_dir("tiny"),
        experts: ExpertsKind::Int8,
        container: Some(container.path().to_path_buf()),
        threads: None,
        keep_awake: Default::default(),
        expertd: Default::default(),
        dense: Default::default(),
        host_extra_bytes: 0,
        weights_digest: false,
    };
    // Flip one byte inside the first blob's packed weights (layer 0, expert 0).
    tests::corrupt_blobs(container.path(), &[0], 100);
    let model = load_model(&args, "test").expect("header and index are intact, so the model loads");
    // Route every expert of layer 0 by feeding enough tokens that expert 0 is chosen somewhere.
    let ids: Vec<u32> = (0..64).collect();
    let mut state = model.new_state();
    let err = model
        .forward(&mut state, &ids, Logits::Last, None)
        .expect_err("corrupt expert must fail");
    let msg = err.to_string();
    assert!(msg.contains("layer 0 expert 0"), "{msg}");
    // The sequence is unusable afterwards rather than silently half-advanced.
    assert!(model.forward(&mut state, &[1], Logits::Last, None).is_err());
}

#[test]
fn a_container_from_another_model_is_refused() {
    let container = tempfile::tempdir().expect("tempdir");
    prepare_container(&model_dir("tiny"), container.path());
    let args = LoadOptions {
        model: model_dir("small"),
        experts: ExpertsKind::Int8,
        container: Some(container.path().to_path_buf()),
        threads: None,
        keep_awake: Default::default(),
        expertd: Default::default(),
        dense: Default::default(),
        host_extra_bytes: 0,
        weights_digest: false,
    };
    let err = load_model(&args, "test")
        .err()
        .expect("mismatched container is refused");
    let msg = format!("{err:#}");
    assert!(
        msg.contains("different model") || msg.contains("dims"),
        "{msg}"
    );
}
