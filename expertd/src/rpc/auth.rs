//! Who may call: unix peers are checked by their socket credentials against `--allow-uid` /
//! `--allow-gid` (when either is given), TCP peers by a bearer token compared in constant time.
//! The decision for a unix peer is made once, when the connection is accepted, and travels in
//! [`super::ConnInfo`]; the token is checked on every request, because HTTP/2 metadata is per
//! request. gRPC health has its own rule (`Auth::check_health`): the token on TCP, nothing
//! more on a unix socket. Both are applied in one place, `super::intake`, before a request's
//! body is read. Status codes come from `super::status`.

use super::status::RpcError;
use super::{ConnInfo, Peer};
use std::sync::Arc;

/// The daemon's access rules.
#[derive(Debug, Clone, Default)]
pub struct Auth {
    /// The bearer token TCP clients must present; `None` on a unix socket.
    token: Option<Arc<[u8]>>,
    /// Unix peers whose uid is listed may call (when either list is non-empty).
    allow_uids: Arc<[u32]>,
    /// Unix peers whose primary gid is listed may call (when either list is non-empty).
    allow_gids: Arc<[u32]>,
}

/// Compares two byte strings in time that depends only on their lengths (`subtle`).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    subtle::ConstantTimeEq::ct_eq(a, b).into()
}

impl Auth {
    /// Rules with an optional token and uid/gid allow lists.
    pub fn new(token: Option<String>, allow_uids: Vec<u32>, allow_gids: Vec<u32>) -> Auth {
        Auth {
            token: token.map(|t| Arc::from(t.into_bytes())),
            allow_uids: allow_uids.into(),
            allow_gids: allow_gids.into(),
        }
    }

    /// Whether a unix peer with these credentials may call.
    pub fn unix_peer_allowed(&self, uid: u32, gid: u32) -> bool {
        if self.allow_uids.is_empty() && self.allow_gids.is_empty() {
            return true;
        }
        self.allow_uids.contains(&uid) || self.allow_gids.contains(&gid)
    }

    /// Checks one request: a unix peer must have been allowed at accept time; a TCP peer must
    /// present `authorization: Bearer TOKEN`.
    pub fn check(
        &self,
        conn: &ConnInfo,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<(), RpcError> {
        match &conn.peer {
            Peer::Unix { uid, gid, .. } => {
                if conn.allowed {
                    Ok(())
                } else {
                    Err(RpcError::PeerNotAllowed {
                        uid: *uid,
                        gid: *gid,
                    })
                }
            }
            Peer::Tcp(_) => {
                let Some(expected) = &self.token else {
                    return Err(RpcError::Unauthenticated(
                        "this daemon has no token configured",
                    ));
                };
                let Some(value) = metadata.get(proto::AUTHORIZATION_HEADER) else {
                    return Err(RpcError::Unauthenticated(
                        "missing `authorization: Bearer TOKEN` metadata",
                    ));
                };
                let presented = value.as_bytes().strip_prefix(b"Bearer ").unwrap_or(b"");
                if constant_time_eq(presented, expected) {
                    Ok(())
                } else {
                    Err(RpcError::Unauthenticated("bearer token does not match"))
                }
            }
        }
    }
}

impl Auth {
    /// Checks a `grpc.health.v1` request: on TCP the same bearer token as every other call
    /// (a health probe over the network must not reveal, unauthenticated, that a daemon is
    /// there and serving); on a unix socket anyone the socket's mode admits.
    pub fn check_health(
        &self,
        conn: Option<&ConnInfo>,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<(), RpcError> {
        match conn {
            Some(ConnInfo {
                peer: Peer::Unix { .. },
                ..
            }) => Ok(()),
            Some(conn) => self.check(conn, metadata),
            None => Err(RpcError::Internal(
                "health request without connection info".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_exactly() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }

    #[test]
    fn allow_lists_restrict_only_when_given() {
        assert!(Auth::new(None, vec![], vec![]).unix_peer_allowed(5, 5));
        let a = Auth::new(None, vec![1000], vec![50]);
        assert!(a.unix_peer_allowed(1000, 1));
        assert!(a.unix_peer_allowed(2, 50));
        assert!(!a.unix_peer_allowed(0, 0));
    }
}
