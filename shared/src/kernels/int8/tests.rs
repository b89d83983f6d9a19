//! Tests for the int8 kernels: the R16C4 layout and the quantisation formula; every available
//! ISA against the scalar reference, comparing the i32 accumulators exactly and the f32
//! outputs bitwise, on odd shapes, batch sizes 1..=9, misaligned slices and extreme values;
//! GEMM rows against GEMV; and `expert_forward` against an f64 reference within a stated
//! error budget.

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::quant::{quantize_value, row_params};
use super::*;
use crate::splitmix::SplitMix64;

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

/// What `expert_forward` should compute, in f64 from the dequantised weights and the
/// unquantised input, with a worst-case error bound per output element (see
/// [`expert_forward_within_budget`]). Returns `(reference, bound)`, each `[n, d]`.
fn expert_reference(
    gu: &QuantizedMatrix,
    down: &QuantizedMatrix,
    x: &[f32],
    n: usize,
) -> (Vec<f64>, Vec<f64>) {
    // f32 rounding slack of each dequantisation (`acc as f32 * sw * sx`: three roundings) and
    // of the quantiser's `inv`/`scale` (see `quantisation_round_trip_and_invariants`).
    const DEQ_REL: f64 = 3.0 * 6e-8;
    const HALF_STEP: f64 = 0.5 + 1e-4;
    let (d, f) = (gu.cols, gu.rows / 2);
    let (wgu, wd) = (gu.dequantize(), down.dequantize());
    let mut out = vec![0.0f64; n * d];
    let mut bound = vec![0.0f64; n * d];
    for t in 0..n {
        let xt = &x[t * d..][..d];
        let sx = f64::from(row_params(xt).1);
        // Stage 1: [g | u] and its error bound from x's quantisation.
        let (mut gu_ref, mut gu_err) = (vec![0.0f64; 2 * f], vec![0.0f64; 2 * f]);
        for j in 0..2 * f {
            let row = &wgu[j * d..][..d];
            gu_ref[j] = row
                .iter()
                .zip(xt)
                .map(|(&w, &v)| f64::from(w) * f64::from(v))
                .sum();
            let abs: f64 = row.iter().map(|&w| f64::from(w).abs()).sum();
            gu_err[j] = sx * HALF_STEP * abs * (1.0 + DEQ_REL) + DEQ_REL * gu_ref[j].abs();
        }
        // Stage 2: h = silu(g)·u; |silu'| ≤ 1.1, so |Δh| ≤ 1.1·Δg·(|u| + Δu) + |silu(g)|·Δu,
        // plus the f32 evaluation of silu_mul (a few ulps).
        let silu = |z: f64| z / (1.0 + (-z).exp());
        let (mut h_ref, mut h_err) = (vec![0.0f64; f], vec![0.0f64; f]);
        for j in 0..f {
            let (g, u, eg, eu) = (gu_ref[j], gu_ref[f + j], gu_err[j], gu_err[f + j]);
            h_ref[j] = silu(g) * u;
            h_err[j] =
                1.1 * eg * (u.abs() + eu) + silu(g).abs() * eu + 1e-6 * (h_ref[j].abs() + 1e-30);
        }
        // Stage 3: h's quantisation step, from the largest |h| the kernel can have seen.
        let h_max = (0..f)
            .map(|j| h_ref[j].abs() + h_err[j])
            .fold(0.0f64, f64::max);
        let sh = h_max / 127.0;
        for r in 0..d {
            let row = &wd[r * f..][..f];
            let o: f64 = row
                .iter()
                .zip(&h_ref)
                .map(|(&w, &h)| f64::from(w) * h)
                .sum();
            let e: f64 = row
                .iter()
                .zip(&h_err)
                .map(|(&w, &eh)| f64::from(w).abs() * (eh + sh * HALF_STEP))
                .sum();
            out[t * d + r] = o;
            bound[t * d + r] = e * (1.0 + DEQ_REL) + DEQ_REL * o.abs() + 1e-30;
        }
    }
    (out, bound)
}

/// `expert_forward` on random experts: bitwise identical across ISAs and between a batch and
/// token-by-token calls, and within budget of an f64 reference from the dequantised weights.
///
/// # Error budget
///
/// 1. Worst case, per element: the quantisation of `x` moves each gate/up output by at most
///    `(s_x/2)·Σ_c |w|`; that propagates through `silu(g)·u` with `|silu'| ≤ 1.1`; the
///    quantisation of `h` adds `s_h/2` per element, weighted by `Σ_j |w_down|`; f32 rounding
///    adds a few 1e-7 relative (see `expert_reference`). Every element must be within it.
/// 2. Typical case: quantisation errors are nearly independent, so the relative RMS error
///    `‖out − ref‖ / ‖ref‖` is what matters. Quantising a row with crest factor
///    `κ = max|v| / rms(v)` adds relative noise `κ / (127 · √12) ≈ κ / 440`: uniform `x` has
///    `κ = √3` (0.4%); `h = silu(g)·u` is heavy-tailed (`κ ≈ 4–6` over 512 elements, ≈ 1.2%).
///    The budget is 3% (measured 0.3–1.7% here); a wrong scale, a dropped row or a mis-packed
///    column gives tens of percent.
#[test]
fn expert_forward_within_budget() {
    let mut rng = SplitMix64::new(9);
    for (d, f, n) in [(2048, 512, 3), (65, 17, 5), (4, 1, 1), (130, 33, 9)] {
        let gu = quantize_weights(&uniform_vec(&mut rng, 2 * f * d, -0.05, 0.05), 2 * f, d);
        let down = quantize_weights(&uniform_vec(&mut rng, d * f, -0.05, 0.05), d, f);
        let mut x = uniform_vec(&mut rng, n * d, -2.0, 2.0);
        if n > 2 {
            x[d..2 * d].fill(0.0); // a zero token
        }
        let mut scratch = ExpertScratch::new();
        let mut out_ref = vec![f32::NAN; n * d];
        expert_forward(
            Int8Isa::Scalar,
            gu.as_ref(),
            down.as_ref(),
            &x,
            n,
            &mut out_ref,
            &mut scratch,
        );
        let what = format!("expert d {d} f {f} n {n}");
        for isa in isas() {
            let mut out = vec![f32::NAN; n * d];
            expert_forward(
                isa,
                gu.as_ref(),
                down.as_ref(),
                &x,
                n,
                &mut out,
                &mut scratch,
            );
            assert_bitwise(&format!("{what}: {isa} batch"), &out, &out_ref);
            for t in 0..n {
                let mut one = vec![f32::NAN; d];
                expert_forward(
                    isa,
                    gu.as_ref(),
                    down.as_ref(),
                    &x[t * d..][..d],
                    1,
                    &mut one,
                    &mut scratch,
                );
                assert_bitwise(
                    &format!("{what}: {isa} token {t}"),
                    &one,
                    &out_ref[t * d..][..d],
                );
            }
        }
        let (reference, bound) = expert_reference(&gu, &down, &x, n);
        let (mut err2, mut ref2) = (0.0f64, 0.0f64);
        for i in 0..n * d {
            let err = (f64::from(out_ref[i]) - reference[i]).abs();
            assert!(
                err <= bound[i],
                "{what}: element {i}: {} vs {}, bound {}",
                out_ref[i],
                reference[i],
                bound[i]
            );
            err2 += err * err;
            ref2 += reference[i] * reference[i];
        }
        if n > 2 {
            assert!(
                out_ref[d..2 * d].iter().all(|&v| v.to_bits() == 0),
                "{what}: zero token gives +0.0"
            );
        }
        let rel_rms = (err2 / ref2).sqrt();
        println!("{what}: relative RMS error {rel_rms:.4}");
        assert!(rel_rms < 0.03, "{what}: relative RMS error {rel_rms}");
    }
}

#[test]
fn expert_shape_mismatch_panics() {
    let gu = quantize_weights(&[0.5; 4 * 8], 4, 8);
    let down = quantize_weights(&[0.5; 8 * 2], 8, 2);
    let odd = quantize_weights(&[0.5; 3 * 8], 3, 8);
    let panics = |f: &dyn Fn()| catch_unwind(AssertUnwindSafe(f)).is_err();
    let run =
        |gu: &QuantizedMatrix, down: &QuantizedMatrix, x: &[f32], n: usize, out_len: usize| {
            let mut out = vec![0.0; out_len];
            expert_forward(
                Int8Isa::Scalar,
                gu.as_ref(),
                down.as_ref(),
                x,
                n,
                &mut out,
                &mut ExpertScratch::new(),
            );
        };
    run(&gu, &down, &[1.0; 16], 2, 16);
    assert!(panics(&|| run(&odd, &down, &[1.0; 8], 1, 8)), "odd gate_up");
    assert!(panics(&|| run(&gu, &gu, &[1.0; 8], 1, 8)), "down shape");
    assert!(panics(&|| run(&gu, &down, &[1.0; 15], 2, 16)), "short x");
    assert!(panics(&|| run(&gu, &down, &[1.0; 16], 2, 8)), "short out");
}

#[test]
fn scratch_does_not_grow_after_warm_up() {
    let gu = quantize_weights(
        &uniform_vec(&mut SplitMix64::new(12), 2 * 8 * 20, -1.0, 1.0),
        16,
        20,
    );
    let down = quantize_weights(
        &uniform_vec(&mut SplitMix64::new(13), 20 * 8, -1.0, 1.0),
        20,
        8,
    );
    let mut scratch = ExpertScratch::with_capacity(4, 20, 8);
    let before = scratch.capacities();
    let x = vec![0.25f32; 4 * 20];
    for n in [4, 1, 3] {
        let mut out = vec![0.0; n * 20];
        expert_forward(
            Int8Isa::active(),
            gu.as_ref(),
            down.as_ref(),
            &x[..n * 20],
            n,
            &mut out,
            &mut scratch,
        );
    }
    assert_eq!(scratch.capacities(), before);
}
