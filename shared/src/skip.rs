//! How a test skips what its machine cannot run (an instruction set, a memory cgroup, io_uring):
//! one `SKIPPED` line in the test's output and in the run's skip list (the file
//! `SLUICE_SKIP_LOG` names, which `scripts/test` prints at the end), or a failure when the run
//! declared the capability present (`SLUICE_REQUIRE`, a comma-separated list `.ci/run` sets
//! from what the machine has): a test that would pass by skipping on a machine that has what it
//! needs fails instead.

use std::io::Write;

/// The environment variable listing the capabilities a run declares present.
pub const REQUIRE_VAR: &str = "SLUICE_REQUIRE";
/// The environment variable naming the file skips are appended to.
pub const LOG_VAR: &str = "SLUICE_SKIP_LOG";

/// Whether the run declared `capability` present.
pub fn required(capability: &str) -> bool {
    listed(&std::env::var(REQUIRE_VAR).unwrap_or_default(), capability)
}

/// Whether the comma-separated `list` names `capability`.
fn listed(list: &str, capability: &str) -> bool {
    list.split(',').any(|c| c.trim() == capability)
}

/// Skips `what` for want of `capability` (`why`: what was found), or panics if the run declared
/// the capability present.
///
/// # Panics
///
/// When [`REQUIRE_VAR`] lists `capability`.
pub fn skip(capability: &str, what: &str, why: &str) {
    assert!(
        !required(capability),
        "{what}: needs {capability}, which {REQUIRE_VAR} declares present, but {why}"
    );
    let line = format!("SKIPPED {what}: {why} (needs {capability})");
    println!("{line}");
    if let Some(path) = std::env::var_os(LOG_VAR)
        && let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    {
        // One write per line (O_APPEND): lines of concurrent tests do not interleave.
        let _ = f.write_all(format!("{line}\n").as_bytes());
    }
}

/// The capability an instruction set's name stands for: `avx512` for every AVX-512 variant,
/// else the name itself (`avx2`).
pub fn isa_capability(name: &str) -> &str {
    if name.starts_with("avx512") {
        "avx512"
    } else {
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capability_is_required_only_when_listed() {
        assert!(listed("avx2,avx512,io_uring,cgroup", "cgroup"));
        assert!(listed("avx2, cgroup ", "cgroup"));
        assert!(!listed("avx2,avx512vnni", "avx512"));
        assert!(!listed("", "avx2"));
    }

    #[test]
    fn isa_names_map_to_capabilities() {
        assert_eq!(isa_capability("avx512vnni"), "avx512");
        assert_eq!(isa_capability("avx512"), "avx512");
        assert_eq!(isa_capability("avx2"), "avx2");
    }
}
