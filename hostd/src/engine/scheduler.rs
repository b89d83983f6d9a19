//! The scheduler loop: the only thread that touches the model.
//!
//! Each iteration: admit queued requests while fewer than `max_batch` sequences run (looking up
//! the prefix cache and the state directory), drop sequences whose client went away, then one
//! forward pass that carries this step's prefill blocks (at most one per prefilling sequence,
//! shortest remaining prompt first, within the step's token budget) together with the next
//! token of every decoding sequence: one expert call per layer for both. While sequences
//! decode, blocks are short and prefill gets at most half the time (`fairness`), so a long
//! prompt slows a decoding stream to no less than about half its speed. A sequence's output
//! depends only on its own prompt, parameters and (for prefix hits) the cached state, never on
//! what else runs: batched rows equal per-sequence rows bit for bit (`model::batch`), and a
//! prompt's blocks end on a grid that makes the pace invisible in the bits (`fairness`).

use super::fairness::{self, Candidate};
use super::marks::MarkRule;
use super::metrics::Metrics;
use super::output::{Delta, OutputText};
use super::supervise::{PANIC_BUDGET, PANIC_WINDOW, Supervised, supervise};
use super::{EngineConfig, Event, FinishReason, GenRequest, Usage};
use crate::constraint::{Commit, SequenceConstraint};
use crate::model::batch::{BatchError, BatchItem};
use crate::model::snapshot::{KvRows, RecurrentSnapshot};
use crate::model::{Model, SequenceState};
use crate::prefix_cache::{self, PrefixCache};
use crate::prefix_store::PrefixStore;
use crate::sampling::Sampler;
use crate::tokenizer::Tokenizer;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

enum Phase {
    /// Prompt tokens `..fed` are in the state.
    Prefill { fed: usize },
    /// The prompt is in; `next` is the sampled token to feed on the next step.
    Decode { next: u32 },
}

struct Sequence {
    /// Unique per scheduler; names the sequence in a prefill plan.
    serial: u64,
    /// Consecutive iterations this sequence was prefilling but ran no block.
    skipped: u32,
    request_id: String,
    span: tracing::Span,
    prompt: Vec<u32>,
    /// Where prefill blocks end besides the multiples of `prefill_chunk` (`marks`), after the
    /// cached prefix.
    boundaries: Vec<usize>,
    /// The boundaries whose state goes into the prefix cache.
    checkpoints: Vec<usize>,
    /// The checkpoints also saved to the state directory.
    persist: Vec<usize>,
    cache_final_state: bool,
    cached_tokens: usize,
    state: SequenceState,
    phase: Phase,
    generated: Vec<u32>,
    /// The generation ended on a stop id (sampled, counted in usage, not in `generated`).
    stop_id_sampled: bool,
    sampler: Sampler,
    /// The grammar this sequence's output must follow (`response_format`, forced tool calls).
    constraint: Option<Box<SequenceConstraint>>,
    out: OutputText,
    max_tokens: usize,
    stop_ids: Vec<u32>,
    received: Instant,
    last_token_at: Option<Instant>,
    events: UnboundedSender<Event>,
}

/// What one sequence feeds in a step.
#[derive(Debug, Clone, Copy)]
enum Feed {
    /// Prompt tokens `start..end`.
    Prompt { start: usize, end: usize },
    /// The token sampled last.
    Token(u32),
}

/// How a sequence left the running set.
enum Exit {
    Finished(FinishReason),
    Cancelled,
    Failed(super::Failure),
}

/// The loop's state: the model, the prefix cache and the running sequences (FCFS order).
pub(super) struct Scheduler {
    model: Model,
    tokenizer: Arc<Tokenizer>,
    config: EngineConfig,
    metrics: Arc<Metrics>,
    rx: Receiver<GenRequest>,
    cache: PrefixCache<KvRows, RecurrentSnapshot>,
    /// Where prompts' blocks end and which states are kept (empty without a cache).
    marks: MarkRule,
    /// The state directory (`--prefix-cache-dir`), if any.
    store: Option<PrefixStore>,
    seqs: Vec<Sequence>,
    /// Ids ≥ this are padding rows of the embedding and never sampled.
    sample_vocab: usize,
    /// Ids below `sample_vocab` the tokenizer cannot decode (gaps in a truncated synthetic
    /// vocabulary); their logits are set to −∞ before sampling. Empty for real vocabularies.
    undefined_ids: Vec<u32>,
    /// Seeds requests that gave none (time-derived, then advanced per request).
    seed_counter: u64,
    /// The next sequence's `serial`.
    next_serial: u64,
    /// How prefill and decode share the time while sequences decode.
    pace: fairness::Pace,
}

impl Scheduler {
    /// A scheduler that will read requests from `rx`.
    pub(super) fn new(
        model: Model,
        tokenizer: Arc<Tokenizer>,
        config: EngineConfig,
        metrics: Arc<Metrics>,
        rx: Receiver<GenRequest>,
        store: Option<PrefixStore>,
    ) -> Scheduler {
        let sample_vocab = tokenizer.vocab_size().min(model.config().vocab_size).max(1);
        let undefined_ids: Vec<u32> = (0..sample_vocab as u32)
            .filter(|&id| tokenizer.token_bytes(id).is_none())
            .collect();
        let seed_counter = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Scheduler {
            cache: PrefixCache::new(config.state_cache_bytes, prefix_cache::BLOCK_TOKENS),
            marks: if config.state_cache_bytes > 0 {
                MarkRule::new(&tokenizer, config.checkpoint_every)
            } else {
                MarkRule::default()
            },
            model,
            tokenizer,
            config,
            metrics,
            rx,
            store,
            seqs: Vec::new(),
            sample_vocab,
            undefined_ids,
            seed_counter,
            next_serial: 0,
            pace: fairness::Pace::default(),
        }
    }

    /// Runs until every handle is dropped and no sequence is left.
    ///
    /// A panic inside an iteration (a bug that one request's input reached) fails the sequences
    /// running then, empties the prefix cache (a half-run iteration may have been inserting into
    /// it), and the loop goes on serving: one bad request never stops the server. More than
    /// [`PANIC_BUDGET`] panics within [`PANIC_WINDOW`] mean the engine itself is broken, and the
    /// engine stops and returns the reason: `hostd serve` then drains and exits with
    /// [`super::supervise::EXIT_ENGINE_PANICS`] so that its supervisor restarts it, rather than answering every
    /// later request with an error.
    pub(super) fn run(mut self) -> Option<String> {
        let ended = supervise(
            &mut self,
            Scheduler::iteration,
            Scheduler::recover,
            PANIC_BUDGET,
            PANIC_WINDOW,
        );
        if let Supervised::PanicBudgetSpent(panics) = ended {
            tracing::error!(
                panics,
                window_s = PANIC_WINDOW.as_secs(),
                "the scheduler keeps panicking; stopping so that a supervisor restarts hostd"
            );
            return Some(format!(
                "the generation engine panicked {panics} times within {} s",
                PANIC_WINDOW.as_secs()
            ));
        }
        tracing::info!("scheduler stopped");
        None
    }

    /// One iteration of the loop; false once the queue is closed and nothing is left to do.
    fn iteration(&mut self) -> bool {
        if !self.admit() {
            return false;
        }
        self.drop_cancelled();
        self.step();
        self.publish_gauges();
        true
    }

    /// After a panic in [`Self::iteration`]: fails every running sequence with a 500 (a request
    /// that was being admitted lost its channel in the unwind, which its handler reports the
    /// same way) through the one exit path, and empties the prefix cache.
    fn recover(&mut self, what: &str) {
        self.metrics.engine_panics.inc();
        tracing::error!(
            panic = %what,
            sequences = self.seqs.len(),
            "the scheduler panicked; failing the running sequences and going on"
        );
        for seq in std::mem::take(&mut self.seqs) {
            let failure = super::Failure {
                message: "internal error: the generation engine failed while running this \
                          request; it was dropped and the engine went on"
                    .to_string(),
                retry_after_s: None,
            };
            self.exit(seq, Exit::Failed(failure));
        }
        // Emptied, not replaced: its hit/miss/eviction totals feed Prometheus counters, which
        // must not go backwards.
        self.cache.clear();
        self.publish_gauges();
    }

    /// Pulls queued requests into free slots; blocks while nothing runs. Returns false when
    /// the queue is closed and nothing is left to do.
    fn admit(&mut self) -> bool {
        while self.seqs.len() < self.config.max_batch.max(1) {
            let req = if self.seqs.is_empty() {
                match self.rx.recv() {
                    Ok(r) => r,
                    Err(_) => return false,
                }
            } else {
                match self.rx.try_recv() {
                    Ok(r) => r,
                    Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                }
            };
            self.metrics.queue_depth.dec();
            self.metrics.queued_tokens.dec_by(req.prompt.len() as u64);
            if req.events.is_closed() {
                self.metrics.cancelled.inc();
                tracing::info!(parent: &req.span, "client went away while queued");
                continue;
            }
            self.start_sequence(req);
        }
        true
    }

    fn start_sequence(&mut self, req: GenRequest) {
        let hit = if self.config.state_cache_bytes > 0 {
            self.cache.lookup(&req.prompt).and_then(|h| {
                let state = SequenceState::resume(&h.parts, h.recurrent);
                debug_assert!(state.is_some(), "a cached checkpoint's parts do not fit");
                state.map(|s| (h.tokens, s))
            })
        } else {
            None
        };
        let (cached_tokens, state) =
            match self.resume_from_disk(&req.prompt, hit.as_ref().map_or(0, |h| h.0)) {
                Some(found) => found,
                None => hit.unwrap_or_else(|| (0, self.model.new_state())),
            };
        self.metrics.prompt_tokens.inc_by(req.prompt.len() as u64);
        self.metrics
            .cached_prompt_tokens
            .inc_by(cached_tokens as u64);
        tracing::info!(parent: &req.span, prompt_tokens = req.prompt.len(), cached_tokens, "admitted");
        self.seed_counter = self
            .seed_counter
            .wrapping_add(shared::splitmix::GOLDEN_GAMMA);
        let sampler = Sampler::new(req.sampling, &req.prompt, self.seed_counter);
        let mut out = OutputText::new(
            &self.tokenizer,
            &req.stop,
            req.split_reasoning,
            req.reasoning,
        );
        if req.skip_special_tokens {
            out = out.skip_special_tokens(&self.tokenizer);
        }
        let marks = self.marks.marks(&req.prompt);
        self.next_serial += 1;
        self.seqs.push(Sequence {
            serial: self.next_serial,
            skipped: 0,
            request_id: req.request_id,
            span: req.span,
            // Without a cache the rule has no marks, and prefill blocks stay those of
            // `hostd run` (multiples of `prefill_chunk`).
            boundaries: marks
                .boundaries
                .into_iter()
                .filter(|&c| c > cached_tokens)
                .collect(),
            checkpoints: marks
                .checkpoints
                .into_iter()
                .filter(|&c| c > cached_tokens)
                .collect(),
            persist: marks
                .persist
                .into_iter()
                .filter(|&c| c > cached_tokens)
                .collect(),
            prompt: req.prompt,
            cache_final_state: req.cache_final_state,
            cached_tokens,
            state,
            phase: Phase::Prefill { fed: cached_tokens },
            generated: Vec::new(),
            stop_id_sampled: false,
            sampler,
            constraint: req.constraint,
            out,
            max_tokens: req.max_tokens,
            stop_ids: req.stop_ids,
            received: req.received,
            last_token_at: None,
            events: req.events,
        });
    }

    /// A saved state from the state directory covering more of `prompt` than `longer_than`
    /// tokens, put into the prefix cache too (so later prompts share its blocks) and resumed.
    fn resume_from_disk(
        &mut self,
        prompt: &[u32],
        longer_than: usize,
    ) -> Option<(usize, SequenceState)> {
        let saved = self.store.as_mut()?.find(prompt, longer_than)?;
        let state = SequenceState::resume(&[&saved.kv], &saved.recurrent)?;
        self.cache.insert(
            &saved.tokens,
            |range| saved.kv.slice(range),
            || saved.recurrent.clone(),
            false,
        );
        tracing::info!(
            tokens = saved.tokens.len(),
            "resumed a sequence state from the state directory"
        );
        Some((saved.tokens.len(), state))
    }

    /// Sequences whose client disconnected stop here, before any more compute is spent.
    fn drop_cancelled(&mut self) {
        let mut i = 0;
        while i < self.seqs.len() {
            if self.seqs[i].events.is_closed() {
                let seq = self.seqs.remove(i);
                self.exit(seq, Exit::Cancelled);
            } else {
                i += 1;
            }
        }
    }

    /// One forward pass: this iteration's prefill blocks (as `fairness::plan` orders them) and
    /// the next token of every decoding sequence, in one batched call, so a prefill block and
    /// the decode rows share one expert call per layer. While sequences decode, prefill blocks
    /// are one pace unit long and run in at most `fairness::PREFILL_SHARE` of the time (the
    /// other steps decode only); with nothing decoding, blocks are `prefill_chunk` long and run
    /// back to back. Block boundaries stay where `fairness::block_end` puts them whatever the
    /// pace, so the output does not depend on the load.
    fn step(&mut self) {
        if self.config.fault_panic_in_step && !self.seqs.is_empty() {
            panic!("--fault-panic-in-step: a deliberate panic in the generation step");
        }
        let decoding = self
            .seqs
            .iter()
            .any(|s| matches!(s.phase, Phase::Decode { .. }));
        let cands: Vec<Candidate> = self
            .seqs
            .iter()
            .filter_map(|s| match s.phase {
                Phase::Prefill { fed } => Some(Candidate {
                    serial: s.serial,
                    fed,
                    prompt_len: s.prompt.len(),
                    checkpoint: s.boundaries.iter().copied().find(|&b| b > fed),
                    skipped: s.skipped,
                }),
                Phase::Decode { .. } => None,
            })
            .collect();
        let pace = &mut self.pace;
        let (rows, budget) = if decoding {
            let unit = fairness::pace_unit(self.config.prefill_chunk);
            (unit, unit)
        } else {
            (self.config.prefill_chunk, self.config.prefill_budget.max(1))
        };
        let blocks = if cands.is_empty() || (decoding && !pace.prefill_turn()) {
            Vec::new()
        } else {
            fairness::plan(&cands, rows, budget)
        };
        for s in &mut self.seqs {
            if matches!(s.phase, Phase::Prefill { .. }) {
                s.skipped = s.skipped.saturating_add(1);
            }
        }
        // Which sequence each item is, and what it feeds.
        let mut plan: Vec<(usize, Feed)> = Vec::new();
        for b in &blocks {
            if let Some(i) = self.seqs.iter().position(|s| s.serial == b.serial) {
                self.seqs[i].skipped = 0;
                let end = b.end.clamp(b.start + 1, self.seqs[i].prompt.len());
                plan.push((
                    i,
                    Feed::Prompt {
                        start: b.start,
                        end,
                    },
                ));
            }
        }
        for (i, s) in self.seqs.iter().enumerate() {
            if let Phase::Decode { next } = s.phase {
                plan.push((i, Feed::Token(next)));
            }
        }
        if plan.is_empty() {
            return;
        }
        let started = Instant::now();
        let mut order: Vec<usize> = (0..plan.len()).collect();
        order.sort_by_key(|&k| plan[k].0);
        let mut items: Vec<BatchItem<'_>> = Vec::with_capacity(plan.len());
        let mut slots: Vec<Option<BatchItem<'_>>> = (0..plan.len()).map(|_| None).collect();
        let mut seqs = self.seqs.iter_mut().enumerate();
        for &k in &order {
            let (i, feed) = &plan[k];
            let seq = loop {
                let (j, s) = seqs.next().expect("planned sequences exist");
                if j == *i {
                    break s;
                }
            };
            let Sequence { state, prompt, .. } = seq;
            slots[k] = Some(BatchItem {
                state,
                tokens: match feed {
                    Feed::Prompt { start, end } => &prompt[*start..*end],
                    Feed::Token(t) => std::slice::from_ref(t),
                },
            });
        }
        items.extend(slots.into_iter().map(|s| s.expect("every item placed")));
        let result = self.model.forward_batch(&mut items);
        drop(items);
        let n_blocks = plan
            .iter()
            .filter(|(_, f)| matches!(f, Feed::Prompt { .. }))
            .count();
        let n_decode = plan.len() - n_blocks;
        self.metrics.prefill_chunks.inc_by(n_blocks as u64);
        if n_decode > 0 {
            self.metrics.decode_steps.inc();
            self.metrics.decode_rows.inc_by(n_decode as u64);
            if n_blocks > 0 {
                self.metrics.mixed_steps.inc();
            }
        }
        let contended = decoding && !cands.is_empty();
        self.pace.record(contended, n_blocks > 0, started.elapsed());
        match result {
            Ok(all) => {
                // Highest sequence index first, so removals do not shift pending indices.
                let mut done: Vec<(usize, Feed, Vec<f32>)> = plan
                    .into_iter()
                    .zip(all)
                    .map(|((i, f), l)| (i, f, l))
                    .collect();
                done.sort_by_key(|d| std::cmp::Reverse(d.0));
                for (i, feed, logits) in done {
                    match feed {
                        Feed::Prompt { start, end } => self.prefill_done(i, start, end, &logits),
                        Feed::Token(_) => self.take_token(i, &logits),
                    }
                }
            }
            Err(BatchError::Item { index, source }) => {
                let seq = self.seqs.remove(plan[index].0);
                self.exit(
                    seq,
                    Exit::Failed(super::Failure::of(
                        "this sequence's input was refused",
                        &source,
                    )),
                );
            }
            Err(BatchError::Failed(e)) => {
                tracing::error!(error = %e, sequences = plan.len(), "batched forward pass failed");
                let mut idx: Vec<usize> = plan.iter().map(|(i, _)| *i).collect();
                idx.sort_unstable();
                idx.dedup();
                for &i in idx.iter().rev() {
                    let seq = self.seqs.remove(i);
                    self.exit(
                        seq,
                        Exit::Failed(super::Failure::of("forward pass failed", &e)),
                    );
                }
            }
        }
    }

    /// After prompt tokens `start..end` of sequence `i` went in: keeps a checkpoint there if one
    /// is due, and samples the first token when that completed the prompt.
    fn prefill_done(&mut self, i: usize, start: usize, end: usize, logits: &[f32]) {
        let seq = &mut self.seqs[i];
        {
            let _enter = seq.span.enter();
            tracing::debug!(fed = start, end, "prefill block");
        }
        if seq.checkpoints.contains(&end) {
            let state = &seq.state;
            let mark = seq.persist.contains(&end);
            self.cache.insert(
                &seq.prompt[..end],
                |range| state.kv_rows(range),
                || state.recurrent_snapshot(),
                !mark,
            );
            if mark {
                persist(self.store.as_mut(), &seq.prompt[..end], state);
            }
        }
        if end < seq.prompt.len() {
            seq.phase = Phase::Prefill { fed: end };
            return;
        }
        self.take_token(i, logits);
    }

    /// Samples from `logits` for sequence `i`, reports the token, and ends the sequence when a
    /// stop id, stop string, `max_tokens` or the context limit says so, or when its grammar is
    /// complete. Only a constrained sequence pays for a mask (and its own logits buffer).
    fn take_token(&mut self, i: usize, logits: &[f32]) {
        let now = Instant::now();
        let seq = &mut self.seqs[i];
        let masked;
        let logits = if self.undefined_ids.is_empty() {
            logits
        } else {
            masked = {
                let mut l = logits.to_vec();
                for &id in &self.undefined_ids {
                    l[id as usize] = f32::NEG_INFINITY;
                }
                l
            };
            &masked
        };
        let sampled = match seq.constraint.as_mut() {
            None => Ok(seq.sampler.sample(logits, self.sample_vocab)),
            Some(c) => c
                .mask_logits(logits, self.sample_vocab)
                .map(|l| seq.sampler.sample(l, self.sample_vocab)),
        };
        let commit = sampled.and_then(|(id, lp)| match seq.constraint.as_mut() {
            None => Ok((id, lp, Commit::Continue)),
            Some(c) => c.commit(id).map(|commit| (id, lp, commit)),
        });
        let (id, lp, commit) = match commit {
            Ok(t) => t,
            Err(e) => {
                let seq = self.seqs.remove(i);
                self.exit(
                    seq,
                    Exit::Failed(super::Failure {
                        message: e.to_string(),
                        retry_after_s: None,
                    }),
                );
                return;
            }
        };
        match seq.last_token_at {
            None => self.metrics.ttft.observe(now - seq.received),
            Some(t) => self.metrics.per_token.observe(now - t),
        }
        seq.last_token_at = Some(now);
        let exit = if commit == Commit::End || seq.stop_ids.contains(&id) {
            seq.stop_id_sampled = true;
            self.metrics.generation_tokens.inc();
            Some(FinishReason::Stop)
        } else {
            seq.generated.push(id);
            self.metrics.generation_tokens.inc();
            let (delta, stopped) = seq.out.push(&self.tokenizer, id, lp);
            send_delta(&seq.events, delta);
            if stopped {
                Some(
                    seq.out
                        .matched_stop()
                        .map_or(FinishReason::Stop, FinishReason::StopString),
                )
            } else if commit == Commit::Complete {
                Some(FinishReason::Stop)
            } else if seq.generated.len() >= seq.max_tokens
                || seq.state.len() + 1 > self.config.max_context
            {
                Some(FinishReason::Length)
            } else {
                seq.phase = Phase::Decode { next: id };
                None
            }
        };
        if let Some(reason) = exit {
            let seq = self.seqs.remove(i);
            self.exit(seq, Exit::Finished(reason));
        }
    }

    /// Reports the end of a sequence and frees (or caches) its state.
    fn exit(&mut self, mut seq: Sequence, how: Exit) {
        let _enter = seq.span.enter();
        let completion_tokens = seq.generated.len() + usize::from(seq.stop_id_sampled);
        let usage = Usage {
            prompt_tokens: seq.prompt.len(),
            completion_tokens,
            cached_tokens: seq.cached_tokens,
        };
        let state_ok = matches!(how, Exit::Finished(_) | Exit::Cancelled);
        match how {
            Exit::Finished(reason) => {
                send_delta(&seq.events, seq.out.finish());
                let _ = seq.events.send(Event::Done { reason, usage });
                self.metrics.finished.inc();
                self.metrics.e2e.observe(seq.received.elapsed());
                tracing::info!(
                    finish_reason = reason.as_str(),
                    completion_tokens = usage.completion_tokens,
                    cached_tokens = usage.cached_tokens,
                    "finished"
                );
            }
            Exit::Cancelled => {
                self.metrics.cancelled.inc();
                tracing::info!(
                    completion_tokens = usage.completion_tokens,
                    "client went away; sequence cancelled"
                );
            }
            Exit::Failed(msg) => {
                self.metrics.failed.inc();
                tracing::error!(error = %msg.message, "generation failed");
                let _ = seq.events.send(Event::Failed(msg));
            }
        }
        drop(_enter);
        let complete_prompt =
            matches!(seq.phase, Phase::Decode { .. }) || seq.state.len() >= seq.prompt.len();
        if state_ok
            && seq.cache_final_state
            && complete_prompt
            && self.config.state_cache_bytes > 0
            && !seq.state.is_empty()
        {
            let consumed = seq.state.len();
            let mut tokens = seq.prompt.clone();
            tokens.extend_from_slice(
                &seq.generated[..consumed
                    .saturating_sub(seq.prompt.len())
                    .min(seq.generated.len())],
            );
            if tokens.len() == consumed {
                let state = &seq.state;
                self.cache.insert(
                    &tokens,
                    |range| state.kv_rows(range),
                    || state.recurrent_snapshot(),
                    false,
                );
                persist(self.store.as_mut(), &tokens, state);
            }
        }
        tracing::debug!(request_id = %seq.request_id, "sequence state freed");
    }

    fn publish_gauges(&self) {
        let m = &self.metrics;
        m.active_sequences.set(self.seqs.len() as u64);
        m.active_state_bytes
            .set(self.seqs.iter().map(|s| s.state.bytes() as u64).sum());
        let c = self.cache.stats();
        m.cache_bytes.set(c.bytes as u64);
        m.cache_entries.set(c.entries as u64);
        m.cache_blocks.set(c.blocks as u64);
        // The cache counts these itself; the counters mirror its totals.
        m.cache_hits.inner().store(c.hits, Relaxed);
        m.cache_misses.inner().store(c.misses, Relaxed);
        m.cache_evictions.inner().store(c.evictions, Relaxed);
    }
}

/// Queues the state that consumed `tokens` for the state directory's writer, when there is one
/// and it takes it (a copy of the state is made only then).
fn persist(store: Option<&mut PrefixStore>, tokens: &[u32], state: &SequenceState) {
    if let Some(store) = store
        && store.wants(tokens, state.bytes())
    {
        store.save(
            tokens,
            state.kv_rows(0..tokens.len()),
            state.recurrent_snapshot(),
        );
    }
}

fn send_delta(events: &UnboundedSender<Event>, delta: Delta) {
    if !delta.is_empty() {
        // A closed channel means the client left; the next `drop_cancelled` handles it.
        let _ = events.send(Event::Delta(delta));
    }
}
