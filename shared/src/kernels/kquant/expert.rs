//! One routed expert with k-quant weights: `out = down · (silu(gate · x) ⊙ (up · x))`, the same
//! dataflow as the int8 expert (`int8::expert`) with the k-quant activation format. Every step
//! outside the integer sums is scalar code shared by all ISAs, so the output is bit-identical
//! across ISAs.

use super::{KActs, KMatrixRef, gemm_k};
use crate::kernels::int8::{Int8Isa, silu_mul_rows};

/// The buffers [`expert_forward_k`] works in, kept by the caller (one per worker thread).
#[derive(Debug, Default, Clone)]
pub struct KExpertScratch {
    x: KActs,
    h_q: KActs,
    gate_up: Vec<f32>,
    h: Vec<f32>,
}

impl KExpertScratch {
    /// Empty scratch; the first call grows it.
    pub fn new() -> KExpertScratch {
        KExpertScratch::default()
    }
}

/// One expert for `n` tokens: `gate_up` is `[2f, d]` (gate rows first), `down` `[d, f]`;
/// `x` and `out` are row-major `[n, d]`. Allocates only to grow `scratch`.
///
/// # Panics
///
/// Panics if the shapes disagree or `isa` is not available on this CPU.
pub fn expert_forward_k(
    isa: Int8Isa,
    gate_up: KMatrixRef<'_>,
    down: KMatrixRef<'_>,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    scratch: &mut KExpertScratch,
) {
    let d = gate_up.cols;
    assert!(
        gate_up.rows.is_multiple_of(2),
        "kquant expert: gate_up has an odd row count ({})",
        gate_up.rows
    );
    let f = gate_up.rows / 2;
    assert_eq!(
        (down.rows, down.cols),
        (d, f),
        "kquant expert: down is not [d = {d}, f = {f}]"
    );
    assert_eq!(x.len(), n * d, "kquant expert: input length != n · d");
    assert_eq!(out.len(), n * d, "kquant expert: output length != n · d");
    if scratch.gate_up.len() < n * 2 * f {
        scratch.gate_up.resize(n * 2 * f, 0.0);
    }
    if scratch.h.len() < n * f {
        scratch.h.resize(n * f, 0.0);
    }
    let gu = &mut scratch.gate_up[..n * 2 * f];
    let xa = scratch.x.quantize(x, n, d);
    gemm_k(isa, gate_up, xa, n, gu);
    let h = &mut scratch.h[..n * f];
    silu_mul_rows(gu, f, h);
    let ha = scratch.h_q.quantize(h, n, f);
    gemm_k(isa, down, ha, n, out);
}
