//! The prefix cache's bookkeeping, on parts that record which positions they were made for.

use super::*;

/// Key/value rows made for positions `.0` (10 bytes a position).
#[derive(Debug, Clone, PartialEq)]
struct Rows(Range<usize>);

impl Part for Rows {
    fn bytes(&self) -> usize {
        self.0.len() * 10
    }
}

/// A recurrent part taken at position `.0` (1000 bytes).
#[derive(Debug, Clone, PartialEq)]
struct Rec(usize);

impl Part for Rec {
    fn bytes(&self) -> usize {
        1000
    }
}

type Cache = PrefixCache<Rows, Rec>;

fn put(c: &mut Cache, tokens: &[u32]) -> bool {
    c.insert(tokens, Rows, || Rec(tokens.len()), false)
}

/// The tokens a lookup covers, after checking that its parts cover `0..tokens` in order and
/// that its recurrent part was taken there.
fn hit(c: &mut Cache, prompt: &[u32]) -> Option<usize> {
    let h = c.lookup(prompt)?;
    let mut at = 0;
    for p in &h.parts {
        assert_eq!(p.0.start, at, "parts out of order: {:?}", h.parts);
        at = p.0.end;
    }
    assert_eq!((at, h.recurrent.0), (h.tokens, h.tokens));
    assert!(h.tokens < prompt.len());
    Some(h.tokens)
}

fn seq(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|t| t * 7 + salt).collect()
}

#[test]
fn longest_proper_prefix_wins_across_blocks_and_tails() {
    let mut c = Cache::new(1 << 20, 4);
    let p = seq(20, 1);
    for n in [2, 4, 6, 9, 12] {
        assert!(put(&mut c, &p[..n]));
    }
    assert_eq!(hit(&mut c, &p), Some(12));
    assert_eq!(
        hit(&mut c, &p[..12]),
        Some(9),
        "an entry equal to the prompt leaves nothing to run"
    );
    assert_eq!(hit(&mut c, &p[..11]), Some(9));
    assert_eq!(hit(&mut c, &p[..5]), Some(4));
    assert_eq!(hit(&mut c, &p[..3]), Some(2));
    assert_eq!(hit(&mut c, &p[..2]), None);
    // Diverging inside the second block: the first block's checkpoint serves.
    let mut q = p.clone();
    q[6] = 999;
    assert_eq!(hit(&mut c, &q), Some(6));
    q[5] = 999;
    assert_eq!(hit(&mut c, &q), Some(4));
    let mut r = p.clone();
    r[0] = 999;
    assert_eq!(hit(&mut c, &r), None);
    assert_eq!(hit(&mut c, &[]), None);
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.entries, s.blocks), (7, 3, 5, 3));
    assert_eq!(s.hit_tokens, 12 + 9 + 9 + 4 + 2 + 6 + 4);
}

#[test]
fn checkpoints_on_one_prefix_share_its_blocks() {
    let mut c = Cache::new(1 << 20, 4);
    let p = seq(16, 3);
    let mut asked = Vec::new();
    c.insert(
        &p[..13],
        |r| {
            asked.push(r.clone());
            Rows(r)
        },
        || Rec(13),
        false,
    );
    assert_eq!(asked, [0..4, 4..8, 8..12, 12..13]);
    asked.clear();
    c.insert(
        &p[..10],
        |r| {
            asked.push(r.clone());
            Rows(r)
        },
        || Rec(10),
        false,
    );
    assert_eq!(asked, vec![8..10], "the shared blocks are not copied again");
    let s = c.stats();
    assert_eq!((s.entries, s.blocks), (2, 3));
    // Blocks 3×(40 + 16 + overhead); tails 1 and 2 positions; two recurrent parts.
    let want = 3 * (40 + 16 + ENTRY_OVERHEAD) + (10 + 4 + 20 + 8) + 2 * (1000 + ENTRY_OVERHEAD);
    assert_eq!(s.bytes, want);
}

#[test]
fn eviction_is_lru_by_bytes_and_frees_unshared_blocks() {
    let block = 40 + 16 + ENTRY_OVERHEAD;
    let ckpt = 1000 + ENTRY_OVERHEAD;
    // Room for two checkpoints at depth 2 on different prefixes, not three.
    let mut c = Cache::new(2 * (2 * block + ckpt) + block, 4);
    let (a, b, d) = (seq(9, 1), seq(9, 2), seq(9, 3));
    put(&mut c, &a[..8]);
    put(&mut c, &b[..8]);
    assert_eq!(hit(&mut c, &a), Some(8), "a is now more recent than b");
    put(&mut c, &d[..8]);
    assert_eq!(hit(&mut c, &b), None, "b was the least recently used");
    assert_eq!(hit(&mut c, &a), Some(8));
    assert_eq!(hit(&mut c, &d), Some(8));
    let s = c.stats();
    assert_eq!(
        (s.evictions, s.entries, s.blocks),
        (1, 2, 4),
        "b's blocks went with it"
    );
    assert_eq!(s.bytes, 2 * (2 * block + ckpt));
}

#[test]
fn a_block_outlives_the_checkpoint_that_made_it_while_another_needs_it() {
    let block = 40 + 16 + ENTRY_OVERHEAD;
    let ckpt = 1000 + ENTRY_OVERHEAD;
    let p = seq(13, 5);
    // Room for the three blocks, two checkpoints without tails and a 2-token tail's rows.
    let mut c = Cache::new(3 * block + 2 * ckpt + 30, 4);
    put(&mut c, &p[..8]);
    put(&mut c, &p[..12]);
    hit(&mut c, &p); // the depth-3 checkpoint is the most recent
    // A third checkpoint forces one out: the depth-2 one, whose blocks the depth-3 one keeps.
    assert!(put(&mut c, &seq(2, 9)));
    assert_eq!(c.stats().blocks, 3);
    assert_eq!(hit(&mut c, &p), Some(12));
    assert_eq!(hit(&mut c, &p[..9]), None);
}

#[test]
fn reinserting_touches_and_oversized_or_disabled_store_nothing() {
    let mut c = Cache::new(1 << 20, 4);
    let p = seq(9, 1);
    assert!(put(&mut c, &p[..6]));
    let before = c.stats();
    let mut asked = 0;
    assert!(c.insert(
        &p[..6],
        |r| {
            asked += 1;
            Rows(r)
        },
        || Rec(6),
        false
    ));
    assert_eq!(
        (asked, c.stats()),
        (0, before),
        "an existing checkpoint is not rebuilt"
    );
    let mut small = Cache::new(500, 4);
    assert!(!put(&mut small, &p[..6]));
    assert_eq!(small.stats().bytes, 0);
    let mut off = Cache::new(0, 4);
    assert!(!put(&mut off, &p[..6]));
    assert_eq!(hit(&mut off, &p), None);
    assert!(!put(&mut c, &[]));
}

/// Many random inserts and lookups on prompts that share prefixes: every hit is the longest
/// held checkpoint that is a proper prefix of the prompt, the byte count equals the sum of
/// what is held, every block's reference count equals the checkpoints passing through it,
/// and the budget always holds.
#[test]
fn random_workload_keeps_every_invariant() {
    let mut c = Cache::new(12_000, 4);
    let mut rng = shared::splitmix::SplitMix64::new(7);
    let bases: Vec<Vec<u32>> = (0..3).map(|s| seq(40, s)).collect();
    for _ in 0..2000 {
        let base = &bases[(rng.next_u64() % 3) as usize];
        let mut prompt = base[..1 + (rng.next_u64() % 40) as usize].to_vec();
        if rng.next_u64().is_multiple_of(4) {
            let at = (rng.next_u64() as usize) % prompt.len();
            prompt[at] = 500 + (rng.next_u64() % 3) as u32;
        }
        if rng.next_u64().is_multiple_of(2) {
            put(&mut c, &prompt);
        } else {
            let want = c
                .checkpoints
                .values()
                .map(|k| {
                    let mut t: Vec<u32> = Vec::new();
                    let mut key = k.key;
                    let mut chain = Vec::new();
                    for _ in 0..k.depth {
                        let bl = &c.blocks[&key];
                        chain.push(bl.tokens.clone());
                        key = bl.parent;
                    }
                    for b in chain.iter().rev() {
                        t.extend_from_slice(b);
                    }
                    t.extend_from_slice(&k.tail_tokens);
                    t
                })
                .filter(|t| t.len() < prompt.len() && prompt.starts_with(t))
                .map(|t| t.len())
                .max();
            assert_eq!(hit(&mut c, &prompt), want, "prompt {prompt:?}");
        }
        let held: usize = c.blocks.values().map(|b| b.bytes).sum::<usize>()
            + c.checkpoints.values().map(|k| k.bytes).sum::<usize>();
        assert_eq!(c.stats().bytes, held);
        assert!(held <= 12_000);
        let mut refs: HashMap<u64, usize> = HashMap::new();
        for k in c.checkpoints.values() {
            let mut key = k.key;
            for _ in 0..k.depth {
                *refs.entry(key).or_default() += 1;
                key = c.blocks[&key].parent;
            }
        }
        for (key, b) in &c.blocks {
            assert_eq!(refs.get(key).copied().unwrap_or(0), b.refs, "block refs");
            assert!(b.refs > 0, "an unreferenced block was kept");
        }
    }
    assert!(c.stats().evictions > 0 && c.stats().hits > 0);
}

#[test]
fn periodic_checkpoints_go_before_the_others() {
    let ckpt = 1000 + 20 + 8 + ENTRY_OVERHEAD;
    // Room for three checkpoints of 2 tokens at depth 0, not four.
    let mut c = Cache::new(3 * ckpt + 10, 4);
    let (a, b, d, e) = (seq(3, 1), seq(3, 2), seq(3, 3), seq(3, 4));
    put(&mut c, &a[..2]); // the system prompt's: oldest, kept
    c.insert(&b[..2], Rows, || Rec(2), true);
    c.insert(&d[..2], Rows, || Rec(2), true);
    put(&mut c, &e[..2]);
    assert_eq!(
        hit(&mut c, &a),
        Some(2),
        "the oldest survives: it is not periodic"
    );
    assert_eq!(
        hit(&mut c, &b),
        None,
        "the least recently used periodic one went"
    );
    assert_eq!(hit(&mut c, &d), Some(2));
    // Inserting a periodic checkpoint again as a mark promotes it.
    assert!(c.insert(&d[..2], Rows, || Rec(2), false));
    put(&mut c, &b[..2]);
    assert_eq!(
        hit(&mut c, &e),
        None,
        "with no periodic one left, plain LRU"
    );
    assert_eq!(hit(&mut c, &a), Some(2));
    assert_eq!(hit(&mut c, &d), Some(2));
}
