//! Process figures from Linux's /proc, for reports and tests: resident set (`VmRSS`), its peak
//! (`VmHWM`) and physical storage reads (`read_bytes` of /proc/PID/io: bytes the process caused
//! to be fetched from the block layer, page-cache hits not included), and the machine's memory
//! (/proc/meminfo). Every reader returns
//! `None` when the file or the field cannot be read (no /proc, a process that is gone).

/// `pid`'s /proc directory (`/proc/self` for this process).
fn dir(pid: Option<u32>) -> String {
    pid.map_or_else(|| "/proc/self".to_string(), |p| format!("/proc/{p}"))
}

/// A `kB` field of /proc/PID/status (`"VmRSS"`, `"VmHWM"`, …) in bytes.
pub fn status_bytes(pid: Option<u32>, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("{}/status", dir(pid))).ok()?;
    let value = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    let kib: u64 = value.split_whitespace().next()?.parse().ok()?;
    Some(kib * 1024)
}

/// A `kB` field of /proc/meminfo (`"MemTotal"`, `"MemAvailable"`, …) in bytes.
pub fn meminfo_bytes(field: &str) -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let value = meminfo
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    let kib: u64 = value.split_whitespace().next()?.parse().ok()?;
    Some(kib * 1024)
}

/// Resident set size in bytes (`VmRSS`).
pub fn vm_rss_bytes(pid: Option<u32>) -> Option<u64> {
    status_bytes(pid, "VmRSS")
}

/// Peak resident set size in bytes (`VmHWM`).
pub fn vm_hwm_bytes(pid: Option<u32>) -> Option<u64> {
    status_bytes(pid, "VmHWM")
}

/// Bytes the process has read from storage so far (`read_bytes` of /proc/PID/io).
pub fn read_bytes(pid: Option<u32>) -> Option<u64> {
    let io = std::fs::read_to_string(format!("{}/io", dir(pid))).ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_has_a_resident_set_below_its_peak() {
        let (rss, hwm) = (
            super::vm_rss_bytes(None).expect("VmRSS"),
            super::vm_hwm_bytes(None).expect("VmHWM"),
        );
        assert!(rss > 0 && rss <= hwm, "VmRSS {rss} VmHWM {hwm}");
        assert_eq!(super::status_bytes(None, "NoSuchField"), None);
        assert_eq!(super::vm_rss_bytes(Some(u32::MAX)), None);
    }
}
