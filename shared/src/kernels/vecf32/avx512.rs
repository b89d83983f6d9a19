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
//!
//! The multi-vector kernels (several query vectors or accumulators over the same rows) keep 16
//! accumulators in registers per tile; each dot product and each element still follows the
//! sequence above, so they give the single-vector kernels' bits. The softmax tile is the
//! portable kernel's arithmetic, 16 lanes at a time.

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
        let ptrs: [*const f32; DOT_ROWS] =
            std::array::from_fn(|k| rp.wrapping_add((i + k) * stride));
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
pub(super) unsafe fn dot_n<const R: usize>(
    x: *const f32,
    r: [*const f32; R],
    len: usize,
) -> [f32; R] {
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
pub(super) unsafe fn dot_acc<const R: usize>(
    x: *const f32,
    r: [*const f32; R],
    len: usize,
) -> [__m512; R] {
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
/// AVX-512 F/BW/VL, AVX2 and FMA are available; `w` is not empty, and for every `i < w.len()`,
/// `rows[i·stride ..][.. acc.len()]` is in bounds (checked by the caller).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn scale_axpy_rows(
    acc: &mut [f32],
    acc_scale: f32,
    w: &[f32],
    rows: &[f32],
    stride: usize,
) {
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
        let mut v = _mm512_mul_ps(
            unsafe { _mm512_maskz_loadu_ps(mask, ap.add(j)) },
            _mm512_set1_ps(acc_scale),
        );
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
unsafe fn axpy_block<const V: usize>(
    a: *mut f32,
    acc_scale: f32,
    w: &[f32],
    rows: *const f32,
    stride: usize,
) {
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
        let mask = if len - j >= LANES {
            u16::MAX
        } else {
            tail_mask(len - j)
        };
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
        let mask = if len - j >= LANES {
            u16::MAX
        } else {
            tail_mask(len - j)
        };
        // SAFETY: as above.
        let e = exp(_mm512_sub_ps(
            unsafe { _mm512_maskz_loadu_ps(mask, p.add(j)) },
            mv,
        ));
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
    let r = _mm512_sub_ps(
        _mm512_sub_ps(xc, _mm512_mul_ps(n, _mm512_set1_ps(LN2_HI))),
        _mm512_mul_ps(n, _mm512_set1_ps(LN2_LO)),
    );
    let mut y = _mm512_set1_ps(EXP_P[0]);
    for &c in &EXP_P[1..] {
        y = _mm512_add_ps(_mm512_mul_ps(y, r), _mm512_set1_ps(c));
    }
    let y = _mm512_add_ps(
        _mm512_add_ps(_mm512_mul_ps(y, _mm512_mul_ps(r, r)), r),
        _mm512_set1_ps(1.0),
    );
    let pow2 = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
        ni,
        _mm512_set1_epi32(127),
    )));
    let y = _mm512_mul_ps(y, pow2);
    let under = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, lo);
    _mm512_mask_mov_ps(y, under, _mm512_setzero_ps())
}

/// Query vectors × rows per register tile of [`dot_rows_multi`]: 16 accumulators, reduced
/// together by [`hsum16`]. 8 × 2 (each key vector loaded from L2 feeds 8 FMAs) measured ~3%
/// faster than 4 × 4 on one thread (prefill 4096 of the attention bench).
const TILE_X: usize = 8;
/// See [`TILE_X`].
const TILE_R: usize = 2;
// `dot_tile` reduces its TILE_X · TILE_R accumulators with one 16-way `hsum16`.
const _: () = assert!(TILE_X * TILE_R == 16);
/// Accumulator vectors × 16-lane columns per register tile of [`scale_axpy_rows_multi`]. 8 × 2
/// reads each value vector from L2 once per 8 heads; it measured ~8% faster than 4 × 4 on one
/// thread (prefill 4096 of the attention bench).
const AXPY_X: usize = 8;
/// See [`AXPY_X`].
const AXPY_V: usize = 2;

/// See `super::dot_rows_multi_f32`: 8 query vectors × 2 rows at a time, so that each loaded
/// row vector feeds 8 FMAs and each query vector 2; every dot product is still the sequence of
/// the module docs (one accumulator, masked tail, the `hsum` tree), so the results are
/// [`dot_rows`]' bits.
///
/// # Safety
///
/// AVX-512 F/BW/VL, AVX2 and FMA are available; `xs` holds `nx · len` f32, `out` `nx · n`, and
/// for every `i < n`, `rows[i·stride ..][.. len]` is in bounds (checked by the caller).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn dot_rows_multi(
    len: usize,
    xs: &[f32],
    rows: &[f32],
    stride: usize,
    out: &mut [f32],
    n: usize,
) {
    let nx = out.len() / n.max(1);
    let rp = rows.as_ptr();
    let mut v = 0;
    while v + TILE_X <= nx {
        let xp: [*const f32; TILE_X] = std::array::from_fn(|a| xs[(v + a) * len..].as_ptr());
        let mut i = 0;
        while i + TILE_R <= n {
            let r: [*const f32; TILE_R] =
                std::array::from_fn(|b| rp.wrapping_add((i + b) * stride));
            let next: [*const f32; TILE_R] =
                std::array::from_fn(|b| rp.wrapping_add((i + TILE_R + b) * stride));
            // SAFETY: query vectors v .. v + TILE_X and rows i .. i + TILE_R are in bounds.
            let z = unsafe { dot_tile(xp, r, next, len) };
            for a in 0..TILE_X {
                for b in 0..TILE_R {
                    out[(v + a) * n + i + b] = z[hsum16_lane(b * TILE_X + a)];
                }
            }
            i += TILE_R;
        }
        for (a, &x) in xp.iter().enumerate() {
            for k in i..n {
                // SAFETY: row k < n is in bounds, x holds len f32.
                out[(v + a) * n + k] = unsafe { dot_n::<1>(x, [rp.add(k * stride)], len) }[0];
            }
        }
        v += TILE_X;
    }
    for u in v..nx {
        // SAFETY: forwarded contract, for query vector u alone.
        unsafe { dot_rows(&xs[u * len..][..len], rows, stride, &mut out[u * n..][..n]) };
    }
}

/// The lane of [`hsum16`]'s result that holds the sum of its input vector `k`.
const fn hsum16_lane(k: usize) -> usize {
    4 * (k % 4) + k / 4
}

/// The dot products of `TILE_X` query vectors with `TILE_R` rows: `x[a] · r[b]` is lane
/// `hsum16_lane(b · TILE_X + a)` of the result. Meanwhile, the rows `next` (the next pair of
/// rows this loop will take) are prefetched into L1, one cache line per step; that changes no arithmetic.
///
/// # Safety
///
/// AVX-512; every `x[a]` and `r[b]` is readable for `len` f32.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
#[inline]
unsafe fn dot_tile(
    x: [*const f32; TILE_X],
    r: [*const f32; TILE_R],
    next: [*const f32; TILE_R],
    len: usize,
) -> [f32; 16] {
    let mut acc = [[_mm512_setzero_ps(); TILE_X]; TILE_R];
    let full = len - len % LANES;
    let mut j = 0;
    // PERF-CRITICAL: attention scores at long context.
    while j < full {
        for &p in &next {
            // Prefetches never fault, so rows past the end are harmless.
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(j).cast());
        }
        // SAFETY: j + 16 <= len for every vector.
        let xv: [__m512; TILE_X] = std::array::from_fn(|a| unsafe { _mm512_loadu_ps(x[a].add(j)) });
        for (acc_b, &rb) in acc.iter_mut().zip(&r) {
            // SAFETY: as above.
            let rv = unsafe { _mm512_loadu_ps(rb.add(j)) };
            for (s, &xa) in acc_b.iter_mut().zip(&xv) {
                *s = _mm512_fmadd_ps(xa, rv, *s);
            }
        }
        j += LANES;
    }
    if j < len {
        let mask = tail_mask(len - j);
        // SAFETY: masked-off lanes are not read; the len - j selected f32 are in bounds.
        let xv: [__m512; TILE_X] =
            std::array::from_fn(|a| unsafe { _mm512_maskz_loadu_ps(mask, x[a].add(j)) });
        for (acc_b, &rb) in acc.iter_mut().zip(&r) {
            // SAFETY: as above.
            let rv = unsafe { _mm512_maskz_loadu_ps(mask, rb.add(j)) };
            for (s, &xa) in acc_b.iter_mut().zip(&xv) {
                *s = _mm512_mask3_fmadd_ps(xa, rv, *s, mask);
            }
        }
    }
    let flat: [__m512; 16] = std::array::from_fn(|k| acc[k / TILE_X][k % TILE_X]);
    let mut z = [0.0f32; 16];
    // SAFETY: z holds 16 f32.
    unsafe { _mm512_storeu_ps(z.as_mut_ptr(), hsum16(flat)) };
    z
}

/// Sixteen [`hsum`]s at once: lane `4q + k` of the result is `hsum(v[4k + q])`, bit for bit,
/// because every vector goes through the same tree (`v[i] + v[i+8]`, then `+4`, `+2`, `+1`),
/// with the 16 vectors' lanes interleaved by shuffles instead of reduced one vector at a time.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
#[inline]
fn hsum16(v: [__m512; 16]) -> __m512 {
    // a[m]: lanes 0..8 = v[2m][i] + v[2m][i+8], lanes 8..16 the same for v[2m+1].
    let a: [__m512; 8] = std::array::from_fn(|m| {
        let (x, y) = (v[2 * m], v[2 * m + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y),
        )
    });
    // b[m]: quarter q = (a[i] + a[i+4], i < 4) of v[4m + q].
    let b: [__m512; 4] = std::array::from_fn(|m| {
        let (x, y) = (a[2 * m], a[2 * m + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
        )
    });
    // c[m]: quarter q = (c0, c1) of v[q], then of v[4 + q] (m = 0), or of v[8 + q], v[12 + q].
    let c: [__m512; 2] = std::array::from_fn(|m| {
        let (x, y) = (b[2 * m], b[2 * m + 1]);
        _mm512_add_ps(
            _mm512_shuffle_ps::<0b01_00_01_00>(x, y),
            _mm512_shuffle_ps::<0b11_10_11_10>(x, y),
        )
    });
    // Quarter q = c0 + c1 of v[q], v[4 + q], v[8 + q], v[12 + q].
    _mm512_add_ps(
        _mm512_shuffle_ps::<0b10_00_10_00>(c[0], c[1]),
        _mm512_shuffle_ps::<0b11_01_11_01>(c[0], c[1]),
    )
}

/// See `super::scale_axpy_rows_multi_f32`: 8 accumulator vectors × 32 elements at a time, so
/// each loaded row vector feeds 8 FMAs. Every element gets the arithmetic of
/// [`scale_axpy_rows`] (its scale, then one FMA per row in row order), hence its bits.
///
/// # Safety
///
/// AVX-512 F/BW/VL, AVX2 and FMA are available; `n > 0`; `acc` holds `scales.len() · len` f32,
/// `w` `scales.len() · n`, and for every `i < n`, `rows[i·stride ..][.. len]` is in bounds.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn scale_axpy_rows_multi(
    acc: &mut [f32],
    len: usize,
    scales: &[f32],
    w: &[f32],
    n: usize,
    rows: &[f32],
    stride: usize,
) {
    let nx = scales.len();
    let block = AXPY_V * LANES;
    let full = len - len % block;
    let mut v = 0;
    while v + AXPY_X <= nx {
        let ap = acc[v * len..].as_mut_ptr();
        let mut j = 0;
        while j < full {
            // SAFETY: vectors v .. v + AXPY_X of acc and every row hold j + block <= len
            // elements (block = AXPY_V · 16).
            unsafe {
                axpy_tile(
                    ap.add(j),
                    len,
                    &scales[v..v + AXPY_X],
                    &w[v * n..(v + AXPY_X) * n],
                    n,
                    rows.as_ptr().add(j),
                    stride,
                );
            };
            j += block;
        }
        if j < len {
            for a in 0..AXPY_X {
                let wa = &w[(v + a) * n..][..n];
                // SAFETY: forwarded contract, for elements j .. len of vector v + a.
                unsafe {
                    scale_axpy_rows(
                        &mut acc[(v + a) * len + j..(v + a + 1) * len],
                        scales[v + a],
                        wa,
                        &rows[j..],
                        stride,
                    );
                };
            }
        }
        v += AXPY_X;
    }
    for u in v..nx {
        // SAFETY: forwarded contract, for vector u alone.
        unsafe {
            scale_axpy_rows(
                &mut acc[u * len..][..len],
                scales[u],
                &w[u * n..][..n],
                rows,
                stride,
            );
        };
    }
}

/// `AXPY_X` accumulator vectors (at `a`, `len` apart) × `16 · AXPY_V` elements: each scaled, then one FMA per
/// row with its own weight `w[x·n + i]`.
///
/// # Safety
///
/// AVX-512; `a + x·len` is writable for `16 · AXPY_V` f32 (`x < AXPY_X`); every row readable for
/// `16 · AXPY_V` f32.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
#[inline]
unsafe fn axpy_tile(
    a: *mut f32,
    len: usize,
    scales: &[f32],
    w: &[f32],
    n: usize,
    rows: *const f32,
    stride: usize,
) {
    let mut v = [[_mm512_setzero_ps(); AXPY_V]; AXPY_X];
    for (x, vx) in v.iter_mut().enumerate() {
        let s = _mm512_set1_ps(scales[x]);
        for (k, e) in vx.iter_mut().enumerate() {
            // SAFETY: the caller's contract covers 16 · AXPY_V elements of vector x.
            *e = _mm512_mul_ps(unsafe { _mm512_loadu_ps(a.add(x * len + k * LANES)) }, s);
        }
    }
    assert!(
        w.len() >= AXPY_X * n,
        "kernels: weights for {AXPY_X} vectors of {n}"
    );
    let wp = w.as_ptr();
    // PERF-CRITICAL: attention's probability-weighted sum of values at long context. Raw
    // pointers: bounds checks here cost as many instructions as the FMAs.
    for i in 0..n {
        // SAFETY: row i is readable for 16 · AXPY_V elements.
        let row = unsafe { rows.add(i * stride) };
        // SAFETY: as above.
        let rv: [__m512; AXPY_V] =
            std::array::from_fn(|k| unsafe { _mm512_loadu_ps(row.add(k * LANES)) });
        for (x, vx) in v.iter_mut().enumerate() {
            // SAFETY: x · n + i < AXPY_X · n <= w.len() (asserted above).
            let wv = _mm512_set1_ps(unsafe { *wp.add(x * n + i) });
            for (e, &r) in vx.iter_mut().zip(&rv) {
                *e = _mm512_fmadd_ps(wv, r, *e);
            }
        }
    }
    for (x, vx) in v.iter().enumerate() {
        for (k, e) in vx.iter().enumerate() {
            // SAFETY: the caller's contract; the accumulator is exclusively the caller's.
            unsafe { _mm512_storeu_ps(a.add(x * len + k * LANES), *e) };
        }
    }
}
