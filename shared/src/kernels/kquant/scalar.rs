//! The portable reference kernel: per output element, per super-block, the integer sums of the
//! module docs computed element by element, then the shared fold. What every SIMD kernel is
//! tested against and what runs off x86_64; never delete it.

use super::quant::{q6k_codes, q6k_scales};
use super::{KActsRef, KMatrixRef, KQuantKind, QK_K, f16_at, fold_q4k, fold_q6k, padded_k};
use super::{SUM_GROUP, q4k_scales_mins};

/// `(a, m)` of one Q4_K block against 256 activations (`sums`: their 16 partial sums).
pub(super) fn q4k_block_sums(block: &[u8], x: &[i8], sums: &[i32]) -> (i32, i32) {
    let (sc, m) = q4k_scales_mins(&block[4..16]);
    let qs = &block[16..];
    let (mut a, mut mm) = (0i32, 0i32);
    for c in 0..4 {
        let (mut lo, mut hi) = (0i32, 0i32);
        for l in 0..32 {
            let b = qs[32 * c + l];
            lo += i32::from(b & 0xF) * i32::from(x[64 * c + l]);
            hi += i32::from(b >> 4) * i32::from(x[64 * c + 32 + l]);
        }
        a += i32::from(sc[2 * c]) * lo + i32::from(sc[2 * c + 1]) * hi;
    }
    for (&mj, pair) in m.iter().zip(sums.chunks_exact(2)) {
        mm += i32::from(mj) * (pair[0] + pair[1]);
    }
    (a, mm)
}

/// `a` of one Q6_K block against 256 activations.
pub(super) fn q6k_block_sum(block: &[u8], x: &[i8]) -> i32 {
    let sc = q6k_scales(block);
    let codes = q6k_codes(block);
    let mut a = 0i32;
    for ((&s, q), xs) in sc
        .iter()
        .zip(codes.chunks_exact(SUM_GROUP))
        .zip(x.chunks_exact(SUM_GROUP))
    {
        let dot: i32 = q
            .iter()
            .zip(xs)
            .map(|(&q, &v)| (i32::from(q) - 32) * i32::from(v))
            .sum();
        a += i32::from(s) * dot;
    }
    a
}

/// Every token against every row. Shapes are the caller's to check.
pub(super) fn gemm(m: KMatrixRef<'_>, x: KActsRef<'_>, n: usize, y: &mut [f32]) {
    let pk = padded_k(m.cols);
    let (rb, bb) = (m.row_bytes(), m.kind.block_bytes());
    for t in 0..n {
        let (xq, sums, sx) = x.row(t, pk);
        for r in 0..m.rows {
            let row = &m.data[r * rb..][..rb];
            let mut acc = 0.0f32;
            for (b, block) in row.chunks_exact(bb).enumerate() {
                let xb = &xq[b * QK_K..][..QK_K];
                let sb = &sums[b * (QK_K / SUM_GROUP)..][..QK_K / SUM_GROUP];
                acc = match m.kind {
                    KQuantKind::Q4K => {
                        let (a, mm) = q4k_block_sums(block, xb, sb);
                        fold_q4k(acc, f16_at(block, 0), f16_at(block, 2), a, mm)
                    }
                    KQuantKind::Q6K => fold_q6k(acc, f16_at(block, 208), q6k_block_sum(block, xb)),
                };
            }
            y[t * m.rows + r] = acc * sx;
        }
    }
}
