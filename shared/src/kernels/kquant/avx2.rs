//! AVX2 k-quant kernel: exact per-super-block i32 sums with `vpmaddubsw` (codes as u8 against
//! activations as i8) and `vpmaddwd` against broadcast sub-block scales, then the shared fold.
//!
//! Owns the x86_64 AVX2 code; the safe API, the shape checks, the block formats and the fold
//! live in `mod.rs`. The AVX-512 kernel (`avx512.rs`) has the same structure with wider tiles.
//!
//! # Arithmetic
//!
//! For a super-block, row and token, an accumulator of 8 i32 lanes collects
//! `Σ_j sc_j · Σ_{i∈j} q_i·x_i`: `vpmaddubsw` adds two u8 × i8 products into an i16 (never
//! saturating: at most `2 · 63 · 128 = 16128` for 6-bit codes), and `vpmaddwd` multiplies each
//! i16 by its sub-block's scale (broadcast with `vpshufb`) and adds pairs into i32. The Q4_K
//! mins term `m = Σ_j m_j · Σ_{i∈j} x_i` and the Q6_K offset `−32 · Σ_j sc_j · Σ_{i∈j} x_i` come
//! from the activations' 16-value sums, packed to i16 (each |sum| ≤ 2048) and multiplied by
//! `vpmaddwd` as well (for Q6_K straight into the accumulator: the same integer `a` as the
//! scalar `Σ_j sc_j · Σ (q_i − 32)·x_i`). Eight accumulators at a time are reduced to eight
//! sums by one `vphaddd` tree; the sums are exact, so [`fold_q4k`] / [`fold_q6k`], called per
//! super-block in order, give the scalar kernel's bits.
//!
//! # Tiling
//!
//! Tokens go in groups of up to [`MAX_TOKENS`]; for each group, the rows of a row tile are
//! walked (row, block) by (row, block) in memory order, so the weights are one forward stream
//! (which the hardware prefetcher follows, helped by [`Plan::prefetch_ahead`]), and each unpacked
//! weight vector and scale is used for every token of the group. Pairs fill the slots of one
//! reduction (4 tokens × 1 pair, 2 × 2 or 1 × 4 for Q4_K, twice that for Q6_K); after it, the
//! slots are folded in order, so each row's blocks are folded in order. The row tile stays in
//! L1 across token groups, so the weights stream from DRAM once per call.

use std::arch::x86_64::*;

use super::fold_q6k;
use super::{KActsRef, KMatrixRef, KQuantKind, QK_K, SUM_GROUP, SUM32_GROUP, f16_at, fold_q4k};
use super::{Q4K_BLOCK_BYTES, Q6K_BLOCK_BYTES, padded_k};

/// Rows per row tile: what the token groups share from L1 (at most 16 · 4 KiB).
const ROWS: usize = 16;
/// The largest token group.
const MAX_TOKENS: usize = 4;
/// How far ahead of the block being read to prefetch (into L1): the weights are one forward
/// stream, which the hardware prefetcher alone follows at ~2/3 of the DRAM bandwidth here;
/// measured on the expert shapes (Q4_K gate_up, 1 token), 4 KiB into L1 beat 1–8 KiB into L1
/// or L2 and none by 5–35%. Prefetches never fault, so running past the matrix is harmless.
const PREFETCH_BYTES: usize = 4096;

/// `Y = dequant(X · Wᵀ)` for `n` tokens (the module docs), into `y` (`[n, rows]`).
///
/// # Safety
///
/// The CPU must support AVX2 (`Int8Isa::Avx2.is_available()`). The shapes must have been
/// checked (`gemm_k`).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn gemm(m: KMatrixRef<'_>, x: KActsRef<'_>, n: usize, y: &mut [f32]) {
    let p = Plan::new(m, x);
    match m.kind {
        KQuantKind::Q4K => drive(&p, n, y, [tile_q4::<4>, tile_q4::<2>, tile_q4::<1>]),
        KQuantKind::Q6K => drive(&p, n, y, [tile_q6::<4>, tile_q6::<2>, tile_q6::<1>]),
    }
}

/// A tile: rows `r0..r1` against the tokens from `t0` on, into `y`.
type TileFn = unsafe fn(&Plan<'_>, usize, usize, usize, &mut [f32]);

/// Row tiles of [`ROWS`]; within each, token groups of 4, 2, 1 (`tiles`, widest first).
#[target_feature(enable = "avx2")]
fn drive(p: &Plan<'_>, n: usize, y: &mut [f32], tiles: [TileFn; 3]) {
    let rows = p.rows();
    let mut r0 = 0;
    while r0 < rows {
        let r1 = rows.min(r0 + ROWS);
        let mut t0 = 0;
        while t0 < n {
            let g = group(n - t0, MAX_TOKENS);
            let tile = match g {
                4 => tiles[0],
                2 => tiles[1],
                _ => tiles[2],
            };
            // SAFETY: the tile functions need AVX2 (this function's) and t0 + g <= n tokens.
            unsafe { tile(p, r0, r1, t0, y) };
            t0 += g;
        }
        r0 = r1;
    }
}

/// What every tile of one call shares.
pub(super) struct Plan<'a> {
    m: KMatrixRef<'a>,
    x: KActsRef<'a>,
    /// Padded columns: the activations' row stride.
    pk: usize,
    /// Super-blocks per row.
    nb: usize,
    /// Bytes per row.
    rb: usize,
}

impl<'a> Plan<'a> {
    pub(super) fn new(m: KMatrixRef<'a>, x: KActsRef<'a>) -> Plan<'a> {
        let pk = padded_k(m.cols);
        Plan {
            m,
            x,
            pk,
            nb: pk / QK_K,
            rb: m.row_bytes(),
        }
    }

    /// Output rows.
    pub(super) fn rows(&self) -> usize {
        self.m.rows
    }

    /// Super-blocks per row.
    pub(super) fn blocks(&self) -> usize {
        self.nb
    }

    /// Row `r`'s super-block `b` (`BB` = the kind's block bytes).
    #[inline]
    pub(super) fn block<const BB: usize>(&self, r: usize, b: usize) -> &'a [u8; BB] {
        self.m.data[r * self.rb + b * BB..][..BB]
            .try_into()
            .expect("one block")
    }

    /// Tokens `t0..t0 + T`: pointers to each one's first activation and first 16-value sum,
    /// the whole range bounds-checked once here. For `b < blocks()`, token `t`'s super-block
    /// `b` is then the 256 bytes at `x[t] + 256b` and the 16 sums at `s[t] + 16b`.
    #[inline]
    pub(super) fn tokens<const T: usize>(&self, t0: usize) -> Tokens<T> {
        let (pk, g) = (self.pk, self.pk / SUM_GROUP);
        let q = &self.x.q[t0 * pk..(t0 + T) * pk];
        let sums = &self.x.sums[t0 * g..(t0 + T) * g];
        Tokens {
            x: std::array::from_fn(|t| q.as_ptr().wrapping_add(t * pk)),
            s: std::array::from_fn(|t| sums.as_ptr().wrapping_add(t * g)),
        }
    }

    /// Tokens `t0..t0 + T`: pointers to each one's first 32-value sum, the range bounds-checked
    /// once here. For `b < blocks()`, token `t`'s super-block `b` has its 8 sums at
    /// `s[t] + 8b`.
    #[inline]
    pub(super) fn sums32<const T: usize>(&self, t0: usize) -> [*const i16; T] {
        let g = self.pk / SUM32_GROUP;
        let sums = &self.x.sums32[t0 * g..(t0 + T) * g];
        std::array::from_fn(|t| sums.as_ptr().wrapping_add(t * g))
    }

    /// `y[t0 + t][r] = acc[t] · x_scale[t0 + t]`: a row's finished accumulators.
    #[inline]
    pub(super) fn store_row<const T: usize>(
        &self,
        acc: &[f32; T],
        r: usize,
        t0: usize,
        y: &mut [f32],
    ) {
        for (t, &a) in acc.iter().enumerate() {
            y[(t0 + t) * self.m.rows + r] = a * self.x.scales[t0 + t];
        }
    }

    /// Prefetches the [`PREFETCH_BYTES`] ahead of row `r`'s block `b` (`BB` bytes).
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(super) fn prefetch_ahead<const BB: usize>(&self, r: usize, b: usize) {
        let at = self
            .m
            .data
            .as_ptr()
            .wrapping_add(r * self.rb + b * BB + PREFETCH_BYTES);
        let mut line = 0;
        while line < BB {
            _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(line).cast());
            line += 64;
        }
    }
}

/// A position in a row range's (row, block) pairs, in memory order.
#[derive(Clone, Copy)]
pub(super) struct Cursor {
    /// The row.
    pub r: usize,
    /// The block.
    pub b: usize,
    /// Blocks per row.
    nb: usize,
}

impl Cursor {
    /// Row `r`'s first block.
    pub(super) fn new(r: usize, nb: usize) -> Cursor {
        Cursor { r, b: 0, nb }
    }

    /// Steps to the next pair; true if that finished row `r` (now `r + 1`).
    #[inline]
    pub(super) fn step(&mut self) -> bool {
        self.b += 1;
        if self.b == self.nb {
            (self.r, self.b) = (self.r + 1, 0);
            true
        } else {
            false
        }
    }
}
/// A tile's tokens, as [`Plan::tokens`] checked them.
#[derive(Clone, Copy)]
pub(super) struct Tokens<const T: usize> {
    /// Each token's activations.
    pub x: [*const i8; T],
    /// Each token's 16-value sums.
    pub s: [*const i32; T],
}

impl<const T: usize> Tokens<T> {
    /// The pointers for super-block `b`.
    #[inline]
    pub(super) fn block(&self, b: usize) -> Tokens<T> {
        Tokens {
            x: self.x.map(|x| x.wrapping_add(b * QK_K)),
            s: self.s.map(|s| s.wrapping_add(b * (QK_K / SUM_GROUP))),
        }
    }
}

/// The largest token group (a power of two ≤ `cap`) for `left` remaining tokens.
#[inline]
pub(super) fn group(left: usize, cap: usize) -> usize {
    let mut g = cap;
    while g > left {
        g /= 2;
    }
    g
}

/// The 16 bytes `[sc_0..sc_7, m_0..m_7]` of a Q4_K block's 12 packed scale bytes (ggml's
/// `utmp` unpacking on the words `u0, u1, u2` at bytes 4, 8, 12; equal to `q4k_scales_mins`):
/// `[u0 & 0x3F…, (u2 & 0x0F…) | (u0 >> 2 & 0x30…), u1 & 0x3F…, (u2 >> 4 & 0x0F…) | (u1 >> 2 &
/// 0x30…)]`.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn q4k_scales_mins_x(block: &[u8; Q4K_BLOCK_BYTES]) -> __m128i {
    // SAFETY: bytes 4..20 are within the 144 (the words u0, u1, u2 and 4 bytes of nibbles).
    let u = unsafe { _mm_loadu_si128(block.as_ptr().add(4).cast()) };
    let (low6, low4, top2) = (0x3F3F_3F3F, 0x0F0F_0F0F, 0x3030_3030);
    // [u0, u2, u1, u2 >> 4] masked, or [·, u0 >> 2, ·, u1 >> 2] masked.
    let a = _mm_srlv_epi32(
        _mm_shuffle_epi32::<0b10_01_10_00>(u),
        _mm_setr_epi32(0, 0, 0, 4),
    );
    let a = _mm_and_si128(a, _mm_setr_epi32(low6, low4, low6, low4));
    let b = _mm_srli_epi32::<2>(_mm_shuffle_epi32::<0b01_00_00_00>(u));
    _mm_or_si128(a, _mm_and_si128(b, _mm_setr_epi32(0, top2, 0, top2)))
}

/// Q4_K rows `r0..r1` against tokens `t0..t0 + T`: (row, block) pairs in memory order, `4 / T`
/// per reduction, each folded in order into its row's accumulators, stored when the row ends.
///
/// # Safety
///
/// The AVX2 feature; `t0 + T <= n`.
#[target_feature(enable = "avx2")]
unsafe fn tile_q4<const T: usize>(p: &Plan<'_>, r0: usize, r1: usize, t0: usize, y: &mut [f32]) {
    let slots = 4 / T;
    let tokens = p.tokens::<T>(t0);
    let mut acc = [0.0f32; T];
    if p.blocks() == 0 {
        (r0..r1).for_each(|r| p.store_row(&acc, r, t0, y));
        return;
    }
    let mut at = Cursor::new(r0, p.blocks());
    let mut left = (r1 - r0) * p.blocks();
    while left > 0 {
        // Constant trip counts (unrolled); only a row range's last reduction may be partial.
        let full = slots.min(left);
        left -= full;
        let (mut v, mut d) = ([_mm256_setzero_si256(); 8], [[0.0f32; 2]; 4]);
        let mut fold_at = at;
        for k in 0..slots {
            if k == full {
                break;
            }
            let block = p.block::<Q4K_BLOCK_BYTES>(at.r, at.b);
            p.prefetch_ahead::<Q4K_BLOCK_BYTES>(at.r, at.b);
            // SAFETY: b < blocks(), so each token's block is in bounds (`Plan::tokens`).
            let (a, m) = unsafe { q4k_slot::<T>(block, tokens.block(at.b)) };
            v[k * T..][..T].copy_from_slice(&a);
            v[4 + k * T..][..T].copy_from_slice(&m);
            d[k] = [f16_at(block, 0), f16_at(block, 2)];
            at.step();
        }
        let total = reduce8(&v);
        for (i, &[dk, dmin]) in d[..full].iter().enumerate() {
            for (t, a) in acc.iter_mut().enumerate() {
                *a = fold_q4k(*a, dk, dmin, total[i * T + t], total[4 + i * T + t]);
            }
            let r = fold_at.r;
            if fold_at.step() {
                p.store_row(&acc, r, t0, y);
                acc = [0.0; T];
            }
        }
    }
}

/// Q6_K rows `r0..r1` against tokens `t0..t0 + T`, `8 / T` pairs per reduction (as
/// [`tile_q4`]).
///
/// # Safety
///
/// As [`tile_q4`].
#[target_feature(enable = "avx2")]
unsafe fn tile_q6<const T: usize>(p: &Plan<'_>, r0: usize, r1: usize, t0: usize, y: &mut [f32]) {
    let slots = 8 / T;
    let tokens = p.tokens::<T>(t0);
    let mut acc = [0.0f32; T];
    if p.blocks() == 0 {
        (r0..r1).for_each(|r| p.store_row(&acc, r, t0, y));
        return;
    }
    let mut at = Cursor::new(r0, p.blocks());
    let mut left = (r1 - r0) * p.blocks();
    while left > 0 {
        // Constant trip counts (unrolled); only a row range's last reduction may be partial.
        let full = slots.min(left);
        left -= full;
        let (mut v, mut d) = ([_mm256_setzero_si256(); 8], [0.0f32; 8]);
        let mut fold_at = at;
        for k in 0..slots {
            if k == full {
                break;
            }
            let block = p.block::<Q6K_BLOCK_BYTES>(at.r, at.b);
            p.prefetch_ahead::<Q6K_BLOCK_BYTES>(at.r, at.b);
            // SAFETY: b < blocks(), so each token's block is in bounds (`Plan::tokens`).
            let a = unsafe { q6k_slot::<T>(block, tokens.block(at.b)) };
            v[k * T..][..T].copy_from_slice(&a);
            d[k] = f16_at(block, 208);
            at.step();
        }
        let total = reduce8(&v);
        for (i, &dk) in d[..full].iter().enumerate() {
            for (t, a) in acc.iter_mut().enumerate() {
                *a = fold_q6k(*a, dk, total[i * T + t]);
            }
            let r = fold_at.r;
            if fold_at.step() {
                p.store_row(&acc, r, t0, y);
                acc = [0.0; T];
            }
        }
    }
}

/// 32 bytes from `p`.
///
/// # Safety
///
/// `p` must be readable for 32 bytes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn load<T>(p: *const T) -> __m256i {
    // SAFETY: the caller's contract; loadu needs no alignment.
    unsafe { _mm256_loadu_si256(p.cast()) }
}

/// A token's 16 sums packed to i16 in `vpackssdw` order: `[s0..s3, s8..s11 | s4..s7,
/// s12..s15]` (each |sum| ≤ 16 · 128, so the packing is exact).
///
/// # Safety
///
/// The AVX2 feature; `s` is readable for 16 i32.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn packed_sums(s: *const i32) -> __m256i {
    // SAFETY: 64 bytes, two loads of 32 (this function's contract).
    let (lo, hi) = unsafe { (load(s), load(s.add(8))) };
    _mm256_packs_epi32(lo, hi)
}

/// The `vpshufb` mask that broadcasts i16 `j` of each 128-bit lane (`lo`) / (`hi`).
#[target_feature(enable = "avx2")]
#[inline]
fn pick16(lo: usize, hi: usize) -> __m256i {
    let m = |j: usize| i16::from_le_bytes([2 * j as u8, 2 * j as u8 + 1]);
    _mm256_set_m128i(_mm_set1_epi16(m(hi)), _mm_set1_epi16(m(lo)))
}

/// Eight accumulators to their eight lane sums, in order (`vphaddd` tree).
#[target_feature(enable = "avx2")]
#[inline]
fn reduce8(v: &[__m256i; 8]) -> [i32; 8] {
    // Each hadd pair leaves, per 128-bit lane, the lane sums of four inputs.
    let h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    let h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    let total = _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(h0, h1),
        _mm256_permute2x128_si256::<0x31>(h0, h1),
    );
    let mut out = [0i32; 8];
    // SAFETY: out holds 8 i32, one ymm.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), total) };
    out
}

/// One Q4_K super-block against `T` tokens: per token, 8 i32 lanes summing to `a` and 8
/// summing to `m` (the module docs).
///
/// # Safety
///
/// The AVX2 feature; `x.x[t]` is readable for 256 bytes and `x.s[t]` for 16 i32.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn q4k_slot<const T: usize>(
    w: &[u8; Q4K_BLOCK_BYTES],
    x: Tokens<T>,
) -> ([__m256i; T], [__m256i; T]) {
    let nibble = _mm256_set1_epi8(0x0F);
    // The i16 mins in `packed_sums` order: [m0 m0 m1 m1 m4 m4 m5 m5 | m2 m2 m3 m3 m6 m6 m7 m7]
    // from the bytes [sc0..sc7, m0..m7] (-1: a zero byte).
    let min_pick = _mm256_setr_epi8(
        8, -1, 8, -1, 9, -1, 9, -1, 12, -1, 12, -1, 13, -1, 13, -1, //
        10, -1, 10, -1, 11, -1, 11, -1, 14, -1, 14, -1, 15, -1, 15, -1,
    );
    let sm = q4k_scales_mins_x(w);
    // The 8 scales as i16 in both lanes.
    let scales = _mm256_cvtepu8_epi16(_mm_unpacklo_epi64(sm, sm));
    let mins = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(sm), min_pick);
    let mut acc = [_mm256_setzero_si256(); T];
    let mut m = [_mm256_setzero_si256(); T];
    for (mt, &st) in m.iter_mut().zip(&x.s) {
        // SAFETY: each x.s[t] holds 16 sums (this function's contract).
        *mt = _mm256_madd_epi16(unsafe { packed_sums(st) }, mins);
    }
    for c in 0..4 {
        // Byte 32c + l: low nibble = weight 64c + l (sub-block 2c), high = 64c + 32 + l.
        // SAFETY: 16 + 32c + 32 <= 144 block bytes.
        let q = unsafe { load(w.as_ptr().add(16 + 32 * c)) };
        let lo = _mm256_and_si256(q, nibble);
        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), nibble);
        let sc_lo = _mm256_shuffle_epi8(scales, pick16(2 * c, 2 * c));
        let sc_hi = _mm256_shuffle_epi8(scales, pick16(2 * c + 1, 2 * c + 1));
        for (at, &xt) in acc.iter_mut().zip(&x.x) {
            // SAFETY: 64c + 64 <= 256 activations (this function's contract).
            let (xl, xh) = unsafe { (load(xt.add(64 * c)), load(xt.add(64 * c + 32))) };
            let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), sc_lo);
            let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), sc_hi);
            *at = _mm256_add_epi32(*at, _mm256_add_epi32(pl, ph));
        }
    }
    (acc, m)
}

/// One Q6_K super-block against `T` tokens: per token, 8 i32 lanes summing to `a`.
///
/// # Safety
///
/// As [`q4k_slot`].
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn q6k_slot<const T: usize>(w: &[u8; Q6K_BLOCK_BYTES], x: Tokens<T>) -> [__m256i; T] {
    let (nibble, top) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
    let blk = w.as_ptr();
    // SAFETY: bytes 192..208 are the 16 i8 scales.
    let sc = _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(blk.add(192).cast()) });
    // Per half h: the i16 scales sc_{8h}..sc_{8h+7} in both lanes.
    let halves = [
        _mm256_permute2x128_si256::<0x00>(sc, sc),
        _mm256_permute2x128_si256::<0x11>(sc, sc),
    ];
    // −32 · sc_j in `packed_sums` order ([sc0..3, sc8..11 | sc4..7, sc12..15]); each fits i16
    // (−4064..=4096), and the offset starts the accumulator.
    let off = _mm256_sub_epi16(
        _mm256_setzero_si256(),
        _mm256_slli_epi16::<5>(_mm256_permute4x64_epi64::<0xD8>(sc)),
    );
    let mut acc = [_mm256_setzero_si256(); T];
    for (at, &st) in acc.iter_mut().zip(&x.s) {
        // SAFETY: each x.s[t] holds 16 sums (this function's contract).
        *at = _mm256_madd_epi16(unsafe { packed_sums(st) }, off);
    }
    for (h, &half) in halves.iter().enumerate() {
        for k in 0..4 {
            // Codes for weights 128h + 32k .. + 32: sub-blocks 8h + 2k (low lane) and + 1.
            // SAFETY: ql (64h + 32(k % 2) + 32 <= 128) and qh (128 + 32h + 32 <= 192) are
            // within the 210 block bytes.
            let (ql, qh) = unsafe {
                (
                    load(blk.add(64 * h + 32 * (k % 2))),
                    load(blk.add(128 + 32 * h)),
                )
            };
            // Low nibble (k < 2) or high nibble (k ≥ 2) of ql, and bits 2k, 2k + 1 of qh moved
            // to bits 4, 5 (16-bit shifts: what crosses a byte is masked off).
            let low = if k < 2 {
                ql
            } else {
                _mm256_srli_epi16::<4>(ql)
            };
            let high = match k {
                0 => _mm256_slli_epi16::<4>(qh),
                1 => _mm256_slli_epi16::<2>(qh),
                2 => qh,
                _ => _mm256_srli_epi16::<2>(qh),
            };
            let q = _mm256_or_si256(_mm256_and_si256(low, nibble), _mm256_and_si256(high, top));
            let scv = _mm256_shuffle_epi8(half, pick16(2 * k, 2 * k + 1));
            for (at, &xt) in acc.iter_mut().zip(&x.x) {
                // SAFETY: 128h + 32k + 32 <= 256 activations (this function's contract).
                let xk = unsafe { load(xt.add(128 * h + 32 * k)) };
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, xk), scv);
                *at = _mm256_add_epi32(*at, p);
            }
        }
    }
    acc
}
