//! Checkpointed sequence states keyed by the tokens they consumed, so a request only prefills
//! the tokens after the longest checkpointed prefix of its prompt.
//!
//! A sequence state has two parts that behave differently. The attention layers' keys and
//! values of a position depend only on the tokens up to it, so every state whose tokens agree
//! up to there can share them; the DeltaNet layers' recurrent state folds every token in and
//! cannot be rewound, so each resumable position needs its own copy. The cache keeps them
//! apart:
//! - **Blocks**: the key/value rows of one block of `block_tokens` positions, keyed by a hash
//!   chain over the token blocks (block `j`'s key hashes its tokens with block `j − 1`'s key,
//!   as paged KV caches do), so equal prefixes share their blocks and a lookup costs
//!   O(prompt / block) map probes. Each block keeps its tokens and its parent's key, and a
//!   lookup compares them with the prompt: a hash collision can only cost a miss, never serve
//!   another prefix's state.
//! - **Checkpoints**: a position `p = depth × block_tokens + tail`: the key of its last whole
//!   block, the `tail` tokens after it with their key/value rows, and the recurrent part.
//!   A checkpoint holds a reference on each block of its chain; a block lives while any
//!   checkpoint needs it.
//!
//! A checkpoint serves a prompt when all of its tokens are a proper prefix of the prompt (at
//! least one prompt token is left to run: the next logits come from a forward call); the
//! longest one wins. The cache is bounded by bytes (blocks and checkpoints together). It evicts
//! checkpoints inserted as `evict_first` (the periodic ones, useful only after an edit) before
//! the others, least recently used first within each class, then the blocks nothing refers to
//! any more: a long prefill's periodic checkpoints never push out the system prompt's. Pure bookkeeping: no model, no IO, no locks; the scheduler thread owns the one
//! instance. The parts are generic ([`Part`]), so the bookkeeping is tested without a model.

use std::collections::HashMap;
use std::ops::Range;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Positions per block of shared key/value rows (the serving default).
pub const BLOCK_TOKENS: usize = 256;

/// The chain key of the empty prefix.
const ROOT: u64 = 0x5eed_0f5e_9c4a_1e00;

/// Bookkeeping bytes charged per block and per checkpoint besides their parts and tokens.
const ENTRY_OVERHEAD: usize = 128;

/// Something the cache holds, with the bytes it takes.
pub trait Part {
    /// Bytes held.
    fn bytes(&self) -> usize;
}

impl Part for crate::model::snapshot::KvRows {
    fn bytes(&self) -> usize {
        crate::model::snapshot::KvRows::bytes(self)
    }
}

impl Part for crate::model::snapshot::RecurrentSnapshot {
    fn bytes(&self) -> usize {
        crate::model::snapshot::RecurrentSnapshot::bytes(self)
    }
}

/// Counters of one cache, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Checkpoints held.
    pub entries: usize,
    /// Shared key/value blocks held.
    pub blocks: usize,
    /// Bytes held (blocks and checkpoints, with their tokens).
    pub bytes: usize,
    /// Lookups that found a usable prefix.
    pub hits: u64,
    /// Lookups that found none.
    pub misses: u64,
    /// Checkpoints dropped to stay within the budget.
    pub evictions: u64,
    /// Prompt tokens served from the cache, summed over hits.
    pub hit_tokens: u64,
}

/// What a lookup found: the prompt tokens it covers, the key/value parts covering positions
/// `0..tokens` in order, and the recurrent part at `tokens`.
pub struct Hit<'a, K, R> {
    /// Prompt tokens the checkpoint covers.
    pub tokens: usize,
    /// Key/value rows of `0..tokens`, in order (the chain's blocks, then the tail).
    pub parts: Vec<&'a K>,
    /// The recurrent part at position `tokens`.
    pub recurrent: &'a R,
}

struct Block<K> {
    parent: u64,
    tokens: Vec<u32>,
    kv: K,
    /// Checkpoints whose chain passes through this block.
    refs: usize,
    bytes: usize,
}

struct Checkpoint<K, R> {
    /// Chain key of the last whole block (`ROOT` at depth 0).
    key: u64,
    depth: usize,
    tail_tokens: Vec<u32>,
    tail: K,
    recurrent: R,
    bytes: usize,
    last_used: u64,
    evict_first: bool,
}

/// A byte-bounded cache of checkpointed states sharing their key/value blocks.
pub struct PrefixCache<K, R> {
    capacity_bytes: usize,
    block_tokens: usize,
    blocks: HashMap<u64, Block<K>>,
    checkpoints: HashMap<u64, Checkpoint<K, R>>,
    /// Chain key → ids of the checkpoints at that key.
    by_key: HashMap<u64, Vec<u64>>,
    next_id: u64,
    clock: u64,
    bytes: usize,
    stats: PrefixCacheStats,
}

/// Block `j`'s chain key from block `j − 1`'s and block `j`'s tokens.
fn chain(parent: u64, tokens: &[u32]) -> u64 {
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    xxh3_64_with_seed(&bytes, parent)
}

impl<K: Part, R: Part> PrefixCache<K, R> {
    /// An empty cache holding at most `capacity_bytes` in blocks of `block_tokens` positions;
    /// a capacity of 0 disables it.
    pub fn new(capacity_bytes: usize, block_tokens: usize) -> PrefixCache<K, R> {
        assert!(block_tokens > 0, "a block holds at least one position");
        PrefixCache {
            capacity_bytes,
            block_tokens,
            blocks: HashMap::new(),
            checkpoints: HashMap::new(),
            by_key: HashMap::new(),
            next_id: 0,
            clock: 0,
            bytes: 0,
            stats: PrefixCacheStats::default(),
        }
    }

    /// The byte budget.
    pub fn capacity_bytes(&self) -> usize {
        self.capacity_bytes
    }

    /// Current counters.
    pub fn stats(&self) -> PrefixCacheStats {
        PrefixCacheStats {
            entries: self.checkpoints.len(),
            blocks: self.blocks.len(),
            bytes: self.bytes,
            ..self.stats
        }
    }

    /// Chain keys of the first `depth` whole blocks of `tokens`, `ROOT` first.
    fn keys(&self, tokens: &[u32], depth: usize) -> Vec<u64> {
        let b = self.block_tokens;
        let mut keys = Vec::with_capacity(depth + 1);
        keys.push(ROOT);
        for j in 1..=depth {
            keys.push(chain(keys[j - 1], &tokens[(j - 1) * b..j * b]));
        }
        keys
    }

    /// Whether the blocks under `keys[1..]` exist and hold exactly `tokens`' blocks.
    fn chain_holds(&self, keys: &[u64], tokens: &[u32]) -> bool {
        let b = self.block_tokens;
        (1..keys.len()).all(|j| {
            self.blocks.get(&keys[j]).is_some_and(|bl| {
                bl.parent == keys[j - 1] && bl.tokens == tokens[(j - 1) * b..j * b]
            })
        })
    }

    /// The longest checkpoint whose tokens are a proper prefix of `prompt`, marked recently
    /// used; the entry stays, so identical concurrent prompts all reuse it.
    pub fn lookup(&mut self, prompt: &[u32]) -> Option<Hit<'_, K, R>> {
        let found = self.find(prompt);
        let Some((id, keys)) = found else {
            self.stats.misses += 1;
            return None;
        };
        self.clock += 1;
        let c = self.checkpoints.get_mut(&id)?;
        c.last_used = self.clock;
        let tokens = c.depth * self.block_tokens + c.tail_tokens.len();
        self.stats.hits += 1;
        self.stats.hit_tokens += tokens as u64;
        let c = &self.checkpoints[&id];
        let mut parts: Vec<&K> = keys[1..].iter().map(|k| &self.blocks[k].kv).collect();
        parts.push(&c.tail);
        Some(Hit {
            tokens,
            parts,
            recurrent: &c.recurrent,
        })
    }

    /// The id of the checkpoint [`Self::lookup`] serves, with its chain's keys.
    fn find(&self, prompt: &[u32]) -> Option<(u64, Vec<u64>)> {
        let b = self.block_tokens;
        if prompt.is_empty() || self.checkpoints.is_empty() {
            return None;
        }
        let keys = self.keys(prompt, (prompt.len() - 1) / b);
        for depth in (0..keys.len()).rev() {
            let Some(ids) = self.by_key.get(&keys[depth]) else {
                continue;
            };
            let rest = &prompt[depth * b..];
            let best = ids
                .iter()
                .filter(|id| {
                    let c = &self.checkpoints[id];
                    c.depth == depth
                        && c.tail_tokens.len() < rest.len()
                        && rest.starts_with(&c.tail_tokens)
                })
                .max_by_key(|id| {
                    let c = &self.checkpoints[id];
                    (c.tail_tokens.len(), c.last_used)
                });
            // Checkpoints at a shallower depth end before this one's blocks do, so the first
            // depth with a match holds the longest one.
            if let Some(&id) = best
                && self.chain_holds(&keys[..=depth], prompt)
            {
                return Some((id, keys[..=depth].to_vec()));
            }
        }
        None
    }

    /// Stores the state that consumed exactly `tokens`: `kv(range)` gives the key/value rows
    /// of positions `range` (asked only for blocks the cache lacks, and for the tail), and
    /// `recurrent()` the recurrent part. Returns whether the checkpoint is held afterwards (an
    /// existing one is only marked recently used). Not stored: empty tokens, a checkpoint
    /// larger than the whole budget, or a chain whose key collides with another prefix's.
    /// Checkpoints are evicted until the budget holds (`evict_first` ones first, see the
    /// module doc).
    pub fn insert(
        &mut self,
        tokens: &[u32],
        mut kv: impl FnMut(Range<usize>) -> K,
        recurrent: impl FnOnce() -> R,
        evict_first: bool,
    ) -> bool {
        if tokens.is_empty() || self.capacity_bytes == 0 {
            return false;
        }
        let b = self.block_tokens;
        let depth = tokens.len() / b;
        let keys = self.keys(tokens, depth);
        let tail_tokens = &tokens[depth * b..];
        let collides = (1..=depth).any(|j| {
            self.blocks.get(&keys[j]).is_some_and(|bl| {
                bl.parent != keys[j - 1] || bl.tokens != tokens[(j - 1) * b..j * b]
            })
        });
        if collides {
            return false;
        }
        self.clock += 1;
        if let Some(ids) = self.by_key.get(&keys[depth]) {
            for id in ids {
                let c = self.checkpoints.get_mut(id).expect("indexed checkpoint");
                if c.depth == depth && c.tail_tokens == tail_tokens {
                    c.last_used = self.clock;
                    c.evict_first &= evict_first;
                    return true;
                }
            }
        }
        let new_blocks: Vec<(u64, Block<K>)> = (1..=depth)
            .filter(|&j| !self.blocks.contains_key(&keys[j]))
            .map(|j| {
                let part = kv((j - 1) * b..j * b);
                let bytes = part.bytes() + b * 4 + ENTRY_OVERHEAD;
                let block = Block {
                    parent: keys[j - 1],
                    tokens: tokens[(j - 1) * b..j * b].to_vec(),
                    kv: part,
                    refs: 0,
                    bytes,
                };
                (keys[j], block)
            })
            .collect();
        let tail = kv(depth * b..tokens.len());
        let recurrent = recurrent();
        let bytes = tail.bytes() + recurrent.bytes() + tail_tokens.len() * 4 + ENTRY_OVERHEAD;
        let added = bytes + new_blocks.iter().map(|(_, bl)| bl.bytes).sum::<usize>();
        let shared: usize = (1..=depth)
            .filter_map(|j| self.blocks.get(&keys[j]))
            .map(|bl| bl.bytes)
            .sum();
        if added + shared > self.capacity_bytes {
            return false;
        }
        for (key, block) in new_blocks {
            self.blocks.insert(key, block);
        }
        for key in &keys[1..] {
            self.blocks.get_mut(key).expect("chain block").refs += 1;
        }
        self.next_id += 1;
        let id = self.next_id;
        self.checkpoints.insert(
            id,
            Checkpoint {
                key: keys[depth],
                depth,
                tail_tokens: tail_tokens.to_vec(),
                tail,
                recurrent,
                bytes,
                last_used: self.clock,
                evict_first,
            },
        );
        self.by_key.entry(keys[depth]).or_default().push(id);
        self.bytes += added;
        self.evict_to(self.capacity_bytes);
        true
    }

    /// Drops every entry (the counters stay: they feed Prometheus counters).
    pub fn clear(&mut self) {
        self.blocks.clear();
        self.checkpoints.clear();
        self.by_key.clear();
        self.bytes = 0;
    }

    fn evict_to(&mut self, budget: usize) {
        while self.bytes > budget {
            let Some(id) = self
                .checkpoints
                .iter()
                .min_by_key(|(_, c)| (!c.evict_first, c.last_used))
                .map(|(&id, _)| id)
            else {
                break;
            };
            self.remove(id);
            self.stats.evictions += 1;
        }
    }

    /// Removes checkpoint `id` and the blocks only it referred to.
    fn remove(&mut self, id: u64) {
        let Some(c) = self.checkpoints.remove(&id) else {
            return;
        };
        self.bytes -= c.bytes;
        if let Some(ids) = self.by_key.get_mut(&c.key) {
            ids.retain(|&i| i != id);
            if ids.is_empty() {
                self.by_key.remove(&c.key);
            }
        }
        let mut key = c.key;
        for _ in 0..c.depth {
            let block = self
                .blocks
                .get_mut(&key)
                .expect("a checkpoint's chain block");
            block.refs -= 1;
            let parent = block.parent;
            if block.refs == 0 {
                let gone = self.blocks.remove(&key).expect("present");
                self.bytes -= gone.bytes;
            }
            key = parent;
        }
    }
}

#[cfg(test)]
mod tests;
