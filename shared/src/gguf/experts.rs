//! Where a `qwen35moe` GGUF keeps its routed experts: the dimensions from the metadata, and
//! for each layer the `blk.N.ffn_{gate,up,down}_exps.weight` tensors with each one's element
//! type, shape and the byte range of every expert inside it. Pure: over a parsed [`Gguf`].
//!
//! llama.cpp stores an expert set as one 3-D tensor, ggml order `[cols, rows, experts]`
//! (`ne[0]` innermost): gate and up are `[hidden, inner, experts]`, down is
//! `[inner, hidden, experts]`. Expert `e` is the contiguous `e`-th slice, `rows` rows of
//! `cols / block` blocks each — the row-major block layout of our k-quant blobs.

use super::{GgmlType, Gguf, GgufError, TensorInfo};

/// Most weights one expert matrix may have (`hidden × inner`): 2²⁶, 64 times the real model's.
pub const MAX_EXPERT_WEIGHTS: u64 = 1 << 26;

/// The only architecture whose experts are read (`general.architecture`).
pub const ARCHITECTURE: &str = "qwen35moe";

/// One expert set tensor of one layer.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertTensor {
    /// The tensor's name (`blk.3.ffn_down_exps.weight`).
    pub name: String,
    /// Its element type.
    pub ty: GgmlType,
    /// Rows of one expert's matrix (gate/up: inner; down: hidden).
    pub rows: usize,
    /// Columns of one expert's matrix (gate/up: hidden; down: inner).
    pub cols: usize,
    /// Absolute file offset of expert 0's bytes.
    pub offset: u64,
    /// Bytes of one expert's matrix.
    pub expert_bytes: u64,
    /// Bytes from one expert's matrix to the next's (`expert_bytes`, or twice it in a fused
    /// gate/up tensor).
    pub expert_stride: u64,
    /// Bytes of the whole tensor in the file.
    pub tensor_bytes: u64,
    /// The tensor's shape as the file gives it (for the identity).
    pub dims: Vec<u64>,
}

impl ExpertTensor {
    /// The absolute byte range `(offset, len)` of `expert`'s matrix.
    pub fn expert_range(&self, expert: usize) -> (u64, u64) {
        (
            self.offset + expert as u64 * self.expert_stride,
            self.expert_bytes,
        )
    }
}

/// The three expert tensors of one layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerExperts {
    /// `ffn_gate_exps`.
    pub gate: ExpertTensor,
    /// `ffn_up_exps`.
    pub up: ExpertTensor,
    /// `ffn_down_exps`.
    pub down: ExpertTensor,
}

/// The routed experts of a `qwen35moe` GGUF.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufExperts {
    /// Decoder layers with routed experts (`block_count` less `nextn_predict_layers`: the MTP
    /// layers are not read).
    pub n_layers: usize,
    /// Experts per layer (`expert_count`).
    pub n_experts: usize,
    /// Residual width (`embedding_length`).
    pub hidden: usize,
    /// One expert's inner width (`expert_feed_forward_length`).
    pub inner: usize,
    /// Per layer, its three tensors.
    pub layers: Vec<LayerExperts>,
}

/// A metadata value for an error message, cut to 80 characters.
pub(crate) fn short(v: &super::Value) -> String {
    let s = format!("{v:?}");
    match s.char_indices().nth(80) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s,
    }
}

fn metadata_err(key: &str, why: impl Into<String>) -> GgufError {
    GgufError::Metadata {
        key: key.to_string(),
        why: why.into(),
    }
}

/// The metadata integer `key`, in `1..=max`.
fn count(g: &Gguf, key: &str, max: u64) -> Result<usize, GgufError> {
    let v = g
        .get(key)
        .ok_or_else(|| metadata_err(key, "missing (a qwen35moe GGUF states it)"))?;
    match v.as_u64() {
        Some(n) if (1..=max).contains(&n) => Ok(n as usize),
        _ => Err(metadata_err(
            key,
            format!("is {}: expected an integer in 1..={max}", short(v)),
        )),
    }
}

impl GgufExperts {
    /// Finds the routed experts of `g`: checks the architecture, reads the dimensions, and
    /// checks every expert tensor's shape and type. Errors name the key or tensor.
    pub fn locate(g: &Gguf) -> Result<GgufExperts, GgufError> {
        let arch_key = "general.architecture";
        match g.get(arch_key).and_then(|v| v.as_str()) {
            Some(ARCHITECTURE) => {}
            Some(other) => {
                return Err(metadata_err(
                    arch_key,
                    format!(
                        "is {}; only {ARCHITECTURE:?} (Qwen3.5/3.6 MoE) is supported",
                        short(&super::Value::String(other.to_string()))
                    ),
                ));
            }
            None => return Err(metadata_err(arch_key, "missing or not a string")),
        }
        let key = |k: &str| format!("{ARCHITECTURE}.{k}");
        const MAX: u64 = 1 << 16;
        let blocks = count(g, &key("block_count"), MAX)?;
        let nextn = match g.get(&key("nextn_predict_layers")) {
            None => 0,
            Some(v) => match v.as_u64() {
                Some(n) if (n as usize) < blocks => n as usize,
                _ => {
                    return Err(metadata_err(
                        &key("nextn_predict_layers"),
                        format!(
                            "is {}: expected an integer below block_count ({blocks})",
                            short(v)
                        ),
                    ));
                }
            },
        };
        let n_layers = blocks - nextn;
        let n_experts = count(g, &key("expert_count"), MAX)?;
        let hidden = count(g, &key("embedding_length"), MAX)?;
        let inner = count(g, &key("expert_feed_forward_length"), MAX)?;
        // One expert matrix is held as f32 several times over while it is converted: cap its
        // weights far above the real 2048 × 512 so a hostile header cannot ask for tens of GB.
        if (hidden as u64) * (inner as u64) > MAX_EXPERT_WEIGHTS {
            return Err(metadata_err(
                &key("expert_feed_forward_length"),
                format!(
                    "{inner} × embedding_length {hidden} weights per expert matrix exceed the \
                     supported {MAX_EXPERT_WEIGHTS}"
                ),
            ));
        }
        let mut layers = Vec::with_capacity(n_layers);
        for layer in 0..n_layers {
            let find = |part: &str, rows: usize, cols: usize| {
                let name = format!("blk.{layer}.ffn_{part}_exps.weight");
                let t = g.tensor(&name).ok_or_else(|| GgufError::Tensor {
                    tensor: name.clone(),
                    why: format!("missing: layer {layer} of {n_layers} has no routed {part}"),
                })?;
                expert_tensor(t, rows, cols, n_experts)
            };
            let fused = format!("blk.{layer}.ffn_gate_up_exps.weight");
            let (gate, up) = match g.tensor(&fused) {
                Some(t) => {
                    let both = expert_tensor(t, 2 * inner, hidden, n_experts)?;
                    let half = both.expert_bytes / 2;
                    let gate = ExpertTensor {
                        rows: inner,
                        expert_bytes: half,
                        ..both.clone()
                    };
                    let up = ExpertTensor {
                        offset: both.offset + half,
                        ..gate.clone()
                    };
                    (gate, up)
                }
                None => (find("gate", inner, hidden)?, find("up", inner, hidden)?),
            };
            layers.push(LayerExperts {
                gate,
                up,
                down: find("down", hidden, inner)?,
            });
        }
        Ok(GgufExperts {
            n_layers,
            n_experts,
            hidden,
            inner,
            layers,
        })
    }

    /// Every expert matrix view, layer by layer, gate, up, down (a fused gate/up tensor is
    /// two views of one tensor).
    pub fn tensors(&self) -> impl Iterator<Item = &ExpertTensor> {
        self.layers.iter().flat_map(|l| [&l.gate, &l.up, &l.down])
    }

    /// Bytes of one expert's three matrices in layer `layer`.
    pub fn expert_bytes(&self, layer: usize) -> u64 {
        let l = &self.layers[layer];
        l.gate.expert_bytes + l.up.expert_bytes + l.down.expert_bytes
    }
}

/// Checks one expert set tensor: `[cols, rows, n_experts]`, a type we can read, rows of whole
/// blocks.
fn expert_tensor(
    t: &TensorInfo,
    rows: usize,
    cols: usize,
    n_experts: usize,
) -> Result<ExpertTensor, GgufError> {
    let bad = |why: String| GgufError::Tensor {
        tensor: t.name.clone(),
        why,
    };
    let want = [cols as u64, rows as u64, n_experts as u64];
    if t.dims != want {
        return Err(bad(format!(
            "shape {:?} (ggml order), expected {want:?} from the metadata",
            t.dims
        )));
    }
    let expert_bytes = rows as u64
        * t.row_bytes(rows, cols, n_experts)
            .map_err(|why| bad(format!("routed experts: {why}")))?;
    Ok(ExpertTensor {
        name: t.name.clone(),
        ty: t.ty,
        rows,
        cols,
        offset: t.offset,
        expert_bytes,
        expert_stride: expert_bytes,
        tensor_bytes: t.len,
        dims: t.dims.clone(),
    })
}
