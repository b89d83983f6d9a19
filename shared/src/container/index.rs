//! The expert index: one entry per (layer, expert) — offset, length, checksum (24 bytes in v1),
//! then in v2 the expert's format code and a reserved zero (32 bytes) — right after the header,
//! zero-padded to the first blob; its xxh3-64 is the header's `index_checksum`.
//!
//! Entries are redundant with the layout by design: a reader demands exactly the offsets and
//! lengths the dimensions imply, which makes blobs contiguous, ordered and non-overlapping by
//! construction. Pure: bytes in, entries or errors out.

use super::ContainerError;
use super::checksum::le_u32;
use super::checksum::{checksum, le_u64};
use super::header::Header;
use super::layout::ContainerLayout;

/// Where one expert's blob is and what it must hash to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// File offset of the blob.
    pub offset: u64,
    /// Bytes to read (the blob stride, padding included).
    pub length: u64,
    /// xxh3-64 of the blob's contents before its trailer.
    pub checksum: u64,
}

/// Bytes of the index region: from `index_offset` up to `blobs_offset` (entries + padding).
pub fn region_bytes(layout: &ContainerLayout) -> usize {
    (layout.blobs_offset - layout.index_offset) as usize
}

/// The index region (entries then zero padding) for the given blob checksums, in (layer,
/// expert) order.
///
/// # Panics
///
/// Panics if `checksums.len()` is not the layout's blob count (a writer bug, not bad input).
pub fn encode_index(layout: &ContainerLayout, checksums: &[u64]) -> Vec<u8> {
    assert_eq!(
        checksums.len(),
        layout.dims.n_blobs(),
        "one checksum per (layer, expert)"
    );
    let mut out = vec![0u8; region_bytes(layout)];
    let entry_bytes = layout.dims.index_entry_bytes();
    for (i, &sum) in checksums.iter().enumerate() {
        let e = &mut out[i * entry_bytes..(i + 1) * entry_bytes];
        e[0..8].copy_from_slice(&layout.blob_offset_at(i).to_le_bytes());
        e[8..16].copy_from_slice(&(layout.blob.stride as u64).to_le_bytes());
        e[16..24].copy_from_slice(&sum.to_le_bytes());
        if entry_bytes > 24 {
            e[24..28].copy_from_slice(&layout.dims.format.index_code().to_le_bytes());
        }
    }
    out
}

/// xxh3-64 of the entries part of an index region (what `index_checksum` stores).
pub fn index_checksum(layout: &ContainerLayout, region: &[u8]) -> u64 {
    checksum(&region[..layout.index_bytes as usize])
}

/// Every entry as stored, and every problem found: each entry's offset and length, the
/// padding, and the checksum. `verify` reports all of them; [`parse_index`] stops at the first.
/// `region` must be [`region_bytes`] long (else a single `TooShort` problem and no entries).
pub fn check_index(header: &Header, region: &[u8]) -> (Vec<IndexEntry>, Vec<ContainerError>) {
    let layout = &header.layout;
    let need = region_bytes(layout);
    if region.len() < need {
        let e = ContainerError::TooShort {
            what: "index",
            found: region.len() as u64,
            needed: need as u64,
        };
        return (Vec::new(), vec![e]);
    }
    let mut problems = Vec::new();
    let mut entries = Vec::with_capacity(layout.dims.n_blobs());
    let entry_bytes = layout.dims.index_entry_bytes();
    for i in 0..layout.dims.n_blobs() {
        let at = i * entry_bytes;
        let entry = IndexEntry {
            offset: le_u64(region, at),
            length: le_u64(region, at + 8),
            checksum: le_u64(region, at + 16),
        };
        let (layer, expert) = layout.blob_ids(i);
        let entry_offset = layout.index_entry_offset(i);
        // v2: the expert's format code, then a reserved zero. Every expert of a container is in
        // the header's format (the layout is a function of it); the code is checked so that a
        // reader never applies one format's kernel to another's bytes.
        let (format, reserved) = if entry_bytes > 24 {
            (
                u64::from(le_u32(region, at + 24)),
                u64::from(le_u32(region, at + 28)),
            )
        } else {
            (0, 0)
        };
        for (field, found, expected) in [
            ("offset", entry.offset, layout.blob_offset_at(i)),
            ("length", entry.length, layout.blob.stride as u64),
            ("format", format, u64::from(layout.dims.format.index_code())),
            ("reserved", reserved, 0),
        ] {
            if found != expected {
                problems.push(ContainerError::IndexEntry {
                    layer,
                    expert,
                    offset: entry_offset,
                    field,
                    found,
                    expected,
                });
            }
        }
        entries.push(entry);
    }
    let pad_start = layout.index_bytes as usize;
    if let Some(i) = region[pad_start..need].iter().position(|&b| b != 0) {
        problems.push(ContainerError::IndexPadding {
            offset: layout.index_offset + (pad_start + i) as u64,
        });
    }
    // Last, so that `parse_index` reports the more specific problem when there is one.
    let computed = index_checksum(layout, region);
    if computed != header.index_checksum {
        problems.push(ContainerError::IndexChecksum {
            offset: layout.index_offset,
            stored: header.index_checksum,
            computed,
        });
    }
    (entries, problems)
}

/// The entries of a valid index, or the first problem.
pub fn parse_index(header: &Header, region: &[u8]) -> Result<Vec<IndexEntry>, ContainerError> {
    let (entries, mut problems) = check_index(header, region);
    if problems.is_empty() {
        Ok(entries)
    } else {
        Err(problems.swap_remove(0))
    }
}
