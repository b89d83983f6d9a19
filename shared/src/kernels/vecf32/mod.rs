//! f32 × f32 vector kernels for attention over the KV cache: the dot products of one query
//! against a run of key rows ([`dot_rows_f32`]) and the probability-weighted sum of a run of
//! value rows into an accumulator ([`scale_axpy_rows_f32`]); both for several query vectors or
//! accumulators sharing the rows ([`dot_rows_multi_f32`], [`scale_axpy_rows_multi_f32`]); one
//! tile of the online softmax ([`softmax_tile_f32`]); and the scalar kernel's single dot product
//! ([`dot_f32`]), for callers that need one ISA-independent order.
//!
//! Owns the safe API (shape and ISA checks) over one kernel per instruction set: `scalar` (the
//! portable reference, written so LLVM vectorises it, NEON included), `avx2` and `avx512`
//! (x86_64). The AVX-512 weighted sum gives the AVX2 one's bits (both are one FMA per element
//! and row); the dot products differ in the last bits between ISAs (their lane counts differ).
//!
//! Rows are strided: row `i` starts at `rows[i · stride]`, so the keys or values of one KV head
//! are read straight out of a `[position][kv head][head_dim]` cache.
//!
//! # Determinism
//!
//! For a given [`Isa`], every output element is computed by one fixed sequence of operations
//! that depends only on the vector length, never on how many rows one call covers or where
//! the call starts: `dot_rows_f32(x, rows)[i]` equals `dot_rows_f32(x, row i alone)[0]`, and
//! an element of the accumulator gets `acc·scale` then one multiply-add per row in row order.
//! The multi-vector kernels give each vector exactly those bits, whatever the other vectors.
//! The attention kernel builds its own bitwise contract on this.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod scalar;
#[cfg(test)]
mod tests;

use super::Isa;

/// `out[i] = Σ_j x[j] · rows[i·stride + j]` for `i < out.len()`, `j < x.len()`.
///
/// # Panics
///
/// Panics if `stride < x.len()` with more than one row, if `rows` is too short for
/// `out.len()` rows, or if `isa` is not available on this CPU.
pub fn dot_rows_f32(isa: Isa, x: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
    check_rows(isa, x.len(), rows, stride, out.len());
    match isa {
        Isa::Scalar => scalar::dot_rows(x, rows, stride, out),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the ISA (AVX2 + FMA) is available and the shapes were checked: every row
        // i < out.len() has x.len() readable elements at i · stride.
        Isa::Avx2 => unsafe { avx2::dot_rows(x, rows, stride, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for AVX-512.
        Isa::Avx512 => unsafe { avx512::dot_rows(x, rows, stride, out) },
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2 | Isa::Avx512 => unreachable!("kernels: {isa} is never available off x86_64"),
    }
}

/// `acc[j] = acc[j] · acc_scale`, then `acc[j] += w[i] · rows[i·stride + j]` for `i` in
/// increasing order, for every `j < acc.len()`.
///
/// # Panics
///
/// Panics if `stride < acc.len()` with more than one row, if `rows` is too short for
/// `w.len()` rows, or if `isa` is not available on this CPU.
pub fn scale_axpy_rows_f32(
    isa: Isa,
    acc: &mut [f32],
    acc_scale: f32,
    w: &[f32],
    rows: &[f32],
    stride: usize,
) {
    check_rows(isa, acc.len(), rows, stride, w.len());
    if w.is_empty() {
        // No rows: only the scale (one multiply per element, the same bits on every ISA). The
        // SIMD kernels require at least one row (`rows` is not checked without one).
        acc.iter_mut().for_each(|a| *a *= acc_scale);
        return;
    }
    match isa {
        Isa::Scalar => scalar::scale_axpy_rows(acc, acc_scale, w, rows, stride),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `dot_rows_f32`: ISA available, every row i < w.len() has acc.len()
        // readable elements at i · stride.
        Isa::Avx2 => unsafe { avx2::scale_axpy_rows(acc, acc_scale, w, rows, stride) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for AVX-512.
        Isa::Avx512 => unsafe { avx512::scale_axpy_rows(acc, acc_scale, w, rows, stride) },
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2 | Isa::Avx512 => unreachable!("kernels: {isa} is never available off x86_64"),
    }
}

/// [`dot_rows_f32`] for several query vectors against the same rows: `xs` holds
/// `nx = out.len() / n` vectors of `len`, one after another, and `out[x·n + i]` is the dot
/// product of vector `x` with row `i`, the same bits as [`dot_rows_f32`] gives for that vector
/// (the AVX-512 kernel computes 8 vectors × 2 rows per register tile so each row load feeds 8 FMAs;
/// the others run [`dot_rows_f32`] per vector).
///
/// # Panics
///
/// As [`dot_rows_f32`], and if `out.len()` is not a multiple of `n` or `xs.len() != nx · len`.
pub fn dot_rows_multi_f32(
    isa: Isa,
    len: usize,
    xs: &[f32],
    rows: &[f32],
    stride: usize,
    out: &mut [f32],
    n: usize,
) {
    check_rows(isa, len, rows, stride, n);
    if n == 0 {
        return;
    }
    assert!(
        out.len().is_multiple_of(n) && xs.len() == out.len() / n * len,
        "kernels: {} query floats of {len} for {} outputs of {n} rows",
        xs.len(),
        out.len()
    );
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the ISA and the shapes were checked above.
        Isa::Avx512 => unsafe { avx512::dot_rows_multi(len, xs, rows, stride, out, n) },
        _ => {
            for (x, o) in out.chunks_exact_mut(n).enumerate() {
                dot_rows_f32(isa, &xs[x * len..][..len], rows, stride, o);
            }
        }
    }
}

/// [`scale_axpy_rows_f32`] for several accumulators over the same rows: `acc` holds
/// `nx = scales.len()` accumulators of `len = acc.len() / nx`, `w` their weights (`n = w.len() /
/// nx` each, one accumulator's after another). Each accumulator gets the same bits as
/// [`scale_axpy_rows_f32`] on it alone (the AVX-512 kernel updates 8 accumulators × 32
/// elements per register tile, so each row vector loaded feeds 8 FMAs).
///
/// # Panics
///
/// As [`scale_axpy_rows_f32`], and if `acc` or `w` do not divide into `scales.len()` parts.
pub fn scale_axpy_rows_multi_f32(
    isa: Isa,
    acc: &mut [f32],
    scales: &[f32],
    w: &[f32],
    rows: &[f32],
    stride: usize,
) {
    let nx = scales.len();
    if nx == 0 {
        return;
    }
    assert!(
        acc.len().is_multiple_of(nx) && w.len().is_multiple_of(nx),
        "kernels: {} accumulator floats and {} weights for {nx} vectors",
        acc.len(),
        w.len()
    );
    let (len, n) = (acc.len() / nx, w.len() / nx);
    check_rows(isa, len, rows, stride, n);
    if n == 0 {
        // No rows: only the scales, as in `scale_axpy_rows_f32`.
        for (a, &s) in acc.chunks_exact_mut(len.max(1)).zip(scales) {
            a.iter_mut().for_each(|v| *v *= s);
        }
        return;
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the ISA and the shapes were checked above.
        Isa::Avx512 => unsafe {
            avx512::scale_axpy_rows_multi(acc, len, scales, w, n, rows, stride);
        },
        _ => {
            for (x, &s) in scales.iter().enumerate() {
                scale_axpy_rows_f32(
                    isa,
                    &mut acc[x * len..][..len],
                    s,
                    &w[x * n..][..n],
                    rows,
                    stride,
                );
            }
        }
    }
}

/// One tile of the online softmax: `s[i] ← s[i]·scale`, `m' = max(m, maxᵢ s[i])`, then
/// `s[i] ← exp(s[i] − m')`; returns `(m', Σᵢ s[i])`.
///
/// `exp` is a polynomial, not libm's: relative error under 1.5e-7 over `[−87.3, 0]` (measured
/// 8.0e-8 against f64 in `tests.rs`; the softmax only ever takes it of `s − m' ≤ 0`), 0 below,
/// written with separate multiplies and adds so that every ISA computes the same bits. The sum
/// keeps 16 partial sums (lane `i mod 16`) combined by the fixed halving tree of the dot
/// products, so the result depends only on the values and `s.len()`: the same bits on every
/// ISA (up to the sign of a zero maximum, and NaN scores: AVX-512's max keeps a NaN that
/// `f32::max` drops), whatever else the caller computes.
pub fn softmax_tile_f32(isa: Isa, s: &mut [f32], scale: f32, m: f32) -> (f32, f32) {
    assert!(
        isa.is_available(),
        "kernels: ISA {isa} is not available on this CPU"
    );
    match isa {
        Isa::Scalar => scalar::softmax_tile(s, scale, m),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the ISA was checked.
        Isa::Avx2 => unsafe { avx2::softmax_tile(s, scale, m) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the ISA was checked.
        Isa::Avx512 => unsafe { avx512::softmax_tile(s, scale, m) },
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2 | Isa::Avx512 => unreachable!("kernels: {isa} is never available off x86_64"),
    }
}

/// `Σ a[j]·b[j]` over `j < min(a.len(), b.len())` by the portable kernel, whatever the ISA: 16
/// independent partial sums (lane `j mod 16` over the whole 16-wide chunks) combined by a fixed
/// halving tree, then the tail added in order. A fixed order that LLVM keeps in vector registers
/// once this inlines into the caller (hostd's `ops::dot`: attention scores, DeltaNet chunks).
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    scalar::dot(a, b)
}

/// Panics unless `isa` runs here and `n` rows of `len` elements, `stride` apart, fit `rows`.
fn check_rows(isa: Isa, len: usize, rows: &[f32], stride: usize, n: usize) {
    assert!(
        isa.is_available(),
        "kernels: ISA {isa} is not available on this CPU"
    );
    if n == 0 {
        return;
    }
    assert!(
        n == 1 || stride >= len,
        "kernels: row stride {stride} is shorter than the row length {len}"
    );
    let needed = (n - 1)
        .checked_mul(stride)
        .and_then(|v| v.checked_add(len))
        .expect("kernels: rows overflow usize");
    assert!(
        rows.len() >= needed,
        "kernels: {n} rows of {len} with stride {stride} need {needed} elements, got {}",
        rows.len()
    );
}
