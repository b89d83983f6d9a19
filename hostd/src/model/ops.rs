//! Element-wise and per-vector math of the forward pass in f32 (docs/model.md §4.1): the zero-centred
//! RMSNorm, the SiLU-gated DeltaNet norm, the L2 norm, activations, softmax and the dense
//! projections (thin wrappers over `shared::kernels`).
//!
//! Formulas follow transformers' fp32 code so results agree to rounding.

use super::weights::Matrix;
use shared::kernels::{self, Isa};

/// Logistic sigmoid.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// SiLU: x · σ(x).
#[inline]
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// PyTorch's softplus (β = 1, threshold 20): x itself above 20, else ln(1 + eˣ).
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// Zero-centred RMSNorm in place over one vector: `x / sqrt(mean(x²) + ε) · scale`, where
/// `scale` already holds `1 + w`.
pub fn rms_norm_scaled(x: &mut [f32], scale: &[f32], eps: f32) {
    debug_assert_eq!(x.len(), scale.len());
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ms + eps).sqrt();
    for (v, s) in x.iter_mut().zip(scale) {
        *v = *v * inv * s;
    }
}

/// `1 + w` for every element: the effective scale of a zero-centred norm weight.
pub fn zero_centred_scale(w: &[f32]) -> Vec<f32> {
    w.iter().map(|v| 1.0 + v).collect()
}

/// Applies a zero-centred RMSNorm to every `dim`-wide row of `x` (`scale` = 1 + w).
pub fn rms_norm_rows(x: &mut [f32], scale: &[f32], eps: f32) {
    for row in x.chunks_exact_mut(scale.len()) {
        rms_norm_scaled(row, scale, eps);
    }
}

/// L2 normalisation with ε inside the root: `x / sqrt(Σx² + ε)`, then × `mul`.
pub fn l2_norm(x: &mut [f32], eps: f32, mul: f32) {
    let ss = x.iter().map(|v| v * v).sum::<f32>();
    let inv = 1.0 / (ss + eps).sqrt();
    for v in x.iter_mut() {
        *v = *v * inv * mul;
    }
}

/// `Σ a[i]·b[i]` with 16 independent partial sums (lane `i % 16`), combined pairwise at the
/// end, then the tail: a fixed order (so every caller, decode or prefill, gets the same bits
/// for the same inputs) that the compiler can keep in SIMD registers, unlike one sequential
/// f32 chain. Used for the attention scores and DeltaNet's chunk-local dot products. The
/// portable f32 kernel's dot product, [`shared::kernels::vecf32::dot_f32`].
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    // PERF-CRITICAL: attention scores and DeltaNet chunk products in prefill.
    debug_assert_eq!(a.len(), b.len());
    kernels::vecf32::dot_f32(a, b)
}

/// Numerically stable softmax in place.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

/// `y[n × rows] = x[n × cols] · Wᵀ` over the rayon pool; GEMV when `n == 1`.
pub fn project(isa: Isa, w: &Matrix, x: &[f32], n: usize, y: &mut [f32]) {
    debug_assert_eq!(x.len(), n * w.cols);
    debug_assert_eq!(y.len(), n * w.rows);
    if n == 1 {
        kernels::par_gemv_bf16(isa, w.data(), w.rows, w.cols, x, y);
    } else {
        kernels::par_gemm_bf16(isa, w.data(), w.rows, w.cols, x, n, y);
    }
}

/// Weight bytes below which a GEMV tile is not worth a rayon task of its own.
const MIN_TILE_WEIGHT_BYTES: usize = 64 << 10;

/// Rows per parallel tile of a decode projection over `rows` rows of `row_bytes` weight bytes
/// each: at least [`MIN_TILE_WEIGHT_BYTES`] of weights, at most a quarter of a thread's share,
/// rounded up to a multiple of `align` (the kernel's row block). One rule for every format.
pub(super) fn tile_rows(rows: usize, row_bytes: usize, align: usize) -> usize {
    let min_rows = MIN_TILE_WEIGHT_BYTES.div_ceil(row_bytes.max(1));
    min_rows
        .max(rows.div_ceil(4 * rayon::current_num_threads()))
        .next_multiple_of(align)
}

/// Several projections of the same input in ONE parallel region: `x · Wᵢᵀ` for every matrix,
/// returned in order. With one token (decode) the rows of all matrices are cut into tiles that
/// share the rayon pool, paying one fork/join instead of one per matrix; every row is computed
/// by the same single-threaded kernel as [`project`], so results are bitwise equal to it.
/// With several tokens each matrix goes through [`project`] (compute-bound; the join is noise).
pub fn project_many(isa: Isa, mats: &[&Matrix], x: &[f32], n: usize) -> Vec<Vec<f32>> {
    // PERF-CRITICAL: decode runs this a few times per layer per token.
    if n != 1 {
        return mats.iter().map(|m| project_new(isa, m, x, n)).collect();
    }
    let mut outs: Vec<Vec<f32>> = mats.iter().map(|m| vec![0.0f32; m.rows]).collect();
    let mut tiles: Vec<(&Matrix, usize, &mut [f32])> = Vec::new();
    for (m, out) in mats.iter().zip(outs.iter_mut()) {
        let tile = tile_rows(m.rows, 2 * m.cols, 8);
        for (i, chunk) in out.chunks_mut(tile).enumerate() {
            tiles.push((m, i * tile, chunk));
        }
    }
    use rayon::prelude::*;
    // One stealable job per tile (`with_max_len(1)`): rayon would otherwise cut the list into
    // runs of a few tiles that cannot be split once started (from the model's thread with 2
    // workers, runs of up to two of q_proj's 2 MB tiles), so with tiles of unequal sizes the
    // other threads idle at the end while one finishes a run of big ones.
    tiles
        .into_par_iter()
        .with_max_len(1)
        .for_each(|(m, r0, y)| {
            let rows = y.len();
            kernels::gemv_bf16(
                isa,
                &m.data()[r0 * m.cols..(r0 + rows) * m.cols],
                rows,
                m.cols,
                x,
                y,
            );
        });
    outs
}

/// Like [`project`] but allocates the output.
pub fn project_new(isa: Isa, w: &Matrix, x: &[f32], n: usize) -> Vec<f32> {
    let mut y = vec![0.0; n * w.rows];
    project(isa, w, x, n, &mut y);
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softplus_matches_pytorch_threshold() {
        assert_eq!(softplus(25.0), 25.0);
        assert!((softplus(0.0) - std::f32::consts::LN_2).abs() < 1e-7);
        assert!((softplus(-30.0) - (-30f32).exp()).abs() < 1e-20);
    }

    #[test]
    fn zero_centred_norm_with_zero_weight_is_plain_rms() {
        let mut x = vec![3.0, 4.0];
        rms_norm_scaled(&mut x, &zero_centred_scale(&[0.0, 0.0]), 0.0);
        let rms = (12.5f32).sqrt();
        assert!((x[0] - 3.0 / rms).abs() < 1e-6 && (x[1] - 4.0 / rms).abs() < 1e-6);
    }

    #[test]
    fn project_many_equals_project_bitwise() {
        let isa = Isa::active();
        let mk = |rows: usize, cols: usize, seed: u32| {
            let data = (0..rows * cols)
                .map(|i| {
                    half::bf16::from_f32(
                        (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0,
                    )
                })
                .collect();
            Matrix::from_vec(data, rows, cols)
        };
        let (a, b, c) = (mk(300, 96, 1), mk(7, 96, 2), mk(1030, 96, 3));
        for n in [1, 3] {
            let x: Vec<f32> = (0..n * 96).map(|i| (i as f32 * 0.37).sin()).collect();
            let many = project_many(isa, &[&a, &b, &c], &x, n);
            for (m, got) in [&a, &b, &c].into_iter().zip(&many) {
                assert_eq!(&project_new(isa, m, &x, n), got, "n = {n}");
            }
        }
    }

    #[test]
    fn dot_matches_the_plain_sum_closely_on_every_length() {
        for len in [0usize, 1, 7, 15, 16, 17, 33, 128, 256, 300] {
            let a: Vec<f32> = (0..len).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..len).map(|i| (i as f32 * 0.11).cos()).collect();
            let plain: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| f64::from(*x) * f64::from(*y))
                .sum();
            let scale: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| f64::from((x * y).abs()))
                .sum::<f64>()
                .max(1e-30);
            assert!(
                (f64::from(dot(&a, &b)) - plain).abs() <= 1e-6 * scale,
                "len {len}"
            );
        }
    }

    #[test]
    fn l2_norm_unit_length() {
        let mut x = vec![3.0, 4.0];
        l2_norm(&mut x, 0.0, 1.0);
        assert!((x[0] - 0.6).abs() < 1e-7 && (x[1] - 0.8).abs() < 1e-7);
    }
}
