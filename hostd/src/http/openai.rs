//! OpenAI wire types: the request bodies this server accepts and the response, chunk, usage
//! and logprobs shapes it returns, field for field as OpenAI's API reference names them.
//!
//! Each request keeps the fields it has no typed slot for in `extra`, which `http::fields`
//! checks against the field policy (ignored, refused unless neutral, or unknown and accepted).
//! The tool fields are raw values checked by `http::tools`. Options OpenAI defines but this
//! server does not implement are declared as raw values and refused with a sentence by `http::params`. vLLM's extensions that
//! clients commonly send (`top_k`, `min_p`, `repetition_penalty`, `ignore_eos`,
//! `chat_template_kwargs`, `skip_special_tokens`) are implemented. Nested option objects
//! (`stream_options`, `chat_template_kwargs`) still deny unknown keys, named with their path.
//!
//! Not here: validation and conversion to engine types (`http::params`).

use crate::engine::{LogprobEntry, TopLogprob, Usage as EngineUsage};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// A single stop string.
    One(String),
    /// Up to four stop strings.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Send a final chunk with `usage` and no choices.
    #[serde(default)]
    pub include_usage: bool,
    /// OpenAI pads chunks with random text against length side channels; accepted and
    /// ignored (no padding is sent; the content is the same).
    pub include_obfuscation: Option<bool>,
}

/// `chat_template_kwargs` (vLLM's extension): switches of the chat template.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatTemplateKwargs {
    /// Thinking on (default) or off.
    pub enable_thinking: Option<bool>,
    /// Keep the reasoning of earlier assistant turns in the prompt.
    pub preserve_thinking: Option<bool>,
}

/// Declares `pub struct $name` with its own fields followed by the eight sampling fields
/// (OpenAI's names, and vLLM's `top_k`, `min_p`, `repetition_penalty`), and `$name::sampling()`,
/// which reads them as a [`SamplingFields`]. [`SamplingFields`] itself and the request bodies of
/// chat, legacy completions and Responses are declared with it, so the list exists once.
///
/// Not a `#[serde(flatten)]` struct: serde buffers a flattened struct's fields and deserialises
/// them after the rest of the body, where `serde_path_to_error` no longer sees the path, so the
/// 400 for `"temperature": "hot"` could not name `temperature`.
macro_rules! with_sampling_fields {
    ($(#[$meta:meta])* pub struct $name:ident { $($own:tt)* }) => {
        $(#[$meta])*
        pub struct $name {
            $($own)*
            /// Sampling temperature, 0–2.
            pub temperature: Option<f64>,
            /// Nucleus sampling mass.
            pub top_p: Option<f64>,
            /// Top-k candidates (vLLM).
            pub top_k: Option<i64>,
            /// Min-p filter (vLLM).
            pub min_p: Option<f64>,
            /// Presence penalty, −2–2.
            pub presence_penalty: Option<f64>,
            /// Frequency penalty, −2–2.
            pub frequency_penalty: Option<f64>,
            /// Repetition penalty (vLLM).
            pub repetition_penalty: Option<f64>,
            /// Seed of the sampler.
            pub seed: Option<i64>,
        }

        impl $name {
            /// The sampling fields.
            pub fn sampling(&self) -> SamplingFields {
                SamplingFields {
                    temperature: self.temperature,
                    top_p: self.top_p,
                    top_k: self.top_k,
                    min_p: self.min_p,
                    presence_penalty: self.presence_penalty,
                    frequency_penalty: self.frequency_penalty,
                    repetition_penalty: self.repetition_penalty,
                    seed: self.seed,
                }
            }
        }
    };
}
pub(crate) use with_sampling_fields;

with_sampling_fields! {
    /// The sampling fields of a request, as the OpenAI generation endpoints name them (the
    /// Anthropic endpoint fills the three it has).
    #[derive(Debug, Clone, Default)]
    pub struct SamplingFields {}
}

with_sampling_fields! {
    /// `POST /v1/chat/completions` body.
    #[derive(Debug, Clone, Deserialize)]
    pub struct ChatCompletionRequest {
        /// The served model's name.
        pub model: Option<String>,
        /// The conversation; checked message by message for precise errors.
        pub messages: Option<Vec<Value>>,
        /// Stream chunks as server-sent events.
        pub stream: Option<bool>,
        /// Streaming options.
        pub stream_options: Option<StreamOptions>,
        /// Deprecated name of `max_completion_tokens`.
        pub max_tokens: Option<i64>,
        /// Most tokens to generate (reasoning included).
        pub max_completion_tokens: Option<i64>,
        /// Stop strings.
        pub stop: Option<Stop>,
        /// Choices per request, 1–8.
        pub n: Option<i64>,
        /// Return log-probabilities of the output tokens.
        pub logprobs: Option<bool>,
        /// Alternatives per token, 0–20.
        pub top_logprobs: Option<i64>,
        /// Chat template switches (vLLM).
        pub chat_template_kwargs: Option<ChatTemplateKwargs>,
        /// Keep generating past the end-of-turn token (vLLM).
        pub ignore_eos: Option<bool>,
        /// Keep special tokens such as `<|vision_end|>` in the text (vLLM; default false).
        pub skip_special_tokens: Option<bool>,
        /// Thinking on or off (Qwen's DashScope API, SGLang).
        pub enable_thinking: Option<bool>,
        /// Whether the reply carries the reasoning (vLLM, OpenRouter; default true).
        pub include_reasoning: Option<bool>,
        /// OpenRouter's reasoning options (`effort`, `enabled`, `exclude`).
        pub reasoning: Option<Value>,
        /// OpenAI's reasoning levels, mapped onto thinking on/off (`http::fields::thinking`).
        pub reasoning_effort: Option<String>,
        /// Token id → bias added to its logit before sampling, −100–100.
        pub logit_bias: Option<Value>,
        /// Tool definitions (function tools), checked by `http::tools`.
        pub tools: Option<Value>,
        /// `none`, `auto`, `required` or a named function (the last two refused for now).
        pub tool_choice: Option<Value>,
        /// Whether a reply may hold several calls (false keeps only the first).
        pub parallel_tool_calls: Option<Value>,
        /// Unsupported: legacy function definitions.
        pub functions: Option<Value>,
        /// Unsupported: legacy function call control.
        pub function_call: Option<Value>,
        /// `text`, `json_object` or `json_schema` (constrained decoding; `http::response_format`).
        pub response_format: Option<Value>,
        /// Unsupported unless `["text"]`.
        pub modalities: Option<Value>,
        /// Every other field, for the field policy (`http::fields`).
        #[serde(flatten)]
        pub extra: serde_json::Map<String, Value>,
    }
}

with_sampling_fields! {
    /// `POST /v1/completions` body.
    #[derive(Debug, Clone, Deserialize)]
    pub struct CompletionRequest {
        /// The served model's name.
        pub model: Option<String>,
        /// A string, a one-element list of strings, token ids, or a one-element list of id lists.
        pub prompt: Option<Value>,
        /// Stream chunks as server-sent events.
        pub stream: Option<bool>,
        /// Streaming options.
        pub stream_options: Option<StreamOptions>,
        /// Most tokens to generate (default 16, as OpenAI).
        pub max_tokens: Option<i64>,
        /// Stop strings.
        pub stop: Option<Stop>,
        /// Choices, 1–8.
        pub n: Option<i64>,
        /// Top log-probabilities per token, 0–5 (legacy shape).
        pub logprobs: Option<i64>,
        /// Keep generating past end-of-text (vLLM).
        pub ignore_eos: Option<bool>,
        /// Keep special tokens in the text (vLLM; default false).
        pub skip_special_tokens: Option<bool>,
        /// `text`, `json_object` or `json_schema` (constrained decoding, as on chat).
        pub response_format: Option<Value>,
        /// Unsupported unless false.
        pub echo: Option<bool>,
        /// Unsupported unless absent or equal to `n`.
        pub best_of: Option<i64>,
        /// Text after the insertion point: fill-in-the-middle.
        pub suffix: Option<String>,
        /// Token id → bias added to its logit before sampling, −100–100.
        pub logit_bias: Option<Value>,
        /// Every other field, for the field policy (`http::fields`).
        #[serde(flatten)]
        pub extra: serde_json::Map<String, Value>,
    }
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose state came from the prefix cache.
    pub cached_tokens: usize,
}

/// `usage`.
#[derive(Debug, Clone, Serialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Sum of both.
    pub total_tokens: usize,
    /// Cache detail.
    pub prompt_tokens_details: PromptTokensDetails,
}

impl From<EngineUsage> for Usage {
    fn from(u: EngineUsage) -> Self {
        Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: u.cached_tokens,
            },
        }
    }
}

/// One `top_logprobs` alternative (chat shape).
#[derive(Debug, Clone, Serialize)]
pub struct TopLogprobJson {
    /// Token text.
    pub token: String,
    /// Natural-log probability.
    pub logprob: f32,
    /// UTF-8 bytes of the token.
    pub bytes: Vec<u8>,
}

impl From<&TopLogprob> for TopLogprobJson {
    fn from(t: &TopLogprob) -> Self {
        TopLogprobJson {
            token: t.token.clone(),
            logprob: t.logprob,
            bytes: t.bytes.clone(),
        }
    }
}

/// One `logprobs.content` entry (chat shape).
#[derive(Debug, Clone, Serialize)]
pub struct LogprobContent {
    /// Token text.
    pub token: String,
    /// Natural-log probability.
    pub logprob: f32,
    /// UTF-8 bytes of the token.
    pub bytes: Vec<u8>,
    /// Most likely alternatives.
    pub top_logprobs: Vec<TopLogprobJson>,
}

impl From<&LogprobEntry> for LogprobContent {
    fn from(e: &LogprobEntry) -> Self {
        LogprobContent {
            token: e.token.token.clone(),
            logprob: e.token.logprob,
            bytes: e.token.bytes.clone(),
            top_logprobs: e.top.iter().map(TopLogprobJson::from).collect(),
        }
    }
}

/// `choices[].logprobs` (chat shape).
#[derive(Debug, Clone, Serialize)]
pub struct ChatLogprobs {
    /// Entries of the content (and reasoning) tokens, in order.
    pub content: Vec<LogprobContent>,
    /// Always null: no refusals.
    pub refusal: Option<Vec<LogprobContent>>,
}

/// `choices[].message` of a chat completion.
#[derive(Debug, Clone, Serialize)]
pub struct ChatMessageOut {
    /// Always `assistant`.
    pub role: &'static str,
    /// The answer (empty when the budget ended inside the reasoning).
    pub content: Option<String>,
    /// The reasoning block's text; absent with thinking off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Always null.
    pub refusal: Option<String>,
    /// The calls the model made; absent when none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallOut>>,
}

/// One call of `message.tool_calls`.
#[derive(Debug, Clone, Serialize)]
pub struct ToolCallOut {
    /// `call_…`.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The function and its arguments.
    pub function: FunctionCallOut,
}

/// `tool_calls[].function`.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionCallOut {
    /// The function's name.
    pub name: String,
    /// The arguments as a JSON object's text.
    pub arguments: String,
}

/// One entry of `delta.tool_calls`: the first for a call carries `id`, `type` and `name`; later
/// ones only argument text to append (the openai SDK concatenates string fields).
#[derive(Debug, Clone, Serialize)]
pub struct ToolCallDelta {
    /// The call's position in the reply.
    pub index: usize,
    /// On the call's first delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function`, on the call's first delta.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// Name and/or argument text.
    pub function: FunctionDelta,
}

/// `delta.tool_calls[].function`.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionDelta {
    /// On the call's first delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Text to append to the arguments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// One choice of a chat completion.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    /// The choice's position, 0 … n−1.
    pub index: usize,
    /// The reply.
    pub message: ChatMessageOut,
    /// Log-probabilities when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop`, `length` or `tool_calls`.
    pub finish_reason: &'static str,
}

/// A non-streaming chat completion.
#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletion {
    /// `chatcmpl-…`.
    pub id: String,
    /// `chat.completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// Served model name.
    pub model: String,
    /// Build identity.
    pub system_fingerprint: String,
    /// `n` choices.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: Usage,
}

/// `choices[].delta` of a chunk; absent fields are omitted.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChatDelta {
    /// `assistant` on the first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// New answer text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// New reasoning text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// New tool calls and argument text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// One choice of a chunk.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChunkChoice {
    /// The choice this chunk belongs to.
    pub index: usize,
    /// New output.
    pub delta: ChatDelta,
    /// Entries of the tokens in this delta.
    pub logprobs: Option<ChatLogprobs>,
    /// Set on the last content chunk.
    pub finish_reason: Option<&'static str>,
}

/// A `chat.completion.chunk`.
pub type ChatCompletionChunk = Envelope<ChatChunkChoice>;

/// A `text_completion` (whole or chunk).
pub type Completion = Envelope<CompletionChoice>;

/// What a chat chunk and a text completion share around their choices.
#[derive(Debug, Clone, Serialize)]
pub struct Envelope<C> {
    /// Same for every chunk of a stream (`chatcmpl-…`, `cmpl-…`).
    pub id: String,
    /// `chat.completion.chunk` or `text_completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// Served model name.
    pub model: String,
    /// Build identity.
    pub system_fingerprint: String,
    /// The choices (one in a chunk), or none on the usage chunk.
    pub choices: Vec<C>,
    /// Token counts (a whole text completion, or the final chunk with `include_usage`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// Legacy completions logprobs.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CompletionLogprobs {
    /// Token texts.
    pub tokens: Vec<String>,
    /// Their log-probabilities.
    pub token_logprobs: Vec<f32>,
    /// Per token, alternative text → log-probability.
    pub top_logprobs: Vec<serde_json::Map<String, Value>>,
    /// Character offset of each token in the choice's text.
    pub text_offset: Vec<usize>,
}

/// One choice of a text completion (also used in its chunks).
#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    /// Generated text (a piece of it in a chunk).
    pub text: String,
    /// The choice's position, 0 … n−1.
    pub index: usize,
    /// Legacy logprobs when asked for.
    pub logprobs: Option<CompletionLogprobs>,
    /// `stop`/`length` at the end; null in earlier chunks.
    pub finish_reason: Option<&'static str>,
}

/// One entry of `GET /v1/models`.
#[derive(Debug, Clone, Serialize)]
pub struct ModelCard {
    /// The served name.
    pub id: String,
    /// `model`.
    pub object: &'static str,
    /// Unix seconds when the server loaded it.
    pub created: u64,
    /// `sluice`.
    pub owned_by: &'static str,
    /// Context limit (vLLM reports it too).
    pub max_model_len: usize,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, Serialize)]
pub struct ModelList {
    /// `list`.
    pub object: &'static str,
    /// The one served model.
    pub data: Vec<ModelCard>,
}
