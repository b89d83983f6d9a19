//! One forward pass over several sequences at once (continuous batching): the dense work —
//! embedding, norms, the router, the shared expert, `lm_head` — and the routed-expert call run
//! over the union of every sequence's new rows, so each MoE layer makes one
//! [`ExpertBackend::moe_layer`](crate::experts::ExpertBackend::moe_layer) call for the whole
//! batch; attention and DeltaNet run per sequence on that sequence's own state.
//!
//! **Invariant:** each sequence's logits equal, bit for bit, what [`Model::forward`] returns for
//! the same state and tokens, because every batched operation is row-independent: a GEMM row
//! equals the GEMV of that row (`shared::kernels`), the router and norms work row by row, and an
//! expert backend sums each row's experts in the call's order. Tested below.
//!
//! Not here: choosing which sequences run together (`engine::scheduler`).

use super::{LayerState, Mixer, Model, ModelError, SequenceState, linear, ops};
use crate::profile;

/// One sequence's share of a batched forward call.
pub struct BatchItem<'a> {
    /// The sequence's state, advanced by `tokens` on success.
    pub state: &'a mut SequenceState,
    /// Its new tokens (one for a decode step; any number for a prefill block).
    pub tokens: &'a [u32],
}

/// Why a batched forward call failed.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// One sequence's input is invalid; no state was touched.
    #[error("sequence {index} of the batch: {source}")]
    Item {
        /// Position of the sequence in the call.
        index: usize,
        /// What is wrong with it.
        #[source]
        source: ModelError,
    },
    /// The pass failed midway; every sequence of the batch is now poisoned.
    #[error("batched forward pass failed (every sequence in it is poisoned): {0}")]
    Failed(#[source] ModelError),
}

impl Model {
    fn check_item(&self, item: &BatchItem<'_>) -> Result<(), ModelError> {
        let vocab = self.cfg.vocab_size;
        if item.state.poisoned {
            return Err(ModelError::Poisoned);
        }
        if item.tokens.is_empty() {
            return Err(ModelError::Empty);
        }
        if let Some((index, &id)) = item
            .tokens
            .iter()
            .enumerate()
            .find(|(_, id)| **id as usize >= vocab)
        {
            return Err(ModelError::TokenOutOfRange { id, index, vocab });
        }
        let needed = item.state.pos + item.tokens.len();
        if needed > self.cfg.max_position_embeddings {
            return Err(ModelError::ContextExceeded {
                needed,
                max: self.cfg.max_position_embeddings,
            });
        }
        Ok(())
    }

    /// Runs every item's tokens through the model in one pass and returns, per item, the logits
    /// of its last new token (`vocab` floats each, in item order).
    pub fn forward_batch(&self, items: &mut [BatchItem<'_>]) -> Result<Vec<Vec<f32>>, BatchError> {
        for (index, item) in items.iter().enumerate() {
            self.check_item(item)
                .map_err(|source| BatchError::Item { index, source })?;
        }
        if items.is_empty() {
            return Ok(Vec::new());
        }
        super::keep_awake::run(self.keep_awake, || self.forward_batch_pass(items))
    }

    /// [`forward_batch`](Self::forward_batch) of checked, non-empty items, on whichever thread runs it.
    fn forward_batch_pass(&self, items: &mut [BatchItem<'_>]) -> Result<Vec<Vec<f32>>, BatchError> {
        let d = self.cfg.hidden_size;
        let eps = self.cfg.rms_norm_eps as f32;
        // Row ranges of each item inside the union.
        let mut starts = Vec::with_capacity(items.len() + 1);
        starts.push(0usize);
        for item in items.iter() {
            starts.push(starts[starts.len() - 1] + item.tokens.len());
        }
        let total = starts[items.len()];

        let prof = self.profiler();
        let scope = profile::scope(prof, "embed", total * d * 2);
        let mut h = Vec::with_capacity(total * d);
        for item in items.iter() {
            for &id in item.tokens {
                h.extend(self.embed.row(id as usize).iter().map(|v| v.to_f32()));
            }
        }
        drop(scope);
        // As in `forward`: states advance in place and are marked poisoned until the pass ends.
        for item in items.iter_mut() {
            item.state.poisoned = true;
        }
        let mut mixed = vec![0.0f32; total * d];
        for (i, layer) in self.layers.iter().enumerate() {
            let mut a = h.clone();
            ops::rms_norm_rows(&mut a, &layer.input_scale, eps);
            for (k, item) in items.iter_mut().enumerate() {
                let (r0, r1) = (starts[k], starts[k + 1]);
                let x = &a[r0 * d..r1 * d];
                let out = match (&layer.mixer, &mut item.state.layers[i]) {
                    (Mixer::Attention(att), LayerState::Kv(cache)) => {
                        att.forward(self.isa, x, r1 - r0, cache, prof)
                    }
                    (Mixer::DeltaNet(dn), LayerState::DeltaNet(s)) => {
                        dn.forward(self.isa, x, r1 - r0, s, prof)
                    }
                    _ => unreachable!(
                        "layer {i}: state kind always matches the mixer (built by new_state)"
                    ),
                };
                mixed[r0 * d..r1 * d].copy_from_slice(&out);
            }
            for (hv, mv) in h.iter_mut().zip(&mixed) {
                *hv += mv;
            }
            let mut b = h.clone();
            ops::rms_norm_rows(&mut b, &layer.post_scale, eps);
            let (moe_out, routes) = layer
                .moe
                .forward(self.isa, self.experts.as_ref(), &b, total, prof)
                .map_err(|e| BatchError::Failed(e.into()))?;
            self.heat.record(i, &routes.ids);
            for (hv, mv) in h.iter_mut().zip(&moe_out) {
                *hv += mv;
            }
            self.prefetch_next(i, &h, total);
        }
        for item in items.iter_mut() {
            item.state.poisoned = false;
            item.state.pos += item.tokens.len();
        }

        let m = items.len();
        let mut last = Vec::with_capacity(m * d);
        for k in 0..m {
            let r = starts[k + 1] - 1;
            last.extend_from_slice(&h[r * d..(r + 1) * d]);
        }
        let _scope = profile::scope(prof, "lm_head", self.lm_head.bytes());
        ops::rms_norm_rows(&mut last, &self.final_scale, eps);
        let logits = linear::project_new(self.isa, &self.lm_head, &last, m);
        let vocab = self.cfg.vocab_size;
        Ok(logits.chunks_exact(vocab).map(<[f32]>::to_vec).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Logits;
    use crate::model::linear::DenseFormat;

    fn load(preset: &str) -> Model {
        load_dense(preset, DenseFormat::Bf16)
    }

    fn load_dense(preset: &str, dense: DenseFormat) -> Model {
        crate::model::fixture_model(preset, dense)
    }

    /// Prompts of different lengths, prefilled per sequence, then `steps` decode steps in which
    /// the batch and the solo runs feed the same tokens; logits must match exactly, and so must
    /// a mixed step where one sequence brings a multi-token block.
    fn check_batch_equals_solo(preset: &str, steps: usize, dense: DenseFormat) {
        let model = load_dense(preset, dense);
        let vocab = model.config().vocab_size as u32;
        let prompts: Vec<Vec<u32>> = [5usize, 1, 9, 3]
            .iter()
            .enumerate()
            .map(|(s, &n)| {
                (0..n as u32)
                    .map(|t| (t * 31 + s as u32 * 7 + 1) % vocab)
                    .collect()
            })
            .collect();
        let mut solo: Vec<SequenceState> = Vec::new();
        let mut last: Vec<u32> = Vec::new();
        for p in &prompts {
            let mut st = model.new_state();
            let logits = model
                .forward(&mut st, p, Logits::Last, None)
                .expect("prefill");
            last.push(crate::sampling::argmax(&logits));
            solo.push(st);
        }
        let mut batched = solo.clone();
        for step in 0..steps {
            // Step 1 also gives sequence 2 a three-token block, as a joining prefill would.
            let feeds: Vec<Vec<u32>> = (0..prompts.len())
                .map(|k| {
                    if step == 1 && k == 2 {
                        vec![last[k], 4, 8]
                    } else {
                        vec![last[k]]
                    }
                })
                .collect();
            let expect: Vec<Vec<f32>> = solo
                .iter_mut()
                .zip(&feeds)
                .map(|(st, f)| model.forward(st, f, Logits::Last, None).expect("solo step"))
                .collect();
            let mut items: Vec<BatchItem<'_>> = batched
                .iter_mut()
                .zip(&feeds)
                .map(|(state, f)| BatchItem { state, tokens: f })
                .collect();
            let got = model.forward_batch(&mut items).expect("batched step");
            for (k, (g, e)) in got.iter().zip(&expect).enumerate() {
                let same =
                    g.len() == e.len() && g.iter().zip(e).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{preset}: step {step}, sequence {k}: batched logits differ from per-sequence forward"
                );
            }
            last = got.iter().map(|l| crate::sampling::argmax(l)).collect();
        }
        for (a, b) in solo.iter().zip(&batched) {
            assert_eq!(a.len(), b.len());
        }
    }

    #[test]
    fn batched_logits_equal_per_sequence_forward_tiny() {
        check_batch_equals_solo("tiny", 4, DenseFormat::Bf16);
    }

    #[test]
    fn batched_logits_equal_per_sequence_forward_tiny_int8_dense() {
        check_batch_equals_solo("tiny", 4, DenseFormat::Int8);
    }

    #[test]
    fn batched_logits_equal_per_sequence_forward_small() {
        check_batch_equals_solo("small", 3, DenseFormat::Bf16);
    }

    #[test]
    fn invalid_item_is_named_and_nothing_advances() {
        let model = load("tiny");
        let (mut a, mut b) = (model.new_state(), model.new_state());
        let bad = [model.config().vocab_size as u32];
        let mut items = vec![
            BatchItem {
                state: &mut a,
                tokens: &[1],
            },
            BatchItem {
                state: &mut b,
                tokens: &bad,
            },
        ];
        match model.forward_batch(&mut items) {
            Err(BatchError::Item {
                index: 1,
                source: ModelError::TokenOutOfRange { .. },
            }) => {}
            other => panic!("expected an item error for sequence 1, got {other:?}"),
        }
        assert_eq!((a.len(), b.len()), (0, 0));
    }
}
