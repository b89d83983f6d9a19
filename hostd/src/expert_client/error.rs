//! [`ExpertClientError`]: every way talking to expertd can fail, and hostd's one mapping from
//! a gRPC `Status` to it ([`ExpertClientError::from_status`]) and from it to the model's
//! `ExpertError`. Messages name the daemon's address and, for refusals, both sides' values.

use crate::experts::ExpertError;
use shared::ids::{ExpertId, LayerId};
use tonic::Code;

/// The `Retry-After` (seconds) of a request failed because the daemon was unreachable: long
/// enough for a private daemon to restart or a stopped one to be noticed back by the probe.
pub const RETRY_AFTER_S: u64 = 2;

/// Why an expertd call or connection failed.
#[derive(Debug, thiserror::Error)]
pub enum ExpertClientError {
    /// The daemon could not be reached (not running, wrong path, refused).
    #[error("cannot connect to expertd at {endpoint}: {reason}")]
    Connect {
        /// The daemon's address.
        endpoint: String,
        /// Why.
        reason: String,
    },
    /// No daemon answered within the wait: the socket never appeared, refused connections, or
    /// its backlog stayed full (a daemon still starting), or every handshake failed.
    #[error("expertd at {endpoint} did not come up within {waited_s} s; last error: {last}")]
    NotUp {
        /// The daemon's address.
        endpoint: String,
        /// How long the client waited, in seconds (to 0.1 s).
        waited_s: f64,
        /// The last attempt's error (for a connection failure, the OS's reason).
        last: String,
    },
    /// The daemon speaks another protocol version.
    #[error(
        "expertd at {endpoint} speaks protocol version {daemon}, but this hostd speaks version {ours}; run matching hostd and expertd builds"
    )]
    VersionMismatch {
        /// The daemon's address.
        endpoint: String,
        /// The daemon's version.
        daemon: u32,
        /// Ours.
        ours: u32,
    },
    /// The daemon serves another container than expected.
    #[error(
        "expertd at {endpoint} serves container fingerprint {served:#018x}, but this hostd expects {expected:#018x}{hint}"
    )]
    FingerprintMismatch {
        /// The daemon's address.
        endpoint: String,
        /// What the daemon serves.
        served: u64,
        /// What we expect.
        expected: u64,
        /// Where the expectation came from.
        hint: String,
    },
    /// The daemon's container was prepared from another model, or has other dimensions.
    #[error("expertd at {endpoint} cannot serve this model: {reason}")]
    WrongModel {
        /// The daemon's address.
        endpoint: String,
        /// Both values.
        reason: String,
    },
    /// The daemon refused or failed a call.
    #[error("expertd at {endpoint}: {code:?}: {message}")]
    Status {
        /// The daemon's address.
        endpoint: String,
        /// The gRPC status code.
        code: Code,
        /// The daemon's message.
        message: String,
        /// The expert named by the daemon (layer, expert), for failed reads.
        expert: Option<(LayerId, ExpertId)>,
    },
    /// The connection broke during the call (daemon exited or restarted); the next call
    /// reconnects.
    #[error("expertd at {endpoint} went away during the call ({message})")]
    ConnectionLost {
        /// The daemon's address.
        endpoint: String,
        /// The transport's message.
        message: String,
    },
    /// The daemon did not answer within the call's deadline (`--expertd-call-timeout`): it is
    /// stopped, overloaded or hung. The call was abandoned with its session; the next call
    /// opens a new one.
    #[error(
        "expertd at {endpoint} did not answer {what} within {deadline_s} s (--expertd-call-timeout); the daemon is stopped, overloaded or hung, and the call was abandoned"
    )]
    DeadlineExceeded {
        /// The daemon's address.
        endpoint: String,
        /// What was waited for (`the call`, `a new connection's handshake`).
        what: &'static str,
        /// The deadline, in seconds (to 0.1 s).
        deadline_s: f64,
    },
    /// The TLS handshake with a `https://` daemon failed (its certificate is not signed by
    /// `--expertd-ca-file`, names another host, or the daemon does not speak TLS). Waiting
    /// does not fix it, so the connection is not retried.
    #[error("TLS with expertd at {endpoint} failed: {reason}")]
    Tls {
        /// The daemon's address.
        endpoint: String,
        /// rustls's reason.
        reason: String,
    },
    /// Setting up shared memory failed.
    #[error("shared memory for expertd: {0}")]
    Shm(std::io::Error),
    /// Starting or preparing the private daemon failed.
    #[error("private expertd: {0}")]
    PrivateDaemon(String),
    /// The daemon's answer does not fit the request.
    #[error("expertd at {endpoint} sent a malformed response: {reason}")]
    Protocol {
        /// The daemon's address.
        endpoint: String,
        /// What is wrong.
        reason: String,
    },
}

impl ExpertClientError {
    /// The one mapping from a daemon's `Status` to a client error.
    pub fn from_status(endpoint: &str, status: &tonic::Status) -> ExpertClientError {
        let code = status.code();
        let message = status.message().to_string();
        // expertd tags every status it sends; an untagged failure of these kinds comes from the
        // transport (the connection broke), not from the daemon.
        let from_daemon = proto::convert::is_daemon_status(status);
        if !from_daemon
            && matches!(
                code,
                Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Internal
            )
        {
            return ExpertClientError::ConnectionLost {
                endpoint: endpoint.to_string(),
                message: if message.is_empty() {
                    format!("{code:?}")
                } else {
                    message
                },
            };
        }
        ExpertClientError::Status {
            endpoint: endpoint.to_string(),
            code,
            message,
            expert: proto::convert::failed_expert(status),
        }
    }

    /// Whether the session or connection is gone and a new handshake may succeed.
    pub fn needs_reconnect(&self) -> bool {
        match self {
            ExpertClientError::ConnectionLost { .. }
            | ExpertClientError::Connect { .. }
            | ExpertClientError::NotUp { .. }
            | ExpertClientError::DeadlineExceeded { .. } => true,
            ExpertClientError::Status { code, .. } => {
                matches!(code, Code::NotFound | Code::Unavailable | Code::Unknown)
            }
            _ => false,
        }
    }

    /// Whether this is a connection attempt that failed because no daemon is serving at the
    /// address yet: the socket file is missing (`NotFound`), nobody listens
    /// (`ConnectionRefused`), or the listener's backlog is full because it does not accept yet
    /// (`WouldBlock`, `EAGAIN`). A daemon that is still starting gives these; the client waits.
    pub fn daemon_not_up(&self) -> bool {
        let ExpertClientError::Connect { reason, .. } = self else {
            return false;
        };
        os_error_kind(reason).is_some_and(|k| {
            matches!(
                k,
                std::io::ErrorKind::NotFound
                    | std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::WouldBlock
            )
        })
    }

    /// Whether a new connection may succeed if the client waits: the daemon is not up yet
    /// ([`Self::daemon_not_up`]), a connection broke (the daemon restarts or drains), or the
    /// session is gone. A connection refused for a reason waiting does not change (permission
    /// denied, a path through a file that is not a directory, …) is not worth waiting for.
    pub fn worth_waiting_for(&self) -> bool {
        use std::io::ErrorKind as K;
        match self {
            ExpertClientError::Connect { reason, .. } => os_error_kind(reason).is_none_or(|k| {
                matches!(
                    k,
                    K::NotFound
                        | K::ConnectionRefused
                        | K::WouldBlock
                        | K::ConnectionReset
                        | K::ConnectionAborted
                        | K::BrokenPipe
                        | K::Interrupted
                        | K::TimedOut
                )
            }),
            other => other.needs_reconnect(),
        }
    }

    /// `NotUp` after waiting `waited` for a daemon, with `self` as the last attempt's error.
    pub fn not_up(self, endpoint: &str, waited: std::time::Duration) -> ExpertClientError {
        let last = match self {
            ExpertClientError::Connect { reason, .. } => reason,
            other => other.to_string(),
        };
        ExpertClientError::NotUp {
            endpoint: endpoint.to_string(),
            waited_s: (waited.as_secs_f64() * 10.0).round() / 10.0,
            last,
        }
    }

    /// Whether the daemon itself answered the call with this failure, so its work on the call
    /// is over (expertd answers a call only after its compute job ended). Any other failure
    /// (deadline, lost connection, malformed answer) may leave the daemon still writing the
    /// call's output: its slot must not be reused.
    pub fn answered_by_daemon(&self) -> bool {
        matches!(self, ExpertClientError::Status { .. })
    }

    /// Whether this is a connection that nobody is listening for: the socket file is missing or
    /// the connection was refused or reset (the daemon is gone or restarting), as opposed to a
    /// daemon that accepted and then did not answer.
    pub fn nobody_listening(&self) -> bool {
        use std::io::ErrorKind as K;
        let ExpertClientError::Connect { reason, .. } = self else {
            return false;
        };
        os_error_kind(reason).is_some_and(|k| {
            matches!(
                k,
                K::NotFound | K::ConnectionRefused | K::ConnectionReset | K::BrokenPipe
            )
        })
    }

    /// Whether the daemon is (for now) unreachable or too slow, so the same request may succeed
    /// if retried shortly: gone, restarting, not answering in time, or saying it is
    /// unavailable. Requests failing this way are answered 503 with `Retry-After`.
    pub fn is_unavailable(&self) -> bool {
        match self {
            ExpertClientError::ConnectionLost { .. }
            | ExpertClientError::NotUp { .. }
            | ExpertClientError::DeadlineExceeded { .. } => true,
            ExpertClientError::Connect { .. } => self.worth_waiting_for(),
            ExpertClientError::Status { code, .. } => matches!(
                code,
                Code::Unavailable | Code::DeadlineExceeded | Code::Aborted
            ),
            _ => false,
        }
    }

    /// As the model's `ExpertError` for a call of `layer`.
    pub fn into_expert_error(self, layer: LayerId) -> ExpertError {
        if self.is_unavailable() {
            return ExpertError::Unavailable {
                backend: "expertd",
                layer,
                reason: self.to_string(),
                retry_after_s: RETRY_AFTER_S,
            };
        }
        match self {
            ExpertClientError::Status {
                expert: Some((l, e)),
                ..
            } => ExpertError::Expert {
                layer: l,
                expert: e,
                reason: self.to_string(),
            },
            ExpertClientError::Status {
                code: Code::InvalidArgument,
                ..
            } => ExpertError::InvalidCall {
                layer,
                reason: self.to_string(),
            },
            other => ExpertError::Backend {
                backend: "expertd",
                layer,
                reason: other.to_string(),
            },
        }
    }
}

/// The kind of an OS error from its message: `std::io::Error` displays an OS error as
/// `"<description> (os error N)"`, and the connection path keeps only that text.
pub(super) fn os_error_kind(reason: &str) -> Option<std::io::ErrorKind> {
    let code = reason
        .rsplit_once("(os error ")?
        .1
        .strip_suffix(')')?
        .parse::<i32>()
        .ok()?;
    Some(std::io::Error::from_raw_os_error(code).kind())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_once() {
        let mut s2 = tonic::Status::new(Code::DataLoss, "layer 1 expert 2: checksum mismatch");
        proto::convert::mark_daemon_status(&mut s2, Some((LayerId::new(1), ExpertId::new(2))));
        match ExpertClientError::from_status("unix:///x", &s2).into_expert_error(LayerId::new(1)) {
            ExpertError::Expert {
                layer,
                expert,
                reason,
            } if (layer.get(), expert.get()) == (1, 2) => {
                assert!(reason.contains("checksum"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        let e = ExpertClientError::from_status(
            "unix:///x",
            &tonic::Status::new(Code::NotFound, "unknown session 5"),
        );
        assert!(e.needs_reconnect());
        let e = ExpertClientError::from_status(
            "unix:///x",
            &tonic::Status::new(Code::Unavailable, "broken pipe"),
        );
        assert!(
            matches!(e, ExpertClientError::ConnectionLost { .. }),
            "{e:?}"
        );
        let e = ExpertClientError::from_status(
            "unix:///x",
            &tonic::Status::new(Code::InvalidArgument, "bad"),
        );
        assert!(!e.needs_reconnect());
    }

    #[test]
    fn an_unreachable_or_slow_daemon_is_a_retryable_unavailability() {
        let late = ExpertClientError::DeadlineExceeded {
            endpoint: "unix:///x".into(),
            what: "the call",
            deadline_s: 2.0,
        };
        assert!(late.needs_reconnect() && late.is_unavailable());
        assert!(late.to_string().contains("within 2 s"), "{late}");
        match late.into_expert_error(LayerId::new(3)) {
            ExpertError::Unavailable {
                layer,
                retry_after_s: RETRY_AFTER_S,
                reason,
                ..
            } if layer.get() == 3 => assert!(reason.contains("unix:///x"), "{reason}"),
            other => panic!("{other:?}"),
        }
        let lost = ExpertClientError::ConnectionLost {
            endpoint: "unix:///x".into(),
            message: "reset".into(),
        };
        assert!(matches!(
            lost.into_expert_error(LayerId::new(0)),
            ExpertError::Unavailable { .. }
        ));
        let bad = ExpertClientError::from_status(
            "unix:///x",
            &tonic::Status::new(Code::InvalidArgument, "bad"),
        );
        assert!(!bad.is_unavailable());
        assert!(matches!(
            bad.into_expert_error(LayerId::new(0)),
            ExpertError::InvalidCall { .. }
        ));
        let wrong = ExpertClientError::WrongModel {
            endpoint: "unix:///x".into(),
            reason: "dims".into(),
        };
        assert!(
            !wrong.is_unavailable(),
            "retrying does not fix a wrong container"
        );
    }

    #[test]
    fn a_daemon_still_starting_is_recognised_by_the_os_error() {
        use rustix::io::Errno;
        use std::io::{Error, ErrorKind};
        let connect = |e: Error| ExpertClientError::Connect {
            endpoint: "unix:///x".into(),
            reason: e.to_string(),
        };
        // The codes a connect to a daemon that is not serving yet fails with, as the connection
        // path reports them: the io::Error's text.
        for (code, kind) in [
            (Errno::NOENT, ErrorKind::NotFound),
            (Errno::CONNREFUSED, ErrorKind::ConnectionRefused),
            (Errno::AGAIN, ErrorKind::WouldBlock),
        ] {
            let e = connect(code.into());
            assert_eq!(os_error_kind(&e.to_string()), Some(kind));
            assert!(e.daemon_not_up() && e.worth_waiting_for(), "{e}");
        }
        let denied = connect(Errno::ACCESS.into());
        assert!(
            !denied.daemon_not_up() && !denied.worth_waiting_for(),
            "waiting does not grant permissions"
        );
        assert!(!connect(Error::other("the token is not valid header text")).daemon_not_up());
        assert!(
            connect(Errno::CONNRESET.into()).worth_waiting_for(),
            "a daemon restarting"
        );
        let lost = ExpertClientError::ConnectionLost {
            endpoint: "unix:///x".into(),
            message: "reset".into(),
        };
        assert!(!lost.daemon_not_up() && lost.worth_waiting_for());
        let bad = ExpertClientError::from_status(
            "unix:///x",
            &tonic::Status::new(Code::InvalidArgument, "bad"),
        );
        assert!(!bad.worth_waiting_for());

        let e =
            connect(Errno::NOENT.into()).not_up("unix:///x", std::time::Duration::from_secs(30));
        let msg = e.to_string();
        assert!(
            msg.starts_with("expertd at unix:///x did not come up within 30 s; last error: "),
            "{msg}"
        );
        assert!(msg.contains("(os error 2)"), "{msg}");
        assert!(e.needs_reconnect());
        let e = ExpertClientError::ConnectionLost {
            endpoint: "unix:///x".into(),
            message: "reset".into(),
        };
        let msg = e
            .not_up("unix:///x", std::time::Duration::from_millis(250))
            .to_string();
        assert!(
            msg.contains("within 0.3 s; last error: expertd at unix:///x went away"),
            "{msg}"
        );
    }
}
