//! Tests for the int8 kernels: the R16C4 layout and the quantisation formula; every available
//! ISA against the scalar reference, comparing the i32 accumulators exactly and the f32
//! outputs bitwise, on odd shapes, batch sizes 1..=9, misaligned slices and extreme values;
//! GEMM rows against GEMV; and `expert_forward` against an f64 reference within a stated
//! error budget.

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::quant::{quantize_value, row_params};
use super::*;
use crate::splitmix::SplitMix64;

mod expert;

/// Row counts: one, the row block ± 1, two blocks + 1, and a large odd count.
const ODD_ROWS: [usize; 6] = [1, 15, 16, 17, 33, 1024 + 5];
/// Column counts: one, the column group ± 1, the zmm width ± 1, and a long odd row.
const ODD_COLS: [usize; 8] = [1, 3, 4, 5, 63, 64, 65, 2048 + 3];

/// Uniform in `[lo, hi)`, 24 random bits.
fn uniform(rng: &mut SplitMix64, lo: f32, hi: f32) -> f32 {
    lo + (hi - lo) * ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
}

/// `len` values [`uniform`] in `[lo, hi)`.
fn uniform_vec(rng: &mut SplitMix64, len: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..len).map(|_| uniform(rng, lo, hi)).collect()
}

/// Every ISA this CPU has, scalar first; prints the ones it lacks.
fn isas() -> Vec<Int8Isa> {
    crate::kernels::present_or_say(Int8Isa::ALL, |isa| isa.is_available())
}

/// `Σ_c q[r][c] · (x_q[c] − 128)` from the row-major quantised values, in i64: a check of the
/// scalar kernel (and the packing) that shares no code with it.
fn reference_acc(q: &[i8], rows: usize, cols: usize, x_q: &[u8], n: usize) -> Vec<i32> {
    let pc = padded_cols(cols);
    let mut acc = Vec::with_capacity(n * rows);
    for t in 0..n {
        for r in 0..rows {
            let s: i64 = (0..cols)
                .map(|c| i64::from(q[r * cols + c]) * (i64::from(x_q[t * pc + c]) - 128))
                .sum();
            acc.push(i32::try_from(s).expect("reference accumulator fits i32"));
        }
    }
    acc
}

/// A matrix's slices copied `off` elements into fresh buffers, so the kernels see misaligned
/// pointers; the buffers keep the copies alive.
struct Shifted {
    packed: Vec<i8>,
    scales: Vec<f32>,
    row_sums: Vec<i32>,
    off: usize,
    rows: usize,
    cols: usize,
}

impl Shifted {
    fn new(m: &QuantizedMatrix, off: usize) -> Shifted {
        fn shift<T: Copy + Default>(v: &[T], off: usize) -> Vec<T> {
            let mut out = vec![T::default(); off];
            out.extend_from_slice(v);
            out.extend(std::iter::repeat_n(T::default(), 3));
            out
        }
        Shifted {
            packed: shift(&m.packed, off),
            scales: shift(&m.scales, off),
            row_sums: shift(&m.row_sums, off),
            off,
            rows: m.rows,
            cols: m.cols,
        }
    }

    fn as_ref(&self) -> MatrixRef<'_> {
        let (o, pr) = (self.off, padded_rows(self.rows));
        MatrixRef {
            rows: self.rows,
            cols: self.cols,
            packed: &self.packed[o..o + pr * padded_cols(self.cols)],
            scales: &self.scales[o..o + pr],
            row_sums: &self.row_sums[o..o + pr],
        }
    }
}

/// Runs `m` against `x_q` on every ISA and checks: the scalar accumulators equal `want`; every
/// SIMD ISA's accumulators equal the scalar ones and its f32 outputs are bitwise equal; each
/// GEMM row equals GEMV on that token. Returns the scalar f32 outputs.
fn check_all_isas(
    what: &str,
    m: MatrixRef<'_>,
    x_q: &[u8],
    x_scales: &[f32],
    n: usize,
    want: &[i32],
) -> Vec<f32> {
    let rows = m.rows;
    let pc = m.padded_cols();
    let mut acc_ref = vec![0i32; n * rows];
    gemm_w8a8_i32(Int8Isa::Scalar, m, x_q, n, &mut acc_ref);
    assert_eq!(
        acc_ref, want,
        "{what}: scalar accumulators differ from the reference"
    );
    let mut y_ref = vec![f32::NAN; n * rows];
    gemm_w8a8(Int8Isa::Scalar, m, x_q, x_scales, n, &mut y_ref);
    for (i, (&y, &a)) in y_ref.iter().zip(&acc_ref).enumerate() {
        let want = a as f32 * m.scales[i % rows] * x_scales[i / rows];
        assert_eq!(
            y.to_bits(),
            want.to_bits(),
            "{what}: scalar dequantisation at {i}"
        );
    }
    for isa in isas() {
        let mut acc = vec![i32::MIN; n * rows];
        gemm_w8a8_i32(isa, m, x_q, n, &mut acc);
        if let Some(i) = (0..acc.len()).find(|&i| acc[i] != acc_ref[i]) {
            panic!(
                "{what}: {isa} accumulator {i} (t {}, r {}) = {}, scalar {}",
                i / rows,
                i % rows,
                acc[i],
                acc_ref[i]
            );
        }
        let mut y = vec![f32::NAN; n * rows];
        gemm_w8a8(isa, m, x_q, x_scales, n, &mut y);
        assert_bitwise(&format!("{what}: {isa} gemm"), &y, &y_ref);
        for t in 0..n {
            let mut y1 = vec![f32::NAN; rows];
            gemv_w8a8(isa, m, &x_q[t * pc..][..pc], x_scales[t], &mut y1);
            assert_bitwise(
                &format!("{what}: {isa} gemv token {t}"),
                &y1,
                &y_ref[t * rows..][..rows],
            );
        }
    }
    y_ref
}

fn assert_bitwise(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!(
            "{what}: element {i} is {:e} ({:#x}), want {:e} ({:#x})",
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits()
        );
    }
}

/// Random weights in [-1, 1) with the given shape, quantised; also the row-major values.
fn random_matrix(rng: &mut SplitMix64, rows: usize, cols: usize) -> (QuantizedMatrix, Vec<i8>) {
    let w = uniform_vec(rng, rows * cols, -1.0, 1.0);
    let m = quantize_weights(&w, rows, cols);
    let q = unpack_r16c4(&m.packed, rows, cols);
    (m, q)
}

/// `n` random activation rows in [-3, 3), quantised: `(x_q, scales)`.
fn random_activations(rng: &mut SplitMix64, n: usize, cols: usize) -> (Vec<u8>, Vec<f32>) {
    let x = uniform_vec(rng, n * cols, -3.0, 3.0);
    quantize(&x, n, cols)
}

fn quantize(x: &[f32], n: usize, cols: usize) -> (Vec<u8>, Vec<f32>) {
    let mut x_q = vec![0u8; n * padded_cols(cols)];
    let mut scales = vec![0.0f32; n];
    quantize_activations(x, n, cols, &mut x_q, &mut scales);
    (x_q, scales)
}

#[test]
fn packed_index_follows_the_documented_loop() {
    for (rows, cols) in [(1, 1), (17, 5), (33, 64), (16, 3)] {
        let (pr, pc) = (padded_rows(rows), padded_cols(cols));
        let mut expected = Vec::new();
        for rb in 0..pr / ROW_BLOCK {
            for cg in 0..pc / COL_GROUP {
                for r in 0..ROW_BLOCK {
                    for c in 0..COL_GROUP {
                        expected.push((rb * ROW_BLOCK + r, cg * COL_GROUP + c));
                    }
                }
            }
        }
        assert_eq!(expected.len(), pr * pc);
        for (i, &(r, c)) in expected.iter().enumerate() {
            assert_eq!(packed_index(r, c, cols), i, "{rows}×{cols} ({r}, {c})");
        }
        let q: Vec<i8> = (0..rows * cols).map(|i| (i % 251) as i8).collect();
        let packed = pack_r16c4(&q, rows, cols);
        for (i, &(r, c)) in expected.iter().enumerate() {
            let want = if r < rows && c < cols {
                q[r * cols + c]
            } else {
                0
            };
            assert_eq!(packed[i], want, "{rows}×{cols} byte {i}");
        }
        assert_eq!(unpack_r16c4(&packed, rows, cols), q);
    }
    assert_eq!(
        (
            padded_rows(0),
            padded_rows(1),
            padded_rows(16),
            padded_rows(17)
        ),
        (0, 16, 16, 32)
    );
    assert_eq!(
        (
            padded_cols(0),
            padded_cols(1),
            padded_cols(4),
            padded_cols(5)
        ),
        (0, 4, 4, 8)
    );
}

/// The quantisation formula, its layout invariants and the round-trip bound.
///
/// Bound: `|w − q·scale| ≤ scale · (0.5 + 1e-4)`. Exact arithmetic gives `scale / 2`; f32 adds
/// the rounding of `inv`, of `w · inv` (together ≤ 127 · 2⁻²³ on the `q` scale), of `scale`
/// and of `q · scale` (≤ 127 · 2⁻²³ more), about `3e-5 · scale` in all.
#[test]
fn quantisation_round_trip_and_invariants() {
    let mut rng = SplitMix64::new(7);
    for (rows, cols) in [(1, 1), (17, 65), (33, 2051), (5, 3)] {
        let mut w = uniform_vec(&mut rng, rows * cols, -2.0, 2.0);
        if rows > 2 {
            w[cols..2 * cols].fill(0.0); // a zero row
            w[2 * cols..3 * cols].iter_mut().for_each(|v| *v *= 1e-20); // a tiny row
        }
        let m = quantize_weights(&w, rows, cols);
        m.as_ref()
            .verify()
            .expect("quantize_weights output is well-formed");
        let q = unpack_r16c4(&m.packed, rows, cols);
        let deq = m.dequantize();
        for r in 0..rows {
            let row = &w[r * cols..][..cols];
            let max_abs = row.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let scale = m.scales[r];
            assert_eq!(scale, max_abs / 127.0, "row {r} scale");
            let sum: i32 = q[r * cols..][..cols].iter().map(|&v| i32::from(v)).sum();
            assert_eq!(m.row_sums[r], sum, "row {r} sum");
            if max_abs == 0.0 {
                assert!(
                    q[r * cols..][..cols].iter().all(|&v| v == 0),
                    "zero row {r}"
                );
                continue;
            }
            let qmax = (0..cols)
                .map(|c| q[r * cols + c].unsigned_abs())
                .max()
                .unwrap();
            assert_eq!(qmax, 127, "row {r}: the largest |w| maps to ±127");
            for c in 0..cols {
                let (v, d) = (row[c], deq[r * cols + c]);
                assert!((-127..=127).contains(&q[r * cols + c]));
                let err = (f64::from(v) - f64::from(d)).abs();
                assert!(
                    err <= f64::from(scale) * (0.5 + 1e-4),
                    "({r}, {c}): w {v}, deq {d}, scale {scale}"
                );
            }
        }
        assert!(
            m.scales[rows..].iter().all(|&s| s == 0.0)
                && m.row_sums[rows..].iter().all(|&s| s == 0)
        );
    }
    // The formula exactly as specified, on hand-picked values: ties round to even.
    let m = quantize_weights(&[127.0, 0.5, 1.5, 2.5, -0.5, -126.5], 1, 6);
    assert_eq!(unpack_r16c4(&m.packed, 1, 6), [127, 0, 2, 2, 0, -126]);
    assert_eq!(m.scales[0], 1.0);
}

/// The fast `quantize_value` equals the formula as specified on ties, near-ties, signed zeros,
/// the clamp bounds, non-finite values and a million random products.
#[test]
fn quantize_value_matches_the_formula() {
    let formula = |v: f32, inv: f32| (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
    let mut values = vec![
        0.0f32,
        -0.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN,
        1e-45,
    ];
    for k in -130i32..=130 {
        let k = k as f32;
        for d in [0.0f32, 0.5, -0.5, 0.25, 0.75] {
            let v = k + d;
            values.extend([v, v.next_up(), v.next_down()]);
        }
    }
    let mut rng = SplitMix64::new(21);
    values.extend((0..1_000_000).map(|_| uniform(&mut rng, -300.0, 300.0)));
    for &v in &values {
        for inv in [1.0f32, 0.5, 127.0 / 3.0, 1e30, 0.0] {
            assert_eq!(
                quantize_value(v, inv),
                formula(v, inv),
                "v {v:e}, inv {inv:e}"
            );
        }
    }
}

#[test]
fn activation_quantisation_matches_weights_and_pads_with_zero() {
    let mut rng = SplitMix64::new(11);
    for cols in [1, 3, 4, 5, 63, 2051] {
        let n = 3;
        let mut x = uniform_vec(&mut rng, n * cols, -5.0, 5.0);
        x[cols..2 * cols].fill(0.0);
        let (x_q, scales) = quantize(&x, n, cols);
        let pc = padded_cols(cols);
        let m = quantize_weights(&x, n, cols);
        let q = unpack_r16c4(&m.packed, n, cols);
        for t in 0..n {
            assert_eq!(
                scales[t], m.scales[t],
                "cols {cols} row {t}: same scale as the weight formula"
            );
            for c in 0..pc {
                let want = if c < cols {
                    (i16::from(q[t * cols + c]) + 128) as u8
                } else {
                    128
                };
                assert_eq!(x_q[t * pc + c], want, "cols {cols} ({t}, {c})");
                assert!(x_q[t * pc + c] >= 1);
            }
        }
        assert_eq!(scales[1], 0.0);
    }
}

/// The brief's odd shapes × batch sizes 1..=9 (the largest shapes at a few batch sizes).
#[test]
fn accumulators_bit_identical_on_odd_shapes() {
    let mut rng = SplitMix64::new(1);
    for rows in ODD_ROWS {
        for cols in ODD_COLS {
            let (m, q) = random_matrix(&mut rng, rows, cols);
            let big = rows * cols > 100_000;
            let ns: &[usize] = if big {
                &[1, 2, 5, 8, 9]
            } else {
                &[1, 2, 3, 4, 5, 6, 7, 8, 9]
            };
            for &n in ns {
                let (mut x_q, mut scales) = random_activations(&mut rng, n, cols);
                if n >= 3 {
                    // A zero activation row in the middle of the batch.
                    let pc = padded_cols(cols);
                    x_q[pc..2 * pc].fill(128);
                    scales[1] = 0.0;
                }
                let want = reference_acc(&q, rows, cols, &x_q, n);
                check_all_isas(
                    &format!("{rows}×{cols} n {n}"),
                    m.as_ref(),
                    &x_q,
                    &scales,
                    n,
                    &want,
                );
            }
        }
    }
}

#[test]
fn misaligned_offsets_bit_identical() {
    let mut rng = SplitMix64::new(2);
    for (rows, cols, n) in [(33, 65, 3), (17, 2051, 9), (1029, 63, 2), (16, 4, 1)] {
        let (m, q) = random_matrix(&mut rng, rows, cols);
        let (x_q, scales) = random_activations(&mut rng, n, cols);
        let want = reference_acc(&q, rows, cols, &x_q, n);
        let aligned = check_all_isas("aligned", m.as_ref(), &x_q, &scales, n, &want);
        for off in [1, 2, 3, 5, 63] {
            let shifted = Shifted::new(&m, off);
            let mut x_buf = vec![0u8; off];
            x_buf.extend_from_slice(&x_q);
            let mut s_buf = vec![0.0f32; off % 3];
            s_buf.extend_from_slice(&scales);
            let what = format!("{rows}×{cols} n {n} offset {off}");
            let y = check_all_isas(
                &what,
                shifted.as_ref(),
                &x_buf[off..],
                &s_buf[off % 3..],
                n,
                &want,
            );
            assert_bitwise(&what, &y, &aligned);
        }
    }
}

/// Saturating weights and activations: the largest magnitudes the quantiser produces (±127)
/// and the largest the kernels accept (−128 weights, activation bytes 0 and 255), up to
/// `MAX_COLS` columns, against closed-form sums. `vpmaddubsw` would saturate here and an
/// i16 accumulator would overflow.
#[test]
fn extremes_do_not_overflow_or_saturate() {
    for cols in [4, 65, 2048, 2051, MAX_COLS] {
        let rows = 17;
        let n = 4;
        // Rows: all +127, all −127, all −128, alternating ±127, then the rest all +127.
        let mut q = vec![127i8; rows * cols];
        q[cols..2 * cols].fill(-127);
        q[2 * cols..3 * cols].fill(-128);
        q[3 * cols..4 * cols]
            .iter_mut()
            .enumerate()
            .for_each(|(c, v)| *v = if c % 2 == 0 { 127 } else { -127 });
        let m = QuantizedMatrix::from_quantized(&q, rows, cols, &vec![1.0; rows]);
        m.as_ref().verify().expect("well-formed");
        // Activation bytes: all 255 (+127), all 1 (−127), all 0 (−128), all 128 (0).
        let pc = padded_cols(cols);
        let mut x_q = vec![128u8; n * pc];
        for (t, byte) in [255u8, 1, 0, 128].into_iter().enumerate() {
            x_q[t * pc..t * pc + cols].fill(byte);
        }
        let scales = vec![1.0f32; n];
        let want = reference_acc(&q, rows, cols, &x_q, n);
        let c = cols as i64;
        let alternating = |x: i64| if cols % 2 == 1 { 127 * x } else { 0 };
        let expected: [[i64; 4]; 4] = [
            [
                127 * 127 * c,
                -127 * 127 * c,
                -128 * 127 * c,
                alternating(127),
            ],
            [
                -127 * 127 * c,
                127 * 127 * c,
                128 * 127 * c,
                alternating(-127),
            ],
            [
                -128 * 127 * c,
                128 * 127 * c,
                128 * 128 * c,
                alternating(-128),
            ],
            [0, 0, 0, 0],
        ];
        for (t, row) in expected.iter().enumerate() {
            for (r, &e) in row.iter().enumerate() {
                assert_eq!(
                    i64::from(want[t * rows + r]),
                    e,
                    "cols {cols}: closed form, token {t} row {r}"
                );
            }
        }
        check_all_isas(
            &format!("extremes cols {cols}"),
            m.as_ref(),
            &x_q,
            &scales,
            n,
            &want,
        );
    }
}

/// Zero weight rows (scale 0) and zero activation rows (scale 0) give +0.0 exactly.
#[test]
fn zero_rows_give_zero() {
    let mut rng = SplitMix64::new(3);
    let (rows, cols, n) = (33, 130, 3);
    let mut w = uniform_vec(&mut rng, rows * cols, -1.0, 1.0);
    w[5 * cols..6 * cols].fill(0.0);
    w[32 * cols..].fill(0.0);
    let m = quantize_weights(&w, rows, cols);
    assert_eq!((m.scales[5], m.scales[32]), (0.0, 0.0));
    let mut x = uniform_vec(&mut rng, n * cols, -1.0, 1.0);
    x[2 * cols..].fill(0.0);
    let (x_q, scales) = quantize(&x, n, cols);
    assert_eq!(scales[2], 0.0);
    let q = unpack_r16c4(&m.packed, rows, cols);
    let y = check_all_isas(
        "zero rows",
        m.as_ref(),
        &x_q,
        &scales,
        n,
        &reference_acc(&q, rows, cols, &x_q, n),
    );
    for t in 0..n {
        for r in 0..rows {
            if t == 2 || r == 5 || r == 32 {
                assert_eq!(y[t * rows + r].to_bits(), 0, "({t}, {r}) is +0.0");
            }
        }
    }
}

#[test]
fn empty_shapes() {
    for isa in isas() {
        let m = quantize_weights(&[], 0, 7);
        gemm_w8a8(isa, m.as_ref(), &[128; 16], &[1.0; 2], 2, &mut []);
        let m = quantize_weights(&[], 3, 0);
        let mut y = [f32::NAN; 6];
        gemm_w8a8(isa, m.as_ref(), &[], &[1.0; 2], 2, &mut y);
        assert_eq!(y, [0.0; 6], "{isa}");
        let (m, _) = random_matrix(&mut SplitMix64::new(4), 5, 9);
        gemm_w8a8(isa, m.as_ref(), &[], &[], 0, &mut []);
    }
}

#[test]
fn malformed_matrices_are_rejected() {
    let (m, _) = random_matrix(&mut SplitMix64::new(5), 17, 6);
    let good = m.as_ref();
    good.verify().expect("well-formed");
    let mut bad_sum = m.clone();
    bad_sum.row_sums[3] += 1;
    assert!(matches!(
        bad_sum.as_ref().verify(),
        Err(MatrixError::RowSum { row: 3, .. })
    ));
    let mut bad_pad = m.clone();
    bad_pad.packed[packed_index(2, 7, 6)] = 1;
    assert!(matches!(
        bad_pad.as_ref().verify(),
        Err(MatrixError::Padding { row: 2 })
    ));
    let mut bad_row_pad = m.clone();
    bad_row_pad.scales[20] = 1.0;
    assert!(matches!(
        bad_row_pad.as_ref().verify(),
        Err(MatrixError::Padding { row: 20 })
    ));
    let short = MatrixRef {
        packed: &m.packed[1..],
        ..good
    };
    assert!(matches!(
        short.verify(),
        Err(MatrixError::Length { what: "packed", .. })
    ));

    let panics = |f: &dyn Fn()| catch_unwind(AssertUnwindSafe(f)).is_err();
    let x_q = vec![128u8; 2 * 8];
    let mut y = vec![0.0f32; 2 * 17];
    for isa in isas() {
        assert!(
            panics(&|| gemm_w8a8(isa, short, &x_q, &[1.0; 2], 2, &mut y.clone())),
            "{isa}: short packed"
        );
        assert!(
            panics(&|| gemm_w8a8(isa, good, &x_q[1..], &[1.0; 2], 2, &mut y.clone())),
            "{isa}: short x"
        );
        assert!(
            panics(&|| gemm_w8a8(isa, good, &x_q, &[1.0; 1], 2, &mut y.clone())),
            "{isa}: short scales"
        );
        assert!(
            panics(&|| gemm_w8a8(isa, good, &x_q, &[1.0; 2], 2, &mut y[1..].to_vec())),
            "{isa}: short y"
        );
        assert!(
            panics(&|| gemv_w8a8(isa, good, &x_q, 1.0, &mut y[..17].to_vec())),
            "{isa}: gemv long x"
        );
    }
    gemm_w8a8(Int8Isa::Scalar, good, &x_q, &[1.0; 2], 2, &mut y);
    for isa in Int8Isa::ALL.into_iter().filter(|isa| !isa.is_available()) {
        assert!(
            panics(&|| gemm_w8a8(isa, good, &x_q, &[1.0; 2], 2, &mut y.clone())),
            "{isa} unavailable"
        );
    }
}
