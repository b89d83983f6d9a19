//! Unit tests of container format v2 (k-quant experts): the real dimensions' sizes, header and
//! index round trips with the format recorded, blobs viewed in place as k-quant matrices, and
//! rejection of a format that disagrees between header, version and index.

use super::header::*;
use super::index::{check_index, encode_index, parse_index};
use super::layout::*;
use super::writer::{encode_blob, encode_expert, finish};
use super::*;
use crate::ids::{ExpertId, LayerId};
use crate::kernels::ExpertMatrices;
use crate::kernels::int8::quantize_weights;
use crate::kernels::kquant::{KQuantKind, quantize_matrix};

fn identity() -> ModelIdentity {
    ModelIdentity {
        config_sha256: [0x11; 32],
        expert_tensors_sha256: [0x22; 32],
        expert_sample_sha256: [0x33; 32],
    }
}

fn layout(format: ExpertFormat) -> ContainerLayout {
    ContainerLayout::new(
        ExpertDims::new(2, 3, 40, 24)
            .expect("dims")
            .with_format(format),
    )
    .expect("layout")
}

#[test]
fn real_dimensions_sizes_of_the_kquant_formats() {
    // Qwen3.6-35B-A3B: 40 × 256 experts, d = 2048, f = 512 (docs/container-format.md, v2).
    for (format, down_bytes, stride, file) in [
        (ExpertFormat::Q4K, 589_824, 1_773_568, 18_161_668_096u64),
        (ExpertFormat::Q4KQ6K, 860_160, 2_043_904, 20_929_908_736),
    ] {
        let dims = ExpertDims::new(40, 256, 2048, 512).expect("dims");
        let l = ContainerLayout::new(dims.with_format(format)).expect("layout");
        let b = &l.blob;
        assert_eq!(b.format, format);
        assert_eq!(
            (b.gate_up_packed.len, b.down_packed.len),
            (1_179_648, down_bytes)
        );
        assert_eq!(b.down_packed.offset, 1_179_648);
        assert_eq!(b.stride, stride, "{format}");
        assert_eq!((l.index_bytes, l.blobs_offset), (327_680, 331_776));
        assert_eq!(l.file_bytes, file, "{format}");
    }
}

#[test]
fn a_v2_header_round_trips_and_names_its_format() {
    for format in [ExpertFormat::Q4K, ExpertFormat::Q4KQ6K] {
        let l = layout(format);
        let sums: Vec<u64> = (0..6).map(|i| 0x1111 * (i + 1)).collect();
        let (region, header) = finish(identity(), l, &sums);
        assert_eq!(header.magic, VersionedMagic::CompleteV2);
        let bytes = header.encode();
        assert_eq!(&bytes[8..12], &2u32.to_le_bytes());
        assert_eq!(
            &bytes[QUANT_SCHEME_OFFSET..][..format.scheme().len()],
            format.scheme().as_bytes()
        );
        let parsed = Header::parse(&bytes).expect("v2 header parses");
        assert_eq!(parsed, header);
        assert_eq!(parsed.layout.dims.format, format);
        let entries = parse_index(&parsed, &region).expect("index parses");
        assert_eq!(entries.len(), 6);
        // The format code sits in each 32-byte entry.
        for i in 0..6 {
            let code = u32::from_le_bytes(region[i * 32 + 24..i * 32 + 28].try_into().unwrap());
            assert_eq!(code, format.index_code());
        }
    }
}

/// Re-seals a header after an edit so parsing reaches the field checks.
fn reseal(bytes: &mut [u8]) {
    let sum = checksum::checksum(&bytes[..HEADER_CHECKSUM_OFFSET]);
    bytes[HEADER_CHECKSUM_OFFSET..HEADER_CHECKSUM_OFFSET + 8].copy_from_slice(&sum.to_le_bytes());
}

#[test]
fn a_scheme_that_does_not_match_the_version_is_refused() {
    // An INT8 scheme under version 2, and a k-quant scheme under version 1.
    let (_, v2) = finish(identity(), layout(ExpertFormat::Q4K), &[0; 6]);
    let mut b = v2.encode();
    b[QUANT_SCHEME_OFFSET..ROW_BLOCK_OFFSET].fill(0);
    b[QUANT_SCHEME_OFFSET..][..QUANT_SCHEME.len()].copy_from_slice(QUANT_SCHEME.as_bytes());
    reseal(&mut b);
    let e = Header::parse(&b).expect_err("int8 scheme in v2");
    assert!(matches!(e, ContainerError::QuantScheme { .. }), "{e}");
    let mut b = v2.encode();
    b[8..12].copy_from_slice(&1u32.to_le_bytes());
    reseal(&mut b);
    let e = Header::parse(&b).expect_err("k-quant scheme in v1");
    assert!(
        matches!(&e, ContainerError::QuantScheme { found, .. } if found == "ggml-q4k"),
        "{e}"
    );
    // An unknown scheme is named.
    let mut b = v2.encode();
    b[QUANT_SCHEME_OFFSET + 6] = b'9';
    reseal(&mut b);
    let e = Header::parse(&b).expect_err("unknown scheme");
    assert!(
        matches!(&e, ContainerError::QuantScheme { found, .. } if found == "ggml-q9k"),
        "{e}"
    );
}

#[test]
fn an_index_entry_with_another_format_or_reserved_bits_is_refused() {
    let l = layout(ExpertFormat::Q4KQ6K);
    let sums = [5u64; 6];
    for (at, value, field) in [
        (24, ExpertFormat::Q4K.index_code(), "format"),
        (28, 1, "reserved"),
    ] {
        let mut region = encode_index(&l, &sums);
        region[32 + at..32 + at + 4].copy_from_slice(&value.to_le_bytes());
        let (_, header) = finish(identity(), l, &sums);
        let header = Header {
            index_checksum: index::index_checksum(&l, &region),
            ..header
        };
        let (_, problems) = check_index(&header, &region);
        assert_eq!(problems.len(), 1, "{problems:?}");
        let msg = problems[0].to_string();
        assert!(
            msg.contains(field) && msg.contains("layer 0 expert 1"),
            "{msg}"
        );
    }
}

#[test]
fn kquant_blobs_round_trip_and_refuse_the_wrong_family() {
    for format in [ExpertFormat::Q4K, ExpertFormat::Q4KQ6K] {
        let b = layout(format).blob;
        let (gu_kind, dn_kind) = format.kquant().expect("k-quant");
        let w = |n: usize, s: f32| -> Vec<f32> { (0..n).map(|i| ((i as f32) * s).sin()).collect() };
        let gu = quantize_matrix(gu_kind, &w(48 * 40, 0.37), 48, 40);
        let dn = quantize_matrix(dn_kind, &w(40 * 24, 0.61), 40, 24);
        let m = ExpertMatrices::KQuant {
            gate_up: gu.as_ref(),
            down: dn.as_ref(),
        };
        let mut out = vec![0u8; b.stride];
        let sum = encode_expert(&b, &m, &mut out).expect("encode");
        let at = BlobAt {
            layer: LayerId::new(1),
            expert: ExpertId::new(2),
            offset: 8192,
        };
        let parsed = ExpertBlob::parse(&out, &b, at, sum).expect("parse");
        let (p_gu, p_dn) = parsed.kquant().expect("k-quant view");
        assert_eq!((p_gu.kind, p_dn.kind), (gu_kind, dn_kind));
        assert_eq!(p_gu.data, &gu.data[..]);
        assert_eq!(p_dn.data, &dn.data[..]);
        assert!(p_gu.verify().is_ok() && p_dn.verify().is_ok());
        // Every byte of the blob is covered by the checksum or the padding check.
        for i in (0..b.stride).step_by(97) {
            let mut c = out.clone();
            c[i] ^= 0x10;
            assert!(ExpertBlob::parse(&c, &b, at, sum).is_err(), "byte {i}");
        }
        // An INT8 expert does not encode into a k-quant layout, nor the reverse.
        let q = quantize_weights(&w(48 * 40, 0.1), 48, 40);
        let qd = quantize_weights(&w(40 * 24, 0.1), 40, 24);
        let int8 = ExpertMatrices::Int8 {
            gate_up: q.as_ref(),
            down: qd.as_ref(),
        };
        assert!(encode_expert(&b, &int8, &mut out).is_err());
        assert!(encode_blob(&b, &q.as_ref(), &qd.as_ref(), &mut out).is_err());
        let v1 = layout(ExpertFormat::Int8).blob;
        let mut out1 = vec![0u8; v1.stride];
        assert!(encode_expert(&v1, &m, &mut out1).is_err());
        // A down matrix of the other block kind is refused.
        let other = if dn_kind == KQuantKind::Q4K {
            KQuantKind::Q6K
        } else {
            KQuantKind::Q4K
        };
        let dn2 = quantize_matrix(other, &w(40 * 24, 0.61), 40, 24);
        let m2 = ExpertMatrices::KQuant {
            gate_up: gu.as_ref(),
            down: dn2.as_ref(),
        };
        assert!(encode_expert(&b, &m2, &mut out).is_err());
    }
}

#[test]
fn a_non_finite_super_scale_fails_verify_naming_row_and_block() {
    let m = quantize_matrix(KQuantKind::Q4K, &vec![0.5f32; 3 * 512], 3, 512);
    let mut data = m.data.clone();
    // Row 2, block 1: dmin := +inf (f16 0x7c00).
    let at = 2 * 2 * 144 + 144 + 2;
    data[at..at + 2].copy_from_slice(&[0x00, 0x7c]);
    let r = crate::kernels::kquant::KMatrixRef {
        kind: KQuantKind::Q4K,
        rows: 3,
        cols: 512,
        data: &data,
    };
    let e = r.verify().expect_err("inf");
    assert!(e.contains("row 2 block 1"), "{e}");
}
