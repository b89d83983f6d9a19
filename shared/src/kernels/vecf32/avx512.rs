//! AVX-512 (F + BW + VL) f32 vector kernels, 16 lanes.
//!
//! # Operation order (the bitwise contract)
//!
//! Dot product of `x` (length `len`) with one row:
//!
//! 1. One 16-lane accumulator starts at +0. Lane `l` takes the elements `j ≡ l (mod 16)` of the
//!    whole 16-element chunks in increasing `j`, one fused multiply-add per chunk.
//! 2. The last `len mod 16` elements go in by one masked fused multiply-add; lanes past the end
//!    are left untouched.
//! 3. The 16 lanes are reduced by the fixed tree of the dense AVX-512 kernel's `hsum`
//!    (`a[i] = v[i] + v[i+8]`, `b[i] = a[i] + a[i+4]`, `c[i] = b[i] + b[i+2]`, `c[0] + c[1]`).
//!
//! Several rows run side by side for instruction-level parallelism, each by exactly that
//! sequence, so a row's result never depends on its neighbours or on the call it falls in.
//!
//! Weighted sum: every accumulator element is multiplied by the scale, then gets one fused
//! multiply-add per row in row order; the last `len mod 16` elements use masked vectors. This is
//! element for element the AVX2 kernel's arithmetic, so the two give the same bits.

use std::arch::x86_64::*;

use crate::kernels::avx512::hsum;

/// f32 lanes per vector.
const LANES: usize = 16;
/// Accumulator elements kept in registers while the rows stream past (16 zmm registers: one
/// whole head at head_dim 256).
const AXPY_BLOCK: usize = 16 * LANES;
/// Rows whose dot products run side by side: four independent FMA chains.
const DOT_ROWS: usize = 4;

/// The mask of the first `n < 16` lanes.
#[inline]
fn tail_mask(n: usize) -> __mmask16 {
    ((1u32 << n) - 1) as __mmask16
}

/// See `super::dot_rows_f32`.
///
/// # Safety
///
/// AVX-512 F/BW/VL, AVX2 and FMA are available; for every `i < out.len()`,
/// `rows[i·stride ..][.. x.len()]` is in bounds (checked by the caller).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn dot_rows(x: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
    let len = x.len();
    let (xp, rp) = (x.as_ptr(), rows.as_ptr());
    let n = out.len();
    let mut i = 0;
    while i + DOT_ROWS <= n {
        let ptrs: [*const f32; DOT_ROWS] = std::array::from_fn(|k| rp.wrapping_add((i + k) * stride));
        // SAFETY: rows i .. i + 4 are in bounds by the caller's contract.
        let r = unsafe { dot_n::<DOT_ROWS>(xp, ptrs, len) };
        out[i..i + DOT_ROWS].copy_from_slice(&r);
        i += DOT_ROWS;
    }
    while i < n {
        // SAFETY: row i is in bounds by the caller's contract.
        out[i] = unsafe { dot_n::<1>(xp, [rp.add(i * stride)], len) }[0];
        i += 1;
    }
}

/// The dot products of `x` with `R` rows, each in the order of the module docs.
///
/// # Safety
///
/// AVX-512 F/BW/VL and FMA; `x` and every `r[k]` are readable for `len` f32.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
#[inline]
pub(super) unsafe fn dot_n<const R: usize>(x: *const f32, r: [*const f32; R], len: usize) -> [f32; R] {
    // SAFETY: forwarded contract.
    let acc = unsafe { dot_acc::<R>(x, r, len) };
    let mut out = [0.0f32; R];
    for (o, &a) in out.iter_mut().zip(&acc) {
        *o = hsum(a);
    }
    out
}

/// The unreduced 16-lane accumulators of [`dot_n`] (steps 1 and 2 of the module docs).
///
/// # Safety
///
/// As [`dot_n`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
#[inline]
pub(super) unsafe fn dot_acc<const R: usize>(x: *const f32, r: [*const f32; R], len: usize) -> [__m512; R] {
    let mut acc = [_mm512_setzero_ps(); R];
    let full = len - len % LANES;
    let mut j = 0;
    // PERF-CRITICAL: attention scores, every query against every visible key.
    while j < full {
        // SAFETY: j + 16 <= len.
        let xv = unsafe { _mm512_loadu_ps(x.add(j)) };
        for (a, &rk) in acc.iter_mut().zip(&r) {
            // SAFETY: as above, for the row.
            *a = _mm512_fmadd_ps(xv, unsafe { _mm512_loadu_ps(rk.add(j)) }, *a);
        }
        j += LANES;
    }
    if j < len {
        let mask = tail_mask(len - j);
        // SAFETY: masked-off lanes are not read (AVX-512 suppresses their faults); the len - j
        // selected f32 are in bounds.
        let xv = unsafe { _mm512_maskz_loadu_ps(mask, x.add(j)) };
        for (a, &rk) in acc.iter_mut().zip(&r) {
            // SAFETY: as above, for the row.
            let rv = unsafe { _mm512_maskz_loadu_ps(mask, rk.add(j)) };
            *a = _mm512_mask3_fmadd_ps(xv, rv, *a, mask);
        }
    }
    acc
}

/// See `super::scale_axpy_rows_f32`.
///
/// # Safety
///
/// AVX-512 F/BW/VL, AVX2 and FMA are available; for every `i < w.len()`,
/// `rows[i·stride ..][.. acc.len()]` is in bounds (checked by the caller).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn scale_axpy_rows(acc: &mut [f32], acc_scale: f32, w: &[f32], rows: &[f32], stride: usize) {
    let len = acc.len();
    let (ap, rp) = (acc.as_mut_ptr(), rows.as_ptr());
    let mut j = 0;
    // PERF-CRITICAL: attention's probability-weighted sum of values.
    while j + AXPY_BLOCK <= len {
        // SAFETY: j + AXPY_BLOCK <= len; every row holds len elements.
        unsafe { axpy_block::<{ AXPY_BLOCK / LANES }>(ap.add(j), acc_scale, w, rp.add(j), stride) };
        j += AXPY_BLOCK;
    }
    while j + LANES <= len {
        // SAFETY: j + 16 <= len.
        unsafe { axpy_block::<1>(ap.add(j), acc_scale, w, rp.add(j), stride) };
        j += LANES;
    }
    if j < len {
        let mask = tail_mask(len - j);
        // SAFETY: masked loads and stores touch only the len - j elements in bounds.
        let mut v = _mm512_mul_ps(unsafe { _mm512_maskz_loadu_ps(mask, ap.add(j)) }, _mm512_set1_ps(acc_scale));
        for (i, &wi) in w.iter().enumerate() {
            // SAFETY: as above, for row i.
            let rv = unsafe { _mm512_maskz_loadu_ps(mask, rp.add(i * stride + j)) };
            v = _mm512_mask3_fmadd_ps(_mm512_set1_ps(wi), rv, v, mask);
        }
        // SAFETY: as above; acc is exclusively borrowed.
        unsafe { _mm512_mask_storeu_ps(ap.add(j), mask, v) };
    }
}

/// `V` vectors of the accumulator at `a` scaled, then one FMA per row (`rows`, stride `stride`).
///
/// # Safety
///
/// AVX-512; `a` is writable and every row readable for `16 · V` f32.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
#[inline]
unsafe fn axpy_block<const V: usize>(a: *mut f32, acc_scale: f32, w: &[f32], rows: *const f32, stride: usize) {
    let scale = _mm512_set1_ps(acc_scale);
    let mut v = [_mm512_setzero_ps(); V];
    for (k, x) in v.iter_mut().enumerate() {
        // SAFETY: the caller's contract covers 16 · V elements at a.
        *x = _mm512_mul_ps(unsafe { _mm512_loadu_ps(a.add(k * LANES)) }, scale);
    }
    for (i, &wi) in w.iter().enumerate() {
        let wv = _mm512_set1_ps(wi);
        // SAFETY: row i is readable for 16 · V elements.
        let row = unsafe { rows.add(i * stride) };
        for (k, x) in v.iter_mut().enumerate() {
            // SAFETY: as above.
            *x = _mm512_fmadd_ps(wv, unsafe { _mm512_loadu_ps(row.add(k * LANES)) }, *x);
        }
    }
    for (k, x) in v.iter().enumerate() {
        // SAFETY: the caller's contract; the accumulator is exclusively the caller's.
        unsafe { _mm512_storeu_ps(a.add(k * LANES), *x) };
    }
}

/// See `super::softmax_tile_f32`. The arithmetic of `scalar::softmax_tile`, 16 lanes at a time:
/// the same `exp` (separate multiplies and adds), the same 16 partial sums (lane `i mod 16`,
/// masked for the tail) and the same reduction tree.
///
/// # Safety
///
/// AVX-512 F/BW/VL, AVX2 and FMA are available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn softmax_tile(s: &mut [f32], scale: f32, m: f32) -> (f32, f32) {
    let len = s.len();
    let p = s.as_mut_ptr();
    let sv = _mm512_set1_ps(scale);
    let mut mx = _mm512_set1_ps(m);
    let mut j = 0;
    while j < len {
        let mask = if len - j >= LANES { u16::MAX } else { tail_mask(len - j) };
        // SAFETY: the masked load and store touch only elements j .. len of s.
        let x = _mm512_mul_ps(unsafe { _mm512_maskz_loadu_ps(mask, p.add(j)) }, sv);
        // SAFETY: as above.
        unsafe { _mm512_mask_storeu_ps(p.add(j), mask, x) };
        mx = _mm512_mask_max_ps(mx, mask, mx, x);
        j += LANES;
    }
    let m_new = _mm512_reduce_max_ps(mx);
    let mv = _mm512_set1_ps(m_new);
    let mut acc = _mm512_setzero_ps();
    let mut j = 0;
    while j < len {
        let mask = if len - j >= LANES { u16::MAX } else { tail_mask(len - j) };
        // SAFETY: as above.
        let e = exp(_mm512_sub_ps(unsafe { _mm512_maskz_loadu_ps(mask, p.add(j)) }, mv));
        // SAFETY: as above.
        unsafe { _mm512_mask_storeu_ps(p.add(j), mask, e) };
        acc = _mm512_mask_add_ps(acc, mask, acc, e);
        j += LANES;
    }
    (m_new, hsum(acc))
}

/// `scalar::exp`, lane by lane, with the same operations in the same order.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
#[inline]
fn exp(x: __m512) -> __m512 {
    use super::scalar::{EXP_HI, EXP_LO, EXP_P, LN2_HI, LN2_LO, LOG2E, ROUND};
    let lo = _mm512_set1_ps(EXP_LO);
    // min/max return their second operand when either is NaN, so NaN passes through.
    let xc = _mm512_max_ps(lo, _mm512_min_ps(_mm512_set1_ps(EXP_HI), x));
    let round = _mm512_set1_ps(ROUND);
    let t = _mm512_add_ps(_mm512_mul_ps(xc, _mm512_set1_ps(LOG2E)), round);
    let n = _mm512_sub_ps(t, round);
    let ni = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_castps_si512(round));
    let r = _mm512_sub_ps(_mm512_sub_ps(xc, _mm512_mul_ps(n, _mm512_set1_ps(LN2_HI))), _mm512_mul_ps(n, _mm512_set1_ps(LN2_LO)));
    let mut y = _mm512_set1_ps(EXP_P[0]);
    for &c in &EXP_P[1..] {
        y = _mm512_add_ps(_mm512_mul_ps(y, r), _mm512_set1_ps(c));
    }
    let y = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(y, _mm512_mul_ps(r, r)), r), _mm512_set1_ps(1.0));
    let pow2 = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(ni, _mm512_set1_epi32(127))));
    let y = _mm512_mul_ps(y, pow2);
    let under = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, lo);
    _mm512_mask_mov_ps(y, under, _mm512_setzero_ps())
}
