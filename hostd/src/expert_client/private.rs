//! hostd's private expertd: with `--experts expertd` and no `--expertd URI`, hostd runs its own
//! daemon as a child process on a socket in a fresh 0700 temporary directory, after preparing
//! the container if it is missing (`expertd prepare`). The child watches its standard input
//! (a pipe from hostd) and drains and exits when it closes, so it never outlives hostd however
//! hostd ends — `kill -9` included.
//!
//! Supervision: a thread reaps the child as soon as it exits (no zombie), marks the daemon
//! `unavailable` in the shared [`ExpertHealth`] and starts a new child on the same socket path
//! with backoff (100 ms, doubling to 5 s; back to 100 ms after a child that lived 30 s). Calls
//! in flight fail at once (their connection closes); the client reconnects to the new child.
//!
//! Cleanup: dropping [`PrivateDaemon`] or [`stop_all`] (hostd's `main` calls it on every
//! return) closes the pipe, waits for the child (killing it after 5 s) and removes the
//! temporary directory. A directory left by a hostd that was itself killed is removed by the
//! next private daemon's start ([`sweep_stale_dirs`]): its name carries the owner's pid.

use super::error::ExpertClientError;
use super::health::ExpertHealth;
use super::transport::Endpoint;
use shared::sizes::human_bytes;
use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
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
/// First wait before restarting a child that exited.
pub const RESTART_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest wait between restarts of a child that keeps exiting.
pub const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A child that lived this long resets the backoff.
pub const STABLE_AFTER: Duration = Duration::from_secs(30);
/// How often the supervisor looks at the child.
const SUPERVISE_POLL: Duration = Duration::from_millis(50);
/// How long a stopping child may drain before it is killed.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Prefix of the temporary directories (followed by the owner's pid and a dash).
const DIR_PREFIX: &str = "sluice-expertd-";

/// Every private daemon of this process, for [`stop_all`] only. A global because the owner
/// cannot always be dropped before the process exits: `hostd serve` moves the model (and with
/// it the client that owns its [`PrivateDaemon`]) onto the scheduler thread, which is detached
/// and still running (or the loader thread still loading) when `main` returns, and statics
/// are never dropped. Dropping the owner is the normal path; this is the exit path's. Weak
/// references: the registry keeps no daemon alive. Everything else asks the owning client
/// (`ExpertBackend::private_daemon_pid`).
static DAEMONS: Mutex<Vec<Weak<Supervised>>> = Mutex::new(Vec::new());

fn daemons() -> Vec<Arc<Supervised>> {
    let mut all = DAEMONS.lock().unwrap_or_else(PoisonError::into_inner);
    all.retain(|w| w.strong_count() > 0);
    all.iter().filter_map(Weak::upgrade).collect()
}

/// Stops every private daemon of this process and removes its directory (hostd's `main` calls
/// this on every return, since the model that owns a client may live on a detached thread).
pub fn stop_all() {
    for d in daemons() {
        d.shutdown();
    }
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
    /// Bytes hostd itself will still allocate after the daemon starts (its dense weights and
    /// runtime, `crate::plan::host_weight_bytes`, and `hostd serve`'s prefix cache), kept out
    /// of the default budget.
    pub host_bytes: u64,
    /// The daemon's compute threads (default: one per core).
    pub threads: Option<usize>,
    /// More `expertd serve` flags, passed verbatim (e.g. `--no-overlap` for A/B runs).
    pub extra_args: Vec<String>,
}

/// One child process.
struct Running {
    child: Child,
    /// Closing this pipe tells the child to drain and exit.
    stdin: Option<ChildStdin>,
    started: Instant,
}

/// The state the owner and the supervisor thread share.
struct Supervised {
    bin: PathBuf,
    args: Vec<OsString>,
    socket: PathBuf,
    /// Removed (with the socket) at shutdown.
    dir: Mutex<Option<tempfile::TempDir>>,
    /// The current child; `None` between an exit and the restart. Spawning happens under this
    /// lock after checking `stopping`, so a shutdown never misses a child.
    child: Mutex<Option<Running>>,
    stopping: AtomicBool,
    health: Arc<ExpertHealth>,
}

/// A supervised child expertd.
pub struct PrivateDaemon {
    inner: Arc<Supervised>,
    supervisor: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for PrivateDaemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivateDaemon")
            .field("socket", &self.inner.socket)
            .field("pid", &self.inner.pid())
            .finish()
    }
}

fn err(msg: String) -> ExpertClientError {
    ExpertClientError::PrivateDaemon(msg)
}

/// Standard output of a child: hostd's standard error, so the child never writes into hostd's
/// own output (which may be JSON).
fn stderr_stdio() -> Stdio {
    std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map_or_else(|_| Stdio::null(), Stdio::from)
}

impl PrivateDaemon {
    /// The `expertd` binary: `$SLUICE_EXPERTD_BIN`, else the one next to this executable.
    pub fn binary() -> Result<PathBuf, ExpertClientError> {
        if let Some(p) = std::env::var_os(EXPERTD_BIN_ENV) {
            return Ok(PathBuf::from(p));
        }
        let exe = std::env::current_exe()
            .map_err(|e| err(format!("cannot locate this executable: {e}")))?;
        let bin = exe
            .parent()
            .map(|d| d.join("expertd"))
            .ok_or_else(|| err("this executable has no directory".into()))?;
        if !bin.exists() {
            return Err(err(format!(
                "{} not found (install expertd next to hostd, set {EXPERTD_BIN_ENV}, or pass --expertd URI)",
                bin.display()
            )));
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
            return Err(err(format!(
                "`expertd prepare {} --out {}` failed ({status})",
                model.display(),
                container.display()
            )));
        }
        Ok(())
    }

    /// Prepares the container if needed, starts the child, waits for its socket and starts
    /// the supervisor.
    pub fn start(opts: &PrivateOptions) -> Result<PrivateDaemon, ExpertClientError> {
        let bin = PrivateDaemon::binary()?;
        let file = opts.container.join(shared::container::CONTAINER_FILE);
        if !file.exists() {
            PrivateDaemon::prepare(&bin, &opts.model, &opts.container)?;
        }
        // The experts' bytes as expertd counts them (blobs × stride), not the file's length.
        let header = std::fs::File::open(&file)
            .map_err(|e| err(format!("{}: {e}", file.display())))
            .and_then(|f| {
                shared::container::read_header(&f, &file).map_err(|e| err(e.to_string()))
            })?
            .0;
        let len = header.layout.dims.n_blobs() as u64 * header.layout.blob.stride as u64;
        let (budget, why) = match opts.cache_bytes {
            Some(b) => (b, "set by --expertd-cache-bytes".to_string()),
            None => default_cache_budget(len, opts.host_bytes, available_memory()),
        };
        // Said on stderr whatever the log level: whether the run streams decides its speed.
        eprintln!(
            "hostd: private expertd cache: {} ({why})",
            shared::sizes::cache_budget_summary(budget.min(len), len)
        );
        sweep_stale_dirs(&std::env::temp_dir());
        let dir = tempfile::Builder::new()
            .prefix(&format!("{DIR_PREFIX}{}-", std::process::id()))
            .tempdir()
            .map_err(|e| err(format!("temporary directory: {e}")))?;
        let socket = dir.path().join("expertd.sock");
        let mut args: Vec<OsString> = vec![
            "serve".into(),
            "--container".into(),
            opts.container.clone().into(),
        ];
        args.extend([
            "--socket".into(),
            socket.clone().into(),
            "--socket-mode".into(),
            "600".into(),
        ]);
        args.extend([
            "--cache-bytes".into(),
            budget.to_string().into(),
            "--exit-on-stdin-eof".into(),
        ]);
        if let Some(t) = opts.threads {
            args.extend(["--threads".into(), t.to_string().into()]);
        }
        args.extend(opts.extra_args.iter().map(OsString::from));
        let inner = Arc::new(Supervised {
            bin,
            args,
            socket,
            dir: Mutex::new(Some(dir)),
            child: Mutex::new(None),
            stopping: AtomicBool::new(false),
            health: Arc::new(ExpertHealth::new()),
        });
        DAEMONS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::downgrade(&inner));
        if let Err(e) = inner.spawn_child() {
            inner.shutdown();
            return Err(e);
        }
        tracing::info!(socket = %inner.socket.display(), pid = inner.pid(), budget_bytes = budget, "private expertd started");
        let watched = Arc::clone(&inner);
        let supervisor = std::thread::Builder::new()
            .name("hostd-expertd-supervisor".into())
            .spawn(move || supervise(&watched))
            .map_err(|e| {
                inner.shutdown();
                err(format!("starting the supervisor thread: {e}"))
            })?;
        Ok(PrivateDaemon {
            inner,
            supervisor: Some(supervisor),
        })
    }

    /// Where the child listens (the same path across restarts).
    pub fn endpoint(&self) -> Endpoint {
        Endpoint::Unix(self.inner.socket.clone())
    }

    /// The current child's process id (`None` while it is being restarted).
    pub fn pid(&self) -> Option<u32> {
        self.inner.pid()
    }

    /// The readiness record the supervisor reports to (shared with the client).
    pub fn health(&self) -> Arc<ExpertHealth> {
        Arc::clone(&self.inner.health)
    }
}

impl Drop for PrivateDaemon {
    fn drop(&mut self) {
        self.inner.shutdown();
        if let Some(t) = self.supervisor.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Supervised {
    fn pid(&self) -> Option<u32> {
        self.child
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|r| r.child.id())
    }

    /// Starts a child (unless stopping) and waits for its socket.
    fn spawn_child(&self) -> Result<(), ExpertClientError> {
        let pid = {
            let mut slot = self.child.lock().unwrap_or_else(PoisonError::into_inner);
            if self.stopping.load(Ordering::SeqCst) {
                return Err(err("hostd is stopping".into()));
            }
            // A socket file left by a killed child would look like readiness.
            let _ = std::fs::remove_file(&self.socket);
            let mut cmd = Command::new(&self.bin);
            cmd.args(&self.args);
            // The child logs to hostd's stderr; quietly unless the user asked for more.
            if std::env::var_os("RUST_LOG").is_none() {
                cmd.env("RUST_LOG", "warn");
            }
            cmd.stdin(Stdio::piped())
                .stdout(stderr_stdio())
                .stderr(Stdio::inherit());
            let mut child = cmd
                .spawn()
                .map_err(|e| err(format!("starting {}: {e}", self.bin.display())))?;
            let stdin = child.stdin.take();
            let pid = child.id();
            *slot = Some(Running {
                child,
                stdin,
                started: Instant::now(),
            });
            pid
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            {
                let mut slot = self.child.lock().unwrap_or_else(PoisonError::into_inner);
                let Some(r) = slot.as_mut() else {
                    return Err(err("hostd is stopping".into()));
                };
                if let Some(status) = r.child.try_wait().map_err(|e| err(e.to_string()))? {
                    *slot = None;
                    return Err(err(format!(
                        "expertd (pid {pid}) exited ({status}) before it was ready; its log is above"
                    )));
                }
            }
            if self.socket.exists() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(err(format!(
                    "expertd did not create {} within {START_TIMEOUT:?}",
                    self.socket.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the child (closing its pipe, then killing it after [`DRAIN_TIMEOUT`]) and removes
    /// the directory. Idempotent.
    fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let running = self
            .child
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(mut r) = running {
            drop(r.stdin.take());
            let deadline = Instant::now() + DRAIN_TIMEOUT;
            let mut exited = false;
            while Instant::now() < deadline {
                if let Ok(Some(_)) | Err(_) = r.child.try_wait() {
                    exited = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            if !exited {
                let _ = r.child.kill();
                let _ = r.child.wait();
            }
        }
        if let Some(dir) = self
            .dir
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let path = dir.path().to_path_buf();
            if let Err(e) = dir.close() {
                tracing::warn!(dir = %path.display(), error = %e, "could not remove the private expertd's directory");
            }
        }
    }
}

/// The supervisor thread: reaps an exited child at once and restarts it with backoff, until
/// the daemon is stopping.
fn supervise(d: &Supervised) {
    let mut backoff = RESTART_BACKOFF_MIN;
    while !d.stopping.load(Ordering::SeqCst) {
        std::thread::park_timeout(SUPERVISE_POLL);
        let exited = {
            let mut slot = d.child.lock().unwrap_or_else(PoisonError::into_inner);
            let status = slot.as_mut().and_then(|r| match r.child.try_wait() {
                Ok(Some(status)) => Some((r.child.id(), status.to_string(), r.started.elapsed())),
                Ok(None) => None,
                Err(e) => Some((r.child.id(), e.to_string(), r.started.elapsed())),
            });
            if status.is_some() {
                // Reaped by `try_wait`: no zombie. The pipe closes with it.
                *slot = None;
            }
            status
        };
        let Some((pid, status, lived)) = exited else {
            continue;
        };
        if d.stopping.load(Ordering::SeqCst) {
            return;
        }
        if lived >= STABLE_AFTER {
            backoff = RESTART_BACKOFF_MIN;
        }
        let what = format!(
            "the private expertd (pid {pid}) exited ({status}) after {:.1} s",
            lived.as_secs_f64()
        );
        eprintln!("hostd: {what}; restarting it in {} ms", backoff.as_millis());
        d.health.unavailable(format!("{what}; restarting"));
        loop {
            std::thread::park_timeout(backoff);
            if d.stopping.load(Ordering::SeqCst) {
                return;
            }
            let t = Instant::now();
            let result = d.spawn_child();
            backoff = (backoff * 2).min(RESTART_BACKOFF_MAX);
            match result {
                Ok(()) => {
                    d.health.restarted();
                    eprintln!(
                        "hostd: private expertd restarted (pid {}, ready in {} ms)",
                        d.pid().unwrap_or(0),
                        t.elapsed().as_millis()
                    );
                    break;
                }
                Err(e) => {
                    if d.stopping.load(Ordering::SeqCst) {
                        return;
                    }
                    d.health.unavailable(format!(
                        "{what}; restarting it failed: {e}; retrying in {} ms",
                        backoff.as_millis()
                    ));
                    eprintln!(
                        "hostd: restarting the private expertd failed: {e}; retrying in {} ms",
                        backoff.as_millis()
                    );
                }
            }
        }
    }
}

/// Removes private-daemon directories in `tmp` whose owning hostd (the pid in the name) is no
/// longer running: left behind when that hostd was killed. Only this user's directories.
pub fn sweep_stale_dirs(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    // `/proc/self` belongs to this process's user.
    let Ok(uid) = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m))
    else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(DIR_PREFIX))
            .and_then(|r| r.split_once('-'))
            .and_then(|(p, _)| p.parse::<u32>().ok())
        else {
            continue;
        };
        let owned = std::os::unix::fs::MetadataExt::uid(&match entry.metadata() {
            Ok(m) if m.is_dir() => m,
            _ => continue,
        }) == uid;
        if owned && pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            match std::fs::remove_dir_all(entry.path()) {
                Ok(()) => {
                    tracing::info!(dir = %entry.path().display(), "removed a private expertd directory left by a hostd that was killed");
                }
                Err(e) => {
                    tracing::debug!(dir = %entry.path().display(), error = %e, "could not remove a stale private expertd directory");
                }
            }
        }
    }
}

/// The default cache budget of a private daemon and how it was chosen: the whole container
/// when it fits in `available` memory beside `host_bytes` and [`DEFAULT_HEADROOM_BYTES`],
/// otherwise what is left (at least [`MIN_DEFAULT_CACHE_BYTES`]). Without a memory figure,
/// the whole container.
pub fn default_cache_budget(
    container_bytes: u64,
    host_bytes: u64,
    available: Option<u64>,
) -> (u64, String) {
    let Some(available) = available else {
        return (
            container_bytes,
            "default: the whole container; free memory unknown".into(),
        );
    };
    let spare = available
        .saturating_sub(host_bytes)
        .saturating_sub(DEFAULT_HEADROOM_BYTES);
    let budget = container_bytes.min(spare.max(MIN_DEFAULT_CACHE_BYTES));
    let why = format!(
        "default: {} available less {} for hostd (dense weights, runtime, state cache) and {} headroom; --expertd-cache-bytes to choose",
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
    let mut available = shared::procfs::meminfo_bytes("MemAvailable")?;
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
    cgroup_memory(root, proc_self_cgroup).map(|c| c.room)
}

/// The memory limit that leaves the least room, of a cgroup and its ancestors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupMemory {
    /// The limit (`memory.max` or `memory.limit_in_bytes`).
    pub limit: u64,
    /// The limit less the usage that cannot be dropped.
    pub room: u64,
}

/// [`cgroup_room`] with the limit it came from.
pub fn cgroup_memory(root: &Path, proc_self_cgroup: &str) -> Option<CgroupMemory> {
    let mut best: Option<CgroupMemory> = None;
    let mut consider = |c: CgroupMemory| {
        if best.is_none_or(|b| c.room < b.room) {
            best = Some(c);
        }
    };
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let rel = path.trim().trim_start_matches('/');
        let (base, files) = if controllers.is_empty() {
            (
                root.to_path_buf(),
                ("memory.max", "memory.current", "inactive_file"),
            )
        } else if controllers.split(',').any(|c| c == "memory") {
            (
                root.join("memory"),
                (
                    "memory.limit_in_bytes",
                    "memory.usage_in_bytes",
                    "total_inactive_file",
                ),
            )
        } else {
            continue;
        };
        let mut dir = base.join(rel);
        loop {
            if let Some(c) = limit_room(&dir, files) {
                consider(c);
            }
            if dir == base || !dir.pop() || !dir.starts_with(&base) {
                break;
            }
        }
    }
    best
}

/// `limit − (usage − inactive file pages)` of one cgroup directory, if it has a numeric limit
/// (v2 writes `max` for none; v1 writes a huge number, which leaves the room huge too).
fn limit_room(
    dir: &Path,
    (limit_file, usage_file, inactive_key): (&str, &str, &str),
) -> Option<CgroupMemory> {
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
    let limit: u64 = read(limit_file)?.trim().parse().ok()?;
    let usage: u64 = read(usage_file)?.trim().parse().ok()?;
    let inactive: u64 = read("memory.stat")
        .and_then(|stat| {
            stat.lines().find_map(|l| {
                l.strip_prefix(inactive_key)
                    .and_then(|v| v.strip_prefix(' '))
                    .and_then(|v| v.trim().parse().ok())
            })
        })
        .unwrap_or(0);
    Some(CgroupMemory {
        limit,
        room: limit.saturating_sub(usage.saturating_sub(inactive)),
    })
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
            (
                "system.slice/app.service/memory.stat",
                "anon 3000\ninactive_file 1000\nactive_file 1000\n",
            ),
        ]);
        // 8000 − (5000 − 1000 inactive) = 4000; the parent has no limit.
        assert_eq!(
            super::cgroup_room(t.path(), "0::/system.slice/app.service\n"),
            Some(4000)
        );
        assert_eq!(super::cgroup_room(t.path(), "0::/\n"), None);
    }

    #[test]
    fn cgroup_v1_memory_controller_is_read_too() {
        let t = tree(&[
            ("memory/docker/abc/memory.limit_in_bytes", "4096\n"),
            ("memory/docker/abc/memory.usage_in_bytes", "3000\n"),
            (
                "memory/docker/abc/memory.stat",
                "cache 10\ntotal_inactive_file 1000\n",
            ),
            ("memory/memory.limit_in_bytes", "9223372036854771712\n"),
            ("memory/memory.usage_in_bytes", "1\n"),
        ]);
        let text = "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n";
        assert_eq!(super::cgroup_room(t.path(), text), Some(4096 - 2000));
    }

    #[test]
    fn short_memory_still_leaves_a_working_cache() {
        assert_eq!(
            default_cache_budget(60 * GIB, 5 * GIB, Some(GIB)).0,
            MIN_DEFAULT_CACHE_BYTES
        );
        assert_eq!(
            default_cache_budget(100 << 20, 5 * GIB, Some(GIB)).0,
            100 << 20
        );
        assert_eq!(default_cache_budget(60 * GIB, 5 * GIB, None).0, 60 * GIB);
    }
}
