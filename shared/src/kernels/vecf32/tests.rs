//! Tests for the f32 vector kernels: every available ISA against an f64 reference on odd
//! lengths and strides, and the bitwise invariants the attention kernel relies on (a row's dot
//! product does not depend on the call it is in; a weighted sum split over two calls equals one
//! call; the multi-vector kernels give each vector the single kernels' bits), and the softmax
//! tile's `exp` against f64.

use super::*;

/// Lengths around the vector widths, plus the real head size.
const LENS: [usize; 14] = [1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 100, 256, 259];

/// Deterministic test values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let z =
                (i ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn available() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|i| i.is_available()).collect()
}

#[test]
fn dot_rows_match_f64_reference_on_odd_lengths_and_strides() {
    for isa in available() {
        for len in LENS {
            let stride = len + 3;
            let n = 5;
            let x = values(len, 1);
            let rows = values((n - 1) * stride + len, 2);
            let mut out = vec![0.0f32; n];
            dot_rows_f32(isa, &x, &rows, stride, &mut out);
            for (i, got) in out.iter().enumerate() {
                let r = &rows[i * stride..][..len];
                let exact: f64 = x
                    .iter()
                    .zip(r)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
                let mag: f64 = x
                    .iter()
                    .zip(r)
                    .map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs())
                    .sum();
                assert!(
                    (f64::from(*got) - exact).abs() <= 1e-6 * mag + 1e-30,
                    "{isa} len {len} row {i}: {got} vs {exact}"
                );
            }
        }
    }
}

#[test]
fn a_rows_dot_product_is_the_same_bits_in_any_call() {
    for isa in available() {
        for len in LENS {
            let n = 7;
            let x = values(len, 3);
            let rows = values(n * len, 4);
            let mut all = vec![0.0f32; n];
            dot_rows_f32(isa, &x, &rows, len, &mut all);
            for i in 0..n {
                let mut one = [0.0f32];
                dot_rows_f32(isa, &x, &rows[i * len..], len, &mut one);
                assert_eq!(
                    one[0].to_bits(),
                    all[i].to_bits(),
                    "{isa} len {len} row {i}"
                );
            }
        }
    }
}

#[test]
fn weighted_sum_matches_reference_and_splits_bitwise() {
    for isa in available() {
        for len in LENS {
            let (n, stride) = (9, len + 1);
            let w = values(n, 5);
            let rows = values((n - 1) * stride + len, 6);
            let start = values(len, 7);
            let mut acc = start.clone();
            scale_axpy_rows_f32(isa, &mut acc, 0.75, &w, &rows, stride);
            for j in 0..len {
                let exact = f64::from(start[j]) * 0.75
                    + (0..n)
                        .map(|i| f64::from(w[i]) * f64::from(rows[i * stride + j]))
                        .sum::<f64>();
                let mag = f64::from(start[j]).abs()
                    + (0..n)
                        .map(|i| (f64::from(w[i]) * f64::from(rows[i * stride + j])).abs())
                        .sum::<f64>();
                assert!(
                    (f64::from(acc[j]) - exact).abs() <= 1e-6 * mag + 1e-30,
                    "{isa} len {len} elem {j}"
                );
            }
            let mut split = start.clone();
            scale_axpy_rows_f32(isa, &mut split, 0.75, &w[..4], &rows, stride);
            scale_axpy_rows_f32(isa, &mut split, 1.0, &w[4..], &rows[4 * stride..], stride);
            let same = split
                .iter()
                .zip(&acc)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{isa} len {len}: a weighted sum split over two calls differs from one call"
            );
        }
    }
}

#[test]
fn avx512_weighted_sum_gives_the_avx2_bits() {
    if !Isa::Avx512.is_available() {
        crate::skip::skip(
            "avx512",
            "avx512_weighted_sum_gives_the_avx2_bits",
            "this CPU lacks AVX-512",
        );
        return;
    }
    for len in LENS {
        let (n, stride) = (9, len + 5);
        let w = values(n, 8);
        let rows = values((n - 1) * stride + len, 9);
        let start = values(len, 10);
        let (mut a2, mut a5) = (start.clone(), start);
        scale_axpy_rows_f32(Isa::Avx2, &mut a2, 0.5, &w, &rows, stride);
        scale_axpy_rows_f32(Isa::Avx512, &mut a5, 0.5, &w, &rows, stride);
        assert!(
            a2.iter().zip(&a5).all(|(a, b)| a.to_bits() == b.to_bits()),
            "len {len}"
        );
    }
}

#[test]
fn multi_vector_kernels_give_each_vector_the_single_kernels_bits() {
    for isa in available() {
        for len in LENS {
            let stride = len + 2;
            for nx in [1, 3, 4, 5, 8, 9] {
                for n in [1, 3, 4, 5, 7, 16, 63, 64] {
                    let xs = values(nx * len, 11);
                    let rows = values((n - 1) * stride + len, 12);
                    let mut multi = vec![0.0f32; nx * n];
                    dot_rows_multi_f32(isa, len, &xs, &rows, stride, &mut multi, n);
                    let w = values(nx * n, 13);
                    let scales = values(nx, 14);
                    let mut acc = values(nx * len, 15);
                    let start = acc.clone();
                    scale_axpy_rows_multi_f32(isa, &mut acc, &scales, &w, &rows, stride);
                    for x in 0..nx {
                        let mut one = vec![0.0f32; n];
                        dot_rows_f32(isa, &xs[x * len..][..len], &rows, stride, &mut one);
                        let same = one
                            .iter()
                            .zip(&multi[x * n..][..n])
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "{isa} len {len} nx {nx} n {n}: dot products of vector {x}"
                        );
                        let mut a1 = start[x * len..][..len].to_vec();
                        scale_axpy_rows_f32(
                            isa,
                            &mut a1,
                            scales[x],
                            &w[x * n..][..n],
                            &rows,
                            stride,
                        );
                        let same = a1
                            .iter()
                            .zip(&acc[x * len..][..len])
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "{isa} len {len} nx {nx} n {n}: weighted sum of vector {x}"
                        );
                    }
                }
            }
        }
    }
}

/// The bound the `softmax_tile_f32` docs state for its `exp`.
const EXP_MAX_REL_ERR: f64 = 1.5e-7;

#[test]
fn polynomial_exp_is_within_its_stated_error_of_f64_exp() {
    let steps = 2_000_000;
    let mut worst = (0.0f64, 0.0f32);
    for k in 0..=steps {
        let x = scalar::EXP_LO * (k as f32 / steps as f32);
        let want = f64::from(x).exp();
        let rel = ((f64::from(scalar::exp(x)) - want) / want).abs();
        if rel > worst.0 {
            worst = (rel, x);
        }
    }
    println!("exp: max relative error {:e} at {}", worst.0, worst.1);
    assert!(
        worst.0 <= EXP_MAX_REL_ERR,
        "exp: relative error {:e} at {}",
        worst.0,
        worst.1
    );
    assert_eq!(scalar::exp(0.0), 1.0);
    assert_eq!(scalar::exp(-0.0), 1.0);
    assert_eq!(scalar::exp(-88.0), 0.0);
    assert_eq!(scalar::exp(f32::NEG_INFINITY), 0.0);
    assert!(scalar::exp(f32::NAN).is_nan());
}

#[test]
fn softmax_tile_matches_f64_and_gives_the_same_bits_on_every_isa() {
    for len in [1, 2, 15, 16, 17, 31, 33, 63, 64] {
        let mut raw: Vec<f32> = values(len, 16).iter().map(|v| v * 40.0).collect();
        if len >= 16 {
            // Scores far below the maximum, so exp's underflow to 0 and its clamp run in every
            // ISA's lanes too (with m = 100 every element is below exp's range), and a masked key.
            raw[3] = -2000.0;
            raw[len - 2] = f32::NEG_INFINITY;
        }
        for m in [f32::NEG_INFINITY, 3.0, 50.0, 100.0, 1500.0] {
            let mut want = raw.clone();
            let (m_want, sum_want) = softmax_tile_f32(Isa::Scalar, &mut want, 0.0625, m);
            let m_exact = raw.iter().map(|v| v * 0.0625).fold(m, f32::max);
            assert_eq!(m_want, m_exact, "len {len} m {m}: max");
            let mut sum_exact = 0.0f64;
            for (p, r) in want.iter().zip(&raw) {
                // The kernel's own f32 difference: exp's error, not the subtraction's rounding.
                let e = f64::from(r * 0.0625 - m_exact).exp();
                sum_exact += e;
                assert!(
                    (f64::from(*p) - e).abs() <= EXP_MAX_REL_ERR * e + 1e-38,
                    "len {len} m {m}: {p} vs {e}"
                );
            }
            // (An absolute floor for the terms exp flushes to 0: below e^-87.3 each.)
            assert!(
                (f64::from(sum_want) - sum_exact).abs() <= 1e-6 * sum_exact + 1e-36,
                "len {len} m {m}: sum"
            );
            for isa in available() {
                let mut got = raw.clone();
                let (m_got, sum_got) = softmax_tile_f32(isa, &mut got, 0.0625, m);
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same && m_got.to_bits() == m_want.to_bits()
                        && sum_got.to_bits() == sum_want.to_bits(),
                    "{isa} len {len} m {m}"
                );
            }
        }
    }
}

#[test]
fn with_no_rows_the_weighted_sums_only_scale() {
    for isa in available() {
        for len in LENS {
            let acc0 = values(len, 20);
            let mut acc = acc0.clone();
            scale_axpy_rows_f32(isa, &mut acc, 0.5, &[], &[], len);
            assert!(
                acc.iter()
                    .zip(&acc0)
                    .all(|(a, b)| a.to_bits() == (b * 0.5).to_bits()),
                "{isa} len {len}"
            );
            let acc0 = values(9 * len, 21);
            let mut acc = acc0.clone();
            let scales: Vec<f32> = (0..9).map(|x| 0.25 * x as f32).collect();
            scale_axpy_rows_multi_f32(isa, &mut acc, &scales, &[], &[], len);
            let want: Vec<f32> = acc0
                .iter()
                .enumerate()
                .map(|(i, v)| v * scales[i / len])
                .collect();
            assert!(
                acc.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{isa} multi len {len}"
            );
        }
    }
}

#[test]
#[should_panic(expected = "need")]
fn short_rows_are_refused() {
    let mut out = [0.0f32; 3];
    dot_rows_f32(Isa::Scalar, &[1.0; 4], &[0.0; 10], 4, &mut out);
}
