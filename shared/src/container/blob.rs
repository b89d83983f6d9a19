//! One expert blob read back: [`check_blob`] verifies a blob buffer (length, checksum against
//! its trailer and the index, zero padding) and [`ExpertBlob::parse`] then views its parts in
//! place as the kernels' matrices ([`ExpertMatrices`]: INT8 [`MatrixRef`]s with alignment
//! checks, or k-quant [`KMatrixRef`]s).
//!
//! Pure and allocation-free, errors included: this runs once per expert read in the daemon.

use super::ContainerError;
use super::checksum::{checksum, le_u64};
use super::layout::{BlobLayout, CHECKSUM_BYTES, Part};
use crate::ids::{ExpertId, LayerId};
use crate::kernels::ExpertMatrices;
use crate::kernels::int8::MatrixRef;
use crate::kernels::kquant::KMatrixRef;

/// Which blob a buffer holds, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobAt {
    /// Layer.
    pub layer: LayerId,
    /// Expert within the layer.
    pub expert: ExpertId,
    /// File offset of the blob.
    pub offset: u64,
}

/// Verifies one blob buffer of `layout.stride` bytes: its contents hash to its trailer, the
/// trailer equals `index_checksum` when one is given, and the padding after the trailer is
/// zero. Returns the checksum.
pub fn check_blob(
    bytes: &[u8],
    layout: &BlobLayout,
    at: BlobAt,
    index_checksum: Option<u64>,
) -> Result<u64, ContainerError> {
    let BlobAt {
        layer,
        expert,
        offset,
    } = at;
    if bytes.len() != layout.stride {
        return Err(ContainerError::BlobLength {
            layer,
            expert,
            offset,
            found: bytes.len() as u64,
            expected: layout.stride as u64,
        });
    }
    // PERF-CRITICAL: one pass over the blob (3 MiB at the real dimensions) per expert read.
    let computed = checksum(&bytes[..layout.checksum_offset]);
    let trailer = le_u64(bytes, layout.checksum_offset);
    if computed != trailer || index_checksum.is_some_and(|c| c != computed) {
        return Err(ContainerError::BlobChecksum {
            layer,
            expert,
            offset,
            computed,
            trailer,
            index: index_checksum,
        });
    }
    if let Some(i) = bytes[layout.content_bytes..].iter().position(|&b| b != 0) {
        let byte_offset = offset + (layout.content_bytes + i) as u64;
        return Err(ContainerError::BlobPadding {
            layer,
            expert,
            offset,
            byte_offset,
        });
    }
    Ok(computed)
}

/// The two matrices of one expert, borrowed from a verified blob buffer.
pub type ExpertBlob<'a> = ExpertMatrices<'a>;

impl<'a> ExpertMatrices<'a> {
    /// Verifies `bytes` (see [`check_blob`], with the index's `expected_checksum`) and views its
    /// parts. The f32 and i32 parts must be 4-byte aligned in memory: they are 64-byte aligned
    /// relative to the blob start, so any buffer aligned to 4 (every heap allocation) works.
    pub fn parse(
        bytes: &'a [u8],
        layout: &BlobLayout,
        at: BlobAt,
        expected_checksum: u64,
    ) -> Result<ExpertBlob<'a>, ContainerError> {
        check_blob(bytes, layout, at, Some(expected_checksum))?;
        ExpertBlob::view_verified(bytes, layout, at)
    }

    /// Views the parts of a blob that [`check_blob`] (or [`ExpertBlob::parse`]) has already
    /// verified, without hashing it again: for callers that keep verified blobs in memory and
    /// compute from them many times. Checks only the length and the alignment of the parts.
    pub fn view_verified(
        bytes: &'a [u8],
        layout: &BlobLayout,
        at: BlobAt,
    ) -> Result<ExpertBlob<'a>, ContainerError> {
        if bytes.len() != layout.stride {
            let BlobAt {
                layer,
                expert,
                offset,
            } = at;
            return Err(ContainerError::BlobLength {
                layer,
                expert,
                offset,
                found: bytes.len() as u64,
                expected: layout.stride as u64,
            });
        }
        if let Some((gu, dn)) = layout.format.kquant() {
            return Ok(ExpertMatrices::KQuant {
                gate_up: KMatrixRef {
                    kind: gu,
                    rows: layout.gate_up_rows,
                    cols: layout.gate_up_cols,
                    data: &bytes[layout.gate_up_packed.range()],
                },
                down: KMatrixRef {
                    kind: dn,
                    rows: layout.down_rows,
                    cols: layout.down_cols,
                    data: &bytes[layout.down_packed.range()],
                },
            });
        }
        let gate_up = [
            layout.gate_up_packed,
            layout.gate_up_scales,
            layout.gate_up_row_sums,
        ];
        let down = [layout.down_packed, layout.down_scales, layout.down_row_sums];
        let gate_up = view_matrix(
            bytes,
            at,
            (layout.gate_up_rows, layout.gate_up_cols),
            gate_up,
            ["gate_up scales", "gate_up row sums"],
        )?;
        let down = view_matrix(
            bytes,
            at,
            (layout.down_rows, layout.down_cols),
            down,
            ["down scales", "down row sums"],
        )?;
        Ok(ExpertMatrices::Int8 { gate_up, down })
    }
}

/// One matrix of a blob: `(rows, cols)`, its packed, scales and row-sums parts, and the names of
/// the f32 and i32 parts for the error when one is not 4-byte aligned in memory.
fn view_matrix<'a>(
    bytes: &'a [u8],
    at: BlobAt,
    (rows, cols): (usize, usize),
    [packed, scales, row_sums]: [Part; 3],
    [scales_name, row_sums_name]: [&'static str; 2],
) -> Result<MatrixRef<'a>, ContainerError> {
    Ok(MatrixRef {
        rows,
        cols,
        packed: bytemuck::cast_slice(&bytes[packed.range()]),
        scales: bytemuck::try_cast_slice(&bytes[scales.range()])
            .map_err(|_| misaligned(at, scales_name))?,
        row_sums: bytemuck::try_cast_slice(&bytes[row_sums.range()])
            .map_err(|_| misaligned(at, row_sums_name))?,
    })
}

fn misaligned(at: BlobAt, part: &'static str) -> ContainerError {
    ContainerError::Misaligned {
        layer: at.layer,
        expert: at.expert,
        offset: at.offset,
        part,
    }
}

const _: () = assert!(CHECKSUM_BYTES == 8);
