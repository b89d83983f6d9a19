//! expertd run in-process, for the RPC, status and validation tests (mini-redis's
//! `tests/server.rs`, tonic's own tests): [`InProcessDaemon`] prepares the real server
//! ([`expertd::server::Prepared`]) and binds its listener — a unix socket in a temporary
//! directory, or TCP on `127.0.0.1:0` — before it returns, so a client connects at once: the
//! connection waits in the listener's backlog until the accept loop takes it, and no test polls
//! or sleeps for readiness. The server runs on a tokio runtime of its own thread (two workers,
//! as `expertd serve` runs it), its log is captured per daemon, and dropping it drains the server
//! (as SIGTERM does) and joins the thread.
//!
//! Tests that need the daemon to be a separate process — kill, restart, SIGSTOP, its RSS or
//! cgroup, stdin EOF, socket activation, the command line itself — keep the subprocess harness
//! ([`crate::Spawned`]).

use expertd::server::{Listener, Prepared, ServeConfig, ServeError, bind_unix};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

/// How long dropping or stopping a daemon waits for it to drain before giving up on it.
const STOP_LIMIT: Duration = Duration::from_secs(30);

/// What an [`InProcessDaemon`] listens on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// A unix socket (mode 0660, as `expertd serve --socket` binds it by default).
    Unix,
    /// TCP on 127.0.0.1 at a port the OS picks (the configuration must carry the token, and TLS
    /// or `insecure_tcp`).
    Tcp,
}

/// An `expertd` server running in this process; drained and joined when dropped.
pub struct InProcessDaemon {
    socket: Option<PathBuf>,
    tcp: Option<(std::net::SocketAddr, bool)>,
    log: LogBuffer,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: mpsc::Receiver<Result<(), ServeError>>,
    _dir: tempfile::TempDir,
}

impl InProcessDaemon {
    /// Serves `config` on a fresh unix socket; panics if the daemon cannot start.
    pub fn unix(config: ServeConfig) -> InProcessDaemon {
        InProcessDaemon::start(config, Transport::Unix)
            .unwrap_or_else(|e| panic!("in-process expertd on a unix socket: {e}"))
    }

    /// Serves `config` on TCP (127.0.0.1, a free port); panics if the daemon cannot start.
    pub fn tcp(config: ServeConfig) -> InProcessDaemon {
        InProcessDaemon::start(config, Transport::Tcp)
            .unwrap_or_else(|e| panic!("in-process expertd on TCP: {e}"))
    }

    /// Prepares `config` (what `expertd serve` does before it binds), binds the listener and
    /// starts serving; returns once a client can connect, or the error that stopped start-up.
    pub fn start(config: ServeConfig, transport: Transport) -> Result<InProcessDaemon, ServeError> {
        let dir = tempfile::tempdir().map_err(|source| ServeError::Io {
            what: "temporary directory".into(),
            source,
        })?;
        let log = LogBuffer::default();
        let dispatch = log.dispatch();
        let runtime = {
            let dispatch = dispatch.clone();
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("expertd-rt")
                // Every runtime thread (workers and the blocking pool) logs to this daemon's buffer.
                .on_thread_start(move || {
                    std::mem::forget(tracing::dispatcher::set_default(&dispatch));
                })
                .enable_all()
                .build()
                .map_err(|source| ServeError::Io {
                    what: "building the runtime".into(),
                    source,
                })?
        };
        let tls = config.tls.is_some();
        let prepared =
            tracing::dispatcher::with_default(&dispatch, || Prepared::new(config.clone()))?;
        // Registering the listener with tokio needs the runtime's context.
        let bound = {
            let _context = runtime.enter();
            match transport {
                Transport::Unix => {
                    let path = dir.path().join("expertd.sock");
                    bind_unix(&path, 0o660).map(|l| (Listener::Unix(l), Some(path), None))
                }
                Transport::Tcp => {
                    bind_tcp().map(|(l, addr)| (Listener::Tcp(l), None, Some((addr, tls))))
                }
            }
        };
        let (listener, socket, tcp) = bound?;
        config.check_listener(&listener)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (finished, done) = mpsc::channel();
        std::thread::Builder::new()
            .name("expertd-in-process".into())
            .spawn(move || {
                let served = tracing::dispatcher::with_default(&dispatch, || {
                    runtime.block_on(prepared.serve(listener, async move {
                        let _ = stopped.await;
                    }))
                });
                // Calls still on the blocking pool get a bounded wait, as the drain does.
                runtime.shutdown_timeout(STOP_LIMIT);
                let _ = finished.send(served);
            })
            .map_err(|source| ServeError::Io {
                what: "spawning the daemon thread".into(),
                source,
            })?;
        Ok(InProcessDaemon {
            socket,
            tcp,
            log,
            stop: Some(stop),
            done,
            _dir: dir,
        })
    }

    /// The unix socket's path; panics for a TCP daemon.
    pub fn socket(&self) -> &Path {
        self.socket.as_deref().expect("a unix-socket daemon")
    }

    /// The address a client dials: `unix://PATH`, or `http(s)://127.0.0.1:PORT` (https when
    /// the daemon serves TLS).
    pub fn uri(&self) -> String {
        match (&self.socket, self.tcp) {
            (Some(s), _) => format!("unix://{}", s.display()),
            (None, Some((addr, tls))) => format!("{}://{addr}", if tls { "https" } else { "http" }),
            (None, None) => unreachable!("a daemon listens on a unix socket or on TCP"),
        }
    }

    /// The daemon's log so far (what `expertd serve` writes to stderr at `info`, no colour).
    pub fn log_text(&self) -> String {
        self.log.text()
    }

    /// Drains the daemon (as SIGTERM does) and returns how serving ended.
    pub fn stop(mut self) -> Result<(), ServeError> {
        self.drain().unwrap_or_else(|| {
            panic!(
                "in-process expertd did not stop within {STOP_LIMIT:?}: {}",
                self.log_text()
            )
        })
    }

    /// Asks the server to stop and waits (at most [`STOP_LIMIT`]) for its result; `None` when
    /// it did not stop in time or was stopped already.
    fn drain(&mut self) -> Option<Result<(), ServeError>> {
        let _ = self.stop.take()?.send(());
        self.done.recv_timeout(STOP_LIMIT).ok()
    }
}

impl Drop for InProcessDaemon {
    fn drop(&mut self) {
        // A daemon that does not stop is left running (the test process ends it); an error
        // while draining is for `stop` to report.
        let _ = self.drain();
    }
}

/// A TCP listener on 127.0.0.1 at a port the OS picks, registered with tokio.
fn bind_tcp() -> Result<(tokio::net::TcpListener, std::net::SocketAddr), ServeError> {
    let io = |what: &str| {
        let what = what.to_string();
        move |source: std::io::Error| ServeError::Io { what, source }
    };
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(io("binding 127.0.0.1:0"))?;
    let addr = l.local_addr().map_err(io("local address"))?;
    l.set_nonblocking(true).map_err(io("set_nonblocking"))?;
    Ok((
        tokio::net::TcpListener::from_std(l).map_err(io("registering the listener with tokio"))?,
        addr,
    ))
}

/// One daemon's log lines, written by a `tracing` subscriber of its own.
#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl LogBuffer {
    /// A subscriber formatting like `expertd serve`'s (`info`, plain text) into this buffer.
    fn dispatch(&self) -> tracing::Dispatch {
        let buffer = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
            .with_ansi(false)
            .with_writer(move || buffer.clone())
            .finish();
        tracing::Dispatch::new(subscriber)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(
            &self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
        .into_owned()
    }
}

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
