//! The write plan: every tensor `shared::tensor_spec` expects (release names, shapes and
//! dtypes, fused experts), its value distribution, its shard, and each shard's complete
//! safetensors header — all computed before a byte of weights is generated.
//!
//! Scales follow the oracle's fixtures (`tests/oracle/make_fixtures.py`): std ≈ c/√fan_in, with
//! the residual-branch output projections sized so each branch adds about 0.5² to the hidden
//! state's mean square (RMS stays within a few units over 40 layers), a router with logit std ≈ 2
//! (top-k choices vary between tokens) and an `lm_head` giving logits with std ≈ 3.

use super::SynthError;
use super::preset::{Dims, Preset, check_experts, check_layers, config_json};
use super::values::{Init, elem_bytes};
use safetensors::Dtype;
use serde_json::Value;
use shared::config::TextConfig;
use shared::container::{ContainerLayout, ExpertDims};
use shared::tensor_spec::{self, ExpectedTensor, ExpertLayout, PREFIX_RELEASE};
use std::collections::BTreeMap;

/// Largest shard (bytes of tensor data), like the release's few-GiB files.
pub const SHARD_CAP_BYTES: u64 = 4 << 30;
/// Scale of the embedding / `lm_head` rows no token id maps to.
const PAD_SCALE: f32 = 0.01;

/// One tensor to write.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedTensor {
    /// Full checkpoint name.
    pub name: String,
    /// Shape (row-major).
    pub shape: Vec<usize>,
    /// Stored dtype (the release's: BF16, F32 for `A_log` and the DeltaNet norm).
    pub dtype: Dtype,
    /// Value distribution.
    pub init: Init,
    /// Byte offsets `[start, end)` inside the shard's data section.
    pub data_offsets: (u64, u64),
}

impl PlannedTensor {
    /// Elements.
    pub fn numel(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product()
    }
    /// Bytes of data.
    pub fn bytes(&self) -> u64 {
        self.data_offsets.1 - self.data_offsets.0
    }
}

/// One safetensors file to write.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardPlan {
    /// `model-0000K-of-0000N.safetensors`.
    pub file_name: String,
    /// The file's first bytes: the little-endian u64 header length, then the JSON header padded
    /// with spaces to a multiple of 8 bytes.
    pub header: Vec<u8>,
    /// Tensors in data order (F32 first, then BF16, each by name, as `safetensors` orders them).
    pub tensors: Vec<PlannedTensor>,
}

impl ShardPlan {
    /// Bytes of tensor data.
    pub fn data_bytes(&self) -> u64 {
        self.tensors.last().map_or(0, |t| t.data_offsets.1)
    }
    /// Final file length.
    pub fn file_len(&self) -> u64 {
        self.header.len() as u64 + self.data_bytes()
    }
}

/// Everything `synthesize` writes, except the values themselves (which also depend on the seed).
#[derive(Debug, Clone)]
pub struct Plan {
    /// The preset.
    pub preset: Preset,
    /// Its dimensions (`experts` as asked for with `--experts`).
    pub dims: Dims,
    /// Decoder layers.
    pub layers: usize,
    /// `config.json` content.
    pub config_json: Value,
    /// The configuration as `shared::config` parses it back.
    pub config: TextConfig,
    /// Shards in file order.
    pub shards: Vec<ShardPlan>,
}

impl Plan {
    /// Bytes of all shard files together.
    pub fn total_file_bytes(&self) -> u64 {
        self.shards.iter().map(ShardPlan::file_len).sum()
    }
    /// Bytes of tensor data (the index's `metadata.total_size`).
    pub fn total_data_bytes(&self) -> u64 {
        self.shards.iter().map(ShardPlan::data_bytes).sum()
    }
    /// Bytes of the INT8 expert container `expertd prepare` makes from this checkpoint (header,
    /// index and one aligned blob per routed expert; `shared::container`'s layout arithmetic).
    pub fn int8_container_bytes(&self) -> Result<u64, SynthError> {
        let dims = ExpertDims::from_config(&self.config)
            .map_err(|e| SynthError::Internal(e.to_string()))?;
        Ok(ContainerLayout::new(dims)
            .map_err(|e| SynthError::Internal(e.to_string()))?
            .file_bytes)
    }
    /// Tensor name → shard file name.
    pub fn weight_map(&self) -> BTreeMap<String, String> {
        self.shards
            .iter()
            .flat_map(|s| {
                s.tensors
                    .iter()
                    .map(|t| (t.name.clone(), s.file_name.clone()))
            })
            .collect()
    }
    /// Index of the shard holding `name`.
    pub fn shard_of(&self, name: &str) -> Option<usize> {
        self.shards
            .iter()
            .position(|s| s.tensors.iter().any(|t| t.name == name))
    }
    /// `model.safetensors.index.json` content.
    pub fn index_json(&self) -> Value {
        serde_json::json!({
            "metadata": { "total_size": self.total_data_bytes() },
            "weight_map": self.weight_map(),
        })
    }
}

/// Computes the plan for `preset` with `layers` decoder layers and `experts` routed experts per
/// layer (defaults: the preset's; top-k stays the preset's).
pub fn plan(
    preset: Preset,
    layers: Option<usize>,
    experts: Option<usize>,
) -> Result<Plan, SynthError> {
    let mut dims = preset.dims();
    let layers = layers.unwrap_or(dims.default_layers);
    check_layers(layers)?;
    if let Some(experts) = experts {
        check_experts(preset, &dims, experts)?;
        dims.experts = experts;
    }
    let config_json = config_json(&dims, layers);
    let config = shared::config::parse_config(&config_json.to_string())
        .map_err(|e| SynthError::Internal(format!("generated config does not parse: {e}")))?
        .text;
    let ordered = tensors_in_layer_order(&config)?;
    let mut groups: Vec<Vec<(ExpectedTensor, Init)>> = vec![Vec::new()];
    let mut group_bytes = 0u64;
    for t in ordered {
        let init = init_for(&t, &config, &dims)?;
        let bytes = t.canonical_bytes();
        let current = groups.last().map_or(&[][..], |g| &g[..]);
        // A layer's fused down_proj never shares a file with its gate_up_proj.
        let partner = t
            .name
            .strip_suffix(".down_proj")
            .map(|base| format!("{base}.gate_up_proj"));
        let split_pair = partner.is_some_and(|p| current.iter().any(|(c, _)| c.name == p));
        if !current.is_empty() && (split_pair || group_bytes + bytes > SHARD_CAP_BYTES) {
            groups.push(Vec::new());
            group_bytes = 0;
        }
        group_bytes += bytes;
        if let Some(g) = groups.last_mut() {
            g.push((t, init));
        }
    }
    let n = groups.len();
    let shards = groups
        .into_iter()
        .enumerate()
        .map(|(k, g)| shard_plan(format!("model-{:05}-of-{n:05}.safetensors", k + 1), g))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Plan {
        preset,
        dims,
        layers,
        config_json,
        config,
        shards,
    })
}

/// Dense and fused expert tensors, grouped by layer: embedding, then per layer its dense
/// tensors, `gate_up_proj`, `down_proj`; then the final norm and `lm_head`.
fn tensors_in_layer_order(cfg: &TextConfig) -> Result<Vec<ExpectedTensor>, SynthError> {
    let dense = tensor_spec::dense_tensors(cfg, PREFIX_RELEASE);
    let layer_prefix = format!("{PREFIX_RELEASE}layers.");
    let (layered, global): (Vec<_>, Vec<_>) = dense
        .into_iter()
        .partition(|t| t.name.starts_with(&layer_prefix));
    let mut out = Vec::new();
    let mut rest = global.into_iter();
    out.extend(rest.next()); // embed_tokens
    for layer in 0..cfg.num_layers {
        let p = format!("{layer_prefix}{layer}.");
        out.extend(layered.iter().filter(|t| t.name.starts_with(&p)).cloned());
        out.extend(tensor_spec::expert_tensors(
            cfg,
            PREFIX_RELEASE,
            layer,
            ExpertLayout::Fused,
        ));
    }
    out.extend(rest);
    let want = tensor_spec::dense_tensors(cfg, PREFIX_RELEASE).len() + 2 * cfg.num_layers;
    if out.len() != want {
        return Err(SynthError::Internal(format!(
            "ordered {} tensors, expected {want}",
            out.len()
        )));
    }
    Ok(out)
}

/// The value distribution of one tensor, by its name.
fn init_for(t: &ExpectedTensor, cfg: &TextConfig, dims: &Dims) -> Result<Init, SynthError> {
    let name = t.name.as_str();
    let inv_sqrt = |n: usize| 1.0 / (n as f32).sqrt();
    let d = cfg.hidden_size;
    let dn = cfg.delta_net;
    let at = cfg.attention;
    let padded = |std: f32| Init::Normal {
        std,
        live: (dims.defined_tokens() * d) as u64,
        pad_scale: PAD_SCALE,
    };
    // Zero-centred RMSNorm weights (effective scale 1 + w).
    let zero_centred = Init::Uniform { lo: -0.2, hi: 0.2 };
    let suffix = name
        .rsplit_once("layers.")
        .map_or(name, |(_, s)| s.split_once('.').map_or(s, |(_, s)| s));
    let init = if name == tensor_spec::LM_HEAD {
        padded(3.0 * inv_sqrt(d))
    } else if name.ends_with("embed_tokens.weight") {
        padded(1.0)
    } else if name == format!("{PREFIX_RELEASE}norm.weight") {
        zero_centred
    } else {
        match suffix {
            "input_layernorm.weight"
            | "post_attention_layernorm.weight"
            | "self_attn.q_norm.weight"
            | "self_attn.k_norm.weight" => zero_centred,
            "linear_attn.in_proj_qkv.weight"
            | "linear_attn.in_proj_z.weight"
            | "linear_attn.in_proj_b.weight" => Init::normal(inv_sqrt(d)),
            "linear_attn.in_proj_a.weight" => Init::normal(0.5 * inv_sqrt(d)),
            "linear_attn.conv1d.weight" => Init::Uniform { lo: -0.6, hi: 0.6 },
            "linear_attn.dt_bias" => Init::DtBias { lo: 1e-3, hi: 1e-1 },
            "linear_attn.A_log" => Init::LnUniform { lo: 1.0, hi: 16.0 },
            // Plain scale of the gated norm (not 1 + w).
            "linear_attn.norm.weight" => Init::Uniform { lo: 0.8, hi: 1.2 },
            "linear_attn.out_proj.weight" => Init::normal(inv_sqrt(dn.value_dim())),
            "self_attn.q_proj.weight" | "self_attn.k_proj.weight" | "self_attn.v_proj.weight" => {
                Init::normal(inv_sqrt(d))
            }
            "self_attn.o_proj.weight" => Init::normal(inv_sqrt(at.o_proj_cols())),
            "mlp.gate.weight" => Init::normal(2.0 * inv_sqrt(d)),
            "mlp.experts.gate_up_proj" => Init::normal(inv_sqrt(d)),
            "mlp.experts.down_proj" => Init::normal(1.5 * inv_sqrt(cfg.moe_intermediate_size)),
            "mlp.shared_expert.gate_proj.weight" | "mlp.shared_expert.up_proj.weight" => {
                Init::normal(inv_sqrt(d))
            }
            "mlp.shared_expert.down_proj.weight" => {
                Init::normal(inv_sqrt(cfg.shared_expert_intermediate_size))
            }
            "mlp.shared_expert_gate.weight" => Init::normal(inv_sqrt(d)),
            _ => {
                return Err(SynthError::Internal(format!(
                    "no initialiser for tensor {name}"
                )));
            }
        }
    };
    Ok(init)
}

/// Lays out one shard (safetensors order: larger dtypes first, then by name) and renders its
/// header.
fn shard_plan(
    file_name: String,
    mut group: Vec<(ExpectedTensor, Init)>,
) -> Result<ShardPlan, SynthError> {
    group.sort_by(|(a, _), (b, _)| {
        elem_bytes(b.canonical)
            .cmp(&elem_bytes(a.canonical))
            .then_with(|| a.name.cmp(&b.name))
    });
    let mut offset = 0u64;
    let mut tensors = Vec::with_capacity(group.len());
    for (t, init) in group {
        let end = offset + t.canonical_bytes();
        tensors.push(PlannedTensor {
            name: t.name,
            shape: t.shape,
            dtype: t.canonical,
            init,
            data_offsets: (offset, end),
        });
        offset = end;
    }
    let header = render_header(&tensors)?;
    Ok(ShardPlan {
        file_name,
        header,
        tensors,
    })
}

fn dtype_name(dtype: Dtype) -> Result<&'static str, SynthError> {
    match dtype {
        Dtype::BF16 => Ok("BF16"),
        Dtype::F32 => Ok("F32"),
        other => Err(SynthError::Internal(format!("unexpected dtype {other:?}"))),
    }
}

/// The 8-byte length prefix plus the JSON header, padded with spaces to a multiple of 8.
fn render_header(tensors: &[PlannedTensor]) -> Result<Vec<u8>, SynthError> {
    let mut json = String::from(r#"{"__metadata__":{"format":"pt"}"#);
    for t in tensors {
        let name =
            serde_json::to_string(&t.name).map_err(|e| SynthError::Internal(e.to_string()))?;
        let shape: Vec<String> = t.shape.iter().map(usize::to_string).collect();
        json.push_str(&format!(
            r#",{name}:{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}}"#,
            dtype_name(t.dtype)?,
            shape.join(","),
            t.data_offsets.0,
            t.data_offsets.1
        ));
    }
    json.push('}');
    while json.len() % 8 != 0 {
        json.push(' ');
    }
    let mut header = (json.len() as u64).to_le_bytes().to_vec();
    header.extend_from_slice(json.as_bytes());
    Ok(header)
}
