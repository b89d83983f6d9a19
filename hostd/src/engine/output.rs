//! Turns one sequence's generated ids into the text a client sees: incremental detokenisation,
//! the reasoning/content split at `</think>`, stop strings (never emitted, matched across token
//! boundaries) and the per-token log-probabilities that go with the released text.
//!
//! The reasoning block is recognised by token id, not by text: with thinking on, the generation
//! prompt already opened `<think>\n`, so output starts as reasoning until the `</think>` token;
//! with thinking off it starts as content. Leading newlines of the content (the template's
//! `</think>\n\n`) are dropped. A stop string cannot span the switch from reasoning to content.
//! Streaming and non-streaming replies are built from the same [`Delta`]s, so they agree.
//!
//! With `skip_special_tokens` (the default of both endpoints, as in vLLM) ids the tokenizer
//! flags special (`<|vision_end|>`, `<|im_start|>`, …) add no text; the tokens this module or a
//! client parses out of the text (`<think>`, `</think>`, `<tool_call>`, `</tool_call>`) are
//! kept. Their log-probability entries are still reported.

use crate::sampling::{StopMatcher, TokenLogprob};
use crate::tokenizer::{IncrementalDecoder, Tokenizer};

/// One alternative in a logprobs entry.
#[derive(Debug, Clone, PartialEq)]
pub struct TopLogprob {
    /// The token's text (lossy UTF-8 of its bytes).
    pub token: String,
    /// Natural-log probability.
    pub logprob: f32,
    /// The token's raw bytes.
    pub bytes: Vec<u8>,
}

/// One generated token's log-probability entry (OpenAI chat shape).
#[derive(Debug, Clone, PartialEq)]
pub struct LogprobEntry {
    /// The chosen token.
    pub token: TopLogprob,
    /// The most likely alternatives.
    pub top: Vec<TopLogprob>,
}

/// Newly released output of one sequence.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Delta {
    /// Text of the reasoning block.
    pub reasoning: String,
    /// Text of the answer.
    pub content: String,
    /// Entries of the tokens whose text was released (chat logprobs).
    pub logprobs: Vec<LogprobEntry>,
}

impl Delta {
    /// True when there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty() && self.logprobs.is_empty()
    }
}

/// Per-sequence text state.
#[derive(Debug)]
pub struct OutputText {
    decoder: IncrementalDecoder,
    stop: StopMatcher,
    think: Option<u32>,
    think_end: Option<u32>,
    in_reasoning: bool,
    /// Whether anything was released as content yet (leading newlines are dropped until then).
    content_started: bool,
    /// Entries of tokens whose text is still held back.
    pending: Vec<LogprobEntry>,
    /// Special ids that add no text (sorted); empty unless skipping is on.
    skipped: Vec<u32>,
}

/// Special tokens that stay in the text when special tokens are skipped: the reasoning
/// markers and the tool-call markers that parsers read.
const KEPT_SPECIAL: &[&str] = &[
    crate::tokenizer::THINK,
    crate::tokenizer::THINK_END,
    "<tool_call>",
    "</tool_call>",
];

impl OutputText {
    /// `split`: recognise `<think>`/`</think>` (chat); without it every token is text.
    /// `reasoning`: output starts inside a `<think>` block (thinking on).
    pub fn new(
        tokenizer: &Tokenizer,
        stops: &[String],
        split: bool,
        reasoning: bool,
    ) -> OutputText {
        let id = |t: &str| if split { tokenizer.token_id(t) } else { None };
        OutputText {
            decoder: tokenizer.incremental_decoder(),
            stop: StopMatcher::new(stops),
            think: id(crate::tokenizer::THINK),
            think_end: id(crate::tokenizer::THINK_END),
            in_reasoning: split && reasoning,
            // Raw text keeps its leading newlines: only chat replies drop the template's.
            content_started: !split,
            pending: Vec::new(),
            skipped: Vec::new(),
        }
    }

    /// The index (in the stop list given to [`OutputText::new`]) of the stop string that ended
    /// the output, once one did.
    pub fn matched_stop(&self) -> Option<usize> {
        self.stop.matched()
    }

    /// Drops the text of special tokens (all but [`KEPT_SPECIAL`]) from now on.
    pub fn skip_special_tokens(mut self, tokenizer: &Tokenizer) -> OutputText {
        let kept: Vec<u32> = KEPT_SPECIAL
            .iter()
            .filter_map(|t| tokenizer.token_id(t))
            .collect();
        self.skipped = tokenizer
            .flagged_special_ids()
            .iter()
            .copied()
            .filter(|id| !kept.contains(id))
            .collect();
        self
    }

    /// Whether output is currently inside the reasoning block.
    pub fn in_reasoning(&self) -> bool {
        self.in_reasoning
    }

    /// Adds one generated id; returns the released text and whether a stop string ended it.
    pub fn push(
        &mut self,
        tokenizer: &Tokenizer,
        id: u32,
        lp: Option<TokenLogprob>,
    ) -> (Delta, bool) {
        if let Some(lp) = lp {
            self.pending.push(entry(tokenizer, &lp));
        }
        let mut delta = Delta::default();
        if Some(id) == self.think_end && self.in_reasoning {
            // Close the reasoning block: whatever is held belongs to it.
            let mut text = self.decoder.finish().unwrap_or_default();
            let out = self.stop.push(&text);
            if out.stopped {
                delta.reasoning = out.text;
                return (delta, true);
            }
            text = out.text + &self.stop.flush();
            delta.reasoning = text;
            self.in_reasoning = false;
            delta.logprobs = std::mem::take(&mut self.pending);
            return (delta, false);
        }
        if Some(id) == self.think && !self.in_reasoning && !self.content_started {
            // A reasoning block the model opened itself (thinking was not pre-opened).
            self.in_reasoning = true;
            delta.logprobs = std::mem::take(&mut self.pending);
            return (delta, false);
        }
        if self.skipped.binary_search(&id).is_ok() {
            if !self.stop.is_holding() && !self.decoder.has_pending() {
                delta.logprobs = std::mem::take(&mut self.pending);
            }
            return (delta, false);
        }
        let piece = match self.decoder.push(id) {
            Ok(p) => p.unwrap_or_default(),
            Err(e) => {
                tracing::warn!(error = %e, id, "detokenisation failed; token skipped");
                String::new()
            }
        };
        let out = self.stop.push(&piece);
        self.route(&mut delta, out.text);
        if out.stopped {
            self.pending.clear();
            return (delta, true);
        }
        if !self.stop.is_holding() && !self.decoder.has_pending() {
            delta.logprobs = std::mem::take(&mut self.pending);
        }
        (delta, false)
    }

    /// Releases everything held back (generation ended without a stop string).
    pub fn finish(&mut self) -> Delta {
        let mut delta = Delta::default();
        let tail = self.decoder.finish().unwrap_or_default();
        let out = self.stop.push(&tail);
        let mut text = out.text;
        if !out.stopped {
            text.push_str(&self.stop.flush());
        }
        self.route(&mut delta, text);
        delta.logprobs = std::mem::take(&mut self.pending);
        delta
    }

    fn route(&mut self, delta: &mut Delta, text: String) {
        if self.in_reasoning {
            delta.reasoning.push_str(&text);
        } else if self.content_started {
            delta.content.push_str(&text);
        } else {
            let trimmed = text.trim_start_matches(['\n', '\r']);
            if !trimmed.is_empty() {
                self.content_started = true;
                delta.content.push_str(trimmed);
            }
        }
    }
}

fn top(tokenizer: &Tokenizer, id: u32, logprob: f32) -> TopLogprob {
    let bytes = tokenizer
        .token_bytes(id)
        .map(<[u8]>::to_vec)
        .unwrap_or_default();
    TopLogprob {
        token: String::from_utf8_lossy(&bytes).into_owned(),
        logprob,
        bytes,
    }
}

fn entry(tokenizer: &Tokenizer, lp: &TokenLogprob) -> LogprobEntry {
    LogprobEntry {
        token: top(tokenizer, lp.id, lp.logprob),
        top: lp
            .top
            .iter()
            .map(|&(id, l)| top(tokenizer, id, l))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> Tokenizer {
        Tokenizer::from_model_dir(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models/tiny"),
        )
        .expect("fixture tokenizer")
    }

    /// Feeds `text`'s tokens one by one; returns (reasoning, content, stopped).
    fn run(text: &str, stops: &[&str], split: bool, reasoning: bool) -> (String, String, bool) {
        let tok = tokenizer();
        let stops: Vec<String> = stops.iter().map(ToString::to_string).collect();
        let mut out = OutputText::new(&tok, &stops, split, reasoning);
        let (mut r, mut c) = (String::new(), String::new());
        for id in tok.encode(text).expect("encode") {
            let (d, stopped) = out.push(&tok, id, None);
            r.push_str(&d.reasoning);
            c.push_str(&d.content);
            if stopped {
                return (r, c, true);
            }
        }
        let d = out.finish();
        (r + &d.reasoning, c + &d.content, false)
    }

    #[test]
    fn reasoning_then_content_with_leading_newlines_dropped() {
        let got = run("let me think\n</think>\n\nThe answer.", &[], true, true);
        assert_eq!(
            got,
            (
                "let me think\n".to_string(),
                "The answer.".to_string(),
                false
            )
        );
    }

    #[test]
    fn thinking_off_is_all_content_and_raw_text_keeps_everything() {
        assert_eq!(
            run("\nHello there", &[], true, false),
            (String::new(), "Hello there".to_string(), false)
        );
        let raw = run("\nx</think>y", &[], false, false);
        assert_eq!(raw, (String::new(), "\nx</think>y".to_string(), false));
    }

    #[test]
    fn model_opened_think_block_is_split_out() {
        assert_eq!(
            run("<think>hmm</think>ok", &[], true, false),
            ("hmm".to_string(), "ok".to_string(), false)
        );
    }

    #[test]
    fn special_tokens_are_skipped_unless_asked_for_and_markers_stay() {
        let tok = tokenizer();
        let text = "a<|vision_end|>b<tool_call>c</tool_call><|im_start|>";
        let collect = |mut out: OutputText| {
            let mut c = String::new();
            for id in tok.encode(text).expect("encode") {
                c.push_str(&out.push(&tok, id, None).0.content);
            }
            c + &out.finish().content
        };
        let kept = collect(OutputText::new(&tok, &[], true, false));
        assert_eq!(kept, text);
        let skipped = collect(OutputText::new(&tok, &[], true, false).skip_special_tokens(&tok));
        assert_eq!(skipped, "ab<tool_call>c</tool_call>");
    }

    #[test]
    fn stop_string_ends_content_and_is_not_emitted() {
        let got = run(
            "plan</think>Answer: 42. STOP and more",
            &["STOP"],
            true,
            true,
        );
        assert_eq!(got, ("plan".to_string(), "Answer: 42. ".to_string(), true));
    }
}
