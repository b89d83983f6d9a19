//! The vocabulary as llguidance sees it: a `TokTrie` built from our tokenizer's byte table (not
//! from a second `tokenizers` load), with special tokens marked so grammars can name them
//! (`<tool_call>`, `</think>`) and the end-of-turn ids as the trie's EOS set.

use super::ConstraintError;
use crate::tokenizer::Tokenizer;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use std::sync::Arc;

/// Our tokenizer behind llguidance's `TokenizerEnv`: the trie answers what bytes each id
/// stands for; the tokenizer encodes the text a grammar forces.
struct VocabEnv {
    tokenizer: Arc<Tokenizer>,
    trie: TokTrie,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Valid UTF-8 goes through the real tokenizer (canonical ids); stray bytes fall back
        // to the trie's greedy match. An encoding failure (it has none for valid UTF-8) also
        // falls back, so forcing never panics.
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tokenizer
                .encode(text)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(text.as_bytes()))
        })
    }
}

/// The trie's token list: each id's raw bytes; special tokens get llguidance's marker byte
/// (0xFF, never valid UTF-8) before their text, so no text can spell them; ids the tokenizer
/// does not define (gaps in a truncated synthetic vocabulary) are empty, which the trie never
/// allows.
fn token_words(tokenizer: &Tokenizer) -> Vec<Vec<u8>> {
    let special = tokenizer.special_token_ids();
    (0..tokenizer.vocab_size() as u32)
        .map(|id| match tokenizer.token_bytes(id) {
            None => Vec::new(),
            Some(b) if special.binary_search(&id).is_ok() => {
                let mut w = Vec::with_capacity(b.len() + 1);
                w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                w.extend_from_slice(b);
                w
            }
            Some(b) => b.to_vec(),
        })
        .collect()
}

/// Builds the environment grammars compile against. `eos` are the ids that end a generation
/// (the first is the trie's primary EOS); `<|im_end|>` must exist.
pub(super) fn build(tokenizer: Arc<Tokenizer>, eos: &[u32]) -> Result<TokEnv, ConstraintError> {
    let err = |message: String| ConstraintError::Vocabulary { message };
    let im_end = tokenizer.im_end_id().map_err(|e| err(e.to_string()))?;
    let words = token_words(&tokenizer);
    let vocab_size = u32::try_from(words.len())
        .map_err(|_| err(format!("{} token ids do not fit in u32", words.len())))?;
    if let Some(&bad) = eos.iter().find(|&&id| id >= vocab_size) {
        return Err(err(format!(
            "end-of-generation id {bad} is outside the vocabulary ({vocab_size} ids)"
        )));
    }
    let mut ends = vec![im_end];
    ends.extend(eos.iter().copied().filter(|&id| id != im_end));
    let mut info = TokRxInfo::new(vocab_size, im_end);
    info.tok_end_of_turn = Some(im_end);
    let trie = TokTrie::from(&info, &words).with_eos_tokens(&ends);
    Ok(Arc::new(VocabEnv { tokenizer, trie }))
}
