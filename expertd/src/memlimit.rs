//! The daemon's memory budget against its own cgroup's limit: reads the tightest memory limit
//! that applies to this process (cgroup v2 `memory.max`/`memory.high`, or v1
//! `memory.limit_in_bytes`, of its cgroup and every ancestor, found through
//! `/proc/self/cgroup`), estimates the daemon's fixed overhead next to the cache, and either
//! checks `--cache-bytes` against the limit (refusing with the numbers when it cannot fit) or,
//! without `--cache-bytes`, derives a budget that fits.
//!
//! The overhead is an estimate with a stated formula (see [`Overhead`]); `tests/it/
//! expertd_deploy.rs` checks that a derived budget keeps the peak RSS under the limit.

use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;
/// The runtime, threads, container index, gRPC and per-connection state, allocator slack: the
/// same allowance `tests/it/expertd_rss.rs` gives above the idle RSS, plus that idle RSS.
pub const BASE_OVERHEAD_BYTES: u64 = 96 * MIB;
/// Limits at or above this are "no limit" (v1 reports unlimited as a huge page-rounded value).
const UNLIMITED: u64 = 1 << 60;
/// Of the limit, this part stays free when a budget is derived (page cache of reads, allocator
/// fragmentation), so the cgroup reclaims rather than kills.
const DERIVED_SLACK_DIVISOR: u64 = 16;

/// A memory limit that applies to this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLimit {
    /// The limit in bytes.
    pub bytes: u64,
    /// The file it came from (e.g. `/sys/fs/cgroup/system.slice/x.service/memory.max`).
    pub file: PathBuf,
}

/// Reads the tightest memory limit over this process's cgroup and its ancestors, `None` when
/// there is none (or no cgroup filesystem to read).
pub fn own_limit() -> Option<CgroupLimit> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    limit_from(&cgroups, Path::new("/sys/fs/cgroup"))
}

/// [`own_limit`] on a given `/proc/self/cgroup` text and cgroup mount root (for tests).
pub fn limit_from(proc_cgroup: &str, root: &Path) -> Option<CgroupLimit> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let rel = path.trim_start_matches('/');
        if id == "0" && controllers.is_empty() && root.join("cgroup.controllers").is_file() {
            // v2 (unified): memory.max and memory.high at each level.
            for dir in ancestors(&root.join(rel), root) {
                candidates.push(dir.join("memory.max"));
                candidates.push(dir.join("memory.high"));
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            let mount = root.join("memory");
            for dir in ancestors(&mount.join(rel), &mount) {
                candidates.push(dir.join("memory.limit_in_bytes"));
            }
        }
    }
    candidates
        .into_iter()
        .filter_map(|file| {
            let text = std::fs::read_to_string(&file).ok()?;
            let bytes: u64 = text.trim().parse().ok()?; // "max" (v2 unlimited) does not parse
            (bytes < UNLIMITED).then_some(CgroupLimit { bytes, file })
        })
        .min_by_key(|l| l.bytes)
}

/// `dir` and its parents up to and including `root`.
fn ancestors(dir: &Path, root: &Path) -> Vec<PathBuf> {
    dir.ancestors()
        .take_while(|d| d.starts_with(root))
        .map(Path::to_path_buf)
        .collect()
}

/// The daemon's memory next to its cache, estimated from its configuration:
/// `base + transient_slots × blob + lanes × max_call_bytes + max_queued_bytes`, where `max_call_bytes` is the most
/// one call may make the daemon hold (`crate::call_memory`: a call of `--max-rows-per-call`
/// rows at top-8, its activations in wire and f32 form, one output row per routed cell and the
/// compute threads' expert buffers). Admission refuses a call past that bound, so the estimate
/// is a ceiling the calls cannot push through. `max_queued_bytes` caps the gRPC requests
/// arriving (`crate::rpc::intake`) or decoded and waiting for a lane over every connection
/// (`--max-queued-bytes`; a request past it is refused, not buffered or queued).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overhead {
    /// [`BASE_OVERHEAD_BYTES`].
    pub base: u64,
    /// The transient pool: `transient_slots × blob stride`.
    pub transient: u64,
    /// Call buffers over all compute lanes.
    pub calls: u64,
    /// Decoded requests waiting for a lane.
    pub queued: u64,
}

impl Overhead {
    /// The estimate for a container's blob size and the serve flags; `max_call_bytes` from
    /// [`crate::call_memory::CallMemory::max_call_bytes`].
    pub fn estimate(
        blob_bytes: u64,
        transient_slots: u64,
        lanes: u64,
        max_call_bytes: u64,
        max_queued_bytes: u64,
    ) -> Overhead {
        Overhead {
            base: BASE_OVERHEAD_BYTES,
            transient: transient_slots * blob_bytes,
            calls: lanes.saturating_mul(max_call_bytes),
            queued: max_queued_bytes,
        }
    }

    /// The sum.
    pub fn total(&self) -> u64 {
        self.base
            .saturating_add(self.transient)
            .saturating_add(self.calls)
            .saturating_add(self.queued)
    }
}

impl std::fmt::Display for Overhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} B (runtime {} B + transient pool {} B + call buffers {} B + queued requests {} B)",
            self.total(),
            self.base,
            self.transient,
            self.calls,
            self.queued
        )
    }
}

/// Why no budget fits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    /// `--cache-bytes` plus the overhead exceeds the limit.
    #[error(
        "--cache-bytes {requested} B plus the daemon's overhead {overhead} = {need} B does not fit the memory limit {limit} B ({file}); {}",
        if *fits > 0 { format!("give --cache-bytes at most {fits} B, leave it out to derive one, or raise MemoryMax= / the cgroup's limit") } else { "the overhead alone exceeds it: raise MemoryMax= / the cgroup's limit, or lower --compute-lanes / --max-rows-per-call / --transient-slots".to_string() }
    )]
    DoesNotFit {
        /// `--cache-bytes`.
        requested: u64,
        /// The overhead estimate.
        overhead: Overhead,
        /// `requested + overhead`.
        need: u64,
        /// The limit.
        limit: u64,
        /// Where it came from.
        file: String,
        /// The largest `--cache-bytes` that fits (0 when none does: the overhead alone exceeds
        /// the limit).
        fits: u64,
    },
    /// No limit and no `--cache-bytes`.
    #[error(
        "no --cache-bytes given and this process has no cgroup memory limit to derive one from; give --cache-bytes (or run under MemoryMax=)"
    )]
    NoLimit,
    /// The limit leaves no room for one expert.
    #[error(
        "the memory limit {limit} B ({file}) minus the daemon's overhead {overhead} leaves {left} B for the cache, less than one expert ({blob} B); raise MemoryMax= / the cgroup's limit or lower --compute-lanes / --max-rows-per-call / --transient-slots"
    )]
    TooSmall {
        /// The limit.
        limit: u64,
        /// Where it came from.
        file: String,
        /// The overhead estimate.
        overhead: Overhead,
        /// What is left for the cache.
        left: u64,
        /// One expert blob.
        blob: u64,
    },
}

/// How the budget was settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Budget {
    /// `--cache-bytes`, with no limit to check against.
    Unchecked(u64),
    /// `--cache-bytes`, checked against a limit.
    Fits(u64),
    /// Derived from the limit: `limit − limit/16 − overhead`.
    Derived(u64),
}

impl Budget {
    /// The cache budget in bytes.
    pub fn bytes(&self) -> u64 {
        match self {
            Budget::Unchecked(b) | Budget::Fits(b) | Budget::Derived(b) => *b,
        }
    }
}

/// Checks or derives the cache budget. `requested` is `--cache-bytes` already clamped to what
/// the container holds (a cap the cache never exceeds).
pub fn plan(
    requested: Option<u64>,
    limit: Option<&CgroupLimit>,
    overhead: Overhead,
    blob: u64,
) -> Result<Budget, BudgetError> {
    match (requested, limit) {
        (Some(r), None) => Ok(Budget::Unchecked(r)),
        (None, None) => Err(BudgetError::NoLimit),
        (Some(r), Some(l)) => {
            let need = r.saturating_add(overhead.total());
            if need <= l.bytes {
                Ok(Budget::Fits(r))
            } else {
                let fits = Some(l.bytes.saturating_sub(overhead.total()))
                    .filter(|&f| f >= blob)
                    .unwrap_or(0);
                Err(BudgetError::DoesNotFit {
                    requested: r,
                    overhead,
                    need,
                    limit: l.bytes,
                    file: l.file.display().to_string(),
                    fits,
                })
            }
        }
        (None, Some(l)) => {
            let left = l
                .bytes
                .saturating_sub(l.bytes / DERIVED_SLACK_DIVISOR)
                .saturating_sub(overhead.total());
            if left < blob {
                return Err(BudgetError::TooSmall {
                    limit: l.bytes,
                    file: l.file.display().to_string(),
                    overhead,
                    left,
                    blob,
                });
            }
            Ok(Budget::Derived(left))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_and_v2_limits_take_the_tightest_ancestor_and_ignore_unlimited() {
        let root = tempfile::tempdir().expect("tempdir");
        let r = root.path();
        // v2: the parent has the tighter memory.high.
        std::fs::write(r.join("cgroup.controllers"), "memory\n").expect("write");
        std::fs::create_dir_all(r.join("a/b")).expect("mkdir");
        std::fs::write(r.join("a/b/memory.max"), "1000000\n").expect("write");
        std::fs::write(r.join("a/b/memory.high"), "max\n").expect("write");
        std::fs::write(r.join("a/memory.high"), "500000\n").expect("write");
        let l = limit_from("0::/a/b\n", r).expect("a limit");
        assert_eq!(l.bytes, 500_000);
        assert_eq!(l.file, r.join("a/memory.high"));
        // v1: the memory controller's hierarchy; unlimited is a huge value.
        let v1 = tempfile::tempdir().expect("tempdir");
        let m = v1.path().join("memory/x/y");
        std::fs::create_dir_all(&m).expect("mkdir");
        std::fs::write(m.join("memory.limit_in_bytes"), "9223372036854771712\n").expect("write");
        assert_eq!(limit_from("4:memory:/x/y\n0::/\n", v1.path()), None);
        std::fs::write(m.join("memory.limit_in_bytes"), "268435456\n").expect("write");
        assert_eq!(
            limit_from("4:memory:/x/y\n0::/\n", v1.path()).map(|l| l.bytes),
            Some(256 * MIB)
        );
    }

    #[test]
    fn a_budget_is_checked_against_the_limit_or_derived_from_it() {
        let o = Overhead::estimate(1 << 20, 4, 2, 8 * (4 * 64 + 2 * 32) * 4, 0);
        let limit = CgroupLimit {
            bytes: 256 * MIB,
            file: "/x/memory.max".into(),
        };
        assert_eq!(
            plan(Some(10 * MIB), None, o, 1 << 20),
            Ok(Budget::Unchecked(10 * MIB))
        );
        assert_eq!(
            plan(Some(100 * MIB), Some(&limit), o, 1 << 20),
            Ok(Budget::Fits(100 * MIB))
        );
        let err = plan(Some(200 * MIB), Some(&limit), o, 1 << 20).expect_err("does not fit");
        let text = err.to_string();
        assert!(
            text.contains("268435456")
                && text.contains("/x/memory.max")
                && text.contains(&(256 * MIB - o.total()).to_string()),
            "{text}"
        );
        let derived = plan(None, Some(&limit), o, 1 << 20)
            .expect("derived")
            .bytes();
        assert_eq!(derived, 256 * MIB - 16 * MIB - o.total());
        assert_eq!(plan(None, None, o, 1 << 20), Err(BudgetError::NoLimit));
        let tiny = CgroupLimit {
            bytes: 64 * MIB,
            file: "/y".into(),
        };
        assert!(matches!(
            plan(None, Some(&tiny), o, 1 << 20),
            Err(BudgetError::TooSmall { .. })
        ));
    }
}
