//! The synthetic checkpoint's `tokenizer.json`: the committed truncated Qwen3.6 vocabulary
//! (BPE ranks 0..999, specials at 1000..1032), its specials renumbered to the real ids
//! 248044..248076 for the real-vocabulary preset (ids 1000..248043 then decode to nothing: they
//! are absent from the truncated vocabulary), or a user-supplied real `tokenizer.json`. The
//! written file is checked with the runtime's tokenizer, which the caller supplies
//! ([`RuntimeTokenizer`]): this crate cannot use hostd's, since hostd depends on it.

use super::SynthError;
use super::preset::{ASSET_RANKS, Dims, ENDOFTEXT, IM_END, IM_START, N_SPECIALS};
use serde_json::Value;
use std::path::Path;

/// `tests/oracle/build_tokenizer.py --ranks 1000`: BPE ranks 0..999 + the 33 specials at 1000..1032.
pub const ASSET: &str = include_str!("../../assets/qwen36-ranks-1000.tokenizer.json");

/// `<|im_end|>` (what hostd's tokenizer calls `IM_END`).
const IM_END_TEXT: &str = "<|im_end|>";
/// `<|endoftext|>` (what hostd's tokenizer calls `ENDOFTEXT`).
const ENDOFTEXT_TEXT: &str = "<|endoftext|>";

/// The runtime tokenizer, as far as [`verify`] needs it: `hostd synth` implements it for
/// `hostd::tokenizer::Tokenizer`, so a written `tokenizer.json` is checked by the code that
/// will load it.
pub trait RuntimeTokenizer {
    /// Encodes `text` as the runtime does: specials matched as whole strings, no BOS/EOS.
    fn encode(&self, text: &str) -> Result<Vec<u32>, String>;
    /// Number of token ids (largest id + 1, specials included).
    fn vocab_size(&self) -> usize;
}

/// Loads a `tokenizer.json` with the runtime tokenizer; the error is the loader's message.
pub type LoadTokenizer = fn(&Path) -> Result<Box<dyn RuntimeTokenizer>, String>;

/// Where the written `tokenizer.json` comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenizerSource {
    /// The committed asset (renumbered when the preset's specials are not at 1000).
    Asset,
    /// A real Qwen3.6 `tokenizer.json` copied verbatim (real-vocabulary preset only).
    File(std::path::PathBuf),
}

fn parse(text: &str, source: &str) -> Result<Value, SynthError> {
    serde_json::from_str(text)
        .map_err(|e| SynthError::Tokenizer(format!("{source}: not JSON: {e}")))
}

fn added_tokens<'a>(v: &'a Value, source: &str) -> Result<&'a Vec<Value>, SynthError> {
    v.get("added_tokens")
        .and_then(Value::as_array)
        .ok_or_else(|| SynthError::Tokenizer(format!("{source}: no added_tokens array")))
}

/// The 33 special-token strings in id order (from the asset).
pub fn special_tokens() -> Result<Vec<String>, SynthError> {
    let v = parse(ASSET, "tokenizer asset")?;
    let mut specials: Vec<(u64, String)> = added_tokens(&v, "tokenizer asset")?
        .iter()
        .filter_map(|t| {
            Some((
                t.get("id")?.as_u64()?,
                t.get("content")?.as_str()?.to_string(),
            ))
        })
        .collect();
    specials.sort();
    let ids: Vec<u64> = specials.iter().map(|(id, _)| *id).collect();
    let want: Vec<u64> = (0..u64::from(N_SPECIALS))
        .map(|k| u64::from(ASSET_RANKS) + k)
        .collect();
    if ids != want {
        return Err(SynthError::Tokenizer(format!(
            "tokenizer asset: specials at {ids:?}, expected {want:?}"
        )));
    }
    Ok(specials.into_iter().map(|(_, s)| s).collect())
}

/// The asset with its specials moved to `dims.bpe_ranks..+33` (the asset as is when they
/// already are there).
pub fn asset_for(dims: &Dims) -> Result<String, SynthError> {
    if dims.bpe_ranks == ASSET_RANKS {
        return Ok(ASSET.to_string());
    }
    let mut v = parse(ASSET, "tokenizer asset")?;
    let shift = u64::from(dims.bpe_ranks - ASSET_RANKS);
    let bad = |what: &str| SynthError::Tokenizer(format!("tokenizer asset: {what}"));
    let tokens = v
        .get_mut("added_tokens")
        .and_then(Value::as_array_mut)
        .ok_or_else(|| bad("no added_tokens array"))?;
    let mut moved = Vec::with_capacity(tokens.len());
    for t in tokens {
        let id = t
            .get("id")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad("an added token has no id"))?;
        let content = t
            .get("content")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("an added token has no content"))?;
        moved.push((content.to_string(), id + shift));
        t["id"] = Value::from(id + shift);
    }
    // `tokenizers` ignores an added token's `id` unless the model vocabulary holds the token:
    // otherwise it numbers added tokens from the model's vocabulary size (1000 here). Entering the
    // specials in the BPE vocabulary at their ids pins them; BPE never produces them because
    // added tokens are split out of the text before the model runs.
    let vocab = v
        .get_mut("model")
        .and_then(|m| m.get_mut("vocab"))
        .and_then(Value::as_object_mut)
        .ok_or_else(|| bad("no model.vocab object"))?;
    for (content, id) in moved {
        vocab.insert(content, Value::from(id));
    }
    serde_json::to_string(&v).map_err(|e| SynthError::Internal(e.to_string()))
}

/// Checks that a user-supplied `tokenizer.json` has the Qwen3.6 specials at their real ids
/// (`dims.bpe_ranks + k`) and returns its text.
pub fn read_external(path: &Path, dims: &Dims) -> Result<String, SynthError> {
    let source = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| SynthError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let v = parse(&text, &source)?;
    let have: std::collections::HashMap<&str, u64> = added_tokens(&v, &source)?
        .iter()
        .filter_map(|t| Some((t.get("content")?.as_str()?, t.get("id")?.as_u64()?)))
        .collect();
    for (s, k) in special_tokens()?.iter().zip(0u32..) {
        let want = u64::from(dims.special_id(k));
        match have.get(s.as_str()) {
            Some(&id) if id == want => {}
            Some(&id) => {
                return Err(SynthError::Tokenizer(format!(
                    "{source}: special {s} has id {id}, expected {want}"
                )));
            }
            None => {
                return Err(SynthError::Tokenizer(format!(
                    "{source}: special {s} (id {want}) is missing"
                )));
            }
        }
    }
    Ok(text)
}

/// Loads a written `tokenizer.json` with the runtime's tokenizer (`load`) and checks the
/// chat-control ids and that every id fits in the embedding.
pub fn verify(path: &Path, dims: &Dims, load: LoadTokenizer) -> Result<(), SynthError> {
    let tok = load(path).map_err(SynthError::Tokenizer)?;
    let checks = [
        ("<|im_start|>", IM_START),
        (IM_END_TEXT, IM_END),
        (ENDOFTEXT_TEXT, ENDOFTEXT),
    ];
    for (text, k) in checks {
        let ids = tok.encode(text).map_err(SynthError::Tokenizer)?;
        let want = dims.special_id(k);
        if ids != [want] {
            return Err(SynthError::Tokenizer(format!(
                "{}: {text} encodes to {ids:?}, expected [{want}]",
                path.display()
            )));
        }
    }
    if tok.vocab_size() > dims.vocab_size {
        return Err(SynthError::Tokenizer(format!(
            "{}: ids reach {} but the embedding has {} rows",
            path.display(),
            tok.vocab_size(),
            dims.vocab_size
        )));
    }
    Ok(())
}
