//! The rooflines `hostd bench` measures in the same session as its runs: DRAM read bandwidth
//! (the existing streaming probe) and the storage read bandwidth of a file with `O_DIRECT`
//! (the page cache bypassed), plus dropping the page cache before a cold run.

use serde_json::{Value, json};
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::Instant;

/// Bytes one `O_DIRECT` read asks for.
pub const CHUNK: usize = 4 << 20;
/// Alignment of the `O_DIRECT` buffer and offsets.
const ALIGN: usize = 4096;

/// The result of a storage probe, as JSON: GB/s (10⁹ B/s) or null, and how it was measured.
pub fn read_bandwidth(path: &Path, max_bytes: u64, readers: usize) -> Value {
    let readers = readers.max(1);
    let len = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) => {
            return json!({"file": path.display().to_string(), "gbps": null, "error": e.to_string()});
        }
    };
    // Whole 4 KiB blocks (O_DIRECT's unit), split evenly between the readers.
    let per_reader = (len.min(max_bytes) / readers as u64 / ALIGN as u64) * ALIGN as u64;
    let total = per_reader * readers as u64;
    let direct = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
        .open(path);
    let (file, mode) = match direct {
        Ok(f) => (f, "O_DIRECT".to_string()),
        Err(e) => match File::open(path) {
            // Fallback: buffered reads after asking the kernel to drop the file's cached pages
            // (pages that are mapped or dirty may stay cached, so this can overstate the disk).
            Ok(f) => {
                let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed);
                (
                    f,
                    format!(
                        "buffered after POSIX_FADV_DONTNEED (O_DIRECT refused: {e}); may include page-cache hits"
                    ),
                )
            }
            Err(e) => {
                return json!({"file": path.display().to_string(), "gbps": null, "error": e.to_string()});
            }
        },
    };
    if total == 0 {
        return json!({"file": path.display().to_string(), "gbps": null, "error": "file shorter than one 4 KiB block per reader"});
    }
    let t = Instant::now();
    let result: std::io::Result<()> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..readers)
            .map(|r| {
                let file = &file;
                s.spawn(move || {
                    let mut raw = vec![0u8; CHUNK + ALIGN];
                    let skip = raw.as_ptr().align_offset(ALIGN);
                    let buf = &mut raw[skip..skip + CHUNK];
                    let start = r as u64 * per_reader;
                    let mut off = start;
                    while off < start + per_reader {
                        let want = CHUNK.min((start + per_reader - off) as usize);
                        let n = file.read_at(&mut buf[..want], off)?;
                        if n == 0 {
                            return Err(std::io::Error::new(
                                std::io::ErrorKind::UnexpectedEof,
                                "short read",
                            ));
                        }
                        off += n as u64;
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(std::io::Error::other("reader panicked")))
        })
    });
    let secs = t.elapsed().as_secs_f64();
    match result {
        Ok(()) => json!({
            "file": path.display().to_string(),
            "gbps": total as f64 / secs / 1e9,
            "bytes": total,
            "seconds": secs,
            "mode": mode,
            "readers": readers,
            "how": format!("{readers} threads, each reading its own contiguous 1/{readers} of the first {total} bytes front to back in preads of up to {} MiB (one outstanding read per thread)", CHUNK >> 20),
        }),
        Err(e) => {
            json!({"file": path.display().to_string(), "gbps": null, "mode": mode, "error": e.to_string()})
        }
    }
}

/// The DRAM read bandwidth probe, with when it ran.
pub fn dram(bytes: usize, threads: usize, when: &str) -> Value {
    let gbps = shared::kernels::bandwidth::measure_read_bandwidth_gbps(bytes, threads);
    json!({"when": when, "gbps": gbps, "buffer_bytes": bytes, "threads": threads})
}

/// `sync`, then drops the page cache, dentries and inodes; `Err` says why it could not.
pub fn drop_caches() -> Result<(), String> {
    rustix::fs::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n")
        .map_err(|e| format!("writing 3 to /proc/sys/vm/drop_caches: {e}"))
}
