//! Qwen3.6 ChatML prompt rendering for text conversations (docs/model.md §7.3), written to match the model's Jinja template.
//!
//! Each turn is `<|im_start|>{role}\n{content}<|im_end|>\n`; there is no BOS. The optional system message must
//! come first. Assistant turns after the last user query carry their reasoning as
//! `<think>\n{reasoning}\n</think>\n\n{answer}` (an empty reasoning still renders the empty block, as the
//! official template does); older assistant turns keep only the answer unless `preserve_thinking` is set.
//! The generation prompt is `<|im_start|>assistant\n<think>\n` (thinking on, the default) or
//! `<|im_start|>assistant\n<think>\n\n</think>\n\n` (thinking off).
//!
//! Details reproduced from the official template: every message's content is trimmed of leading/trailing
//! whitespace (Jinja `|trim`, i.e. Python `str.strip()`), so is the reasoning; an assistant message without
//! `reasoning_content` whose content contains `</think>` has its reasoning split out of the content; a
//! conversation needs at least one user query; a user message wrapped entirely in
//! `<tool_response>…</tool_response>` does not count as a query.
//!
//! Tool calling ([`render_with_tools`], `tools.rs`): the `# Tools` system block, `tool_calls` on
//! assistant turns and `tool` results, as the official template writes them; golden conversations
//! rendered by transformers check it byte for byte (tests/oracle/tool_goldens.json).
//!
//! Out of scope: multimodal content (image/video placeholders).

#[cfg(test)]
mod goldens;
mod pyjson;
mod tools;

pub use pyjson::tojson;
pub use tools::ToolCall;

use serde_json::Value;
use std::fmt;
use std::str::FromStr;

/// Errors from rendering a conversation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChatTemplateError {
    /// The conversation has no messages.
    #[error("no messages provided")]
    NoMessages,
    /// A system message appears somewhere other than the first position.
    #[error("system message at index {index} must be at the beginning")]
    SystemNotFirst {
        /// Index of the offending message.
        index: usize,
    },
    /// There is no user query (a user message that is not just a tool response).
    #[error("no user query found in messages")]
    NoUserQuery,
    /// A role name other than system/user/assistant/tool.
    #[error("unsupported message role {0:?} (only system, user, assistant and tool)")]
    UnknownRole(String),
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Instructions for the assistant; at most one, and only as the first message.
    System,
    /// A user turn.
    User,
    /// A model turn (possibly with reasoning and tool calls).
    Assistant,
    /// A tool's result, rendered inside a user turn as `<tool_response>`.
    Tool,
}

impl Role {
    /// The role's name as written in the prompt.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = ChatTemplateError;

    /// Parse `system`, `user`, `assistant` or `tool`; anything else is
    /// [`ChatTemplateError::UnknownRole`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "system" => Ok(Role::System),
            "user" => Ok(Role::User),
            "assistant" => Ok(Role::Assistant),
            "tool" => Ok(Role::Tool),
            other => Err(ChatTemplateError::UnknownRole(other.to_string())),
        }
    }
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// Who wrote it.
    pub role: Role,
    /// The visible text (for an assistant turn: the answer).
    pub content: String,
    /// An assistant turn's reasoning (the text inside `<think>…</think>`); ignored on other roles.
    pub reasoning_content: Option<String>,
    /// An assistant turn's tool calls, rendered after its content; ignored on other roles.
    pub tool_calls: Vec<ToolCall>,
}

impl ChatMessage {
    /// A message without reasoning.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            reasoning_content: None,
            tool_calls: Vec::new(),
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }

    /// An assistant message without reasoning.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(Role::Assistant, content)
    }

    /// An assistant message with its reasoning.
    pub fn assistant_with_reasoning(
        content: impl Into<String>,
        reasoning: impl Into<String>,
    ) -> Self {
        Self {
            role: Role::Assistant,
            content: content.into(),
            reasoning_content: Some(reasoning.into()),
            tool_calls: Vec::new(),
        }
    }

    /// A tool's result.
    pub fn tool(content: impl Into<String>) -> Self {
        Self::new(Role::Tool, content)
    }

    /// The same message with these tool calls (meaningful on an assistant turn).
    pub fn with_tool_calls(mut self, calls: Vec<ToolCall>) -> Self {
        self.tool_calls = calls;
        self
    }
}

/// Rendering switches (the template's `add_generation_prompt`, `enable_thinking`, `preserve_thinking`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChatOptions {
    /// Append the assistant prompt that the model continues from.
    pub add_generation_prompt: bool,
    /// Thinking on: the prompt opens a `<think>` block; off: it contains an empty closed block.
    pub enable_thinking: bool,
    /// Keep the reasoning of every past assistant turn, not only of those after the last user query.
    pub preserve_thinking: bool,
}

impl Default for ChatOptions {
    /// Generation prompt on, thinking on (the model's default), reasoning of old turns dropped.
    fn default() -> Self {
        Self {
            add_generation_prompt: true,
            enable_thinking: true,
            preserve_thinking: false,
        }
    }
}

const IM_START: &str = "<|im_start|>";
const IM_END: &str = "<|im_end|>";
const THINK: &str = "<think>";
const THINK_END: &str = "</think>";

/// Render a conversation without tools to the prompt text (encode it with special tokens matched
/// as text).
pub fn render(
    messages: &[ChatMessage],
    options: &ChatOptions,
) -> Result<String, ChatTemplateError> {
    render_with_tools(messages, &[], options)
}

/// Render a conversation with the tool definitions `tools` (each rendered as given, with
/// `tojson`; an empty list means no tools) to the prompt text.
pub fn render_with_tools(
    messages: &[ChatMessage],
    tools: &[Value],
    options: &ChatOptions,
) -> Result<String, ChatTemplateError> {
    if messages.is_empty() {
        return Err(ChatTemplateError::NoMessages);
    }
    let system = (messages[0].role == Role::System).then(|| py_trim(&messages[0].content));
    let mut out = String::new();
    if !tools.is_empty() {
        tools::push_system_with_tools(&mut out, tools, system);
    } else if let Some(s) = system {
        push_turn(&mut out, Role::System, s);
    }
    let last_query = messages
        .iter()
        .rposition(|m| m.role == Role::User && is_query(&m.content))
        .ok_or(ChatTemplateError::NoUserQuery)?;
    if let Some(index) = messages.iter().skip(1).position(|m| m.role == Role::System) {
        return Err(ChatTemplateError::SystemNotFirst { index: index + 1 });
    }

    for (index, message) in messages.iter().enumerate() {
        let content = py_trim(&message.content);
        match message.role {
            Role::System => {}
            Role::User => push_turn(&mut out, message.role, content),
            Role::Assistant => {
                let (reasoning, answer) = match &message.reasoning_content {
                    Some(r) => (r.as_str(), content),
                    None => split_inline_reasoning(content),
                };
                out.push_str(IM_START);
                out.push_str("assistant\n");
                if options.preserve_thinking || index > last_query {
                    out.push_str(THINK);
                    out.push('\n');
                    out.push_str(py_trim(reasoning));
                    out.push('\n');
                    out.push_str(THINK_END);
                    out.push_str("\n\n");
                }
                out.push_str(answer);
                tools::push_tool_calls(&mut out, &message.tool_calls, py_trim(answer).is_empty());
                out.push_str(IM_END);
                out.push('\n');
            }
            Role::Tool => {
                let prev = index.checked_sub(1).map(|p| messages[p].role == Role::Tool);
                let next = messages
                    .get(index + 1)
                    .is_some_and(|m| m.role == Role::Tool);
                tools::push_tool_response(&mut out, content, prev, next);
            }
        }
    }
    if options.add_generation_prompt {
        out.push_str(&generation_prompt(options.enable_thinking));
    }
    Ok(out)
}

/// The text appended by `add_generation_prompt`: `<|im_start|>assistant\n<think>\n` with thinking on,
/// `<|im_start|>assistant\n<think>\n\n</think>\n\n` with thinking off.
pub fn generation_prompt(enable_thinking: bool) -> String {
    if enable_thinking {
        format!("{IM_START}assistant\n{THINK}\n")
    } else {
        format!("{IM_START}assistant\n{THINK}\n\n{THINK_END}\n\n")
    }
}

fn push_turn(out: &mut String, role: Role, content: &str) {
    out.push_str(IM_START);
    out.push_str(role.as_str());
    out.push('\n');
    out.push_str(content);
    out.push_str(IM_END);
    out.push('\n');
}

/// A user message counts as a query unless its (trimmed) content is a bare tool response.
fn is_query(content: &str) -> bool {
    let c = py_trim(content);
    !(c.starts_with("<tool_response>") && c.ends_with("</tool_response>"))
}

/// The template's fallback for assistant content with inline reasoning (`content` already trimmed):
/// reasoning = `content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')`,
/// answer = `content.split('</think>')[-1].lstrip('\n')`. Without `</think>` there is no reasoning.
fn split_inline_reasoning(content: &str) -> (&str, &str) {
    let Some(first_end) = content.find(THINK_END) else {
        return ("", content);
    };
    let before = content[..first_end].trim_end_matches('\n');
    let reasoning = before
        .rsplit_once(THINK)
        .map_or(before, |(_, r)| r)
        .trim_start_matches('\n');
    let after_last = content
        .rsplit_once(THINK_END)
        .map_or(content, |(_, a)| a)
        .trim_start_matches('\n');
    (reasoning, after_last)
}

/// Python `str.isspace()`: Unicode White_Space plus the ASCII information separators U+001C…U+001F.
fn py_is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Jinja's `|trim` (Python `str.strip()` without arguments).
fn py_trim(s: &str) -> &str {
    s.trim_matches(py_is_space)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(
        add_generation_prompt: bool,
        enable_thinking: bool,
        preserve_thinking: bool,
    ) -> ChatOptions {
        ChatOptions {
            add_generation_prompt,
            enable_thinking,
            preserve_thinking,
        }
    }

    #[test]
    fn spec_test_vector() {
        let got = render(&[ChatMessage::user("hi")], &ChatOptions::default()).unwrap();
        assert_eq!(
            got,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
        );
    }

    #[test]
    fn thinking_off_prompt() {
        let got = render(&[ChatMessage::user("hi")], &opts(true, false, false)).unwrap();
        assert_eq!(
            got,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        );
    }

    #[test]
    fn no_generation_prompt() {
        let got = render(&[ChatMessage::user("hi")], &opts(false, true, false)).unwrap();
        assert_eq!(got, "<|im_start|>user\nhi<|im_end|>\n");
    }

    #[test]
    fn system_first() {
        let msgs = [
            ChatMessage::system("You are terse."),
            ChatMessage::user("2+2?"),
        ];
        let got = render(&msgs, &ChatOptions::default()).unwrap();
        assert_eq!(
            got,
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n\
             <|im_start|>assistant\n<think>\n"
        );
    }

    #[test]
    fn system_not_first_is_an_error() {
        let msgs = [ChatMessage::user("a"), ChatMessage::system("s")];
        assert_eq!(
            render(&msgs, &ChatOptions::default()),
            Err(ChatTemplateError::SystemNotFirst { index: 1 })
        );
    }

    #[test]
    fn empty_and_queryless_conversations_are_errors() {
        assert_eq!(
            render(&[], &ChatOptions::default()),
            Err(ChatTemplateError::NoMessages)
        );
        assert_eq!(
            render(&[ChatMessage::system("s")], &ChatOptions::default()),
            Err(ChatTemplateError::NoUserQuery)
        );
        let only_tool = [ChatMessage::user("<tool_response>\n42\n</tool_response>")];
        assert_eq!(
            render(&only_tool, &ChatOptions::default()),
            Err(ChatTemplateError::NoUserQuery)
        );
    }

    #[test]
    fn roles_parse_and_others_are_rejected() {
        assert_eq!("assistant".parse::<Role>(), Ok(Role::Assistant));
        assert_eq!("system".parse::<Role>(), Ok(Role::System));
        assert_eq!("user".parse::<Role>(), Ok(Role::User));
        assert_eq!("tool".parse::<Role>(), Ok(Role::Tool));
        assert_eq!(
            "function".parse::<Role>(),
            Err(ChatTemplateError::UnknownRole("function".into()))
        );
        assert_eq!(
            "User".parse::<Role>(),
            Err(ChatTemplateError::UnknownRole("User".into()))
        );
    }

    fn two_rounds() -> Vec<ChatMessage> {
        vec![
            ChatMessage::user("First"),
            ChatMessage::assistant_with_reasoning("Old answer", "old trace"),
            ChatMessage::user("Second"),
            ChatMessage::assistant_with_reasoning("New answer", "new trace"),
        ]
    }

    #[test]
    fn old_reasoning_dropped_new_kept() {
        let got = render(&two_rounds(), &opts(false, true, false)).unwrap();
        assert_eq!(
            got,
            "<|im_start|>user\nFirst<|im_end|>\n\
             <|im_start|>assistant\nOld answer<|im_end|>\n\
             <|im_start|>user\nSecond<|im_end|>\n\
             <|im_start|>assistant\n<think>\nnew trace\n</think>\n\nNew answer<|im_end|>\n"
        );
    }

    #[test]
    fn preserve_thinking_keeps_all_reasoning() {
        let got = render(&two_rounds()[..3], &opts(true, true, true)).unwrap();
        assert_eq!(
            got,
            "<|im_start|>user\nFirst<|im_end|>\n\
             <|im_start|>assistant\n<think>\nold trace\n</think>\n\nOld answer<|im_end|>\n\
             <|im_start|>user\nSecond<|im_end|>\n\
             <|im_start|>assistant\n<think>\n"
        );
    }

    #[test]
    fn assistant_after_last_query_without_reasoning_gets_empty_block() {
        let msgs = [ChatMessage::user("q"), ChatMessage::assistant("a")];
        assert_eq!(
            render(&msgs, &opts(false, true, false)).unwrap(),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\na<|im_end|>\n"
        );
        // With preserve_thinking, an older reasoning-less turn also gets the empty block.
        let msgs = [
            ChatMessage::user("q"),
            ChatMessage::assistant("a"),
            ChatMessage::user("r"),
        ];
        assert_eq!(
            render(&msgs, &opts(false, true, true)).unwrap(),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\na<|im_end|>\n\
             <|im_start|>user\nr<|im_end|>\n"
        );
    }

    #[test]
    fn content_and_reasoning_are_trimmed() {
        let msgs = [
            ChatMessage::system("\n  sys \t"),
            ChatMessage::user("  hi there \n\n"),
            ChatMessage::assistant_with_reasoning("\n\nanswer  ", "\n  why \n"),
        ];
        assert_eq!(
            render(&msgs, &opts(false, true, false)).unwrap(),
            "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi there<|im_end|>\n\
             <|im_start|>assistant\n<think>\nwhy\n</think>\n\nanswer<|im_end|>\n"
        );
        // Python's strip() also removes U+001C..U+001F; inner whitespace is untouched.
        assert_eq!(py_trim("\u{1f}\u{3000}a  b\u{1c}"), "a  b");
    }

    #[test]
    fn inline_reasoning_is_split_out_of_content() {
        let msgs = [
            ChatMessage::user("q"),
            ChatMessage::assistant("<think>\nstep 1\nstep 2\n</think>\n\nThe answer."),
        ];
        assert_eq!(
            render(&msgs, &opts(false, true, false)).unwrap(),
            "<|im_start|>user\nq<|im_end|>\n\
             <|im_start|>assistant\n<think>\nstep 1\nstep 2\n</think>\n\nThe answer.<|im_end|>\n"
        );
        // Older turn: the inline reasoning is dropped.
        let msgs = [
            ChatMessage::user("q"),
            ChatMessage::assistant("<think>r</think>a"),
            ChatMessage::user("q2"),
        ];
        assert_eq!(
            render(&msgs, &opts(false, true, false)).unwrap(),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n"
        );
        assert_eq!(
            split_inline_reasoning("no think here"),
            ("", "no think here")
        );
        assert_eq!(
            split_inline_reasoning("x<think>a<think>\nb\n</think>c</think>\nd"),
            ("b", "d")
        );
    }

    #[test]
    fn tool_response_user_turn_does_not_move_last_query() {
        let msgs = [
            ChatMessage::user("weather?"),
            ChatMessage::assistant_with_reasoning("calling", "need a tool"),
            ChatMessage::user("<tool_response>\nsunny\n</tool_response>"),
            ChatMessage::assistant_with_reasoning("It is sunny.", "got it"),
        ];
        assert_eq!(
            render(&msgs, &opts(false, true, false)).unwrap(),
            "<|im_start|>user\nweather?<|im_end|>\n\
             <|im_start|>assistant\n<think>\nneed a tool\n</think>\n\ncalling<|im_end|>\n\
             <|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n\
             <|im_start|>assistant\n<think>\ngot it\n</think>\n\nIt is sunny.<|im_end|>\n"
        );
    }

    #[test]
    fn reasoning_on_user_message_is_ignored() {
        let mut m = ChatMessage::user("hi");
        m.reasoning_content = Some("ignored".into());
        assert_eq!(
            render(&[m], &opts(false, true, false)).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n"
        );
    }
}
