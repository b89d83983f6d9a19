//! Locating a `qwen35moe` GGUF's routed experts ([`GgufExperts::locate`]): the ranges of every
//! expert, and an error naming the key or tensor for each way a file can be wrong. (Opening
//! files, `GgufFile::open`, is tested in `tests/it/gguf_llamacpp.rs`.)

use super::*;

/// Hidden 4, inner 2, 3 experts, F32 (one-weight blocks, so the shapes can be tiny).
const H: u64 = 4;
const F: u64 = 2;
const E: u64 = 3;

struct Model {
    kv: Vec<(&'static str, Value)>,
    /// (name, dims, type name, bytes)
    tensors: Vec<(String, Vec<u64>, &'static str, Vec<u8>)>,
}

impl Model {
    /// One routed layer and one declared MTP layer, every weight its own index as f32.
    fn new() -> Model {
        let mut tensors = Vec::new();
        for (part, dims) in [("gate", [H, F, E]), ("up", [H, F, E]), ("down", [F, H, E])] {
            let n = dims.iter().product::<u64>();
            let bytes = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
            tensors.push((
                format!("blk.0.ffn_{part}_exps.weight"),
                dims.to_vec(),
                "F32",
                bytes,
            ));
        }
        Model {
            kv: vec![
                ("general.architecture", Value::String("qwen35moe".into())),
                ("qwen35moe.block_count", Value::U32(2)),
                ("qwen35moe.nextn_predict_layers", Value::U32(1)),
                ("qwen35moe.expert_count", Value::U32(E as u32)),
                ("qwen35moe.embedding_length", Value::U32(H as u32)),
                ("qwen35moe.expert_feed_forward_length", Value::U32(F as u32)),
            ],
            tensors,
        }
    }

    fn set(mut self, key: &'static str, value: Option<Value>) -> Model {
        self.kv.retain(|(k, _)| *k != key);
        if let Some(v) = value {
            self.kv.push((key, v));
        }
        self
    }

    fn bytes(&self) -> Vec<u8> {
        let mut w = GgufWriter::new();
        for (k, v) in &self.kv {
            w = w.kv(k, v.clone());
        }
        let tensors: Vec<WriteTensor<'_>> = self
            .tensors
            .iter()
            .map(|(name, dims, ty, data)| WriteTensor {
                name,
                dims,
                ty: GgmlType::from_name(ty).expect("type"),
                data,
            })
            .collect();
        w.to_bytes(&tensors).expect("write")
    }

    fn locate(&self) -> Result<GgufExperts, GgufError> {
        let b = self.bytes();
        GgufExperts::locate(&parse(&b, b.len() as u64).expect("parses"))
    }
}

fn err_text(m: &Model) -> String {
    m.locate().expect_err("refused").to_string()
}

#[test]
fn every_expert_is_its_own_contiguous_slice() {
    let m = Model::new();
    let b = m.bytes();
    let g = parse(&b, b.len() as u64).expect("parses");
    let x = GgufExperts::locate(&g).expect("locates");
    assert_eq!((x.n_layers, x.n_experts, x.hidden, x.inner), (1, 3, 4, 2));
    let down = &x.layers[0].down;
    assert_eq!((down.rows, down.cols, down.expert_bytes), (4, 2, 32));
    for e in 0..3 {
        let (offset, len) = down.expert_range(e);
        let first = f32::from_le_bytes(b[offset as usize..][..4].try_into().expect("4"));
        assert_eq!(first, (e as u64 * H * F) as f32, "expert {e}");
        assert_eq!(len, 32);
    }
    assert_eq!(x.expert_bytes(0), 3 * 32);
    assert_eq!(x.tensors().count(), 3);
}

#[test]
fn each_wrong_file_is_refused_naming_what_is_wrong() {
    let t = err_text(&Model::new().set(
        "general.architecture",
        Some(Value::String("qwen3moe".into())),
    ));
    assert!(
        t.contains("general.architecture") && t.contains("qwen3moe"),
        "{t}"
    );
    let t = err_text(&Model::new().set("qwen35moe.expert_count", None));
    assert!(
        t.contains("qwen35moe.expert_count") && t.contains("missing"),
        "{t}"
    );
    let t = err_text(&Model::new().set("qwen35moe.embedding_length", Some(Value::I32(-4))));
    assert!(t.contains("qwen35moe.embedding_length"), "{t}");
    let t = err_text(&Model::new().set("qwen35moe.nextn_predict_layers", Some(Value::U32(2))));
    assert!(t.contains("nextn_predict_layers"), "{t}");
    // Without the MTP layer declared, layer 1 must have experts: it has none.
    let t = err_text(&Model::new().set("qwen35moe.nextn_predict_layers", None));
    assert!(
        t.contains("blk.1.ffn_gate_exps.weight") && t.contains("missing"),
        "{t}"
    );

    // A shape whose conversion would hold tens of GB per expert is refused up front.
    let t = err_text(
        &Model::new()
            .set("qwen35moe.embedding_length", Some(Value::U32(65_536)))
            .set(
                "qwen35moe.expert_feed_forward_length",
                Some(Value::U32(2048)),
            ),
    );
    assert!(
        t.contains("expert_feed_forward_length") && t.contains("exceed"),
        "{t}"
    );

    let mut m = Model::new();
    m.tensors.retain(|t| !t.0.contains("down"));
    let t = err_text(&m);
    assert!(
        t.contains("blk.0.ffn_down_exps.weight") && t.contains("missing"),
        "{t}"
    );

    let mut m = Model::new();
    m.tensors[2].1 = vec![H, F, E];
    let t = err_text(&m);
    assert!(
        t.contains("blk.0.ffn_down_exps.weight") && t.contains("shape"),
        "{t}"
    );

    // A type with no dequantizer (Q2_K) is refused by name.
    let mut m = Model::new()
        .set("qwen35moe.embedding_length", Some(Value::U32(256)))
        .set("qwen35moe.expert_count", Some(Value::U32(1)));
    m.tensors = vec![
        (
            "blk.0.ffn_gate_exps.weight".into(),
            vec![256, F, 1],
            "Q2_K",
            vec![0; 84 * 2],
        ),
        (
            "blk.0.ffn_up_exps.weight".into(),
            vec![256, F, 1],
            "Q2_K",
            vec![0; 84 * 2],
        ),
        (
            "blk.0.ffn_down_exps.weight".into(),
            vec![F, 256, 1],
            "F32",
            vec![0; 4 * 512],
        ),
    ];
    let t = err_text(&m);
    assert!(
        t.contains("blk.0.ffn_gate_exps.weight") && t.contains("Q2_K"),
        "{t}"
    );

    let mut m = Model::new();
    m.tensors.push((
        "blk.0.ffn_gate_up_exps.weight".into(),
        vec![H, F, E],
        "F32",
        vec![0; 4 * 24],
    ));
    let t = err_text(&m);
    assert!(
        t.contains("blk.0.ffn_gate_up_exps.weight") && t.contains("shape"),
        "{t}"
    );
}

#[test]
fn a_fused_gate_up_tensor_is_read_as_each_experts_gate_rows_then_its_up_rows() {
    // Expert e of the fused tensor: gate rows then up rows, each F × H weights; weight i of the
    // whole tensor is i.
    let mut m = Model::new();
    m.tensors.retain(|t| t.0.contains("down"));
    let n = H * 2 * F * E;
    m.tensors.push((
        "blk.0.ffn_gate_up_exps.weight".into(),
        vec![H, 2 * F, E],
        "F32",
        (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect(),
    ));
    let b = m.bytes();
    let x = GgufExperts::locate(&parse(&b, b.len() as u64).expect("parses")).expect("locates");
    let first = |t: &ExpertTensor, e: usize| {
        let (at, len) = t.expert_range(e);
        assert_eq!(len, F * H * 4);
        f32::from_le_bytes(b[at as usize..][..4].try_into().expect("4"))
    };
    let l = &x.layers[0];
    for e in 0..E as usize {
        let base = (e as u64 * 2 * F * H) as f32;
        assert_eq!(first(&l.gate, e), base, "gate of expert {e}");
        assert_eq!(first(&l.up, e), base + (F * H) as f32, "up of expert {e}");
    }
    assert_eq!(l.gate.name, l.up.name);
    assert_eq!(l.gate.tensor_bytes, n * 4);
}
