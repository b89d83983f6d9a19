//! Connecting to expertd: parses `unix:///PATH`, `https://HOST:PORT` (TLS, rustls through
//! tonic, the daemon's certificate checked against a CA file) and `http://HOST:PORT` (plain TCP)
//! endpoints, opens the socket itself (on a unix socket: the shared-memory pre-handshake
//! first), and hands that one stream to tonic through a single-use connector (tonic runs the
//! TLS handshake over it for `https://`), so a gRPC channel is exactly one connection:
//! when it breaks, the client notices ([`ConnWatch`]) and makes a new connection and session
//! instead of tonic silently reconnecting under a session the daemon has already closed.

use super::error::ExpertClientError;
use super::shm::{ClientSegment, HELLO_REPLY_TIMEOUT, send_hello_within};
use hyper_util::rt::TokioIo;
use proto::v1::expert_service_client::ExpertServiceClient;
use rustix::event::{PollFd, PollFlags, Timespec};
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint as TonicEndpoint, Uri};

pub use proto::MAX_MESSAGE_BYTES;
/// HTTP/2 keepalive: a PING this often, even when idle…
pub const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
/// …and the connection is closed (calls fail as `ConnectionLost`, the next one reconnects)
/// when a PING is not answered within this: a half-open TCP connection is noticed.
pub const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// Where expertd listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A unix socket path (`unix:///run/sluice/expertd.sock`).
    Unix(PathBuf),
    /// A TCP address: `https://node2:7443` (TLS) or `http://127.0.0.1:7070` (plain).
    Tcp {
        /// The URI as given.
        uri: String,
        /// `HOST:PORT`.
        authority: String,
        /// `https://`: TLS, the daemon's certificate checked against `ca`.
        tls: bool,
        /// The CA certificate(s) a `https://` daemon's certificate must chain to.
        ca: Option<CaCertificate>,
    },
}

/// PEM CA certificate(s) trusted for `https://` daemons, and the file they came from.
#[derive(Clone, PartialEq, Eq)]
pub struct CaCertificate {
    /// The file (for messages).
    pub path: PathBuf,
    /// Its PEM text.
    pub pem: Arc<Vec<u8>>,
}

impl std::fmt::Debug for CaCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CaCertificate({})", self.path.display())
    }
}

impl CaCertificate {
    /// Reads a PEM file of one or more CA certificates.
    pub fn read(path: &std::path::Path) -> std::io::Result<CaCertificate> {
        let pem = std::fs::read(path)?;
        if !pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
            ));
        }
        Ok(CaCertificate {
            path: path.to_path_buf(),
            pem: Arc::new(pem),
        })
    }
}

impl Endpoint {
    /// Parses `unix:///PATH` (or `unix:PATH`), `https://HOST:PORT` or `http://HOST:PORT`.
    pub fn parse(s: &str) -> Result<Endpoint, String> {
        if let Some(path) = s.strip_prefix("unix://")
            && !path.is_empty()
            && !path.starts_with('/')
        {
            // `unix://tmp/x.sock` is a typo for `unix:///tmp/x.sock`, not a relative path.
            return Err(format!(
                "{s:?}: a unix socket URI is `unix://` followed by an absolute path (three \
                 slashes): did you mean unix:///{path}? (`unix:{path}` names a relative path)"
            ));
        }
        if let Some(path) = s
            .strip_prefix("unix://")
            .or_else(|| s.strip_prefix("unix:"))
        {
            if path.is_empty() {
                return Err(format!("{s:?}: the unix socket path is empty"));
            }
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        for (scheme, tls) in [("https://", true), ("http://", false)] {
            if let Some(rest) = s.strip_prefix(scheme) {
                let authority = rest.trim_end_matches('/');
                if authority.is_empty() || authority.contains('/') || !authority.contains(':') {
                    return Err(format!("{s:?}: expected {scheme}HOST:PORT"));
                }
                return Ok(Endpoint::Tcp {
                    uri: s.to_string(),
                    authority: authority.to_string(),
                    tls,
                    ca: None,
                });
            }
        }
        Err(format!(
            "{s:?}: expected unix:///PATH, https://HOST:PORT or http://HOST:PORT"
        ))
    }

    /// This endpoint trusting `ca` (for `https://`; other endpoints are returned unchanged).
    pub fn with_ca(self, ca: Option<CaCertificate>) -> Endpoint {
        match self {
            Endpoint::Tcp {
                uri,
                authority,
                tls: true,
                ..
            } => Endpoint::Tcp {
                uri,
                authority,
                tls: true,
                ca,
            },
            other => other,
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix://{}", p.display()),
            Endpoint::Tcp { uri, .. } => f.write_str(uri),
        }
    }
}

/// Adds `authorization: Bearer TOKEN` to every request when a token is configured.
#[derive(Clone)]
pub struct TokenInterceptor(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl Interceptor for TokenInterceptor {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut()
                .insert(proto::AUTHORIZATION_HEADER, v.clone());
        }
        Ok(req)
    }
}

/// The generated client over one connection.
pub type Client = ExpertServiceClient<InterceptedService<Channel, TokenInterceptor>>;

/// Watches a connection's socket for the peer hanging up, with a zero-timeout `poll`.
pub struct ConnWatch(OwnedFd);

impl ConnWatch {
    /// Whether the daemon closed the connection (exited, restarted, drained).
    pub fn is_closed(&self) -> bool {
        let mut fds = [PollFd::new(&self.0, PollFlags::RDHUP)];
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match rustix::event::poll(&mut fds, Some(&zero)) {
            Ok(0) => false,
            Ok(_) => fds[0]
                .revents()
                .intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL),
            Err(_) => true,
        }
    }
}

/// One connection: the client, its hang-up watch, and the segment id the daemon assigned
/// (0: activations travel inline).
pub struct Link {
    /// The gRPC client.
    pub client: Client,
    /// The socket's watch.
    pub watch: ConnWatch,
    /// The daemon's id for our segment on this connection (0: none).
    pub segment_id: u64,
}

/// A connector that hands out one already-open stream, once: later connection attempts fail,
/// so tonic cannot reconnect behind the client's back.
struct SingleUse<IO>(Arc<Mutex<Option<TokioIo<IO>>>>);

impl<IO> Clone for SingleUse<IO> {
    fn clone(&self) -> Self {
        SingleUse(Arc::clone(&self.0))
    }
}

impl<IO> tower::Service<Uri> for SingleUse<IO> {
    type Response = TokioIo<IO>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<TokioIo<IO>, std::io::Error>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), std::io::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let io = self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
        std::future::ready(io.ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "the expertd connection closed; hostd reconnects with a new session",
            )
        }))
    }
}

fn single_use_channel<IO>(io: IO) -> SingleUse<IO> {
    SingleUse(Arc::new(Mutex::new(Some(TokioIo::new(io)))))
}

/// Opens one connection to `endpoint` (passing `segment` on a unix socket) and wraps it.
pub async fn connect(
    endpoint: &Endpoint,
    segment: Option<Arc<ClientSegment>>,
    token: Option<&str>,
) -> Result<Link, ExpertClientError> {
    connect_within(endpoint, segment, token, HELLO_REPLY_TIMEOUT).await
}

/// [`connect`], waiting at most `hello_timeout` for the pre-handshake's reply (a stopped
/// daemon's listener still accepts connections into its backlog, then never answers).
pub async fn connect_within(
    endpoint: &Endpoint,
    segment: Option<Arc<ClientSegment>>,
    token: Option<&str>,
    hello_timeout: std::time::Duration,
) -> Result<Link, ExpertClientError> {
    let ep = endpoint.to_string();
    let connect_err = |reason: String| ExpertClientError::Connect {
        endpoint: ep.clone(),
        reason,
    };
    let token = match token {
        Some(t) => Some(
            format!("Bearer {t}")
                .parse()
                .map_err(|_| connect_err("the token is not valid header text".into()))?,
        ),
        None => None,
    };
    let (channel, watch, segment_id) = match endpoint {
        Endpoint::Unix(path) => {
            let path = path.clone();
            let (stream, reply) = tokio::task::spawn_blocking(move || {
                let mut stream = std::os::unix::net::UnixStream::connect(&path)?;
                let reply = send_hello_within(&mut stream, segment.as_deref(), hello_timeout)?;
                stream.set_nonblocking(true)?;
                Ok::<_, std::io::Error>((stream, reply))
            })
            .await
            .map_err(|e| connect_err(e.to_string()))?
            .map_err(|e| connect_err(e.to_string()))?;
            if reply.status != shared::shm_layout::REPLY_OK {
                tracing::warn!(endpoint = %ep, "expertd refused the shared-memory segment (see its log); activations travel inline");
            }
            let watch = ConnWatch(
                stream
                    .as_fd()
                    .try_clone_to_owned()
                    .map_err(|e| connect_err(e.to_string()))?,
            );
            let stream =
                tokio::net::UnixStream::from_std(stream).map_err(|e| connect_err(e.to_string()))?;
            let channel = keepalive(TonicEndpoint::from_static("http://expertd.local"))
                .connect_with_connector(single_use_channel(stream))
                .await
                .map_err(|e| connect_err(e.to_string()))?;
            (channel, watch, reply.segment_id)
        }
        Endpoint::Tcp {
            uri,
            authority,
            tls,
            ca,
        } => {
            let mut tonic_endpoint = keepalive(
                TonicEndpoint::from_shared(uri.clone()).map_err(|e| connect_err(e.to_string()))?,
            );
            if *tls {
                let Some(ca) = ca else {
                    return Err(connect_err("a https:// endpoint needs the CA that signed the daemon's certificate (--expertd-ca-file)".into()));
                };
                let config = tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(ca.pem.as_slice()));
                tonic_endpoint = tonic_endpoint.tls_config(config).map_err(|e| {
                    connect_err(format!(
                        "CA file {}: {}",
                        ca.path.display(),
                        error_chain(&e)
                    ))
                })?;
            }
            let stream = tokio::net::TcpStream::connect(authority.as_str())
                .await
                .map_err(|e| connect_err(e.to_string()))?;
            let _ = stream.set_nodelay(true);
            let watch = ConnWatch(
                stream
                    .as_fd()
                    .try_clone_to_owned()
                    .map_err(|e| connect_err(e.to_string()))?,
            );
            let channel = tonic_endpoint
                .connect_with_connector(single_use_channel(stream))
                .await
                .map_err(|e| {
                    if *tls {
                        let trust = ca.as_ref().map_or_else(String::new, |ca| {
                            format!(" (trusting {})", ca.path.display())
                        });
                        ExpertClientError::Tls {
                            endpoint: ep.clone(),
                            reason: format!("{}{trust}", error_chain(&e)),
                        }
                    } else {
                        connect_err(error_chain(&e))
                    }
                })?;
            (channel, watch, 0)
        }
    };
    let client = ExpertServiceClient::with_interceptor(channel, TokenInterceptor(token))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    Ok(Link {
        client,
        watch,
        segment_id,
    })
}

/// An error and its sources, `outer: inner: …` (tonic's own text is only "transport error").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn keepalive(e: TonicEndpoint) -> TonicEndpoint {
    e.http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse() {
        assert_eq!(
            Endpoint::parse("unix:///run/x.sock"),
            Ok(Endpoint::Unix("/run/x.sock".into()))
        );
        assert_eq!(
            Endpoint::parse("http://127.0.0.1:7070"),
            Ok(Endpoint::Tcp {
                uri: "http://127.0.0.1:7070".into(),
                authority: "127.0.0.1:7070".into(),
                tls: false,
                ca: None
            })
        );
        assert_eq!(
            Endpoint::parse("https://node2:7443"),
            Ok(Endpoint::Tcp {
                uri: "https://node2:7443".into(),
                authority: "node2:7443".into(),
                tls: true,
                ca: None
            })
        );
        assert!(Endpoint::parse("https://nohost").is_err());
        assert!(Endpoint::parse("ftp://x:1").is_err());
        assert!(Endpoint::parse("http://nohost").is_err());
        assert!(Endpoint::parse("unix://").is_err());
        let typo = Endpoint::parse("unix://tmp/x.sock").expect_err("relative after unix://");
        assert!(typo.contains("did you mean unix:///tmp/x.sock?"), "{typo}");
        assert_eq!(
            Endpoint::parse("unix:tmp/x.sock"),
            Ok(Endpoint::Unix(PathBuf::from("tmp/x.sock")))
        );
    }
}
