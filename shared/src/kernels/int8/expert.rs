//! One routed expert in W8A8: `out = down · (silu(gate · x) ⊙ (up · x))`.
//!
//! Owns the expert's dataflow and its scratch buffers; the matrix kernels are `mod.rs`'s.
//! Every step outside the integer GEMMs (activation quantisation, SiLU and the product, the
//! dequantisation) is one scalar routine shared by all ISAs, so with bit-identical
//! accumulators the expert's output is bit-identical across ISAs.

use super::{Int8Isa, MatrixRef, gemm_w8a8, padded_cols, quantize_activations};

/// The buffers [`expert_forward`] works in, kept by the caller (one per worker thread) so the
/// hot path does not allocate once they have grown to the largest `n` seen.
#[derive(Debug, Default, Clone)]
pub struct ExpertScratch {
    x_q: Vec<u8>,
    x_scales: Vec<f32>,
    gate_up: Vec<f32>,
    h: Vec<f32>,
    h_q: Vec<u8>,
    h_scales: Vec<f32>,
}

/// Mutable views of the scratch buffers for one call.
struct Buffers<'a> {
    x_q: &'a mut [u8],
    x_scales: &'a mut [f32],
    gate_up: &'a mut [f32],
    h: &'a mut [f32],
    h_q: &'a mut [u8],
    h_scales: &'a mut [f32],
}

impl ExpertScratch {
    /// Empty scratch; the first call of [`expert_forward`] grows it.
    pub fn new() -> ExpertScratch {
        ExpertScratch::default()
    }

    /// Scratch already large enough for `n` tokens through an expert with hidden size `d` and
    /// intermediate size `f`, so not even the first call allocates.
    pub fn with_capacity(n: usize, d: usize, f: usize) -> ExpertScratch {
        let mut s = ExpertScratch::default();
        s.buffers(n, d, f);
        s
    }

    /// The buffers' capacities, for the no-growth test.
    #[cfg(test)]
    pub(super) fn capacities(&self) -> [usize; 6] {
        [
            self.x_q.capacity(),
            self.x_scales.capacity(),
            self.gate_up.capacity(),
            self.h.capacity(),
            self.h_q.capacity(),
            self.h_scales.capacity(),
        ]
    }

    /// Grows the buffers as needed (never shrinks) and hands out views of the sizes needed.
    fn buffers(&mut self, n: usize, d: usize, f: usize) -> Buffers<'_> {
        fn take<T: Copy + Default>(v: &mut Vec<T>, len: usize) -> &mut [T] {
            if v.len() < len {
                v.resize(len, T::default());
            }
            &mut v[..len]
        }
        Buffers {
            x_q: take(&mut self.x_q, n * padded_cols(d)),
            x_scales: take(&mut self.x_scales, n),
            gate_up: take(&mut self.gate_up, n * 2 * f),
            h: take(&mut self.h, n * f),
            h_q: take(&mut self.h_q, n * padded_cols(f)),
            h_scales: take(&mut self.h_scales, n),
        }
    }
}

/// `silu(g) · u` with `silu(g) = g / (1 + exp(−g))`, evaluated as written: the one
/// implementation every ISA's expert uses.
#[inline]
pub fn silu_mul(g: f32, u: f32) -> f32 {
    g / (1.0 + (-g).exp()) * u
}

/// `h[t][i] = silu_mul(gate_up[t][i], gate_up[t][f + i])` for every row `t` of `gate_up`
/// (`[n, 2f]`, gate then up) into `h` (`[n, f]`): the step between the two projections of
/// every expert, whatever its weight format.
pub(crate) fn silu_mul_rows(gate_up: &[f32], f: usize, h: &mut [f32]) {
    if f > 0 {
        for (h_row, gu_row) in h.chunks_exact_mut(f).zip(gate_up.chunks_exact(2 * f)) {
            let (g, u) = gu_row.split_at(f);
            for ((hv, &gv), &uv) in h_row.iter_mut().zip(g).zip(u) {
                *hv = silu_mul(gv, uv);
            }
        }
    }
}

/// One expert for `n` tokens: quantise each row of `x` ([`quantize_activations`]), compute
/// `[g | u] = gate_up · x` ([`gemm_w8a8`]), `h = silu_mul(g, u)` per element, quantise each
/// row of `h`, and `out = down · h`. Single-threaded; allocates only to grow `scratch`.
///
/// `gate_up` is `[2f, d]` with the `f` gate rows first, `down` is `[d, f]`; `x` and `out` are
/// row-major `[n, d]`. The result is bitwise identical for every ISA, and row `t` does not
/// depend on the other rows.
///
/// # Panics
///
/// Panics if the shapes disagree (`gate_up.rows` odd, `down` not `[d, f]`, `x.len()` or
/// `out.len()` not `n · d`), a matrix's slices do not match its shape, or `isa` is not
/// available on this CPU.
pub fn expert_forward(
    isa: Int8Isa,
    gate_up: MatrixRef<'_>,
    down: MatrixRef<'_>,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    scratch: &mut ExpertScratch,
) {
    let d = gate_up.cols;
    assert!(
        gate_up.rows.is_multiple_of(2),
        "int8 expert: gate_up has an odd row count ({})",
        gate_up.rows
    );
    let f = gate_up.rows / 2;
    assert_eq!(
        (down.rows, down.cols),
        (d, f),
        "int8 expert: down is not [d = {d}, f = {f}]"
    );
    assert_eq!(
        x.len(),
        n * d,
        "int8 expert: input length != n ({n}) · d ({d})"
    );
    assert_eq!(
        out.len(),
        n * d,
        "int8 expert: output length != n ({n}) · d ({d})"
    );
    let b = scratch.buffers(n, d, f);
    quantize_activations(x, n, d, b.x_q, b.x_scales);
    gemm_w8a8(isa, gate_up, b.x_q, b.x_scales, n, b.gate_up);
    silu_mul_rows(b.gate_up, f, b.h);
    quantize_activations(b.h, n, f, b.h_q, b.h_scales);
    gemm_w8a8(isa, down, b.h_q, b.h_scales, n, out);
}
