//! The dense (non-routed-expert) text tensors of a `qwen35moe` GGUF, under the names and in the
//! layout of the transformers checkpoint: which GGUF tensor holds each one, and how to undo what
//! llama.cpp's converter did to it, row by row, so hostd loads a GGUF through the same code as a
//! safetensors directory. IO-free: the caller hands over each tensor's bytes.
//!
//! What llama.cpp's `convert_hf_to_gguf.py` (`Qwen3_5MoeTextModel`, 0c1e570) changes, undone here:
//! - zero-centred RMSNorm weights (`input_layernorm`, `post_attention_layernorm`, `q_norm`,
//!   `k_norm`, the final `norm`) are stored as `1 + w`; the DeltaNet output norm is not;
//! - `A_log` is stored as `A = −exp(A_log)`;
//! - the DeltaNet value heads are reordered from grouped by key head (`[k0: v0..v(r−1), k1: …]`,
//!   transformers' order) to tiled (`[v0 of k0, v0 of k1, …, v1 of k0, …]`): the V rows of
//!   `in_proj_qkv` and of the conv weight, the rows of `in_proj_z`, `in_proj_a`, `in_proj_b`, the
//!   elements of `A_log` and `dt_bias`, and the columns of `out_proj`. [I] A GGUF written by a
//!   converter older than that reordering (llama.cpp PR 19468) keeps the grouped order and loads
//!   here with the heads scrambled; nothing in the file says which, so we follow current llama.cpp;
//! - `conv1d.weight` loses its middle dimension of 1;
//! - a missing `output.weight` means the output projection is the embedding (llama.cpp's rule).

use super::parse::GgufError;
use super::{Gguf, TensorInfo, dequantize};
use crate::config::{LayerType, TextConfig};
use crate::kernels::kquant::KQuantKind;
use crate::tensor_spec::{self, LM_HEAD};
use std::collections::HashMap;

/// What was done to the values when they were written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// Written as they are.
    AsIs,
    /// Written as `1 + w` (a zero-centred RMSNorm weight).
    PlusOne,
    /// Written as `−exp(w)` (`A_log`).
    NegExp,
}

/// Where the DeltaNet value heads were moved from grouped to tiled order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadOrder {
    /// Nothing moved.
    Kept,
    /// The rows `start..start + n_v_heads × head` were reordered, in units of `head` rows.
    Rows {
        /// First reordered row.
        start: usize,
        /// Rows per value head.
        head: usize,
    },
    /// Every column was reordered, in units of `head` columns.
    Cols {
        /// Columns per value head.
        head: usize,
    },
}

/// One dense tensor: the GGUF tensor that holds it and how to read it back. Built only by
/// [`GgufDense::locate`], which checks its fields against each other and the file.
#[derive(Debug, Clone, PartialEq)]
pub struct DenseTensor {
    gguf: TensorInfo,
    rows: usize,
    cols: usize,
    /// Bytes of one stored row (whole blocks, checked by `locate`).
    row_bytes: usize,
    stored: Stored,
    order: HeadOrder,
    /// Key heads and value heads per key head (for [`HeadOrder`]).
    heads: (usize, usize),
}

/// Every dense text tensor of a `qwen35moe` GGUF, by its transformers name.
#[derive(Debug, Clone)]
pub struct GgufDense {
    tensors: HashMap<String, DenseTensor>,
}

/// The GGUF name and conversion of the transformers tensor `hf` (under `prefix`).
fn recipe(hf: &str, prefix: &str, cfg: &TextConfig) -> Option<(String, Stored, HeadOrder)> {
    use HeadOrder::*;
    use Stored::*;
    if hf == LM_HEAD {
        return Some(("output.weight".into(), AsIs, Kept));
    }
    let rest = hf.strip_prefix(prefix)?;
    match rest {
        "embed_tokens.weight" => return Some(("token_embd.weight".into(), AsIs, Kept)),
        "norm.weight" => return Some(("output_norm.weight".into(), PlusOne, Kept)),
        _ => {}
    }
    let rest = rest.strip_prefix("layers.")?;
    let (layer, part) = rest.split_once('.')?;
    let dn = cfg.delta_net;
    let v_rows = |head| Rows {
        start: 2 * dn.n_k_heads * dn.key_head_dim,
        head,
    };
    let (name, stored, order) = match part {
        "input_layernorm.weight" => ("attn_norm.weight", PlusOne, Kept),
        "post_attention_layernorm.weight" => ("post_attention_norm.weight", PlusOne, Kept),
        "linear_attn.in_proj_qkv.weight" => ("attn_qkv.weight", AsIs, v_rows(dn.value_head_dim)),
        "linear_attn.in_proj_z.weight" => (
            "attn_gate.weight",
            AsIs,
            Rows {
                start: 0,
                head: dn.value_head_dim,
            },
        ),
        "linear_attn.in_proj_b.weight" => ("ssm_beta.weight", AsIs, Rows { start: 0, head: 1 }),
        "linear_attn.in_proj_a.weight" => ("ssm_alpha.weight", AsIs, Rows { start: 0, head: 1 }),
        "linear_attn.conv1d.weight" => ("ssm_conv1d.weight", AsIs, v_rows(dn.value_head_dim)),
        "linear_attn.dt_bias" => ("ssm_dt.bias", AsIs, Cols { head: 1 }),
        "linear_attn.A_log" => ("ssm_a", NegExp, Cols { head: 1 }),
        "linear_attn.norm.weight" => ("ssm_norm.weight", AsIs, Kept),
        "linear_attn.out_proj.weight" => (
            "ssm_out.weight",
            AsIs,
            Cols {
                head: dn.value_head_dim,
            },
        ),
        "self_attn.q_proj.weight" => ("attn_q.weight", AsIs, Kept),
        "self_attn.k_proj.weight" => ("attn_k.weight", AsIs, Kept),
        "self_attn.v_proj.weight" => ("attn_v.weight", AsIs, Kept),
        "self_attn.o_proj.weight" => ("attn_output.weight", AsIs, Kept),
        "self_attn.q_norm.weight" => ("attn_q_norm.weight", PlusOne, Kept),
        "self_attn.k_norm.weight" => ("attn_k_norm.weight", PlusOne, Kept),
        "mlp.gate.weight" => ("ffn_gate_inp.weight", AsIs, Kept),
        "mlp.shared_expert.gate_proj.weight" => ("ffn_gate_shexp.weight", AsIs, Kept),
        "mlp.shared_expert.up_proj.weight" => ("ffn_up_shexp.weight", AsIs, Kept),
        "mlp.shared_expert.down_proj.weight" => ("ffn_down_shexp.weight", AsIs, Kept),
        "mlp.shared_expert_gate.weight" => ("ffn_gate_inp_shexp.weight", AsIs, Kept),
        _ => return None,
    };
    Some((format!("blk.{layer}.{name}"), stored, order))
}

/// `dims` without its dimensions of 1 (a squeezed tensor is the same bytes).
fn squeezed(dims: impl IntoIterator<Item = u64>) -> Vec<u64> {
    dims.into_iter().filter(|&d| d != 1).collect()
}

impl GgufDense {
    /// Finds every dense text tensor `cfg` implies (the transformers names under `prefix`) in
    /// `g`, checking its shape and type. Errors name the GGUF tensor and the transformers one.
    pub fn locate(g: &Gguf, cfg: &TextConfig, prefix: &str) -> Result<GgufDense, GgufError> {
        let dn = cfg.delta_net;
        let heads = (dn.n_k_heads, dn.v_per_k);
        let has_linear = cfg.layer_types.contains(&LayerType::LinearAttention);
        if has_linear && dn.n_k_heads * dn.v_per_k != dn.n_v_heads {
            return Err(GgufError::Metadata {
                key: "qwen35moe.ssm.time_step_rank".into(),
                why: format!(
                    "{} value heads are not a multiple of ssm.group_count {} key heads",
                    dn.n_v_heads, dn.n_k_heads
                ),
            });
        }
        let mut tensors = HashMap::new();
        for want in tensor_spec::dense_tensors(cfg, prefix) {
            let Some((mut name, stored, order)) = recipe(&want.name, prefix, cfg) else {
                return Err(GgufError::Tensor {
                    tensor: want.name.clone(),
                    why: "the model needs it and no GGUF tensor is known to hold it".into(),
                });
            };
            if want.name == LM_HEAD && g.tensor(&name).is_none() {
                // Tied output projection: llama.cpp reads the embedding.
                name = "token_embd.weight".into();
            }
            let t = g.tensor(&name).ok_or_else(|| GgufError::Tensor {
                tensor: name.clone(),
                why: format!("missing (it holds {})", want.name),
            })?;
            let bad = |why: String| GgufError::Tensor {
                tensor: name.clone(),
                why: format!("{why} (it holds {})", want.name),
            };
            let (rows, cols) = match want.shape.as_slice() {
                [n] => (1, *n),
                [r, c] => (*r, *c),
                [r, 1, c] => (*r, *c),
                other => return Err(bad(format!("unexpected transformers shape {other:?}"))),
            };
            if squeezed(t.dims.iter().copied()) != squeezed([cols as u64, rows as u64]) {
                return Err(bad(format!(
                    "shape {:?} (ggml order), expected [{cols}, {rows}] from the metadata",
                    t.dims
                )));
            }
            let row_bytes = t.row_bytes(rows, cols, 1).map_err(bad)?;
            let span = |head: usize| heads.0 * heads.1 * head;
            let fits = match order {
                HeadOrder::Kept => true,
                HeadOrder::Rows { start, head } => start + span(head) == rows,
                HeadOrder::Cols { head } => span(head) == cols,
            };
            if !fits {
                return Err(bad(format!(
                    "{rows} × {cols} does not hold {} value heads where they belong",
                    dn.n_v_heads
                )));
            }
            tensors.insert(
                want.name.clone(),
                DenseTensor {
                    gguf: t.clone(),
                    rows,
                    cols,
                    row_bytes: row_bytes as usize,
                    stored,
                    order,
                    heads,
                },
            );
        }
        Ok(GgufDense { tensors })
    }

    /// The tensor the transformers checkpoint names `hf_name`.
    pub fn get(&self, hf_name: &str) -> Option<&DenseTensor> {
        self.tensors.get(hf_name)
    }

    /// Every dense tensor (for a digest or a report), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &DenseTensor)> {
        self.tensors.iter().map(|(k, v)| (k.as_str(), v))
    }
}

/// Where value-head element `i` of the grouped (transformers) order sits in the tiled order.
fn tiled_index(i: usize, head: usize, (n_k, per_k): (usize, usize)) -> usize {
    let (vh, h) = (i / head, i % head);
    let (k, j) = (vh / per_k, vh % per_k);
    (j * n_k + k) * head + h
}

impl DenseTensor {
    /// The GGUF tensor.
    pub fn gguf(&self) -> &TensorInfo {
        &self.gguf
    }

    /// Rows of the transformers tensor viewed as a matrix (1 for a vector, the channels of the
    /// conv weight).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (the vector's length, the conv kernel width).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// What the converter did to the values.
    pub fn stored(&self) -> Stored {
        self.stored
    }

    /// Which value heads it moved.
    pub fn order(&self) -> HeadOrder {
        self.order
    }

    /// Dequantizes `data` (this tensor's bytes) and undoes the conversion, calling
    /// `row(r, values)` once for every transformers row `r` with its `cols` values. Rows come in
    /// the file's order, which is not `r`'s order where heads were moved.
    pub fn for_each_row(
        &self,
        data: &[u8],
        mut row: impl FnMut(usize, &[f32]),
    ) -> Result<(), GgufError> {
        let t = &self.gguf;
        let bad = |why: String| GgufError::Tensor {
            tensor: t.name.clone(),
            why,
        };
        let row_bytes = self.row_bytes;
        if data.len() != row_bytes * self.rows {
            return Err(bad(format!(
                "{} bytes handed over, expected {}",
                data.len(),
                row_bytes * self.rows
            )));
        }
        let col_source: Option<Vec<usize>> = match self.order {
            HeadOrder::Cols { head } => Some(
                (0..self.cols)
                    .map(|c| tiled_index(c, head, self.heads))
                    .collect(),
            ),
            _ => None,
        };
        // File row → transformers row: the inverse of the tiled placement.
        let mut row_of = (0..self.rows).collect::<Vec<usize>>();
        if let HeadOrder::Rows { start, head } = self.order {
            for i in 0..self.rows - start {
                row_of[start + tiled_index(i, head, self.heads)] = start + i;
            }
        }
        let mut file_row = vec![0f32; self.cols];
        let mut out = vec![0f32; self.cols];
        for (r, bytes) in data.chunks_exact(row_bytes).enumerate() {
            dequantize(t.ty, bytes, &mut file_row).map_err(&bad)?;
            if self.stored == Stored::NegExp
                && let Some(c) = file_row.iter().position(|v| !(*v < 0.0 && v.is_finite()))
            {
                return Err(bad(format!(
                    "element {c} (file order) of row {r} is {}: a stored A = −exp(A_log) is negative and finite",
                    file_row[c]
                )));
            }
            match &col_source {
                Some(src) => {
                    for (o, &s) in out.iter_mut().zip(src) {
                        *o = file_row[s];
                    }
                }
                None => out.copy_from_slice(&file_row),
            }
            match self.stored {
                Stored::AsIs => {}
                Stored::PlusOne => out.iter_mut().for_each(|v| *v -= 1.0),
                Stored::NegExp => out.iter_mut().for_each(|v| *v = (-*v).ln()),
            }
            row(row_of[r], &out);
        }
        Ok(())
    }

    /// The k-quant format the kernels can run this tensor in as it is stored: `Q4_K` or `Q6_K`,
    /// values stored as they are, value heads kept or moved only as whole rows (rows are
    /// independent blocks, so moving them back is a copy). `None` for any other type or
    /// conversion (those are dequantized). Needs no bytes: callers ask before reading.
    pub fn kquant_kind(&self) -> Option<KQuantKind> {
        let kind = match self.gguf.ty.name {
            "Q4_K" => KQuantKind::Q4K,
            "Q6_K" => KQuantKind::Q6K,
            _ => return None,
        };
        (self.stored == Stored::AsIs && !matches!(self.order, HeadOrder::Cols { .. }))
            .then_some(kind)
    }

    /// `data` (this tensor's bytes) as k-quant blocks in the transformers row order, if
    /// [`DenseTensor::kquant_kind`] allows: kept rows are `data` itself, moved value-head rows
    /// are copied back into place.
    pub fn kquant_rows(&self, data: Vec<u8>) -> Result<Option<(KQuantKind, Vec<u8>)>, GgufError> {
        let Some(kind) = self.kquant_kind() else {
            return Ok(None);
        };
        let rb = self.row_bytes;
        if data.len() != rb * self.rows {
            return Err(GgufError::Tensor {
                tensor: self.gguf.name.clone(),
                why: format!(
                    "{} bytes handed over, expected {}",
                    data.len(),
                    rb * self.rows
                ),
            });
        }
        let HeadOrder::Rows { start, head } = self.order else {
            return Ok(Some((kind, data)));
        };
        let mut out = data.clone();
        // Transformers row start + i sits at file row start + tiled_index(i).
        for i in 0..self.rows - start {
            let from = start + tiled_index(i, head, self.heads);
            out[(start + i) * rb..][..rb].copy_from_slice(&data[from * rb..][..rb]);
        }
        Ok(Some((kind, out)))
    }

    /// The whole tensor, row-major in the transformers layout (small tensors: vectors, norms).
    pub fn values(&self, data: &[u8]) -> Result<Vec<f32>, GgufError> {
        let mut all = vec![0f32; self.rows * self.cols];
        let cols = self.cols;
        self.for_each_row(data, |r, v| {
            all[r * cols..(r + 1) * cols].copy_from_slice(v);
        })?;
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgmlType;

    #[test]
    fn value_heads_move_as_llamacpp_moves_them() {
        // llama.cpp's `_reorder_v_heads` with 2 key heads, 3 value heads each, head size 1:
        // grouped [k0v0 k0v1 k0v2 k1v0 k1v1 k1v2] → tiled [k0v0 k1v0 k0v1 k1v1 k0v2 k1v2].
        let tiled: Vec<usize> = (0..6).map(|i| tiled_index(i, 1, (2, 3))).collect();
        assert_eq!(tiled, [0, 2, 4, 1, 3, 5]);
        // Head size 2 moves whole heads.
        let tiled: Vec<usize> = (0..4).map(|i| tiled_index(i, 2, (1, 2))).collect();
        assert_eq!(tiled, [0, 1, 2, 3]);
        let tiled: Vec<usize> = (0..8).map(|i| tiled_index(i, 2, (2, 2))).collect();
        assert_eq!(tiled, [0, 1, 4, 5, 2, 3, 6, 7]);
    }

    /// llama.cpp's `_reorder_v_heads` spelled out: view `[n_k, per_k, head]`, swap the first two
    /// axes; returns the grouped index each tiled position holds.
    fn reorder_v_heads(n_k: usize, per_k: usize, head: usize) -> Vec<usize> {
        let mut out = Vec::with_capacity(n_k * per_k * head);
        for j in 0..per_k {
            for k in 0..n_k {
                for h in 0..head {
                    out.push((k * per_k + j) * head + h);
                }
            }
        }
        out
    }

    #[test]
    fn tiled_index_inverts_llamacpps_reorder_at_the_real_shape() {
        // Qwen3.6-35B-A3B: 16 key heads, 32 value heads of 128; also a vector (head 1).
        for (n_k, per_k, head) in [(16, 2, 128), (16, 2, 1), (2, 3, 5)] {
            let tiled = reorder_v_heads(n_k, per_k, head);
            for (pos, &grouped) in tiled.iter().enumerate() {
                assert_eq!(tiled_index(grouped, head, (n_k, per_k)), pos);
            }
        }
    }

    fn a_tensor(values: &[f32]) -> (DenseTensor, Vec<u8>) {
        let ty = GgmlType::from_name("F32").expect("F32");
        let gguf = TensorInfo {
            name: "blk.0.ssm_a".into(),
            dims: vec![values.len() as u64],
            ty,
            offset: 0,
            len: 4 * values.len() as u64,
        };
        let t = DenseTensor {
            gguf,
            rows: 1,
            cols: values.len(),
            row_bytes: 4 * values.len(),
            stored: Stored::NegExp,
            order: HeadOrder::Cols { head: 1 },
            heads: (2, values.len() / 2),
        };
        (t, values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    #[test]
    fn a_is_read_back_as_a_log_in_grouped_order_and_a_positive_a_is_refused() {
        // Tiled file order [k0v0 k1v0 k0v1 k1v1] holds A = −exp(A_log) of grouped heads 0, 2, 1, 3.
        let a_log = [0.5f32, -1.0, 2.0, 0.0];
        let file: Vec<f32> = [0, 2, 1, 3].iter().map(|&h| -a_log[h].exp()).collect();
        let (t, bytes) = a_tensor(&file);
        let got = t.values(&bytes).expect("values");
        for (g, w) in got.iter().zip(a_log) {
            assert!((g - w).abs() < 1e-6, "{got:?} vs {a_log:?}");
        }
        let (t, bytes) = a_tensor(&[-1.0, 0.5, -1.0, -1.0]);
        let err = t.values(&bytes).expect_err("positive A").to_string();
        assert!(
            err.contains("blk.0.ssm_a") && err.contains("element 1 (file order)"),
            "{err}"
        );
    }

    /// A Q4_K `[14, 256]` tensor whose rows 2.. hold 6 value heads of 2 rows: 3 key heads of 2
    /// value heads each, so the tiled order is not its own inverse (with 2 × 2 it would be, and
    /// a copy in the wrong direction would pass).
    fn q4k_tensor(stored: Stored, order: HeadOrder) -> (DenseTensor, Vec<u8>) {
        let (rows, cols) = (14, 256);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * (1 + i / cols) as f32)
            .collect();
        let data = crate::kernels::kquant::quantize_matrix(KQuantKind::Q4K, &w, rows, cols).data;
        let gguf = TensorInfo {
            name: "blk.0.ssm_in.weight".into(),
            dims: vec![cols as u64, rows as u64],
            ty: GgmlType::from_name("Q4_K").expect("Q4_K"),
            offset: 0,
            len: data.len() as u64,
        };
        let row_bytes = data.len() / rows;
        let t = DenseTensor {
            gguf,
            rows,
            cols,
            row_bytes,
            stored,
            order,
            heads: (3, 2),
        };
        (t, data)
    }

    #[test]
    fn kquant_rows_are_the_blocks_in_transformers_row_order() {
        let (t, data) = q4k_tensor(Stored::AsIs, HeadOrder::Rows { start: 2, head: 2 });
        let (kind, rows) = t
            .kquant_rows(data.clone())
            .expect("read")
            .expect("kept as k-quant");
        assert_eq!(kind, KQuantKind::Q4K);
        // Each block row, dequantized, is the row for_each_row gives for that transformers row.
        let rb = data.len() / 14;
        let mut want = vec![vec![]; 14];
        t.for_each_row(&data, |r, v| want[r] = v.to_vec())
            .expect("rows");
        for (r, bytes) in rows.chunks_exact(rb).enumerate() {
            let mut got = vec![0f32; 256];
            dequantize(t.gguf.ty, bytes, &mut got).expect("dequantize");
            assert_eq!(got, want[r], "row {r}");
        }
        assert_ne!(rows, data, "the value-head rows moved");
        // Moved columns, a stored 1 + w or another type are not run as k-quant.
        let (t, data) = q4k_tensor(Stored::AsIs, HeadOrder::Cols { head: 32 });
        assert_eq!(t.kquant_kind(), None);
        assert_eq!(t.kquant_rows(data).expect("read"), None);
        let (t, data) = q4k_tensor(Stored::PlusOne, HeadOrder::Kept);
        assert_eq!(t.kquant_rows(data).expect("read"), None);
        let (t, bytes) = a_tensor(&[-1.0; 4]);
        assert_eq!(t.kquant_rows(bytes).expect("read"), None);
        let (t, data) = q4k_tensor(Stored::AsIs, HeadOrder::Kept);
        assert_eq!(
            t.kquant_rows(data.clone()).expect("read"),
            Some((KQuantKind::Q4K, data.clone()))
        );
        assert!(
            t.kquant_rows(data[1..].to_vec()).is_err(),
            "a short read is refused"
        );
    }
}
