//! W8A8 kernels for the routed experts: int8 weights (R16C4-packed, per-row scales) × int8
//! activations (per-row scales) with exact i32 accumulation, then f32 dequantisation.
//!
//! Owns the safe API (shape and ISA checks) over one kernel per instruction set: `scalar` (the
//! reference), `avx2` and `avx512_vnni` (x86_64 only; the tiling driver they share lives in
//! `tiling`). The weight layout and its types live in `pack`, the quantisation formula in
//! `quant`, the ISA choice in `dispatch` ([`Int8Isa`], honouring `SLUICE_KERNEL_ISA`), the
//! gate/up/down expert in `expert`. No IO, no logging, no threads: the caller runs experts in
//! parallel, one kernel call per thread.
//!
//! # Shapes
//!
//! A [`MatrixRef`] is `[rows, cols]` (`[out, in]`, as PyTorch stores linear weights), packed as
//! R16C4 (see [`pack_r16c4`]). Quantised activations are `n` rows of
//! [`padded_cols`]`(cols)` bytes, each byte `q + 128` ([`quantize_activations`]), with one f32
//! scale per row. Outputs are row-major `[n, rows]`.
//!
//! # Arithmetic (the bitwise contract)
//!
//! For token `t` and row `r`, with `x[c] = x_q[t][c] − 128`:
//!
//! 1. `acc[t][r] = Σ_c w[r][c] · x[c]`, an exact i32 ([`MAX_COLS`] bounds every intermediate).
//!    The scalar kernel computes exactly this sum; the SIMD kernels compute
//!    `Σ_c w[r][c] · x_q[t][c] − 128 · row_sums[r]`, the same integer.
//! 2. `y[t][r] = acc[t][r] as f32 * scales[r] * x_scales[t]`, left to right, by one shared
//!    scalar routine (`Sink::put`) whatever the ISA.
//!
//! Integer sums do not depend on order, so every ISA, every tiling, GEMV and each row of a
//! GEMM give bit-identical accumulators, hence bit-identical f32 outputs; [`expert_forward`]
//! adds only ISA-independent scalar steps (quantisation, SiLU), so its output is bit-identical
//! across ISAs too. Tokens decoded one at a time and the same tokens in a batch agree exactly.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512_vnni;
mod dispatch;
mod expert;
mod pack;
mod quant;
mod scalar;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod tiling;

pub use dispatch::{Int8Isa, Int8IsaOverrideProblem, Int8IsaSelection};
pub(crate) use expert::silu_mul_rows;
pub use expert::{ExpertScratch, expert_forward, silu_mul};
pub use pack::{
    COL_GROUP, MAX_COLS, MatrixError, MatrixRef, QuantizedMatrix, ROW_BLOCK, pack_r16c4,
    packed_index, padded_cols, padded_rows, unpack_r16c4,
};
pub use quant::{quantize_activations, quantize_weights};
pub(crate) use quant::{quantize_value, row_params};

/// `y = dequant(W · x)` for one quantised activation row:
/// `y[r] = acc[r] as f32 * m.scales[r] * x_scale` (see the module docs). Single-threaded and
/// allocation-free.
///
/// # Panics
///
/// Panics if `m`'s slices do not match its shape, `x_q.len() != padded_cols(m.cols)`,
/// `y.len() != m.rows`, or `isa` is not available on this CPU.
pub fn gemv_w8a8(isa: Int8Isa, m: MatrixRef<'_>, x_q: &[u8], x_scale: f32, y: &mut [f32]) {
    gemm_w8a8(isa, m, x_q, std::slice::from_ref(&x_scale), 1, y);
}

/// `Y = dequant(X · Wᵀ)` for `n` quantised activation rows:
/// `y[t·rows + r] = acc[t][r] as f32 * m.scales[r] * x_scales[t]`. Each 16-row weight block is
/// read from memory once per call and reused from L1 by every batch of up to 8 tokens
/// (AVX-512; 2 for AVX2). Row `t` of `y` is bitwise equal to
/// [`gemv_w8a8`] on row `t` of `x_q`, and bitwise equal across ISAs.
///
/// # Panics
///
/// Panics if `m`'s slices do not match its shape, `x_q.len() != n · padded_cols(m.cols)`,
/// `x_scales.len() != n`, `y.len() != n · m.rows`, or `isa` is not available on this CPU.
pub fn gemm_w8a8(
    isa: Int8Isa,
    m: MatrixRef<'_>,
    x_q: &[u8],
    x_scales: &[f32],
    n: usize,
    y: &mut [f32],
) {
    check_shapes(isa, &m, x_q, n);
    assert_eq!(
        x_scales.len(),
        n,
        "int8: activation scales length != n ({n})"
    );
    assert_eq!(
        y.len(),
        n * m.rows,
        "int8: output length != n ({n}) · rows ({})",
        m.rows
    );
    // SAFETY: check_shapes passed.
    unsafe { run(isa, m, x_q, n, &mut Sink::Dequant { y, x_scales }) };
}

/// The exact i32 accumulators `acc[t·rows + r] = Σ_c w[r][c] · (x_q[t][c] − 128)` that
/// [`gemm_w8a8`] dequantises; for tests and diagnostics.
///
/// # Panics
///
/// As [`gemm_w8a8`], with `acc.len() != n · m.rows` in place of the output check.
pub fn gemm_w8a8_i32(isa: Int8Isa, m: MatrixRef<'_>, x_q: &[u8], n: usize, acc: &mut [i32]) {
    check_shapes(isa, &m, x_q, n);
    assert_eq!(
        acc.len(),
        n * m.rows,
        "int8: accumulator length != n ({n}) · rows ({})",
        m.rows
    );
    // SAFETY: check_shapes passed.
    unsafe { run(isa, m, x_q, n, &mut Sink::Acc(acc)) };
}

/// Panics unless `isa` runs here, `m` is well-formed and `x_q` holds `n` padded rows.
fn check_shapes(isa: Int8Isa, m: &MatrixRef<'_>, x_q: &[u8], n: usize) {
    assert!(
        isa.is_available(),
        "int8: ISA {isa} is not available on this CPU"
    );
    m.assert_shape();
    let x_len = n
        .checked_mul(m.padded_cols())
        .expect("int8: n · padded cols overflows usize");
    assert_eq!(
        x_q.len(),
        x_len,
        "int8: quantised activation length != n ({n}) · padded cols ({})",
        m.padded_cols()
    );
}

/// Dispatches to `isa`'s kernel.
///
/// # Safety
///
/// `check_shapes(isa, &m, x_q, n)` passed: `isa` is available, `m` is well-formed and `x_q`
/// holds `n` padded rows.
unsafe fn run(isa: Int8Isa, m: MatrixRef<'_>, x_q: &[u8], n: usize, sink: &mut Sink<'_>) {
    match isa {
        Int8Isa::Scalar => scalar::gemm(m, x_q, n, sink),
        // SAFETY: the caller guarantees AVX2 and the kernel's shapes.
        #[cfg(target_arch = "x86_64")]
        Int8Isa::Avx2 => unsafe { avx2::gemm(m, x_q, n, sink) },
        // SAFETY: the caller guarantees AVX-512 F/BW/VNNI and the kernel's shapes.
        #[cfg(target_arch = "x86_64")]
        Int8Isa::Avx512Vnni => unsafe { avx512_vnni::gemm(m, x_q, n, sink) },
        #[cfg(not(target_arch = "x86_64"))]
        Int8Isa::Avx2 | Int8Isa::Avx512Vnni => {
            unreachable!("int8: {isa} is never available off x86_64")
        }
    }
}

/// Where a kernel hands each finished block of accumulators. Every kernel calls
/// [`Sink::put`] exactly once per token and 16-row block; the dequantisation lives here, once,
/// so it is the same scalar code for every ISA.
enum Sink<'a> {
    /// Raw accumulators, `[n, rows]`.
    Acc(&'a mut [i32]),
    /// `y[t·rows + r] = acc as f32 * scales[r] * x_scales[t]`, `[n, rows]`.
    Dequant {
        /// The output.
        y: &'a mut [f32],
        /// One scale per token.
        x_scales: &'a [f32],
    },
}

impl Sink<'_> {
    /// Stores token `t`'s accumulators for rows `r0..r0 + 16` (those below `m.rows`).
    #[inline]
    fn put(&mut self, m: &MatrixRef<'_>, t: usize, r0: usize, acc: &[i32; ROW_BLOCK]) {
        let len = ROW_BLOCK.min(m.rows - r0);
        let at = t * m.rows + r0;
        match self {
            Sink::Acc(out) => out[at..at + len].copy_from_slice(&acc[..len]),
            Sink::Dequant { y, x_scales } => {
                let sx = x_scales[t];
                let scales = &m.scales[r0..r0 + len];
                for ((yv, &a), &sw) in y[at..at + len].iter_mut().zip(acc).zip(scales) {
                    *yv = a as f32 * sw * sx;
                }
            }
        }
    }
}
