//! Recent conversation states keyed by the tokens they consumed, so a follow-up request only
//! prefills the tokens after the longest cached prefix of its prompt.
//!
//! A sequence state cannot be rewound (DeltaNet folds every token into its recurrent state), so
//! an entry is usable only when all of its tokens are a prefix of the new prompt, and only when
//! at least one prompt token is left to run (the next logits come from a forward call). The cache
//! is bounded by bytes (`SequenceState::bytes()`, or any size the caller states) and evicts the
//! least recently used entry first. Pure bookkeeping: no model, no IO, no locks; the scheduler
//! thread owns the one instance.

use std::collections::HashMap;

/// Counters of one cache, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Entries held.
    pub entries: usize,
    /// Bytes held (sum of the entries' stated sizes).
    pub bytes: usize,
    /// Lookups that found a usable prefix.
    pub hits: u64,
    /// Lookups that found none.
    pub misses: u64,
    /// Entries dropped to stay within the budget.
    pub evictions: u64,
    /// Prompt tokens served from the cache, summed over hits.
    pub hit_tokens: u64,
}

struct Entry<S> {
    tokens: Vec<u32>,
    state: S,
    bytes: usize,
    last_used: u64,
}

/// A byte-bounded LRU of states keyed by token prefix.
pub struct PrefixCache<S> {
    capacity_bytes: usize,
    entries: Vec<Entry<S>>,
    /// First token → indices into `entries`, so a lookup scans only candidates that can match.
    by_first: HashMap<u32, Vec<usize>>,
    clock: u64,
    stats: PrefixCacheStats,
}

impl<S: Clone> PrefixCache<S> {
    /// An empty cache holding at most `capacity_bytes`; 0 disables it.
    pub fn new(capacity_bytes: usize) -> PrefixCache<S> {
        PrefixCache {
            capacity_bytes,
            entries: Vec::new(),
            by_first: HashMap::new(),
            clock: 0,
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
            entries: self.entries.len(),
            bytes: self.entries.iter().map(|e| e.bytes).sum(),
            ..self.stats
        }
    }

    /// The longest entry whose tokens are a proper prefix of `prompt`: returns how many prompt
    /// tokens it covers and a clone of its state (the entry stays, so identical concurrent
    /// prompts all reuse it). Marks the entry recently used.
    pub fn lookup(&mut self, prompt: &[u32]) -> Option<(usize, S)> {
        let best = prompt
            .first()
            .and_then(|first| self.by_first.get(first))
            .and_then(|candidates| {
                candidates
                    .iter()
                    .copied()
                    .filter(|&i| {
                        let t = &self.entries[i].tokens;
                        t.len() < prompt.len() && prompt.starts_with(t)
                    })
                    .max_by_key(|&i| (self.entries[i].tokens.len(), self.entries[i].last_used))
            });
        match best {
            Some(i) => {
                self.clock += 1;
                let e = &mut self.entries[i];
                e.last_used = self.clock;
                self.stats.hits += 1;
                self.stats.hit_tokens += e.tokens.len() as u64;
                Some((e.tokens.len(), e.state.clone()))
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// Stores `state` as the result of consuming exactly `tokens`, replacing an entry with the
    /// same tokens, then evicts least recently used entries until the budget holds. A state
    /// larger than the whole budget is not stored. Returns whether it was stored.
    pub fn insert(&mut self, tokens: Vec<u32>, state: S, bytes: usize) -> bool {
        if tokens.is_empty() || bytes > self.capacity_bytes {
            return false;
        }
        self.clock += 1;
        if let Some(i) = self.find_exact(&tokens) {
            let e = &mut self.entries[i];
            e.state = state;
            e.bytes = bytes;
            e.last_used = self.clock;
        } else {
            self.entries.push(Entry {
                tokens,
                state,
                bytes,
                last_used: self.clock,
            });
            self.reindex();
        }
        self.evict_to(self.capacity_bytes);
        true
    }

    /// Drops every entry.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.by_first.clear();
    }

    fn find_exact(&self, tokens: &[u32]) -> Option<usize> {
        self.by_first
            .get(tokens.first()?)?
            .iter()
            .copied()
            .find(|&i| self.entries[i].tokens == tokens)
    }

    fn evict_to(&mut self, budget: usize) {
        let mut total: usize = self.entries.iter().map(|e| e.bytes).sum();
        let mut evicted = false;
        while total > budget {
            let Some(i) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used) else {
                break;
            };
            total -= self.entries[i].bytes;
            self.entries.swap_remove(i);
            self.stats.evictions += 1;
            evicted = true;
        }
        if evicted {
            self.reindex();
        }
    }

    fn reindex(&mut self) {
        self.by_first.clear();
        for (i, e) in self.entries.iter().enumerate() {
            self.by_first.entry(e.tokens[0]).or_default().push(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(cap: usize, entries: &[(&[u32], usize)]) -> PrefixCache<String> {
        let mut c = PrefixCache::new(cap);
        for (tokens, bytes) in entries {
            c.insert(tokens.to_vec(), format!("{tokens:?}"), *bytes);
        }
        c
    }

    fn check_lookup(c: &mut PrefixCache<String>, prompt: &[u32], expect: Option<usize>) {
        assert_eq!(
            c.lookup(prompt).map(|(n, _)| n),
            expect,
            "prompt {prompt:?}"
        );
    }

    #[test]
    fn longest_proper_prefix_wins() {
        let mut c = cache(100, &[(&[1, 2], 10), (&[1, 2, 3], 10), (&[1, 9], 10)]);
        check_lookup(&mut c, &[1, 2, 3, 4], Some(3));
        check_lookup(&mut c, &[1, 2, 4], Some(2));
        check_lookup(&mut c, &[1, 9, 9], Some(2));
        // An entry equal to the prompt leaves no token to run, so the shorter one serves.
        check_lookup(&mut c, &[1, 2, 3], Some(2));
        check_lookup(&mut c, &[2, 1], None);
        check_lookup(&mut c, &[], None);
        let s = c.stats();
        assert_eq!(
            (s.hits, s.misses, s.hit_tokens, s.entries, s.bytes),
            (4, 2, 9, 3, 30)
        );
    }

    #[test]
    fn lookup_returns_the_state_and_keeps_the_entry() {
        let mut c = cache(100, &[(&[5, 6], 10)]);
        assert_eq!(
            c.lookup(&[5, 6, 7]).map(|(_, s)| s),
            Some("[5, 6]".to_string())
        );
        assert_eq!(c.lookup(&[5, 6, 8]).map(|(n, _)| n), Some(2));
    }

    #[test]
    fn lru_eviction_by_bytes() {
        let mut c = cache(25, &[(&[1], 10), (&[2], 10)]);
        check_lookup(&mut c, &[1, 0], Some(1)); // [1] is now more recent than [2].
        c.insert(vec![3], "three".into(), 10);
        check_lookup(&mut c, &[2, 0], None);
        check_lookup(&mut c, &[1, 0], Some(1));
        check_lookup(&mut c, &[3, 0], Some(1));
        assert_eq!((c.stats().evictions, c.stats().bytes), (1, 20));
    }

    #[test]
    fn oversized_and_disabled() {
        let mut c = cache(5, &[(&[1], 10)]);
        check_lookup(&mut c, &[1, 2], None);
        let mut off = cache(0, &[(&[1], 1)]);
        check_lookup(&mut off, &[1, 2], None);
        assert_eq!(off.stats().entries, 0);
    }

    #[test]
    fn reinsert_replaces_in_place() {
        let mut c = cache(100, &[(&[1, 2], 10)]);
        c.insert(vec![1, 2], "new".into(), 30);
        assert_eq!(
            c.lookup(&[1, 2, 3]).map(|(_, s)| s),
            Some("new".to_string())
        );
        assert_eq!((c.stats().entries, c.stats().bytes), (1, 30));
    }
}
