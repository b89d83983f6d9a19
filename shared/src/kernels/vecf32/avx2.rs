//! AVX2 + FMA f32 vector kernels, 8 lanes.
//!
//! # Operation order (the bitwise contract)
//!
//! Dot product of `x` (length `len`) with one row:
//!
//! 1. Four 8-lane accumulators start at +0. Whole 32-element blocks: accumulator `k` takes
//!    elements `32·b + 8·k .. + 8` by one fused multiply-add, block after block.
//! 2. The remaining whole 8-element chunks `m = 0, 1, 2` go into accumulator `m` the same way.
//! 3. `hsum((a0 + a1) + (a2 + a3))` by the fixed tree of [`hsum`] (the dense AVX2 kernel's:
//!    `b[i] = v[i] + v[i+4]`, `c[i] = b[i] + b[i+2]`, result `c[0] + c[1]`), then the last
//!    `len mod 8` products are added one by one in order (plain multiply, then add).
//!
//! Two rows are computed side by side for instruction-level parallelism, each by exactly that
//! sequence, so a row's result never depends on its neighbours or on the call it falls in.
//!
//! Weighted sum: every accumulator element is multiplied by the scale, then gets one fused
//! multiply-add per row in row order; vector and scalar (`_mm_fmadd_ss`) lanes round alike.

use std::arch::x86_64::*;

use crate::kernels::avx2::hsum;

/// f32 lanes per vector.
const LANES: usize = 8;
/// Accumulator elements kept in registers while the rows stream past (8 ymm registers).
const AXPY_BLOCK: usize = 8 * LANES;

/// See `super::dot_rows_f32`.
///
/// # Safety
///
/// AVX2 and FMA are available; for every `i < out.len()`, `rows[i·stride ..][.. x.len()]` is in
/// bounds (checked by the caller).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot_rows(x: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
    let len = x.len();
    let (xp, rp) = (x.as_ptr(), rows.as_ptr());
    let n = out.len();
    let mut i = 0;
    while i + 2 <= n {
        // SAFETY: rows i and i + 1 are in bounds by the caller's contract.
        let pair = unsafe { dot_n::<2>(xp, [rp.add(i * stride), rp.add((i + 1) * stride)], len) };
        out[i] = pair[0];
        out[i + 1] = pair[1];
        i += 2;
    }
    if i < n {
        // SAFETY: row i is in bounds by the caller's contract.
        out[i] = unsafe { dot_n::<1>(xp, [rp.add(i * stride)], len) }[0];
    }
}

/// The dot products of `x` with `R` rows, each in the order of the module docs.
///
/// # Safety
///
/// AVX2 and FMA; `x` and every `r[k]` are readable for `len` f32.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn dot_n<const R: usize>(x: *const f32, r: [*const f32; R], len: usize) -> [f32; R] {
    let mut acc = [[_mm256_setzero_ps(); 4]; R];
    let blocks = len / (4 * LANES);
    // PERF-CRITICAL: attention scores, every query against every visible key.
    for b in 0..blocks {
        let base = b * 4 * LANES;
        for k in 0..4 {
            // SAFETY: base + 8k + 8 <= len.
            let xv = unsafe { _mm256_loadu_ps(x.add(base + k * LANES)) };
            for (a, &rk) in acc.iter_mut().zip(&r) {
                // SAFETY: as above, for the row.
                let rv = unsafe { _mm256_loadu_ps(rk.add(base + k * LANES)) };
                a[k] = _mm256_fmadd_ps(xv, rv, a[k]);
            }
        }
    }
    let mut j = blocks * 4 * LANES;
    let mut m = 0;
    while j + LANES <= len {
        // SAFETY: j + 8 <= len.
        let xv = unsafe { _mm256_loadu_ps(x.add(j)) };
        for (a, &rk) in acc.iter_mut().zip(&r) {
            // SAFETY: as above, for the row.
            let rv = unsafe { _mm256_loadu_ps(rk.add(j)) };
            a[m] = _mm256_fmadd_ps(xv, rv, a[m]);
        }
        j += LANES;
        m += 1;
    }
    let mut out = [0.0f32; R];
    for ((o, a), &rk) in out.iter_mut().zip(&acc).zip(&r) {
        let mut s = hsum(_mm256_add_ps(
            _mm256_add_ps(a[0], a[1]),
            _mm256_add_ps(a[2], a[3]),
        ));
        for t in j..len {
            // SAFETY: t < len.
            s += unsafe { *x.add(t) * *rk.add(t) };
        }
        *o = s;
    }
    out
}

/// See `super::scale_axpy_rows_f32`.
///
/// # Safety
///
/// AVX2 and FMA are available; for every `i < w.len()`, `rows[i·stride ..][.. acc.len()]` is
/// in bounds (checked by the caller).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn scale_axpy_rows(
    acc: &mut [f32],
    acc_scale: f32,
    w: &[f32],
    rows: &[f32],
    stride: usize,
) {
    let len = acc.len();
    let (ap, rp) = (acc.as_mut_ptr(), rows.as_ptr());
    let scale = _mm256_set1_ps(acc_scale);
    let mut j = 0;
    // PERF-CRITICAL: attention's probability-weighted sum of values.
    while j + AXPY_BLOCK <= len {
        let mut a = [_mm256_setzero_ps(); AXPY_BLOCK / LANES];
        for (k, v) in a.iter_mut().enumerate() {
            // SAFETY: j + AXPY_BLOCK <= len.
            *v = _mm256_mul_ps(unsafe { _mm256_loadu_ps(ap.add(j + k * LANES)) }, scale);
        }
        for (i, &wi) in w.iter().enumerate() {
            let wv = _mm256_set1_ps(wi);
            // SAFETY: row i is in bounds for len elements, and j + AXPY_BLOCK <= len.
            let row = unsafe { rp.add(i * stride + j) };
            for (k, v) in a.iter_mut().enumerate() {
                // SAFETY: as above.
                *v = _mm256_fmadd_ps(wv, unsafe { _mm256_loadu_ps(row.add(k * LANES)) }, *v);
            }
        }
        for (k, v) in a.iter().enumerate() {
            // SAFETY: j + AXPY_BLOCK <= len; acc is exclusively borrowed.
            unsafe { _mm256_storeu_ps(ap.add(j + k * LANES), *v) };
        }
        j += AXPY_BLOCK;
    }
    while j + LANES <= len {
        // SAFETY: j + 8 <= len.
        let mut v = _mm256_mul_ps(unsafe { _mm256_loadu_ps(ap.add(j)) }, scale);
        for (i, &wi) in w.iter().enumerate() {
            // SAFETY: row i is in bounds for len elements.
            v = _mm256_fmadd_ps(
                _mm256_set1_ps(wi),
                unsafe { _mm256_loadu_ps(rp.add(i * stride + j)) },
                v,
            );
        }
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(ap.add(j), v) };
        j += LANES;
    }
    for t in j..len {
        // SAFETY: t < len.
        let mut v = _mm_mul_ss(_mm_set_ss(unsafe { *ap.add(t) }), _mm_set_ss(acc_scale));
        for (i, &wi) in w.iter().enumerate() {
            // SAFETY: row i is in bounds for len elements.
            v = _mm_fmadd_ss(
                _mm_set_ss(wi),
                _mm_set_ss(unsafe { *rp.add(i * stride + t) }),
                v,
            );
        }
        // SAFETY: t < len.
        unsafe { *ap.add(t) = _mm_cvtss_f32(v) };
    }
}

/// See `super::softmax_tile_f32`: the portable kernel, compiled here with AVX2 so that LLVM
/// vectorises it 8 wide. It has no FMA to contract (Rust never fuses a multiply and an add), so
/// the bits are the portable kernel's.
///
/// # Safety
///
/// AVX2 and FMA are available.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn softmax_tile(s: &mut [f32], scale: f32, m: f32) -> (f32, f32) {
    super::scalar::softmax_tile(s, scale, m)
}
