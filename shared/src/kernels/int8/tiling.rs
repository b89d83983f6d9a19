//! The int8 tiling driver shared by the SIMD kernels (`avx2`, `avx512_vnni`): row blocks in
//! order, and within each the tokens in tiles, written once over [`Int8Tile`].
//!
//! Each ISA module implements [`Int8Tile`] with its row-block preparation and its microkernel
//! (the intrinsics inner loop), and calls [`gemm`] from its own `#[target_feature]` entry point.
//! The driver is `#[inline(always)]` and carries no target features of its own, so it inlines
//! into the ISA's entry point and the `#[target_feature]` `#[inline]` microkernels inline into
//! that in turn: the machine code is that of the per-ISA drivers this replaced.
//!
//! The driver only decides which tokens a tile covers; integer sums do not depend on order, so
//! every tiling gives the same accumulators (see `mod.rs`).

use super::{COL_GROUP, MatrixRef, ROW_BLOCK, Sink};

/// Bytes per R16C4 chunk: one row block's column group (a zmm; four ymm quarters after AVX2
/// widens them).
pub(super) const CHUNK: usize = ROW_BLOCK * COL_GROUP;
/// How far ahead of the current weight chunk to prefetch, into L2 (`_MM_HINT_T1`). Measured on
/// the expert shapes streaming from DRAM: the hardware prefetcher alone already reaches the
/// probe's bandwidth for one token, but with 8 tokens (compute and loads interleaved) this
/// prefetch is worth ≈ 30%; 1–2 KiB or into L1 was worse. Prefetches never fault, so running
/// past the end of the matrix is harmless; prefetching changes no arithmetic.
pub(super) const PREFETCH_BYTES: usize = 4096;

/// What one tile works on: the 16-row block at row `r0` against the tokens from `t0` on. One
/// `Copy` value, so the microkernels' signatures stay short.
#[derive(Clone, Copy)]
pub(super) struct Tile<'a, S> {
    /// The matrix, for [`Sink::put`].
    pub m: &'a MatrixRef<'a>,
    /// The block's packed bytes: `groups` chunks of 64.
    pub w: *const i8,
    /// Token `t0`'s quantised activations; token `t0 + t` starts `t · pc` bytes later.
    pub x: *const u8,
    /// Padded columns: the stride of `x`.
    pub pc: usize,
    /// Column groups (`pc / COL_GROUP`): the chunks per block.
    pub groups: usize,
    /// The ISA's form of the block's row sums ([`Int8Tile::Sums`]).
    pub sums: S,
    /// The first token of the tile.
    pub t0: usize,
    /// The first row of the block.
    pub r0: usize,
}

/// An ISA's row-block preparation and tile microkernels.
pub(super) trait Int8Tile {
    /// The block's row sums as the microkernels use them, prepared once per block (borrowed
    /// from the matrix for `'a`, or a vector).
    type Sums<'a>: Copy;

    /// The row sums of the 16 rows from `r0`.
    ///
    /// # Safety
    ///
    /// The CPU supports the implementing ISA; `m.row_sums` holds at least `r0 + 16` entries.
    unsafe fn sums<'a>(m: &MatrixRef<'a>, r0: usize) -> Self::Sums<'a>;

    /// The block against the widest tile of tokens the ISA has for `left` remaining tokens,
    /// handed to `sink`; returns how many tokens it covered (`1..=left`).
    ///
    /// # Safety
    ///
    /// The CPU supports the implementing ISA; `tile.w` is readable for `groups · 64` bytes and
    /// `tile.x` for `left` tokens of `pc` bytes.
    unsafe fn tile(tile: Tile<'_, Self::Sums<'_>>, left: usize, sink: &mut Sink<'_>) -> usize;
}

/// Every token `t < n` against every row block, in tiles of `K`'s choosing, handed to `sink`.
///
/// # Safety
///
/// The CPU must support `K`'s ISA. `m.packed.len() == padded_rows · padded_cols`,
/// `m.row_sums.len() == padded_rows` and `x_q.len() >= n · padded_cols`.
#[inline(always)]
pub(super) unsafe fn gemm<K: Int8Tile>(
    m: MatrixRef<'_>,
    x_q: &[u8],
    n: usize,
    sink: &mut Sink<'_>,
) {
    let pc = m.padded_cols();
    let groups = pc / COL_GROUP;
    for rb in 0..m.padded_rows() / ROW_BLOCK {
        let r0 = rb * ROW_BLOCK;
        let w = m.packed[r0 * pc..].as_ptr();
        // SAFETY: row_sums holds padded_rows entries, so the 16 at r0 are in bounds.
        let sums = unsafe { K::sums(&m, r0) };
        let mut t = 0;
        while t < n {
            let tile = Tile {
                m: &m,
                w,
                x: x_q[t * pc..].as_ptr(),
                pc,
                groups,
                sums,
                t0: t,
                r0,
            };
            // SAFETY: w points at this block's 16 · pc bytes; x at tokens t.. of x_q, of which
            // n − t remain, each pc bytes long.
            t += unsafe { K::tile(tile, n - t, sink) };
        }
    }
}
