//! The attention core as it was before tiling, kept as the reference the tiled kernel is tested
//! and benchmarked against: one task per (token, q head), a full `visible`-long score vector,
//! softmax, then the weighted sum of values. Not used by the model.

use super::Heads;
use crate::model::ops;
use rayon::prelude::*;

/// Same contract as [`super::causal_attention`], returning the `[n][nq][dh]` output.
#[allow(clippy::too_many_arguments)]
pub fn naive(
    heads: Heads,
    q: &[f32],
    n: usize,
    start: usize,
    k: &[f32],
    v: &[f32],
    scale: f32,
) -> Vec<f32> {
    let Heads { nq, nkv, dh } = heads;
    let mut o = vec![0.0f32; n * nq * dh];
    o.par_chunks_mut(dh).enumerate().for_each(|(idx, out)| {
        let (t, h) = (idx / nq, idx % nq);
        let g = h / (nq / nkv);
        let qv = &q[idx * dh..(idx + 1) * dh];
        let visible = start + t + 1;
        let mut scores: Vec<f32> = (0..visible)
            .map(|tau| ops::dot(qv, &k[(tau * nkv + g) * dh..(tau * nkv + g + 1) * dh]) * scale)
            .collect();
        ops::softmax(&mut scores);
        for (tau, s) in scores.iter().enumerate() {
            let vv = &v[(tau * nkv + g) * dh..(tau * nkv + g + 1) * dh];
            for (acc, x) in out.iter_mut().zip(vv) {
                *acc += s * x;
            }
        }
    });
    o
}
