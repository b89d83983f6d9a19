//! The generation loop: prefill the prompt in row blocks, then greedy decoding with EOS/stop
//! ids and a token limit, reporting each token as it is produced and timing every phase.

use crate::model::{Logits, Model, ModelError};
use crate::sampling::argmax_allowed;
use std::time::{Duration, Instant};

/// What ends a generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// A stop token (EOS, `<|im_end|>`) was produced; it is not part of the output.
    Stop(u32),
    /// `max_new_tokens` were produced.
    Length,
    /// The caller's callback asked to stop.
    Cancelled,
}

/// Settings of one generation.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Most tokens to produce.
    pub max_new_tokens: usize,
    /// Ids that end generation.
    pub stop_ids: Vec<u32>,
    /// Prompt rows per forward block during prefill.
    pub prefill_chunk: usize,
    /// Only ids below this are eligible (masks the embedding table's padding rows).
    pub sample_vocab: usize,
    /// When set, only ids whose entry is true are eligible (ids the tokenizer can decode).
    pub allowed: Option<std::sync::Arc<[bool]>>,
}

/// Timings and counts of one generation.
#[derive(Debug, Clone)]
pub struct GenerateStats {
    /// Prompt tokens prefilled.
    pub prompt_tokens: usize,
    /// Tokens produced (excluding a final stop token).
    pub new_tokens: usize,
    /// Wall time of the prefill forward passes alone (fresh state to last prompt logits).
    pub prefill_time: Duration,
    /// Wall time from the start of prefill to the first produced token (prefill + its argmax);
    /// equals `prefill_time` when no token was produced.
    pub ttft: Duration,
    /// Wall time from the first produced token to the end: every decode step (one forward +
    /// argmax) plus the caller's per-token callback (detokenise, write).
    pub decode_time: Duration,
    /// Forward passes after prefill (tokens fed back).
    pub decode_steps: usize,
    /// Why generation ended.
    pub stop: StopReason,
}

impl GenerateStats {
    /// Prompt tokens per second of prefill time.
    pub fn prefill_tokens_per_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_time.as_secs_f64()
    }
    /// Decode steps per second after the first token; `None` with no decode step.
    pub fn decode_tokens_per_s(&self) -> Option<f64> {
        (self.decode_steps > 0).then(|| self.decode_steps as f64 / self.decode_time.as_secs_f64())
    }
}

/// Greedy decoding. `on_token` sees every produced token (not the stop token) and returns
/// `false` to cancel.
pub fn generate_greedy(
    model: &Model,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<(Vec<u32>, GenerateStats), ModelError> {
    if prompt.is_empty() {
        return Err(ModelError::Empty);
    }
    let limit = prompt.len() + opts.max_new_tokens;
    let max = model.config().max_position_embeddings;
    if prompt.len() > max {
        return Err(ModelError::ContextExceeded {
            needed: prompt.len(),
            max,
        });
    }
    let start = Instant::now();
    let mut state = model.new_state();
    let chunk = opts.prefill_chunk.max(1);
    let mut logits = Vec::new();
    // The server's block rule (`engine::block_end`), so both give the same logits.
    let mut fed = 0;
    while fed < prompt.len() {
        let end = crate::engine::block_end(fed, prompt.len(), chunk, None);
        logits = model.forward(&mut state, &prompt[fed..end], Logits::Last, None)?;
        fed = end;
    }
    let prefill_time = start.elapsed();
    let mut out = Vec::new();
    let mut stats = GenerateStats {
        prompt_tokens: prompt.len(),
        new_tokens: 0,
        prefill_time,
        ttft: prefill_time,
        decode_time: Duration::ZERO,
        decode_steps: 0,
        stop: StopReason::Length,
    };
    let vocab = opts.sample_vocab.min(logits.len()).max(1);
    let mut decode_start = None;
    while out.len() < opts.max_new_tokens {
        let id = argmax_allowed(&logits[..vocab], opts.allowed.as_deref());
        if out.is_empty() {
            stats.ttft = start.elapsed();
            decode_start = Some(Instant::now());
        }
        if opts.stop_ids.contains(&id) {
            stats.stop = StopReason::Stop(id);
            break;
        }
        out.push(id);
        if !on_token(id) {
            stats.stop = StopReason::Cancelled;
            break;
        }
        if out.len() == opts.max_new_tokens || state.len() + 1 > limit.min(max) {
            break;
        }
        logits = model.forward(&mut state, &[id], Logits::Last, None)?;
        stats.decode_steps += 1;
    }
    if let Some(t) = decode_start {
        stats.decode_time = t.elapsed();
    }
    stats.new_tokens = out.len();
    Ok((out, stats))
}
