//! Which prefill blocks the scheduler runs in one step, and how prefill shares the time with
//! decoding, so a long prompt cannot hold other sequences' first tokens or their decoding
//! hostage.
//!
//! Policy, per step: every prefilling sequence may run at most one block; the blocks run
//! shortest-remaining-prompt first while their rows fit the step's token budget (the first block
//! always runs, so a budget smaller than a block still makes progress); a sequence passed over
//! [`STARVATION_LIMIT`] steps in a row goes first, so a long prompt keeps progressing under a
//! stream of short ones. The blocks ride in the same forward pass as the decoding sequences'
//! rows. While any sequence decodes, blocks are one [`pace_unit`] long and a step carries
//! prefill blocks only while prefill has had at most [`PREFILL_SHARE`] of the time ([`Pace`]);
//! so a decoding stream keeps at least about half its solo speed beside a long prefill. With
//! nothing decoding, blocks are `prefill_chunk` long and run back to back.
//!
//! **The output does not depend on the pace.** A block ends at its start plus `rows`, at the
//! sequence's next boundary (a prefix-cache mark), or at the prompt's end ([`block_end`]). When
//! `prefill_chunk` is a multiple of the DeltaNet chunk (64), the pace unit is 64, and a block
//! that ends on the 64-grid counted from its start changes no bit of the result compared with a
//! longer block (every other op is row-wise; `model::snapshot` tests it), so blocks of 64 and of
//! `prefill_chunk` give the same logits. Otherwise the pace unit is `prefill_chunk` itself and
//! blocks never change size.
//!
//! Pure functions and counters only; the scheduler applies the plan to the model.

use std::time::Duration;

/// The DeltaNet chunk length: blocks that end on this grid from their start do not change bits.
const GRID: usize = 64;

/// At most this share of the time goes to steps carrying prefill blocks while sequences decode.
pub(super) const PREFILL_SHARE: f64 = 0.5;

/// The block length while sequences decode: 64 when `prefill_chunk` is on the 64-grid (any
/// multiple then gives the same bits), else `prefill_chunk` (blocks never change size).
pub(super) fn pace_unit(prefill_chunk: usize) -> usize {
    if prefill_chunk >= GRID && prefill_chunk.is_multiple_of(GRID) {
        GRID
    } else {
        prefill_chunk.max(1)
    }
}

/// The time steps with and without prefill took since sequences started decoding beside a
/// prefill: a step carries prefill blocks only while their share stays within
/// [`PREFILL_SHARE`].
#[derive(Debug, Default)]
pub(super) struct Pace {
    prefill: Duration,
    decode: Duration,
}

impl Pace {
    /// Whether this step may carry prefill blocks.
    pub(super) fn prefill_turn(&self) -> bool {
        let total = self.prefill + self.decode;
        total.is_zero() || self.prefill.as_secs_f64() <= PREFILL_SHARE * total.as_secs_f64()
    }

    /// A step that took `took`: it counts only while sequences decode and a prompt waits for
    /// prefill (`contended`), with prefill blocks in it or not. Any other step starts the
    /// accounting afresh, so time spent decoding with no prompt waiting is not banked as
    /// prefill credit for the next long prompt.
    pub(super) fn record(&mut self, contended: bool, with_prefill: bool, took: Duration) {
        if !contended {
            *self = Pace::default();
        } else if with_prefill {
            self.prefill += took;
        } else {
            self.decode += took;
        }
    }
}

/// Iterations a prefilling sequence may be passed over in a row before it goes first.
pub(super) const STARVATION_LIMIT: u32 = 2;

/// What the planner needs to know about one prefilling sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Candidate {
    /// Identifies the sequence to the caller (stable while the plan is applied).
    pub serial: u64,
    /// Prompt tokens already in the state.
    pub fed: usize,
    /// Prompt length.
    pub prompt_len: usize,
    /// Position whose state is cached (a block ends there), if any.
    pub checkpoint: Option<usize>,
    /// Consecutive iterations this sequence was prefilling but ran no block.
    pub skipped: u32,
}

/// One block to run: feed prompt tokens `start..end` of sequence `serial`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Block {
    /// The sequence.
    pub serial: u64,
    /// First prompt position of the block (the sequence's `fed`).
    pub start: usize,
    /// One past the block's last prompt position.
    pub end: usize,
}

/// Where the block starting at `fed` ends: `rows` later, or at the checkpoint (the next
/// boundary), or at the prompt's end, whichever comes first; and never one row short of that
/// stop, which would leave a 1-row block (one token takes the DeltaNet's recurrent form, not
/// the chunked one, so its bits would depend on the pace). Depends on nothing but the sequence
/// and the pace (see the module doc for why the pace changes no bit). `hostd run` prefills
/// with the same rule, so its logits equal the server's.
pub(crate) fn block_end(
    fed: usize,
    prompt_len: usize,
    rows: usize,
    checkpoint: Option<usize>,
) -> usize {
    let stop = checkpoint
        .filter(|&c| c > fed)
        .map_or(prompt_len, |c| c.min(prompt_len));
    let end = fed + rows.max(1);
    if end + 1 >= stop { stop } else { end }
}

/// The blocks of one iteration, in the order to run them (at most one per candidate). Callers
/// pass candidates in arrival order; ties keep it.
pub(super) fn plan(cands: &[Candidate], chunk: usize, budget: usize) -> Vec<Block> {
    let mut order: Vec<&Candidate> = cands.iter().filter(|c| c.fed < c.prompt_len).collect();
    // Stable sort: starved sequences first (oldest first), then shortest remaining prompt.
    order.sort_by_key(|c| {
        let starved = c.skipped >= STARVATION_LIMIT;
        (!starved, if starved { 0 } else { c.prompt_len - c.fed })
    });
    let mut used = 0usize;
    let mut blocks = Vec::new();
    for c in order {
        let end = block_end(c.fed, c.prompt_len, chunk, c.checkpoint);
        let rows = end - c.fed;
        if blocks.is_empty() || used + rows <= budget {
            used += rows;
            blocks.push(Block {
                serial: c.serial,
                start: c.fed,
                end,
            });
        }
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(serial: u64, fed: usize, prompt_len: usize) -> Candidate {
        Candidate {
            serial,
            fed,
            prompt_len,
            checkpoint: None,
            skipped: 0,
        }
    }

    #[test]
    fn blocks_end_at_fixed_positions() {
        assert_eq!(block_end(0, 1000, 512, None), 512);
        assert_eq!(block_end(512, 1000, 512, None), 1000);
        assert_eq!(block_end(0, 1000, 512, Some(300)), 300);
        assert_eq!(block_end(300, 1000, 512, Some(300)), 812);
        // A block starts wherever the last one (or the cache hit) ended.
        assert_eq!(block_end(700, 5000, 512, None), 1212);
        assert_eq!(block_end(700, 5000, 64, Some(720)), 720);
        assert_eq!(block_end(0, 10, 0, None), 1);
        // Never a 1-row block before the stop: the pace would show in the bits.
        assert_eq!(block_end(0, 65, 64, None), 65);
        assert_eq!(block_end(0, 66, 64, None), 64);
        assert_eq!(block_end(0, 1000, 64, Some(65)), 65);
        assert_eq!(block_end(64, 65, 64, None), 65);
    }

    #[test]
    fn a_short_prompt_goes_before_a_long_one_and_the_long_one_waits_its_turn() {
        // The long prompt (arrived first) is mid-prefill; a 4-token prompt arrives.
        let cands = [cand(1, 1024, 12_000), cand(2, 0, 4)];
        let p = plan(&cands, 512, 512);
        assert_eq!(
            p,
            vec![Block {
                serial: 2,
                start: 0,
                end: 4
            }],
            "the long block does not fit after the short one"
        );
        // Alone, the long prompt runs one block per iteration.
        let p = plan(&cands[..1], 512, 512);
        assert_eq!(
            p,
            vec![Block {
                serial: 1,
                start: 1024,
                end: 1536
            }]
        );
    }

    #[test]
    fn the_budget_is_shared_and_the_first_block_always_runs() {
        let cands = [cand(1, 0, 100), cand(2, 0, 50), cand(3, 0, 30)];
        let p: Vec<u64> = plan(&cands, 512, 80).iter().map(|b| b.serial).collect();
        assert_eq!(p, vec![3, 2], "30 + 50 fit in 80; 100 does not");
        let p: Vec<u64> = plan(&cands, 512, 10).iter().map(|b| b.serial).collect();
        assert_eq!(p, vec![3], "a budget below one block still runs one");
        let p: Vec<u64> = plan(&cands, 512, 1000).iter().map(|b| b.serial).collect();
        assert_eq!(p, vec![3, 2, 1]);
    }

    #[test]
    fn a_starved_sequence_goes_first() {
        let mut long = cand(1, 512, 12_000);
        long.skipped = STARVATION_LIMIT;
        let p = plan(&[long, cand(2, 0, 4)], 512, 512);
        assert_eq!(
            p,
            vec![Block {
                serial: 1,
                start: 512,
                end: 1024
            }]
        );
    }

    #[test]
    fn a_long_prompt_progresses_under_a_stream_of_short_ones() {
        // Simulate: a new 4-token prompt every iteration; the long one must still finish.
        let chunk = 512;
        let mut long = cand(0, 0, 12_000);
        let mut iterations = 0;
        while long.fed < long.prompt_len {
            iterations += 1;
            assert!(iterations < 200, "the long prompt starved");
            let plan = plan(&[long, cand(iterations, 0, 4)], chunk, chunk);
            match plan.iter().find(|b| b.serial == 0) {
                Some(b) => {
                    long.fed = b.end;
                    long.skipped = 0;
                }
                None => long.skipped += 1,
            }
        }
        // At least one block every STARVATION_LIMIT + 1 iterations.
        assert!(iterations <= 12_000usize.div_ceil(chunk) as u64 * u64::from(STARVATION_LIMIT + 1));
    }

    #[test]
    fn the_pace_unit_and_the_share() {
        assert_eq!(pace_unit(512), 64);
        assert_eq!(pace_unit(64), 64);
        assert_eq!(pace_unit(16), 16, "off the grid: blocks never change size");
        assert_eq!(pace_unit(100), 100);
        let mut p = Pace::default();
        assert!(p.prefill_turn(), "the first step may prefill");
        p.record(true, true, Duration::from_millis(300));
        assert!(
            !p.prefill_turn(),
            "then decode until prefill is within its share"
        );
        p.record(true, false, Duration::from_millis(200));
        assert!(!p.prefill_turn());
        p.record(true, false, Duration::from_millis(100));
        assert!(p.prefill_turn());
        // Decoding with no prompt waiting banks nothing: a prompt arriving after ten minutes
        // of decoding still gets only its share.
        p.record(false, false, Duration::from_secs(600));
        assert!(p.prefill_turn());
        p.record(true, true, Duration::from_millis(300));
        assert!(!p.prefill_turn(), "no credit from the uncontended decoding");
    }

    #[test]
    fn finished_prompts_are_not_planned() {
        assert!(plan(&[cand(1, 10, 10)], 512, 512).is_empty());
        assert!(plan(&[], 512, 512).is_empty());
    }
}
