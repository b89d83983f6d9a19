//! Where everything lives in a container, as pure functions of the dimensions: the file's
//! regions (header, index, blobs) in [`ContainerLayout`] and the parts inside one expert blob in
//! [`BlobLayout`] (docs/container-format.md, "File map" and "Expert blob").
//!
//! Every quantity is computed with checked arithmetic from capped inputs; nothing here reads or
//! trusts a file — the header parser compares what a file says against these values.

use super::ContainerError;
use super::format::ExpertFormat;
use crate::config::TextConfig;
use crate::ids::{ExpertId, LayerId};
use crate::kernels::int8::{padded_cols, padded_rows};
use crate::kernels::kquant;

/// Alignment of the index, of every blob and of every blob's length (the direct-IO block size).
pub const ALIGNMENT: u64 = 4096;
/// Alignment of every part inside a blob, relative to the blob's start (one zmm).
pub const PART_ALIGN: usize = 64;
/// Bytes of the checksum that ends each blob's contents.
pub const CHECKSUM_BYTES: usize = 8;
/// Bytes of the fixed header region at offset 0.
pub const HEADER_BYTES: usize = 4096;
/// Bytes of one v1 index entry (offset, length, checksum; three u64).
pub const INDEX_ENTRY_BYTES: usize = 24;
/// Bytes of one v2 index entry (offset, length, checksum; then the expert's format code, u32,
/// and a reserved zero u32).
pub const INDEX_ENTRY_BYTES_V2: usize = 32;
/// Largest `n_layers` a container may declare.
pub const MAX_LAYERS: u64 = 4096;
/// Largest `n_experts` (per layer) a container may declare.
pub const MAX_EXPERTS: u64 = 65_536;
/// Largest `hidden` or `expert_inner` a container may declare.
pub const MAX_DIM: u64 = 65_536;
/// Largest blob (stride) accepted: 1 GiB, far above the real 3 MiB, far below address-space trouble.
pub const MAX_BLOB_BYTES: u64 = 1 << 30;

/// The four numbers and the format that determine a container's whole layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertDims {
    /// Decoder layers (each has one routed-expert set).
    pub n_layers: usize,
    /// Routed experts per layer.
    pub n_experts: usize,
    /// Residual width `d` (gate/up input, down output).
    pub hidden: usize,
    /// One expert's inner width `f` (gate/up output rows, down input).
    pub inner: usize,
    /// How every expert is quantised ([`ExpertFormat::Int8`] from [`ExpertDims::new`]).
    pub format: ExpertFormat,
}

impl ExpertDims {
    /// Dimensions checked against the caps (each in `1..=max`).
    pub fn new(
        n_layers: usize,
        n_experts: usize,
        hidden: usize,
        inner: usize,
    ) -> Result<ExpertDims, ContainerError> {
        for (field, found, max) in [
            ("n_layers", n_layers, MAX_LAYERS),
            ("n_experts", n_experts, MAX_EXPERTS),
            ("hidden", hidden, MAX_DIM),
            ("expert_inner", inner, MAX_DIM),
        ] {
            if found == 0 || found as u64 > max {
                return Err(ContainerError::Dimension {
                    field,
                    found: found as u64,
                    max,
                });
            }
        }
        Ok(ExpertDims {
            n_layers,
            n_experts,
            hidden,
            inner,
            format: ExpertFormat::Int8,
        })
    }

    /// The same dimensions holding experts in `format`.
    #[must_use]
    pub fn with_format(self, format: ExpertFormat) -> ExpertDims {
        ExpertDims { format, ..self }
    }

    /// Bytes of one index entry for this format's version.
    pub fn index_entry_bytes(&self) -> usize {
        if self.format.version() == 1 {
            INDEX_ENTRY_BYTES
        } else {
            INDEX_ENTRY_BYTES_V2
        }
    }

    /// The routed-expert dimensions of a model configuration.
    pub fn from_config(cfg: &TextConfig) -> Result<ExpertDims, ContainerError> {
        ExpertDims::new(
            cfg.num_layers,
            cfg.num_experts,
            cfg.hidden_size,
            cfg.moe_intermediate_size,
        )
    }

    /// Blobs in the container (`n_layers · n_experts`; cannot overflow under the caps).
    pub fn n_blobs(&self) -> usize {
        self.n_layers * self.n_experts
    }
}

/// A byte range inside a blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// Offset from the blob's start.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
}

impl Part {
    /// `offset..offset + len`.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len
    }
    /// First byte after the part.
    pub fn end(&self) -> usize {
        self.offset + self.len
    }
}

/// The byte offsets of each part inside one expert blob, for given `d` and `f`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobLayout {
    /// The expert format the parts are laid out for.
    pub format: ExpertFormat,
    /// Logical rows of the fused gate+up matrix, `2f`.
    pub gate_up_rows: usize,
    /// Logical columns of the gate+up matrix, `d`.
    pub gate_up_cols: usize,
    /// Logical rows of the down matrix, `d`.
    pub down_rows: usize,
    /// Logical columns of the down matrix, `f`.
    pub down_cols: usize,
    /// gate_up weights: INT8, `padded_rows(2f) × padded_cols(d)` bytes, R16C4; k-quant,
    /// `2f × row_bytes(kind, d)` bytes of blocks, row-major.
    pub gate_up_packed: Part,
    /// down weights: INT8, `padded_rows(d) × padded_cols(f)` bytes, R16C4; k-quant,
    /// `d × row_bytes(kind, f)` bytes of blocks.
    pub down_packed: Part,
    /// gate_up scales, `padded_rows(2f)` f32 (INT8 only; empty for k-quants, whose scales are
    /// inside the blocks).
    pub gate_up_scales: Part,
    /// down scales, `padded_rows(d)` f32 (INT8 only).
    pub down_scales: Part,
    /// gate_up row sums, `padded_rows(2f)` i32 (INT8 only).
    pub gate_up_row_sums: Part,
    /// down row sums, `padded_rows(d)` i32 (INT8 only).
    pub down_row_sums: Part,
    /// Offset of the u64 checksum (= bytes the checksum covers).
    pub checksum_offset: usize,
    /// Bytes up to and including the checksum.
    pub content_bytes: usize,
    /// Bytes of the blob including its zero padding: a multiple of [`ALIGNMENT`].
    pub stride: usize,
}

fn overflow(what: &'static str) -> ContainerError {
    ContainerError::Overflow { what }
}

/// `n` rounded up to a multiple of `align` (a power of two), or `None` on overflow.
pub fn align_up(n: u64, align: u64) -> Option<u64> {
    assert!(align.is_power_of_two());
    Some(n.checked_add(align - 1)? & !(align - 1))
}

impl BlobLayout {
    /// The INT8 blob layout for hidden width `hidden` (d) and expert inner width `inner` (f).
    pub fn new(hidden: usize, inner: usize) -> Result<BlobLayout, ContainerError> {
        BlobLayout::with_format(hidden, inner, ExpertFormat::Int8)
    }

    /// The blob layout of `format` for hidden width `hidden` (d) and inner width `inner` (f).
    pub fn with_format(
        hidden: usize,
        inner: usize,
        format: ExpertFormat,
    ) -> Result<BlobLayout, ContainerError> {
        if hidden == 0 || hidden as u64 > MAX_DIM {
            return Err(ContainerError::Dimension {
                field: "hidden",
                found: hidden as u64,
                max: MAX_DIM,
            });
        }
        if inner == 0 || inner as u64 > MAX_DIM {
            return Err(ContainerError::Dimension {
                field: "expert_inner",
                found: inner as u64,
                max: MAX_DIM,
            });
        }
        let gate_up_rows = inner.checked_mul(2).ok_or(overflow("2f"))?;
        let (pr_gu, pc_gu) = (padded_rows(gate_up_rows), padded_cols(hidden));
        let (pr_dn, pc_dn) = (padded_rows(hidden), padded_cols(inner));
        let mut cursor = 0usize;
        let mut next = |len: Option<usize>, what: &'static str| -> Result<Part, ContainerError> {
            let len = len.ok_or(overflow(what))?;
            let offset = align_up(cursor as u64, PART_ALIGN as u64).ok_or(overflow(what))? as usize;
            cursor = offset.checked_add(len).ok_or(overflow(what))?;
            Ok(Part { offset, len })
        };
        let (
            gate_up_packed,
            down_packed,
            gate_up_scales,
            down_scales,
            gate_up_row_sums,
            down_row_sums,
        );
        if let Some((gu, dn)) = format.kquant() {
            gate_up_packed = next(
                gate_up_rows.checked_mul(kquant::row_bytes(gu, hidden)),
                "gate_up blocks",
            )?;
            down_packed = next(
                hidden.checked_mul(kquant::row_bytes(dn, inner)),
                "down blocks",
            )?;
            let empty = Part {
                offset: down_packed.end(),
                len: 0,
            };
            (gate_up_scales, down_scales, gate_up_row_sums, down_row_sums) =
                (empty, empty, empty, empty);
        } else {
            gate_up_packed = next(pr_gu.checked_mul(pc_gu), "gate_up packed")?;
            down_packed = next(pr_dn.checked_mul(pc_dn), "down packed")?;
            gate_up_scales = next(pr_gu.checked_mul(4), "gate_up scales")?;
            down_scales = next(pr_dn.checked_mul(4), "down scales")?;
            gate_up_row_sums = next(pr_gu.checked_mul(4), "gate_up row sums")?;
            down_row_sums = next(pr_dn.checked_mul(4), "down row sums")?;
        }
        // The checksum is a u64 and the parts end on 4-byte multiples; keep it 8-aligned.
        let checksum_offset =
            align_up(cursor as u64, 8).ok_or(overflow("checksum offset"))? as usize;
        let content_bytes = checksum_offset
            .checked_add(CHECKSUM_BYTES)
            .ok_or(overflow("blob content"))?;
        let stride = align_up(content_bytes as u64, ALIGNMENT).ok_or(overflow("blob stride"))?;
        if stride > MAX_BLOB_BYTES {
            return Err(ContainerError::Dimension {
                field: "blob_stride",
                found: stride,
                max: MAX_BLOB_BYTES,
            });
        }
        Ok(BlobLayout {
            format,
            gate_up_rows,
            gate_up_cols: hidden,
            down_rows: hidden,
            down_cols: inner,
            gate_up_packed,
            down_packed,
            gate_up_scales,
            down_scales,
            gate_up_row_sums,
            down_row_sums,
            checksum_offset,
            content_bytes,
            stride: stride as usize,
        })
    }

    /// Padded row count of the gate+up matrix (entries in its scales and row sums).
    pub fn gate_up_padded_rows(&self) -> usize {
        self.gate_up_scales.len / 4
    }

    /// Padded row count of the down matrix.
    pub fn down_padded_rows(&self) -> usize {
        self.down_scales.len / 4
    }
}

/// The file's regions for given dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerLayout {
    /// The dimensions everything follows from.
    pub dims: ExpertDims,
    /// Layout of every blob.
    pub blob: BlobLayout,
    /// File offset of the index (right after the header).
    pub index_offset: u64,
    /// Bytes of index entries (`n_blobs · index_entry_bytes`: 24 in v1, 32 in v2), without
    /// padding.
    pub index_bytes: u64,
    /// File offset of blob (0, 0): the index's end rounded up to [`ALIGNMENT`].
    pub blobs_offset: u64,
    /// Total file length.
    pub file_bytes: u64,
}

impl ContainerLayout {
    /// The layout of a container with these dimensions.
    pub fn new(dims: ExpertDims) -> Result<ContainerLayout, ContainerError> {
        let dims_checked = ExpertDims::new(dims.n_layers, dims.n_experts, dims.hidden, dims.inner)?;
        let dims = dims_checked.with_format(dims.format);
        let blob = BlobLayout::with_format(dims.hidden, dims.inner, dims.format)?;
        let n_blobs = dims.n_blobs() as u64;
        let index_offset = HEADER_BYTES as u64;
        let index_bytes = n_blobs
            .checked_mul(dims.index_entry_bytes() as u64)
            .ok_or(overflow("index bytes"))?;
        let index_end = index_offset
            .checked_add(index_bytes)
            .ok_or(overflow("index end"))?;
        let blobs_offset = align_up(index_end, ALIGNMENT).ok_or(overflow("blobs offset"))?;
        let blob_bytes = n_blobs
            .checked_mul(blob.stride as u64)
            .ok_or(overflow("blob region"))?;
        let file_bytes = blobs_offset
            .checked_add(blob_bytes)
            .ok_or(overflow("file bytes"))?;
        Ok(ContainerLayout {
            dims,
            blob,
            index_offset,
            index_bytes,
            blobs_offset,
            file_bytes,
        })
    }

    /// Position of (layer, expert) in index and blob order, or `OutOfRange`.
    pub fn blob_index(&self, layer: LayerId, expert: ExpertId) -> Result<usize, ContainerError> {
        if layer.index() >= self.dims.n_layers || expert.index() >= self.dims.n_experts {
            return Err(ContainerError::OutOfRange {
                layer,
                expert,
                n_layers: self.dims.n_layers,
                n_experts: self.dims.n_experts,
            });
        }
        Ok(layer.index() * self.dims.n_experts + expert.index())
    }

    /// The (layer, expert) at position `i` of index and blob order (`i` below `n_blobs`).
    pub fn blob_ids(&self, i: usize) -> (LayerId, ExpertId) {
        assert!(i < self.dims.n_blobs());
        (
            LayerId::from_index(i / self.dims.n_experts),
            ExpertId::from_index(i % self.dims.n_experts),
        )
    }

    /// File offset of blob number `i` (in (layer, expert) order). `i` must be below `n_blobs`;
    /// under that bound it cannot overflow because `file_bytes` did not.
    pub fn blob_offset_at(&self, i: usize) -> u64 {
        assert!(i < self.dims.n_blobs());
        self.blobs_offset + i as u64 * self.blob.stride as u64
    }

    /// File offset of (layer, expert)'s blob.
    pub fn blob_offset(&self, layer: LayerId, expert: ExpertId) -> Result<u64, ContainerError> {
        Ok(self.blob_offset_at(self.blob_index(layer, expert)?))
    }

    /// File offset of index entry number `i`.
    pub fn index_entry_offset(&self, i: usize) -> u64 {
        self.index_offset + (i * self.dims.index_entry_bytes()) as u64
    }

    /// Bytes of one whole layer's blobs.
    pub fn layer_bytes(&self) -> u64 {
        self.dims.n_experts as u64 * self.blob.stride as u64
    }
}
