//! How a routed-expert call's per-expert outputs become its result, shared by every expert
//! backend (hostd's in-process ones and expertd) so they agree bit for bit.
//!
//! A call has `n_rows × top_k` cells (`row · top_k + slot`). Experts are computed grouped (each
//! over all its rows), their outputs scattered into per-cell slots, then each row's slots are
//! summed in slot order — so the result does not depend on grouping, waves, caching or thread
//! scheduling.

use crate::ids::ExpertId;

/// The cells of a call grouped by expert: `(expert, cells)` for every expert used, in ascending
/// expert order. `ids` is `n_rows × top_k`; every id must be `< n_experts` (validated earlier).
pub fn cells_by_expert(ids: &[u32], n_experts: usize) -> Vec<(ExpertId, Vec<usize>)> {
    let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); n_experts];
    for (cell, &e) in ids.iter().enumerate() {
        by_expert[e as usize].push(cell);
    }
    by_expert
        .into_iter()
        .enumerate()
        .filter(|(_, c)| !c.is_empty())
        .map(|(e, c)| (ExpertId::from_index(e), c))
        .collect()
}

/// The input rows one expert computes on: row `cell / top_k` of `x` (`n_rows × d`) for each of
/// its `cells`, in `cells` order (`cells.len() × d`).
pub fn gather(x: &[f32], d: usize, top_k: usize, cells: &[usize]) -> Vec<f32> {
    let mut xs = Vec::with_capacity(cells.len() * d);
    for &cell in cells {
        let r = cell / top_k;
        xs.extend_from_slice(&x[r * d..(r + 1) * d]);
    }
    xs
}

/// Copies one expert's outputs (`cells.len() × d`, in `cells` order) into their cell slots
/// (`slots` holds `n_rows × top_k × d`).
pub fn scatter(slots: &mut [f32], d: usize, cells: &[usize], y: &[f32]) {
    for (i, &cell) in cells.iter().enumerate() {
        slots[cell * d..(cell + 1) * d].copy_from_slice(&y[i * d..(i + 1) * d]);
    }
}

/// `out[r] = Σ_{s in 0..top_k} weights[r·top_k + s] · slots[r·top_k + s]`, summed in slot order.
pub fn sum_in_call_order(
    slots: &[f32],
    weights: &[f32],
    n_rows: usize,
    top_k: usize,
    d: usize,
    out: &mut [f32],
) {
    // PERF-CRITICAL: once per MoE layer call.
    out.fill(0.0);
    for r in 0..n_rows {
        let o = &mut out[r * d..(r + 1) * d];
        for s in 0..top_k {
            let w = weights[r * top_k + s];
            for (ov, yv) in o
                .iter_mut()
                .zip(&slots[(r * top_k + s) * d..(r * top_k + s + 1) * d])
            {
                *ov += w * yv;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouping_then_combining_equals_the_per_cell_sum() {
        let (n_rows, top_k, d) = (3, 2, 2);
        let ids = [4, 1, 1, 0, 4, 0];
        let weights = [0.5, 0.25, 1.0, 2.0, 0.125, 4.0];
        let groups = cells_by_expert(&ids, 5);
        assert_eq!(
            groups,
            vec![
                (ExpertId::new(0), vec![3, 5]),
                (ExpertId::new(1), vec![1, 2]),
                (ExpertId::new(4), vec![0, 4])
            ]
        );
        // Expert e's output for any row is [e, 10e].
        let mut slots = vec![0.0; n_rows * top_k * d];
        for (e, cells) in &groups {
            let y: Vec<f32> = cells
                .iter()
                .flat_map(|_| [e.get() as f32, 10.0 * e.get() as f32])
                .collect();
            scatter(&mut slots, d, cells, &y);
        }
        let mut out = vec![0.0; n_rows * d];
        sum_in_call_order(&slots, &weights, n_rows, top_k, d, &mut out);
        assert_eq!(out, vec![2.25, 22.5, 1.0, 10.0, 0.5, 5.0]);
    }
}
