//! The INT8 expert container end to end: `expertd prepare` then `expertd verify` on every
//! fixture; every corrupt byte (blob, header, index) and truncation is caught by both `verify`
//! and `ContainerFile`; a killed `prepare` resumes to a byte-identical file; another model's
//! container is refused; and the container's weights are exactly `quantize_weights` of the
//! checkpoint's BF16 experts.

use half::bf16;
use shared::checkpoint::Checkpoint;
use shared::container::header::{
    HEADER_CHECKSUM_OFFSET, INDEX_CHECKSUM_OFFSET, N_EXPERTS_OFFSET, VERSION_OFFSET,
};
use shared::container::{
    CONTAINER_FILE, ContainerError, ContainerFile, ModelIdentity, PARTIAL_FILE,
};
use shared::ids::{ExpertId, LayerId};
use shared::kernels::int8::{QuantizedMatrix, quantize_weights};
use shared::safetensors_locator::{ByteRange, ExpertLocator};
use shared::splitmix::SplitMix64;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use tests::{model_dir, presets, workspace_bin};

fn expertd(args: &[&str]) -> Output {
    Command::new(workspace_bin("expertd"))
        .args(args)
        .output()
        .expect("spawn expertd")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Runs `expertd prepare MODEL --out OUT` and asserts success.
fn prepare(model: &Path, out: &Path) -> Output {
    let o = expertd(&["prepare", path_str(model), "--out", path_str(out)]);
    assert!(
        o.status.success(),
        "expertd prepare {} failed: {}",
        model.display(),
        text(&o)
    );
    o
}

/// Runs `expertd verify DIR [EXTRA…]`.
fn verify(dir: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["verify", path_str(dir)];
    args.extend_from_slice(extra);
    expertd(&args)
}

fn read_range(r: &ByteRange) -> Vec<f32> {
    let f = std::fs::File::open(&r.file).expect("open shard");
    let mut buf = vec![0u8; r.len as usize];
    f.read_exact_at(&mut buf, r.offset).expect("read range");
    buf.chunks_exact(2)
        .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
        .collect()
}

fn owned(m: shared::kernels::int8::MatrixRef<'_>) -> QuantizedMatrix {
    QuantizedMatrix {
        rows: m.rows,
        cols: m.cols,
        packed: m.packed.to_vec(),
        scales: m.scales.to_vec(),
        row_sums: m.row_sums.to_vec(),
    }
}

#[test]
fn prepare_then_verify_every_fixture() {
    for preset in presets() {
        let model = model_dir(&preset);
        let tmp = tempfile::tempdir().expect("tempdir");
        let out = tmp.path().join("c");
        prepare(&model, &out);
        let o = verify(&out, &["--model", path_str(&model), "--deep"]);
        assert!(o.status.success(), "{preset}: verify failed: {}", text(&o));
        assert!(
            text(&o).contains("OK") && text(&o).contains("identity matches"),
            "{}",
            text(&o)
        );
        assert!(
            !out.join(PARTIAL_FILE).exists(),
            "{preset}: partial file left behind"
        );

        let ckpt = Checkpoint::open(&model).expect("fixture opens");
        let cfg = &ckpt.config.text;
        let c = ContainerFile::open(&out).expect("container opens");
        let dims = c.header().layout.dims;
        assert_eq!(
            (dims.n_layers, dims.n_experts, dims.hidden, dims.inner),
            (
                cfg.num_layers,
                cfg.num_experts,
                cfg.hidden_size,
                cfg.moe_intermediate_size
            )
        );
        assert_eq!(
            c.header().identity,
            ModelIdentity::of_checkpoint(&ckpt).expect("identity")
        );
        assert_eq!(
            std::fs::metadata(out.join(CONTAINER_FILE))
                .expect("stat")
                .len(),
            c.header().layout.file_bytes
        );
        let mut buf = Vec::new();
        for layer in LayerId::all(dims.n_layers) {
            for e in ExpertId::all(dims.n_experts) {
                c.read_expert(layer, e, &mut buf)
                    .unwrap_or_else(|err| panic!("{preset}: {err}"));
            }
        }

        let report: serde_json::Value = serde_json::from_slice(
            &std::fs::read(out.join("prepare-report.json")).expect("report"),
        )
        .expect("report json");
        assert_eq!(report["layers_converted"], cfg.num_layers);
        assert_eq!(
            report["layers"].as_array().expect("layers").len(),
            cfg.num_layers
        );
        for kind in ["gate", "up", "down"] {
            let k = &report["dequant_error"][kind];
            let err = k["max_abs_err"].as_f64().expect("max_abs_err");
            let row_rel = k["max_row_rel_err"].as_f64().expect("max_row_rel_err");
            // Symmetric per-row int8: |w − deq| ≤ scale / 2 = max|row| / 254, plus f32 rounding.
            assert!(
                err > 0.0 && row_rel <= 1.0 / 254.0 * 1.0001,
                "{preset} {kind}: {k}"
            );
        }
    }
}

#[test]
fn container_weights_equal_quantize_weights_of_the_checkpoint() {
    for (i, preset) in presets().iter().enumerate() {
        let model = model_dir(preset);
        let tmp = tempfile::tempdir().expect("tempdir");
        prepare(&model, tmp.path());
        let ckpt = Checkpoint::open(&model).expect("fixture opens");
        let cfg = &ckpt.config.text;
        let (f, d) = (cfg.moe_intermediate_size, cfg.hidden_size);
        let locator = ExpertLocator::new(&ckpt);
        let c = ContainerFile::open(tmp.path()).expect("container opens");
        let mut rng = SplitMix64::new(40 + i as u64);
        let mut picks: Vec<(usize, usize)> = (0..4)
            .map(|_| (rng.below(cfg.num_layers), rng.below(cfg.num_experts)))
            .collect();
        picks.push((cfg.num_layers - 1, cfg.num_experts - 1));
        let mut buf = Vec::new();
        for (layer, e) in picks
            .into_iter()
            .map(|(l, e)| (LayerId::from_index(l), ExpertId::from_index(e)))
        {
            let r = locator.expert(layer, e).expect("locate");
            let mut gate_up = read_range(&r.gate);
            gate_up.extend(read_range(&r.up));
            let want_gu = quantize_weights(&gate_up, 2 * f, d);
            let want_dn = quantize_weights(&read_range(&r.down), d, f);
            let blob = c.read_expert(layer, e, &mut buf).expect("read expert");
            let (got_gu, got_dn) = {
                let (gu, dn) = blob.int8().expect("an INT8 container");
                (owned(gu), owned(dn))
            };
            assert_eq!(
                got_gu, want_gu,
                "{preset} layer {layer} expert {e}: gate_up"
            );
            assert_eq!(got_dn, want_dn, "{preset} layer {layer} expert {e}: down");
            assert_eq!(got_gu.dequantize(), want_gu.dequantize());
            assert_eq!(got_dn.dequantize(), want_dn.dequantize());
        }
    }
}

/// A prepared `tiny` container shared by the corruption tests (each works on a copy).
fn prepared_tiny() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("tempdir");
    prepare(&model_dir("tiny"), tmp.path());
    tmp
}

/// Copies `src/experts.sluice` into a fresh directory with byte `at` XOR 0x5a.
fn corrupt_copy(src: &Path, at: u64) -> tempfile::TempDir {
    let dst = tempfile::tempdir().expect("tempdir");
    let mut bytes = std::fs::read(src.join(CONTAINER_FILE)).expect("read container");
    bytes[at as usize] ^= 0x5a;
    std::fs::write(dst.path().join(CONTAINER_FILE), bytes).expect("write copy");
    dst
}

#[test]
fn any_flipped_blob_byte_fails_verify_and_that_experts_read() {
    let good = prepared_tiny();
    let c = ContainerFile::open(good.path()).expect("opens");
    let layout = c.header().layout;
    let b = layout.blob;
    let (layer, expert) = (LayerId::new(2), ExpertId::new(5));
    let base = layout.blob_offset(layer, expert).expect("in range");
    let positions = [
        ("gate_up packed", b.gate_up_packed.offset + 3),
        ("gate_up packed (up rows)", b.gate_up_packed.end() - 1),
        ("down packed", b.down_packed.offset + b.down_packed.len / 2),
        ("gate_up scales", b.gate_up_scales.offset + 1),
        ("down scales", b.down_scales.end() - 2),
        ("gate_up row sums", b.gate_up_row_sums.offset),
        ("down row sums", b.down_row_sums.offset + 5),
        ("checksum trailer", b.checksum_offset + 7),
        ("padding", b.content_bytes + 100),
        ("last padding byte", b.stride - 1),
    ];
    for (what, pos) in positions {
        let at = base + pos as u64;
        let dir = corrupt_copy(good.path(), at);
        let o = verify(dir.path(), &[]);
        let out = text(&o);
        assert!(
            !o.status.success(),
            "{what}: verify passed a flipped byte at {at}"
        );
        let named = format!("layer {layer} expert {expert}: blob at file offset {base}");
        assert!(
            out.contains(&named) && out.contains("FAILED: 1 problem"),
            "{what}: {out}"
        );
        let flipped = ContainerFile::open(dir.path()).expect("header and index are intact");
        let mut buf = Vec::new();
        let err = flipped
            .read_expert(layer, expert, &mut buf)
            .err()
            .unwrap_or_else(|| panic!("{what}: read_expert passed"));
        assert!(err.to_string().contains(&named), "{what}: {err}");
        assert!(
            matches!(
                err,
                ContainerError::BlobChecksum { .. } | ContainerError::BlobPadding { .. }
            ),
            "{what}: {err}"
        );
        // Its neighbours are untouched.
        flipped
            .read_expert(layer, ExpertId::new(expert.get() - 1), &mut buf)
            .expect("neighbour before");
        flipped
            .read_expert(layer, ExpertId::new(expert.get() + 1), &mut buf)
            .expect("neighbour after");
    }
}

#[test]
fn flipped_header_or_index_bytes_fail_verify_and_open() {
    let good = prepared_tiny();
    let layout = ContainerFile::open(good.path())
        .expect("opens")
        .header()
        .layout;
    let entry = |layer: usize, expert: usize| {
        layout.index_entry_offset(layer * layout.dims.n_experts + expert)
    };
    let cases: Vec<(&str, u64, &str)> = vec![
        ("magic", 2, "not a sluice expert container"),
        (
            "version",
            VERSION_OFFSET as u64,
            "unsupported container version",
        ),
        ("n_experts", N_EXPERTS_OFFSET as u64, "header_checksum"),
        ("identity byte", 40, "header_checksum"),
        (
            "index_checksum field",
            INDEX_CHECKSUM_OFFSET as u64 + 1,
            "header_checksum",
        ),
        (
            "header_checksum field",
            HEADER_CHECKSUM_OFFSET as u64,
            "header_checksum",
        ),
        ("reserved", 3000, "header reserved byte at offset 3000"),
        (
            "index entry offset",
            entry(1, 3) + 1,
            "layer 1 expert 3: index entry at file offset",
        ),
        (
            "index entry length",
            entry(3, 7) + 9,
            "layer 3 expert 7: index entry at file offset",
        ),
        (
            "index entry checksum",
            entry(0, 2) + 16,
            "index checksum mismatch",
        ),
        (
            "index padding",
            layout.index_offset + layout.index_bytes + 10,
            "index padding byte",
        ),
    ];
    for (what, at, expected) in cases {
        let dir = corrupt_copy(good.path(), at);
        let o = verify(dir.path(), &[]);
        assert!(!o.status.success(), "{what}: verify passed");
        assert!(
            text(&o).contains(expected),
            "{what}: expected {expected:?} in: {}",
            text(&o)
        );
        let err = ContainerFile::open(dir.path())
            .err()
            .unwrap_or_else(|| panic!("{what}: open passed"));
        assert!(err.to_string().contains(expected), "{what}: {err}");
    }
    // A corrupt index checksum field is also reported against the blob it describes.
    let dir = corrupt_copy(good.path(), entry(0, 2) + 16);
    assert!(text(&verify(dir.path(), &[])).contains("layer 0 expert 2: blob at file offset"));
}

#[test]
fn truncated_or_extended_files_fail() {
    let good = prepared_tiny();
    let full = std::fs::read(good.path().join(CONTAINER_FILE)).expect("read");
    for (what, len) in [
        ("one byte short", full.len() - 1),
        ("one page short", full.len() - 4096),
        ("header only", 4096),
        ("100 bytes", 100),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(CONTAINER_FILE), &full[..len]).expect("write");
        let o = verify(dir.path(), &[]);
        assert!(!o.status.success(), "{what}: verify passed");
        let out = text(&o);
        assert!(
            out.contains("file_bytes") || out.contains("truncated"),
            "{what}: {out}"
        );
        assert!(
            ContainerFile::open(dir.path()).is_err(),
            "{what}: open passed"
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut longer = full.clone();
    longer.push(0);
    std::fs::write(dir.path().join(CONTAINER_FILE), &longer).expect("write");
    assert!(
        !verify(dir.path(), &[]).status.success(),
        "extended file passed"
    );
    assert_eq!(
        ContainerFile::open(dir.path()).err(),
        Some(ContainerError::FileLength {
            found: full.len() as u64 + 1,
            expected: full.len() as u64
        })
    );
}

#[test]
fn killed_prepare_resumes_to_a_byte_identical_file() {
    let model = model_dir("small");
    let reference = tempfile::tempdir().expect("tempdir");
    prepare(&model, reference.path());
    let want = std::fs::read(reference.path().join(CONTAINER_FILE)).expect("reference");

    let layout = ContainerFile::open(reference.path())
        .expect("reference opens")
        .header()
        .layout;

    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("c");
    let partial = out.join(PARTIAL_FILE);
    let mut child = Command::new(workspace_bin("expertd"))
        .args([
            "prepare",
            path_str(&model),
            "--out",
            path_str(&out),
            "--throttle-ms",
            "25",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn expertd");
    // Kill it once blob (2, 1) is on disk: layers 0 and 1 are complete, layer 2 is half written
    // (its remaining 14 blobs take ≥ 350 ms more).
    let (blob, trailer) = (
        layout
            .blob_offset(LayerId::new(2), ExpertId::new(1))
            .expect("in range"),
        layout.blob.checksum_offset as u64,
    );
    let want_trailer = &want[(blob + trailer) as usize..(blob + trailer + 8) as usize];
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut got = [0u8; 8];
        let written = std::fs::File::open(&partial).ok().is_some_and(|f| {
            f.read_exact_at(&mut got, blob + trailer).is_ok() && got == want_trailer
        });
        if written {
            break;
        }
        assert!(Instant::now() < deadline, "prepare never wrote blob (2, 1)");
        assert!(
            child.try_wait().expect("poll child").is_none(),
            "prepare finished before it could be killed"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    assert!(
        !out.join(CONTAINER_FILE).exists(),
        "killed run must not leave a final container"
    );
    assert_eq!(
        ContainerFile::open_file(&partial).err(),
        Some(ContainerError::Unfinished)
    );

    // Also damage one blob of finished layer 0: the rerun must notice and redo that layer.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&partial)
        .expect("open partial");
    let at = layout
        .blob_offset(LayerId::new(0), ExpertId::new(3))
        .expect("in range")
        + 17;
    file.write_all_at(&[want[at as usize] ^ 0xff], at)
        .expect("damage");
    drop(file);

    let o = prepare(&model, &out);
    let log = text(&o);
    assert!(log.contains("resuming"), "{log}");
    assert!(log.contains("layer 0: incomplete"), "{log}");
    assert!(log.contains("layer 1: all blobs valid, kept"), "{log}");
    assert!(log.contains("layer 2: incomplete"), "{log}");
    assert!(log.contains("layer 4: incomplete"), "{log}");
    let got = std::fs::read(out.join(CONTAINER_FILE)).expect("resumed container");
    assert!(
        got == want,
        "resumed container differs from the uninterrupted one"
    );
    assert!(!partial.exists());
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("prepare-report.json")).expect("report"))
            .expect("json");
    assert_eq!(report["layers_kept"], 1, "{report}");
    assert_eq!(report["layers_converted"], 4, "{report}");
    let reference_report: serde_json::Value = serde_json::from_slice(
        &std::fs::read(reference.path().join("prepare-report.json")).expect("report"),
    )
    .expect("json");
    assert_eq!(
        report["dequant_error"], reference_report["dequant_error"],
        "resumed report covers every layer"
    );
    assert!(verify(&out, &[]).status.success());
}

#[test]
fn another_models_container_is_refused_and_a_rerun_is_up_to_date() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (tiny, small) = (model_dir("tiny"), model_dir("small"));
    prepare(&tiny, tmp.path());
    let before = std::fs::read(tmp.path().join(CONTAINER_FILE)).expect("read");
    let o = prepare(&tiny, tmp.path());
    assert!(text(&o).contains("is up to date"), "{}", text(&o));
    assert_eq!(
        std::fs::read(tmp.path().join(CONTAINER_FILE)).expect("read"),
        before,
        "up-to-date rerun rewrote the file"
    );

    let id = |m: &Path| {
        ModelIdentity::of_checkpoint(&Checkpoint::open(m).expect("opens"))
            .expect("identity")
            .to_string()
    };
    let o = expertd(&["prepare", path_str(&small), "--out", path_str(tmp.path())]);
    assert!(
        !o.status.success(),
        "prepare overwrote another model's container"
    );
    let msg = text(&o);
    assert!(
        msg.contains("different model") && msg.contains(&id(&tiny)) && msg.contains(&id(&small)),
        "{msg}"
    );
    assert_eq!(
        std::fs::read(tmp.path().join(CONTAINER_FILE)).expect("read"),
        before,
        "refused run touched the file"
    );

    // verify --model names the mismatch too.
    let o = verify(tmp.path(), &["--model", path_str(&small)]);
    assert!(
        !o.status.success() && text(&o).contains("identity mismatch"),
        "{}",
        text(&o)
    );

    // An unfinished file of another model is refused as well.
    std::fs::rename(
        tmp.path().join(CONTAINER_FILE),
        tmp.path().join(PARTIAL_FILE),
    )
    .expect("rename");
    let o = expertd(&["prepare", path_str(&small), "--out", path_str(tmp.path())]);
    assert!(
        !o.status.success()
            && text(&o).contains(PARTIAL_FILE)
            && text(&o).contains("different model"),
        "{}",
        text(&o)
    );
}

/// A checkpoint re-saved with per-expert tensors converts to the same expert blobs as the
/// fused original (the identity differs: tensor names are part of it).
#[test]
fn per_expert_layout_converts_to_the_same_blobs() {
    let original = model_dir("tiny");
    let split = tests::copy_model(&original);
    tests::split_experts(split.path());
    let (a, b) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    tests::prepare_container(&original, a.path());
    tests::prepare_container(split.path(), b.path());
    let fa = ContainerFile::open(a.path()).expect("fused container");
    let fb = ContainerFile::open(b.path()).expect("per-expert container");
    let blobs_at = fa.index()[0].offset as usize;
    assert_eq!(blobs_at, fb.index()[0].offset as usize);
    let bytes_a = std::fs::read(a.path().join("experts.sluice")).expect("read");
    let bytes_b = std::fs::read(b.path().join("experts.sluice")).expect("read");
    assert_eq!(bytes_a.len(), bytes_b.len());
    assert!(
        bytes_a[blobs_at..] == bytes_b[blobs_at..],
        "expert blobs differ between layouts"
    );
    assert_ne!(
        fa.header().identity,
        fb.header().identity,
        "tensor names are part of the identity"
    );
}
