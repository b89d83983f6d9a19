//! Incremental parser of the model's tool calls: fed the reply's content text (what follows
//! `</think>`) in arbitrary pieces, it separates plain content from
//! `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>`
//! blocks and turns each call into a name and a JSON arguments string, typed by the tool's schema
//! (`schema.rs`). The output is the same however the text is split.
//!
//! Rules (docs/tool-calling.md):
//! - A call starts only at `<tool_call>` followed (after whitespace) by `<function=NAME>` with NAME
//!   one of the request's tools. Anything else — an unknown name, text that is not a function
//!   header, a stream that ends before the header is complete — is left in the content, verbatim.
//! - Once a call has started it is committed: text between parameters that is not a tag is
//!   dropped; a missing `</function>` or `</tool_call>` is tolerated; a reply that ends inside a
//!   call (the token budget ran out) closes it with what was read, so its arguments stay valid JSON;
//!   a value cut short is kept only when its text is a whole value of its type (a raw string's
//!   prefix is; half-written JSON is not, and is left out rather than passed off as a string).
//! - A parameter's value is the text between `<parameter=KEY>` and `</parameter>` with one
//!   leading and one trailing newline removed (the template puts them there). Only
//!   `</parameter>` ends a value.
//! - Whitespace just before a call, between calls and after the last one is dropped; other text
//!   after a call is content.
//! - With `max_calls` (`parallel_tool_calls: false` → 1), calls past the limit are parsed and
//!   dropped.
//!
//! Arguments stream as fragments: `{` when the call starts, `"key":value` (comma-separated) as
//! each parameter completes, `}` at the end; their concatenation is the call's arguments.

mod schema;
pub use schema::is_raw_text;

pub use schema::typed_value;

use serde_json::Value;

const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";
const FUNCTION_OPEN: &str = "<function=";
const FUNCTION_CLOSE: &str = "</function>";
const PARAM_OPEN: &str = "<parameter=";
const PARAM_CLOSE: &str = "</parameter>";
/// Longest function or parameter name the parser waits for before calling the header malformed.
const MAX_NAME: usize = 256;

/// A tool the model may call: its name and its `parameters` JSON schema.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// The function's name.
    pub name: String,
    /// The `parameters` schema (an object), when given.
    pub parameters: Option<Value>,
}

/// What the parser found in the text fed so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolEvent {
    /// Plain content.
    Content(String),
    /// Call number `index` (0-based, in order) of function `name` started.
    CallStart {
        /// The call's position among this reply's calls.
        index: usize,
        /// The function's name.
        name: String,
    },
    /// More of call `index`'s JSON arguments.
    Arguments {
        /// The call's position.
        index: usize,
        /// Text to append to its arguments.
        fragment: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    /// Plain content; looking for `<tool_call>`.
    Text,
    /// After `<tool_call>`; waiting for `<function=NAME>`.
    Open,
    /// Inside a call, between parameters.
    Function { call: Call },
    /// Inside a parameter's value.
    Param { call: Call, key: String },
    /// After `</function>`; waiting for `</tool_call>`.
    AfterFunction,
}

#[derive(Debug, Clone, PartialEq)]
struct Call {
    index: usize,
    tool: usize,
    params: usize,
    /// False for a call past `max_calls`: parsed, not reported.
    report: bool,
}

/// The incremental parser of one reply.
#[derive(Debug)]
pub struct ToolCallParser {
    tools: Vec<ToolSpec>,
    max_calls: Option<usize>,
    state: State,
    buf: String,
    /// Whitespace at the end of the content, held until it is known not to precede a call.
    held: String,
    /// Drop leading whitespace of the content that follows a call.
    after_call: bool,
    calls: usize,
    reported: usize,
    events: Vec<ToolEvent>,
}

impl ToolCallParser {
    /// A parser for a request offering `tools`; `max_calls` limits the reported calls.
    pub fn new(tools: Vec<ToolSpec>, max_calls: Option<usize>) -> Self {
        ToolCallParser {
            tools,
            max_calls,
            state: State::Text,
            buf: String::new(),
            held: String::new(),
            after_call: false,
            calls: 0,
            reported: 0,
            events: Vec::new(),
        }
    }

    /// Number of calls reported so far.
    pub fn reported_calls(&self) -> usize {
        self.reported
    }

    /// Feeds the next piece of content text; returns what became certain.
    pub fn feed(&mut self, text: &str) -> Vec<ToolEvent> {
        self.buf.push_str(text);
        while self.step(false) {}
        std::mem::take(&mut self.events)
    }

    /// The text has ended: settles whatever is pending.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        while self.step(true) {}
        match std::mem::replace(&mut self.state, State::Text) {
            State::Text | State::AfterFunction => {}
            State::Open => {
                let rest = std::mem::take(&mut self.buf);
                self.content(&format!("{CALL_OPEN}{rest}"));
            }
            State::Function { call } => self.args(&call, "}"),
            State::Param { mut call, key } => {
                // Cut short inside a value: kept only if what was written is a whole value
                // of the parameter's type (issue 39 (d)), else left out of the arguments.
                let mut raw = std::mem::take(&mut self.buf);
                raw.truncate(raw.len() - partial_suffix(&raw, &format!("\n{PARAM_CLOSE}")));
                let raw = raw.strip_prefix('\n').unwrap_or(&raw);
                let schema = self.tools[call.tool].parameters.as_ref();
                if let Some(value) = schema::typed_value_if_complete(raw, schema, &key) {
                    self.push_param(&mut call, &key, &value);
                }
                self.args(&call, "}");
            }
        }
        let rest = std::mem::take(&mut self.buf);
        self.content(&rest);
        if self.calls == 0 {
            let held = std::mem::take(&mut self.held);
            self.push_content(held);
        }
        std::mem::take(&mut self.events)
    }

    /// One transition; false when more text is needed (or, at `end`, when nothing changed).
    fn step(&mut self, end: bool) -> bool {
        match self.state.clone() {
            State::Text => {
                if let Some(p) = self.buf.find(CALL_OPEN) {
                    let before: String = self.buf.drain(..p + CALL_OPEN.len()).collect();
                    self.content(&before[..p]);
                    self.state = State::Open;
                    true
                } else {
                    let keep = if end {
                        0
                    } else {
                        partial_suffix(&self.buf, CALL_OPEN)
                    };
                    let upto = self.buf.len() - keep;
                    let text: String = self.buf.drain(..upto).collect();
                    self.content(&text);
                    false
                }
            }
            State::Open => self.open(end),
            State::Function { call } => self.between_params(call, end),
            State::Param { mut call, key } => {
                let Some(p) = self.buf.find(PARAM_CLOSE) else {
                    return false;
                };
                let raw: String = self.buf.drain(..p + PARAM_CLOSE.len()).collect();
                self.param(&mut call, &key, &raw[..p]);
                self.state = State::Function { call };
                true
            }
            State::AfterFunction => {
                let rest = self.buf.trim_start();
                if rest.starts_with(CALL_CLOSE) {
                    let cut = self.buf.len() - rest.len() + CALL_CLOSE.len();
                    self.buf.drain(..cut);
                } else if !end && CALL_CLOSE.starts_with(rest) {
                    return false;
                }
                self.end_call();
                true
            }
        }
    }

    /// After `<tool_call>`: a known `<function=NAME>` starts a call; anything else is content.
    fn open(&mut self, end: bool) -> bool {
        let rest = self.buf.trim_start();
        if rest.is_empty() || (FUNCTION_OPEN.starts_with(rest) && rest.len() < FUNCTION_OPEN.len())
        {
            // Wait for more; at the end `finish` leaves it all as content.
            return false;
        }
        let header = rest
            .strip_prefix(FUNCTION_OPEN)
            .and_then(|after| match after.find('>') {
                Some(gt) => Some(Some((after[..gt].to_string(), gt))),
                None if !end && after.len() <= MAX_NAME && !after.contains(['\n', '<']) => {
                    Some(None)
                }
                None => None,
            });
        match header {
            Some(None) => false,
            Some(Some((name, gt))) if !name.contains('\n') => {
                match self.tools.iter().position(|t| t.name == name) {
                    Some(tool) => {
                        let cut = self.buf.len() - rest.len() + FUNCTION_OPEN.len() + gt + 1;
                        self.buf.drain(..cut);
                        self.held.clear();
                        let index = self.calls;
                        self.calls += 1;
                        let report = self.max_calls.is_none_or(|m| index < m);
                        let call = Call {
                            index,
                            tool,
                            params: 0,
                            report,
                        };
                        if report {
                            self.reported += 1;
                            self.events.push(ToolEvent::CallStart { index, name });
                        }
                        self.args(&call, "{");
                        self.state = State::Function { call };
                        true
                    }
                    None => self.malformed(),
                }
            }
            _ => self.malformed(),
        }
    }

    /// Not a call after all: `<tool_call>` and what follows are content.
    fn malformed(&mut self) -> bool {
        self.content(CALL_OPEN);
        self.state = State::Text;
        true
    }

    fn between_params(&mut self, call: Call, end: bool) -> bool {
        let rest = self.buf.trim_start();
        let skipped = self.buf.len() - rest.len();
        if let Some(after) = rest.strip_prefix(PARAM_OPEN) {
            if let Some(gt) = after.find('>') {
                let key = after[..gt].to_string();
                self.buf.drain(..skipped + PARAM_OPEN.len() + gt + 1);
                self.state = State::Param { call, key };
                return true;
            }
            if !end && after.len() <= MAX_NAME {
                return false;
            }
        } else if rest.starts_with(FUNCTION_CLOSE) {
            self.buf.drain(..skipped + FUNCTION_CLOSE.len());
            self.args(&call, "}");
            self.state = State::AfterFunction;
            return true;
        } else if rest.starts_with(CALL_CLOSE) {
            self.buf.drain(..skipped + CALL_CLOSE.len());
            self.args(&call, "}");
            self.end_call();
            return true;
        } else if !end
            && [PARAM_OPEN, FUNCTION_CLOSE, CALL_CLOSE]
                .iter()
                .any(|t| t.starts_with(rest))
        {
            self.buf.drain(..skipped);
            return false;
        }
        if rest.is_empty() {
            self.buf.clear();
            return false;
        }
        // Stray text inside a call: drop it up to the next tag.
        let drop = skipped + rest[1..].find('<').map_or(rest.len(), |p| p + 1);
        self.buf.drain(..drop);
        self.state = State::Function { call };
        true
    }

    /// A completed parameter: its `"key":value` fragment.
    fn param(&mut self, call: &mut Call, key: &str, raw: &str) {
        let raw = raw.strip_prefix('\n').unwrap_or(raw);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let value = typed_value(raw, self.tools[call.tool].parameters.as_ref(), key);
        self.push_param(call, key, &value);
    }

    /// Appends `"key":value` to the call's arguments.
    fn push_param(&mut self, call: &mut Call, key: &str, value: &Value) {
        let sep = if call.params > 0 { "," } else { "" };
        let key_json = serde_json::to_string(key).unwrap_or_default();
        let value_json = serde_json::to_string(&value).unwrap_or_default();
        call.params += 1;
        self.args(call, &format!("{sep}{key_json}:{value_json}"));
    }

    fn args(&mut self, call: &Call, fragment: &str) {
        if call.report {
            self.events.push(ToolEvent::Arguments {
                index: call.index,
                fragment: fragment.to_string(),
            });
        }
    }

    fn end_call(&mut self) {
        self.state = State::Text;
        self.after_call = true;
    }

    /// Content text: leading whitespace after a call dropped, trailing whitespace held back.
    fn content(&mut self, text: &str) {
        let mut text = text;
        if self.after_call {
            text = text.trim_start();
            if text.is_empty() {
                return;
            }
            self.after_call = false;
        }
        let body = text.trim_end();
        if body.is_empty() {
            self.held.push_str(text);
            return;
        }
        let mut out = std::mem::take(&mut self.held);
        out.push_str(body);
        self.held = text[body.len()..].to_string();
        self.push_content(out);
    }

    fn push_content(&mut self, text: String) {
        if text.is_empty() {
            return;
        }
        if let Some(ToolEvent::Content(last)) = self.events.last_mut() {
            last.push_str(&text);
        } else {
            self.events.push(ToolEvent::Content(text));
        }
    }
}

/// Length of the longest proper prefix of `tag` that `s` ends with.
fn partial_suffix(s: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&n| {
            s.len() >= n && s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..])
        })
        .unwrap_or(0)
}

/// A whole reply parsed at once: its content (empty when none) and its calls as (name, arguments).
pub fn parse_all(
    tools: Vec<ToolSpec>,
    max_calls: Option<usize>,
    text: &str,
) -> (String, Vec<(String, String)>) {
    let mut p = ToolCallParser::new(tools, max_calls);
    let mut events = p.feed(text);
    events.extend(p.finish());
    fold(events)
}

/// Folds events into content and calls.
pub fn fold(events: Vec<ToolEvent>) -> (String, Vec<(String, String)>) {
    let mut content = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    for e in events {
        match e {
            ToolEvent::Content(t) => content.push_str(&t),
            ToolEvent::CallStart { name, .. } => calls.push((name, String::new())),
            ToolEvent::Arguments { index, fragment } => calls[index].1.push_str(&fragment),
        }
    }
    (content, calls)
}

#[cfg(test)]
mod tests;
