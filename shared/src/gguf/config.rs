//! The model configuration of a `qwen35moe` GGUF: its metadata written as the bare
//! `qwen3_5_moe_text` `config.json` it stands for, then validated by the one config parser
//! (`crate::config::parse_config`), so a GGUF and a checkpoint are held to the same checks.
//! An error names the GGUF key that the failing config field came from.

use super::experts::short;
use super::{ARCHITECTURE, Gguf, GgufError, Value};
use crate::config::{ConfigError, ModelConfig, parse_config};
use serde_json::{Map, Value as Json, json};

/// Config fields derived from metadata (not copied from one key), and the key or tensor an
/// error in them is reported under.
const DERIVED: &[(&str, &str)] = &[
    ("partial_rotary_factor", "qwen35moe.rope.dimension_count"),
    ("linear_value_head_dim", "qwen35moe.ssm.inner_size"),
    ("num_hidden_layers", "qwen35moe.block_count"),
    ("layer_types", "qwen35moe.attention.recurrent_layers"),
    ("vocab_size", "tensor token_embd.weight"),
    ("eos_token_id", "tokenizer.ggml.eos_token_id"),
];

/// Each config field read from one metadata key (`{arch}.` prefixed), in the config's names.
const KEYS: &[(&str, &str)] = &[
    ("hidden_size", "embedding_length"),
    ("num_attention_heads", "attention.head_count"),
    ("num_key_value_heads", "attention.head_count_kv"),
    ("head_dim", "attention.key_length"),
    ("rope_theta", "rope.freq_base"),
    ("max_position_embeddings", "context_length"),
    ("rms_norm_eps", "attention.layer_norm_rms_epsilon"),
    ("linear_num_key_heads", "ssm.group_count"),
    ("linear_num_value_heads", "ssm.time_step_rank"),
    ("linear_key_head_dim", "ssm.state_size"),
    ("linear_conv_kernel_dim", "ssm.conv_kernel"),
    ("num_experts", "expert_count"),
    ("num_experts_per_tok", "expert_used_count"),
    ("moe_intermediate_size", "expert_feed_forward_length"),
    (
        "shared_expert_intermediate_size",
        "expert_shared_feed_forward_length",
    ),
];

fn key(k: &str) -> String {
    format!("{ARCHITECTURE}.{k}")
}

fn missing(k: &str) -> GgufError {
    GgufError::Metadata {
        key: k.to_string(),
        why: "missing (a qwen35moe GGUF states it)".into(),
    }
}

/// A metadata number as JSON: integers as integers; an f32 by its shortest decimal form (so
/// the `1e-6` that llama.cpp stored as an f32 reads back as 1e-6, not 9.99999997e-7).
fn number(g: &Gguf, k: &str) -> Result<Json, GgufError> {
    let v = g.get(k).ok_or_else(|| missing(k))?;
    if let Some(n) = v.as_u64() {
        return Ok(json!(n));
    }
    let f = match v {
        Value::F32(f) => format!("{f}").parse::<f64>().ok(),
        Value::F64(f) => Some(*f),
        _ => None,
    };
    f.filter(|f| f.is_finite())
        .map(|f| json!(f))
        .ok_or_else(|| GgufError::Metadata {
            key: k.to_string(),
            why: format!("is {}: expected a number", short(v)),
        })
}

fn int(g: &Gguf, k: &str) -> Result<u64, GgufError> {
    let v = g.get(k).ok_or_else(|| missing(k))?;
    v.as_u64().ok_or_else(|| GgufError::Metadata {
        key: k.to_string(),
        why: format!("is {}: expected a non-negative integer", short(v)),
    })
}

/// Rows of a 2-D tensor (`dims[1]`), e.g. the vocabulary of `token_embd.weight`.
fn rows_of(g: &Gguf, name: &str) -> Result<u64, GgufError> {
    let t = g.tensor(name).ok_or_else(|| GgufError::Tensor {
        tensor: name.to_string(),
        why: "missing".into(),
    })?;
    match t.dims[..] {
        [_, rows] => Ok(rows),
        _ => Err(GgufError::Tensor {
            tensor: name.to_string(),
            why: format!("shape {:?}, expected 2 dimensions", t.dims),
        }),
    }
}

/// The bare text `config.json` that `g`'s metadata stands for.
pub fn config_json(g: &Gguf) -> Result<Json, GgufError> {
    let experts = super::GgufExperts::locate(g)?;
    let mut c = Map::new();
    c.insert("model_type".into(), json!(crate::config::MODEL_TYPE_TEXT));
    for (field, k) in KEYS {
        c.insert((*field).into(), number(g, &key(k))?);
    }
    c.insert("num_hidden_layers".into(), json!(experts.n_layers));
    // Value heads: inner size over their count (llama.cpp's ssm.inner_size = v_dim · v_heads).
    let v_heads = int(g, &key("ssm.time_step_rank"))?;
    let inner = int(g, &key("ssm.inner_size"))?;
    if v_heads == 0 || !inner.is_multiple_of(v_heads) {
        return Err(GgufError::Metadata {
            key: key("ssm.inner_size"),
            why: format!("{inner} is not a multiple of ssm.time_step_rank {v_heads}"),
        });
    }
    c.insert("linear_value_head_dim".into(), json!(inner / v_heads));
    // [I] attention values have the key's head size: assert it rather than assume.
    let (kl, vl) = (key("attention.key_length"), key("attention.value_length"));
    if let Some(v) = g.get(&vl)
        && v.as_u64() != Some(int(g, &kl)?)
    {
        return Err(GgufError::Metadata {
            key: vl,
            why: format!(
                "is {}, but {kl} is {}: different key and value head sizes are not supported",
                short(v),
                int(g, &kl)?
            ),
        });
    }
    let rotary = int(g, &key("rope.dimension_count"))?;
    let head_dim = int(g, &kl)?;
    if rotary == 0 || head_dim == 0 {
        return Err(GgufError::Metadata {
            key: key("rope.dimension_count"),
            why: format!("{rotary} rotary dims of head size {head_dim}"),
        });
    }
    c.insert(
        "partial_rotary_factor".into(),
        json!(rotary as f64 / head_dim as f64),
    );
    // Layer types: llama.cpp's per-layer recurrent flags, else every `interval`-th is attention.
    let n = experts.n_layers;
    let types: Vec<&str> = match g.get(&key("attention.recurrent_layers")) {
        Some(Value::Array(_, flags)) if flags.len() >= n => flags[..n]
            .iter()
            .map(|f| match f {
                Value::Bool(true) => Ok("linear_attention"),
                Value::Bool(false) => Ok("full_attention"),
                other => Err(GgufError::Metadata {
                    key: key("attention.recurrent_layers"),
                    why: format!("holds {}, expected booleans", short(other)),
                }),
            })
            .collect::<Result<_, _>>()?,
        Some(v) => {
            return Err(GgufError::Metadata {
                key: key("attention.recurrent_layers"),
                why: format!("is {}: expected {n} booleans", short(v)),
            });
        }
        None => {
            let every = int(g, &key("full_attention_interval"))?;
            if every == 0 || every > n as u64 {
                return Err(GgufError::Metadata {
                    key: key("full_attention_interval"),
                    why: format!("is {every}: expected 1..={n} (the layer count)"),
                });
            }
            let every = every as usize;
            (0..n)
                .map(|i| {
                    if (i + 1) % every == 0 {
                        "full_attention"
                    } else {
                        "linear_attention"
                    }
                })
                .collect()
        }
    };
    c.insert("layer_types".into(), json!(types));
    let vocab = rows_of(g, "token_embd.weight")?;
    // No `output.weight`: the output projection is tied to the embedding (llama.cpp's rule).
    if g.tensor("output.weight").is_some() && rows_of(g, "output.weight")? != vocab {
        return Err(GgufError::Tensor {
            tensor: "output.weight".into(),
            why: format!("its rows differ from token_embd.weight's {vocab} (the vocabulary)"),
        });
    }
    c.insert("vocab_size".into(), json!(vocab));
    if let Some(eos) = g.get("tokenizer.ggml.eos_token_id").and_then(Value::as_u64) {
        c.insert("eos_token_id".into(), json!(eos));
    }
    Ok(Json::Object(c))
}

/// The validated configuration of `g`; an invalid value names the GGUF key it came from.
pub fn model_config(g: &Gguf) -> Result<ModelConfig, GgufError> {
    let json = config_json(g)?;
    parse_config(&json.to_string()).map_err(|e| {
        let field = match &e {
            ConfigError::Missing { field }
            | ConfigError::WrongType { field, .. }
            | ConfigError::Invalid { field, .. }
            | ConfigError::UnsupportedModelType { field, .. } => field.clone(),
            ConfigError::Json(_) => String::new(),
        };
        // The field itself, or the field followed by a note (` (or …)`).
        let names = |f: &str| {
            field == f
                || field
                    .strip_prefix(f)
                    .is_some_and(|rest| rest.starts_with(' '))
        };
        let from = KEYS
            .iter()
            .find(|(f, _)| names(f))
            .map(|(_, k)| key(k))
            .or_else(|| {
                DERIVED
                    .iter()
                    .find(|(f, _)| names(f))
                    .map(|(_, k)| (*k).to_string())
            })
            .unwrap_or_else(|| format!("the metadata ({field})"));
        GgufError::Metadata {
            key: from,
            why: e.to_string(),
        }
    })
}
