//! The session of an [`ExpertdClient`]: one connection to the daemon, the handshake checked on
//! it (protocol version, container fingerprint and identity, dimensions — a refusal names both
//! values) and the shared-memory segment passed with it; kept while the connection lives,
//! replaced with backoff when it does not (the reconnection policy of the module doc of
//! `expert_client`).

use super::{DaemonInfo, ExpertClientError, ExpertdClient, shm, tenths, transport};
use proto::v1 as pb;
use shared::container::ModelIdentity;
use shm::ClientSegment;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};
use transport::Endpoint;
use transport::Link;

/// The pre-handshake's own read timeout runs this much past a connection attempt's deadline,
/// so a daemon that accepts but never answers is reported as a deadline, not a socket error.
const HELLO_MARGIN: Duration = Duration::from_millis(100);

/// One connection, the session opened on it and the segment passed with it (fresh per
/// session, so a daemon-side call of a lost session can never write into a later call's slot).
pub(super) struct Session {
    pub(super) link: Link,
    pub(super) info: DaemonInfo,
    pub(super) segment: Option<Arc<ClientSegment>>,
}
impl ExpertdClient {
    /// The live session, or a new one (connect + handshake, retried with backoff while the
    /// failure is worth waiting for: a daemon still starting, restarting or draining). The
    /// first connection waits `connect_timeout`, a reconnection `reconnect_timeout`; when the
    /// wait runs out the error says so and names the last attempt's error.
    pub(super) fn session(&self) -> Result<Arc<Session>, ExpertClientError> {
        self.session_by(None)
    }

    /// [`Self::session`], giving up at `call_deadline` (a call's deadline) if that comes first.
    pub(super) fn session_by(
        &self,
        call_deadline: Option<Instant>,
    ) -> Result<Arc<Session>, ExpertClientError> {
        {
            let mut cur = self.session.lock().unwrap_or_else(PoisonError::into_inner);
            match &*cur {
                Some(s) if !s.link.watch.is_closed() => return Ok(Arc::clone(s)),
                Some(_) => {
                    tracing::warn!(endpoint = %self.endpoint, "expertd closed the connection; reconnecting");
                    *cur = None;
                }
                None => {}
            }
        }
        // Every successful handshake records the blob size: none yet means this is the first
        // connection, to a daemon that may have been started together with hostd.
        let first = self.expert_bytes.get().is_none();
        let start = Instant::now();
        let wait = if first {
            self.opts.connect_timeout
        } else {
            self.opts.reconnect_timeout
        };
        let deadline = call_deadline.map_or(start + wait, |d| d.min(start + wait));
        let wait = deadline.saturating_duration_since(start);
        let mut delay = Duration::from_millis(20);
        // The last failure that was not a timeout (no socket, refused, a full backlog): under
        // load the last, shortest attempt can time out before it even connects, and it must
        // not hide why the daemon was not up.
        let mut last_not_up: Option<ExpertClientError> = None;
        let mut announced = false;
        loop {
            // One attempt never outlasts the wait: a stopped daemon accepts the connection
            // into its backlog and then never answers the pre-handshake.
            let attempt = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(10));
            match self.open_session(attempt.min(shm::HELLO_REPLY_TIMEOUT)) {
                Ok(s) => {
                    let s = Arc::new(s);
                    *self.session.lock().unwrap_or_else(PoisonError::into_inner) =
                        Some(Arc::clone(&s));
                    return Ok(s);
                }
                Err(e) if e.worth_waiting_for() => {
                    let now = Instant::now();
                    let timed_out = matches!(e, ExpertClientError::DeadlineExceeded { .. });
                    if now >= deadline {
                        // A daemon that accepts but does not answer is reported as such.
                        return Err(match (timed_out, last_not_up) {
                            (true, Some(prev)) => prev.not_up(&self.endpoint, wait),
                            (true, None) => e,
                            (false, _) => e.not_up(&self.endpoint, wait),
                        });
                    }
                    tracing::debug!(error = %e, ?delay, "expertd not reachable yet; retrying");
                    if first && !announced && self.daemon.is_none() && e.daemon_not_up() {
                        // Say at once what hostd waits for, not only when the wait runs out
                        // (not for its own private daemon, which it has just started and whose
                        // socket it waited for: advice to start one would mislead).
                        announced = true;
                        eprintln!("hostd: {}", waiting_notice(&self.opts.endpoint, wait, &e));
                    }
                    if !timed_out {
                        last_not_up = Some(e);
                    }
                    std::thread::sleep(delay.min(deadline - now));
                    delay = (delay * 2).min(Duration::from_millis(500));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Connects, passes a fresh segment and handshakes, all within `timeout`.
    fn open_session(&self, timeout: Duration) -> Result<Session, ExpertClientError> {
        let o = &self.opts;
        let segment = match &self.segment_layout {
            Some(layout) => Some(Arc::new(
                ClientSegment::create(*layout).map_err(ExpertClientError::Shm)?,
            )),
            None => None,
        };
        let (endpoint, token) = (o.endpoint.clone(), o.token.clone());
        let link_segment = segment.clone();
        let req = pb::HandshakeRequest {
            protocol_version: proto::version::CURRENT,
            client_name: o.client_name.clone(),
            client_pid: std::process::id(),
            model_identity: o.model_identity.as_ref().map(pb::ModelIdentity::from),
            expected_container_fingerprint: o.expected_fingerprint.as_ref().map_or(0, |f| f.0),
        };
        let ep = self.endpoint.clone();
        let late = ExpertClientError::DeadlineExceeded {
            endpoint: ep.clone(),
            what: "a new connection's handshake",
            deadline_s: tenths(timeout),
        };
        let (link, resp) = self
            .block_on(async move {
                let open = async {
                    let mut link = transport::connect_within(
                        &endpoint,
                        link_segment,
                        token.as_deref(),
                        timeout + HELLO_MARGIN,
                    )
                    .await?;
                    let resp = link
                        .client
                        .handshake(req)
                        .await
                        .map_err(|s| ExpertClientError::from_status(&ep, &s))?;
                    Ok::<_, ExpertClientError>((link, resp.into_inner()))
                };
                tokio::time::timeout(timeout, open)
                    .await
                    .unwrap_or(Err(late))
            })
            .ok_or_else(|| self.lost("the client runtime stopped"))??;
        self.check_handshake(&resp)?;
        let streams = streams_experts(&resp);
        let info = DaemonInfo {
            session_id: resp.session_id,
            fingerprint: resp.container_fingerprint,
            kernel_isa: resp.kernel_isa,
            io_backend: resp.io_backend,
            shared_memory: link.segment_id != 0 && resp.shm_segment_id == link.segment_id,
            ring_entries: 0,
            streams_experts: streams,
        };
        let shared_memory = info.shared_memory;
        // The ring is used only if the daemon serves exactly the ring this segment announced.
        let ring_entries = match segment.as_ref().and_then(|seg| seg.layout().ring) {
            Some(r) if shared_memory && resp.ring_entries == r.entries => r.entries,
            _ => 0,
        };
        Ok(Session {
            link,
            info: DaemonInfo {
                ring_entries,
                ..info
            },
            segment,
        })
    }

    fn check_handshake(&self, r: &pb::HandshakeResponse) -> Result<(), ExpertClientError> {
        let o = &self.opts;
        let endpoint = self.endpoint.clone();
        if !(proto::version::OLDEST_DAEMON..=proto::version::CURRENT).contains(&r.protocol_version)
        {
            return Err(ExpertClientError::VersionMismatch {
                endpoint,
                daemon: r.protocol_version,
                ours: proto::version::CURRENT,
            });
        }
        if let Some((expected, hint)) = &o.expected_fingerprint
            && r.container_fingerprint != *expected
        {
            return Err(ExpertClientError::FingerprintMismatch {
                endpoint,
                served: r.container_fingerprint,
                expected: *expected,
                hint: format!(" ({hint})"),
            });
        }
        if let (Some(ours), Some(theirs)) = (&o.model_identity, &r.container_identity) {
            let theirs =
                ModelIdentity::try_from(theirs).map_err(|e| ExpertClientError::Protocol {
                    endpoint: endpoint.clone(),
                    reason: e.to_string(),
                })?;
            let what = theirs.differing(ours);
            if !what.is_empty() {
                return Err(ExpertClientError::WrongModel {
                    endpoint,
                    reason: format!(
                        "its container was prepared from a different model than this one ({} differ); serve a container made by `expertd prepare` from this model (identities: container {}, this model {})",
                        what.join(", "),
                        theirs.short_hex(),
                        ours.short_hex()
                    ),
                });
            }
        }
        let dims = r.dims.clone().unwrap_or_default();
        let theirs = (
            dims.n_layers as usize,
            dims.n_experts as usize,
            dims.hidden_size as usize,
        );
        let ours = (o.n_layers, o.n_experts, o.hidden);
        if theirs != ours {
            return Err(ExpertClientError::WrongModel {
                endpoint,
                reason: format!(
                    "its container has {} layers × {} experts, hidden {}; this model has {} layers × {} experts, hidden {}",
                    theirs.0, theirs.1, theirs.2, ours.0, ours.1, ours.2
                ),
            });
        }
        if let Some(layout) = blob_layout(&dims) {
            let _ = self.expert_bytes.set(layout.stride);
        }
        Ok(())
    }

    /// Forgets `s` if it is still the current session (its connection is gone).
    pub(super) fn forget(&self, s: &Arc<Session>) {
        let mut cur = self.session.lock().unwrap_or_else(PoisonError::into_inner);
        if cur.as_ref().is_some_and(|c| Arc::ptr_eq(c, s)) {
            *cur = None;
        }
    }
}

/// The blob layout of the daemon's container: its dimensions in its expert format (an empty
/// format is a daemon from before format v2: INT8). `None` for a format this build does not
/// know or impossible dimensions.
fn blob_layout(dims: &pb::ModelDims) -> Option<shared::container::BlobLayout> {
    let format = shared::container::ExpertFormat::from_wire(&dims.expert_format)?;
    shared::container::BlobLayout::with_format(
        dims.hidden_size as usize,
        dims.expert_inner_size as usize,
        format,
    )
    .ok()
}

/// Whether a handshake's daemon streams experts: its cache budget is below the container's
/// expert bytes (layers × experts × blob stride). Unknown dimensions count as resident.
fn streams_experts(r: &pb::HandshakeResponse) -> bool {
    let (Some(dims), Some(limits)) = (r.dims.as_ref(), r.limits.as_ref()) else {
        return false;
    };
    let Some(layout) = blob_layout(dims) else {
        return false;
    };
    let experts = u64::from(dims.n_layers) * u64::from(dims.n_experts) * layout.stride as u64;
    limits.cache_budget_bytes < experts
}

/// The line hostd prints when its first connection to a daemon fails because nothing is there
/// yet: what it waits for, for how long, and what would make the daemon appear.
pub(super) fn waiting_notice(endpoint: &Endpoint, wait: Duration, e: &ExpertClientError) -> String {
    let secs = wait.as_secs_f64().round();
    let why = match (endpoint, e) {
        (Endpoint::Unix(path), ExpertClientError::Connect { reason, .. })
            if super::error::os_error_kind(reason) == Some(std::io::ErrorKind::NotFound) =>
        {
            format!("there is no socket file at {}", path.display())
        }
        (Endpoint::Unix(path), ExpertClientError::Connect { reason, .. })
            if super::error::os_error_kind(reason)
                == Some(std::io::ErrorKind::ConnectionRefused) =>
        {
            format!(
                "nothing accepts connections on {} (a daemon that exited leaves its socket file)",
                path.display()
            )
        }
        (Endpoint::Tcp { authority, .. }, _) => format!("nothing answers at {authority} yet"),
        (_, other) => other.to_string(),
    };
    let start = match endpoint {
        Endpoint::Unix(path) => format!(
            "start one with `expertd serve --container DIR --socket {}`, or leave out --expertd \
             and hostd starts a private daemon on --container DIR",
            path.display()
        ),
        Endpoint::Tcp { uri, .. } => {
            format!("is `expertd serve --container DIR --listen HOST:PORT` running for {uri}?")
        }
    };
    format!("waiting up to {secs} s for expertd at {endpoint}: {why}; {start}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn connect(reason: std::io::Error) -> ExpertClientError {
        ExpertClientError::Connect {
            endpoint: "unix:///run/x.sock".into(),
            reason: reason.to_string(),
        }
    }

    #[test]
    fn the_waiting_notice_says_what_is_missing_and_how_to_start_it() {
        let unix = Endpoint::Unix(PathBuf::from("/run/x.sock"));
        let missing = connect(std::io::Error::from_raw_os_error(2));
        let line = waiting_notice(&unix, Duration::from_secs(30), &missing);
        assert!(
            line.starts_with("waiting up to 30 s for expertd at unix:///run/x.sock"),
            "{line}"
        );
        assert!(
            line.contains("there is no socket file at /run/x.sock"),
            "{line}"
        );
        assert!(
            line.contains("expertd serve --container DIR --socket /run/x.sock"),
            "{line}"
        );
        let refused = connect(std::io::Error::from_raw_os_error(111));
        let line = waiting_notice(&unix, Duration::from_secs(30), &refused);
        assert!(
            line.contains("nothing accepts connections on /run/x.sock"),
            "{line}"
        );
    }
}
