//! How often each layer routes to each expert (`GET /v1/live`'s heat map): one relaxed atomic
//! add per chosen expert per row, counted for every forward pass of the served model.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Routing counts, `layers × experts`, cumulative since load.
#[derive(Debug)]
pub struct RoutingHeat {
    n_experts: usize,
    counts: Vec<AtomicU64>,
}

impl RoutingHeat {
    /// All zero, for `n_layers` layers of `n_experts` experts.
    pub fn new(n_layers: usize, n_experts: usize) -> RoutingHeat {
        RoutingHeat {
            n_experts,
            counts: (0..n_layers * n_experts)
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    /// Counts each of `ids` (experts chosen by `layer`'s router, any number of rows).
    pub fn record(&self, layer: usize, ids: &[u32]) {
        let base = layer * self.n_experts;
        for &e in ids {
            if let Some(c) = self
                .counts
                .get(base + e as usize)
                .filter(|_| (e as usize) < self.n_experts)
            {
                c.fetch_add(1, Relaxed);
            }
        }
    }

    /// Experts per layer.
    pub fn n_experts(&self) -> usize {
        self.n_experts
    }

    /// Layers.
    pub fn n_layers(&self) -> usize {
        self.counts.len().checked_div(self.n_experts).unwrap_or(0)
    }

    /// The counts now, layer-major.
    pub fn snapshot(&self) -> Vec<u64> {
        self.counts.iter().map(|c| c.load(Relaxed)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_land_in_their_layer_and_expert() {
        let h = RoutingHeat::new(2, 4);
        h.record(0, &[1, 3, 1]);
        h.record(1, &[0, 9]);
        h.record(5, &[0]);
        assert_eq!(h.snapshot(), vec![0, 2, 0, 1, 1, 0, 0, 0]);
        assert_eq!((h.n_layers(), h.n_experts()), (2, 4));
    }
}
