//! Route traces: the record of every decision-relevant event the expert cache processed, in the
//! order it processed them, so that `expertd replay` can drive a fresh [`Planner`] through the
//! same sequence and reproduce the daemon's hits, misses and evictions exactly — or try another
//! policy or budget on the same routes. Owns the format (types, writer, reader); the cache
//! produces the events (`ExpertCache::start_trace`), `crate::replay` consumes them.
//!
//! # Format (version 1)
//!
//! JSON lines, UTF-8, one object per line, each with an `"ev"` tag. `docs/route-trace.md`
//! repeats this with examples.
//!
//! - First line, the header:
//!   `{"ev":"header","format":"sluice-route-trace","version":1,"policy":"lfu-aging","halving_period":32,"budget_bytes":B,"slot_bytes":S,"slots":N,"transient_slots":T}`
//!   (`halving_period` only for `lfu-aging`; `slots = budget_bytes / slot_bytes`).
//! - One MoE-layer call:
//!   `{"ev":"acquire","session":S,"step":N,"layer":L,"experts":[e,…],"hits":H,"misses":M,"call":C}`
//!   plus `"transient":X` (misses served by a transient buffer) and `"evictions":V` when not
//!   zero. `call` numbers successful calls from 0 in order. A refused call has
//!   `"exhausted":true`, `hits` = `misses` = 0 and no `call`; it changed nothing.
//! - The end of a call (its last lease dropped):
//!   `{"ev":"release","session":S,"layer":L,"call":C}` plus `"unfilled":[e,…]` listing the
//!   call's misses whose read was never completed (their slots were freed, not cached).
//! - `{"ev":"release_session","session":S,"orphaned":K}`: the server closed session S; K
//!   leases of its live calls were orphaned (their calls still end with a `release` line).
//!
//! Readers ignore unknown fields, so later versions may add fields without a version bump;
//! a change of meaning bumps `version`.
//!
//! Releases are recorded because when calls overlap, which entries are pinned decides both the
//! victims and whether a miss falls back to a transient buffer.
//!
//! [`Planner`]: crate::cache::Planner

use crate::cache::{CacheConfig, Policy, PolicyKind};
use serde::{Deserialize, Serialize};
use shared::ids::{ExpertId, LayerId};
use std::io::{BufRead, BufWriter, Write};
use std::path::Path;

/// The `format` string of a route-trace header.
pub const TRACE_FORMAT: &str = "sluice-route-trace";
/// The route-trace version this build writes and reads.
pub const TRACE_VERSION: u32 = 1;
/// Capacity of the writer's buffer: large enough that tracing costs a write system call only
/// every few thousand events.
const WRITER_BUFFER_BYTES: usize = 1 << 20;

/// The first line of a trace: the cache configuration the events were recorded under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceHeader {
    /// Always [`TRACE_FORMAT`].
    pub format: String,
    /// Format version; this build reads [`TRACE_VERSION`].
    pub version: u32,
    /// The eviction policy.
    pub policy: PolicyKind,
    /// The `lfu-aging` halving period, in calls per layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halving_period: Option<u64>,
    /// The resident-expert byte budget.
    pub budget_bytes: u64,
    /// Bytes of one slot (the container's blob stride).
    pub slot_bytes: u64,
    /// Resident slots: `budget_bytes / slot_bytes`.
    pub slots: u64,
    /// Transient buffers.
    pub transient_slots: u32,
}

impl TraceHeader {
    /// The header of a trace recorded by a cache with this configuration.
    pub fn new(config: &CacheConfig, slot_bytes: u64, slots: u64) -> TraceHeader {
        TraceHeader {
            format: TRACE_FORMAT.to_string(),
            version: TRACE_VERSION,
            policy: config.policy.kind(),
            halving_period: config.policy.halving_period(),
            budget_bytes: config.budget_bytes,
            slot_bytes,
            slots,
            transient_slots: config.transient_slots,
        }
    }

    /// The recorded policy with its parameters.
    pub fn policy(&self) -> Policy {
        Policy::from_kind(self.policy, self.halving_period)
    }
}

/// One acquire call: a MoE-layer call of one session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcquireEvent {
    /// The session (client) that made the call.
    pub session: u64,
    /// The session's step (token) the call belongs to.
    pub step: u64,
    /// The MoE layer.
    pub layer: LayerId,
    /// The experts named, in call order.
    pub experts: Vec<ExpertId>,
    /// Experts resident (or being read by another call) when acquired.
    pub hits: u32,
    /// Experts that needed a read.
    pub misses: u32,
    /// The call's number (successful calls from 0); absent when the call was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<u64>,
    /// Misses served by a transient buffer.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub transient: u32,
    /// Entries evicted to make room for the misses.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub evictions: u32,
    /// Whether the call was refused (every slot leased, transient pool empty).
    #[serde(default, skip_serializing_if = "is_false")]
    pub exhausted: bool,
}

/// The end of a call: its last lease dropped, its pins were released.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseEvent {
    /// The session that made the call.
    pub session: u64,
    /// The call's layer.
    pub layer: LayerId,
    /// The call's number, as in its acquire line.
    pub call: u64,
    /// Misses of the call whose read never completed; their slots were freed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unfilled: Vec<ExpertId>,
}

/// The server closed a session (`release_session`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseSessionEvent {
    /// The session.
    pub session: u64,
    /// Leases of the session's live calls that became orphaned.
    pub orphaned: u64,
}

/// One line of a route trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum TraceEvent {
    /// The first line.
    Header(TraceHeader),
    /// A MoE-layer call.
    Acquire(AcquireEvent),
    /// The end of a call.
    Release(ReleaseEvent),
    /// A closed session.
    ReleaseSession(ReleaseSessionEvent),
}

#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's skip_serializing_if passes a reference"
)]
fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's skip_serializing_if passes a reference"
)]
fn is_false(b: &bool) -> bool {
    !*b
}

/// Why a route trace could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// Reading or writing the trace file failed.
    #[error("route trace IO: {0}")]
    Io(#[from] std::io::Error),
    /// A line is not a valid event.
    #[error("route trace line {line}: {source}")]
    Parse {
        /// 1-based line number.
        line: usize,
        /// What serde_json said.
        source: serde_json::Error,
    },
    /// The first line is not a header.
    #[error("route trace does not start with a header line (found {found})")]
    MissingHeader {
        /// What the first line was instead.
        found: &'static str,
    },
    /// A second header line.
    #[error("route trace line {line}: a second header")]
    SecondHeader {
        /// 1-based line number.
        line: usize,
    },
    /// A trace was asked of a cache that has already processed calls, or is already tracing.
    #[error("a route trace must start before the cache's first call, and only once")]
    CacheStarted,
    /// The writer fell behind the calls and journaled events were dropped; the trace is
    /// incomplete.
    #[error(
        "the route trace lost {events} events: its file was written slower than calls journaled them (it stalled for more than {} events); the trace is incomplete",
        crate::cache::MAX_JOURNAL_EVENTS
    )]
    Dropped {
        /// Events dropped.
        events: u64,
    },
    /// An earlier write to the trace failed; the trace is incomplete.
    #[error("an earlier write to the route trace failed ({0}); the trace is incomplete")]
    Broken(String),
    /// The header names another format or an unsupported version.
    #[error(
        "route trace header: format {format:?} version {version} is not {TRACE_FORMAT:?} version {TRACE_VERSION}"
    )]
    Version {
        /// The header's format string.
        format: String,
        /// The header's version.
        version: u32,
    },
}

/// Writes a route trace: a header, then events, buffered; flushed by [`TraceWriter::flush`]
/// and, best effort, on drop. The cache owns one while tracing (`ExpertCache::start_trace`)
/// and writes the events it journaled whenever the server calls `ExpertCache::flush_trace`.
pub struct TraceWriter {
    out: BufWriter<Box<dyn Write + Send>>,
    /// Events taken from the cache's journal, kept to reuse the allocation.
    pub(crate) spare: Vec<TraceEvent>,
    header_written: bool,
    /// The first write error, kept: later events would leave a gap, so nothing more is written.
    failed: Option<String>,
}

impl TraceWriter {
    /// A writer into `out`.
    pub fn new(out: Box<dyn Write + Send>) -> TraceWriter {
        TraceWriter {
            out: BufWriter::with_capacity(WRITER_BUFFER_BYTES, out),
            spare: Vec::new(),
            header_written: false,
            failed: None,
        }
    }

    /// A writer into a new (or truncated) file at `path`.
    pub fn create(path: &Path) -> std::io::Result<TraceWriter> {
        Ok(TraceWriter::new(Box::new(std::fs::File::create(path)?)))
    }

    /// Writes the header line; must come first, once.
    pub fn write_header(&mut self, header: &TraceHeader) -> std::io::Result<()> {
        debug_assert!(!self.header_written, "route trace header written twice");
        self.header_written = true;
        self.write_line(&TraceEvent::Header(header.clone()))
    }

    /// Writes events, one line each, in order. After a failure nothing more is written (a
    /// trace with a gap cannot be replayed) and [`TraceWriter::check_ok`] reports it.
    pub fn write_events(&mut self, events: &[TraceEvent]) -> std::io::Result<()> {
        if let Some(msg) = &self.failed {
            return Err(std::io::Error::other(msg.clone()));
        }
        for e in events {
            if let Err(err) = self.write_line(e) {
                self.failed = Some(err.to_string());
                return Err(err);
            }
        }
        Ok(())
    }

    /// Whether every write so far succeeded.
    pub fn check_ok(&self) -> Result<(), TraceError> {
        match &self.failed {
            None => Ok(()),
            Some(msg) => Err(TraceError::Broken(msg.clone())),
        }
    }

    fn write_line(&mut self, e: &TraceEvent) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.out, e)?;
        self.out.write_all(b"\n")
    }

    /// Pushes buffered lines to the underlying writer and flushes it.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

impl Drop for TraceWriter {
    fn drop(&mut self) {
        // Best effort: the owner calls `flush` (through `ExpertCache::finish_trace`) to see errors.
        let _ = self.out.flush();
    }
}

/// A whole route trace in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// The header line.
    pub header: TraceHeader,
    /// Every later line, in order.
    pub events: Vec<TraceEvent>,
}

impl Trace {
    /// Parses a trace from JSON lines; blank lines are skipped.
    pub fn read(input: impl BufRead) -> Result<Trace, TraceError> {
        let mut header = None;
        let mut events = Vec::new();
        for (i, line) in input.lines().enumerate() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let ev: TraceEvent =
                serde_json::from_str(&line).map_err(|source| TraceError::Parse {
                    line: i + 1,
                    source,
                })?;
            match (ev, &header) {
                (TraceEvent::Header(h), None) => {
                    if h.format != TRACE_FORMAT || h.version != TRACE_VERSION {
                        return Err(TraceError::Version {
                            format: h.format,
                            version: h.version,
                        });
                    }
                    header = Some(h);
                }
                (TraceEvent::Header(_), Some(_)) => {
                    return Err(TraceError::SecondHeader { line: i + 1 });
                }
                (ev, None) => {
                    let found = match ev {
                        TraceEvent::Acquire(_) => "an acquire event",
                        TraceEvent::Release(_) => "a release event",
                        TraceEvent::ReleaseSession(_) | TraceEvent::Header(_) => {
                            "a release_session event"
                        }
                    };
                    return Err(TraceError::MissingHeader { found });
                }
                (ev, Some(_)) => events.push(ev),
            }
        }
        let header = header.ok_or(TraceError::MissingHeader {
            found: "an empty file",
        })?;
        Ok(Trace { header, events })
    }

    /// Reads the trace file at `path`.
    pub fn open(path: &Path) -> Result<Trace, TraceError> {
        Trace::read(std::io::BufReader::new(std::fs::File::open(path)?))
    }
}
