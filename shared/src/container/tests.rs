//! Unit tests of the container format: the golden header bytes of a tiny layout, the real
//! dimensions' sizes, and rejection of every corrupt header field, index entry and blob byte.

use super::header::*;
use super::index::{check_index, encode_index, parse_index, region_bytes};
use super::layout::*;
use super::writer::{encode_blob, finish, unfinished_header};
use super::*;
use crate::ids::{ExpertId, LayerId};
use crate::kernels::int8::{QuantizedMatrix, quantize_weights};

/// 2 layers × 3 experts, d = 8, f = 4: every region is small enough to flip every byte.
fn tiny_layout() -> ContainerLayout {
    ContainerLayout::new(ExpertDims::new(2, 3, 8, 4).expect("dims")).expect("layout")
}

fn identity() -> ModelIdentity {
    ModelIdentity {
        config_sha256: [0x11; 32],
        expert_tensors_sha256: [0x22; 32],
        expert_sample_sha256: [0x33; 32],
    }
}

fn tiny_header() -> Header {
    Header {
        magic: VersionedMagic::CompleteV1,
        identity: identity(),
        layout: tiny_layout(),
        index_checksum: 0x0123_4567_89ab_cdef,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Recomputes the header checksum after a deliberate edit, so parsing reaches the field checks.
fn reseal(bytes: &mut [u8]) {
    let sum = checksum::checksum(&bytes[..HEADER_CHECKSUM_OFFSET]);
    bytes[HEADER_CHECKSUM_OFFSET..HEADER_CHECKSUM_OFFSET + 8].copy_from_slice(&sum.to_le_bytes());
}

#[test]
fn tiny_layout_offsets() {
    let l = tiny_layout();
    let b = &l.blob;
    // gate_up [8 × 8] → 16 × 8 packed; down [8 × 4] → 16 × 4 packed; 16 padded rows each.
    let parts = [
        b.gate_up_packed,
        b.down_packed,
        b.gate_up_scales,
        b.down_scales,
        b.gate_up_row_sums,
        b.down_row_sums,
    ];
    let expected = [
        (0, 128),
        (128, 64),
        (192, 64),
        (256, 64),
        (320, 64),
        (384, 64),
    ];
    assert_eq!(parts.map(|p| (p.offset, p.len)), expected);
    assert_eq!(
        (b.checksum_offset, b.content_bytes, b.stride),
        (448, 456, 4096)
    );
    assert_eq!(
        (l.index_offset, l.index_bytes, l.blobs_offset, l.file_bytes),
        (4096, 144, 8192, 8192 + 6 * 4096)
    );
    assert_eq!(
        l.blob_offset(LayerId::new(1), ExpertId::new(2))
            .expect("in range"),
        8192 + 5 * 4096
    );
    assert!(
        matches!(l.blob_offset(LayerId::new(2), ExpertId::new(0)), Err(ContainerError::OutOfRange { layer, expert, .. }) if (layer.get(), expert.get()) == (2, 0))
    );
    assert!(
        matches!(l.blob_offset(LayerId::new(0), ExpertId::new(3)), Err(ContainerError::OutOfRange { expert, .. }) if expert.get() == 3)
    );
}

#[test]
fn real_dimensions_sizes() {
    // Qwen3.6-35B-A3B: 40 layers × 256 experts, d = 2048, f = 512 (docs/container-format.md).
    let l =
        ContainerLayout::new(ExpertDims::new(40, 256, 2048, 512).expect("dims")).expect("layout");
    let b = &l.blob;
    assert_eq!(
        (b.gate_up_packed.len, b.down_packed.len),
        (2_097_152, 1_048_576)
    );
    assert_eq!(
        (
            b.gate_up_scales.len,
            b.down_scales.len,
            b.gate_up_row_sums.len,
            b.down_row_sums.len
        ),
        (4096, 8192, 4096, 8192)
    );
    assert_eq!(
        (b.checksum_offset, b.content_bytes, b.stride),
        (3_170_304, 3_170_312, 3_174_400)
    );
    assert_eq!(l.layer_bytes(), 812_646_400);
    assert_eq!((l.index_bytes, l.blobs_offset), (245_760, 249_856));
    assert_eq!(l.file_bytes, 32_506_105_856);
}

#[test]
fn parts_are_aligned_ordered_and_disjoint_for_many_dims() {
    for d in 1..40 {
        for f in 1..40 {
            let b = BlobLayout::new(d, f).expect("layout");
            let parts = [
                b.gate_up_packed,
                b.down_packed,
                b.gate_up_scales,
                b.down_scales,
                b.gate_up_row_sums,
                b.down_row_sums,
            ];
            let mut end = 0;
            for p in parts {
                assert_eq!(p.offset % PART_ALIGN, 0, "d={d} f={f}");
                assert!(p.offset >= end, "d={d} f={f}: parts overlap");
                end = p.end();
            }
            assert!(b.checksum_offset >= end && b.checksum_offset.is_multiple_of(8));
            assert_eq!(b.stride % ALIGNMENT as usize, 0);
            assert!(b.stride >= b.content_bytes);
        }
    }
}

#[test]
fn caps_and_overflow() {
    assert!(matches!(
        ExpertDims::new(0, 1, 1, 1),
        Err(ContainerError::Dimension {
            field: "n_layers",
            ..
        })
    ));
    assert!(matches!(
        ExpertDims::new(1, 65_537, 1, 1),
        Err(ContainerError::Dimension {
            field: "n_experts",
            ..
        })
    ));
    assert!(matches!(
        ExpertDims::new(1, 1, 70_000, 1),
        Err(ContainerError::Dimension {
            field: "hidden",
            ..
        })
    ));
    assert!(matches!(
        ExpertDims::new(1, 1, 1, 0),
        Err(ContainerError::Dimension {
            field: "expert_inner",
            ..
        })
    ));
    // The largest dims pass their caps but their blob would be 8 GiB.
    let dims = ExpertDims::new(4096, 65_536, 65_536, 65_536).expect("within caps");
    assert!(matches!(
        ContainerLayout::new(dims),
        Err(ContainerError::Dimension {
            field: "blob_stride",
            ..
        })
    ));
}

/// The golden bytes of the tiny header: the fixed fields, then zeros to 4096.
const GOLDEN_TINY_HEADER: &str = concat!(
    "534c554943455850",
    "01000000",
    "00100000", // magic, version, header_bytes
    "1111111111111111111111111111111111111111111111111111111111111111", // config_sha256
    "2222222222222222222222222222222222222222222222222222222222222222", // expert_tensors_sha256
    "3333333333333333333333333333333333333333333333333333333333333333", // expert_sample_sha256
    "02000000",
    "03000000",
    "08000000",
    "04000000", // n_layers, n_experts, hidden, inner
    "77382d73796d2d7065722d726f772d7231366334000000000000000000000000", // quant_scheme (32 bytes)
);

#[test]
fn golden_header_bytes() {
    let bytes = tiny_header().encode();
    assert_eq!(bytes.len(), HEADER_BYTES);
    // Fields up to the quant scheme, byte for byte.
    assert_eq!(hex(&bytes[..ROW_BLOCK_OFFSET]), GOLDEN_TINY_HEADER);
    // The numeric tail: row_block 16, col_group 4, alignment 4096, entry 24, index_offset 4096,
    // index_bytes 144, blobs_offset 8192, stride 4096, content 456, file 32768, index checksum.
    let tail = concat!(
        "10000000",
        "04000000",
        "00100000",
        "18000000",
        "0010000000000000",
        "9000000000000000",
        "0020000000000000",
        "0010000000000000",
        "c801000000000000",
        "0080000000000000",
        "efcdab8967452301",
    );
    assert_eq!(hex(&bytes[ROW_BLOCK_OFFSET..HEADER_CHECKSUM_OFFSET]), tail);
    assert_eq!(
        hex(&bytes[HEADER_CHECKSUM_OFFSET..RESERVED_OFFSET]),
        GOLDEN_TINY_HEADER_CHECKSUM
    );
    assert!(bytes[RESERVED_OFFSET..].iter().all(|&b| b == 0));
    assert_eq!(Header::parse(&bytes).expect("parses"), tiny_header());
    assert_eq!(
        tiny_header().fingerprint(),
        u64::from_le_bytes(
            bytes[HEADER_CHECKSUM_OFFSET..RESERVED_OFFSET]
                .try_into()
                .expect("8")
        )
    );
}

/// The xxh3-64 of the golden header's first 232 bytes, little-endian.
const GOLDEN_TINY_HEADER_CHECKSUM: &str = "b230d4c168efc43b";

/// Parses `bytes` after `edit` (resealing the checksum when `seal`) and returns the error.
fn check(edit: impl FnOnce(&mut Vec<u8>), seal: bool) -> ContainerError {
    let mut bytes = tiny_header().encode();
    edit(&mut bytes);
    if seal {
        reseal(&mut bytes);
    }
    Header::parse(&bytes).expect_err("corrupt header must be rejected")
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn magic_and_version_are_read_together() {
    let e = check(|b| b[0] = b'X', false);
    assert_eq!(
        e,
        ContainerError::NotAContainer {
            found: *b"XLUICEXP"
        }
    );
    let e = check(|b| put32(b, VERSION_OFFSET, 3), false);
    assert_eq!(
        e,
        ContainerError::UnsupportedVersion {
            magic: "SLUICEXP",
            version: 3
        }
    );
    // A safetensors file starts with its header length, not a magic.
    let e = check(|b| b[..8].copy_from_slice(&1234u64.to_le_bytes()), false);
    assert!(matches!(e, ContainerError::NotAContainer { .. }), "{e}");
    let unfinished = Header {
        magic: VersionedMagic::UnfinishedV1,
        ..tiny_header()
    };
    assert_eq!(
        Header::parse(&unfinished.encode()).expect("parses").magic,
        VersionedMagic::UnfinishedV1
    );
    let e = Header::parse(&tiny_header().encode()[..100]).expect_err("short");
    assert_eq!(
        e,
        ContainerError::TooShort {
            what: "header",
            found: 100,
            needed: 4096
        }
    );
}

#[test]
fn checksum_covers_every_field_byte() {
    for at in MAGIC_OFFSET + 12..HEADER_CHECKSUM_OFFSET + 8 {
        let e = check(|b| b[at] ^= 0x01, false);
        assert!(
            matches!(e, ContainerError::HeaderChecksum { offset: 232, .. }),
            "byte {at}: {e}"
        );
    }
}

#[test]
fn every_single_bit_flip_is_rejected() {
    for at in 0..HEADER_BYTES {
        for bit in [0, 7] {
            let e = check(|b| b[at] ^= 1 << bit, false);
            assert!(!e.to_string().is_empty(), "byte {at}");
        }
    }
}

#[test]
fn each_field_is_validated_by_name() {
    let field = |e: ContainerError| match e {
        ContainerError::HeaderField { field, offset, .. }
        | ContainerError::HeaderLimit { field, offset, .. } => (field, offset),
        other => panic!("expected a field error, got {other}"),
    };
    type Edit = fn(&mut Vec<u8>);
    let cases: [(&str, usize, Edit); 18] = [
        ("header_bytes", 12, |b| put32(b, HEADER_BYTES_OFFSET, 8192)),
        ("n_layers", 112, |b| put32(b, N_LAYERS_OFFSET, 0)),
        ("n_layers", 112, |b| put32(b, N_LAYERS_OFFSET, 5000)),
        ("n_experts", 116, |b| put32(b, N_EXPERTS_OFFSET, 0)),
        ("n_experts", 116, |b| put32(b, N_EXPERTS_OFFSET, u32::MAX)),
        ("hidden", 120, |b| put32(b, HIDDEN_OFFSET, 65_537)),
        ("expert_inner", 124, |b| put32(b, EXPERT_INNER_OFFSET, 0)),
        ("row_block", 160, |b| put32(b, ROW_BLOCK_OFFSET, 32)),
        ("col_group", 164, |b| put32(b, COL_GROUP_OFFSET, 8)),
        ("alignment", 168, |b| put32(b, ALIGNMENT_OFFSET, 512)),
        ("index_entry_bytes", 172, |b| {
            put32(b, INDEX_ENTRY_BYTES_OFFSET, 16);
        }),
        ("index_offset", 176, |b| put64(b, INDEX_OFFSET_OFFSET, 0)),
        ("index_bytes", 184, |b| put64(b, INDEX_BYTES_OFFSET, 145)),
        ("blobs_offset", 192, |b| put64(b, BLOBS_OFFSET_OFFSET, 4096)),
        ("blob_stride", 200, |b| put64(b, BLOB_STRIDE_OFFSET, 8192)),
        ("blob_content_bytes", 208, |b| {
            put64(b, BLOB_CONTENT_BYTES_OFFSET, 448);
        }),
        ("file_bytes", 216, |b| put64(b, FILE_BYTES_OFFSET, u64::MAX)),
        // More layers than the derived fields describe: caught at the first derived field.
        ("index_bytes", 184, |b| put32(b, N_LAYERS_OFFSET, 3)),
    ];
    for (name, offset, edit) in cases {
        assert_eq!(
            field(check(edit, true)),
            (name, offset as u64),
            "editing {name}"
        );
    }
    let e = check(|b| b[QUANT_SCHEME_OFFSET + 1] = b'4', true);
    assert_eq!(
        e,
        ContainerError::QuantScheme {
            offset: 128,
            found: "w4-sym-per-row-r16c4".into()
        }
    );
    let e = check(|b| b[4000] = 7, false);
    assert_eq!(
        e,
        ContainerError::HeaderReserved {
            offset: 4000,
            found: 7
        }
    );
}

/// A deterministic expert: gate_up `[2f × d]` and down `[d × f]` from a simple generator.
fn expert(layout: &BlobLayout, seed: u32) -> (QuantizedMatrix, QuantizedMatrix) {
    let values = |n: usize, salt: u32| -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((i as u32)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(seed * 97 + salt)
                    % 2001) as f32
                    / 1000.0
                    - 1.0
            })
            .collect()
    };
    let gu = quantize_weights(
        &values(layout.gate_up_rows * layout.gate_up_cols, 1),
        layout.gate_up_rows,
        layout.gate_up_cols,
    );
    let dn = quantize_weights(
        &values(layout.down_rows * layout.down_cols, 2),
        layout.down_rows,
        layout.down_cols,
    );
    (gu, dn)
}

fn blob(layout: &BlobLayout, seed: u32) -> (Vec<u8>, u64) {
    let (gu, dn) = expert(layout, seed);
    let mut out = vec![0u8; layout.stride];
    let sum = encode_blob(layout, &gu.as_ref(), &dn.as_ref(), &mut out).expect("encode");
    (out, sum)
}

const AT: BlobAt = BlobAt {
    layer: LayerId::new(1),
    expert: ExpertId::new(2),
    offset: 28_672,
};

#[test]
fn blob_round_trips_through_parse() {
    let layout = tiny_layout().blob;
    let (gu, dn) = expert(&layout, 5);
    let (bytes, sum) = blob(&layout, 5);
    assert_eq!(
        &bytes[layout.checksum_offset..layout.content_bytes],
        &sum.to_le_bytes()
    );
    let parsed = ExpertBlob::parse(&bytes, &layout, AT, sum).expect("valid blob");
    let (p_gu, p_dn) = parsed.int8().expect("an INT8 blob");
    for (got, want) in [(p_gu, gu.as_ref()), (p_dn, dn.as_ref())] {
        assert_eq!((got.rows, got.cols), (want.rows, want.cols));
        assert_eq!(got.packed, want.packed);
        assert_eq!(got.scales, want.scales);
        assert_eq!(got.row_sums, want.row_sums);
        got.verify().expect("R16C4 invariants hold");
    }
    assert_eq!(p_gu.dequantize(), gu.dequantize());
}

#[test]
fn every_blob_byte_is_covered() {
    let layout = tiny_layout().blob;
    let (bytes, sum) = blob(&layout, 9);
    for at in 0..layout.stride {
        let mut b = bytes.clone();
        b[at] ^= 0x40;
        let e = check_blob(&b, &layout, AT, Some(sum)).expect_err("flipped byte must be caught");
        if at < layout.content_bytes {
            assert!(
                matches!(e, ContainerError::BlobChecksum { layer, expert, offset: 28_672, .. } if (layer, expert) == (AT.layer, AT.expert)),
                "byte {at}: {e}"
            );
        } else {
            assert_eq!(
                e,
                ContainerError::BlobPadding {
                    layer: AT.layer,
                    expert: AT.expert,
                    offset: 28_672,
                    byte_offset: 28_672 + at as u64
                }
            );
        }
    }
    // Consistent blob, wrong index entry.
    let e = check_blob(&bytes, &layout, AT, Some(sum ^ 1)).expect_err("index mismatch");
    assert_eq!(
        e,
        ContainerError::BlobChecksum {
            layer: AT.layer,
            expert: AT.expert,
            offset: 28_672,
            computed: sum,
            trailer: sum,
            index: Some(sum ^ 1)
        }
    );
    let msg = e.to_string();
    assert!(
        msg.starts_with("layer 1 expert 2: blob at file offset 28672: checksum mismatch"),
        "{msg}"
    );
    let e = check_blob(&bytes[..100], &layout, AT, None).expect_err("short");
    assert!(matches!(
        e,
        ContainerError::BlobLength {
            found: 100,
            expected: 4096,
            ..
        }
    ));
}

#[test]
fn misaligned_buffer_is_an_error_not_ub() {
    let layout = tiny_layout().blob;
    let (bytes, sum) = blob(&layout, 3);
    let mut shifted = vec![0u8; layout.stride + 1];
    // Heap allocations are at least 4-aligned, so offset 1 is not.
    shifted[1..].copy_from_slice(&bytes);
    let e = ExpertBlob::parse(&shifted[1..], &layout, AT, sum).expect_err("misaligned");
    assert_eq!(
        e,
        ContainerError::Misaligned {
            layer: AT.layer,
            expert: AT.expert,
            offset: 28_672,
            part: "gate_up scales"
        }
    );
}

#[test]
fn encode_rejects_wrong_shapes() {
    let layout = tiny_layout().blob;
    let (gu, dn) = expert(&layout, 1);
    let mut out = vec![0u8; layout.stride];
    let e =
        encode_blob(&layout, &dn.as_ref(), &dn.as_ref(), &mut out).expect_err("down as gate_up");
    assert!(matches!(
        e,
        ContainerError::EncodeShape {
            what: "gate_up cols",
            ..
        }
    ));
    let e =
        encode_blob(&layout, &gu.as_ref(), &dn.as_ref(), &mut out[..10]).expect_err("short buffer");
    assert!(matches!(
        e,
        ContainerError::EncodeShape {
            what: "blob buffer bytes",
            ..
        }
    ));
}

#[test]
fn index_round_trip_and_every_byte_checked() {
    let layout = tiny_layout();
    let sums: Vec<u64> = (0..6).map(|i| 1000 + i).collect();
    let (region, header) = finish(identity(), layout, &sums);
    assert_eq!(region.len(), region_bytes(&layout));
    let entries = parse_index(&header, &region).expect("valid index");
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(
            (e.offset, e.length, e.checksum),
            (layout.blob_offset_at(i), 4096, 1000 + i as u64)
        );
    }
    for at in 0..region.len() {
        let mut r = region.clone();
        r[at] ^= 0x02;
        let (_, problems) = check_index(&header, &r);
        assert!(!problems.is_empty(), "index byte {at}");
        let first = parse_index(&header, &r).expect_err("rejected");
        let i = at / 24;
        if at >= 144 {
            assert_eq!(
                first,
                ContainerError::IndexPadding {
                    offset: 4096 + at as u64
                }
            );
        } else if at % 24 < 8 {
            let named = matches!(first, ContainerError::IndexEntry { layer, expert, field: "offset", .. } if (layer.index(), expert.index()) == (i / 3, i % 3));
            assert!(named, "{first}");
        } else if at % 24 < 16 {
            assert!(
                matches!(
                    first,
                    ContainerError::IndexEntry {
                        field: "length",
                        ..
                    }
                ),
                "{first}"
            );
        } else {
            assert!(
                matches!(first, ContainerError::IndexChecksum { offset: 4096, .. }),
                "{first}"
            );
        }
    }
    let e = parse_index(&header, &region[..10]).expect_err("short");
    assert!(matches!(e, ContainerError::TooShort { what: "index", .. }));
    assert_eq!(encode_index(&layout, &sums), region);
    assert_eq!(unfinished_header(identity(), layout).index_checksum, 0);
}

#[test]
fn identity_is_order_sensitive_and_displays_short_hex() {
    use super::identity::IdentityHasher;
    use safetensors::Dtype;
    let make = |names: [&str; 2]| {
        let mut h = IdentityHasher::new(b"{}");
        for n in names {
            h.tensor_entry(n, Dtype::BF16, &[2, 4, 8], 128);
        }
        h.sample(&[1, 2, 3]);
        h.finish()
    };
    let a = make(["x", "y"]);
    assert_eq!(a, make(["x", "y"]));
    let b = make(["y", "x"]);
    assert_ne!(a.expert_tensors_sha256, b.expert_tensors_sha256);
    assert_eq!(a.config_sha256, b.config_sha256);
    assert_eq!(a.differing(&b), vec!["expert tensor names/shapes"]);
    // SHA-256("{}"), as `printf '{}' | sha256sum` prints it.
    assert_eq!(
        a.to_hex()[0],
        "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    );
    assert!(
        a.to_string()
            .starts_with("config 44136fa355b3678a / expert tensors "),
        "{a}"
    );
}
