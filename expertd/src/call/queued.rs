//! The bytes of gRPC requests arriving (`crate::rpc::intake`) or decoded and waiting for a
//! compute lane, over every connection: one cap (`--max-queued-bytes`), of which one peer (a
//! unix uid, or a TCP address) may hold at most [`PEER_SHARE`] — so that whatever one peer
//! sends, stalls or floods, every other peer always finds the rest of the cap for its requests.

use crate::rpc::RpcError;
use crate::session::PeerKey;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// The part of the cap one peer may hold: three quarters (a peer can always have the largest
/// request arriving, which the default cap sizes for; the other quarter stays for the rest).
pub const PEER_SHARE: (u64, u64) = (3, 4);

/// The counted bytes, in total and per peer.
pub struct QueuedBytes {
    cap: u64,
    level: Mutex<Level>,
    refusals: AtomicU64,
}

#[derive(Default)]
struct Level {
    total: u64,
    by_peer: HashMap<PeerKey, u64>,
}

impl QueuedBytes {
    /// Counts against a cap of `cap` bytes.
    pub fn new(cap: u64) -> Arc<QueuedBytes> {
        Arc::new(QueuedBytes {
            cap,
            level: Mutex::default(),
            refusals: AtomicU64::new(0),
        })
    }

    /// The most one peer may hold.
    pub fn peer_share(&self) -> u64 {
        let (num, den) = PEER_SHARE;
        self.cap / den * num + self.cap % den * num / den
    }

    /// Bytes counted now, over every peer.
    pub fn level(&self) -> u64 {
        self.lock().total
    }

    /// Requests refused so far for the cap or a peer's share.
    pub fn refusals(&self) -> u64 {
        self.refusals.load(Ordering::Relaxed)
    }

    /// Counts `bytes` for `peer` until the guard drops, or refuses them: past the cap, past the
    /// peer's share, or more than a share alone.
    pub fn reserve(self: &Arc<Self>, bytes: u64, peer: PeerKey) -> Result<Held, RpcError> {
        if bytes == 0 {
            return Ok(Held::default());
        }
        let share = self.peer_share();
        let refused = |e: RpcError| {
            self.refusals.fetch_add(1, Ordering::Relaxed);
            Err(e)
        };
        if bytes > share {
            return refused(RpcError::OverQueueCap {
                held_bytes: bytes,
                cap_bytes: share,
            });
        }
        let mut level = self.lock();
        let mine = level.by_peer.get(&peer).copied().unwrap_or(0);
        if level.total.saturating_add(bytes) > self.cap {
            return refused(RpcError::QueueFull {
                held_bytes: bytes,
                queued_bytes: level.total,
                cap_bytes: self.cap,
            });
        }
        if mine.saturating_add(bytes) > share {
            return refused(RpcError::PeerQueueFull {
                peer: peer.label(),
                held_bytes: bytes,
                peer_bytes: mine,
                share_bytes: share,
            });
        }
        level.total += bytes;
        *level.by_peer.entry(peer).or_default() += bytes;
        Ok(Held {
            counted: Some((Arc::clone(self), peer)),
            bytes,
        })
    }

    fn release(&self, peer: PeerKey, bytes: u64) {
        let mut level = self.lock();
        level.total -= bytes;
        if let Some(n) = level.by_peer.get_mut(&peer) {
            *n -= bytes;
            if *n == 0 {
                level.by_peer.remove(&peer);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Level> {
        self.level.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Bytes counted in a [`QueuedBytes`] until dropped (when the call gets its lane, or the
/// request is refused or goes away).
#[derive(Default)]
pub struct Held {
    counted: Option<(Arc<QueuedBytes>, PeerKey)>,
    bytes: u64,
}

impl Held {
    /// The bytes counted.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Takes `other`'s bytes into this guard (both count for the same peer).
    pub fn absorb(&mut self, mut other: Held) {
        if let Some(c) = other.counted.take() {
            debug_assert!(self.counted.as_ref().is_none_or(|(_, p)| *p == c.1));
            self.counted.get_or_insert(c);
            self.bytes += std::mem::take(&mut other.bytes);
        }
    }

    /// Gives back all but `bytes` of what is counted.
    pub fn shrink_to(&mut self, bytes: u64) {
        if let Some((q, peer)) = &self.counted
            && bytes < self.bytes
        {
            q.release(*peer, self.bytes - bytes);
            self.bytes = bytes;
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.shrink_to(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_peer_cannot_take_the_whole_cap() {
        let q = QueuedBytes::new(400);
        let (a, b) = (PeerKey::Uid(1), PeerKey::Uid(2));
        assert_eq!(q.peer_share(), 300);
        let a1 = q.reserve(200, a).expect("within the share");
        let e = q.reserve(101, a).map(|_| ()).expect_err("past a's share");
        assert!(
            matches!(
                e,
                RpcError::PeerQueueFull {
                    peer_bytes: 200,
                    ..
                }
            ),
            "{e}"
        );
        // b still finds the rest of the cap.
        let b1 = q.reserve(200, b).expect("b's request");
        let e = q.reserve(1, b).map(|_| ()).expect_err("past the cap");
        assert!(
            matches!(
                e,
                RpcError::QueueFull {
                    queued_bytes: 400,
                    ..
                }
            ),
            "{e}"
        );
        assert!(matches!(
            q.reserve(301, b).map(|_| ()),
            Err(RpcError::OverQueueCap { .. })
        ));
        assert_eq!(q.refusals(), 3);
        let mut a1 = a1;
        a1.shrink_to(50);
        assert_eq!(q.level(), 250);
        a1.absorb(q.reserve(100, a).expect("fits again"));
        assert_eq!(a1.bytes(), 150);
        drop((a1, b1));
        assert_eq!(q.level(), 0);
        assert!(q.lock().by_peer.is_empty());
    }
}
