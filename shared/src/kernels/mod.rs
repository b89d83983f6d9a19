//! Dense-weight kernels: bf16 weights × f32 activations with f32 accumulation, `y = W·x`.
//!
//! Owns the safe API (shape checks, ISA checks, the rayon wrappers) over one kernel per
//! instruction set: `scalar` (the reference), `avx2` and `avx512` (x86_64 only; the tiling
//! driver they share lives in `tiling`). Choosing the instruction set lives in `dispatch`; the
//! DRAM roofline probe in [`bandwidth`]; the int8 expert kernels in [`int8`]; the f32 × f32
//! attention kernels in [`vecf32`]. No IO, no logging: callers log [`Isa::selection`] once at
//! startup.
//!
//! Weights are row-major `[rows, cols]`, the `[out, in]` layout PyTorch stores linear weights
//! in; activations are row-major `[n, cols]`; outputs are row-major `[n, rows]`.
//!
//! # Determinism
//!
//! For a given [`Isa`], every output element is summed in one fixed order (documented in each
//! SIMD module), independent of how many tokens or rows are computed together. Hence, bit for
//! bit: row `t` of [`gemm_bf16`] equals [`gemv_bf16`] on token `t`, and the `par_` wrappers
//! equal the single-threaded kernels whatever the thread count. Chunked prefill and
//! token-by-token decode therefore see identical projections. Different ISAs agree only within
//! rounding (their lane counts differ), so the ISA must stay fixed for a comparison.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod bandwidth;
mod dispatch;
mod expert;
pub mod int8;
pub mod kquant;
mod scalar;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod tiling;
pub mod vecf32;

pub use dispatch::{
    ISA_ENV_VAR, Isa, IsaOverrideProblem, IsaSelection, KernelIsa, OverrideProblem, Selection,
};
pub use expert::{AnyExpertScratch, ExpertMatrices, expert_forward_any};
pub use vecf32::{
    dot_rows_f32, dot_rows_multi_f32, scale_axpy_rows_f32, scale_axpy_rows_multi_f32,
    softmax_tile_f32,
};

use half::bf16;
use rayon::prelude::*;

/// The least weight bytes one rayon task of the `par_` wrappers covers, so a task's work
/// (streaming them from DRAM takes several microseconds) dwarfs rayon's per-task overhead.
pub const PAR_MIN_TASK_WEIGHT_BYTES: usize = 64 << 10;

/// The instruction sets of `all` this CPU has, in order, skipping each one it lacks with
/// [`crate::skip::skip`] (a failure when the run declared it present): how the kernel tests and
/// benchmarks say which kernels they skip.
#[doc(hidden)]
pub fn present_or_say<I: Copy + std::fmt::Display>(
    all: impl IntoIterator<Item = I>,
    is_available: impl Fn(&I) -> bool,
) -> Vec<I> {
    all.into_iter()
        .filter(|isa| {
            let ok = is_available(isa);
            if !ok {
                let name = isa.to_string();
                crate::skip::skip(
                    crate::skip::isa_capability(&name),
                    &format!("the {name} kernels"),
                    "this CPU lacks it",
                );
            }
            ok
        })
        .collect()
}

/// `y = W·x` for one activation vector: `y[r] = Σ_j w[r·cols + j] · x[j]`, single-threaded and
/// allocation-free.
///
/// # Panics
///
/// Panics if `w.len() != rows · cols`, `x.len() != cols` or `y.len() != rows`, or if `isa` is
/// not available on this CPU ([`Isa::is_available`]; use [`Isa::active`]).
pub fn gemv_bf16(isa: Isa, w: &[bf16], rows: usize, cols: usize, x: &[f32], y: &mut [f32]) {
    check_shapes(isa, w, rows, cols, x, 1, y);
    // SAFETY: shapes and ISA availability were just checked; y is exclusively borrowed and holds
    // rows elements, so y.add(r) is writable for r < rows (ldy is irrelevant with n == 1).
    unsafe { gemm_raw(isa, w, rows, cols, x, 1, y.as_mut_ptr(), rows) };
}

/// `Y = X·Wᵀ` for `n` activation rows (prefill): `y[t·rows + r] = Σ_j w[r·cols + j] ·
/// x[t·cols + j]`, single-threaded and allocation-free. Each tile of weight rows is loaded once
/// per block of activation rows and kept in cache across blocks, not re-read per token. Row `t`
/// of `y` is bitwise equal to [`gemv_bf16`] on row `t` of `x`.
///
/// # Panics
///
/// Panics if `w.len() != rows · cols`, `x.len() != n · cols` or `y.len() != n · rows`, or if
/// `isa` is not available on this CPU.
pub fn gemm_bf16(
    isa: Isa,
    w: &[bf16],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) {
    check_shapes(isa, w, rows, cols, x, n, y);
    // SAFETY: shapes and ISA availability were just checked; y is exclusively borrowed and holds
    // n · rows elements, so y.add(t · rows + r) is writable for t < n, r < rows.
    unsafe { gemm_raw(isa, w, rows, cols, x, n, y.as_mut_ptr(), rows) };
}

/// [`gemv_bf16`] with the output rows split across the current rayon pool in tiles of at least
/// [`PAR_MIN_TASK_WEIGHT_BYTES`] of weights. Bitwise equal to [`gemv_bf16`].
///
/// # Panics
///
/// As [`gemv_bf16`].
pub fn par_gemv_bf16(isa: Isa, w: &[bf16], rows: usize, cols: usize, x: &[f32], y: &mut [f32]) {
    par_gemm_tiled(isa, w, rows, cols, x, 1, y, par_tile_rows(rows, cols));
}

/// [`gemm_bf16`] with the output rows (weight rows) split across the current rayon pool in
/// tiles of at least [`PAR_MIN_TASK_WEIGHT_BYTES`] of weights; each task computes its rows for
/// all `n` tokens. Bitwise equal to [`gemm_bf16`].
///
/// # Panics
///
/// As [`gemm_bf16`].
pub fn par_gemm_bf16(
    isa: Isa,
    w: &[bf16],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) {
    par_gemm_tiled(isa, w, rows, cols, x, n, y, par_tile_rows(rows, cols));
}

/// Rows per rayon task: enough for [`PAR_MIN_TASK_WEIGHT_BYTES`], and small enough that each
/// thread gets about four tasks to balance load; a multiple of 8 so the SIMD row tiles stay
/// whole.
fn par_tile_rows(rows: usize, cols: usize) -> usize {
    let min_rows = PAR_MIN_TASK_WEIGHT_BYTES.div_ceil(2 * cols.max(1));
    let balanced = rows.div_ceil(4 * rayon::current_num_threads());
    min_rows.max(balanced).next_multiple_of(8)
}

/// The `par_` wrappers with an explicit tile height, so tests can force many small tiles.
#[allow(clippy::too_many_arguments)]
fn par_gemm_tiled(
    isa: Isa,
    w: &[bf16],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    tile_rows: usize,
) {
    check_shapes(isa, w, rows, cols, x, n, y);
    let tile_rows = tile_rows.max(1);
    if rows <= tile_rows {
        // SAFETY: as in `gemm_bf16`.
        unsafe { gemm_raw(isa, w, rows, cols, x, n, y.as_mut_ptr(), rows) };
        return;
    }
    let out = SharedOut(y.as_mut_ptr());
    (0..rows.div_ceil(tile_rows))
        .into_par_iter()
        .for_each(|tile| {
            let r0 = tile * tile_rows;
            let r1 = rows.min(r0 + tile_rows);
            let w_tile = &w[r0 * cols..r1 * cols];
            // SAFETY: shapes and ISA were checked above. This task writes y[t · rows + r] only for
            // r in r0..r1, a range no other task shares, and t < n, all inside y, which stays
            // exclusively borrowed until `for_each` has joined every task.
            unsafe { gemm_raw(isa, w_tile, r1 - r0, cols, x, n, out.get().add(r0), rows) };
        });
}

/// The output pointer shared by the rayon tasks of [`par_gemm_tiled`], each writing its own
/// disjoint set of elements.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);

// SAFETY: the pointer is only used by `par_gemm_tiled`, whose tasks write disjoint elements of
// a slice it borrows mutably for the whole parallel section.
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// The pointer (a method, so closures capture the whole `Sync` wrapper, not the field).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Panics unless `isa` runs on this CPU and the slices match `rows`, `cols` and `n`.
fn check_shapes(isa: Isa, w: &[bf16], rows: usize, cols: usize, x: &[f32], n: usize, y: &[f32]) {
    assert!(
        isa.is_available(),
        "kernels: ISA {isa} is not available on this CPU"
    );
    let w_len = rows
        .checked_mul(cols)
        .expect("kernels: rows · cols overflows usize");
    assert_eq!(
        w.len(),
        w_len,
        "kernels: weight length != rows ({rows}) · cols ({cols})"
    );
    let x_len = n
        .checked_mul(cols)
        .expect("kernels: n · cols overflows usize");
    assert_eq!(
        x.len(),
        x_len,
        "kernels: activation length != n ({n}) · cols ({cols})"
    );
    let y_len = n
        .checked_mul(rows)
        .expect("kernels: n · rows overflows usize");
    assert_eq!(
        y.len(),
        y_len,
        "kernels: output length != n ({n}) · rows ({rows})"
    );
}

/// Dispatches to `isa`'s kernel: `y[t·ldy + r] = Σ_j w[r·cols + j] · x[t·cols + j]`.
///
/// # Safety
///
/// `isa.is_available()`; `w.len() == rows · cols`; `x.len() == n · cols`; for every `t < n`
/// and `r < rows`, `y.add(t · ldy + r)` is valid for writes and not accessed by anyone else
/// during the call.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_raw(
    isa: Isa,
    w: &[bf16],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: *mut f32,
    ldy: usize,
) {
    match isa {
        // SAFETY: the caller's contract is the scalar kernel's.
        Isa::Scalar => unsafe { scalar::gemm(w, rows, cols, x, n, y, ldy) },
        // SAFETY: the caller guarantees AVX2 + FMA and the kernel's slice and output contract.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::gemm(w, rows, cols, x, n, y, ldy) },
        // SAFETY: the caller guarantees AVX-512 F/BW/VL (+ AVX2, FMA) and the kernel's slice and
        // output contract.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { avx512::gemm(w, rows, cols, x, n, y, ldy) },
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2 | Isa::Avx512 => unreachable!("kernels: {isa} is never available off x86_64"),
    }
}
