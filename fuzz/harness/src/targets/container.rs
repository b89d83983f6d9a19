//! `shared::container`: the INT8 expert container's header, index and blob trailer, as the
//! daemon and `expertd verify` read them from disk. The first byte picks the part and a few
//! repairs (a fresh checksum, the exact length) so that mutations get past the checksums to
//! the field checks behind them.
//!
//! Contract: no panic; an accepted header re-encodes to exactly its bytes and its offsets
//! follow from its dimensions; an accepted index is exactly the layout's entries and
//! re-encodes to its bytes; an accepted blob views as matrices of the layout's shapes whose
//! re-encoding gives back its parts and trailer.

use crate::bytes::{Aligned, Input};
use crate::{Outcome, class};
use shared::container::checksum::checksum;
use shared::container::header::{HEADER_CHECKSUM_OFFSET, VersionedMagic};
use shared::container::index::{check_index, encode_index, parse_index, region_bytes};
use shared::container::layout::{ALIGNMENT, HEADER_BYTES};
use shared::container::writer::encode_expert;
use shared::container::{
    BlobAt, BlobLayout, ContainerLayout, ExpertBlob, ExpertDims, ExpertFormat, Header,
    ModelIdentity, check_blob,
};
use shared::ids::{ExpertId, LayerId};

/// Picks the part from the first byte: 0 raw header, 1 header from dimensions, 2 index, 3 blob
/// (`mode % 4`); bit 0x08 picks a k-quant expert format where the part has one.
pub fn run(data: &[u8]) -> Outcome {
    let mut input = Input::new(data);
    let mode = input.u8();
    match mode % 4 {
        0 => raw_header(mode, input.rest()),
        1 => built_header(mode, input),
        2 => index(mode, input),
        _ => blob(mode, input),
    }
}

/// Writes a fresh header checksum over the first `HEADER_CHECKSUM_OFFSET` bytes.
fn reseal_header(bytes: &mut [u8]) {
    if bytes.len() >= HEADER_BYTES {
        let sum = checksum(&bytes[..HEADER_CHECKSUM_OFFSET]);
        bytes[HEADER_CHECKSUM_OFFSET..HEADER_CHECKSUM_OFFSET + 8]
            .copy_from_slice(&sum.to_le_bytes());
    }
}

/// What every accepted header must satisfy.
fn check_header(h: &Header, bytes: &[u8]) {
    assert_eq!(
        h.encode(),
        bytes[..HEADER_BYTES],
        "an accepted header does not re-encode to its bytes"
    );
    let l = &h.layout;
    assert_eq!(
        ContainerLayout::new(l.dims).as_ref(),
        Ok(l),
        "layout is not the one its dimensions imply"
    );
    assert_eq!(l.index_offset, HEADER_BYTES as u64);
    assert_eq!(
        l.index_bytes,
        l.dims.n_blobs() as u64 * l.dims.index_entry_bytes() as u64
    );
    assert!(
        l.blobs_offset >= l.index_offset + l.index_bytes
            && l.blobs_offset.is_multiple_of(ALIGNMENT)
    );
    assert!(
        (l.blob.stride as u64).is_multiple_of(ALIGNMENT) && l.blob.content_bytes <= l.blob.stride
    );
    let last = l.blob_offset_at(l.dims.n_blobs() - 1);
    assert_eq!(
        last + l.blob.stride as u64,
        l.file_bytes,
        "blobs do not end the file"
    );
}

fn raw_header(mode: u8, rest: &[u8]) -> Outcome {
    let mut bytes = rest.to_vec();
    if mode & 0x10 != 0 && bytes.len() < HEADER_BYTES {
        bytes.resize(HEADER_BYTES, 0);
    }
    resealed_then_parsed("raw", mode, &mut bytes)
}

/// Reseals the header's checksum when the mode says so (so mutations reach the fields behind
/// it), then parses it: an accepted header must be consistent and re-encode to its bytes.
fn resealed_then_parsed(what: &str, mode: u8, bytes: &mut [u8]) -> Outcome {
    if mode & 0x20 != 0 {
        reseal_header(bytes);
    }
    match Header::parse(bytes) {
        Ok(h) => {
            check_header(&h, bytes);
            format!("ok:{what}")
        }
        Err(e) => class(what, &e),
    }
}

fn identity(input: &mut Input<'_>) -> ModelIdentity {
    let mut digest = || {
        let mut d = [0u8; 32];
        d[..8].copy_from_slice(&input.u64().to_le_bytes());
        d
    };
    ModelIdentity {
        config_sha256: digest(),
        expert_tensors_sha256: digest(),
        expert_sample_sha256: digest(),
    }
}

/// The expert format: INT8 unless mode bit 0x08 is set, then a k-quant format chosen by the
/// next byte.
fn format(mode: u8, input: &mut Input<'_>) -> ExpertFormat {
    if mode & 0x08 != 0 {
        ExpertFormat::ALL[1 + usize::from(input.u8() & 1)]
    } else {
        ExpertFormat::Int8
    }
}

/// Dimensions: small ones usually, raw u32s (caps, overflow) when the mode says so.
fn dims(mode: u8, input: &mut Input<'_>) -> ExpertDims {
    let format = format(mode, input);
    if mode & 0x40 != 0 {
        let mut raw = || input.u32() as usize;
        ExpertDims {
            n_layers: raw(),
            n_experts: raw(),
            hidden: raw(),
            inner: raw(),
            format,
        }
    } else {
        ExpertDims {
            n_layers: input.small(4),
            n_experts: input.small(16),
            hidden: input.small(64),
            inner: input.small(64),
            format,
        }
    }
}

fn built_header(mode: u8, mut input: Input<'_>) -> Outcome {
    let layout = match ContainerLayout::new(dims(mode, &mut input)) {
        Ok(l) => l,
        Err(e) => return class("dims", &e),
    };
    let magic = VersionedMagic::for_format(layout.dims.format, mode & 0x80 != 0);
    let header = Header {
        magic,
        identity: identity(&mut input),
        layout,
        index_checksum: input.u64(),
    };
    let mut bytes = header.encode();
    assert_eq!(
        Header::parse(&bytes),
        Ok(header),
        "a written header does not parse back to itself"
    );
    // Then corrupt it: (position, xor) pairs from the rest of the input.
    let patches = input.rest();
    for p in patches.chunks_exact(3).take(8) {
        let at = usize::from(u16::from_le_bytes([p[0], p[1]])) % HEADER_BYTES;
        bytes[at] ^= p[2];
    }
    resealed_then_parsed("built", mode, &mut bytes)
}

fn index(mode: u8, mut input: Input<'_>) -> Outcome {
    let format = format(mode, &mut input);
    let dims = ExpertDims {
        n_layers: input.small(4),
        n_experts: input.small(16),
        hidden: input.small(8),
        inner: input.small(8),
        format,
    };
    let layout = ContainerLayout::new(dims).expect("small dimensions are valid");
    let stored = input.u64();
    let mut region = input.rest().to_vec();
    if mode & 0x10 != 0 {
        region.resize(region_bytes(&layout), 0);
    }
    let index_checksum = if mode & 0x20 != 0 && region.len() >= layout.index_bytes as usize {
        checksum(&region[..layout.index_bytes as usize])
    } else {
        stored
    };
    let header = Header {
        magic: VersionedMagic::for_format(layout.dims.format, true),
        identity: ModelIdentity::default_for_fuzz(),
        layout,
        index_checksum,
    };
    let (entries, problems) = check_index(&header, &region);
    let parsed = parse_index(&header, &region);
    assert_eq!(
        parsed.is_ok(),
        problems.is_empty(),
        "check_index and parse_index disagree"
    );
    match parsed {
        Ok(got) => {
            assert_eq!(got, entries);
            assert_eq!(got.len(), dims.n_blobs());
            for (i, e) in got.iter().enumerate() {
                assert_eq!(
                    (e.offset, e.length),
                    (layout.blob_offset_at(i), layout.blob.stride as u64),
                    "entry {i}"
                );
            }
            let sums: Vec<u64> = got.iter().map(|e| e.checksum).collect();
            assert_eq!(
                encode_index(&layout, &sums),
                region[..region_bytes(&layout)],
                "an accepted index does not re-encode to its bytes"
            );
            "ok:index".into()
        }
        Err(e) => class("index", &e),
    }
}

fn blob(mode: u8, mut input: Input<'_>) -> Outcome {
    let format = format(mode, &mut input);
    let layout = match BlobLayout::with_format(input.small(64), input.small(64), format) {
        Ok(l) => l,
        Err(e) => return class("blob-layout", &e),
    };
    let expected = input.u64();
    let rest = input.rest();
    let len = if mode & 0x10 != 0 {
        layout.stride
    } else {
        rest.len()
    };
    let mut buf = Aligned::new(rest, len);
    if mode & 0x20 != 0 && len >= layout.content_bytes {
        let b = buf.bytes_mut();
        let sum = checksum(&b[..layout.checksum_offset]);
        b[layout.checksum_offset..layout.content_bytes].copy_from_slice(&sum.to_le_bytes());
    }
    let bytes = buf.bytes();
    let at = BlobAt {
        layer: LayerId::new(0),
        expert: ExpertId::new(0),
        offset: 0,
    };
    let index = if mode & 0x40 != 0 {
        Some(expected)
    } else {
        None
    };
    let sum = match check_blob(bytes, &layout, at, index) {
        Ok(s) => s,
        Err(e) => return class("blob", &e),
    };
    let view =
        ExpertBlob::view_verified(bytes, &layout, at).expect("a checked, aligned blob views");
    assert_eq!(
        view.shapes(),
        [
            (layout.gate_up_rows, layout.gate_up_cols),
            (layout.down_rows, layout.down_cols)
        ]
    );
    let mut again = vec![0u8; layout.stride];
    encode_expert(&layout, &view, &mut again)
        .expect("an accepted blob's matrices have the layout's shapes");
    for part in [
        layout.gate_up_packed,
        layout.down_packed,
        layout.gate_up_scales,
        layout.down_scales,
        layout.gate_up_row_sums,
        layout.down_row_sums,
    ] {
        assert_eq!(
            again[part.range()],
            bytes[part.range()],
            "blob part at {} does not re-encode",
            part.offset
        );
    }
    assert_eq!(
        again[layout.content_bytes..],
        bytes[layout.content_bytes..],
        "blob padding"
    );
    // Bytes between the parts are covered by the checksum but not required to be zero: an
    // accepted blob may differ from what the writer would write there. Counted, not fatal.
    if again[..layout.checksum_offset] == bytes[..layout.checksum_offset] {
        assert_eq!(le(&again, layout.checksum_offset), sum);
        "ok:blob".into()
    } else {
        "ok:blob-nonzero-gaps".into()
    }
}

fn le(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// A fixed identity for targets that need a header but do not fuzz its identity.
trait FuzzIdentity {
    fn default_for_fuzz() -> ModelIdentity;
}

impl FuzzIdentity for ModelIdentity {
    fn default_for_fuzz() -> ModelIdentity {
        ModelIdentity {
            config_sha256: [1; 32],
            expert_tensors_sha256: [2; 32],
            expert_sample_sha256: [3; 32],
        }
    }
}
