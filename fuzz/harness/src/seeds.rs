//! The seed corpus: a few valid (and a few nearly valid) inputs per target, built with the
//! project's own writers so that they track the formats. `fuzz-stable --write-seeds` writes
//! them to `fuzz/corpus/<target>/seed-*` (committed); both drivers start from that folder.

use prost::Message;
use proto::v1;
use shared::container::writer::finish;
use shared::container::{ContainerLayout, ExpertDims, ExpertFormat, ModelIdentity};
use shared::ids::LayerId;
use shared::ring::{self, RingLayout, RingView, Submission};
use shared::shm_layout::{
    HELLO_FLAG_SEGMENT, HELLO_VERSION, Hello, HelloReply, REPLY_OK, SEGMENT_HEADER_BYTES,
    SLICE_ALIGN, SegmentHeader, SlotLayout,
};

use crate::bytes::Aligned;

/// The seeds of `target`, by file name.
pub fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let list: Vec<Vec<u8>> = match target {
        "safetensors_header" => safetensors(),
        "container" => container(),
        "gguf" => gguf(),
        "shm_segment" => shm_segment(),
        "shm_ring" => shm_ring(),
        "proto_convert" => proto(),
        "http_params" => http(),
        _ => Vec::new(),
    };
    list.into_iter()
        .enumerate()
        .map(|(i, b)| (format!("seed-{i:02}"), b))
        .collect()
}

/// Tokens the stable runner splices into inputs of `target` (also written as the libFuzzer
/// dictionary `fuzz/dicts/<target>.dict`).
pub fn dictionary(target: &str) -> &'static [&'static str] {
    match target {
        "http_params" => &[
            "\"model\"",
            "\"sluice\"",
            "\"messages\"",
            "\"role\"",
            "\"content\"",
            "\"user\"",
            "\"system\"",
            "\"assistant\"",
            "\"developer\"",
            "\"tool\"",
            "\"text\"",
            "\"type\"",
            "\"prompt\"",
            "\"temperature\"",
            "\"top_p\"",
            "\"top_k\"",
            "\"min_p\"",
            "\"seed\"",
            "\"stop\"",
            "\"n\"",
            "\"max_tokens\"",
            "\"max_completion_tokens\"",
            "\"logprobs\"",
            "\"top_logprobs\"",
            "\"stream\"",
            "\"stream_options\"",
            "\"include_usage\"",
            "\"reasoning_content\"",
            "\"chat_template_kwargs\"",
            "\"enable_thinking\"",
            "\"tools\"",
            "\"tool_calls\"",
            "\"response_format\"",
            "\"presence_penalty\"",
            "\"frequency_penalty\"",
            "\"repetition_penalty\"",
            "\"echo\"",
            "\"suffix\"",
            "\"best_of\"",
            "null",
            "true",
            "false",
            "[]",
            "{}",
            "-1",
            "0",
            "1",
            "1e309",
            "-0.0",
            "9223372036854775807",
            "18446744073709551616",
            "\"\\ud800\"",
            "\"\\u0000\"",
            "4294967296",
            "2.5",
        ],
        "safetensors_header" => &[
            "{\"",
            "\"dtype\"",
            "\"shape\"",
            "\"data_offsets\"",
            "\"__metadata__\"",
            "\"BF16\"",
            "\"F32\"",
            "\"F4\"",
            "\"U8\"",
            "\"I64\"",
            "[0,",
            "18446744073709551615",
            "2305843009213693951",
            "[]",
        ],
        _ => &[],
    }
}

fn gguf() -> Vec<Vec<u8>> {
    use shared::gguf::{GgmlType, GgufWriter, Value, WriteTensor};
    let ty = |n| GgmlType::from_name(n).expect("type");
    let f32s = [0u8; 16];
    let q8 = [1u8; 34];
    let q4k = [2u8; 144];
    let full = GgufWriter::new()
        .kv("general.architecture", Value::String("qwen35moe".into()))
        .kv("qwen35moe.block_count", Value::U32(2))
        .kv("f", Value::F32(0.5))
        .kv("b", Value::Bool(true))
        .kv(
            "toks",
            Value::Array(
                8,
                vec![Value::String("a".into()), Value::String("b".into())],
            ),
        )
        .kv("ids", Value::Array(5, vec![Value::I32(1)]))
        .to_bytes(&[
            WriteTensor {
                name: "w",
                dims: &[2, 2],
                ty: ty("F32"),
                data: &f32s,
            },
            WriteTensor {
                name: "q",
                dims: &[32],
                ty: ty("Q8_0"),
                data: &q8,
            },
            WriteTensor {
                name: "k",
                dims: &[256, 1],
                ty: ty("Q4_K"),
                data: &q4k,
            },
        ])
        .expect("write");
    let packed = GgufWriter::new()
        .kv("general.alignment", Value::U32(1))
        .to_bytes(&[WriteTensor {
            name: "w",
            dims: &[4],
            ty: ty("F32"),
            data: &f32s,
        }])
        .expect("write");
    // The smallest file with routed experts: one layer, two experts of hidden 2, inner 1.
    let w8 = [0u8; 16];
    let experts = GgufWriter::new()
        .kv("general.architecture", Value::String("qwen35moe".into()))
        .kv("qwen35moe.block_count", Value::U32(1))
        .kv("qwen35moe.expert_count", Value::U32(2))
        .kv("qwen35moe.embedding_length", Value::U32(2))
        .kv("qwen35moe.expert_feed_forward_length", Value::U32(1))
        .to_bytes(&[
            WriteTensor {
                name: "blk.0.ffn_gate_exps.weight",
                dims: &[2, 1, 2],
                ty: ty("F32"),
                data: &w8,
            },
            WriteTensor {
                name: "blk.0.ffn_up_exps.weight",
                dims: &[2, 1, 2],
                ty: ty("F32"),
                data: &w8,
            },
            WriteTensor {
                name: "blk.0.ffn_down_exps.weight",
                dims: &[1, 2, 2],
                ty: ty("F32"),
                data: &w8,
            },
        ])
        .expect("write");
    // The same with gate and up fused into one ffn_gate_up_exps tensor.
    let w16 = [0u8; 32];
    let fused = GgufWriter::new()
        .kv("general.architecture", Value::String("qwen35moe".into()))
        .kv("qwen35moe.block_count", Value::U32(1))
        .kv("qwen35moe.expert_count", Value::U32(2))
        .kv("qwen35moe.embedding_length", Value::U32(2))
        .kv("qwen35moe.expert_feed_forward_length", Value::U32(1))
        .to_bytes(&[
            WriteTensor {
                name: "blk.0.ffn_gate_up_exps.weight",
                dims: &[2, 2, 2],
                ty: ty("F32"),
                data: &w16,
            },
            WriteTensor {
                name: "blk.0.ffn_down_exps.weight",
                dims: &[1, 2, 2],
                ty: ty("F32"),
                data: &w8,
            },
        ])
        .expect("write");
    vec![
        GgufWriter::new().to_bytes(&[]).expect("write"),
        full,
        packed,
        experts,
        fused,
        // A whole model as llama.cpp's converter writes it (the `tiny` checkpoint, 788 KB): the
        // only seed whose metadata makes a config, so the dense tensors are read back.
        include_bytes!("../../../tests/fixtures/gguf/tiny-llamacpp-bf16.gguf").to_vec(),
    ]
}

fn st_file(header: &str, payload: usize) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.resize(v.len() + payload, 0);
    v
}

fn safetensors() -> Vec<Vec<u8>> {
    vec![
        st_file(
            r#"{"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[8,20]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
            20,
        ),
        st_file(
            r#"{"__metadata__":{"format":"pt"},"w":{"dtype":"I8","shape":[4,4],"data_offsets":[0,16]}}"#,
            16,
        ),
        st_file(
            r#"{"x":{"dtype":"F4","shape":[2,3],"data_offsets":[0,3]},"e":{"dtype":"U8","shape":[0],"data_offsets":[3,3]}}"#,
            3,
        ),
        st_file("{}", 0),
        st_file(
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
            7,
        ),
    ]
}

fn identity() -> ModelIdentity {
    ModelIdentity {
        config_sha256: [0x11; 32],
        expert_tensors_sha256: [0x22; 32],
        expert_sample_sha256: [0x33; 32],
    }
}

fn container() -> Vec<Vec<u8>> {
    let layout = ContainerLayout::new(ExpertDims {
        n_layers: 2,
        n_experts: 3,
        hidden: 16,
        inner: 8,
        format: ExpertFormat::Int8,
    })
    .expect("layout");
    let sums: Vec<u64> = (0..6).map(|i| 0x1234_5678 * (i + 1)).collect();
    let (_, header) = finish(identity(), layout, &sums);
    let mut raw = vec![0u8];
    raw.extend(header.encode());
    let mut resealed = vec![0x20u8];
    resealed.extend(header.encode());
    // Mode 1: dimensions (small) then identity and index checksum, no patches; and with patches.
    let built = vec![1u8, 1, 2, 15, 7, 1, 2, 3, 4, 5, 6, 7, 8];
    let mut patched = vec![0x21u8, 0, 0, 31, 31];
    patched.extend([0u8; 32]);
    patched.extend([0x40, 0, 1, 0x41, 0, 2]);
    // Mode 2: an index region sized and checksummed by the target, or raw.
    let index = vec![0x32u8, 1, 2, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0];
    let mut raw_index = vec![2u8, 0, 1, 0, 0];
    raw_index.extend(0u64.to_le_bytes());
    raw_index.extend(shared::container::index::encode_index(
        &ContainerLayout::new(ExpertDims {
            n_layers: 1,
            n_experts: 2,
            hidden: 1,
            inner: 1,
            format: ExpertFormat::Int8,
        })
        .expect("layout"),
        &[7, 9],
    ));
    // Mode 3: a blob of the exact length with a fresh trailer (valid), and a raw short one.
    let blob = vec![0x33u8, 15, 7, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3];
    let short_blob = vec![3u8, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 9, 9];
    vec![
        raw, resealed, built, patched, index, raw_index, blob, short_blob,
    ]
}

fn shm_segment() -> Vec<Vec<u8>> {
    let hello = Hello {
        version: HELLO_VERSION,
        flags: HELLO_FLAG_SEGMENT,
    };
    let reply = HelloReply {
        status: REPLY_OK,
        segment_id: 7,
    };
    let slots = SlotLayout::new(2, 3, 5)
        .expect("slots")
        .with_ring(24)
        .expect("ring");
    let with_ring = slots.header();
    let plain = SegmentHeader::new(4096);
    let mut out = vec![
        [&[0u8][..], &hello.encode()].concat(),
        [&[1u8][..], &reply.encode()].concat(),
    ];
    // Mode 2: file size = the header's claim.
    for h in [plain, with_ring] {
        let mut v = vec![2u8];
        v.extend(h.segment_bytes.to_le_bytes());
        v.extend(h.encode());
        out.push(v);
    }
    // Mode 3: a real sealed memfd of the layout's size, and a too-small one.
    let mut seg = vec![3u8];
    seg.extend([0u8; 48]);
    let mut body = vec![0u8; slots.segment_bytes as usize];
    body[..SEGMENT_HEADER_BYTES].copy_from_slice(&with_ring.encode());
    seg.extend(body);
    out.push(seg);
    out.push([&[0x13u8][..], &[0u8; 48], &SegmentHeader::new(192).encode()].concat());
    out
}

fn shm_ring() -> Vec<Vec<u8>> {
    // Fields as `shm_ring::run` reads them: mode, 4 dims, message length, ring offset, entries, cells.
    let (n_layers_b, n_experts_b, hidden_b, max_rows_b) = (1u8, 7u8, 3u8, 1u8); // 2 layers, 8 experts, d 4, 2 rows
    let (offset_b, entries_b, cells_b) = (2u8, 1u8, 7u8); // offset 192, 2 entries, 8 cells
    let layout = RingLayout {
        offset: SEGMENT_HEADER_BYTES as u64 + SLICE_ALIGN * 2,
        entries: 2,
        cells: 8,
    };
    let mut out = Vec::new();
    for mode in [0u8, 0x20] {
        let len = layout.offset + layout.bytes() + SLICE_ALIGN * u64::from(mode >> 5);
        let mut seg = Aligned::new(&[], len as usize);
        // SAFETY: `seg` is 64-aligned and holds the whole ring (len covers offset + bytes).
        let view = unsafe { RingView::new(seg.as_mut_ptr(), layout) };
        let sub = |op, layer, n_rows, top_k| Submission {
            op,
            seq: 5,
            layer: LayerId::new(layer),
            n_rows,
            top_k,
            step: 1,
            input_offset: 64,
            output_offset: 64 + 64,
        };
        // The call carries a prefetch hint for layer 1 in the cells after its own.
        view.entry(0).submit_with_hint(
            &sub(ring::OP_MOE, 1, 2, 2),
            &[0, 3, 7, 1],
            &[0.5, 0.5, 0.25, 0.75],
            LayerId::new(1),
            &[2, 5],
        );
        view.entry(1)
            .submit(&sub(ring::OP_PREFETCH, 0, 1, 3), &[1, 2, 3], &[0.0; 3]);
        let mut v = vec![
            mode,
            n_layers_b,
            n_experts_b,
            hidden_b,
            max_rows_b,
            40,
            offset_b,
            entries_b,
            cells_b,
        ];
        v.extend(&seg.bytes()[SEGMENT_HEADER_BYTES..]);
        out.push(v);
    }
    // An echo, and a call whose ids repeat (refused), on the same layout.
    let len = layout.offset + layout.bytes();
    let mut seg = Aligned::new(&[], len as usize);
    // SAFETY: as above.
    let view = unsafe { RingView::new(seg.as_mut_ptr(), layout) };
    view.entry(0).submit(
        &Submission {
            op: ring::OP_ECHO,
            seq: 1,
            layer: LayerId::new(0),
            n_rows: 1,
            top_k: 1,
            step: 0,
            input_offset: 64,
            output_offset: 128,
        },
        &[],
        &[],
    );
    view.entry(1).submit(
        &Submission {
            op: ring::OP_MOE,
            seq: 2,
            layer: LayerId::new(0),
            n_rows: 1,
            top_k: 2,
            step: 0,
            input_offset: 64,
            output_offset: 128,
        },
        &[4, 4],
        &[1.0, 1.0],
    );
    let mut v = vec![
        0u8,
        n_layers_b,
        n_experts_b,
        hidden_b,
        max_rows_b,
        255,
        offset_b,
        entries_b,
        cells_b,
    ];
    v.extend(&seg.bytes()[SEGMENT_HEADER_BYTES..]);
    out.push(v);
    out
}

fn tagged(tag: u8, m: &impl Message) -> Vec<u8> {
    let mut v = vec![tag];
    v.extend(m.encode_to_vec());
    v
}

fn proto() -> Vec<Vec<u8>> {
    let id = v1::ModelIdentity::from(&identity());
    let slice = v1::ShmSlice {
        segment_id: 4096,
        offset_bytes: 64,
        length_bytes: 128,
        dtype: v1::Dtype::F32 as i32,
    };
    let handshake = v1::HandshakeRequest {
        protocol_version: 3,
        client_name: "fuzz".into(),
        client_pid: 1,
        model_identity: Some(id.clone()),
        expected_container_fingerprint: 9,
    };
    let inline = v1::MoeLayerRequest {
        session_id: 1,
        request_id: 2,
        step: 3,
        layer_idx: 0,
        n_tokens: 2,
        top_k: 2,
        expert_ids: vec![0, 1, 2, 3],
        weights: vec![0.5; 4],
        input: Some(v1::moe_layer_request::Input::InputInlineF32Le(
            proto::convert::f32s_to_le_bytes(&[1.0, -0.0, f32::NAN, 2.5]),
        )),
        output_shm: None,
    };
    let shm = v1::MoeLayerRequest {
        input: Some(v1::moe_layer_request::Input::InputShm(slice)),
        output_shm: Some(slice),
        ..inline.clone()
    };
    let reply = v1::HandshakeResponse {
        protocol_version: 3,
        container_fingerprint: 1,
        container_identity: Some(id),
        dims: Some(v1::ModelDims {
            n_layers: 2,
            n_experts: 8,
            hidden_size: 64,
            expert_inner_size: 32,
            expert_format: "int8".into(),
        }),
        ..Default::default()
    };
    let out = v1::MoeLayerResponse {
        output: Some(v1::moe_layer_response::Output::OutputInlineF32Le(vec![
            0, 0, 128, 63,
        ])),
        hits: 1,
        ..Default::default()
    };
    let stats = v1::StatsResponse {
        cache: Some(v1::CacheStats {
            budget_bytes: 1 << 30,
            hits: 5,
            ..Default::default()
        }),
        ..Default::default()
    };
    vec![
        tagged(0, &handshake),
        tagged(1, &inline),
        tagged(1, &shm),
        tagged(2, &reply),
        tagged(3, &out),
        tagged(4, &stats),
        tagged(5, &slice),
    ]
}

fn http() -> Vec<Vec<u8>> {
    let bodies: [(u8, &str); 8] = [
        (
            0,
            r#"{"model":"sluice","messages":[{"role":"user","content":"Hi"}]}"#,
        ),
        (
            0,
            r#"{"model":"sluice","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":null,"reasoning_content":"hmm"},{"role":"user","content":"more"}],"temperature":0.7,"top_p":0.9,"top_k":20,"seed":-3,"stop":["x","y"],"max_completion_tokens":64,"logprobs":true,"top_logprobs":3,"stream":true,"stream_options":{"include_usage":true},"chat_template_kwargs":{"enable_thinking":false}}"#,
        ),
        (
            0,
            r#"{"model":"sluice","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}],"n":2}"#,
        ),
        (0, r#"{"model":"other","messages":[]}"#),
        (
            1,
            r#"{"model":"sluice","prompt":"Once upon a time","max_tokens":16,"stop":"."}"#,
        ),
        (
            1,
            r#"{"model":"sluice","prompt":[[1,2,3]],"logprobs":2,"temperature":0}"#,
        ),
        (
            1,
            r#"{"model":"sluice","prompt":[10,20,999999],"echo":true}"#,
        ),
        (1, r#"{"model":"sluice","prompt":["a","b"],"max_tokens":0}"#),
    ];
    bodies
        .iter()
        .map(|(tag, body)| [&[*tag][..], body.as_bytes()].concat())
        .collect()
}
