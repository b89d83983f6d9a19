//! A sequence state taken apart for the prefix cache and put back together: the attention
//! layers' key/value rows of a range of positions ([`KvRows`], shareable between every state
//! whose tokens agree up to there) and the DeltaNet layers' conv and recurrent state at one
//! position ([`RecurrentSnapshot`], one per checkpoint: it cannot be rewound or shared).
//!
//! [`SequenceState::resume`] from the rows of positions `0..pos` and the snapshot taken at
//! `pos` is the state that consumed those tokens, bit for bit (the rows are copied, not
//! recomputed), so the forward calls that follow give the same logits.

use super::attention::KvCache;
use super::gdn::DeltaNetState;
use super::{LayerState, SequenceState};
use std::ops::Range;

/// Keys and values of a range of positions in every full-attention layer, in layer order.
#[derive(Debug, Clone, PartialEq)]
pub struct KvRows {
    /// `(keys, values)` per attention layer, each `rows × n_kv_heads × head_dim` floats.
    layers: Vec<(Vec<f32>, Vec<f32>)>,
    rows: usize,
}

impl KvRows {
    /// Positions held.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Bytes of keys and values held.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|(k, v)| (k.len() + v.len()) * 4)
            .sum()
    }

    /// The rows of positions `range` (relative to this part's first row).
    pub fn slice(&self, range: Range<usize>) -> KvRows {
        let width = |k: &Vec<f32>| k.len().checked_div(self.rows).unwrap_or(0);
        let layers = self
            .layers
            .iter()
            .map(|(k, v)| {
                let w = width(k);
                (
                    k[range.start * w..range.end * w].to_vec(),
                    v[range.start * w..range.end * w].to_vec(),
                )
            })
            .collect();
        KvRows {
            layers,
            rows: range.len(),
        }
    }

    /// `(keys, values)` per attention layer.
    pub fn layers(&self) -> &[(Vec<f32>, Vec<f32>)] {
        &self.layers
    }

    /// Rows from their layers (a saved state); `None` unless every layer holds `rows` rows
    /// of `width` floats in both keys and values.
    pub fn from_layers(
        layers: Vec<(Vec<f32>, Vec<f32>)>,
        rows: usize,
        width: usize,
    ) -> Option<KvRows> {
        let whole = rows.checked_mul(width)?;
        layers
            .iter()
            .all(|(k, v)| k.len() == whole && v.len() == whole)
            .then_some(KvRows { layers, rows })
    }
}

/// The conv and recurrent state of every DeltaNet layer at one position (`None` at the
/// attention layers, so the layer order is kept).
#[derive(Debug, Clone)]
pub struct RecurrentSnapshot {
    layers: Vec<Option<DeltaNetState>>,
    pos: usize,
}

impl RecurrentSnapshot {
    /// The position the snapshot was taken at (tokens consumed).
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes of DeltaNet state held.
    pub fn bytes(&self) -> usize {
        self.layers.iter().flatten().map(DeltaNetState::bytes).sum()
    }

    /// Per layer: the DeltaNet state, `None` at an attention layer.
    pub fn layers(&self) -> &[Option<DeltaNetState>] {
        &self.layers
    }

    /// A snapshot from its layers (a saved state) at position `pos`.
    pub fn from_layers(layers: Vec<Option<DeltaNetState>>, pos: usize) -> RecurrentSnapshot {
        RecurrentSnapshot { layers, pos }
    }
}

impl SequenceState {
    /// The attention layers' keys and values of positions `range` (within `0..len()`).
    pub fn kv_rows(&self, range: Range<usize>) -> KvRows {
        let layers = self
            .layers
            .iter()
            .filter_map(|l| match l {
                LayerState::Kv(c) => {
                    let (k, v) = c.rows(range.clone());
                    Some((k.to_vec(), v.to_vec()))
                }
                LayerState::DeltaNet(_) => None,
            })
            .collect();
        KvRows {
            layers,
            rows: range.len(),
        }
    }

    /// The DeltaNet layers' state now.
    pub fn recurrent_snapshot(&self) -> RecurrentSnapshot {
        let layers = self
            .layers
            .iter()
            .map(|l| match l {
                LayerState::Kv(_) => None,
                LayerState::DeltaNet(s) => Some(s.clone()),
            })
            .collect();
        RecurrentSnapshot {
            layers,
            pos: self.pos,
        }
    }

    /// The state that consumed `snapshot.pos()` tokens: the attention rows are `parts`
    /// concatenated in order (they must cover exactly `0..snapshot.pos()`), the DeltaNet layers'
    /// state is the snapshot's. `None` when the parts do not fit the snapshot (another layer
    /// layout, or rows that do not add up to its position): a caller's bug, never a state.
    pub fn resume(parts: &[&KvRows], snapshot: &RecurrentSnapshot) -> Option<SequenceState> {
        let rows: usize = parts.iter().map(|p| p.rows).sum();
        let n_kv = snapshot.layers.iter().filter(|l| l.is_none()).count();
        if rows != snapshot.pos || parts.iter().any(|p| p.layers.len() != n_kv) {
            return None;
        }
        let mut kv_index = 0;
        let layers = snapshot
            .layers
            .iter()
            .map(|l| match l {
                Some(s) => LayerState::DeltaNet(s.clone()),
                None => {
                    let i = kv_index;
                    kv_index += 1;
                    let pieces = parts
                        .iter()
                        .map(|p| (p.layers[i].0.as_slice(), p.layers[i].1.as_slice()));
                    LayerState::Kv(KvCache::from_rows(rows, pieces))
                }
            })
            .collect();
        Some(SequenceState {
            layers,
            pos: snapshot.pos,
            poisoned: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::linear::DenseFormat;
    use crate::model::{Logits, Model};

    /// Feeds `prompt` in blocks ending at each of `ends` (ascending, the last one the prompt's
    /// end), starting from `state`; returns the last block's logits.
    fn feed(model: &Model, state: &mut SequenceState, prompt: &[u32], ends: &[usize]) -> Vec<f32> {
        let mut logits = Vec::new();
        for &end in ends {
            let start = state.len();
            if end <= start {
                continue;
            }
            logits = model
                .forward(state, &prompt[start..end], Logits::Last, None)
                .expect("forward");
        }
        logits
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// A prompt that crosses several DeltaNet chunks (64) with both layer kinds, prefilled in
    /// blocks; at every block boundary the state is taken apart (its rows in two uneven
    /// pieces) and put back, and the rest of the prompt fed from there must give the
    /// uninterrupted run's logits bit for bit.
    #[test]
    fn resuming_at_any_block_boundary_gives_the_full_prefills_logits() {
        for dense in [DenseFormat::Bf16, DenseFormat::Int8] {
            let model = crate::model::fixture_model("tiny", dense);
            let vocab = model.config().vocab_size as u32;
            let prompt: Vec<u32> = (0..300u32).map(|t| (t * 37 + 11) % vocab).collect();
            let ends = [1, 2, 64, 100, 128, 129, 200, 256, 299, 300];
            let mut full = model.new_state();
            let want = bits(&feed(&model, &mut full, &prompt, &ends));
            let mut state = model.new_state();
            for &c in &ends[..ends.len() - 1] {
                feed(&model, &mut state, &prompt, &[c]);
                let cut = c / 3;
                let (a, b) = (state.kv_rows(0..cut), state.kv_rows(cut..c));
                let snap = state.recurrent_snapshot();
                assert_eq!((snap.pos(), a.rows() + b.rows()), (c, c));
                let mut resumed = SequenceState::resume(&[&a, &b], &snap).expect("parts fit");
                assert_eq!(resumed.len(), c);
                let got = bits(&feed(&model, &mut resumed, &prompt, &ends));
                assert_eq!(got, want, "{dense:?}: resumed at {c}: logits differ");
            }
        }
    }

    /// The rule the scheduler's free prefill pace rests on (`engine::fairness`): splitting a
    /// block at multiples of the DeltaNet chunk (64) counted from the block's start does not
    /// change a bit, whatever the sizes of the pieces (1-row pieces excepted: one token takes
    /// the recurrent form).
    #[test]
    fn blocks_split_on_the_chunk_grid_give_the_same_logits() {
        for dense in [DenseFormat::Bf16, DenseFormat::Int8] {
            let model = crate::model::fixture_model("tiny", dense);
            let vocab = model.config().vocab_size as u32;
            let prompt: Vec<u32> = (0..294u32).map(|t| (t * 29 + 5) % vocab).collect();
            // A mark at 37: the grid restarts there (37 + 64 j). 294 = 37 + 4·64 + 1: the last
            // block takes the odd row (`engine::block_end` never leaves a 1-row block).
            let splits: [&[usize]; 4] = [
                &[37, 294],
                &[37, 101, 165, 229, 294],
                &[37, 229, 294],
                &[37, 165, 294],
            ];
            let mut want = None;
            for ends in splits {
                let mut st = model.new_state();
                let got = bits(&feed(&model, &mut st, &prompt, ends));
                match &want {
                    None => want = Some(got),
                    Some(w) => assert_eq!(&got, w, "{dense:?}: blocks ending at {ends:?} differ"),
                }
            }
        }
    }

    #[test]
    fn parts_that_do_not_cover_the_snapshot_are_refused() {
        let model = crate::model::fixture_model("tiny", DenseFormat::Bf16);
        let mut state = model.new_state();
        model
            .forward(&mut state, &[1, 2, 3, 4, 5], Logits::Last, None)
            .expect("forward");
        let snap = state.recurrent_snapshot();
        let (a, b) = (state.kv_rows(0..2), state.kv_rows(2..5));
        assert!(SequenceState::resume(&[&a, &b], &snap).is_some());
        assert!(
            SequenceState::resume(&[&a], &snap).is_none(),
            "rows short of the position"
        );
        assert!(
            SequenceState::resume(&[&a, &b, &a], &snap).is_none(),
            "rows past it"
        );
        let empty = model.new_state().recurrent_snapshot();
        assert!(SequenceState::resume(&[], &empty).is_some_and(|s| s.is_empty()));
    }
}
