//! Tests for the dense kernels: every available ISA against the scalar reference on odd shapes,
//! misaligned slices and extreme values; the bitwise invariants (GEMM row == GEMV, parallel ==
//! single-threaded, each SIMD kernel == a scalar model of its documented summation order); ISA
//! detection and override parsing, for the dense and the int8 families; and a smoke test of the
//! bandwidth probe.
//!
//! # Error budget
//!
//! A SIMD result is accepted when, per element,
//! `|y_simd − y_ref| ≤ 1e-6 · Σ_j |w_j · x_j| + 1e-30`.
//! The reference sums in f64 and is exact to far below that; the SIMD kernels sum in f32, in
//! a different order (16 or 8 interleaved lane sums, then a tree), and each f32 addition rounds
//! by up to half an ulp of the running lane sum. A lane sum holds about `cols / 16` terms, so its
//! accumulated rounding stays well under 1e-6 of `Σ|w·x|` for the shapes tested (the worst case,
//! all terms positive with 2051 columns, is a few 1e-7). Products are exact inside an FMA, so
//! the only error is summation order and width. The `1e-30` floor covers results built from
//! subnormal products, whose absolute rounding (≈ 1e-45 per addition) has no relative bound.

use std::panic::{AssertUnwindSafe, catch_unwind};

use half::bf16;

use super::int8::{Int8Isa, Int8IsaSelection};
use super::*;
use crate::splitmix::SplitMix64;

const REL_TOL: f64 = 1e-6;
const ABS_TOL: f64 = 1e-30;

/// The column counts the brief asks for: vector widths ± 1 and a long odd row.
const ODD_COLS: [usize; 10] = [1, 15, 16, 17, 31, 33, 63, 65, 127, 2048 + 3];
/// Row counts: one, fewer than a tile, tiles plus a remainder.
const ODD_ROWS: [usize; 4] = [1, 3, 17, 64 + 5];

/// Uniform in `[lo, hi)`, 53 random bits.
fn uniform(rng: &mut SplitMix64, lo: f64, hi: f64) -> f64 {
    lo + (hi - lo) * rng.next_f64()
}

/// +1 or −1, evenly.
fn sign(rng: &mut SplitMix64) -> f64 {
    if rng.next_u64() & 1 == 0 { 1.0 } else { -1.0 }
}

/// What the weights and activations look like.
#[derive(Debug, Clone, Copy)]
enum Data {
    /// Uniform in [-1, 1): typical mixed-sign sums.
    Signed,
    /// Uniform in [0.5, 1): no cancellation, the worst case for summation order.
    Positive,
    /// |w| near 1e30 and |x| near 1e3: products near 1e33, sums far from f32 overflow.
    Large,
    /// |w| near 1e-30 and |x| near 1e-9: every product is subnormal in f32.
    Small,
    /// Magnitudes spread over 2^±40 in both operands.
    Wide,
    /// Only +0, −0 and ±1 in the weights, +0, −0 and ±0.25 in the activations.
    Zeros,
}

impl Data {
    const ALL: [Data; 6] = [
        Data::Signed,
        Data::Positive,
        Data::Large,
        Data::Small,
        Data::Wide,
        Data::Zeros,
    ];

    /// A weight, rounded to bf16.
    fn weight(self, rng: &mut SplitMix64) -> bf16 {
        bf16::from_f64(self.draw(rng, (1e29, 1e30), (1e-31, 1e-30), 1.0))
    }

    /// An activation, rounded to f32.
    fn activation(self, rng: &mut SplitMix64) -> f32 {
        self.draw(rng, (1e2, 1e3), (1e-10, 1e-9), 0.25) as f32
    }

    /// One value: `large` and `small` are the magnitude ranges of those kinds, `unit` the
    /// non-zero magnitude of `Zeros`.
    fn draw(self, rng: &mut SplitMix64, large: (f64, f64), small: (f64, f64), unit: f64) -> f64 {
        match self {
            Data::Signed => uniform(rng, -1.0, 1.0),
            Data::Positive => uniform(rng, 0.5, 1.0),
            Data::Large => sign(rng) * uniform(rng, large.0, large.1),
            Data::Small => sign(rng) * uniform(rng, small.0, small.1),
            Data::Wide => {
                sign(rng) * uniform(rng, 1.0, 2.0) * 2f64.powi(uniform(rng, -40.0, 40.0) as i32)
            }
            Data::Zeros => [0.0, -0.0, unit, -unit][(rng.next_u64() % 4) as usize],
        }
    }
}

/// The SIMD instruction sets this CPU has; prints the ones it lacks.
fn simd_isas() -> Vec<Isa> {
    present_or_say([Isa::Avx2, Isa::Avx512], |isa| isa.is_available())
}

/// One case: `rows × cols` weights starting `w_off` elements into their buffer, `n × cols`
/// activations starting `x_off` elements into theirs.
#[derive(Debug, Clone, Copy)]
struct Case {
    rows: usize,
    cols: usize,
    n: usize,
    w_off: usize,
    x_off: usize,
    data: Data,
    seed: u64,
}

impl Case {
    /// `rows × cols` weights, `n` tokens, the slices at `(w_off, x_off)`.
    fn new(
        rows: usize,
        cols: usize,
        n: usize,
        (w_off, x_off): (usize, usize),
        data: Data,
        seed: u64,
    ) -> Case {
        Case {
            rows,
            cols,
            n,
            w_off,
            x_off,
            data,
            seed,
        }
    }
}

/// Buffers for a case, with slack before and after the slices the kernels see.
struct Inputs {
    w_buf: Vec<bf16>,
    x_buf: Vec<f32>,
    case: Case,
}

impl Inputs {
    fn new(case: Case) -> Inputs {
        let mut rng = SplitMix64::new(case.seed);
        let w_buf = (0..case.w_off + case.rows * case.cols + 3)
            .map(|_| case.data.weight(&mut rng))
            .collect();
        let x_buf = (0..case.x_off + case.n * case.cols + 3)
            .map(|_| case.data.activation(&mut rng))
            .collect();
        Inputs { w_buf, x_buf, case }
    }

    fn w(&self) -> &[bf16] {
        &self.w_buf[self.case.w_off..][..self.case.rows * self.case.cols]
    }

    fn x(&self) -> &[f32] {
        &self.x_buf[self.case.x_off..][..self.case.n * self.case.cols]
    }

    /// `Σ_j |w_j · x_j|` for output `(t, r)`, the scale of the error budget.
    fn abs_dot(&self, t: usize, r: usize) -> f64 {
        let cols = self.case.cols;
        let w = &self.w()[r * cols..][..cols];
        let x = &self.x()[t * cols..][..cols];
        w.iter()
            .zip(x)
            .map(|(&a, &b)| (f64::from(a.to_f32()) * f64::from(b)).abs())
            .sum()
    }
}

fn gemm(isa: Isa, inputs: &Inputs) -> Vec<f32> {
    let Case { rows, cols, n, .. } = inputs.case;
    let mut y = vec![f32::NAN; n * rows];
    gemm_bf16(isa, inputs.w(), rows, cols, inputs.x(), n, &mut y);
    y
}

fn assert_bitwise(what: &str, case: &Case, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits(),
            "{what}: element {i} is {g:e}, expected bitwise {w:e}; {case:?}"
        );
    }
}

/// The full check of one case for one ISA: within budget of the scalar reference, bitwise equal
/// to the model of its summation order, GEMM rows bitwise equal to GEMV, and every parallel
/// split bitwise equal to the single-threaded result.
fn check(isa: Isa, case: Case) {
    let inputs = Inputs::new(case);
    let Case { rows, cols, n, .. } = case;
    let y = gemm(isa, &inputs);
    let y_ref = gemm(Isa::Scalar, &inputs);

    for t in 0..n {
        for r in 0..rows {
            let (got, want) = (f64::from(y[t * rows + r]), f64::from(y_ref[t * rows + r]));
            let budget = REL_TOL * inputs.abs_dot(t, r) + ABS_TOL;
            assert!(
                (got - want).abs() <= budget,
                "{isa} y[{t}][{r}] = {got:e}, scalar {want:e}, |diff| {:e} > budget {budget:e}; {case:?}",
                (got - want).abs()
            );
        }
    }

    let model = order_model(isa, &inputs);
    assert_bitwise(&format!("{isa} vs its order model"), &case, &y, &model);

    for t in 0..n {
        let mut y_row = vec![f32::NAN; rows];
        gemv_bf16(
            isa,
            inputs.w(),
            rows,
            cols,
            &inputs.x()[t * cols..][..cols],
            &mut y_row,
        );
        assert_bitwise(
            &format!("{isa} gemv on token {t} vs gemm row"),
            &case,
            &y_row,
            &y[t * rows..][..rows],
        );
    }

    for tile_rows in [1, 3, 8, 13] {
        let mut y_par = vec![f32::NAN; n * rows];
        par_gemm_tiled(
            isa,
            inputs.w(),
            rows,
            cols,
            inputs.x(),
            n,
            &mut y_par,
            tile_rows,
        );
        assert_bitwise(
            &format!("{isa} parallel, {tile_rows}-row tiles"),
            &case,
            &y_par,
            &y,
        );
    }
    let mut y_par = vec![f32::NAN; n * rows];
    par_gemm_bf16(isa, inputs.w(), rows, cols, inputs.x(), n, &mut y_par);
    assert_bitwise(&format!("{isa} par_gemm_bf16"), &case, &y_par, &y);
}

/// A scalar model of a SIMD kernel's documented summation order (see the `avx512` and `avx2`
/// module docs): lane `l` of an `L`-lane accumulator fuses in columns `j ≡ l (mod L)` in order,
/// then a halving tree adds lane `i` and lane `i + width/2`. The scalar ISA's order is its own
/// f64 loop, so its model is the reference itself.
fn order_model(isa: Isa, inputs: &Inputs) -> Vec<f32> {
    let lanes = match isa {
        Isa::Scalar => return gemm(Isa::Scalar, inputs),
        Isa::Avx2 => 8,
        Isa::Avx512 => 16,
    };
    let Case { rows, cols, n, .. } = inputs.case;
    let mut y = vec![0.0f32; n * rows];
    for t in 0..n {
        let x = &inputs.x()[t * cols..][..cols];
        for r in 0..rows {
            let w = &inputs.w()[r * cols..][..cols];
            let mut acc = vec![0.0f32; lanes];
            for (j, (&wj, &xj)) in w.iter().zip(x).enumerate() {
                acc[j % lanes] = wj.to_f32().mul_add(xj, acc[j % lanes]);
            }
            let mut width = lanes;
            while width > 1 {
                width /= 2;
                for i in 0..width {
                    acc[i] += acc[i + width];
                }
            }
            y[t * rows + r] = acc[0];
        }
    }
    y
}

/// Every ISA (scalar included) over the odd rows × cols grid and n = 1..=9; the slice offsets
/// cycle through 0..=3 with the case index so every combination appears.
#[test]
fn odd_shapes_match_scalar_and_invariants_hold() {
    let mut isas = vec![Isa::Scalar];
    isas.extend(simd_isas());
    for isa in isas {
        let mut index = 0u64;
        for rows in ODD_ROWS {
            for cols in ODD_COLS {
                for n in 1..=9 {
                    let (w_off, x_off) = ((index % 4) as usize, ((index / 4) % 4) as usize);
                    check(
                        isa,
                        Case::new(rows, cols, n, (w_off, x_off), Data::Signed, index),
                    );
                    index += 1;
                }
            }
        }
    }
}

/// Every pair of slice offsets 0..=3 (weights and activations) on shapes with tails.
#[test]
fn misaligned_offsets_match_scalar() {
    for isa in simd_isas() {
        for w_off in 0..=3 {
            for x_off in 0..=3 {
                for (rows, cols, n) in [(17, 65, 3), (9, 2051, 5)] {
                    let seed = (w_off * 4 + x_off) as u64;
                    check(
                        isa,
                        Case::new(rows, cols, n, (w_off, x_off), Data::Signed, seed),
                    );
                }
            }
        }
    }
}

/// Large and small magnitudes, subnormal products, zeros and negative zeros, wide dynamic range
/// and the all-positive worst case for summation order.
#[test]
fn extremes_match_scalar() {
    for isa in simd_isas() {
        for data in Data::ALL {
            for (rows, cols, n) in [(17, 17, 1), (17, 33, 5), (69, 2051, 1), (11, 2051, 9)] {
                check(isa, Case::new(rows, cols, n, (1, 2), data, 7));
            }
        }
    }
}

/// Negative zero stays a zero, and a row of zero weights gives exactly zero.
#[test]
fn zero_rows_give_zero() {
    let mut isas = vec![Isa::Scalar];
    isas.extend(simd_isas());
    let cols = 33;
    let w = vec![bf16::NEG_ZERO; 2 * cols];
    let x: Vec<f32> = (0..cols).map(|j| j as f32 - 10.0).collect();
    for isa in isas {
        let mut y = [f32::NAN; 2];
        gemv_bf16(isa, &w, 2, cols, &x, &mut y);
        assert_eq!(y, [0.0, 0.0], "{isa}");
    }
}

/// The real parallel wrappers on shapes big enough to split into several tasks, in a pool with
/// more threads than this machine has cores, against the single-threaded kernels.
#[test]
fn par_wrappers_match_single_threaded() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .expect("rayon pool");
    let mut isas = vec![Isa::Scalar];
    isas.extend(simd_isas());
    for isa in isas {
        for (rows, cols, n) in [(1000, 2051, 1), (517, 130, 7)] {
            let case = Case::new(rows, cols, n, (3, 1), Data::Signed, 99);
            let inputs = Inputs::new(case);
            let y = gemm(isa, &inputs);
            assert!(
                par_tile_rows(rows, cols) < rows,
                "the shape must split: {case:?}"
            );
            let mut y_par = vec![f32::NAN; n * rows];
            pool.install(|| par_gemm_bf16(isa, inputs.w(), rows, cols, inputs.x(), n, &mut y_par));
            assert_bitwise(&format!("{isa} par_gemm_bf16"), &case, &y_par, &y);
            let mut y_par = vec![f32::NAN; rows];
            pool.install(|| {
                par_gemv_bf16(isa, inputs.w(), rows, cols, &inputs.x()[..cols], &mut y_par);
            });
            assert_bitwise(&format!("{isa} par_gemv_bf16"), &case, &y_par, &y[..rows]);
        }
    }
}

/// Empty shapes are legal and write nothing (or zeros, for `cols == 0`).
#[test]
fn empty_shapes() {
    let mut isas = vec![Isa::Scalar];
    isas.extend(simd_isas());
    for isa in isas {
        let mut y: [f32; 0] = [];
        gemv_bf16(isa, &[], 0, 5, &[0.0; 5], &mut y);
        gemm_bf16(isa, &[bf16::ONE; 15], 3, 5, &[], 0, &mut y);
        let mut y = [f32::NAN; 3];
        gemv_bf16(isa, &[], 3, 0, &[], &mut y);
        assert_eq!(y, [0.0; 3], "{isa}");
    }
}

/// Mismatched slice lengths panic (the documented `# Panics`).
#[test]
fn shape_mismatch_panics() {
    let w = vec![bf16::ONE; 12];
    let x = vec![1.0f32; 4];
    let panics = |f: &dyn Fn()| catch_unwind(AssertUnwindSafe(f)).is_err();
    assert!(
        panics(&|| gemv_bf16(Isa::Scalar, &w[..11], 3, 4, &x, &mut [0.0; 3])),
        "short weights"
    );
    assert!(
        panics(&|| gemv_bf16(Isa::Scalar, &w, 3, 4, &x[..3], &mut [0.0; 3])),
        "short activations"
    );
    assert!(
        panics(&|| gemv_bf16(Isa::Scalar, &w, 3, 4, &x, &mut [0.0; 4])),
        "long output"
    );
    assert!(
        panics(&|| gemm_bf16(Isa::Scalar, &w, 3, 4, &x, 2, &mut [0.0; 6])),
        "gemm with n too large"
    );
    assert!(
        panics(&|| par_gemm_bf16(Isa::Scalar, &w, 3, 4, &x, 1, &mut [0.0; 2])),
        "par short output"
    );
}

/// Both instruction-set families: the detected and active sets run here, and every name
/// parses back.
#[test]
fn isa_detection_is_consistent() {
    check_detection(&Isa::ALL, Isa::detect(), Isa::active(), Isa::is_available);
    check_detection(
        &Int8Isa::ALL,
        Int8Isa::detect(),
        Int8Isa::active(),
        Int8Isa::is_available,
    );
}

/// Checks one family's detection, `all` from least to most capable.
fn check_detection<I: KernelIsa>(all: &[I], detected: I, active: I, is_available: fn(I) -> bool) {
    assert!(is_available(detected) && is_available(active));
    assert!(active <= detected);
    assert!(
        is_available(all[0]),
        "{} (scalar) is always available",
        all[0]
    );
    for &isa in all {
        assert_eq!(I::from_name(&isa.to_string()), Some(isa));
        if isa <= detected {
            assert!(is_available(isa), "{isa} is below the detected {detected}");
        }
    }
    println!("detected ISA: {detected}; active: {active}");
}

/// `SLUICE_KERNEL_ISA` resolved against a detected set: `active` and the problem, if any.
fn check_resolve<I: KernelIsa>(
    value: Option<&str>,
    detected: I,
    active: I,
    problem: Option<OverrideProblem<I>>,
) {
    let sel = Selection::resolve(value, detected);
    assert_eq!(
        sel,
        Selection {
            active,
            detected,
            override_problem: problem
        },
        "{value:?} on {detected}"
    );
    assert_eq!(sel.warning().is_some(), sel.override_problem.is_some());
}

/// The override cases every family resolves alike, for its `[scalar, avx2, most capable]`
/// sets; each of `top_names` names the most capable one.
fn check_resolution<I: KernelIsa>([scalar, avx2, top]: [I; 3], top_names: &[&str]) {
    check_resolve(None, top, top, None);
    for blank in ["", " ", "  "] {
        check_resolve(Some(blank), avx2, avx2, None);
    }
    check_resolve(Some("scalar"), top, scalar, None);
    for name in ["avx2", "AVX2", " AVX2 "] {
        check_resolve(Some(name), top, avx2, None);
    }
    for &name in top_names {
        check_resolve(Some(name), top, top, None);
        check_resolve(
            Some(name),
            avx2,
            avx2,
            Some(OverrideProblem::Unsupported(top)),
        );
    }
    check_resolve(
        Some("avx2"),
        scalar,
        scalar,
        Some(OverrideProblem::Unsupported(avx2)),
    );
    check_resolve(
        Some("neon"),
        avx2,
        avx2,
        Some(OverrideProblem::Unrecognized("neon".into())),
    );
}

/// Both families; `avx512` pins the int8 kernels to AVX-512 VNNI too.
#[test]
fn isa_override_resolution() {
    check_resolution(Isa::ALL, &["avx512"]);
    check_resolution(Int8Isa::ALL, &["avx512", "avx512vnni"]);
    let warning = IsaSelection::resolve(Some("avx512"), Isa::Avx2).warning();
    let expected =
        "SLUICE_KERNEL_ISA=avx512 requested, but this CPU supports at most avx2; using avx2";
    assert_eq!(warning.as_deref(), Some(expected));
    let warning = Int8IsaSelection::resolve(Some("avx512"), Int8Isa::Avx2).warning();
    let expected = "SLUICE_KERNEL_ISA=avx512vnni requested, but this CPU supports at most avx2 for int8 kernels; using avx2";
    assert_eq!(warning.as_deref(), Some(expected));
    // The unrecognised-value warnings, word for word as each family has always logged them.
    let warning = IsaSelection::resolve(Some("neon"), Isa::Avx2).warning();
    assert_eq!(
        warning.as_deref(),
        Some("SLUICE_KERNEL_ISA=\"neon\" is not one of scalar, avx2, avx512; using avx2")
    );
    let warning = Int8IsaSelection::resolve(Some("neon"), Int8Isa::Avx2).warning();
    let expected = "SLUICE_KERNEL_ISA=\"neon\" is not one of scalar, avx2, avx512, avx512vnni; int8 kernels use avx2";
    assert_eq!(warning.as_deref(), Some(expected));
}

/// The probe runs and returns a plausible number on a small buffer (raised to one 64 MiB step).
#[test]
fn bandwidth_probe_smoke() {
    for threads in [0, 1, 2] {
        let gbps = bandwidth::measure_read_bandwidth_gbps(1 << 20, threads);
        assert!(
            gbps.is_finite() && gbps > 0.1,
            "{threads} threads: {gbps} GB/s"
        );
    }
}
