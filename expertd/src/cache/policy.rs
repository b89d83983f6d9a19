//! Eviction policies: which unleased resident expert the cache gives up when a miss needs a
//! slot and none is free. Owns the policy names (`lru`, `lfu-aging`), their parameters and the
//! ordering key each policy gives an entry; it does not own the entries (that is
//! [`super::planner`]) or any buffer.
//!
//! # How a victim is chosen
//!
//! Every resident entry carries two numbers that the planner maintains:
//!
//! - `last_use`: the value of one global tick counter when the entry was last named by an
//!   acquire call. The counter advances once per key of every successful call, in key order, so
//!   no two entries share a `last_use`.
//! - `count`: how many acquire calls named the entry since it was read (1 after the read),
//!   halved (integer shift, so 1 becomes 0) for every entry of layer `L` at the start of every
//!   `halving_period`-th call for layer `L` under `lfu-aging`. It is kept under `lru` too but
//!   not used.
//!
//! The policy is applied per layer: each layer's entries are ordered by the policy's key, and
//! because every layer's key is drawn from the same scale (one global tick, counts of one
//! layer's calls), the globally best victim is simply the smallest key over all unleased entries
//! of all layers — the head of the merged per-layer orders:
//!
//! - [`Policy::Lru`]: key `(last_use)`: the least recently used unleased entry across layers.
//! - [`Policy::LfuAging`]: key `(count, last_use)`: the unleased entry with the lowest aged
//!   count across layers; ties go to the least recently used. A layer's halving only touches
//!   that layer's counts, so a layer called rarely keeps its counts longer (in tokens) than a
//!   layer called often — with one call per layer per token the layers age in step.
//!
//! Leased entries (pinned by a live call) and entries whose read is still in flight are never
//! candidates; see the invariants in [`super::stats`].

use serde::{Deserialize, Serialize};

/// Halving period used when `lfu-aging` is chosen without one: slipstream's `lfu-aging` halves
/// its counts every 32 plans, and beat both LRU and plain LFU on its coding trace
/// (docs: prior-art §3).
pub const DEFAULT_HALVING_PERIOD: u64 = 32;

/// The policy names as the command line spells them (`--policy lru|lfu-aging`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    clap::ValueEnum,
    Serialize,
    Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// Least recently used across all layers.
    Lru,
    /// Least frequently used with per-layer aging (counts halved every `--halving-period`
    /// calls for that layer); ties go to the least recently used.
    LfuAging,
}

impl PolicyKind {
    /// The name as the command line and the route trace spell it.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Lru => "lru",
            PolicyKind::LfuAging => "lfu-aging",
        }
    }
}

/// An eviction policy with its parameters. See the module doc for the exact victim order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Evict the least recently used unleased entry across layers.
    Lru,
    /// Evict the unleased entry with the lowest aged use count across layers (ties: least
    /// recently used).
    LfuAging {
        /// A layer's counts are halved at the start of every `halving_period`-th acquire call
        /// for that layer; at least 1.
        halving_period: u64,
    },
}

impl Policy {
    /// The policy named `kind`; `halving_period` (default [`DEFAULT_HALVING_PERIOD`], raised to
    /// at least 1) applies to `lfu-aging` only.
    pub fn from_kind(kind: PolicyKind, halving_period: Option<u64>) -> Policy {
        match kind {
            PolicyKind::Lru => Policy::Lru,
            PolicyKind::LfuAging => Policy::LfuAging {
                halving_period: halving_period.unwrap_or(DEFAULT_HALVING_PERIOD).max(1),
            },
        }
    }

    /// The policy's name without parameters.
    pub fn kind(self) -> PolicyKind {
        match self {
            Policy::Lru => PolicyKind::Lru,
            Policy::LfuAging { .. } => PolicyKind::LfuAging,
        }
    }

    /// The halving period, for `lfu-aging`.
    pub fn halving_period(self) -> Option<u64> {
        match self {
            Policy::Lru => None,
            Policy::LfuAging { halving_period } => Some(halving_period),
        }
    }

    /// Whether the call about to be made for a layer that has already seen `layer_calls` calls
    /// starts by halving that layer's counts.
    pub(crate) fn halves_before_call(self, layer_calls: u64) -> bool {
        match self {
            Policy::Lru => false,
            Policy::LfuAging { halving_period } => {
                (layer_calls + 1).is_multiple_of(halving_period.max(1))
            }
        }
    }

    /// The ordering key of an unleased entry: the smallest key is the next victim. The slot
    /// index is last only to make keys unique; `last_use` is already unique.
    pub(crate) fn evict_key(self, count: u64, last_use: u64, slot: u32) -> EvictKey {
        match self {
            Policy::Lru => (0, last_use, slot),
            Policy::LfuAging { .. } => (count, last_use, slot),
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Policy::Lru => f.write_str("lru"),
            Policy::LfuAging { halving_period } => {
                write!(f, "lfu-aging(halving every {halving_period} calls)")
            }
        }
    }
}

/// `(primary, last_use, slot)`: the victim order; see [`Policy::evict_key`].
pub(crate) type EvictKey = (u64, u64, u32);
