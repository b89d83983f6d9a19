//! AVX-512 k-quant kernel: exact per-super-block i32 sums with `vpdpbusd` (VNNI) on 64 codes
//! at a time, `vpackssdw` and `vpmaddwd` against the sub-block scales, then the shared fold.
//!
//! Owns the x86_64 AVX-512 code; the safe API, the shape checks, the block formats and the fold
//! live in `mod.rs`; the walk bookkeeping ([`Plan`], [`Cursor`]) is shared with `avx2.rs`.
//!
//! # Arithmetic
//!
//! A zmm holds 64 consecutive weights of one row, so the activations are one plain 64-byte
//! load: for Q4_K, byte `32c + l`'s low nibble (weight `64c + l`) in the low half and its high
//! nibble (weight `64c + 32 + l`) in the high half, from one 32-byte broadcast shifted by 0 and
//! 4 (`vpsrlvw`); for Q6_K, 64 low nibbles of `ql` in one load and the `qh` bit pairs from a
//! broadcast shifted per half. `vpdpbusd` adds four exact u8 × i8 products per i32 lane (at most
//! `4 · 63 · 128 = 32256` in magnitude), so `vpackssdw` packs two such vectors to i16 without
//! saturating, and `vpmaddwd` multiplies each i16 by its sub-block's scale (picked by `vpermw`)
//! and adds pairs into i32: per token and 128 weights 2 `vpdpbusd`, 1 `vpackssdw`, 1 `vpmaddwd`
//! and 1 add (the `vpmaddubsw` route takes 6 ops; LLVM splits `vpdpwssd` into `vpmaddwd` +
//! `vpaddd` for generic x86-64 anyway). The Q4_K mins term and the Q6_K offset use the
//! activations' 16 i32 sums directly: as i16 pairs a sum is `(s, sign)`, and against `(m, 0)`
//! (or `(−32·sc, 0)`) `vpmaddwd` gives exactly `s · m`. Sixteen accumulators at a time are
//! reduced to sixteen sums by one shuffle tree; the sums are exact, so [`fold_q4k`] /
//! [`fold_q6k`], called per super-block in order, give the scalar kernel's bits. The blocks'
//! f16 scales are converted with F16C (implied by AVX-512 F; f16 → f32 is exact, so the values
//! are `f16_at`'s).
//!
//! # Tiling
//!
//! As in `avx2.rs` (row tiles walked (row, block) by (row, block) in memory order, token
//! groups sharing each unpacked block), with groups of up to 8 tokens and 16 accumulators per
//! reduction: 8 (row, block) pairs × 1 token up to 1 × 8 for Q4_K (an `a` and an `m` each),
//! 16 × 1 up to 2 × 8 for Q6_K. Eight Q4_K tokens take their own tile ([`tile_q4_8`], measured
//! 13–16% less time than the generic tile at 8 and 64 tokens): one pair per reduction of the eight `a` accumulators alone,
//! the mins term from the activations' 32-value sums as i16 (two `vpmaddwd` for all eight
//! tokens, nothing to reduce over the weights), and the fold done for the eight tokens in the
//! lanes of one ymm: the same f32 multiplies, adds and subtract as [`fold_q4k`], lane by lane,
//! never fused, so the bits are the scalar kernel's.

use std::arch::x86_64::*;

use super::avx2::{Cursor, Plan, Tokens, group, q4k_scales_mins_x};
use super::{
    KActsRef, KMatrixRef, KQuantKind, Q4K_BLOCK_BYTES, Q6K_BLOCK_BYTES, QK_K, SUM32_GROUP,
};
use super::{fold_q4k, fold_q6k};

/// Rows per row tile: what the token groups share from L1 (at most 16 · 4 KiB).
const ROWS: usize = 16;
/// The largest token group.
const MAX_TOKENS: usize = 8;

/// `Y = dequant(X · Wᵀ)` for `n` tokens (the module docs), into `y` (`[n, rows]`).
///
/// # Safety
///
/// The CPU must support AVX-512 F, BW and VNNI (`Int8Isa::Avx512Vnni.is_available()`). The
/// shapes must have been checked (`gemm_k`).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn gemm(m: KMatrixRef<'_>, x: KActsRef<'_>, n: usize, y: &mut [f32]) {
    let p = Plan::new(m, x);
    match m.kind {
        KQuantKind::Q4K => drive(
            &p,
            n,
            y,
            [tile_q4_8, tile_q4::<4>, tile_q4::<2>, tile_q4::<1>],
        ),
        KQuantKind::Q6K => drive(
            &p,
            n,
            y,
            [tile_q6::<8>, tile_q6::<4>, tile_q6::<2>, tile_q6::<1>],
        ),
    }
}

/// A tile: rows `r0..r1` against the tokens from `t0` on, into `y`.
type TileFn = unsafe fn(&Plan<'_>, usize, usize, usize, &mut [f32]);

/// Row tiles of [`ROWS`]; within each, token groups of 8, 4, 2, 1 (`tiles`, widest first).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn drive(p: &Plan<'_>, n: usize, y: &mut [f32], tiles: [TileFn; 4]) {
    let rows = p.rows();
    let mut r0 = 0;
    while r0 < rows {
        let r1 = rows.min(r0 + ROWS);
        let mut t0 = 0;
        while t0 < n {
            let g = group(n - t0, MAX_TOKENS);
            let tile = match g {
                8 => tiles[0],
                4 => tiles[1],
                2 => tiles[2],
                _ => tiles[3],
            };
            // SAFETY: the tile functions need this function's features, and t0 + g <= n.
            unsafe { tile(p, r0, r1, t0, y) };
            t0 += g;
        }
        r0 = r1;
    }
}

/// Q4_K rows `r0..r1` against tokens `t0..t0 + T`: (row, block) pairs in memory order, `8 / T`
/// per reduction, each folded in order into its row's accumulators, stored when the row ends.
///
/// # Safety
///
/// The AVX-512 features of [`gemm`]; `t0 + T <= n`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile_q4<const T: usize>(p: &Plan<'_>, r0: usize, r1: usize, t0: usize, y: &mut [f32]) {
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
        let (mut v, mut d) = ([_mm512_setzero_si512(); 16], [[0.0f32; 2]; 8]);
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
            v[8 + k * T..][..T].copy_from_slice(&m);
            d[k] = f16_pair::<_, true>(block, 0);
            at.step();
        }
        let total = reduce16(&v);
        for (i, &[dk, dmin]) in d[..full].iter().enumerate() {
            for (t, a) in acc.iter_mut().enumerate() {
                *a = fold_q4k(*a, dk, dmin, total[i * T + t], total[8 + i * T + t]);
            }
            let r = fold_at.r;
            if fold_at.step() {
                p.store_row(&acc, r, t0, y);
                acc = [0.0; T];
            }
        }
    }
}

/// Q6_K rows `r0..r1` against tokens `t0..t0 + T`, `16 / T` pairs per reduction (as
/// [`tile_q4`]).
///
/// # Safety
///
/// As [`tile_q4`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile_q6<const T: usize>(p: &Plan<'_>, r0: usize, r1: usize, t0: usize, y: &mut [f32]) {
    let slots = 16 / T;
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
        let (mut v, mut d) = ([_mm512_setzero_si512(); 16], [0.0f32; 16]);
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
            d[k] = f16_pair::<_, false>(block, 208)[0];
            at.step();
        }
        let total = reduce16(&v);
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

/// Q4_K rows `r0..r1` against the eight tokens `t0..t0 + 8`, one (row, block) pair at a time in
/// memory order: the eight `a` sums from one [`reduce8_pairs`], the eight `m` sums from the
/// activations' 32-value sums ([`q4k_mins8`], no reduction over the weights), both folded into
/// eight f32 lanes at once by [`fold8_q4k`] (the scalar fold's operations, lane by lane).
///
/// # Safety
///
/// The AVX-512 features of [`gemm`]; `t0 + 8 <= n`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile_q4_8(p: &Plan<'_>, r0: usize, r1: usize, t0: usize, y: &mut [f32]) {
    let tokens = p.tokens::<8>(t0);
    let sums32 = p.sums32::<8>(t0);
    let mut acc = _mm256_setzero_ps();
    let mut at = Cursor::new(r0, p.blocks());
    if p.blocks() == 0 {
        (r0..r1).for_each(|r| p.store_row(&[0.0; 8], r, t0, y));
        return;
    }
    while at.r < r1 {
        let block = p.block::<Q4K_BLOCK_BYTES>(at.r, at.b);
        p.prefetch_ahead::<Q4K_BLOCK_BYTES>(at.r, at.b);
        let sm = q4k_scales_mins_x(block);
        // SAFETY: b < blocks(), so each token's block is in bounds (`Plan::tokens`,
        // `Plan::sums32`).
        let (a, m) = unsafe {
            (
                q4k_dots::<8>(block, sm, tokens.block(at.b)),
                q4k_mins8(
                    sm,
                    sums32.map(|s| s.wrapping_add(at.b * QK_K / SUM32_GROUP)),
                ),
            )
        };
        let [d, dmin] = f16_pair::<_, true>(block, 0);
        acc = fold8_q4k(acc, d, dmin, reduce8_pairs(&a), m);
        let r = at.r;
        if at.step() {
            p.store_row(&lanes8(acc), r, t0, y);
            acc = _mm256_setzero_ps();
        }
    }
}

/// Eight lanes of `acc ← fold_q4k(acc, d, dmin, a, m)`: `(acc + d·a) − dmin·m` in f32, each
/// product and sum rounded as the scalar fold's (separate multiplies and adds, never fused).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
fn fold8_q4k(acc: __m256, d: f32, dmin: f32, a: __m256i, m: __m256i) -> __m256 {
    let da = _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(a));
    let dm = _mm256_mul_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(m));
    _mm256_sub_ps(_mm256_add_ps(acc, da), dm)
}

/// The eight f32 lanes of `v`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
fn lanes8(v: __m256) -> [f32; 8] {
    let mut out = [0.0f32; 8];
    // SAFETY: out holds 8 f32, one ymm.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
    out
}

/// Eight accumulators to their eight lane sums, in order, as one ymm (the first three levels
/// of [`reduce16`]'s tree, then the pairs within each quarter).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
fn reduce8_pairs(v: &[__m512i; 8]) -> __m256i {
    // w[i]: quarters 0, 1 hold v[2i]'s halves summed, quarters 2, 3 v[2i + 1]'s.
    let w: [__m512i; 4] = std::array::from_fn(|i| {
        let (a, b) = (v[2 * i], v[2 * i + 1]);
        _mm512_add_epi32(
            _mm512_shuffle_i64x2::<0x44>(a, b),
            _mm512_shuffle_i64x2::<0xEE>(a, b),
        )
    });
    // u[i]: quarter k holds 4 partial sums of v[4i + k].
    let u: [__m512i; 2] = std::array::from_fn(|i| {
        let (a, b) = (w[2 * i], w[2 * i + 1]);
        _mm512_add_epi32(
            _mm512_shuffle_i64x2::<0x88>(a, b),
            _mm512_shuffle_i64x2::<0xDD>(a, b),
        )
    });
    gather_pairs(_mm512_add_epi32(
        _mm512_unpacklo_epi64(u[0], u[1]),
        _mm512_unpackhi_epi64(u[0], u[1]),
    ))
}

/// From `z` whose quarter `k` holds two partial sums of value `k` then two of value `4 + k`, the
/// eight values in order.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
fn gather_pairs(z: __m512i) -> __m256i {
    // Lane 4k: value k; lane 4k + 2: value 4 + k.
    let sum = _mm512_add_epi32(z, _mm512_shuffle_epi32::<0xB1>(z));
    let order = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, sum))
}

/// The Q4_K mins term `m = Σ_j m_j · S_j` of one block for eight tokens, `S_j` their 32-value
/// sums (`sums32`, 8 per block): two zmm of i16 sums, one `vpmaddwd` each against the mins, one
/// pairwise tree. Exact: `|S_j| ≤ 4096`, `m_j ≤ 63`.
///
/// # Safety
///
/// The AVX-512 features of [`gemm`]; each `s[t]` is readable for 8 i16.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn q4k_mins8(sm: __m128i, s: [*const i16; 8]) -> __m256i {
    // The 8 mins (bytes 8..16 of sm) as i16, in every 128-bit quarter.
    let mins = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_srli_si128::<8>(sm)));
    // Quarter q of half h: token 4h + q's 8 sums.
    let half = |h: usize| {
        // SAFETY: each s[t] is readable for 8 i16 (this function's contract).
        let l = |t: usize| unsafe { _mm_loadu_si128(s[4 * h + t].cast()) };
        let z = _mm512_castsi128_si512(l(0));
        let z = _mm512_inserti32x4::<1>(z, l(1));
        let z = _mm512_inserti32x4::<2>(z, l(2));
        _mm512_madd_epi16(_mm512_inserti32x4::<3>(z, l(3)), mins)
    };
    let (lo, hi) = (half(0), half(1));
    gather_pairs(_mm512_add_epi32(
        _mm512_unpacklo_epi64(lo, hi),
        _mm512_unpackhi_epi64(lo, hi),
    ))
}

/// The f16 values at `block[at..at + 2]` and (if `TWO`) `block[at + 2..at + 4]` as f32: what
/// `f16_at(block, at)` and `f16_at(block, at + 2)` return (f16 → f32 is exact), with F16C
/// (implied by AVX-512 F) instead of `half`'s per-call feature check.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
fn f16_pair<const BB: usize, const TWO: bool>(block: &[u8; BB], at: usize) -> [f32; 2] {
    let hi = if TWO {
        [block[at + 2], block[at + 3]]
    } else {
        [0, 0]
    };
    let bits = i32::from_le_bytes([block[at], block[at + 1], hi[0], hi[1]]);
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
    [_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v))]
}

/// 64 bytes from `p`.
///
/// # Safety
///
/// `p` must be readable for 64 bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn load<T>(p: *const T) -> __m512i {
    // SAFETY: the caller's contract; loadu needs no alignment.
    unsafe { _mm512_loadu_si512(p.cast()) }
}

/// 32 bytes from `p` in both halves of a zmm.
///
/// # Safety
///
/// `p` must be readable for 32 bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn load_twice<T>(p: *const T) -> __m512i {
    // SAFETY: the caller's contract; loadu needs no alignment.
    _mm512_broadcast_i64x4(unsafe { _mm256_loadu_si256(p.cast()) })
}

/// i16 lanes `0..16` = `lo`, `16..32` = `hi`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
fn halves16(lo: i16, hi: i16) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_set1_epi16(lo), _mm256_set1_epi16(hi))
}

/// The exact dot products of two 64-weight quarters, 4 weights per i16: `vpdpbusd` adds 4
/// u8 × i8 products per i32 lane (at most `4 · 63 · 128 = 32256`, so `vpackssdw` keeps them
/// exact), packed to `[a lanes 4q..4q + 4, b lanes 4q..4q + 4]` per 128-bit quarter `q`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
fn pair(codes_a: __m512i, x_a: __m512i, codes_b: __m512i, x_b: __m512i) -> __m512i {
    let zero = _mm512_setzero_si512();
    _mm512_packs_epi32(
        _mm512_dpbusd_epi32(zero, codes_a, x_a),
        _mm512_dpbusd_epi32(zero, codes_b, x_b),
    )
}

/// `vpermw` indices for [`pair`] of two Q4_K chunks: i16 lanes `[a ×4, b ×4]` in quarters 0
/// and 1, `[c ×4, d ×4]` in quarters 2 and 3 (a chunk's first 32 weights are one sub-block).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
fn pair_pick(a: i16, b: i16, c: i16, d: i16) -> __m512i {
    let half = |x: i16, y: i16| _mm_setr_epi16(x, x, x, x, y, y, y, y);
    let low = _mm256_set_m128i(half(a, b), half(a, b));
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(low),
        _mm256_set_m128i(half(c, d), half(c, d)),
    )
}

/// `vpermw` indices for [`pair`] of two Q6_K quarters: i16 lanes `[a + q ×4, b + q ×4]` in
/// 128-bit quarter `q` (a quarter's 16-weight sub-blocks, one per 128-bit quarter).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
fn quarter_pick(a: i16, b: i16) -> __m512i {
    let q = |i: i16| _mm_setr_epi16(a + i, a + i, a + i, a + i, b + i, b + i, b + i, b + i);
    let low = _mm256_set_m128i(q(1), q(0));
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(low), _mm256_set_m128i(q(3), q(2)))
}

/// Sixteen accumulators to their sixteen lane sums, in order (a shuffle tree: 256-bit halves,
/// 128-bit quarters, then pairs of i32).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
fn reduce16(v: &[__m512i; 16]) -> [i32; 16] {
    // w[i]: quarters 0, 1 hold v[2i]'s halves summed, quarters 2, 3 v[2i + 1]'s.
    let mut w = [_mm512_setzero_si512(); 8];
    for (i, wi) in w.iter_mut().enumerate() {
        let (a, b) = (v[2 * i], v[2 * i + 1]);
        *wi = _mm512_add_epi32(
            _mm512_shuffle_i64x2::<0x44>(a, b),
            _mm512_shuffle_i64x2::<0xEE>(a, b),
        );
    }
    // u[i]: quarter k holds 4 partial sums of v[4i + k].
    let mut u = [_mm512_setzero_si512(); 4];
    for (i, ui) in u.iter_mut().enumerate() {
        let (a, b) = (w[2 * i], w[2 * i + 1]);
        *ui = _mm512_add_epi32(
            _mm512_shuffle_i64x2::<0x88>(a, b),
            _mm512_shuffle_i64x2::<0xDD>(a, b),
        );
    }
    // z[i]: quarter k holds 2 partial sums of v[8i + k], then 2 of v[8i + 4 + k].
    let mut z = [_mm512_setzero_si512(); 2];
    for (i, zi) in z.iter_mut().enumerate() {
        let (a, b) = (u[2 * i], u[2 * i + 1]);
        *zi = _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
    }
    // Quarter k: the sums of v[k], v[4 + k], v[8 + k], v[12 + k].
    let (a, b) = (_mm512_castsi512_ps(z[0]), _mm512_castsi512_ps(z[1]));
    let total = _mm512_add_epi32(
        _mm512_castps_si512(_mm512_shuffle_ps::<0x88>(a, b)),
        _mm512_castps_si512(_mm512_shuffle_ps::<0xDD>(a, b)),
    );
    let mut lanes = [0i32; 16];
    // SAFETY: lanes holds 16 i32, one zmm.
    unsafe { _mm512_storeu_si512(lanes.as_mut_ptr().cast(), total) };
    std::array::from_fn(|i| lanes[4 * (i % 4) + i / 4])
}

/// One Q4_K super-block against `T` tokens: per token, 16 i32 lanes summing to `a` and 16
/// summing to `m` (the module docs).
///
/// # Safety
///
/// The AVX-512 features of [`gemm`]; `x.x[t]` is readable for 256 bytes and `x.s[t]` for 16
/// i32.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn q4k_slot<const T: usize>(
    w: &[u8; Q4K_BLOCK_BYTES],
    x: Tokens<T>,
) -> ([__m512i; T], [__m512i; T]) {
    // Sum g (16 activations) pairs with min g / 2, byte 8 + g / 2 of [sc0..sc7, m0..m7].
    let min_pick = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    let sm = q4k_scales_mins_x(w);
    // i32 lane g: m_{g/2}, i.e. the i16 pair (m, 0).
    let mins = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(sm, min_pick));
    // SAFETY: this function's contract.
    let a = unsafe { q4k_dots::<T>(w, sm, x) };
    let mut m = [_mm512_setzero_si512(); T];
    for (mt, &st) in m.iter_mut().zip(&x.s) {
        // SAFETY: x.s[t] holds 16 i32, one zmm (this function's contract).
        *mt = _mm512_madd_epi16(unsafe { load(st) }, mins);
    }
    (a, m)
}

/// The `a` part of [`q4k_slot`]: per token, 16 i32 lanes summing to `Σ_j sc_j · Σ_{i∈j}
/// q_i·x_i`; `sm` is the block's `[sc_0..sc_7, m_0..m_7]` ([`q4k_scales_mins_x`]).
///
/// # Safety
///
/// The AVX-512 features of [`gemm`]; `x.x[t]` is readable for 256 bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn q4k_dots<const T: usize>(
    w: &[u8; Q4K_BLOCK_BYTES],
    sm: __m128i,
    x: Tokens<T>,
) -> [__m512i; T] {
    let nibble = _mm512_set1_epi8(0x0F);
    let shift = halves16(0, 4);
    // i16 lanes 0..8: the scales (8..16 the mins, 16.. zero).
    let scales = _mm512_cvtepu8_epi16(_mm256_zextsi128_si256(sm));
    // Chunk c, weights 64c..64c + 64: sub-block 2c (low half), 2c + 1 (high half).
    let mut codes = [_mm512_setzero_si512(); 4];
    for (c, code) in codes.iter_mut().enumerate() {
        // SAFETY: 16 + 32c + 32 <= 144 block bytes.
        let q = unsafe { load_twice(w.as_ptr().add(16 + 32 * c)) };
        *code = _mm512_and_si512(_mm512_srlv_epi16(q, shift), nibble);
    }
    // The scales in `pair` order: chunks (0, 1) cover sub-blocks 0, 1 (first) and 2, 3
    // (second), chunks (2, 3) sub-blocks 4..8.
    let sc = [
        _mm512_permutexvar_epi16(pair_pick(0, 2, 1, 3), scales),
        _mm512_permutexvar_epi16(pair_pick(4, 6, 5, 7), scales),
    ];
    let mut a = [_mm512_setzero_si512(); T];
    for (at, &xt) in a.iter_mut().zip(&x.x) {
        for (k, &sck) in sc.iter().enumerate() {
            // SAFETY: 128k + 128 <= 256 activations (this function's contract).
            let xk = unsafe { [load(xt.add(128 * k)), load(xt.add(128 * k + 64))] };
            let p = pair(codes[2 * k], xk[0], codes[2 * k + 1], xk[1]);
            *at = _mm512_add_epi32(*at, _mm512_madd_epi16(p, sck));
        }
    }
    a
}

/// One Q6_K super-block against `T` tokens: per token, 16 i32 lanes summing to `a`.
///
/// # Safety
///
/// As [`q4k_slot`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn q6k_slot<const T: usize>(w: &[u8; Q6K_BLOCK_BYTES], x: Tokens<T>) -> [__m512i; T] {
    let (nibble, top) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
    // qh bit pairs (0, 1 | 2, 3) to bits 4, 5 by a left shift; (4, 5 | 6, 7) by a right one.
    let (shl, shr) = (halves16(4, 2), halves16(0, 2));
    let blk = w.as_ptr();
    // SAFETY: bytes 192..208 are the 16 i8 scales.
    let sc8 = unsafe { _mm_loadu_si128(blk.add(192).cast()) };
    // i16 lanes 0..16: the scales.
    let scales = _mm512_cvtepi8_epi16(_mm256_zextsi128_si256(sc8));
    // i32 lane j: the i16 pair (−32 · sc_j, 0) (−4064..=4096 fits i16); the offset starts the
    // accumulator.
    let off = _mm512_and_si512(
        _mm512_sub_epi32(
            _mm512_setzero_si512(),
            _mm512_slli_epi32::<5>(_mm512_cvtepi8_epi32(sc8)),
        ),
        _mm512_set1_epi32(0xFFFF),
    );
    // Quarter k: codes for weights 64k..64k + 64 (sub-blocks 4k..4k + 4).
    let mut codes = [_mm512_setzero_si512(); 4];
    for h in 0..2 {
        // SAFETY: ql's half h (64h + 64 <= 128) and qh's (128 + 32h + 32 <= 192) are within the
        // 210 block bytes.
        let (ql, qh) = unsafe { (load(blk.add(64 * h)), load_twice(blk.add(128 + 32 * h))) };
        // 16-bit shifts: whatever crosses a byte is masked off.
        codes[2 * h] = _mm512_or_si512(
            _mm512_and_si512(ql, nibble),
            _mm512_and_si512(_mm512_sllv_epi16(qh, shl), top),
        );
        codes[2 * h + 1] = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi16::<4>(ql), nibble),
            _mm512_and_si512(_mm512_srlv_epi16(qh, shr), top),
        );
    }
    // The scales in `pair` order: quarters (0, 1) cover sub-blocks q (first) and 4 + q
    // (second) in 128-bit quarter q, quarters (2, 3) sub-blocks 8 + q and 12 + q.
    let sc = [
        _mm512_permutexvar_epi16(quarter_pick(0, 4), scales),
        _mm512_permutexvar_epi16(quarter_pick(8, 12), scales),
    ];
    let mut a = [_mm512_setzero_si512(); T];
    for ((at, &xt), &st) in a.iter_mut().zip(&x.x).zip(&x.s) {
        // SAFETY: each x.s[t] holds 16 i32, one zmm (this function's contract).
        *at = _mm512_madd_epi16(unsafe { load(st) }, off);
        for (k, &sck) in sc.iter().enumerate() {
            // SAFETY: 128k + 128 <= 256 activations (this function's contract).
            let xk = unsafe { [load(xt.add(128 * k)), load(xt.add(128 * k + 64))] };
            let p = pair(codes[2 * k], xk[0], codes[2 * k + 1], xk[1]);
            *at = _mm512_add_epi32(*at, _mm512_madd_epi16(p, sck));
        }
    }
    a
}
