//! Constrained decoding: per-sequence token masks from a grammar (llguidance), for
//! `response_format` json_object / json_schema and for forced tool calls.
//!
//! [`Grammars`] owns the one llguidance `ParserFactory` per tokenizer. It is built lazily, on the
//! first constrained request (building the token trie for a 248k vocabulary takes a moment), so
//! unconstrained serving pays nothing. [`Grammars::compile`] turns a [`ConstraintSpec`] into a
//! [`SequenceConstraint`], the per-sequence state the scheduler consults on every step of a
//! constrained sequence: [`SequenceConstraint::mask_logits`] sets the logits of tokens the
//! grammar does not allow to −∞, [`SequenceConstraint::commit`] advances it by the sampled token
//! and says when the grammar has ended the answer.
//!
//! Thinking: with thinking on, the output begins inside `<think>`. The reasoning is not
//! constrained (the matcher does not see it), except that it may not end the turn (end ids are
//! masked) and that it gets at most a budget of tokens (by default half of `max_tokens`), after
//! which `</think>` is the only token allowed. The grammar applies from the token after
//! `</think>`. With thinking off it applies from the first token. The answer may begin with one
//! or two newlines (the template's `</think>\n\n` habit); the chat reply drops them.
//!
//! Not here: the HTTP shape of `response_format` (`http::response_format`), sampling.

mod tool_calls;
mod vocab;

#[cfg(test)]
mod tests;

pub use tool_calls::{ToolChoice, ToolSpec, is_raw_string, tool_call_constraint};

use crate::tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::SimpleVob;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use std::sync::{Arc, OnceLock};

/// Whitespace the JSON grammars allow between two tokens of JSON: bounded, so a model (random
/// weights included) cannot spend its whole budget on it, and wide enough for pretty-printing
/// a few levels deep.
const JSON_WHITESPACE: &str = r"[\x20\x0A\x0D\x09]{1,40}";

/// What the answer must be.
#[derive(Debug, Clone, PartialEq)]
pub enum ConstraintSpec {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON conforming to this JSON schema (`response_format: {"type": "json_schema"}`).
    JsonSchema(Value),
    /// A grammar in llguidance's Lark-like syntax (the forced tool-call form).
    Lark(String),
}

/// Why a constraint could not be built or followed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConstraintError {
    /// The tokenizer's vocabulary could not be turned into a token trie.
    #[error("cannot build the token vocabulary for constrained decoding: {message}")]
    Vocabulary {
        /// What failed.
        message: String,
    },
    /// The schema or grammar is invalid or uses something the grammar engine does not support.
    #[error("{message}")]
    Grammar {
        /// The grammar engine's message.
        message: String,
    },
    /// A tool definition cannot be turned into a call grammar.
    #[error("tool {tool:?}: {message}")]
    Tool {
        /// The tool's name.
        tool: String,
        /// What is wrong with it.
        message: String,
    },
    /// The matcher failed while generating (a bug, or a grammar that allows no token).
    #[error("constrained decoding failed: {message}")]
    Matcher {
        /// What failed.
        message: String,
    },
}

/// How a constrained sequence starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartOptions {
    /// The output begins inside a `<think>` block (chat with thinking on).
    pub reasoning: bool,
    /// Most reasoning tokens before `</think>` is forced (ignored without `reasoning`).
    pub reasoning_budget: usize,
}

impl StartOptions {
    /// Thinking as given, with the default budget: half of `max_tokens` (at least one token).
    pub fn new(reasoning: bool, max_tokens: usize) -> StartOptions {
        StartOptions {
            reasoning,
            reasoning_budget: (max_tokens / 2).max(1),
        }
    }
}

/// The shared, lazily built grammar machinery of one tokenizer.
pub struct Grammars {
    tokenizer: Arc<Tokenizer>,
    /// Ids that end a generation; allowed by a grammar only once it is complete.
    eos: Vec<u32>,
    factory: OnceLock<Result<Arc<Factory>, ConstraintError>>,
}

/// What every sequence's matcher shares.
struct Factory {
    parser: ParserFactory,
    think_end: Option<u32>,
    eos: Arc<[u32]>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("eos", &self.eos)
            .field("built", &self.factory.get().is_some())
            .finish_non_exhaustive()
    }
}

impl Grammars {
    /// Grammars over `tokenizer`; `eos` are the ids that end a generation (`<|im_end|>`,
    /// `<|endoftext|>`, the model's EOS). Nothing is built until the first [`Grammars::compile`].
    pub fn new(tokenizer: Arc<Tokenizer>, eos: Vec<u32>) -> Grammars {
        Grammars {
            tokenizer,
            eos,
            factory: OnceLock::new(),
        }
    }

    fn factory(&self) -> Result<Arc<Factory>, ConstraintError> {
        self.factory
            .get_or_init(|| {
                let t0 = std::time::Instant::now();
                let env = vocab::build(Arc::clone(&self.tokenizer), &self.eos)?;
                let mut parser =
                    ParserFactory::new_simple(&env).map_err(|e| ConstraintError::Vocabulary {
                        message: e.to_string(),
                    })?;
                parser.quiet();
                let eos: Arc<[u32]> = env.tok_trie().eos_tokens().into();
                let think_end = self.tokenizer.think_end_id().ok();
                tracing::info!(
                    vocab = self.tokenizer.vocab_size(),
                    elapsed_ms = t0.elapsed().as_millis() as u64,
                    "grammar engine ready"
                );
                Ok(Arc::new(Factory {
                    parser,
                    think_end,
                    eos,
                }))
            })
            .clone()
    }

    /// A fresh per-sequence constraint for `spec`. Fails with [`ConstraintError::Grammar`]
    /// naming what the grammar engine refused (an invalid schema, an unsupported keyword).
    pub fn compile(
        &self,
        spec: &ConstraintSpec,
        start: StartOptions,
    ) -> Result<SequenceConstraint, ConstraintError> {
        let factory = self.factory()?;
        let grammar = TopLevelGrammar::from_lark(answer_grammar(spec)?);
        let parser =
            factory
                .parser
                .create_parser(grammar)
                .map_err(|e| ConstraintError::Grammar {
                    message: e.to_string(),
                })?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(message) = matcher.get_error() {
            return Err(ConstraintError::Grammar { message });
        }
        let reasoning_left = match (start.reasoning, factory.think_end) {
            (true, Some(_)) => Some(start.reasoning_budget),
            _ => None,
        };
        Ok(SequenceConstraint {
            matcher,
            reasoning_left,
            think_end: factory.think_end.unwrap_or(u32::MAX),
            eos: Arc::clone(&factory.eos),
            masked: Vec::new(),
        })
    }
}

/// The Lark grammar of a whole answer: up to two leading newlines, then what `spec` asks for.
fn answer_grammar(spec: &ConstraintSpec) -> Result<String, ConstraintError> {
    let body = match spec {
        ConstraintSpec::JsonObject => json_rule(&serde_json::json!({"type": "object"}), false)?,
        ConstraintSpec::JsonSchema(schema) => json_rule(schema, false)?,
        ConstraintSpec::Lark(lark) => return Ok(lark.clone()),
    };
    Ok(format!(
        "start: LEAD? answer\nLEAD: /\\n{{1,2}}/\nanswer: {body}\n"
    ))
}

/// `%json {schema}` with this module's JSON formatting options (bounded whitespace).
/// `lenient`: keywords the grammar cannot enforce (`propertyNames`, unknown `format`s) are
/// ignored rather than refused. A response format is strict: the client asked for that shape.
/// A tool's parameters are lenient: clients send schemas written for providers that do not
/// enforce them (Claude Code's tools use `propertyNames`), and refusing one would refuse the
/// whole request; the call still follows every keyword the grammar knows.
pub(crate) fn json_rule(schema: &Value, lenient: bool) -> Result<String, ConstraintError> {
    let mut schema = match schema {
        Value::Object(_) => schema.clone(),
        Value::Bool(true) => serde_json::json!({}),
        _ => {
            return Err(ConstraintError::Grammar {
                message: "the schema must be a JSON object".into(),
            });
        }
    };
    if let Value::Object(m) = &mut schema {
        m.insert(
            "x-guidance".into(),
            serde_json::json!({"whitespace_pattern": JSON_WHITESPACE, "lenient": lenient}),
        );
    }
    Ok(format!("%json {schema}"))
}

/// What the sampled token did to a constrained sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// Keep generating.
    Continue,
    /// The token is an end-of-generation id the complete grammar allowed: end the sequence
    /// without emitting it.
    End,
    /// The token completed the grammar and nothing but an end id may follow: emit it, then end.
    Complete,
}

/// One sequence's constraint state.
pub struct SequenceConstraint {
    matcher: Matcher,
    /// Reasoning tokens left before `</think>` is forced; `None` once the answer has begun.
    reasoning_left: Option<usize>,
    think_end: u32,
    eos: Arc<[u32]>,
    /// Reused logits buffer (one allocation per sequence, not per token).
    masked: Vec<f32>,
}

impl std::fmt::Debug for SequenceConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SequenceConstraint")
            .field("reasoning_left", &self.reasoning_left)
            .finish_non_exhaustive()
    }
}

/// The tokens allowed at one step.
#[derive(Debug, Clone, PartialEq)]
pub enum Allowed {
    /// Reasoning: anything but an end id.
    AnyButEnd(Arc<[u32]>),
    /// Only this token (`</think>` at the end of the reasoning budget).
    Only(u32),
    /// The grammar's mask.
    Set(SimpleVob),
}

impl Allowed {
    /// Whether `id` may be sampled.
    pub fn contains(&self, id: u32) -> bool {
        match self {
            Allowed::AnyButEnd(eos) => !eos.contains(&id),
            Allowed::Only(t) => *t == id,
            Allowed::Set(v) => (id as usize) < v.len() && v.is_allowed(id),
        }
    }
}

impl SequenceConstraint {
    fn matcher_err(what: &str, e: impl std::fmt::Display) -> ConstraintError {
        ConstraintError::Matcher {
            message: format!("{what}: {e}"),
        }
    }

    /// The tokens allowed now.
    pub fn allowed(&mut self) -> Result<Allowed, ConstraintError> {
        match self.reasoning_left {
            Some(0) => Ok(Allowed::Only(self.think_end)),
            Some(_) => Ok(Allowed::AnyButEnd(Arc::clone(&self.eos))),
            // Once the grammar has ended, only an end id may follow.
            None => match self.matcher.compute_mask_or_eos() {
                Ok(m) => Ok(Allowed::Set(m)),
                Err(e) => Err(Self::matcher_err("computing the token mask", e)),
            },
        }
    }

    /// `logits` (the first `vocab` entries are sampled) with every token the constraint does
    /// not allow set to −∞, in a buffer the sequence reuses. Fails when no token below `vocab`
    /// with a finite logit is allowed.
    pub fn mask_logits(&mut self, logits: &[f32], vocab: usize) -> Result<&[f32], ConstraintError> {
        let allowed = self.allowed()?;
        let vocab = vocab.min(logits.len());
        self.masked.clear();
        self.masked.extend_from_slice(logits);
        let out = &mut self.masked[..vocab];
        let any = match &allowed {
            Allowed::AnyButEnd(eos) => {
                for &id in eos.iter() {
                    if let Some(l) = out.get_mut(id as usize) {
                        *l = f32::NEG_INFINITY;
                    }
                }
                out.iter().any(|l| l.is_finite())
            }
            Allowed::Only(id) => {
                let keep = out.get(*id as usize).copied();
                out.fill(f32::NEG_INFINITY);
                match keep {
                    Some(l) => {
                        // Forced: its logit may be anything, even −∞ in a truncated vocabulary.
                        out[*id as usize] = if l.is_finite() { l } else { 0.0 };
                        true
                    }
                    None => false,
                }
            }
            Allowed::Set(mask) => apply_mask(mask, out),
        };
        if !any {
            return Err(ConstraintError::Matcher {
                message: format!(
                    "the grammar allows no token of the model's {vocab}-token vocabulary here"
                ),
            });
        }
        Ok(&self.masked)
    }

    /// Advances the constraint by the sampled token `id` (one the last mask allowed).
    pub fn commit(&mut self, id: u32) -> Result<Commit, ConstraintError> {
        if let Some(left) = &mut self.reasoning_left {
            if id == self.think_end {
                self.reasoning_left = None;
            } else {
                *left = left.saturating_sub(1);
            }
            return Ok(Commit::Continue);
        }
        if self.eos.contains(&id) {
            return Ok(Commit::End);
        }
        if let Err(e) = self.matcher.consume_token(id) {
            return Err(Self::matcher_err(
                &format!("token {id} was not accepted"),
                e,
            ));
        }
        if self.matcher.is_error() {
            let e = self.matcher.get_error().unwrap_or_default();
            return Err(Self::matcher_err(&format!("after token {id}"), e));
        }
        Ok(if self.matcher.is_stopped() {
            Commit::Complete
        } else {
            Commit::Continue
        })
    }

    /// Whether the answer so far is a complete sentence of the grammar (an end id may follow).
    pub fn is_accepting(&mut self) -> bool {
        self.reasoning_left.is_none() && self.matcher.is_accepting().unwrap_or(false)
    }

    /// How many of `ids` the grammar would accept in a row from here, without advancing
    /// (0 while reasoning). End ids count as accepted where the grammar may end.
    pub fn accepted_prefix(&mut self, ids: &[u32]) -> usize {
        if self.reasoning_left.is_some() {
            return 0;
        }
        self.matcher.validate_tokens(ids).unwrap_or(0)
    }

    /// Whether the reasoning block is still open.
    pub fn in_reasoning(&self) -> bool {
        self.reasoning_left.is_some()
    }
}

/// Sets `logits[id]` to −∞ for each id not in `mask` (ids past the mask's end included).
/// Returns whether any allowed id keeps a finite logit. Works a 32-bit word at a time.
fn apply_mask(mask: &SimpleVob, logits: &mut [f32]) -> bool {
    let words = mask.as_slice();
    let mut any = false;
    for (w, chunk) in logits.chunks_mut(32).enumerate() {
        let bits = words.get(w).copied().unwrap_or(0);
        if bits == 0 {
            chunk.fill(f32::NEG_INFINITY);
            continue;
        }
        for (b, l) in chunk.iter_mut().enumerate() {
            if bits & (1 << b) == 0 {
                *l = f32::NEG_INFINITY;
            } else if l.is_finite() {
                any = true;
            }
        }
    }
    any
}
