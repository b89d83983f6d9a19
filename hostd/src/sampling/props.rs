//! Property tests of the sampler over the whole f32 range: for every knob, every value that
//! [`SamplingParams::validate`] accepts gives an id below the vocabulary for every row of logits
//! (ties, infinities, NaN, values near f32::MAX), and never panics. The values are the edge cases
//! (zeros, subnormals, the greedy threshold, range bounds, infinities, NaN) plus random bit
//! patterns, so every class of f32 is reached, not only the ranges a client would send.

use super::*;
use shared::splitmix::SplitMix64;
use std::panic::{AssertUnwindSafe, catch_unwind};

const VOCAB: usize = 16;

/// Random bit patterns tried per knob, beyond the edge cases.
const RANDOM_VALUES: usize = 4000;

fn edge_values() -> Vec<f32> {
    let mut v = vec![
        0.0,
        -0.0,
        f32::from_bits(1),
        1e-45,
        1e-40,
        f32::MIN_POSITIVE,
        1e-30,
        f32::EPSILON,
        MIN_SAMPLING_TEMPERATURE,
        0.1,
        0.5,
        1.0,
        2.0,
        100.0,
        1e30,
        f32::MAX,
        f32::INFINITY,
        f32::NAN,
    ];
    let around: Vec<f32> = v
        .iter()
        .filter(|x| x.is_finite())
        .flat_map(|&x| [x.next_up(), x.next_down()])
        .collect();
    v.extend(around);
    let negated: Vec<f32> = v.iter().map(|x| -x).collect();
    v.extend(negated);
    v
}

fn values(rng: &mut SplitMix64) -> Vec<f32> {
    let mut v = edge_values();
    v.extend((0..RANDOM_VALUES).map(|_| f32::from_bits(rng.next_u64() as u32)));
    v
}

/// Rows that have broken samplers before: ties, a dominant logit, infinities, NaN, values at the
/// edge of f32, all equal, all −∞.
fn rows() -> Vec<Vec<f32>> {
    let ramp: Vec<f32> = (0..VOCAB).map(|i| i as f32 * 0.25).collect();
    let mut rows = vec![
        ramp.clone(),
        vec![1.0; VOCAB],
        vec![f32::NEG_INFINITY; VOCAB],
        vec![f32::NAN; VOCAB],
        vec![f32::MAX; VOCAB],
        vec![-f32::MAX; VOCAB],
    ];
    let mut edgy = ramp.clone();
    edgy[3] = f32::INFINITY;
    edgy[5] = f32::NAN;
    edgy[7] = f32::NEG_INFINITY;
    rows.push(edgy);
    let mut huge = ramp;
    huge[2] = 3e38;
    huge[9] = -3e38;
    rows.push(huge);
    rows
}

/// Samples every row a few times (so output-token penalties apply) with `params` and checks each
/// id; returns the first failure as a sentence.
fn exercise(params: &SamplingParams, rows: &[Vec<f32>]) -> Result<(), String> {
    let mut sampler = Sampler::new(params.clone(), &[1, 2, 3], 11);
    for row in rows {
        for _ in 0..3 {
            let got = catch_unwind(AssertUnwindSafe(|| sampler.sample(row, VOCAB)));
            match got {
                Ok((id, _)) if (id as usize) < VOCAB => {}
                Ok((id, _)) => return Err(format!("id {id} outside the vocabulary, row {row:?}")),
                Err(_) => return Err(format!("panicked on row {row:?}")),
            }
        }
    }
    Ok(())
}

/// Biases an id inside the vocabulary and one past it by `v`.
fn set_bias(p: &mut SamplingParams, v: f32) {
    p.logit_bias = vec![(4, v), (VOCAB as u32 + 3, v)];
}

/// Sets one knob of the parameters to a value.
type Setter = fn(&mut SamplingParams, f32);

/// The knobs that take an f32, each as a setter on a sampling (not greedy) base.
fn knobs() -> Vec<(&'static str, Setter)> {
    vec![
        ("temperature", |p, v| p.temperature = v),
        ("top_p", |p, v| p.top_p = v),
        ("min_p", |p, v| p.min_p = v),
        ("presence_penalty", |p, v| p.presence_penalty = v),
        ("frequency_penalty", |p, v| p.frequency_penalty = v),
        ("repetition_penalty", |p, v| p.repetition_penalty = v),
        ("logit_bias", set_bias),
    ]
}

fn base() -> SamplingParams {
    SamplingParams {
        temperature: 0.7,
        top_k: 5,
        seed: Some(3),
        logprobs: true,
        top_logprobs: MAX_TOP_LOGPROBS,
        ..SamplingParams::default()
    }
}

#[test]
fn every_accepted_value_of_every_knob_samples_without_panicking() {
    let mut rng = SplitMix64::new(0x5eed);
    let rows = rows();
    let mut accepted = 0usize;
    for (name, set) in knobs() {
        for v in values(&mut rng) {
            let mut p = base();
            set(&mut p, v);
            if p.validate().is_err() {
                continue;
            }
            accepted += 1;
            if let Err(e) = exercise(&p, &rows) {
                panic!(
                    "{name} = {v:e} ({:#010x}) passed validation but {e}",
                    v.to_bits()
                );
            }
        }
    }
    // The ranges are narrow, so most random patterns are refused; the edge cases alone give
    // dozens of accepted values per knob.
    assert!(
        accepted > 100,
        "only {accepted} accepted values were exercised"
    );
}

#[test]
fn random_combinations_of_all_knobs_sample_without_panicking() {
    let mut rng = SplitMix64::new(0xc0ffee);
    let edges = edge_values();
    // One value in eight is an edge case; the rest are uniform in (0, 1], inside every knob's
    // range, so that about half of the combinations pass validation and are exercised.
    let pick = |rng: &mut SplitMix64| {
        if rng.next_u64().is_multiple_of(8) {
            edges[(rng.next_u64() % edges.len() as u64) as usize]
        } else {
            (1.0 - rng.next_f64()) as f32
        }
    };
    let rows = rows();
    let mut accepted = 0usize;
    for _ in 0..8_000 {
        let mut p = base();
        for (_, set) in knobs() {
            let v = pick(&mut rng);
            set(&mut p, v);
        }
        p.top_k = (rng.next_u64() % (VOCAB as u64 + 2)) as usize;
        if p.validate().is_err() {
            continue;
        }
        accepted += 1;
        if let Err(e) = exercise(&p, &rows) {
            panic!("{p:?} passed validation but {e}");
        }
    }
    assert!(
        accepted > 2_000,
        "only {accepted} accepted combinations were exercised"
    );
}

#[test]
fn a_subnormal_temperature_is_greedy_not_a_panic() {
    // The request that stopped `hostd serve` for good: 1/t overflowed, every candidate was
    // dropped, and the draw indexed an empty list.
    for t in [
        1e-40,
        f32::from_bits(1),
        f32::MIN_POSITIVE,
        1e-6,
        MIN_SAMPLING_TEMPERATURE.next_down(),
    ] {
        let p = SamplingParams {
            temperature: t,
            seed: Some(1),
            ..SamplingParams::default()
        };
        p.validate().expect("a temperature inside [0, 2]");
        assert!(p.is_greedy(), "temperature {t:e}");
        let logits = [0.0, 3.0, 2.9, 1.0];
        let mut s = Sampler::new(p, &[], 7);
        assert_eq!(
            s.sample(&logits, 4).0,
            1,
            "temperature {t:e} picks the argmax"
        );
    }
    let sampled = SamplingParams {
        temperature: MIN_SAMPLING_TEMPERATURE,
        ..SamplingParams::default()
    };
    assert!(!sampled.is_greedy(), "the threshold itself samples");
}
