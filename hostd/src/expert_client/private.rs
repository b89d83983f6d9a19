//! hostd's private expertd: with `--experts expertd` and no `--expertd URI`, hostd runs its own
//! daemon as a child process on a socket in a fresh 0700 temporary directory, after preparing
//! the container if it is missing (`expertd prepare`). The child watches its standard input
//! (a pipe from hostd) and drains and exits when it closes, so it never outlives hostd however
//! hostd ends — `kill -9` included. Dropping [`PrivateDaemon`] closes the pipe and waits.

use super::error::ExpertClientError;
use super::transport::Endpoint;
use shared::sizes::human_bytes;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// Environment variable that overrides where the `expertd` binary is.
pub const EXPERTD_BIN_ENV: &str = "SLUICE_EXPERTD_BIN";
/// How long the child may take to create its socket.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Memory left free for everything else on the machine when a private daemon's cache is sized
/// from free memory (beyond what hostd itself will hold).
pub const DEFAULT_HEADROOM_BYTES: u64 = 1 << 30;
/// Smallest default cache budget (or the container, if smaller): room for a few layers' experts
/// even when free memory is short.
pub const MIN_DEFAULT_CACHE_BYTES: u64 = 256 << 20;

/// Process ids of the private daemons alive in this process (for `hostd profile`'s memory and
/// IO figures, which cannot reach the client behind the model).
static LIVE: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

/// The process ids of this process's private expertd children that are still running.
pub fn live_pids() -> Vec<u32> {
    LIVE.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
}

/// What the private daemon serves.
#[derive(Debug, Clone)]
pub struct PrivateOptions {
    /// The BF16 checkpoint (for `expertd prepare` when the container is missing).
    pub model: PathBuf,
    /// The container directory.
    pub container: PathBuf,
    /// The cache budget (default: [`default_cache_budget`] from free memory).
    pub cache_bytes: Option<u64>,
    /// Bytes hostd itself will still allocate after the daemon starts (its dense weights, and
    /// `hostd serve`'s prefix cache), kept out of the default budget.
    pub host_bytes: u64,
    /// The daemon's compute threads (default: one per core).
    pub threads: Option<usize>,
    /// More `expertd serve` flags, passed verbatim (e.g. `--no-overlap` for A/B runs).
    pub extra_args: Vec<String>,
}

/// A running child expertd.
#[derive(Debug)]
pub struct PrivateDaemon {
    child: Child,
    /// Closing this pipe tells the child to drain and exit.
    stdin: Option<ChildStdin>,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

fn err(msg: String) -> ExpertClientError {
    ExpertClientError::PrivateDaemon(msg)
}

/// Standard output of a child: hostd's standard error, so the child never writes into hostd's
/// own output (which may be JSON).
fn stderr_stdio() -> Stdio {
    std::io::stderr().as_fd().try_clone_to_owned().map_or_else(|_| Stdio::null(), Stdio::from)
}

impl PrivateDaemon {
    /// The `expertd` binary: `$SLUICE_EXPERTD_BIN`, else the one next to this executable.
    pub fn binary() -> Result<PathBuf, ExpertClientError> {
        if let Some(p) = std::env::var_os(EXPERTD_BIN_ENV) {
            return Ok(PathBuf::from(p));
        }
        let exe = std::env::current_exe().map_err(|e| err(format!("cannot locate this executable: {e}")))?;
        let bin = exe.parent().map(|d| d.join("expertd")).ok_or_else(|| err("this executable has no directory".into()))?;
        if !bin.exists() {
            return Err(err(format!("{} not found (install expertd next to hostd, set {EXPERTD_BIN_ENV}, or pass --expertd URI)", bin.display())));
        }
        Ok(bin)
    }

    fn prepare(bin: &Path, model: &Path, container: &Path) -> Result<(), ExpertClientError> {
        tracing::info!(model = %model.display(), container = %container.display(), "container missing: running expertd prepare");
        let status = Command::new(bin)
            .arg("prepare")
            .arg(model)
            .arg("--out")
            .arg(container)
            .stdin(Stdio::null())
            .stdout(stderr_stdio())
            .status()
            .map_err(|e| err(format!("running {} prepare: {e}", bin.display())))?;
        if !status.success() {
            return Err(err(format!("`expertd prepare {} --out {}` failed ({status})", model.display(), container.display())));
        }
        Ok(())
    }

    /// Prepares the container if needed, starts the child and waits for its socket.
    pub fn start(opts: &PrivateOptions) -> Result<PrivateDaemon, ExpertClientError> {
        let bin = PrivateDaemon::binary()?;
        let file = opts.container.join(shared::container::CONTAINER_FILE);
        if !file.exists() {
            PrivateDaemon::prepare(&bin, &opts.model, &opts.container)?;
        }
        // The experts' bytes as expertd counts them (blobs × stride), not the file's length.
        let header = std::fs::File::open(&file)
            .map_err(|e| err(format!("{}: {e}", file.display())))
            .and_then(|f| shared::container::read_header(&f, &file).map_err(|e| err(e.to_string())))?
            .0;
        let len = header.layout.dims.n_blobs() as u64 * header.layout.blob.stride as u64;
        let (budget, why) = match opts.cache_bytes {
            Some(b) => (b, "set by --expertd-cache-bytes".to_string()),
            None => default_cache_budget(len, opts.host_bytes, available_memory()),
        };
        // Said on stderr whatever the log level: whether the run streams decides its speed.
        eprintln!("hostd: private expertd cache: {} ({why})", shared::sizes::cache_budget_summary(budget.min(len), len));
        let dir = tempfile::Builder::new().prefix("sluice-expertd-").tempdir().map_err(|e| err(format!("temporary directory: {e}")))?;
        let socket = dir.path().join("expertd.sock");
        let mut cmd = Command::new(&bin);
        cmd.arg("serve")
            .arg("--container")
            .arg(&opts.container)
            .arg("--socket")
            .arg(&socket)
            .arg("--socket-mode")
            .arg("600")
            .arg("--cache-bytes")
            .arg(budget.to_string())
            .arg("--exit-on-stdin-eof");
        if let Some(t) = opts.threads {
            cmd.arg("--threads").arg(t.to_string());
        }
        cmd.args(&opts.extra_args);
        // The child logs to hostd's stderr; quietly unless the user asked for more.
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "warn");
        }
        cmd.stdin(Stdio::piped()).stdout(stderr_stdio()).stderr(Stdio::inherit());
        let mut child = cmd.spawn().map_err(|e| err(format!("starting {}: {e}", bin.display())))?;
        let stdin = child.stdin.take();
        let mut daemon = PrivateDaemon { child, stdin, socket, _dir: dir };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = daemon.child.try_wait().map_err(|e| err(e.to_string()))? {
                return Err(err(format!("expertd exited ({status}) before it was ready; its log is above")));
            }
            if daemon.socket.exists() {
                break;
            }
            if Instant::now() > deadline {
                return Err(err(format!("expertd did not create {} within {START_TIMEOUT:?}", daemon.socket.display())));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        tracing::info!(socket = %daemon.socket.display(), pid = daemon.child.id(), budget_bytes = budget, "private expertd started");
        LIVE.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(daemon.child.id());
        Ok(daemon)
    }

    /// Where the child listens.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint::Unix(self.socket.clone())
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the child has exited.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)) | Err(_))
    }
}

impl Drop for PrivateDaemon {
    fn drop(&mut self) {
        let pid = self.child.id();
        LIVE.lock().unwrap_or_else(std::sync::PoisonError::into_inner).retain(|&p| p != pid);
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The default cache budget of a private daemon and how it was chosen: the whole container
/// when it fits in `available` memory beside `host_bytes` and [`DEFAULT_HEADROOM_BYTES`],
/// otherwise what is left (at least [`MIN_DEFAULT_CACHE_BYTES`]). Without a memory figure,
/// the whole container.
pub fn default_cache_budget(container_bytes: u64, host_bytes: u64, available: Option<u64>) -> (u64, String) {
    let Some(available) = available else {
        return (container_bytes, "default: the whole container; free memory unknown".into());
    };
    let spare = available.saturating_sub(host_bytes).saturating_sub(DEFAULT_HEADROOM_BYTES);
    let budget = container_bytes.min(spare.max(MIN_DEFAULT_CACHE_BYTES));
    let why = format!(
        "default: {} available less {} for hostd (dense weights, state cache) and {} headroom; --expertd-cache-bytes to choose",
        human_bytes(available),
        human_bytes(host_bytes),
        human_bytes(DEFAULT_HEADROOM_BYTES)
    );
    (budget, why)
}

/// Memory this process may still use: `MemAvailable` from `/proc/meminfo`, lowered to the
/// room left under the memory limits of this process's cgroup and its ancestors (v2
/// `memory.max`, or v1 `memory.limit_in_bytes`: a container or systemd limit).
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = meminfo.lines().find_map(|l| l.strip_prefix("MemAvailable:"))?.split_whitespace().next()?.parse().ok()?;
    let mut available = kib * 1024;
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    if let Some(room) = cgroup_room(Path::new("/sys/fs/cgroup"), &cgroups) {
        available = available.min(room);
    }
    Some(available)
}

/// The least room under a memory limit over the cgroup named in `proc_self_cgroup` (the text
/// of `/proc/self/cgroup`) and its ancestors, below `root` (`/sys/fs/cgroup`): v2 (`0::PATH`,
/// `memory.max`) or v1 (`N:memory:PATH` or `N:…,memory,…:PATH`, `memory/…/memory.limit_in_bytes`).
/// Room is the limit less the usage, where page cache the kernel can drop (`inactive_file`
/// in `memory.stat`) does not count as used. None when no limit is set.
pub fn cgroup_room(root: &Path, proc_self_cgroup: &str) -> Option<u64> {
    let mut room: Option<u64> = None;
    let mut consider = |r: u64| room = Some(room.map_or(r, |x: u64| x.min(r)));
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let rel = path.trim().trim_start_matches('/');
        let (base, files) = if controllers.is_empty() {
            (root.to_path_buf(), ("memory.max", "memory.current", "inactive_file"))
        } else if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"))
        } else {
            continue;
        };
        let mut dir = base.join(rel);
        loop {
            if let Some(r) = limit_room(&dir, files) {
                consider(r);
            }
            if dir == base || !dir.pop() || !dir.starts_with(&base) {
                break;
            }
        }
    }
    room
}

/// `limit − (usage − inactive file pages)` of one cgroup directory, if it has a numeric limit
/// (v2 writes `max` for none; v1 writes a huge number, which leaves the room huge too).
fn limit_room(dir: &Path, (limit_file, usage_file, inactive_key): (&str, &str, &str)) -> Option<u64> {
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
    let limit: u64 = read(limit_file)?.trim().parse().ok()?;
    let usage: u64 = read(usage_file)?.trim().parse().ok()?;
    let inactive: u64 = read("memory.stat")
        .and_then(|stat| stat.lines().find_map(|l| l.strip_prefix(inactive_key).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.trim().parse().ok())))
        .unwrap_or(0);
    Some(limit.saturating_sub(usage.saturating_sub(inactive)))
}

#[cfg(test)]
mod tests {
    use super::{DEFAULT_HEADROOM_BYTES, MIN_DEFAULT_CACHE_BYTES, default_cache_budget};

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_container_that_fits_in_free_memory_is_cached_whole() {
        let (b, why) = default_cache_budget(10 * GIB, 5 * GIB, Some(20 * GIB));
        assert_eq!(b, 10 * GIB, "{why}");
    }

    #[test]
    fn a_container_larger_than_free_memory_gets_what_is_left() {
        let (b, _) = default_cache_budget(60 * GIB, 5 * GIB, Some(20 * GIB));
        assert_eq!(b, 20 * GIB - 5 * GIB - DEFAULT_HEADROOM_BYTES);
    }

    /// Writes `files` (path → contents) under a fresh directory.
    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        for (path, text) in files {
            let p = dir.path().join(path);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, text).expect("write");
        }
        dir
    }

    #[test]
    fn cgroup_v2_room_is_the_tightest_limit_up_the_tree_with_reclaimable_cache_free() {
        let t = tree(&[
            ("system.slice/memory.max", "max\n"),
            ("system.slice/memory.current", "999\n"),
            ("system.slice/app.service/memory.max", "8000\n"),
            ("system.slice/app.service/memory.current", "5000\n"),
            ("system.slice/app.service/memory.stat", "anon 3000\ninactive_file 1000\nactive_file 1000\n"),
        ]);
        // 8000 − (5000 − 1000 inactive) = 4000; the parent has no limit.
        assert_eq!(super::cgroup_room(t.path(), "0::/system.slice/app.service\n"), Some(4000));
        assert_eq!(super::cgroup_room(t.path(), "0::/\n"), None);
    }

    #[test]
    fn cgroup_v1_memory_controller_is_read_too() {
        let t = tree(&[
            ("memory/docker/abc/memory.limit_in_bytes", "4096\n"),
            ("memory/docker/abc/memory.usage_in_bytes", "3000\n"),
            ("memory/docker/abc/memory.stat", "cache 10\ntotal_inactive_file 1000\n"),
            ("memory/memory.limit_in_bytes", "9223372036854771712\n"),
            ("memory/memory.usage_in_bytes", "1\n"),
        ]);
        let text = "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n";
        assert_eq!(super::cgroup_room(t.path(), text), Some(4096 - 2000));
    }

    #[test]
    fn short_memory_still_leaves_a_working_cache() {
        assert_eq!(default_cache_budget(60 * GIB, 5 * GIB, Some(GIB)).0, MIN_DEFAULT_CACHE_BYTES);
        assert_eq!(default_cache_budget(100 << 20, 5 * GIB, Some(GIB)).0, 100 << 20);
        assert_eq!(default_cache_budget(60 * GIB, 5 * GIB, None).0, 60 * GIB);
    }
}
