//! The bf16 × f32 tiling driver shared by the SIMD kernels (`avx2`, `avx512`): row panels,
//! token chunks, GEMV and GEMM tiles and their tails, written once over [`Bf16Tile`].
//!
//! Each ISA module implements [`Bf16Tile`] with its tile microkernel (the intrinsics inner loop,
//! which fixes the summation order: see that module's docs) and calls [`gemm`] from its own
//! `#[target_feature]` entry point with its tile shape as const parameters. The driver is
//! `#[inline(always)]` and carries no target features of its own, so it inlines into the ISA's
//! entry point, and the `#[target_feature]` `#[inline]` microkernel inlines into that in turn:
//! the machine code matches the per-ISA drivers this replaced (checked with `objdump`: the
//! AVX-512 `gemm` is the same size with the same instructions, the AVX2 one differs only in
//! loop control).
//!
//! The driver only decides which elements a tile computes; a tile computes each of them in the
//! ISA's one fixed order, so GEMM row `t` equals GEMV on token `t` bit for bit, and so does any
//! split of the rows across threads.

use half::bf16;

/// Bytes of weights per GEMM row panel: the panel stays in L2 while every token block of the
/// activation chunk streams past it.
const PANEL_WEIGHT_BYTES: usize = 128 << 10;
/// Bytes of activations per GEMM token chunk, so the chunk stays in L2 across row panels.
const CHUNK_ACTIVATION_BYTES: usize = 512 << 10;

/// What one tile works on: weight rows at `w` against activation rows at `x`, both `cols`
/// elements long, into `y` with row stride `ldy`. One `Copy` value, so the microkernels'
/// signatures stay short.
#[derive(Clone, Copy)]
pub(super) struct Tile {
    /// The first weight row (bf16 as u16); row `r` starts `r · cols` elements later.
    pub w: *const u16,
    /// Columns: the length of every row and the stride of `w` and `x`.
    pub cols: usize,
    /// The first activation row; token `t` starts `t · cols` elements later.
    pub x: *const f32,
    /// Output element (token 0, row 0); element `(t, r)` is at `y.add(t·ldy + r)`.
    pub y: *mut f32,
    /// The output's token stride.
    pub ldy: usize,
}

/// An ISA's tile microkernel.
pub(super) trait Bf16Tile {
    /// One tile: `R` consecutive weight rows at `tile.w` against `T` consecutive activation rows
    /// at `tile.x`, writing `y[t·ldy + r]` for `t < T`, `r < R`, each element in the ISA's fixed
    /// summation order. `PREFETCH` (GEMV, where the weights stream from DRAM once) prefetches
    /// the next tile's weights; it changes no arithmetic.
    ///
    /// # Safety
    ///
    /// The CPU supports the implementing ISA; `w` is readable for `R · cols` u16, `x` for
    /// `T · cols` f32, and `y.add(t·ldy + r)` writable for `t < T`, `r < R`.
    unsafe fn tile<const R: usize, const T: usize, const PREFETCH: bool>(tile: Tile);
}

/// Computes `y[t·ldy + r] = Σ_j w[r·cols + j] · x[t·cols + j]` for `r < rows`, `t < n` with
/// `K`'s tiles: `GEMV_ROWS × 1` (prefetching) when `n == 1`; otherwise `GEMM_ROWS ×
/// GEMM_TOKENS` tiles over L2-sized row panels and token chunks, a chunk's last
/// `< GEMM_TOKENS` tokens going 2 and then 1 at a time. Rows left over by any tile go one at a
/// time.
///
/// # Safety
///
/// The CPU must support `K`'s ISA. `w.len() == rows · cols` and `x.len() == n · cols`
/// (checked). For every `t < n` and `r < rows`, `y.add(t · ldy + r)` must be valid for writes
/// and not accessed by anyone else during the call.
#[inline(always)]
pub(super) unsafe fn gemm<
    K: Bf16Tile,
    const GEMV_ROWS: usize,
    const GEMM_ROWS: usize,
    const GEMM_TOKENS: usize,
>(
    w: &[bf16],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: *mut f32,
    ldy: usize,
) {
    assert_eq!(w.len(), rows * cols);
    assert_eq!(x.len(), n * cols);
    // bf16 is `repr(transparent)` over u16.
    let w = w.as_ptr().cast::<u16>();
    let x = x.as_ptr();
    if n == 1 {
        // SAFETY: rows 0..rows of w and token 0 of x are in bounds; y's contract is the caller's.
        unsafe { row_range::<K, GEMV_ROWS, 1, true>(w, 0, rows, cols, x, y, ldy) };
        return;
    }
    let panel_rows =
        (PANEL_WEIGHT_BYTES / (2 * cols.max(1))).max(GEMM_ROWS) / GEMM_ROWS * GEMM_ROWS;
    let chunk_tokens =
        (CHUNK_ACTIVATION_BYTES / (4 * cols.max(1))).max(GEMM_TOKENS) / GEMM_TOKENS * GEMM_TOKENS;
    for t_chunk in (0..n).step_by(chunk_tokens) {
        let t_chunk_end = n.min(t_chunk + chunk_tokens);
        for r_panel in (0..rows).step_by(panel_rows) {
            let r_panel_end = rows.min(r_panel + panel_rows);
            let mut t0 = t_chunk;
            while t0 < t_chunk_end {
                let xt = x.wrapping_add(t0 * cols);
                let yt = y.wrapping_add(t0 * ldy);
                let left = t_chunk_end - t0;
                let (r0, r1) = (r_panel, r_panel_end);
                // SAFETY: each arm reads tokens t0..t0 + T with T <= left, in bounds of x, and rows
                // r_panel..r_panel_end, in bounds of w; every (t, r) written is one the caller
                // guarantees writable.
                t0 += unsafe {
                    if left >= GEMM_TOKENS {
                        row_range::<K, GEMM_ROWS, GEMM_TOKENS, false>(w, r0, r1, cols, xt, yt, ldy);
                        GEMM_TOKENS
                    } else if left >= 2 {
                        row_range::<K, GEMM_ROWS, 2, false>(w, r0, r1, cols, xt, yt, ldy);
                        2
                    } else {
                        row_range::<K, GEMM_ROWS, 1, false>(w, r0, r1, cols, xt, yt, ldy);
                        1
                    }
                };
            }
        }
    }
}

/// Rows `r_begin..r_end` against the `T` tokens at `x`, `R` rows at a time, then one row at a
/// time for the remainder.
///
/// # Safety
///
/// `K`'s ISA; `w` holds rows `..r_end` of `cols` u16 each; `x` holds `T` rows of `cols` f32;
/// `y.add(t·ldy + r)` is writable for `t < T`, `r_begin <= r < r_end`.
#[inline(always)]
unsafe fn row_range<K: Bf16Tile, const R: usize, const T: usize, const PREFETCH: bool>(
    w: *const u16,
    r_begin: usize,
    r_end: usize,
    cols: usize,
    x: *const f32,
    y: *mut f32,
    ldy: usize,
) {
    let mut r = r_begin;
    while r + R <= r_end {
        // SAFETY: rows r..r + R are below r_end; the rest is this function's contract.
        unsafe {
            K::tile::<R, T, PREFETCH>(Tile {
                w: w.wrapping_add(r * cols),
                cols,
                x,
                y: y.wrapping_add(r),
                ldy,
            });
        };
        r += R;
    }
    while r < r_end {
        // SAFETY: as above, for the single row r.
        unsafe {
            K::tile::<1, T, PREFETCH>(Tile {
                w: w.wrapping_add(r * cols),
                cols,
                x,
                y: y.wrapping_add(r),
                ldy,
            });
        };
        r += 1;
    }
}
