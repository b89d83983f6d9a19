//! The k-quant kernels against their definitions: block layouts round-trip, the quantisers'
//! error stays within the format's resolution, every ISA equals the scalar reference bit for
//! bit, and a token alone equals the same token in a batch.

use super::*;
use crate::kernels::present_or_say;

/// Deterministic pseudo-random values in about [-scale, scale].
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn isas() -> Vec<Int8Isa> {
    present_or_say(Int8Isa::ALL, |i| i.is_available())
}

#[test]
fn q4k_scale_packing_matches_ggml_get_scale_min_k4() {
    // ggml's definition, written out per sub-block.
    let packed: Vec<u8> = (0..12u8)
        .map(|i| i.wrapping_mul(37).wrapping_add(11))
        .collect();
    let (sc, m) = q4k_scales_mins(&packed);
    for j in 0..8 {
        let (d, mm) = if j < 4 {
            (packed[j] & 63, packed[j + 4] & 63)
        } else {
            (
                (packed[j + 4] & 0xF) | ((packed[j - 4] >> 6) << 4),
                (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4),
            )
        };
        assert_eq!((sc[j], m[j]), (d, mm), "sub-block {j}");
    }
}

#[test]
fn quantisers_round_trip_within_their_resolution() {
    // Bounds on the RMS and the largest error relative to the row's largest |w|, for uniform
    // weights: 4 bits over the range [lo, hi] give RMS ≈ step/√12 = 1/(15·√12) ≈ 0.019 of
    // the range (0.039 of max |w|); the least-squares fit may clip an extreme to lower the RMS.
    for (kind, cols, rms_bound, max_bound) in [
        (KQuantKind::Q4K, 512, 0.045, 0.15),
        (KQuantKind::Q4K, 300, 0.045, 0.15),
        (KQuantKind::Q6K, 512, 0.011, 0.03),
        (KQuantKind::Q6K, 40, 0.011, 0.03),
    ] {
        let rows = 6;
        let w = values(rows * cols, 7 + cols as u64, 0.5);
        let m = quantize_matrix(kind, &w, rows, cols);
        assert_eq!(m.data.len(), rows * row_bytes(kind, cols));
        let rb = m.as_ref().row_bytes();
        let mut back = vec![0.0f32; cols];
        for r in 0..rows {
            dequantize_row(kind, &m.data[r * rb..][..rb], cols, &mut back);
            let row = &w[r * cols..][..cols];
            let max = row.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let err = row
                .iter()
                .zip(&back)
                .fold(0.0f32, |a, (x, y)| a.max((x - y).abs()));
            let rms = (row
                .iter()
                .zip(&back)
                .map(|(x, y)| (x - y) * (x - y))
                .sum::<f32>()
                / cols as f32)
                .sqrt();
            assert!(
                rms <= rms_bound * max && err <= max_bound * max,
                "{kind:?} cols {cols} row {r}: rms {rms}, max err {err}, max |w| {max}"
            );
        }
    }
}

#[test]
fn an_all_zero_matrix_quantises_to_zero_output() {
    for kind in [KQuantKind::Q4K, KQuantKind::Q6K] {
        let m = quantize_matrix(kind, &[0.0; 4 * 256], 4, 256);
        let x = values(256, 3, 1.0);
        let mut acts = KActs::default();
        let xa = acts.quantize(&x, 1, 256);
        for isa in isas() {
            let mut y = vec![1.0f32; 4];
            gemv_k(isa, m.as_ref(), xa, &mut y);
            assert_eq!(y, vec![0.0; 4], "{kind:?} {isa}");
        }
    }
}

/// f64 dot product of dequantised weights and dequantised activations: what the integer path
/// must reproduce up to f32 rounding.
fn reference(kind: KQuantKind, m: &KMatrix, x: &KActsRef<'_>, t: usize) -> Vec<f64> {
    let pk = padded_k(m.cols);
    let (xq, _, sx) = x.row(t, pk);
    let rb = m.as_ref().row_bytes();
    let mut w = vec![0.0f32; m.cols];
    (0..m.rows)
        .map(|r| {
            dequantize_row(kind, &m.data[r * rb..][..rb], m.cols, &mut w);
            w.iter()
                .zip(xq)
                .map(|(&a, &b)| f64::from(a) * f64::from(b) * f64::from(sx))
                .sum()
        })
        .collect()
}

#[test]
fn every_isa_equals_the_scalar_kernel_bit_for_bit_and_the_math() {
    for kind in [KQuantKind::Q4K, KQuantKind::Q6K] {
        for (rows, cols) in [(1, 256), (3, 512), (17, 300), (32, 2048), (5, 24)] {
            let w = values(rows * cols, (rows * 31 + cols) as u64, 0.3);
            let m = quantize_matrix(kind, &w, rows, cols);
            for n in [1usize, 2, 3, 5, 8, 13] {
                let x = values(n * cols, (n * 7 + cols) as u64, 2.0);
                let mut acts = KActs::default();
                let xa = acts.quantize(&x, n, cols);
                let mut want = vec![0.0f32; n * rows];
                gemm_k(Int8Isa::Scalar, m.as_ref(), xa, n, &mut want);
                for t in 0..n {
                    let r64 = reference(kind, &m, &xa, t);
                    for (r, (&g, &e)) in want[t * rows..][..rows].iter().zip(&r64).enumerate() {
                        let tol = 1e-4 * (1.0 + e.abs());
                        assert!(
                            (f64::from(g) - e).abs() <= tol,
                            "{kind:?} {rows}x{cols} n {n} t {t} r {r}: {g} vs {e}"
                        );
                    }
                }
                for isa in isas() {
                    let mut got = vec![0.0f32; n * rows];
                    gemm_k(isa, m.as_ref(), xa, n, &mut got);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{kind:?} {isa} {rows}x{cols} n {n}: differs from scalar"
                    );
                    // Each token alone gives the same bits as in the batch.
                    for t in 0..n {
                        let mut one = KActs::default();
                        let xt = one.quantize(&x[t * cols..][..cols], 1, cols);
                        let mut y1 = vec![0.0f32; rows];
                        gemv_k(isa, m.as_ref(), xt, &mut y1);
                        assert!(
                            y1.iter()
                                .zip(&got[t * rows..])
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{kind:?} {isa} n {n}: token {t} alone differs"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn every_tile_shape_equals_the_scalar_kernel_bit_for_bit() {
    // The SIMD kernels tile rows by 4, 8 or 16 and tokens in groups of 8, 4, 2, 1: rows around
    // and between those tiles (with remainders), every n up to 17, and raw activations over the
    // whole i8 range (−128 included, which the quantiser never produces).
    for kind in [KQuantKind::Q4K, KQuantKind::Q6K] {
        for (rows, cols) in [(7, 256), (9, 520), (16, 256), (23, 300), (33, 512), (3, 0)] {
            let w = values(rows * cols, (rows * 13 + cols) as u64, 0.4);
            let m = quantize_matrix(kind, &w, rows, cols);
            let pk = padded_k(cols);
            for n in 1usize..=17 {
                let raw = values(n * pk, (n * 5 + rows) as u64, 129.0);
                let mut q: Vec<i8> = raw.iter().map(|&v| v.clamp(-128.0, 127.0) as i8).collect();
                for t in 0..n {
                    q[t * pk + cols..(t + 1) * pk].fill(0);
                }
                if let Some(first) = q.first_mut() {
                    *first = -128;
                }
                let sums: Vec<i32> = q
                    .chunks_exact(SUM_GROUP)
                    .map(|g| g.iter().map(|&v| i32::from(v)).sum())
                    .collect();
                let sums32: Vec<i16> = sums.chunks_exact(2).map(|p| (p[0] + p[1]) as i16).collect();
                let scales = values(n, n as u64, 0.01);
                let xa = KActsRef {
                    q: &q,
                    sums: &sums,
                    sums32: &sums32,
                    scales: &scales,
                };
                let mut want = vec![0.0f32; n * rows];
                gemm_k(Int8Isa::Scalar, m.as_ref(), xa, n, &mut want);
                for isa in isas() {
                    let mut got = vec![0.0f32; n * rows];
                    gemm_k(isa, m.as_ref(), xa, n, &mut got);
                    assert_eq!(
                        got.map_bits(),
                        want.map_bits(),
                        "{kind:?} {isa} {rows}x{cols} n {n}"
                    );
                }
            }
        }
    }
}

#[test]
fn extreme_codes_and_activations_stay_exact() {
    // Every nibble 15, every 6-bit scale and min 63, activations ±127: the largest sums.
    for kind in [KQuantKind::Q4K, KQuantKind::Q6K] {
        let cols = 2048;
        let mut data = vec![0xFFu8; 2 * row_bytes(kind, cols)];
        for block in data.chunks_exact_mut(kind.block_bytes()) {
            match kind {
                KQuantKind::Q4K => block[..4].copy_from_slice(&[0x00, 0x3C, 0x00, 0x3C]),
                KQuantKind::Q6K => {
                    block[192..208].fill(0x80); // -128
                    block[208..210].copy_from_slice(&[0x00, 0x3C]);
                }
            }
        }
        let m = KMatrixRef {
            kind,
            rows: 2,
            cols,
            data: &data,
        };
        // One token alone and eight (the eight-token tiles), signs varying by token.
        for n in [1usize, 8] {
            let x: Vec<f32> = (0..n * cols)
                .map(|i| {
                    if (i % cols) % (3 + i / cols) == 0 {
                        -1.0
                    } else {
                        1.0
                    }
                })
                .collect();
            let mut acts = KActs::default();
            let xa = acts.quantize(&x, n, cols);
            let mut want = vec![0.0f32; 2 * n];
            gemm_k(Int8Isa::Scalar, m, xa, n, &mut want);
            assert!(want.iter().all(|v| v.is_finite() && *v != 0.0), "{want:?}");
            for isa in isas() {
                let mut got = vec![0.0f32; 2 * n];
                gemm_k(isa, m, xa, n, &mut got);
                assert_eq!(got.map_bits(), want.map_bits(), "{kind:?} {isa} n {n}");
            }
        }
    }
}

trait Bits {
    fn map_bits(&self) -> Vec<u32>;
}
impl Bits for Vec<f32> {
    fn map_bits(&self) -> Vec<u32> {
        self.iter().map(|v| v.to_bits()).collect()
    }
}

#[test]
fn the_expert_is_bit_identical_across_isas_and_close_to_f32() {
    let (d, f, n) = (512, 256, 5);
    let gate_up = values(2 * f * d, 11, 0.05);
    let down = values(d * f, 12, 0.05);
    let x = values(n * d, 13, 1.0);
    for down_kind in [KQuantKind::Q4K, KQuantKind::Q6K] {
        let gu = quantize_matrix(KQuantKind::Q4K, &gate_up, 2 * f, d);
        let dn = quantize_matrix(down_kind, &down, d, f);
        let mut want = vec![0.0f32; n * d];
        let mut s = KExpertScratch::new();
        expert_forward_k(
            Int8Isa::Scalar,
            gu.as_ref(),
            dn.as_ref(),
            &x,
            n,
            &mut want,
            &mut s,
        );
        for isa in isas() {
            let mut got = vec![0.0f32; n * d];
            expert_forward_k(isa, gu.as_ref(), dn.as_ref(), &x, n, &mut got, &mut s);
            assert_eq!(got.map_bits(), want.map_bits(), "{down_kind:?} {isa}");
        }
        // Against the f32 expert: relative L2 error of a few percent at 4 bits.
        let mut exact = vec![0.0f32; n * d];
        for t in 0..n {
            let xt = &x[t * d..][..d];
            let h: Vec<f32> = (0..f)
                .map(|i| {
                    let g: f32 = gate_up[i * d..][..d]
                        .iter()
                        .zip(xt)
                        .map(|(a, b)| a * b)
                        .sum();
                    let u: f32 = gate_up[(f + i) * d..][..d]
                        .iter()
                        .zip(xt)
                        .map(|(a, b)| a * b)
                        .sum();
                    silu_mul_ref(g, u)
                })
                .collect();
            for r in 0..d {
                exact[t * d + r] = down[r * f..][..f].iter().zip(&h).map(|(a, b)| a * b).sum();
            }
        }
        let num: f32 = exact
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b) * (a - b))
            .sum();
        let den: f32 = exact.iter().map(|a| a * a).sum();
        let rel = (num / den).sqrt();
        assert!(rel < 0.12, "{down_kind:?}: relative L2 error {rel}");
    }
}

fn silu_mul_ref(g: f32, u: f32) -> f32 {
    g / (1.0 + (-g).exp()) * u
}
