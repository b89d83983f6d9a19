//! Peer-supplied strings (a client's name, anything else a request carries) as log fields:
//! control characters, newlines and escape sequences are escaped (`str::escape_debug`), and the
//! text is cut at a bound ([`MAX_NAME_CHARS`] for names, [`MAX_TEXT_CHARS`] for error texts
//! that may quote a request), so that a client cannot forge log lines,
//! recolour the terminal of whoever reads the log, or flood it.

use std::fmt;

/// Most characters of a peer-supplied name written to the log (the rest is counted).
pub const MAX_NAME_CHARS: usize = 128;
/// Most characters of an error text written to the log.
pub const MAX_TEXT_CHARS: usize = 2048;

/// A string made safe for a log field; build it with [`name`] or [`text`].
#[derive(Debug, Clone, Copy)]
pub struct Escaped<'a> {
    s: &'a str,
    max_chars: usize,
}

/// A peer-supplied name for a log field: `tracing::info!(client_name = %logsafe::name(&n))`.
pub fn name(s: &str) -> Escaped<'_> {
    Escaped {
        s,
        max_chars: MAX_NAME_CHARS,
    }
}

/// An error text (which may quote a request) for a log field.
pub fn text(s: &str) -> Escaped<'_> {
    Escaped {
        s,
        max_chars: MAX_TEXT_CHARS,
    }
}

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut chars = self.s.char_indices();
        for (_, c) in chars.by_ref().take(self.max_chars) {
            // `escape_debug` also escapes quotes; log fields are quoted by nobody, keep them.
            if c == '"' || c == '\'' {
                f.write_fmt(format_args!("{c}"))?;
            } else {
                f.write_fmt(format_args!("{}", c.escape_debug()))?;
            }
        }
        if let Some((at, _)) = chars.next() {
            write!(f, "…(+{} bytes)", self.s.len() - at)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_length_bounded() {
        let s = name("evil\n\x1b[31mred\r\u{7}\u{202e}'\"").to_string();
        assert_eq!(s, "evil\\n\\u{1b}[31mred\\r\\u{7}\\u{202e}'\"");
        assert!(!s.chars().any(char::is_control), "{s:?}");
        let long = "x".repeat(MAX_NAME_CHARS + 50);
        assert_eq!(
            name(&long).to_string(),
            format!("{}…(+50 bytes)", "x".repeat(MAX_NAME_CHARS))
        );
        assert_eq!(text(&long).to_string(), long);
        assert_eq!(name("plain name").to_string(), "plain name");
    }
}
