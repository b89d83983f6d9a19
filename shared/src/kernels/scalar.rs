//! The portable reference kernels: one obvious dot product per output element.
//!
//! This is what every SIMD kernel is tested against, and what runs off x86_64 or under
//! `SLUICE_KERNEL_ISA=scalar`. It stays simple on purpose: no blocking, no unrolling. It
//! accumulates in f64 (the product of a bf16 and an f32 is exact in f64, and the f64 sum of a
//! few thousand of them is correct to far below f32 precision), so it is the accuracy
//! reference the SIMD kernels' f32 summation is measured against. Never delete it.

use half::bf16;

/// `Σ_j w[j] · x[j]`, accumulated in f64 from left to right and rounded to f32 once.
///
/// # Panics
///
/// Panics if `w` and `x` differ in length.
pub(super) fn dot(w: &[bf16], x: &[f32]) -> f32 {
    assert_eq!(
        w.len(),
        x.len(),
        "dot: weight row and activation row differ in length"
    );
    let mut sum = 0.0f64;
    for (&wj, &xj) in w.iter().zip(x) {
        sum += f64::from(wj.to_f32()) * f64::from(xj);
    }
    sum as f32
}

/// `y[t·ldy + r] = dot(w[r·cols..][..cols], x[t·cols..][..cols])` for every row `r < rows` and
/// token `t < n`: the shared signature of every ISA's kernel (see `avx512::gemm`).
///
/// # Safety
///
/// `w.len() == rows · cols` and `x.len() == n · cols` (checked); for every `t < n` and
/// `r < rows`, `y.add(t · ldy + r)` must be valid for writes and not accessed by anyone else
/// during the call.
pub(super) unsafe fn gemm(
    w: &[bf16],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: *mut f32,
    ldy: usize,
) {
    assert_eq!(w.len(), rows * cols);
    assert_eq!(x.len(), n * cols);
    for t in 0..n {
        let x_row = &x[t * cols..][..cols];
        for r in 0..rows {
            let value = dot(&w[r * cols..][..cols], x_row);
            // SAFETY: the caller guarantees `y.add(t * ldy + r)` is writable and unshared for
            // t < n, r < rows.
            unsafe { y.add(t * ldy + r).write(value) };
        }
    }
}
