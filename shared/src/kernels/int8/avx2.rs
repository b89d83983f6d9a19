//! AVX2 W8A8 kernel: exact, with bytes widened to i16 and multiplied by `vpmaddwd`.
//!
//! Owns the x86_64 AVX2 code; the safe API, the shape checks and the dequantisation live in
//! `mod.rs`; the tiling driver, shared with `avx512_vnni.rs`, in `tiling.rs`.
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

use super::tiling::{self, CHUNK, Int8Tile, PREFETCH_BYTES, Tile};
use super::{COL_GROUP, MatrixRef, ROW_BLOCK, Sink};

/// Tokens per tile: 4 accumulators per token plus a weight and a broadcast register per token
/// must fit the 16 ymm registers.
const MAX_TOKENS: usize = 2;

/// Every token `t < n` against every row block, handed to `sink`: the shared driver
/// [`tiling::gemm`] over this module's tiles (see the module docs).
///
/// # Safety
///
/// The CPU must support AVX2 (`Int8Isa::Avx2.is_available()`). `m.packed.len() ==
/// padded_rows · padded_cols`, `m.row_sums.len() == padded_rows` and `x_q.len() >= n ·
/// padded_cols`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn gemm(m: MatrixRef<'_>, x_q: &[u8], n: usize, sink: &mut Sink<'_>) {
    // SAFETY: this function's feature is Avx2's; the rest of the contract is the caller's.
    unsafe { tiling::gemm::<Avx2>(m, x_q, n, sink) }
}

/// The AVX2 tiles ([`Int8Tile`]), for [`tiling::gemm`].
struct Avx2;

impl Int8Tile for Avx2 {
    /// The 16 row sums as they are stored.
    type Sums<'a> = &'a [i32; ROW_BLOCK];

    #[inline]
    unsafe fn sums<'a>(m: &MatrixRef<'a>, r0: usize) -> &'a [i32; ROW_BLOCK] {
        m.row_sums[r0..r0 + ROW_BLOCK]
            .try_into()
            .expect("16 row sums")
    }

    /// [`MAX_TOKENS`] tokens while that many remain, then one at a time.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn tile(tile: Tile<'_, &[i32; ROW_BLOCK]>, left: usize, sink: &mut Sink<'_>) -> usize {
        // SAFETY: (both arms) the caller's contract, for T <= left tokens.
        unsafe {
            if left >= MAX_TOKENS {
                block::<MAX_TOKENS>(tile, sink)
            } else {
                block::<1>(tile, sink)
            }
        }
    }
}

/// One 16-row block against `T` tokens; hands the results to `sink` and returns `T`.
///
/// # Safety
///
/// The AVX2 feature; `tile.w` is readable for `groups · 64` bytes (one row block), `tile.x` for
/// `(T − 1) · pc + groups · 4` bytes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn block<const T: usize>(tile: Tile<'_, &[i32; ROW_BLOCK]>, sink: &mut Sink<'_>) -> usize {
    let Tile {
        m,
        w,
        x,
        pc,
        groups,
        sums,
        t0,
        r0,
    } = tile;
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
