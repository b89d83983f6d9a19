//! sluice-tools: developer tooling that is not part of either daemon, kept out of the product
//! crates. Today that is [`synth`], the synthetic-checkpoint writer behind `hostd synth`; hostd's
//! command-line layer is its only product-side user.

pub mod synth;
