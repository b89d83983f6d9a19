//! Encoding: a blob from an expert's two quantised matrices (INT8 or k-quant), and the
//! unfinished and complete headers.
//! Pure — bytes out; `expertd prepare` does the file IO (pwrite, fsync, rename).
//!
//! Every multi-byte value is written with explicit `to_le_bytes`.

use super::ContainerError;
use super::checksum::checksum;
use super::header::{Header, VersionedMagic};
use super::identity::ModelIdentity;
use super::index;
use super::layout::{BlobLayout, ContainerLayout, Part};
use crate::kernels::ExpertMatrices;
use crate::kernels::int8::MatrixRef;
use crate::kernels::kquant::{KMatrixRef, KQuantKind};

fn shape(what: &'static str, found: usize, expected: usize) -> Result<(), ContainerError> {
    if found == expected {
        Ok(())
    } else {
        Err(ContainerError::EncodeShape {
            what,
            found: found as u64,
            expected: expected as u64,
        })
    }
}

fn check_matrix(
    m: &MatrixRef<'_>,
    rows: usize,
    cols: usize,
    packed: Part,
    scales: Part,
    names: [&'static str; 5],
) -> Result<(), ContainerError> {
    shape(names[0], m.rows, rows)?;
    shape(names[1], m.cols, cols)?;
    shape(names[2], m.packed.len(), packed.len)?;
    shape(names[3], m.scales.len(), scales.len / 4)?;
    shape(names[4], m.row_sums.len(), scales.len / 4)
}

/// Writes one expert's blob into `out` (exactly `layout.stride` bytes) in the layout's format:
/// the matrices' parts at their layout offsets, zeros everywhere else, and the checksum
/// trailer. Returns the checksum (what the index stores). A matrix in another format than the
/// layout's is an `EncodeShape` error.
pub fn encode_expert(
    layout: &BlobLayout,
    m: &ExpertMatrices<'_>,
    out: &mut [u8],
) -> Result<u64, ContainerError> {
    match (m, layout.format.kquant()) {
        (ExpertMatrices::Int8 { gate_up, down }, None) => encode_blob(layout, gate_up, down, out),
        (ExpertMatrices::KQuant { gate_up, down }, Some(kinds)) => {
            encode_kquant(layout, kinds, gate_up, down, out)
        }
        _ => Err(ContainerError::EncodeShape {
            what: "expert format (1 = k-quant)",
            found: u64::from(m.kquant().is_some()),
            expected: u64::from(layout.format.kquant().is_some()),
        }),
    }
}

fn encode_kquant(
    layout: &BlobLayout,
    (gu_kind, dn_kind): (KQuantKind, KQuantKind),
    gate_up: &KMatrixRef<'_>,
    down: &KMatrixRef<'_>,
    out: &mut [u8],
) -> Result<u64, ContainerError> {
    shape("blob buffer bytes", out.len(), layout.stride)?;
    // The kinds differ exactly when their block sizes do (144 Q4_K, 210 Q6_K).
    shape(
        "gate_up bytes per block",
        gate_up.kind.block_bytes(),
        gu_kind.block_bytes(),
    )?;
    shape(
        "down bytes per block",
        down.kind.block_bytes(),
        dn_kind.block_bytes(),
    )?;
    shape("gate_up rows", gate_up.rows, layout.gate_up_rows)?;
    shape("gate_up cols", gate_up.cols, layout.gate_up_cols)?;
    shape(
        "gate_up block bytes",
        gate_up.data.len(),
        layout.gate_up_packed.len,
    )?;
    shape("down rows", down.rows, layout.down_rows)?;
    shape("down cols", down.cols, layout.down_cols)?;
    shape("down block bytes", down.data.len(), layout.down_packed.len)?;
    out.fill(0);
    out[layout.gate_up_packed.range()].copy_from_slice(gate_up.data);
    out[layout.down_packed.range()].copy_from_slice(down.data);
    let sum = checksum(&out[..layout.checksum_offset]);
    out[layout.checksum_offset..layout.content_bytes].copy_from_slice(&sum.to_le_bytes());
    Ok(sum)
}

/// Writes one INT8 expert's blob into `out` (exactly `layout.stride` bytes): the packed
/// matrices, scales and row sums at their layout offsets, zeros everywhere else, and the
/// checksum trailer. Returns the checksum (what the index stores).
pub fn encode_blob(
    layout: &BlobLayout,
    gate_up: &MatrixRef<'_>,
    down: &MatrixRef<'_>,
    out: &mut [u8],
) -> Result<u64, ContainerError> {
    shape("blob buffer bytes", out.len(), layout.stride)?;
    shape(
        "expert format (1 = k-quant)",
        usize::from(layout.format.kquant().is_some()),
        0,
    )?;
    check_matrix(
        gate_up,
        layout.gate_up_rows,
        layout.gate_up_cols,
        layout.gate_up_packed,
        layout.gate_up_scales,
        [
            "gate_up rows",
            "gate_up cols",
            "gate_up packed bytes",
            "gate_up scales",
            "gate_up row sums",
        ],
    )?;
    check_matrix(
        down,
        layout.down_rows,
        layout.down_cols,
        layout.down_packed,
        layout.down_scales,
        [
            "down rows",
            "down cols",
            "down packed bytes",
            "down scales",
            "down row sums",
        ],
    )?;
    out.fill(0);
    out[layout.gate_up_packed.range()].copy_from_slice(bytemuck::cast_slice(gate_up.packed));
    out[layout.down_packed.range()].copy_from_slice(bytemuck::cast_slice(down.packed));
    let floats = |dst: &mut [u8], src: &[f32]| {
        for (d, s) in dst.chunks_exact_mut(4).zip(src) {
            d.copy_from_slice(&s.to_le_bytes());
        }
    };
    floats(&mut out[layout.gate_up_scales.range()], gate_up.scales);
    floats(&mut out[layout.down_scales.range()], down.scales);
    let ints = |dst: &mut [u8], src: &[i32]| {
        for (d, s) in dst.chunks_exact_mut(4).zip(src) {
            d.copy_from_slice(&s.to_le_bytes());
        }
    };
    ints(&mut out[layout.gate_up_row_sums.range()], gate_up.row_sums);
    ints(&mut out[layout.down_row_sums.range()], down.row_sums);
    let sum = checksum(&out[..layout.checksum_offset]);
    out[layout.checksum_offset..layout.content_bytes].copy_from_slice(&sum.to_le_bytes());
    Ok(sum)
}

/// The header of a file being written: magic "SLUICEPT" (version of the layout's format),
/// `index_checksum` 0.
pub fn unfinished_header(identity: ModelIdentity, layout: ContainerLayout) -> Header {
    Header {
        magic: VersionedMagic::for_format(layout.dims.format, false),
        identity,
        layout,
        index_checksum: 0,
    }
}

/// The index region and the complete header for the given blob checksums (in (layer, expert)
/// order).
///
/// # Panics
///
/// Panics if `checksums.len()` is not the layout's blob count.
pub fn finish(
    identity: ModelIdentity,
    layout: ContainerLayout,
    checksums: &[u64],
) -> (Vec<u8>, Header) {
    let region = index::encode_index(&layout, checksums);
    let index_checksum = index::index_checksum(&layout, &region);
    (
        region,
        Header {
            magic: VersionedMagic::for_format(layout.dims.format, true),
            identity,
            layout,
            index_checksum,
        },
    )
}
