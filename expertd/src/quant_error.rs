//! Dequantisation error statistics of `expertd prepare`: per tensor kind (gate, up, down), the
//! largest |w − deq| over all experts, the largest |w|, and the largest per-row error relative
//! to that row's largest |w| — per layer, merged over the model, and written as
//! `prepare-report.json`.
//!
//! Pure: numbers in, numbers out; the caller does the file IO.

use serde::{Deserialize, Serialize};

/// Error statistics of one tensor kind over some set of experts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct KindStats {
    /// Largest |w − dequantised(w)| over every element.
    pub max_abs_err: f32,
    /// Largest |w| over every element.
    pub max_abs_weight: f32,
    /// Largest (max |w − deq| of a row) / (max |w| of that row); ≤ 1/254 plus f32 rounding for
    /// symmetric per-row int8.
    pub max_row_rel_err: f32,
    /// Layer of the expert holding `max_abs_err`.
    pub worst_layer: usize,
    /// Expert holding `max_abs_err`.
    pub worst_expert: usize,
}

impl KindStats {
    /// Statistics of one matrix `w` (row-major, `cols` per row) against its dequantisation.
    pub fn of_matrix(
        w: &[f32],
        deq: &[f32],
        cols: usize,
        layer: usize,
        expert: usize,
    ) -> KindStats {
        let mut s = KindStats {
            worst_layer: layer,
            worst_expert: expert,
            ..KindStats::default()
        };
        for (row_w, row_d) in w.chunks_exact(cols).zip(deq.chunks_exact(cols)) {
            let (mut row_err, mut row_max) = (0.0f32, 0.0f32);
            for (&a, &b) in row_w.iter().zip(row_d) {
                row_err = row_err.max((a - b).abs());
                row_max = row_max.max(a.abs());
            }
            s.max_abs_err = s.max_abs_err.max(row_err);
            s.max_abs_weight = s.max_abs_weight.max(row_max);
            if row_max > 0.0 {
                s.max_row_rel_err = s.max_row_rel_err.max(row_err / row_max);
            }
        }
        s
    }

    /// Folds `other` in; ties in `max_abs_err` keep the earlier location.
    pub fn merge(&mut self, other: &KindStats) {
        if other.max_abs_err > self.max_abs_err {
            self.max_abs_err = other.max_abs_err;
            self.worst_layer = other.worst_layer;
            self.worst_expert = other.worst_expert;
        }
        self.max_abs_weight = self.max_abs_weight.max(other.max_abs_weight);
        self.max_row_rel_err = self.max_row_rel_err.max(other.max_row_rel_err);
    }

    /// `max_abs_err / max_abs_weight` (0 for an all-zero tensor).
    pub fn rel_to_max_abs_weight(&self) -> f32 {
        if self.max_abs_weight > 0.0 {
            self.max_abs_err / self.max_abs_weight
        } else {
            0.0
        }
    }
}

/// Statistics of the three kinds over one layer (or the whole model).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrorStats {
    /// Gate projection (gate_up rows 0..f).
    pub gate: KindStats,
    /// Up projection (gate_up rows f..2f).
    pub up: KindStats,
    /// Down projection.
    pub down: KindStats,
}

impl ErrorStats {
    /// Folds `other` in, kind by kind.
    pub fn merge(&mut self, other: &ErrorStats) {
        self.gate.merge(&other.gate);
        self.up.merge(&other.up);
        self.down.merge(&other.down);
    }

    /// The kinds with their names, in report order.
    pub fn kinds(&self) -> [(&'static str, &KindStats); 3] {
        [("gate", &self.gate), ("up", &self.up), ("down", &self.down)]
    }

    /// JSON of the three kinds, with the derived relative error.
    pub fn to_json(&self) -> serde_json::Value {
        let mut map = serde_json::Map::new();
        for (name, k) in self.kinds() {
            map.insert(
                name.to_string(),
                serde_json::json!({
                    "max_abs_err": k.max_abs_err,
                    "max_abs_weight": k.max_abs_weight,
                    "rel_to_max_abs_weight": k.rel_to_max_abs_weight(),
                    "max_row_rel_err": k.max_row_rel_err,
                    "worst": { "layer": k.worst_layer, "expert": k.worst_expert },
                }),
            );
        }
        serde_json::Value::Object(map)
    }
}

/// Merges per-layer statistics (in layer order) into model-wide ones.
pub fn merge_layers(layers: &[ErrorStats]) -> ErrorStats {
    let mut all = ErrorStats::default();
    for l in layers {
        all.merge(l);
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_row_relative_error_and_merge_keeps_the_worst_location() {
        let w = [1.0, -2.0, 0.5, 0.25];
        let deq = [1.0, -1.9, 0.5, 0.5];
        let s = KindStats::of_matrix(&w, &deq, 2, 3, 7);
        assert!((s.max_abs_err - 0.25).abs() < 1e-6);
        assert_eq!(s.max_abs_weight, 2.0);
        // Row 1: error 0.25 against row max 0.5.
        assert!((s.max_row_rel_err - 0.5).abs() < 1e-6);
        let mut a = KindStats {
            max_abs_err: 0.1,
            worst_layer: 0,
            worst_expert: 1,
            ..KindStats::default()
        };
        a.merge(&s);
        assert_eq!((a.worst_layer, a.worst_expert), (3, 7));
        assert!((a.rel_to_max_abs_weight() - 0.125).abs() < 1e-6);
    }
}
