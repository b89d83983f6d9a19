//! Model configuration: parses `config.json` (nested `qwen3_5_moe` or bare `qwen3_5_moe_text`),
//! validates every field the runtime depends on and derives the layer types and head layouts.
//!
//! Pure: takes the JSON text, returns values. Reading the file is `model_dir`'s job.
//! Fields the runtime does not use are ignored; fields it uses are required, except the few
//! that take transformers' default (noted next to each default below; docs/model.md §2.1).

use serde_json::{Map, Value};

/// `model_type` of the multimodal release config that nests the text model in `text_config`.
pub const MODEL_TYPE_NESTED: &str = "qwen3_5_moe";
/// `model_type` of a bare text config (and of the nested `text_config` object).
pub const MODEL_TYPE_TEXT: &str = "qwen3_5_moe_text";

/// Kind of token mixer in one decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerType {
    /// Gated DeltaNet (`"linear_attention"`).
    LinearAttention,
    /// Gated full attention with a KV cache (`"full_attention"`).
    FullAttention,
}

impl LayerType {
    /// The string `config.json` uses for this layer type.
    pub fn as_str(self) -> &'static str {
        match self {
            LayerType::LinearAttention => "linear_attention",
            LayerType::FullAttention => "full_attention",
        }
    }
}

/// Which form the configuration file had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigForm {
    /// `model_type: qwen3_5_moe` with the text model under `text_config` (the official release).
    Nested,
    /// `model_type: qwen3_5_moe_text` at the top level.
    Text,
}

/// Head layout of the gated full-attention layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionLayout {
    /// Query heads (`num_attention_heads`).
    pub n_q_heads: usize,
    /// Key/value heads (`num_key_value_heads`).
    pub n_kv_heads: usize,
    /// Dimension of one head (`head_dim`, not hidden/heads).
    pub head_dim: usize,
    /// Query heads per KV head (GQA group size).
    pub q_per_kv: usize,
    /// Leading head dimensions that get rotary embedding (`head_dim × partial_rotary_factor`).
    pub rotary_dims: usize,
}

impl AttentionLayout {
    /// Output rows of `q_proj`: query and gate interleaved per head.
    pub fn q_proj_rows(&self) -> usize {
        2 * self.n_q_heads * self.head_dim
    }
    /// Output rows of `k_proj` and of `v_proj`.
    pub fn kv_proj_rows(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
    /// Input columns of `o_proj`.
    pub fn o_proj_cols(&self) -> usize {
        self.n_q_heads * self.head_dim
    }
}

/// Head layout of the Gated DeltaNet layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaNetLayout {
    /// q/k heads (`linear_num_key_heads`).
    pub n_k_heads: usize,
    /// v heads (`linear_num_value_heads`).
    pub n_v_heads: usize,
    /// q/k head dimension.
    pub key_head_dim: usize,
    /// v head dimension.
    pub value_head_dim: usize,
    /// v heads per q/k head; v head h reads q/k head `h / v_per_k`.
    pub v_per_k: usize,
    /// Depthwise causal convolution width.
    pub conv_kernel: usize,
}

impl DeltaNetLayout {
    /// Channels of q (and of k): `n_k_heads × key_head_dim`.
    pub fn key_dim(&self) -> usize {
        self.n_k_heads * self.key_head_dim
    }
    /// Channels of v and z: `n_v_heads × value_head_dim`.
    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.value_head_dim
    }
    /// Channels that go through the convolution: q, k and v.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
}

/// The text-model configuration the runtime depends on, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct TextConfig {
    /// Residual stream width `d`.
    pub hidden_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Mixer kind of each layer; `layer_types.len() == num_layers`.
    pub layer_types: Vec<LayerType>,
    /// Full-attention head layout.
    pub attention: AttentionLayout,
    /// `partial_rotary_factor` as configured (0.25 for the release).
    pub partial_rotary_factor: f64,
    /// RoPE base θ.
    pub rope_theta: f64,
    /// Longest context the model is configured for, in tokens.
    pub max_position_embeddings: usize,
    /// ε of every RMSNorm (the DeltaNet L2 norm of q and k uses a fixed 1e-6, as transformers does).
    pub rms_norm_eps: f64,
    /// Gated DeltaNet head layout.
    pub delta_net: DeltaNetLayout,
    /// Routed experts per layer.
    pub num_experts: usize,
    /// Experts chosen per token (top-k).
    pub experts_per_token: usize,
    /// Inner width of one routed expert.
    pub moe_intermediate_size: usize,
    /// Inner width of the shared expert.
    pub shared_expert_intermediate_size: usize,
    /// Rows of the embedding table and of `lm_head` (includes padding rows).
    pub vocab_size: usize,
    /// End-of-sequence ids named by the config (may be empty; the tokenizer adds its own).
    pub eos_token_ids: Vec<u32>,
}

impl TextConfig {
    /// Number of full-attention layers.
    pub fn n_full_attention_layers(&self) -> usize {
        self.layer_types
            .iter()
            .filter(|t| **t == LayerType::FullAttention)
            .count()
    }
    /// Number of Gated DeltaNet layers.
    pub fn n_linear_attention_layers(&self) -> usize {
        self.num_layers - self.n_full_attention_layers()
    }
}

/// A parsed model configuration and the form it came in.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Nested (release) or bare text form.
    pub form: ConfigForm,
    /// The validated text configuration.
    pub text: TextConfig,
}

/// A configuration that cannot be used, naming the offending field (dotted JSON path).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// The file is not JSON.
    #[error("not valid JSON: {0}")]
    Json(String),
    /// `model_type` names a model this runtime does not implement.
    #[error(
        "unsupported model_type {found:?} (field {field}); expected \"{MODEL_TYPE_NESTED}\" with a text_config, or \"{MODEL_TYPE_TEXT}\""
    )]
    UnsupportedModelType {
        /// Dotted path of the field.
        field: String,
        /// The value found.
        found: String,
    },
    /// A required field is absent.
    #[error("missing required field {field}")]
    Missing {
        /// Dotted path of the field.
        field: String,
    },
    /// A field has the wrong JSON type.
    #[error("field {field} must be {expected}, found {found}")]
    WrongType {
        /// Dotted path of the field.
        field: String,
        /// What the runtime expects.
        expected: &'static str,
        /// The JSON value found, abbreviated.
        found: String,
    },
    /// A field has a value the runtime cannot run.
    #[error("field {field} is invalid: {reason}")]
    Invalid {
        /// Dotted path of the field.
        field: String,
        /// Why the value is rejected.
        reason: String,
    },
}

/// Parses and validates a `config.json` text.
pub fn parse_config(json: &str) -> Result<ModelConfig, ConfigError> {
    let root: Value = serde_json::from_str(json).map_err(|e| ConfigError::Json(e.to_string()))?;
    let root = root.as_object().ok_or_else(|| ConfigError::WrongType {
        field: "(root)".into(),
        expected: "a JSON object",
        found: abbreviate(&root),
    })?;
    let top = Fields {
        map: root,
        prefix: String::new(),
    };
    let model_type = top.string("model_type")?;
    match model_type.as_str() {
        MODEL_TYPE_NESTED => {
            if top.opt_bool("tie_word_embeddings")? == Some(true) {
                return Err(tied_embeddings("tie_word_embeddings"));
            }
            let text = top.object("text_config")?;
            let text_type = text.string("model_type")?;
            if text_type != MODEL_TYPE_TEXT {
                return Err(ConfigError::UnsupportedModelType {
                    field: "text_config.model_type".into(),
                    found: text_type,
                });
            }
            Ok(ModelConfig {
                form: ConfigForm::Nested,
                text: parse_text(&text, &top)?,
            })
        }
        MODEL_TYPE_TEXT => Ok(ModelConfig {
            form: ConfigForm::Text,
            text: parse_text(&top, &top)?,
        }),
        _ => Err(ConfigError::UnsupportedModelType {
            field: "model_type".into(),
            found: model_type,
        }),
    }
}

fn tied_embeddings(field: &str) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        reason: "tied embeddings are not supported (Qwen3.5/3.6 MoE ships a separate lm_head)"
            .into(),
    }
}

fn parse_text(t: &Fields<'_>, top: &Fields<'_>) -> Result<TextConfig, ConfigError> {
    if t.opt_bool("tie_word_embeddings")? == Some(true) {
        return Err(tied_embeddings(&t.path("tie_word_embeddings")));
    }
    if let Some(act) = t.opt_string("hidden_act")?
        && act != "silu"
    {
        return Err(t.invalid(
            "hidden_act",
            format!("{act:?} is not supported; the model uses \"silu\""),
        ));
    }
    if t.opt_bool("attention_bias")? == Some(true) {
        return Err(t.invalid("attention_bias", "biases are not part of this model".into()));
    }
    if let Some(list) = t.opt_array("mlp_only_layers")?
        && !list.is_empty()
    {
        return Err(t.invalid(
            "mlp_only_layers",
            "dense-FFN layers are not supported; every layer must be MoE".into(),
        ));
    }

    let hidden_size = t.positive("hidden_size")?;
    let num_layers = t.positive("num_hidden_layers")?;
    let layer_types = parse_layer_types(t, num_layers)?;

    let n_q_heads = t.positive("num_attention_heads")?;
    let n_kv_heads = t.positive("num_key_value_heads")?;
    let head_dim = t.positive("head_dim")?;
    if n_q_heads % n_kv_heads != 0 {
        return Err(t.invalid(
            "num_key_value_heads",
            format!("{n_kv_heads} does not divide num_attention_heads {n_q_heads}"),
        ));
    }

    // RoPE parameters: `rope_parameters` (transformers 5) or `rope_scaling` (older exports).
    // transformers merges a top-level partial_rotary_factor into the dict (dict value wins) and
    // defaults it to 0.25.
    let rope_key = if t.has("rope_parameters") {
        "rope_parameters"
    } else {
        "rope_scaling"
    };
    let rope = t.opt_object(rope_key)?;
    let mut partial_rotary_factor = t.opt_f64("partial_rotary_factor")?;
    let mut rope_theta = t.opt_f64("rope_theta")?;
    if let Some(rope) = &rope {
        if let Some(kind) = rope.opt_string("rope_type")?.or(rope.opt_string("type")?)
            && kind != "default"
        {
            return Err(rope.invalid(
                "rope_type",
                format!("{kind:?} is not supported; only \"default\" RoPE is implemented"),
            ));
        }
        partial_rotary_factor = rope
            .opt_f64("partial_rotary_factor")?
            .or(partial_rotary_factor);
        rope_theta = rope.opt_f64("rope_theta")?.or(rope_theta);
    }
    let partial_rotary_factor = partial_rotary_factor.unwrap_or(0.25);
    let rope_theta = rope_theta.ok_or_else(|| ConfigError::Missing {
        field: format!(
            "{} (or {}.rope_theta)",
            t.path("rope_theta"),
            t.path(rope_key)
        ),
    })?;
    if !(rope_theta.is_finite() && rope_theta > 1.0) {
        return Err(t.invalid(
            "rope_theta",
            format!("{rope_theta} must be a finite number > 1"),
        ));
    }
    let rotary = head_dim as f64 * partial_rotary_factor;
    let rotary_dims = rotary as usize;
    if !(partial_rotary_factor > 0.0 && partial_rotary_factor <= 1.0)
        || rotary_dims as f64 != rotary
        || !rotary_dims.is_multiple_of(2)
    {
        return Err(t.invalid(
            "partial_rotary_factor",
            format!("{partial_rotary_factor} × head_dim {head_dim} must be a positive even integer ≤ head_dim"),
        ));
    }

    let rms_norm_eps = t.f64("rms_norm_eps")?;
    if !(rms_norm_eps.is_finite() && rms_norm_eps > 0.0 && rms_norm_eps < 1.0) {
        return Err(t.invalid("rms_norm_eps", format!("{rms_norm_eps} must be in (0, 1)")));
    }

    let n_k_heads = t.positive("linear_num_key_heads")?;
    let n_v_heads = t.positive("linear_num_value_heads")?;
    if n_v_heads % n_k_heads != 0 {
        return Err(t.invalid(
            "linear_num_value_heads",
            format!("{n_v_heads} is not a multiple of linear_num_key_heads {n_k_heads}"),
        ));
    }
    let delta_net = DeltaNetLayout {
        n_k_heads,
        n_v_heads,
        key_head_dim: t.positive("linear_key_head_dim")?,
        value_head_dim: t.positive("linear_value_head_dim")?,
        v_per_k: n_v_heads / n_k_heads,
        conv_kernel: t.positive("linear_conv_kernel_dim")?,
    };

    let num_experts = t.positive("num_experts")?;
    let experts_per_token = t.positive("num_experts_per_tok")?;
    if experts_per_token > num_experts {
        return Err(t.invalid(
            "num_experts_per_tok",
            format!("{experts_per_token} exceeds num_experts {num_experts}"),
        ));
    }
    if num_experts > u16::MAX as usize {
        return Err(t.invalid(
            "num_experts",
            format!("{num_experts} exceeds the supported maximum {}", u16::MAX),
        ));
    }

    // The nested form keeps eos ids at either level; prefer the text model's.
    let eos_token_ids = match t.opt_ids("eos_token_id")? {
        Some(ids) => ids,
        None => top.opt_ids("eos_token_id")?.unwrap_or_default(),
    };
    let vocab_size = t.positive("vocab_size")?;
    if let Some(bad) = eos_token_ids.iter().find(|&&id| id as usize >= vocab_size) {
        return Err(t.invalid(
            "eos_token_id",
            format!("id {bad} is outside vocab_size {vocab_size}"),
        ));
    }

    Ok(TextConfig {
        hidden_size,
        num_layers,
        layer_types,
        attention: AttentionLayout {
            n_q_heads,
            n_kv_heads,
            head_dim,
            q_per_kv: n_q_heads / n_kv_heads,
            rotary_dims,
        },
        partial_rotary_factor,
        rope_theta,
        max_position_embeddings: t.positive("max_position_embeddings")?,
        rms_norm_eps,
        delta_net,
        num_experts,
        experts_per_token,
        moe_intermediate_size: t.positive("moe_intermediate_size")?,
        shared_expert_intermediate_size: t.positive("shared_expert_intermediate_size")?,
        vocab_size,
        eos_token_ids,
    })
}

/// `layer_types` is authoritative when present; otherwise transformers synthesises it from
/// `full_attention_interval`: layer i is full attention iff (i + 1) % interval == 0.
fn parse_layer_types(t: &Fields<'_>, num_layers: usize) -> Result<Vec<LayerType>, ConfigError> {
    let types = match t.opt_array("layer_types")? {
        Some(list) => {
            if list.len() != num_layers {
                return Err(t.invalid(
                    "layer_types",
                    format!(
                        "has {} entries but num_hidden_layers is {num_layers}",
                        list.len()
                    ),
                ));
            }
            list.iter()
                .enumerate()
                .map(|(i, v)| match v.as_str() {
                    Some("linear_attention") => Ok(LayerType::LinearAttention),
                    Some("full_attention") => Ok(LayerType::FullAttention),
                    _ => Err(ConfigError::Invalid {
                        field: format!("{}[{i}]", t.path("layer_types")),
                        reason: format!(
                            "{} is not \"linear_attention\" or \"full_attention\"",
                            abbreviate(v)
                        ),
                    }),
                })
                .collect::<Result<Vec<_>, _>>()?
        }
        None => {
            let interval = t.positive("full_attention_interval").map_err(|e| match e {
                ConfigError::Missing { .. } => ConfigError::Missing {
                    field: format!(
                        "{} (or {})",
                        t.path("layer_types"),
                        t.path("full_attention_interval")
                    ),
                },
                other => other,
            })?;
            (0..num_layers)
                .map(|i| {
                    if (i + 1) % interval == 0 {
                        LayerType::FullAttention
                    } else {
                        LayerType::LinearAttention
                    }
                })
                .collect()
        }
    };
    Ok(types)
}

/// A JSON object plus its dotted path, so every error names the full field.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    prefix: String,
}

impl<'a> Fields<'a> {
    fn path(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.prefix)
        }
    }
    fn invalid(&self, key: &str, reason: String) -> ConfigError {
        ConfigError::Invalid {
            field: self.path(key),
            reason,
        }
    }
    fn has(&self, key: &str) -> bool {
        self.map.get(key).is_some_and(|v| !v.is_null())
    }
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }
    fn wrong(&self, key: &str, expected: &'static str, v: &Value) -> ConfigError {
        ConfigError::WrongType {
            field: self.path(key),
            expected,
            found: abbreviate(v),
        }
    }
    fn missing(&self, key: &str) -> ConfigError {
        ConfigError::Missing {
            field: self.path(key),
        }
    }
    fn string(&self, key: &str) -> Result<String, ConfigError> {
        self.opt_string(key)?.ok_or_else(|| self.missing(key))
    }
    fn opt_string(&self, key: &str) -> Result<Option<String>, ConfigError> {
        self.get(key)
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| self.wrong(key, "a string", v))
            })
            .transpose()
    }
    fn opt_bool(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        self.get(key)
            .map(|v| v.as_bool().ok_or_else(|| self.wrong(key, "a boolean", v)))
            .transpose()
    }
    fn opt_array(&self, key: &str) -> Result<Option<&'a Vec<Value>>, ConfigError> {
        self.get(key)
            .map(|v| v.as_array().ok_or_else(|| self.wrong(key, "an array", v)))
            .transpose()
    }
    fn object(&self, key: &str) -> Result<Fields<'a>, ConfigError> {
        self.opt_object(key)?.ok_or_else(|| self.missing(key))
    }
    fn opt_object(&self, key: &str) -> Result<Option<Fields<'a>>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(Fields {
                map,
                prefix: self.path(key),
            })),
            Some(v) => Err(self.wrong(key, "an object", v)),
        }
    }
    fn opt_f64(&self, key: &str) -> Result<Option<f64>, ConfigError> {
        self.get(key)
            .map(|v| v.as_f64().ok_or_else(|| self.wrong(key, "a number", v)))
            .transpose()
    }
    fn f64(&self, key: &str) -> Result<f64, ConfigError> {
        self.opt_f64(key)?.ok_or_else(|| self.missing(key))
    }
    fn positive(&self, key: &str) -> Result<usize, ConfigError> {
        let v = self.get(key).ok_or_else(|| self.missing(key))?;
        let n = v
            .as_u64()
            .ok_or_else(|| self.wrong(key, "a non-negative integer", v))?;
        if n == 0 {
            return Err(self.invalid(key, "must be at least 1".into()));
        }
        // Cap every dimension so products of a few of them cannot overflow u64.
        if n > 1 << 24 {
            return Err(self.invalid(
                key,
                format!("{n} exceeds the supported maximum {}", 1u64 << 24),
            ));
        }
        Ok(n as usize)
    }
    fn opt_ids(&self, key: &str) -> Result<Option<Vec<u32>>, ConfigError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let one = |x: &Value| x.as_u64().and_then(|n| u32::try_from(n).ok());
        let ids = match v {
            Value::Array(items) => items.iter().map(one).collect::<Option<Vec<_>>>(),
            other => one(other).map(|id| vec![id]),
        };
        ids.map(Some)
            .ok_or_else(|| self.wrong(key, "a token id or a list of token ids", v))
    }
}

fn abbreviate(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 40 {
        format!("{}…", s.chars().take(40).collect::<String>())
    } else {
        s
    }
}

#[cfg(test)]
mod tests;
