//! [`ExpertClientError`]: every way talking to expertd can fail, and hostd's one mapping from
//! a gRPC `Status` to it ([`ExpertClientError::from_status`]) and from it to the model's
//! `ExpertError`. Messages name the daemon's address and, for refusals, both sides' values.

use crate::experts::ExpertError;
use tonic::Code;

/// Metadata key expertd sets on every status it sends (absent: the transport failed).
pub const ORIGIN_METADATA: &str = "expertd-origin";
/// Metadata key under which expertd names the layer of a failed expert read.
pub const LAYER_METADATA: &str = "expertd-layer";
/// Metadata key under which expertd names the expert of a failed expert read.
pub const EXPERT_METADATA: &str = "expertd-expert";

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
    #[error("expertd at {endpoint} serves container fingerprint {served:#018x}, but this hostd expects {expected:#018x}{hint}")]
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
        expert: Option<(usize, u32)>,
    },
    /// The connection broke during the call (daemon exited or restarted); the next call
    /// reconnects.
    #[error("expertd at {endpoint} went away during the call ({message}); the call failed and hostd reconnects on the next one")]
    ConnectionLost {
        /// The daemon's address.
        endpoint: String,
        /// The transport's message.
        message: String,
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
        let from_daemon = status.metadata().get(ORIGIN_METADATA).is_some();
        if !from_daemon && matches!(code, Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Internal) {
            return ExpertClientError::ConnectionLost { endpoint: endpoint.to_string(), message: if message.is_empty() { format!("{code:?}") } else { message } };
        }
        let meta = |key: &str| status.metadata().get(key).and_then(|v| v.to_str().ok()).and_then(|s| s.parse::<u64>().ok());
        let expert = match (meta(LAYER_METADATA), meta(EXPERT_METADATA)) {
            (Some(l), Some(e)) => Some((l as usize, e as u32)),
            _ => None,
        };
        ExpertClientError::Status { endpoint: endpoint.to_string(), code, message, expert }
    }

    /// Whether the session or connection is gone and a new handshake may succeed.
    pub fn needs_reconnect(&self) -> bool {
        match self {
            ExpertClientError::ConnectionLost { .. } | ExpertClientError::Connect { .. } => true,
            ExpertClientError::Status { code, .. } => matches!(code, Code::NotFound | Code::Unavailable | Code::Unknown),
            _ => false,
        }
    }

    /// As the model's `ExpertError` for a call of `layer`.
    pub fn into_expert_error(self, layer: usize) -> ExpertError {
        match self {
            ExpertClientError::Status { expert: Some((l, e)), .. } => ExpertError::Expert { layer: l, expert: e, reason: self.to_string() },
            ExpertClientError::Status { code: Code::InvalidArgument, .. } => ExpertError::InvalidCall { layer, reason: self.to_string() },
            other => ExpertError::Backend { backend: "expertd", layer, reason: other.to_string() },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_once() {
        let mut s2 = tonic::Status::new(Code::DataLoss, "layer 1 expert 2: checksum mismatch");
        s2.metadata_mut().insert(ORIGIN_METADATA, "1".parse().expect("ascii"));
        s2.metadata_mut().insert(LAYER_METADATA, "1".parse().expect("ascii"));
        s2.metadata_mut().insert(EXPERT_METADATA, "2".parse().expect("ascii"));
        match ExpertClientError::from_status("unix:///x", &s2).into_expert_error(1) {
            ExpertError::Expert { layer: 1, expert: 2, reason } => assert!(reason.contains("checksum"), "{reason}"),
            other => panic!("{other:?}"),
        }
        let e = ExpertClientError::from_status("unix:///x", &tonic::Status::new(Code::NotFound, "unknown session 5"));
        assert!(e.needs_reconnect());
        let e = ExpertClientError::from_status("unix:///x", &tonic::Status::new(Code::Unavailable, "broken pipe"));
        assert!(matches!(e, ExpertClientError::ConnectionLost { .. }), "{e:?}");
        let e = ExpertClientError::from_status("unix:///x", &tonic::Status::new(Code::InvalidArgument, "bad"));
        assert!(!e.needs_reconnect());
    }
}
