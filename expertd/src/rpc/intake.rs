//! What the gRPC server holds of requests still arriving: every request is authorized from its
//! headers before a byte of its body is read, and each `ExpertService` message larger than
//! [`UNCOUNTED_MESSAGE_BYTES`] is counted against the daemon's cap on queued request bytes
//! (`--max-queued-bytes`, and its peer's share of it: `crate::call::queued`) from its 5-byte
//! length prefix, before tonic buffers it — as its wire bytes plus what they may decode to
//! ([`proto::codec::DECODED_PER_WIRE_BYTE`], which the codec enforces). A message that does not
//! fit is refused (RESOURCE_EXHAUSTED) at its prefix; a body that has not fully arrived within
//! `--request-arrival-timeout-secs` of its first poll is refused (DEADLINE_EXCEEDED), and its
//! count released, so a client that uploads slowly or never finishes holds its share of the
//! cap for that long at most. Health requests are not counted: their decode cap is
//! [`crate::server::MAX_HEALTH_MESSAGE_BYTES`]. Small messages (handshakes, closes, stats,
//! small calls) are not counted while they arrive, so they are never refused for the cap
//! there; what they can hold is bounded by the streams per connection and the connections per
//! peer (a `MoeLayer` call is still counted at admission).
//!
//! The count moves with the request: a `MoeLayer` call takes it over at admission (shrunk to
//! what the decoded request holds, `crate::call::CallPipeline::admit`) and gives it back when it
//! gets a compute lane; any other request gives it back when it is dropped.

use super::service::{ConnInfo, ServiceState};
use crate::call::Held;
use http_body::{Body as HttpBody, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{Bytes, http};

/// The `grpc.health.v1` service's path prefix: its own access rule (`Auth::check_health`),
/// and its own small decode cap instead of a count.
const HEALTH_PREFIX: &str = "/grpc.health.v1.Health/";

/// Messages up to this size are not counted while they arrive.
pub const UNCOUNTED_MESSAGE_BYTES: u64 = 4096;

/// The tower layer that puts [`IntakeService`] in front of every gRPC service.
#[derive(Clone)]
pub struct IntakeLayer {
    state: Arc<ServiceState>,
}

impl IntakeLayer {
    /// The layer over the daemon's state (access rules, pipeline, limits).
    pub fn new(state: Arc<ServiceState>) -> IntakeLayer {
        IntakeLayer { state }
    }
}

impl<S> tower::Layer<S> for IntakeLayer {
    type Service = IntakeService<S>;

    fn layer(&self, inner: S) -> IntakeService<S> {
        IntakeService {
            inner,
            state: Arc::clone(&self.state),
        }
    }
}

/// Authorizes a request from its headers, then hands it on with its body counted
/// ([`Arriving`]) and the count reachable from the handler ([`ArrivalHold`]).
#[derive(Clone)]
pub struct IntakeService<S> {
    inner: S,
    state: Arc<ServiceState>,
}

/// What a request's messages are counted as while they arrive; the `MoeLayer` handler takes
/// it ([`ArrivalHold::take`]) to hand it to admission. Found in the request's extensions.
#[derive(Clone, Default)]
pub struct ArrivalHold(Arc<Mutex<Held>>);

impl ArrivalHold {
    /// The count so far, leaving none behind.
    pub fn take(&self) -> Held {
        std::mem::take(
            &mut *self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    fn add(&self, held: Held) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .absorb(held);
    }
}

type Ready = std::future::Ready<Result<http::Response<Body>, std::convert::Infallible>>;

impl<S> tower::Service<http::Request<Body>> for IntakeService<S>
where
    S: tower::Service<
            http::Request<Body>,
            Response = http::Response<Body>,
            Error = std::convert::Infallible,
        >,
{
    type Response = http::Response<Body>;
    type Error = std::convert::Infallible;
    type Future = futures_util::future::Either<Ready, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        if let Err(status) = self.authorize(&mut req) {
            return futures_util::future::Either::Left(std::future::ready(Ok(status.into_http())));
        }
        let hold = ArrivalHold::default();
        req.extensions_mut().insert(hold.clone());
        // `authorize` found the connection's info.
        let peer = ConnInfo::of(req.extensions())
            .map_or(crate::session::PeerKey::Unknown, |c| c.peer.key());
        if req.uri().path().starts_with(HEALTH_PREFIX) {
            return futures_util::future::Either::Right(self.inner.call(req));
        }
        let state = Arc::clone(&self.state);
        let req = req.map(|body| {
            Body::new(Arriving {
                inner: body,
                framing: Framing::Prefix {
                    have: 0,
                    buf: [0; 5],
                },
                hold,
                peer,
                deadline: None,
                state,
            })
        });
        futures_util::future::Either::Right(self.inner.call(req))
    }
}

impl<S> IntakeService<S> {
    /// The same rules as the handlers apply (a unix peer allowed at accept, a TCP peer's
    /// bearer token), before the body is read: an unauthorized peer gets no byte buffered.
    fn authorize(&self, req: &mut http::Request<Body>) -> Result<(), Status> {
        let conn = ConnInfo::of(req.extensions()).cloned();
        let headers = std::mem::take(req.headers_mut());
        let metadata = tonic::metadata::MetadataMap::from_headers(headers);
        let auth = &self.state.auth;
        let checked = if req.uri().path().starts_with(HEALTH_PREFIX) {
            auth.check_health(conn.as_ref(), &metadata)
        } else {
            match &conn {
                Some(conn) => auth.check(conn, &metadata),
                None => Err(super::status::RpcError::Internal(
                    "request without connection info".into(),
                )),
            }
        };
        *req.headers_mut() = metadata.into_headers();
        checked.map_err(Status::from)
    }
}

/// Where the body's reader is in the gRPC framing.
enum Framing {
    /// Reading a message's 5-byte prefix (compression flag, big-endian length).
    Prefix { have: usize, buf: [u8; 5] },
    /// Inside a message, `left` bytes to go.
    Message { left: u64 },
}

/// A request body whose messages are counted from their length prefixes.
struct Arriving {
    inner: Body,
    framing: Framing,
    hold: ArrivalHold,
    /// Whose share of the cap the messages count against.
    peer: crate::session::PeerKey,
    /// Set at the first poll: the whole body must have arrived by then.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    state: Arc<ServiceState>,
}

impl Arriving {
    /// Walks `data` through the framing, counting each message as its prefix completes.
    fn account(&mut self, mut data: &[u8]) -> Result<(), Status> {
        while !data.is_empty() {
            match &mut self.framing {
                Framing::Prefix { have, buf } => {
                    let n = (5 - *have).min(data.len());
                    buf[*have..*have + n].copy_from_slice(&data[..n]);
                    *have += n;
                    data = &data[n..];
                    if *have == 5 {
                        if buf[0] != 0 {
                            return Err(Status::invalid_argument(
                                "expertd accepts no compressed gRPC messages",
                            ));
                        }
                        let len = u64::from(u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]));
                        self.count(len)?;
                        self.framing = Framing::Message { left: len };
                    }
                }
                Framing::Message { left } => {
                    let n = (*left).min(data.len() as u64);
                    data = &data[n as usize..];
                    *left -= n;
                }
            }
            if let Framing::Message { left: 0 } = self.framing {
                self.framing = Framing::Prefix {
                    have: 0,
                    buf: [0; 5],
                };
            }
        }
        Ok(())
    }

    /// Counts a message of `len` wire bytes; one over the message cap is left to tonic, which
    /// refuses it from the same prefix before buffering it, and a small one is not counted.
    fn count(&mut self, len: u64) -> Result<(), Status> {
        if len > self.state.config.max_message_bytes || len <= UNCOUNTED_MESSAGE_BYTES {
            return Ok(());
        }
        let bytes = len.saturating_mul(1 + proto::codec::DECODED_PER_WIRE_BYTE);
        let held = self
            .state
            .pipeline
            .reserve(bytes, self.peer)
            .map_err(Status::from)?;
        self.hold.add(held);
        Ok(())
    }
}

impl HttpBody for Arriving {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        let limit = this.state.config.request_arrival_limit;
        let deadline = this
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if deadline.as_mut().poll(cx).is_ready() {
            tracing::debug!(peer = ?this.peer, limit_s = limit.as_secs(), "request cut off: its body did not arrive in time");
            return Poll::Ready(Some(Err(arrival_timeout(limit))));
        }
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        Poll::Ready(match frame {
            Some(Ok(frame)) => match frame.data_ref().map(|d| this.account(d)) {
                Some(Err(status)) => Some(Err(status)),
                _ => Some(Ok(frame)),
            },
            other => other,
        })
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

fn arrival_timeout(limit: Duration) -> Status {
    Status::deadline_exceeded(format!(
        "the request did not arrive within {} s of its first byte (expertd serve \
         --request-arrival-timeout-secs); refused, and the bytes it held released",
        limit.as_secs_f64()
    ))
}
