//! The daemon's one mapping from domain errors to gRPC status codes. Every error a call can
//! end with is an [`RpcError`]; `From<RpcError> for Status` is the only place a code is chosen:
//!
//! | error | code |
//! |---|---|
//! | malformed call: lengths, ranges, duplicates, non-finite weights or activations (naming layer and row), bad slices, buffer too small, bad wire values | `INVALID_ARGUMENT` |
//! | protocol version, container identity or fingerprint mismatch; shared memory on a connection without a segment | `FAILED_PRECONDITION` |
//! | unknown session (never opened, closed, or opened on another connection) | `NOT_FOUND` |
//! | session at its bound on calls in flight; the daemon's queue of decoded requests at its byte cap; connection or peer at its cap of open sessions (naming the flag); cache exhausted (every slot and transient buffer leased) | `RESOURCE_EXHAUSTED` |
//! | blob checksum or padding mismatch, container file shorter than its blobs | `DATA_LOSS` |
//! | draining for shutdown; device read error; another call's read of a shared expert failed | `UNAVAILABLE` |
//! | unix peer not in `--allow-uid` / `--allow-gid` | `PERMISSION_DENIED` |
//! | TCP call without the bearer token | `UNAUTHENTICATED` |
//! | anything that is the daemon's own bug | `INTERNAL` |

use crate::cache::CacheError;
use crate::io::IoError;
use crate::moe_call::CallError;
use crate::session::CapReached;
use crate::shm::ShmError;
use tonic::{Code, Status};

/// Every way an RPC can fail.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// The call executor refused or failed the call.
    #[error(transparent)]
    Call(#[from] CallError),
    /// The session is not open on this connection.
    #[error(
        "unknown session {session}: it was never opened on this connection, or it was closed (handshake again)"
    )]
    UnknownSession {
        /// The session id in the request.
        session: u64,
    },
    /// The session already has its bound of calls queued or running.
    #[error(
        "session {session} already has {limit} calls queued or running (the per-session limit); retry when one finishes"
    )]
    SessionBusy {
        /// The session.
        session: u64,
        /// The bound.
        limit: u32,
    },
    /// A handshake over the connection's or the peer's cap of open sessions.
    #[error(transparent)]
    TooManySessions(#[from] CapReached),
    /// Counting the request (arriving, or decoded and waiting for a lane) would pass the
    /// daemon's cap.
    #[error(
        "expertd already holds {queued_bytes} B of requests arriving or waiting for a compute lane; this request's {held_bytes} B would pass its cap of {cap_bytes} B (--max-queued-bytes); retry when calls finish, or use the shared-memory ring"
    )]
    QueueFull {
        /// What this call's decoded request holds.
        held_bytes: u64,
        /// What queued calls hold now.
        queued_bytes: u64,
        /// The cap.
        cap_bytes: u64,
    },
    /// Counting the request would pass its peer's share of the cap (`crate::call::queued`).
    #[error(
        "{peer} already holds {peer_bytes} B of requests arriving or waiting for a compute lane; this request's {held_bytes} B would pass one peer's share of {share_bytes} B (three quarters of --max-queued-bytes, so that other clients always find room); retry when its calls finish, or use the shared-memory ring"
    )]
    PeerQueueFull {
        /// The peer (`uid:N` or `tcp:ADDR`).
        peer: String,
        /// What this request is counted as.
        held_bytes: u64,
        /// What the peer's requests hold now.
        peer_bytes: u64,
        /// One peer's share.
        share_bytes: u64,
    },
    /// The request alone counts for more than one peer's share of the cap on queued requests.
    #[error(
        "this request is counted as {held_bytes} B (while it arrives: its wire bytes and what they may decode to; while it waits: its decoded form), more than one peer's share of {cap_bytes} B of the cap on requests arriving or waiting for a compute lane (three quarters of --max-queued-bytes); send fewer rows per call, or use the shared-memory ring"
    )]
    OverQueueCap {
        /// What this call's decoded request holds.
        held_bytes: u64,
        /// The cap.
        cap_bytes: u64,
    },
    /// The daemon is draining for shutdown.
    #[error("expertd is shutting down and accepts no new calls")]
    ShuttingDown,
    /// The client speaks a protocol version the daemon does not accept.
    #[error(
        "client speaks expertd protocol version {client}, but this expertd accepts versions {oldest}..={current}"
    )]
    VersionMismatch {
        /// The client's version.
        client: u32,
        /// The oldest version accepted.
        oldest: u32,
        /// The daemon's version.
        current: u32,
    },
    /// The container was prepared from another model than the client's.
    #[error(
        "container {container} was prepared from a different model than the client's ({what} differ; identities: container {theirs}, client model {ours})"
    )]
    IdentityMismatch {
        /// The container path.
        container: String,
        /// Which digests differ.
        what: String,
        /// The container's identity (hex).
        theirs: String,
        /// The client's identity (hex).
        ours: String,
    },
    /// The container fingerprint is not the one the client expects.
    #[error(
        "client expects container fingerprint {expected:#018x}, but this expertd serves {served:#018x} ({container})"
    )]
    FingerprintMismatch {
        /// The fingerprint the client expects.
        expected: u64,
        /// The fingerprint served.
        served: u64,
        /// The container path.
        container: String,
    },
    /// A wire value that does not convert, or a required field that is missing.
    #[error("{0}")]
    BadRequest(String),
    /// A shared-memory slice that is misaligned, out of bounds or names another segment.
    #[error(transparent)]
    Shm(#[from] ShmError),
    /// A shared-memory slice on a connection that passed no segment.
    #[error(
        "{field} is a shared-memory slice, but this connection passed no segment (send activations inline)"
    )]
    NoSegment {
        /// The request field.
        field: &'static str,
    },
    /// A buffer that cannot hold what the call needs.
    #[error(
        "{field} holds {found_bytes} bytes, but n_tokens × hidden_size × 4 = {needed_bytes} bytes are needed"
    )]
    BufferTooSmall {
        /// The request field.
        field: &'static str,
        /// Bytes given.
        found_bytes: u64,
        /// Bytes needed.
        needed_bytes: u64,
    },
    /// A unix peer outside the allow lists.
    #[error("peer uid {uid} gid {gid} is not allowed by --allow-uid / --allow-gid")]
    PeerNotAllowed {
        /// The peer's uid.
        uid: u32,
        /// The peer's gid.
        gid: u32,
    },
    /// A TCP call without a valid token.
    #[error("unauthenticated: {0}")]
    Unauthenticated(&'static str),
    /// The daemon's own bug (a lost task, missing connection info).
    #[error("internal error: {0}")]
    Internal(String),
}

impl RpcError {
    /// The status code this error maps to.
    pub fn code(&self) -> Code {
        match self {
            RpcError::Call(CallError::Invalid { .. }) => Code::InvalidArgument,
            RpcError::Call(CallError::Cache(c)) => match c {
                CacheError::Exhausted { .. } => Code::ResourceExhausted,
                CacheError::UnknownSession { .. } => Code::NotFound,
                CacheError::FillFailed { .. } | CacheError::FillTimeout { .. } => Code::Unavailable,
                CacheError::SlotBytes { .. }
                | CacheError::ArenaAlloc { .. }
                | CacheError::EmptyCall
                | CacheError::MixedLayers { .. }
                | CacheError::DuplicateKey { .. } => Code::Internal,
            },
            RpcError::Call(CallError::Io(io)) => match io {
                IoError::DataLoss { .. } | IoError::ShortRead { .. } => Code::DataLoss,
                IoError::Os { .. } => Code::Unavailable,
                IoError::Unaligned { .. } | IoError::OutOfRange { .. } => Code::Internal,
            },
            RpcError::Call(CallError::Misaligned { .. }) => Code::Internal,
            RpcError::Call(CallError::TooLarge { .. }) => Code::ResourceExhausted,
            RpcError::UnknownSession { .. } => Code::NotFound,
            RpcError::SessionBusy { .. }
            | RpcError::TooManySessions(_)
            | RpcError::QueueFull { .. }
            | RpcError::PeerQueueFull { .. }
            | RpcError::OverQueueCap { .. } => Code::ResourceExhausted,
            RpcError::ShuttingDown => Code::Unavailable,
            RpcError::VersionMismatch { .. }
            | RpcError::IdentityMismatch { .. }
            | RpcError::FingerprintMismatch { .. } => Code::FailedPrecondition,
            RpcError::BadRequest(_) | RpcError::BufferTooSmall { .. } => Code::InvalidArgument,
            RpcError::Shm(ShmError::Slice(_) | ShmError::WrongSegment { .. }) => {
                Code::InvalidArgument
            }
            RpcError::Shm(_) => Code::Internal,
            RpcError::NoSegment { .. } => Code::FailedPrecondition,
            RpcError::PeerNotAllowed { .. } => Code::PermissionDenied,
            RpcError::Unauthenticated(_) => Code::Unauthenticated,
            RpcError::Internal(_) => Code::Internal,
        }
    }

    /// A stable, low-cardinality name for metric labels and logs.
    pub fn error_type(&self) -> &'static str {
        match self {
            RpcError::Call(CallError::Invalid { .. }) => "invalid_call",
            RpcError::Call(CallError::Cache(c)) => c.error_type(),
            RpcError::Call(CallError::Io(io)) => io.error_type(),
            RpcError::Call(CallError::Misaligned { .. }) => "misaligned",
            RpcError::Call(CallError::TooLarge { .. }) => "call_too_large",
            RpcError::UnknownSession { .. } => "unknown_session",
            RpcError::SessionBusy { .. } => "session_busy",
            RpcError::QueueFull { .. } => "queue_full",
            RpcError::PeerQueueFull { .. } => "peer_queue_full",
            RpcError::OverQueueCap { .. } => "over_queue_cap",
            RpcError::TooManySessions(_) => "session_cap",
            RpcError::ShuttingDown => "shutting_down",
            RpcError::VersionMismatch { .. } => "version_mismatch",
            RpcError::IdentityMismatch { .. } => "identity_mismatch",
            RpcError::FingerprintMismatch { .. } => "fingerprint_mismatch",
            RpcError::BadRequest(_) => "bad_request",
            RpcError::Shm(_) => "shm",
            RpcError::NoSegment { .. } => "no_segment",
            RpcError::BufferTooSmall { .. } => "buffer_too_small",
            RpcError::PeerNotAllowed { .. } => "peer_not_allowed",
            RpcError::Unauthenticated(_) => "unauthenticated",
            RpcError::Internal(_) => "internal",
        }
    }
}

impl From<RpcError> for Status {
    fn from(e: RpcError) -> Status {
        let mut status = Status::new(e.code(), e.to_string());
        let expert = match &e {
            RpcError::Call(CallError::Io(
                IoError::DataLoss { layer, expert, .. }
                | IoError::ShortRead { layer, expert, .. }
                | IoError::Os { layer, expert, .. }
                | IoError::Unaligned { layer, expert, .. }
                | IoError::OutOfRange { layer, expert },
            )) => Some((*layer, *expert)),
            _ => None,
        };
        proto::convert::mark_daemon_status(&mut status, expert);
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::ids::{ExpertId, LayerId};

    fn check(e: RpcError, code: Code, needle: &str) {
        let s = Status::from(e);
        assert_eq!(s.code(), code, "{}", s.message());
        assert!(
            s.message().contains(needle),
            "{:?} lacks {needle:?}",
            s.message()
        );
    }

    #[test]
    fn codes() {
        check(
            RpcError::UnknownSession { session: 9 },
            Code::NotFound,
            "unknown session 9",
        );
        check(
            RpcError::SessionBusy {
                session: 1,
                limit: 4,
            },
            Code::ResourceExhausted,
            "4 calls",
        );
        check(
            RpcError::from(CapReached::Connection { limit: 64 }),
            Code::ResourceExhausted,
            "--max-sessions-per-connection",
        );
        check(
            RpcError::VersionMismatch {
                client: 1,
                oldest: 2,
                current: 2,
            },
            Code::FailedPrecondition,
            "version 1",
        );
        check(
            RpcError::Call(CallError::Invalid {
                layer: LayerId::new(3),
                reason: "x".into(),
            }),
            Code::InvalidArgument,
            "layer 3",
        );
        check(
            RpcError::Call(CallError::Io(IoError::Os {
                layer: LayerId::new(1),
                expert: ExpertId::new(2),
                offset: 4096,
                errno: 5,
            })),
            Code::Unavailable,
            "layer 1 expert 2",
        );
        check(
            RpcError::Unauthenticated("missing"),
            Code::Unauthenticated,
            "missing",
        );
        check(
            RpcError::PeerNotAllowed { uid: 7, gid: 8 },
            Code::PermissionDenied,
            "uid 7",
        );
    }
}
