//! Connection acceptance: the accept loop, unix peer credentials and the allow lists, the shared-
//! memory pre-handshake (`crate::shm`), and the connection type tonic serves, whose drop closes the
//! sessions opened on it.

use super::*;

/// Accepts connections until told to stop; each one is checked (and, on a unix socket,
/// pre-handshaken) on its own task so a slow client cannot hold up the others.
pub(super) async fn accept_loop(
    listener: Listener,
    state: Arc<ServiceState>,
    tx: mpsc::Sender<std::io::Result<Conn>>,
    mut stop: watch::Receiver<bool>,
) {
    static NEXT_CONN: AtomicU64 = AtomicU64::new(1);
    loop {
        let accepted = tokio::select! {
            _ = stop.changed() => return,
            a = accept_one(&listener) => a,
        };
        let (io, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                // Out of descriptors and similar: do not spin.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let conn_id = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
        // Counted against the peer's cap before a byte of it is read (a flood of connections,
        // each passing a segment, is refused here, never mapped).
        let Some(slot) = state.admit_connection(&peer) else {
            let refused = state.connection_cap_refusals.load(Ordering::Relaxed);
            if refused.is_power_of_two() {
                tracing::warn!(%peer, limit = state.config.max_connections_per_peer, refused, "connection refused: the peer holds --max-connections-per-uid connections already");
            }
            drop(io);
            continue;
        };
        let (state, tx) = (Arc::clone(&state), tx.clone());
        tokio::spawn(async move {
            let allowed = match &peer {
                Peer::Unix { uid, gid, .. } => state.auth.unix_peer_allowed(*uid, *gid),
                Peer::Tcp(_) => true,
            };
            let (io, segment) = match io {
                Accepted::Tcp(s) => {
                    let _ = s.set_nodelay(true);
                    (ConnIo::Tcp(s), None)
                }
                // Authorization comes first: a peer outside the allow lists never gets its
                // descriptor examined or mapped.
                Accepted::Unix(mut s) => {
                    let policy = state.config.segment;
                    match crate::shm::negotiate(&mut s, conn_id, allowed, policy).await {
                        Ok(n) => (ConnIo::Unix(PrefixedStream::new(n.prefix, s)), n.segment),
                        Err(e) => {
                            tracing::warn!(error = %crate::logsafe::text(&e.to_string()), %peer, "connection dropped during the pre-handshake");
                            return;
                        }
                    }
                }
            };
            if !allowed {
                tracing::warn!(%peer, "peer not in --allow-uid/--allow-gid; its calls will be refused");
            }
            tracing::debug!(conn_id, %peer, shm = segment.is_some(), "connection accepted");
            state.connection_opened();
            let conn = Conn {
                io,
                info: ConnInfo {
                    conn_id,
                    peer,
                    allowed,
                    segment,
                },
                state,
                _slot: slot,
            };
            let _ = tx.send(Ok(conn)).await;
        });
    }
}

enum Accepted {
    Unix(tokio::net::UnixStream),
    Tcp(TcpStream),
}

async fn accept_one(listener: &Listener) -> std::io::Result<(Accepted, Peer)> {
    match listener {
        Listener::Unix(l) => {
            let (s, _) = l.accept().await?;
            let cred = s.peer_cred()?;
            let peer = Peer::Unix {
                uid: cred.uid(),
                gid: cred.gid(),
                pid: cred.pid(),
            };
            Ok((Accepted::Unix(s), peer))
        }
        Listener::Tcp(l) => {
            let (s, addr) = l.accept().await?;
            Ok((Accepted::Tcp(s), Peer::Tcp(Some(addr))))
        }
    }
}

enum ConnIo {
    Unix(PrefixedStream),
    Tcp(TcpStream),
}

/// One accepted connection as tonic serves it. Dropping it (the connection ended) closes the
/// sessions opened on it and releases their leases.
pub(super) struct Conn {
    io: ConnIo,
    info: ConnInfo,
    state: Arc<ServiceState>,
    /// The peer's count of open connections, released when this drops.
    _slot: crate::rpc::service::PeerConnection,
}

impl Drop for Conn {
    fn drop(&mut self) {
        tracing::debug!(conn_id = self.info.conn_id, peer = %self.info.peer, "connection closed");
        self.state.connection_closed(self.info.conn_id);
    }
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match &mut self.io {
            ConnIo::Unix(s) => Pin::new(s).poll_read(cx, buf),
            ConnIo::Tcp(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.io {
            ConnIo::Unix(s) => Pin::new(s).poll_write(cx, buf),
            ConnIo::Tcp(s) => Pin::new(s).poll_write(cx, buf),
        }
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.io {
            ConnIo::Unix(s) => Pin::new(s).poll_flush(cx),
            ConnIo::Tcp(s) => Pin::new(s).poll_flush(cx),
        }
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.io {
            ConnIo::Unix(s) => Pin::new(s).poll_shutdown(cx),
            ConnIo::Tcp(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.io {
            ConnIo::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ConnIo::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match &self.io {
            ConnIo::Unix(s) => s.is_write_vectored(),
            ConnIo::Tcp(s) => s.is_write_vectored(),
        }
    }
}
