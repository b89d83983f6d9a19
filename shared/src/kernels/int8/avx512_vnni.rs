//! AVX-512 VNNI W8A8 kernel: `vpdpbusd` of the broadcast activation bytes (u8) against one
//! 64-byte R16C4 chunk (s8) per column group, 16 rows per zmm.
//!
//! Owns the x86_64 AVX-512 code; the safe API, the shape checks and the dequantisation live in
//! `mod.rs`; the tiling driver, shared with `avx2.rs`, in `tiling.rs`.
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

use super::tiling::{self, CHUNK, Int8Tile, PREFETCH_BYTES, Tile};
use super::{COL_GROUP, MatrixRef, ROW_BLOCK, Sink};

/// Tokens per tile: 8 accumulators, the weight chunk and a broadcast fit easily in 32 zmm.
const MAX_TOKENS: usize = 8;

/// Every token `t < n` against every row block, handed to `sink`: the shared driver
/// [`tiling::gemm`] over this module's tiles (see the module docs).
///
/// # Safety
///
/// The CPU must support AVX-512 F, BW and VNNI (`Int8Isa::Avx512Vnni.is_available()`).
/// `m.packed.len() == padded_rows · padded_cols`, `m.row_sums.len() == padded_rows` and
/// `x_q.len() >= n · padded_cols`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn gemm(m: MatrixRef<'_>, x_q: &[u8], n: usize, sink: &mut Sink<'_>) {
    // SAFETY: this function's features are Avx512Vnni's; the rest of the contract is the caller's.
    unsafe { tiling::gemm::<Avx512Vnni>(m, x_q, n, sink) }
}

/// The AVX-512 VNNI tiles ([`Int8Tile`]), for [`tiling::gemm`].
struct Avx512Vnni;

impl Int8Tile for Avx512Vnni {
    /// `128 · row_sums[r0 + r]` in lane `r`: what each lane subtracts at the end.
    type Sums<'a> = __m512i;

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn sums(m: &MatrixRef<'_>, r0: usize) -> __m512i {
        // SAFETY: the caller guarantees the 16 row sums at r0 are in bounds.
        _mm512_slli_epi32::<7>(unsafe { _mm512_loadu_si512(m.row_sums.as_ptr().add(r0).cast()) })
    }

    /// The exact token count up to [`MAX_TOKENS`], with more accumulator sets for fewer tokens.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn tile(tile: Tile<'_, __m512i>, left: usize, sink: &mut Sink<'_>) -> usize {
        // SAFETY: (every arm) the caller's contract, for T <= left tokens.
        unsafe {
            match left {
                1 => block::<1, 4>(tile, sink),
                2 => block::<2, 2>(tile, sink),
                3 => block::<3, 2>(tile, sink),
                4 => block::<4, 1>(tile, sink),
                5 => block::<5, 1>(tile, sink),
                6 => block::<6, 1>(tile, sink),
                7 => block::<7, 1>(tile, sink),
                _ => block::<MAX_TOKENS, 1>(tile, sink),
            }
        }
    }
}

/// One 16-row block against `T` tokens with `U` interleaved accumulator sets (for latency when
/// `T` is small); hands the results to `sink` and returns `T`.
///
/// # Safety
///
/// The AVX-512 features of [`gemm`]; `tile.w` is readable for `groups · 64` bytes (one row
/// block), `tile.x` for `(T − 1) · pc + groups · 4` bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn block<const T: usize, const U: usize>(
    tile: Tile<'_, __m512i>,
    sink: &mut Sink<'_>,
) -> usize {
    let Tile {
        m,
        w,
        x,
        pc,
        groups,
        sums: correction,
        t0,
        r0,
    } = tile;
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
            _mm512_storeu_si512(out.as_mut_ptr().cast(), _mm512_sub_epi32(total, correction));
        };
        sink.put(m, t0 + t, r0, &out);
    }
    T
}

/// Column group `g`: one weight chunk against `T` tokens' broadcast activation bytes.
///
/// # Safety
///
/// The AVX-512 features of [`gemm`]; `w` is readable for `(g + 1) · 64` bytes and `x` for
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
