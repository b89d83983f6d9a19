//! Unit tests of token selection and stop-string matching.

use super::*;

fn greedy() -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    }
}

fn sample_n(params: SamplingParams, logits: &[f32], vocab: usize, n: usize) -> Vec<u32> {
    let mut s = Sampler::new(params, &[], 7);
    (0..n).map(|_| s.sample(logits, vocab).0).collect()
}

#[test]
fn greedy_takes_argmax_and_lowest_id_on_ties() {
    assert_eq!(sample_n(greedy(), &[0.1, 0.9, 0.3], 3, 1), [1]);
    assert_eq!(sample_n(greedy(), &[0.5, 0.9, 0.9, 0.2], 4, 1), [1]);
    assert_eq!(argmax(&[f32::NAN, 1.0, 2.0]), 2);
}

#[test]
fn argmax_has_one_nan_rule() {
    assert_eq!(argmax(&[1.0, f32::NAN, 0.5]), 0);
    assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
    assert_eq!(argmax(&[]), 0);
    assert_eq!(
        argmax_allowed(&[f32::NAN, 1.0, 3.0], Some(&[true, true, false])),
        1
    );
}

#[test]
fn argmax_respects_the_mask_and_prefers_the_lowest_id_on_ties() {
    let x = [1.0, 5.0, 5.0, 9.0];
    assert_eq!(argmax_allowed(&x, None), 3);
    assert_eq!(argmax_allowed(&x, Some(&[true, true, true, false])), 1);
    assert_eq!(argmax_allowed(&x, Some(&[true, false, true])), 2);
    assert_eq!(argmax_allowed(&x, Some(&[true])), 0);
}

#[test]
fn padding_rows_are_never_chosen() {
    // Ids ≥ vocab are embedding padding: even a huge logit there must not win.
    assert_eq!(sample_n(greedy(), &[0.1, 0.2, 99.0], 2, 1), [1]);
    let hot = SamplingParams {
        temperature: 2.0,
        seed: Some(3),
        ..SamplingParams::default()
    };
    assert!(
        sample_n(hot, &[0.0, 0.0, 50.0, 50.0], 2, 200)
            .iter()
            .all(|&id| id < 2)
    );
}

#[test]
fn same_seed_same_ids_other_seed_other_ids() {
    let logits: Vec<f32> = (0..50).map(|i| ((i * 37 % 11) as f32) * 0.3).collect();
    let p = |seed| SamplingParams {
        temperature: 1.0,
        seed: Some(seed),
        ..SamplingParams::default()
    };
    let a = sample_n(p(42), &logits, 50, 64);
    assert_eq!(a, sample_n(p(42), &logits, 50, 64));
    assert_ne!(a, sample_n(p(43), &logits, 50, 64));
}

#[test]
fn top_k_one_and_tiny_top_p_are_greedy() {
    let logits = [0.0, 3.0, 2.9, 1.0];
    let k1 = SamplingParams {
        top_k: 1,
        seed: Some(1),
        ..SamplingParams::default()
    };
    assert!(sample_n(k1, &logits, 4, 50).iter().all(|&id| id == 1));
    let p = SamplingParams {
        top_p: 1e-6,
        seed: Some(1),
        ..SamplingParams::default()
    };
    assert!(sample_n(p, &logits, 4, 50).iter().all(|&id| id == 1));
}

#[test]
fn top_k_restricts_candidates() {
    let logits = [1.0, 1.1, 1.2, 1.3, 1.4];
    let p = SamplingParams {
        top_k: 2,
        seed: Some(9),
        ..SamplingParams::default()
    };
    let ids = sample_n(p, &logits, 5, 300);
    assert!(ids.iter().all(|&id| id == 3 || id == 4), "{ids:?}");
    assert!(ids.contains(&3) && ids.contains(&4));
}

#[test]
fn min_p_drops_unlikely_tokens() {
    // p ∝ e^x: token 0 has e^5 ≈ 148× the mass of the others.
    let logits = [5.0, 0.0, 0.0, 0.0];
    let p = SamplingParams {
        min_p: 0.1,
        seed: Some(5),
        ..SamplingParams::default()
    };
    assert!(sample_n(p, &logits, 4, 200).iter().all(|&id| id == 0));
}

#[test]
fn frequency_penalty_breaks_repetition_under_greedy() {
    let logits = [1.0, 0.9, 0.0];
    let p = SamplingParams {
        frequency_penalty: 0.5,
        ..greedy()
    };
    // After one 0, its logit drops to 0.5 < 0.9; after one 1 as well, 0 (0.5) beats 1 (0.4).
    assert_eq!(sample_n(p, &logits, 3, 3), [0, 1, 0]);
    let p = SamplingParams {
        presence_penalty: 2.0,
        ..greedy()
    };
    assert_eq!(sample_n(p, &logits, 3, 3), [0, 1, 2]);
}

#[test]
fn repetition_penalty_covers_the_prompt() {
    let p = SamplingParams {
        repetition_penalty: 2.0,
        ..greedy()
    };
    let mut s = Sampler::new(p, &[0], 0);
    // Token 0 appeared in the prompt: 1.0 / 2 = 0.5 < 0.9.
    assert_eq!(s.sample(&[1.0, 0.9], 2).0, 1);
    // Negative logits are multiplied: −0.1 × 2 = −0.2 < −0.15.
    let p = SamplingParams {
        repetition_penalty: 2.0,
        ..greedy()
    };
    let mut s = Sampler::new(p, &[0], 0);
    assert_eq!(s.sample(&[-0.1, -0.15], 2).0, 1);
}

#[test]
fn logprobs_are_log_softmax_with_sorted_alternatives() {
    let row = [0.0f32, (2.0f32).ln(), 0.0];
    let lp = logprobs_of(&row, 0, 2);
    assert!((lp.logprob - (0.25f32).ln()).abs() < 1e-6);
    assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 0]);
    assert!((lp.top[0].1 - (0.5f32).ln()).abs() < 1e-6);
    let p = SamplingParams {
        logprobs: true,
        top_logprobs: 1,
        ..greedy()
    };
    let (id, lp) = Sampler::new(p, &[], 0).sample(&row, 3);
    assert_eq!(id, 1);
    assert_eq!(lp.map(|l| l.top.len()), Some(1));
}

fn check_invalid(p: SamplingParams, param: &str) {
    assert_eq!(p.validate().map_err(|e| e.param), Err(param), "{p:?}");
}

#[test]
fn validation_names_the_field() {
    assert_eq!(SamplingParams::default().validate(), Ok(()));
    check_invalid(
        SamplingParams {
            temperature: -0.1,
            ..Default::default()
        },
        "temperature",
    );
    check_invalid(
        SamplingParams {
            temperature: f32::NAN,
            ..Default::default()
        },
        "temperature",
    );
    check_invalid(
        SamplingParams {
            top_p: 0.0,
            ..Default::default()
        },
        "top_p",
    );
    check_invalid(
        SamplingParams {
            min_p: 1.5,
            ..Default::default()
        },
        "min_p",
    );
    check_invalid(
        SamplingParams {
            presence_penalty: 2.5,
            ..Default::default()
        },
        "presence_penalty",
    );
    check_invalid(
        SamplingParams {
            frequency_penalty: -3.0,
            ..Default::default()
        },
        "frequency_penalty",
    );
    check_invalid(
        SamplingParams {
            repetition_penalty: 0.0,
            ..Default::default()
        },
        "repetition_penalty",
    );
    check_invalid(
        SamplingParams {
            logprobs: true,
            top_logprobs: 21,
            ..Default::default()
        },
        "top_logprobs",
    );
    check_invalid(
        SamplingParams {
            top_logprobs: 2,
            ..Default::default()
        },
        "top_logprobs",
    );
}

/// Feeds `pieces` and returns (emitted pieces, stopped, flushed rest).
fn run_stop(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool, String) {
    let stops: Vec<String> = stops.iter().map(ToString::to_string).collect();
    let mut m = StopMatcher::new(&stops);
    let mut out = Vec::new();
    for p in pieces {
        let o = m.push(p);
        out.push(o.text);
        if o.stopped {
            return (out, true, String::new());
        }
    }
    (out, false, m.flush())
}

fn check_stop(stops: &[&str], pieces: &[&str], emitted: &[&str], stopped: bool, rest: &str) {
    let (e, s, r) = run_stop(stops, pieces);
    assert_eq!(
        (
            e.iter().map(String::as_str).collect::<Vec<_>>(),
            s,
            r.as_str()
        ),
        (emitted.to_vec(), stopped, rest)
    );
}

#[test]
fn stop_string_inside_one_piece() {
    check_stop(&["END"], &["abcENDdef"], &["abc"], true, "");
}

#[test]
fn stop_string_across_pieces_is_never_emitted() {
    check_stop(
        &["END"],
        &["ab", "cE", "N", "Dxyz"],
        &["ab", "c", "", ""],
        true,
        "",
    );
}

#[test]
fn held_prefix_is_released_when_it_cannot_match() {
    check_stop(
        &["END"],
        &["abE", "Nx", "y"],
        &["ab", "ENx", "y"],
        false,
        "",
    );
    check_stop(&["END"], &["abEN"], &["ab"], false, "EN");
}

#[test]
fn earliest_of_several_stops_wins() {
    check_stop(&["yz", "bc"], &["abcxyz"], &["a"], true, "");
    check_stop(&["\n\n", "."], &["Hi", ".", "more"], &["Hi", ""], true, "");
}

#[test]
fn multibyte_stop_strings_hold_on_char_boundaries() {
    check_stop(&["é!"], &["café", "!"], &["caf", ""], true, "");
    check_stop(&["日本"], &["今日", "は"], &["今", "日は"], false, "");
}

#[test]
fn no_stops_passes_through() {
    check_stop(&[], &["a", "b"], &["a", "b"], false, "");
}

/// The matcher names the stop string that ended the text by its index in the list given (empty
/// strings counted), the earliest match first, the first listed among matches at one position.
#[test]
fn matched_stop_is_named_by_index() {
    let stops: Vec<String> = ["", "xyz", "b", "bc"]
        .iter()
        .map(ToString::to_string)
        .collect();
    let mut m = StopMatcher::new(&stops);
    assert!(!m.push("a").stopped);
    assert_eq!(m.matched(), None);
    assert!(m.push("bcd").stopped);
    assert_eq!(m.matched(), Some(2));
    let mut m = StopMatcher::new(&stops);
    assert!(m.push("qqxyzb").stopped);
    assert_eq!(m.matched(), Some(1));
}

#[test]
fn logit_bias_moves_greedy_and_random_picks_and_leaves_logprobs_raw() {
    let logits = [0.1, 0.9, 0.3];
    // +100 forces a token, −100 bans one, in greedy and in random sampling.
    let forced = SamplingParams {
        logit_bias: vec![(2, 100.0)],
        ..greedy()
    };
    assert_eq!(sample_n(forced, &logits, 3, 3), [2, 2, 2]);
    let banned = SamplingParams {
        logit_bias: vec![(1, -100.0)],
        temperature: 1.0,
        seed: Some(5),
        ..SamplingParams::default()
    };
    assert!(sample_n(banned, &logits, 3, 200).iter().all(|&id| id != 1));
    // A small bias shifts the argmax only when it overcomes the gap.
    assert_eq!(
        sample_n(
            SamplingParams {
                logit_bias: vec![(0, 0.5)],
                ..greedy()
            },
            &logits,
            3,
            1
        ),
        [1]
    );
    assert_eq!(
        sample_n(
            SamplingParams {
                logit_bias: vec![(0, 0.9)],
                ..greedy()
            },
            &logits,
            3,
            1
        ),
        [0]
    );
    // Log-probabilities stay those of the model's distribution.
    let mut s = Sampler::new(
        SamplingParams {
            logit_bias: vec![(2, 100.0)],
            logprobs: true,
            ..greedy()
        },
        &[],
        1,
    );
    let (id, lp) = s.sample(&logits, 3);
    assert_eq!(id, 2);
    assert_eq!(
        lp.map(|l| l.logprob),
        Some(logprobs_of(&logits, 2, 0).logprob)
    );
    let bad = SamplingParams {
        logit_bias: vec![(0, 101.0)],
        ..SamplingParams::default()
    };
    assert_eq!(bad.validate().map_err(|e| e.param), Err("logit_bias"));
}
