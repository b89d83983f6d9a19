//! Where a prompt's prefill blocks end besides the multiples of `prefill_chunk`, and at which of
//! those positions the prefix cache keeps a checkpoint.
//!
//! A resumed prompt gives the same logits as a full prefill of it bit for bit only when the full
//! prefill also ends a block where the checkpoint was taken (the DeltaNet layers' chunked form
//! depends on where a forward call starts). So the boundaries are a function of the prompt's
//! tokens alone, and of each prefix alone: a boundary at `p` depends only on `prompt[..p]`, so
//! two prompts that agree up to a checkpoint also agree on every boundary before it. They are:
//! - the end of the first message (`<|im_end|>\n`): the system prompt with the tool definitions,
//!   which every conversation of one agent repeats;
//! - the end of every assistant header (`<|im_start|>assistant\n`): the point where a turn's
//!   prompt ends and the next turn's prompt diverges (the template drops the earlier turn's
//!   reasoning), so the last one is where a conversation's next turn resumes;
//! - every multiple of `every` tokens, so an edit in a long history re-prefills at most `every`
//!   tokens before it.
//!
//! A checkpoint is kept at the first-message end, the last assistant header and the multiples of
//! `every`; earlier assistant headers are only boundaries (their checkpoints were kept when those
//! turns ran), so a long history does not flood the cache with states nobody resumes from.

use crate::tokenizer::Tokenizer;

/// The token patterns of the chat template and the checkpoint interval.
#[derive(Debug, Clone, Default)]
pub(super) struct MarkRule {
    /// `<|im_end|>` then `\n`, when the vocabulary has them.
    message_end: Option<[u32; 2]>,
    /// `<|im_start|>assistant\n`, when the vocabulary has it.
    assistant_header: Option<Vec<u32>>,
    /// Checkpoint interval in tokens (0: none).
    every: usize,
}

/// A prompt's block boundaries and the ones to checkpoint (both ascending, inside the prompt:
/// at least one token after each).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Marks {
    /// Where prefill blocks must end.
    pub boundaries: Vec<usize>,
    /// The boundaries whose state the prefix cache keeps.
    pub checkpoints: Vec<usize>,
    /// The checkpoints also saved to disk, when a state directory is configured: the
    /// first-message end and the last assistant header (the ones a restarted server or another
    /// conversation resumes from; periodic checkpoints stay in memory).
    pub persist: Vec<usize>,
}

impl MarkRule {
    /// The rule for `tokenizer`'s chat template with a checkpoint every `every` tokens.
    pub(super) fn new(tokenizer: &Tokenizer, every: usize) -> MarkRule {
        let newline = tokenizer.encode("\n").ok().filter(|t| t.len() == 1);
        let im_start = tokenizer.token_id("<|im_start|>");
        let im_end = tokenizer.token_id("<|im_end|>");
        let assistant_header = match (im_start, tokenizer.encode("assistant\n")) {
            (Some(start), Ok(rest)) if !rest.is_empty() => {
                Some(std::iter::once(start).chain(rest).collect())
            }
            _ => None,
        };
        MarkRule {
            message_end: im_end.zip(newline).map(|(e, n)| [e, n[0]]),
            assistant_header,
            every,
        }
    }

    /// The marks of `prompt`.
    pub(super) fn marks(&self, prompt: &[u32]) -> Marks {
        let inside = |p: usize| p > 0 && p < prompt.len();
        let first_end = self.message_end.and_then(|pat| {
            prompt
                .windows(2)
                .position(|w| w == pat)
                .map(|i| i + 2)
                .filter(|&p| inside(p))
        });
        let headers: Vec<usize> = match &self.assistant_header {
            Some(pat) => prompt
                .windows(pat.len())
                .enumerate()
                .filter(|(_, w)| w == pat)
                .map(|(i, _)| i + pat.len())
                .filter(|&p| inside(p))
                .collect(),
            None => Vec::new(),
        };
        let periodic: Vec<usize> = if self.every == 0 {
            Vec::new()
        } else {
            (1..)
                .map(|k| k * self.every)
                .take_while(|&p| p < prompt.len())
                .collect()
        };
        let mut persist: Vec<usize> = first_end
            .into_iter()
            .chain(headers.last().copied())
            .collect();
        persist.sort_unstable();
        persist.dedup();
        let mut checkpoints: Vec<usize> = persist.iter().chain(&periodic).copied().collect();
        checkpoints.sort_unstable();
        checkpoints.dedup();
        let mut boundaries: Vec<usize> = checkpoints.iter().chain(&headers).copied().collect();
        boundaries.sort_unstable();
        boundaries.dedup();
        Marks {
            boundaries,
            checkpoints,
            persist,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const END: u32 = 902;
    const NL: u32 = 10;
    const START: u32 = 901;
    const ASSISTANT: u32 = 500;

    fn rule(every: usize) -> MarkRule {
        MarkRule {
            message_end: Some([END, NL]),
            assistant_header: Some(vec![START, ASSISTANT, NL]),
            every,
        }
    }

    /// system(3 tokens) / user / assistant answer / user / assistant header.
    fn conversation() -> Vec<u32> {
        let mut p = vec![START, 1, NL, 7, 7, 7, END, NL]; // system ends at 8
        p.extend([START, 2, NL, 8, 8, END, NL]); // user: 8..15
        p.extend([START, ASSISTANT, NL, 9, 9, 9, END, NL]); // header ends at 18
        p.extend([START, 2, NL, 8, END, NL]); // user: 23..29
        p.extend([START, ASSISTANT, NL, 3]); // header ends at 32
        p
    }

    #[test]
    fn boundaries_and_checkpoints_of_a_conversation() {
        let p = conversation();
        let m = rule(0).marks(&p);
        assert_eq!(m.boundaries, [8, 18, 32]);
        assert_eq!(
            m.checkpoints,
            [8, 32],
            "earlier headers are boundaries only"
        );
        let m = rule(10).marks(&p);
        assert_eq!(m.boundaries, [8, 10, 18, 20, 30, 32]);
        assert_eq!(m.checkpoints, [8, 10, 20, 30, 32]);
        assert_eq!(m.persist, [8, 32], "periodic checkpoints stay in memory");
    }

    #[test]
    fn marks_of_a_prefix_are_the_prompts_marks_before_its_end() {
        let p = conversation();
        let full = rule(10).marks(&p).boundaries;
        for n in 1..=p.len() {
            let before: Vec<usize> = full.iter().copied().filter(|&b| b < n).collect();
            assert_eq!(rule(10).marks(&p[..n]).boundaries, before, "prefix of {n}");
        }
    }

    #[test]
    fn a_mark_at_the_prompts_end_leaves_nothing_to_run_and_is_dropped() {
        let p = &conversation()[..32];
        assert_eq!(rule(0).marks(p).boundaries, [8, 18]);
        assert_eq!(
            rule(0).marks(p).checkpoints,
            [8, 18],
            "the last header inside is kept"
        );
        assert_eq!(MarkRule::default().marks(p), Marks::default());
    }

    #[test]
    fn the_rule_comes_from_the_tokenizer() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models/tiny");
        let tok = Tokenizer::from_model_dir(&dir).expect("tokenizer");
        let rule = MarkRule::new(&tok, 0);
        let text = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n\
                    <|im_start|>assistant\n<think>\n";
        let ids = tok.encode(text).expect("encode");
        let head = tok
            .encode("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
            .expect("encode");
        let first = tok
            .encode("<|im_start|>system\nbe brief<|im_end|>\n")
            .expect("encode");
        let m = rule.marks(&ids);
        assert_eq!(m.boundaries, [first.len(), head.len()]);
        assert_eq!(m.checkpoints, m.boundaries);
    }
}
