//! The expert locator: for (layer, expert) the exact byte ranges — file, offset, length, dtype,
//! shape — of its gate, up and down weights, in either checkpoint layout (docs/model.md §3.5).
//!
//! Pure arithmetic over a validated `Checkpoint`; every offset is computed with checked
//! arithmetic and re-checked against the containing tensor's range.

use crate::checkpoint::{Checkpoint, TensorEntry};
use crate::ids::{ExpertId, LayerId};
use crate::tensor_spec::{self, ExpertLayout};
use safetensors::Dtype;
use std::path::PathBuf;

/// A contiguous run of bytes holding one 2-D weight matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct ByteRange {
    /// Index of the shard in `Checkpoint::shards`.
    pub shard: usize,
    /// The shard file.
    pub file: PathBuf,
    /// Absolute offset of the first byte in the file.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// Element type.
    pub dtype: Dtype,
    /// `[rows, cols]`, row-major, `[out, in]` as PyTorch stores linear weights.
    pub shape: [usize; 2],
}

/// The three weight matrices of one routed expert.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertRanges {
    /// Gate projection `[f, d]`.
    pub gate: ByteRange,
    /// Up projection `[f, d]`.
    pub up: ByteRange,
    /// Down projection `[d, f]`.
    pub down: ByteRange,
}

impl ExpertRanges {
    /// Total bytes of the three matrices.
    pub fn total_bytes(&self) -> u64 {
        self.gate.len + self.up.len + self.down.len
    }
}

/// A (layer, expert) the locator cannot place.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LocateError {
    /// The layer index is out of range.
    #[error("layer {layer} out of range (model has {n_layers} layers)")]
    Layer {
        /// Requested layer.
        layer: LayerId,
        /// Layers in the model.
        n_layers: usize,
    },
    /// The expert index is out of range.
    #[error("expert {expert} out of range (layer has {n_experts} experts)")]
    Expert {
        /// Requested expert.
        expert: ExpertId,
        /// Experts per layer.
        n_experts: usize,
    },
    /// A computed range overflowed or fell outside its tensor (a header inconsistent with the config).
    #[error("layer {layer} expert {expert}: {what} range does not fit inside tensor {tensor}")]
    OutOfTensor {
        /// Layer.
        layer: LayerId,
        /// Expert.
        expert: ExpertId,
        /// `gate`, `up` or `down`.
        what: &'static str,
        /// The containing tensor.
        tensor: String,
    },
    /// A tensor the validated checkpoint should contain is absent.
    #[error("tensor {0} missing from the inventory")]
    Missing(String),
}

/// Computes expert byte ranges for one checkpoint.
pub struct ExpertLocator<'a> {
    ckpt: &'a Checkpoint,
}

impl<'a> ExpertLocator<'a> {
    /// A locator over a validated checkpoint.
    pub fn new(ckpt: &'a Checkpoint) -> Self {
        ExpertLocator { ckpt }
    }

    /// Byte ranges of `expert`'s gate, up and down weights in `layer`.
    pub fn expert(&self, layer: LayerId, expert: ExpertId) -> Result<ExpertRanges, LocateError> {
        let cfg = &self.ckpt.config.text;
        let layout = *self
            .ckpt
            .expert_layouts
            .get(layer.index())
            .ok_or(LocateError::Layer {
                layer,
                n_layers: cfg.num_layers,
            })?;
        if expert.index() >= cfg.num_experts {
            return Err(LocateError::Expert {
                expert,
                n_experts: cfg.num_experts,
            });
        }
        let (f, d) = (cfg.moe_intermediate_size, cfg.hidden_size);
        let prefix = self.ckpt.prefix;
        match layout {
            ExpertLayout::Fused => {
                let gate_up_name = tensor_spec::fused_gate_up_name(prefix, layer.index());
                let down_name = tensor_spec::fused_down_name(prefix, layer.index());
                let gate_up = self.entry(&gate_up_name)?;
                let down = self.entry(&down_name)?;
                let slice = |entry: &TensorEntry,
                             name: &str,
                             what,
                             index: u64,
                             rows: usize,
                             cols: usize| {
                    let err = || LocateError::OutOfTensor {
                        layer,
                        expert,
                        what,
                        tensor: name.to_string(),
                    };
                    let elem = tensor_spec::dtype_bytes(entry.loc.dtype);
                    let len = (rows as u64)
                        .checked_mul(cols as u64)
                        .and_then(|n| n.checked_mul(elem))
                        .ok_or_else(err)?;
                    let rel = index.checked_mul(len).ok_or_else(err)?;
                    let end = rel.checked_add(len).ok_or_else(err)?;
                    if end > entry.loc.len {
                        return Err(err());
                    }
                    Ok(ByteRange {
                        shard: entry.shard,
                        file: self.ckpt.shard_path(entry).to_path_buf(),
                        offset: entry.loc.offset.checked_add(rel).ok_or_else(err)?,
                        len,
                        dtype: entry.loc.dtype,
                        shape: [rows, cols],
                    })
                };
                // gate_up_proj[e] is [2f, d]: gate rows [0, f), up rows [f, 2f). Indexing the
                // tensor as 2E blocks of [f, d] puts expert e's gate at block 2e, up at 2e + 1.
                let e = u64::from(expert.get());
                Ok(ExpertRanges {
                    gate: slice(gate_up, &gate_up_name, "gate", 2 * e, f, d)?,
                    up: slice(gate_up, &gate_up_name, "up", 2 * e + 1, f, d)?,
                    down: slice(down, &down_name, "down", e, d, f)?,
                })
            }
            ExpertLayout::PerExpert => {
                let range = |proj: &str,
                             rows: usize,
                             cols: usize|
                 -> Result<ByteRange, LocateError> {
                    let name =
                        tensor_spec::per_expert_name(prefix, layer.index(), expert.index(), proj);
                    let entry = self.entry(&name)?;
                    Ok(ByteRange {
                        shard: entry.shard,
                        file: self.ckpt.shard_path(entry).to_path_buf(),
                        offset: entry.loc.offset,
                        len: entry.loc.len,
                        dtype: entry.loc.dtype,
                        shape: [rows, cols],
                    })
                };
                Ok(ExpertRanges {
                    gate: range("gate_proj", f, d)?,
                    up: range("up_proj", f, d)?,
                    down: range("down_proj", d, f)?,
                })
            }
        }
    }

    fn entry(&self, name: &str) -> Result<&'a TensorEntry, LocateError> {
        self.ckpt
            .tensor(name)
            .ok_or_else(|| LocateError::Missing(name.to_string()))
    }
}
