//! `ContainerError`: every way a container (or the data going into one) can be unusable, each
//! variant naming the header field, or the layer and expert, and the file offset involved.
//!
//! The variants a reader can hit per expert read (`BlobLength`, `BlobChecksum`, `BlobPadding`,
//! `Misaligned`, `OutOfRange`) carry only integers, so that error path does not allocate.

use crate::ids::{ExpertId, LayerId};
use std::path::PathBuf;

/// Why a container cannot be read, written or trusted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ContainerError {
    /// A file could not be opened, read or written.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        message: String,
    },
    /// There is no container file where one was looked for.
    #[error(
        "no expert container at {}: make one with `expertd prepare MODEL_DIR --out {}`",
        path.display(),
        path.parent().map_or_else(|| ".".into(), |d| d.display().to_string())
    )]
    Missing {
        /// The container file looked for.
        path: PathBuf,
    },
    /// A region is shorter than its fixed size.
    #[error("{what} is {found} bytes, at least {needed} needed (truncated file?)")]
    TooShort {
        /// Which region (`header`, `index`).
        what: &'static str,
        /// Bytes available.
        found: u64,
        /// Bytes required.
        needed: u64,
    },
    /// The first eight bytes are not a known magic.
    #[error("not a sluice expert container: magic at offset 0 is \"{}\", expected \"SLUICEXP\"", found.escape_ascii())]
    NotAContainer {
        /// The bytes found.
        found: [u8; 8],
    },
    /// The file is one `expertd prepare` has not finished.
    #[error(
        "unfinished container (magic \"SLUICEPT\" at offset 0): expertd prepare was interrupted; rerun it to finish"
    )]
    Unfinished,
    /// A known magic with a version this build does not read.
    #[error(
        "unsupported container version {version} (field version at offset 8, magic \"{magic}\"); this build reads versions 1 and 2"
    )]
    UnsupportedVersion {
        /// The magic found.
        magic: &'static str,
        /// The version found.
        version: u32,
    },
    /// The header's bytes do not hash to its stored checksum.
    #[error(
        "header checksum mismatch (field header_checksum at offset {offset}): stored {stored:#018x}, header bytes hash to {computed:#018x}"
    )]
    HeaderChecksum {
        /// Offset of the checksum field.
        offset: u64,
        /// Value stored in the header.
        stored: u64,
        /// Value computed over the header bytes.
        computed: u64,
    },
    /// A header field disagrees with the value the format or the other fields imply.
    #[error("header field {field} at offset {offset}: found {found}, expected {expected}")]
    HeaderField {
        /// Field name as in docs/container-format.md.
        field: &'static str,
        /// Offset of the field in the file.
        offset: u64,
        /// Value found.
        found: u64,
        /// Value required.
        expected: u64,
    },
    /// A header count or dimension is outside its cap.
    #[error("header field {field} at offset {offset}: {found} is outside 1..={max}")]
    HeaderLimit {
        /// Field name.
        field: &'static str,
        /// Offset of the field in the file.
        offset: u64,
        /// Value found.
        found: u64,
        /// Largest accepted value.
        max: u64,
    },
    /// The quantisation scheme id is not one this build knows.
    #[error(
        "header field quant_scheme at offset {offset}: \"{found}\" is not a scheme of this format version (v1: \"w8-sym-per-row-r16c4\"; v2: \"ggml-q4k\", \"ggml-q4k-gate-up-q6k-down\")"
    )]
    QuantScheme {
        /// Offset of the field.
        offset: u64,
        /// The id found (escaped).
        found: String,
    },
    /// A reserved header byte is not zero.
    #[error("header reserved byte at offset {offset} is {found:#04x}, expected 0")]
    HeaderReserved {
        /// Offset of the byte.
        offset: u64,
        /// Value found.
        found: u8,
    },
    /// A model dimension cannot be stored (too large, or zero).
    #[error("dimension {field} = {found} is outside 1..={max}")]
    Dimension {
        /// Which dimension.
        field: &'static str,
        /// Value.
        found: u64,
        /// Largest accepted value.
        max: u64,
    },
    /// Layout arithmetic overflowed (dimensions too large for this format).
    #[error("container layout overflows computing {what}")]
    Overflow {
        /// The quantity being computed.
        what: &'static str,
    },
    /// The file's length disagrees with the header.
    #[error(
        "file is {found} bytes but header field file_bytes (offset 216) says {expected} (truncated or extended file)"
    )]
    FileLength {
        /// Actual length.
        found: u64,
        /// Length the header implies.
        expected: u64,
    },
    /// The index does not hash to the header's `index_checksum`.
    #[error(
        "index checksum mismatch: the index at offset {offset} hashes to {computed:#018x}, header field index_checksum (offset 224) says {stored:#018x}"
    )]
    IndexChecksum {
        /// File offset of the index.
        offset: u64,
        /// Value in the header.
        stored: u64,
        /// Value computed over the index.
        computed: u64,
    },
    /// One index entry disagrees with the layout.
    #[error(
        "layer {layer} expert {expert}: index entry at file offset {offset}: field {field} is {found}, expected {expected}"
    )]
    IndexEntry {
        /// Layer.
        layer: LayerId,
        /// Expert.
        expert: ExpertId,
        /// File offset of the entry.
        offset: u64,
        /// `offset` or `length`.
        field: &'static str,
        /// Value found.
        found: u64,
        /// Value required.
        expected: u64,
    },
    /// A byte between the index's end and the first blob is not zero.
    #[error("index padding byte at file offset {offset} is not zero")]
    IndexPadding {
        /// File offset of the byte.
        offset: u64,
    },
    /// A (layer, expert) outside the container.
    #[error(
        "layer {layer} expert {expert} out of range (container has {n_layers} layers of {n_experts} experts)"
    )]
    OutOfRange {
        /// Requested layer.
        layer: LayerId,
        /// Requested expert.
        expert: ExpertId,
        /// Layers in the container.
        n_layers: usize,
        /// Experts per layer.
        n_experts: usize,
    },
    /// A blob buffer has the wrong length (short read, truncated file).
    #[error(
        "layer {layer} expert {expert}: blob at file offset {offset} is {found} bytes, expected {expected} (truncated file?)"
    )]
    BlobLength {
        /// Layer.
        layer: LayerId,
        /// Expert.
        expert: ExpertId,
        /// File offset of the blob.
        offset: u64,
        /// Bytes available.
        found: u64,
        /// Bytes required.
        expected: u64,
    },
    /// A blob's contents, trailer and index entry do not agree.
    #[error(
        "layer {layer} expert {expert}: blob at file offset {offset}: checksum mismatch: contents hash to {computed:#018x}, \
         blob trailer says {trailer:#018x}, index says {}",
        index.map_or_else(|| "(not checked)".to_string(), |c| format!("{c:#018x}"))
    )]
    BlobChecksum {
        /// Layer.
        layer: LayerId,
        /// Expert.
        expert: ExpertId,
        /// File offset of the blob.
        offset: u64,
        /// xxh3-64 of the contents.
        computed: u64,
        /// The checksum stored at the end of the blob.
        trailer: u64,
        /// The checksum in the index, when one was given.
        index: Option<u64>,
    },
    /// A padding byte after the blob's checksum is not zero.
    #[error(
        "layer {layer} expert {expert}: blob at file offset {offset}: padding byte at file offset {byte_offset} is not zero"
    )]
    BlobPadding {
        /// Layer.
        layer: LayerId,
        /// Expert.
        expert: ExpertId,
        /// File offset of the blob.
        offset: u64,
        /// File offset of the first non-zero padding byte.
        byte_offset: u64,
    },
    /// A part of a blob buffer is not aligned for its element type in memory.
    #[error(
        "layer {layer} expert {expert}: blob at file offset {offset}: part {part} is not 4-byte aligned in the read buffer"
    )]
    Misaligned {
        /// Layer.
        layer: LayerId,
        /// Expert.
        expert: ExpertId,
        /// File offset of the blob.
        offset: u64,
        /// Which part.
        part: &'static str,
    },
    /// A matrix handed to the blob encoder does not match the layout.
    #[error("cannot encode blob: {what} is {found}, layout expects {expected}")]
    EncodeShape {
        /// Which quantity.
        what: &'static str,
        /// Value given.
        found: u64,
        /// Value required.
        expected: u64,
    },
    /// The checkpoint could not be read for the model identity.
    #[error("model identity: {0}")]
    Identity(String),
}

impl ContainerError {
    /// A stable, low-cardinality name for metric labels and logs.
    pub fn error_type(&self) -> &'static str {
        match self {
            ContainerError::Io { .. } => "io",
            ContainerError::Missing { .. } => "missing",
            ContainerError::TooShort { .. } | ContainerError::FileLength { .. } => "truncated",
            ContainerError::NotAContainer { .. } => "not_a_container",
            ContainerError::Unfinished => "unfinished",
            ContainerError::UnsupportedVersion { .. } => "unsupported_version",
            ContainerError::HeaderChecksum { .. }
            | ContainerError::HeaderField { .. }
            | ContainerError::HeaderLimit { .. }
            | ContainerError::QuantScheme { .. }
            | ContainerError::HeaderReserved { .. } => "bad_header",
            ContainerError::Dimension { .. } | ContainerError::Overflow { .. } => "bad_dimensions",
            ContainerError::IndexChecksum { .. }
            | ContainerError::IndexEntry { .. }
            | ContainerError::IndexPadding { .. } => "bad_index",
            ContainerError::OutOfRange { .. } => "out_of_range",
            ContainerError::BlobLength { .. } => "short_blob",
            ContainerError::BlobChecksum { .. } | ContainerError::BlobPadding { .. } => {
                "blob_checksum"
            }
            ContainerError::Misaligned { .. } => "misaligned",
            ContainerError::EncodeShape { .. } => "encode_shape",
            ContainerError::Identity(_) => "identity",
        }
    }
}
