//! Sessions and fairness: the registry of open sessions (one per client handshake, bound to the
//! connection it was opened on and closed with it, and capped per connection and per peer so
//! that no client can fill the daemon with sessions), each session's counters and its bound on
//! calls in flight, and the fair queue in front of the compute lanes, which serves waiting
//! sessions round-robin so a client that floods the daemon gets only its share.
//!
//! No IO and no cache decisions: the service opens and closes sessions, the call executor runs calls,
//! and the cache's own per-session lease accounting lives in `crate::cache`.

use shared::call_cost::CallCost;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::oneshot;

/// How a session's connection moves activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// Protobuf bytes.
    Inline,
    /// The connection's memfd segment.
    SharedMemory,
}

/// Whom a session counts against for the per-peer cap: a unix peer by its uid (every
/// connection of that user together), a TCP peer by its IP address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerKey {
    /// A unix-socket peer's uid.
    Uid(u32),
    /// A TCP peer's address (the port differs per connection and is not counted).
    Addr(std::net::IpAddr),
    /// A TCP peer whose address the OS did not report: counted together.
    Unknown,
}

impl PeerKey {
    /// The key as metrics and `Stats` label it: `uid:U`, `tcp:ADDRESS` or `tcp:unknown`.
    pub fn label(&self) -> String {
        match self {
            PeerKey::Uid(uid) => format!("uid:{uid}"),
            PeerKey::Addr(addr) => format!("tcp:{addr}"),
            PeerKey::Unknown => "tcp:unknown".into(),
        }
    }
}

impl std::fmt::Display for PeerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerKey::Uid(uid) => write!(f, "uid {uid}"),
            PeerKey::Addr(addr) => write!(f, "address {addr}"),
            PeerKey::Unknown => f.write_str("peers without an address"),
        }
    }
}

/// The caps on open sessions (each at least 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionCaps {
    /// Sessions one connection may hold open (`--max-sessions-per-connection`).
    pub per_connection: u32,
    /// Sessions one peer (uid, or TCP address) may hold open over all its connections
    /// (`--max-sessions-per-uid`).
    pub per_peer: u32,
}

/// A handshake refused because a session cap is reached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapReached {
    /// The connection holds its cap of sessions.
    #[error(
        "this connection already holds {limit} open sessions, the cap set by --max-sessions-per-connection; close one (CloseSession) or reuse it"
    )]
    Connection {
        /// The cap.
        limit: u32,
    },
    /// The peer holds its cap over all its connections.
    #[error(
        "{peer} already holds {limit} open sessions over all its connections, the cap set by --max-sessions-per-uid; close some (CloseSession, or end the processes holding them)"
    )]
    Peer {
        /// Whom the cap counts.
        peer: PeerKey,
        /// The cap.
        limit: u32,
    },
}

/// A session's cumulative counters. Relaxed atomics: they order nothing, and a stats reader
/// may see one call's counters half-applied.
#[derive(Debug, Default)]
pub struct SessionCounters {
    /// Calls completed successfully.
    pub calls: AtomicU64,
    /// Calls that failed, with any status.
    pub failed_calls: AtomicU64,
    /// Calls queued or running now.
    pub in_flight: AtomicU32,
    /// Experts found in the cache.
    pub hits: AtomicU64,
    /// Experts read from the container.
    pub misses: AtomicU64,
    /// Bytes read from the container.
    pub bytes_read: AtomicU64,
    /// Nanoseconds waited for a compute lane.
    pub queue_ns: AtomicU64,
    /// Nanoseconds waited for reads.
    pub io_wait_ns: AtomicU64,
    /// Nanoseconds computed.
    pub compute_ns: AtomicU64,
    /// Of `calls`, those that came through the shared-memory call ring.
    pub ring_calls: AtomicU64,
    /// Bursts of ring calls run on the kept-awake compute pool (`SessionStats.ring_bursts`).
    pub ring_bursts: AtomicU64,
}

/// One peer's counters over every session it has opened, closed ones included (what the
/// Prometheus endpoint reports per uid, and what the daemon totals sum). Each session adds to
/// its peer's totals as it records calls, so a call that finishes after its session closed
/// still counts.
#[derive(Debug, Default)]
pub struct PeerTotals {
    /// Sessions opened.
    pub sessions: AtomicU64,
    /// Calls completed successfully.
    pub calls: AtomicU64,
    /// Calls that failed.
    pub failed_calls: AtomicU64,
    /// Experts found in the cache.
    pub hits: AtomicU64,
    /// Experts read from the container.
    pub misses: AtomicU64,
    /// Bytes read from the container.
    pub bytes_read: AtomicU64,
}

/// One open session.
#[derive(Debug)]
pub struct Session {
    /// The id calls name.
    pub id: u64,
    /// The connection it was opened on (and is closed with).
    pub conn_id: u64,
    /// The name the client gave in its handshake.
    pub client_name: String,
    /// The peer: "uid U gid G pid P" or "ADDRESS:PORT".
    pub peer: String,
    /// Whom the session counts against for the per-peer cap.
    pub peer_key: PeerKey,
    /// How the connection moves activations.
    pub transport: TransportKind,
    /// Counters.
    pub counters: SessionCounters,
    /// Its peer's totals, which [`Session::record`] adds to as well.
    pub peer_totals: Arc<PeerTotals>,
    /// Set when the session is closed (its ring worker, if any, stops).
    closed: std::sync::atomic::AtomicBool,
}

impl Session {
    /// Whether the session was closed.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn mark_closed(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Records a finished call.
    pub fn record(&self, result: Result<&CallCost, ()>) {
        let c = &self.counters;
        let p = &self.peer_totals;
        match result {
            Ok(call) => {
                p.calls.fetch_add(1, Ordering::Relaxed);
                p.hits.fetch_add(u64::from(call.hits), Ordering::Relaxed);
                p.misses
                    .fetch_add(u64::from(call.misses), Ordering::Relaxed);
                p.bytes_read.fetch_add(call.bytes_read, Ordering::Relaxed);
                c.calls.fetch_add(1, Ordering::Relaxed);
                c.hits.fetch_add(u64::from(call.hits), Ordering::Relaxed);
                c.misses
                    .fetch_add(u64::from(call.misses), Ordering::Relaxed);
                c.bytes_read.fetch_add(call.bytes_read, Ordering::Relaxed);
                c.queue_ns.fetch_add(call.queue_ns, Ordering::Relaxed);
                c.io_wait_ns.fetch_add(call.io_wait_ns, Ordering::Relaxed);
                c.compute_ns.fetch_add(call.compute_ns, Ordering::Relaxed);
            }
            Err(()) => {
                p.failed_calls.fetch_add(1, Ordering::Relaxed);
                c.failed_calls.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Admits one more call if fewer than `limit` are in flight; the guard counts it until it
    /// drops. `None` means the session is at its bound (RESOURCE_EXHAUSTED).
    pub fn try_enter(self: &Arc<Session>, limit: u32) -> Option<InFlight> {
        let n = &self.counters.in_flight;
        let mut cur = n.load(Ordering::Relaxed);
        loop {
            if cur >= limit {
                return None;
            }
            match n.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    return Some(InFlight {
                        session: Arc::clone(self),
                    });
                }
                Err(now) => cur = now,
            }
        }
    }
}

/// One call counted in its session's `in_flight` until dropped.
#[derive(Debug)]
pub struct InFlight {
    session: Arc<Session>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.session
            .counters
            .in_flight
            .fetch_sub(1, Ordering::AcqRel);
    }
}

/// The open sessions.
#[derive(Debug)]
pub struct Sessions {
    /// By id. A std mutex: held for a map operation only, never across an await or a call.
    by_id: Mutex<HashMap<u64, Arc<Session>>>,
    /// The next id; starts at a per-process value so a restarted daemon does not reuse the ids
    /// its predecessor handed out (they would fail the connection check anyway).
    next_id: AtomicU64,
    /// Every peer that ever opened a session, with its totals (bounded by the peers that
    /// passed the access checks: unix uids, or TCP addresses holding the token).
    peers: Mutex<HashMap<PeerKey, Arc<PeerTotals>>>,
}

impl Default for Sessions {
    fn default() -> Sessions {
        Sessions::new()
    }
}

impl Sessions {
    /// An empty registry.
    pub fn new() -> Sessions {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs() & 0xff_ffff);
        Sessions {
            by_id: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new((seed << 24) | 1),
            peers: Mutex::new(HashMap::new()),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Session>>> {
        self.by_id.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens a session on connection `conn_id` for `peer_key`, unless the connection or the
    /// peer already holds its cap of open sessions (checked and inserted under one lock, so
    /// concurrent handshakes cannot overshoot). Counting walks the open sessions, whose number
    /// the caps bound; a handshake is rare next to calls.
    pub fn open(
        &self,
        conn_id: u64,
        peer_key: PeerKey,
        client_name: String,
        peer: String,
        transport: TransportKind,
        caps: SessionCaps,
    ) -> Result<Arc<Session>, CapReached> {
        let mut map = self.map();
        let (mut on_conn, mut of_peer) = (0u32, 0u32);
        for s in map.values() {
            on_conn += u32::from(s.conn_id == conn_id);
            of_peer += u32::from(s.peer_key == peer_key);
        }
        if on_conn >= caps.per_connection {
            return Err(CapReached::Connection {
                limit: caps.per_connection,
            });
        }
        if of_peer >= caps.per_peer {
            return Err(CapReached::Peer {
                peer: peer_key,
                limit: caps.per_peer,
            });
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let peer_totals = Arc::clone(
            self.peers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(peer_key)
                .or_default(),
        );
        peer_totals.sessions.fetch_add(1, Ordering::Relaxed);
        let s = Arc::new(Session {
            id,
            conn_id,
            client_name,
            peer,
            peer_key,
            transport,
            counters: SessionCounters::default(),
            peer_totals,
            closed: Default::default(),
        });
        map.insert(id, Arc::clone(&s));
        Ok(s)
    }

    /// The session `id` if it is open and belongs to connection `conn_id` (a session is usable
    /// only on the connection that opened it).
    pub fn get(&self, id: u64, conn_id: u64) -> Option<Arc<Session>> {
        self.map()
            .get(&id)
            .filter(|s| s.conn_id == conn_id)
            .cloned()
    }

    /// Closes session `id` if it belongs to `conn_id`.
    pub fn close(&self, id: u64, conn_id: u64) -> Option<Arc<Session>> {
        let mut map = self.map();
        let s = if map.get(&id).is_some_and(|s| s.conn_id == conn_id) {
            map.remove(&id)
        } else {
            None
        };
        if let Some(s) = &s {
            s.mark_closed();
        }
        s
    }

    /// Closes every session of a connection that went away.
    pub fn close_connection(&self, conn_id: u64) -> Vec<Arc<Session>> {
        let mut map = self.map();
        let ids: Vec<u64> = map
            .values()
            .filter(|s| s.conn_id == conn_id)
            .map(|s| s.id)
            .collect();
        let closed: Vec<Arc<Session>> = ids.iter().filter_map(|id| map.remove(id)).collect();
        for s in &closed {
            s.mark_closed();
        }
        closed
    }

    /// Every peer that opened a session since start, with its totals.
    pub fn peers(&self) -> Vec<(PeerKey, Arc<PeerTotals>)> {
        self.peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(k, t)| (*k, Arc::clone(t)))
            .collect()
    }

    /// Every open session, by id.
    pub fn list(&self) -> Vec<Arc<Session>> {
        let mut v: Vec<Arc<Session>> = self.map().values().cloned().collect();
        v.sort_by_key(|s| s.id);
        v
    }
}

/// The fair queue in front of the compute lanes. A call takes a [`LanePermit`] before it reads
/// or computes; when every lane is busy, waiting calls are queued per session and each freed
/// lane goes to the next session in id order after the one served last (round-robin), so
/// sessions share the lanes equally whatever their queue lengths.
#[derive(Debug)]
pub struct FairQueue {
    /// A std mutex: held only to push or pop a waiter, never across an await or a call.
    state: Mutex<FairState>,
}

#[derive(Debug)]
struct FairState {
    lanes_free: usize,
    waiting: BTreeMap<u64, VecDeque<oneshot::Sender<LanePermit>>>,
    last_served: u64,
}

/// One compute lane, held for the duration of a call's reads and compute. Dropping it hands
/// the lane to the next waiting session.
#[derive(Debug)]
pub struct LanePermit {
    /// `None` once defused (a permit that could not be delivered).
    queue: Option<Arc<FairQueue>>,
}

impl Drop for LanePermit {
    fn drop(&mut self) {
        if let Some(q) = self.queue.take() {
            FairQueue::release(&q);
        }
    }
}

impl FairQueue {
    /// A queue over `lanes` compute lanes (at least 1).
    pub fn new(lanes: usize) -> Arc<FairQueue> {
        Arc::new(FairQueue {
            state: Mutex::new(FairState {
                lanes_free: lanes.max(1),
                waiting: BTreeMap::new(),
                last_served: 0,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FairState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for a lane for a call of `session`. Cancel-safe: a waiter dropped before or after
    /// its lane arrives passes the lane on.
    pub async fn acquire(self: &Arc<FairQueue>, session: u64) -> LanePermit {
        let rx = match self.take_or_enqueue(session) {
            Ok(permit) => return permit,
            Err(rx) => rx,
        };
        match rx.await {
            Ok(permit) => permit,
            // The sender is only dropped after a send (or with the queue itself, which `self`
            // keeps alive), so this cannot happen; wait again rather than run without a lane.
            Err(_) => Box::pin(self.acquire(session)).await,
        }
    }

    /// A free lane when nobody waits, otherwise a place in `session`'s queue.
    fn take_or_enqueue(
        self: &Arc<FairQueue>,
        session: u64,
    ) -> Result<LanePermit, oneshot::Receiver<LanePermit>> {
        let mut st = self.lock();
        if st.lanes_free > 0 && st.waiting.is_empty() {
            st.lanes_free -= 1;
            st.last_served = session;
            return Ok(LanePermit {
                queue: Some(Arc::clone(self)),
            });
        }
        let (tx, rx) = oneshot::channel();
        st.waiting.entry(session).or_default().push_back(tx);
        Err(rx)
    }

    /// [`acquire`](Self::acquire) for a plain thread (the call ring's worker): takes a free
    /// lane at once when nobody waits, otherwise queues fairly and blocks.
    pub fn acquire_blocking(self: &Arc<FairQueue>, session: u64) -> LanePermit {
        loop {
            match self.take_or_enqueue(session) {
                Ok(permit) => return permit,
                Err(rx) => {
                    if let Ok(permit) = rx.blocking_recv() {
                        return permit;
                    }
                }
            }
        }
    }

    /// Hands a freed lane to the next waiting session, or returns it to the pool.
    fn release(q: &Arc<FairQueue>) {
        loop {
            let next = {
                let mut st = q.lock();
                let after = st.last_served;
                let key = st
                    .waiting
                    .range(after.saturating_add(1)..)
                    .next()
                    .map(|(k, _)| *k)
                    .or_else(|| st.waiting.keys().next().copied());
                match key {
                    None => {
                        st.lanes_free += 1;
                        return;
                    }
                    Some(k) => {
                        let queue = st.waiting.get_mut(&k).expect("key just found");
                        let tx = queue.pop_front().expect("queues in the map are non-empty");
                        if queue.is_empty() {
                            st.waiting.remove(&k);
                        }
                        st.last_served = k;
                        tx
                    }
                }
            };
            match next.send(LanePermit {
                queue: Some(Arc::clone(q)),
            }) {
                Ok(()) => return,
                // The waiter is gone: defuse the permit and try the next one.
                Err(mut permit) => {
                    permit.queue = None;
                }
            }
        }
    }

    /// Calls waiting for a lane now.
    pub fn waiting(&self) -> usize {
        self.lock().waiting.values().map(VecDeque::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lanes_go_round_robin_across_sessions() {
        let q = FairQueue::new(1);
        let held = q.acquire(1).await;
        // Session 1 queues three calls, session 2 one: session 2 must not wait behind all three.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        for (session, tag) in [(1u64, "1a"), (1, "1b"), (1, "1c"), (2, "2a")] {
            let (q, tx) = (Arc::clone(&q), tx.clone());
            tasks.push(tokio::spawn(async move {
                let p = q.acquire(session).await;
                tx.send(tag).expect("receiver alive");
                drop(p);
            }));
            tokio::task::yield_now().await;
        }
        assert_eq!(q.waiting(), 4);
        drop(held);
        for t in tasks {
            t.await.expect("task");
        }
        let order: Vec<&str> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(order, ["2a", "1a", "1b", "1c"]);
    }

    #[tokio::test]
    async fn a_cancelled_waiter_passes_its_lane_on() {
        let q = FairQueue::new(1);
        let held = q.acquire(1).await;
        let waiter = tokio::spawn({
            let q = Arc::clone(&q);
            async move { q.acquire(2).await }
        });
        tokio::task::yield_now().await;
        waiter.abort();
        let _ = waiter.await;
        drop(held);
        // The lane must be free again.
        let p = tokio::time::timeout(std::time::Duration::from_secs(1), q.acquire(3))
            .await
            .expect("lane free");
        drop(p);
    }

    const CAPS: SessionCaps = SessionCaps {
        per_connection: 64,
        per_peer: 256,
    };

    fn open(
        sessions: &Sessions,
        conn: u64,
        uid: u32,
        caps: SessionCaps,
    ) -> Result<Arc<Session>, CapReached> {
        sessions.open(
            conn,
            PeerKey::Uid(uid),
            "t".into(),
            "p".into(),
            TransportKind::Inline,
            caps,
        )
    }

    #[test]
    fn sessions_are_capped_per_connection_and_per_peer() {
        let sessions = Sessions::new();
        let caps = SessionCaps {
            per_connection: 3,
            per_peer: 5,
        };
        for _ in 0..3 {
            open(&sessions, 1, 1000, caps).expect("under the connection cap");
        }
        assert_eq!(
            open(&sessions, 1, 1000, caps).unwrap_err(),
            CapReached::Connection { limit: 3 }
        );
        // Another connection of the same uid: two more, then the uid's cap.
        open(&sessions, 2, 1000, caps).expect("fourth of the uid");
        open(&sessions, 2, 1000, caps).expect("fifth of the uid");
        assert_eq!(
            open(&sessions, 2, 1000, caps).unwrap_err(),
            CapReached::Peer {
                peer: PeerKey::Uid(1000),
                limit: 5
            }
        );
        // Another uid is not affected.
        open(&sessions, 3, 1001, caps).expect("another uid");
        // Closing frees room: a dropped connection's sessions no longer count.
        assert_eq!(sessions.close_connection(1).len(), 3);
        open(&sessions, 2, 1000, caps).expect("room again after connection 1 closed");
        assert!(
            CapReached::Connection { limit: 3 }
                .to_string()
                .contains("--max-sessions-per-connection")
        );
        assert!(
            CapReached::Peer {
                peer: PeerKey::Uid(7),
                limit: 5
            }
            .to_string()
            .contains("uid 7 already holds 5")
        );
    }

    #[test]
    fn in_flight_is_bounded() {
        let sessions = Sessions::new();
        let s = open(&sessions, 7, 1, CAPS).expect("open");
        let a = s.try_enter(2).expect("first");
        let _b = s.try_enter(2).expect("second");
        assert!(s.try_enter(2).is_none());
        drop(a);
        assert!(s.try_enter(2).is_some());
        assert!(
            sessions.get(s.id, 8).is_none(),
            "another connection cannot use the session"
        );
        assert_eq!(sessions.close_connection(7).len(), 1);
        assert!(sessions.get(s.id, 7).is_none());
    }
}
