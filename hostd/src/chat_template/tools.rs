//! The tool-calling parts of the Qwen3.6 template: the `# Tools` system block, an assistant
//! turn's `<tool_call>` blocks, and `tool` results as `<tool_response>` blocks of a user turn.
//! The text is the official template's (tests/oracle/templates/qwen36-35b-a3b.chat_template.jinja).

use super::pyjson::{py_str, tojson};
use super::{IM_END, IM_START};
use serde_json::{Map, Value};

/// One call of an assistant turn, as the template reads it (`tool_call.function` unwrapped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The function's name.
    pub name: String,
    /// Its arguments in the order given; `None` renders no parameters (the template's
    /// `tool_call.arguments is defined` test).
    pub arguments: Option<Map<String, Value>>,
}

impl ToolCall {
    /// A call with arguments.
    pub fn new(name: impl Into<String>, arguments: Map<String, Value>) -> Self {
        Self {
            name: name.into(),
            arguments: Some(arguments),
        }
    }
}

const TOOLS_HEAD: &str = "# Tools\n\nYou have access to the following functions:\n\n<tools>";

const TOOLS_INSTRUCTIONS: &str = "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n\
<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n\
<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n</parameter>\n\
</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n\
- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n\
- Required parameters MUST be specified\n\
- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n\
- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n\
</IMPORTANT>";

/// The system turn when tools are given: the tool list (one `tojson` line each), the format
/// instructions, then the system message's (trimmed) text after a blank line when non-empty.
pub(super) fn push_system_with_tools(out: &mut String, tools: &[Value], system: Option<&str>) {
    out.push_str(IM_START);
    out.push_str("system\n");
    out.push_str(TOOLS_HEAD);
    for tool in tools {
        out.push('\n');
        out.push_str(&tojson(tool));
    }
    out.push_str("\n</tools>");
    out.push_str(TOOLS_INSTRUCTIONS);
    if let Some(s) = system.filter(|s| !s.is_empty()) {
        out.push_str("\n\n");
        out.push_str(s);
    }
    out.push_str(IM_END);
    out.push('\n');
}

/// The calls of an assistant turn, appended after its content: the first after `\n\n` only
/// when the content is non-empty, later ones after `\n`. A string argument is written raw,
/// an object or array as `tojson`, anything else as Python's `str()` (`True`, `None`, `2.5`).
pub(super) fn push_tool_calls(out: &mut String, calls: &[ToolCall], content_is_empty: bool) {
    for (i, call) in calls.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        } else if !content_is_empty {
            out.push_str("\n\n");
        }
        out.push_str("<tool_call>\n<function=");
        out.push_str(&call.name);
        out.push_str(">\n");
        for (key, value) in call.arguments.iter().flatten() {
            out.push_str("<parameter=");
            out.push_str(key);
            out.push_str(">\n");
            match value {
                Value::Object(_) | Value::Array(_) => out.push_str(&tojson(value)),
                other => out.push_str(&py_str(other)),
            }
            out.push_str("\n</parameter>\n");
        }
        out.push_str("</function>\n</tool_call>");
    }
}

/// One `tool` message: a user turn opens unless the previous message was a tool result too
/// (or there is no previous message); the turn closes unless the next message is one.
pub(super) fn push_tool_response(
    out: &mut String,
    content: &str,
    prev_is_tool: Option<bool>,
    next_is_tool: bool,
) {
    if prev_is_tool == Some(false) {
        out.push_str(IM_START);
        out.push_str("user");
    }
    out.push_str("\n<tool_response>\n");
    out.push_str(content);
    out.push_str("\n</tool_response>");
    if !next_is_tool {
        out.push_str(IM_END);
        out.push('\n');
    }
}
