//! The tokenizer of a `qwen35moe` GGUF as the Hugging Face `tokenizer.json` it was converted
//! from: llama.cpp keeps the byte-level BPE vocabulary (`tokenizer.ggml.tokens`, with a type per
//! token), the merges and the name of the pre-tokenizer; this rebuilds the JSON that `tokenizers`
//! loads. Pure: over a parsed [`Gguf`].
//!
//! Token types (llama.cpp's `llama_token_type`): 1 normal (the BPE vocabulary), 3 control
//! (an added special token), 4 user-defined (an added token that is not special), 5 unused
//! (the `[PADn]` rows llama.cpp writes for ids the tokenizer does not have; left out).

use super::experts::short;
use super::{Gguf, GgufError, Value};
use serde_json::{Map, Value as Json, json};

/// The Qwen3.5/3.6 pre-tokenizer split, as its `tokenizer.json` has it (llama.cpp's `qwen35`
/// pre-tokenizer is the same expression with the case-insensitive group spelled out).
pub const QWEN35_SPLIT: &str = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

fn bad(key: &str, why: impl Into<String>) -> GgufError {
    GgufError::Metadata {
        key: key.to_string(),
        why: why.into(),
    }
}

fn strings<'a>(g: &'a Gguf, key: &str) -> Result<Vec<&'a str>, GgufError> {
    match g.get(key) {
        Some(Value::Array(_, items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str()
                    .ok_or_else(|| bad(key, format!("element {i} is {}, not a string", short(v))))
            })
            .collect(),
        Some(v) => Err(bad(
            key,
            format!("is {}, not an array of strings", short(v)),
        )),
        None => Err(bad(key, "missing")),
    }
}

/// The `tokenizer.json` (as JSON) that `g`'s `tokenizer.ggml.*` metadata stands for. Only
/// llama.cpp's `gpt2` model with the `qwen35` pre-tokenizer is rebuilt; other tokenizers are
/// refused by name.
pub fn tokenizer_json(g: &Gguf) -> Result<Json, GgufError> {
    let text = |k: &str| g.get(k).and_then(Value::as_str);
    match text("tokenizer.ggml.model") {
        Some("gpt2") => {}
        other => {
            return Err(bad(
                "tokenizer.ggml.model",
                format!("is {other:?}; only \"gpt2\" (byte-level BPE) is supported"),
            ));
        }
    }
    match text("tokenizer.ggml.pre") {
        Some("qwen35") => {}
        other => {
            return Err(bad(
                "tokenizer.ggml.pre",
                format!("is {other:?}; only \"qwen35\" (Qwen3.5/3.6) is supported"),
            ));
        }
    }
    let tokens = strings(g, "tokenizer.ggml.tokens")?;
    let types: Vec<i64> = match g.get("tokenizer.ggml.token_type") {
        Some(Value::Array(_, items)) if items.len() == tokens.len() => items
            .iter()
            .map(|v| match v {
                Value::I32(t) => Ok(i64::from(*t)),
                other => Err(bad(
                    "tokenizer.ggml.token_type",
                    format!("holds {}, expected INT32", short(other)),
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(v) => {
            return Err(bad(
                "tokenizer.ggml.token_type",
                format!("is {}: expected {} INT32 values", short(v), tokens.len()),
            ));
        }
        None => return Err(bad("tokenizer.ggml.token_type", "missing")),
    };
    let merges = strings(g, "tokenizer.ggml.merges")?;
    let mut vocab = Map::new();
    let mut added = Vec::new();
    for (id, (&token, &ty)) in tokens.iter().zip(&types).enumerate() {
        match ty {
            1 => {
                if vocab.insert(token.to_string(), json!(id)).is_some() {
                    return Err(bad(
                        "tokenizer.ggml.tokens",
                        format!(
                            "token {} appears twice (again at id {id})",
                            short(&Value::String(token.into()))
                        ),
                    ));
                }
            }
            3 | 4 => added.push(json!({
                "id": id, "content": token, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": ty == 3,
            })),
            5 => {}
            other => {
                return Err(bad(
                    "tokenizer.ggml.token_type",
                    format!("id {id} has type {other}; expected 1, 3, 4 or 5"),
                ));
            }
        }
    }
    let byte_level = json!({
        "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false,
    });
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": { "type": "NFC" },
        "pre_tokenizer": { "type": "Sequence", "pretokenizers": [
            { "type": "Split", "pattern": { "Regex": QWEN35_SPLIT }, "behavior": "Isolated", "invert": false },
            byte_level,
        ]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            // [I] The file does not record it; Qwen's tokenizer.json sets it, and the test
            // against the checkpoint's tokenizer holds it to that.
            "ignore_merges": true,
            "vocab": vocab,
            "merges": merges,
        },
    }))
}
