//! AVX-512 VNNI W8A8 kernel: `vpdpbusd` of the broadcast activation bytes (u8) against one
//! 64-byte R16C4 chunk (s8) per column group, 16 rows per zmm.
//!
//! Owns the x86_64 AVX-512 code; the safe API, the shape checks and the dequantisation live in
//! `mod.rs`.
//!
//! # Arithmetic
//!
//! For a 16-row block and a token, lane `r` of an accumulator collects
//! `Σ_c w[r][c] · x_q[c]` (activations as stored, `q + 128`): each `vpdpbusd` adds four exact
//! u8 × s8 products to the lane without saturation (the non-`s` form), and `MAX_COLS` keeps the
//! lane far from i32 overflow. The block then subtracts `128 · row_sums[r]` (a shift by 7),
//! leaving the exact `Σ_c w[r][c] · (x_q[c] − 128)`. Splitting the column groups over several
//! accumulators (to hide `vpdpbusd` latency) changes nothing: integer addition is associative.
//!
//! # Tiling
//!
//! Row blocks are visited in order; for each, up to [`MAX_TOKENS`] tokens share every weight
//! load (one accumulator per token), so the weights stream from DRAM once per call when
//! `n <= MAX_TOKENS` and are re-read from L1/L2 otherwise. The packed matrix is one contiguous
//! forward stream, and each weight load also prefetches the line [`PREFETCH_BYTES`] ahead.

use std::arch::x86_64::*;

use super::{COL_GROUP, Int8Isa, MatrixRef, ROW_BLOCK, Sink};

/// Bytes per R16C4 chunk: one zmm.
const CHUNK: usize = ROW_BLOCK * COL_GROUP;
/// Tokens per tile: 8 accumulators, the weight chunk and a broadcast fit easily in 32 zmm.
const MAX_TOKENS: usize = 8;
/// How far ahead of the current weight chunk to prefetch, into L2 (`_MM_HINT_T1`). Measured on
/// the expert shapes streaming from DRAM: the hardware prefetcher alone already reaches the
/// probe's bandwidth for one token, but with 8 tokens (compute and loads interleaved) this
/// prefetch is worth ≈ 30%; 1–2 KiB or into L1 was worse. Prefetches never fault, so running
/// past the end of the matrix is harmless; prefetching changes no arithmetic.
const PREFETCH_BYTES: usize = 4096;

/// The safe entry point: checks the CPU features, then runs [`gemm_impl`].
///
/// # Panics
///
/// Panics unless the CPU has AVX-512 F, BW and VNNI, `m`'s slices match its shape and `x_q`
/// holds at least `n · padded_cols` bytes.
pub(super) fn gemm(m: MatrixRef<'_>, x_q: &[u8], n: usize, sink: &mut Sink<'_>) {
    assert!(
        Int8Isa::Avx512Vnni.is_available(),
        "int8: AVX-512 VNNI is not available on this CPU"
    );
    m.assert_shape();
    assert!(
        x_q.len() >= n * m.padded_cols(),
        "int8: activations shorter than n rows"
    );
    // SAFETY: the features were just detected; the shapes were just checked.
    unsafe { gemm_impl(m, x_q, n, sink) }
}

/// Every token `t < n` against every row block, handed to `sink` (see the module docs).
///
/// # Safety
///
/// The CPU must support AVX-512 F, BW and VNNI. `m.packed.len() == padded_rows ·
/// padded_cols`, `m.row_sums.len() == padded_rows` and `x_q.len() >= n · padded_cols`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn gemm_impl(m: MatrixRef<'_>, x_q: &[u8], n: usize, sink: &mut Sink<'_>) {
    let pc = m.padded_cols();
    let groups = pc / COL_GROUP;
    for rb in 0..m.padded_rows() / ROW_BLOCK {
        let r0 = rb * ROW_BLOCK;
        let w = m.packed[r0 * pc..].as_ptr();
        // SAFETY: row_sums holds padded_rows i32, so the 16 at r0 are in bounds.
        let sums = unsafe { _mm512_loadu_si512(m.row_sums.as_ptr().add(r0).cast()) };
        let correction = _mm512_slli_epi32::<7>(sums);
        let mut t = 0;
        while t < n {
            let x = x_q[t * pc..].as_ptr();
            let left = n - t;
            // SAFETY (every arm): w points at this block's 16 · pc bytes; x at tokens t.. of
            // x_q, of which at least T remain, each pc bytes long.
            t += unsafe {
                match left {
                    1 => block::<1, 4>(&m, w, x, pc, groups, correction, sink, t, r0),
                    2 => block::<2, 2>(&m, w, x, pc, groups, correction, sink, t, r0),
                    3 => block::<3, 2>(&m, w, x, pc, groups, correction, sink, t, r0),
                    4 => block::<4, 1>(&m, w, x, pc, groups, correction, sink, t, r0),
                    5 => block::<5, 1>(&m, w, x, pc, groups, correction, sink, t, r0),
                    6 => block::<6, 1>(&m, w, x, pc, groups, correction, sink, t, r0),
                    7 => block::<7, 1>(&m, w, x, pc, groups, correction, sink, t, r0),
                    _ => block::<MAX_TOKENS, 1>(&m, w, x, pc, groups, correction, sink, t, r0),
                }
            };
        }
    }
}

/// One 16-row block against `T` tokens with `U` interleaved accumulator sets (for latency when
/// `T` is small); hands the results to `sink` and returns `T`.
///
/// # Safety
///
/// The AVX-512 features of [`gemm_impl`]; `w` is readable for `groups · 64` bytes (one row
/// block), `x` for `(T − 1) · pc + groups · 4` bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn block<const T: usize, const U: usize>(
    m: &MatrixRef<'_>,
    w: *const i8,
    x: *const u8,
    pc: usize,
    groups: usize,
    correction: __m512i,
    sink: &mut Sink<'_>,
    t0: usize,
    r0: usize,
) -> usize {
    let mut acc = [[_mm512_setzero_si512(); T]; U];
    let mut g = 0;
    while g + U <= groups {
        for (u, acc_u) in acc.iter_mut().enumerate() {
            // SAFETY: g + u < groups, so the chunk and each token's 4 bytes are in bounds.
            unsafe { step(w, x, pc, g + u, acc_u) };
        }
        g += U;
    }
    while g < groups {
        // SAFETY: as above, for the single group g < groups.
        unsafe { step(w, x, pc, g, &mut acc[0]) };
        g += 1;
    }
    for t in 0..T {
        let mut total = acc[0][t];
        for acc_u in &acc[1..] {
            total = _mm512_add_epi32(total, acc_u[t]);
        }
        let mut out = [0i32; ROW_BLOCK];
        // SAFETY: out holds 16 i32, one zmm.
        unsafe {
            _mm512_storeu_si512(out.as_mut_ptr().cast(), _mm512_sub_epi32(total, correction))
        };
        sink.put(m, t0 + t, r0, &out);
    }
    T
}

/// Column group `g`: one weight chunk against `T` tokens' broadcast activation bytes.
///
/// # Safety
///
/// The AVX-512 features of [`gemm_impl`]; `w` is readable for `(g + 1) · 64` bytes and `x` for
/// `(T − 1) · pc + (g + 1) · 4` bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn step<const T: usize>(
    w: *const i8,
    x: *const u8,
    pc: usize,
    g: usize,
    acc: &mut [__m512i; T],
) {
    _mm_prefetch::<_MM_HINT_T1>(w.wrapping_add(g * CHUNK + PREFETCH_BYTES));
    // SAFETY: the chunk at g · 64 is in bounds (this function's contract).
    let wv = unsafe { _mm512_loadu_si512(w.add(g * CHUNK).cast()) };
    for (t, a) in acc.iter_mut().enumerate() {
        // SAFETY: token t's bytes g·4..g·4 + 4 are in bounds; read_unaligned needs no alignment.
        let xv = unsafe { x.add(t * pc + g * COL_GROUP).cast::<i32>().read_unaligned() };
        *a = _mm512_dpbusd_epi32(*a, _mm512_set1_epi32(xv), wv);
    }
}
