//! Synthetic checkpoints: deterministic random-weight Qwen3.6-MoE model directories in the
//! release's on-disk layout (nested `config.json`, sharded safetensors with an index, fused
//! experts, BF16 with F32 `A_log` / DeltaNet norm, tokenizer files), for tests and benchmarks
//! at real per-layer dimensions without the real weights.
//!
//! [`plan`] computes everything but the values (tensor list, shard assignment, headers);
//! [`synthesize`] streams the values into the files. The same preset, layer count and seed
//! always give byte-identical files; so do the same preset, layer count, expert count and seed.

pub mod plan;
pub mod preset;
pub mod tokenizer;
pub mod values;
mod write;

pub use plan::{Plan, PlannedTensor, SHARD_CAP_BYTES, ShardPlan, plan};
pub use preset::{Dims, MAX_EXPERTS, Preset};
pub use tokenizer::{LoadTokenizer, RuntimeTokenizer, TokenizerSource};
pub use write::{Summary, SynthOptions, synthesize};

use std::path::PathBuf;

/// Why a synthetic checkpoint cannot be planned or written.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// The layer count is out of range.
    #[error(
        "--layers {layers} is invalid: need at least 4 (layer i is full attention iff i % 4 == 3, and at least one full-attention layer is required) and at most {max}"
    )]
    Layers {
        /// The layer count asked for.
        layers: usize,
        /// The largest accepted.
        max: usize,
    },
    /// The expert count is out of range for the preset.
    #[error(
        "--experts {experts} is invalid for preset {preset}: it routes each token to its top {top_k} experts, so a layer needs at least {top_k} experts (and at most {max})"
    )]
    Experts {
        /// The expert count asked for.
        experts: usize,
        /// The preset.
        preset: Preset,
        /// The preset's experts per token.
        top_k: usize,
        /// The largest accepted.
        max: usize,
    },
    /// A signal asked the write to stop; the partial directory was removed.
    #[error("interrupted; removed the partial checkpoint {0}")]
    Interrupted(PathBuf),
    /// The output directory exists and is not empty.
    #[error("{0} exists and is not empty; pass --force to replace it")]
    OutExists(PathBuf),
    /// The output path exists but is not a directory, or names no directory.
    #[error("{0} is not a directory path that can be created")]
    OutNotDir(PathBuf),
    /// A file could not be written or read.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        message: String,
    },
    /// The tokenizer is unusable for this preset.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// An inconsistency inside the generator (a bug).
    #[error("internal error: {0}")]
    Internal(String),
}

#[cfg(test)]
mod tests;
