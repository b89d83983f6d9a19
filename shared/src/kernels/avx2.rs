//! AVX2 + FMA bf16 × f32 kernels with f32 accumulation, 8 lanes.
//!
//! Owns the x86_64 AVX2 code and its fixed summation order; the safe API, the shape checks and
//! the threading live in `mod.rs`; the tiling driver, shared with `avx512.rs`, in `tiling.rs`.
//!
//! # Summation order (the bitwise contract)
//!
//! Every output element `y[t][r] = Σ_j w[r][j] · x[t][j]` is computed the same way, whatever
//! tile it falls in and whichever function (GEMV or GEMM) computes it:
//!
//! 1. One 8-lane f32 accumulator starts at +0. Lane `l` takes columns `j ≡ l (mod 8)` in
//!    increasing `j`, one fused multiply-add per column (bf16 → f32 is exact).
//! 2. The last `cols mod 8` columns go through one more FMA whose result is blended into the
//!    lanes they belong to; the other lanes are left untouched.
//! 3. The 8 lanes are reduced by the fixed tree in [`hsum`].
//!
//! Tiles never change an element's order, so GEMM row `t` equals GEMV on token `t` bit for
//! bit, and so does any split of the rows across threads. The order differs from AVX-512's
//! (8 lanes, not 16), so results agree across ISAs only within the tested tolerance.

use std::arch::x86_64::*;

use half::bf16;

use super::tiling::{self, Bf16Tile, Tile};

/// f32 lanes per vector.
const LANES: usize = 8;
/// Rows per tile when there is one token (GEMV): eight accumulators plus the activation and a
/// weight vector fit the 16 ymm registers.
const GEMV_ROWS: usize = 8;
/// Rows × tokens per tile for GEMM: 8 accumulators, 2 weight and 4 activation vectors.
const GEMM_ROWS: usize = 2;
/// See [`GEMM_ROWS`]. A chunk's last `< GEMM_TOKENS` tokens go 2 and then 1 at a time.
const GEMM_TOKENS: usize = 4;

/// Computes `y[t·ldy + r] = Σ_j w[r·cols + j] · x[t·cols + j]` for `r < rows`, `t < n`, in the
/// order described in the module docs, by the shared driver [`tiling::gemm`] over this
/// module's tile.
///
/// # Safety
///
/// The CPU must support AVX2 and FMA (`Isa::Avx2.is_available()`).
/// `w.len() == rows · cols` and `x.len() == n · cols` (checked). For every `t < n` and
/// `r < rows`, `y.add(t · ldy + r)` must be valid for writes and not accessed by anyone else
/// during the call.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn gemm(
    w: &[bf16],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: *mut f32,
    ldy: usize,
) {
    // SAFETY: this function's features are Avx2's; the rest of the contract is the caller's.
    unsafe { tiling::gemm::<Avx2, GEMV_ROWS, GEMM_ROWS, GEMM_TOKENS>(w, rows, cols, x, n, y, ldy) }
}

/// The Avx2 microkernel ([`Bf16Tile::tile`]), for [`tiling::gemm`].
struct Avx2;

impl Bf16Tile for Avx2 {
    /// One tile: `R` consecutive weight rows at `w` (stride `cols`) against `T` consecutive
    /// activation rows at `x` (stride `cols`), writing `y[t·ldy + r]` for `t < T`, `r < R`.
    ///
    /// With `PREFETCH` (GEMV, where the weights stream from DRAM once), each step also prefetches
    /// into L2 as many bytes of the next tile as it consumes of this one. The next tile's rows
    /// follow this tile's contiguously, so the prefetch runs one tile ahead in address order; the
    /// hardware streamer alone, facing `R` concurrent short streams (one 4 KiB row each for
    /// `cols = 2048`), measured about 5–8% slower with the AVX-512 kernel, whose memory access
    /// pattern this one shares. Prefetches never fault, so running past the matrix on the last tile
    /// is harmless. Prefetching changes no arithmetic.
    ///
    /// # Safety
    ///
    /// AVX2 and FMA; `w` is readable for `R · cols` u16, `x` for `T · cols` f32, and
    /// `y.add(t·ldy + r)` writable for `t < T`, `r < R`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn tile<const R: usize, const T: usize, const PREFETCH: bool>(tile: Tile) {
        let Tile { w, cols, x, y, ldy } = tile;
        let mut acc = [[_mm256_setzero_ps(); R]; T];
        let full = cols - cols % LANES;
        let mut k = 0;
        // PERF-CRITICAL: decode streams every dense weight through this loop once per token.
        while k < full {
            if PREFETCH {
                let next = w.wrapping_add(R * cols + R * k).cast::<i8>();
                for line in (0..R * LANES * 2).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(line));
                }
            }
            let mut wv = [_mm256_setzero_ps(); R];
            for (r, v) in wv.iter_mut().enumerate() {
                // SAFETY: k + 8 <= cols, so the 8 u16 at row r, column k are in bounds.
                *v = widen(unsafe { _mm_loadu_si128(w.add(r * cols + k).cast()) });
            }
            for (t, acc_t) in acc.iter_mut().enumerate() {
                // SAFETY: k + 8 <= cols, so the 8 f32 at token t, column k are in bounds.
                let xv = unsafe { _mm256_loadu_ps(x.add(t * cols + k)) };
                for (a, &wr) in acc_t.iter_mut().zip(&wv) {
                    *a = _mm256_fmadd_ps(wr, xv, *a);
                }
            }
            k += LANES;
        }
        let tail = cols - k;
        if tail > 0 {
            // Lane l is selected (all ones) when l < tail; `maskload` reads only selected lanes.
            let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let select = _mm256_cmpgt_epi32(_mm256_set1_epi32(tail as i32), lane);
            let mut wv = [_mm256_setzero_ps(); R];
            for (r, v) in wv.iter_mut().enumerate() {
                // AVX2 has no 16-bit masked load, so the tail goes through a zeroed stack buffer.
                let mut buf = [0u16; LANES];
                // SAFETY: the `tail` u16 at row r, column k are in bounds (k + tail == cols), and
                // `buf` has room for them.
                unsafe {
                    std::ptr::copy_nonoverlapping(w.add(r * cols + k), buf.as_mut_ptr(), tail);
                };
                // SAFETY: `buf` is 16 readable bytes.
                *v = widen(unsafe { _mm_loadu_si128(buf.as_ptr().cast()) });
            }
            for (t, acc_t) in acc.iter_mut().enumerate() {
                // SAFETY: only the `tail` selected f32 of token t are read, and they are in bounds.
                let xv = unsafe { _mm256_maskload_ps(x.add(t * cols + k), select) };
                for (a, &wr) in acc_t.iter_mut().zip(&wv) {
                    let sum = _mm256_fmadd_ps(wr, xv, *a);
                    *a = _mm256_blendv_ps(*a, sum, _mm256_castsi256_ps(select));
                }
            }
        }
        for (t, acc_t) in acc.iter().enumerate() {
            for (r, &a) in acc_t.iter().enumerate() {
                // SAFETY: t < T and r < R, which the caller guarantees writable.
                unsafe { y.add(t * ldy + r).write(hsum(a)) };
            }
        }
    }
}

/// Eight bf16 (as u16) to eight f32: zero-extend to 32 bits and shift into the high half.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn widen(v: __m128i) -> __m256 {
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(v)))
}

/// The fixed horizontal reduction of the 8 lanes `v[0..8]`: `b[i] = v[i] + v[i+4]` (i < 4),
/// `c[i] = b[i] + b[i+2]` (i < 2), result `c[0] + c[1]` — the last three levels of the AVX-512
/// tree. Also the reduction of the f32 vector kernels (`vecf32/avx2.rs`).
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn hsum(v: __m256) -> f32 {
    let b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    let d = _mm_add_ss(c, _mm_shuffle_ps::<0b01>(c, c));
    _mm_cvtss_f32(d)
}
