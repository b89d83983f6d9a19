//! Qwen3.6 text tokenizer: a thin wrapper over Hugging Face `tokenizers` plus a byte-exact incremental decoder.
//!
//! The model's `tokenizer.json` (docs/model.md §7.2: NFC normaliser, regex split + ByteLevel pre-tokenizer, byte-level BPE
//! with `ignore_merges`, 33 added special tokens) does all the encoding work. On top of it this module adds
//! typed errors naming the file or id that failed, looks up the chat-control tokens by their text, and
//! provides [`IncrementalDecoder`], which turns a stream of generated ids into text without ever splitting a
//! multi-byte UTF-8 character across chunks.
//!
//! Special tokens are matched as whole strings anywhere in the input (they are never produced by BPE), no
//! BOS/EOS is inserted, and decoding renders special tokens as their text, so `decode(encode(s)) == s` for
//! every NFC string `s`. Non-NFC input round-trips to its NFC form (the normaliser runs before BPE).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokenizers::DecoderWrapper;

/// Text of the end-of-turn token (stop token; id 248046 in Qwen3.6).
pub const IM_END: &str = "<|im_end|>";
/// Text of the end-of-document token (stop token; id 248044 in Qwen3.6).
pub const ENDOFTEXT: &str = "<|endoftext|>";
/// Text of the token that opens a reasoning block (id 248068 in Qwen3.6).
pub const THINK: &str = "<think>";
/// Text of the token that closes a reasoning block (id 248069 in Qwen3.6).
pub const THINK_END: &str = "</think>";

/// Errors from loading a tokenizer or converting between text and ids.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The model directory itself is missing or not a directory.
    #[error("model directory {dir}: {message}")]
    ModelDir {
        /// The directory given as the model.
        dir: PathBuf,
        /// Why it is unusable (does not exist, not a directory).
        message: String,
    },
    /// The `tokenizer.json` could not be read or parsed.
    #[error("cannot load tokenizer {path}: {error}")]
    Load {
        /// The file that failed to load.
        path: PathBuf,
        /// The underlying I/O or parse error (part of the message, not a `source()`, so chain printers
        /// do not repeat it).
        error: tokenizers::Error,
    },
    /// The tokenizer's decoder is not `ByteLevel`, so token ids cannot be mapped to raw bytes.
    #[error("tokenizer {path}: decoder must be ByteLevel (byte-level BPE), found {found}")]
    UnsupportedDecoder {
        /// The tokenizer file.
        path: PathBuf,
        /// A short description of the decoder that was found.
        found: String,
    },
    /// Encoding a text failed inside `tokenizers`.
    #[error("tokenizer {path}: encoding failed: {error}")]
    Encode {
        /// The tokenizer file.
        path: PathBuf,
        /// The underlying error (part of the message).
        error: tokenizers::Error,
    },
    /// Decoding failed inside `tokenizers`.
    #[error("tokenizer {path}: decoding failed: {error}")]
    Decode {
        /// The tokenizer file.
        path: PathBuf,
        /// The underlying error (part of the message).
        error: tokenizers::Error,
    },
    /// An id that is not in the vocabulary was passed to a decoder.
    #[error("tokenizer {path}: unknown token id {id} (vocabulary has {vocab_size} ids)")]
    UnknownId {
        /// The tokenizer file.
        path: PathBuf,
        /// The offending id.
        id: u32,
        /// Number of ids in the vocabulary (largest id + 1).
        vocab_size: usize,
    },
    /// A required control token (e.g. `<|im_end|>`) is not in the vocabulary.
    #[error("tokenizer {path} has no token {token:?}")]
    MissingToken {
        /// The tokenizer file.
        path: PathBuf,
        /// The text of the missing token.
        token: String,
    },
}

/// Convenience alias for results of this module.
pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;

/// The ids of the chat-control tokens, looked up by their text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecialIds {
    /// `<|im_end|>`: ends a chat turn; generation stops on it.
    pub im_end: u32,
    /// `<|endoftext|>`: end of document; generation stops on it.
    pub endoftext: u32,
    /// `<think>`: opens a reasoning block.
    pub think: u32,
    /// `</think>`: closes a reasoning block.
    pub think_end: u32,
}

/// Raw bytes of every id, exactly as the `ByteLevel` decoder maps them (flat storage).
#[derive(Debug)]
struct TokenBytes {
    /// Concatenated bytes of all tokens.
    data: Vec<u8>,
    /// `(start, len)` into `data` per id; `None` for ids absent from a sparse vocabulary.
    spans: Vec<Option<(u32, u32)>>,
}

impl TokenBytes {
    fn get(&self, id: u32) -> Option<&[u8]> {
        let (start, len) = (*self.spans.get(id as usize)?)?;
        self.data.get(start as usize..(start + len) as usize)
    }
}

/// A loaded `tokenizer.json` (byte-level BPE with added special tokens).
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    bytes: Arc<TokenBytes>,
    /// Ids of the added tokens the file flags `special: true`, sorted.
    special: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("path", &self.path)
            .field("vocab_size", &self.vocab_size())
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Load a `tokenizer.json` file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let inner =
            tokenizers::Tokenizer::from_file(&path).map_err(|error| TokenizerError::Load {
                path: path.clone(),
                error,
            })?;
        Self::from_inner(inner, path)
    }

    /// The tokenizer a `qwen35moe` GGUF file's metadata describes (`shared::gguf::tokenizer_json`
    /// rebuilds its `tokenizer.json`); errors name the file and the key.
    pub fn from_gguf(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let load = |error: tokenizers::Error| TokenizerError::Load {
            path: path.clone(),
            error,
        };
        let file = shared::gguf::GgufFile::open(&path).map_err(|e| load(e.into()))?;
        let json = shared::gguf::tokenizer_json(&file.gguf).map_err(|e| load(e.into()))?;
        let inner: tokenizers::Tokenizer = json.to_string().parse().map_err(load)?;
        Self::from_inner(inner, path)
    }

    fn from_inner(inner: tokenizers::Tokenizer, path: PathBuf) -> Result<Self> {
        match inner.get_decoder() {
            Some(DecoderWrapper::ByteLevel(_)) => {}
            other => {
                let found = match other {
                    None => "no decoder".to_string(),
                    Some(d) => serde_json::to_string(d)
                        .unwrap_or_else(|_| "an unknown decoder".to_string()),
                };
                return Err(TokenizerError::UnsupportedDecoder { path, found });
            }
        }
        let bytes = Arc::new(build_token_bytes(&inner));
        let mut special: Vec<u32> = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        special.sort_unstable();
        Ok(Self {
            inner,
            path,
            bytes,
            special,
        })
    }

    /// Load `DIR/tokenizer.json` from a model directory.
    pub fn from_model_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        // Say so when the directory itself is wrong, not that its tokenizer.json is missing.
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(TokenizerError::ModelDir {
                    dir: dir.to_path_buf(),
                    message: "not a directory".into(),
                });
            }
            Err(e) => {
                return Err(TokenizerError::ModelDir {
                    dir: dir.to_path_buf(),
                    message: e.to_string(),
                });
            }
        }
        Self::from_file(dir.join("tokenizer.json"))
    }

    /// The file this tokenizer was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Encode text to ids: special tokens are matched as whole strings, the rest is NFC-normalised and
    /// BPE-encoded; no BOS/EOS is added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|error| TokenizerError::Encode {
                path: self.path.clone(),
                error,
            })?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decode ids to text; special tokens are rendered as their text. Byte sequences that are not valid
    /// UTF-8 (e.g. a truncated multi-byte character) become U+FFFD. Unknown ids are an error.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        if let Some(&id) = ids.iter().find(|&&id| self.bytes.get(id).is_none()) {
            return Err(self.unknown_id(id));
        }
        self.inner
            .decode(ids, false)
            .map_err(|error| TokenizerError::Decode {
                path: self.path.clone(),
                error,
            })
    }

    /// The id of a token given its exact text (a special token or a byte-level vocabulary string).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Whether `tokenizer.json` flags the id as a special added token (what vLLM's
    /// `skip_special_tokens` drops from output text).
    pub fn is_special(&self, id: u32) -> bool {
        self.special.binary_search(&id).is_ok()
    }

    /// The ids [`Tokenizer::is_special`] accepts, sorted.
    pub fn flagged_special_ids(&self) -> &[u32] {
        &self.special
    }

    /// The raw bytes an id decodes to, or `None` for an unknown id.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.bytes.get(id)
    }

    /// `mask[id]` is true for every id below [`Tokenizer::vocab_size`] that decodes to
    /// something: the ids a sampler may choose. Gaps in the id space (a truncated synthetic
    /// vocabulary with specials at their real ids) and padding rows are excluded.
    pub fn defined_ids_mask(&self) -> Vec<bool> {
        (0..self.vocab_size() as u32)
            .map(|id| self.token_bytes(id).is_some())
            .collect()
    }

    /// Number of token ids (largest id + 1, special tokens included): 248,077 for Qwen3.6. The model's
    /// embedding has more rows (248,320); the extra rows are padding no tokenizer id maps to.
    pub fn vocab_size(&self) -> usize {
        self.bytes.spans.len()
    }

    /// Look up a required token by text, failing with [`TokenizerError::MissingToken`].
    pub fn require_token(&self, token: &str) -> Result<u32> {
        self.token_id(token)
            .ok_or_else(|| TokenizerError::MissingToken {
                path: self.path.clone(),
                token: token.to_string(),
            })
    }

    /// Id of `<|im_end|>` (end of turn).
    pub fn im_end_id(&self) -> Result<u32> {
        self.require_token(IM_END)
    }

    /// Id of `<|endoftext|>` (end of document).
    pub fn endoftext_id(&self) -> Result<u32> {
        self.require_token(ENDOFTEXT)
    }

    /// Id of `<think>`.
    pub fn think_id(&self) -> Result<u32> {
        self.require_token(THINK)
    }

    /// Id of `</think>`.
    pub fn think_end_id(&self) -> Result<u32> {
        self.require_token(THINK_END)
    }

    /// All four chat-control ids at once; fails on the first one that is missing.
    pub fn special_ids(&self) -> Result<SpecialIds> {
        Ok(SpecialIds {
            im_end: self.im_end_id()?,
            endoftext: self.endoftext_id()?,
            think: self.think_id()?,
            think_end: self.think_end_id()?,
        })
    }

    /// Ids of the added tokens marked special (`<|im_end|>`, `<think>`, `<tool_call>`, …),
    /// sorted: text never encodes to them by BPE, only by their exact spelling.
    pub fn special_token_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self
            .inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// A fresh streaming decoder over this tokenizer's vocabulary (it shares the byte table, so it is
    /// `'static` and can live in per-request state).
    pub fn incremental_decoder(&self) -> IncrementalDecoder {
        IncrementalDecoder {
            bytes: Arc::clone(&self.bytes),
            path: self.path.clone(),
            pending: Vec::new(),
        }
    }

    fn unknown_id(&self, id: u32) -> TokenizerError {
        TokenizerError::UnknownId {
            path: self.path.clone(),
            id,
            vocab_size: self.vocab_size(),
        }
    }
}

/// Streaming detokenizer: feed ids one at a time, get text whenever it ends on a complete UTF-8 boundary.
///
/// The concatenation of everything returned by [`push`](Self::push) and [`finish`](Self::finish) equals
/// [`Tokenizer::decode`] of all pushed ids, including the U+FFFD substitutions for invalid byte sequences;
/// a character whose bytes span several tokens is emitted once, whole, with the token that completes it.
#[derive(Debug)]
pub struct IncrementalDecoder {
    bytes: Arc<TokenBytes>,
    path: PathBuf,
    /// Bytes received but not yet emitted: at most an incomplete UTF-8 sequence (≤ 3 bytes) between calls.
    pending: Vec<u8>,
}

impl IncrementalDecoder {
    /// Add one id; returns the newly completed text, or `None` if nothing is complete yet.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        let bytes = self
            .bytes
            .get(id)
            .ok_or_else(|| TokenizerError::UnknownId {
                path: self.path.clone(),
                id,
                vocab_size: self.bytes.spans.len(),
            })?;
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(
                        &self.pending[start..start + valid],
                    ));
                    start += valid;
                    match e.error_len() {
                        // An invalid sequence: replaced exactly like `String::from_utf8_lossy` does.
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start += n;
                        }
                        // An incomplete sequence at the end: wait for more bytes.
                        None => break,
                    }
                }
            }
        }
        self.pending.drain(..start);
        Ok((!out.is_empty()).then_some(out))
    }

    /// Flush what is left (an incomplete trailing sequence becomes U+FFFD) and reset the decoder.
    pub fn finish(&mut self) -> Option<String> {
        if self.pending.is_empty() {
            return None;
        }
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        Some(out)
    }

    /// Whether bytes of an unfinished character are being held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }
}

/// GPT-2's printable-character table inverted: unicode char -> byte (what `ByteLevel` decoding uses).
fn unicode_to_bytes() -> std::collections::HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut map = std::collections::HashMap::with_capacity(256);
    let mut n = 0u32;
    for b in 0..=255u8 {
        let c = if printable(b) {
            char::from(b)
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap_or(char::REPLACEMENT_CHARACTER)
        };
        map.insert(c, b);
    }
    map
}

/// Bytes of every id, mirroring `tokenizers`' ByteLevel decoder: each char of the token string maps back to
/// its byte; a token containing any char outside the table (e.g. an added token) contributes its UTF-8 text.
fn build_token_bytes(tok: &tokenizers::Tokenizer) -> TokenBytes {
    let table = unicode_to_bytes();
    let vocab = tok.get_vocab(true);
    let n_ids = vocab.values().map(|&id| id as usize + 1).max().unwrap_or(0);
    let mut by_id: Vec<Option<&str>> = vec![None; n_ids];
    for (token, &id) in &vocab {
        by_id[id as usize] = Some(token.as_str());
    }
    // Added tokens may shadow a model token of the same id; decoding prefers the added token's text.
    let added = tok.get_added_tokens_decoder();
    for (&id, token) in &added {
        if let Some(slot) = by_id.get_mut(id as usize) {
            *slot = Some(token.content.as_str());
        }
    }
    let mut data = Vec::with_capacity(n_ids * 8);
    let mut spans = Vec::with_capacity(n_ids);
    for token in by_id {
        let Some(token) = token else {
            spans.push(None);
            continue;
        };
        let start = data.len();
        let mapped: Option<Vec<u8>> = token.chars().map(|c| table.get(&c).copied()).collect();
        match mapped {
            Some(b) => data.extend_from_slice(&b),
            None => data.extend_from_slice(token.as_bytes()),
        }
        spans.push(Some((start as u32, (data.len() - start) as u32)));
    }
    TokenBytes { data, spans }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_is_gpt2() {
        let t = unicode_to_bytes();
        assert_eq!(t.len(), 256);
        assert_eq!(t[&'Ġ'], b' ');
        assert_eq!(t[&'Ċ'], b'\n');
        assert_eq!(t[&'!'], b'!');
        assert_eq!(t[&'Ā'], 0);
        assert_eq!(t[&'ÿ'], 0xFF);
    }

    #[test]
    fn missing_file_names_the_path() {
        let err = Tokenizer::from_file("/nonexistent/tokenizer.json").unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/tokenizer.json"),
            "{err}"
        );
    }
}
