//! Greedy evaluation of one prompt for parity and quality checks: prefill in row blocks, then
//! N greedy steps with no stop ids, keeping every logit row and every layer's routes. The
//! library behind `hostd eval` (which writes the oracle's reference schema) and the tests.

use crate::model::moe::Routes;
use crate::model::{Logits, Model, ModelError};
use crate::sampling::argmax;

/// Why [`eval_prompt`] failed.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// No prompt tokens.
    #[error("empty prompt: at least one token is required")]
    EmptyPrompt,
    /// A prefill block of zero rows.
    #[error("the prefill chunk must be at least 1 token")]
    ZeroChunk,
    /// The forward pass failed.
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// Logits, greedy ids and routes of one prompt.
pub struct PromptEval {
    /// `T × V`.
    pub prompt_logits: Vec<f32>,
    /// Greedy continuation.
    pub greedy_ids: Vec<u32>,
    /// `N × V`; row i is the vector whose argmax gave `greedy_ids[i]`.
    pub greedy_logits: Vec<f32>,
    /// Per layer, the routes of every prompt position.
    pub prompt_routes: Vec<Routes>,
    /// Per layer, the routes of every token fed during decode (`N − 1` rows).
    pub greedy_routes: Vec<Routes>,
}

/// Prefill in blocks of `chunk` rows, then `n_new` greedy steps ([`argmax`], no stop ids).
pub fn eval_prompt(
    model: &Model,
    ids: &[u32],
    n_new: usize,
    chunk: usize,
) -> Result<PromptEval, EvalError> {
    let n_layers = model.config().num_layers;
    let vocab = model.config().vocab_size;
    let mut state = model.new_state();
    let mut prompt_logits = Vec::with_capacity(ids.len() * vocab);
    let mut prompt_routes: Vec<Routes> = Vec::new();
    if ids.is_empty() {
        return Err(EvalError::EmptyPrompt);
    }
    if chunk == 0 {
        return Err(EvalError::ZeroChunk);
    }
    for block in ids.chunks(chunk) {
        let mut r = Vec::with_capacity(n_layers);
        prompt_logits.extend(model.forward(&mut state, block, Logits::All, Some(&mut r))?);
        merge_routes(&mut prompt_routes, r);
    }
    let mut greedy_ids = Vec::with_capacity(n_new);
    let mut greedy_logits = Vec::with_capacity(n_new * vocab);
    let mut greedy_routes: Vec<Routes> = Vec::new();
    let mut last = prompt_logits[prompt_logits.len() - vocab..].to_vec();
    for step in 0..n_new {
        if step > 0 {
            let mut r = Vec::with_capacity(n_layers);
            last = model.forward(
                &mut state,
                &[greedy_ids[step - 1]],
                Logits::Last,
                Some(&mut r),
            )?;
            merge_routes(&mut greedy_routes, r);
        }
        greedy_ids.push(argmax(&last));
        greedy_logits.extend_from_slice(&last);
    }
    Ok(PromptEval {
        prompt_logits,
        greedy_ids,
        greedy_logits,
        prompt_routes,
        greedy_routes,
    })
}

/// Appends one call's per-layer routes to the running per-layer lists.
fn merge_routes(acc: &mut Vec<Routes>, call: Vec<Routes>) {
    if acc.is_empty() {
        *acc = call;
        return;
    }
    for (a, c) in acc.iter_mut().zip(call) {
        a.ids.extend(c.ids);
        a.weights.extend(c.weights);
    }
}
