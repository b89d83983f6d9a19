//! Readiness of the expert daemon as this hostd sees it: [`ExpertHealth`] is written by the
//! call path (a call that succeeds, or fails because the daemon is unreachable or too slow),
//! by the background probe (one `Stats` RPC per interval on its own connection, with a short
//! deadline) and by the private daemon's supervisor (exited, restarting, back), and read by
//! `GET /health`.
//!
//! States: `ready` (the last call or probe was answered in time); `degraded` (the daemon is
//! connected but did not answer in time: stopped, overloaded or hung); `unavailable` (no
//! connection: the daemon is gone, restarting, or refuses); `failing` (the daemon answers, but
//! it reported a corrupt expert: calls routed to it fail). The state changes as soon as one
//! observation says so — except `failing`, which holds for [`FAILING_HOLD`] after the last
//! data-loss failure whatever succeeds meanwhile (probes and calls to other experts do), since
//! requests that route to the corrupt expert keep failing. The reason names the address and
//! what was seen.

use super::error::ExpertClientError;
use super::transport::{self, Endpoint, Link};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How the expert daemon looks from here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Calls are answered.
    Ready,
    /// Connected, but calls or probes are not answered in time.
    Degraded,
    /// Answering, but calls that route to a corrupt expert fail (DATA_LOSS).
    Failing,
    /// Not reachable (gone, restarting, refusing).
    Unavailable,
}

/// How long `failing` holds after the last data-loss failure.
pub const FAILING_HOLD: Duration = Duration::from_secs(60);

impl Readiness {
    /// The word `/health` reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Readiness::Ready => "ready",
            Readiness::Degraded => "degraded",
            Readiness::Failing => "failing",
            Readiness::Unavailable => "unavailable",
        }
    }

    /// Severity: a larger code is worse (shards report their worst).
    pub fn code(self) -> u8 {
        match self {
            Readiness::Ready => 0,
            Readiness::Degraded => 1,
            Readiness::Failing => 2,
            Readiness::Unavailable => 3,
        }
    }
}

/// A snapshot for `/health`.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthReport {
    /// The state.
    pub readiness: Readiness,
    /// Why it is not ready (None when ready).
    pub reason: Option<String>,
    /// Seconds in this state.
    pub for_s: f64,
    /// Times the private daemon was restarted (0 for a shared daemon).
    pub restarts: u64,
}

struct Detail {
    readiness: Readiness,
    reason: Option<String>,
    since: Instant,
    /// While `failing`: until when it holds.
    failing_until: Option<Instant>,
}

/// The shared readiness record.
pub struct ExpertHealth {
    /// `Readiness::code` of the current state: lets the call path skip the lock when nothing
    /// changes (it reports every successful call).
    state: AtomicU8,
    detail: Mutex<Detail>,
    restarts: AtomicU64,
    /// [`FAILING_HOLD`], shorter in tests.
    failing_hold: Duration,
}

impl std::fmt::Debug for ExpertHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpertHealth")
            .field("report", &self.report())
            .finish()
    }
}

impl Default for ExpertHealth {
    fn default() -> Self {
        ExpertHealth::new()
    }
}

impl ExpertHealth {
    /// A record that starts `ready` (the client is built after a successful handshake).
    pub fn new() -> ExpertHealth {
        ExpertHealth {
            state: AtomicU8::new(Readiness::Ready.code()),
            detail: Mutex::new(Detail {
                readiness: Readiness::Ready,
                reason: None,
                since: Instant::now(),
                failing_until: None,
            }),
            restarts: AtomicU64::new(0),
            failing_hold: FAILING_HOLD,
        }
    }

    /// [`ExpertHealth::new`] with `failing` holding for `hold` (tests).
    pub fn with_failing_hold(hold: Duration) -> ExpertHealth {
        ExpertHealth {
            failing_hold: hold,
            ..ExpertHealth::new()
        }
    }

    fn set(&self, readiness: Readiness, reason: Option<String>) {
        let mut d = self.detail.lock().unwrap_or_else(PoisonError::into_inner);
        // `failing` holds against successes and slowness: requests routed to the corrupt
        // expert still fail. Only a worse state (unreachable) replaces it meanwhile.
        if d.readiness == Readiness::Failing
            && readiness != Readiness::Failing
            && readiness.code() < Readiness::Failing.code()
            && d.failing_until.is_some_and(|t| Instant::now() < t)
        {
            return;
        }
        d.failing_until =
            (readiness == Readiness::Failing).then(|| Instant::now() + self.failing_hold);
        if d.readiness != readiness {
            match &reason {
                Some(r) => {
                    tracing::warn!(state = readiness.as_str(), reason = %r, "expertd health changed");
                }
                None => tracing::info!(state = readiness.as_str(), "expertd health changed"),
            }
            d.since = Instant::now();
        }
        d.readiness = readiness;
        d.reason = reason;
        self.state.store(readiness.code(), Ordering::Release);
    }

    /// A call or probe was answered in time.
    pub fn ok(&self) {
        // PERF-CRITICAL: called after every successful expert call; one atomic load when ready.
        if self.state.load(Ordering::Acquire) != Readiness::Ready.code() {
            self.set(Readiness::Ready, None);
        }
    }

    /// Connected, but not answered in time.
    pub fn degraded(&self, reason: String) {
        self.set(Readiness::Degraded, Some(reason));
    }

    /// The daemon reported a corrupt expert (DATA_LOSS): `failing` for [`FAILING_HOLD`].
    pub fn data_loss(&self, reason: String) {
        self.set(Readiness::Failing, Some(reason));
    }

    /// Not reachable.
    pub fn unavailable(&self, reason: String) {
        self.set(Readiness::Unavailable, Some(reason));
    }

    /// Counts a restart of the private daemon.
    pub fn restarted(&self) {
        self.restarts.fetch_add(1, Ordering::Relaxed);
    }

    /// The current state.
    pub fn readiness(&self) -> Readiness {
        self.detail
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .readiness
    }

    /// A snapshot.
    pub fn report(&self) -> HealthReport {
        let d = self.detail.lock().unwrap_or_else(PoisonError::into_inner);
        HealthReport {
            readiness: d.readiness,
            reason: d.reason.clone(),
            for_s: (d.since.elapsed().as_secs_f64() * 10.0).round() / 10.0,
            restarts: self.restarts.load(Ordering::Relaxed),
        }
    }
}

/// The background probe: one `Stats` RPC per interval on its own connection (no segment, no
/// session), each within `timeout`. It keeps its connection while the daemon is merely slow
/// (a stopped daemon's backlog is not filled with a connection per tick) and reconnects when
/// the connection closes.
pub struct Probe {
    /// The daemon.
    pub endpoint: Endpoint,
    /// The bearer token (TCP).
    pub token: Option<String>,
    /// Interval between probes.
    pub every: Duration,
    /// Deadline of one probe.
    pub timeout: Duration,
    /// Where to report.
    pub health: Arc<ExpertHealth>,
}

impl Probe {
    /// Probes until the runtime it runs on is dropped.
    pub async fn run(self) {
        let ep = self.endpoint.to_string();
        let mut link: Option<Link> = None;
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let secs = (self.timeout.as_secs_f64() * 10.0).round() / 10.0;
        let slow = || {
            format!(
                "expertd at {ep} did not answer a health probe within {secs} s: it is stopped, overloaded or hung"
            )
        };
        loop {
            tick.tick().await;
            if link.as_ref().is_some_and(|l| l.watch.is_closed()) {
                link = None;
            }
            let l = match link.take() {
                Some(l) => l,
                None => match tokio::time::timeout(
                    self.timeout,
                    transport::connect_within(
                        &self.endpoint,
                        None,
                        self.token.as_deref(),
                        self.timeout,
                    ),
                )
                .await
                {
                    Ok(Ok(l)) => l,
                    Ok(Err(e)) if e.nobody_listening() => {
                        self.health.unavailable(format!("health probe: {e}"));
                        continue;
                    }
                    Ok(Err(ExpertClientError::Connect { reason, .. }))
                        if reason.contains("(os error 11)") || reason.contains("timed out") =>
                    {
                        // The pre-handshake's reply did not come: the daemon accepted (its
                        // listener is in the kernel) but does not run.
                        self.health.degraded(slow());
                        continue;
                    }
                    Ok(Err(e)) => {
                        self.health.unavailable(format!("health probe: {e}"));
                        continue;
                    }
                    Err(_) => {
                        self.health.degraded(slow());
                        continue;
                    }
                },
            };
            let mut client = l.client.clone();
            match tokio::time::timeout(self.timeout, client.stats(proto::v1::StatsRequest {})).await
            {
                Ok(Ok(_)) => {
                    self.health.ok();
                    link = Some(l);
                }
                Ok(Err(status)) => match ExpertClientError::from_status(&ep, &status) {
                    // The probe's own connection broke (e.g. closed by the keepalive while the
                    // daemon is stopped): says nothing new; the next tick reconnects and tells.
                    ExpertClientError::ConnectionLost { .. } => {}
                    e => self.health.unavailable(format!("health probe: {e}")),
                },
                Err(_) => {
                    self.health.degraded(slow());
                    link = Some(l);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_change_on_one_observation_and_keep_their_reason() {
        let h = ExpertHealth::new();
        assert_eq!(h.report().readiness, Readiness::Ready);
        h.degraded("expertd at unix:///x did not answer within 2 s".into());
        let r = h.report();
        assert_eq!(r.readiness, Readiness::Degraded);
        assert!(
            r.reason
                .as_deref()
                .is_some_and(|m| m.contains("did not answer")),
            "{r:?}"
        );
        h.unavailable("gone".into());
        assert_eq!(h.readiness(), Readiness::Unavailable);
        h.restarted();
        h.ok();
        let r = h.report();
        assert_eq!(
            (r.readiness, r.reason, r.restarts),
            (Readiness::Ready, None, 1)
        );
    }

    #[test]
    fn failing_holds_against_successes_until_its_hold_passes() {
        let h = ExpertHealth::with_failing_hold(Duration::from_millis(200));
        h.data_loss("layer 0 expert 1: checksum mismatch".into());
        assert_eq!(h.readiness(), Readiness::Failing);
        // A probe and calls to other experts succeed, a call is slow: still failing.
        h.ok();
        h.degraded("slow".into());
        assert_eq!(h.readiness(), Readiness::Failing);
        assert!(h.report().reason.is_some_and(|r| r.contains("checksum")));
        // The daemon going away is worse, and replaces it.
        h.unavailable("gone".into());
        assert_eq!(h.readiness(), Readiness::Unavailable);
        h.data_loss("again".into());
        std::thread::sleep(Duration::from_millis(250));
        h.ok();
        assert_eq!(h.readiness(), Readiness::Ready, "the hold passed");
    }
}
