//! The daemon's side of systemd: socket activation (a unix listener inherited through
//! `LISTEN_FDS`/`LISTEN_PID`, checked to be a listening unix stream socket at the path
//! `--socket` names and no more open than `--socket-mode`) and readiness notification
//! (`READY=1` once the daemon can serve, `STATUS=` lines, `STOPPING=1` when draining), both
//! through the `sd-notify` crate. Without a service manager (no `LISTEN_FDS`, no
//! `NOTIFY_SOCKET`) everything here is a no-op and the daemon binds its own socket.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

/// Why an inherited socket cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    /// `LISTEN_FDS`/`LISTEN_PID` were malformed.
    #[error("socket activation: {0}")]
    Env(std::io::Error),
    /// More or fewer than one descriptor was passed.
    #[error(
        "socket activation passed {0} descriptors; expertd takes exactly one (one ListenStream= in the .socket unit)"
    )]
    Count(usize),
    /// The descriptor is not what the daemon serves on.
    #[error("socket activation: descriptor {fd} {what}")]
    Unusable {
        /// The descriptor.
        fd: RawFd,
        /// What is wrong with it.
        what: String,
    },
    /// The inherited socket is bound elsewhere than `--socket`.
    #[error(
        "the inherited socket is bound at {bound}, but --socket says {wanted}; make ListenStream= and EXPERTD_SOCKET name the same path"
    )]
    PathMismatch {
        /// Where the inherited socket is bound.
        bound: String,
        /// What `--socket` names.
        wanted: String,
    },
    /// The socket file lets more users connect than `--socket-mode`.
    #[error(
        "the inherited socket {path} has mode {actual:o}, which lets more users connect than --socket-mode {wanted:o}; set SocketMode= in the .socket unit to {wanted:o} (or --socket-mode to match)"
    )]
    TooOpen {
        /// The socket file.
        path: String,
        /// Its permission bits.
        actual: u32,
        /// `--socket-mode`.
        wanted: u32,
    },
}

/// A listening unix socket handed over by the service manager.
pub struct Inherited {
    /// The listener, non-blocking, ready for tokio.
    pub listener: std::os::unix::net::UnixListener,
    /// The path it is bound at.
    pub path: PathBuf,
}

/// Takes the socket systemd passed, if this process was socket-activated (`LISTEN_PID` is
/// ours); `Ok(None)` otherwise. The descriptor must be a listening unix stream socket bound at
/// `socket` (when given) whose file grants write (connect) permission to no class of users that
/// `mode` does not: the same policy as a socket the daemon binds itself. Peer-credential allow
/// lists apply to its connections as to any other.
pub fn inherited_listener(
    socket: Option<&Path>,
    mode: u32,
) -> Result<Option<Inherited>, ActivationError> {
    let fds: Vec<RawFd> = sd_notify::listen_fds()
        .map_err(ActivationError::Env)?
        .collect();
    if fds.is_empty() {
        return Ok(None);
    }
    if fds.len() != 1 {
        return Err(ActivationError::Count(fds.len()));
    }
    let fd = fds[0];
    // SAFETY: LISTEN_PID names this process, so the service manager passed descriptor `fd` to
    // it and nothing else in the process owns it; `sd_notify::listen_fds` only set CLOEXEC.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let unusable = |what: String| ActivationError::Unusable { fd, what };
    use rustix::net::sockopt;
    let ty =
        sockopt::socket_type(&owned).map_err(|e| unusable(format!("is not a socket ({e})")))?;
    if ty != rustix::net::SocketType::STREAM {
        return Err(unusable(format!(
            "is a {ty:?} socket, not a stream socket (ListenStream=)"
        )));
    }
    if !sockopt::socket_acceptconn(&owned).map_err(|e| unusable(format!("SO_ACCEPTCONN: {e}")))? {
        return Err(unusable("is not listening".into()));
    }
    let addr =
        rustix::net::getsockname(&owned).map_err(|e| unusable(format!("getsockname: {e}")))?;
    let unix = rustix::net::SocketAddrUnix::try_from(addr)
        .map_err(|_| unusable("is not a unix socket (ListenStream= must be a path)".into()))?;
    let path = unix
        .path()
        .map(|p| PathBuf::from(p.to_string_lossy().into_owned()))
        .ok_or_else(|| {
            unusable("is an abstract or unnamed unix socket; give ListenStream= a path".into())
        })?;
    if let Some(wanted) = socket
        && std::fs::canonicalize(wanted).ok() != std::fs::canonicalize(&path).ok()
    {
        return Err(ActivationError::PathMismatch {
            bound: path.display().to_string(),
            wanted: wanted.display().to_string(),
        });
    }
    use std::os::unix::fs::PermissionsExt;
    let actual = std::fs::metadata(&path)
        .map_err(|e| {
            unusable(format!(
                "is bound at {}, which cannot be read: {e}",
                path.display()
            ))
        })?
        .permissions()
        .mode()
        & 0o777;
    // Connecting to a unix socket needs write permission on its file: compare the write bits.
    if actual & 0o222 & !(mode & 0o222) != 0 {
        return Err(ActivationError::TooOpen {
            path: path.display().to_string(),
            actual,
            wanted: mode,
        });
    }
    let listener = std::os::unix::net::UnixListener::from(owned);
    listener
        .set_nonblocking(true)
        .map_err(|e| unusable(format!("set_nonblocking: {e}")))?;
    Ok(Some(Inherited { listener, path }))
}

/// Tells the service manager (if any) a free-form status line.
pub fn status(text: &str) {
    notify(&[sd_notify::NotifyState::Status(text)]);
}

/// Tells the service manager (if any) the daemon can serve, with a status line.
pub fn ready(text: &str) {
    notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(text),
    ]);
}

/// Tells the service manager (if any) the daemon is draining.
pub fn stopping() {
    notify(&[
        sd_notify::NotifyState::Stopping,
        sd_notify::NotifyState::Status("draining: finishing in-flight calls"),
    ]);
}

fn notify(states: &[sd_notify::NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, socket = ?std::env::var_os("NOTIFY_SOCKET"), "sd_notify failed");
    }
}
