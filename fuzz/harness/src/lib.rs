//! Fuzz targets for every parser of bytes that come from disk or from a peer, written once and
//! driven two ways: by libFuzzer through the cargo-fuzz crate in `fuzz/` (nightly, coverage
//! guided, for deep runs) and by the stable runner `fuzz-stable` (`src/bin/fuzz_stable.rs`,
//! what CI runs: the committed corpus replayed, then outcome-guided random mutation for a
//! bounded time).
//!
//! A target takes arbitrary bytes and asserts the parser's contract with `assert!` (a panic is
//! a finding): no panic inside the parser, errors instead of unbounded allocation (the drivers
//! cap allocations), the documented invariants of every accepted value, and, where the format
//! has a writer, that encoding an accepted value gives back the accepted bytes. Each target
//! returns an [`Outcome`] naming which path the input took; the stable runner keeps inputs
//! that reach a new outcome, libFuzzer ignores it.

pub mod bytes;
pub mod seeds;
pub mod targets;

/// Which path an input took through a target: `ok…` for an accepted value, else the error's
/// kind (its `Debug` text with the numbers stripped). Used only as the stable runner's feedback.
pub type Outcome = String;

/// A fuzz target: bytes in, the path they took out; panics on a contract violation.
pub type Target = fn(&[u8]) -> Outcome;

/// Every target, by the name its corpus folder (`fuzz/corpus/<name>/`) and its cargo-fuzz
/// binary (`fuzz/libfuzzer/fuzz_targets/<name>.rs`) carry. `shm_segment` and `shm_ring` need
/// the `daemon` feature and `http_params` the `http` feature (both default).
pub fn targets() -> Vec<(&'static str, Target)> {
    let mut t: Vec<(&'static str, Target)> = vec![
        ("safetensors_header", targets::safetensors_header::run),
        ("container", targets::container::run),
        ("gguf", targets::gguf::run),
    ];
    #[cfg(feature = "daemon")]
    t.push(("shm_segment", targets::shm_segment::run));
    #[cfg(feature = "daemon")]
    t.push(("shm_ring", targets::shm_ring::run));
    t.push(("proto_convert", targets::proto_convert::run));
    #[cfg(feature = "http")]
    t.push(("http_params", targets::http_params::run));
    t
}

/// The outcome of an error: the start of its `Debug` text (variant and field names), digits
/// dropped and quoted text cut short, so that the same kind of failure on different values
/// (an invented field name, a number) counts once.
pub fn class(prefix: &str, e: &impl std::fmt::Debug) -> Outcome {
    let text = format!("{e:?}");
    let (mut kind, mut quoted, mut in_quote, mut escaped) = (String::new(), 0, false, false);
    for c in text.chars().filter(|c| !c.is_ascii_digit()) {
        let was_escaped = escaped;
        escaped = in_quote && c == '\\' && !was_escaped;
        if c == '"' && !was_escaped {
            in_quote = !in_quote;
            quoted = 0;
        } else if in_quote {
            quoted += 1;
            if quoted > 12 {
                continue;
            }
        }
        kind.push(c);
        if kind.len() >= 48 {
            break;
        }
    }
    format!("{prefix}:{kind}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every committed corpus file (seeds and past findings) and every generated seed passes
    /// its target: the findings stay fixed even where the fuzz step does not run.
    #[test]
    fn corpus_replays() {
        let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../corpus");
        for (name, target) in targets() {
            let mut n = 0;
            for entry in std::fs::read_dir(corpus.join(name)).expect("corpus folder") {
                let path = entry.expect("entry").path();
                target(&std::fs::read(&path).expect("corpus file"));
                n += 1;
            }
            for (_, bytes) in seeds::seeds(name) {
                target(&bytes);
            }
            assert!(n > 0, "{name} has no committed corpus");
        }
    }
}
