//! Facts about the machine and the code a benchmark report records: CPU model, memory, date,
//! the checkout's commit, and the identity (path and SHA-256) of the executable that ran.

use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;

/// The CPU model name from /proc/cpuinfo.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The git commit of the working directory's checkout, when run inside one.
pub fn git_commit() -> String {
    command_line(Command::new("git").args(["rev-parse", "--short=12", "HEAD"]))
}

/// The current time in UTC, `YYYY-MM-DDTHH:MM:SSZ`.
pub fn date_utc() -> String {
    command_line(Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%SZ"]))
}

/// The first line a command prints, or `unknown` when it fails.
fn command_line(cmd: &mut Command) -> String {
    cmd.output()
        .ok()
        .filter(|o| o.status.success())
        .map_or_else(
            || "unknown".into(),
            |o| String::from_utf8_lossy(&o.stdout).trim().to_string(),
        )
}

/// The machine's memory (`MemTotal` of /proc/meminfo), in bytes.
pub fn mem_total_bytes() -> Option<u64> {
    shared::procfs::meminfo_bytes("MemTotal")
}

/// `{"path", "sha256"}` of a file (an executable): what identifies the code that ran, whatever
/// the checkout's HEAD says. `sha256` is null when the file cannot be read.
pub fn file_identity(path: &Path) -> Value {
    use sha2::{Digest, Sha256};
    let sha = std::fs::read(path).ok().map(|b| {
        Sha256::digest(&b)
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect::<String>()
    });
    json!({"path": path.display().to_string(), "sha256": sha})
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_file_is_identified_by_its_sha256() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("exe");
        std::fs::write(&f, b"abc").expect("write");
        let id = super::file_identity(&f);
        assert_eq!(
            id["sha256"],
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(super::file_identity(&dir.path().join("missing"))["sha256"].is_null());
    }
}
