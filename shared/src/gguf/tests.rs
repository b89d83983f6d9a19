//! The GGUF reader against files from our writer, every truncation of them, and hand-made
//! corruptions of each checked field.

use super::*;

fn ty(name: &str) -> GgmlType {
    GgmlType::from_name(name).expect("known type")
}

fn sample(alignment: Option<u32>) -> Vec<u8> {
    let f32s: Vec<u8> = (0..12).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let q8 = vec![7u8; 2 * 34];
    let q4k = vec![3u8; 144];
    let mut w = GgufWriter::new()
        .kv("general.architecture", Value::String("qwen35moe".into()))
        .kv("qwen35moe.block_count", Value::U32(2))
        .kv("qwen35moe.rope.freq_base", Value::F32(1e7))
        .kv("flag", Value::Bool(true))
        .kv("big", Value::U64(u64::MAX))
        .kv("neg", Value::I64(-5))
        .kv("pi", Value::F64(std::f64::consts::PI))
        .kv(
            "tokenizer.ggml.tokens",
            Value::Array(
                8,
                vec![
                    Value::String("a".into()),
                    Value::String("<|im_end|>".into()),
                ],
            ),
        )
        .kv(
            "tokenizer.ggml.token_type",
            Value::Array(5, vec![Value::I32(1), Value::I32(3)]),
        );
    if let Some(a) = alignment {
        w = w.kv("general.alignment", Value::U32(a));
    }
    w.to_bytes(&[
        WriteTensor {
            name: "a.weight",
            dims: &[3, 4],
            ty: ty("F32"),
            data: &f32s,
        },
        WriteTensor {
            name: "blk.0.ffn_down_exps.weight",
            dims: &[32, 2],
            ty: ty("Q8_0"),
            data: &q8,
        },
        WriteTensor {
            name: "blk.0.ffn_gate_exps.weight",
            dims: &[256, 1, 1],
            ty: ty("Q4_K"),
            data: &q4k,
        },
    ])
    .expect("write")
}

#[test]
fn a_written_file_reads_back() {
    for alignment in [None, Some(64), Some(1)] {
        let bytes = sample(alignment);
        let g = parse(&bytes, bytes.len() as u64).expect("parse");
        let align = alignment.map_or(DEFAULT_ALIGNMENT, u64::from);
        assert_eq!((g.version, g.alignment), (3, align));
        assert_eq!(
            g.get("qwen35moe.block_count").and_then(Value::as_u64),
            Some(2)
        );
        assert_eq!(
            g.get("general.architecture").and_then(Value::as_str),
            Some("qwen35moe")
        );
        assert_eq!(g.get("neg"), Some(&Value::I64(-5)));
        assert_eq!(g.get("big").and_then(Value::as_u64), Some(u64::MAX));
        assert!(matches!(g.get("tokenizer.ggml.tokens"), Some(Value::Array(8, v)) if v.len() == 2));
        assert_eq!(g.tensors.len(), 3);
        let a = g.tensor("a.weight").expect("a");
        assert_eq!(
            (a.dims.as_slice(), a.ty.name, a.len),
            (&[3u64, 4][..], "F32", 48)
        );
        assert_eq!(a.offset, g.data_offset);
        assert_eq!(
            f32::from_le_bytes(bytes[a.offset as usize + 4..][..4].try_into().unwrap()),
            1.0
        );
        for t in &g.tensors {
            assert_eq!((t.offset - g.data_offset) % align, 0, "{}", t.name);
        }
        let q4 = g.tensor("blk.0.ffn_gate_exps.weight").expect("q4");
        assert_eq!(
            (q4.len, &bytes[q4.offset as usize..][..144]),
            (144, &[3u8; 144][..])
        );
    }
}

#[test]
fn every_truncation_is_refused_and_names_what_it_cut() {
    let bytes = sample(None);
    let full = parse(&bytes, bytes.len() as u64).expect("parse");
    let last = full
        .tensors
        .iter()
        .max_by_key(|t| t.offset)
        .expect("tensors");
    // Padding after the last tensor's bytes is optional: cuts there are fine.
    let end = (last.offset + last.len) as usize;
    assert!(parse(&bytes[..end], end as u64).is_ok());
    for cut in 0..end {
        let e = parse(&bytes[..cut], cut as u64).expect_err("truncated");
        if cut as u64 >= full.data_offset {
            // Inside the data: the tensor whose bytes are cut is named.
            assert!(
                matches!(&e, GgufError::Tensor { why, .. } if why.contains("run past")),
                "{cut}: {e}"
            );
        }
        if cut as u64 >= full.data_offset
            && (cut as u64) < last.offset + last.len
            && cut as u64 > last.offset
        {
            assert!(e.to_string().contains(&last.name), "{cut}: {e}");
        }
    }
    // The header alone (a prefix), with the real length, is enough.
    let g = parse(&bytes[..full.data_offset as usize], bytes.len() as u64).expect("prefix");
    assert_eq!(g, full);
}

/// The offset of the first occurrence of `needle` in `hay`.
fn at(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("needle")
}

#[test]
fn hostile_counts_are_refused_before_allocating() {
    let bytes = sample(None);
    // The metadata count (bytes 16..24).
    let mut b = bytes.clone();
    b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        parse(&b, b.len() as u64),
        Err(GgufError::TooMany { .. })
    ));
    // The tensor count (bytes 8..16).
    let mut b = bytes.clone();
    b[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(matches!(
        parse(&b, b.len() as u64),
        Err(GgufError::TooMany { .. })
    ));
    // A string length: the first key's.
    let mut b = bytes.clone();
    b[24..32].copy_from_slice(&(1u64 << 50).to_le_bytes());
    assert!(matches!(
        parse(&b, b.len() as u64),
        Err(GgufError::TooMany { .. })
    ));
    // An array's count.
    let mut b = bytes.clone();
    let key = at(&b, b"tokenizer.ggml.tokens") + "tokenizer.ggml.tokens".len();
    b[key + 8..key + 16].copy_from_slice(&(1u64 << 33).to_le_bytes());
    let e = parse(&b, b.len() as u64).expect_err("array count");
    assert!(e.to_string().contains("tokenizer.ggml.tokens"), "{e}");
}

#[test]
fn each_bad_field_is_refused_with_its_name() {
    let bytes = sample(None);
    let len = bytes.len() as u64;
    let check = |b: Vec<u8>, needle: &str| {
        let e = parse(&b, b.len() as u64).expect_err(needle);
        assert!(
            e.to_string().contains(needle),
            "{e} does not mention {needle:?}"
        );
    };
    let mut b = bytes.clone();
    b[0] = b'X';
    check(b, "not a GGUF file");
    let mut b = bytes.clone();
    b[4] = 9;
    check(b, "version 9");
    // A tensor's type, dimension count and offset (the fields after its name and dims).
    let name = b"blk.0.ffn_down_exps.weight";
    let ndims = at(&bytes, name) + name.len();
    let ty_at = ndims + 4 + 2 * 8;
    let mut b = bytes.clone();
    b[ty_at..ty_at + 4].copy_from_slice(&4u32.to_le_bytes());
    check(b, "ggml type 4 is unknown");
    let mut b = bytes.clone();
    b[ndims..ndims + 4].copy_from_slice(&5u32.to_le_bytes());
    check(b, "5 dimensions");
    let mut b = bytes.clone();
    b[ty_at + 4..ty_at + 12].copy_from_slice(&1u64.to_le_bytes());
    check(b, "not a multiple of the alignment");
    // Overlap: the Q8_0 tensor placed on the first one.
    let mut b = bytes.clone();
    b[ty_at + 4..ty_at + 12].copy_from_slice(&0u64.to_le_bytes());
    check(b, "overlap");
    // A first dimension that is not whole blocks (33 for Q8_0).
    let mut b = bytes.clone();
    b[ndims + 4..ndims + 12].copy_from_slice(&33u64.to_le_bytes());
    check(b, "not a whole number of Q8_0 blocks");
    // A size that overflows.
    let mut b = bytes.clone();
    // (32 × (2^58 − 1) elements fit int64; 34 bytes per 32 of them do not.)
    b[ndims + 12..ndims + 20].copy_from_slice(&((1u64 << 58) - 1).to_le_bytes());
    check(b, "overflows");
    // A bool of 2, a bad alignment, duplicate keys and tensors, a nested array.
    let flag = at(&bytes, b"flag") + 4 + 4;
    let mut b = bytes.clone();
    b[flag] = 2;
    let g = parse(&b, len).expect("any nonzero byte is true, as llama.cpp reads it");
    assert_eq!(g.get("flag"), Some(&Value::Bool(true)));
    // More elements than ggml's int64, in a tensor of zero bytes (a zero dimension).
    let mut b = bytes.clone();
    b[ndims..ndims + 4].copy_from_slice(&4u32.to_le_bytes());
    let dims: Vec<u8> = [32u64, 1 << 30, 1 << 29, 0]
        .iter()
        .flat_map(|d| d.to_le_bytes())
        .collect();
    b.splice(ndims + 4..ndims + 20, dims);
    check(b, "exceed ggml's int64");
    let mut odd = GgufWriter::new()
        .kv("general.alignment", Value::U32(32))
        .to_bytes(&[])
        .expect("write");
    let v = at(&odd, b"general.alignment") + "general.alignment".len() + 4;
    odd[v..v + 4].copy_from_slice(&48u32.to_le_bytes());
    check(odd, "general.alignment");
    let dup = GgufWriter::new()
        .kv("k", Value::U8(1))
        .kv("k", Value::U8(2))
        .to_bytes(&[])
        .expect("write");
    check(dup, "\"k\" appears twice");
    let t = [0u8; 4];
    let one = WriteTensor {
        name: "t",
        dims: &[1],
        ty: ty("F32"),
        data: &t,
    };
    let two = WriteTensor {
        name: "t",
        dims: &[1],
        ty: ty("F32"),
        data: &t,
    };
    check(
        GgufWriter::new().to_bytes(&[one, two]).expect("write"),
        "tensor \"t\" appears twice",
    );
    let mut nested = GgufWriter::new()
        .kv("n", Value::Array(4, vec![]))
        .to_bytes(&[])
        .expect("write");
    let elem = at(&nested, b"n") + 1 + 4;
    nested[elem..elem + 4].copy_from_slice(&9u32.to_le_bytes());
    check(nested, "value type 9");
    // Not UTF-8.
    let mut b = bytes.clone();
    let arch = at(&b, b"qwen35moe");
    b[arch] = 0xff;
    check(b, "not UTF-8");
    // The whole file is fine with its own length, and refused as one byte short of its last
    // tensor's end.
    assert!(parse(&bytes, len).is_ok());
    let g = parse(&bytes, len).expect("parse");
    let end = g
        .tensors
        .iter()
        .map(|t| t.offset + t.len)
        .max()
        .expect("tensors");
    check(bytes[..end as usize - 1].to_vec(), "run past the file");
}

#[test]
fn the_type_table_has_unique_ids_and_names() {
    for (i, a) in GGML_TYPES.iter().enumerate() {
        for b in &GGML_TYPES[i + 1..] {
            assert!(a.0 != b.0 && a.1 != b.1, "{a:?} {b:?}");
        }
        assert!([1, 32, 64, 128, 256].contains(&a.2), "{a:?}");
    }
    assert_eq!(
        GgmlType::from_name("Q4_K").map(|t| (t.id, t.block_bytes)),
        Some((12, 144))
    );
    assert!(GgmlType::from_id(4).is_none());
}

#[test]
fn version_2_names_of_63_bytes_and_zero_dimension_tensors_are_read() {
    let t = [0u8; 4];
    let long = "n".repeat(MAX_NAME_BYTES);
    let mut bytes = GgufWriter::new()
        .to_bytes(&[
            WriteTensor {
                name: &long,
                dims: &[1],
                ty: ty("F32"),
                data: &t,
            },
            WriteTensor {
                name: "scalar",
                dims: &[],
                ty: ty("F32"),
                data: &t,
            },
            WriteTensor {
                name: "empty",
                dims: &[0, 5],
                ty: ty("Q8_0"),
                data: &[],
            },
        ])
        .expect("write");
    bytes[4] = 2;
    let g = parse(&bytes, bytes.len() as u64).expect("version 2");
    assert_eq!(g.version, 2);
    assert_eq!(g.tensor("scalar").map(|t| t.len), Some(4));
    assert_eq!(g.tensor("empty").map(|t| t.len), Some(0));
    let longer = "n".repeat(MAX_NAME_BYTES + 1);
    let bytes = GgufWriter::new()
        .to_bytes(&[WriteTensor {
            name: &longer,
            dims: &[1],
            ty: ty("F32"),
            data: &t,
        }])
        .expect("write");
    let e = parse(&bytes, bytes.len() as u64).expect_err("64-byte name");
    assert!(e.to_string().contains("more than 63"), "{e}");
}

#[test]
fn a_prefix_too_short_for_the_metadata_is_truncated_not_corrupt() {
    let bytes = sample(None);
    // The tokens array's count fits the file but not the first bytes given.
    let key = at(&bytes, b"tokenizer.ggml.tokens") + "tokenizer.ggml.tokens".len();
    let cut = key + 4 + 8 + 3;
    let e = parse(&bytes[..cut], bytes.len() as u64).expect_err("prefix");
    assert!(matches!(e, GgufError::Truncated { .. }), "{e}");
    // The array limit over all the metadata.
    let many = Value::Array(0, vec![Value::U8(1); MAX_ARRAY_ELEMENTS as usize / 2 + 1]);
    let b = GgufWriter::new()
        .kv("a", many.clone())
        .kv("b", many)
        .to_bytes(&[])
        .expect("write");
    let e = parse(&b, b.len() as u64).expect_err("past the array limit");
    assert!(
        matches!(e, GgufError::TooMany { ref what, .. } if what.contains("\"b\"")),
        "{e}"
    );
}
