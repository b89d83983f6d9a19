//! sluice's GGUF reader (`shared::gguf`) against a file written by llama.cpp's own Python
//! package (`gguf` on PyPI, `tests/oracle/make_gguf.py`), and what that package's reader finds
//! in it (`pygguf.json`): every metadata key with its type and value, every tensor's ggml
//! shape, type, absolute offset and size, its dequantized values bit for bit (every type
//! `shared::gguf::dequantize` reads), and the ggml type-size table.

use serde_json::Value as Json;
use shared::gguf::{DEQUANTIZED, GGML_TYPES, Value, dequantize, parse};
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/gguf")
        .join(name)
}

/// A metadata value as the Python reader reports it: its type names and its value.
fn as_python(v: &Value) -> (Vec<&'static str>, Json) {
    let scalar = |v: &Value| -> (&'static str, Json) {
        match v {
            Value::U8(x) => ("UINT8", (*x).into()),
            Value::I8(x) => ("INT8", (*x).into()),
            Value::U16(x) => ("UINT16", (*x).into()),
            Value::I16(x) => ("INT16", (*x).into()),
            Value::U32(x) => ("UINT32", (*x).into()),
            Value::I32(x) => ("INT32", (*x).into()),
            Value::F32(x) => ("FLOAT32", f64::from(*x).into()),
            Value::Bool(x) => ("BOOL", (*x).into()),
            Value::String(x) => ("STRING", x.clone().into()),
            Value::U64(x) => ("UINT64", (*x).into()),
            Value::I64(x) => ("INT64", (*x).into()),
            Value::F64(x) => ("FLOAT64", (*x).into()),
            Value::Array(..) => unreachable!("no nested arrays"),
        }
    };
    match v {
        Value::Array(_, values) => {
            let items: Vec<(&str, Json)> = values.iter().map(scalar).collect();
            let ty = items.first().map_or("?", |i| i.0);
            (
                vec!["ARRAY", ty],
                Json::Array(items.into_iter().map(|i| i.1).collect()),
            )
        }
        v => {
            let (ty, j) = scalar(v);
            (vec![ty], j)
        }
    }
}

#[test]
fn a_gguf_written_by_llama_cpps_python_package_reads_as_its_own_reader_says() {
    let bytes = std::fs::read(fixture("pygguf.gguf")).expect("fixture");
    let want: Json = serde_json::from_str(
        &std::fs::read_to_string(fixture("pygguf.json")).expect("expectations"),
    )
    .expect("json");
    assert_eq!(want["file_len"].as_u64(), Some(bytes.len() as u64));
    let g = parse(&bytes, bytes.len() as u64).expect("parse");

    let fields = want["fields"].as_object().expect("fields");
    assert_eq!(g.metadata.len(), fields.len());
    for (key, value) in &g.metadata {
        let w = &fields[key.as_str()];
        let (types, json) = as_python(value);
        assert_eq!(
            types,
            w["types"]
                .as_array()
                .expect("types")
                .iter()
                .map(|t| t.as_str().expect("str"))
                .collect::<Vec<_>>(),
            "{key}"
        );
        assert_eq!(json, w["value"], "{key}");
    }

    let tensors = want["tensors"].as_array().expect("tensors");
    assert_eq!(g.tensors.len(), tensors.len());
    for (t, w) in g.tensors.iter().zip(tensors) {
        assert_eq!(t.name, w["name"].as_str().expect("name"));
        let dims: Vec<u64> = w["dims"]
            .as_array()
            .expect("dims")
            .iter()
            .map(|d| d.as_u64().expect("u64"))
            .collect();
        assert_eq!(t.dims, dims, "{}", t.name);
        assert_eq!(t.ty.name, w["type"].as_str().expect("type"), "{}", t.name);
        assert_eq!(
            t.offset,
            w["offset"].as_u64().expect("offset"),
            "{}",
            t.name
        );
        assert_eq!(t.len, w["n_bytes"].as_u64().expect("n_bytes"), "{}", t.name);
        // Dequantized bit for bit as the package does.
        let want: Vec<u32> = w["dequant_bits"]
            .as_array()
            .expect("bits")
            .iter()
            .map(|b| b.as_u64().expect("u64") as u32)
            .collect();
        let mut got = vec![0f32; want.len()];
        dequantize(
            t.ty,
            &bytes[t.offset as usize..(t.offset + t.len) as usize],
            &mut got,
        )
        .unwrap_or_else(|e| panic!("{}: {e}", t.name));
        let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
        let diff = got.iter().zip(&want).filter(|(a, b)| a != b).count();
        assert_eq!(
            diff,
            0,
            "{} ({}): {diff} of {} values differ",
            t.name,
            t.ty.name,
            want.len()
        );
    }
    // Every type dequantize reads is in the fixture.
    for ty in DEQUANTIZED {
        assert!(
            g.tensors.iter().any(|t| t.ty.name == *ty),
            "no {ty} tensor in the fixture"
        );
    }

    // The type table: every type the package knows, with its id, block and size (Q8_1 aside:
    // the package sizes it with f32 scales, ggml with f16).
    let sizes = want["type_sizes"].as_object().expect("type_sizes");
    assert_eq!(sizes.len(), GGML_TYPES.len());
    for &(id, name, block, bytes) in GGML_TYPES {
        let w = &sizes[name];
        assert_eq!(w["id"].as_u64(), Some(u64::from(id)), "{name}");
        assert_eq!(w["block"].as_u64(), Some(block), "{name}");
        if name != "Q8_1" {
            assert_eq!(w["bytes"].as_u64(), Some(bytes), "{name}");
        }
    }
}
