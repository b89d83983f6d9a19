//! The portable reference kernel: one plain i32 dot product per output element.
//!
//! This is what every SIMD kernel is tested against, and what runs off x86_64 or under
//! `SLUICE_KERNEL_ISA=scalar`. It reads the packed weights element by element through
//! [`MatrixRef::get`], subtracts the activation offset per element and needs no row sums: the
//! obvious code. No blocking, no unrolling; never delete it.

use super::{MatrixRef, ROW_BLOCK, Sink};

/// `Σ_c w[r][c] · (x_q[c] − 128)` over the real columns, in i32 (exact: see `MAX_COLS`).
pub(super) fn dot(m: &MatrixRef<'_>, r: usize, x_q: &[u8]) -> i32 {
    (0..m.cols)
        .map(|c| i32::from(m.get(r, c)) * (i32::from(x_q[c]) - 128))
        .sum()
}

/// Every token `t < n` against every row, handed to `sink` one 16-row block at a time. Shapes
/// are the caller's to check (`check_shapes`); out-of-range indexing panics.
pub(super) fn gemm(m: MatrixRef<'_>, x_q: &[u8], n: usize, sink: &mut Sink<'_>) {
    let pc = m.padded_cols();
    for t in 0..n {
        let x = &x_q[t * pc..][..pc];
        for r0 in (0..m.rows).step_by(ROW_BLOCK) {
            let mut acc = [0i32; ROW_BLOCK];
            for (i, a) in acc.iter_mut().enumerate().take(m.rows - r0) {
                *a = dot(&m, r0 + i, x);
            }
            sink.put(&m, t, r0, &acc);
        }
    }
}
