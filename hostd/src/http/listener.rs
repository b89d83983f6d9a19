//! The accept loop of `hostd serve`, with peer limits from hyper's own HTTP/1 connection
//! settings: a header read timeout (which hyper also runs while a keep-alive connection waits
//! for its next request, so it is the idle timeout too), a cap on open connections, and a
//! peer's end of stream taken as its disconnect: hyper closes the connection on a read EOF while
//! a request is pending, which drops the handler and with it the request's generation (a
//! non-streaming client that hangs up stops costing compute). A client that half-closes after
//! sending its request is therefore treated as gone, as Go's `net/http` and uvicorn do: over
//! TCP a half-close and a close look the same until something is written, and HTTP/1.1 gives a
//! server nothing to write before the response.
//!
//! Beyond `--max-connections`, up to [`HEALTH_RESERVE`] more connections are accepted in a
//! restricted mode: a short header timeout, no keep-alive, and only `GET /health` answered
//! (anything else gets 503 with `Retry-After`), so a monitor can still see the server while
//! idle or slow clients hold every slot. Past that, new connections are closed at once.
//! The request body's time limit is the handlers' (`http::admission`), since only they read it.

use super::AppState;
use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::sync::{Semaphore, watch};

/// Connections accepted beyond `--max-connections` that may only ask for `/health`.
pub const HEALTH_RESERVE: usize = 32;
/// Header timeout of a connection in the reserve (capped by `--header-timeout`).
const RESERVE_HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// Default `--header-timeout`.
pub const HEADER_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Default `--max-connections`.
pub const MAX_CONNECTIONS_DEFAULT: usize = 1024;

/// Peer limits of the listener (set by `hostd serve` flags).
#[derive(Debug, Clone)]
pub struct PeerLimits {
    /// Time for a request head to arrive, counted from the connection's start or from the end
    /// of its previous response (so also the keep-alive idle timeout).
    pub header_timeout: Duration,
    /// Connections served normally at once.
    pub max_connections: usize,
}

impl Default for PeerLimits {
    fn default() -> Self {
        PeerLimits {
            header_timeout: HEADER_TIMEOUT_DEFAULT,
            max_connections: MAX_CONNECTIONS_DEFAULT,
        }
    }
}

/// Marks a request that arrived on a connection beyond `--max-connections`.
#[derive(Debug, Clone, Copy)]
pub struct Overflow;

/// Accepts until `shutdown` resolves, then asks every connection to finish its current
/// request and waits for them.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = state.config.peer.clone();
    let main = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let reserve = Arc::new(Semaphore::new(HEALTH_RESERVE));
    let (close_tx, close_rx) = watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Per-connection errors (a peer that reset before accept) are routine; running
                    // out of descriptors is not: back off instead of spinning.
                    if !matches!(e.kind(), std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset) {
                        tracing::warn!(error = %e, "accept failed; retrying in 100 ms");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let (permit, overflow) = match Arc::clone(&main).try_acquire_owned() {
            Ok(p) => (p, false),
            Err(_) => match Arc::clone(&reserve).try_acquire_owned() {
                Ok(p) => (p, true),
                Err(_) => {
                    tracing::debug!(
                        "connection refused: --max-connections and the /health reserve are full"
                    );
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let state = Arc::clone(&state);
        let router = router.clone();
        let mut close = close_rx.clone();
        let header_timeout = if overflow {
            limits.header_timeout.min(RESERVE_HEADER_TIMEOUT)
        } else {
            limits.header_timeout
        };
        tokio::spawn(async move {
            state.connections.fetch_add(1, Relaxed);
            let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
                if overflow {
                    req.extensions_mut().insert(Overflow);
                }
                tower::ServiceExt::oneshot(router.clone(), req.map(Body::new))
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .half_close(false)
                .keep_alive(!overflow);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                _ = close.changed() => {
                    conn.as_mut().graceful_shutdown();
                    conn.as_mut().await
                }
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            // The permit goes first, so the count never reads lower than the slots in use.
            drop(permit);
            state.connections.fetch_sub(1, Relaxed);
        });
    }
    drop(listener);
    drop(close_rx);
    let _ = close_tx.send(());
    close_tx.closed().await;
    Ok(())
}
