//! Tests of the tiled attention core: agreement with the naive per-(token, head) softmax it
//! replaced (kept here as the reference), and its bitwise contract: a query row's output is the
//! same bits however the prompt was cut into blocks, however the work was split, and whatever the
//! thread count.

use super::reference::naive;
use super::*;

/// Deterministic values in [-amp, amp), multiples of amp / 2²³.
fn values(n: usize, seed: u64, amp: f32) -> Vec<f32> {
    let mut r = shared::splitmix::SplitMix64::new(seed);
    (0..n)
        .map(|_| ((r.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * amp)
        .collect()
}

/// A cache of `total` positions and queries for all of them.
struct Case {
    heads: Heads,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    scale: f32,
}

impl Case {
    fn new(heads: Heads, total: usize, q_amp: f32, seed: u64) -> Case {
        let Heads { nq, nkv, dh } = heads;
        Case {
            heads,
            q: values(total * nq * dh, seed, q_amp),
            k: values(total * nkv * dh, seed + 1, 1.0),
            v: values(total * nkv * dh, seed + 2, 1.0),
            scale: 1.0 / (dh as f32).sqrt(),
        }
    }

    /// Rows `start..start + n` against a cache holding exactly `start + n` positions.
    fn run(&self, isa: Isa, start: usize, n: usize, split: Split) -> Vec<f32> {
        let Heads { nq, nkv, dh } = self.heads;
        let kv = (start + n) * nkv * dh;
        let q = &self.q[start * nq * dh..(start + n) * nq * dh];
        let mut out = vec![0.0f32; q.len()];
        causal_attention_split(
            isa,
            self.heads,
            q,
            n,
            start,
            &self.k[..kv],
            &self.v[..kv],
            self.scale,
            &mut out,
            split,
        );
        out
    }

    /// All `total` rows fed in blocks of the given sizes.
    fn run_blocks(&self, isa: Isa, sizes: &[usize], split: Split) -> Vec<f32> {
        let mut out = Vec::new();
        let mut start = 0;
        for &n in sizes {
            out.extend(self.run(isa, start, n, split));
            start += n;
        }
        out
    }
}

fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len());
    let (i, err) = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .enumerate()
        .fold((0, 0.0f32), |m, (i, e)| if e > m.1 { (i, e) } else { m });
    assert!(
        err <= tol,
        "{what}: max |tiled − naive| = {err:e} at element {i} (tolerance {tol:e})"
    );
}

fn assert_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len());
    if let Some(i) = got
        .iter()
        .zip(want)
        .position(|(a, b)| a.to_bits() != b.to_bits())
    {
        panic!("{what}: element {i} differs ({} vs {})", got[i], want[i]);
    }
}

#[test]
fn tiled_matches_naive_on_gqa_shapes_across_tile_and_segment_boundaries() {
    let isa = Isa::active();
    // Small heads, a 3000-token prompt in one block: 46 tiles, 3 segments.
    let small = Heads {
        nq: 6,
        nkv: 2,
        dh: 36,
    };
    let case = Case::new(small, 3000, 4.0, 11);
    let want = naive(small, &case.q, 3000, 0, &case.k, &case.v, case.scale);
    for split in [Split::Never, Split::Always] {
        assert_close(
            &case.run(isa, 0, 3000, split),
            &want,
            2e-6,
            &format!("6q/2kv/36, T 3000, {split:?}"),
        );
    }
    // The real shape (16 q heads, 2 kv heads, head_dim 256): the last 130 rows of 1100, a block
    // that starts mid-tile and crosses the first segment boundary.
    let real = Heads {
        nq: 16,
        nkv: 2,
        dh: 256,
    };
    let case = Case::new(real, 1100, 2.0, 12);
    let (start, n) = (970, 130);
    let q = &case.q[start * 16 * 256..];
    let want = naive(real, q, n, start, &case.k, &case.v, case.scale);
    for split in [Split::Never, Split::Always] {
        assert_close(
            &case.run(isa, start, n, split),
            &want,
            2e-6,
            &format!("16q/2kv/256, rows 970..1100, {split:?}"),
        );
    }
}

#[test]
fn a_rows_output_is_the_same_bits_however_the_prompt_was_split() {
    let isa = Isa::active();
    // 2 q heads per KV head (the one-vector kernels), and 8 with a head size over 64 (the
    // AVX-512 register tiles: 8 heads × 2 keys for q·K, 8 heads × 32 elements for P·V, plus
    // their tails), so both paths are held to the rule.
    for heads in [
        Heads {
            nq: 4,
            nkv: 2,
            dh: 40,
        },
        Heads {
            nq: 8,
            nkv: 1,
            dh: 72,
        },
    ] {
        let total = 2200; // 3 segments, a partial last tile
        let case = Case::new(heads, total, 3.0, 21);
        let one_block = case.run_blocks(isa, &[total], Split::Never);
        let uneven = [1usize, 63, 64, 65, 300, 511, 17, 1000, 179];
        assert_eq!(uneven.iter().sum::<usize>(), total);
        let token_by_token = vec![1usize; total];
        for (name, sizes) in [
            ("uneven chunks", &uneven[..]),
            ("token by token", &token_by_token[..]),
            ("one block", &[total][..]),
        ] {
            for split in [Split::Never, Split::Always, Split::Auto] {
                for threads in [1, 3] {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .expect("pool");
                    let got = pool.install(|| case.run_blocks(isa, sizes, split));
                    let what = format!(
                        "{}q/{}kv/{}: {name}, {split:?}, {threads} threads vs one block",
                        heads.nq, heads.nkv, heads.dh
                    );
                    assert_bits(&got, &one_block, &what);
                }
            }
        }
    }
}

#[test]
fn every_available_isa_agrees_with_the_naive_reference() {
    let heads = Heads {
        nq: 8,
        nkv: 1,
        dh: 24,
    };
    let case = Case::new(heads, 1500, 4.0, 31);
    let want = naive(heads, &case.q, 1500, 0, &case.k, &case.v, case.scale);
    for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
        assert_close(
            &case.run(isa, 0, 1500, Split::Auto),
            &want,
            2e-6,
            &format!("{isa}"),
        );
    }
}
