//! The portable f32 vector kernels: the reference for the SIMD ones and what runs off x86_64.
//!
//! The dot product keeps 16 independent partial sums (lane `j mod 16` for the whole 16-wide
//! chunks), combines them by a fixed halving tree and then adds the tail in order, so LLVM can
//! keep the lanes in vector registers (SSE, NEON) while the order stays fixed. The weighted sum
//! is element-wise, so it vectorises as written.

/// Independent partial sums of the dot product.
const LANES: usize = 16;

/// See `super::dot_rows_f32`; shapes were checked by the caller.
pub(super) fn dot_rows(x: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = dot(x, &rows[i * stride..][..x.len()]);
    }
}

/// `Σ a[j]·b[j]` in the fixed order of the module docs (`super::dot_f32`).
#[inline]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            acc[l] += acc[l + width];
        }
        width /= 2;
    }
    let mut sum = acc[0];
    for (x, y) in ta.iter().zip(tb) {
        sum += x * y;
    }
    sum
}

/// See `super::scale_axpy_rows_f32`; shapes were checked by the caller.
pub(super) fn scale_axpy_rows(acc: &mut [f32], acc_scale: f32, w: &[f32], rows: &[f32], stride: usize) {
    for a in acc.iter_mut() {
        *a *= acc_scale;
    }
    let len = acc.len();
    for (i, &wi) in w.iter().enumerate() {
        for (a, r) in acc.iter_mut().zip(&rows[i * stride..][..len]) {
            *a += wi * r;
        }
    }
}
