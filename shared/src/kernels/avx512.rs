//! AVX-512 (F + BW + VL) bf16 × f32 kernels with f32 accumulation, 16 lanes.
//!
//! Owns the x86_64 AVX-512 code and its fixed summation order; the safe API, the shape checks
//! and the threading live in `mod.rs`; the tiling driver, shared with `avx2.rs`, in `tiling.rs`.
//!
//! # Summation order (the bitwise contract)
//!
//! Every output element `y[t][r] = Σ_j w[r][j] · x[t][j]` is computed the same way, whatever
//! tile it falls in and whichever function (GEMV or GEMM) computes it:
//!
//! 1. One 16-lane f32 accumulator starts at +0. Lane `l` takes columns `j ≡ l (mod 16)` in
//!    increasing `j`, one fused multiply-add per column (bf16 → f32 is exact).
//! 2. The last `cols mod 16` columns use a masked FMA; lanes past the end are left untouched.
//! 3. The 16 lanes are reduced by the fixed tree in [`hsum`].
//!
//! Tiles only decide how many such accumulators run side by side (to hide FMA latency and to
//! reuse each loaded weight vector across tokens and each activation vector across rows); they
//! never change an element's order, so GEMM row `t` equals GEMV on token `t` bit for bit, and
//! so does any split of the rows across threads.

use std::arch::x86_64::*;

use half::bf16;

use super::tiling::{self, Bf16Tile, Tile};

/// f32 lanes per vector.
const LANES: usize = 16;
/// Rows per tile when there is one token (GEMV): eight independent FMA chains share each
/// activation vector.
const GEMV_ROWS: usize = 8;
/// Rows × tokens per tile for GEMM: 16 accumulators, 4 weight and 4 activation vectors fit in
/// the 32 zmm registers; each converted weight vector feeds 4 tokens. Measured against 6 × 4,
/// 4 × 6, 3 × 8, 2 × 8 and 2 × 16 on 8192 × 2048 with 64 tokens: none was faster (4 × 4 and 6 × 4
/// tie; wider token blocks lose once 8 activation rows of 8 KiB no longer fit in L1).
const GEMM_ROWS: usize = 4;
/// See [`GEMM_ROWS`]. A chunk's last `< GEMM_TOKENS` tokens go 2 and then 1 at a time.
const GEMM_TOKENS: usize = 4;

/// Computes `y[t·ldy + r] = Σ_j w[r·cols + j] · x[t·cols + j]` for `r < rows`, `t < n`, in the
/// order described in the module docs, by the shared driver [`tiling::gemm`] over this
/// module's tile.
///
/// # Safety
///
/// The CPU must support AVX-512 F, BW, VL, AVX2 and FMA (`Isa::Avx512.is_available()`).
/// `w.len() == rows · cols` and `x.len() == n · cols` (checked). For every `t < n` and
/// `r < rows`, `y.add(t · ldy + r)` must be valid for writes and not accessed by anyone else
/// during the call.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn gemm(
    w: &[bf16],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: *mut f32,
    ldy: usize,
) {
    // SAFETY: this function's features are Avx512's; the rest of the contract is the caller's.
    unsafe {
        tiling::gemm::<Avx512, GEMV_ROWS, GEMM_ROWS, GEMM_TOKENS>(w, rows, cols, x, n, y, ldy);
    }
}

/// The Avx512 microkernel ([`Bf16Tile::tile`]), for [`tiling::gemm`].
struct Avx512;

impl Bf16Tile for Avx512 {
    /// One tile: `R` consecutive weight rows at `w` (stride `cols`) against `T` consecutive
    /// activation rows at `x` (stride `cols`), writing `y[t·ldy + r]` for `t < T`, `r < R`.
    ///
    /// With `PREFETCH` (GEMV, where the weights stream from DRAM once), each step also prefetches
    /// into L2 as many bytes of the next tile as it consumes of this one. The next tile's rows
    /// follow this tile's contiguously, so the prefetch runs one tile ahead in address order; the
    /// hardware streamer alone, facing `R` concurrent short streams (one 4 KiB row each for
    /// `cols = 2048`), measured about 5–8% slower on one core (fastest of many 32 MiB GEMVs,
    /// 12.1–12.8 vs 13.2–13.7 GB/s). Prefetches never fault, so running past the matrix on the last
    /// tile is harmless. Prefetching changes no arithmetic.
    ///
    /// # Safety
    ///
    /// The AVX-512 features of [`gemm`]; `w` is readable for `R · cols` u16, `x` for `T · cols`
    /// f32, and `y.add(t·ldy + r)` writable for `t < T`, `r < R`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    #[inline]
    unsafe fn tile<const R: usize, const T: usize, const PREFETCH: bool>(tile: Tile) {
        let Tile { w, cols, x, y, ldy } = tile;
        let mut acc = [[_mm512_setzero_ps(); R]; T];
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
            let mut wv = [_mm512_setzero_ps(); R];
            for (r, v) in wv.iter_mut().enumerate() {
                // SAFETY: k + 16 <= cols, so the 16 u16 at row r, column k are in bounds.
                *v = widen(unsafe { _mm256_loadu_si256(w.add(r * cols + k).cast()) });
            }
            for (t, acc_t) in acc.iter_mut().enumerate() {
                // SAFETY: k + 16 <= cols, so the 16 f32 at token t, column k are in bounds.
                let xv = unsafe { _mm512_loadu_ps(x.add(t * cols + k)) };
                for (a, &wr) in acc_t.iter_mut().zip(&wv) {
                    *a = _mm512_fmadd_ps(wr, xv, *a);
                }
            }
            k += LANES;
        }
        if k < cols {
            let mask: __mmask16 = (1u16 << (cols - k)) - 1;
            let mut wv = [_mm512_setzero_ps(); R];
            for (r, v) in wv.iter_mut().enumerate() {
                // SAFETY: masked-off elements are not read (AVX-512 suppresses their faults); the
                // cols - k selected u16 of row r are in bounds.
                *v = widen(unsafe { _mm256_maskz_loadu_epi16(mask, w.add(r * cols + k).cast()) });
            }
            for (t, acc_t) in acc.iter_mut().enumerate() {
                // SAFETY: as above, for the cols - k selected f32 of token t.
                let xv = unsafe { _mm512_maskz_loadu_ps(mask, x.add(t * cols + k)) };
                for (a, &wr) in acc_t.iter_mut().zip(&wv) {
                    *a = _mm512_mask3_fmadd_ps(wr, xv, *a, mask);
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

/// Sixteen bf16 (as u16) to sixteen f32: zero-extend to 32 bits and shift into the high half,
/// which is exactly the f32 with the same sign, exponent and top mantissa bits.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
#[inline]
fn widen(v: __m256i) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(v)))
}

/// The fixed horizontal reduction of the 16 lanes `v[0..16]`:
/// `a[i] = v[i] + v[i+8]` (i < 8), `b[i] = a[i] + a[i+4]` (i < 4), `c[i] = b[i] + b[i+2]`
/// (i < 2), result `c[0] + c[1]`. Written out rather than `_mm512_reduce_add_ps` so the order
/// is ours, not the compiler's. Also the reduction of the f32 vector kernels (`vecf32/avx512.rs`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
#[inline]
pub(super) fn hsum(v: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    let a = _mm256_add_ps(lo, hi);
    let b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
    let c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    let d = _mm_add_ss(c, _mm_shuffle_ps::<0b01>(c, c));
    _mm_cvtss_f32(d)
}
