//! Size flags as people type them: `--cache-bytes 16GiB`, `2G`, `512MiB` or plain bytes.
//!
//! IEC suffixes (`Ki`, `Mi`, `Gi`, `Ti`, with or without `B`) are powers of 1024; SI suffixes
//! (`K`, `M`, `G`, `T`, with or without `B`) are powers of 1000, as in the `parse-size` crate
//! that does the parsing (case-insensitive, fractions allowed, overflow refused).

/// What every size flag's error says it accepts.
const ACCEPTED: &str =
    "expected bytes or a size such as 16GiB or 16Gi (x 2^30), 16GB or 16G (x 10^9), 512MiB";

/// Parses a size flag's value into bytes (a clap `value_parser`).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    parse_size::parse_size(text.trim()).map_err(|e| format!("`{text}`: {e}; {ACCEPTED}"))
}

/// [`parse_bytes`] for a flag held as `usize`.
pub fn parse_bytes_usize(text: &str) -> Result<usize, String> {
    let bytes = parse_bytes(text)?;
    usize::try_from(bytes)
        .map_err(|_| format!("`{text}`: {bytes} bytes do not fit this machine's address space"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_follow_iec_and_si() {
        assert_eq!(parse_bytes("1073741824"), Ok(1 << 30));
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes("2Gi"), Ok(2 << 30));
        assert_eq!(parse_bytes("2gib"), Ok(2 << 30));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_bytes("2G"), Ok(2_000_000_000));
        assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes(" 8 GiB "), Ok(8 << 30));
    }

    #[test]
    fn nonsense_and_overflow_are_refused_with_the_accepted_forms() {
        for bad in ["2XB", "GiB", "", "-1", "99999EiB"] {
            let e = parse_bytes(bad).expect_err(bad);
            assert!(e.contains("16GiB"), "{bad}: {e}");
            assert!(e.contains(&format!("`{bad}`")), "{bad}: {e}");
        }
    }
}
