//! hostd's private expertd: with `--experts expertd` and no `--expertd URI`, hostd runs its own
//! daemon as a child process on a socket in a fresh 0700 temporary directory, after preparing
//! the container if it is missing (`expertd prepare`). The child watches its standard input
//! (a pipe from hostd) and drains and exits when it closes, so it never outlives hostd however
//! hostd ends — `kill -9` included. Dropping [`PrivateDaemon`] closes the pipe and waits.

use super::error::ExpertClientError;
use super::transport::Endpoint;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// Environment variable that overrides where the `expertd` binary is.
pub const EXPERTD_BIN_ENV: &str = "SLUICE_EXPERTD_BIN";
/// How long the child may take to create its socket.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest default cache budget of a private daemon, in bytes.
pub const DEFAULT_MAX_CACHE_BYTES: u64 = 4 << 30;

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
    /// The cache budget (default: the container's size, at most [`DEFAULT_MAX_CACHE_BYTES`]).
    pub cache_bytes: Option<u64>,
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
        let len = std::fs::metadata(&file).map_err(|e| err(format!("{}: {e}", file.display())))?.len();
        let budget = opts.cache_bytes.unwrap_or(len.min(DEFAULT_MAX_CACHE_BYTES));
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
