//! The container header: the first 4096 bytes of `experts.sluice`, encoded and parsed.
//!
//! ```text
//! offset  size  field                  value / meaning
//!      0     8  magic                  "SLUICEXP" (complete) or "SLUICEPT" (unfinished)
//!      8     4  version                u32 = 1 (INT8) or 2 (k-quant formats)
//!     12     4  header_bytes           u32 = 4096
//!     16    32  config_sha256          SHA-256 of config.json's bytes
//!     48    32  expert_tensors_sha256  SHA-256 of the expert tensors' header entries
//!     80    32  expert_sample_sha256   SHA-256 of a 64-byte sample of every expert matrix
//!    112     4  n_layers               u32, 1..=4096
//!    116     4  n_experts              u32, 1..=65536
//!    120     4  hidden                 u32 d, 1..=65536
//!    124     4  expert_inner           u32 f, 1..=65536
//!    128    32  quant_scheme           ASCII NUL-padded, `ExpertFormat::scheme` ("w8-sym-per-row-r16c4" in v1)
//!    160     4  row_block              u32 = 16 (v1) or 1 (v2)
//!    164     4  col_group              u32 = 4 (v1) or 256 (v2)
//!    168     4  alignment              u32 = 4096
//!    172     4  index_entry_bytes      u32 = 24 (v1) or 32 (v2)
//!    176     8  index_offset           u64 = 4096
//!    184     8  index_bytes            u64 = n_layers · n_experts · index_entry_bytes
//!    192     8  blobs_offset           u64 = align4096(index_offset + index_bytes)
//!    200     8  blob_stride            u64 = align4096(blob_content_bytes)
//!    208     8  blob_content_bytes     u64
//!    216     8  file_bytes             u64
//!    224     8  index_checksum         u64 xxh3-64 of the index entries
//!    232     8  header_checksum        u64 xxh3-64 of bytes [0, 232)
//!    240  3856  reserved               zero
//! ```
//!
//! Each offset below is built from the one before it, and the table above is asserted against
//! them at compile time. Parsing is pure (bytes in, `Header` out) and names the field and its
//! offset in every error; docs/container-format.md is the normative description.

use super::ContainerError;
use super::checksum::{checksum, le_u32, le_u64};
use super::format::ExpertFormat;
use super::identity::ModelIdentity;
use super::layout::{
    ALIGNMENT, ContainerLayout, ExpertDims, HEADER_BYTES, MAX_DIM, MAX_EXPERTS, MAX_LAYERS,
};
use crate::kernels::int8::{COL_GROUP, ROW_BLOCK};
use crate::kernels::kquant::QK_K;

const U32: usize = 4;
const U64: usize = 8;
const SHA256: usize = 32;

/// Magic of a complete container.
pub const MAGIC_COMPLETE: [u8; 8] = *b"SLUICEXP";
/// Magic of a container `expertd prepare` has not finished.
pub const MAGIC_UNFINISHED: [u8; 8] = *b"SLUICEPT";
/// The INT8 format version.
pub const VERSION_1: u32 = 1;
/// The k-quant format version.
pub const VERSION_2: u32 = 2;
/// The only quantisation scheme of version 1.
pub const QUANT_SCHEME: &str = ExpertFormat::Int8.scheme();
/// Bytes reserved for the quantisation scheme id.
pub const QUANT_SCHEME_BYTES: usize = 32;

/// Offset of `magic`.
pub const MAGIC_OFFSET: usize = 0;
/// Offset of `version`.
pub const VERSION_OFFSET: usize = MAGIC_OFFSET + MAGIC_COMPLETE.len();
/// Offset of `header_bytes`.
pub const HEADER_BYTES_OFFSET: usize = VERSION_OFFSET + U32;
/// Offset of `config_sha256`.
pub const CONFIG_SHA256_OFFSET: usize = HEADER_BYTES_OFFSET + U32;
/// Offset of `expert_tensors_sha256`.
pub const EXPERT_TENSORS_SHA256_OFFSET: usize = CONFIG_SHA256_OFFSET + SHA256;
/// Offset of `expert_sample_sha256`.
pub const EXPERT_SAMPLE_SHA256_OFFSET: usize = EXPERT_TENSORS_SHA256_OFFSET + SHA256;
/// Offset of `n_layers`.
pub const N_LAYERS_OFFSET: usize = EXPERT_SAMPLE_SHA256_OFFSET + SHA256;
/// Offset of `n_experts`.
pub const N_EXPERTS_OFFSET: usize = N_LAYERS_OFFSET + U32;
/// Offset of `hidden`.
pub const HIDDEN_OFFSET: usize = N_EXPERTS_OFFSET + U32;
/// Offset of `expert_inner`.
pub const EXPERT_INNER_OFFSET: usize = HIDDEN_OFFSET + U32;
/// Offset of `quant_scheme`.
pub const QUANT_SCHEME_OFFSET: usize = EXPERT_INNER_OFFSET + U32;
/// Offset of `row_block`.
pub const ROW_BLOCK_OFFSET: usize = QUANT_SCHEME_OFFSET + QUANT_SCHEME_BYTES;
/// Offset of `col_group`.
pub const COL_GROUP_OFFSET: usize = ROW_BLOCK_OFFSET + U32;
/// Offset of `alignment`.
pub const ALIGNMENT_OFFSET: usize = COL_GROUP_OFFSET + U32;
/// Offset of `index_entry_bytes`.
pub const INDEX_ENTRY_BYTES_OFFSET: usize = ALIGNMENT_OFFSET + U32;
/// Offset of `index_offset`.
pub const INDEX_OFFSET_OFFSET: usize = INDEX_ENTRY_BYTES_OFFSET + U32;
/// Offset of `index_bytes`.
pub const INDEX_BYTES_OFFSET: usize = INDEX_OFFSET_OFFSET + U64;
/// Offset of `blobs_offset`.
pub const BLOBS_OFFSET_OFFSET: usize = INDEX_BYTES_OFFSET + U64;
/// Offset of `blob_stride`.
pub const BLOB_STRIDE_OFFSET: usize = BLOBS_OFFSET_OFFSET + U64;
/// Offset of `blob_content_bytes`.
pub const BLOB_CONTENT_BYTES_OFFSET: usize = BLOB_STRIDE_OFFSET + U64;
/// Offset of `file_bytes`.
pub const FILE_BYTES_OFFSET: usize = BLOB_CONTENT_BYTES_OFFSET + U64;
/// Offset of `index_checksum`.
pub const INDEX_CHECKSUM_OFFSET: usize = FILE_BYTES_OFFSET + U64;
/// Offset of `header_checksum` (it covers every byte before it).
pub const HEADER_CHECKSUM_OFFSET: usize = INDEX_CHECKSUM_OFFSET + U64;
/// Offset of the reserved (zero) bytes that fill the header to [`HEADER_BYTES`].
pub const RESERVED_OFFSET: usize = HEADER_CHECKSUM_OFFSET + U64;

const _: () = {
    assert!(VERSION_OFFSET == 8 && CONFIG_SHA256_OFFSET == 16 && N_LAYERS_OFFSET == 112);
    assert!(QUANT_SCHEME_OFFSET == 128 && ROW_BLOCK_OFFSET == 160 && INDEX_OFFSET_OFFSET == 176);
    assert!(
        FILE_BYTES_OFFSET == 216 && INDEX_CHECKSUM_OFFSET == 224 && HEADER_CHECKSUM_OFFSET == 232
    );
    assert!(RESERVED_OFFSET == 240 && RESERVED_OFFSET <= HEADER_BYTES);
    assert!(QUANT_SCHEME.len() < QUANT_SCHEME_BYTES);
};

/// The (magic, version) pairs this build knows, read together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionedMagic {
    /// `("SLUICEXP", 1)`: a complete version-1 container.
    CompleteV1,
    /// `("SLUICEPT", 1)`: a version-1 file `prepare` is still writing (or was interrupted in).
    UnfinishedV1,
    /// `("SLUICEXP", 2)`: a complete version-2 (k-quant) container.
    CompleteV2,
    /// `("SLUICEPT", 2)`: an unfinished version-2 file.
    UnfinishedV2,
}

impl VersionedMagic {
    /// Classifies the first 12 bytes; unknown pairs are rejected by name.
    pub fn read(bytes: &[u8]) -> Result<VersionedMagic, ContainerError> {
        if bytes.len() < HEADER_BYTES_OFFSET {
            return Err(ContainerError::TooShort {
                what: "header",
                found: bytes.len() as u64,
                needed: HEADER_BYTES as u64,
            });
        }
        let mut magic = [0u8; 8];
        magic.copy_from_slice(&bytes[MAGIC_OFFSET..VERSION_OFFSET]);
        let version = le_u32(bytes, VERSION_OFFSET);
        match (magic, version) {
            (MAGIC_COMPLETE, VERSION_1) => Ok(VersionedMagic::CompleteV1),
            (MAGIC_UNFINISHED, VERSION_1) => Ok(VersionedMagic::UnfinishedV1),
            (MAGIC_COMPLETE, VERSION_2) => Ok(VersionedMagic::CompleteV2),
            (MAGIC_UNFINISHED, VERSION_2) => Ok(VersionedMagic::UnfinishedV2),
            (MAGIC_COMPLETE, version) => Err(ContainerError::UnsupportedVersion {
                magic: "SLUICEXP",
                version,
            }),
            (MAGIC_UNFINISHED, version) => Err(ContainerError::UnsupportedVersion {
                magic: "SLUICEPT",
                version,
            }),
            (found, _) => Err(ContainerError::NotAContainer { found }),
        }
    }

    /// The magic bytes.
    pub fn magic(self) -> [u8; 8] {
        if self.is_unfinished() {
            MAGIC_UNFINISHED
        } else {
            MAGIC_COMPLETE
        }
    }

    /// The version number.
    pub fn version(self) -> u32 {
        match self {
            VersionedMagic::CompleteV1 | VersionedMagic::UnfinishedV1 => VERSION_1,
            VersionedMagic::CompleteV2 | VersionedMagic::UnfinishedV2 => VERSION_2,
        }
    }

    /// Whether this is the magic of a file `prepare` has not finished.
    pub fn is_unfinished(self) -> bool {
        matches!(
            self,
            VersionedMagic::UnfinishedV1 | VersionedMagic::UnfinishedV2
        )
    }

    /// The complete (or unfinished) magic of the version that holds `format`.
    pub fn for_format(format: ExpertFormat, complete: bool) -> VersionedMagic {
        match (format.version(), complete) {
            (VERSION_1, true) => VersionedMagic::CompleteV1,
            (VERSION_1, false) => VersionedMagic::UnfinishedV1,
            (_, true) => VersionedMagic::CompleteV2,
            (_, false) => VersionedMagic::UnfinishedV2,
        }
    }
}

/// A parsed, self-consistent header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Complete or unfinished, and the version.
    pub magic: VersionedMagic,
    /// The model the experts came from.
    pub identity: ModelIdentity,
    /// Dimensions and every offset derived from them.
    pub layout: ContainerLayout,
    /// xxh3-64 of the index entries (0 in an unfinished file).
    pub index_checksum: u64,
}

/// The header's `(row_block, col_group)` for a format: R16C4's `(16, 4)` for INT8; `(1, 256)`
/// for k-quants (whole rows of 256-weight blocks).
fn blocking(format: ExpertFormat) -> (u32, u32) {
    if format.version() == VERSION_1 {
        (ROW_BLOCK as u32, COL_GROUP as u32)
    } else {
        (1, QK_K as u32)
    }
}

fn put_u32(out: &mut [u8], offset: usize, v: u32) {
    out[offset..offset + U32].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut [u8], offset: usize, v: u64) {
    out[offset..offset + U64].copy_from_slice(&v.to_le_bytes());
}

impl Header {
    /// The header's 4096 bytes, checksum included.
    pub fn encode(&self) -> Vec<u8> {
        let l = &self.layout;
        let mut out = vec![0u8; HEADER_BYTES];
        out[MAGIC_OFFSET..VERSION_OFFSET].copy_from_slice(&self.magic.magic());
        put_u32(&mut out, VERSION_OFFSET, self.magic.version());
        put_u32(&mut out, HEADER_BYTES_OFFSET, HEADER_BYTES as u32);
        out[CONFIG_SHA256_OFFSET..][..SHA256].copy_from_slice(&self.identity.config_sha256);
        out[EXPERT_TENSORS_SHA256_OFFSET..][..SHA256]
            .copy_from_slice(&self.identity.expert_tensors_sha256);
        out[EXPERT_SAMPLE_SHA256_OFFSET..][..SHA256]
            .copy_from_slice(&self.identity.expert_sample_sha256);
        // The dimensions passed `ExpertDims::new`, so each fits in a u32.
        put_u32(&mut out, N_LAYERS_OFFSET, l.dims.n_layers as u32);
        put_u32(&mut out, N_EXPERTS_OFFSET, l.dims.n_experts as u32);
        put_u32(&mut out, HIDDEN_OFFSET, l.dims.hidden as u32);
        put_u32(&mut out, EXPERT_INNER_OFFSET, l.dims.inner as u32);
        let scheme = l.dims.format.scheme();
        out[QUANT_SCHEME_OFFSET..][..scheme.len()].copy_from_slice(scheme.as_bytes());
        let (row_block, col_group) = blocking(l.dims.format);
        put_u32(&mut out, ROW_BLOCK_OFFSET, row_block);
        put_u32(&mut out, COL_GROUP_OFFSET, col_group);
        put_u32(&mut out, ALIGNMENT_OFFSET, ALIGNMENT as u32);
        put_u32(
            &mut out,
            INDEX_ENTRY_BYTES_OFFSET,
            l.dims.index_entry_bytes() as u32,
        );
        put_u64(&mut out, INDEX_OFFSET_OFFSET, l.index_offset);
        put_u64(&mut out, INDEX_BYTES_OFFSET, l.index_bytes);
        put_u64(&mut out, BLOBS_OFFSET_OFFSET, l.blobs_offset);
        put_u64(&mut out, BLOB_STRIDE_OFFSET, l.blob.stride as u64);
        put_u64(
            &mut out,
            BLOB_CONTENT_BYTES_OFFSET,
            l.blob.content_bytes as u64,
        );
        put_u64(&mut out, FILE_BYTES_OFFSET, l.file_bytes);
        put_u64(&mut out, INDEX_CHECKSUM_OFFSET, self.index_checksum);
        let sum = checksum(&out[..HEADER_CHECKSUM_OFFSET]);
        put_u64(&mut out, HEADER_CHECKSUM_OFFSET, sum);
        out
    }

    /// The container fingerprint: the header checksum, which covers the identity, the
    /// dimensions and (through `index_checksum`) every blob checksum.
    pub fn fingerprint(&self) -> u64 {
        le_u64(&self.encode(), HEADER_CHECKSUM_OFFSET)
    }

    /// Parses and validates the first [`HEADER_BYTES`] of a container (complete or unfinished;
    /// the caller decides which it accepts). Checks, in order: magic and version, the header
    /// checksum, the quantisation scheme (one of the version's), each count against its cap,
    /// each derived field against the layout the dimensions and the format imply, and that the
    /// reserved bytes are zero.
    pub fn parse(bytes: &[u8]) -> Result<Header, ContainerError> {
        let magic = VersionedMagic::read(bytes)?;
        if bytes.len() < HEADER_BYTES {
            return Err(ContainerError::TooShort {
                what: "header",
                found: bytes.len() as u64,
                needed: HEADER_BYTES as u64,
            });
        }
        let bytes = &bytes[..HEADER_BYTES];
        let stored = le_u64(bytes, HEADER_CHECKSUM_OFFSET);
        let computed = checksum(&bytes[..HEADER_CHECKSUM_OFFSET]);
        if stored != computed {
            return Err(ContainerError::HeaderChecksum {
                offset: HEADER_CHECKSUM_OFFSET as u64,
                stored,
                computed,
            });
        }
        let exact32 = |field, offset: usize, expected: u64| {
            let found = u64::from(le_u32(bytes, offset));
            if found == expected {
                Ok(())
            } else {
                Err(ContainerError::HeaderField {
                    field,
                    offset: offset as u64,
                    found,
                    expected,
                })
            }
        };
        let exact64 = |field, offset: usize, expected: u64| {
            let found = le_u64(bytes, offset);
            if found == expected {
                Ok(())
            } else {
                Err(ContainerError::HeaderField {
                    field,
                    offset: offset as u64,
                    found,
                    expected,
                })
            }
        };
        let capped = |field, offset: usize, max: u64| {
            let found = u64::from(le_u32(bytes, offset));
            if found == 0 || found > max {
                Err(ContainerError::HeaderLimit {
                    field,
                    offset: offset as u64,
                    found,
                    max,
                })
            } else {
                Ok(found as usize)
            }
        };
        exact32("header_bytes", HEADER_BYTES_OFFSET, HEADER_BYTES as u64)?;
        let scheme = &bytes[QUANT_SCHEME_OFFSET..ROW_BLOCK_OFFSET];
        let end = scheme.iter().position(|&b| b == 0).unwrap_or(scheme.len());
        let format = ExpertFormat::from_scheme(&scheme[..end])
            .filter(|f| f.version() == magic.version() && scheme[end..].iter().all(|&b| b == 0))
            .ok_or_else(|| ContainerError::QuantScheme {
                offset: QUANT_SCHEME_OFFSET as u64,
                found: scheme[..end].escape_ascii().to_string(),
            })?;
        let dims = ExpertDims {
            n_layers: capped("n_layers", N_LAYERS_OFFSET, MAX_LAYERS)?,
            n_experts: capped("n_experts", N_EXPERTS_OFFSET, MAX_EXPERTS)?,
            hidden: capped("hidden", HIDDEN_OFFSET, MAX_DIM)?,
            inner: capped("expert_inner", EXPERT_INNER_OFFSET, MAX_DIM)?,
            format,
        };
        let (row_block, col_group) = blocking(format);
        exact32("row_block", ROW_BLOCK_OFFSET, u64::from(row_block))?;
        exact32("col_group", COL_GROUP_OFFSET, u64::from(col_group))?;
        exact32("alignment", ALIGNMENT_OFFSET, ALIGNMENT)?;
        exact32(
            "index_entry_bytes",
            INDEX_ENTRY_BYTES_OFFSET,
            dims.index_entry_bytes() as u64,
        )?;
        let layout = ContainerLayout::new(dims)?;
        exact64("index_offset", INDEX_OFFSET_OFFSET, layout.index_offset)?;
        exact64("index_bytes", INDEX_BYTES_OFFSET, layout.index_bytes)?;
        exact64("blobs_offset", BLOBS_OFFSET_OFFSET, layout.blobs_offset)?;
        exact64("blob_stride", BLOB_STRIDE_OFFSET, layout.blob.stride as u64)?;
        exact64(
            "blob_content_bytes",
            BLOB_CONTENT_BYTES_OFFSET,
            layout.blob.content_bytes as u64,
        )?;
        exact64("file_bytes", FILE_BYTES_OFFSET, layout.file_bytes)?;
        if let Some(i) = bytes[RESERVED_OFFSET..].iter().position(|&b| b != 0) {
            let offset = RESERVED_OFFSET + i;
            return Err(ContainerError::HeaderReserved {
                offset: offset as u64,
                found: bytes[offset],
            });
        }
        let sha = |offset: usize| -> [u8; 32] {
            let mut d = [0u8; 32];
            d.copy_from_slice(&bytes[offset..offset + SHA256]);
            d
        };
        Ok(Header {
            magic,
            identity: ModelIdentity {
                config_sha256: sha(CONFIG_SHA256_OFFSET),
                expert_tensors_sha256: sha(EXPERT_TENSORS_SHA256_OFFSET),
                expert_sample_sha256: sha(EXPERT_SAMPLE_SHA256_OFFSET),
            },
            layout,
            index_checksum: le_u64(bytes, INDEX_CHECKSUM_OFFSET),
        })
    }
}
