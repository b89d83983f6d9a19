//! Snapshots `hostd profile` takes around its phases: physical storage reads of hostd and its
//! private expertd (over the /proc readers of `shared::procfs`, re-exported here), and the busy
//! time of the block device holding the container.

use serde_json::{Value, json};
pub use shared::procfs::{read_bytes, vm_hwm_bytes};

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

/// A snapshot of the block device holding a file (`/sys/dev/block/MAJ:MIN/stat`): the
/// kernel's `io_ticks` (milliseconds during which the device had at least one request in
/// flight: `iostat`'s %util) and sectors read. Device-wide: every process's I/O counts.
#[derive(Debug, Clone)]
pub struct DeviceBusy {
    /// `MAJ:MIN` of the device (the partition, when the file is on one).
    pub device: String,
    /// Milliseconds with I/O in flight.
    pub io_ticks_ms: u64,
    /// 512-byte sectors read.
    pub read_sectors: u64,
}

impl DeviceBusy {
    /// The device holding `path`, now; `None` where /sys cannot tell (no such file, not Linux,
    /// a filesystem without a block device such as tmpfs or overlay).
    pub fn of(path: &std::path::Path) -> Option<DeviceBusy> {
        use std::os::unix::fs::MetadataExt;
        let dev = std::fs::metadata(path).ok()?.dev();
        let device = format!("{}:{}", rustix::fs::major(dev), rustix::fs::minor(dev));
        let stat = std::fs::read_to_string(format!("/sys/dev/block/{device}/stat")).ok()?;
        DeviceBusy::parse(device, &stat)
    }

    /// Parses a block `stat` line: field 3 is sectors read, field 10 is `io_ticks`.
    fn parse(device: String, stat: &str) -> Option<DeviceBusy> {
        let f: Vec<u64> = stat
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        Some(DeviceBusy {
            device,
            read_sectors: *f.get(2)?,
            io_ticks_ms: *f.get(9)?,
        })
    }

    /// Busy milliseconds and bytes read between `self` and `later`, and the busy share of
    /// `wall_s` seconds, as JSON.
    pub fn delta_json(&self, later: &DeviceBusy, wall_s: f64) -> Value {
        let busy = later.io_ticks_ms.saturating_sub(self.io_ticks_ms);
        json!({
            "device": self.device,
            "busy_ms": busy,
            "busy_fraction": busy as f64 / (wall_s * 1e3),
            "read_bytes": later.read_sectors.saturating_sub(self.read_sectors) * 512,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::DeviceBusy;

    #[test]
    fn a_block_stat_line_gives_sectors_read_and_io_ticks() {
        let line = "   51190     1180  6512834    22580   101877    83620  3598600   153080        0    93504   181788        0        0        0        0     1711      681\n";
        let d = DeviceBusy::parse("253:0".into(), line).expect("parsed");
        assert_eq!((d.read_sectors, d.io_ticks_ms), (6512834, 93504));
        let later = DeviceBusy {
            io_ticks_ms: 93504 + 800,
            read_sectors: 6512834 + 2048,
            ..d.clone()
        };
        let j = d.delta_json(&later, 1.0);
        assert_eq!(
            (j["busy_ms"].as_u64(), j["read_bytes"].as_u64()),
            (Some(800), Some(2048 * 512))
        );
        assert!((j["busy_fraction"].as_f64().expect("fraction") - 0.8).abs() < 1e-12);
        assert!(
            DeviceBusy::parse("1:2".into(), "1 2").is_none(),
            "too few fields"
        );
    }
}
