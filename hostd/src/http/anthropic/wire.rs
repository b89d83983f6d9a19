//! Anthropic Messages API wire types: the `POST /v1/messages` and `/v1/messages/count_tokens`
//! bodies this server accepts and the message, content-block, usage and stream-event shapes it
//! returns, named as the Messages API reference (and the official Python SDK's types) name them.
//!
//! Requests deny unknown top-level fields (a 400 naming the field). Fields whose meaning is
//! structured (`system`, `messages`, `thinking`, `tools`, `tool_choice`, `output_config`) are
//! raw values, checked field by field in `convert.rs` so each error names its exact path.
//! One extension beyond Anthropic's fields, as on the OpenAI routes (vLLM's): `ignore_eos`.
//! Accepted and ignored: `metadata`, `cache_control` (the prefix cache works without
//! markers), `service_tier`, `inference_geo`, `speed`, `diagnostics`. Refused when set:
//! `container`, `mcp_servers` (server-side tools); `context_management` is read and ignored.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Declares `pub struct $name` with its own fields followed by the fields both endpoints take
/// (the model, the conversation, and the options that change its prompt or are accepted
/// alike), and `$name::conversation()`, which lends the conversation's fields as a
/// [`Conversation`], so `/v1/messages` and `/v1/messages/count_tokens` check exactly the same
/// fields. Both deny unknown fields, which rules out a `#[serde(flatten)]` struct.
macro_rules! with_conversation_fields {
    ($(#[$meta:meta])* pub struct $name:ident { $($own:tt)* }) => {
        $(#[$meta])*
        pub struct $name {
            /// The served model's name.
            pub model: Option<String>,
            /// The conversation: `user` and `assistant` turns.
            pub messages: Option<Vec<Value>>,
            /// System prompt: a string or a list of text blocks.
            pub system: Option<Value>,
            /// Thinking switch: `{"type": "enabled" | "adaptive" | "disabled", …}` (it changes
            /// the generation prompt, so the count).
            pub thinking: Option<Value>,
            /// Custom tool definitions (name, description, input_schema), rendered into the prompt.
            pub tools: Option<Value>,
            /// `auto`, `any`, `tool` (with `name`) or `none`; `disable_parallel_tool_use`.
            pub tool_choice: Option<Value>,
            /// `effort` (accepted, ignored) and `format` (refused).
            pub output_config: Option<Value>,
            /// Prompt-cache marker (accepted, ignored).
            pub cache_control: Option<Value>,
            /// Fast mode (accepted, ignored).
            pub speed: Option<Value>,
            /// Refused: MCP servers called by the API.
            pub mcp_servers: Option<Value>,
            /// Read and ignored: server-side context editing.
            pub context_management: Option<Value>,
            $($own)*
        }

        impl $name {
            /// The conversation's fields.
            pub fn conversation(&self) -> Conversation<'_> {
                Conversation {
                    system: self.system.as_ref(),
                    messages: self.messages.as_deref(),
                    thinking: self.thinking.as_ref(),
                    tools: self.tools.as_ref(),
                    tool_choice: self.tool_choice.as_ref(),
                    output_config: self.output_config.as_ref(),
                    mcp_servers: self.mcp_servers.as_ref(),
                    context_management: self.context_management.as_ref(),
                }
            }
        }
    };
}

/// The conversation fields both endpoints check, borrowed from either request.
pub struct Conversation<'a> {
    /// `system`.
    pub system: Option<&'a Value>,
    /// `messages`.
    pub messages: Option<&'a [Value]>,
    /// `thinking`.
    pub thinking: Option<&'a Value>,
    /// `tools`.
    pub tools: Option<&'a Value>,
    /// `tool_choice`.
    pub tool_choice: Option<&'a Value>,
    /// `output_config`.
    pub output_config: Option<&'a Value>,
    /// `mcp_servers`.
    pub mcp_servers: Option<&'a Value>,
    /// `context_management`.
    pub context_management: Option<&'a Value>,
}

with_conversation_fields! {
    /// `POST /v1/messages` body.
    #[derive(Debug, Clone, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct MessagesRequest {
        /// Most tokens to generate, thinking included (required).
        pub max_tokens: Option<i64>,
        /// Strings that end the generation; the one matched comes back as `stop_sequence`.
        pub stop_sequences: Option<Vec<String>>,
        /// Sampling temperature (0–2 here; Anthropic's range is 0–1).
        pub temperature: Option<f64>,
        /// Nucleus sampling mass.
        pub top_p: Option<f64>,
        /// Top-k candidates.
        pub top_k: Option<i64>,
        /// Stream server-sent events.
        pub stream: Option<bool>,
        /// Keep generating past the end-of-turn token (vLLM's extension, for benchmarks and tests).
        pub ignore_eos: Option<bool>,
        /// Request metadata such as `user_id` (accepted, ignored).
        pub metadata: Option<Value>,
        /// Capacity tier (accepted, ignored).
        pub service_tier: Option<Value>,
        /// Inference region (accepted, ignored).
        pub inference_geo: Option<Value>,
        /// Cache-miss diagnostics (accepted, ignored).
        pub diagnostics: Option<Value>,
        /// Refused: code-execution containers.
        pub container: Option<Value>,
    }
}

with_conversation_fields! {
    /// `POST /v1/messages/count_tokens` body.
    #[derive(Debug, Clone, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct CountTokensRequest {}
}

/// One block of a reply's `content`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    /// The model's reasoning. `signature` is always empty: this server signs nothing and
    /// ignores signatures on thinking blocks sent back to it.
    Thinking {
        /// The reasoning text (empty with `display: "omitted"`).
        thinking: String,
        /// Always `""`.
        signature: String,
    },
    /// Answer text.
    Text {
        /// The text.
        text: String,
    },
    /// A call of one of the request's tools.
    ToolUse {
        /// `toolu_…`, what the `tool_result` of the next turn names.
        id: String,
        /// The tool's name.
        name: String,
        /// The arguments: a JSON object typed by the tool's `input_schema`.
        input: Value,
    },
}

/// `usage` of a message. Anthropic counts input as `input_tokens` (not read from a cache) +
/// `cache_read_input_tokens` (+ `cache_creation_input_tokens`, which this server does not
/// account and reports as null).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Usage {
    /// Prompt tokens that were prefilled.
    pub input_tokens: usize,
    /// Generated tokens, thinking included.
    pub output_tokens: usize,
    /// Not accounted: null.
    pub cache_creation_input_tokens: Option<usize>,
    /// Prompt tokens whose state came from the prefix cache.
    pub cache_read_input_tokens: Option<usize>,
}

impl Usage {
    /// From the engine's counts.
    pub fn from_engine(u: crate::engine::Usage) -> Usage {
        Usage {
            input_tokens: u.prompt_tokens.saturating_sub(u.cached_tokens),
            output_tokens: u.completion_tokens,
            cache_creation_input_tokens: None,
            cache_read_input_tokens: Some(u.cached_tokens),
        }
    }
}

/// A `message` object (a whole reply, or the empty one that opens a stream).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Message {
    /// `msg_…`.
    pub id: String,
    /// `message`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// `assistant`.
    pub role: &'static str,
    /// Served model name.
    pub model: String,
    /// Thinking block (when the model reasoned), text block (when it answered), then one
    /// `tool_use` block per call.
    pub content: Vec<ContentBlock>,
    /// `end_turn`, `max_tokens`, `stop_sequence` or `tool_use`; null only in `message_start`.
    pub stop_reason: Option<&'static str>,
    /// The stop sequence matched, with `stop_reason: "stop_sequence"`.
    pub stop_sequence: Option<String>,
    /// Token counts.
    pub usage: Usage,
}

/// `count_tokens` reply.
#[derive(Debug, Clone, Serialize)]
pub struct TokenCount {
    /// Tokens of the rendered prompt, generation prompt included.
    pub input_tokens: usize,
}
