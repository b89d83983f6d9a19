//! Converting one routed expert from a `qwen35moe` GGUF: pread its gate, up and down slices,
//! and either copy their blocks into the blob unchanged (when the tensor's ggml type is the
//! container's block format for that matrix: `Q4_K` or `Q6_K`) or dequantize them
//! (`shared::gguf::dequantize`, bit-identical to ggml) and quantize to the container's format.
//! Which format a GGUF gets by default, and which tensors that requantizes, is decided here too.
//!
//! Owns no file layout and no resume logic (that is `prepare`); holds one expert in memory.

use crate::convert::{ConvertedExpert, encode_converted};
use crate::prepare::PrepareError;
use shared::container::format::{GGML_TYPE_Q4_K, GGML_TYPE_Q6_K};
use shared::container::{BlobLayout, ExpertFormat};
use shared::gguf::{ExpertTensor, GgmlType, GgufExperts, GgufFile, OpenError, dequantize};
use shared::ids::{ExpertId, LayerId};
use shared::kernels::kquant::{self, KMatrix, KQuantKind};
use std::path::Path;

/// Bits per weight up to which a GGUF matrix goes to `Q4_K` by default (`Q4_0`, `Q4_1`,
/// `Q4_K`); above it gate/up go to INT8 and down to `Q6_K` (or INT8 with gate/up).
const Q4K_MAX_BITS: f64 = 5.0;

/// A GGUF opened for `prepare`.
pub(crate) struct GgufSource {
    /// The file.
    pub file: GgufFile,
    /// Where its experts are.
    pub experts: GgufExperts,
}

/// One tensor whose type is not the container's for its matrix, so its values are requantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requantized {
    /// The layer.
    pub layer: LayerId,
    /// `gate`, `up`, `down`, or `gate_up` for a fused gate/up tensor.
    pub part: &'static str,
    /// The GGUF's ggml type.
    pub from: &'static str,
    /// The container's format for the matrix (`Q4_K`, `Q6_K`, `INT8`).
    pub to: &'static str,
}

impl Requantized {
    /// The tensor's name in the GGUF.
    pub fn tensor(&self) -> String {
        format!("blk.{}.ffn_{}_exps.weight", self.layer, self.part)
    }
}

fn bits(ty: GgmlType) -> f64 {
    (ty.block_bytes * 8) as f64 / ty.block as f64
}

fn ggml_id(kind: KQuantKind) -> u32 {
    u32::from(match kind {
        KQuantKind::Q4K => GGML_TYPE_Q4_K,
        KQuantKind::Q6K => GGML_TYPE_Q6_K,
    })
}

impl GgufSource {
    /// Opens `path` and locates its routed experts.
    pub(crate) fn open(path: &Path) -> Result<GgufSource, PrepareError> {
        let file = GgufFile::open(path)?;
        let experts = GgufExperts::locate(&file.gguf).map_err(|source| OpenError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(GgufSource { file, experts })
    }

    /// The format that keeps the most of the file's blocks as they are without losing bits:
    /// gate/up at ≤ 5 bits per weight everywhere → `Q4_K`, with down in `Q4_K` when it is that
    /// small everywhere too and in `Q6_K` otherwise; gate/up above 5 bits anywhere → INT8.
    pub(crate) fn natural_format(&self) -> ExpertFormat {
        let small = |t: &ExpertTensor| bits(t.ty) <= Q4K_MAX_BITS;
        let layers = &self.experts.layers;
        if !layers.iter().all(|l| small(&l.gate) && small(&l.up)) {
            ExpertFormat::Int8
        } else if layers.iter().all(|l| small(&l.down)) {
            ExpertFormat::Q4K
        } else {
            ExpertFormat::Q4KQ6K
        }
    }

    /// Every tensor whose blocks cannot be copied into a container of `format`.
    pub(crate) fn requantized(&self, format: ExpertFormat) -> Vec<Requantized> {
        let mut out = Vec::new();
        for (i, l) in self.experts.layers.iter().enumerate() {
            let kinds = format.kquant();
            for (part, t, kind) in [
                ("gate", &l.gate, kinds.map(|k| k.0)),
                ("up", &l.up, kinds.map(|k| k.0)),
                ("down", &l.down, kinds.map(|k| k.1)),
            ] {
                // A fused gate/up tensor is reported once, as gate_up.
                let fused = t.name.ends_with("ffn_gate_up_exps.weight");
                if kind.map(ggml_id) != Some(t.ty.id) && !(fused && part == "up") {
                    out.push(Requantized {
                        layer: LayerId::from_index(i),
                        part: if fused { "gate_up" } else { part },
                        from: t.ty.name,
                        to: kind.map_or("INT8", KQuantKind::name),
                    });
                }
            }
        }
        out
    }

    /// Reads one expert's slice of `t` and dequantizes it; refuses a non-finite value, naming
    /// the tensor, the expert and the element.
    fn read(
        &self,
        t: &ExpertTensor,
        layer: LayerId,
        expert: ExpertId,
    ) -> Result<(Vec<u8>, Vec<f32>), PrepareError> {
        let (offset, len) = t.expert_range(expert.index());
        let raw = self
            .file
            .read(offset, len, &format!("{} expert {expert}", t.name))?;
        let mut values = vec![0f32; t.rows * t.cols];
        let source = |reason: String| PrepareError::Source {
            layer,
            expert,
            what: "gguf",
            reason: format!("{}: {reason}", t.name),
        };
        dequantize(t.ty, &raw, &mut values).map_err(source)?;
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(source(format!(
                "weight [{}, {}] of {} is {} (not finite)",
                i / t.cols,
                i % t.cols,
                t.ty.name,
                values[i]
            )));
        }
        Ok((raw, values))
    }

    /// Converts (layer, expert) into a blob of `layout`'s format.
    pub(crate) fn convert(
        &self,
        layout: &BlobLayout,
        layer: LayerId,
        expert: ExpertId,
    ) -> Result<ConvertedExpert, PrepareError> {
        let l = &self.experts.layers[layer.index()];
        let (f, d) = (layout.down_cols, layout.down_rows);
        let (gate_raw, gate) = self.read(&l.gate, layer, expert)?;
        let (up_raw, up) = self.read(&l.up, layer, expert)?;
        let (down_raw, down) = self.read(&l.down, layer, expert)?;
        let source_bytes = (gate_raw.len() + up_raw.len() + down_raw.len()) as u64;
        let gate_up: Vec<f32> = gate.into_iter().chain(up).collect();
        let kquant = layout.format.kquant().map(|(gu, dn)| {
            // Row by row the k-quants are independent, so a matrix may be half copied blocks and
            // half requantized rows (gate copied, up requantized).
            let part = |t: &ExpertTensor, raw: Vec<u8>, values: &[f32], kind: KQuantKind| {
                if t.ty.id == ggml_id(kind) {
                    raw
                } else {
                    kquant::quantize_matrix(kind, values, t.rows, t.cols).data
                }
            };
            let mut gu_data = part(&l.gate, gate_raw, &gate_up[..f * d], gu);
            gu_data.extend(part(&l.up, up_raw, &gate_up[f * d..], gu));
            let q_gate_up = KMatrix {
                kind: gu,
                rows: 2 * f,
                cols: d,
                data: gu_data,
            };
            let q_down = KMatrix {
                kind: dn,
                rows: d,
                cols: f,
                data: part(&l.down, down_raw, &down, dn),
            };
            (q_gate_up, q_down)
        });
        encode_converted(
            layout,
            layer,
            expert,
            (&gate_up, &down),
            kquant,
            source_bytes,
        )
    }
}
