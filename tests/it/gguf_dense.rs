//! hostd's dense weights from a GGUF written by llama.cpp's converter
//! (`tests/fixtures/gguf/tiny-llamacpp-bf16.gguf`, the `tiny` checkpoint, BF16): every dense
//! tensor reads back as the checkpoint's once the converter's changes are undone (norms stored
//! as 1 + w, A stored as −exp(A_log), value heads moved to the tiled order — `tiny` has 2 key
//! and 4 value heads, so the reordering is not the identity), the model loaded from it matches
//! the transformers reference, and `hostd run --model FILE.gguf` works with a container prepared
//! from the same file and refuses one prepared from the checkpoint.

use hostd::eval::eval_prompt;
use hostd::experts::bf16::Bf16Experts;
use hostd::model::Model;
use hostd::model::linear::DenseFormat;
use hostd::model::weights::MappedCheckpoint;
use shared::kernels::Isa;
use shared::tensor_spec::dense_tensors;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use tests::{
    GgufEdit, max_abs_diff, model_dir, prepare_container, read_logits, reference, reference_dir,
    rewrite_gguf, workspace_bin,
};

fn fixture() -> PathBuf {
    tests::llamacpp_tiny_gguf()
}

/// Largest |Δlogit| against the transformers fp32 reference that a model read from llama.cpp's
/// BF16 GGUF may show: the checkpoint's own tolerance (`parity.rs`). The GGUF keeps each
/// zero-centred norm weight as `bf16(1 + w)` (the converter adds in BF16), which may move a norm
/// scale by up to 2⁻⁹ relative; on `tiny` that costs 6e-5.
const GGUF_LOGIT_TOL: f32 = 1e-3;

#[test]
fn every_dense_tensor_reads_back_as_the_checkpoints() {
    let gguf = MappedCheckpoint::open(&fixture()).expect("GGUF opens");
    let ckpt = MappedCheckpoint::open(&model_dir("tiny")).expect("checkpoint opens");
    assert_eq!(gguf.config().text.num_layers, ckpt.config().text.num_layers);
    let (mut exact, mut norms, mut a_logs) = (0, 0, 0);
    for want in dense_tensors(&ckpt.config().text, ckpt.prefix()) {
        let name = &want.name;
        let gguf_name = match name.strip_prefix(ckpt.prefix()) {
            Some(rest) => format!("{}{rest}", gguf.prefix()),
            None => name.clone(),
        };
        let theirs = ckpt.vector_f32(name).expect("checkpoint tensor");
        let ours = gguf
            .vector_f32(&gguf_name)
            .unwrap_or_else(|e| panic!("{gguf_name}: {e}"));
        assert_eq!(ours.len(), theirs.len(), "{name}: length");
        let zero_centred =
            name.ends_with("norm.weight") && !name.ends_with("linear_attn.norm.weight");
        for (i, (&o, &t)) in ours.iter().zip(&theirs).enumerate() {
            let ok = if zero_centred {
                // Stored as bf16(1 + w): within half a BF16 step of 1 + w.
                ((1.0 + o) - (1.0 + t)).abs() <= (1.0 + t).abs() * 2f32.powi(-8)
            } else if name.ends_with("A_log") {
                (o - t).abs() <= 1e-5 * t.abs().max(1.0)
            } else {
                o == t
            };
            assert!(ok, "{name}[{i}]: GGUF gives {o}, the checkpoint {t}");
        }
        if zero_centred {
            norms += 1;
        } else if name.ends_with("A_log") {
            a_logs += 1;
        } else {
            exact += 1;
        }
        if want.shape.len() == 2 {
            let (r, c) = (want.shape[0], want.shape[1]);
            let m = gguf.matrix(&gguf_name, r, c).expect("matrix");
            let from_vector: Vec<half::bf16> =
                ours.iter().map(|&v| half::bf16::from_f32(v)).collect();
            assert!(
                m.data() == from_vector.as_slice(),
                "{name}: matrix and vector disagree"
            );
        }
    }
    println!(
        "{exact} tensors bit-identical, {norms} norms within a BF16 step of 1 + w, {a_logs} A_log within 1e-5"
    );
    // tiny: 4 layers (2 DeltaNet, 2 attention) — 46 tensors kept as they are, 13 zero-centred
    // norms (2 per layer, q/k norms of 2 attention layers, the final norm), 2 A_log.
    assert_eq!(
        (exact, norms, a_logs),
        (46, 13, 2),
        "every dense tensor was compared"
    );
}

#[test]
fn a_model_from_the_gguf_matches_the_transformers_reference() {
    // Dense weights from the GGUF, routed experts (BF16) from the checkpoint: the difference
    // from the reference is the dense conversion's alone.
    let gguf = MappedCheckpoint::open(&fixture()).expect("GGUF opens");
    let ckpt = MappedCheckpoint::open(&model_dir("tiny")).expect("checkpoint opens");
    let isa = Isa::detect();
    let experts = Arc::new(Bf16Experts::new(&ckpt, isa).expect("experts"));
    let model = Model::load(&gguf, experts, isa, DenseFormat::Bf16).expect("model from GGUF");
    let reference = reference("tiny");
    let mut worst = 0f32;
    for p in reference["prompts"].as_array().expect("prompts") {
        let ids: Vec<u32> = serde_json::from_value(p["input_ids"].clone()).expect("ids");
        let want: Vec<u32> = serde_json::from_value(p["greedy_ids"].clone()).expect("greedy");
        let got = eval_prompt(&model, &ids, want.len(), usize::MAX).expect("eval");
        assert_eq!(got.greedy_ids, want, "{}: greedy ids", p["name"]);
        let d = max_abs_diff(
            &got.prompt_logits,
            &read_logits(&reference_dir(), &p["prompt_logits_file"]),
        )
        .max(max_abs_diff(
            &got.greedy_logits,
            &read_logits(&reference_dir(), &p["greedy_logits_file"]),
        ));
        worst = worst.max(d);
    }
    println!(
        "max |Δlogit| of the GGUF-loaded model vs transformers fp32: {worst:.3e} (tolerance {GGUF_LOGIT_TOL})"
    );
    assert!(worst <= GGUF_LOGIT_TOL, "logits differ by {worst}");
}

fn run(model: &PathBuf, container: &std::path::Path) -> std::process::Output {
    Command::new(workspace_bin("hostd"))
        .args(["run", "--model"])
        .arg(model)
        .args(["--experts", "int8", "--container"])
        .arg(container)
        .args(["--prompt", "The tide comes in", "--max-new-tokens", "12"])
        .output()
        .expect("spawn hostd")
}

#[test]
fn hostd_runs_from_the_gguf_with_a_container_prepared_from_it() {
    let work = tempfile::tempdir().expect("tempdir");
    let from_gguf = work.path().join("from-gguf");
    let from_ckpt = work.path().join("from-ckpt");
    prepare_container(&fixture(), &from_gguf);
    prepare_container(&model_dir("tiny"), &from_ckpt);
    let gguf_run = run(&fixture(), &from_gguf);
    let stderr = String::from_utf8_lossy(&gguf_run.stderr);
    assert!(
        gguf_run.status.success(),
        "hostd run from the GGUF: {stderr}"
    );
    assert!(
        stderr.contains("12 new"),
        "twelve tokens generated: {stderr}"
    );
    // The checkpoint with its own container: the same experts (the GGUF's are the checkpoint's
    // BF16 bytes), dense weights that differ only in the norms' rounding.
    let ckpt_run = run(&model_dir("tiny"), &from_ckpt);
    assert!(
        ckpt_run.status.success(),
        "{}",
        String::from_utf8_lossy(&ckpt_run.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&gguf_run.stdout),
        String::from_utf8_lossy(&ckpt_run.stdout),
        "the same greedy text from the GGUF and from the checkpoint"
    );
    // A container prepared from the checkpoint is not the GGUF's (its identity names the file).
    let wrong = run(&fixture(), &from_ckpt);
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        !wrong.status.success() && stderr.contains("was prepared from"),
        "{stderr}"
    );
    // In-process BF16 experts need a safetensors directory: a clear error, not a crash.
    let bf16 = Command::new(workspace_bin("hostd"))
        .args(["run", "--model"])
        .arg(fixture())
        .args(["--prompt", "x", "--max-new-tokens", "1"])
        .output()
        .expect("spawn hostd");
    let stderr = String::from_utf8_lossy(&bf16.stderr);
    assert!(
        !bf16.status.success() && stderr.contains("expertd prepare FILE.gguf"),
        "{stderr}"
    );
}

#[test]
fn without_output_the_head_is_the_embedding_and_a_bad_dense_tensor_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tied.gguf");
    std::fs::write(
        &path,
        rewrite_gguf(
            &fixture(),
            GgufEdit {
                drop: &["output.weight"],
                ..GgufEdit::default()
            },
        ),
    )
    .expect("write");
    let tied = MappedCheckpoint::open(&path).expect("a GGUF without output.weight opens");
    let cfg = tied.config().text.clone();
    let (v, d) = (cfg.vocab_size, cfg.hidden_size);
    let head = tied.matrix("lm_head.weight", v, d).expect("tied head");
    let embed = tied
        .matrix("model.language_model.embed_tokens.weight", v, d)
        .expect("embedding");
    assert!(
        head.data() == embed.data(),
        "the tied head is the embedding"
    );

    for (drop, reshape, says) in [
        (vec!["blk.1.attn_q_norm.weight"], None, "missing"),
        (
            vec![],
            Some(("blk.0.attn_qkv.weight", &[128u64, 64][..])),
            "shape",
        ),
    ] {
        let path = dir.path().join("bad.gguf");
        std::fs::write(
            &path,
            rewrite_gguf(
                &fixture(),
                GgufEdit {
                    drop: &drop,
                    reshape,
                    ..GgufEdit::default()
                },
            ),
        )
        .expect("write");
        let err = MappedCheckpoint::open(&path)
            .err()
            .expect("refused")
            .to_string();
        let tensor = drop
            .first()
            .copied()
            .or(reshape.map(|r| r.0))
            .expect("a tensor");
        assert!(
            err.contains(tensor) && err.contains(says),
            "{tensor}: {err}"
        );
    }
}

#[test]
fn dense_gguf_holds_non_kquant_projections_as_int8_and_needs_a_gguf() {
    // llama.cpp's tiny conversion is BF16 throughout (its rows are too short for k-quants):
    // with --dense gguf every projection is held as INT8, so the logits are --dense int8's,
    // bit for bit.
    let gguf = MappedCheckpoint::open(&fixture()).expect("GGUF opens");
    let ckpt = MappedCheckpoint::open(&model_dir("tiny")).expect("checkpoint opens");
    let isa = Isa::detect();
    let logits = |dense| {
        let experts = Arc::new(Bf16Experts::new(&ckpt, isa).expect("experts"));
        let model = Model::load(&gguf, experts, isa, dense).expect("model from GGUF");
        eval_prompt(&model, &[1, 5, 9, 200, 3], 3, usize::MAX).expect("eval")
    };
    let (int8, kept) = (logits(DenseFormat::Int8), logits(DenseFormat::Gguf));
    assert_eq!(kept.greedy_ids, int8.greedy_ids);
    assert!(
        kept.prompt_logits == int8.prompt_logits && kept.greedy_logits == int8.greedy_logits,
        "--dense gguf without k-quant tensors is --dense int8"
    );
    // A directory has no GGUF blocks to keep: refused before anything loads.
    let o = Command::new(workspace_bin("hostd"))
        .args(["run", "--model"])
        .arg(model_dir("tiny"))
        .args(["--dense", "gguf", "--prompt", "x", "--max-new-tokens", "1"])
        .output()
        .expect("spawn hostd");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && stderr.contains("is not a GGUF file"),
        "{stderr}"
    );
}
