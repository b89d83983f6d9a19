//! `expertd prepare FILE.gguf` (issue 38, item 2) on a `qwen35moe` GGUF made here with
//! `shared::gguf::GgufWriter`, shaped like llama.cpp's Q4_K_M mix: every blob's gate/up/down
//! bytes are the GGUF's own blocks where the tensor's type is the container's (Q4_K gate/up,
//! Q6_K down), and exactly our quantizer's output on the GGUF's dequantized values where it is
//! not (a Q4_K down, a Q4_0 up, an F16 down), each such tensor named in a warning; the default
//! format follows the file's types and `--format` overrides it; `verify --model FILE.gguf`
//! checks the identity; a killed run resumes to the same bytes; a truncated file is refused.

use half::f16;
use shared::container::{CONTAINER_FILE, ContainerFile, PARTIAL_FILE};
use shared::gguf::{GgmlType, GgufWriter, Value, WriteTensor, dequantize};
use shared::ids::{ExpertId, LayerId};
use shared::kernels::kquant::{KQuantKind, quantize_matrix};
use shared::splitmix::SplitMix64;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use tests::workspace_bin;

const HIDDEN: usize = 256;
const INNER: usize = 256;
const EXPERTS: usize = 4;

/// Per layer, the ggml types of gate, up and down: layer 0 as llama.cpp's Q4_K_M writes its
/// "more bits" layers, layer 1 as its others (Q4_K down), layer 2 a mix it never writes.
const LAYERS: [[&str; 3]; 3] = [
    ["Q4_K", "Q4_K", "Q6_K"],
    ["Q4_K", "Q4_K", "Q4_K"],
    ["Q4_K", "Q4_0", "F16"],
];

fn ty(name: &str) -> GgmlType {
    GgmlType::from_name(name).expect("ggml type")
}

/// `w` (`rows × cols`, row-major) encoded as ggml type `name`.
fn encode(name: &str, w: &[f32], rows: usize, cols: usize) -> Vec<u8> {
    match name {
        "Q4_K" => quantize_matrix(KQuantKind::Q4K, w, rows, cols).data,
        "Q6_K" => quantize_matrix(KQuantKind::Q6K, w, rows, cols).data,
        "F16" => w
            .iter()
            .flat_map(|&x| f16::from_f32(x).to_le_bytes())
            .collect(),
        "Q8_0" => w
            .chunks_exact(32)
            .flat_map(|b| {
                let amax = b.iter().fold(0f32, |m, x| m.max(x.abs()));
                let d = amax / 127.0;
                let mut out = f16::from_f32(d).to_le_bytes().to_vec();
                out.extend(b.iter().map(|&x| {
                    let q = if d == 0.0 { 0.0 } else { (x / d).round() };
                    q as i8 as u8
                }));
                out
            })
            .collect(),
        // ggml's quantize_row_q4_0_ref: the signed value of largest magnitude maps to −8.
        "Q4_0" => w
            .chunks_exact(32)
            .flat_map(|b| {
                let max = b
                    .iter()
                    .fold(0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
                let d = max / -8.0;
                let id = if d == 0.0 { 0.0 } else { 1.0 / d };
                let q = |x: f32| ((x * id + 8.5) as i8).min(15) as u8;
                let mut out = f16::from_f32(d).to_le_bytes().to_vec();
                out.extend((0..16).map(|j| q(b[j]) | (q(b[j + 16]) << 4)));
                out
            })
            .collect(),
        // Types only the default-format rule looks at: all-zero blocks (every value 0).
        "Q4_1" | "Q5_0" => {
            let t = ty(name);
            vec![0; rows * cols / t.block as usize * t.block_bytes as usize]
        }
        other => panic!("no encoder for {other}"),
    }
}

/// Writes the test GGUF to `path`: the metadata `GgufExperts::locate` reads (with one MTP
/// layer, not stored, as `--no-mtp` conversions of an MTP config still declare), a dense tensor,
/// and the three expert tensors of every layer.
/// With `fused`, gate and up are one `ffn_gate_up_exps` tensor (llama.cpp's converter with
/// `--fuse-gate-up-exps`), holding the same weights.
fn write_gguf(path: &Path, layers: &[[&str; 3]], fused: bool) {
    let mut rng = SplitMix64::new(38);
    let mut data: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)> = Vec::new();
    let embd: Vec<f32> = (0..HIDDEN * 8)
        .map(|_| (rng.next_f64() - 0.5) as f32)
        .collect();
    data.push((
        "token_embd.weight".into(),
        vec![HIDDEN as u64, 8],
        ty("F32"),
        embd.iter().flat_map(|x| x.to_le_bytes()).collect(),
    ));
    for (layer, types) in layers.iter().enumerate() {
        // Per part, each expert's encoded matrix (gate, up, down; the same draws either way).
        let mut parts: Vec<Vec<Vec<u8>>> = Vec::new();
        for (part, name) in ["gate", "up", "down"].iter().zip(types) {
            let (rows, cols) = if *part == "down" {
                (HIDDEN, INNER)
            } else {
                (INNER, HIDDEN)
            };
            let experts = (0..EXPERTS)
                .map(|_| {
                    let w: Vec<f32> = (0..rows * cols)
                        .map(|_| ((rng.next_f64() - 0.5) * 0.2) as f32)
                        .collect();
                    encode(name, &w, rows, cols)
                })
                .collect();
            parts.push(experts);
            if fused && *part != "down" {
                continue;
            }
            data.push((
                format!("blk.{layer}.ffn_{part}_exps.weight"),
                vec![cols as u64, rows as u64, EXPERTS as u64],
                ty(name),
                parts.last().expect("pushed").concat(),
            ));
        }
        if fused {
            assert_eq!(types[0], types[1], "a fused gate/up tensor has one type");
            let bytes = (0..EXPERTS)
                .flat_map(|e| [parts[0][e].clone(), parts[1][e].clone()])
                .collect::<Vec<_>>()
                .concat();
            data.push((
                format!("blk.{layer}.ffn_gate_up_exps.weight"),
                vec![HIDDEN as u64, 2 * INNER as u64, EXPERTS as u64],
                ty(types[0]),
                bytes,
            ));
        }
    }
    let tensors: Vec<WriteTensor<'_>> = data
        .iter()
        .map(|(name, dims, ty, data)| WriteTensor {
            name,
            dims,
            ty: *ty,
            data,
        })
        .collect();
    let file = GgufWriter::new()
        .kv("general.architecture", Value::String("qwen35moe".into()))
        .kv("qwen35moe.block_count", Value::U32(layers.len() as u32 + 1))
        .kv("qwen35moe.nextn_predict_layers", Value::U32(1))
        .kv("qwen35moe.expert_count", Value::U32(EXPERTS as u32))
        .kv("qwen35moe.expert_used_count", Value::U32(2))
        .kv("qwen35moe.embedding_length", Value::U32(HIDDEN as u32))
        .kv(
            "qwen35moe.expert_feed_forward_length",
            Value::U32(INNER as u32),
        )
        .to_bytes(&tensors)
        .expect("gguf bytes");
    std::fs::write(path, file).expect("write gguf");
}

fn expertd(args: &[&str]) -> Output {
    Command::new(workspace_bin("expertd"))
        .args(args)
        .output()
        .expect("spawn expertd")
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// One expert's slice of a GGUF tensor, read back from the file.
fn slice(gguf: &shared::gguf::GgufFile, name: &str, expert: usize) -> (GgmlType, Vec<u8>) {
    let t = gguf.gguf.tensor(name).expect("tensor");
    let per = t.len / EXPERTS as u64;
    let bytes = gguf
        .read(t.offset + per * expert as u64, per, name)
        .expect("read");
    (t.ty, bytes)
}

/// What the container must hold for a GGUF slice in block format `kind`: the bytes themselves
/// when the types agree, else our quantizer on the dequantized values.
fn expected(ty: GgmlType, bytes: &[u8], kind: KQuantKind, rows: usize, cols: usize) -> Vec<u8> {
    if ty.name == kind.name() {
        return bytes.to_vec();
    }
    let mut values = vec![0f32; rows * cols];
    dequantize(ty, bytes, &mut values).expect("dequantize");
    quantize_matrix(kind, &values, rows, cols).data
}

#[test]
fn a_gguf_prepares_into_its_own_blocks_and_requantizes_only_what_it_must() {
    let work = tempfile::tempdir().expect("tempdir");
    let gguf_path = work.path().join("model.gguf");
    write_gguf(&gguf_path, &LAYERS, false);
    let out = work.path().join("c");
    let o = expertd(&["prepare", s(&gguf_path), "--out", s(&out)]);
    let log = text(&o);
    assert!(o.status.success(), "{log}");
    for (tensor, from, to) in [
        ("blk.1.ffn_down_exps.weight", "Q4_K", "Q6_K"),
        ("blk.2.ffn_up_exps.weight", "Q4_0", "Q4_K"),
        ("blk.2.ffn_down_exps.weight", "F16", "Q6_K"),
    ] {
        let line = format!("warning: {tensor} is {from}, not the container's {to}");
        assert!(log.contains(&line), "missing {line:?} in:\n{log}");
    }
    assert_eq!(log.matches("warning:").count(), 3, "{log}");

    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("prepare-report.json")).expect("report"))
            .expect("report json");
    assert_eq!(report["source"], "gguf");
    assert_eq!(report["expert_format"], "q4k-q6k", "{report}");
    assert_eq!(report["requantized"].as_array().map(Vec::len), Some(3));
    // The copied layer-0 matrices come back exactly: no dequantization error at all.
    let l0 = &report["layers"][0]["dequant_error"];
    assert_eq!(l0["down"]["max_abs_err"], 0.0, "{l0}");
    assert_eq!(l0["gate"]["max_abs_err"], 0.0, "{l0}");

    let gguf = shared::gguf::GgufFile::open(&gguf_path).expect("gguf opens");
    let container = ContainerFile::open(&out).expect("container opens");
    let blob = container.header().layout.blob;
    let mut buf = Vec::new();
    for (layer, _) in LAYERS.iter().enumerate() {
        for e in 0..EXPERTS {
            container
                .read_expert(
                    LayerId::from_index(layer),
                    ExpertId::from_index(e),
                    &mut buf,
                )
                .expect("blob verifies");
            let part = |p: &str| slice(&gguf, &format!("blk.{layer}.ffn_{p}_exps.weight"), e);
            let (gt, gate) = part("gate");
            let (ut, up) = part("up");
            let (dt, down) = part("down");
            let mut want_gu = expected(gt, &gate, KQuantKind::Q4K, INNER, HIDDEN);
            want_gu.extend(expected(ut, &up, KQuantKind::Q4K, INNER, HIDDEN));
            assert!(
                buf[blob.gate_up_packed.range()] == want_gu[..],
                "layer {layer} expert {e}: gate/up blocks"
            );
            let want_down = expected(dt, &down, KQuantKind::Q6K, HIDDEN, INNER);
            assert!(
                buf[blob.down_packed.range()] == want_down[..],
                "layer {layer} expert {e}: down blocks"
            );
        }
    }

    // The identity is the GGUF's: verify against it passes, against a GGUF whose expert bytes
    // differ it fails.
    let o = expertd(&["verify", "--deep", s(&out), "--model", s(&gguf_path)]);
    assert!(o.status.success(), "{}", text(&o));
    let other = work.path().join("other.gguf");
    let mut bytes = std::fs::read(&gguf_path).expect("read gguf");
    let t = gguf.gguf.tensor("blk.2.ffn_gate_exps.weight").expect("t");
    bytes[t.offset as usize + 20] ^= 0x01;
    std::fs::write(&other, &bytes).expect("write other");
    let o = expertd(&["verify", s(&out), "--model", s(&other)]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("expert weight sample"), "{}", text(&o));
    // A second run finds it up to date; preparing the other file into it is refused.
    let o = expertd(&["prepare", s(&gguf_path), "--out", s(&out)]);
    assert!(text(&o).contains("is up to date"), "{}", text(&o));
    let o = expertd(&["prepare", s(&other), "--out", s(&out)]);
    assert!(!o.status.success());
    assert!(text(&o).contains("different model"), "{}", text(&o));

    // `--format int8` overrides the choice: every tensor is requantized, and says so.
    let int8 = work.path().join("int8");
    let o = expertd(&[
        "prepare",
        s(&gguf_path),
        "--out",
        s(&int8),
        "--format",
        "int8",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(text(&o).matches("warning:").count(), 9, "{}", text(&o));
    let c = ContainerFile::open(&int8).expect("int8 container");
    assert_eq!(c.header().layout.dims.format.name(), "int8");
}

#[test]
fn the_default_format_follows_the_files_types() {
    let work = tempfile::tempdir().expect("tempdir");
    for (types, format, warnings) in [
        ([["Q4_K", "Q4_K", "Q4_K"]; 2], "q4k", 0),
        ([["Q8_0", "Q8_0", "Q6_K"]; 2], "int8", 6),
        // Q4_1 is 5.0 bits: still Q4_K's; Q5_0 (5.5) down makes down Q6_K.
        ([["Q4_1", "Q4_1", "Q5_0"]; 2], "q4k-q6k", 6),
    ] {
        let path = work.path().join(format!("{format}.gguf"));
        write_gguf(&path, &types, false);
        let out = work.path().join(format);
        let o = expertd(&["prepare", s(&path), "--out", s(&out)]);
        assert!(o.status.success(), "{}", text(&o));
        assert_eq!(
            text(&o).matches("warning:").count(),
            warnings,
            "{}",
            text(&o)
        );
        let c = ContainerFile::open(&out).expect("container");
        assert_eq!(c.header().layout.dims.format.name(), format);
    }
    // One layer's gate above 5 bits makes the whole file INT8 (gate/up must hold everywhere).
    let path = work.path().join("mixed.gguf");
    write_gguf(
        &path,
        &[["Q4_K", "Q4_K", "Q4_K"], ["Q5_0", "Q4_K", "Q4_K"]],
        false,
    );
    let out = work.path().join("mixed");
    let o = expertd(&["prepare", s(&path), "--out", s(&out)]);
    assert!(o.status.success(), "{}", text(&o));
    let c = ContainerFile::open(&out).expect("container");
    assert_eq!(c.header().layout.dims.format.name(), "int8");
}

#[test]
fn a_killed_gguf_prepare_resumes_to_the_same_bytes_and_a_truncated_gguf_is_refused_by_name() {
    let work = tempfile::tempdir().expect("tempdir");
    let gguf_path = work.path().join("model.gguf");
    // Layer 0 has a requantized tensor: a fresh run warns about it, the resumed run (which
    // keeps layer 0) must not.
    let layers = [["Q4_K", "Q4_0", "Q6_K"], LAYERS[1], LAYERS[2]];
    write_gguf(&gguf_path, &layers, false);
    let reference = work.path().join("ref");
    let o = expertd(&["prepare", s(&gguf_path), "--out", s(&reference)]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("warning: blk.0.ffn_up_exps.weight"),
        "{}",
        text(&o)
    );
    let want = std::fs::read(reference.join(CONTAINER_FILE)).expect("reference");
    let layout = ContainerFile::open(&reference)
        .expect("opens")
        .header()
        .layout;

    let out = work.path().join("c");
    let partial = out.join(PARTIAL_FILE);
    let mut child = Command::new(workspace_bin("expertd"))
        .args([
            "prepare",
            s(&gguf_path),
            "--out",
            s(&out),
            "--throttle-ms",
            "40",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    // Kill it once blob (1, 0) is on disk: layer 0 complete, layer 1 begun.
    let at = layout
        .blob_offset(LayerId::new(1), ExpertId::new(0))
        .expect("in range")
        + layout.blob.checksum_offset as u64;
    let want_trailer = &want[at as usize..at as usize + 8];
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut got = [0u8; 8];
        let written = std::fs::File::open(&partial)
            .ok()
            .is_some_and(|f| f.read_exact_at(&mut got, at).is_ok() && got == want_trailer);
        if written {
            break;
        }
        assert!(Instant::now() < deadline, "prepare never wrote blob (1, 0)");
        assert!(
            child.try_wait().expect("poll").is_none(),
            "prepare finished before it could be killed"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    let o = expertd(&["prepare", s(&gguf_path), "--out", s(&out)]);
    let log = text(&o);
    assert!(o.status.success(), "{log}");
    assert!(log.contains("layer 0: all blobs valid, kept"), "{log}");
    assert!(log.contains("layer 1: incomplete"), "{log}");
    let got = std::fs::read(out.join(CONTAINER_FILE)).expect("resumed");
    assert!(
        got == want,
        "resumed container differs from the uninterrupted one"
    );
    // The kept layer's error statistics survived the kill too.
    let report = |dir: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(dir.join("prepare-report.json")).expect("report"))
            .expect("json")
    };
    assert_eq!(report(&out)["layers"], report(&reference)["layers"]);
    // Only the layers converted again are warned about (not layer 0's).
    assert!(!log.contains("warning: blk.0."), "{log}");

    // Cut inside the last tensor's data: refused before anything is written, naming it.
    let bytes = std::fs::read(&gguf_path).expect("read");
    let cut = work.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() - 4096]).expect("write cut");
    let o = expertd(&["prepare", s(&cut), "--out", s(&work.path().join("x"))]);
    assert!(!o.status.success());
    assert!(
        !work.path().join("x").exists(),
        "nothing written for a truncated file"
    );
    assert!(
        text(&o).contains("blk.2.ffn_down_exps.weight"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_fused_gate_up_gguf_gives_the_same_blobs_as_the_split_one() {
    let work = tempfile::tempdir().expect("tempdir");
    let layers = [["Q4_K", "Q4_K", "Q6_K"], ["Q4_0", "Q4_0", "Q4_K"]];
    let mut blobs = Vec::new();
    for fused in [false, true] {
        let path = work.path().join(format!("fused-{fused}.gguf"));
        write_gguf(&path, &layers, fused);
        let out = work.path().join(format!("c-{fused}"));
        let o = expertd(&["prepare", s(&path), "--out", s(&out)]);
        assert!(o.status.success(), "{}", text(&o));
        let (want, n) = if fused {
            ("warning: blk.1.ffn_gate_up_exps.weight is Q4_0", 2)
        } else {
            ("warning: blk.1.ffn_up_exps.weight is Q4_0", 3)
        };
        assert!(text(&o).contains(want), "{}", text(&o));
        assert_eq!(text(&o).matches("warning:").count(), n, "{}", text(&o));
        let c = ContainerFile::open(&out).expect("container");
        let layout = c.header().layout;
        let bytes = std::fs::read(out.join(CONTAINER_FILE)).expect("read");
        let first = layout
            .blob_offset(LayerId::new(0), ExpertId::new(0))
            .expect("in range") as usize;
        blobs.push(bytes[first..].to_vec());
    }
    assert!(
        blobs[0] == blobs[1],
        "fused and split GGUFs gave different blobs"
    );
}
