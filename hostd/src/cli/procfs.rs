//! Process figures from /proc for the benchmarks: peak resident set (`VmHWM`) and physical
//! storage reads (`read_bytes` of /proc/PID/io: bytes this process caused to be fetched from
//! the block layer, page-cache hits not included).

use serde_json::{Value, json};

/// `pid`'s /proc directory name (`self` for this process).
fn dir(pid: Option<u32>) -> String {
    pid.map_or_else(|| "/proc/self".to_string(), |p| format!("/proc/{p}"))
}

/// Peak resident set size in bytes (`VmHWM`), if readable.
pub fn vm_hwm_bytes(pid: Option<u32>) -> Option<u64> {
    let status = std::fs::read_to_string(format!("{}/status", dir(pid))).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Bytes the process has read from storage so far (`read_bytes` of /proc/PID/io), if readable.
pub fn read_bytes(pid: Option<u32>) -> Option<u64> {
    let io = std::fs::read_to_string(format!("{}/io", dir(pid))).ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

/// A snapshot of `read_bytes` for hostd (this process) and, when there is one, its expertd.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reads {
    /// This process.
    pub hostd: Option<u64>,
    /// The private expertd.
    pub expertd: Option<u64>,
    /// Whether there is a private expertd (so `expertd: None` means unreadable, not absent).
    pub daemon: bool,
}

impl Reads {
    /// Reads both counters now.
    pub fn now(daemon: Option<u32>) -> Reads {
        Reads {
            hostd: read_bytes(None),
            expertd: daemon.and_then(|p| read_bytes(Some(p))),
            daemon: daemon.is_some(),
        }
    }

    /// Bytes read by each process between `self` and `later`, as JSON (null where unreadable).
    pub fn delta_json(&self, later: &Reads) -> Value {
        let d = |a: Option<u64>, b: Option<u64>| a.zip(b).map(|(a, b)| b.saturating_sub(a));
        let (h, e) = (d(self.hostd, later.hostd), d(self.expertd, later.expertd));
        // With a daemon whose counter could not be read the total is unknown, not hostd's alone.
        let total = if self.daemon && e.is_none() {
            None
        } else {
            h.map(|h| h + e.unwrap_or(0))
        };
        json!({"hostd": h, "expertd": e, "total": total})
    }
}
