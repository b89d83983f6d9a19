//! The portable f32 vector kernels: the reference for the SIMD ones and what runs off x86_64.
//!
//! The dot product keeps 16 independent partial sums (lane `j mod 16` for the whole 16-wide
//! chunks), combines them by a fixed halving tree and then adds the tail in order, so LLVM can
//! keep the lanes in vector registers (SSE, NEON) while the order stays fixed. The weighted sum
//! is element-wise, so it vectorises as written. The softmax tile's `exp` and 16-lane sum are the
//! definition that the SIMD kernels reproduce bit for bit.

/// Independent partial sums of the dot product.
const LANES: usize = 16;

/// See `super::dot_rows_f32`; shapes were checked by the caller.
pub(super) fn dot_rows(x: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = dot(x, &rows[i * stride..][..x.len()]);
    }
}

/// `Σ a[j]·b[j]` in the fixed order of the module docs (`super::dot_f32`).
#[inline]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    let mut sum = halving_sum(acc);
    for (x, y) in ta.iter().zip(tb) {
        sum += x * y;
    }
    sum
}

/// See `super::scale_axpy_rows_f32`; shapes were checked by the caller.
pub(super) fn scale_axpy_rows(
    acc: &mut [f32],
    acc_scale: f32,
    w: &[f32],
    rows: &[f32],
    stride: usize,
) {
    for a in acc.iter_mut() {
        *a *= acc_scale;
    }
    let len = acc.len();
    for (i, &wi) in w.iter().enumerate() {
        for (a, r) in acc.iter_mut().zip(&rows[i * stride..][..len]) {
            *a += wi * r;
        }
    }
}

/// Below this, `exp` would be subnormal (`ln(f32::MIN_POSITIVE)`): [`exp`] returns 0 instead.
pub(super) const EXP_LO: f32 = -87.336_55;
/// Above this, `exp` overflows; [`exp`] clamps its argument here.
pub(super) const EXP_HI: f32 = 88.0;
/// `1.5 · 2²³`: adding it rounds an f32 of magnitude below 2²² to an integer (to nearest, ties
/// to even), which then sits in the low mantissa bits.
pub(super) const ROUND: f32 = 12_582_912.0;
pub(super) const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` split as Cephes does: `LN2_HI` has 9 significant bits, so `n · LN2_HI` is exact.
pub(super) const LN2_HI: f32 = 0.693_359_4;
pub(super) const LN2_LO: f32 = -2.121_944_4e-4;
/// Cephes' `expf` minimax polynomial on `[−ln2/2, ln2/2]`, highest degree first.
pub(super) const EXP_P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_66,
    0.5,
];

/// `eˣ` by range reduction `x = n·ln2 + r` and a degree-7 polynomial in `r`, with separate
/// multiplies and adds (no FMA) so that every ISA computes the same bits. 0 for
/// `x < EXP_LO` (including −∞); NaN stays NaN. Its relative error over `[EXP_LO, 0]` is bounded
/// in `tests.rs`.
#[inline(always)]
pub(super) fn exp(x: f32) -> f32 {
    let xc = x.clamp(EXP_LO, EXP_HI); // NaN stays NaN
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    let ni = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let mut y = EXP_P[0];
    for p in &EXP_P[1..] {
        y = y * r + p;
    }
    let y = (y * (r * r) + r) + 1.0;
    let y = y * f32::from_bits((ni.wrapping_add(127) as u32) << 23);
    if x < EXP_LO { 0.0 } else { y }
}

/// The partial sums combined by the fixed halving tree: lane `l` += lane `l + w` for
/// `w` = 8, 4, 2, 1.
#[inline(always)]
fn halving_sum(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            acc[l] += acc[l + width];
        }
        width /= 2;
    }
    acc[0]
}

/// See `super::softmax_tile_f32`: scale and max, then `exp` and the 16-lane sum.
#[inline(always)]
pub(super) fn softmax_tile(s: &mut [f32], scale: f32, m: f32) -> (f32, f32) {
    let mut m_new = m;
    for x in s.iter_mut() {
        *x *= scale;
        m_new = m_new.max(*x);
    }
    let mut acc = [0.0f32; LANES];
    for chunk in s.chunks_mut(LANES) {
        for (a, x) in acc.iter_mut().zip(chunk) {
            *x = exp(*x - m_new);
            *a += *x;
        }
    }
    (m_new, halving_sum(acc))
}
