//! Element-wise and per-vector math of the forward pass in f32 (spec §4.1): the zero-centred
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
    fn l2_norm_unit_length() {
        let mut x = vec![3.0, 4.0];
        l2_norm(&mut x, 0.0, 1.0);
        assert!((x[0] - 0.6).abs() < 1e-7 && (x[1] - 0.8).abs() < 1e-7);
    }
}
