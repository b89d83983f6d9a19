//! The rooflines `hostd bench` measures in the same session as its runs: the storage read
//! bandwidth of a file with `O_DIRECT` (the page cache bypassed), DRAM read bandwidth (the
//! streaming probe of `shared::kernels::bandwidth`, timed with when it ran), and dropping the
//! page cache before a cold run.

use serde_json::{Value, json};
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// Bytes one `O_DIRECT` read asks for.
pub const CHUNK: usize = 4 << 20;
/// Alignment of the `O_DIRECT` buffer and offsets.
const ALIGN: usize = 4096;

/// The result of a storage probe, as JSON: GB/s (10⁹ B/s) or null, and how it was measured.
pub fn read_bandwidth(path: &Path, max_bytes: u64, readers: usize) -> Value {
    read_bandwidth_seeded(path, max_bytes, readers, None)
}

/// [`read_bandwidth`] with the shuffle's seed given (default: the file's length), so that
/// repeated probes of one file read different offsets.
pub fn read_bandwidth_seeded(
    path: &Path,
    max_bytes: u64,
    readers: usize,
    seed: Option<u64>,
) -> Value {
    let readers = readers.max(1);
    let len = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) => {
            return json!({"file": path.display().to_string(), "gbps": null, "error": e.to_string()});
        }
    };
    // Whole CHUNK-sized, CHUNK-aligned slots anywhere in the file, visited in a shuffled order
    // (the decode reads scattered expert blobs, not one front-to-back stream), until
    // `max_bytes`; the readers share one queue of slots, so `readers` reads are outstanding.
    let slots = (len / CHUNK as u64) as usize;
    let take = ((max_bytes / CHUNK as u64) as usize).min(slots);
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
    if take == 0 {
        return json!({"file": path.display().to_string(), "gbps": null, "error": format!("file shorter than one {} MiB read", CHUNK >> 20)});
    }
    let order = shuffled_slots(slots, take, seed.unwrap_or(len));
    let total = (take * CHUNK) as u64;
    let next = AtomicUsize::new(0);
    let t = Instant::now();
    let result: std::io::Result<()> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..readers)
            .map(|_| {
                let (file, order, next) = (&file, &order, &next);
                s.spawn(move || {
                    let mut raw = vec![0u8; CHUNK + ALIGN];
                    let skip = raw.as_ptr().align_offset(ALIGN);
                    let buf = &mut raw[skip..skip + CHUNK];
                    while let Some(&slot) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                        let mut done = 0;
                        while done < CHUNK {
                            let n = file.read_at(
                                &mut buf[done..],
                                slot as u64 * CHUNK as u64 + done as u64,
                            )?;
                            if n == 0 {
                                return Err(std::io::Error::new(
                                    std::io::ErrorKind::UnexpectedEof,
                                    "short read",
                                ));
                            }
                            done += n;
                        }
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
            "how": format!(
                "{take} reads of {} MiB at distinct {} MiB-aligned offsets spread over the whole {len}-byte file in a shuffled order, {readers} threads pulling from one queue ({readers} reads outstanding)",
                CHUNK >> 20,
                CHUNK >> 20
            ),
        }),
        Err(e) => {
            json!({"file": path.display().to_string(), "gbps": null, "mode": mode, "error": e.to_string()})
        }
    }
}

/// `take` distinct slot indices of `slots`, in a shuffled order seeded by the file length
/// (reproducible for a file, different across the file). Fisher–Yates over SplitMix64.
fn shuffled_slots(slots: usize, take: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..slots).collect();
    let mut rng = shared::splitmix::SplitMix64::new(seed);
    for i in (1..slots).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order.truncate(take);
    order
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_visits_distinct_slots_spread_over_the_file() {
        let order = shuffled_slots(1000, 300, 42);
        let mut seen = order.clone();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 300, "distinct slots");
        assert!(order.iter().all(|&s| s < 1000));
        // Not the first 300 slots in order: the sample reaches the far end of the file.
        assert!(order.iter().any(|&s| s >= 700) && order.windows(2).any(|w| w[0] > w[1]));
        assert_eq!(
            shuffled_slots(5, 10, 1).len(),
            5,
            "never more slots than the file has"
        );
    }

    #[test]
    fn the_probe_reads_what_it_says_and_refuses_a_file_too_short() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("blob");
        std::fs::write(&f, vec![7u8; 3 * CHUNK + 100]).expect("write");
        let v = read_bandwidth(&f, 2 * CHUNK as u64, 2);
        assert_eq!(v["bytes"].as_u64(), Some(2 * CHUNK as u64), "{v}");
        assert!(v["gbps"].as_f64().is_some_and(|g| g > 0.0), "{v}");
        std::fs::write(&f, vec![7u8; 100]).expect("write");
        assert!(read_bandwidth(&f, 2 * CHUNK as u64, 2)["gbps"].is_null());
    }
}
