//! The text model's tensor inventory as the configuration predicts it: every name, shape and
//! accepted dtype (docs/model.md §3), and which names belong to parts the text runtime skips.
//!
//! Pure: a function of `TextConfig`. The checkpoint reader compares files against it; the size
//! arithmetic sums it, so `hostd inspect` works on a bare config too.

use crate::config::{LayerType, TextConfig};
use safetensors::Dtype;

/// Name prefix of the text model in the official (multimodal) release.
pub const PREFIX_RELEASE: &str = "model.language_model.";
/// Name prefix of a text-only save (`Qwen3_5MoeForCausalLM.save_pretrained`).
pub const PREFIX_TEXT_ONLY: &str = "model.";
/// The output projection sits outside the `model.` prefix in both forms.
pub const LM_HEAD: &str = "lm_head.weight";

/// Parts of the checkpoint the text runtime does not load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SkippedPart {
    /// `model.visual.*`: the vision tower.
    Vision,
    /// `mtp.*`: the multi-token-prediction head.
    Mtp,
}

impl SkippedPart {
    /// Classifies a tensor name; `None` for names the text runtime may need.
    pub fn of(name: &str) -> Option<SkippedPart> {
        if name.starts_with("model.visual.") {
            Some(SkippedPart::Vision)
        } else if name.starts_with("mtp.") {
            Some(SkippedPart::Mtp)
        } else {
            None
        }
    }
}

/// What a tensor is for, as far as memory planning cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorRole {
    /// Resident in hostd: embeddings, mixers, norms, router, shared expert, lm_head.
    Dense,
    /// A routed expert's weights (streamed by expertd).
    RoutedExpert,
}

/// How a checkpoint stores a layer's routed experts (docs/model.md §3.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertLayout {
    /// `mlp.experts.gate_up_proj` `[E, 2f, d]` (gate rows first) and `mlp.experts.down_proj` `[E, d, f]`.
    Fused,
    /// `mlp.experts.{e}.{gate,up,down}_proj.weight`, as transformers v5 writes on save.
    PerExpert,
}

impl ExpertLayout {
    /// Stable lowercase name for reports.
    pub fn as_str(self) -> &'static str {
        match self {
            ExpertLayout::Fused => "fused",
            ExpertLayout::PerExpert => "per_expert",
        }
    }
}

/// One tensor the text runtime requires.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpectedTensor {
    /// Full name in the checkpoint.
    pub name: String,
    /// Shape in PyTorch (row-major) order.
    pub shape: Vec<usize>,
    /// The dtype the official release stores it in (used for size arithmetic).
    pub canonical: Dtype,
    /// Dtypes the loader accepts.
    pub accepted: &'static [Dtype],
    /// Dense or routed expert.
    pub role: TensorRole,
}

impl ExpectedTensor {
    /// Elements in the tensor.
    pub fn numel(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product()
    }
    /// Bytes in the canonical (release) dtype.
    pub fn canonical_bytes(&self) -> u64 {
        self.numel() * dtype_bytes(self.canonical)
    }
}

/// Bytes per element of a byte-aligned dtype (every dtype this model accepts is).
pub fn dtype_bytes(dtype: Dtype) -> u64 {
    dtype.bitsize() as u64 / 8
}

const BF16_ONLY: &[Dtype] = &[Dtype::BF16];
// `A_log` and the DeltaNet gated-norm weight are F32 in the release; BF16 re-saves exist [docs/model.md §3.3].
const F32_OR_BF16: &[Dtype] = &[Dtype::F32, Dtype::BF16];

fn bf16(name: String, shape: Vec<usize>, role: TensorRole) -> ExpectedTensor {
    ExpectedTensor {
        name,
        shape,
        canonical: Dtype::BF16,
        accepted: BF16_ONLY,
        role,
    }
}

fn f32_kept(name: String, shape: Vec<usize>) -> ExpectedTensor {
    ExpectedTensor {
        name,
        shape,
        canonical: Dtype::F32,
        accepted: F32_OR_BF16,
        role: TensorRole::Dense,
    }
}

/// Every dense (non-routed-expert) text tensor, in checkpoint order, under `prefix`.
pub fn dense_tensors(cfg: &TextConfig, prefix: &str) -> Vec<ExpectedTensor> {
    use TensorRole::Dense;
    let d = cfg.hidden_size;
    let v = cfg.vocab_size;
    let mut out = vec![bf16(
        format!("{prefix}embed_tokens.weight"),
        vec![v, d],
        Dense,
    )];
    for (i, ty) in cfg.layer_types.iter().enumerate() {
        let l = format!("{prefix}layers.{i}.");
        out.push(bf16(format!("{l}input_layernorm.weight"), vec![d], Dense));
        out.push(bf16(
            format!("{l}post_attention_layernorm.weight"),
            vec![d],
            Dense,
        ));
        match ty {
            LayerType::LinearAttention => {
                let dn = cfg.delta_net;
                let a = format!("{l}linear_attn.");
                out.push(bf16(
                    format!("{a}in_proj_qkv.weight"),
                    vec![dn.conv_dim(), d],
                    Dense,
                ));
                out.push(bf16(
                    format!("{a}in_proj_z.weight"),
                    vec![dn.value_dim(), d],
                    Dense,
                ));
                out.push(bf16(
                    format!("{a}in_proj_b.weight"),
                    vec![dn.n_v_heads, d],
                    Dense,
                ));
                out.push(bf16(
                    format!("{a}in_proj_a.weight"),
                    vec![dn.n_v_heads, d],
                    Dense,
                ));
                out.push(bf16(
                    format!("{a}conv1d.weight"),
                    vec![dn.conv_dim(), 1, dn.conv_kernel],
                    Dense,
                ));
                out.push(bf16(format!("{a}dt_bias"), vec![dn.n_v_heads], Dense));
                out.push(f32_kept(format!("{a}A_log"), vec![dn.n_v_heads]));
                out.push(f32_kept(format!("{a}norm.weight"), vec![dn.value_head_dim]));
                out.push(bf16(
                    format!("{a}out_proj.weight"),
                    vec![d, dn.value_dim()],
                    Dense,
                ));
            }
            LayerType::FullAttention => {
                let at = cfg.attention;
                let a = format!("{l}self_attn.");
                out.push(bf16(
                    format!("{a}q_proj.weight"),
                    vec![at.q_proj_rows(), d],
                    Dense,
                ));
                out.push(bf16(
                    format!("{a}k_proj.weight"),
                    vec![at.kv_proj_rows(), d],
                    Dense,
                ));
                out.push(bf16(
                    format!("{a}v_proj.weight"),
                    vec![at.kv_proj_rows(), d],
                    Dense,
                ));
                out.push(bf16(
                    format!("{a}o_proj.weight"),
                    vec![d, at.o_proj_cols()],
                    Dense,
                ));
                out.push(bf16(format!("{a}q_norm.weight"), vec![at.head_dim], Dense));
                out.push(bf16(format!("{a}k_norm.weight"), vec![at.head_dim], Dense));
            }
        }
        let m = format!("{l}mlp.");
        let fs = cfg.shared_expert_intermediate_size;
        out.push(bf16(
            format!("{m}gate.weight"),
            vec![cfg.num_experts, d],
            Dense,
        ));
        out.push(bf16(
            format!("{m}shared_expert.gate_proj.weight"),
            vec![fs, d],
            Dense,
        ));
        out.push(bf16(
            format!("{m}shared_expert.up_proj.weight"),
            vec![fs, d],
            Dense,
        ));
        out.push(bf16(
            format!("{m}shared_expert.down_proj.weight"),
            vec![d, fs],
            Dense,
        ));
        out.push(bf16(
            format!("{m}shared_expert_gate.weight"),
            vec![1, d],
            Dense,
        ));
    }
    out.push(bf16(format!("{prefix}norm.weight"), vec![d], Dense));
    out.push(bf16(LM_HEAD.to_string(), vec![v, d], Dense));
    out
}

/// Name of a fused layer's `gate_up_proj` tensor.
pub fn fused_gate_up_name(prefix: &str, layer: usize) -> String {
    format!("{prefix}layers.{layer}.mlp.experts.gate_up_proj")
}

/// Name of a fused layer's `down_proj` tensor.
pub fn fused_down_name(prefix: &str, layer: usize) -> String {
    format!("{prefix}layers.{layer}.mlp.experts.down_proj")
}

/// Name of one per-expert projection; `proj` is `gate_proj`, `up_proj` or `down_proj`.
pub fn per_expert_name(prefix: &str, layer: usize, expert: usize, proj: &str) -> String {
    format!("{prefix}layers.{layer}.mlp.experts.{expert}.{proj}.weight")
}

/// The routed-expert tensors of one layer in the given layout.
pub fn expert_tensors(
    cfg: &TextConfig,
    prefix: &str,
    layer: usize,
    layout: ExpertLayout,
) -> Vec<ExpectedTensor> {
    use TensorRole::RoutedExpert;
    let (e, f, d) = (cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size);
    match layout {
        ExpertLayout::Fused => vec![
            bf16(
                fused_gate_up_name(prefix, layer),
                vec![e, 2 * f, d],
                RoutedExpert,
            ),
            bf16(fused_down_name(prefix, layer), vec![e, d, f], RoutedExpert),
        ],
        ExpertLayout::PerExpert => (0..e)
            .flat_map(|x| {
                [
                    bf16(
                        per_expert_name(prefix, layer, x, "gate_proj"),
                        vec![f, d],
                        RoutedExpert,
                    ),
                    bf16(
                        per_expert_name(prefix, layer, x, "up_proj"),
                        vec![f, d],
                        RoutedExpert,
                    ),
                    bf16(
                        per_expert_name(prefix, layer, x, "down_proj"),
                        vec![d, f],
                        RoutedExpert,
                    ),
                ]
            })
            .collect(),
    }
}
