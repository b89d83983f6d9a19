//! Token selection from one row of logits, and stop-string matching over the generated text.
//!
//! Pure: slices in, ids and strings out; no model, no IO, no clocks. The per-request random
//! generator is seeded from the request's `seed`, so the same seed and the same logits give the
//! same ids. The pipeline, in order: padding rows (ids ≥ the tokenizer's vocabulary) are cut
//! off; repetition penalty (prompt and output tokens), then presence and frequency penalties
//! (output tokens), then `logit_bias` (added per id) adjust logits; a temperature below
//! [`MIN_SAMPLING_TEMPERATURE`] (0 included) picks the argmax (lowest id on ties); otherwise logits
//! are divided by the temperature, turned into probabilities, filtered by top-k, top-p and min-p,
//! and one id is drawn. Every parameter that passes [`SamplingParams::validate`] gives an id for
//! every row of logits, NaN and infinities included (property-tested over the whole f32 range).
//! Log-probabilities reported to clients come from the raw model distribution (before penalties
//! and temperature), as vLLM reports them by default.
//!
//! Not here: detokenisation and the reasoning/content split (`engine::output`).

use std::collections::HashMap;

/// Upper bound on `top_logprobs` (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;
/// Temperatures in `[0, MIN_SAMPLING_TEMPERATURE)` are greedy. Dividing logits by a temperature
/// that small would overflow (1e-40, a subnormal, makes `1/t` infinite and every probability NaN);
/// at 1e-5 a logit gap of 0.001 already becomes e^-100, so nothing but the argmax could be drawn
/// anyway. vLLM treats temperatures below the same 1e-5 as greedy.
pub const MIN_SAMPLING_TEMPERATURE: f32 = 1e-5;
/// Upper bound on the number of stop strings (OpenAI's limit).
pub const MAX_STOP_STRINGS: usize = 4;

/// A sampling parameter outside its valid range; names the API field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid value for {param}: {reason}")]
pub struct SamplingError {
    /// The request field (`temperature`, `top_p`, …).
    pub param: &'static str,
    /// What is wrong, with the accepted range.
    pub reason: String,
}

/// How to pick each token of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Below [`MIN_SAMPLING_TEMPERATURE`] (0 included) greedy; otherwise logits are divided by
    /// it. Range `[0, 2]`.
    pub temperature: f32,
    /// Nucleus mass kept, `(0, 1]`; 1 disables.
    pub top_p: f32,
    /// Most candidates kept; 0 disables.
    pub top_k: usize,
    /// Candidates below `min_p × max probability` are dropped, `[0, 1]`; 0 disables.
    pub min_p: f32,
    /// Subtracted once from the logit of every token already generated, `[-2, 2]`.
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of generated tokens, `[-2, 2]`.
    pub frequency_penalty: f32,
    /// HF-style multiplicative penalty on prompt and generated tokens, `(0, 2]`; 1 disables.
    pub repetition_penalty: f32,
    /// Seed of the request's generator; `None` draws a fresh one.
    pub seed: Option<u64>,
    /// Report the chosen token's log-probability.
    pub logprobs: bool,
    /// Alternatives reported per position, `0..=20` (needs `logprobs`).
    pub top_logprobs: usize,
    /// `(id, bias)` added to the id's logit before sampling (greedy included), bias `[-100, 100]`.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    /// OpenAI's defaults: temperature 1, no filtering, no penalties.
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            seed: None,
            logprobs: false,
            top_logprobs: 0,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Checks every field's range; the error names the first bad field.
    pub fn validate(&self) -> Result<(), SamplingError> {
        let bad = |param, reason: &str| {
            Err(SamplingError {
                param,
                reason: reason.to_string(),
            })
        };
        let finite = [
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("min_p", self.min_p),
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
            ("repetition_penalty", self.repetition_penalty),
        ];
        if let Some((param, _)) = finite.iter().find(|(_, v)| !v.is_finite()) {
            return bad(param, "must be a finite number");
        }
        if !(0.0..=2.0).contains(&self.temperature) {
            return bad("temperature", "must be between 0 and 2");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", "must be greater than 0 and at most 1");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", "must be between 0 and 1");
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return bad("presence_penalty", "must be between -2 and 2");
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return bad("frequency_penalty", "must be between -2 and 2");
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty <= 2.0) {
            return bad("repetition_penalty", "must be greater than 0 and at most 2");
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return bad("top_logprobs", "must be between 0 and 20");
        }
        if self.top_logprobs > 0 && !self.logprobs {
            return bad("top_logprobs", "requires logprobs to be true");
        }
        if self
            .logit_bias
            .iter()
            .any(|(_, b)| !(b.is_finite() && (-100.0..=100.0).contains(b)))
        {
            return bad("logit_bias", "biases must be between -100 and 100");
        }
        Ok(())
    }

    /// True when the argmax decides (a temperature below [`MIN_SAMPLING_TEMPERATURE`], or
    /// top-k 1).
    pub fn is_greedy(&self) -> bool {
        self.temperature < MIN_SAMPLING_TEMPERATURE || self.top_k == 1
    }
}

/// The sampler's generator (SplitMix64): small, fast, seedable; one per request.
pub use shared::splitmix::SplitMix64 as Rng;

/// One token's log-probability and its best alternatives (raw model distribution).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The chosen id.
    pub id: u32,
    /// Its natural-log probability.
    pub logprob: f32,
    /// The `top_logprobs` most likely ids, most likely first (lower id first on ties).
    pub top: Vec<(u32, f32)>,
}

/// Per-request sampling state: parameters, generator and token counts for the penalties.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    /// Occurrences of each generated token (presence and frequency penalties).
    output_counts: HashMap<u32, u32>,
    /// Every id of the prompt and the output (repetition penalty).
    seen: std::collections::HashSet<u32>,
}

impl Sampler {
    /// A sampler for one request. `fallback_seed` is used when the request gave no seed.
    pub fn new(params: SamplingParams, prompt: &[u32], fallback_seed: u64) -> Sampler {
        let rng = Rng::new(params.seed.unwrap_or(fallback_seed));
        let seen = if params.repetition_penalty != 1.0 {
            prompt.iter().copied().collect()
        } else {
            Default::default()
        };
        Sampler {
            params,
            rng,
            output_counts: HashMap::new(),
            seen,
        }
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next id from `logits` (only the first `vocab` entries are eligible) and, when
    /// asked for, its log-probabilities. Records the id for the penalties.
    pub fn sample(&mut self, logits: &[f32], vocab: usize) -> (u32, Option<TokenLogprob>) {
        let vocab = vocab.min(logits.len()).max(1);
        let raw = &logits[..vocab.min(logits.len())];
        let mut adjusted;
        let row: &[f32] = if self.needs_penalties() {
            adjusted = raw.to_vec();
            self.apply_penalties(&mut adjusted);
            &adjusted
        } else {
            raw
        };
        let id = if self.params.is_greedy() {
            argmax(row)
        } else {
            adjusted = row.to_vec();
            self.draw(&mut adjusted)
        };
        let lp = self
            .params
            .logprobs
            .then(|| logprobs_of(raw, id, self.params.top_logprobs));
        *self.output_counts.entry(id).or_insert(0) += 1;
        if self.params.repetition_penalty != 1.0 {
            self.seen.insert(id);
        }
        (id, lp)
    }

    fn needs_penalties(&self) -> bool {
        let p = &self.params;
        (p.presence_penalty != 0.0 || p.frequency_penalty != 0.0) && !self.output_counts.is_empty()
            || p.repetition_penalty != 1.0 && !self.seen.is_empty()
            || !p.logit_bias.is_empty()
    }

    fn apply_penalties(&self, row: &mut [f32]) {
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
            for &id in &self.seen {
                if let Some(v) = row.get_mut(id as usize) {
                    *v = if *v > 0.0 {
                        *v / p.repetition_penalty
                    } else {
                        *v * p.repetition_penalty
                    };
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&id, &count) in &self.output_counts {
                if let Some(v) = row.get_mut(id as usize) {
                    *v -= p.presence_penalty + p.frequency_penalty * count as f32;
                }
            }
        }
        for &(id, bias) in &p.logit_bias {
            if let Some(v) = row.get_mut(id as usize) {
                *v += bias;
            }
        }
    }

    /// Temperature, top-k, top-p, min-p, then one draw. Candidate order is a total order
    /// (probability descending, id ascending), so the draw depends only on the logits and seed.
    fn draw(&mut self, row: &mut [f32]) -> u32 {
        let p = &self.params;
        let inv_t = 1.0 / p.temperature;
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if !max.is_finite() {
            return argmax(row);
        }
        let mut cand: Vec<(f32, u32)> = Vec::with_capacity(row.len());
        for (i, v) in row.iter().enumerate() {
            let e = ((v - max) * inv_t).exp();
            if e > 0.0 {
                cand.push((e, i as u32));
            }
        }
        if cand.is_empty() {
            // Unreachable for a validated temperature (the maximum's own term is e^0 = 1), kept
            // so that no parameter can leave the draw without a candidate.
            return argmax(row);
        }
        let order = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.select_nth_unstable_by(p.top_k - 1, order);
            cand.truncate(p.top_k);
        }
        cand.sort_unstable_by(order);
        let total: f64 = cand.iter().map(|c| f64::from(c.0)).sum();
        if p.top_p < 1.0 {
            let mut acc = 0.0f64;
            let keep = cand
                .iter()
                .position(|c| {
                    acc += f64::from(c.0) / total;
                    acc >= f64::from(p.top_p)
                })
                .map_or(cand.len(), |i| i + 1);
            cand.truncate(keep.max(1));
        }
        if p.min_p > 0.0 {
            let floor = cand[0].0 * p.min_p;
            let keep = cand.iter().take_while(|c| c.0 >= floor).count();
            cand.truncate(keep.max(1));
        }
        let total: f64 = cand.iter().map(|c| f64::from(c.0)).sum();
        let mut u = self.rng.next_f64() * total;
        for c in &cand {
            u -= f64::from(c.0);
            if u < 0.0 {
                return c.1;
            }
        }
        cand[cand.len() - 1].1
    }
}

/// Index of the largest value: the one greedy choice of hostd (`run`, `eval`, `profile`,
/// `serve`, batched decode). The lowest index wins ties; NaN never wins over a number (a row of
/// NaN gives index 0).
pub fn argmax(x: &[f32]) -> u32 {
    argmax_allowed(x, None)
}

/// [`argmax`] over the eligible indices only: every index when `allowed` is `None`, else those
/// whose entry is `true` (indices past the end of `allowed` are not eligible). Same tie and NaN
/// rule; 0 when nothing is eligible.
pub fn argmax_allowed(x: &[f32], allowed: Option<&[bool]>) -> u32 {
    let eligible = |i: usize| allowed.is_none_or(|a| a.get(i).copied().unwrap_or(false));
    let mut best: Option<usize> = None;
    for (i, &v) in x.iter().enumerate() {
        if eligible(i) && best.is_none_or(|b| v > x[b] || x[b].is_nan() && !v.is_nan()) {
            best = Some(i);
        }
    }
    best.unwrap_or(0) as u32
}

/// Log-softmax value of `id` and the `top` most likely ids over `row`.
pub fn logprobs_of(row: &[f32], id: u32, top: usize) -> TokenLogprob {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|v| f64::from(v - max).exp()).sum();
    let log_z = f64::from(max) + sum.ln();
    let lp = |i: u32| (f64::from(row[i as usize]) - log_z) as f32;
    let mut best: Vec<u32> = Vec::new();
    if top > 0 {
        let mut ids: Vec<u32> = (0..row.len() as u32).collect();
        let order = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
        let k = top.min(ids.len());
        if k < ids.len() {
            ids.select_nth_unstable_by(k - 1, order);
            ids.truncate(k);
        }
        ids.sort_unstable_by(order);
        best = ids;
    }
    TokenLogprob {
        id,
        logprob: lp(id),
        top: best.into_iter().map(|i| (i, lp(i))).collect(),
    }
}

/// Finds stop strings in streamed text without emitting any part of them: text that could
/// still become a stop string is held back until it cannot.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    /// The non-empty stop strings, each with its index in the list given to [`StopMatcher::new`].
    stops: Vec<(usize, String)>,
    held: String,
    /// Index of the stop string that ended the text (Anthropic's `stop_sequence` names it).
    matched: Option<usize>,
}

/// What [`StopMatcher::push`] releases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopOutput {
    /// Text safe to emit now.
    pub text: String,
    /// A stop string was found; `text` ends just before it and generation must end.
    pub stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> StopMatcher {
        let stops = stops
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_empty())
            .map(|(i, s)| (i, s.clone()))
            .collect();
        StopMatcher {
            stops,
            held: String::new(),
            matched: None,
        }
    }

    /// Adds text; returns what may be emitted. After `stopped`, the matcher holds nothing.
    pub fn push(&mut self, text: &str) -> StopOutput {
        if self.stops.is_empty() {
            return StopOutput {
                text: text.to_string(),
                stopped: false,
            };
        }
        self.held.push_str(text);
        // The earliest match wins; among matches at the same position, the first in the list.
        if let Some((at, index)) = self
            .stops
            .iter()
            .filter_map(|(i, s)| self.held.find(s.as_str()).map(|at| (at, *i)))
            .min()
        {
            let out = self.held[..at].to_string();
            self.held.clear();
            self.matched = Some(index);
            return StopOutput {
                text: out,
                stopped: true,
            };
        }
        // Hold the longest suffix that is a proper prefix of some stop string.
        let keep_from = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops
                    .iter()
                    .any(|(_, s)| s.len() > tail.len() && s.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let out = self.held[..keep_from].to_string();
        self.held.drain(..keep_from);
        StopOutput {
            text: out,
            stopped: false,
        }
    }

    /// Releases whatever is held (generation ended without a stop string).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// True while text is held back.
    pub fn is_holding(&self) -> bool {
        !self.held.is_empty()
    }

    /// The index (in the list given to [`StopMatcher::new`]) of the stop string that ended the
    /// text, once one did.
    pub fn matched(&self) -> Option<usize> {
        self.matched
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod props;
