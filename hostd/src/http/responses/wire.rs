//! Wire types of the Responses API: the `POST /v1/responses` body, and the response object with
//! its output items and usage, field for field as the openai SDK's
//! `openai.types.responses.Response` defines them.
//!
//! The request keeps raw values for the fields `input.rs` checks with precise errors (`input`,
//! `tools`, `tool_choice`, `text`, `reasoning`), and every other field in `extra` for the field
//! policy (`http::fields` and [`REFUSED`]).

use crate::engine::Usage as EngineUsage;
use crate::http::fields::Rule;
use crate::http::openai::{SamplingFields, with_sampling_fields};
use serde::{Deserialize, Serialize};
use serde_json::Value;

with_sampling_fields! {
    /// `POST /v1/responses` body.
    #[derive(Debug, Clone, Deserialize)]
    pub struct CreateRequest {
        /// The served model's name.
        pub model: Option<String>,
        /// A string (one user message) or a list of input items.
        pub input: Option<Value>,
        /// The system message (not carried over by `previous_response_id`).
        pub instructions: Option<String>,
        /// Function tools in the Responses shape (`{type, name, description, parameters, strict}`).
        pub tools: Option<Value>,
        /// `none`, `auto`, `required` or `{type: "function", name}`.
        pub tool_choice: Option<Value>,
        /// Whether a reply may hold several calls (default true).
        pub parallel_tool_calls: Option<bool>,
        /// Most tokens to generate, reasoning included.
        pub max_output_tokens: Option<i64>,
        /// Stream events.
        pub stream: Option<bool>,
        /// `text.format` (structured output) and `text.verbosity` (ignored).
        pub text: Option<Value>,
        /// `reasoning.effort` (thinking on/off) and `reasoning.summary` (ignored).
        pub reasoning: Option<Value>,
        /// Keep the response for `GET` and `previous_response_id` (default true).
        pub store: Option<bool>,
        /// Continue the conversation of this stored response.
        pub previous_response_id: Option<String>,
        /// Keep generating past the end-of-turn token (vLLM's extension; for tests).
        pub ignore_eos: Option<bool>,
        /// Echoed back in the response.
        pub metadata: Option<Value>,
        /// Every other field, for the field policy.
        #[serde(flatten)]
        pub extra: serde_json::Map<String, Value>,
    }
}

fn null(v: &Value) -> bool {
    v.is_null()
}
fn falsy(v: &Value) -> bool {
    v.is_null() || *v == Value::Bool(false)
}
fn zero(v: &Value) -> bool {
    v.is_null() || v.as_i64() == Some(0)
}
fn truncation_disabled(v: &Value) -> bool {
    v.is_null() || v.as_str() == Some("disabled")
}
/// `include` may name only what costs nothing to leave out: `reasoning.encrypted_content` (no
/// encrypted reasoning exists here; the reasoning items carry their text instead).
fn include_neutral(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(list) => list
            .iter()
            .all(|i| i.as_str() == Some("reasoning.encrypted_content")),
        _ => false,
    }
}

const fn refused(name: &'static str, note: &'static str, neutral: fn(&Value) -> bool) -> Rule {
    Rule {
        name,
        note,
        neutral,
    }
}

/// Fields of the Responses API refused unless neutral.
pub const REFUSED: &[Rule] = &[
    refused(
        "background",
        "Background responses are not supported: send the request and wait, or stream.",
        falsy,
    ),
    refused(
        "conversation",
        "Conversations are not supported; use previous_response_id or send the input items.",
        null,
    ),
    refused(
        "prompt",
        "Stored prompt templates are not supported; send instructions and input.",
        null,
    ),
    refused(
        "top_logprobs",
        "top_logprobs is not supported on /v1/responses.",
        zero,
    ),
    refused(
        "truncation",
        "truncation \"auto\" is not supported: an input that is too long is refused.",
        truncation_disabled,
    ),
    refused(
        "include",
        "include supports only \"reasoning.encrypted_content\" (accepted; reasoning items carry their text instead).",
        include_neutral,
    ),
    refused("max_tool_calls", "max_tool_calls is not supported.", null),
];

/// `usage.input_tokens_details`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct InputTokensDetails {
    /// Prompt tokens whose state came from the prefix cache.
    pub cached_tokens: usize,
}

/// `usage.output_tokens_details`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OutputTokensDetails {
    /// Tokens of the reasoning text (its text re-encoded by the tokenizer).
    pub reasoning_tokens: usize,
}

/// `usage`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ResponseUsage {
    /// Prompt tokens.
    pub input_tokens: usize,
    /// Cache detail.
    pub input_tokens_details: InputTokensDetails,
    /// Generated tokens (reasoning included, the end-of-turn token counted).
    pub output_tokens: usize,
    /// Reasoning detail.
    pub output_tokens_details: OutputTokensDetails,
    /// Sum of input and output.
    pub total_tokens: usize,
}

impl ResponseUsage {
    /// The engine's counts, with the reasoning's token count.
    pub fn new(u: EngineUsage, reasoning_tokens: usize) -> ResponseUsage {
        ResponseUsage {
            input_tokens: u.prompt_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: u.cached_tokens,
            },
            output_tokens: u.completion_tokens,
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: reasoning_tokens.min(u.completion_tokens),
            },
            total_tokens: u.prompt_tokens + u.completion_tokens,
        }
    }
}

/// A part of an output item's `content`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    /// A message's text.
    OutputText {
        /// The text.
        text: String,
        /// Always empty (no citations).
        annotations: Vec<Value>,
        /// Always empty (logprobs are not offered on this route).
        logprobs: Vec<Value>,
    },
    /// A reasoning item's text.
    ReasoningText {
        /// The text.
        text: String,
    },
}

impl Part {
    /// The part's text.
    pub fn text_mut(&mut self) -> &mut String {
        match self {
            Part::OutputText { text, .. } | Part::ReasoningText { text } => text,
        }
    }

    /// An `output_text` part.
    pub fn output_text(text: String) -> Part {
        Part::OutputText {
            text,
            annotations: Vec::new(),
            logprobs: Vec::new(),
        }
    }
}

/// One item of `output`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    /// The model's reasoning (`content` holds its text; there are no summaries).
    Reasoning {
        /// `rs_…`.
        id: String,
        /// Always empty: no summaries are generated.
        summary: Vec<Value>,
        /// One `reasoning_text` part.
        content: Vec<Part>,
        /// Always null.
        encrypted_content: Option<String>,
        /// `in_progress`, `completed` or `incomplete`.
        status: &'static str,
    },
    /// The answer.
    Message {
        /// `msg_…`.
        id: String,
        /// Always `assistant`.
        role: &'static str,
        /// One `output_text` part.
        content: Vec<Part>,
        /// `in_progress`, `completed` or `incomplete`.
        status: &'static str,
    },
    /// A call of a function tool.
    FunctionCall {
        /// `fc_…`.
        id: String,
        /// `call_…`: what a `function_call_output` answers.
        call_id: String,
        /// The function's name.
        name: String,
        /// The arguments as a JSON object's text.
        arguments: String,
        /// `in_progress`, `completed` or `incomplete`.
        status: &'static str,
    },
}

impl OutputItem {
    /// The item's id.
    pub fn id(&self) -> &str {
        match self {
            OutputItem::Reasoning { id, .. }
            | OutputItem::Message { id, .. }
            | OutputItem::FunctionCall { id, .. } => id,
        }
    }

    /// Sets the item's status.
    pub fn set_status(&mut self, s: &'static str) {
        match self {
            OutputItem::Reasoning { status, .. }
            | OutputItem::Message { status, .. }
            | OutputItem::FunctionCall { status, .. } => *status = s,
        }
    }
}

/// `incomplete_details`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct IncompleteDetails {
    /// `max_output_tokens`.
    pub reason: &'static str,
}

/// The response object (whole, in `GET`, and inside the lifecycle events of a stream).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ResponseObject {
    /// `resp_…`.
    pub id: String,
    /// `response`.
    pub object: &'static str,
    /// Unix seconds.
    pub created_at: u64,
    /// `in_progress`, `completed`, `incomplete` or `failed`.
    pub status: &'static str,
    /// Always false.
    pub background: bool,
    /// Set when a stream failed (`response.failed`).
    pub error: Option<Value>,
    /// Why the response is incomplete.
    pub incomplete_details: Option<IncompleteDetails>,
    /// The request's `instructions`.
    pub instructions: Option<String>,
    /// The request's `max_output_tokens`.
    pub max_output_tokens: Option<i64>,
    /// Served model name.
    pub model: String,
    /// Reasoning, message and function-call items, in the order they were generated.
    pub output: Vec<OutputItem>,
    /// The request's `parallel_tool_calls` (default true).
    pub parallel_tool_calls: bool,
    /// The request's `previous_response_id`.
    pub previous_response_id: Option<String>,
    /// `{effort, summary}` as the request gave them.
    pub reasoning: Value,
    /// Whether the response is stored.
    pub store: bool,
    /// The request's `temperature`.
    pub temperature: Option<f64>,
    /// `{format}`: the request's, or `{type: "text"}`.
    pub text: Value,
    /// The request's `tool_choice` (default `auto`).
    pub tool_choice: Value,
    /// The request's tools.
    pub tools: Vec<Value>,
    /// The request's `top_p`.
    pub top_p: Option<f64>,
    /// Always `disabled`.
    pub truncation: &'static str,
    /// Token counts; null until the response ends.
    pub usage: Option<ResponseUsage>,
    /// The request's `metadata` (or `{}`).
    pub metadata: Value,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `docs/api.md` names every refused field of this route.
    #[test]
    fn the_api_page_lists_the_refused_fields() {
        let page = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/api.md"),
        )
        .expect("docs/api.md");
        for rule in REFUSED {
            assert!(
                page.contains(&format!("`{}`", rule.name)),
                "docs/api.md does not mention `{}`",
                rule.name
            );
        }
    }

    #[test]
    fn neutral_values() {
        let neutral = |name: &str, v: Value| {
            (REFUSED.iter().find(|r| r.name == name).expect(name).neutral)(&v)
        };
        assert!(
            neutral("include", json!(["reasoning.encrypted_content"]))
                && neutral("include", json!([]))
        );
        assert!(!neutral("include", json!(["message.output_text.logprobs"])));
        assert!(neutral("truncation", json!("disabled")) && !neutral("truncation", json!("auto")));
        assert!(neutral("background", json!(false)) && !neutral("background", json!(true)));
        assert!(neutral("top_logprobs", json!(0)) && !neutral("top_logprobs", json!(3)));
    }

    #[test]
    fn items_serialise_as_the_sdk_reads_them() {
        let call = OutputItem::FunctionCall {
            id: "fc_1".into(),
            call_id: "call_1".into(),
            name: "f".into(),
            arguments: "{}".into(),
            status: "completed",
        };
        assert_eq!(
            serde_json::to_value(&call).expect("json"),
            json!({"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": "{}", "status": "completed"})
        );
        let msg = OutputItem::Message {
            id: "msg_1".into(),
            role: "assistant",
            content: vec![Part::output_text("hi".into())],
            status: "completed",
        };
        assert_eq!(
            serde_json::to_value(&msg).expect("json"),
            json!({"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": "hi", "annotations": [], "logprobs": []}]})
        );
    }
}
