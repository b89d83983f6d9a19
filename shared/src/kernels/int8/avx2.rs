//! AVX2 W8A8 kernel: exact, with bytes widened to i16 and multiplied by `vpmaddwd`.
//!
//! Owns the x86_64 AVX2 code; the safe API, the shape checks and the dequantisation live in
//! `mod.rs`. The structure mirrors `avx512_vnni.rs`.
//!
//! # Why not `vpmaddubsw`
//!
//! `_mm256_maddubs_epi16` adds two u8 × s8 products into an i16 with saturation, and
//! `2 · 255 · 127 = 64770 > 32767`, so it would clip real activation/weight pairs. Instead
//! each quarter of a 64-byte R16C4 chunk (4 rows × 4 columns) is sign-extended to 16 i16
//! (`vpmovsxbw`), the 4 activation bytes are zero-extended to i16 and repeated 4 times
//! (`vpmovzxbw`), and `vpmaddwd` sums adjacent i16 × i16 products into i32 lanes — exact,
//! since its only overflow case is two `−32768 · −32768` products.
//!
//! # Arithmetic
//!
//! Lane `2j + h` of accumulator `k` collects row `4k + j`, columns `≡ 2h, 2h + 1 (mod 4)`, of
//! `Σ_c w[r][c] · x_q[c]`; the two halves are added at the end and `128 · row_sums[r]` is
//! subtracted, giving the exact `Σ_c w[r][c] · (x_q[c] − 128)` — the same integer as every
//! other ISA.

use std::arch::x86_64::*;

use super::{COL_GROUP, Int8Isa, MatrixRef, ROW_BLOCK, Sink};

/// Bytes per R16C4 chunk (four ymm quarters after widening).
const CHUNK: usize = ROW_BLOCK * COL_GROUP;
/// Tokens per tile: 4 accumulators per token plus a weight and a broadcast register per token
/// must fit the 16 ymm registers.
const MAX_TOKENS: usize = 2;
/// How far ahead of the current weight chunk to prefetch, into L2 (`_MM_HINT_T1`). Measured on
/// the expert shapes streaming from DRAM: the hardware prefetcher alone already reaches the
/// probe's bandwidth for one token, but with 8 tokens (compute and loads interleaved) this
/// prefetch is worth ≈ 30%; 1–2 KiB or into L1 was worse. Prefetches never fault, so running
/// past the end of the matrix is harmless; prefetching changes no arithmetic.
const PREFETCH_BYTES: usize = 4096;

/// The safe entry point: checks the CPU feature, then runs [`gemm_impl`].
///
/// # Panics
///
/// Panics unless the CPU has AVX2, `m`'s slices match its shape and `x_q` holds at least
/// `n · padded_cols` bytes.
pub(super) fn gemm(m: MatrixRef<'_>, x_q: &[u8], n: usize, sink: &mut Sink<'_>) {
    assert!(
        Int8Isa::Avx2.is_available(),
        "int8: AVX2 is not available on this CPU"
    );
    m.assert_shape();
    assert!(
        x_q.len() >= n * m.padded_cols(),
        "int8: activations shorter than n rows"
    );
    // SAFETY: the feature was just detected; the shapes were just checked.
    unsafe { gemm_impl(m, x_q, n, sink) }
}

/// Every token `t < n` against every row block, handed to `sink` (see the module docs).
///
/// # Safety
///
/// The CPU must support AVX2. `m.packed.len() == padded_rows · padded_cols`,
/// `m.row_sums.len() == padded_rows` and `x_q.len() >= n · padded_cols`.
#[target_feature(enable = "avx2")]
unsafe fn gemm_impl(m: MatrixRef<'_>, x_q: &[u8], n: usize, sink: &mut Sink<'_>) {
    let pc = m.padded_cols();
    let groups = pc / COL_GROUP;
    for rb in 0..m.padded_rows() / ROW_BLOCK {
        let r0 = rb * ROW_BLOCK;
        let w = m.packed[r0 * pc..].as_ptr();
        let sums: &[i32; ROW_BLOCK] = m.row_sums[r0..r0 + ROW_BLOCK]
            .try_into()
            .expect("16 row sums");
        let mut t = 0;
        while t < n {
            let x = x_q[t * pc..].as_ptr();
            // SAFETY (both arms): w points at this block's 16 · pc bytes; x at tokens t.. of
            // x_q, of which at least T remain, each pc bytes long.
            t += unsafe {
                if n - t >= MAX_TOKENS {
                    block::<MAX_TOKENS>(&m, w, x, pc, groups, sums, sink, t, r0)
                } else {
                    block::<1>(&m, w, x, pc, groups, sums, sink, t, r0)
                }
            };
        }
    }
}

/// One 16-row block against `T` tokens; hands the results to `sink` and returns `T`.
///
/// # Safety
///
/// The AVX2 feature; `w` is readable for `groups · 64` bytes (one row block), `x` for
/// `(T − 1) · pc + groups · 4` bytes.
#[target_feature(enable = "avx2")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn block<const T: usize>(
    m: &MatrixRef<'_>,
    w: *const i8,
    x: *const u8,
    pc: usize,
    groups: usize,
    sums: &[i32; ROW_BLOCK],
    sink: &mut Sink<'_>,
    t0: usize,
    r0: usize,
) -> usize {
    let mut acc = [[_mm256_setzero_si256(); 4]; T];
    for g in 0..groups {
        let chunk = w.wrapping_add(g * CHUNK);
        _mm_prefetch::<_MM_HINT_T1>(chunk.wrapping_add(PREFETCH_BYTES));
        let mut xb = [_mm256_setzero_si256(); T];
        for (t, v) in xb.iter_mut().enumerate() {
            // SAFETY: token t's bytes g·4..g·4 + 4 are in bounds; read_unaligned needs no
            // alignment.
            let bytes = unsafe { x.add(t * pc + g * COL_GROUP).cast::<i32>().read_unaligned() };
            *v = _mm256_cvtepu8_epi16(_mm_set1_epi32(bytes));
        }
        for k in 0..4 {
            // SAFETY: g < groups, so the 16 bytes of quarter k of chunk g are in bounds.
            let wv = _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(chunk.add(16 * k).cast()) });
            for (acc_t, &xv) in acc.iter_mut().zip(&xb) {
                acc_t[k] = _mm256_add_epi32(acc_t[k], _mm256_madd_epi16(wv, xv));
            }
        }
    }
    for (t, acc_t) in acc.iter().enumerate() {
        let mut halves = [0i32; 2 * ROW_BLOCK];
        for (k, &a) in acc_t.iter().enumerate() {
            // SAFETY: halves holds 32 i32; quarter k's 8 lanes go to 8k..8k + 8.
            unsafe { _mm256_storeu_si256(halves.as_mut_ptr().add(8 * k).cast(), a) };
        }
        let mut out = [0i32; ROW_BLOCK];
        for (r, o) in out.iter_mut().enumerate() {
            // Wrapping, like the AVX-512 lanes; exact for well-formed matrices (`MAX_COLS`).
            *o = halves[2 * r]
                .wrapping_add(halves[2 * r + 1])
                .wrapping_sub(sums[r].wrapping_mul(128));
        }
        sink.put(m, t0 + t, r0, &out);
    }
    T
}
