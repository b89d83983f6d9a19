//! The one executor of a routed-expert call, shared by hostd's in-process INT8 backend and
//! expertd: validate the routing, group the call's cells by expert, gather each expert's input
//! rows, run the W8A8 expert kernel, scatter the outputs into per-cell slots and sum each row's
//! slots in call order ([`crate::moe_combine`]).
//!
//! Where the weights come from is the caller's business (a memory-mapped container, a cache
//! lease): [`MoeExec::compute`] takes a closure that views one expert's matrices. A caller may
//! compute the experts in any subsets and any order (waves, hits before misses, each miss as
//! its read lands); the result is the same bit for bit, because every expert's output row is
//! produced by the same single-threaded kernel and the final sum runs in call order.

use crate::kernels::int8::{ExpertScratch, Int8Isa, MatrixRef, expert_forward};
use crate::moe_combine;
use rayon::prelude::*;

/// One expert's two matrices, as the kernel consumes them.
#[derive(Debug, Clone, Copy)]
pub struct ExpertMatrices<'a> {
    /// Fused gate and up projection.
    pub gate_up: MatrixRef<'a>,
    /// Down projection.
    pub down: MatrixRef<'a>,
}

/// Checks a call's routing: `1 ≤ top_k ≤ n_experts`, `ids` and `weights` both `n_rows × top_k`,
/// every id `< n_experts` and not repeated within its row, every weight finite. Returns the
/// reason for the first violation. Layer, row-count and activation-length checks are the
/// caller's (they differ by boundary).
pub fn validate_routing(n_rows: usize, top_k: usize, ids: &[u32], weights: &[f32], n_experts: usize) -> Result<(), String> {
    if top_k == 0 || top_k > n_experts {
        return Err(format!("top_k {top_k} must be in 1..={n_experts} (experts per layer)"));
    }
    let cells = n_rows.checked_mul(top_k);
    if cells != Some(ids.len()) || cells != Some(weights.len()) {
        return Err(format!(
            "expert_ids ({}) and weights ({}) must both hold n_tokens × top_k = {n_rows} × {top_k} entries",
            ids.len(),
            weights.len()
        ));
    }
    for (r, row) in ids.chunks_exact(top_k).enumerate() {
        for (i, &e) in row.iter().enumerate() {
            if e as usize >= n_experts {
                return Err(format!("row {r}: expert {e} out of range (layer has {n_experts} experts)"));
            }
            if row[..i].contains(&e) {
                return Err(format!("row {r}: expert {e} chosen twice"));
            }
        }
    }
    if let Some((i, w)) = weights.iter().enumerate().find(|(_, w)| !w.is_finite()) {
        return Err(format!("weight {i} (row {}) is not finite: {w}", i / top_k));
    }
    Ok(())
}

/// One call in progress: its inputs, its experts grouped, and the per-cell output slots.
pub struct MoeExec<'a> {
    x: &'a [f32],
    weights: &'a [f32],
    n_rows: usize,
    top_k: usize,
    d: usize,
    groups: Vec<(u32, Vec<usize>)>,
    slots: Vec<f32>,
}

impl<'a> MoeExec<'a> {
    /// A call of `n_rows` rows of `d` values (`x`), routed by `ids` / `weights`
    /// (`n_rows × top_k`, already validated with [`validate_routing`]).
    pub fn new(x: &'a [f32], ids: &[u32], weights: &'a [f32], n_rows: usize, top_k: usize, d: usize, n_experts: usize) -> MoeExec<'a> {
        assert_eq!(x.len(), n_rows * d);
        MoeExec { x, weights, n_rows, top_k, d, groups: moe_combine::cells_by_expert(ids, n_experts), slots: vec![0.0; n_rows * top_k * d] }
    }

    /// The experts the call uses, ascending, each with its cells (`row · top_k + slot`).
    pub fn groups(&self) -> &[(u32, Vec<usize>)] {
        &self.groups
    }

    /// Computes the experts `which` (indices into [`groups`](Self::groups)) in parallel on the
    /// current rayon pool; `matrices(g, expert)` views group `g`'s weights. Stops at the first
    /// error (slots already written stay written; the call is then abandoned by the caller).
    pub fn compute<'w, E, F>(&mut self, isa: Int8Isa, which: &[usize], matrices: F) -> Result<(), E>
    where
        E: Send,
        F: Fn(usize, u32) -> Result<ExpertMatrices<'w>, E> + Sync,
    {
        // PERF-CRITICAL: every expert of every MoE call.
        let (x, d, k, groups) = (self.x, self.d, self.top_k, &self.groups);
        let run = |scratch: &mut ExpertScratch, g: usize| -> Result<(usize, Vec<f32>), E> {
            let (e, cells) = &groups[g];
            let m = matrices(g, *e)?;
            let xs = moe_combine::gather(x, d, k, cells);
            let mut y = vec![0.0f32; cells.len() * d];
            expert_forward(isa, m.gate_up, m.down, &xs, cells.len(), &mut y, scratch);
            Ok((g, y))
        };
        let results: Vec<(usize, Vec<f32>)> = if which.len() == 1 {
            // One expert: no fork/join (the kernel itself is single-threaded).
            vec![run(&mut ExpertScratch::new(), which[0])?]
        } else {
            which.par_iter().map_init(ExpertScratch::new, |s, &g| run(s, g)).collect::<Result<_, E>>()?
        };
        for (g, y) in results {
            moe_combine::scatter(&mut self.slots, d, &groups[g].1, &y);
        }
        Ok(())
    }

    /// Writes `out[r] = Σ_k weights[r,k] · y[r,k]`, summed in call order. Every group must
    /// have been computed.
    pub fn finish(self, out: &mut [f32]) {
        moe_combine::sum_in_call_order(&self.slots, self.weights, self.n_rows, self.top_k, self.d, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_checks_name_the_problem() {
        assert!(validate_routing(1, 2, &[0, 1], &[0.5, 0.5], 4).is_ok());
        assert!(validate_routing(1, 2, &[0, 0], &[0.5, 0.5], 4).unwrap_err().contains("chosen twice"));
        assert!(validate_routing(1, 2, &[0, 4], &[0.5, 0.5], 4).unwrap_err().contains("out of range"));
        assert!(validate_routing(1, 2, &[0, 1], &[0.5, f32::NAN], 4).unwrap_err().contains("not finite"));
        assert!(validate_routing(2, 2, &[0, 1], &[0.5, 0.5], 4).unwrap_err().contains("n_tokens × top_k"));
        assert!(validate_routing(1, 0, &[], &[], 4).unwrap_err().contains("top_k"));
        assert!(validate_routing(1, 5, &[0, 1, 2, 3, 4], &[0.0; 5], 4).unwrap_err().contains("top_k"));
        assert!(validate_routing(usize::MAX, 2, &[0, 1], &[0.5, 0.5], 4).is_err());
    }
}
