//! Tests of `expert_forward`: against an f64 reference within a stated error budget, shape
//! mismatches that panic, and scratch buffers that stop growing after warm-up.

use super::*;

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
