//! One-line text of an error and its causes, each cause said once.
//!
//! Many error types both print their cause in their message (`"{path}: {source}"`) and return
//! it from `source()`; walking the chain naively (anyhow's `{:#}`) then prints the cause twice.
//! [`chain`] walks the same chain but leaves out a cause whose text the message so far already
//! ends with.

use std::error::Error;

/// `error`'s message followed by each of its causes (`": "`-separated), skipping a cause whose
/// text is already the tail of what has been written.
pub fn chain(error: &(dyn Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let part = e.to_string();
        if !part.is_empty() && !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        cause = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::chain;

    #[derive(Debug)]
    struct E(String, Option<Box<E>>);
    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }
    impl std::error::Error for E {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }
    fn e(msg: &str, cause: Option<E>) -> E {
        E(msg.to_string(), cause.map(Box::new))
    }

    #[test]
    fn a_cause_already_in_the_message_is_said_once() {
        let io = e("No such file or directory (os error 2)", None);
        let open = e(
            "/x/experts.sluice: No such file or directory (os error 2)",
            Some(io),
        );
        let top = e("container /x", Some(open));
        assert_eq!(
            chain(&top),
            "container /x: /x/experts.sluice: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn causes_not_in_the_message_are_all_kept() {
        let inner = e("unexpected end of file", None);
        let mid = e("reading the header", Some(inner));
        let top = e("shard 3", Some(mid));
        assert_eq!(
            chain(&top),
            "shard 3: reading the header: unexpected end of file"
        );
    }
}
