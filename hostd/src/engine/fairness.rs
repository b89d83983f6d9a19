//! Which prefill blocks the scheduler runs in one iteration (between two decode steps), so a
//! long prompt cannot hold other sequences' first tokens or their decoding hostage.
//!
//! Policy, per iteration: every prefilling sequence may run at most one block (the per-request
//! chunk budget: `prefill_chunk` rows, fewer up to its checkpoint or its prompt's end); the
//! blocks run shortest-remaining-prompt first while their rows fit the iteration's token budget
//! (the first block always runs, so a budget smaller than a block still makes progress); a
//! sequence passed over [`STARVATION_LIMIT`] iterations in a row goes first, so a long prompt
//! keeps progressing under a stream of short ones. Block *boundaries* never depend on the plan
//! (they are multiples of `prefill_chunk` and the checkpoint), only the order and the pace do,
//! so a sequence's output is the same whatever else is queued.
//!
//! Pure functions only; the scheduler applies the plan to the model.

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

/// Where the block starting at `fed` ends: the next multiple of `chunk`, or the checkpoint, or
/// the prompt's end, whichever comes first. Depends on nothing but the sequence itself.
pub(super) fn block_end(
    fed: usize,
    prompt_len: usize,
    chunk: usize,
    checkpoint: Option<usize>,
) -> usize {
    let chunk = chunk.max(1);
    let mut end = (fed / chunk + 1) * chunk;
    if let Some(c) = checkpoint.filter(|&c| c > fed) {
        end = end.min(c);
    }
    end.min(prompt_len)
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
        assert_eq!(block_end(300, 1000, 512, Some(300)), 512);
        // A cache hit that starts mid-chunk realigns to the chunk grid.
        assert_eq!(block_end(700, 5000, 512, None), 1024);
        assert_eq!(block_end(0, 10, 0, None), 1);
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
    fn finished_prompts_are_not_planned() {
        assert!(plan(&[cand(1, 10, 10)], 512, 512).is_empty());
        assert!(plan(&[], 512, 512).is_empty());
    }
}
