//! What `hostd plan` measures on this machine: memory (total, available, the cgroup's limit),
//! the CPU (model, threads, instruction sets), DRAM read bandwidth, the O_DIRECT read bandwidth
//! of the disk that holds (or will hold) the experts, and whether the container's directory can
//! be written and has room.

use crate::expert_client::private::{CgroupMemory, cgroup_memory};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Memory, in bytes.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Memory {
    /// `MemTotal`.
    pub total: u64,
    /// `MemAvailable`: free memory plus page cache the kernel can drop.
    pub available: u64,
    /// The tightest memory limit of this process's cgroup or an ancestor, if any.
    pub cgroup_limit: Option<u64>,
    /// Room left under that limit.
    pub cgroup_room: Option<u64>,
    /// What the plan may use: `available`, lowered to `cgroup_room`.
    pub usable: u64,
}

impl Memory {
    /// Reads `/proc/meminfo` and the cgroup files; `Err` when `/proc/meminfo` cannot be read.
    pub fn measure() -> Result<Memory, String> {
        let field = |name: &str| {
            shared::procfs::meminfo_bytes(name)
                .ok_or_else(|| format!("/proc/meminfo has no readable {name}"))
        };
        let (total, available) = (field("MemTotal")?, field("MemAvailable")?);
        let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let cg: Option<CgroupMemory> = cgroup_memory(Path::new("/sys/fs/cgroup"), &cgroups)
            // v1 writes a huge number for "no limit".
            .filter(|c| c.limit < total);
        Ok(Memory {
            total,
            available,
            cgroup_limit: cg.map(|c| c.limit),
            cgroup_room: cg.map(|c| c.room),
            usable: cg.map_or(available, |c| available.min(c.room)),
        })
    }
}

/// The CPU.
#[derive(Debug, Clone, Serialize)]
pub struct Cpu {
    /// `model name` from `/proc/cpuinfo`, if it has one.
    pub model: Option<String>,
    /// Threads this process may run on (`available_parallelism`, affinity and cgroup quota).
    pub threads: usize,
    /// The dense kernels' instruction set (`scalar`, `avx2`, `avx512`).
    pub isa: &'static str,
    /// The INT8 expert kernels' instruction set.
    pub int8_isa: &'static str,
}

impl Cpu {
    /// Detects the CPU.
    pub fn detect() -> Cpu {
        let model = Some(sluice_tools::machine::cpu_model()).filter(|m| !m.is_empty());
        Cpu {
            model,
            threads: std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            isa: shared::kernels::Isa::detect().name(),
            int8_isa: shared::kernels::int8::Int8Isa::detect().name(),
        }
    }
}

/// A measured read bandwidth of a file's disk.
#[derive(Debug, Clone, Serialize)]
pub struct Disk {
    /// The file read.
    pub file: PathBuf,
    /// The median of the samples, GB/s (10⁹ B/s).
    pub gbps: f64,
    /// Every sample, GB/s, in the order taken.
    pub samples_gbps: Vec<f64>,
    /// `O_DIRECT`, or the buffered fallback and why.
    pub mode: String,
    /// Bytes read per sample.
    pub bytes: u64,
}

impl Disk {
    /// The slowest and the fastest sample, bytes per second.
    pub fn range_bps(&self) -> (f64, f64) {
        let lo = self
            .samples_gbps
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min);
        let hi = self.samples_gbps.iter().copied().fold(0.0, f64::max);
        (lo * 1e9, hi * 1e9)
    }
}

/// Samples of [`disk_bandwidth`]: this VM's disk moves by ±25% from one second to the next.
pub const DISK_SAMPLES: u64 = 3;

/// Reads up to `max_bytes` of `file` with `O_DIRECT` from 8 threads (`sluice_tools`' probe, the
/// one `hostd bench` reports beside its cold runs), [`DISK_SAMPLES`] times at different
/// shuffled offsets.
pub fn disk_bandwidth(file: &Path, max_bytes: u64) -> Result<Disk, String> {
    let mut samples = Vec::new();
    let (mut mode, mut bytes) = (String::new(), 0);
    let len = std::fs::metadata(file).map_or(0, |m| m.len());
    // A warm-up read, not counted: on this project's VM the first read after a quiet spell is
    // the slowest of a run (1.27–1.44 GB/s against 1.43–2.1 for the next ones, 5 runs of 6), while a decode
    // keeps the disk busy.
    let _ = sluice_tools::probe::storage::read_bandwidth_seeded(
        file,
        max_bytes / 4,
        8,
        Some(len + DISK_SAMPLES),
    );
    for i in 0..DISK_SAMPLES {
        let v =
            sluice_tools::probe::storage::read_bandwidth_seeded(file, max_bytes, 8, Some(len + i));
        match v["gbps"].as_f64() {
            Some(gbps) => samples.push(gbps),
            None => {
                return Err(format!(
                    "reading {}: {}",
                    file.display(),
                    v["error"].as_str().unwrap_or("no figure")
                ));
            }
        }
        v["mode"].as_str().unwrap_or("").clone_into(&mut mode);
        bytes = v["bytes"].as_u64().unwrap_or(0);
    }
    let mut sorted = samples.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(Disk {
        file: file.to_path_buf(),
        gbps: sorted[sorted.len() / 2],
        samples_gbps: samples,
        mode,
        bytes,
    })
}

/// Bytes of the scratch file [`scratch_disk_bandwidth`] writes at most.
pub const SCRATCH_PROBE_BYTES: u64 = 256 << 20;

/// Without a file to read (a plan from config.json alone): writes `bytes` of pseudo-random data
/// to a scratch file in `dir`'s nearest existing ancestor, flushes it to the disk (`fsync`, so
/// the reads cannot be served from dirty pages), probes it like [`disk_bandwidth`] and removes it.
pub fn scratch_disk_bandwidth(dir: &Path, bytes: u64) -> Result<Disk, String> {
    let at = nearest_existing_dir(dir);
    let mut file = tempfile::Builder::new()
        .prefix(".sluice-plan-probe-")
        .tempfile_in(&at)
        .map_err(|e| format!("a scratch file in {} for the disk probe: {e}", at.display()))?;
    let mut rng = shared::splitmix::SplitMix64::new(bytes);
    let chunk: Vec<u8> = (0..(1 << 20) / 8)
        .flat_map(|_| rng.next_u64().to_le_bytes())
        .collect();
    let mut write = || -> std::io::Result<()> {
        use std::io::Write;
        for _ in 0..bytes.div_ceil(chunk.len() as u64) {
            file.write_all(&chunk)?;
        }
        file.as_file().sync_all()
    };
    write().map_err(|e| {
        format!(
            "writing the disk probe's scratch file in {}: {e}",
            at.display()
        )
    })?;
    let mut d = disk_bandwidth(file.path(), bytes)?;
    d.mode = format!("{}, a scratch file written and synced first", d.mode);
    Ok(d)
}

/// Where the container goes (or is), and whether it can be written there.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// The container directory.
    pub dir: PathBuf,
    /// Whether `experts.sluice` is already there.
    pub exists: bool,
    /// Free bytes on its filesystem (for an unprivileged user), if known.
    pub free_bytes: Option<u64>,
    /// Why the directory cannot be written, if it cannot: a read-only filesystem, permissions.
    pub unwritable: Option<String>,
}

impl Target {
    /// Checks `dir` (which may not exist yet: its nearest existing ancestor is checked).
    pub fn check(dir: &Path) -> Target {
        let exists = dir.join(shared::container::CONTAINER_FILE).is_file();
        let probe = nearest_existing_dir(dir);
        let (free_bytes, unwritable) = match rustix::fs::statvfs(&probe) {
            Ok(st) => {
                let ro = st
                    .f_flag
                    .contains(rustix::fs::StatVfsMountFlags::RDONLY)
                    .then(|| format!("{} is on a read-only filesystem", probe.display()));
                (Some(st.f_bavail * st.f_frsize), ro)
            }
            Err(e) => (None, Some(format!("{}: {e}", probe.display()))),
        };
        let unwritable = unwritable.or_else(|| {
            if exists {
                return None;
            }
            match tempfile::Builder::new()
                .prefix(".sluice-plan-")
                .tempfile_in(&probe)
            {
                Ok(_) => None,
                Err(e) => Some(format!("cannot create a file in {}: {e}", probe.display())),
            }
        });
        Target {
            dir: dir.to_path_buf(),
            exists,
            free_bytes,
            unwritable,
        }
    }
}

/// Whether `file` and `dir` (or `dir`'s nearest existing ancestor) are on one filesystem; `None`
/// when either cannot be examined.
pub fn same_filesystem(file: &Path, dir: &Path) -> Option<bool> {
    use std::os::unix::fs::MetadataExt;
    let at = nearest_existing_dir(dir);
    Some(std::fs::metadata(file).ok()?.dev() == std::fs::metadata(&at).ok()?.dev())
}

/// `dir` if it is a directory, else its nearest ancestor that is (`.` for a relative path with
/// none): where a container that does not exist yet would be created.
fn nearest_existing_dir(dir: &Path) -> PathBuf {
    let mut at = dir.to_path_buf();
    while !at.is_dir() {
        if !at.pop() || at.as_os_str().is_empty() {
            return PathBuf::from(".");
        }
    }
    at
}

/// The largest `*.safetensors` file of a model directory: what the disk probe reads when there
/// is no container yet (the container is normally written to the same disk).
pub fn largest_shard(model: &Path) -> Option<PathBuf> {
    std::fs::read_dir(model)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .filter_map(|e| Some((e.metadata().ok()?.len(), e.path())))
        .max()
        .map(|(_, p)| p)
}
