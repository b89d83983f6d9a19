//! The one executor of a routed-expert call, shared by hostd's in-process INT8 backend and
//! expertd: validate the routing, group the call's cells by expert, gather each expert's input
//! rows, run the expert kernel of the weights' format, scatter the outputs into per-cell slots and sum each row's
//! slots in call order ([`crate::moe_combine`]).
//!
//! Where the weights come from is the caller's business (a memory-mapped container, a cache
//! lease): [`MoeExec::compute`] takes a closure that views one expert's matrices. A caller may
//! compute the experts in any subsets and any order (waves, hits before misses, each miss as
//! its read lands); the result is the same bit for bit, because every expert's output row is
//! produced by the same single-threaded kernel and the final sum runs in call order.

use crate::ids::ExpertId;
pub use crate::kernels::ExpertMatrices;
use crate::kernels::int8::Int8Isa;
use crate::kernels::{AnyExpertScratch, expert_forward_any};
use crate::moe_combine;
use rayon::prelude::*;

/// Checks a call's routing: `1 ≤ top_k ≤ n_experts`, `ids` and `weights` both `n_rows × top_k`,
/// every id `< n_experts` and not repeated within its row, every weight finite. Returns the
/// reason for the first violation. Layer, row-count and activation-length checks are the
/// caller's (they differ by boundary).
pub fn validate_routing(
    n_rows: usize,
    top_k: usize,
    ids: &[u32],
    weights: &[f32],
    n_experts: usize,
) -> Result<(), String> {
    if top_k == 0 || top_k > n_experts {
        return Err(format!(
            "top_k {top_k} must be in 1..={n_experts} (experts per layer)"
        ));
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
                return Err(format!(
                    "row {r}: expert {e} out of range (layer has {n_experts} experts)"
                ));
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

/// The first non-finite value of the activations `x` (rows of `d` values), as
/// `(row, column, value)`, or `None` when every value is finite. The W8A8 kernel quantises a
/// row by its largest |x|: a NaN or an infinity would turn the whole row into finite garbage,
/// so a boundary refuses such a call instead (naming the row).
///
/// One read of `x`, branch-free within a row so it vectorises (an OR of `!is_finite`, i.e.
/// `|v| < inf` compares, over the row: ~4× faster on baseline x86-64 than an integer max of
/// the exponent bits, which SSE2 cannot vectorise); only a row that fails is searched again
/// for the column.
pub fn first_non_finite(x: &[f32], d: usize) -> Option<(usize, usize, f32)> {
    // PERF-CRITICAL: once per expert call, over all its rows.
    if d == 0 {
        return None;
    }
    for (r, row) in x.chunks_exact(d).enumerate() {
        if row.iter().fold(false, |bad, v| bad | !v.is_finite()) {
            let c = row.iter().position(|v| !v.is_finite()).unwrap_or(0);
            return Some((r, c, row[c]));
        }
    }
    None
}

/// One call in progress: its inputs, its experts grouped, and the per-cell output slots.
pub struct MoeExec<'a> {
    x: &'a [f32],
    weights: &'a [f32],
    n_rows: usize,
    top_k: usize,
    d: usize,
    groups: Vec<(ExpertId, Vec<usize>)>,
    slots: Vec<f32>,
}

impl<'a> MoeExec<'a> {
    /// A call of `n_rows` rows of `d` values (`x`), routed by `ids` / `weights`
    /// (`n_rows × top_k`, already validated with [`validate_routing`]).
    pub fn new(
        x: &'a [f32],
        ids: &[u32],
        weights: &'a [f32],
        n_rows: usize,
        top_k: usize,
        d: usize,
        n_experts: usize,
    ) -> MoeExec<'a> {
        assert_eq!(x.len(), n_rows * d);
        MoeExec {
            x,
            weights,
            n_rows,
            top_k,
            d,
            groups: moe_combine::cells_by_expert(ids, n_experts),
            slots: vec![0.0; n_rows * top_k * d],
        }
    }

    /// The experts the call uses, ascending, each with its cells (`row · top_k + slot`).
    pub fn groups(&self) -> &[(ExpertId, Vec<usize>)] {
        &self.groups
    }

    /// Computes the experts `which` (indices into [`groups`](Self::groups)) in parallel on the
    /// current rayon pool; `matrices(g, expert)` views group `g`'s weights. Stops at the first
    /// error (slots already written stay written; the call is then abandoned by the caller).
    pub fn compute<'w, E, F>(&mut self, isa: Int8Isa, which: &[usize], matrices: F) -> Result<(), E>
    where
        E: Send,
        F: Fn(usize, ExpertId) -> Result<ExpertMatrices<'w>, E> + Sync,
    {
        // PERF-CRITICAL: every expert of every MoE call.
        let (x, d, k, groups) = (self.x, self.d, self.top_k, &self.groups);
        let run = |scratch: &mut AnyExpertScratch, g: usize| -> Result<(usize, Vec<f32>), E> {
            let (e, cells) = &groups[g];
            let m = matrices(g, *e)?;
            let xs = moe_combine::gather(x, d, k, cells);
            let mut y = vec![0.0f32; cells.len() * d];
            expert_forward_any(isa, m, &xs, cells.len(), &mut y, scratch);
            Ok((g, y))
        };
        if which.len() == 1 {
            // One expert: no fork/join (the kernel itself is single-threaded).
            let (g, y) = run(&mut AnyExpertScratch::new(), which[0])?;
            moe_combine::scatter(&mut self.slots, d, &groups[g].1, &y);
            return Ok(());
        }
        // Each expert's outputs go to their slots as soon as it is done, so at most one
        // expert's buffers per thread are alive at once (not every expert's of the wave): the
        // bound a daemon admits calls against. Each cell has one expert, so the order of the
        // scatters changes no value.
        let slots = std::sync::Mutex::new(&mut self.slots);
        which
            .par_iter()
            .map_init(AnyExpertScratch::new, |s, &g| run(s, g))
            .try_for_each(|r| {
                let (g, y) = r?;
                let mut slots = slots
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                moe_combine::scatter(&mut slots, d, &groups[g].1, &y);
                Ok(())
            })
    }

    /// Writes `out[r] = Σ_k weights[r,k] · y[r,k]`, summed in call order. Every group must
    /// have been computed.
    pub fn finish(self, out: &mut [f32]) {
        moe_combine::sum_in_call_order(
            &self.slots,
            self.weights,
            self.n_rows,
            self.top_k,
            self.d,
            out,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_checks_name_the_problem() {
        assert!(validate_routing(1, 2, &[0, 1], &[0.5, 0.5], 4).is_ok());
        assert!(
            validate_routing(1, 2, &[0, 0], &[0.5, 0.5], 4)
                .unwrap_err()
                .contains("chosen twice")
        );
        assert!(
            validate_routing(1, 2, &[0, 4], &[0.5, 0.5], 4)
                .unwrap_err()
                .contains("out of range")
        );
        assert!(
            validate_routing(1, 2, &[0, 1], &[0.5, f32::NAN], 4)
                .unwrap_err()
                .contains("not finite")
        );
        assert!(
            validate_routing(2, 2, &[0, 1], &[0.5, 0.5], 4)
                .unwrap_err()
                .contains("n_tokens × top_k")
        );
        assert!(
            validate_routing(1, 0, &[], &[], 4)
                .unwrap_err()
                .contains("top_k")
        );
        assert!(
            validate_routing(1, 5, &[0, 1, 2, 3, 4], &[0.0; 5], 4)
                .unwrap_err()
                .contains("top_k")
        );
        assert!(validate_routing(usize::MAX, 2, &[0, 1], &[0.5, 0.5], 4).is_err());
    }

    #[test]
    fn non_finite_activations_are_found_with_their_row_and_column() {
        let mut x: Vec<f32> = (0..5 * 7).map(|i| (i as f32 * 0.3).sin() * 1e30).collect();
        x.push(f32::MAX);
        x.push(-f32::MAX);
        x.extend([f32::MIN_POSITIVE, -0.0, 1e-45, 0.0, 3.0]);
        assert_eq!(
            first_non_finite(&x, 6),
            None,
            "large, tiny, subnormal and signed-zero values are finite"
        );
        for bad in [
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::from_bits(0x7f80_0001),
        ] {
            let mut y = x.clone();
            y[3 * 6 + 4] = bad;
            y[5 * 6 + 1] = f32::NAN;
            let (r, c, v) = first_non_finite(&y, 6).expect("found");
            assert_eq!((r, c), (3, 4), "{bad}");
            assert_eq!(v.to_bits(), bad.to_bits());
        }
        assert_eq!(first_non_finite(&[], 6), None);
        assert_eq!(
            first_non_finite(&[f32::NAN], 0),
            None,
            "no rows of zero width"
        );
    }

    /// The cost of the check at the real hidden size (2048), printed for
    /// `docs/results/reliability/expertd.md`: `cargo test --release -p shared --lib
    /// non_finite_check_cost -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, not a check"]
    fn non_finite_check_cost() {
        let d = 2048;
        for rows in [1usize, 8, 64, 512] {
            let x: Vec<f32> = (0..rows * d).map(|i| (i as f32 * 0.37).sin()).collect();
            let iters = (4096 / rows).max(20);
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t = std::time::Instant::now();
                for _ in 0..iters {
                    assert!(first_non_finite(std::hint::black_box(&x), d).is_none());
                }
                best = best.min(t.elapsed().as_secs_f64() / iters as f64);
            }
            let gbs = (rows * d * 4) as f64 / best / 1e9;
            println!(
                "non-finite check: {rows:>4} rows x {d}: {:>9.2} us per call ({gbs:.1} GB/s, activations cache-warm)",
                best * 1e6
            );
        }
    }
}
