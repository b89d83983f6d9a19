//! The generation engine behind `hostd serve`: one scheduler thread owns the model, admits
//! requests from a queue bounded in requests and in prompt tokens, prefills each new sequence
//! in blocks interleaved fairly with other sequences' blocks and decode steps (`fairness`), and
//! advances every running sequence by one token per batched forward pass (continuous batching).
//!
//! The HTTP layer talks to it only through [`EngineHandle::submit`] and the per-request
//! [`Event`] channel; dropping that channel's receiver (the client went away) cancels the
//! sequence within one decode step and frees its state. Requests carry token ids, not text;
//! text comes back already split into reasoning and content with stop strings removed.
//!
//! Not here: HTTP, JSON and the OpenAI shapes (`http/`); the sampling math (`sampling`).

mod fairness;
pub(crate) use fairness::block_end;
mod marks;
pub mod metrics;
pub mod output;
mod scheduler;
mod supervise;

use crate::model::Model;
use crate::sampling::SamplingParams;
use crate::tokenizer::Tokenizer;
use metrics::Metrics;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{SyncSender, TrySendError};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

pub use output::{Delta, LogprobEntry, TopLogprob};

/// Prompt rows per prefill forward call unless a command says otherwise (`--prefill-chunk` of
/// `hostd serve`, `run`, `eval`, `profile` and `bench`): big enough for GEMM efficiency, small
/// enough that a long prompt's per-block temporaries stay O(block), not O(prompt).
pub const DEFAULT_PREFILL_CHUNK: usize = 512;

/// Scheduler limits.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Requests that may wait for a slot; one more is refused (HTTP 429).
    pub max_queue: usize,
    /// Prompt tokens that may wait for a slot, all queued requests together; a request that
    /// would go past it is refused (HTTP 429), except into an empty queue (so any prompt that
    /// fits the context can be served).
    pub max_queued_tokens: usize,
    /// Sequences prefilled or decoded concurrently.
    pub max_batch: usize,
    /// Byte budget of the prefix cache (0 disables it).
    pub state_cache_bytes: usize,
    /// Directory where chosen checkpoints are also saved, to outlive the process
    /// (`crate::prefix_store`), and the bytes it may hold.
    pub state_dir: Option<(std::path::PathBuf, u64)>,
    /// The prefix cache keeps a checkpoint every this many prompt tokens (0: only at the chat
    /// template's marks; see `marks`).
    pub checkpoint_every: usize,
    /// Prompt rows per prefill forward call while nothing decodes (one pace unit while
    /// something does; `fairness`); prefill is cancellable between calls.
    pub prefill_chunk: usize,
    /// Prompt rows prefilled per scheduler iteration across all sequences, between two decode
    /// steps (at least one block always runs).
    pub prefill_budget: usize,
    /// Most tokens a sequence may hold (prompt + generated).
    pub max_context: usize,
    /// Fault injection (`hostd serve --fault-panic-in-step`, hidden from `--help`): every
    /// generation step that has a sequence panics, so that tests can drive the panic
    /// supervision end to end in a real process (failed requests, then exit status 70).
    pub fault_panic_in_step: bool,
}

/// One generation request, already tokenised and validated.
#[derive(Debug)]
pub struct GenRequest {
    /// Correlates logs, responses and metrics.
    pub request_id: String,
    /// The request's INFO span; the scheduler logs inside it.
    pub span: tracing::Span,
    /// Prompt ids (non-empty, shorter than the context).
    pub prompt: Vec<u32>,
    /// Also cache the final state (prompt + output), for completions that continue the text.
    pub cache_final_state: bool,
    /// How tokens are picked.
    pub sampling: SamplingParams,
    /// Most tokens to generate (≥ 1).
    pub max_tokens: usize,
    /// Stop strings (removed from the output).
    pub stop: Vec<String>,
    /// Ids that end generation (not part of the output); empty with `ignore_eos`.
    pub stop_ids: Vec<u32>,
    /// Separate reasoning (`<think>` … `</think>`) from content (chat); off for raw text.
    pub split_reasoning: bool,
    /// Output starts inside a reasoning block (chat with thinking on; needs `split_reasoning`).
    pub reasoning: bool,
    /// Special tokens add no text (`engine::output`); vLLM's `skip_special_tokens`.
    pub skip_special_tokens: bool,
    /// The grammar the output must follow; `None` for free text (no per-token cost).
    pub constraint: Option<Box<crate::constraint::SequenceConstraint>>,
    /// When the HTTP request arrived (TTFT counts from here).
    pub received: Instant,
    /// Where the engine sends this request's events.
    pub events: UnboundedSender<Event>,
}

/// Why a generation ended normally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop id (end of turn).
    Stop,
    /// The stop string at this index of [`GenRequest::stop`].
    StopString(usize),
    /// `max_tokens` or the context limit.
    Length,
}

impl FinishReason {
    /// OpenAI's `finish_reason` string.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop | FinishReason::StopString(_) => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Token counts of a finished generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens, the stop id that ended the generation included (as vLLM and OpenAI
    /// count it: a reply that ends at once used one token).
    pub completion_tokens: usize,
    /// Prompt tokens whose state came from the prefix cache.
    pub cached_tokens: usize,
}

/// What the engine reports about one request, in order: any number of `Delta`s, then exactly
/// one `Done` or `Failed`.
#[derive(Debug)]
pub enum Event {
    /// Newly released output.
    Delta(Delta),
    /// The generation ended.
    Done {
        /// Why.
        reason: FinishReason,
        /// Token counts.
        usage: Usage,
    },
    /// The model failed on this sequence.
    Failed(Failure),
}

/// Why a sequence failed, with what the HTTP layer needs to answer it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What failed, as a sentence.
    pub message: String,
    /// Set when the expert backend was unreachable or too slow: retrying after this many
    /// seconds may succeed (HTTP 503 with `Retry-After`). `None`: an internal failure.
    pub retry_after_s: Option<u64>,
}

impl Failure {
    /// `context: error`, retryable when the model failed because its expert backend was
    /// unavailable.
    pub fn of(context: &str, e: &crate::model::ModelError) -> Failure {
        let retry_after_s = match e {
            crate::model::ModelError::Experts(crate::experts::ExpertError::Unavailable {
                retry_after_s,
                ..
            }) => Some(*retry_after_s),
            _ => None,
        };
        Failure {
            message: format!("{context}: {e}"),
            retry_after_s,
        }
    }
}

/// Why a request was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The queue holds `max_queue` requests.
    #[error("the server is at capacity: {max_queue} requests are already queued")]
    QueueFull {
        /// The limit.
        max_queue: usize,
    },
    /// The queued prompts hold `max_queued_tokens` tokens, or would with this one.
    #[error(
        "the server is at capacity: {queued_tokens} prompt tokens are already queued and this request's {prompt_tokens} would pass the limit of {max_queued_tokens}"
    )]
    QueuedTokensFull {
        /// Prompt tokens already queued.
        queued_tokens: u64,
        /// This request's prompt tokens.
        prompt_tokens: u64,
        /// The limit.
        max_queued_tokens: usize,
    },
    /// The scheduler thread has stopped.
    #[error("the generation engine has stopped")]
    Stopped,
}

/// The handlers' side of the engine: submit requests, read limits.
#[derive(Clone)]
pub struct EngineHandle {
    tx: SyncSender<GenRequest>,
    metrics: Arc<Metrics>,
    config: EngineConfig,
    /// True while the scheduler thread runs; cleared when it returns or unwinds.
    running: Arc<AtomicBool>,
}

/// Clears the engine's `running` flag when the scheduler thread ends, however it ends.
struct RunningGuard(Arc<AtomicBool>);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.store(false, Relaxed);
    }
}

impl EngineHandle {
    /// Queues a request, or refuses it when the queue is full (in requests or in tokens).
    pub fn submit(&self, req: GenRequest) -> Result<(), SubmitError> {
        // Reserve the prompt's tokens first; the scheduler releases them when it takes the
        // request, so its decrement never runs ahead of this increment.
        let n = req.prompt.len() as u64;
        let limit = self.config.max_queued_tokens as u64;
        let reserved = self
            .metrics
            .queued_tokens
            .inner()
            .fetch_update(Relaxed, Relaxed, |q| {
                (q == 0 || q.saturating_add(n) <= limit).then(|| q + n)
            });
        if let Err(queued_tokens) = reserved {
            self.metrics.queue_rejected.inc();
            return Err(SubmitError::QueuedTokensFull {
                queued_tokens,
                prompt_tokens: n,
                max_queued_tokens: self.config.max_queued_tokens,
            });
        }
        self.metrics.queue_depth.inc();
        match self.tx.try_send(req) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.metrics.queue_depth.dec();
                self.metrics.queued_tokens.dec_by(n);
                match e {
                    TrySendError::Full(_) => {
                        self.metrics.queue_rejected.inc();
                        Err(SubmitError::QueueFull {
                            max_queue: self.config.max_queue,
                        })
                    }
                    TrySendError::Disconnected(_) => Err(SubmitError::Stopped),
                }
            }
        }
    }

    /// Whether the scheduler thread still runs: false means every request would fail, which
    /// `/health` reports.
    pub fn is_running(&self) -> bool {
        self.running.load(Relaxed)
    }

    /// The limits the engine runs with.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }
}

/// The engine stopped for good (its scheduler kept panicking): `hostd serve` drains and exits
/// with [`EngineFatal::EXIT_CODE`] so that a supervisor restarts it.
#[derive(Debug, thiserror::Error)]
#[error("{0}; exiting with status 70 for a supervisor to restart hostd")]
pub struct EngineFatal(pub String);

impl EngineFatal {
    /// The process's exit status (EX_SOFTWARE).
    pub const EXIT_CODE: u8 = supervise::EXIT_ENGINE_PANICS;
}

/// Starts the scheduler thread, which owns `model` until every [`EngineHandle`] is dropped
/// and the running sequences have finished. Returns the handle and the thread. `on_fatal` is
/// called (on the scheduler thread) with the reason if the engine stops for good.
pub fn start(
    model: Model,
    tokenizer: Arc<Tokenizer>,
    config: EngineConfig,
    metrics: Arc<Metrics>,
    store: Option<crate::prefix_store::PrefixStore>,
    on_fatal: impl FnOnce(EngineFatal) + Send + 'static,
) -> std::io::Result<(EngineHandle, std::thread::JoinHandle<()>)> {
    // `sync_channel(0)` would be a rendezvous channel: the queue always admits at least one.
    let (tx, rx) = std::sync::mpsc::sync_channel(config.max_queue.max(1));
    let sched = scheduler::Scheduler::new(
        model,
        tokenizer,
        config.clone(),
        Arc::clone(&metrics),
        rx,
        store,
    );
    let running = Arc::new(AtomicBool::new(true));
    let guard = RunningGuard(Arc::clone(&running));
    let thread = std::thread::Builder::new()
        .name("hostd-scheduler".into())
        .spawn(move || {
            let _guard = guard;
            if let Some(reason) = sched.run() {
                on_fatal(EngineFatal(reason));
            }
        })?;
    metrics.model_loaded.set(1);
    Ok((
        EngineHandle {
            tx,
            metrics,
            config,
            running,
        },
        thread,
    ))
}
