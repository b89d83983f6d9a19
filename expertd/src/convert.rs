//! Converting one routed expert: pread its BF16 gate, up and down ranges from the checkpoint,
//! widen to f32, quantise in the container's format (`shared::kernels::int8::quantize_weights`
//! or `shared::kernels::kquant::quantize_matrix`), encode the container blob, and measure the
//! dequantisation error.
//!
//! Owns no file layout and no resume logic (that is `prepare`); holds one expert in memory at a
//! time (about 40 MiB at the real dimensions), never a whole fused tensor.

use crate::prepare::PrepareError;
use crate::quant_error::{ErrorStats, KindStats};
use half::bf16;
use safetensors::Dtype;
use shared::checkpoint::Checkpoint;
use shared::container::BlobLayout;
use shared::container::writer::encode_expert;
use shared::ids::{ExpertId, LayerId};
use shared::kernels::ExpertMatrices;
use shared::kernels::int8::quantize_weights;
use shared::kernels::kquant::{self, KMatrix};
use shared::safetensors_locator::{ByteRange, ExpertLocator};
use std::fs::File;
use std::os::unix::fs::FileExt;

/// The checkpoint's shard files, opened once and read with `pread` from any thread.
pub(crate) struct ShardFiles {
    files: Vec<File>,
}

impl ShardFiles {
    /// Opens every shard of `ckpt` read-only.
    pub(crate) fn open(ckpt: &Checkpoint) -> Result<ShardFiles, PrepareError> {
        let files = ckpt
            .shards
            .iter()
            .map(|s| File::open(&s.path).map_err(|e| PrepareError::io(&s.path, e)))
            .collect::<Result<_, _>>()?;
        Ok(ShardFiles { files })
    }

    /// Reads a BF16 matrix range and appends it widened to f32 to `out`.
    fn read_bf16(
        &self,
        range: &ByteRange,
        what: &'static str,
        layer: LayerId,
        expert: ExpertId,
        out: &mut Vec<f32>,
    ) -> Result<(), PrepareError> {
        let [rows, cols] = range.shape;
        let expected = (rows as u64) * (cols as u64) * 2;
        if range.dtype != Dtype::BF16 || range.len != expected {
            return Err(PrepareError::Source {
                layer,
                expert,
                what,
                reason: format!(
                    "expected BF16 {rows}×{cols} ({expected} bytes), found {:?} with {} bytes",
                    range.dtype, range.len
                ),
            });
        }
        let file = self
            .files
            .get(range.shard)
            .ok_or_else(|| PrepareError::Source {
                layer,
                expert,
                what,
                reason: format!("shard index {} out of range", range.shard),
            })?;
        let mut bytes = vec![0u8; range.len as usize];
        file.read_exact_at(&mut bytes, range.offset)
            .map_err(|e| PrepareError::io(&range.file, e))?;
        out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()),
        );
        Ok(())
    }
}

/// One converted expert, ready to be written at its offset.
pub(crate) struct ConvertedExpert {
    /// The blob, `layout.stride` bytes, checksum trailer included.
    pub blob: Vec<u8>,
    /// Its checksum (what the index stores).
    pub checksum: u64,
    /// Its dequantisation error.
    pub stats: ErrorStats,
    /// BF16 bytes read from the checkpoint.
    pub source_bytes: u64,
}

/// Converts (layer, expert): gate and up are quantised as one `[2f × d]` matrix (gate rows
/// first), down as `[d × f]`.
pub(crate) fn convert_expert(
    locator: &ExpertLocator<'_>,
    files: &ShardFiles,
    layout: &BlobLayout,
    layer: LayerId,
    expert: ExpertId,
) -> Result<ConvertedExpert, PrepareError> {
    let ranges = locator.expert(layer, expert)?;
    let (f, d) = (layout.down_cols, layout.down_rows);
    let mut gate_up = Vec::with_capacity(2 * f * d);
    files.read_bf16(&ranges.gate, "gate", layer, expert, &mut gate_up)?;
    files.read_bf16(&ranges.up, "up", layer, expert, &mut gate_up)?;
    let mut down = Vec::with_capacity(d * f);
    files.read_bf16(&ranges.down, "down", layer, expert, &mut down)?;
    // A NaN or infinite weight has no quantised value (the INT8 scale and the k-quant fits
    // would silently absorb it): refuse it, naming the tensor and the element.
    let split = (f * d).min(gate_up.len());
    let (gate, up) = gate_up.split_at(split);
    for (what, w, cols) in [("gate", gate, d), ("up", up, d), ("down", &down[..], f)] {
        if let Some(i) = w.iter().position(|v| !v.is_finite()) {
            return Err(PrepareError::Source {
                layer,
                expert,
                what,
                reason: format!(
                    "weight [{}, {}] is {} (not finite)",
                    i / cols.max(1),
                    i % cols.max(1),
                    w[i]
                ),
            });
        }
    }
    if gate_up.len() != 2 * f * d || down.len() != d * f {
        return Err(PrepareError::Source {
            layer,
            expert,
            what: "gate/up/down",
            reason: format!("shapes do not match the config's d = {d}, f = {f}"),
        });
    }
    let kquant = layout.format.kquant().map(|(gu, dn)| {
        (
            kquant::quantize_matrix(gu, &gate_up, 2 * f, d),
            kquant::quantize_matrix(dn, &down, d, f),
        )
    });
    encode_converted(
        layout,
        layer,
        expert,
        (&gate_up, &down),
        kquant,
        ranges.total_bytes(),
    )
}

/// Finishes one expert whose f32 weights are `gate_up` (`[2f × d]`, gate rows first) and
/// `down` (`[d × f]`): encodes the blob in `layout`'s format from the k-quant matrices given
/// (checked for finite super-scales) or, for INT8 (`None`), quantizes them here, and measures
/// the dequantization error against those f32 weights. Both sources (`convert_expert` and the
/// GGUF reader) end here.
pub(crate) fn encode_converted(
    layout: &BlobLayout,
    layer: LayerId,
    expert: ExpertId,
    (gate_up, down): (&[f32], &[f32]),
    kquant: Option<(KMatrix, KMatrix)>,
    source_bytes: u64,
) -> Result<ConvertedExpert, PrepareError> {
    let (f, d) = (layout.down_cols, layout.down_rows);
    let mut blob = vec![0u8; layout.stride];
    let (checksum, deq_gate_up, deq_down) = if let Some((q_gate_up, q_down)) = kquant {
        // A sub-block whose range or minimum is too large for an f16 super-scale (about 4e6 for
        // a Q4_K min, 6e7 for a range) makes an infinite scale: refuse it, naming the expert.
        // gate_up is verified as its gate rows and its up rows, so the error names which.
        let (gate, up) = q_gate_up.as_ref().split_rows(f);
        for (what, m) in [("gate", gate), ("up", up), ("down", q_down.as_ref())] {
            m.verify().map_err(|reason| PrepareError::Source {
                layer,
                expert,
                what,
                reason: format!("not representable as {}: {reason}", m.kind.name()),
            })?;
        }
        let m = ExpertMatrices::KQuant {
            gate_up: q_gate_up.as_ref(),
            down: q_down.as_ref(),
        };
        let checksum = encode_expert(layout, &m, &mut blob)?;
        (checksum, q_gate_up.dequantize(), q_down.dequantize())
    } else {
        let q_gate_up = quantize_weights(gate_up, 2 * f, d);
        let q_down = quantize_weights(down, d, f);
        let m = ExpertMatrices::Int8 {
            gate_up: q_gate_up.as_ref(),
            down: q_down.as_ref(),
        };
        let checksum = encode_expert(layout, &m, &mut blob)?;
        (checksum, q_gate_up.dequantize(), q_down.dequantize())
    };
    let split = f * d;
    let (li, ei) = (layer.index(), expert.index());
    let stats = ErrorStats {
        gate: KindStats::of_matrix(&gate_up[..split], &deq_gate_up[..split], d, li, ei),
        up: KindStats::of_matrix(&gate_up[split..], &deq_gate_up[split..], d, li, ei),
        down: KindStats::of_matrix(down, &deq_down, f, li, ei),
    };
    Ok(ConvertedExpert {
        blob,
        checksum,
        stats,
        source_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::container::ExpertFormat;

    /// `encode_converted` on a 256 × 256 expert (f = 256) whose `row` of gate_up holds one
    /// weight too large for a Q4_K super-scale: the error's `what` and reason.
    fn refused_at(row: usize) -> (&'static str, String) {
        let (d, f) = (256, 256);
        let layout = BlobLayout::with_format(d, f, ExpertFormat::Q4K).expect("layout");
        let mut gate_up = vec![0.01f32; 2 * f * d];
        gate_up[row * d + 3] = 1e9;
        let down = vec![0.01f32; d * f];
        let kquant = Some((
            kquant::quantize_matrix(kquant::KQuantKind::Q4K, &gate_up, 2 * f, d),
            kquant::quantize_matrix(kquant::KQuantKind::Q4K, &down, d, f),
        ));
        let got = encode_converted(
            &layout,
            LayerId::new(1),
            ExpertId::new(2),
            (&gate_up, &down),
            kquant,
            0,
        );
        match got {
            Err(PrepareError::Source { what, reason, .. }) => (what, reason),
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("an infinite super-scale was accepted"),
        }
    }

    #[test]
    fn an_unrepresentable_kquant_weight_names_gate_or_up_and_its_row_there() {
        let (what, reason) = refused_at(5);
        assert_eq!(what, "gate", "{reason}");
        assert!(reason.contains("row 5 "), "{reason}");
        // Row f + 7 of gate_up is row 7 of up.
        let (what, reason) = refused_at(256 + 7);
        assert_eq!(what, "up", "{reason}");
        assert!(reason.contains("row 7 "), "{reason}");
    }
}
